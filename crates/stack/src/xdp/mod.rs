//! The xdp engine: a poll-mode user-space UDP/IPv4 path over AF_XDP.
//!
//! One [`Engine`] per (process, network namespace, interface) owns the
//! steering program, one AF_XDP socket per RX queue, the demux and the
//! neighbour table. [`XdpSocket`]s are handles on it. The parts, each in
//! its own file and behind its own lock:
//!
//! | part | file | lock | job |
//! |---|---|---|---|
//! | registry | `registry.rs` | fork-safe spin lock | one engine per (pid, netns, interface) |
//! | devices | `device/` | (the path's) | the seam: `RxDevice`/`TxDevice` over the AF_XDP rings or in memory; tap, faults, stamps as wrappers |
//! | receive | `rx.rs` | RX lock | budgeted poll of the receive device into the demux |
//! | classify | `classify.rs` | none (pure) | bytes to 5-tuple + payload bounds, or a drop reason |
//! | demux | `demux.rs` | RX lock | 5-tuple to endpoint (connected, specific, wildcard), per-endpoint bounded queues of owned frames |
//! | transmit | `tx.rs` | TX lock | frames lent by the transmit device, headers, batched kicks |
//! | neighbours | `neigh.rs` | neighbour lock + a thread | routes and MACs, asynchronous resolution, kernel change events |
//! | socket API and wait policy | `socket.rs` | none of its own | `XdpSocket`: open/adopt, recv/send, spin/block |
//! | stats | `shm.rs` | single writer per counter | counters in a shared page for `nanowire stats` |
//!
//! The data path (`rx.rs`, `tx.rs`, the TCP driver's halves in `tcp.rs`) is
//! generic over the device, with the engine's types fixed at compile time
//! (`device::EngineRx`, `device::EngineTx`): no dynamic call per frame, and
//! unit tests run it over the loopback device without root. The rest of
//! this file is the control plane: it opens the program, the sockets, the
//! neighbour thread and the stats page, and hands the rings to the path.
//!
//! Lock rules (`order.rs`; docs/architecture.md, "Locks"): four tiers taken
//! in increasing order only (the shared client stack's slot, a TCP stack,
//! the engine service's control lock, the leaves RX/TX/program/neighbour/
//! control queue), never two leaves at once, none held across a user
//! closure, a netlink call, a blocking syscall or a sleep, but the control
//! lock across a request to the service (which no data path takes: a TCP
//! turn's releases wait in the control queue); one documented exception (a
//! TCP hand-over's builder).

pub mod classify;
pub mod config;
pub mod demux;
pub mod device;
pub mod fallback;
pub mod forkpage;
mod neigh;
mod order;
mod ports;
pub mod reasm;
mod registry;
/// How an engine error begins when it repeats a failed open remembered by
/// the registry (said at the default level once, at the first failure).
pub use registry::REMEMBERED as OPEN_REMEMBERED;
pub use registry::forget_failed_opens;
mod rx;
pub mod service;
/// The spinner registry of a process on the engine service (its waits).
pub use nanowire_xdp::seats;
pub use service::client::set_service_lost_hook;
pub mod shm;
mod socket;
pub mod tcp;
#[cfg(test)]
mod testkit;
mod tsc;
mod tx;
mod wake;

pub use demux::{Delivery, EndpointId, EndpointKind};
pub use nanowire_xdp::netlink::tcp_state_name;
/// The steering program `nanowire run` attaches before exec (the shim
/// receives it at load; [`Engine::open`] adopts it).
pub use nanowire_xdp::prestart;
pub use neigh::{NEGATIVE_TTL, QUEUE_BYTES_PER_NEIGH, QUEUE_PER_NEIGH, RESOLVE_TIMEOUT};
pub use order::set_tcp_service_wrapper;
pub use socket::{EngineHold, IdlePeek, OpenError, XdpSocket, udp_packet};
pub use tcp::{
    Armed, COAST_TURNS, Drained, EngineState, FourTuple, Handover, MovedOut, Taker, TcpIdle,
    XdpTcpError, XdpTcpInfo, XdpTcpListener, XdpTcpState, XdpTcpStream, ip_header_of, tcp_drain,
    tcp_ready, tcp_service_lost,
};
pub use tx::IpHeader;

/// What a user of the engine needs of the host around it, so that callers
/// (the preload shim) reach AF_XDP only through this crate: the privilege
/// probe, the route and interface an address leaves by, and a send whose
/// transmit stamps carry a caller-chosen key (`SO_TIMESTAMPING` with
/// `OPT_ID` on the kernel path of an accelerated socket).
pub mod host {
    pub use nanowire_xdp::iface::iface_for_addr;
    pub use nanowire_xdp::netlink::{Route, route_get};
    pub use nanowire_xdp::privilege::check as privilege_check;
    pub use nanowire_xdp::sys::{above_floor, sendto_tskey};
}

use crate::EngineOptions;
use demux::{Demux, FastMap};
use device::{EngineRx, EngineTx};
use nanowire_xdp::iface::{self, IfaceInfo};
use nanowire_xdp::xsk::{BindMode, XskConfig, XskSocket};
use nanowire_xdp::{AttachMode, Frags, SteerProgram, UmemArea};
use order::{Guard, Tier};
use rx::{RX_BUDGET, RxPath};
use shm::{E, PageInfo, StatsPage, set};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use tx::TxPath;

/// Longest single sleep in poll() (a safety net: a thread that queues a
/// datagram for a sleeping socket wakes it through its eventfd).
const MAX_SLEEP_MS: i32 = 50;
/// TX frames per queue: four kicks' worth at the largest copy-mode budget.
pub const TX_FRAMES: u32 = nanowire_xdp::umem::OWN_TX_FRAMES;

/// Who steers this engine's flows: its own program, or the engine service
/// (which checks every claim against the kernel socket that holds the port).
enum Steer {
    Own(Box<SteerProgram>),
    Service(service::client::Conn),
}

