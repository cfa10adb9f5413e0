//! The server side, answering like `sockperf sr`: a message with the client
//! and pong-request flags is sent back with the client flag cleared, to its
//! sender (UDP) or on its connection (TCP); warm-up messages and messages
//! without the client flag are counted and otherwise ignored. Every client
//! (source address, or TCP connection) gets its own sequence tracker, so
//! drops, duplicates and reordering are counted per client.

use crate::client::{Protocol, pin_to_cpu};
use crate::env::Env;
use crate::result::thread_cpu_s;
use crate::seq::SeqTracker;
use crate::transport::{Frame, MAX_TCP_MSG, StreamBuf, TcpIo, busy};
use nanowire_stack::{EngineKind, EngineOptions, TcpAcceptor, UdpEndpoint, WaitPolicy};
use nanowire_wire::sockperf::{ServerAction, SockperfHeader, server_action};
use rustix::event::{PollFd, PollFlags, Timespec};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a waiting server looks at its stop flag and publishes counters.
const TICK: Duration = Duration::from_millis(100);
/// Stop reading a TCP connection whose unsent replies exceed this.
const MAX_PENDING_WRITE: usize = 4 << 20;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub bind: SocketAddrV4,
    pub protocol: Protocol,
    pub engine: EngineOptions,
    pub cpu: Option<usize>,
}

impl ServerConfig {
    pub fn new(bind: SocketAddrV4) -> ServerConfig {
        ServerConfig {
            bind,
            protocol: Protocol::Udp,
            engine: EngineOptions::new(EngineKind::Kernel),
            cpu: None,
        }
    }
}

/// Counters of one client (UDP source address or TCP connection).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClientStats {
    pub peer: String,
    pub received: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    pub replied: u64,
    pub bytes: u64,
    /// Seconds since server start of the first and last counted message.
    pub first_s: f64,
    pub last_s: f64,
    /// Counted messages per second between first and last.
    pub rate_msg_s: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerStats {
    pub tool: &'static str,
    pub mode: &'static str,
    /// The engine that actually serves (after any fallback).
    pub engine: String,
    pub engine_requested: String,
    pub fallback_reason: Option<String>,
    pub protocol: String,
    pub listen: String,
    pub duration_s: f64,
    /// Client messages counted (warm-up and ignored excluded), all clients.
    pub received: u64,
    pub replied: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Messages flagged warm-up (not answered).
    pub warmup: u64,
    /// Messages without the client flag (not answered).
    pub ignored: u64,
    /// Shorter than the header or with an impossible length field.
    pub malformed: u64,
    /// Replies the socket refused.
    pub reply_errors: u64,
    /// TCP connections accepted / closed by the peer.
    pub connections: u64,
    pub disconnects: u64,
    /// Datagrams the kernel dropped on the server socket (receive buffer full).
    pub socket_drops: u64,
    /// CPU time of the serving thread since it started serving, in seconds.
    pub cpu_thread_s: f64,
    pub clients: Vec<ClientStats>,
    pub env: Env,
}

impl ServerStats {
    pub fn human(&self) -> String {
        let mut s = String::new();
        let p = "nanowire:";
        let _ = writeln!(
            s,
            "{p} [SERVER] summary: engine={} protocol={} listen={} run={:.3} sec",
            self.engine, self.protocol, self.listen, self.duration_s
        );
        let _ = writeln!(
            s,
            "{p} ReceivedMessages={}; RepliedMessages={}; warm-up={}; ignored={}; malformed={}; reply errors={}; socket drops={}",
            self.received,
            self.replied,
            self.warmup,
            self.ignored,
            self.malformed,
            self.reply_errors,
            self.socket_drops
        );
        let _ = writeln!(
            s,
            "{p} # dropped messages = {}; # duplicated messages = {}; # out-of-order messages = {}",
            self.dropped, self.duplicated, self.out_of_order
        );
        for (i, c) in self.clients.iter().enumerate() {
            let _ = writeln!(
                s,
                "{p} [{i:2}] {} received={} dropped={} duplicated={} out-of-order={} replied={} rate={:.0} msg/sec",
                c.peer,
                c.received,
                c.dropped,
                c.duplicated,
                c.out_of_order,
                c.replied,
                c.rate_msg_s
            );
        }
        s
    }
}

