//! Experiment `loss`: the engines on the impaired wire (`lab up --impair`)
//! at a few loss rates: UDP ping-pong tail and its accounting, TCP
//! ping-pong tail and TCP throughput. Client and server JSON are read
//! through the typed schema (`nanowire_bench::BenchResult`).

use super::exec::Target;
use super::experiments::{CLIENT_CPU, Ctx, ExperimentKind, SERVER_CPU, jnum};
use super::model::{Experiment, Plot, Point, Series, Table, median_of};
use crate::testbed::{Direction, Impairment, Lab, WireStatus};
use nanowire_bench::BenchResult;
use nanowire_stack::EngineKind;
use serde_json::json;
use std::collections::BTreeMap;

pub struct Loss;

/// UDP ping-pong gives up on a reply after this long (a lost datagram costs
/// this much time, so it is short); TCP retransmits, so it waits longer.
const UDP_REPLY_TIMEOUT_MS: &str = "5";
const TCP_REPLY_TIMEOUT_MS: &str = "2000";
const TP_SIZE: &str = "16384";

fn wire_drops(w: &Option<WireStatus>) -> u64 {
    w.as_ref().map_or(0, |w| {
        w.ab.dropped_loss + w.ba.dropped_loss + w.ab.dropped_rate + w.ba.dropped_rate
    })
}

fn pct_label(p: f64) -> String {
    format!("{p} %")
}

/// Key of one measurement: (engine, protocol, kind, loss index).
type Key = (String, &'static str, &'static str, usize);

impl ExperimentKind for Loss {
    fn estimate_s(&self, ctx: &Ctx) -> f64 {
        let per = ctx.p.pp.secs as f64 + 0.7;
        let n = ctx.p.loss_points.len() * ctx.engines.len() * ctx.repeats as usize;
        n as f64 * per * 3.0 + ctx.p.loss_points.len() as f64 * ctx.engines.len() as f64 * 0.8
    }

