//! `nanowire stats`: the counters of running engines (read from their
//! shared stats pages; the engine library only writes them), and the
//! network namespace's engine service with every process attached to it
//! (asked over its control socket; issue 23).
use clap::Args;
use nanowire_stack::xdp::service::client::Conn;
use nanowire_stack::xdp::shm;
use serde_json::Value;
use std::io::Write;

/// println! that never panics on a closed stdout (e.g. piped into head).
macro_rules! out {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Print the counters of every running xdp engine (from their shared-memory
/// stats pages under /dev/shm/nanowire).
pub fn run(args: StatsArgs) -> Result<i32, String> {
    let pages = shm::read_all();
    let service = service_status(&pages);
    let shared = crate::shared::shared(&service_listeners(service.as_ref()));
    if args.json {
        let mut v = serde_json::to_value(&pages).map_err(|e| e.to_string())?;
        v["service"] = service.unwrap_or(Value::Null);
        v["shared_sockets"] = shared.into();
        out!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
        return Ok(0);
    }
    if let Some(s) = &service {
        print_service(s);
    }
    // Sockets more than one process holds (issue 24): whose, and where
    // they are served.
    if !shared.is_empty() {
        out!("sockets shared by processes:");
        crate::shared::print(&shared);
    }
    // A page this build cannot read (an older format, a damaged header) is
    // named with the reason, never misread.
    for u in &pages.unreadable {
        out!("cannot read stats page {}: {}", u.page, u.reason);
    }
    let all = &pages.engines;
    if all.is_empty() {
        out!("no running nanowire engines");
        return Ok(0);
    }
    for e in all {
        out!(
            "engine pid {} on {} ({} XDP, {} AF_XDP, {} queue(s), ring depth {})",
            e.info.pid,
            e.info.iface,
            e.info.xdp_mode,
            e.info.bind_mode,
            e.info.queues,
            e.info.ring_depth
        );
        let mib = |k: &str| e.counters.get(k).copied().unwrap_or(0) as f64 / 1048576.0;
        if mib("mem_total_bytes") > 0.0 {
            out!(
                "  memory: {:.1} MiB (UMEM {:.1} MiB, rings {:.2} MiB, queues and tables the rest)",
                mib("mem_total_bytes"),
                mib("mem_umem_bytes"),
                mib("mem_ring_bytes")
            );
        }
        // Drops and injected faults when they happened; TCP's counters
        // (zeros included: no RST sent is news) when the engine carries TCP.
        let has_tcp = e
            .counters
            .iter()
            .any(|(k, v)| k.starts_with("tcp_") && *v != 0);
        for (k, v) in &e.counters {
            let quiet = k.starts_with("drop_")
                || k.starts_with("fault_")
                || (k.starts_with("tcp_") && !has_tcp);
            if *v != 0 || !quiet {
                out!("  {k:<26} {v}");
            }
        }
        // Send rings on the heap (issue 24 item 3), with their reasons.
        let c = |k: &str| e.counters.get(k).copied().unwrap_or(0);
        let heap = [
            ("send buffer over 256 KiB", "tcp_slab_fallback_large_buffer"),
            ("no free slab of 1,024", "tcp_slab_fallback_no_free_slab"),
            (
                "a forked child's copy of the engine",
                "tcp_slab_fallback_forked_child",
            ),
        ]
        .iter()
        .filter(|(_, k)| c(k) != 0)
        .map(|(why, k)| format!("{} ({why})", c(k)))
        .collect::<Vec<_>>();
        if !heap.is_empty() {
            out!(
                "  tcp send rings on the heap, not in slabs (their unacknowledged bytes are not delivered after a kill -9): {}",
                heap.join(", ")
            );
        }
        for s in &e.sockets {
            // Names as the page describes them; a counter the page lacks reads 0.
            let c = |k: &str| s.counters.get(k).copied().unwrap_or(0);
            out!(
                "  socket {:<21} rx {} pkts {} B, tx {} pkts {} B, drops: queue full {}, tx ring full {}, queue {} (peak {})",
                s.local,
                c("rx_packets"),
                c("rx_bytes"),
                c("tx_packets"),
                c("tx_bytes"),
                c("drop_queue_full"),
                c("drop_tx_ring_full"),
                c("queue_depth"),
                c("peak_queue_depth")
            );
        }
    }
    Ok(0)
}

/// The engine service of this network namespace, if one runs: its status,
/// each attached process's entry with its engine's own drop counters
/// (`engine_drops`: from the stats page of that pid when this reader can
/// read it, a page being its owner's and root's; else as the service read
/// them from the sealed page an unprivileged process handed it).
fn service_status(pages: &shm::Pages) -> Option<Value> {
    let conn = Conn::connect_existing().ok()?;
    let mut st: Value = match conn
        .status()
        .and_then(|t| serde_json::from_str(&t).map_err(|e| format!("engine service status: {e}")))
    {
        Ok(v) => v,
        Err(e) => return Some(serde_json::json!({ "error": e })),
    };
    for ifc in st["ifaces"].as_array_mut().into_iter().flatten() {
        for c in ifc["clients"].as_array_mut().into_iter().flatten() {
            let pid = c["pid"].as_u64();
            let drops: Option<std::collections::BTreeMap<&str, u64>> = pages
                .engines
                .iter()
                .find(|e| Some(u64::from(e.info.pid)) == pid)
                .map(|e| {
                    e.counters
                        .iter()
                        .filter(|(k, _)| shm::is_drop(k))
                        .map(|(k, v)| (k.as_str(), *v))
                        .collect()
                });
            // The page read here (root's, or its own user's) when there is
            // one; else what the service read from the page it was handed.
            if let Some(d) = drops {
                c["engine_drops"] = serde_json::to_value(d).unwrap_or(Value::Null);
            }
        }
    }
    Some(st)
}

/// The TCP listeners on the engine service (its clients' claims and its
/// listener groups) and how many processes each group has.
fn service_listeners(s: Option<&Value>) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for i in s.and_then(|s| s["ifaces"].as_array()).into_iter().flatten() {
        for c in i["clients"].as_array().into_iter().flatten() {
            for k in c["claims"].as_array().into_iter().flatten() {
                if let Some(a) = k.as_str().and_then(|k| k.strip_prefix("tcp:")) {
                    out.entry(a.to_string()).or_insert(1);
                }
            }
        }
        for g in i["tcp_listener_groups"].as_array().into_iter().flatten() {
            if let Some(a) = g["listener"].as_str() {
                out.insert(a.to_string(), g["members"].as_array().map_or(0, Vec::len));
            }
        }
    }
    out
}

/// `NAME VALUE, ...` of the counters `names` of `m` that are not zero
/// (`None`: all are zero).
fn named_nonzero(m: &Value, names: &[&str]) -> Option<String> {
    let v: Vec<String> = names
        .iter()
        .map(|k| (k, m[k].as_u64().unwrap_or(0)))
        .filter(|(_, v)| *v != 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    (!v.is_empty()).then(|| v.join(", "))
}

/// The service's counters of how dead processes' connections ended.
const DEAD_ENDS: &[&str] = &[
    "tcp_ended_repaired",
    "tcp_ended_fin",
    "tcp_ended_rst",
    "tcp_end_failed",
    "tcp_end_left",
    "tcp_end_refused",
    "tcp_end_unpassed",
    "tcp_handed_swept",
];

/// A client's requests the service refused.
const REFUSED: &[&str] = &[
    "claims_refused",
    "tcp_flows_refused",
    "tcp_joins_refused",
    "tcp_moves_refused",
];

/// The service, its interfaces, and per attached process: who, what it
/// claims, its share of the frames, its drops by reason.
fn print_service(s: &Value) {
    if let Some(e) = s["error"].as_str() {
        out!("engine service: {e}");
        return;
    }
    let ifaces = s["ifaces"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let attached: usize = ifaces
        .iter()
        .map(|i| i["clients"].as_array().map_or(0, Vec::len))
        .sum();
    out!(
        "engine service pid {}: {attached} process(es) attached",
        s["pid"]
    );
    let nonzero = |m: &Value| -> String {
        m.as_object()
            .into_iter()
            .flatten()
            .filter(|(_, v)| v.as_u64().unwrap_or(0) != 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let refused = nonzero(&s["counters"]["bad_messages"]);
    if !refused.is_empty() {
        out!("  refused messages: {refused}");
    }
    // Dead processes' connections (issue 24): how the service ended them.
    if let Some(ends) = named_nonzero(&s["counters"], DEAD_ENDS) {
        out!("  dead processes' tcp connections: {ends}");
    }
    for i in ifaces {
        out!(
            "  {}: {} XDP, {} queue(s), {} RX frames shared per queue, UMEM {:.1} MiB ({}), fill ring empty {}",
            i["iface"].as_str().unwrap_or("?"),
            i["xdp_mode"].as_str().unwrap_or("?"),
            i["queues"],
            i["rx_frames"],
            i["umem_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
            i["umem_pages"].as_str().unwrap_or("?"),
            i["xsk_rx_fill_ring_empty"]
        );
        for c in i["clients"].as_array().into_iter().flatten() {
            let f = &c["frames"];
            out!(
                "    pid {} uid {} {} (slot {}): RX frames held {} + {} waiting (ring {}, shared {}), TX frames {} own",
                c["pid"],
                c["uid"],
                c["comm"].as_str().unwrap_or("?"),
                c["slot"],
                f["rx_held"],
                f["rx_waiting"],
                f["rx_ring"],
                f["rx_shared"],
                f["tx_own"]
            );
            for k in c["claims"].as_array().into_iter().flatten() {
                out!("      claim {}", k.as_str().unwrap_or("?"));
            }
            for t in c["tcp_flows"].as_array().into_iter().flatten() {
                out!(
                    "      tcp {} <-> {} (to the {})",
                    t["local"].as_str().unwrap_or("?"),
                    t["remote"].as_str().unwrap_or("?"),
                    t["to"].as_str().unwrap_or("?")
                );
            }
            let drops = [nonzero(&c["drops"]), nonzero(&c["engine_drops"])]
                .into_iter()
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
                .join(", ");
            out!(
                "      drops: {}",
                if drops.is_empty() { "none" } else { &drops }
            );
            if c["engine_drops"].is_null() {
                out!("      (its engine's own drop counters: no stats page readable)");
            }
            if let Some(refused) = named_nonzero(&c["counters"], REFUSED) {
                out!("      refused: {refused}");
            }
        }
        // Listeners shared across fork (issue 24): which processes hold
        // each one, and which of them new connections go to.
        for g in i["tcp_listener_groups"].as_array().into_iter().flatten() {
            let members = g["members"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            if members.len() < 2 {
                continue;
            }
            let who: Vec<String> = members
                .iter()
                .map(|m| {
                    format!(
                        "pid {} (slot {}{})",
                        m["pid"],
                        m["slot"],
                        if m["accepting"].as_bool() == Some(true) {
                            ", accepting"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            out!(
                "    tcp listener {} shared by {}",
                g["listener"].as_str().unwrap_or("?"),
                who.join(", ")
            );
        }
        // Orphans: dead processes' connections the kernel finishes for
        // them (handed over at the death), until it has nothing of them.
        for o in i["tcp_orphans"].as_array().into_iter().flatten() {
            out!(
                "    tcp orphan {} <-> {} of pid {} (dead; ended: {}, {} ms ago): kernel {}",
                o["local"].as_str().unwrap_or("?"),
                o["remote"].as_str().unwrap_or("?"),
                o["pid"],
                o["ended"].as_str().unwrap_or("?"),
                o["age_ms"],
                o["kernel_state"].as_str().unwrap_or("?")
            );
        }
    }
}
