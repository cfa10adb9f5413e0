//! The seed methodology, one function per experiment. Server side in host b
//! (pinned to CPU 1), client side in host a (CPU 0); every number comes from
//! the JSON the measuring processes print.

use super::exec::{Proc, Target, proc_cpu_seconds};
use super::model::{Experiment, Plot, Point, Series, Table, fmt_num, median};
use super::progress::Progress;
use crate::testbed::Host;
use nanowire_bench::burst::{BurstReport, SinkReport, burst_time_10g_us};
use nanowire_stack::EngineKind;
use serde_json::{Value, json};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

/// (engine label, protocol, size) -> (Gbps samples, %CPU samples).
type TpData = BTreeMap<(String, String, usize), (Vec<f64>, Vec<f64>)>;

/// How much of everything to run.
#[derive(Debug, Clone)]
pub struct Params {
    pub pp_sizes: Vec<usize>,
    pub pp_secs: u64,
    pub ul_rates: Vec<Option<u64>>,
    pub ul_size: usize,
    pub rate_trial_s: f64,
    pub rate_confirm_s: f64,
    pub rate_steps: usize,
    pub burst_sizes: Vec<usize>,
    pub burst_max: u64,
    /// Largest burst tried into a receiver that does not stall.
    pub burst_max_nostall: u64,
    /// Stop the search when the bracket is within 1/precision of the answer.
    pub burst_precision: u64,
    pub burst_trials: u32,
    pub burst_steps: usize,
    pub tp_sizes_udp: Vec<usize>,
    pub tp_sizes_tcp: Vec<usize>,
    pub tp_secs: f64,
    pub tp_iperf_udp: bool,
    pub load_sizes: Vec<usize>,
    pub load_gaps_ns: Vec<u64>,
    pub load_packets: u64,
    /// Loss (percent, each direction) of the impaired-wire experiment.
    pub loss_points: Vec<f64>,
}

impl Params {
    pub fn quick() -> Params {
        Params {
            pp_sizes: vec![16, 64, 1472],
            pp_secs: 1,
            ul_rates: vec![
                Some(10_000),
                Some(100_000),
                Some(250_000),
                Some(500_000),
                None,
            ],
            ul_size: 256,
            rate_trial_s: 1.0,
            rate_confirm_s: 0.0,
            rate_steps: 5,
            burst_sizes: vec![256],
            burst_max: 131_072,
            burst_max_nostall: 32768,
            burst_precision: 8,
            burst_trials: 3,
            burst_steps: 5,
            tp_sizes_udp: vec![64, 1472, 65507],
            tp_sizes_tcp: vec![64, 1472, 65536],
            tp_secs: 1.0,
            tp_iperf_udp: false,
            load_sizes: vec![64, 1472],
            load_gaps_ns: vec![0, 2_000, 20_000, 200_000],
            load_packets: 500,
            loss_points: vec![0.0, 0.1, 1.0],
        }
    }
    pub fn full() -> Params {
        Params {
            pp_sizes: vec![16, 64, 256, 1024, 1472],
            pp_secs: 2,
            ul_rates: vec![
                Some(10_000),
                Some(100_000),
                Some(250_000),
                Some(500_000),
                None,
            ],
            ul_size: 256,
            rate_trial_s: 3.0,
            rate_confirm_s: 10.0,
            rate_steps: 7,
            burst_sizes: vec![64, 256, 1024],
            burst_max: 262_144,
            burst_max_nostall: 131_072,
            burst_precision: 16,
            burst_trials: 3,
            burst_steps: 7,
            tp_sizes_udp: vec![64, 256, 1472, 8192, 65507],
            tp_sizes_tcp: vec![64, 1024, 16384, 65536],
            tp_secs: 2.0,
            tp_iperf_udp: true,
            load_sizes: vec![64, 512, 1472],
            load_gaps_ns: vec![0, 1_000, 2_000, 5_000, 50_000, 1_000_000],
            load_packets: 500,
            loss_points: vec![0.0, 0.1, 1.0],
        }
    }
    /// A tiny suite for the tests: every experiment, a point or two each.
    pub fn smoke() -> Params {
        Params {
            pp_sizes: vec![64, 1472],
            pp_secs: 1,
            ul_rates: vec![Some(10_000), None],
            ul_size: 256,
            rate_trial_s: 0.5,
            rate_confirm_s: 0.0,
            rate_steps: 3,
            burst_sizes: vec![256],
            burst_max: 4096,
            burst_max_nostall: 4096,
            burst_precision: 8,
            burst_trials: 3,
            burst_steps: 3,
            tp_sizes_udp: vec![1024],
            tp_sizes_tcp: vec![1024],
            tp_secs: 0.5,
            tp_iperf_udp: false,
            load_sizes: vec![64],
            load_gaps_ns: vec![0, 20_000],
            load_packets: 500,
            loss_points: vec![0.0, 1.0],
        }
    }
}

pub struct Ctx<'a> {
    pub target: &'a Target,
    pub exe: String,
    pub engines: Vec<EngineKind>,
    pub repeats: u32,
    pub stall_ms: u64,
    /// RX ring depth of xdp receivers.
    pub xdp_ring: u32,
    pub p: Params,
    pub progress: &'a Progress,
    /// Engine of the burst/stream generator: the fastest that works.
    pub gen_engine: EngineKind,
    port: Cell<u16>,
}

