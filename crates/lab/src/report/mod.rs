//! `nanowire lab report`: the seed suite on every engine, written to
//! `DIR/index.html` (self-contained, inline SVG) and `DIR/results.json`
//! (every number behind every plot, plus the environment).

pub mod capture;
pub mod exec;
pub mod experiments;
pub mod html;
pub mod loss;
pub mod model;
pub mod progress;
pub mod remote;
pub mod suite;

use crate::testbed::{Host, Lab, LabOptions};
use clap::Args;
use exec::Target;
use experiments::{Ctx, Params, jnum};
use model::{Experiment, Report, SCHEMA, Table, fmt_num, median, median_of};
use nanowire_doctor::read as read_trim;
use nanowire_stack::EngineKind;
use progress::Progress;
use serde_json::{Map, Value, json};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// The quick suite (about 3 minutes): fewer sizes and rates, 1 repeat.
    #[arg(long)]
    pub quick: bool,
    /// A tiny suite for tests: one or two points per experiment.
    #[arg(long, hide = true)]
    pub smoke: bool,
    /// Output directory (index.html, results.json).
    #[arg(long, default_value = "lab-report")]
    pub out: PathBuf,
    /// Engines to compare, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "kernel,spin,xdp")]
    pub engines: Vec<EngineKind>,
    /// Repeats per point (default 3, 1 with --quick).
    #[arg(long)]
    pub repeats: Option<u32>,
    /// How long a stalled receiver stops reading in the microburst test.
    #[arg(long = "stall-ms", default_value_t = 800)]
    pub stall_ms: u64,
    /// RX ring depth (frames) of xdp receivers in the burst/rate experiments.
    #[arg(long = "xdp-ring", default_value_t = 65536)]
    pub xdp_ring: u32,
    /// Only these experiments (ids, comma separated): latency_vs_size,
    /// latency_under_load, max_rate, microburst, throughput, latency_vs_load,
    /// tick_to_trade, capture, loss.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Two real hosts: the peer running `nanowire bench server` (no lab).
    #[arg(long)]
    pub peer: Option<Ipv4Addr>,
    /// The local interface facing --peer.
    #[arg(long)]
    pub iface: Option<String>,
    /// Port of `nanowire bench server` on the peer (start one for UDP and one with --tcp).
    #[arg(long = "peer-port", default_value_t = 11111)]
    pub peer_port: u16,
    /// Two real hosts: host b reached over ssh (USER@HOST or an ssh config
    /// alias; BatchMode, your keys and config). The report starts every server
    /// there itself, copying this nanowire over when host b has no nanowire of
    /// this version. Needs --local-addr and --remote-addr.
    #[arg(long, value_name = "USER@HOST", conflicts_with = "peer")]
    pub remote: Option<String>,
    /// With --remote: this host's address facing host b (host a, the clients).
    #[arg(long = "local-addr", requires = "remote")]
    pub local_addr: Option<Ipv4Addr>,
    /// With --remote: host b's address (the servers bind it).
    #[arg(long = "remote-addr", requires = "remote")]
    pub remote_addr: Option<Ipv4Addr>,
    /// With --remote: an ssh option (-o), e.g. --ssh-opt Port=2222 (repeatable).
    #[arg(long = "ssh-opt", value_name = "OPTION", requires = "remote")]
    pub ssh_opts: Vec<String>,
    /// Re-render index.html in --out from an existing results.json (no measurements).
    #[arg(long = "render-only")]
    pub render_only: bool,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
}

