//! The seed methodology: the shared context (`Ctx`) and helpers here, one
//! file per experiment beside it (each an `impl Ctx` block), registered in
//! `super::suite`. Server side in host b
//! (pinned to CPU 1), client side in host a (CPU 0); every number comes from
//! the JSON the measuring processes print.

use super::exec::{Proc, Target};
use super::model::{Experiment, Plot, Point, Series, Table, fmt_num, median, median_of};
use super::progress::Progress;
use crate::testbed::Host;
use nanowire_bench::burst::{BurstReport, SinkReport, burst_time_10g_us};
use nanowire_stack::EngineKind;
use serde_json::{Value, json};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

mod latency_under_load;
mod latency_vs_load;
mod latency_vs_size;
mod max_rate;
mod microburst;
mod throughput;
mod tick_to_trade;

/// (engine label, protocol, size) -> (Gbps samples, %CPU samples).
type TpData = BTreeMap<(String, String, usize), (Vec<f64>, Vec<f64>)>;

/// How much of everything to run: each experiment's own settings.
#[derive(Debug, Clone)]
pub struct Params {
    pub pp: PingPong,
    pub ul: UnderLoad,
    pub rate: RateSearch,
    pub burst: BurstSearch,
    pub tp: Throughput,
    pub load: LoadSweep,
    /// Seconds of ticks per tick-to-trade run.
    pub t2t_secs: f64,
    /// Loss (percent, each direction) of the impaired-wire experiment.
    pub loss_points: Vec<f64>,
}

/// Latency vs message size; `secs` is also every other ping-pong run's
/// length (latency under load, capture, loss).
#[derive(Debug, Clone)]
pub struct PingPong {
    pub sizes: Vec<usize>,
    pub secs: u64,
}

/// Latency under load: the offered rates (`None`: max) at one size.
#[derive(Debug, Clone)]
pub struct UnderLoad {
    pub rates: Vec<Option<u64>>,
    pub size: usize,
}

/// Maximum rate with zero loss: the bisection's trials.
#[derive(Debug, Clone)]
pub struct RateSearch {
    pub trial_s: f64,
    /// Seconds of the confirming run at the rate found (0: none).
    pub confirm_s: f64,
    pub steps: usize,
}

/// Microburst tolerance: the burst sizes and the longest-burst search.
#[derive(Debug, Clone)]
pub struct BurstSearch {
    pub sizes: Vec<usize>,
    pub max: u64,
    /// Largest burst tried into a receiver that does not stall.
    pub max_nostall: u64,
    /// Stop the search when the bracket is within 1/precision of the answer.
    pub precision: u64,
    pub trials: u32,
    pub steps: usize,
}

/// Throughput vs I/O size.
#[derive(Debug, Clone)]
pub struct Throughput {
    pub sizes_udp: Vec<usize>,
    pub sizes_tcp: Vec<usize>,
    pub secs: f64,
    /// Also iperf3 -u, as the kernel engine's reference line.
    pub iperf_udp: bool,
}

/// Latency vs network load: bursts of `packets` at each size and gap.
#[derive(Debug, Clone)]
pub struct LoadSweep {
    pub sizes: Vec<usize>,
    pub gaps_ns: Vec<u64>,
    pub packets: u64,
}

impl UnderLoad {
    /// The quick and full suites' points: 10k to 500k msg/s and unpaced,
    /// 256-byte messages.
    pub fn standard() -> UnderLoad {
        UnderLoad {
            rates: vec![
                Some(10_000),
                Some(100_000),
                Some(250_000),
                Some(500_000),
                None,
            ],
            size: 256,
        }
    }
}