/// The claims keep their names on either side: on the service each is a
/// request the service checks against the kernel socket passed with it
/// (or the process's own listener claim).
impl Steer {
    fn claim(&mut self, addr: Ipv4Addr, port: u16, sock: RawFd) -> Result<(), String> {
        match self {
            Steer::Own(p) => p.claim(addr, port, std::process::id()),
            Steer::Service(c) => c.claim(addr, port, borrow(sock)),
        }
    }
    fn unclaim(&mut self, addr: Ipv4Addr, port: u16) {
        match self {
            Steer::Own(p) => p.unclaim(addr, port),
            Steer::Service(c) => c.unclaim(addr, port),
        }
    }
    /// `sock`: the listening kernel socket holding the port.
    fn claim_tcp_listener(&mut self, addr: Ipv4Addr, port: u16, sock: RawFd) -> Result<(), String> {
        match self {
            Steer::Own(p) => p.claim_tcp_listener(addr, port, registry::pid()),
            Steer::Service(c) => c.claim_tcp_listener(addr, port, borrow(sock)),
        }
    }
    /// Join the listener group of (addr, port) with `sock`, this process's
    /// copy of its listening socket (the engine service only: an engine of
    /// its own cannot share a listener with another process).
    fn join_tcp_listener(&mut self, addr: Ipv4Addr, port: u16, sock: RawFd) -> Result<(), String> {
        match self {
            Steer::Own(_) => Err(
                "a listener inherited through fork is shared on the engine service only (NANOWIRE_SERVICE=1)"
                    .into(),
            ),
            Steer::Service(c) => c.tcp_join(addr, port, borrow(sock)),
        }
    }
    /// Stop accepting from the listener group of (addr, port) for now.
    fn idle_tcp_listener(&mut self, addr: Ipv4Addr, port: u16) -> Result<(), String> {
        match self {
            Steer::Own(_) => Err("not on the engine service".into()),
            Steer::Service(c) => c.tcp_idle(addr, port),
        }
    }
    /// A port of the client port block (ports.rs): every segment for it
    /// comes here, as for a listener's; `sock`, the engine's socket bound
    /// to it alone (the service checks that no other socket may share it,
    /// and keeps it).
    fn claim_client_port(&mut self, addr: Ipv4Addr, port: u16, sock: RawFd) -> Result<(), String> {
        match self {
            Steer::Own(p) => p.claim_tcp_listener(addr, port, registry::pid()),
            Steer::Service(c) => c.claim_client_port(addr, port, borrow(sock)),
        }
    }
    fn unclaim_tcp_listener(&mut self, addr: Ipv4Addr, port: u16) {
        match self {
            Steer::Own(p) => p.unclaim_tcp_listener(addr, port),
            Steer::Service(c) => c.unclaim_tcp_listener(addr, port),
        }
    }
    /// `sock`: the kernel socket holding `local`'s port (`None`: a
    /// connection of this process's claimed listener).
    fn claim_tcp_flow(
        &mut self,
        local: std::net::SocketAddrV4,
        remote: std::net::SocketAddrV4,
        sock: Option<RawFd>,
    ) -> Result<(), String> {
        match self {
            Steer::Own(p) => p.claim_tcp_flow(local, remote, registry::pid()),
            Steer::Service(c) => c.tcp_flow(
                service::proto::TcpFlow::Flow,
                local,
                remote,
                sock.map(borrow),
            ),
        }
    }
    fn pass_tcp_flow(
        &mut self,
        local: std::net::SocketAddrV4,
        remote: std::net::SocketAddrV4,
    ) -> Result<(), String> {
        match self {
            Steer::Own(p) => p.pass_tcp_flow(local, remote),
            Steer::Service(c) => c.tcp_flow(service::proto::TcpFlow::Pass, local, remote, None),
        }
    }
    /// Move a connection between two processes holding its socket `sock`
    /// (`K_TCP_MOVE`, issue 24 item 1): `take` false, the owner offers it;
    /// true, another process takes it (the service checks the socket).
    fn move_tcp_flow(
        &mut self,
        take: bool,
        local: std::net::SocketAddrV4,
        remote: std::net::SocketAddrV4,
        sock: RawFd,
    ) -> Result<(), String> {
        match self {
            Steer::Own(_) => Err("not on the engine service".into()),
            Steer::Service(c) => c.tcp_move(take, local, remote, borrow(sock)),
        }
    }
    fn unclaim_tcp_flow(&mut self, local: std::net::SocketAddrV4, remote: std::net::SocketAddrV4) {
        match self {
            Steer::Own(p) => p.unclaim_tcp_flow(local, remote),
            Steer::Service(c) => c.tcp_unflow(local, remote),
        }
    }
}

/// A caller's open kernel socket, borrowed for one request to the service.
fn borrow<'a>(sock: RawFd) -> std::os::fd::BorrowedFd<'a> {
    // SAFETY: every caller passes a descriptor it holds open (its kernel
    // socket or a reservation) for the duration of the request.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(sock) }
}

/// The fault injector's specification and its parsed form (`None`: off).
type Faults = Option<(String, nanowire_tcp::fault::EngineFaults)>;

/// The steering program and how many sockets claim each (address, port).
/// An engine of its own: its program's maps, behind the program lock (a
/// leaf: BPF map writes, no wait). On the engine service: the control
/// socket, behind the control lock (`Tier::Control`, held across each
/// request's round trip), which no data path takes: what a TCP turn
/// releases waits in the control queue ([`Deferrals`]).
struct Prog {
    prog: Steer,
    claims: FastMap<(u32, u16), usize>,
}

/// A release the data path made on the engine service, sent by the next
/// holder of the control lock (never a round trip in a TCP turn: every
/// turn of the stack, and through the stack lock every thread on it,
/// would wait for the service's answer).
enum Deferred {
    /// A TCP connection's flow claim ended; `keep`: the kernel socket
    /// holding its port, closed once the claim is gone (so no other
    /// socket can take the port while the claim stands).
    Unflow(SocketAddrV4, SocketAddrV4, Option<std::os::fd::OwnedFd>),
    /// The first multi-buffer packet arrived: ask for the frags-aware
    /// program (`Conn::want_frags`).
    Frags,
}

/// The control queue (engine service only): [`Deferred`] requests in the
/// order they were made. Whoever holds the control lock sends them, first
/// when it takes the lock (so a release always reaches the service before
/// a later claim of the same ports) and again before it lets go; the
/// neighbour thread, woken for each, sends them when the lock is free
/// (`try_lock`: it never waits behind a request either).
struct Deferrals {
    q: Mutex<std::collections::VecDeque<Deferred>>,
    neigh: Arc<neigh::Neigh>,
}

impl Deferrals {
    fn push(&self, d: impl IntoIterator<Item = Deferred>) {
        let mut q = order::lock(&self.q, Tier::Leaf, "the control queue");
        let before = q.len();
        q.extend(d);
        let more = q.len() > before;
        drop(q);
        if more {
            self.neigh.wake_worker();
        }
    }

    fn pending(&self) -> bool {
        !order::lock(&self.q, Tier::Leaf, "the control queue").is_empty()
    }

    /// Send what waits (the control lock held: `p`).
    fn send(&self, p: &mut Prog) {
        loop {
            let Some(d) = order::lock(&self.q, Tier::Leaf, "the control queue").pop_front() else {
                return;
            };
            let Steer::Service(c) = &mut p.prog else {
                continue;
            };
            match d {
                Deferred::Unflow(local, remote, keep) => {
                    c.tcp_unflow(local, remote);
                    if let Some(fd) = keep {
                        nanowire_xdp::sys::close(std::os::fd::IntoRawFd::into_raw_fd(fd));
                    }
                }
                Deferred::Frags => {
                    if let Err(e) = c.want_frags() {
                        eprintln!(
                            "nanowire: {e}; packets larger than one frame still arrive \
                             (linearised by the kernel's generic XDP)"
                        );
                    }
                }
            }
        }
    }
}

/// The steering state, locked: an own engine's program lock, or the
/// engine service's control lock, whose holder also sends the control
/// queue (on taking it and before letting go).
struct Steering<'a> {
    g: Option<Guard<'a, Prog>>,
    deferred: Option<&'a Deferrals>,
}

impl std::ops::Deref for Steering<'_> {
    type Target = Prog;
    fn deref(&self) -> &Prog {
        self.g.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for Steering<'_> {
    fn deref_mut(&mut self) -> &mut Prog {
        self.g.as_mut().expect("held until drop")
    }
}

impl Drop for Steering<'_> {
    fn drop(&mut self) {
        let Some(d) = self.deferred else {
            return;
        };
        if let Some(mut g) = self.g.take() {
            d.send(&mut g);
        }
        // A release queued after the last send and before the unlock found
        // the lock taken (the neighbour thread's try_lock): wake it again.
        if d.pending() {
            d.neigh.wake_worker();
        }
    }
}

