//! Microburst tools (seed 000, RFC 2544 back-to-back):
//!
//! * `nanowire bench burst`: a generator that sends N datagrams back to back
//!   as fast as the engine allows (batched through
//!   [`UdpEndpoint::send_batch_to`]), or paced at a rate / inter-packet gap,
//!   or for a duration. Every datagram carries a small header: magic, run id,
//!   sequence number, burst length and its transmit time (CLOCK_MONOTONIC,
//!   shared by every namespace of one machine), so the receiver can find
//!   every gap and measure one-way latency from transmit to user memory.
//! * `nanowire bench sink`: the receiver. It spins, stalls (stops reading
//!   for `--stall-ms` after the first datagram, then drains) or echoes every
//!   datagram back, and reports as JSON what arrived, the sequence gaps, the
//!   peak queue occupancy it saw and the drop counters of its namespace
//!   (`/proc/net/snmp` Udp RcvbufErrors/InErrors, interface rx_dropped,
//!   softnet backlog drops) so every lost datagram is accounted for.

use crate::le::{Fields, put_u64};
use clap::{Args, ValueEnum};
use nanowire_stack::{EngineKind, EngineOptions, UdpEndpoint};
use serde::Serialize;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

/// Magic at the start of every burst datagram.
pub const MAGIC: [u8; 4] = *b"NWB1";
/// Bytes of header every burst datagram carries.
pub const HEADER_LEN: usize = 32;
/// Largest UDP payload over IPv4.
pub const MAX_SIZE: usize = 65507;

/// Nanoseconds of CLOCK_MONOTONIC (one clock for every namespace of a machine).
pub fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The header of a burst datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstHeader {
    pub run: u32,
    pub seq: u64,
    /// Datagrams in the burst; 0 when the generator runs for a duration.
    pub total: u64,
    pub tx_ns: u64,
}

impl BurstHeader {
    pub fn write(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(&MAGIC);
        buf[4..8].copy_from_slice(&self.run.to_le_bytes());
        put_u64(buf, 8, self.seq);
        put_u64(buf, 16, self.total);
        put_u64(buf, 24, self.tx_ns);
    }
    /// `None` for anything that is not a burst datagram.
    pub fn parse(buf: &[u8]) -> Option<BurstHeader> {
        let f = Fields::check(buf, MAGIC, HEADER_LEN)?;
        Some(BurstHeader {
            run: f.u32_at(4),
            seq: f.u64_at(8),
            total: f.u64_at(16),
            tx_ns: f.u64_at(24),
        })
    }
}

// ---------------------------------------------------------------------------
// Opening sockets on an engine.

/// A socket on an engine, plus the xdp engine's handle for its counters.
pub struct Opened {
    pub ep: Box<dyn UdpEndpoint>,
    pub xdp: Option<std::sync::Arc<nanowire_stack::xdp::Engine>>,
}

/// Open a UDP socket bound to `bind` on `engine`, without falling back: a
/// measurement must run on the engine it names.
pub fn open_endpoint(
    engine: EngineKind,
    bind: SocketAddrV4,
    ring_depth: Option<u32>,
) -> Result<Opened, String> {
    let mut opts = EngineOptions::new(engine);
    opts.fallback = false;
    if let Some(d) = ring_depth {
        opts.ring_depth = d;
    }
    match engine {
        EngineKind::Kernel | EngineKind::Spin => {
            let ep = nanowire_stack::open_udp(bind, &opts)
                .map_err(|e| format!("cannot open a UDP socket on {bind} ({engine}): {e}"))?;
            Ok(Opened { ep, xdp: None })
        }
        EngineKind::Xdp => {
            let s = nanowire_stack::xdp::XdpSocket::open(bind, &opts)
                .map_err(|e| format!("engine xdp is not available: {e}"))?;
            let h = s.engine_handle().clone();
            Ok(Opened {
                ep: Box::new(s),
                xdp: Some(h),
            })
        }
    }
}

/// The xdp engine's counters that say a datagram was dropped on the way to a socket.
const XDP_DROP_COUNTERS: [&str; 6] = [
    "drop_socket_queue_full",
    "drop_no_socket",
    "xsk_rx_dropped",
    "xsk_rx_ring_full",
    "xsk_rx_fill_ring_empty",
    "xdp_no_socket_on_queue",
];

