//! 3. Maximum message rate with zero loss.

use super::*;

impl<'a> Ctx<'a> {
    pub(crate) fn est_max_rate(&self) -> f64 {
        let per = (self.p.rate.steps + 1) as f64 * (self.p.rate.trial_s + 0.8)
            + if self.p.rate.confirm_s > 0.0 {
                self.repeats as f64 * (self.p.rate.confirm_s + 0.8)
            } else {
                0.0
            };
        per * self.engines.len() as f64
    }

    pub(crate) fn max_rate(&self, mut ex: Experiment) -> Experiment {
        let size = 64;
        ex.method = format!(
            "{size} B datagrams from the {} generator (`nanowire bench burst --duration`) paced at a rate, into a receiver (`nanowire bench sink --behaviour spin`) on the engine under test. The generator first runs unpaced to find the sender's ceiling; then a geometric bisection ({} steps of {} s) finds the highest rate whose run lost nothing{}.",
            self.gen_engine,
            self.p.rate.steps,
            self.p.rate.trial_s,
            if self.p.rate.confirm_s > 0.0 {
                format!(
                    ", confirmed by {} runs of {} s",
                    self.repeats, self.p.rate.confirm_s
                )
            } else {
                String::new()
            }
        );
        let mut series = Series::new("max zero-loss rate", "all", "udp", "max_zero_loss_rate");
        let mut rows = vec![];
        let mut cats = vec![];
        for (i, &e) in self.engines.iter().enumerate() {
            cats.push(e.to_string());
            let stream = |rate: Option<f64>, secs: f64| {
                self.trial(
                    e,
                    self.gen_engine,
                    "spin",
                    size,
                    0,
                    Some(secs),
                    rate,
                    0,
                    300,
                )
            };
            self.progress
                .step(&format!("max rate {e}: unpaced"), self.p.rate.trial_s + 0.8);
            let (g0, s0, raw) = match stream(None, self.p.rate.trial_s) {
                Ok(x) => x,
                Err(r) => {
                    self.progress.step(
                        &format!("max rate {e}: not available"),
                        self.est_max_rate() / self.engines.len() as f64,
                    );
                    ex.unavailable(e.as_str(), "udp", r);
                    continue;
                }
            };
            if s0.engine != e {
                ex.unavailable(
                    e.as_str(),
                    "udp",
                    format!("the sink fell back to {}", s0.engine),
                );
                continue;
            }
            ex.runs
                .push(json!({"engine": e, "phase": "unpaced", "result": raw}));
            let lost = |g: &BurstReport, s: &SinkReport| g.sent.saturating_sub(s.received);
            let ceiling = g0.rate_msg_s;
            let mut lo: Option<f64> = None;
            let mut hi = ceiling;
            let mut lo_trials: Vec<f64> = vec![];
            if lost(&g0, &s0) == 0 {
                lo = Some(s0.rate_msg_s.min(ceiling));
                lo_trials.push(s0.rate_msg_s);
                ex.notes.push(format!(
                    "{e}: no loss even unpaced; the rate is bounded by the generator ({} msg/s).",
                    fmt_num(ceiling)
                ));
            } else {
                let floor = 1000.0;
                let mut cand = (ceiling * 0.5).max(floor);
                for step in 0..self.p.rate.steps {
                    self.progress.step(
                        &format!("max rate {e}: {} msg/s (step {})", fmt_num(cand), step + 1),
                        self.p.rate.trial_s + 0.8,
                    );
                    match stream(Some(cand), self.p.rate.trial_s) {
                        Ok((g, s, raw)) => {
                            let l = lost(&g, &s);
                            ex.runs.push(json!({"engine": e, "phase": "search", "offered": cand, "lost": l, "result": raw}));
                            if l == 0 {
                                lo = Some(cand);
                                lo_trials = vec![s.rate_msg_s];
                            } else {
                                hi = cand;
                            }
                        }
                        Err(r) => {
                            ex.notes.push(format!("{e}: a search run failed: {r}"));
                            hi = cand;
                        }
                    }
                    let l = lo.unwrap_or(floor / 2.0);
                    if hi / l < 1.1 || (lo.is_none() && hi <= floor) {
                        break;
                    }
                    cand = (l * hi).sqrt().max(floor);
                }
            }
            // Confirm with repeats at the rate found.
            let mut confirmed = String::from("-");
            if let (Some(r), true) = (lo, self.p.rate.confirm_s > 0.0) {
                let mut ok = 0;
                let mut vals = vec![];
                for rep in 0..self.repeats {
                    self.progress.step(
                        &format!(
                            "max rate {e}: confirm {} msg/s ({}/{})",
                            fmt_num(r),
                            rep + 1,
                            self.repeats
                        ),
                        self.p.rate.confirm_s + 0.8,
                    );
                    if let Ok((g, s, raw)) = stream(Some(r), self.p.rate.confirm_s) {
                        ex.runs.push(json!({"engine": e, "phase": "confirm", "offered": r, "lost": lost(&g, &s), "result": raw}));
                        if lost(&g, &s) == 0 {
                            ok += 1;
                        }
                        vals.push(s.rate_msg_s);
                    }
                }
                confirmed = format!(
                    "{ok}/{} lossless over {} s",
                    self.repeats, self.p.rate.confirm_s
                );
                if ok < self.repeats {
                    ex.notes.push(format!("{e}: only {confirmed} at {} msg/s: the zero-loss rate is not stable at this length.", fmt_num(r)));
                }
                if !vals.is_empty() {
                    lo_trials = vals;
                }
            }
            ex.measured(e.as_str(), "udp");
            match lo {
                Some(r) => {
                    if let Some(mut p) = Point::from_samples(i as f64, lo_trials.clone()) {
                        // The bar shows the offered rate that was lossless; whiskers the received rates.
                        p.median = r;
                        p.min = p.min.min(r);
                        p.max = p.max.max(r);
                        series.points.push(p);
                    }
                }
                None => series.missing.push(i as f64),
            }
            rows.push(vec![
                json!(e),
                json!(size),
                lo.map_or(json!("< 1000 (lost even at 1000 msg/s)"), jnum),
                jnum(ceiling),
                jnum(s0.rate_msg_s),
                jnum(lost(&g0, &s0) as f64 / g0.sent.max(1) as f64 * 100.0),
                json!(confirmed),
                json!(s0.rmem_or_ring()),
            ]);
        }
        ex.plots.push(Plot {
            id: "max_rate".into(),
            title: format!("Highest rate with zero loss, {size} B UDP"),
            x_label: "receiving engine".into(),
            y_label: "msg/s".into(),
            x_log: false,
            y_log: false,
            categories: Some(cats),
            series: vec![series],
        });
        ex.tables.push(Table {
            caption: format!("Maximum message rate, {size} B UDP"),
            columns: [
                "engine",
                "size",
                "max zero-loss msg/s",
                "generator ceiling msg/s",
                "received unpaced msg/s",
                "loss unpaced %",
                "confirmation",
                "receive buffer",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        });
        ex
    }
}