/// Take the steering state (`service`: the control lock, else the program
/// lock), sending the control queue first.
fn steering<'a>(prog: &'a Mutex<Prog>, deferred: Option<&'a Deferrals>) -> Steering<'a> {
    let mut g = match deferred {
        Some(_) => order::lock(prog, Tier::Control, "the control lock"),
        None => order::lock(prog, Tier::Leaf, "the program lock"),
    };
    if let Some(d) = deferred {
        d.send(&mut g);
    }
    Steering {
        g: Some(g),
        deferred,
    }
}

impl Prog {
    /// `sock`: the kernel socket that holds the port (the service checks it).
    fn claim(&mut self, addr: Ipv4Addr, port: u16, sock: RawFd) -> Result<(), String> {
        let n = self.claims.entry((addr.to_bits(), port)).or_insert(0);
        if *n == 0
            && let Err(e) = self.prog.claim(addr, port, sock)
        {
            self.claims.remove(&(addr.to_bits(), port));
            return Err(e);
        }
        *n += 1;
        Ok(())
    }
    fn unclaim(&mut self, addr: Ipv4Addr, port: u16) {
        let k = (addr.to_bits(), port);
        if let Some(n) = self.claims.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.claims.remove(&k);
                self.prog.unclaim(addr, port);
            }
        }
    }
}

/// The xdp engine on one interface.
pub struct Engine {
    /// The RX and TX locks: owned locks (order.rs, `nanowire_owner`), so
    /// that one thread using the engine takes them with plain stores.
    rx: order::Owned<RxPath<EngineRx>>,
    tx: Arc<order::Owned<TxPath<EngineTx>>>,
    neigh: Arc<neigh::Neigh>,
    /// Shared with the neighbour thread, which upgrades a `Frags::Lazy`
    /// program and sends the control queue (see [`Engine::assemble`]).
    prog: Arc<Mutex<Prog>>,
    /// The control queue (on the engine service; `None`: an own program).
    deferred: Option<Arc<Deferrals>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    fds: Vec<RawFd>,
    iface: IfaceInfo,
    attach: AttachMode,
    bind: BindMode,
    page: Arc<StatsPage>,
    depth: u32,
    tx_budget: Option<u32>,
    frame_size: usize,
    multi_buffer: bool,
    /// Transmitted TCP segments leave their checksum to the kernel or the
    /// device (AF_XDP TX metadata; `XskTx::csum_offload`).
    csum_offload: bool,
    mem: usize,
    /// Fork generation at open: an engine belongs to the process that
    /// opened it (see registry.rs).
    fork_gen: u32,
    /// The fds a forked child must not keep: the steering program's link,
    /// program and maps, and the AF_XDP sockets (see [`Engine::disown`]).
    child_fds: Vec<RawFd>,
    /// The TCP stack every client connection of the process on this
    /// engine shares (tcp.rs, `TcpEngine::clients`).
    tcp_clients: Mutex<std::sync::Weak<tcp::TcpEngine>>,
    /// The client port block (ports.rs) while no client stack holds it.
    client_ports: Mutex<ports::PortBlock>,
    /// The network namespace it was opened in (inode).
    netns: u64,
    /// The same namespace's cookie (SO_NETNS_COOKIE), compared with a
    /// socket's at connect (cheaper than the inode's /proc lookup).
    netns_cookie: Option<u64>,
    /// Attached to the engine service (its slot), not an engine of its own.
    service_slot: Option<u32>,
    /// On the service: the shared UMEM's spinner registry, published to
    /// this process's waits while the engine lives (`nanowire_xdp::seats`).
    _seats: Option<nanowire_xdp::seats::Published>,
    /// The service this engine was attached to is gone (service/client.rs,
    /// `Watch`): its program and claims went with it.
    service_lost: Arc<std::sync::atomic::AtomicBool>,
    /// The process's TCP connection table on the service (issue 24: what
    /// the service reads to end the connections if the process dies), made
    /// and handed over with the first TCP stack; `None` inside: it could
    /// not be (said once).
    conn_table: std::sync::OnceLock<Option<Arc<service::conns::ConnTable>>>,
    /// IP_TTL and IP_TOS of a TCP socket left at the kernel's defaults in
    /// this namespace, read from the first one a connect adopted with
    /// [`EngineOptions::ip_header_default`] (see [`Engine::ip_defaults`]).
    ip_defaults: std::sync::OnceLock<(u8, u8)>,
    /// Kept for the process's life ([`Engine::keep_for_life`]).
    kept: std::sync::atomic::AtomicBool,
    /// A look at the receive side without the RX lock (see
    /// [`Engine::rx_quiet`]); `None` when receive faults are injected (the
    /// injector holds frames back and releases them from later polls).
    rx_hint: Option<RxHint>,
}

/// The stats pages of the engines kept for the process's life
/// ([`Engine::keep_for_life`]), with the pid that made each (a forked
/// child's copy of the list is not its own).
static KEPT_PAGES: std::sync::Mutex<Vec<(u32, std::path::PathBuf)>> =
    std::sync::Mutex::new(Vec::new());

/// Whether an AF_XDP bind's error (`XskSocket::open_in`, `SharedQueue::
/// create`) says the queue is busy (EBUSY: another AF_XDP socket is bound
/// to it; an exited process's is freed a moment after it is gone).
pub fn queue_busy(err: &str) -> bool {
    err.contains("(os error 16)")
}

