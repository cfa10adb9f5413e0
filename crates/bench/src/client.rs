//! The client side: `pp` (ping-pong), `ul` (latency under load) and `tp`
//! (throughput), over UDP on any engine or over TCP.
//!
//! Warm-up, as sockperf does it: a few messages flagged warm-up go first (the
//! server ignores them), then one probe that must be answered (so a dead
//! server is a clear error, not an empty result), and then the timed run,
//! whose first `warmup` (default 400 ms, at most half the run) is measured
//! but left out of every reported number.

use crate::env::Env;
use crate::result::Accounting;
use crate::result::{BenchResult, LatencyRecorder, thread_cpu_s};
use crate::transport::{MAX_TCP_MSG, TcpTransport, Transport, UdpTransport};
use nanowire_stack::{EngineKind, EngineOptions, WaitPolicy};
use nanowire_wire::sockperf::{
    FLAG_PONG_REQUEST, FLAG_WARMUP, SOCKPERF_HEADER_LEN, SockperfHeader,
};
use serde::Serialize;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddrV4, ToSocketAddrs, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Largest UDP payload over IPv4.
pub const MAX_UDP_MSG: usize = 65507;
/// Warm-up-flagged messages sent before the probe.
const WARMUP_MSGS: u64 = 4;
/// Probe attempts before "no reply".
const PROBE_TRIES: u32 = 3;
/// Most messages per batched send in `tp`.
const TP_BATCH: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// `pp`: one message in flight, each answered.
    PingPong,
    /// `ul`: paced messages, every `reply_every`-th answered.
    UnderLoad,
    /// `tp`: paced or maximal messages, none answered.
    Throughput,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::PingPong => "pp",
            Mode::UnderLoad => "ul",
            Mode::Throughput => "tp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Udp,
    Tcp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Udp => "udp",
            Protocol::Tcp => "tcp",
        }
    }
}

/// Message rate for `ul` and `tp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    Max,
    PerSec(u64),
}

impl std::str::FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Rate, String> {
        if s.eq_ignore_ascii_case("max") {
            return Ok(Rate::Max);
        }
        match s.parse::<u64>() {
            Ok(0) | Err(_) => Err(format!(
                "bad message rate {s:?}: expected a positive number of messages per second or \"max\""
            )),
            Ok(n) => Ok(Rate::PerSec(n)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub mode: Mode,
    pub server: SocketAddrV4,
    pub protocol: Protocol,
    /// The engine the socket opens on and its knobs (`EngineOptions::new`
    /// gives the kind's wait policy; the xdp engine falls back to spin
    /// unless told not to).
    pub engine: EngineOptions,
    /// Whole message size, header included.
    pub msg_size: usize,
    pub duration: Duration,
    pub mps: Rate,
    /// `ul`: ask for a reply on every N-th message.
    pub reply_every: u64,
    pub cpu: Option<usize>,
    pub warmup: Duration,
    /// A reply later than this counts as dropped (late replies are un-dropped
    /// and counted out of order).
    pub reply_timeout: Duration,
    /// Wait per probe attempt before the run.
    pub probe_timeout: Duration,
    pub full_log: Option<PathBuf>,
    /// pp, xdp engine: read the engine's receive stamp of every reply and
    /// report ring → application (`ring_to_app_us`).
    pub rx_stamps: bool,
}

impl ClientConfig {
    /// sockperf's defaults: 14-byte messages, 1 s, ul at 10000 msg/s with a
    /// reply every 100, tp at max.
    pub fn new(mode: Mode, server: SocketAddrV4) -> ClientConfig {
        ClientConfig {
            mode,
            server,
            protocol: Protocol::Udp,
            engine: EngineOptions::new(EngineKind::Kernel),
            msg_size: SOCKPERF_HEADER_LEN,
            duration: Duration::from_secs(1),
            mps: match mode {
                Mode::Throughput => Rate::Max,
                _ => Rate::PerSec(10_000),
            },
            reply_every: 100,
            cpu: None,
            warmup: Duration::from_millis(400),
            reply_timeout: Duration::from_millis(100),
            probe_timeout: Duration::from_secs(1),
            full_log: None,
            rx_stamps: false,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        match self.protocol {
            Protocol::Udp if !(SOCKPERF_HEADER_LEN..=MAX_UDP_MSG).contains(&self.msg_size) => {
                return Err(format!(
                    "message size {} is out of range: UDP needs {SOCKPERF_HEADER_LEN}..={MAX_UDP_MSG} bytes (14-byte sockperf header included)",
                    self.msg_size
                ));
            }
            Protocol::Tcp if !(SOCKPERF_HEADER_LEN..=MAX_TCP_MSG).contains(&self.msg_size) => {
                return Err(format!(
                    "message size {} is out of range: TCP needs {SOCKPERF_HEADER_LEN}..={MAX_TCP_MSG} bytes (14-byte sockperf header included)",
                    self.msg_size
                ));
            }
            _ => {}
        }
        if self.duration.is_zero() {
            return Err("test time must be positive".into());
        }
        if self.reply_every == 0 {
            return Err("--reply-every must be at least 1".into());
        }
        if self.server.port() == 0 {
            return Err("port 0 is not a server port".into());
        }
        Ok(())
    }
}

/// Resolve `host` (an IPv4 address or a name) to one IPv4 socket address.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddrV4, String> {
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(SocketAddrV4::new(ip, port));
    }
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("unknown host {host:?}: {e}"))?;
    addrs
        .filter_map(|a| match a {
            std::net::SocketAddr::V4(v) => Some(v),
            _ => None,
        })
        .next()
        .ok_or_else(|| format!("unknown host {host:?}: it has no IPv4 address"))
}