struct Client {
    peer: String,
    seq: SeqTracker,
    replied: u64,
    bytes: u64,
    first: Option<Instant>,
    last: Instant,
}

struct State {
    t0: Instant,
    base: ServerStats,
    clients: Vec<Client>,
    by_addr: HashMap<SocketAddrV4, usize>,
    last_pub: Instant,
    cpu0: f64,
}

impl State {
    fn new(
        cfg: &ServerConfig,
        engine: EngineKind,
        fallback_reason: Option<String>,
        listen: SocketAddrV4,
    ) -> State {
        let now = Instant::now();
        State {
            t0: now,
            base: ServerStats {
                tool: "nanowire bench",
                mode: "server",
                engine: engine.as_str().into(),
                engine_requested: cfg.engine.kind.as_str().into(),
                fallback_reason,
                protocol: cfg.protocol.as_str().into(),
                listen: listen.to_string(),
                env: Env::detect(Some(*listen.ip())),
                ..ServerStats::default()
            },
            clients: Vec::new(),
            by_addr: HashMap::new(),
            last_pub: now,
            cpu0: thread_cpu_s(),
        }
    }

    fn new_client(&mut self, peer: String) -> usize {
        self.clients.push(Client {
            peer,
            seq: SeqTracker::new(),
            replied: 0,
            bytes: 0,
            first: None,
            last: self.t0,
        });
        self.clients.len() - 1
    }

    fn udp_client(&mut self, a: SocketAddrV4) -> usize {
        if let Some(&i) = self.by_addr.get(&a) {
            return i;
        }
        let i = self.new_client(a.to_string());
        self.by_addr.insert(a, i);
        i
    }

    /// Account a counted message of client `ci`.
    fn count(&mut self, ci: usize, seq: u64, len: usize, replied: bool, now: Instant) {
        let c = &mut self.clients[ci];
        c.seq.observe(seq);
        c.bytes += len as u64;
        c.first.get_or_insert(now);
        c.last = now;
        if replied {
            c.replied += 1;
        }
    }

    fn snapshot(&self, socket_drops: u64) -> ServerStats {
        let mut s = self.base.clone();
        s.duration_s = self.t0.elapsed().as_secs_f64();
        s.socket_drops = socket_drops;
        s.cpu_thread_s = thread_cpu_s() - self.cpu0;
        for c in &self.clients {
            let k = c.seq.counts;
            s.received += k.received;
            s.dropped += k.dropped;
            s.duplicated += k.duplicated;
            s.out_of_order += k.out_of_order;
            s.replied += c.replied;
            let first = c.first.map_or(0.0, |f| (f - self.t0).as_secs_f64());
            let last = (c.last - self.t0).as_secs_f64();
            s.clients.push(ClientStats {
                peer: c.peer.clone(),
                received: k.received,
                dropped: k.dropped,
                duplicated: k.duplicated,
                out_of_order: k.out_of_order,
                replied: c.replied,
                bytes: c.bytes,
                first_s: first,
                last_s: last,
                rate_msg_s: if last > first {
                    (k.received.saturating_sub(1)) as f64 / (last - first)
                } else {
                    0.0
                },
            });
        }
        s
    }
}

enum Sock {
    Udp(Box<dyn UdpEndpoint>),
    Tcp(TcpListener, nanowire_stack::EngineOptions),
    XdpTcp(nanowire_stack::xdp::XdpTcpListener),
}

/// A bound server, not yet serving.
pub struct BoundServer {
    cfg: ServerConfig,
    sock: Sock,
    local: SocketAddrV4,
    /// Why the xdp TCP server fell back to spin.
    fallback: Option<String>,
}

