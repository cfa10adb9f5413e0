//! 6. Latency vs network load.

use super::*;

impl<'a> Ctx<'a> {
    pub(crate) fn est_load(&self) -> f64 {
        (self.engines.len() * self.p.load.sizes.len() * self.p.load.gaps_ns.len()) as f64
            * 0.85
            * self.repeats as f64
    }

    pub(crate) fn latency_vs_load(&self, mut ex: Experiment) -> Experiment {
        let n = self.p.load.packets;
        ex.method = format!(
            "Bursts of {n} datagrams from the {} generator with an inter-packet gap swept from back-to-back to idle ({} ns); each datagram carries its CLOCK_MONOTONIC transmit time and the receiver (spinning, engine under test) takes the time when the datagram is in user memory: one-way latency per packet (both namespaces share one clock). What a sample includes: the generator reads the clock once per send batch, before its send call (back-to-back, the datagrams of one batch share that stamp, so later ones also carry the sending of earlier ones; with a gap every datagram is sent and stamped alone); the receiver reads it once its receive call has returned the datagram. So a sample is the send path (syscall or AF_XDP kick), veth, XDP or the kernel stack, the time queued in the ring or socket buffer, the receive call, and one clock read (tens of ns). The split of such a path into wire → ring and ring → application, from the xdp engines' own stamps, is in section 9 (capture). {} repeat(s); the plot shows the average per burst against the rate the generator reached.",
            self.gen_engine,
            self.p
                .load
                .gaps_ns
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            self.repeats
        );
        let mut rows = vec![];
        for &e in &self.engines {
            let mut plot = Plot::log_log(
                format!("latency_vs_load_{e}"),
                format!("Receiver {e}: latency vs offered load ({n}-packet bursts)"),
                "generator rate (msg/s)",
                "avg one-way latency (µs)",
                vec![],
            );
            let mut failed = None;
            'sizes: for &size in &self.p.load.sizes {
                let mut s = Series::new(format!("{size} B"), e, "udp", "avg");
                for &gap in &self.p.load.gaps_ns {
                    let mut avgs = vec![];
                    let mut rates = vec![];
                    let mut agg: Vec<(f64, f64, f64, f64, u64)> = vec![];
                    for rep in 0..self.repeats {
                        self.progress.step(
                            &format!(
                                "load {e} {size} B gap {gap} ns ({}/{})",
                                rep + 1,
                                self.repeats
                            ),
                            0.85,
                        );
                        match self.trial(e, self.gen_engine, "spin", size, n, None, None, gap, 100)
                        {
                            Ok((g, sk, raw)) => {
                                if sk.engine != e {
                                    failed = Some(format!("the sink fell back to {}", sk.engine));
                                    break 'sizes;
                                }
                                ex.runs.push(json!({"engine": e, "size": size, "gap_ns": gap, "repeat": rep, "result": raw}));
                                if let Some(l) = sk.latency_us {
                                    avgs.push(l.avg);
                                    rates.push(g.rate_msg_s);
                                    agg.push((
                                        l.min,
                                        l.p50,
                                        l.p99,
                                        l.max,
                                        n.saturating_sub(sk.received),
                                    ));
                                }
                            }
                            Err(r) => {
                                failed = Some(r);
                                break 'sizes;
                            }
                        }
                    }
                    let rate = median(&rates);
                    if let Some(p) = Point::from_samples(rate, avgs.clone()) {
                        s.points.push(p);
                        let col = |f: fn(&(f64, f64, f64, f64, u64)) -> f64| {
                            median(&agg.iter().map(f).collect::<Vec<_>>())
                        };
                        rows.push(vec![
                            json!(e),
                            json!(size),
                            json!(gap),
                            jnum(rate),
                            jnum(rate * (46.0 + size as f64) * 8.0 / 1e10 * 100.0),
                            json!(agg.iter().map(|a| a.4).sum::<u64>()),
                            jnum(col(|a| a.0)),
                            jnum(col(|a| a.1)),
                            jnum(median(&avgs)),
                            jnum(col(|a| a.2)),
                            jnum(col(|a| a.3)),
                        ]);
                    }
                }
                s.points.sort_by(|a, b| a.x.total_cmp(&b.x));
                plot.series.push(s);
            }
            let have = plot.series.iter().any(|s| !s.points.is_empty());
            ex.settle(e.as_str(), "udp", failed, have, |r| format!("{e}: {r}"));
            plot.series.retain(|s| !s.points.is_empty());
            if !plot.series.is_empty() {
                ex.plots.push(plot);
            }
        }
        ex.tables.push(Table {
            caption: format!(
                "Per-packet one-way latency in {n}-datagram bursts (µs, medians of the repeats)"
            ),
            columns: [
                "engine",
                "size",
                "gap (ns)",
                "generator msg/s",
                "load % of 10GbE",
                "lost",
                "min",
                "p50",
                "avg",
                "p99",
                "max",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        });
        ex.flag_spread(1.0);
        ex
    }
}
