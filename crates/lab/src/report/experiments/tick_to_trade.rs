//! Section 10, tick-to-trade (Onload's trade_sim idea): an exchange in
//! host b multicasts ticks, a strategy in host a on each engine answers
//! each with a TCP order, the exchange stamps the order's arrival. With and
//! without a background feed on the same group.

use super::*;

/// The feed rates of the experiment: none, and 100k msg/s.
pub const FEEDS: [u64; 2] = [0, 100_000];
const GROUP: &str = "239.18.0.1";

fn feed_label(f: u64) -> String {
    if f == 0 {
        "no feed".into()
    } else {
        format!("feed {} msg/s", fmt_num(f as f64))
    }
}

/// The tick-to-trade statistics of the table, in its column order.
const T2T_STATS: [&str; 5] = ["min", "p50", "p99", "p99.9", "max"];

impl<'a> Ctx<'a> {
    pub(crate) fn est_tick_to_trade(&self) -> f64 {
        (self.engines.len() * FEEDS.len()) as f64
            * self.repeats as f64
            * (self.p.t2t_secs + 0.3 + 1.0)
    }

    /// One exchange/strategy run; returns (exchange JSON, strategy JSON).
    fn t2t_run(&self, e: EngineKind, feed: u64) -> Result<(Value, Value), String> {
        if !self.target.runs_servers() {
            return Err("needs an exchange started in host b (the lab, or --remote)".into());
        }
        let port = self.next_port();
        let md_port = self.next_port();
        let addr = self.target.server_addr().to_string();
        let (ps, ms, fs, ts) = (
            port.to_string(),
            md_port.to_string(),
            feed.to_string(),
            format!("{}", self.p.t2t_secs),
        );
        // Where both ends meet: the exchange's order port and tick group.
        let meet = ["-i", &addr, "-p", &ps, "--group", GROUP, "--md-port", &ms];
        let ex_argv = self.argv(
            &[
                &["bench", "exchange"][..],
                &meet,
                &[
                    "--feed-rate",
                    &fs,
                    "-t",
                    &ts,
                    "--engine",
                    self.gen_engine.as_str(),
                    "--cpu",
                    SERVER_CPU,
                    "--json",
                ],
            ]
            .concat(),
        );
        let cmd = self.target.command(Host::B, &ex_argv)?;
        let mut ex = Proc::spawn(cmd, "bench exchange")?;
        ex.wait_ready("READY", Duration::from_secs(10))?;
        let mut st_argv = self.argv(
            &[
                &["bench", "strategy"][..],
                &meet,
                &[
                    "--engine",
                    e.as_str(),
                    "--cpu",
                    CLIENT_CPU,
                    "--timeout",
                    "30",
                    "--json",
                ],
            ]
            .concat(),
        );
        st_argv.push("--no-fallback".into());
        let cmd = self.target.command(Host::A, &st_argv)?;
        let st = Proc::spawn(cmd, &format!("bench strategy --engine {e}"))?;
        let limit = Duration::from_secs_f64(self.p.t2t_secs + 25.0);
        let ex_v = ex.finish_json(limit);
        let st_v = st.finish_json(Duration::from_secs(10));
        let st_v = st_v?;
        let ex_v = ex_v?;
        Ok((ex_v, st_v))
    }