/// Pin the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> Result<(), String> {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    if !ids.iter().any(|c| c.id == cpu) {
        return Err(format!(
            "cannot pin to CPU {cpu}: this process may use CPUs {:?}",
            ids.iter().map(|c| c.id).collect::<Vec<_>>()
        ));
    }
    if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        return Err(format!("cannot pin to CPU {cpu}: sched_setaffinity failed"));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Waiting,
    Answered,
    Expired,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    seq: u64,
    tx_ns: u64,
    valid: bool,
    st: St,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    /// Valid-period messages that asked for a reply.
    asked: u64,
    total_sent: u64,
    total_received: u64,
    sent: u64,
    received: u64,
    dropped: u64,
    duplicated: u64,
    out_of_order: u64,
}

/// State of one timed run.
struct Run<'a> {
    cfg: &'a ClientConfig,
    t0: Instant,
    valid_from: Instant,
    c: Counts,
    rec: LatencyRecorder,
    /// ring → application per reply (`--rx-stamps`).
    ring: LatencyRecorder,
    log: Option<Vec<(u64, u64, u64)>>,
    /// Replies we asked for, in send order, `step` sequence numbers apart.
    q: VecDeque<Pending>,
    step: u64,
    /// Entries before this index are past their reply timeout already.
    checked: usize,
    max_rseq: Option<u64>,
    /// Entries still waiting for their reply.
    n_waiting: usize,
    /// Thread CPU time when the valid period began.
    cpu_at_valid: Option<f64>,
}