/// Bind the server's socket (errors such as "address in use" come out here).
pub fn bind_server(cfg: &ServerConfig) -> Result<BoundServer, String> {
    let opts = &cfg.engine;
    let (sock, local) = match cfg.protocol {
        Protocol::Udp => {
            let ep = nanowire_stack::open_udp(cfg.bind, opts).map_err(|e| {
                if e.kind() == io::ErrorKind::AddrInUse {
                    format!("cannot bind UDP {}: address already in use", cfg.bind)
                } else {
                    format!(
                        "cannot open a {} UDP server on {}: {e}",
                        cfg.engine.kind, cfg.bind
                    )
                }
            })?;
            let local = ep.local_addr().map_err(|e| format!("local address: {e}"))?;
            (Sock::Udp(ep), local)
        }
        Protocol::Tcp if cfg.engine.kind == EngineKind::Xdp => {
            match nanowire_stack::xdp::XdpTcpListener::bind(cfg.bind, 128, opts) {
                Ok(l) => {
                    let local = l.local_addr();
                    (Sock::XdpTcp(l), local)
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    return Err(format!(
                        "cannot listen on TCP {}: address already in use",
                        cfg.bind
                    ));
                }
                Err(e) if cfg.engine.fallback => {
                    // As for UDP: say why, then serve with the spin engine.
                    let why = format!("xdp TCP unavailable on {}: {e}", cfg.bind);
                    eprintln!("nanowire: {why}; falling back to the spin engine");
                    let mut c = cfg.clone();
                    c.engine.kind = EngineKind::Spin;
                    let mut b = bind_server(&c)?;
                    b.fallback = Some(why);
                    return Ok(b);
                }
                Err(e) => {
                    return Err(format!(
                        "cannot open an xdp TCP server on {}: {e}",
                        cfg.bind
                    ));
                }
            }
        }
        Protocol::Tcp => {
            let l = nanowire_stack::kernel::tcp_listen(cfg.bind, opts).map_err(|e| {
                if e.kind() == io::ErrorKind::AddrInUse {
                    format!("cannot listen on TCP {}: address already in use", cfg.bind)
                } else {
                    e.to_string()
                }
            })?;
            let local = match l.local_addr() {
                Ok(std::net::SocketAddr::V4(a)) => a,
                _ => cfg.bind,
            };
            (Sock::Tcp(l, opts.clone()), local)
        }
    };
    Ok(BoundServer {
        cfg: cfg.clone(),
        sock,
        local,
        fallback: None,
    })
}

impl BoundServer {
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    pub fn engine(&self) -> EngineKind {
        match &self.sock {
            Sock::Udp(ep) => ep.engine(),
            Sock::Tcp(..) | Sock::XdpTcp(..) => self.cfg.engine.kind,
        }
    }

    /// Why the requested engine is not the one serving, if it fell back.
    pub fn fallback_reason(&self) -> Option<String> {
        match &self.sock {
            Sock::Udp(ep) => ep.fallback_reason().map(str::to_string),
            Sock::Tcp(..) | Sock::XdpTcp(..) => self.fallback.clone(),
        }
    }

    /// Serve until `stop` is set; `shared` receives a snapshot every 100 ms.
    pub fn serve(
        self,
        stop: &AtomicBool,
        shared: Option<&Mutex<ServerStats>>,
    ) -> Result<ServerStats, String> {
        if let Some(c) = self.cfg.cpu {
            pin_to_cpu(c)?;
        }
        let engine = self.engine();
        let mut st = State::new(&self.cfg, engine, self.fallback_reason(), self.local);
        match self.sock {
            Sock::Udp(mut ep) => serve_udp(ep.as_mut(), &mut st, stop, shared),
            Sock::Tcp(l, opts) => serve_tcp(&l, &opts, &mut st, stop, shared),
            Sock::XdpTcp(l) => serve_tcp_xdp(&l, &mut st, stop, shared),
        }
    }
}

