//! Experiment `capture` (issue 13): what seeing the xdp engine's traffic
//! costs, and where the time of a ping-pong goes, split by the engines' own
//! stamps. xdp ping-pong (64 B) without a capture and with `nanowire
//! capture` tapping both engines, interleaved; the taps' stamps of every
//! datagram (matched by payload) split each round trip into wire → ring and
//! ring → application → ring.

use super::exec::{Proc, Target};
use super::experiments::{CLIENT_CPU, Ctx, ExperimentKind, SERVER_CPU, jnum};
use super::model::{Experiment, Table, median};
use crate::testbed::Host;
use nanowire_bench::BenchResult;
use nanowire_stack::EngineKind;
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Capture;

/// The four tap stamps of one ping-pong exchange (ns, CLOCK_REALTIME of the
/// one kernel): client TX post, server ring, server TX post, client ring.
#[derive(Default, Clone, Copy)]
struct Stamps {
    a_tx: u64,
    b_rx: u64,
    b_tx: u64,
    a_rx: u64,
}

/// UDP source port, destination port and payload of an Ethernet/IPv4 frame.
fn udp(frame: &[u8]) -> Option<(u16, u16, &[u8])> {
    if frame.len() < 42 || frame[12..14] != [8, 0] || frame[23] != 17 {
        return None;
    }
    let ihl = usize::from(frame[14] & 15) * 4;
    let l4 = frame.get(14 + ihl..)?;
    if l4.len() < 8 {
        return None;
    }
    Some((
        u16::from_be_bytes([l4[0], l4[1]]),
        u16::from_be_bytes([l4[2], l4[3]]),
        &l4[8..],
    ))
}

/// The engine-tap frames of one capture file: (is a request, sockperf
/// sequence number, ts). A request and its reply carry the same sequence.
fn engine_frames(path: &Path, port: u16) -> Result<Vec<(bool, u64, u64)>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let pkts = nanowire_wire::pcapng::read_packets(&bytes)?;
    Ok(pkts
        .iter()
        // Interface 0 is the kernel's packet tap; the engines' taps follow.
        .filter(|p| p.iface > 0)
        .filter_map(|p| {
            let (sp, dp, pl) = udp(&p.data)?;
            let seq = u64::from_be_bytes(pl.get(..8)?.try_into().ok()?);
            Some((dp == port && sp != port, seq, p.ts_ns))
        })
        .collect())
}

/// Median segments (µs) of one tapped run: a→b, b turnaround, b→a; and
/// how many exchanges had all four stamps.
fn split(a: &Path, b: &Path, port: u16) -> Result<([f64; 3], usize), String> {
    let mut m: HashMap<u64, Stamps> = HashMap::new();
    for (req, seq, ts) in engine_frames(a, port)? {
        let s = m.entry(seq).or_default();
        if req { s.a_tx = ts } else { s.a_rx = ts }
    }
    for (req, seq, ts) in engine_frames(b, port)? {
        let s = m.entry(seq).or_default();
        if req { s.b_rx = ts } else { s.b_tx = ts }
    }
    let full: Vec<&Stamps> = m
        .values()
        .filter(|s| s.a_tx > 0 && s.a_tx <= s.b_rx && s.b_rx <= s.b_tx && s.b_tx <= s.a_rx)
        .collect();
    if full.is_empty() {
        return Err("no exchange was seen by both engines' taps".into());
    }
    let us = |f: &dyn Fn(&Stamps) -> u64| {
        median(
            &full
                .iter()
                .map(|s| f(s) as f64 / 1000.0)
                .collect::<Vec<_>>(),
        )
    };
    Ok((
        [
            us(&|s| s.b_rx - s.a_tx),
            us(&|s| s.b_tx - s.b_rx),
            us(&|s| s.a_rx - s.b_tx),
        ],
        full.len(),
    ))
}

/// A private directory for the capture files (created, never reused).
fn private_dir() -> Result<PathBuf, String> {
    crate::tmp::private_dir("nanowire-report-capture").map_err(|e| e.to_string())
}

impl ExperimentKind for Capture {
    fn estimate_s(&self, ctx: &Ctx) -> f64 {
        (ctx.p.pp.secs as f64 * 2.0 + 4.0) * ctx.repeats as f64
    }

