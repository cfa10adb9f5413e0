//! What both capture modes share: the arguments, the output file and the
//! stop flag set on SIGINT/SIGTERM.

use clap::Args;
use nanowire_wire::pcapng::PcapngWriter;
use std::io::BufWriter;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Keep only IPv4 frames to or from this address.
    #[arg(long)]
    pub addr: Option<Ipv4Addr>,
    /// Tap only the xdp engine of this process (default: every engine on
    /// the interface, including engines that start during the capture).
    #[arg(long, conflicts_with = "xdp")]
    pub pid: Option<u32>,
    /// Leave the xdp engines alone: kernel packet taps (AF_PACKET) only.
    #[arg(long, conflicts_with_all = ["xdp", "pid"])]
    pub no_engines: bool,
    /// Dedicated capture: attach a capture XDP program to the interface and
    /// take its frames (all, or those the filters select) into AF_XDP. The
    /// frames taken do not reach the kernel stack.
    #[arg(long)]
    pub xdp: bool,
    /// Dedicated capture: RX ring (and fill ring) depth in frames, a power
    /// of two; a burst of this many frames is captured without loss.
    #[arg(long, default_value_t = 16384, requires = "xdp")]
    pub ring: u32,
}

/// Set on SIGINT/SIGTERM: the capture stops, flushing its file.
pub(crate) static STOP: AtomicBool = AtomicBool::new(false);

pub(crate) fn writer(a: &CaptureArgs) -> Result<PcapngWriter<BufWriter<std::fs::File>>, String> {
    // Packet contents: owner-only, never through a planted symlink.
    let file = nanowire_outfile::create(&a.write, nanowire_outfile::PRIVATE)
        .map_err(|e| format!("cannot write the capture: {e}"))?;
    PcapngWriter::new(
        BufWriter::with_capacity(1 << 20, file),
        concat!("nanowire ", env!("CARGO_PKG_VERSION")),
        a.snaplen,
    )
    .map_err(|e| e.to_string())
}

/// Stop cleanly (flushing the file) on SIGINT/SIGTERM.
pub(crate) fn ctrlc_stop() {
    extern "C" fn on_signal(_: libc::c_int) {
        STOP.store(true, Ordering::Relaxed);
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler: extern "C" fn(libc::c_int) = on_signal;
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
}