fn publish(
    st: &mut State,
    shared: Option<&Mutex<ServerStats>>,
    now: Instant,
    drops: impl Fn() -> u64,
) {
    if now.saturating_duration_since(st.last_pub) < TICK {
        return;
    }
    st.last_pub = now;
    if let Some(m) = shared {
        let s = st.snapshot(drops());
        if let Ok(mut g) = m.lock() {
            *g = s;
        }
    }
}

fn serve_udp(
    ep: &mut dyn UdpEndpoint,
    st: &mut State,
    stop: &AtomicBool,
    shared: Option<&Mutex<ServerStats>>,
) -> Result<ServerStats, String> {
    let mut buf = vec![0u8; 65536];
    let mut errors_in_row = 0u32;
    // One clock read per message, taken after the reply went out (the
    // reply path is what a ping-pong client measures).
    let mut now = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let dl = now + TICK;
        match ep.recv_from(&mut buf, Some(dl)) {
            Ok(Some((n, from))) => {
                errors_in_row = 0;
                let msg = &mut buf[..n];
                match server_action(msg, n) {
                    Err(_) => {
                        st.base.malformed += 1;
                        now = Instant::now();
                    }
                    Ok(ServerAction::Ignore) => {
                        st.base.ignored += 1;
                        now = Instant::now();
                    }
                    Ok(ServerAction::Warmup) => {
                        st.base.warmup += 1;
                        now = Instant::now();
                    }
                    Ok(ServerAction::Count) => {
                        let seq = SockperfHeader::new_unchecked(&*msg).seq();
                        let ci = st.udp_client(from);
                        now = Instant::now();
                        st.count(ci, seq, n, false, now);
                    }
                    Ok(ServerAction::Reply) => {
                        let mut h = SockperfHeader::new_unchecked(&mut *msg);
                        let seq = h.seq();
                        h.make_reply();
                        let mut ok = false;
                        for _ in 0..1000 {
                            match ep.send_to(msg, from) {
                                Ok(_) => {
                                    ok = true;
                                    break;
                                }
                                Err(e) if busy(&e) => std::hint::spin_loop(),
                                Err(_) => break,
                            }
                        }
                        if !ok {
                            st.base.reply_errors += 1;
                        }
                        now = Instant::now();
                        let ci = st.udp_client(from);
                        st.count(ci, seq, n, ok, now);
                    }
                }
            }
            Ok(None) => now = Instant::now(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => now = Instant::now(),
            Err(e) => {
                now = Instant::now();
                // Transient errors (e.g. a queued ICMP error) must not kill the
                // server; a persistent one must not spin forever.
                errors_in_row += 1;
                if errors_in_row > 1000 {
                    return Err(format!("receive failed: {e}"));
                }
            }
        }
        publish(st, shared, now, || ep.stats().rx_drop_queue_full);
    }
    let s = st.snapshot(ep.stats().rx_drop_queue_full);
    if let Some(mut g) = shared.and_then(|m| m.lock().ok()) {
        *g = s.clone();
    }
    Ok(s)
}

struct Conn<S: TcpIo = TcpStream> {
    s: S,
    client: usize,
    rbuf: StreamBuf,
    wbuf: StreamBuf,
    closed: bool,
}

impl<S: TcpIo> Conn<S> {
    fn new(s: S, client: usize) -> Conn<S> {
        Conn {
            s,
            client,
            rbuf: StreamBuf::with_capacity(128 * 1024),
            wbuf: StreamBuf::with_capacity(128 * 1024),
            closed: false,
        }
    }
}

/// Service every connection once; those that closed are dropped (and
/// counted). True when any made progress.
fn service_all<S: TcpIo>(conns: &mut Vec<Conn<S>>, st: &mut State) -> bool {
    let mut progress = false;
    for c in conns.iter_mut() {
        progress |= service_conn(c, st);
    }
    let before = conns.len();
    conns.retain(|c| !c.closed);
    st.base.disconnects += (before - conns.len()) as u64;
    progress
}

