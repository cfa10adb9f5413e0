//! `nanowire-xdp-test`: the xdp engine's test mode, used by the integration
//! tests (and for memory measurements in docs/benchmarks.md). Open xdp
//! sockets and echo (or count) datagrams until stdin closes or the time is
//! up, then print counters as JSON; or ping-pong / flood as a client; or the
//! same on a spinning kernel socket (`--kernel`) for comparisons. Formerly
//! the hidden `nanowire xdp-test` subcommand, moved out of the engine
//! library: it is test support, not part of the product.
use clap::Parser;
use nanowire_stack::xdp::XdpSocket;
use nanowire_stack::{EngineKind, EngineOptions, UdpEndpoint, WaitPolicy};
use std::io::{BufRead, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// println! that never panics on a closed stdout (e.g. piped into head).
macro_rules! out {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

fn main() {
    let args = XdpTestArgs::parse();
    // The engine's settings from the environment, once (the library never reads it).
    let _ = nanowire_stack::xdp::config::configure(
        nanowire_stack::xdp::config::EngineConfig::from_vars(|k| std::env::var(k).ok()),
    );
    match xdp_test(args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("nanowire: error: {e}");
            std::process::exit(1);
        }
    }
}

/// Open xdp sockets and echo (or count) datagrams
/// until stdin closes or the time is up, then print counters as JSON.
#[derive(Debug, Parser)]
#[command(name = "nanowire-xdp-test")]
struct XdpTestArgs {
    /// Interface (default: the one owning the bind address).
    #[arg(long)]
    iface: Option<String>,
    /// First UDP port.
    #[arg(long, default_value_t = 11111)]
    port: u16,
    /// Number of sockets (consecutive ports, or all on the group's port).
    #[arg(long, default_value_t = 1)]
    sockets: u16,
    /// Multicast group: every socket binds GROUP:PORT and joins it.
    #[arg(long)]
    group: Option<Ipv4Addr>,
    /// Echo every datagram to its source (multicast: prefixed "sN:").
    #[arg(long)]
    echo: bool,
    /// spin | block | spin-then-block:MICROS
    #[arg(long, default_value = "spin")]
    wait: String,
    /// RX ring depth (frames).
    #[arg(long, default_value_t = 16384)]
    ring_depth: u32,
    /// Stop after this many seconds (default: when stdin closes).
    #[arg(long)]
    secs: Option<f64>,
    /// Ping-pong client mode: measure round trips to this echo server.
    #[arg(long)]
    client: Option<SocketAddrV4>,
    /// Client: round trips to measure.
    #[arg(long, default_value_t = 10000)]
    count: u32,
    /// Client: datagram size.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Client: instead of ping-pong, send this many datagrams back to back
    /// with batched transmit (send_batch_to) and report the rate.
    #[arg(long)]
    flood: Option<u64>,
    /// Stall until a line (or EOF) arrives on stdin: read nothing before.
    #[arg(long)]
    hold: bool,
    /// Stall: wait this long after "ready" before reading anything (burst
    /// absorption: what the rings hold is what survives).
    #[arg(long, default_value_t = 0)]
    stall_ms: u64,
    /// Use a spinning kernel UDP socket instead of the xdp engine (for
    /// comparisons in the same run).
    #[arg(long)]
    kernel: bool,
    /// After "ready", fork: the child opens its own socket on this port
    /// (xdp engine with fallback), prints one JSON line saying which engine
    /// serves it and why, and echoes on it until stdin closes; the parent
    /// goes on as usual.
    #[arg(long)]
    fork_port: Option<u16>,
}

fn parse_wait(s: &str) -> Result<WaitPolicy, String> {
    match s {
        "spin" => Ok(WaitPolicy::Spin),
        "block" => Ok(WaitPolicy::Block),
        o => o
            .strip_prefix("spin-then-block:")
            .and_then(|us| us.parse::<u64>().ok())
            .map(|us| WaitPolicy::SpinThenBlock(Duration::from_micros(us)))
            .ok_or_else(|| {
                format!("bad wait policy {o:?}: expected spin, block or spin-then-block:MICROS")
            }),
    }
}

fn xdp_test(a: XdpTestArgs) -> Result<i32, String> {
    if a.kernel {
        return kernel_spin_test(&a);
    }
    let mut opts = EngineOptions::new(EngineKind::Xdp);
    opts.iface = a.iface.clone();
    opts.ring_depth = a.ring_depth;
    opts.wait = parse_wait(&a.wait)?;
    opts.fallback = false;
    if a.sockets == 0 {
        return Err("--sockets must be at least 1".into());
    }
    let mut socks = Vec::new();
    for i in 0..a.sockets {
        let bind = match a.group {
            Some(g) => SocketAddrV4::new(g, a.port),
            None => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, a.port.wrapping_add(i)),
        };
        let mut s =
            XdpSocket::open(bind, &opts).map_err(|e| format!("xdp socket on {bind}: {e}"))?;
        if let Some(g) = a.group {
            s.join_multicast(g, Ipv4Addr::UNSPECIFIED)
                .map_err(|e| format!("join {g}: {e}"))?;
        }
        socks.push(s);
    }
    let eng = socks[0].engine_handle().clone();
    if let Some(peer) = a.client {
        socks[0]
            .connect(peer)
            .map_err(|e| format!("connect {peer}: {e}"))?;
        if let Some(total) = a.flood {
            let msgs: Vec<Vec<u8>> = (0..256u64)
                .map(|i| {
                    let mut m = vec![0u8; a.size.max(8)];
                    m[..8].copy_from_slice(&i.to_le_bytes());
                    m
                })
                .collect();
            let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
            let t0 = Instant::now();
            let (mut sent, mut full) = (0u64, 0u64);
            while sent < total {
                let n = (total - sent).min(256) as usize;
                match socks[0].send_batch_to(&refs[..n], peer) {
                    Ok(k) => sent += k as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => full += 1,
                    Err(e) => return Err(format!("send: {e}")),
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            out!(
                "{}",
                serde_json::json!({"sent": sent, "secs": secs, "rate_pps": sent as f64 / secs, "tx_ring_full_retries": full, "size": a.size.max(8)})
            );
            return Ok(0);
        }
        let s = std::cell::RefCell::new(&mut socks[0]);
        let r = ping_pong(
            a.count,
            a.size,
            |m| s.borrow_mut().send(m).map(|_| ()),
            |b| {
                s.borrow_mut()
                    .recv_from(b, Some(Instant::now() + Duration::from_secs(1)))
                    .map(|o| o.map(|(n, _)| n))
            },
        )?;
        out!("{r}");
        return Ok(0);
    }
    out!(
        "{}",
        serde_json::json!({
            "ready": true,
            "iface": eng.iface().name,
            "queues": eng.iface().rx_queues,
            "ring_depth": eng.ring_depth(),
            "tx_budget": eng.tx_budget(),
            "xdp_mode": eng.attach_mode().as_str(),
            "bind_mode": eng.bind_mode().as_str(),
            "multi_buffer": eng.multi_buffer(),
            "sockets": socks.iter().map(|s| s.local_addr().map(|a| a.to_string()).unwrap_or_default()).collect::<Vec<_>>(),
            "stats_page": eng.stats_page(),
        })
    );
    let _ = std::io::stdout().flush();
    if let Some(p2) = a.fork_port {
        fork_child_echo(p2, &opts);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    if a.secs.is_none() {
        let (st, g) = (stop.clone(), go.clone());
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            for l in stdin.lock().lines() {
                if l.is_err() {
                    break;
                }
                g.store(true, Ordering::Relaxed);
            }
            st.store(true, Ordering::Relaxed);
        });
    }
    std::thread::sleep(Duration::from_millis(a.stall_ms));
    if a.hold {
        while !go.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let end = a.secs.map(|s| Instant::now() + Duration::from_secs_f64(s));
    let mut buf = vec![0u8; 65536];
    let mut pending: Vec<(Vec<u8>, SocketAddrV4)> = Vec::new();
    let mut iter = 0u64;
    while !stop.load(Ordering::Relaxed) && end.is_none_or(|e| Instant::now() < e) {
        if socks.len() == 1 {
            let dl = Instant::now() + Duration::from_millis(50);
            let got = socks[0]
                .recv_from(&mut buf, Some(dl))
                .map_err(|e| e.to_string())?;
            if let (Some((n, src)), true) = (got, a.echo) {
                let _ = socks[0].send_to(&buf[..n], src);
            }
            continue;
        }
        iter += 1;
        let mut got = 0;
        for (i, s) in socks.iter_mut().enumerate() {
            got += s.recv_batch(64, |p, src| {
                if a.echo {
                    let mut v = Vec::with_capacity(p.len() + 4);
                    if a.group.is_some() {
                        v.extend_from_slice(format!("s{i}:").as_bytes());
                    }
                    v.extend_from_slice(p);
                    pending.push((v, src));
                }
            });
            for (v, src) in pending.drain(..) {
                let _ = s.send_to(&v, src);
            }
        }
        if got == 0 && iter.is_multiple_of(1024) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Whatever is still queued is consumed (not echoed) before counting.
    loop {
        let n: usize = socks
            .iter_mut()
            .map(|s| s.recv_batch(1024, |_, _| {}))
            .sum();
        if n == 0 {
            break;
        }
    }
    let counters: serde_json::Map<String, serde_json::Value> = eng
        .counters()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into()))
        .collect();
    let sockets: Vec<_> = socks
        .iter()
        .map(|s| {
            let st = s.stats();
            serde_json::json!({
                "local": s.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                "stats": st,
            })
        })
        .collect();
    out!(
        "{}",
        serde_json::json!({ "counters": counters, "sockets": sockets })
    );
    Ok(0)
}

/// Fork; in the child, echo on `port` with a socket of its own until stdin
/// closes, then exit without running any destructor (the parent's engine
/// is not the child's to clean up). Returns in the parent.
fn fork_child_echo(port: u16, opts: &EngineOptions) {
    // SAFETY: fork(2); the child only runs code that allocates through
    // glibc malloc (fork-safe) and exits with _exit.
    let pid = unsafe { libc::fork() };
    if pid != 0 {
        return;
    }
    let mut o = opts.clone();
    o.fallback = true;
    let code = match nanowire_stack::open_udp(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port), &o) {
        Ok(mut s) => {
            out!(
                "{}",
                serde_json::json!({"child": true, "engine": s.engine().as_str(), "reason": s.fallback_reason()})
            );
            let _ = std::io::stdout().flush();
            let stop = Arc::new(AtomicBool::new(false));
            let st = stop.clone();
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
                st.store(true, Ordering::Relaxed);
            });
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                let dl = Instant::now() + Duration::from_millis(50);
                if let Ok(Some((n, src))) = s.recv_from(&mut buf, Some(dl)) {
                    let _ = s.send_to(&buf[..n], src);
                }
            }
            0
        }
        Err(e) => {
            out!(
                "{}",
                serde_json::json!({"child": true, "error": e.to_string()})
            );
            1
        }
    };
    let _ = std::io::stdout().flush();
    // SAFETY: _exit never returns; no destructors run in the child.
    unsafe { libc::_exit(code) };
}

