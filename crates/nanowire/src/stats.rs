//! `nanowire stats`: the counters of running engines (read from their
//! shared stats pages; the engine library only writes them).
use clap::Args;
use nanowire_stack::xdp::shm;
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
    if args.json {
        out!(
            "{}",
            serde_json::to_string_pretty(&pages).map_err(|e| e.to_string())?
        );
        return Ok(0);
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