impl<'a> Run<'a> {
    /// Note the thread's CPU time once, when the valid period starts.
    fn mark_cpu(&mut self, valid: bool) {
        if valid && self.cpu_at_valid.is_none() {
            self.cpu_at_valid = Some(thread_cpu_s());
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.duration_since(self.t0).as_nanos() as u64
    }

    /// Send request `seq` (asking for a reply when `pong`) and count it:
    /// the send time is read just before the send call, and a request sent
    /// in the valid period counts as sent (and as asked, with `pong`).
    #[inline]
    fn send_request(
        &mut self,
        tr: &mut dyn Transport,
        msg: &mut [u8],
        seq: u64,
        pong: bool,
    ) -> Result<Instant, String> {
        let flags = if pong { FLAG_PONG_REQUEST } else { 0 };
        SockperfHeader::new_unchecked(&mut msg[..]).fill_request(seq, flags);
        let tx = Instant::now();
        tr.send_msg(msg)
            .map_err(|e| io_error(self.cfg, "send to", e))?;
        let valid = tx >= self.valid_from;
        self.mark_cpu(valid);
        if pong {
            let tx_ns = self.ns(tx);
            self.push(seq, tx_ns, valid);
            if valid {
                self.c.asked += 1;
            }
        }
        self.c.total_sent += 1;
        if valid {
            self.c.sent += 1;
        }
        Ok(tx)
    }

    fn push(&mut self, seq: u64, tx_ns: u64, valid: bool) {
        self.q.push_back(Pending {
            seq,
            tx_ns,
            valid,
            st: St::Waiting,
        });
        self.n_waiting += 1;
    }

    fn find(&mut self, seq: u64) -> Option<usize> {
        let f = self.q.front()?.seq;
        if seq < f || !(seq - f).is_multiple_of(self.step) {
            return None;
        }
        let i = ((seq - f) / self.step) as usize;
        (i < self.q.len() && self.q[i].seq == seq).then_some(i)
    }

    /// Mark replies older than the timeout as dropped; forget old entries.
    fn expire(&mut self, now_ns: u64) {
        let to = self.cfg.reply_timeout.as_nanos() as u64;
        while self.checked < self.q.len() {
            let p = &mut self.q[self.checked];
            if p.tx_ns + to > now_ns {
                break;
            }
            if p.st == St::Waiting {
                p.st = St::Expired;
                self.n_waiting -= 1;
                if p.valid {
                    self.c.dropped += 1;
                }
            }
            self.checked += 1;
        }
        while let Some(p) = self.q.front() {
            if self.checked > 0 && p.tx_ns + 4 * to <= now_ns {
                self.q.pop_front();
                self.checked -= 1;
            } else {
                break;
            }
        }
    }

    fn waiting(&self) -> bool {
        self.n_waiting > 0
    }

    /// Account one received message; returns its sequence number when it was
    /// a reply to us.
    fn on_reply(&mut self, msg: &[u8], rx: Instant) -> Option<u64> {
        let h = SockperfHeader::new_checked(msg).ok()?;
        if h.is_client() {
            return None; // not a server reply
        }
        let rseq = h.seq();
        let rx_ns = self.ns(rx);
        let Some(i) = self.find(rseq) else {
            // Older than anything we remember, or never asked for.
            if self.q.front().is_some_and(|p| rseq < p.seq) {
                self.c.out_of_order += 1;
            }
            return Some(rseq);
        };
        let p = self.q[i];
        match p.st {
            St::Answered => {
                if p.valid {
                    self.c.duplicated += 1;
                }
                return Some(rseq);
            }
            St::Expired => {
                if p.valid {
                    self.c.dropped -= 1;
                    self.c.out_of_order += 1;
                }
            }
            St::Waiting => {
                self.n_waiting -= 1;
                if p.valid && self.max_rseq.is_some_and(|m| rseq < m) {
                    self.c.out_of_order += 1;
                }
            }
        }
        self.q[i].st = St::Answered;
        self.max_rseq = Some(self.max_rseq.map_or(rseq, |m| m.max(rseq)));
        self.c.total_received += 1;
        if p.valid {
            self.c.received += 1;
            let rtt = rx_ns.saturating_sub(p.tx_ns);
            self.rec.record(rtt / 2);
            if let Some(l) = self.log.as_mut() {
                l.push((rseq, p.tx_ns, rx_ns));
            }
        }
        Some(rseq)
    }
}

fn no_reply(server: SocketAddrV4, why: &str) -> String {
    format!(
        "no reply from {server} ({why}): is `nanowire bench server` or `sockperf sr` running there, with the same protocol?"
    )
}

fn io_error(cfg: &ClientConfig, what: &str, e: io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => no_reply(cfg.server, "connection refused"),
        _ => format!("{what} {}: {e}", cfg.server),
    }
}