    fn run(&self, ctx: &Ctx, mut ex: Experiment) -> Experiment {
        let points = ctx.p.loss_points.clone();
        ex.method = format!(
            "The lab with a third namespace between the hosts (`nanowire lab up --impair`): nftables in the wire forwards every frame and drops {} of them at random in each direction (`lab impair --loss`), so kernel and bypass traffic cross the same lossy wire. Per engine and loss: UDP ping-pong (`bench pp`, 64 B, a reply given up after {UDP_REPLY_TIMEOUT_MS} ms), with the accounting identity (replies asked for = received + dropped) and the frames the wire dropped over the same run; TCP ping-pong (64 B) and TCP throughput (`bench tp --tcp`, {TP_SIZE} B writes, the sender's rate). {} s per run, {} repeat(s), medians; client on CPU {CLIENT_CPU}, server on CPU {SERVER_CPU}.",
            points
                .iter()
                .map(|p| pct_label(*p))
                .collect::<Vec<_>>()
                .join(", "),
            ctx.p.pp.secs,
            ctx.repeats
        );
        let Target::Lab(lab) = ctx.target else {
            for e in &ctx.engines {
                for proto in ["udp", "tcp"] {
                    ex.unavailable(
                        e.as_str(),
                        proto,
                        "needs the lab's impaired wire (not available with --peer)",
                    );
                }
            }
            return ex;
        };
        let wired = lab.clone().impaired(true);
        if let Err(r) = wired.up() {
            for e in &ctx.engines {
                for proto in ["udp", "tcp"] {
                    ex.unavailable(e.as_str(), proto, format!("cannot build the wire: {r}"));
                }
            }
            return ex;
        }
        let mut data: BTreeMap<Key, Vec<(BenchResult, u64)>> = BTreeMap::new();
        let mut failed: BTreeMap<(String, &'static str), String> = BTreeMap::new();
        for (li, &loss) in points.iter().enumerate() {
            let imp = Impairment {
                loss_pct: loss,
                ..Impairment::default()
            };
            if let Err(r) = wired.impair(Direction::Both, imp) {
                ex.notes
                    .push(format!("loss {loss} %: cannot set the wire: {r}"));
                continue;
            }
            for tcp in [false, true] {
                let proto = if tcp { "tcp" } else { "udp" };
                for &e in &ctx.engines {
                    if failed.contains_key(&(e.to_string(), proto)) {
                        continue;
                    }
                    self.measure(
                        ctx,
                        &wired,
                        e,
                        tcp,
                        li,
                        loss,
                        &mut ex,
                        &mut data,
                        &mut failed,
                    );
                }
            }
        }
        // Leave the lab as the other experiments expect it: a plain pair.
        let _ = wired.impair(Direction::Both, Impairment::default());
        if let Err(r) = lab.up() {
            ex.notes.push(format!(
                "could not turn the lab back into a plain pair: {r}"
            ));
        }
        for ((e, proto), r) in &failed {
            ex.unavailable(e, proto, r.clone());
        }
        for e in &ctx.engines {
            for proto in ["udp", "tcp"] {
                if data.keys().any(|k| k.0 == e.as_str() && k.1 == proto) {
                    ex.measured(e.as_str(), proto);
                }
            }
        }
        self.tables(ctx, &points, &data, &failed, &mut ex);
        ex
    }
}

impl Loss {
    #[allow(clippy::too_many_arguments)]
    fn measure(
        &self,
        ctx: &Ctx,
        wired: &Lab,
        e: EngineKind,
        tcp: bool,
        li: usize,
        loss: f64,
        ex: &mut Experiment,
        data: &mut BTreeMap<Key, Vec<(BenchResult, u64)>>,
        failed: &mut BTreeMap<(String, &'static str), String>,
    ) {
        let proto = if tcp { "tcp" } else { "udp" };
        let est = (ctx.p.pp.secs as f64 + 0.7) * ctx.repeats as f64 * if tcp { 2.0 } else { 1.0 };
        let what = format!("loss {loss} % {proto} {e}");
        let (srv, port) = match ctx.server_step(&what, e, tcp, est) {
            Ok(x) => x,
            Err(r) => {
                failed.insert((e.to_string(), proto), r);
                return;
            }
        };
        let kinds: &[&'static str] = if tcp { &["pp", "tp"] } else { &["pp"] };
        'kinds: for &kind in kinds {
            for rep in 0..ctx.repeats {
                ctx.progress.step(
                    &format!(
                        "loss {loss} % {proto} {e} {kind} (repeat {}/{})",
                        rep + 1,
                        ctx.repeats
                    ),
                    ctx.p.pp.secs as f64 + 0.7,
                );
                let extra: Vec<String> = match kind {
                    "pp" => vec![
                        "pp".into(),
                        "-m".into(),
                        "64".into(),
                        "--reply-timeout-ms".into(),
                        if tcp {
                            TCP_REPLY_TIMEOUT_MS
                        } else {
                            UDP_REPLY_TIMEOUT_MS
                        }
                        .into(),
                    ],
                    _ => vec!["tp".into(), "-m".into(), TP_SIZE.into()],
                };
                let w0 = wired.wire_status();
                let v = match ctx.client(e, tcp, port, &extra, ctx.p.pp.secs) {
                    Ok(v) => v,
                    Err(r) => {
                        failed.insert((e.to_string(), proto), format!("bench {kind}: {r}"));
                        break 'kinds;
                    }
                };
                let wire = wire_drops(&wired.wire_status()).saturating_sub(wire_drops(&w0));
                let r: BenchResult = match serde_json::from_value(v.clone()) {
                    Ok(r) => r,
                    Err(err) => {
                        failed.insert(
                            (e.to_string(), proto),
                            format!("bench {kind}: unreadable JSON: {err}"),
                        );
                        break 'kinds;
                    }
                };
                if r.engine != e.as_str() {
                    failed.insert(
                        (e.to_string(), proto),
                        format!(
                            "{e} {proto} is not available: the client ran on {} ({})",
                            r.engine,
                            r.fallback_reason.as_deref().unwrap_or("no reason given")
                        ),
                    );
                    break 'kinds;
                }
                ex.runs.push(json!({
                    "engine": e, "protocol": proto, "kind": kind, "loss_pct": loss,
                    "repeat": rep, "wire_dropped": wire, "result": v,
                }));
                data.entry((e.to_string(), proto, kind, li))
                    .or_default()
                    .push((r, wire));
            }
        }
        drop(srv);
    }

    fn tables(
        &self,
        ctx: &Ctx,
        points: &[f64],
        data: &BTreeMap<Key, Vec<(BenchResult, u64)>>,
        failed: &BTreeMap<(String, &'static str), String>,
        ex: &mut Experiment,
    ) {
        let cats: Vec<String> = points.iter().map(|p| pct_label(*p)).collect();
        let lat_cols = ["p50", "p99", "p99.9", "max"];
        let lat = |r: &BenchResult, k: &str| {
            r.latency_us.map(|l| match k {
                "p50" => l.p50,
                "p99" => l.p99,
                "p99.9" => l.p99_9,
                _ => l.max,
            })
        };
        let med = |runs: &[(BenchResult, u64)], f: &dyn Fn(&(BenchResult, u64)) -> Option<f64>| {
            median_of(runs, f)
        };
        let mut held = (0usize, 0usize);
        for (proto, kind, caption) in [
            (
                "udp",
                "pp",
                "UDP ping-pong on the impaired wire: one-way latency (µs), medians of the repeats, and the accounting (sums over the repeats)",
            ),
            (
                "tcp",
                "pp",
                "TCP ping-pong on the impaired wire: one-way latency (µs), medians of the repeats",
            ),
        ] {
            let mut columns: Vec<String> = vec!["engine".into(), "loss".into()];
            columns.extend(lat_cols.iter().map(|c| c.to_string()));
            columns.push("round trips/s".into());
            if proto == "udp" {
                columns.extend(
                    [
                        "asked",
                        "received",
                        "dropped (client)",
                        "dropped (wire)",
                        "accounting",
                    ]
                    .map(String::from),
                );
            }
            let mut rows = vec![];
            for e in &ctx.engines {
                if let Some(r) = failed.get(&(e.to_string(), proto))
                    && !data.keys().any(|k| k.0 == e.as_str() && k.1 == proto)
                {
                    let mut row = vec![json!(e.as_str()), json!("all")];
                    row.push(json!(format!("not available: {r}")));
                    while row.len() < columns.len() {
                        row.push(json!("—"));
                    }
                    rows.push(row);
                    continue;
                }
                for (li, cat) in cats.iter().enumerate() {
                    let Some(runs) = data.get(&(e.to_string(), proto, kind, li)) else {
                        continue;
                    };
                    let mut row = vec![json!(e.as_str()), json!(cat)];
                    for c in lat_cols {
                        row.push(jnum(med(runs, &|x| lat(&x.0, c))));
                    }
                    row.push(jnum(med(runs, &|x| Some(x.0.rate_msg_s))));
                    if proto == "udp" {
                        let sum = |f: &dyn Fn(&(BenchResult, u64)) -> u64| -> u64 {
                            runs.iter().map(f).sum()
                        };
                        let ok = runs.iter().all(|x| x.0.accounting.holds == Some(true));
                        held.0 += runs
                            .iter()
                            .filter(|x| x.0.accounting.holds == Some(true))
                            .count();
                        held.1 += runs.len();
                        row.push(json!(sum(&|x| x.0.accounting.expected)));
                        row.push(json!(sum(&|x| x.0.accounting.received)));
                        row.push(json!(sum(&|x| x.0.accounting.dropped)));
                        row.push(json!(sum(&|x| x.1)));
                        row.push(json!(if ok { "holds" } else { "FAILED" }));
                    }
                    rows.push(row);
                }
            }
            ex.tables.push(Table {
                caption: caption.into(),
                columns,
                rows,
            });
        }
        // TCP throughput.
        let mut rows = vec![];
        for e in &ctx.engines {
            if let Some(r) = failed.get(&(e.to_string(), "tcp"))
                && !data
                    .keys()
                    .any(|k| k.0 == e.as_str() && k.1 == "tcp" && k.2 == "tp")
            {
                rows.push(vec![
                    json!(e.as_str()),
                    json!("all"),
                    json!(format!("not available: {r}")),
                ]);
                continue;
            }
            for (li, cat) in cats.iter().enumerate() {
                if let Some(runs) = data.get(&(e.to_string(), "tcp", "tp", li)) {
                    rows.push(vec![
                        json!(e.as_str()),
                        json!(cat),
                        jnum(med(runs, &|x| Some(x.0.bandwidth_mbps))),
                    ]);
                }
            }
        }
        ex.tables.push(Table {
            caption: "TCP throughput on the impaired wire (Mbit/s sent, medians)".into(),
            columns: ["engine", "loss", "Mbit/s"].map(String::from).to_vec(),
            rows,
        });
        if held.1 > 0 {
            ex.notes.push(format!(
                "UDP accounting (replies asked for = received + dropped) held in {} of {} runs. \"dropped (client)\" counts requests or replies lost either way; \"dropped (wire)\" is what the wire's nftables counters dropped over the same runs, warm-up included (the client counts the valid period only), as are ARP and other frames.",
                held.0, held.1
            ));
        }
        // Plots: bars per loss, one series per engine.
        for (id, title, y, proto, kind, f) in [
            (
                "loss_udp_p999",
                "UDP ping-pong p99.9 vs loss",
                "one-way p99.9 (µs)",
                "udp",
                "pp",
                (|r: &BenchResult| r.latency_us.map(|l| l.p99_9))
                    as fn(&BenchResult) -> Option<f64>,
            ),
            (
                "loss_tcp_p999",
                "TCP ping-pong p99.9 vs loss",
                "one-way p99.9 (µs)",
                "tcp",
                "pp",
                |r: &BenchResult| r.latency_us.map(|l| l.p99_9),
            ),
            (
                "loss_tcp_tp",
                "TCP throughput vs loss",
                "Mbit/s",
                "tcp",
                "tp",
                |r: &BenchResult| Some(r.bandwidth_mbps),
            ),
        ] {
            let mut series = vec![];
            for e in &ctx.engines {
                let pts: Vec<Point> = (0..cats.len())
                    .filter_map(|li| {
                        let runs = data.get(&(e.to_string(), proto, kind, li))?;
                        Point::from_samples(
                            li as f64,
                            runs.iter().filter_map(|x| f(&x.0)).collect(),
                        )
                    })
                    .collect();
                if !pts.is_empty() {
                    series.push(Series::new(e, e, proto, y).with_points(pts));
                }
            }
            ex.plots.push(Plot {
                id: id.into(),
                title: title.into(),
                x_label: "loss each way".into(),
                y_label: y.into(),
                x_log: false,
                y_log: false,
                categories: Some(cats.clone()),
                series,
            });
        }
    }
}
