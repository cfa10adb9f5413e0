//! `nanowire capture -i IFACE -w FILE [-c N] [-t SECS]`

use crate::PacketSocket;
use clap::Args;
use nanowire_wire::pcapng::PcapngWriter;
use std::io::BufWriter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// Interface to capture on (in the current network namespace; use `nanowire lab exec`).
    #[arg(short = 'i', long)]
    pub iface: String,
    /// pcapng file to write.
    #[arg(short = 'w', long)]
    pub write: std::path::PathBuf,
    /// Stop after this many frames.
    #[arg(short = 'c', long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(short = 't', long)]
    pub time: Option<f64>,
    /// Bytes kept per frame.
    #[arg(long, default_value_t = 65535, value_parser = clap::value_parser!(u32).range(64..=262144))]
    pub snaplen: u32,
    /// Keep only UDP or TCP frames to or from this port.
    #[arg(long)]
    pub port: Option<u16>,
}

static STOP: AtomicBool = AtomicBool::new(false);

fn matches_port(frame: &[u8], port: u16) -> bool {
    use nanowire_wire::{EtherType, EthernetFrame, Ipv4Packet};
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    if eth.ethertype() != EtherType::Ipv4 {
        return false;
    }
    let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
        return false;
    };
    let p = ip.payload();
    if !matches!(ip.protocol(), 6 | 17) || p.len() < 4 || ip.frag_offset() != 0 {
        return false;
    }
    u16::from_be_bytes([p[0], p[1]]) == port || u16::from_be_bytes([p[2], p[3]]) == port
}

pub fn run(a: CaptureArgs) -> Result<i32, String> {
    if let Some(t) = a.time
        && !(t.is_finite() && t > 0.0)
    {
        return Err(format!(
            "--time must be a positive number of seconds, got {t}"
        ));
    }
    let sock = PacketSocket::open(&a.iface).map_err(|e| format!("capture on {}: {e}", a.iface))?;
    let file = std::fs::File::create(&a.write)
        .map_err(|e| format!("cannot create {}: {e}", a.write.display()))?;
    let mut w = PcapngWriter::new(
        BufWriter::new(file),
        concat!("nanowire ", env!("CARGO_PKG_VERSION")),
        a.snaplen,
    )
    .map_err(|e| e.to_string())?;
    let ifid = w.add_interface(&a.iface).map_err(|e| e.to_string())?;
    let _ = ctrlc_stop();
    let deadline = a.time.map(|t| Instant::now() + Duration::from_secs_f64(t));
    let mut buf = vec![0u8; a.snaplen as usize];
    let mut n = 0u64;
    while !STOP.load(Ordering::Relaxed)
        && a.count.is_none_or(|c| n < c)
        && deadline.is_none_or(|d| Instant::now() < d)
    {
        let Some(f) = sock
            .recv(&mut buf, Duration::from_millis(100))
            .map_err(|e| format!("capture: {e}"))?
        else {
            continue;
        };
        if let Some(p) = a.port
            && !matches_port(&buf[..f.len], p)
        {
            continue;
        }
        let dir = if f.outgoing { "out" } else { "in" };
        w.write_packet(ifid, f.ts_ns, &buf[..f.len], f.orig_len, Some(dir))
            .map_err(|e| e.to_string())?;
        n += 1;
    }
    w.flush().map_err(|e| e.to_string())?;
    eprintln!(
        "nanowire capture: {n} frames written to {}",
        a.write.display()
    );
    Ok(0)
}

/// Stop cleanly (flushing the file) on SIGINT/SIGTERM.
fn ctrlc_stop() -> std::io::Result<()> {
    extern "C" fn on_signal(_: libc::c_int) {
        STOP.store(true, Ordering::Relaxed);
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler: extern "C" fn(libc::c_int) = on_signal;
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
    Ok(())
}