fn open_transport(cfg: &ClientConfig) -> Result<(Box<dyn Transport>, SocketAddrV4), String> {
    let opts = &cfg.engine;
    match cfg.protocol {
        Protocol::Udp => {
            // Ask the kernel which source address reaches the server, so an
            // engine bound to an interface (xdp) gets a concrete address.
            let probe = UdpSocket::bind("0.0.0.0:0").map_err(|e| format!("udp socket: {e}"))?;
            probe
                .connect(cfg.server)
                .map_err(|e| format!("cannot reach {}: {e}", cfg.server))?;
            let local_ip = match probe.local_addr() {
                Ok(std::net::SocketAddr::V4(a)) => *a.ip(),
                _ => Ipv4Addr::UNSPECIFIED,
            };
            drop(probe);
            let mut ep = nanowire_stack::open_udp(SocketAddrV4::new(local_ip, 0), opts)
                .map_err(|e| format!("cannot open a {} UDP socket: {e}", cfg.engine.kind))?;
            ep.connect(cfg.server)
                .map_err(|e| format!("cannot reach {}: {e}", cfg.server))?;
            if cfg.rx_stamps {
                ep.set_rx_stamping(true);
            }
            let local = ep
                .local_addr()
                .map_err(|e| format!("udp local address: {e}"))?;
            let block = matches!(opts.wait, WaitPolicy::Block);
            Ok((
                Box::new(UdpTransport {
                    ep,
                    peer: cfg.server,
                    block,
                }),
                local,
            ))
        }
        Protocol::Tcp if cfg.engine.kind == EngineKind::Xdp => {
            let s = match nanowire_stack::xdp::XdpTcpStream::connect(
                cfg.server,
                opts,
                cfg.probe_timeout,
            ) {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    return Err(format!(
                        "connection refused by {}: is `nanowire bench server --tcp` or `sockperf sr --tcp` running there?",
                        cfg.server
                    ));
                }
                Err(e) if cfg.engine.fallback && e.kind() != io::ErrorKind::TimedOut => {
                    // As for UDP: say why, then run on the spin engine.
                    eprintln!(
                        "nanowire: xdp TCP unavailable to {}: {e}; falling back to the spin engine",
                        cfg.server
                    );
                    let mut c = cfg.clone();
                    c.engine.kind = EngineKind::Spin;
                    return open_transport(&c);
                }
                Err(e) => {
                    return Err(format!(
                        "cannot connect to {} over the xdp engine: {e}",
                        cfg.server
                    ));
                }
            };
            s.set_nodelay(true).map_err(|e| format!("tcp setup: {e}"))?;
            let local = s
                .local_addr()
                .map_err(|e| format!("tcp local address: {e}"))?;
            let t = TcpTransport::with_stream(s, opts.wait, EngineKind::Xdp);
            Ok((Box::new(t), local))
        }
        Protocol::Tcp => {
            let s = nanowire_stack::kernel::tcp_connect(cfg.server, opts, cfg.probe_timeout)
                .map_err(|e| match e.kind() {
                    io::ErrorKind::ConnectionRefused => format!(
                        "connection refused by {}: is `nanowire bench server --tcp` or `sockperf sr --tcp` running there?",
                        cfg.server
                    ),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
                        "cannot connect to {}: timed out after {:?}",
                        cfg.server, cfg.probe_timeout
                    ),
                    _ => format!("cannot connect to {}: {e}", cfg.server),
                })?;
            let local = match s.local_addr() {
                Ok(std::net::SocketAddr::V4(a)) => a,
                _ => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            };
            let t = TcpTransport::new(s, opts.wait, cfg.engine.kind)
                .map_err(|e| format!("tcp setup: {e}"))?;
            Ok((Box::new(t), local))
        }
    }
}

