//! 4. Microburst tolerance.

use super::*;

/// What the search found for one engine, behaviour and size.
pub struct BurstResult {
    /// The longest burst received without loss in every trial.
    pub lossless: u64,
    /// The search never lost: `lossless` is a lower bound (its largest trial).
    pub capped: bool,
    pub gen_rate: f64,
    pub peak: u64,
    /// The shortest burst that lost datagrams, and how many it lost.
    pub first_lossy: Option<(u64, u64)>,
    pub accounting: String,
    pub trials: u32,
}

impl<'a> Ctx<'a> {
    pub(crate) fn est_bursts(&self) -> f64 {
        let stall = self.stall_ms as f64 / 1e3 + 0.5;
        let per_size = (self.p.burst.steps + 3) as f64 * (stall + 0.6)
            + 2.0 * (self.p.burst.steps + 3) as f64 * 0.7;
        per_size * self.p.burst.sizes.len() as f64 * self.engines.len() as f64
    }

    pub(crate) fn bursts(&self, mut ex: Experiment) -> Experiment {
        ex.method = format!(
            "The longest burst of back-to-back datagrams received with zero loss in {t}/{t} trials, found by search (up to {max} datagrams into a stalled receiver, {max2} otherwise). Generator: `nanowire bench burst` on the {g} engine in host a (batches through send_batch_to). Receiver `nanowire bench sink` on the engine under test in host b (kernel sockets with the default receive buffer; xdp with an RX ring of {ring} frames): (a) spin: reads as fast as it can; (b) stall: stops reading for {s} ms after the first datagram, then drains, which measures the buffer capacity; (c) echo: sends every datagram back (work per message). Burst time is the seed's (46 + size) × packets × 8 × 0.1 ns (10 GbE). Every lost datagram must show up in a drop counter of the receiver's namespace (Udp RcvbufErrors/InErrors, interface rx_dropped, softnet backlog drops, engine drop counters).",
            t = self.p.burst.trials,
            max = self.p.burst.max,
            max2 = self.p.burst.max_nostall,
            g = self.gen_engine,
            s = self.stall_ms,
            ring = self.xdp_ring
        );
        let mut rows = vec![];
        let behaviours = ["spin", "stall", "echo"];
        let cats: Vec<String> = self
            .p
            .burst
            .sizes
            .iter()
            .map(|s| format!("{s} B"))
            .collect();
        let mut plots: Vec<Plot> = behaviours
            .iter()
            .map(|b| Plot {
                id: format!("microburst_{b}"),
                title: format!(
                    "Longest lossless burst, receiver {}",
                    match *b {
                        "spin" => "spinning".to_string(),
                        "stall" => format!("stalled {} ms", self.stall_ms),
                        _ => "echoing".to_string(),
                    }
                ),
                x_label: "datagram size".into(),
                y_label: "datagrams".into(),
                x_log: false,
                y_log: true,
                categories: Some(cats.clone()),
                series: vec![],
            })
            .collect();
        for &e in &self.engines {
            let mut avail: Option<String> = None;
            for (bi, b) in behaviours.iter().enumerate() {
                let mut series = Series::new(e, e, "udp", format!("lossless_burst_{b}"));
                for (si, &size) in self.p.burst.sizes.iter().enumerate() {
                    if avail.is_some() {
                        continue;
                    }
                    match self.burst_search(e, b, size, &mut ex) {
                        Ok(res) => {
                            if let Some(p) =
                                Point::from_samples(si as f64, vec![res.lossless as f64; 1])
                            {
                                let mut p = p;
                                p.lower_bound = res.capped;
                                series.points.push(p);
                            }
                            rows.push(vec![
                                json!(e),
                                json!(b),
                                json!(size),
                                json!(if res.capped {
                                    format!("≥ {}", res.lossless)
                                } else {
                                    res.lossless.to_string()
                                }),
                                jnum(burst_time_10g_us(size, res.lossless)),
                                jnum(res.gen_rate),
                                json!(res.peak),
                                res.first_lossy.map_or(json!("-"), |(n, _)| json!(n)),
                                res.first_lossy.map_or(json!("-"), |(_, l)| json!(l)),
                                json!(res.accounting),
                                json!(res.trials),
                            ]);
                        }
                        Err(r) => {
                            avail = Some(r);
                        }
                    }
                }
                plots[bi].series.push(series);
            }
            match avail {
                Some(r) => ex.unavailable(e.as_str(), "udp", r),
                None => ex.measured(e.as_str(), "udp"),
            }
        }
        for p in &mut plots {
            p.series.retain(|s| !s.points.is_empty());
        }
        ex.plots = plots;
        ex.tables.push(Table {
            caption: "Longest burst received with zero loss".into(),
            columns: [
                "engine",
                "receiver",
                "size",
                "lossless burst",
                "burst time at 10GbE (µs)",
                "generator msg/s",
                "peak queue",
                "first lossy burst",
                "lost in it",
                "loss counted by",
                "trials",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        });
        ex
    }

    pub(crate) fn burst_search(
        &self,
        e: EngineKind,
        behaviour: &str,
        size: usize,
        ex: &mut Experiment,
    ) -> Result<BurstResult, String> {
        let t = self.p.burst.trials;
        let stall_s = if behaviour == "stall" {
            self.stall_ms as f64 / 1e3
        } else {
            0.0
        };
        let est = stall_s + 0.6;
        let mut trials = 0u32;
        let mut lo: u64 = 0;
        let mut hi: Option<u64> = None;
        let mut peak = 0u64;
        let mut gen_rates: Vec<f64> = vec![];
        let mut first_lossy: Option<(u64, u64)> = None;
        let mut accounted_all = true;
        let mut counters_used: Vec<&str> = vec![];
        let mut hint: Option<u64> = None;
        let mut n = if behaviour == "stall" {
            self.p.burst.max
        } else {
            self.p.burst.max_nostall
        };
        for step in 0..self.p.burst.steps + 1 {
            // Up to t trials; stop at the first loss.
            let mut ok_all = true;
            let mut rates = vec![];
            let mut peak_n = 0;
            for k in 0..t {
                self.progress.step(
                    &format!(
                        "burst {e} {behaviour} {size} B: {n} datagrams (step {}, trial {}/{t})",
                        step + 1,
                        k + 1
                    ),
                    est,
                );
                trials += 1;
                let (g, s, raw) =
                    self.trial(e, self.gen_engine, behaviour, size, n, None, None, 0, 200)?;
                if s.engine != e {
                    return Err(format!("the sink fell back to {}", s.engine));
                }
                let lost = n.saturating_sub(s.received);
                let acc = s.drops.accounted();
                ex.runs.push(json!({"engine": e, "behaviour": behaviour, "size": size, "burst": n, "lost": lost, "accounted": acc, "result": raw}));
                if g.sent < n {
                    return Err(format!(
                        "the generator sent only {} of {n} datagrams",
                        g.sent
                    ));
                }
                rates.push(g.rate_msg_s);
                peak_n = peak_n.max(s.peak_occupancy);
                if lost > 0 {
                    ok_all = false;
                    if first_lossy.is_none_or(|(f, _)| n < f) {
                        first_lossy = Some((n, lost));
                    }
                    if acc < lost {
                        accounted_all = false;
                    }
                    let d = &s.drops;
                    for (name, v) in [
                        ("RcvbufErrors", d.udp_rcvbuf_errors),
                        ("if rx_dropped", d.if_rx_dropped),
                        ("softnet drops", d.softnet_dropped),
                        ("engine drops", d.engine_dropped),
                    ] {
                        if v > 0 && !counters_used.contains(&name) {
                            counters_used.push(name);
                        }
                    }
                    // Capacity-limited loss (most of the burst lost): the receiver held `received`.
                    // A stalled receiver holds exactly its capacity, whatever the fraction lost.
                    hint = (lost * 2 > n || behaviour == "stall").then_some(s.received);
                    break;
                }
            }
            if ok_all {
                lo = n;
                peak = peak_n;
                gen_rates = rates;
            } else {
                hi = Some(n);
            }
            let Some(h) = hi else {
                break; // lossless at the largest burst tried
            };
            if h <= lo + 1 || (lo > 0 && (h - lo) * self.p.burst.precision <= lo) {
                break;
            }
            n = match hint.take() {
                Some(x) if x > lo && x < h => x,
                _ => {
                    let l = lo.max(1) as f64;
                    (((l * h as f64).sqrt()) as u64).clamp(lo + 1, h - 1)
                }
            };
        }
        let accounting = match (first_lossy, accounted_all) {
            (None, _) => "no loss".to_string(),
            (Some(_), true) => format!(
                "yes ({})",
                if counters_used.is_empty() {
                    "-".into()
                } else {
                    counters_used.join(", ")
                }
            ),
            (Some(_), false) => format!("NO: some loss not counted ({})", counters_used.join(", ")),
        };
        if first_lossy.is_some() && !accounted_all {
            ex.notes.push(format!(
                "{e} {behaviour} {size} B: some lost datagrams were not found in any drop counter."
            ));
        }
        Ok(BurstResult {
            lossless: lo,
            capped: hi.is_none(),
            gen_rate: median(&gen_rates),
            peak,
            first_lossy,
            accounting,
            trials,
        })
    }
}