fn validate(a: &ReportArgs) -> Result<(), String> {
    if a.engines.is_empty() {
        return Err("--engines needs at least one of kernel, spin, xdp".into());
    }
    if a.repeats == Some(0) || a.repeats.is_some_and(|r| r > 20) {
        return Err("--repeats must be 1..=20".into());
    }
    if !(64..=1 << 20).contains(&a.xdp_ring) {
        return Err("--xdp-ring must be 64..=1048576".into());
    }
    if a.stall_ms == 0 || a.stall_ms > 60_000 {
        return Err("--stall-ms must be 1..=60000".into());
    }
    let ids = suite::ids();
    for o in &a.only {
        if !ids.contains(o) {
            return Err(format!(
                "unknown experiment {o:?} in --only: expected one of {}",
                ids.join(", ")
            ));
        }
    }
    if let Some(r) = &a.remote {
        if a.local_addr.is_none() || a.remote_addr.is_none() {
            return Err(
                "--remote needs --local-addr (this host's address) and --remote-addr (host b's)"
                    .into(),
            );
        }
        if r.is_empty() || r.starts_with('-') || r.chars().any(|c| c.is_whitespace()) {
            return Err(format!(
                "--remote {r:?}: expected USER@HOST or an ssh config alias"
            ));
        }
        if a.ssh_opts
            .iter()
            .any(|o| !o.contains('=') || o.starts_with('-'))
        {
            return Err("--ssh-opt takes NAME=VALUE (an ssh -o option)".into());
        }
    }
    match (&a.peer, &a.iface) {
        (Some(_), None) => {
            return Err("--peer needs --iface (the local interface facing the peer)".into());
        }
        (None, Some(_)) => return Err("--iface is only used with --peer".into()),
        (Some(_), Some(i))
            if (!std::path::Path::new("/sys/class/net").join(i).exists()
                || i.contains('/')
                || i.is_empty()) =>
        {
            return Err(format!("unknown interface {i:?}"));
        }
        _ => {}
    }
    Ok(())
}

fn first_line(cmd: &mut Command) -> Value {
    match cmd.stdin(std::process::Stdio::null()).output() {
        Ok(o) => {
            let s = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            s.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map_or(Value::Null, |l| json!(l.trim_start_matches("sockperf: ")))
        }
        Err(_) => json!("not installed"),
    }
}

const SYSCTLS: [&str; 12] = [
    "net.core.rmem_default",
    "net.core.rmem_max",
    "net.core.wmem_default",
    "net.core.wmem_max",
    "net.core.busy_poll",
    "net.core.busy_read",
    "net.core.netdev_max_backlog",
    "net.core.netdev_budget",
    "net.ipv4.udp_mem",
    "net.ipv4.udp_rmem_min",
    "kernel.timer_migration",
    "kernel.sched_rt_runtime_us",
];