/// Run one client benchmark to completion.
pub fn run_client(cfg: &ClientConfig) -> Result<BenchResult, String> {
    cfg.validate()?;
    if let Some(c) = cfg.cpu {
        pin_to_cpu(c)?;
    }
    // Fail on an unwritable log before measuring anything.
    let mut log_file = match &cfg.full_log {
        Some(p) => Some(io::BufWriter::new(
            nanowire_outfile::create(p, nanowire_outfile::PRIVATE)
                .map_err(|e| format!("cannot write the full log: {e}"))?,
        )),
        None => None,
    };
    let (mut tr, local) = open_transport(cfg)?;
    let size = cfg.msg_size;
    let mut msg = vec![0u8; size];
    let mut rbuf = vec![0u8; size.max(MAX_UDP_MSG + 1)];
    let mut seq: u64 = 0;

    // Warm-up messages: the server answers none of them.
    for _ in 0..WARMUP_MSGS {
        SockperfHeader::new_unchecked(&mut msg[..]).fill_request(seq, FLAG_WARMUP);
        tr.send_msg(&msg).map_err(|e| io_error(cfg, "send to", e))?;
        seq += 1;
    }
    // Probe: one answered message proves the server is there.
    let mut answered = false;
    for _ in 0..PROBE_TRIES {
        SockperfHeader::new_unchecked(&mut msg[..]).fill_request(seq, FLAG_PONG_REQUEST);
        tr.send_msg(&msg).map_err(|e| io_error(cfg, "send to", e))?;
        let probe_seq = seq;
        seq += 1;
        let dl = Instant::now() + cfg.probe_timeout;
        while let Some(n) = tr
            .recv_msg(&mut rbuf, Some(dl))
            .map_err(|e| io_error(cfg, "receive from", e))?
        {
            let h = SockperfHeader::new_checked(&rbuf[..n]);
            if h.is_ok_and(|h| !h.is_client() && h.seq() == probe_seq) {
                answered = true;
                break;
            }
        }
        if answered {
            break;
        }
    }
    if !answered {
        return Err(no_reply(
            cfg.server,
            &format!(
                "{} probes unanswered within {:?} each",
                PROBE_TRIES, cfg.probe_timeout
            ),
        ));
    }

    let t0 = Instant::now();
    let warmup = cfg.warmup.min(cfg.duration / 2);
    let step = match cfg.mode {
        Mode::UnderLoad => cfg.reply_every,
        _ => 1,
    };
    let mut run = Run {
        cfg,
        t0,
        valid_from: t0 + warmup,
        c: Counts::default(),
        rec: LatencyRecorder::new(),
        ring: LatencyRecorder::new(),
        log: cfg.full_log.as_ref().map(|_| Vec::new()),
        q: VecDeque::new(),
        step,
        checked: 0,
        max_rseq: None,
        n_waiting: 0,
        cpu_at_valid: None,
    };
    let end = t0 + cfg.duration;
    let t_end = match cfg.mode {
        Mode::PingPong | Mode::UnderLoad => {
            let io = Io {
                tr: tr.as_mut(),
                msg: &mut msg,
                rbuf: &mut rbuf,
            };
            let f = if cfg.mode == Mode::PingPong {
                run_pp
            } else {
                run_ul
            };
            f(&mut run, io, seq, end)?
        }
        Mode::Throughput => run_tp(&mut run, tr.as_mut(), size, seq, end)?,
    };
    let cpu_thread_s = run.cpu_at_valid.map_or(0.0, |c| thread_cpu_s() - c);

    if let (Some(f), Some(log)) = (log_file.as_mut(), run.log.as_ref()) {
        let w = |f: &mut io::BufWriter<std::fs::File>| -> io::Result<()> {
            writeln!(f, "seq,tx_ns,rx_ns,rtt_ns")?;
            for (s, tx, rx) in log {
                writeln!(f, "{s},{tx},{rx},{}", rx - tx)?;
            }
            f.flush()
        };
        w(f).map_err(|e| format!("cannot write full log: {e}"))?;
    }

    let valid = t_end
        .saturating_duration_since(run.valid_from)
        .as_secs_f64();
    let c = run.c;
    let rate_base = match cfg.mode {
        Mode::PingPong => c.received,
        _ => c.sent,
    };
    let rate = if valid > 0.0 {
        rate_base as f64 / valid
    } else {
        0.0
    };
    Ok(BenchResult {
        tool: "nanowire bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        mode: cfg.mode.as_str().into(),
        engine: tr.engine().as_str().into(),
        engine_requested: cfg.engine.kind.as_str().into(),
        fallback_reason: tr.fallback_reason(),
        protocol: cfg.protocol.as_str().into(),
        msg_size: size,
        peer: cfg.server.to_string(),
        local_addr: local.to_string(),
        sent: c.sent,
        received: c.received,
        dropped: c.dropped,
        duplicated: c.duplicated,
        out_of_order: c.out_of_order,
        duration_s: valid,
        total_duration_s: t_end.duration_since(t0).as_secs_f64(),
        total_sent: c.total_sent,
        total_received: c.total_received,
        warmup_s: warmup.as_secs_f64(),
        latency_us: run.rec.summary(),
        ring_to_app_us: if cfg.rx_stamps {
            run.ring.summary()
        } else {
            None
        },
        rate_msg_s: rate,
        bandwidth_mbps: if valid > 0.0 {
            c.sent as f64 * size as f64 * 8.0 / valid / 1e6
        } else {
            0.0
        },
        mps_target: match (cfg.mode, cfg.mps) {
            (Mode::PingPong, _) | (_, Rate::Max) => None,
            (_, Rate::PerSec(n)) => Some(n),
        },
        reply_every: (cfg.mode == Mode::UnderLoad).then_some(cfg.reply_every),
        cpu: cfg.cpu,
        cpu_thread_s,
        cpu_util: if valid > 0.0 {
            cpu_thread_s / valid
        } else {
            0.0
        },
        accounting: match cfg.mode {
            Mode::Throughput => Accounting::not_applicable(
                "tp asks for no replies: the receiver accounts (server or sink --strict)",
            ),
            _ => Accounting::replies(c.asked, c.received, c.dropped),
        },
        env: Env::detect(Some(*local.ip())),
        note: (cfg.mode == Mode::Throughput).then(|| {
            "tp asks for no replies: received/dropped are counted by the server (sequence gaps)"
                .to_string()
        }),
    })
}