    fn run(&self, ctx: &Ctx, mut ex: Experiment) -> Experiment {
        let secs = ctx.p.pp.secs;
        ex.method = format!(
            "xdp ping-pong (`bench pp`, 64 B, both ends xdp, {secs} s, client on CPU {CLIENT_CPU}, server on CPU {SERVER_CPU}) without a capture and with `nanowire capture` tapping both engines (every frame copied into the engines' capture taps and written to pcapng), interleaved, {} repeat(s), medians. Stamps: every tap stamp is one CLOCK_REALTIME read (tens of ns; the two hosts are namespaces of one kernel, so there is no clock offset between them), taken when an engine takes a frame off its AF_XDP RX ring and when it has written a frame into its TX frame, before posting it and kicking the kernel. Matching each datagram's frames by payload splits the round trip: client TX post → server ring (wire → ring: the kick syscall, veth_xmit, XDP, the copy into the UMEM, the wait until the spinning server looks), server ring → server TX post (ring → application → ring: demux, the application's receive, its send), and back. The client's ring → application comes from pp's own receive stamps (`--rx-stamps`, in every run, tapped or not: the engine's stamp when it takes the reply off its RX ring, the tap's stamp point, to one CLOCK_REALTIME read after the receive call returned; costs one clock read per received frame in the engine and one per reply). What remains of pp's RTT/2 is half of that plus the client's send up to its TX post and pp's clock reads. The tapped runs carry the taps' own cost (one clock read and one copy per stamp), which the first table measures.",
            ctx.repeats
        );
        for e in ctx.engines.iter().filter(|e| **e != EngineKind::Xdp) {
            ex.unavailable(
                e.as_str(),
                "udp",
                "the taps show what xdp engines carry; kernel sockets' traffic is already seen by the kernel's packet taps (tcpdump, nanowire capture's AF_PACKET source)",
            );
        }
        let Target::Lab(_) = ctx.target else {
            ex.unavailable(
                "xdp",
                "udp",
                "needs both hosts of the lab (the server's engine is tapped on host b)",
            );
            return ex;
        };
        if !ctx.engines.contains(&EngineKind::Xdp) {
            return ex;
        }
        let dir = match private_dir() {
            Ok(d) => d,
            Err(r) => {
                ex.unavailable(
                    "xdp",
                    "udp",
                    format!("no directory for the capture files: {r}"),
                );
                return ex;
            }
        };
        let mut plain = vec![];
        let mut tapped = vec![];
        let mut segs: Vec<[f64; 3]> = vec![];
        let mut r2a: Vec<f64> = vec![];
        let mut matched = vec![];
        let mut failure = None;
        'reps: for rep in 0..ctx.repeats {
            for tap in [false, true] {
                ctx.progress.step(
                    &format!(
                        "capture: xdp pp {} ({}/{})",
                        if tap { "tapped" } else { "plain" },
                        rep + 1,
                        ctx.repeats
                    ),
                    secs as f64 + 2.0,
                );
                match self.one(ctx, &dir, tap, rep) {
                    Ok((r, v, s)) => {
                        ex.runs
                            .push(json!({"repeat": rep, "tapped": tap, "result": v,
                            "segments_us": s.map(|(s, _)| s.to_vec())}));
                        let p50 = r.latency_us.map(|l| l.p50).unwrap_or(f64::NAN);
                        if let Some(l) = &r.ring_to_app_us {
                            r2a.push(l.p50);
                        }
                        if tap {
                            tapped.push(p50);
                            if let Some((s, n)) = s {
                                segs.push(s);
                                matched.push(n as f64);
                            }
                        } else {
                            plain.push(p50);
                        }
                    }
                    Err(r) => {
                        failure = Some(r);
                        break 'reps;
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        if let Some(r) = failure {
            ex.unavailable("xdp", "udp", r);
            return ex;
        }
        ex.measured("xdp", "udp");
        let (mp, mt) = (median(&plain), median(&tapped));
        ex.tables.push(Table {
            caption: "xdp ping-pong p50 one-way (µs) without and with a tap capture".into(),
            columns: vec![
                "configuration".into(),
                "p50 per repeat".into(),
                "p50".into(),
                "ratio to no capture".into(),
            ],
            rows: vec![
                vec![
                    json!("no capture"),
                    json!(fmt_list(&plain)),
                    jnum(mp),
                    jnum(1.0),
                ],
                vec![
                    json!("tap capture on both hosts"),
                    json!(fmt_list(&tapped)),
                    jnum(mt),
                    jnum(mt / mp),
                ],
            ],
        });
        if !segs.is_empty() {
            let m = |i: usize| median(&segs.iter().map(|s| s[i]).collect::<Vec<_>>());
            let (ab, turn, ba) = (m(0), m(1), m(2));
            let half = (ab + turn + ba) / 2.0;
            ex.tables.push(Table {
                caption: format!(
                    "Where the time of a tapped xdp round trip goes (medians; {:.0} exchanges with all four stamps per run, matched by sockperf sequence number)",
                    median(&matched)
                ),
                columns: vec!["segment".into(), "µs".into()],
                rows: vec![
                    vec![json!("client TX post → server ring (wire → ring)"), jnum(ab)],
                    vec![json!("server ring → server TX post (ring → application → ring)"), jnum(turn)],
                    vec![json!("server TX post → client ring (wire → ring)"), jnum(ba)],
                    vec![json!("half the stamped round trip"), jnum(half)],
                    vec![json!("pp p50 one-way, tapped runs (RTT/2)"), jnum(mt)],
                    vec![
                        json!("client ring → application, once per round trip (pp --rx-stamps: the engine takes the reply off its ring → pp's receive returned; every run)"),
                        jnum(if r2a.is_empty() { f64::NAN } else { median(&r2a) }),
                    ],
                    vec![
                        json!("not split by the taps: half of (client ring → application + its send up to the TX post + clock reads)"),
                        jnum(mt - half),
                    ],
                ],
            });
        }
        ex
    }
}

impl Capture {
    /// One pp run, tapped or not: (result, raw JSON, segments if tapped).
    #[allow(clippy::type_complexity)]
    fn one(
        &self,
        ctx: &Ctx,
        dir: &Path,
        tap: bool,
        rep: u32,
    ) -> Result<(BenchResult, serde_json::Value, Option<([f64; 3], usize)>), String> {
        let (srv, port) = ctx.start_server(EngineKind::Xdp, false)?;
        let Target::Lab(lab) = ctx.target else {
            unreachable!("checked by run")
        };
        let files = [
            dir.join(format!("a{rep}.pcapng")),
            dir.join(format!("b{rep}.pcapng")),
        ];
        let mut caps: Vec<Proc> = vec![];
        if tap {
            for (h, f) in [(Host::A, &files[0]), (Host::B, &files[1])] {
                let argv: Vec<String> = [
                    ctx.exe.as_str(),
                    "capture",
                    "-i",
                    &lab.iface(h),
                    "-w",
                    &f.display().to_string(),
                    "--port",
                    &port.to_string(),
                    "-t",
                    &(ctx.p.pp.secs + 3).to_string(),
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                let mut p = Proc::spawn(ctx.target.command(h, &argv)?, "nanowire capture")?;
                p.settle(Duration::from_millis(300))?;
                caps.push(p);
            }
        }
        let extra = vec![
            "pp".to_string(),
            "-m".into(),
            "64".into(),
            "--no-fallback".into(),
            // The client's own receive stamps (engine: frame off the RX
            // ring), in both kinds of runs so the ratio compares like
            // with like: ring → application on the client side.
            "--rx-stamps".into(),
        ];
        let v = ctx.client(EngineKind::Xdp, false, port, &extra, ctx.p.pp.secs);
        let mut cap_err = None;
        for c in caps {
            let why = c.err_line();
            match c.finish(Duration::from_secs(ctx.p.pp.secs + 20)) {
                Ok((0, _)) => {}
                Ok((code, _)) => {
                    cap_err.get_or_insert(format!("exit {code}: {why}"));
                }
                Err(e) => {
                    cap_err.get_or_insert(e);
                }
            }
        }
        drop(srv);
        let v = v?;
        if let Some(e) = cap_err {
            return Err(format!("nanowire capture: {e}"));
        }
        let r: BenchResult = serde_json::from_value(v.clone())
            .map_err(|e| format!("bench pp: unreadable JSON: {e}"))?;
        if r.engine != "xdp" {
            return Err(format!(
                "the client ran on {} ({})",
                r.engine,
                r.fallback_reason.as_deref().unwrap_or("no reason given")
            ));
        }
        let s = if tap {
            Some(split(&files[0], &files[1], port)?)
        } else {
            None
        };
        for f in &files {
            let _ = std::fs::remove_file(f);
        }
        Ok((r, v, s))
    }
}

/// Values to three decimals, separated by spaces.
fn fmt_list(v: &[f64]) -> String {
    v.iter()
        .map(|v| format!("{v:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}