    pub(crate) fn tick_to_trade(&self, mut ex: Experiment) -> Experiment {
        ex.method = format!(
            "An exchange in host b (`nanowire bench exchange`, spinning, CPU {SERVER_CPU}; market data sent on the {} engine, the fastest that opens, like the burst generator's; orders read from a kernel TCP socket) multicasts market data to {GROUP}: 1000 ticks/s, plus (second setting) a background feed of 100k msg/s on the same group and port, flagged in each message as in trade_sim, so the strategy reads and inspects every message but answers only ticks. A strategy in host a (`nanowire bench strategy`, CPU {CLIENT_CPU}) on the engine under test — kernel: blocking kernel sockets; spin: polled kernel sockets; xdp: the engine's multicast socket and its TCP (native API) — answers each tick with a 24-byte order over TCP. Tick-to-trade = the order's arrival at the exchange (kernel receive stamp, SO_TIMESTAMPNS) − the tick's send time (CLOCK_REALTIME before sendto; both hosts share the machine's clock). {} s per run after 0.3 s of warm-up, {} repeat(s), medians.",
            self.gen_engine, self.p.t2t_secs, self.repeats
        );
        // (engine, feed) -> exchange reports
        let mut data: BTreeMap<(String, u64), Vec<Value>> = BTreeMap::new();
        for &e in &self.engines {
            let mut failed = None;
            'feeds: for &feed in &FEEDS {
                for rep in 0..self.repeats {
                    self.progress.step(
                        &format!(
                            "tick-to-trade {e} {} ({}/{})",
                            feed_label(feed),
                            rep + 1,
                            self.repeats
                        ),
                        self.p.t2t_secs + 1.3,
                    );
                    match self.t2t_run(e, feed) {
                        Ok((xv, sv)) => {
                            if sv["engine"].as_str() != Some(e.as_str()) {
                                failed = Some(format!("the strategy ran on {}", sv["engine"]));
                                break 'feeds;
                            }
                            if xv["t2t_us"].is_null() {
                                failed = Some(format!("no order arrived: {xv}"));
                                break 'feeds;
                            }
                            let mut xv2 = xv.clone();
                            xv2["strategy_tick_us"] = sv["tick_us"].clone();
                            data.entry((e.to_string(), feed)).or_default().push(xv2);
                            ex.runs.push(json!({"engine": e, "protocol": "tcp", "feed_rate": feed, "repeat": rep, "result": xv, "strategy": sv}));
                        }
                        Err(r) => {
                            failed = Some(r);
                            break 'feeds;
                        }
                    }
                }
            }
            let have = data.keys().any(|k| k.0 == e.as_str());
            ex.settle(e.as_str(), "tcp", failed, have, |r| {
                format!("{e}: a run failed, later settings skipped: {r}")
            });
        }
        let t2t = |v: &Value, k: &str| v["t2t_us"][k].as_f64().filter(|x| x.is_finite());
        let cats: Vec<String> = FEEDS.iter().map(|&f| feed_label(f)).collect();
        for (metric, title) in [("p50", "median"), ("p99", "p99")] {
            let mut series = vec![];
            for &e in &self.engines {
                let pts: Vec<Point> = FEEDS
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &f)| {
                        let runs = data.get(&(e.to_string(), f))?;
                        Point::from_samples(
                            i as f64,
                            runs.iter().filter_map(|v| t2t(v, metric)).collect(),
                        )
                    })
                    .collect();
                if !pts.is_empty() {
                    series.push(Series::new(e, e, "tcp", metric).with_points(pts));
                }
            }
            ex.plots.push(Plot {
                id: format!("tick_to_trade_{metric}"),
                title: format!("Tick-to-trade, {title} (µs)"),
                x_label: "market data".into(),
                y_label: format!("tick-to-trade {metric} (µs)"),
                x_log: false,
                y_log: true,
                categories: Some(cats.clone()),
                series,
            });
        }
        let mut rows = vec![];
        for ((e, feed), runs) in &data {
            let n = |k: &str| median_of(runs, |v| v[k].as_f64());
            let mut row = vec![json!(e), json!(feed_label(*feed))];
            row.extend(T2T_STATS.map(|k| jnum(median_of(runs, |v| t2t(v, k)))));
            row.extend([
                jnum(median_of(runs, |v| v["strategy_tick_us"]["p50"].as_f64())),
                jnum(median_of(runs, |v| v["tick_send_us"]["p50"].as_f64())),
                jnum(n("ticks")),
                jnum(n("missing")),
                jnum(n("feed_rate")),
                json!(runs.len()),
            ]);
            rows.push(row);
        }
        ex.tables.push(Table {
            caption: "Tick-to-trade (µs), medians of the repeats; tick one-way = the strategy's read of a tick - its send (the rest of tick-to-trade is the order's way back); exchange send = how long the exchange's send call took per tick (on veth the tick reaches the strategy inside it, so the two are close; both are shared by every engine and are slow when ticks are sparse: docs/benchmarks.md, session 6); missing = measured ticks without an order".into(),
            columns: [
                &["engine", "market data"][..],
                &T2T_STATS,
                &[
                    "tick one-way p50",
                    "exchange send p50",
                    "ticks",
                    "missing",
                    "feed msg/s reached",
                    "runs",
                ],
            ]
            .concat()
            .into_iter()
            .map(String::from)
            .collect(),
            rows,
        });
        // xdp vs spin, the acceptance ratio.
        for &feed in &FEEDS {
            let p50 = |e: &str| {
                data.get(&(e.to_string(), feed))
                    .map(|r| median(&r.iter().filter_map(|v| t2t(v, "p50")).collect::<Vec<_>>()))
            };
            if let (Some(x), Some(s)) = (p50("xdp"), p50("spin"))
                && x.is_finite()
                && s.is_finite()
                && s > 0.0
            {
                ex.notes.push(format!(
                    "{}: xdp p50 / spin p50 = {:.2} ({} / {} µs).",
                    feed_label(feed),
                    x / s,
                    fmt_num(x),
                    fmt_num(s)
                ));
            }
        }
        ex.flag_spread(0.5);
        ex
    }
}