/// Test hook ([`config::TEST_OPEN_DELAY_MS_VAR`]): an engine's open waits
/// `ms` first.
#[cold]
#[inline(never)]
fn test_open_delay(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// `bind()` (an AF_XDP bind), again every 20 ms for up to 1 s while it
/// says the queue is busy ([`queue_busy`]): the queue of a process that
/// just exited (its engine, or the service's member) is freed by the
/// kernel a moment after it is gone (the UMEM's release is deferred), so
/// the program's first socket (a shell's next program, a daemon taking
/// what its exited parent left, a service started after an engine of its
/// own) waits for it rather than fails.
pub(crate) fn while_busy<T>(mut bind: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let since = std::time::Instant::now();
    loop {
        match bind() {
            Err(e) if queue_busy(&e) && since.elapsed() < std::time::Duration::from_secs(1) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// Before an exec: the engines kept for the process's life go with its
/// image, but the pid stays, so their stats pages would be listed as
/// alive beside the new program's (`nanowire stats` read the old one's
/// counters for the process). Their files are removed here; should the
/// exec fail, the engine runs on unlisted (its counters still count).
pub fn before_exec() {
    let me = std::process::id();
    let mut kept = KEPT_PAGES.lock().unwrap_or_else(|e| e.into_inner());
    kept.retain(|(pid, path)| {
        if *pid == me {
            let _ = std::fs::remove_file(path);
        }
        false
    });
}

/// The RX rings' indices and the RX path's delivery count, readable
/// without the RX lock.
struct RxHint {
    rings: Vec<nanowire_xdp::RxPeek>,
    delivered: Arc<std::sync::atomic::AtomicU64>,
    /// The thread whose spinning receive wait last looked (see
    /// [`Engine::rx_spin_alone`]).
    spinners: Spinners,
}

/// The last waiting thread's token on a cache line of its own: written
/// only when another thread's wait looks, and it sits in the engine beside
/// the RX and TX locks' words.
#[repr(align(64))]
#[derive(Default)]
struct Spinners(std::sync::atomic::AtomicUsize);

/// A token of the calling thread, unique among the live threads: its
/// owned-lock token, `pid << 32 | tid` (initial-exec TLS: no call, no
/// system call after the thread's first, no atomic).
#[inline]
fn thread_token() -> usize {
    <nanowire_owner::Process as nanowire_owner::OwnerHost>::me() as usize
}

impl Engine {
    /// The process's engine on `ifname` (in the calling thread's network
    /// namespace), opened on first use. A forked child gets its own.
    pub fn get(ifname: &str, opts: &EngineOptions) -> Result<Arc<Engine>, String> {
        registry::set_child_hook(tcp::service_after_fork);
        registry::get(ifname, || {
            let delay = config::config().test_open_delay_ms;
            if delay > 0 {
                test_open_delay(delay);
            }
            if service::client::wanted() {
                Engine::open_service(ifname, opts)
            } else {
                Engine::open(ifname, opts)
            }
        })
    }

    /// The `faults` setting (off by default); a bad value refuses the
    /// engine with the parser's one line rather than running unimpaired.
    /// The process's settings (config.rs): never the environment here.
    fn faults() -> Result<Faults, String> {
        match &config::config().faults {
            Ok(Some((spec, f))) => Ok(Some((spec.clone(), f.clone()))),
            Ok(None) => Ok(None),
            Err(e) => Err(e.clone()),
        }
    }

    /// Attach to the network namespace's engine service (issue 23): the
    /// service makes and binds this process's AF_XDP socket per queue on its
    /// shared UMEM and checks every claim; the data path is this process's.
    /// No capability needed.
    fn open_service(ifname: &str, opts: &EngineOptions) -> Result<Engine, String> {
        let faults = Self::faults()?;
        let info = iface::lookup(ifname).map_err(|e| format!("interface {ifname}: {e}"))?;
        let own = iface::ipv4_addrs_of(ifname);
        let conn = service::client::Conn::connect()?;
        let conn_fd = conn.fd().as_raw_fd();
        let at = conn.attach(ifname, opts.ring_depth)?;
        let r = at.reply;
        if r.queues != info.rx_queues {
            return Err(format!(
                "engine service: {} queue(s) on {ifname}, this process sees {}",
                r.queues, info.rx_queues
            ));
        }
        let mode = if r.zero_copy {
            BindMode::ZeroCopy
        } else {
            BindMode::Copy
        };
        let budget = (r.tx_budget > 0).then_some(r.tx_budget);
        let mut socks: Vec<XskSocket> = Vec::new();
        for (q, (files, xsk)) in at.queues.into_iter().enumerate() {
            socks.push(XskSocket::attach_shared(
                files,
                xsk,
                r.geo,
                r.slot,
                q as u32,
                mode,
                r.multi_buffer,
                (budget, r.tx_metadata, config::config().tx_csum_offload),
            )?);
        }
        let attach = if r.xdp_generic {
            AttachMode::Skb
        } else {
            AttachMode::Driver
        };
        // Queue 0's control area holds the registry of the processes
        // sharing CPUs (one spinner per CPU; docs/architecture.md).
        let nq = socks.len();
        let seats = socks
            .first()
            .and_then(XskSocket::seats)
            .filter(|_| config::config().spin_share)
            .map(|s| {
                let ready = at.ready.as_ref().filter(|_| config::config().spin_hint);
                s.with_hint(ready.map(std::os::fd::AsFd::as_fd), nq)
            })
            .map(nanowire_xdp::seats::publish);
        let mut e = Self::assemble(
            ifname,
            info,
            own,
            socks,
            Steer::Service(at.conn),
            attach,
            r.multi_buffer,
            r.geo.rx_frames,
            r.geo.frame_size as usize,
            faults,
        )?;
        e.child_fds.push(conn_fd);
        e.service_slot = Some(r.slot);
        e._seats = seats;
        service::client::test_stop("built");
        Ok(e)
    }

    fn open(ifname: &str, opts: &EngineOptions) -> Result<Engine, String> {
        let settings = config::config();
        let faults = Self::faults()?;
        nanowire_xdp::privilege::check()?;
        let info = iface::lookup(ifname).map_err(|e| format!("interface {ifname}: {e}"))?;
        let own = iface::ipv4_addrs_of(ifname);
        // Frame size: 2 KiB frames hold MTU 1500 with the kernel's 256 B
        // headroom; 4 KiB up to MTU 3826; beyond, 4 KiB frames.
        let (depth, _, frame_size) = nanowire_xdp::umem::own_geometry(info.mtu, opts.ring_depth);
        let want_mb = !settings.no_multi_buffer;
        // What `nanowire run` prepared before it exec'd this program
        // (nanowire_xdp::prestart): the steering program, adopted below,
        // and the first queue's UMEM, populated.
        let mut prepared = if want_mb {
            prestart::take(info.index)
        } else {
            None
        };
        let mut made = match &mut prepared {
            Some(Ok(p)) => p.take_umem([depth, TX_FRAMES, frame_size]),
            _ => None,
        };
        // Else the first queue's UMEM (tens of MB to map and zero: most of
        // an engine's start) is made on another thread while the steering
        // program is loaded and attached below (its link waits in the
        // kernel's synchronize_rcu).
        let mut area = if made.is_some() {
            None
        } else {
            std::thread::Builder::new()
                .name("nanowire-umem".into())
                .spawn(move || UmemArea::new(depth, TX_FRAMES, frame_size).ok())
                .ok()
        };
        // Multi-buffer receive in every attach mode: a frags-aware program
        // (xdp.frags) and sockets bound with XDP_USE_SG, so that a packet
        // larger than one frame -- a jumbo frame, or a kernel peer's
        // TSO/GSO super-frame (up to 64 KiB) that generic XDP sees before
        // any segmentation -- arrives as one chain of descriptors instead of
        // being dropped by the kernel (docs/xdp-engine.md, "Multi-buffer
        // receive"). Where the kernel or driver refuses either, the engine
        // runs without and says so: super-frames are then counted drops.
        // In generic mode the program starts without xdp.frags and is
        // replaced by the frags-aware one at the first multi-buffer packet
        // (`Frags::Lazy`: a frags-aware program costs every frame a
        // page-pool copy and a new skb in generic XDP; docs/xdp-engine.md).
        // NANOWIRE_XDP_NO_MULTI_BUFFER=1 (tests): behave as a kernel without it.
        let first = if want_mb {
            match Self::adopt_prepared(prepared, ifname, settings.xdp_mode) {
                Some(p) => Ok(p),
                None => {
                    SteerProgram::attach_private(ifname, info.index, Frags::Lazy, settings.xdp_mode)
                }
            }
        } else {
            Err("multi-buffer turned off (NANOWIRE_XDP_NO_MULTI_BUFFER=1)".to_string())
        };
        let (mut prog, mut multi_buffer) = match first {
            Ok(p) => (p, true),
            Err(e) => {
                let p =
                    SteerProgram::attach_private(ifname, info.index, Frags::No, settings.xdp_mode)
                        .map_err(|e2| format!("{e2} (and the multi-buffer program: {e})"))?;
                eprintln!(
                    "nanowire: {ifname}: no multi-buffer XDP program ({e}); packets larger than \
                     {frame_size}-byte frames (a peer's TSO/GSO super-frames) cannot be received"
                );
                (p, false)
            }
        };
        let mut cfg = XskConfig {
            rx_frames: depth,
            tx_frames: TX_FRAMES,
            frame_size,
            // Zero-copy needs native XDP; generic mode is copy-only.
            try_zero_copy: prog.mode() == AttachMode::Driver,
            multi_buffer,
            // TX metadata (checksum offload) unless the options table's
            // tx_csum_offload turned it off.
            tx_metadata: settings.tx_csum_offload,
        };
        cfg.validate()?;
        let mut socks = Vec::new();
        for q in 0..info.rx_queues {
            // (A retry while the queue is busy makes its own UMEM.)
            let mut premade = made
                .take()
                .or_else(|| area.take().and_then(|h| h.join().ok().flatten()));
            let got = while_busy(|| XskSocket::open_in(ifname, info.index, q, cfg, premade.take()));
            let xsk = match got {
                Ok(x) => x,
                // A busy queue is not a kernel without XDP_USE_SG: binding
                // without it a moment later (the exited process's queue
                // freed meanwhile) gave an engine without multi-buffer,
                // which TCP with a TSO/GSO peer cannot run on (issue 24: a
                // daemon taking its exited parent's connection, in CI).
                Err(e) if cfg.multi_buffer && q == 0 && !queue_busy(&e) => {
                    // No XDP_USE_SG (kernel < 6.6): bind without it.
                    cfg.multi_buffer = false;
                    multi_buffer = false;
                    let x = XskSocket::open(ifname, info.index, q, cfg)
                        .map_err(|e2| format!("{e2} (with XDP_USE_SG: {e})"))?;
                    eprintln!(
                        "nanowire: {ifname}: no multi-buffer AF_XDP ({e}); packets larger than \
                         {frame_size}-byte frames (a peer's TSO/GSO super-frames) cannot be received"
                    );
                    x
                }
                Err(e) => return Err(e),
            };
            prog.set_xsk(q, &xsk)?;
            socks.push(xsk);
        }
        let attach = prog.mode();
        Self::assemble(
            ifname,
            info,
            own,
            socks,
            Steer::Own(Box::new(prog)),
            attach,
            multi_buffer,
            depth,
            frame_size as usize,
            faults,
        )
    }

    /// The steering program `nanowire run` loaded and attached on this
    /// interface before it exec'd this program (`prepared`, from
    /// nanowire_xdp::prestart::take), if there is one and it checks out;
    /// else `None` (with one line saying why when there was one) and the
    /// engine attaches its own.
    fn adopt_prepared(
        prepared: Option<Result<prestart::Prepared, String>>,
        ifname: &str,
        forced: Option<AttachMode>,
    ) -> Option<SteerProgram> {
        let why = match prepared? {
            Ok(p) => match SteerProgram::adopt_private(p, ifname, forced) {
                Ok(prog) => return Some(prog),
                Err(e) => e,
            },
            Err(e) => e,
        };
        eprintln!(
            "nanowire: {ifname}: not adopting the steering program nanowire run attached ({why}); \
             attaching one anew"
        );
        None
    }

    /// The engine around its AF_XDP sockets: stats page, tap, RX and TX
    /// paths, neighbour thread.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        ifname: &str,
        info: IfaceInfo,
        own: Vec<Ipv4Addr>,
        socks: Vec<XskSocket>,
        prog: Steer,
        attach: AttachMode,
        multi_buffer: bool,
        depth: u32,
        frame_size: usize,
        faults: Faults,
    ) -> Result<Engine, String> {
        let (faults_spec, faults) = match faults {
            Some((spec, f)) => (spec, Some(f)),
            None => (String::new(), None),
        };
        let bind = socks[0].mode();
        let tx_budget = socks[0].tx_budget();
        let fds: Vec<RawFd> = socks.iter().map(|s| s.as_raw_fd()).collect();
        let umem: usize = socks.iter().map(|s| s.umem().bytes).sum();
        let rings: usize = socks.iter().map(|s| s.ring_bytes()).sum();
        let on_service = matches!(prog, Steer::Service(_));
        let page = Arc::new(StatsPage::create(&PageInfo {
            pid: std::process::id(),
            iface: ifname.to_string(),
            queues: info.rx_queues,
            xdp_mode: match &prog {
                Steer::Own(_) => attach.as_str().to_string(),
                Steer::Service(_) => format!("{} via engine service", attach.as_str()),
            },
            bind_mode: bind.as_str().to_string(),
            ring_depth: depth,
        }));
        // A page in no directory (an unprivileged process: the stats
        // directory is root's) goes to the engine service, which shows its
        // counters in `nanowire stats`.
        if let (Steer::Service(c), Some(fd)) = (&prog, page.memfd())
            && let Err(e) = c.stats_page(fd)
        {
            eprintln!(
                "nanowire: {ifname}: the engine service refused this engine's stats page ({e}): \
                 its counters are not listed by `nanowire stats`"
            );
        }
        // Capture tap (crates/tap): a sparse shared file that costs memory
        // only while `nanowire capture` is attached.
        let (tap_rx, tap_tx, tap) = nanowire_tap::create(std::process::id(), ifname);
        if let Err(e) = tap {
            eprintln!("nanowire: {e}");
        }
        let mem = umem + rings + shm::PAGE_SIZE_BYTES;
        set(page.e(E::MemUmemBytes), umem as u64);
        set(page.e(E::MemRingBytes), rings as u64);
        set(page.e(E::MemTotalBytes), mem as u64);
        let mut rxs = Vec::new();
        let mut txs = Vec::new();
        for s in socks {
            let (r, t) = s.split();
            rxs.push(r);
            txs.push(t);
        }
        // Queue 0 transmits; the other queues' TX halves are not used.
        let txq = txs.swap_remove(0);
        let per_kick = tx_budget.unwrap_or(32).clamp(1, 256) as usize;
        // The transmit device: the ring, its tap, the fault injector, stamps.
        let txdev = device::stamp::TxStamps::new(device::faults::TxFaults::new(
            device::tap::TxTap::new(txq, tap_tx),
            faults.as_ref().and_then(|f| f.tx()),
            page.clone(),
        ));
        // Checksums left to the kernel or device only where the whole
        // transmit device passes requests on (not through the injector).
        let csum_offload = device::TxDevice::csum_offload(&txdev);
        let tx = Arc::new(order::Owned::new(TxPath::new(
            txdev,
            info.mac,
            per_kick,
            page.clone(),
        )));
        let neigh = Arc::new(
            neigh::Neigh::new(ifname, info.index, info.addr, page.clone())
                .map_err(|e| format!("eventfd: {e}"))?,
        );
        let service_lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watch = match &prog {
            Steer::Service(c) => Some(service::client::Watch::new(c, service_lost.clone(), ifname)),
            Steer::Own(_) => None,
        };
        let prog_fds: &[RawFd] = match &prog {
            Steer::Own(p) => p.fds(),
            Steer::Service(_) => &[],
        };
        let child_fds: Vec<RawFd> = prog_fds.iter().chain(fds.iter()).copied().collect();
        // A generic-mode program without xdp.frags (`Frags::Lazy`): the
        // first multi-buffer packet asks (device::xsk::FragsWanted), the
        // neighbour thread replaces it, with no data-path lock held.
        // On the engine service the service holds the program: the
        // neighbour thread asks it (`K_FRAGS`).
        let lazy = match &prog {
            Steer::Own(p) => p.can_upgrade(),
            Steer::Service(c) => c.frags_lazy(),
        };
        // An own program: nw_steer_frags is loaded from this (outside the
        // program lock, below).
        let loader = match &prog {
            Steer::Own(p) if multi_buffer => p.frags_loader(),
            _ => None,
        };
        let frags_wanted = (lazy && multi_buffer).then(|| {
            let neigh = neigh.clone();
            Arc::new(device::xsk::FragsWanted::new(move || neigh.wake_worker()))
        });
        let deferred = matches!(prog, Steer::Service(_)).then(|| {
            Arc::new(Deferrals {
                q: Mutex::new(Default::default()),
                neigh: neigh.clone(),
            })
        });
        let prog = Arc::new(Mutex::new(Prog {
            prog,
            claims: FastMap::default(),
        }));
        let hook = (frags_wanted.is_some() || deferred.is_some()).then(|| {
            let prog = prog.clone();
            let deferred = deferred.clone();
            let wanted = frags_wanted.clone();
            let iface = ifname.to_string();
            let mut done = false;
            Box::new(move || {
                if !done && wanted.as_ref().is_some_and(|w| w.asked()) {
                    done = true;
                    match &deferred {
                        // On the service: in the control queue, sent below
                        // or by the holder of the control lock.
                        Some(d) => d.push([Deferred::Frags]),
                        None => {
                            // An own program: the verifier's milliseconds
                            // run outside the program lock (a TCP turn that
                            // ends a claimed connection takes it); the lock
                            // covers only BPF_LINK_UPDATE and the fd swap.
                            let r =
                                loader.as_ref().map(|l| l.load()).transpose().and_then(
                                    |new| match (
                                        &mut order::lock(&prog, Tier::Leaf, "the program lock")
                                            .prog,
                                        new,
                                    ) {
                                        (Steer::Own(p), Some(new)) => {
                                            p.install_frags(new).map(|_| ())
                                        }
                                        _ => Ok(()),
                                    },
                                );
                            if let Err(e) = r {
                                eprintln!(
                                    "nanowire: {iface}: {e}; packets larger than one frame \
                                     still arrive (linearised by the kernel's generic XDP)"
                                );
                            }
                        }
                    }
                }
                // The control queue, when nobody holds the control lock
                // (its holder sends it otherwise): never a wait here.
                if let Some(d) = &deferred
                    && d.pending()
                    && let Some(g) = order::try_lock(&prog, Tier::Control)
                {
                    drop(Steering {
                        g: Some(g),
                        deferred: Some(d),
                    });
                }
            }) as neigh::Hook
        });
        let worker = neigh::spawn(neigh.clone(), tx.clone(), watch, hook)
            .map_err(|e| format!("cannot start the neighbour thread: {e}"))?;
        // The receive device: the rings of every queue, the tap, the fault
        // injector, stamps (device/mod.rs).
        let peeks: Vec<nanowire_xdp::RxPeek> = rxs.iter().map(|r| r.peek()).collect();
        let mut queues = device::xsk::XskQueues::new(rxs, page.clone());
        queues.set_oversize_hint(ifname, frame_size, multi_buffer);
        if let Some(w) = frags_wanted {
            queues.set_frags_wanted(w);
        }
        let rxdev = device::stamp::RxStamps::new(device::faults::RxFaults::new(
            device::tap::RxTap::new(queues, tap_rx),
            faults.as_ref().and_then(|f| f.rx()),
            page.clone(),
        ));
        let mut rxp = RxPath::new(rxdev, Demux::new(depth as usize), own, page.clone());
        // Frames TCP may keep in receive queues (rx.rs HOLD_DIVISOR): half
        // of that on the service's UMEM, whose RX frames every attached
        // process shares; none with the options table's tcp_rx_hold=0.
        if on_service {
            rxp.hold_limit /= 2;
            // The process's queues together: a quarter of the shared RX
            // frames (its RX ring can hold half, TCP an eighth: a process
            // that stops reading leaves the others an eighth at least;
            // demux.rs `set_process_limit`).
            rxp.demux.set_process_limit(depth as usize / 4);
        }
        if !config::config().tcp_rx_hold {
            rxp.hold_limit = 0;
        }
        if info.mac != [0; 6] {
            rxp.mac = Some(info.mac);
        }
        if let Some(f) = &faults {
            eprintln!(
                "nanowire: fault injection on {ifname} ({:?}): {}",
                f.dir, faults_spec
            );
        }
        let rx_hint = (faults.as_ref().is_none_or(|f| f.rx().is_none())
            && !config::config().rx_no_quiet)
            .then(|| RxHint {
                rings: peeks,
                delivered: rxp.delivered.clone(),
                spinners: Spinners::default(),
            });
        Ok(Engine {
            rx: order::Owned::new(rxp),
            tx,
            neigh,
            prog,
            deferred,
            worker: Mutex::new(Some(worker)),
            fds,
            iface: info,
            attach,
            bind,
            page,
            depth,
            tx_budget,
            frame_size,
            multi_buffer,
            csum_offload,
            mem,
            fork_gen: registry::fork_gen(),
            child_fds,
            tcp_clients: Mutex::new(std::sync::Weak::new()),
            client_ports: Mutex::new(ports::PortBlock::default()),
            netns: registry::netns_id(),
            netns_cookie: registry::netns_cookie(),
            service_slot: None,
            _seats: None,
            service_lost,
            conn_table: std::sync::OnceLock::new(),
            ip_defaults: std::sync::OnceLock::new(),
            kept: std::sync::atomic::AtomicBool::new(false),
            rx_hint,
        })
    }

    /// In a forked child (from the `pthread_atfork` child handler): the
    /// steering program's link, program and map fds and the AF_XDP sockets
    /// are the parent's. Each number is made to name `inert` (a /dev/null
    /// descriptor, close-on-exec) instead: the child cannot rewrite the
    /// claims or keep the program attached (the link goes when the parent's
    /// last fd closes, even by kill -9), and the numbers stay taken, so the
    /// child's own files never get them and the inherited objects' later
    /// drop closes only the copies of /dev/null.
    pub(crate) fn disown(&self, inert: RawFd) {
        use std::os::fd::FromRawFd;
        // SAFETY: `inert` is the caller's open descriptor, borrowed for the
        // calls below.
        let inert = unsafe { rustix::fd::BorrowedFd::borrow_raw(inert) };
        for &fd in &self.child_fds {
            // SAFETY: a number this engine opened; nothing in this process
            // uses it any more (the engine refuses work in a child,
            // `is_own`). ManuallyDrop: the number stays open (it names
            // /dev/null after the dup3); the engine's own drop closes it.
            let mut target =
                std::mem::ManuallyDrop::new(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
            let _ = rustix::io::dup3(inert, &mut target, rustix::io::DupFlags::CLOEXEC);
        }
        service::warden::disown();
    }

    /// The RX path's delivery count, for [`Engine::rx_quiet`]: read under
    /// the RX lock `g` (the only place it changes), after the attempt that
    /// found the endpoint's queue empty, so it counts exactly the polls that
    /// attempt saw the results of. `None`: no quiet turns on this engine.
    #[inline]
    fn rx_mark(&self, g: &RxPath<EngineRx>) -> Option<u64> {
        self.rx_hint
            .as_ref()
            .map(|_| g.delivered.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Nothing was delivered to any endpoint since the delivery count was
    /// `mark` and nothing waits on the RX rings: an endpoint whose queue was
    /// empty at `mark` is still empty. Two loads per ring and one of the
    /// count, no lock. Holds alike for an engine of its own and one attached
    /// to the engine service: either way this process alone consumes its RX
    /// rings (the service's fill ring is shared, the RX rings are not), and
    /// every consumption is an [`RxPath::poll`] under the RX lock.
    ///
    /// Why a `true` never hides a datagram (S: the socket asking, P: any
    /// poll of any thread; frames reach an endpoint's queue only in
    /// `RxPath::poll`, which bumps `delivered` with Release after its
    /// pushes and its ring releases, all under the RX lock):
    /// - A datagram pushed before S's mark was read: the mark was read
    ///   under the RX lock after S's drain in the same lock hold, so S's
    ///   drain saw it (S marks only a queue it drained empty).
    /// - A datagram pushed by a poll P after that: P's bump is later in
    ///   `delivered`'s modification order than the value S marked, so S's
    ///   Acquire load reads `mark + k` as soon as the bump is visible to it,
    ///   and then S takes the lock. Until then P is still inside its poll
    ///   (pushes done, bump not yet visible): S's turn is ordered before P's
    ///   delivery, exactly as if S had taken the lock before P. A spinning S
    ///   sees the bump on a later turn. A sleeping S announces its sleep
    ///   under the RX lock, which it takes either after P's poll (it finds
    ///   the datagram queued and does not sleep) or before it (P's push sees
    ///   `sleeping` and writes the endpoint's eventfd); its poll(2) also
    ///   covers the RX rings' fds. No wakeup depends on this hint.
    /// - A datagram still on a ring: the kernel writes the descriptor, then
    ///   stores the producer index with release semantics
    ///   (smp_store_release in xskq_prod_submit); [`nanowire_xdp::RxPeek`]
    ///   loads it with Acquire, so a published index is seen together with
    ///   everything before it. The descriptors themselves are never read
    ///   here (they are read under the lock, by the poll, after its own
    ///   Acquire load of the same index), so no torn descriptor is possible.
    ///   The consumer index is ours (stored with Release by a poll under the
    ///   lock); loaded Relaxed after the Acquire load of the producer, a
    ///   stale value only makes the ring look non-empty (a needless lock),
    ///   and a fresh one that equals the producer means those descriptors
    ///   were taken by a poll, i.e. the previous case.
    ///
    /// Off (`false`) when receive faults are injected: the injector holds
    /// frames back and releases them from later polls, off the rings.
    #[inline]
    fn rx_quiet(&self, mark: u64) -> bool {
        self.rx_hint.as_ref().is_some_and(|h| {
            h.delivered.load(std::sync::atomic::Ordering::Acquire) == mark
                && !h.rings.iter().any(|r| r.pending())
        })
    }

    /// [`Engine::rx_quiet`] for a receive's idle turn while it waits (a
    /// spinning UDP receive): the turn it answers `false` polls under the
    /// lock, as every turn did before there were quiet turns; one that
    /// answers `true` keeps what that poll did for receive latency.
    ///
    /// - `false` also while frames wait to go back to the fill ring: the
    ///   last datagram's frame, dropped after it was delivered, goes back
    ///   by the first turn of the next wait (after the reply went out), not
    ///   by the poll that finds the next datagram (its refill reloads the
    ///   fill ring's consumer index, which the kernel writes for every
    ///   packet on the sender's CPU: a cross-CPU miss before the datagram is
    ///   even read).
    /// - `true`: the next RX descriptor slot and the predicted next frame
    ///   are prefetched ([`nanowire_xdp::RxPeek::prefetch`]), as the poll of
    ///   an empty ring does.
    #[inline]
    fn rx_wait_quiet(&self, mark: u64) -> bool {
        self.rx_hint.as_ref().is_some_and(|h| {
            if h.delivered.load(std::sync::atomic::Ordering::Acquire) != mark
                || h.rings.iter().any(|r| r.pending() || r.refill_due())
            {
                return false;
            }
            h.rings.iter().for_each(|r| r.prefetch());
            true
        })
    }

    /// The calling thread's spinning receive wait is the only one on this
    /// engine: its idle turns poll under the RX lock instead of being quiet
    /// turns. What a quiet turn saves is the RX lock's two atomics and the
    /// poll per idle turn, which matter when other threads of the process
    /// take that lock (several spinning readers: the lock's line would
    /// cross CPUs every turn, and the reader whose datagram came waits for
    /// it); a lone reader's lock is uncontended, and its quiet turn puts
    /// the socket and RX locks and the call into the poll between the
    /// arrival (seen in the quiet turn) and the descriptor's read, where a
    /// polling turn has taken them before it looks at the ring: sockperf
    /// UDP under run p50 1.06x far and ~1.02-1.04x near with quiet turns
    /// (docs/benchmarks.md "Session 20: the quiet turn, far").
    ///
    /// "Alone" is told by the last waiting thread's token, not a count,
    /// looked at once per wait (`XdpSocket::idle_peek`): a wait whose look
    /// finds its own thread's token (or none yet) is alone (one load of
    /// a line nobody writes meanwhile); one that finds another's stores its
    /// own and coasts, so two threads waiting by turns keep coasting, and a
    /// thread whose peer stopped waiting polls again from its second look.
    /// A count (session 20) cost every wait two atomic read-modify-writes,
    /// and the look-ahead's engine reference two more, which a lone wait no
    /// longer makes (`XdpSocket::idle_peek`): ~1-2% of sockperf's near p50
    /// (session 21). A token another thread changes a moment later only
    /// decides how the next turns wait, never what they see. Several
    /// sockets waited on by one thread count as one waiter (its lock is
    /// uncontended: it polls).
    #[inline]
    fn rx_spin_alone(&self) -> bool {
        self.rx_hint.as_ref().is_some_and(|h| {
            let me = thread_token();
            let last = &h.spinners.0;
            let was = last.load(std::sync::atomic::Ordering::Relaxed);
            if was == me {
                return true;
            }
            last.store(me, std::sync::atomic::Ordering::Relaxed);
            // The engine's first wait is alone too.
            was == 0
        })
    }

    #[inline]
    fn rx(&self) -> order::OwnedGuard<'_, RxPath<EngineRx>> {
        order::lock_owned(&self.rx, Tier::Leaf, "the RX lock")
    }
    #[inline]
    fn tx(&self) -> order::OwnedGuard<'_, TxPath<EngineTx>> {
        order::lock_owned(&self.tx, Tier::Leaf, "the TX lock")
    }
    /// The steering state: the program lock (an own engine), or the
    /// control lock (on the engine service: a request's round trip is made
    /// with it held; never from a TCP turn, see [`Engine::release_flows`]).
    fn prog(&self) -> Steering<'_> {
        steering(&self.prog, self.deferred.as_deref())
    }

    /// Give up TCP flow claims of connections that ended (the shared
    /// client stack's reap, the timer service's sweep of handed-over
    /// connections), each with the kernel socket that held its port
    /// (closed once the claim is gone). An own engine's program: its map
    /// now (the program lock, a leaf). On the engine service: queued for
    /// the holder of the control lock or the neighbour thread, so the
    /// caller (a TCP turn, under its stack lock) never waits for the
    /// service, nor behind another thread's request.
    fn release_flows(
        &self,
        flows: Vec<(SocketAddrV4, SocketAddrV4, Option<std::os::fd::OwnedFd>)>,
    ) {
        if flows.is_empty() {
            return;
        }
        match &self.deferred {
            Some(d) => d.push(flows.into_iter().map(|(l, r, k)| Deferred::Unflow(l, r, k))),
            None => {
                let mut kept = Vec::new();
                {
                    let mut p = self.prog();
                    for (l, r, keep) in flows {
                        p.prog.unclaim_tcp_flow(l, r);
                        kept.extend(keep);
                    }
                }
                // The ports go back to the kernel after their claims.
                drop(kept);
            }
        }
    }

    /// Keep this engine until the process ends (or execs): an engine of
    /// the process's own whose warden holds a copy of its XDP link
    /// ([`Engine::conn_region`]). Dropped with the last socket, it would
    /// leave the steering program attached through the warden's copy, and
    /// every later open in the process would find the interface held
    /// (EBUSY): a program that closed its last connection and made another
    /// got a kernel socket from then on (session 26; under load even
    /// between the connections of one loop). Onload's stacks live as long
    /// too. The extra reference is never released; a forked child's copy
    /// of it is never used (the registry is per process).
    pub(crate) fn keep_for_life(self: &Arc<Self>) {
        if !self.kept.swap(true, std::sync::atomic::Ordering::AcqRel) {
            std::mem::forget(Arc::clone(self));
            if let Some(p) = self.page.path() {
                KEPT_PAGES
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((std::process::id(), p.to_path_buf()));
            }
        }
    }

    /// A region of the process's TCP connection table for one TCP stack:
    /// the engine service (or, on an engine of the process's own, its
    /// warden, `service/warden.rs`) ends the connections published there
    /// if the process dies (issue 24). `None`: not published (said once).
    pub(crate) fn conn_region(&self) -> Option<service::conns::Region> {
        let t = self.conn_table.get_or_init(|| {
            let made = service::conns::ConnTable::create().and_then(|t| {
                if self.service_slot.is_some() {
                    match &self.prog().prog {
                        Steer::Service(c) => c.conn_table(t.fd())?,
                        Steer::Own(_) => return Err("not on the engine service".into()),
                    }
                } else {
                    // A copy of the link, for the warden to hold (the
                    // program stays attached past a kill -9 until the
                    // warden has given the connections to the kernel).
                    let link = match &self.prog().prog {
                        Steer::Own(p) => rustix::io::fcntl_dupfd_cloexec(p.link_fd(), 16).ok(),
                        Steer::Service(_) => None,
                    };
                    let started = service::warden::start(t.fd(), link.as_ref().map(std::os::fd::AsFd::as_fd));
                    if let Some(l) = link {
                        nanowire_xdp::sys::close(std::os::fd::IntoRawFd::into_raw_fd(l));
                    }
                    if !started? {
                        return Ok(None);
                    }
                }
                Ok(Some(Arc::new(t)))
            });
            match made {
                Ok(t) => t,
                Err(e) if self.service_slot.is_some() => {
                    eprintln!(
                        "nanowire: the engine service cannot end this process's TCP connections if it is killed: {e}"
                    );
                    None
                }
                Err(e) => {
                    eprintln!(
                        "nanowire: no warden: if this process is killed, its TCP connections end without a FIN or RST: {e}"
                    );
                    None
                }
            }
        });
        let r = t.as_ref()?.region();
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if r.is_none() && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!(
                "nanowire: more than {} TCP stacks on the engine service: the connections of the next ones are not ended by the service if the process is killed",
                service::conns::REGIONS
            );
        }
        r
    }

    /// IP_TTL and IP_TOS of `fd`, a TCP socket its caller knows to hold
    /// the kernel's defaults: read from the first such socket, then from
    /// memory (two getsockopt calls per connect fewer; the defaults are the
    /// namespace's `ip_default_ttl` and 0, the same for every such socket
    /// of the engine's namespace while the sysctl stays).
    pub(crate) fn ip_defaults(&self, fd: RawFd) -> (u8, u8) {
        *self.ip_defaults.get_or_init(|| tcp::ip_header_of(fd))
    }

    /// Attached to the engine service (its slot there), rather than an
    /// engine of the process's own.
    pub fn service_slot(&self) -> Option<u32> {
        self.service_slot
    }

    /// The engine service this engine was attached to is gone: nothing is
    /// steered to it any more (the process's sockets fall back to their
    /// kernel sockets; its next engine attaches to a restarted service).
    pub fn service_lost(&self) -> bool {
        self.service_lost.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Attached to the engine service (its program is the service's).
    #[inline]
    pub fn on_service(&self) -> bool {
        self.deferred.is_some() && !self.service_lost()
    }

    /// Does this engine belong to the calling process (not inherited
    /// through fork)?
    #[inline]
    pub fn is_own(&self) -> bool {
        registry::fork_gen() == self.fork_gen
    }

    pub fn iface(&self) -> &IfaceInfo {
        &self.iface
    }
    /// Native or generic XDP.
    pub fn attach_mode(&self) -> AttachMode {
        self.attach
    }
    /// Zero-copy or copy AF_XDP.
    pub fn bind_mode(&self) -> BindMode {
        self.bind
    }
    /// XDP_MAX_TX_SKB_BUDGET in effect (copy-mode frames per TX kick), if
    /// the kernel supports it.
    pub fn tx_budget(&self) -> Option<u32> {
        self.tx_budget
    }
    /// RX ring depth (frames per queue).
    pub fn ring_depth(&self) -> u32 {
        self.depth
    }
    /// UMEM frame size in bytes.
    pub fn frame_size(&self) -> usize {
        self.frame_size
    }
    /// Packets larger than a frame arrive as AF_XDP multi-buffer chains
    /// (jumbo frames, a kernel peer's TSO/GSO super-frames).
    pub fn multi_buffer(&self) -> bool {
        self.multi_buffer
    }
    /// TCP checksums of transmitted segments are completed by the kernel
    /// or the device (AF_XDP TX metadata), not in software.
    pub fn csum_offload(&self) -> bool {
        self.csum_offload
    }
    /// Bytes the engine mapped: UMEM, rings and the stats page.
    pub fn memory_bytes(&self) -> usize {
        self.mem
    }
    /// Path of the shared stats page, if in /dev/shm.
    pub fn stats_page(&self) -> Option<std::path::PathBuf> {
        self.page.path().map(|p| p.to_path_buf())
    }

    /// Engine counters by name (refreshes the kernel's XDP_STATISTICS).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        if self.is_own() {
            self.rx().refresh_kernel_stats();
        }
        self.page.engine_counters().collect()
    }

    /// Drain the RX rings once (for callers that only send, e.g. to keep
    /// counters current). Returns frames processed.
    pub fn poll(&self) -> u32 {
        if !self.is_own() {
            return 0;
        }
        self.rx().poll(RX_BUDGET)
    }

    fn wait_fds(&self, extra: &[RawFd], timeout_ms: i32) {
        let mut pfds: Vec<libc::pollfd> = self
            .fds
            .iter()
            .chain(extra.iter())
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        nanowire_xdp::sys::poll(&mut pfds, timeout_ms);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.is_own() {
            // Inherited through fork: the program, rings and stats page are
            // the parent's. Keep the page (its file) alive forever in this
            // process; the rest only unmaps our copies and closes our fds.
            std::mem::forget(self.page.clone());
            // The neighbour thread does not exist in this process: never
            // join or detach its handle.
            std::mem::forget(std::mem::replace(&mut self.worker, Mutex::new(None)));
            return;
        }
        self.neigh.stop();
        if let Some(w) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = w.join();
        }
    }
}
