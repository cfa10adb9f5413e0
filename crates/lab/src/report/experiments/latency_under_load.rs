//! 2. Latency under load.

use super::*;

impl UnderLoad {
    /// The rate sweep: one point per offered rate (`max`: key 0).
    fn points(&self) -> Vec<SweepPoint<u64>> {
        let size = self.size;
        self.rates
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
            .collect()
    }
}

impl<'a> Ctx<'a> {
    pub(crate) fn est_latency_under_load(&self) -> f64 {
        let n = self.engines.len() * 2 * self.p.ul.rates.len() * self.repeats as usize;
        n as f64 * (self.p.pp.secs as f64 + 0.5) + self.engines.len() as f64
    }

    pub(crate) fn latency_under_load(&self, mut ex: Experiment) -> Experiment {
        let size = self.p.ul.size;
        ex.method = format!(
            "`nanowire bench ul` at fixed offered rates and at max, {size} B, {} s per run, {} repeat(s). A point is drawn only when the rate reached is at least 90% of the offered rate and less than 1% of the messages are lost; others appear in the table as not sustained.",
            self.p.pp.secs, self.repeats
        );
        let data = self.latency_sweep(&mut ex, "ul", "rates", &self.p.ul.points());
        let mut rows = vec![];
        for tcp in [false, true] {
            let proto = proto_name(tcp);
            let mut series = vec![];
            for &e in &self.engines {
                let mut by_metric: BTreeMap<&str, Series> = BTreeMap::new();
                for &rate in &self.p.ul.rates {
                    let Some(runs) = data.get(&(e.to_string(), proto, rate.unwrap_or(0))) else {
                        continue;
                    };
                    let reached = median_of(runs, |v| num(v, "rate_msg_s"));
                    let loss = median_of(runs, loss_fraction);
                    let sustained = reached.is_finite()
                        && rate.is_none_or(|r| reached >= 0.9 * r as f64)
                        && (loss.is_nan() || loss < 0.01);
                    let x = rate.map_or(reached, |r| r as f64);
                    for metric in ["avg", "p99", "p99.9"] {
                        let s = by_metric.entry(metric).or_insert_with(|| {
                            Series::new(format!("{e} {metric}"), e, proto, metric)
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
                    let m = |k: &str| median_of(runs, |v| lat(v, k));
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
            let title = format!("latency under load, {size} B");
            let x = "offered rate (msg/s; max plotted at the rate reached)";
            ex.plots.push(
                Plot::per_proto(proto, "latency_under_load", &title)
                    .log_log((x, "one-way latency (µs)"), series),
            );
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