/// One-way latency summary (RTT/2) in microseconds, as JSON.
fn ping_pong(
    count: u32,
    size: usize,
    mut send: impl FnMut(&[u8]) -> std::io::Result<()>,
    mut recv: impl FnMut(&mut [u8]) -> std::io::Result<Option<usize>>,
) -> Result<serde_json::Value, String> {
    let size = size.max(8);
    let mut msg = vec![0u8; size];
    let mut buf = vec![0u8; 65536];
    let warm = count / 10;
    let mut rtts = Vec::with_capacity(count as usize);
    let mut lost = 0u32;
    for i in 0..count + warm {
        msg[..4].copy_from_slice(&i.to_le_bytes());
        let t0 = Instant::now();
        send(&msg).map_err(|e| format!("send: {e}"))?;
        loop {
            match recv(&mut buf).map_err(|e| format!("recv: {e}"))? {
                Some(n) if n >= 4 && buf[..4] == msg[..4] => {
                    if i >= warm {
                        rtts.push(t0.elapsed().as_nanos() as u64);
                    }
                    break;
                }
                Some(_) => continue,
                None => {
                    lost += 1;
                    break;
                }
            }
        }
    }
    rtts.sort_unstable();
    let pct = |p: f64| -> f64 {
        if rtts.is_empty() {
            return 0.0;
        }
        let i = ((rtts.len() as f64 * p) as usize).min(rtts.len() - 1);
        rtts[i] as f64 / 2000.0
    };
    Ok(serde_json::json!({
        "samples": rtts.len(), "lost": lost, "size": size,
        "one_way_us": {"min": pct(0.0), "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "p99.9": pct(0.999), "max": pct(1.0)}
    }))
}

/// The comparison path: a non-blocking kernel UDP socket polled without
/// sleeping (echo server, or ping-pong client with --client).
fn kernel_spin_test(a: &XdpTestArgs) -> Result<i32, String> {
    let s = std::net::UdpSocket::bind(SocketAddrV4::new(
        Ipv4Addr::UNSPECIFIED,
        if a.client.is_some() { 0 } else { a.port },
    ))
    .map_err(|e| e.to_string())?;
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    let spin_recv =
        |b: &mut [u8], dl: Instant| -> std::io::Result<Option<(usize, std::net::SocketAddr)>> {
            loop {
                match s.recv_from(b) {
                    Ok(r) => return Ok(Some(r)),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() >= dl {
                            return Ok(None);
                        }
                        std::hint::spin_loop();
                    }
                    Err(e) => return Err(e),
                }
            }
        };
    if let Some(peer) = a.client {
        s.connect(peer).map_err(|e| e.to_string())?;
        let r = ping_pong(
            a.count,
            a.size,
            |m| s.send(m).map(|_| ()),
            |b| spin_recv(b, Instant::now() + Duration::from_secs(1)).map(|o| o.map(|(n, _)| n)),
        )?;
        out!("{r}");
        return Ok(0);
    }
    out!("{}", serde_json::json!({"ready": true, "kernel": true}));
    let _ = std::io::stdout().flush();
    let end = Instant::now() + Duration::from_secs_f64(a.secs.unwrap_or(3600.0));
    let mut buf = vec![0u8; 65536];
    while Instant::now() < end {
        if let Some((n, src)) = spin_recv(&mut buf, Instant::now() + Duration::from_millis(50))
            .map_err(|e| e.to_string())?
        {
            let _ = s.send_to(&buf[..n], src);
        }
    }
    Ok(0)
}