pub const CLIENT_CPU: &str = "0";
pub const SERVER_CPU: &str = "1";

/// One point of a latency sweep: its progress label, the client arguments
/// after the mode, its tag in results.json and its key in the sweep's data.
struct SweepPoint<K> {
    label: String,
    args: Vec<String>,
    tag: (&'static str, Value),
    key: K,
}

fn proto_name(tcp: bool) -> &'static str {
    if tcp { "tcp" } else { "udp" }
}

fn lat(v: &Value, k: &str) -> Option<f64> {
    v.get("latency_us")?
        .get(k)?
        .as_f64()
        .filter(|x| x.is_finite())
}
fn num(v: &Value, k: &str) -> Option<f64> {
    v.get(k)?.as_f64().filter(|x| x.is_finite())
}

/// Engine colours and names are shared by every plot.
pub fn engine_label(e: &str) -> String {
    e.to_string()
}

impl<'a> Ctx<'a> {
    pub fn new(
        target: &'a Target,
        exe: String,
        engines: Vec<EngineKind>,
        repeats: u32,
        stall_ms: u64,
        p: Params,
        progress: &'a Progress,
    ) -> Ctx<'a> {
        Ctx {
            target,
            exe,
            engines,
            repeats,
            stall_ms,
            xdp_ring: 65536,
            p,
            progress,
            gen_engine: EngineKind::Spin,
            port: Cell::new(12000 + (std::process::id() % 2000) as u16 * 8),
        }
    }

    fn next_port(&self) -> u16 {
        let p = self.port.get();
        self.port.set(if p > 60000 { 12000 } else { p + 1 });
        p
    }

    fn argv(&self, args: &[&str]) -> Vec<String> {
        std::iter::once(self.exe.clone())
            .chain(args.iter().map(|s| s.to_string()))
            .collect()
    }

    /// `nanowire bench server` for one engine and protocol, in host b.
    /// In --peer mode the server already runs on the peer (started by the
    /// user) and nothing is started here.
    pub(super) fn start_server(
        &self,
        e: EngineKind,
        tcp: bool,
    ) -> Result<(Option<Proc>, u16), String> {
        if let Target::Peer { port, .. } = self.target {
            return Ok((None, *port));
        }
        let port = self.next_port();
        let addr = self.target.server_addr().to_string();
        let ps = port.to_string();
        let mut a = vec![
            "bench",
            "server",
            "-i",
            &addr,
            "-p",
            &ps,
            "--engine",
            e.as_str(),
            "--cpu",
            SERVER_CPU,
        ];
        if tcp {
            a.push("--tcp");
        }
        let cmd = self.target.command(Host::B, &self.argv(&a))?;
        let mut p = Proc::spawn(cmd, &format!("bench server --engine {e}"))?;
        p.settle(Duration::from_millis(400))?;
        Ok((Some(p), port))
    }

    /// Run a bench client mode (pp/ul/tp) in host a and parse its JSON.
    pub(super) fn client(
        &self,
        e: EngineKind,
        tcp: bool,
        port: u16,
        extra: &[String],
        secs: u64,
    ) -> Result<Value, String> {
        let addr = self.target.server_addr().to_string();
        let ps = port.to_string();
        let ts = secs.to_string();
        let mut a: Vec<String> = self.argv(&["bench"]);
        a.extend(extra.iter().cloned());
        for s in [
            "-i",
            &addr,
            "-p",
            &ps,
            "-t",
            &ts,
            "--engine",
            e.as_str(),
            "--cpu",
            CLIENT_CPU,
            "--json",
        ] {
            a.push(s.to_string());
        }
        if tcp {
            a.push("--tcp".into());
        }
        let cmd = self.target.command(Host::A, &a)?;
        let p = Proc::spawn(cmd, &format!("bench {} --engine {e}", extra[0]))?;
        p.finish_json(Duration::from_secs(secs + 20))
    }

    /// One generator -> sink trial. `count`: burst length (0 with `secs`).
    #[allow(clippy::too_many_arguments)]
    fn trial(
        &self,
        rx: EngineKind,
        gen_engine: EngineKind,
        behaviour: &str,
        size: usize,
        count: u64,
        secs: Option<f64>,
        rate: Option<f64>,
        gap_ns: u64,
        idle_ms: u64,
    ) -> Result<(BurstReport, SinkReport, Value), String> {
        let port = self.next_port();
        let run = (port as u32) << 8 | (std::process::id() & 0xff);
        let addr = self.target.server_addr().to_string();
        let (ps, rs, st, im) = (
            port.to_string(),
            run.to_string(),
            self.stall_ms.to_string(),
            idle_ms.to_string(),
        );
        let sink_argv = self.argv(&[
            "bench",
            "sink",
            "-i",
            &addr,
            "-p",
            &ps,
            "--behaviour",
            behaviour,
            "--stall-ms",
            &st,
            "--idle-ms",
            &im,
            "--timeout",
            "15",
            "--stop-on-eof",
            "--run",
            &rs,
            "--engine",
            rx.as_str(),
            "--cpu",
            SERVER_CPU,
            "--json",
        ]);
        let mut sink_argv = sink_argv;
        if rx == EngineKind::Xdp {
            sink_argv.extend(["--ring-depth".to_string(), self.xdp_ring.to_string()]);
        }
        let cmd = self.target.command(Host::B, &sink_argv)?;
        let mut sink = Proc::spawn_io(cmd, &format!("bench sink --engine {rx}"), true)?;
        sink.wait_ready("READY", Duration::from_secs(10))?;
        let (ss, cs, gs) = (
            size.to_string(),
            count.max(1).to_string(),
            gap_ns.to_string(),
        );
        // The xdp engine finds its interface from the bound address.
        let bind = match self.target {
            Target::Lab(l) => l.addr(Host::A).to_string(),
            Target::Peer { .. } => "0.0.0.0".to_string(),
        };
        let mut g = vec![
            "bench",
            "burst",
            "-i",
            &addr,
            "-p",
            &ps,
            "-m",
            &ss,
            "-n",
            &cs,
            "--gap-ns",
            &gs,
            "--run",
            &rs,
            "--bind",
            &bind,
            "--engine",
            gen_engine.as_str(),
            "--cpu",
            CLIENT_CPU,
            "--json",
        ];
        let (dur, rts);
        if let Some(s) = secs {
            dur = format!("{s}");
            g.extend(["--duration", &dur]);
        }
        if let Some(r) = rate {
            rts = format!("{r:.0}");
            g.extend(["--rate", &rts]);
        }
        let cmd = self.target.command(Host::A, &self.argv(&g))?;
        let gen_p = Proc::spawn(cmd, &format!("bench burst --engine {gen_engine}"))?;
        let gen_t = Duration::from_secs_f64(secs.unwrap_or(0.0) + 30.0);
        let gen_v = gen_p.finish_json(gen_t)?;
        // Everything the generator sent is queued or dropped by now (veth delivers in the
        // sender's context); leave a little time for a real link, then tell the sink.
        std::thread::sleep(Duration::from_millis(
            if matches!(self.target, Target::Lab(_)) {
                5
            } else {
                50
            },
        ));
        sink.close_stdin();
        let sink_v = sink.finish_json(Duration::from_secs_f64(
            20.0 + self.stall_ms as f64 / 1e3 + secs.unwrap_or(0.0),
        ))?;
        let gen_r: BurstReport =
            serde_json::from_value(gen_v.clone()).map_err(|e| format!("generator JSON: {e}"))?;
        let sk: SinkReport =
            serde_json::from_value(sink_v.clone()).map_err(|e| format!("sink JSON: {e}"))?;
        let raw = json!({"generator": gen_v, "sink": sink_v});
        Ok((gen_r, sk, raw))
    }

    /// Pick the fastest generator engine that opens.
    pub fn choose_generator(&mut self) {
        if self.engines.contains(&EngineKind::Xdp)
            && let Ok((g, _, _)) = self.trial(
                EngineKind::Spin,
                EngineKind::Xdp,
                "spin",
                64,
                16,
                None,
                None,
                0,
                100,
            )
            && g.engine == EngineKind::Xdp
        {
            self.gen_engine = EngineKind::Xdp;
        }
    }

    // -----------------------------------------------------------------------
    // 1. Latency vs message size (ping-pong).

    pub fn est_latency_vs_size(&self) -> f64 {
        let n = self.engines.len() * 2 * self.p.pp_sizes.len() * self.repeats as usize;
        n as f64 * (self.p.pp_secs as f64 + 0.5) + self.engines.len() as f64 * 2.0 * 0.5
    }

    /// Run `bench MODE` at every point, both protocols, every engine, the
    /// repeats back to back against one server per engine and protocol. Each
    /// run goes into `ex.runs` tagged with its point; runs with latency
    /// samples go into `data` under (engine, protocol, point key). A failed run
    /// skips the engine's later points and is recorded by `Experiment::settle`
    /// (`what` names the points in that note).
    fn latency_sweep<K: Ord + Copy>(
        &self,
        ex: &mut Experiment,
        mode: &str,
        what: &str,
        points: &[SweepPoint<K>],
        data: &mut BTreeMap<(String, &'static str, K), Vec<Value>>,
    ) {
        let run_s = self.p.pp_secs as f64 + 0.5;
        for tcp in [false, true] {
            let proto = proto_name(tcp);
            for &e in &self.engines {
                let est = run_s * points.len() as f64 * self.repeats as f64;
                self.progress
                    .step(&format!("{mode} {proto} {e}: starting server"), 0.5);
                let (srv, port) = match self.start_server(e, tcp) {
                    Ok(x) => x,
                    Err(r) => {
                        self.progress
                            .step(&format!("{mode} {proto} {e}: not available"), est);
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
                        match self.client(e, tcp, port, &extra, self.p.pp_secs) {
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
    }

    pub fn latency_vs_size(&self) -> Experiment {
        let mut ex = Experiment::new(
            "latency_vs_size",
            "1. Latency vs message size",
            "seeds 000, 001, 002",
            &format!(
                "sockperf-style ping-pong (`nanowire bench pp`), one-way latency = RTT/2, {} s per run, {} repeat(s); client in host a on CPU {CLIENT_CPU}, server in host b on CPU {SERVER_CPU}, both ends on the same engine.",
                self.p.pp_secs, self.repeats
            ),
        );
        // (engine, proto, size) -> runs
        let mut data: BTreeMap<(String, &str, usize), Vec<Value>> = BTreeMap::new();
        let points: Vec<SweepPoint<usize>> = self
            .p
            .pp_sizes
            .iter()
            .map(|&size| SweepPoint {
                label: format!("{size} B"),
                args: vec!["-m".into(), size.to_string()],
                tag: ("size", json!(size)),
                key: size,
            })
            .collect();
        self.latency_sweep(&mut ex, "pp", "sizes", &points, &mut data);
        for tcp in [false, true] {
            let proto = proto_name(tcp);
            let mut series = vec![];
            for &e in &self.engines {
                for metric in ["min", "avg", "p99"] {
                    let pts: Vec<Point> = self
                        .p
                        .pp_sizes
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
                        series.push(Series {
                            label: format!("{e} {metric}"),
                            engine: e.to_string(),
                            protocol: proto.into(),
                            metric: metric.into(),
                            points: pts,
                            missing: vec![],
                        });
                    }
                }
            }
            ex.plots.push(Plot {
                id: format!("latency_vs_size_{proto}"),
                title: format!("{} ping-pong latency vs size", proto.to_uppercase()),
                x_label: "message size (bytes)".into(),
                y_label: "one-way latency (µs)".into(),
                x_log: true,
                y_log: true,
                categories: None,
                series,
            });
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

    // -----------------------------------------------------------------------
    // 2. Latency under load.

    pub fn est_latency_under_load(&self) -> f64 {
        let n = self.engines.len() * 2 * self.p.ul_rates.len() * self.repeats as usize;
        n as f64 * (self.p.pp_secs as f64 + 0.5) + self.engines.len() as f64
    }

    pub fn latency_under_load(&self) -> Experiment {
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
            ex.plots.push(Plot {
                id: format!("latency_under_load_{proto}"),
                title: format!("{} latency under load, {size} B", proto.to_uppercase()),
                x_label: "offered rate (msg/s; max plotted at the rate reached)".into(),
                y_label: "one-way latency (µs)".into(),
                x_log: true,
                y_log: true,
                categories: None,
                series,
            });
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

    // -----------------------------------------------------------------------
    // 3. Maximum message rate with zero loss.

    pub fn est_max_rate(&self) -> f64 {
        let per = (self.p.rate_steps + 1) as f64 * (self.p.rate_trial_s + 0.8)
            + if self.p.rate_confirm_s > 0.0 {
                self.repeats as f64 * (self.p.rate_confirm_s + 0.8)
            } else {
                0.0
            };
        per * self.engines.len() as f64
    }

    pub fn max_rate(&self) -> Experiment {
        let size = 64;
        let mut ex = Experiment::new(
            "max_rate",
            "3. Maximum message rate with zero loss",
            "seed 003 table 1",
            &format!(
                "{size} B datagrams from the {} generator (`nanowire bench burst --duration`) paced at a rate, into a receiver (`nanowire bench sink --behaviour spin`) on the engine under test. The generator first runs unpaced to find the sender's ceiling; then a geometric bisection ({} steps of {} s) finds the highest rate whose run lost nothing{}.",
                self.gen_engine,
                self.p.rate_steps,
                self.p.rate_trial_s,
                if self.p.rate_confirm_s > 0.0 {
                    format!(
                        ", confirmed by {} runs of {} s",
                        self.repeats, self.p.rate_confirm_s
                    )
                } else {
                    String::new()
                }
            ),
        );
        let mut series = Series {
            label: "max zero-loss rate".into(),
            engine: "all".into(),
            protocol: "udp".into(),
            metric: "max_zero_loss_rate".into(),
            points: vec![],
            missing: vec![],
        };
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
                .step(&format!("max rate {e}: unpaced"), self.p.rate_trial_s + 0.8);
            let (g0, s0, raw) = match stream(None, self.p.rate_trial_s) {
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
                for step in 0..self.p.rate_steps {
                    self.progress.step(
                        &format!("max rate {e}: {} msg/s (step {})", fmt_num(cand), step + 1),
                        self.p.rate_trial_s + 0.8,
                    );
                    match stream(Some(cand), self.p.rate_trial_s) {
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
            if let (Some(r), true) = (lo, self.p.rate_confirm_s > 0.0) {
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
                        self.p.rate_confirm_s + 0.8,
                    );
                    if let Ok((g, s, raw)) = stream(Some(r), self.p.rate_confirm_s) {
                        ex.runs.push(json!({"engine": e, "phase": "confirm", "offered": r, "lost": lost(&g, &s), "result": raw}));
                        if lost(&g, &s) == 0 {
                            ok += 1;
                        }
                        vals.push(s.rate_msg_s);
                    }
                }
                confirmed = format!(
                    "{ok}/{} lossless over {} s",
                    self.repeats, self.p.rate_confirm_s
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

    // -----------------------------------------------------------------------
    // 4. Microburst tolerance.

    pub fn est_bursts(&self) -> f64 {
        let stall = self.stall_ms as f64 / 1e3 + 0.5;
        let per_size = (self.p.burst_steps + 3) as f64 * (stall + 0.6)
            + 2.0 * (self.p.burst_steps + 3) as f64 * 0.7;
        per_size * self.p.burst_sizes.len() as f64 * self.engines.len() as f64
    }

    pub fn bursts(&self) -> Experiment {
        let mut ex = Experiment::new(
            "microburst",
            "4. Microburst tolerance",
            "seed 000 (RFC 2544 back-to-back)",
            &format!(
                "The longest burst of back-to-back datagrams received with zero loss in {t}/{t} trials, found by search (up to {max} datagrams into a stalled receiver, {max2} otherwise). Generator: `nanowire bench burst` on the {g} engine in host a (batches through send_batch_to). Receiver `nanowire bench sink` on the engine under test in host b (kernel sockets with the default receive buffer; xdp with an RX ring of {ring} frames): (a) spin: reads as fast as it can; (b) stall: stops reading for {s} ms after the first datagram, then drains, which measures the buffer capacity; (c) echo: sends every datagram back (work per message). Burst time is the seed's (46 + size) × packets × 8 × 0.1 ns (10 GbE). Every lost datagram must show up in a drop counter of the receiver's namespace (Udp RcvbufErrors/InErrors, interface rx_dropped, softnet backlog drops, engine drop counters).",
                t = self.p.burst_trials,
                max = self.p.burst_max,
                max2 = self.p.burst_max_nostall,
                g = self.gen_engine,
                s = self.stall_ms,
                ring = self.xdp_ring
            ),
        );
        let mut rows = vec![];
        let behaviours = ["spin", "stall", "echo"];
        let cats: Vec<String> = self
            .p
            .burst_sizes
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
                let mut series = Series {
                    label: e.to_string(),
                    engine: e.to_string(),
                    protocol: "udp".into(),
                    metric: format!("lossless_burst_{b}"),
                    points: vec![],
                    missing: vec![],
                };
                for (si, &size) in self.p.burst_sizes.iter().enumerate() {
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
                                res.first_lossy.map_or(json!("-"), |n| json!(n)),
                                res.lost_in_lossy.map_or(json!("-"), |n| json!(n)),
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

    fn burst_search(
        &self,
        e: EngineKind,
        behaviour: &str,
        size: usize,
        ex: &mut Experiment,
    ) -> Result<BurstResult, String> {
        let t = self.p.burst_trials;
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
        let mut first_lossy: Option<u64> = None;
        let mut lost_in_lossy: Option<u64> = None;
        let mut accounted_all = true;
        let mut counters_used: Vec<&str> = vec![];
        let mut hint: Option<u64> = None;
        let mut n = if behaviour == "stall" {
            self.p.burst_max
        } else {
            self.p.burst_max_nostall
        };
        for step in 0..self.p.burst_steps + 1 {
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
                    if first_lossy.is_none_or(|f| n < f) {
                        first_lossy = Some(n);
                        lost_in_lossy = Some(lost);
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
            if h <= lo + 1 || (lo > 0 && (h - lo) * self.p.burst_precision <= lo) {
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
            lost_in_lossy,
            accounting,
            trials,
        })
    }

    // -----------------------------------------------------------------------
    // 5. Throughput and CPU efficiency.

    pub fn est_throughput(&self) -> f64 {
        let n_udp = self.engines.len() * self.p.tp_sizes_udp.len();
        let n_tcp = self.engines.len() * self.p.tp_sizes_tcp.len();
        ((n_udp + n_tcp) as f64 * (self.p.tp_secs + 0.9)
            + if self.p.tp_iperf_udp {
                self.p.tp_sizes_udp.len() as f64 * (self.p.tp_secs + 0.9)
            } else {
                0.0
            })
            * self.repeats as f64
    }

    pub fn throughput(&self) -> Experiment {
        let mut ex = Experiment::new(
            "throughput",
            "5. Throughput and CPU efficiency vs I/O size",
            "seed 001",
            &format!(
                "UDP: `nanowire bench burst --duration {s}` unpaced into `nanowire bench sink --behaviour spin`, both ends on the engine under test; Gbps counts payload received. TCP: iperf3 for the kernel engine (-A pins), `nanowire bench tp --tcp` for the others. %CPU is both hosts' processes (utime+stime from /proc of the two processes, 100% = one core); lower %CPU per Gbps is better. A spinning receiver burns its core by design.{}",
                if self.p.tp_iperf_udp {
                    " iperf3 -u is shown as a reference line for the kernel engine."
                } else {
                    ""
                },
                s = self.p.tp_secs
            ),
        );
        // (label, proto, size) -> (gbps samples, cpu% samples)
        let mut data: TpData = BTreeMap::new();
        let mut engines_lines: Vec<(String, String)> = vec![];
        for &e in &self.engines {
            let mut failed = None;
            for &size in &self.p.tp_sizes_udp {
                for rep in 0..self.repeats {
                    self.progress.step(
                        &format!("throughput udp {e} {size} B ({}/{})", rep + 1, self.repeats),
                        self.p.tp_secs + 0.9,
                    );
                    match self.trial(e, e, "spin", size, 0, Some(self.p.tp_secs), None, 0, 300) {
                        Ok((g, s, raw)) if s.received > 0 && s.active_s > 0.0 => {
                            if g.engine != e || s.engine != e {
                                failed = Some(format!("fell back to {}/{}", g.engine, s.engine));
                                break;
                            }
                            let gbps = s.bytes as f64 * 8.0 / s.active_s / 1e9;
                            let cpu = g.cpu_s / g.elapsed_s.max(1e-9) * 100.0
                                + s.cpu_s / s.wall_s.max(1e-9) * 100.0;
                            ex.runs.push(json!({"engine": e, "protocol": "udp", "size": size, "repeat": rep, "gbps": gbps, "cpu_pct": cpu, "result": raw}));
                            let d = data.entry((e.to_string(), "udp".into(), size)).or_default();
                            d.0.push(gbps);
                            d.1.push(cpu);
                        }
                        Ok(_) => {
                            ex.notes.push(format!("{e} udp {size} B: nothing received"));
                        }
                        Err(r) => {
                            ex.notes.push(format!("{e} udp {size} B: {r}"));
                            if !data.keys().any(|k| k.0 == e.as_str() && k.1 == "udp")
                                && size == self.p.tp_sizes_udp[0]
                            {
                                failed = Some(r);
                            }
                            break;
                        }
                    }
                }
                if failed.is_some() {
                    break;
                }
            }
            match failed {
                Some(r) => ex.unavailable(e.as_str(), "udp", r),
                None if data.keys().any(|k| k.0 == e.as_str() && k.1 == "udp") => {
                    ex.measured(e.as_str(), "udp");
                    engines_lines.push((e.to_string(), "udp".into()));
                }
                None => ex.unavailable(e.as_str(), "udp", "no size could be measured"),
            }
            // TCP
            let r = if e == EngineKind::Kernel {
                self.iperf_series(e, true, &mut data, &mut ex)
            } else {
                self.bench_tp_tcp(e, &mut data, &mut ex)
            };
            match r {
                Ok(()) => {
                    ex.measured(e.as_str(), "tcp");
                    engines_lines.push((e.to_string(), "tcp".into()));
                }
                Err(r) => ex.unavailable(e.as_str(), "tcp", r),
            }
        }
        if self.p.tp_iperf_udp
            && self.engines.contains(&EngineKind::Kernel)
            && self
                .iperf_series(EngineKind::Kernel, false, &mut data, &mut ex)
                .is_ok()
        {
            engines_lines.push(("kernel (iperf3)".into(), "udp".into()));
        }
        let mut rows = vec![];
        for proto in ["udp", "tcp"] {
            let mut s_gbps = vec![];
            let mut s_eff = vec![];
            for (label, p) in engines_lines.iter().filter(|(_, p)| p == proto) {
                let mut g = Series {
                    label: label.clone(),
                    engine: label.split(' ').next().unwrap_or("").into(),
                    protocol: p.clone(),
                    metric: "gbps".into(),
                    points: vec![],
                    missing: vec![],
                };
                let mut c = Series {
                    metric: "cpu_pct_per_gbps".into(),
                    ..g.clone()
                };
                for ((l, pp, size), (gb, cpu)) in &data {
                    if l != label || pp != p {
                        continue;
                    }
                    if let Some(pt) = Point::from_samples(*size as f64, gb.clone()) {
                        g.points.push(pt);
                    }
                    let eff: Vec<f64> = gb
                        .iter()
                        .zip(cpu)
                        .filter(|(g, _)| **g > 0.0)
                        .map(|(g, c)| c / g)
                        .collect();
                    if let Some(pt) = Point::from_samples(*size as f64, eff.clone()) {
                        c.points.push(pt);
                    }
                    rows.push(vec![
                        json!(label),
                        json!(p),
                        json!(size),
                        jnum(median(gb)),
                        jnum(median(cpu)),
                        jnum(median(&eff)),
                        json!(gb.len()),
                    ]);
                }
                g.points.sort_by(|a, b| a.x.total_cmp(&b.x));
                c.points.sort_by(|a, b| a.x.total_cmp(&b.x));
                s_gbps.push(g);
                s_eff.push(c);
            }
            ex.plots.push(Plot {
                id: format!("throughput_{proto}"),
                title: format!("{} throughput vs I/O size", proto.to_uppercase()),
                x_label: "I/O size (bytes)".into(),
                y_label: "Gbps received".into(),
                x_log: true,
                y_log: true,
                categories: None,
                series: s_gbps,
            });
            ex.plots.push(Plot {
                id: format!("cpu_per_gbps_{proto}"),
                title: format!("{} %CPU per Gbps (both hosts)", proto.to_uppercase()),
                x_label: "I/O size (bytes)".into(),
                y_label: "%CPU per Gbps".into(),
                x_log: true,
                y_log: true,
                categories: None,
                series: s_eff,
            });
        }
        ex.tables.push(Table {
            caption: "Throughput and CPU, medians of the repeats".into(),
            columns: [
                "engine",
                "proto",
                "size (B)",
                "Gbps",
                "%CPU (both hosts)",
                "%CPU per Gbps",
                "runs",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        });
        ex.flag_spread(0.5);
        ex
    }

    fn iperf_series(
        &self,
        e: EngineKind,
        tcp: bool,
        data: &mut TpData,
        ex: &mut Experiment,
    ) -> Result<(), String> {
        if matches!(self.target, Target::Peer { .. }) {
            return Err("needs an iperf3 server on the peer; not started in --peer mode".into());
        }
        let label = if tcp {
            e.to_string()
        } else {
            format!("{e} (iperf3)")
        };
        let proto = proto_name(tcp);
        let sizes = if tcp {
            &self.p.tp_sizes_tcp
        } else {
            &self.p.tp_sizes_udp
        };
        let addr = self.target.server_addr().to_string();
        let mut any = None;
        for &size in sizes {
            for rep in 0..self.repeats {
                self.progress.step(
                    &format!(
                        "throughput {proto} iperf3 {size} B ({}/{})",
                        rep + 1,
                        self.repeats
                    ),
                    self.p.tp_secs + 0.9,
                );
                let port = self.next_port().to_string();
                let srv = self.target.command(
                    Host::B,
                    &[
                        "iperf3".to_string(),
                        "-s".into(),
                        "-1".into(),
                        "-B".into(),
                        addr.clone(),
                        "-p".into(),
                        port.clone(),
                        "-A".into(),
                        SERVER_CPU.into(),
                    ],
                )?;
                let mut srv = Proc::spawn(srv, "iperf3 -s")?;
                srv.settle(Duration::from_millis(250))?;
                let secs = format!("{}", self.p.tp_secs.ceil().max(1.0) as u64);
                let mut a: Vec<String> = [
                    "iperf3",
                    "-c",
                    &addr,
                    "-p",
                    &port,
                    "-t",
                    &secs,
                    "-l",
                    &size.to_string(),
                    "-J",
                    "-A",
                    CLIENT_CPU,
                ]
                .map(String::from)
                .to_vec();
                if !tcp {
                    a.extend(["-u", "-b", "0"].map(String::from));
                }
                let cmd = self.target.command(Host::A, &a)?;
                let v = Proc::spawn(cmd, "iperf3 -c")?.finish_json(Duration::from_secs(30));
                drop(srv);
                let v = match v {
                    Ok(v) => v,
                    Err(r) => {
                        any.get_or_insert(Err(r));
                        break;
                    }
                };
                if let Some(err) = v.get("error").and_then(Value::as_str) {
                    any.get_or_insert(Err(format!("iperf3: {err}")));
                    break;
                }
                let end = &v["end"];
                let bps = if tcp {
                    end["sum_received"]["bits_per_second"].as_f64()
                } else {
                    end["sum"]["bits_per_second"].as_f64().map(|b| {
                        b * (1.0 - end["sum"]["lost_percent"].as_f64().unwrap_or(0.0) / 100.0)
                    })
                };
                let cpu = end["cpu_utilization_percent"]["host_total"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
                    + end["cpu_utilization_percent"]["remote_total"]
                        .as_f64()
                        .unwrap_or(f64::NAN);
                if let Some(b) = bps.filter(|b| *b > 0.0 && cpu.is_finite()) {
                    let d = data.entry((label.clone(), proto.into(), size)).or_default();
                    d.0.push(b / 1e9);
                    d.1.push(cpu);
                    any = Some(Ok(()));
                    ex.runs.push(json!({"engine": label, "protocol": proto, "size": size, "repeat": rep, "tool": "iperf3", "gbps": b / 1e9, "cpu_pct": cpu, "result": {"end": {"sum_received": end["sum_received"], "sum": end["sum"], "cpu_utilization_percent": end["cpu_utilization_percent"]}}}));
                }
            }
        }
        any.unwrap_or_else(|| Err("iperf3 gave no result".into()))
    }

    fn bench_tp_tcp(
        &self,
        e: EngineKind,
        data: &mut TpData,
        ex: &mut Experiment,
    ) -> Result<(), String> {
        let (srv, port) = self.start_server(e, true)?;
        let secs = self.p.tp_secs.ceil().max(1.0) as u64;
        let mut ok = false;
        for &size in &self.p.tp_sizes_tcp {
            for rep in 0..self.repeats {
                self.progress.step(
                    &format!("throughput tcp {e} {size} B ({}/{})", rep + 1, self.repeats),
                    self.p.tp_secs + 0.9,
                );
                let cpu_srv0 = srv.as_ref().map_or(0.0, srv_cpu);
                let extra = vec![
                    "tp".to_string(),
                    "-m".into(),
                    size.to_string(),
                    "--mps".into(),
                    "max".into(),
                ];
                let t0 = std::time::Instant::now();
                let v = self.client(e, true, port, &extra, secs)?;
                let wall = t0.elapsed().as_secs_f64();
                let rate = num(&v, "rate_msg_s").ok_or("bench tp printed no rate_msg_s")?;
                let gbps = rate * size as f64 * 8.0 / 1e9;
                // The client measures its own thread's CPU (1.0 = one core); the server's
                // comes from /proc over the whole run.
                let cli_cpu = v
                    .get("cpu_util")
                    .and_then(Value::as_f64)
                    .map_or(100.0, |c| c * 100.0);
                let cpu = (srv.as_ref().map_or(0.0, srv_cpu) - cpu_srv0) / wall * 100.0 + cli_cpu;
                if gbps > 0.0 {
                    ok = true;
                    let d = data.entry((e.to_string(), "tcp".into(), size)).or_default();
                    d.0.push(gbps);
                    d.1.push(cpu);
                    ex.runs.push(json!({"engine": e, "protocol": "tcp", "size": size, "repeat": rep, "gbps": gbps, "cpu_pct": cpu, "result": v}));
                }
            }
        }
        drop(srv);
        if ok {
            Ok(())
        } else {
            Err("bench tp --tcp measured nothing".into())
        }
    }

    // -----------------------------------------------------------------------
    // 6. Latency vs network load.

    pub fn est_load(&self) -> f64 {
        (self.engines.len() * self.p.load_sizes.len() * self.p.load_gaps_ns.len()) as f64
            * 0.85
            * self.repeats as f64
    }

    pub fn latency_vs_load(&self) -> Experiment {
        let n = self.p.load_packets;
        let mut ex = Experiment::new(
            "latency_vs_load",
            "6. Latency vs network load",
            "seed 004",
            &format!(
                "Bursts of {n} datagrams from the {} generator with an inter-packet gap swept from back-to-back to idle ({} ns); each datagram carries its CLOCK_MONOTONIC transmit time and the receiver (spinning, engine under test) takes the time when the datagram is in user memory: one-way latency per packet (both namespaces share one clock). {} repeat(s); the plot shows the average per burst against the rate the generator reached.",
                self.gen_engine,
                self.p
                    .load_gaps_ns
                    .iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.repeats
            ),
        );
        let mut rows = vec![];
        for &e in &self.engines {
            let mut plot = Plot {
                id: format!("latency_vs_load_{e}"),
                title: format!("Receiver {e}: latency vs offered load ({n}-packet bursts)"),
                x_label: "generator rate (msg/s)".into(),
                y_label: "avg one-way latency (µs)".into(),
                x_log: true,
                y_log: true,
                categories: None,
                series: vec![],
            };
            let mut failed = None;
            'sizes: for &size in &self.p.load_sizes {
                let mut s = Series {
                    label: format!("{size} B"),
                    engine: e.to_string(),
                    protocol: "udp".into(),
                    metric: "avg".into(),
                    points: vec![],
                    missing: vec![],
                };
                for &gap in &self.p.load_gaps_ns {
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

fn srv_cpu(p: &Proc) -> f64 {
    proc_cpu_seconds(p.pid()).unwrap_or(0.0)
}

pub struct BurstResult {
    pub lossless: u64,
    pub capped: bool,
    pub gen_rate: f64,
    pub peak: u64,
    pub first_lossy: Option<u64>,
    pub lost_in_lossy: Option<u64>,
    pub accounting: String,
    pub trials: u32,
}

trait RmemOrRing {
    fn rmem_or_ring(&self) -> String;
}
impl RmemOrRing for SinkReport {
    fn rmem_or_ring(&self) -> String {
        match self.rcvbuf {
            Some(b) => format!("{b} B (rmem_default)"),
            None => "engine ring".into(),
        }
    }
}

fn valid_latency(v: &Value) -> bool {
    let (Some(min), Some(p50), Some(max)) = (lat(v, "min"), lat(v, "p50"), lat(v, "max")) else {
        return false;
    };
    let received = num(v, "received").unwrap_or(0.0);
    received > 0.0 && min <= p50 && p50 <= max
}

fn loss_fraction(v: &Value) -> Option<f64> {
    let sent = num(v, "sent")?;
    let dropped = num(v, "dropped").unwrap_or(0.0);
    (sent > 0.0).then_some(dropped / sent)
}

pub fn jnum(v: f64) -> Value {
    if v.is_finite() {
        json!((v * 1000.0).round() / 1000.0)
    } else {
        json!("n/a")
    }
}

/// Seed-003-style rows from bench latency runs.
pub fn latency_table(
    caption: &str,
    groups: &[(String, String, String, Vec<Value>)],
    xname: &str,
) -> Table {
    let mut rows = vec![];
    for (e, p, x, runs) in groups {
        let m = |k: &str| median(&runs.iter().filter_map(|v| lat(v, k)).collect::<Vec<_>>());
        rows.push(vec![
            json!(e),
            json!(p),
            json!(
                x.parse::<f64>()
                    .map(|_| json!(x.parse::<u64>().unwrap_or(0)))
                    .unwrap_or(json!(x))
            ),
            jnum(m("min")),
            jnum(m("p50")),
            jnum(m("avg")),
            jnum(m("p99")),
            jnum(m("p99.9")),
            jnum(m("max")),
            jnum(m("stddev")),
            jnum(median(
                &runs
                    .iter()
                    .filter_map(|v| num(v, "rate_msg_s"))
                    .collect::<Vec<_>>(),
            )),
            json!(runs.len()),
        ]);
    }
    Table {
        caption: caption.into(),
        columns: [
            "engine", "proto", xname, "min", "p50", "avg", "p99", "p99.9", "max", "stddev",
            "msg/s", "runs",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    }
}
