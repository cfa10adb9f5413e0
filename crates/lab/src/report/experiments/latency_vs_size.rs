//! 1. Latency vs message size (ping-pong).

use super::*;

impl PingPong {
    /// The size sweep: one point per message size.
    fn points(&self) -> Vec<SweepPoint<usize>> {
        self.sizes
            .iter()
            .map(|&size| SweepPoint {
                label: format!("{size} B"),
                args: vec!["-m".into(), size.to_string()],
                tag: ("size", json!(size)),
                key: size,
            })
            .collect()
    }
}

impl<'a> Ctx<'a> {
    pub(crate) fn est_latency_vs_size(&self) -> f64 {
        let n = self.engines.len() * 2 * self.p.pp.sizes.len() * self.repeats as usize;
        n as f64 * (self.p.pp.secs as f64 + 0.5) + self.engines.len() as f64 * 2.0 * 0.5
    }

    /// Run `bench MODE` at every point, both protocols, every engine, the
    /// repeats back to back against one server per engine and protocol. Each
    /// run goes into `ex.runs` tagged with its point; runs with latency
    /// samples are returned under (engine, protocol, point key). A failed run
    /// skips the engine's later points and is recorded by `Experiment::settle`
    /// (`what` names the points in that note).
    pub(crate) fn latency_sweep<K: Ord + Copy>(
        &self,
        ex: &mut Experiment,
        mode: &str,
        what: &str,
        points: &[SweepPoint<K>],
    ) -> SweepData<K> {
        let mut data = SweepData::new();
        let run_s = self.p.pp.secs as f64 + 0.5;
        for tcp in [false, true] {
            let proto = proto_name(tcp);
            for &e in &self.engines {
                let est = run_s * points.len() as f64 * self.repeats as f64;
                let step = format!("{mode} {proto} {e}");
                let (srv, port) = match self.server_step(&step, e, tcp, est) {
                    Ok(x) => x,
                    Err(r) => {
                        ex.unavailable(e.as_str(), proto, r);
                        continue;
                    }
                };
                let mut failed = None;
                'points: for pt in points {
                    for rep in 0..self.repeats {
                        self.progress.step(
                            &format!(
                                "{mode} {proto} {e} {} (repeat {}/{})",
                                pt.label,
                                rep + 1,
                                self.repeats
                            ),
                            run_s,
                        );
                        let mut extra = vec![mode.to_string()];
                        extra.extend(pt.args.iter().cloned());
                        match self.client(e, tcp, port, &extra, self.p.pp.secs) {
                            Ok(v) if valid_latency(&v) => {
                                let mut run =
                                    json!({"engine": e, "protocol": proto, "repeat": rep});
                                run[pt.tag.0] = pt.tag.1.clone();
                                data.entry((e.to_string(), proto, pt.key))
                                    .or_default()
                                    .push(v.clone());
                                run["result"] = v;
                                ex.runs.push(run);
                            }
                            Ok(v) => {
                                failed = Some(format!("bench {mode} gave no latency samples: {v}"));
                                break 'points;
                            }
                            Err(r) => {
                                failed = Some(r);
                                break 'points;
                            }
                        }
                    }
                }
                drop(srv);
                let have = data.keys().any(|k| k.0 == e.as_str() && k.1 == proto);
                ex.settle(e.as_str(), proto, failed, have, |r| {
                    format!("{e} {proto}: a run failed, later {what} skipped: {r}")
                });
            }
        }
        data
    }

    pub(crate) fn latency_vs_size(&self, mut ex: Experiment) -> Experiment {
        ex.method = format!(
            "sockperf-style ping-pong (`nanowire bench pp`), one-way latency = RTT/2, {} s per run, {} repeat(s); client in host a on CPU {CLIENT_CPU}, server in host b on CPU {SERVER_CPU}, both ends on the same engine.",
            self.p.pp.secs, self.repeats
        );
        let data = self.latency_sweep(&mut ex, "pp", "sizes", &self.p.pp.points());
        for tcp in [false, true] {
            let proto = proto_name(tcp);
            let mut series = vec![];
            for &e in &self.engines {
                for metric in ["min", "avg", "p99"] {
                    let pts: Vec<Point> = self
                        .p
                        .pp
                        .sizes
                        .iter()
                        .filter_map(|&s| {
                            let runs = data.get(&(e.to_string(), proto, s))?;
                            Point::from_samples(
                                s as f64,
                                runs.iter().filter_map(|v| lat(v, metric)).collect(),
                            )
                        })
                        .collect();
                    if !pts.is_empty() {
                        series.push(
                            Series::new(format!("{e} {metric}"), e, proto, metric).with_points(pts),
                        );
                    }
                }
            }
            ex.plots.push(
                Plot::per_proto(proto, "latency_vs_size", "ping-pong latency vs size")
                    .log_log(("message size (bytes)", "one-way latency (µs)"), series),
            );
        }
        ex.tables.push(latency_table(
            "Ping-pong, medians of the repeats (µs)",
            &data
                .iter()
                .map(|((e, p, s), v)| (e.clone(), p.to_string(), s.to_string(), v.clone()))
                .collect::<Vec<_>>(),
            "size (B)",
        ));
        ex.flag_spread(0.5);
        ex
    }
}