/// `CLOCK_REALTIME` in ns (the clock of the engine's receive stamps).
fn realtime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    (t.tv_sec as u64).wrapping_mul(1_000_000_000) + t.tv_nsec as u64
}

/// A latency loop's transport and buffers: the request it sends and the
/// reply it reads into.
struct Io<'a> {
    tr: &'a mut dyn Transport,
    msg: &'a mut [u8],
    rbuf: &'a mut [u8],
}

fn run_pp(run: &mut Run<'_>, io: Io<'_>, mut seq: u64, end: Instant) -> Result<Instant, String> {
    let (cfg, Io { tr, msg, rbuf }) = (run.cfg, io);
    loop {
        let now = Instant::now();
        if now >= end {
            return Ok(now);
        }
        let tx = run.send_request(tr, msg, seq, true)?;
        let dl = tx + cfg.reply_timeout;
        while let Some(n) = tr
            .recv_msg(rbuf, Some(dl))
            .map_err(|e| io_error(cfg, "receive from", e))?
        {
            let rx = Instant::now();
            if cfg.rx_stamps && rx >= run.valid_from {
                // The engine's stamp (frame off the RX ring) to now: both
                // CLOCK_REALTIME; one clock read more per reply.
                let st = tr.last_rx_stamp();
                if st != 0 {
                    run.ring.record(realtime_ns().saturating_sub(st));
                }
            }
            if run.on_reply(&rbuf[..n], rx) == Some(seq) {
                break;
            }
        }
        let n = run.ns(Instant::now());
        run.expire(n);
        seq += 1;
    }
}