fn pin(cpu: Option<usize>) -> Result<(), String> {
    if let Some(c) = cpu {
        let ids = core_affinity::get_core_ids().unwrap_or_default();
        let id = ids
            .into_iter()
            .find(|i| i.id == c)
            .ok_or_else(|| format!("cannot pin to CPU {c}: no such CPU"))?;
        if !core_affinity::set_for_current(id) {
            return Err(format!("cannot pin to CPU {c}"));
        }
    }
    Ok(())
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat.
pub fn self_cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the ")" of comm: state is field 3; utime 14, stime 15.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

// ---------------------------------------------------------------------------
// Generator.

#[derive(Debug, Args)]
pub struct BurstArgs {
    /// Destination address.
    #[arg(short = 'i', long = "ip")]
    pub ip: Ipv4Addr,
    /// Destination port.
    #[arg(short = 'p', long = "port", default_value_t = 11112)]
    pub port: u16,
    /// Datagram size in bytes (32..=65507).
    #[arg(short = 'm', long = "msg-size", default_value_t = 256)]
    pub size: usize,
    /// Datagrams in the burst.
    #[arg(short = 'n', long = "count", default_value_t = 1000)]
    pub count: u64,
    /// Send for this many seconds instead of a fixed count.
    #[arg(long = "duration")]
    pub duration: Option<f64>,
    /// Pace at this many datagrams per second (default: back to back).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Inter-packet gap in ns; each datagram is sent alone when > 0.
    #[arg(long = "gap-ns", default_value_t = 0)]
    pub gap_ns: u64,
    /// Datagrams per batch when sending back to back.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Local address to bind (default: any).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: Ipv4Addr,
    #[command(flatten)]
    pub common: RunArgs,
}

/// The options generator and sink share.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Run id: carried in every datagram; the sink counts only its own.
    #[arg(long, default_value_t = 1)]
    pub run: u32,
    #[arg(long, default_value = "spin")]
    pub engine: EngineKind,
    /// Pin to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl RunArgs {
    /// The report: one JSON line with --json, else `text`'s lines.
    fn print(&self, rep: &impl Serialize, text: impl FnOnce() -> String) -> Result<(), String> {
        if self.json {
            crate::result::print_json(rep)
        } else {
            println!("{}", text());
            Ok(())
        }
    }
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BurstReport {
    pub mode: String,
    pub engine: EngineKind,
    pub msg_size: usize,
    pub requested: u64,
    pub sent: u64,
    pub send_errors: u64,
    pub elapsed_s: f64,
    pub rate_msg_s: f64,
    /// Burst time on 10 GbE per the seed: (46 + size) * packets * 8 * 0.1 ns.
    pub burst_time_10g_us: f64,
    pub gap_ns: u64,
    pub cpu_s: f64,
    pub echoes_received: u64,
}

/// Seed 000's burst time: `(46 + size) * packets * 8 * 0.1 ns`, in µs.
pub fn burst_time_10g_us(size: usize, packets: u64) -> f64 {
    (46.0 + size as f64) * packets as f64 * 8.0 * 0.1 / 1000.0
}

pub fn run_burst(a: BurstArgs) -> Result<i32, String> {
    if !(HEADER_LEN..=MAX_SIZE).contains(&a.size) {
        return Err(format!(
            "message size {} out of range {HEADER_LEN}..={MAX_SIZE}",
            a.size
        ));
    }
    if a.count == 0 && a.duration.is_none() {
        return Err("--count must be at least 1".into());
    }
    if let Some(r) = a.rate
        && !(r.is_finite() && r > 0.0)
    {
        return Err(format!("--rate must be positive, got {r}"));
    }
    if let Some(d) = a.duration
        && !(d.is_finite() && d > 0.0 && d <= 3600.0)
    {
        return Err(format!("--duration must be in (0, 3600] s, got {d}"));
    }
    let batch = a.batch.clamp(1, 1024);
    pin(a.common.cpu)?;
    let Opened { mut ep, .. } = open_endpoint(a.common.engine, SocketAddrV4::new(a.bind, 0), None)?;
    let dst = SocketAddrV4::new(a.ip, a.port);
    let total = if a.duration.is_some() { 0 } else { a.count };
    let mut bufs = vec![vec![0u8; a.size]; batch];
    let mut sent = 0u64;
    let mut errors = 0u64;
    let mut echoes = 0u64;
    let mut rx = vec![0u8; 65536];
    let cpu0 = self_cpu_seconds();
    let start = Instant::now();
    let end = a.duration.map(|d| start + Duration::from_secs_f64(d));
    let gap = if a.gap_ns > 0 {
        Some(a.gap_ns)
    } else {
        a.rate.map(|r| (1e9 / r) as u64)
    };
    let start_ns = mono_ns();
    let mut last_err: Option<String> = None;
    loop {
        if let Some(e) = end {
            if Instant::now() >= e {
                break;
            }
        } else if sent >= a.count {
            break;
        }
        // How many datagrams are due now.
        let due = match gap {
            None => batch as u64,
            Some(g) => {
                let now = mono_ns();
                let should = (now - start_ns) / g.max(1) + 1;
                if should <= sent {
                    std::hint::spin_loop();
                    continue;
                }
                if a.gap_ns > 0 {
                    1
                } else {
                    (should - sent).min(batch as u64)
                }
            }
        };
        let n = if total > 0 {
            due.min(a.count - sent) as usize
        } else {
            due as usize
        };
        let tx_ns = mono_ns();
        for (i, b) in bufs.iter_mut().take(n).enumerate() {
            BurstHeader {
                run: a.common.run,
                seq: sent + i as u64,
                total,
                tx_ns,
            }
            .write(b);
        }
        let refs: Vec<&[u8]> = bufs.iter().take(n).map(|b| b.as_slice()).collect();
        match ep.send_batch_to(&refs, dst) {
            Ok(k) => sent += k as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                errors += 1;
                if errors > 1000 {
                    return Err(format!("sending to {dst} keeps failing: {e}"));
                }
                last_err = Some(e.to_string());
                // Count the datagrams that did not leave as sent-and-lost is
                // wrong; skip them so seq numbers stay dense.
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        // Echoes from an echoing sink (never blocks).
        while let Ok(Some(_)) = ep.try_recv_from(&mut rx) {
            echoes += 1;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Collect late echoes briefly.
    let until = Instant::now() + Duration::from_millis(50);
    while Instant::now() < until {
        match ep.try_recv_from(&mut rx) {
            Ok(Some(_)) => echoes += 1,
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    if let Some(e) = last_err {
        eprintln!("burst: {errors} send errors, last: {e}");
    }
    let rep = BurstReport {
        mode: if a.duration.is_some() {
            "stream".into()
        } else {
            "burst".into()
        },
        engine: ep.engine(),
        msg_size: a.size,
        requested: a.count,
        sent,
        send_errors: errors,
        elapsed_s: elapsed,
        rate_msg_s: if elapsed > 0.0 {
            sent as f64 / elapsed
        } else {
            0.0
        },
        burst_time_10g_us: burst_time_10g_us(a.size, sent),
        gap_ns: gap.unwrap_or(0),
        cpu_s: self_cpu_seconds() - cpu0,
        echoes_received: echoes,
    };
    a.common.print(&rep, || {
        format!(
            "burst: sent {} x {} B to {dst} in {:.3} ms ({:.0} msg/s, {} errors; {:.2} us at 10GbE)",
            rep.sent,
            rep.msg_size,
            elapsed * 1e3,
            rep.rate_msg_s,
            rep.send_errors,
            rep.burst_time_10g_us
        )
    })?;
    Ok(0)
}

// ---------------------------------------------------------------------------
// Sink.

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Behaviour {
    /// Read as fast as possible.
    Spin,
    /// Stop reading for --stall-ms after the first datagram, then drain.
    Stall,
    /// Echo every datagram back to its sender.
    Echo,
}

#[derive(Debug, Args)]
pub struct SinkArgs {
    /// Address to listen on.
    #[arg(short = 'i', long = "ip", default_value = "0.0.0.0")]
    pub ip: Ipv4Addr,
    #[arg(short = 'p', long = "port", default_value_t = 11112)]
    pub port: u16,
    #[arg(long, value_enum, default_value_t = Behaviour::Spin)]
    pub behaviour: Behaviour,
    /// How long a stalled receiver stops reading after the first datagram.
    #[arg(long = "stall-ms", default_value_t = 800)]
    pub stall_ms: u64,
    /// Stop after this long without a datagram (once the first one came).
    #[arg(long = "idle-ms", default_value_t = 300)]
    pub idle_ms: u64,
    /// Give up when no datagram arrives within this many seconds.
    #[arg(long = "timeout", default_value_t = 30.0)]
    pub timeout_s: f64,
    /// RX/fill ring depth of the xdp engine (frames; default: the engine's).
    #[arg(long = "ring-depth")]
    pub ring_depth: Option<u32>,
    /// Finish when stdin reaches end of file (the generator is done) and the
    /// queue is drained, instead of after --idle-ms without a datagram.
    #[arg(long = "stop-on-eof")]
    pub stop_on_eof: bool,
    #[command(flatten)]
    pub common: RunArgs,
    /// Exit 3 when the accounting identity fails (a missing datagram that no
    /// drop counter covers).
    #[arg(long)]
    pub strict: bool,
}

/// Drop counters of the receiver's namespace.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct DropCounters {
    /// /proc/net/snmp Udp RcvbufErrors: datagrams dropped because the socket buffer was full.
    pub udp_rcvbuf_errors: u64,
    /// /proc/net/snmp Udp InErrors (includes RcvbufErrors and checksum errors).
    pub udp_in_errors: u64,
    /// /proc/net/snmp Udp NoPorts.
    pub udp_no_ports: u64,
    /// Sum of rx_dropped of the namespace's interfaces.
    pub if_rx_dropped: u64,
    /// /proc/net/softnet_stat backlog drops (machine-wide).
    pub softnet_dropped: u64,
    /// Engine drop counters (xdp engine: ring full, fill ring empty, ...).
    pub engine_dropped: u64,
}

impl DropCounters {
    pub fn read() -> DropCounters {
        let mut d = DropCounters::default();
        if let Ok(s) = std::fs::read_to_string("/proc/net/snmp") {
            let udp: Vec<&str> = s.lines().filter(|l| l.starts_with("Udp:")).collect();
            if udp.len() >= 2 {
                let names: Vec<&str> = udp[0].split_whitespace().collect();
                let vals: Vec<&str> = udp[1].split_whitespace().collect();
                for (n, v) in names.iter().zip(vals.iter()) {
                    let v = v.parse().unwrap_or(0);
                    match *n {
                        "RcvbufErrors" => d.udp_rcvbuf_errors = v,
                        "InErrors" => d.udp_in_errors = v,
                        "NoPorts" => d.udp_no_ports = v,
                        _ => {}
                    }
                }
            }
        }
        if let Ok(rd) = std::fs::read_dir("/sys/class/net") {
            for e in rd.flatten() {
                let p = e.path().join("statistics/rx_dropped");
                if let Ok(v) = std::fs::read_to_string(p) {
                    d.if_rx_dropped += v.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
        if let Ok(s) = std::fs::read_to_string("/proc/net/softnet_stat") {
            for l in s.lines() {
                if let Some(v) = l.split_whitespace().nth(1) {
                    d.softnet_dropped += u64::from_str_radix(v, 16).unwrap_or(0);
                }
            }
        }
        d
    }
    pub fn since(&self, before: &DropCounters) -> DropCounters {
        DropCounters {
            udp_rcvbuf_errors: self
                .udp_rcvbuf_errors
                .saturating_sub(before.udp_rcvbuf_errors),
            udp_in_errors: self.udp_in_errors.saturating_sub(before.udp_in_errors),
            udp_no_ports: self.udp_no_ports.saturating_sub(before.udp_no_ports),
            if_rx_dropped: self.if_rx_dropped.saturating_sub(before.if_rx_dropped),
            softnet_dropped: self.softnet_dropped.saturating_sub(before.softnet_dropped),
            engine_dropped: self.engine_dropped.saturating_sub(before.engine_dropped),
        }
    }
    /// Datagrams the counters say were dropped on the way to this receiver.
    pub fn accounted(&self) -> u64 {
        // InErrors already includes RcvbufErrors.
        self.udp_in_errors.max(self.udp_rcvbuf_errors)
            + self.if_rx_dropped
            + self.softnet_dropped
            + self.engine_dropped
    }
}

/// One-way latency (transmit to user memory), µs.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq)]
pub struct OneWay {
    pub samples: u64,
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub avg: f64,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SinkReport {
    pub engine: EngineKind,
    pub behaviour: Behaviour,
    pub stall_ms: u64,
    /// xdp engine ring depth (frames), when the sink ran on xdp.
    #[serde(default)]
    pub ring_depth: Option<u32>,
    /// Datagrams the generator said the burst had (0: unknown, streaming).
    pub expected: u64,
    /// Distinct datagrams received.
    pub received: u64,
    pub bytes: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    /// Missing sequence numbers below the highest seen (plus the tail when
    /// the burst length is known).
    pub missing: u64,
    /// Runs of consecutive missing sequence numbers.
    pub gaps: u64,
    /// Most datagrams found queued at once (drained without the queue going empty).
    pub peak_occupancy: u64,
    pub rcvbuf: Option<usize>,
    pub drops: DropCounters,
    /// The xdp engine's counters over the run (drops by reason, ring peaks).
    #[serde(default)]
    pub engine_counters: std::collections::BTreeMap<String, u64>,
    /// First to last datagram, seconds.
    pub active_s: f64,
    pub rate_msg_s: f64,
    pub cpu_s: f64,
    /// Wall time the sink ran (for %CPU = cpu_s / wall_s).
    pub wall_s: f64,
    pub latency_us: Option<OneWay>,
    pub echoed: u64,
    pub timed_out: bool,
    /// sent = received + counted drops (`null` on old reports).
    #[serde(default)]
    pub accounting: Option<crate::result::Accounting>,
}

/// The sink's identity: every datagram the generator sent was received or
/// is covered by a counted drop (the namespace's counters, which may count
/// other traffic too, so "covered" means missing <= counted).
pub fn sink_accounting(
    expected: u64,
    received: u64,
    missing: u64,
    counted: u64,
) -> crate::result::Accounting {
    if expected == 0 {
        return crate::result::Accounting::not_applicable(
            "the generator did not say how many it sent (streaming)",
        );
    }
    crate::result::Accounting {
        identity:
            "sent = received + missing, and every missing datagram is covered by a counted drop"
                .into(),
        expected,
        received,
        dropped: counted,
        holds: Some(received + missing == expected && missing <= counted),
    }
}

fn rmem_default() -> Option<usize> {
    std::fs::read_to_string("/proc/sys/net/core/rmem_default")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

pub fn run_sink(a: SinkArgs) -> Result<i32, String> {
    if a.stall_ms > 600_000 {
        return Err("--stall-ms must be at most 600000".into());
    }
    if !(a.timeout_s.is_finite() && a.timeout_s > 0.0) {
        return Err("--timeout must be positive".into());
    }
    if let Some(d) = a.ring_depth
        && !(64..=1 << 20).contains(&d)
    {
        return Err(format!("--ring-depth must be 64..=1048576, got {d}"));
    }
    pin(a.common.cpu)?;
    let Opened { mut ep, xdp } = open_endpoint(
        a.common.engine,
        SocketAddrV4::new(a.ip, a.port),
        a.ring_depth,
    )?;
    let xdp_counters = |h: &std::sync::Arc<nanowire_stack::xdp::Engine>| {
        h.counters()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<std::collections::BTreeMap<String, u64>>()
    };
    let xdp_before = xdp.as_ref().map(xdp_counters);
    let before = DropCounters::read();
    // Tell the runner we are listening.
    eprintln!("READY {}", ep.local_addr().map_err(|e| e.to_string())?);
    let _ = io::stderr().flush();

    let mut buf = vec![0u8; 65536];
    let mut seen: Vec<u64> = Vec::new(); // bitmap
    let mut received = 0u64;
    let mut bytes = 0u64;
    let mut dups = 0u64;
    let mut ooo = 0u64;
    let mut max_seq: Option<u64> = None;
    let mut expected = 0u64;
    let mut peak = 0u64;
    let mut run_len = 0u64;
    let mut echoed = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|e| e.to_string())?;
    let cpu0 = self_cpu_seconds();
    let wall0 = Instant::now();
    let give_up = Instant::now() + Duration::from_secs_f64(a.timeout_s);
    let idle = Duration::from_millis(a.idle_ms.max(1));
    let mut timed_out = false;
    let mut stalled = a.behaviour != Behaviour::Stall;
    let eof = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if a.stop_on_eof {
        let flag = eof.clone();
        std::thread::spawn(move || {
            let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let generator_done = || a.stop_on_eof && eof.load(std::sync::atomic::Ordering::SeqCst);

    loop {
        let deadline = match first {
            None => give_up,
            // With --stop-on-eof the generator says when it is done; idle is only a safety net.
            Some(_) if a.stop_on_eof => last + idle.max(Duration::from_secs(10)),
            Some(_) => last + idle,
        };
        // After the first datagram a stalled receiver stops reading, then drains.
        if !stalled && let Some(f) = first {
            let resume = f + Duration::from_millis(a.stall_ms);
            let now = Instant::now();
            if now < resume {
                std::thread::sleep(resume - now);
            }
            stalled = true;
            run_len = 0;
            last = Instant::now();
            continue;
        }
        let mut got_late = None;
        let got = match ep.try_recv_from(&mut buf).map_err(|e| e.to_string())? {
            Some(x) => Some(x),
            None => {
                run_len = 0;
                if first.is_some() && expected > 0 && received >= expected {
                    break;
                }
                // The generator is done and the queue is empty (checked after it finished).
                if stalled && generator_done() {
                    // One more look: anything that raced in before EOF.
                    match ep.try_recv_from(&mut buf).map_err(|e| e.to_string())? {
                        Some(x) => {
                            got_late = Some(x);
                        }
                        None => break,
                    }
                }
                let wait_until = deadline.min(Instant::now() + Duration::from_millis(20));
                if got_late.is_some() {
                    got_late
                } else {
                    match ep
                        .recv_from(&mut buf, Some(wait_until))
                        .map_err(|e| e.to_string())?
                    {
                        Some(x) => Some(x),
                        None => {
                            if Instant::now() >= deadline {
                                if first.is_none() {
                                    timed_out = true;
                                }
                                break;
                            }
                            if first.is_none() && generator_done() {
                                break; // the generator finished and nothing ever came
                            }
                            None
                        }
                    }
                }
            }
        };
        let Some((n, from)) = got else { continue };
        let now_ns = mono_ns();
        let Some(h) = BurstHeader::parse(&buf[..n]) else {
            continue;
        };
        if h.run != a.common.run {
            continue;
        }
        let now = Instant::now();
        if first.is_none() {
            first = Some(now);
        }
        last = now;
        run_len += 1;
        peak = peak.max(run_len);
        if h.total > 0 {
            expected = h.total;
        }
        let (w, bit) = ((h.seq / 64) as usize, h.seq % 64);
        if w >= seen.len() {
            if w > 1 << 26 {
                continue; // absurd sequence number: ignore rather than allocate
            }
            seen.resize(w + 1, 0);
        }
        if seen[w] & (1 << bit) != 0 {
            dups += 1;
            continue;
        }
        seen[w] |= 1 << bit;
        received += 1;
        bytes += n as u64;
        if max_seq.is_some_and(|m| h.seq < m) {
            ooo += 1;
        }
        max_seq = Some(max_seq.map_or(h.seq, |m| m.max(h.seq)));
        if now_ns >= h.tx_ns {
            let _ = hist.record((now_ns - h.tx_ns).max(1));
        }
        if a.behaviour == Behaviour::Echo && ep.send_to(&buf[..n], from).is_ok() {
            echoed += 1;
        }
    }
    let mut after = DropCounters::read();
    // The xdp engine's own counters (the kernel's XDP_STATISTICS included).
    let mut engine_counters = std::collections::BTreeMap::new();
    if let (Some(h), Some(b0)) = (xdp.as_ref(), xdp_before.as_ref()) {
        h.poll();
        for (k, v) in xdp_counters(h) {
            let d = if k.starts_with("peak_") || k == "sockets" {
                v
            } else {
                v.saturating_sub(b0.get(&k).copied().unwrap_or(0))
            };
            if XDP_DROP_COUNTERS.contains(&k.as_str()) {
                after.engine_dropped += d;
            }
            engine_counters.insert(k, d);
        }
        if let Some(p) = engine_counters.get("peak_rx_ring").copied() {
            peak = peak.max(p);
        }
        if let Some(p) = engine_counters.get("peak_socket_queue").copied() {
            peak = peak.max(p);
        }
    }
    let span = match max_seq {
        None => 0,
        Some(m) => (m + 1).max(expected),
    };
    let mut gaps = 0u64;
    let mut prev_missing = false;
    for s in 0..span {
        let w = (s / 64) as usize;
        let missing = seen.get(w).is_none_or(|x| x & (1 << (s % 64)) == 0);
        if missing && !prev_missing {
            gaps += 1;
        }
        prev_missing = missing;
    }
    let active = match first {
        Some(f) => (last - f).as_secs_f64(),
        None => 0.0,
    };
    let latency = (!hist.is_empty()).then(|| OneWay {
        samples: hist.len(),
        min: hist.min() as f64 / 1e3,
        p50: hist.value_at_quantile(0.5) as f64 / 1e3,
        p99: hist.value_at_quantile(0.99) as f64 / 1e3,
        max: hist.max() as f64 / 1e3,
        avg: hist.mean() / 1e3,
    });
    let missing = span.saturating_sub(received);
    let drops = after.since(&before);
    let accounting = Some(sink_accounting(
        expected,
        received,
        missing,
        drops.accounted(),
    ));
    let rep = SinkReport {
        accounting,
        engine: ep.engine(),
        behaviour: a.behaviour,
        stall_ms: if a.behaviour == Behaviour::Stall {
            a.stall_ms
        } else {
            0
        },
        ring_depth: xdp.as_ref().map(|h| h.ring_depth()),
        expected,
        received,
        bytes,
        duplicates: dups,
        out_of_order: ooo,
        missing,
        gaps,
        peak_occupancy: peak,
        rcvbuf: if ep.engine() == EngineKind::Xdp {
            None
        } else {
            rmem_default()
        },
        drops,
        engine_counters,
        active_s: active,
        rate_msg_s: if active > 0.0 {
            received as f64 / active
        } else {
            0.0
        },
        cpu_s: self_cpu_seconds() - cpu0,
        wall_s: wall0.elapsed().as_secs_f64(),
        latency_us: latency,
        echoed,
        timed_out,
    };
    a.common.print(&rep, || {
        let mut t = format!(
            "sink ({:?}, {}): received {}/{} ({} missing in {} gaps, {} dup, {} out of order), peak queue {}, drops {:?}",
            rep.behaviour,
            rep.engine,
            rep.received,
            rep.expected,
            rep.missing,
            rep.gaps,
            rep.duplicates,
            rep.out_of_order,
            rep.peak_occupancy,
            rep.drops
        );
        if let Some(acc) = &rep.accounting {
            t += &format!("\nsink: {}", acc.line());
        }
        t
    })?;
    if a.strict
        && let Some(acc) = &rep.accounting
        && acc.holds == Some(false)
    {
        eprintln!("nanowire: {}", acc.line());
        return Ok(acc.strict_exit_code());
    }
    Ok(if timed_out { 2 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_burst_time_formula() {
        // (46 + 256) * 1000 * 8 * 0.1 ns = 241.6 us
        assert!((burst_time_10g_us(256, 1000) - 241.6).abs() < 1e-9);
    }

    #[test]
    fn drop_counters_since_saturates() {
        let a = DropCounters {
            udp_rcvbuf_errors: 5,
            udp_in_errors: 5,
            ..Default::default()
        };
        let b = DropCounters::default();
        assert_eq!(b.since(&a).udp_rcvbuf_errors, 0);
        assert_eq!(a.since(&b).accounted(), 5);
    }
}