/// The environment the numbers hold for.
pub fn environment(target: &Target) -> Value {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    });
    let mem = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .next()
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
    });
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mut sysctls = Map::new();
    // Host b's (the receiver's) sysctls, in one ssh round trip.
    let remote_sysctls: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    for k in SYSCTLS {
        let path = format!("/proc/sys/{}", k.replace('.', "/"));
        // Network sysctls are per namespace: read them where the receiver runs;
        // the ones only the initial namespace has (busy_poll, backlog, ...) from here.
        let root = || read_trim(&path).map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "));
        let v = match (target, k.starts_with("net.")) {
            (Target::Remote(r), _) => remote_sysctls
                .get_or_init(|| {
                    let cmd = SYSCTLS
                        .iter()
                        .map(|k| {
                            format!(
                                "echo \"$(cat /proc/sys/{} 2>/dev/null)\"",
                                k.replace('.', "/")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; ");
                    r.ssh
                        .run(&cmd, "reading sysctls", None)
                        .map(|o| {
                            o.lines()
                                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .get(SYSCTLS.iter().position(|x| *x == k).unwrap_or(0))
                .cloned()
                .filter(|v: &String| !v.is_empty()),
            (Target::Lab(l), true) => exec::run_capture(
                l.command(Host::B, &["cat", path.as_str()]),
                Duration::from_secs(5),
            )
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .or_else(root),
            _ => root(),
        };
        sysctls.insert(k.into(), v.map_or(Value::Null, Value::from));
    }
    let lab = match target {
        Target::Lab(l) => {
            let st = l.status();
            let b = st.b.as_ref();
            json!({
                "name": st.name,
                "driver": b.and_then(|h| h.driver.clone()),
                "server_iface": b.map(|h| h.iface.clone()),
                "client_iface": st.a.as_ref().map(|h| h.iface.clone()),
                "xdp": b.and_then(|h| h.xdp.clone()).unwrap_or_else(|| "none attached between runs (engines attach their own)".into()),
                "offloads_server": b.map(|h| h.offloads.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")),
                "offloads_client": st.a.as_ref().map(|h| h.offloads.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")),
                "topology": "two network namespaces joined by a veth pair; client on CPU 0, server on CPU 1",
            })
        }
        Target::Remote(r) => {
            let one = |h: &remote::HostInfo, role: &str| {
                format!(
                    "{} ({role}): {} {} on {}, driver {}, Linux {}, {}",
                    h.hostname,
                    h.addr,
                    h.arch,
                    h.iface,
                    h.driver.as_deref().unwrap_or("?"),
                    h.kernel,
                    h.cpu_model.as_deref().unwrap_or("?")
                )
            };
            json!({
                "host_a": one(&r.a, "host a, clients, this machine"),
                "host_b": one(&r.b, &format!("host b, servers, over ssh to {}", r.ssh.dest)),
                "driver": format!("{} / {}", r.a.driver.as_deref().unwrap_or("?"), r.b.driver.as_deref().unwrap_or("?")),
                "nanowire_on_b": r.nanowire,
                "xdp": "none attached between runs (engines attach their own)",
                "topology": "two real hosts: clients in host a (CPU 0), servers in host b (CPU 1) over a real wire",
            })
        }
        Target::Peer { addr, iface, .. } => json!({
            "peer": addr.to_string(),
            "iface": iface,
            "driver": read_trim(format!("/sys/class/net/{iface}/device/driver/module")).or_else(|| {
                std::fs::read_link(format!("/sys/class/net/{iface}/device/driver")).ok().and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
            }),
            "topology": "two real hosts",
        }),
    };
    let virt = nanowire_bench::env::virtualization();
    let mut tools = Map::new();
    tools.insert("nanowire".into(), json!(env!("CARGO_PKG_VERSION")));
    tools.insert(
        "sockperf".into(),
        first_line(Command::new("sockperf").arg("--version")),
    );
    tools.insert(
        "iperf3".into(),
        first_line(Command::new("iperf3").arg("--version")),
    );
    tools.insert("iproute2".into(), first_line(Command::new("ip").arg("-V")));
    tools.insert(
        "ethtool".into(),
        first_line(Command::new("ethtool").arg("--version")),
    );
    let hosts = match target {
        Target::Remote(r) => json!({"a": r.a, "b": r.b}),
        _ => Value::Null,
    };
    json!({
        "hosts": hosts,
        "kernel": read_trim("/proc/sys/kernel/osrelease").map(|r| format!("Linux {r}")),
        "kernel_version": read_trim("/proc/sys/kernel/version"),
        "cpu_model": cpu_model,
        "cpus": cpus,
        "memory": mem,
        "virtualization": virt.0,
        "virtualization_evidence": virt.1,
        "loadavg_start": read_trim("/proc/loadavg"),
        "clock": "CLOCK_MONOTONIC (shared by every namespace of the machine)",
        "lab": lab,
        "sysctls": sysctls,
        "tools": tools,
    })
}

/// Aggregate CPU times from /proc/stat: (idle incl. iowait, total), in ticks.
fn cpu_times() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let l = s.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = l
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest counted in user).
    let total: u64 = v.iter().take(8).sum();
    Some((v.get(3)? + v.get(4).copied().unwrap_or(0), total))
}

/// How idle the machine was over `window`: the fraction of CPU time idle,
/// and the CPUs' worth of other work (busy fraction x CPUs).
pub fn cpu_idle_window(window: Duration) -> Value {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    let Some((i0, t0)) = cpu_times() else {
        return Value::Null;
    };
    std::thread::sleep(window);
    let Some((i1, t1)) = cpu_times() else {
        return Value::Null;
    };
    let dt = t1.saturating_sub(t0).max(1) as f64;
    let idle = (i1.saturating_sub(i0) as f64 / dt).clamp(0.0, 1.0);
    json!({
        "window_s": window.as_secs_f64(),
        "idle_fraction": (idle * 1000.0).round() / 1000.0,
        "busy_cpus": (((1.0 - idle) * cpus) * 100.0).round() / 100.0,
        "cpus": cpus,
    })
}

fn fmt_ratio(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.0}x")
    } else if r >= 1.0 {
        format!("{r:.2}x")
    } else {
        format!("{r:.3}x")
    }
}

/// A headline value and whether it is a lower bound (a search that never lost).
type MetricFn<'a> = Box<dyn Fn(&str) -> Option<(f64, bool)> + 'a>;

/// Seed-003-style summary tables and the headline ratios.
fn summary(exps: &[Experiment], engines: &[EngineKind]) -> (Experiment, Table) {
    let mut ex = Experiment::new(
        "summary",
        "7. Summary",
        "seed 003 exhibits",
        "One-way latency in µs in the style of seed 003's exhibits: ping-pong at each size (mps = round trips per second reached) and latency under load at each offered rate, medians of the repeats.",
    );
    let find = |id: &str| exps.iter().find(|e| e.who.id == id);
    for proto in ["udp", "tcp"] {
        let mut rows = vec![];
        for src in ["latency_vs_size", "latency_under_load"] {
            let Some(e) = find(src) else { continue };
            // Group runs by (engine, size/offered).
            let mut groups: Vec<(String, String, Vec<&Value>)> = vec![];
            for r in e.runs.iter().filter(|r| r["protocol"] == proto) {
                let eng = r["engine"].as_str().unwrap_or("?").to_string();
                let key = if src == "latency_vs_size" {
                    r["size"].to_string()
                } else {
                    format!(
                        "{}@{}",
                        r["result"]["msg_size"],
                        r["offered"].as_str().unwrap_or("?")
                    )
                };
                match groups.iter_mut().find(|g| g.0 == eng && g.1 == key) {
                    Some(g) => g.2.push(&r["result"]),
                    None => groups.push((eng, key, vec![&r["result"]])),
                }
            }
            for (eng, key, runs) in groups {
                let m = |f: &dyn Fn(&Value) -> Option<f64>| median_of(&runs, |v| f(v));
                let l = |k: &'static str| move |v: &Value| v["latency_us"][k].as_f64();
                let size = key.split('@').next().unwrap_or("").to_string();
                let size_v: Value = size.parse::<u64>().map(Value::from).unwrap_or(json!(size));
                rows.push(vec![
                    json!(eng),
                    size_v,
                    jnum(m(&|v: &Value| v["rate_msg_s"].as_f64())),
                    jnum(m(&l("stddev"))),
                    jnum(m(&l("min"))),
                    jnum(m(&l("avg"))),
                    jnum(m(&l("p99"))),
                    jnum(m(&l("max"))),
                    json!(if src == "latency_vs_size" {
                        "ping-pong".to_string()
                    } else {
                        format!(
                            "under load, offered {}",
                            key.split('@').nth(1).unwrap_or("?")
                        )
                    }),
                ]);
            }
        }
        ex.tables.push(Table {
            caption: format!("{} one-way latency (µs)", proto.to_uppercase()),
            columns: [
                "engine", "size", "mps", "stddev", "min", "avg", "99%ile", "max", "test",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        });
    }

    // Headline: each engine vs the kernel engine.
    let pp = find("latency_vs_size");
    let pp_size = pp
        .and_then(|e| {
            let sizes: Vec<u64> = e.runs.iter().filter_map(|r| r["size"].as_u64()).collect();
            if sizes.contains(&64) {
                Some(64)
            } else {
                sizes.into_iter().min()
            }
        })
        .unwrap_or(64);
    let pp_metric = |eng: &str, proto: &str, k: &str| -> Option<f64> {
        let v: Vec<f64> = pp?
            .runs
            .iter()
            .filter(|r| {
                r["engine"] == eng && r["protocol"] == proto && r["size"].as_u64() == Some(pp_size)
            })
            .filter_map(|r| r["result"]["latency_us"][k].as_f64())
            .collect();
        let m = median(&v);
        m.is_finite().then_some(m)
    };
    let bar_value =
        |id: &str, plot: &str, eng: &str, cat_idx: Option<usize>| -> Option<(f64, bool)> {
            let p = find(id)?.plots.iter().find(|p| p.id == plot)?;
            let cats = p.categories.as_ref()?;
            match cat_idx {
                None => {
                    let i = cats.iter().position(|c| c == eng)?;
                    p.series
                        .first()?
                        .points
                        .iter()
                        .find(|pt| pt.x as usize == i)
                        .map(|pt| (pt.median, pt.lower_bound))
                }
                Some(ci) => p
                    .series
                    .iter()
                    .find(|s| s.engine == eng)?
                    .points
                    .iter()
                    .find(|pt| pt.x as usize == ci)
                    .map(|pt| (pt.median, pt.lower_bound)),
            }
        };
    let burst_cat = find("microburst")
        .and_then(|e| e.plots.first())
        .and_then(|p| p.categories.as_ref())
        .and_then(|c| c.iter().position(|x| x == "256 B").or(Some(0)));
    let burst_name = find("microburst")
        .and_then(|e| e.plots.first())
        .and_then(|p| p.categories.as_ref())
        .and_then(|c| burst_cat.and_then(|i| c.get(i).cloned()))
        .unwrap_or_else(|| "256 B".into());
    let metrics: Vec<(String, MetricFn)> = vec![
        (
            format!("UDP ping-pong p50 µs ({pp_size} B)"),
            Box::new(move |e: &str| pp_metric(e, "udp", "p50").map(|v| (v, false))),
        ),
        (
            format!("UDP ping-pong p99 µs ({pp_size} B)"),
            Box::new(move |e: &str| pp_metric(e, "udp", "p99").map(|v| (v, false))),
        ),
        (
            format!("TCP ping-pong p50 µs ({pp_size} B)"),
            Box::new(move |e: &str| pp_metric(e, "tcp", "p50").map(|v| (v, false))),
        ),
        (
            "tick-to-trade p50 µs (no feed)".into(),
            Box::new(move |e: &str| bar_value("tick_to_trade", "tick_to_trade_p50", e, Some(0))),
        ),
        (
            "tick-to-trade p50 µs (feed 100k msg/s)".into(),
            Box::new(move |e: &str| bar_value("tick_to_trade", "tick_to_trade_p50", e, Some(1))),
        ),
        (
            "max zero-loss rate msg/s (64 B)".into(),
            Box::new(move |e: &str| bar_value("max_rate", "max_rate", e, None)),
        ),
        (
            format!("lossless burst, stalled receiver ({burst_name})"),
            Box::new(move |e: &str| bar_value("microburst", "microburst_stall", e, burst_cat)),
        ),
        (
            format!("lossless burst, spinning receiver ({burst_name})"),
            Box::new(move |e: &str| bar_value("microburst", "microburst_spin", e, burst_cat)),
        ),
    ];
    // The flat profile under load: p99 at the highest fixed offered rate / at the lowest.
    let ul = find("latency_under_load");
    let ul_rates: Vec<u64> = ul
        .map(|e| {
            let mut r: Vec<u64> = e
                .runs
                .iter()
                .filter_map(|r| r["offered"].as_str()?.parse().ok())
                .collect();
            r.sort();
            r.dedup();
            r
        })
        .unwrap_or_default();
    // Runs of one engine (UDP) at one offered rate.
    let ul_runs = move |eng: &str, rate: u64| -> Vec<&serde_json::Value> {
        ul.map(|e| {
            e.runs
                .iter()
                .filter(|r| {
                    r["engine"] == eng
                        && r["protocol"] == "udp"
                        && r["offered"].as_str() == Some(rate.to_string().as_str())
                })
                .map(|r| &r["result"])
                .collect()
        })
        .unwrap_or_default()
    };
    let ul_median = move |eng: &str, rate: u64, f: &dyn Fn(&serde_json::Value) -> Option<f64>| {
        let v: Vec<f64> = ul_runs(eng, rate).into_iter().filter_map(f).collect();
        let m = median(&v);
        m.is_finite().then_some(m)
    };
    let p99 = |r: &serde_json::Value| r["latency_us"]["p99"].as_f64();
    let reached = |r: &serde_json::Value| r["rate_msg_s"].as_f64();
    let loss = |r: &serde_json::Value| {
        let sent = r["sent"].as_f64()?;
        (sent > 0.0).then(|| r["dropped"].as_f64().unwrap_or(0.0) / sent)
    };
    // Sustained as in the experiment's table: >= 90% of the offered rate
    // reached with < 1% loss (medians of the repeats).
    let sustained = move |eng: &str, rate: u64| {
        ul_median(eng, rate, &reached).is_some_and(|x| x >= 0.9 * rate as f64)
            && ul_median(eng, rate, &loss).is_some_and(|l| l < 0.01)
    };
    let mut flat_row = None;
    let mut not_reached: Vec<String> = vec![];
    if let (Some(&lo), Some(&hi)) = (ul_rates.first(), ul_rates.last())
        && lo != hi
    {
        let mut row = vec![json!(format!(
            "UDP p99 under load ÷ p99 at {} msg/s (flat = 1)",
            fmt_num(lo as f64)
        ))];
        for e in engines {
            let eng = e.as_str();
            // The highest offered rate this engine sustained; a rate it could
            // not reach says nothing about latency at that rate.
            let top = ul_rates
                .iter()
                .rev()
                .copied()
                .find(|&r| r > lo && sustained(eng, r));
            let cell = match (top, ul_median(eng, lo, &p99)) {
                (Some(t), Some(l)) if l > 0.0 => match ul_median(eng, t, &p99) {
                    Some(h) => {
                        let mut c = format!("{} @ {}", fmt_ratio(h / l), fmt_num(t as f64));
                        if t != hi {
                            let got = ul_median(eng, hi, &reached).map_or("n/a".into(), fmt_num);
                            not_reached.push(format!("{eng} reached {got}"));
                            c.push_str(" †");
                        }
                        json!(c)
                    }
                    None => json!("n/a"),
                },
                _ => json!("n/a (no rate above the lowest sustained)"),
            };
            row.push(cell);
            if *e != EngineKind::Kernel {
                row.push(json!("-"));
            }
        }
        flat_row = Some(row);
    }
    let mut columns = vec!["metric".to_string()];
    for e in engines {
        columns.push(e.to_string());
        if *e != EngineKind::Kernel {
            columns.push(format!("{e} / kernel"));
        }
    }
    let mut rows = vec![];
    for (name, f) in &metrics {
        let mut row = vec![json!(name)];
        let k = f("kernel");
        for e in engines {
            let v = f(e.as_str());
            row.push(match v {
                None => json!("n/a"),
                Some((x, true)) => json!(format!("≥ {}", fmt_num(x))),
                Some((x, false)) => jnum(x),
            });
            if *e != EngineKind::Kernel {
                row.push(match (v, k) {
                    (Some((v, vb)), Some((k, kb))) if k > 0.0 => {
                        // A bound on the engine's side makes the ratio a bound too;
                        // on the kernel's side it makes it meaningless.
                        match (vb, kb) {
                            (_, true) => json!("n/a (kernel value is a bound)"),
                            (true, false) => json!(format!("≥ {}", fmt_ratio(v / k))),
                            _ => json!(fmt_ratio(v / k)),
                        }
                    }
                    _ => json!("n/a"),
                });
            }
        }
        rows.push(row);
    }
    rows.extend(flat_row);
    let mut caption = "Headline: medians from this run; ratios engine / kernel".to_string();
    if !not_reached.is_empty()
        && let Some(&hi) = ul_rates.last()
    {
        caption.push_str(&format!(
            ". † {} msg/s offered was not sustained ({}); the ratio uses the highest rate that was (section 2)",
            fmt_num(hi as f64),
            not_reached.join(", ")
        ));
    }
    let headline = Table {
        caption,
        columns,
        rows,
    };
    for e in engines {
        if exps.iter().any(|x| {
            x.coverage
                .iter()
                .any(|c| c.engine == e.as_str() && c.available)
        }) {
            ex.measured(e.as_str(), "udp");
        } else {
            ex.unavailable(
                e.as_str(),
                "udp",
                "no experiment could measure this engine (see the sections above)",
            );
        }
    }
    (ex, headline)
}

pub fn run(args: ReportArgs, lab_name: &str) -> Result<i32, String> {
    validate(&args)?;
    if args.render_only {
        // The directory exists already: a symlink there is refused as a new
        // one's is (`create_dir`), so nothing is written where it points.
        nanowire_outfile::not_a_link(&args.out).map_err(|e| e.to_string())?;
        let jp = args.out.join("results.json");
        let s = std::fs::read_to_string(&jp)
            .map_err(|e| format!("cannot read {}: {e}", jp.display()))?;
        let mut r: Report =
            serde_json::from_str(&s).map_err(|e| format!("{}: not a report: {e}", jp.display()))?;
        // The summary and headline are derived from the measurements: derive
        // them again (with this build's rules), leaving every measurement as is.
        let engines: Vec<EngineKind> = r.engines.iter().filter_map(|e| e.parse().ok()).collect();
        r.experiments.retain(|e| e.who.id != "summary");
        let (sum, headline) = summary(&r.experiments, &engines);
        r.experiments.push(sum);
        r.headline = headline;
        let js = serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?;
        write_out(&jp, js.as_bytes())?;
        let hp = args.out.join("index.html");
        write_out(&hp, html::render(&r).as_bytes())?;
        println!("report: {}", hp.display());
        return Ok(0);
    }
    let t0 = Instant::now();
    let mut engines = vec![];
    for e in &args.engines {
        if !engines.contains(e) {
            engines.push(*e);
        }
    }
    let mode = if args.smoke {
        "smoke"
    } else if args.quick {
        "quick"
    } else {
        "full"
    };
    let repeats = args
        .repeats
        .unwrap_or(if args.quick || args.smoke { 1 } else { 3 });
    let params = match mode {
        "smoke" => Params::smoke(),
        "quick" => Params::quick(),
        _ => Params::full(),
    };
    // The output directory first: a refused one (a planted symlink) fails
    // before any lab is made or anything measured.
    nanowire_outfile::create_dir(&args.out, 0o750).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the nanowire binary: {e}"))?
        .to_string_lossy()
        .into_owned();
    let target = match (&args.peer, &args.iface) {
        _ if args.remote.is_some() => {
            let (Some(dest), Some(la), Some(ra)) =
                (&args.remote, args.local_addr, args.remote_addr)
            else {
                unreachable!("validated");
            };
            let r = remote::Remote::connect(
                remote::Ssh {
                    dest: dest.clone(),
                    opts: args.ssh_opts.clone(),
                },
                la,
                ra,
                &exe,
            )?;
            if !args.quiet {
                for n in &r.notes {
                    eprintln!("nanowire lab report: {n}");
                }
            }
            Target::Remote(std::sync::Arc::new(r))
        }
        (Some(addr), Some(iface)) => Target::Peer {
            addr: *addr,
            iface: iface.clone(),
            port: args.peer_port,
        },
        _ => {
            let lab = Lab::new(LabOptions {
                name: lab_name.to_string(),
                queues: 1,
            })?;
            lab.up()?;
            Target::Lab(lab)
        }
    };
    let env = environment(&target);
    let progress = Progress::new(1.0, args.quiet);
    let mut ctx = Ctx::new(
        &target,
        exe,
        engines.clone(),
        repeats,
        args.stall_ms,
        params,
        &progress,
    );
    ctx.xdp_ring = args.xdp_ring;
    ctx.choose_generator();
    let wanted = |id: &str| args.only.is_empty() || args.only.iter().any(|o| o == id);
    let all = suite::all();
    let plan: Vec<(&suite::Entry, f64)> =
        all.iter().map(|e| (e, e.kind.estimate_s(&ctx))).collect();
    let total: f64 = plan
        .iter()
        .filter(|(e, _)| wanted(&e.who.id))
        .map(|(_, t)| t)
        .sum();
    let progress = Progress::new(total, args.quiet);
    ctx.progress = &progress;
    progress.note(&format!(
        "nanowire lab report: {mode} suite on {}, engines {}, {repeats} repeat(s), about {:.0} s; generator engine {}",
        target.describe(),
        engines.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(","),
        total,
        ctx.gen_engine
    ));
    // Is other work running? CPU idle over a short window just before the
    // first measurement (the 1-minute load average still counts the build
    // that `make lab` ran a moment ago).
    let mut env = env;
    env["cpu_idle_before"] = cpu_idle_window(Duration::from_secs(3));
    let mut exps = vec![];
    for (entry, _) in &plan {
        if !wanted(&entry.who.id) {
            continue;
        }
        let t = Instant::now();
        let mut ex = entry.run(&ctx);
        ex.elapsed_s = t.elapsed().as_secs_f64();
        // Every requested engine shows up, measured or with a reason.
        for e in &engines {
            if !ex.coverage.iter().any(|c| c.engine == e.as_str()) {
                ex.unavailable(e.as_str(), "udp", "no measurement completed");
            }
        }
        exps.push(ex);
    }
    progress.finish();
    let (sum, headline) = summary(&exps, &engines);
    exps.push(sum);
    env["loadavg_end"] = json!(read_trim("/proc/loadavg"));
    let report = Report {
        schema: SCHEMA.into(),
        generated_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        mode: mode.into(),
        engines: engines.iter().map(|e| e.to_string()).collect(),
        repeats,
        target: target.describe(),
        elapsed_s: t0.elapsed().as_secs_f64(),
        env,
        headline,
        experiments: exps,
    };
    let json_path = args.out.join("results.json");
    let html_path = args.out.join("index.html");
    let js = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    write_out(&json_path, js.as_bytes())?;
    write_out(&html_path, html::render(&report).as_bytes())?;
    // The headline on the terminal.
    println!("{}", report.headline.columns.join(" | "));
    for r in &report.headline.rows {
        println!(
            "{}",
            r.iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.as_f64().map(fmt_num).unwrap_or_default(),
                    o => o.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    println!(
        "report: {} ({:.0} s)\ndata:   {}",
        html_path.display(),
        report.elapsed_s,
        json_path.display()
    );
    Ok(0)
}

/// Write one report file: owner and group only, never through a planted
/// symlink (issue 20, finding 11).
fn write_out(p: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    nanowire_outfile::create(p, nanowire_outfile::SHARED_GROUP)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| format!("cannot write the report: {e}"))
}
