//! 2. Latency under load.

use super::*;

impl<'a> Ctx<'a> {
    pub(crate) fn est_latency_under_load(&self) -> f64 {
        let n = self.engines.len() * 2 * self.p.ul_rates.len() * self.repeats as usize;
        n as f64 * (self.p.pp_secs as f64 + 0.5) + self.engines.len() as f64
    }

    pub(crate) fn latency_under_load(&self) -> Experiment {
        let size = self.p.ul_size;
        let mut ex = Experiment::new(
            "latency_under_load",
            "2. Latency under load",
            "seeds 000, 003",
            &format!(
                "`nanowire bench ul` at fixed offered rates and at max, {size} B, {} s per run, {} repeat(s). A point is drawn only when the rate reached is at least 90% of the offered rate and less than 1% of the messages are lost; others appear in the table as not sustained.",
                self.p.pp_secs, self.repeats
            ),
        );
        let mut data: BTreeMap<(String, &str, u64), Vec<Value>> = BTreeMap::new();
        let points: Vec<SweepPoint<u64>> = self
            .p
            .ul_rates
            .iter()
            .map(|&rate| {
                let rs = rate.map_or("max".to_string(), |r| r.to_string());
                SweepPoint {
                    label: format!("{rs} msg/s"),
                    args: vec!["-m".into(), size.to_string(), "--mps".into(), rs.clone()],
                    tag: ("offered", json!(rs)),
                    key: rate.unwrap_or(0),
                }
            })
            .collect();
        self.latency_sweep(&mut ex, "ul", "rates", &points, &mut data);
        let mut rows = vec![];
        for tcp in [false, true] {
            let proto = proto_name(tcp);
            let mut series = vec![];
            for &e in &self.engines {
                let mut by_metric: BTreeMap<&str, Series> = BTreeMap::new();
                for &rate in &self.p.ul_rates {
                    let Some(runs) = data.get(&(e.to_string(), proto, rate.unwrap_or(0))) else {
                        continue;
                    };
                    let reached = median(
                        &runs
                            .iter()
                            .filter_map(|v| num(v, "rate_msg_s"))
                            .collect::<Vec<_>>(),
                    );
                    let loss = median(&runs.iter().filter_map(loss_fraction).collect::<Vec<_>>());
                    let sustained = reached.is_finite()
                        && rate.is_none_or(|r| reached >= 0.9 * r as f64)
                        && (loss.is_nan() || loss < 0.01);
                    let x = rate.map_or(reached, |r| r as f64);
                    for metric in ["avg", "p99", "p99.9"] {
                        let s = by_metric.entry(metric).or_insert_with(|| Series {
                            label: format!("{e} {metric}"),
                            engine: e.to_string(),
                            protocol: proto.into(),
                            metric: metric.into(),
                            points: vec![],
                            missing: vec![],
                        });
                        if sustained {
                            if let Some(p) = Point::from_samples(
                                x,
                                runs.iter().filter_map(|v| lat(v, metric)).collect(),
                            ) {
                                s.points.push(p);
                            }
                        } else if x.is_finite() {
                            s.missing.push(x);
                        }
                    }
                    let m = |k: &str| {
                        median(&runs.iter().filter_map(|v| lat(v, k)).collect::<Vec<_>>())
                    };
                    rows.push(vec![
                        json!(e),
                        json!(proto),
                        json!(rate.map_or("max".into(), |r| fmt_num(r as f64))),
                        jnum(reached),
                        jnum(loss * 100.0),
                        json!(if sustained { "yes" } else { "no" }),
                        jnum(m("min")),
                        jnum(m("avg")),
                        jnum(m("p99")),
                        jnum(m("p99.9")),
                        jnum(m("max")),
                        json!(runs.len()),
                    ]);
                }
                series.extend(
                    by_metric
                        .into_values()
                        .filter(|s| !s.points.is_empty() || !s.missing.is_empty()),
                );
            }
            ex.plots.push(Plot::log_log(
                format!("latency_under_load_{proto}"),
                format!("{} latency under load, {size} B", proto.to_uppercase()),
                "offered rate (msg/s; max plotted at the rate reached)",
                "one-way latency (µs)",
                series,
            ));
        }
        ex.tables.push(Table {
            caption: format!(
                "Latency under load, {size} B, medians of the repeats (latency in µs)"
            ),
            columns: [
                "engine",
                "proto",
                "offered msg/s",
                "reached msg/s",
                "loss %",
                "sustained",
                "min",
                "avg",
                "p99",
                "p99.9",
                "max",
                "runs",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        });
        ex.flag_spread(0.5);
        ex
    }
}