impl Params {
    pub fn quick() -> Params {
        Params {
            pp: PingPong {
                sizes: vec![16, 64, 1472],
                secs: 1,
            },
            ul: UnderLoad::standard(),
            rate: RateSearch {
                trial_s: 1.0,
                confirm_s: 0.0,
                steps: 5,
            },
            burst: BurstSearch {
                sizes: vec![256],
                max: 131_072,
                max_nostall: 32768,
                precision: 8,
                trials: 3,
                steps: 5,
            },
            tp: Throughput {
                sizes_udp: vec![64, 1472, 65507],
                sizes_tcp: vec![64, 1472, 65536],
                secs: 1.0,
                iperf_udp: false,
            },
            load: LoadSweep {
                sizes: vec![64, 1472],
                gaps_ns: vec![0, 2_000, 20_000, 200_000],
                packets: 500,
            },
            t2t_secs: 1.5,
            loss_points: vec![0.0, 0.1, 1.0],
        }
    }
    pub fn full() -> Params {
        Params {
            pp: PingPong {
                sizes: vec![16, 64, 256, 1024, 1472],
                secs: 2,
            },
            ul: UnderLoad::standard(),
            rate: RateSearch {
                trial_s: 3.0,
                confirm_s: 10.0,
                steps: 7,
            },
            burst: BurstSearch {
                sizes: vec![64, 256, 1024],
                max: 262_144,
                max_nostall: 131_072,
                precision: 16,
                trials: 3,
                steps: 7,
            },
            tp: Throughput {
                sizes_udp: vec![64, 256, 1472, 8192, 65507],
                sizes_tcp: vec![64, 1024, 16384, 65536],
                secs: 2.0,
                iperf_udp: true,
            },
            load: LoadSweep {
                sizes: vec![64, 512, 1472],
                gaps_ns: vec![0, 1_000, 2_000, 5_000, 50_000, 1_000_000],
                packets: 500,
            },
            t2t_secs: 5.0,
            loss_points: vec![0.0, 0.1, 1.0],
        }
    }
    /// A tiny suite for the tests: every experiment, a point or two each.
    pub fn smoke() -> Params {
        Params {
            pp: PingPong {
                sizes: vec![64, 1472],
                secs: 1,
            },
            ul: UnderLoad {
                rates: vec![Some(10_000), None],
                size: 256,
            },
            rate: RateSearch {
                trial_s: 0.5,
                confirm_s: 0.0,
                steps: 3,
            },
            burst: BurstSearch {
                sizes: vec![256],
                max: 4096,
                max_nostall: 4096,
                precision: 8,
                trials: 3,
                steps: 3,
            },
            tp: Throughput {
                sizes_udp: vec![1024],
                sizes_tcp: vec![1024],
                secs: 0.5,
                iperf_udp: false,
            },
            load: LoadSweep {
                sizes: vec![64],
                gaps_ns: vec![0, 20_000],
                packets: 500,
            },
            t2t_secs: 0.5,
            loss_points: vec![0.0, 1.0],
        }
    }
}

/// How an experiment of a report runs (registered, with its identity, in
/// `super::suite::all`).
pub trait ExperimentKind {
    /// Seconds it should take (progress estimate).
    fn estimate_s(&self, ctx: &Ctx) -> f64;
    /// Measure into `ex` (its identity set, nothing else yet): its method,
    /// plots, tables, notes, coverage and runs.
    fn run(&self, ctx: &Ctx, ex: Experiment) -> Experiment;
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

/// A latency sweep's runs with latency samples: (engine, protocol, point key)
/// -> the runs' JSON.
pub(crate) type SweepData<K> = BTreeMap<(String, &'static str, K), Vec<Value>>;

/// One point of a latency sweep: its progress label, the client arguments
/// after the mode, its tag in results.json and its key in the sweep's data.
pub(crate) struct SweepPoint<K> {
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

    /// [`Ctx::start_server`] as a step of the progress bar named `what`
    /// ("<what>: starting server"); a server that cannot start skips the
    /// `est` seconds its runs would have taken ("<what>: not available").
    pub(crate) fn server_step(
        &self,
        what: &str,
        e: EngineKind,
        tcp: bool,
        est: f64,
    ) -> Result<(Option<Proc>, u16), String> {
        self.progress.step(&format!("{what}: starting server"), 0.5);
        self.start_server(e, tcp).inspect_err(|_| {
            self.progress.step(&format!("{what}: not available"), est);
        })
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
        let v = p.finish_json(Duration::from_secs(secs + 20))?;
        // Every client result is read through the typed schema shared with
        // bench (`BenchResult`): a field renamed or retyped there fails here,
        // with its name, instead of turning into a silent "n/a" later.
        let r: nanowire_bench::BenchResult = serde_json::from_value(v.clone())
            .map_err(|e| format!("bench {} JSON does not match the schema: {e}", extra[0]))?;
        serde_json::to_value(&r).map_err(|e| e.to_string())
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
        let bind = self
            .target
            .client_addr()
            .map_or_else(|| "0.0.0.0".to_string(), |a| a.to_string());
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
        std::thread::sleep(Duration::from_millis(if self.target.real_wire() {
            50
        } else {
            5
        }));
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
}

fn srv_cpu(p: &mut Proc) -> f64 {
    p.cpu_seconds().unwrap_or(0.0)
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
    const STATS: [&str; 7] = ["min", "p50", "avg", "p99", "p99.9", "max", "stddev"];
    let mut rows = vec![];
    for (e, p, x, runs) in groups {
        let x = x
            .parse::<f64>()
            .map(|_| json!(x.parse::<u64>().unwrap_or(0)))
            .unwrap_or(json!(x));
        let mut row = vec![json!(e), json!(p), x];
        row.extend(STATS.map(|k| jnum(median_of(runs, |v| lat(v, k)))));
        row.push(jnum(median_of(runs, |v| num(v, "rate_msg_s"))));
        row.push(json!(runs.len()));
        rows.push(row);
    }
    let columns = [&["engine", "proto", xname][..], &STATS, &["msg/s", "runs"]].concat();
    Table {
        caption: caption.into(),
        columns: columns.into_iter().map(String::from).collect(),
        rows,
    }
}