fn service_conn<S: TcpIo>(c: &mut Conn<S>, st: &mut State) -> bool {
    let mut progress = false;
    // Flush pending replies first.
    while c.wbuf.len() > 0 {
        match c.s.write(c.wbuf.data()) {
            Ok(0) => {
                c.closed = true;
                return true;
            }
            Ok(n) => {
                c.wbuf.consume(n);
                progress = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                c.closed = true;
                return true;
            }
        }
    }
    if c.wbuf.len() > MAX_PENDING_WRITE {
        return progress;
    }
    match c.rbuf.fill_from(&mut c.s) {
        Ok(Some(0)) | Err(_) => {
            c.closed = true;
            return true;
        }
        Ok(Some(_)) => progress = true,
        Ok(None) => return progress,
    }
    let now = Instant::now();
    loop {
        match c.rbuf.frame(MAX_TCP_MSG) {
            Frame::Incomplete => break,
            Frame::Bad(_) => {
                // The stream cannot be re-synchronised: close it.
                st.base.malformed += 1;
                c.closed = true;
                return true;
            }
            Frame::Ready(len) => {
                let msg = &mut c.rbuf.data_mut()[..len];
                match server_action(msg, len) {
                    Err(_) => st.base.malformed += 1,
                    Ok(ServerAction::Ignore) => st.base.ignored += 1,
                    Ok(ServerAction::Warmup) => st.base.warmup += 1,
                    Ok(a) => {
                        let mut h = SockperfHeader::new_unchecked(&mut *msg);
                        let seq = h.seq();
                        let reply = a == ServerAction::Reply;
                        if reply {
                            h.make_reply();
                            c.wbuf.reserve(len);
                            let e = c.wbuf.end;
                            c.wbuf.buf[e..e + len].copy_from_slice(msg);
                            c.wbuf.end += len;
                        }
                        st.count(c.client, seq, len, reply, now);
                    }
                }
                c.rbuf.consume(len);
            }
        }
    }
    // Send the replies right away.
    while c.wbuf.len() > 0 {
        match c.s.write(c.wbuf.data()) {
            Ok(0) => {
                c.closed = true;
                break;
            }
            Ok(n) => c.wbuf.consume(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => {
                c.closed = true;
                break;
            }
        }
    }
    progress
}

/// The TCP server on a kernel listener: each connection set up per the
/// engine's options; a blocking server sleeps in poll(2) on the listener
/// and its connections when nothing moved, a spinning one spins.
fn serve_tcp(
    l: &TcpListener,
    opts: &nanowire_stack::EngineOptions,
    st: &mut State,
    stop: &AtomicBool,
    shared: Option<&Mutex<ServerStats>>,
) -> Result<ServerStats, String> {
    let block = matches!(opts.wait, WaitPolicy::Block);
    let mut conn_opts = opts.clone();
    conn_opts.wait = WaitPolicy::Spin; // connections are non-blocking; we poll
    let setup = |s: &TcpStream| nanowire_stack::kernel::tcp_setup(s, &conn_opts);
    let idle = |l: &TcpListener, conns: &[Conn]| {
        if !block {
            std::hint::spin_loop();
            return Ok(());
        }
        let mut fds = Vec::with_capacity(conns.len() + 1);
        fds.push(PollFd::new(l, PollFlags::IN));
        for c in conns {
            let mut f = PollFlags::IN;
            if c.wbuf.len() > 0 {
                f |= PollFlags::OUT;
            }
            fds.push(PollFd::new(&c.s, f));
        }
        let ts = Timespec {
            tv_sec: 0,
            tv_nsec: TICK.as_nanos() as _,
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(format!("poll failed: {e}")),
        }
    };
    serve_tcp_loop(l, 1, setup, idle, st, stop, shared)
}

/// The TCP server on the xdp engine: one stack for the listener and all its
/// connections; the listener (one more engine turn) is polled every 16th
/// round, or every round while there are no connections.
fn serve_tcp_xdp(
    l: &nanowire_stack::xdp::XdpTcpListener,
    st: &mut State,
    stop: &AtomicBool,
    shared: Option<&Mutex<ServerStats>>,
) -> Result<ServerStats, String> {
    let setup = |s: &nanowire_stack::xdp::XdpTcpStream| {
        let _ = s.set_nodelay(true);
        Ok(())
    };
    let idle = |_: &_, _: &[_]| {
        std::hint::spin_loop();
        Ok(())
    };
    serve_tcp_loop(l, 16, setup, idle, st, stop, shared)
}

/// One TCP server loop for every engine (the stack's `TcpAcceptor` and
/// `TcpEndpoint` contracts): accept what waits (every `accept_every`-th
/// round, or every round while there are no connections), set each new
/// connection up (`setup`; one that fails is dropped), service every
/// connection, and call `idle` when nothing moved.
#[allow(clippy::too_many_arguments)]
fn serve_tcp_loop<L: TcpAcceptor>(
    l: &L,
    accept_every: u32,
    mut setup: impl FnMut(&L::Stream) -> io::Result<()>,
    mut idle: impl FnMut(&L, &[Conn<L::Stream>]) -> Result<(), String>,
    st: &mut State,
    stop: &AtomicBool,
    shared: Option<&Mutex<ServerStats>>,
) -> Result<ServerStats, String> {
    let mut conns: Vec<Conn<L::Stream>> = Vec::new();
    let mut round = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let mut progress = false;
        round = round.wrapping_add(1);
        while conns.is_empty() || round.is_multiple_of(accept_every) {
            let (s, peer) = match l.try_accept() {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break, // e.g. EMFILE: try again next round
            };
            progress = true;
            if setup(&s).is_err() {
                continue;
            }
            st.base.connections += 1;
            let ci = st.new_client(format!("tcp {peer}"));
            conns.push(Conn::new(s, ci));
        }
        progress |= service_all(&mut conns, st);
        if !progress {
            idle(l, &conns)?;
        }
        publish(st, shared, Instant::now(), || 0);
    }
    let s = st.snapshot(0);
    if let Some(mut g) = shared.and_then(|m| m.lock().ok()) {
        *g = s.clone();
    }
    Ok(s)
}