fn run_ul(run: &mut Run<'_>, io: Io<'_>, mut seq: u64, end: Instant) -> Result<Instant, String> {
    let (cfg, Io { tr, msg, rbuf }) = (run.cfg, io);
    let first = seq;
    let interval = match cfg.mps {
        Rate::Max => Duration::ZERO,
        Rate::PerSec(n) => Duration::from_nanos(1_000_000_000 / n.max(1)),
    };
    let mut next_send = Instant::now();
    let t_end;
    loop {
        let now = Instant::now();
        if now >= end {
            t_end = now;
            break;
        }
        if now >= next_send {
            let pong = (seq - first).is_multiple_of(cfg.reply_every);
            run.send_request(tr, msg, seq, pong)?;
            seq += 1;
            next_send += interval;
            if now > next_send + Duration::from_millis(10) {
                // Too far behind: give up the debt instead of bursting.
                next_send = now;
            }
            if interval.is_zero() || run.waiting() {
                // A reply is due (or max rate): take what is there, never wait,
                // so a catch-up burst does not delay reading it.
                while let Some(n) = tr
                    .try_recv_msg(rbuf)
                    .map_err(|e| io_error(cfg, "receive from", e))?
                {
                    run.on_reply(&rbuf[..n], Instant::now());
                }
            }
            continue;
        }
        // Until the next send: collect replies. The kernel engine sleeps (the
        // sleep ends early enough for timer slack); spin polls.
        let gap = next_send - now;
        let got = if tr.blocks() && gap > Duration::from_micros(200) {
            tr.recv_msg(rbuf, Some(next_send - Duration::from_micros(100)))
        } else {
            tr.try_recv_msg(rbuf)
        }
        .map_err(|e| io_error(cfg, "receive from", e))?;
        if let Some(n) = got {
            run.on_reply(&rbuf[..n], Instant::now());
        }
        let n = run.ns(Instant::now());
        run.expire(n);
    }
    // Collect the replies still in flight.
    let dl = t_end + cfg.reply_timeout;
    while run.waiting() {
        match tr
            .recv_msg(rbuf, Some(dl))
            .map_err(|e| io_error(cfg, "receive from", e))?
        {
            Some(n) => {
                run.on_reply(&rbuf[..n], Instant::now());
            }
            None => break,
        }
    }
    let n = run.ns(dl.max(Instant::now()));
    run.expire(n);
    Ok(t_end)
}

fn run_tp(
    run: &mut Run<'_>,
    tr: &mut dyn Transport,
    size: usize,
    mut seq: u64,
    end: Instant,
) -> Result<Instant, String> {
    let cfg = run.cfg;
    let mut bufs: Vec<Vec<u8>> = (0..TP_BATCH).map(|_| vec![0u8; size]).collect();
    let interval = match cfg.mps {
        Rate::Max => None,
        Rate::PerSec(n) => Some(Duration::from_nanos(1_000_000_000 / n.max(1))),
    };
    let mut next_send = Instant::now();
    loop {
        let now = Instant::now();
        if now >= end {
            return Ok(now);
        }
        let due = match interval {
            None => TP_BATCH,
            Some(iv) => {
                if now < next_send {
                    std::hint::spin_loop();
                    continue;
                }
                let behind = (now - next_send).as_nanos() / iv.as_nanos().max(1);
                (behind as usize + 1).min(TP_BATCH)
            }
        };
        for (i, b) in bufs.iter_mut().take(due).enumerate() {
            SockperfHeader::new_unchecked(&mut b[..]).fill_request(seq + i as u64, 0);
        }
        let refs: Vec<&[u8]> = bufs[..due].iter().map(|b| b.as_slice()).collect();
        let tx = Instant::now();
        let n = if due == 1 {
            tr.send_msg(refs[0]).map(|_| 1)
        } else {
            tr.send_batch(&refs)
        }
        .map_err(|e| io_error(cfg, "send to", e))? as u64;
        seq += n;
        run.c.total_sent += n;
        if tx >= run.valid_from {
            run.mark_cpu(true);
            run.c.sent += n;
        }
        if let Some(iv) = interval {
            next_send += iv * n as u32;
            if now > next_send + Duration::from_millis(10) {
                next_send = now;
            }
        }
    }
}