/// Serve in the current thread until `stop` is set (the CLI's way).
pub fn run_server(cfg: &ServerConfig, stop: &AtomicBool) -> Result<ServerStats, String> {
    bind_server(cfg)?.serve(stop, None)
}

/// A server running on its own thread; stopped by [`ServerHandle::stop`] or drop.
pub struct ServerHandle {
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<ServerStats>>,
    thread: Option<JoinHandle<Result<ServerStats, String>>>,
    local: SocketAddrV4,
    engine: EngineKind,
}

/// Bind (in the caller, so bind errors return here) and serve on a new thread.
pub fn start_server(cfg: &ServerConfig) -> Result<ServerHandle, String> {
    let bound = bind_server(cfg)?;
    let local = bound.local_addr();
    let engine = bound.engine();
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Mutex::new(ServerStats::default()));
    let (s2, m2) = (stop.clone(), shared.clone());
    let thread = std::thread::Builder::new()
        .name("nanowire-server".into())
        .spawn(move || bound.serve(&s2, Some(&m2)))
        .map_err(|e| format!("cannot start the server thread: {e}"))?;
    Ok(ServerHandle {
        stop,
        shared,
        thread: Some(thread),
        local,
        engine,
    })
}

impl ServerHandle {
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }
    pub fn engine(&self) -> EngineKind {
        self.engine
    }
    /// Counters as of the last publication (at most ~100 ms old).
    pub fn snapshot(&self) -> ServerStats {
        self.shared.lock().map(|g| g.clone()).unwrap_or_default()
    }
    /// Stop serving and return the final counters.
    pub fn stop(mut self) -> Result<ServerStats, String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| "the server thread panicked".to_string())?,
            None => Ok(self.snapshot()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
