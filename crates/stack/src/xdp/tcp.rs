//! TCP on the xdp engine (issue 11): `nanowire-tcp`'s sans-IO stack driven
//! by the engine's rings.
//!
//! One [`TcpEngine`] per listener or client connection set holds a
//! `TcpStack` and one demux endpoint (`EndpointKind::Tcp`) bound to every
//! local (address, port) it owns; the steering program claims the same
//! (address, port) for TCP (listeners) or the 4-tuple (client connections),
//! so the kernel never sees those segments. Each port is also held by a
//! kernel TCP socket (bound; listening for a listener) so that the kernel
//! never hands it to anyone else.
//!
//! Driving (`turn`): pop this endpoint's frames off the demux (polling the
//! rings), feed them to the stack, run its timers, then stage the segments it
//! wants to send with Ethernet/IPv4 headers and post them on the TX ring in
//! one batch. The next hop's MAC comes from the engine's neighbour table,
//! resolved outside the TX lock (locks are never nested).

use super::Engine;
use super::classify::MAX_PIECES;
use super::demux::{EndpointId, EndpointKind};
use super::device::{RxDevice, TxDevice};
use super::neigh::{Hop, Lookup};
use super::order::{self, Tier, as_engine_thread};
use super::rx::{HeldBudget, RX_BUDGET, RxPath};
use super::shm::{E, bump, peak, set};
use super::tx::{ETH_HDR, IP_HDR, TxPath, eth_ipv4};
use super::wake::{self, PARKED, SERVICE_NAPPING, SERVICE_WAKE, UNPARK_DUE, service_nudge};
use crate::{EngineOptions, WaitPolicy};
use nanowire_probe::{self as probe, Mark};
use nanowire_tcp::{
    Config, ConnId, DirectRead, Error as TcpError, Hold, Intake, ListenerId, Secret, SocketOptions,
    State, TcpInfo, TcpStack,
};
use nanowire_wire::Ipv4Repr;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use nanowire_wire::ipv4::PROTO_TCP;
/// Segments staged per TX batch.
const TX_BATCH: usize = 32;
/// Bytes per staged segment (one frame).
const SLOT: usize = 2048;
const HDRS: usize = ETH_HDR + IP_HDR;
/// Idle turns between two looks at the clock (and the timers).
const IDLE_CLOCK_EVERY: u32 = 16;
/// Idle turns of a spinning reader answered from a lock-free look
/// ([`XdpTcpStream::coast`]) before its next attempt takes the stack's lock
/// (as a UDP wait's `QUIET_LOOK_EVERY`).
pub const COAST_TURNS: u32 = 64;
/// How long a quick ACK of data waits for the application's reply to carry
/// it (`Config::quickack_defer_ns`): the reply comes within the turn that
/// follows the segment's, tens of µs; an application that takes longer gets
/// its ACK sent alone by the timer, 1 ms later than the kernel's.
const QUICKACK_DEFER_NS: u64 = 1_000_000;

fn io_err(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

/// Loopback TCP stays on the kernel (no XDP-capable interface carries
/// it): `Unsupported`, naming the address, when one of `addrs` is.
fn off_loopback(addrs: &[Ipv4Addr]) -> io::Result<()> {
    match addrs.iter().find(|a| a.is_loopback()) {
        Some(a) => Err(io_err(
            io::ErrorKind::Unsupported,
            format!("{a} is a local address (loopback)"),
        )),
        None => Ok(()),
    }
}

fn open_err(e: super::OpenError) -> io::Error {
    match e {
        super::OpenError::Socket(e) => e,
        super::OpenError::Engine(m) => io_err(io::ErrorKind::Unsupported, m),
    }
}

fn tcp_err(e: TcpError) -> io::Error {
    let kind = match e {
        TcpError::WouldBlock => io::ErrorKind::WouldBlock,
        TcpError::ConnectionRefused => io::ErrorKind::ConnectionRefused,
        TcpError::ConnectionReset => io::ErrorKind::ConnectionReset,
        TcpError::TimedOut => io::ErrorKind::TimedOut,
        TcpError::Aborted => io::ErrorKind::ConnectionAborted,
        TcpError::Shutdown => io::ErrorKind::BrokenPipe,
        TcpError::NotConnected => io::ErrorKind::NotConnected,
        TcpError::AddrInUse => io::ErrorKind::AddrInUse,
        TcpError::InvalidHandle => io::ErrorKind::InvalidInput,
        TcpError::TooManyConnections => io::ErrorKind::OutOfMemory,
    };
    io::Error::new(kind, e.to_string())
}

/// A kernel TCP socket holding a port: bound (and listening for a listener).
fn reserve(local: SocketAddrV4, listen: bool) -> io::Result<(OwnedFd, SocketAddrV4)> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own exclusively. Kept while the
    // port is held: above the program's numbers.
    let fd = nanowire_xdp::sys::above_floor(unsafe { OwnedFd::from_raw_fd(fd) });
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: local.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(local.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in and the length matches.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen on a bound socket we own.
    if listen && unsafe { libc::listen(fd.as_raw_fd(), 1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an all-zero sockaddr_in is valid; getsockname writes at most len bytes.
    let mut out: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: out/len are valid for writes.
    if unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut out as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    let got = SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(out.sin_addr.s_addr)),
        u16::from_be(out.sin_port),
    );
    Ok((fd, got))
}

/// The process's TCP secret (ISNs, timestamp offsets, SYN cookies), one
/// for every stack of the process, as the kernel has one per boot: a new
/// connection to a peer that still holds the previous one on the same
/// 4-tuple in TIME-WAIT gets a larger ISN and timestamp, and the peer
/// takes its SYN (RFC 6191; Linux's `tcp_timewait_state_process`) instead
/// of answering with an ACK that costs a reset and a 1 s retransmission.
///
/// One per process is not enough: a new process's first connections reuse
/// ports an earlier process's connections left in the peer's TIME-WAIT,
/// and with a fresh random key half of them got a smaller ISN and TSval
/// (measured: ~2 % of `ab -n 1000 -c 1` connects under run took 1.0 s).
/// So the key is the host's, like the kernel's: [`host_secret`] keeps it
/// in `/run/nanowire/tcp-secret` (root's, 0600); where that cannot be
/// read or made, the process draws its own and says so once.
fn process_secret() -> io::Result<Secret> {
    static SECRET: OnceLock<Secret> = OnceLock::new();
    if let Some(s) = SECRET.get() {
        return Ok(*s);
    }
    let s = match host_secret(Path::new(HOST_SECRET_DIR)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "nanowire: TCP secret for this process only ({HOST_SECRET_DIR}/tcp-secret: {e}): \
                 a connection on a 4-tuple a peer still holds in TIME-WAIT may wait 1 s"
            );
            Secret::from_os()?
        }
    };
    Ok(*SECRET.get_or_init(|| s))
}

/// Where the host's TCP secret lives (a tmpfs: a new one every boot).
const HOST_SECRET_DIR: &str = "/run/nanowire";

/// The host's TCP secret in `dir`/tcp-secret: read it if it is there and
/// safe (a regular file of 16 bytes, not a symlink, owned by us, mode
/// 0600, in a directory owned by us that nobody else may write), else
/// make it atomically (written to a private temporary file, then linked
/// into place: a racing process either wins or reads the winner's).
fn host_secret(dir: &Path) -> io::Result<Secret> {
    use std::io::{Read, Write};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    let me = rustix::process::geteuid().as_raw();
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let d = std::fs::symlink_metadata(dir)?;
    if !d.is_dir() || d.uid() != me || d.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} is not a directory of ours that only we may write",
            dir.display()
        )));
    }
    let path = dir.join("tcp-secret");
    let read = |path: &Path| -> io::Result<Secret> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let m = f.metadata()?;
        if !m.is_file() || m.uid() != me || m.mode() & 0o077 != 0 || m.len() != 16 {
            return Err(io::Error::other("not a 16-byte 0600 file of ours"));
        }
        let mut b = [0u8; 16];
        f.read_exact(&mut b)?;
        Ok(Secret::from_bytes(b))
    };
    match read(&path) {
        Ok(s) => return Ok(s),
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        got += rustix::rand::getrandom(&mut b[got..], rustix::rand::GetRandomFlags::empty())?;
    }
    let tmp = dir.join(format!("tcp-secret.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(&b)?;
    }
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(Secret::from_bytes(b)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(&path),
        Err(e) => Err(e),
    }
}

/// The clock every stack of the process reads: nanoseconds of
/// CLOCK_MONOTONIC (since boot), so ISNs and timestamps of successive
/// stacks keep increasing. One vDSO read through libc (rustix's own vDSO
/// lookup faults under valgrind: scripts/msgwork.py) and a multiply-add:
/// `Instant::elapsed` against an epoch cost ~100 instructions more per read
/// (timespec subtraction, `Duration` normalisation, a u128 `as_nanos`),
/// two reads per message and side on a ping-pong.
#[inline]
pub(crate) fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: CLOCK_MONOTONIC into a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// (first, last, reserved ranges) of the kernel's ephemeral ports.
type PortRange = (u16, u16, Vec<(u16, u16)>);

/// The kernel's ephemeral port range and reserved ports, read once.
fn port_range() -> &'static PortRange {
    static RANGE: OnceLock<PortRange> = OnceLock::new();
    RANGE.get_or_init(|| {
        let (mut lo, mut hi) = (32768u16, 60999u16);
        if let Ok(s) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") {
            let v: Vec<u16> = s
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if let [a, b] = v[..]
                && a >= 1
                && a <= b
            {
                (lo, hi) = (a, b);
            }
        }
        let mut reserved = Vec::new();
        if let Ok(s) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports") {
            for r in s.trim().split(',').filter(|r| !r.is_empty()) {
                let mut it = r.splitn(2, '-').map(|x| x.trim().parse::<u16>());
                match (it.next(), it.next()) {
                    (Some(Ok(a)), None) => reserved.push((a, a)),
                    (Some(Ok(a)), Some(Ok(b))) => reserved.push((a, b)),
                    _ => {}
                }
            }
        }
        (lo, hi, reserved)
    })
}

/// The ports of `[lo, hi]` of one parity, as (first, count): `half` 0 is
/// the parity opposite to `lo`'s (the one Linux's bind(port 0) prefers),
/// 1 is `lo`'s own (the one Linux's connect() prefers, `__inet_hash_connect`).
fn parity_half(lo: u16, hi: u16, half: usize) -> (u16, u32) {
    let span = u32::from(hi - lo) + 1;
    if half == 0 {
        (lo.wrapping_add(1), span / 2)
    } else {
        (lo, span.div_ceil(2))
    }
}

/// Bind the application's unbound socket `fd` to `src` and an ephemeral
/// port. The kernel's connect() takes ports of the range start's parity
/// first (even ones with the default range), so the peers of this host
/// hold its recent connections in TIME-WAIT on even ports, with ISNs and
/// timestamps of the kernel's clock and secret that ours cannot follow: a
/// SYN of ours on such a 4-tuple is taken for an old duplicate half of the
/// time (answered with an ACK, which costs a reset and a resend). So the
/// engine takes the other parity first, as bind(port 0) does for the same
/// reason, and the kernel's ports only when those are all busy.
///
/// Within a parity, successive connections walk the ports from a random
/// start (as the kernel's per-destination offset does), so a port comes
/// back only after the whole half was used, not at once as bind(port 0)
/// would hand it out again. One bind(2) per try; a port some socket holds
/// (EADDRINUSE) is skipped. Reserved ports (`ip_local_reserved_ports`) are
/// never picked. Returns the port bound, `None` when the range was full
/// and the kernel picked one (bind to port 0).
fn bind_ephemeral(fd: RawFd, src: Ipv4Addr) -> io::Result<Option<u16>> {
    bind_ephemeral_with(src, |sa| {
        // SAFETY: sa is a valid sockaddr_in and the length matches.
        unsafe {
            libc::bind(
                fd,
                (sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
    })
}

/// [`bind_ephemeral`] with the bind call given (`bind(sa)`: 0 or -1 with
/// errno).
fn bind_ephemeral_with(
    src: Ipv4Addr,
    bind_sa: impl Fn(&libc::sockaddr_in) -> i32,
) -> io::Result<Option<u16>> {
    static NEXT: [AtomicU32; 2] = [AtomicU32::new(u32::MAX), AtomicU32::new(u32::MAX)];
    let (lo, hi, reserved) = port_range();
    let bind = |port: u16| -> i32 {
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(src.octets()),
            },
            sin_zero: [0; 8],
        };
        bind_sa(&sa)
    };
    for (half, next) in NEXT.iter().enumerate() {
        let (first, count) = parity_half(*lo, *hi, half);
        if count == 0 {
            continue;
        }
        if next.load(Ordering::Relaxed) == u32::MAX {
            let mut b = [0u8; 4];
            let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
            let _ = next.compare_exchange(
                u32::MAX,
                u32::from_ne_bytes(b) % count,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        for _ in 0..count.min(256) {
            let i = next.fetch_add(1, Ordering::Relaxed) % count;
            let port = first + 2 * i as u16;
            if reserved.iter().any(|&(a, b)| (a..=b).contains(&port)) {
                continue;
            }
            if bind(port) == 0 {
                return Ok(Some(port));
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EADDRINUSE) {
                return Err(e);
            }
        }
    }
    // A crowded range: the kernel's own choice (the caller asks which).
    if bind(0) == 0 {
        Ok(None)
    } else {
        Err(io::Error::last_os_error())
    }
}

use nanowire_xdp::sys::eventfd;

fn eventfd_drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a u64 from an eventfd we keep open.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// Next hops cached per TCP stack: a direct-mapped table (bounded; a
/// collision just looks the neighbour table up again).
const HOP_CACHE: usize = 64;
/// Segments waiting for their next hop's MAC, per stack.
const PARK_MAX: usize = 64;

#[derive(Clone, Copy)]
struct HopSlot {
    dst: Ipv4Addr,
    /// Neighbour generation it was valid in (0: empty).
    generation: u64,
    src: Ipv4Addr,
    mac: [u8; 6],
}

const HOP_EMPTY: HopSlot = HopSlot {
    dst: Ipv4Addr::UNSPECIFIED,
    generation: 0,
    src: Ipv4Addr::UNSPECIFIED,
    mac: [0; 6],
};

#[inline]
fn hop_slot(dst: Ipv4Addr) -> usize {
    (dst.to_bits().wrapping_mul(0x9e37_79b1) >> 26) as usize % HOP_CACHE
}

/// A segment whose next hop the neighbour thread is looking up.
struct Parked {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ttl: u8,
    tos: u8,
    since: u64,
    segment: Vec<u8>,
}

/// What one connection of the shared client stack holds besides its
/// state in the stack: the steering program's claim of its 4-tuple, the
/// demux bind of its local address and, once the application closed it,
/// the kernel socket that keeps its port. Released when the stack
/// forgets the connection.
struct Held {
    local: SocketAddrV4,
    remote: SocketAddrV4,
    keep: Option<OwnedFd>,
    /// Its port is the client port block's (index): nothing to release but
    /// the time its connection ended.
    block: Option<usize>,
    /// Moved here from another process's engine (`move_in`): the service
    /// made the 4-tuple this process's flow claim while the claim that
    /// steered it before (a listener's, a port's) may still stand, so a
    /// hand-over to the kernel passes it rather than dropping the claim.
    moved: bool,
}

struct Core {
    stack: TcpStack,
    id: EndpointId,
    wake_fd: RawFd,
    /// Signalled when a listener's accept queue became non-empty (whoever
    /// turned the engine) while a blocking accept waits on it
    /// (`accept_waiters`).
    accept_fd: OwnedFd,
    /// Blocking accepts of this stack's listeners between
    /// [`XdpTcpListener::accept_waiting`] `true` and `false`: only then is
    /// `accept_fd` written (an event loop's accepts never sleep on it: a
    /// write per new connection that nobody read).
    accept_waiters: u32,
    /// A blocking accept sleeps without the engine's fds because a
    /// connection an application holds was open ([`XdpTcpListener::busy`]):
    /// its user turns the engine and the accept fd is signalled for a new
    /// connection. Cleared, with the accept fd signalled, when no held
    /// connection is left, by whatever route (`TcpEngine::held_may_have_ended`).
    accept_busy: bool,
    /// The slot of the held connection last found (`TcpStack::held_connection`):
    /// the turn's check is one look while it stays held.
    held_hint: usize,
    /// `tcp_accept_late`: connections a waiting blocking accept got late
    /// (the timer service's turn queued them, or the accept found them
    /// after its slice: [`XdpTcpListener::note_late`]).
    accept_late: u64,
    /// Local addresses bound in the demux and claimed in the program.
    listen_claims: Vec<SocketAddrV4>,
    flow_claims: Vec<(SocketAddrV4, SocketAddrV4)>,
    /// 4-tuples handed over to the kernel under a listener the engine
    /// claims (pass entries in the flow map), removed when the kernel's
    /// connection is gone (`sweep_passes`).
    pass_claims: Vec<(SocketAddrV4, SocketAddrV4)>,
    /// When `sweep_passes` may look again (`now_ns`).
    pass_sweep_at: u64,
    /// Kernel sockets holding our ports.
    reservations: Vec<OwnedFd>,
    /// Next hops, the scratch segment, IP ids: what builds frames.
    fr: Framer,
    /// Segments waiting for a next hop (at most PARK_MAX), and the
    /// neighbour generation they were last tried in.
    parked: Vec<Parked>,
    parked_gen: u64,
    /// The process's shared client stack (`TcpEngine::clients`): its
    /// connections' resources are released one by one.
    shared: bool,
    held: Vec<Held>,
    /// The engine's client port block (ports.rs) while this stack is the
    /// shared client stack (given back to the engine when it goes).
    block: super::ports::PortBlock,
    unresolved: u64,
    /// When a turn last ran (`now_ns`): the timer service turns
    /// only engines nobody else turned.
    last_turn: u64,
    /// `last_turn` of the timer service's own last turn (a later
    /// `last_turn` is the application's).
    service_turn: u64,
    /// Stack counters already added to the engine's stats page, and turns
    /// since the last publication.
    published: nanowire_tcp::Counters,
    turns: u32,
    /// The RX path's delivery count when this stack's queue was last
    /// drained (`Engine::rx_mark`): a send takes in first only what came
    /// after it (`TcpEngine::take_input`). `None`: look every time.
    rx_mark: Option<u64>,
    /// The frames of the segments the last data turn took in, on their way
    /// back to the fill ring: handed to the UMEM's recycle list by the next
    /// turn's start ([`TcpEngine::turn_into`]), not by the data turn, so
    /// that the recycle list's lock and the UMEM `Arc`'s release are not
    /// between a segment's arrival and the reader's return. A flush sets
    /// the refill hint, which makes that next turn whole (it polls and
    /// refills): in a ping-pong the first turn of the next wait, after the
    /// reply went out. Bounded: it flushes itself at 64 frames.
    recycle: nanowire_xdp::Recycler,
    /// This stack's region of the process's connection table on the
    /// engine service (issue 24; `None` on an engine of its own): what
    /// would end each connection if the process died, kept current at the
    /// end of each turn (`publish_ends`).
    ends: Option<super::service::conns::Region>,
    /// The send's clock (`XdpTcpStream::send_once`): the TSC extrapolated
    /// from the last clock reading (`super::tsc`).
    tsc: super::tsc::TscClock,
}

/// The TCP stack of one set of sockets on one xdp engine.
pub struct TcpEngine {
    engine: Arc<Engine>,
    core: order::Owned<Core>,
    wait: WaitPolicy,
}

/// On the engine service: write what would end the connections touched
/// since the last turn into the process's connection table (issue 24), so
/// the service can end them as the kernel would if the process dies. Only
/// touched connections, only changed bytes, no system call; nothing at all
/// on an engine of its own or when nothing was touched.
#[inline]
fn publish_ends(core: &mut Core) {
    if !core.stack.has_end_changes() {
        return;
    }
    let Core { stack, ends, .. } = core;
    if let Some(r) = ends.as_mut() {
        r.publish(|f| {
            stack.take_end_changes(|slot, e| f(slot, e.as_ref().map(Into::into)));
        });
    }
}

/// Test hooks (`super::config`): this process ends here as by `kill -9`.
#[cold]
#[inline(never)]
fn test_kill_self(at: &str) {
    eprintln!("nanowire: test hook: SIGKILL {at}");
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
}

/// The engine the last connect that asked the kernel's route used.
static LAST_CLIENT_ENGINE: Mutex<Weak<Engine>> = Mutex::new(Weak::new());

impl TcpEngine {
    /// The stack all client connections of the process on `engine` share
    /// (made on first use): one demux endpoint, one pair of eventfds, one
    /// timer-service entry for all of them, and any thread that turns it
    /// moves every connection (a closing connection's last ACK is taken in
    /// by the next connection's calls, not by the timer service). Each
    /// connection keeps its own buffer sizes (`connect_with`).
    fn clients(engine: &Arc<Engine>, opts: &EngineOptions) -> io::Result<Arc<TcpEngine>> {
        let mut slot = order::lock(
            &engine.tcp_clients,
            Tier::Clients,
            "the shared client stack's slot",
        );
        if let Some(e) = slot.upgrade() {
            return Ok(e);
        }
        let mut base = opts.clone();
        base.rcvbuf = None;
        base.sndbuf = None;
        let cfg = TcpEngine::config(engine, &base);
        let e = TcpEngine::new_with(engine.clone(), opts.wait, cfg, true)?;
        *slot = Arc::downgrade(&e);
        Ok(e)
    }

    fn new(engine: Arc<Engine>, wait: WaitPolicy, cfg: Config) -> io::Result<Arc<TcpEngine>> {
        Self::new_with(engine, wait, cfg, false)
    }

    fn new_with(
        engine: Arc<Engine>,
        wait: WaitPolicy,
        cfg: Config,
        shared: bool,
    ) -> io::Result<Arc<TcpEngine>> {
        // With multi-buffer receive, super-frames arrive as chains (mod.rs).
        // An engine without it (a kernel before 6.6) in generic mode would
        // lose every TSO/GSO/GRO super-frame a kernel peer sends and stall
        // the connection: the TCP socket stays on the kernel instead (the
        // shim says so per socket; counted). Native XDP sees no super-frames.
        if engine.attach_mode() == nanowire_xdp::AttachMode::Skb && !engine.multi_buffer() {
            bump(engine.page.e(E::TcpNoMultiBuffer), 1);
            return Err(io_err(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: generic XDP without multi-buffer AF_XDP (kernel < 6.6?) cannot receive a kernel peer's \
                     TSO/GSO/GRO super-frames; TCP stays on the kernel (NANOWIRE_XDP_MODE=native would take it)",
                    engine.iface().name
                ),
            ));
        }
        let wake = eventfd()?;
        let wake_fd = wake.as_raw_fd();
        let id = engine
            .rx()
            .demux
            .add(EndpointKind::Tcp, wake, super::shm::MAX_SOCKETS)
            .ok_or_else(|| {
                io_err(
                    io::ErrorKind::OutOfMemory,
                    "the xdp engine has no free endpoint",
                )
            })?;
        bump(engine.page.e(E::Sockets), 1);
        let secret = process_secret()?;
        let mut stack = TcpStack::new(cfg, secret);
        // Readiness is asked per connection (`poll_ready`/`poll_ready_edge`):
        // only the listeners' events are used.
        stack.set_conn_events(false);
        let ends = engine.conn_region();
        if ends.is_some() && engine.service_slot.is_none() {
            engine.keep_for_life();
        }
        stack.set_end_tracking(ends.is_some());
        // Send rings in the table's memory: a death delivers their bytes.
        stack.set_send_slabs(ends.as_ref().map(super::service::conns::Region::slabs));
        // The shared client stack takes the engine's port block: its ports
        // come to this endpoint (their claims stayed with the engine).
        let block = if shared {
            let b = std::mem::take(
                &mut *engine
                    .client_ports
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            if let Some(src) = b.src() {
                let mut g = engine.rx();
                for p in b.ports() {
                    g.demux.bind(id, PROTO_TCP, SocketAddrV4::new(src, p));
                }
            }
            b
        } else {
            Default::default()
        };
        let src_mac = engine.iface().mac;
        let eng = Arc::new(TcpEngine {
            engine,
            wait,
            core: order::Owned::new(Core {
                stack,
                id,
                wake_fd,
                accept_fd: eventfd()?,
                accept_waiters: 0,
                accept_busy: false,
                held_hint: usize::MAX,
                accept_late: 0,
                listen_claims: Vec::new(),
                flow_claims: Vec::new(),
                pass_claims: Vec::new(),
                pass_sweep_at: 0,
                reservations: Vec::new(),
                fr: Framer::new(src_mac),
                parked: Vec::new(),
                parked_gen: 0,
                shared,
                held: Vec::new(),
                block,
                unresolved: 0,
                last_turn: 0,
                tsc: Default::default(),
                service_turn: 0,
                published: Default::default(),
                turns: 0,
                rx_mark: None,
                recycle: Default::default(),
                ends,
            }),
        });
        service_register(&eng);
        Ok(eng)
    }

    fn config(engine: &Engine, opts: &EngineOptions) -> Config {
        // One segment per frame: MSS from the MTU, bounded by the frame.
        let mtu = (engine.iface().mtu as usize).min(engine.frame_size() - ETH_HDR);
        let mut cfg = Config {
            mss: Config::mss_for_mtu(mtu as u32),
            // The engine's classifier verified (or recognised as an offload's
            // partial) every segment's checksum already: one pass per segment,
            // which matters for 64 KiB super-segments.
            verify_checksum: false,
            // Where the kernel completes transmitted checksums (AF_XDP TX
            // metadata), segments leave with the pseudo-header's sum only:
            // no pass over the payload here.
            tx_checksum_partial: engine.csum_offload(),
            // A request's ACK waits for the application's turn, which
            // follows the segment's: its response carries the ACK (one
            // kick and one peer receive fewer per request, issue 24).
            quickack_defer_ns: QUICKACK_DEFER_NS,
            ..Config::default()
        };
        // The RTO floor: the options table's `tcp_rto_min_us` row, in the
        // process's engine settings (config.rs; 200 ms when unset).
        if let Some(us) = super::config::config().tcp_rto_min_us {
            cfg.rto_min_ns = us * 1000;
        }
        // Receive buffers grow with the application's reading rate, as
        // Linux's autotuning, unless the application set SO_RCVBUF.
        cfg.rcvbuf_max = nanowire_tcp::RCVBUF_AUTOTUNE_MAX;
        if let Some(b) = opts.rcvbuf {
            cfg.rcvbuf = b.max(4096);
            cfg.rcvbuf_max = 0;
        }
        if let Some(b) = opts.sndbuf {
            cfg.sndbuf = b.max(4096);
        }
        cfg
    }

    fn core(&self) -> order::OwnedGuard<'_, Core> {
        order::lock_owned(&self.core, Tier::Stack, "a TCP stack lock")
    }

    /// Next hop for `dst`: the stack's cache, else the engine's neighbour
    /// table (its lock only; never under the TX lock). Never netlink: a
    /// destination the table does not know is handed to the neighbour
    /// thread ([`super::neigh::Neigh::request`]) and `None` returned.
    fn hop(&self, core: &mut Core, dst: Ipv4Addr) -> Option<(Ipv4Addr, [u8; 6])> {
        let n = &self.engine.neigh;
        let g = n.generation();
        let i = hop_slot(dst);
        let h = core.fr.hops[i];
        if h.dst == dst && h.generation == g {
            return Some((h.src, h.mac));
        }
        match n.lookup(dst) {
            Lookup::Ready(Hop::Xdp { src, mac }) => {
                core.fr.hops[i] = HopSlot {
                    dst,
                    generation: g,
                    src,
                    mac,
                };
                Some((src, mac))
            }
            Lookup::Unknown => {
                n.request(dst);
                None
            }
            _ => None,
        }
    }

    /// Wait until `dst`'s MAC is known (or `timeout`): a connect's first SYN
    /// should not be lost to ARP. Route and neighbour lookups (netlink) run
    /// here, in the caller's thread, with no lock held.
    fn resolve(&self, dst: Ipv4Addr, timeout: Duration) -> io::Result<()> {
        let end = Instant::now() + timeout;
        let n = &self.engine.neigh;
        loop {
            match n.lookup(dst) {
                Lookup::Ready(Hop::Xdp { .. }) => return Ok(()),
                Lookup::Ready(Hop::Kernel) => {
                    return Err(io_err(
                        io::ErrorKind::Unsupported,
                        format!("{dst} is not reached through {}", self.engine.iface().name),
                    ));
                }
                Lookup::Unknown => n.learn(dst)?,
                Lookup::Pending | Lookup::Failed => {}
            }
            if matches!(n.lookup(dst), Lookup::Ready(_)) {
                continue;
            }
            if Instant::now() >= end {
                return Err(io_err(
                    io::ErrorKind::HostUnreachable,
                    format!("no route to host {dst} (neighbour unresolved)"),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Before a caller sleeps on [`TcpEngine::poll_fds`]: whoever queues a
    /// frame for this stack from now on signals its eventfd (whichever
    /// thread polls the rings: another connection's, the timer service).
    /// False if frames are queued already (turn instead of sleeping).
    ///
    /// Every arm that returns true is paired with one
    /// [`TcpEngine::disarm`] when its sleep ends: the endpoint counts the
    /// armed sleepers (threads of this process sleeping on this stack), so
    /// one that wakes cannot take another's wake-up away.
    ///
    /// The eventfd is drained only if it was written since its last drain
    /// (`signalled`), under the RX lock: no push writes it meanwhile
    /// (`sleeping` is false until set here). Not skipped while others
    /// sleep: with 200 threads sleeping on one client engine the eventfd
    /// then stayed readable and every sleeper spun through its poll
    /// (apps_tcp_matrix connections_200_concurrent hung).
    fn arm(&self) -> bool {
        let (id, wake) = {
            let c = self.core();
            (c.id, c.wake_fd)
        };
        let mut g = self.engine.rx();
        match g.demux.get_mut(id) {
            Some(e) => {
                if e.signalled {
                    e.signalled = false;
                    eventfd_drain(wake);
                }
                if e.queue.is_empty() {
                    e.sleepers += 1;
                    e.sleeping = true;
                    true
                } else {
                    false
                }
            }
            None => true,
        }
    }

    /// The sleep an [`TcpEngine::arm`] that returned true armed is over:
    /// this thread is awake and turns the engine itself. The last sleeper
    /// to wake clears `sleeping`, so frames queued from then on need no
    /// signal (before, the sleeper's own turn wrote its own eventfd and its
    /// next arm read it back: two syscalls per wake-up); while another
    /// thread still sleeps on the stack, pushes keep signalling it. A
    /// signal written meanwhile stays `signalled` for a later arm to drain.
    fn disarm(&self) {
        let id = self.core().id;
        if let Some(e) = self.engine.rx().demux.get_mut(id) {
            e.sleepers = e.sleepers.saturating_sub(1);
            if e.sleepers == 0 {
                e.sleeping = false;
            }
        }
    }

    /// One pass: receive, timers, transmit. True if anything moved.
    fn turn(&self, core: &mut Core) -> bool {
        self.turn_with(core, false)
    }

    /// The timer service's turn: the timers run whatever the turn count.
    fn service_turn(&self, core: &mut Core) -> bool {
        let moved = self.turn_with(core, true);
        core.service_turn = core.last_turn;
        moved
    }

    fn turn_with(&self, core: &mut Core, timers: bool) -> bool {
        self.turn_into(core, timers, None, None)
    }

    /// [`TcpEngine::turn_with`] for an application reading `read.conn`:
    /// what arrives in order for it goes straight into its buffer
    /// ([`DirectRead`]) while its receive ring is empty. `clock`: the
    /// monotonic clock as the caller read it a moment ago (a spinning
    /// wait's turn, `XdpTcpStream::recv_once`), taken as the time of the
    /// segments this turn finds instead of reading the clock again.
    fn turn_into(
        &self,
        core: &mut Core,
        timers: bool,
        read: Option<&mut DirectRead<'_>>,
        clock: Option<u64>,
    ) -> bool {
        // The last data turn's frames go back now (`Core::recycle`): the
        // refill hint this sets makes this turn whole, and its poll puts
        // them in the fill ring.
        if !core.recycle.is_empty() {
            core.recycle.flush();
        }
        // A QUIET TURN: an application's idle turn (a spinning reader's
        // look, a readiness pass) while nothing was delivered to any
        // endpoint since this stack's queue was last drained, nothing waits
        // on the RX rings, no segment waits for a next hop and the stack
        // has nothing to send: the receive half would find nothing, so the
        // turn ends here without the RX lock and the poll. It keeps what
        // that poll of an empty ring did for the next segment's latency
        // (`Engine::rx_wait_quiet`, as a UDP receive's quiet turn): the
        // next RX descriptor slot and the predicted next frame are
        // prefetched, and it is not quiet while frames wait to go back to
        // the fill ring, so the last segment's frame is refilled by the
        // first turn of this wait (after the reply went out), not by the
        // poll that finds the next segment (session 14's 709f93b skipped
        // both: p50 1.20x worse, reverted in 30c5640). Every
        // IDLE_CLOCK_EVERY-th turn is whole (the clock and the timers,
        // counters); the timer service's turns are always whole.
        if !timers
            && core.parked.is_empty()
            && !core.turns.wrapping_add(1).is_multiple_of(IDLE_CLOCK_EVERY)
            && !core.stack.wants_transmit()
            && core.rx_mark.is_some_and(|m| self.engine.rx_wait_quiet(m))
        {
            core.turns = core.turns.wrapping_add(1);
            // An application call (a read that emptied the receive ring, a
            // write) may have changed what ends a connection.
            publish_ends(core);
            return false;
        }
        self.turn_rx(core, timers, read, clock, 1)
    }

    /// The rest of [`TcpEngine::turn_into`] from its receive half: up to
    /// `polls` polls of the RX rings under the RX lock, until one finds
    /// something for this stack (a lone spinning reader's idle turns,
    /// [`XdpTcpStream::recv_wait`]: the segment that comes is taken by the
    /// poll that sees it, with both locks already held), then the timers,
    /// the transmit and the ends as a whole turn.
    fn turn_rx(
        &self,
        core: &mut Core,
        timers: bool,
        mut read: Option<&mut DirectRead<'_>>,
        clock: Option<u64>,
        polls: u32,
    ) -> bool {
        // The clock is read only when a segment came, and on every
        // IDLE_CLOCK_EVERY-th idle turn for the timers (ms-scale): a
        // spinning reader turns millions of times a second. A caller that
        // read it a moment ago (`clock`) is not made to read it again.
        let read_clock = move || clock.unwrap_or_else(now_ns);
        let mut now = None;
        let mut moved = 0usize;
        {
            let mut guard = self.engine.rx();
            let g = &mut *guard;
            let (stack, done) = (&mut core.stack, &mut core.recycle);
            for i in 0..polls.max(1) {
                if i > 0 {
                    core::hint::spin_loop();
                }
                let read = read.as_deref_mut();
                moved += rx_segments(g, core.id, stack, done, &mut now, read_clock, read);
                if moved > 0 {
                    break;
                }
            }
            core.rx_mark = self.engine.rx_mark(g);
            core.turns = core.turns.wrapping_add(1);
            if core.turns.is_multiple_of(64) {
                // Under the RX lock: the single writer of these counters.
                publish_counters(&g.page, core);
                set(
                    g.page.e(E::TcpRxHeldFrames),
                    g.held.load(Ordering::Relaxed) as u64,
                );
            }
        }
        let now = match now {
            Some(t) => t,
            None if timers || core.turns.is_multiple_of(IDLE_CLOCK_EVERY) => read_clock(),
            // Segments wait for a next hop that became known: they go now,
            // not on the next turn that happens to read the clock.
            None if self.unpark_due(core) => read_clock(),
            None => {
                // An application call (a read that emptied the receive
                // ring, a write) may have changed what ends a connection.
                publish_ends(core);
                return false;
            }
        };
        core.last_turn = now;
        core.stack.poll_timers(now);
        probe::mark(Mark::TimersRun);
        if !core.parked.is_empty() {
            self.unpark(core, now);
        }
        moved += self.transmit(core, now);
        if core.shared && core.held.len() > core.stack.connection_count() {
            self.reap(core);
        }
        Self::signal_accepts(core, timers);
        Self::held_may_have_ended(core);
        probe::mark(Mark::TurnTail);
        publish_ends(core);
        moved > 0
    }

    /// A blocking accept sleeping without the engine's fds
    /// ([`Core::accept_busy`]) looks again, and sleeps on them, once no
    /// connection an application holds is left to turn the engine, by
    /// whatever route: the application closed it (another thread, while
    /// this one sleeps in accept), it ended (TIME-WAIT, closed, reset), it
    /// left for another process's engine or the kernel (move, hand-over).
    /// Called from each: the end of a turn that took segments or ran the
    /// timers, a close, a move, a hand-over. The fork-per-connection
    /// shape: the parent's accept slept beside the connection its child
    /// was about to take, and the next SYN waited for the timer service's
    /// look (20 ms) or the accept's slice (50 ms): the ~45 ms per
    /// connection of session 25's forkconn bench. One look per call while
    /// the hinted connection stays held.
    fn held_may_have_ended(core: &mut Core) {
        if core.accept_busy && core.accept_waiters > 0 && !Self::holds(core) {
            core.accept_busy = false;
            nanowire_xdp::sys::eventfd_signal(core.accept_fd.as_raw_fd());
        }
    }

    /// Does an application hold a connection of this stack
    /// (`TcpStack::held_connection`, its slot kept as the next look's hint)?
    fn holds(core: &mut Core) -> bool {
        let held = core.stack.held_connection(core.held_hint);
        if let Some(i) = held {
            core.held_hint = i;
        }
        held.is_some()
    }

    /// The stack's readiness events (listeners only, see
    /// `set_conn_events`): an accept queue that became non-empty wakes a
    /// blocking accept.
    /// `service`: the timer service's turn (`tcp_accept_late` when it
    /// finds a connection for a waiting accept).
    fn signal_accepts(core: &mut Core, service: bool) {
        let mut accept = false;
        while let Some(ev) = core.stack.poll_ready() {
            accept |= matches!(ev, nanowire_tcp::Readiness::Listener(_));
        }
        if accept && core.accept_waiters > 0 {
            core.accept_late += u64::from(service);
            nanowire_xdp::sys::eventfd_signal(core.accept_fd.as_raw_fd());
        }
    }

    /// Before a send decides its result: take in what arrived for this
    /// stack since it was last drained, as the kernel has by then (its
    /// softirq takes a segment in when it arrives; the engine only when
    /// somebody turns it). A peer's RST fails the send (EPIPE/ECONNRESET)
    /// instead of the data going out to be answered by another RST, and its
    /// ACKs free room first. Nothing arrived (the common case, e.g. a reply
    /// after the read that took the request in): a few loads, no lock
    /// ([`Engine::rx_quiet`]). No transmit here: the caller's transmit
    /// carries the ACK this input may owe on its data.
    fn take_input(&self, core: &mut Core) {
        if core.rx_mark.is_some_and(|m| self.engine.rx_quiet(m)) {
            return;
        }
        let mut now = None;
        {
            let mut g = self.engine.rx();
            let (stack, done) = (&mut core.stack, &mut core.recycle);
            rx_segments(&mut g, core.id, stack, done, &mut now, now_ns, None);
            core.rx_mark = self.engine.rx_mark(&g);
        }
        if let Some(t) = now {
            core.last_turn = t;
            core.stack.poll_timers(t);
            Self::signal_accepts(core, false);
            Self::held_may_have_ended(core);
        }
    }

    /// Send what the stack has to send: segments are built straight in the
    /// TX ring's frames (one copy of the payload, from the connection's send
    /// ring into the frame, headers written in place), posted in batches of
    /// up to `TX_BATCH` with one kick per batch. A ring or pool that runs
    /// out ends the pass with the rest still queued in the stack (sent on a
    /// later turn, not lost). A segment for a next hop not in the cache
    /// (`hop` takes the neighbour lock, never under the TX lock) is finished
    /// outside the TX lock (`send_scratch_slot0`). With the `faults` option
    /// the transmit device's injector copies the frames (device/faults.rs).
    #[inline]
    fn transmit(&self, core: &mut Core, now: u64) -> usize {
        self.transmit_for(core, now, false)
    }

    /// [`TcpEngine::transmit`]; `send`: for an application's send
    /// (`XdpTcpStream::send_once`; only the test hook tells them apart).
    #[inline]
    fn transmit_for(&self, core: &mut Core, now: u64, send: bool) -> usize {
        // Nothing due (the common case after a received segment whose ACK
        // will ride on the answer, and after a read): a few loads here, no
        // call, no TX lock, no frame, no look at the rings.
        if !core.stack.wants_transmit() {
            return 0;
        }
        self.transmit_some(core, now, send)
    }

    /// [`TcpEngine::transmit`] when the stack has something due.
    #[inline(never)]
    fn transmit_some(&self, core: &mut Core, now: u64, send: bool) -> usize {
        // What the application queued moves the ends before any of it is
        // on the wire: once a segment left, the peer may read it before a
        // publish after the kick, and a kill -9 in between left the end
        // before the sent bytes, a FIN the peer drops as old: a connection
        // never ended (run_fork's prefork kill, 1 in 5-20 runs under load,
        // session 23). Published first, the end is a FIN after the queued
        // bytes, which a death delivers from the send ring's slab, sent or
        // not (`send_owing` notes the end at once; only its timer is owed).
        publish_ends(core);
        probe::mark(Mark::EndsPublished);
        let n = self.transmit_due(core, now);
        if send && n > 0 && super::config::config().test_kill_after_send {
            test_kill_self("after a send's kick");
        }
        if n > 0 {
            // What was just sent moves the connections' ends (the FIN or
            // RST a death would send starts after it): the table must say
            // so before the process can die, not at its next turn. A send
            // that transmits without a turn (send_once), then a kill -9
            // within the timer service's 20 ms, left an end at the old
            // sequence number, which the peer drops as out of window: a
            // connection never ended (engine_service kill_9_ends_a_servers
            // 'did not finish within 60s').
            publish_ends(core);
        }
        n
    }

    /// The batches while the stack has something due (it has on entry:
    /// the caller asked [`TcpStack::wants_transmit`]).
    fn transmit_due(&self, core: &mut Core, now: u64) -> usize {
        let mut total = 0;
        loop {
            let generation = self.engine.neigh.generation();
            // A segment built whose next hop is not cached: it is moved to
            // the scratch and finished outside the TX lock.
            let (n, miss) =
                core.fr
                    .tx_segments(&mut self.engine.tx(), &mut core.stack, generation, now);
            bump(self.engine.page.e(E::TxPackets), n as u64);
            total += n;
            match miss {
                Some(t) => {
                    self.send_scratch_slot0(core, t, now);
                    total += 1;
                }
                None if n < TX_BATCH => return total,
                None => {}
            }
            if !core.stack.wants_transmit() {
                return total;
            }
        }
    }

    /// Slot 0 of the scratch holds a built TCP segment (after the headers)
    /// whose next hop was not cached: look it up (neighbour lock) and post
    /// it, or count it lost like a frame on the wire (TCP retransmits once
    /// the neighbour is known).
    #[cold]
    fn send_scratch_slot0(&self, core: &mut Core, t: nanowire_tcp::Transmit, now: u64) {
        let g0 = self.engine.neigh.generation();
        let Some((_, mac)) = self.hop(core, t.dst) else {
            // The neighbour thread looks the next hop up: the segment waits
            // (bounded), as in the kernel's arp_queue; past the bound it is
            // lost like a frame on the wire and TCP retransmits it.
            self.park(core, &t, HDRS, now, g0);
            // Resolved between the lookup and the park (the resolver saw no
            // parked segment then, see `neighbour_changed`): send it now.
            if self.unpark_due(core) {
                self.unpark(core, now);
            }
            return;
        };
        core.fr.ip_id = core.fr.ip_id.wrapping_add(1);
        let src_mac = self.engine.iface().mac;
        write_hdrs(
            &mut core.fr.scratch[..HDRS],
            mac,
            src_mac,
            &t,
            core.fr.ip_id,
        );
        finish_checksum(&mut core.fr.scratch[HDRS..HDRS + t.len], &t);
        let sent = self.engine.tx().post(&[&core.fr.scratch[..HDRS + t.len]]);
        bump(self.engine.page.e(E::TxPackets), sent as u64);
        if sent == 0 {
            bump(self.engine.page.e(E::DropTxRingFull), 1);
        }
    }

    /// Keep the segment `t` built at `scratch[at..]` until its next hop is
    /// known (at most PARK_MAX per stack); beyond, or when the destination
    /// is not reached through the rings, it is lost like a frame on the
    /// wire (counted) and TCP retransmits it.
    /// `g0`: the neighbour generation read before the failed lookup.
    fn park(&self, core: &mut Core, t: &nanowire_tcp::Transmit, at: usize, now: u64, g0: u64) {
        if core.parked.len() < PARK_MAX
            && !matches!(
                self.engine.neigh.lookup(t.dst),
                Lookup::Ready(Hop::Kernel) | Lookup::Failed
            )
        {
            let mut segment = core.fr.scratch[at..at + t.len].to_vec();
            // Sent later as a finished frame (`post`): checksummed here.
            finish_checksum(&mut segment, t);
            if core.parked.is_empty() {
                // Seen by the resolver before it looks (SeqCst both ways,
                // `neighbour_changed`); the generation read after this
                // (`unpark_due`) catches a change the resolver made before.
                PARKED.fetch_add(1, Ordering::SeqCst);
                core.parked_gen = g0;
            }
            core.parked.push(Parked {
                src: t.src,
                dst: t.dst,
                ttl: t.ttl,
                tos: t.tos,
                since: now,
                segment,
            });
        } else {
            core.unresolved += 1;
            bump(self.engine.page.e(E::DropNeighUnresolved), 1);
        }
    }

    /// Send the parked segments whose next hop became known (the neighbour
    /// generation moved); those still unknown after the kernel's resolution
    /// time are dropped, counted.
    fn unpark(&self, core: &mut Core, now: u64) {
        let g = self.engine.neigh.generation();
        if g == core.parked_gen || core.parked.is_empty() {
            return;
        }
        core.parked_gen = g;
        let timeout = super::neigh::RESOLVE_TIMEOUT.as_nanos() as u64;
        let parked = std::mem::take(&mut core.parked);
        let waited = parked.len();
        let mut frames: Vec<Vec<u8>> = Vec::new();
        for p in parked {
            match self.hop(core, p.dst) {
                Some((_, mac)) => {
                    core.fr.ip_id = core.fr.ip_id.wrapping_add(1);
                    let mut f = vec![0u8; HDRS + p.segment.len()];
                    eth_ipv4(mac, self.engine.iface().mac).emit(&mut f);
                    Ipv4Repr {
                        src: p.src,
                        dst: p.dst,
                        protocol: PROTO_TCP,
                        payload_len: p.segment.len(),
                        ttl: p.ttl,
                        ident: core.fr.ip_id,
                    }
                    .emit_tos(&mut f[ETH_HDR..], p.tos);
                    f[HDRS..].copy_from_slice(&p.segment);
                    frames.push(f);
                }
                None if now.saturating_sub(p.since) < timeout
                    && !matches!(
                        self.engine.neigh.lookup(p.dst),
                        Lookup::Ready(Hop::Kernel) | Lookup::Failed
                    ) =>
                {
                    core.parked.push(p)
                }
                None => {
                    core.unresolved += 1;
                    bump(self.engine.page.e(E::DropNeighUnresolved), 1);
                }
            }
        }
        if core.parked.is_empty() {
            PARKED.fetch_sub(1, Ordering::SeqCst);
        }
        debug_assert!(frames.len() <= waited);
        if frames.is_empty() {
            return;
        }
        bump(self.engine.page.e(E::NeighUnparked), frames.len() as u64);
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let sent = self.engine.tx().post(&refs);
        bump(self.engine.page.e(E::TxPackets), sent as u64);
        if sent < refs.len() {
            bump(
                self.engine.page.e(E::DropTxRingFull),
                (refs.len() - sent) as u64,
            );
        }
    }

    /// Segments are parked and the neighbour table changed since they were
    /// last tried (one load when nothing is parked: the common case).
    #[inline]
    fn unpark_due(&self, core: &Core) -> bool {
        !core.parked.is_empty() && self.engine.neigh.generation() != core.parked_gen
    }

    /// Release what the shared client stack's finished connections held
    /// (claims, binds, port reservations): the stack forgot them.
    fn reap(&self, core: &mut Core) {
        // One demux lookup per held entry (not a walk of the stack's whole
        // preallocated map and a set of it, once per closed connection).
        let stack = &core.stack;
        let mut gone: Vec<Held> = core
            .held
            .extract_if(.., |h| {
                !stack.has_tuple(&nanowire_tcp::FourTuple {
                    local: h.local,
                    remote: h.remote,
                })
            })
            .collect();
        if gone.is_empty() {
            return;
        }
        if gone.iter().any(|h| h.block.is_some()) {
            let now = now_ns();
            for i in gone.iter().filter_map(|h| h.block) {
                core.block.ended(i, now);
            }
        }
        if gone.iter().all(|h| h.block.is_some()) {
            // Block ports: their claims and demux binds stay.
            return;
        }
        if self.engine.is_own() {
            // With the kernel socket holding each port: it closes after the
            // claim is gone (on the engine service, later: a turn never
            // waits for the service).
            let mut ended = Vec::new();
            for h in gone.iter_mut().filter(|h| h.block.is_none()) {
                if let Some(i) = core
                    .flow_claims
                    .iter()
                    .position(|&(a, b)| a == h.local && b == h.remote)
                {
                    core.flow_claims.swap_remove(i);
                    ended.push((h.local, h.remote, h.keep.take()));
                }
            }
            self.engine.release_flows(ended);
        }
        {
            let mut g = self.engine.rx();
            for h in gone.iter().filter(|h| h.block.is_none()) {
                g.demux
                    .set_flow(core.id, PROTO_TCP, (h.local, h.remote), false);
                if !core.held.iter().any(|k| k.local == h.local) {
                    g.demux.unbind(core.id, PROTO_TCP, h.local);
                }
            }
        }
        // The reservations close here (their ports go back to the kernel).
        drop(gone);
    }

    /// Run `f` until it yields, turning the engine and waiting per policy.
    fn until<T>(
        &self,
        deadline: Option<Instant>,
        mut f: impl FnMut(&mut TcpStack) -> Option<T>,
    ) -> Option<T> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            {
                let mut c = self.core();
                let moved = self.turn(&mut c);
                if let Some(v) = f(&mut c.stack) {
                    // Flush what the call queued (data, ACK, window update).
                    let now = now_ns();
                    self.transmit(&mut c, now);
                    publish_ends(&mut c);
                    return Some(v);
                }
                if moved {
                    spins = 0;
                    continue;
                }
            }
            spins = spins.wrapping_add(1);
            // A caller with a deadline (a poll: `accept(Some(now))`) gets its
            // answer after one idle turn, not after a burst of spins.
            if !spins.is_multiple_of(64) && deadline.is_none() {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return None;
            }
            let sleep = match self.wait {
                WaitPolicy::Spin => false,
                WaitPolicy::Block => true,
                WaitPolicy::SpinThenBlock(d) => now.duration_since(start) >= d,
            };
            if sleep {
                self.sleep(deadline);
            }
        }
    }

    fn sleep(&self, deadline: Option<Instant>) {
        let (wake, next) = {
            let c = self.core();
            let now = now_ns();
            let next = c
                .stack
                .next_deadline()
                .map(|t| Duration::from_nanos(t.saturating_sub(now)));
            (c.wake_fd, next)
        };
        let mut ms = super::MAX_SLEEP_MS;
        if let Some(n) = next {
            ms = ms.min(n.as_millis() as i32);
        }
        if let Some(d) = deadline {
            ms = ms.min(d.saturating_duration_since(Instant::now()).as_millis() as i32);
        }
        let ms = ms.max(1);
        if self.arm() {
            self.engine.wait_fds(&[wake], ms);
            self.disarm();
        }
    }

    /// `sock`: the listening kernel socket holding the port (the engine
    /// service checks it).
    fn claim_listener(&self, core: &mut Core, local: SocketAddrV4, sock: RawFd) -> io::Result<()> {
        self.claim_listener_as(core, local, sock, false)
    }

    /// `join`: the listener's claim is another process's (fork) and this
    /// engine joins its group on the engine service.
    fn claim_listener_as(
        &self,
        core: &mut Core,
        local: SocketAddrV4,
        sock: RawFd,
        join: bool,
    ) -> io::Result<()> {
        let addrs: Vec<Ipv4Addr> = if local.ip().is_unspecified() {
            let own = self.engine.rx().own.clone();
            if own.is_empty() {
                self.engine.iface().addr.into_iter().collect()
            } else {
                own
            }
        } else {
            vec![*local.ip()]
        };
        self.engine.rx().demux.bind(core.id, PROTO_TCP, local);
        let mut p = self.engine.prog();
        for a in addrs {
            if join {
                p.prog.join_tcp_listener(a, local.port(), sock)
            } else {
                p.prog.claim_tcp_listener(a, local.port(), sock)
            }
            .map_err(|e| io_err(io::ErrorKind::Other, e))?;
            core.listen_claims.push(SocketAddrV4::new(a, local.port()));
        }
        Ok(())
    }

    /// `sock`: the kernel socket holding `local`'s port (the engine
    /// service checks it).
    fn claim_flow(
        &self,
        core: &mut Core,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        sock: RawFd,
    ) -> io::Result<()> {
        self.steer_flow(local, remote, sock)?;
        self.flow_claimed(core, local, remote);
        Ok(())
    }

    /// The steering half of [`TcpEngine::claim_flow`] (no stack lock
    /// needed: on the engine service a round trip under the control lock).
    fn steer_flow(&self, local: SocketAddrV4, remote: SocketAddrV4, sock: RawFd) -> io::Result<()> {
        self.engine
            .prog()
            .prog
            .claim_tcp_flow(local, remote, Some(sock))
            .map_err(|e| io_err(io::ErrorKind::Other, e))
    }

    /// The stack's half of [`TcpEngine::claim_flow`]: the demux takes the
    /// local address, the claim is remembered (released with the
    /// connection).
    fn flow_claimed(&self, core: &mut Core, local: SocketAddrV4, remote: SocketAddrV4) {
        let mut g = self.engine.rx();
        g.demux.bind(core.id, PROTO_TCP, local);
        // Ahead of a listener of this process bound on `local` (a
        // connection it accepted, moved away and back, or exec'd in).
        g.demux.set_flow(core.id, PROTO_TCP, (local, remote), true);
        drop(g);
        core.flow_claims.push((local, remote));
    }

    /// A port of the client port block (ports.rs) for a connect from `src`
    /// to `remote` (index): a free one, else a new one while the block is
    /// below its size, else any free one. `None`: the caller binds a port
    /// for this connection alone, as without a block.
    fn block_port(&self, core: &mut Core, src: Ipv4Addr, remote: SocketAddrV4) -> Option<usize> {
        if !core.shared || !core.block.serves(src) {
            return None;
        }
        let now = now_ns();
        if core.block.len() >= super::ports::MAX_PORTS && core.block.known_miss(remote, now) {
            // Every port's 4-tuple to this peer was taken a moment ago and
            // none has been given back since: no look at each again.
            return None;
        }
        let Core { stack, block, .. } = &mut *core;
        let free = |p: u16| {
            !stack.has_tuple(&nanowire_tcp::FourTuple {
                local: SocketAddrV4::new(src, p),
                remote,
            })
        };
        if let Some(i) = block.pick(now, false, free) {
            return Some(i);
        }
        if core.block.len() < super::ports::MAX_PORTS {
            match self.grow_block(core, src) {
                Ok(i) => return Some(i),
                Err(e) => {
                    core.block.turn_off();
                    eprintln!(
                        "nanowire: tcp client port block stopped at {} port(s) ({e}); connects bind a port each",
                        core.block.len()
                    );
                }
            }
        }
        let Core { stack, block, .. } = &mut *core;
        let found = block.pick(now, true, |p: u16| {
            !stack.has_tuple(&nanowire_tcp::FourTuple {
                local: SocketAddrV4::new(src, p),
                remote,
            })
        });
        if found.is_none() {
            block.note_miss(remote);
        }
        found
    }

    /// One more port for the block: the engine's own socket (raw calls,
    /// above the program's fd numbers) bound to `src` and an ephemeral port
    /// without SO_REUSEADDR, claimed whole and bound in the demux.
    fn grow_block(&self, core: &mut Core, src: Ipv4Addr) -> io::Result<usize> {
        use nanowire_xdp::sys;
        let fd = sys::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = sys::raw_above_floor(fd);
        let bound = bind_ephemeral_with(src, |sa| {
            // SAFETY: sa is a valid sockaddr_in and the length matches.
            unsafe {
                sys::bind(
                    fd,
                    (sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        });
        let port = match bound {
            Ok(Some(p)) => Ok(p),
            Ok(None) => sock_local(fd).map(|a| a.port()),
            Err(e) => Err(e),
        };
        let claimed = port.and_then(|port| {
            self.engine
                .prog()
                .prog
                .claim_client_port(src, port, fd)
                .map(|()| port)
                .map_err(|e| io_err(io::ErrorKind::Other, e))
        });
        let port = match claimed {
            Ok(p) => p,
            Err(e) => {
                sys::close(fd);
                return Err(e);
            }
        };
        self.engine
            .rx()
            .demux
            .bind(core.id, PROTO_TCP, SocketAddrV4::new(src, port));
        Ok(core.block.push(src, port, fd))
    }
}

impl Drop for TcpEngine {
    fn drop(&mut self) {
        if !self.engine.is_own() {
            return;
        }
        let c = self.core.get_mut();
        if c.shared && c.block.len() > 0 {
            // The block outlives this stack (its claims stay; the demux
            // endpoint's binds go below): the next client stack takes it.
            let b = std::mem::take(&mut c.block);
            self.engine
                .client_ports
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .absorb(b);
        }
        // The flows first (on the engine service queued, and sent before
        // the listeners' requests by whoever takes the control lock).
        // On the engine service the passes stay until the kernel's
        // connection is done (the service sweeps them): a connection moved
        // here and handed over may be the only thing between a listener's
        // pin and the kernel's segments.
        let passes: &[_] = if self.engine.on_service() {
            &[]
        } else {
            &c.pass_claims
        };
        let flows = c.flow_claims.iter().chain(passes);
        self.engine
            .release_flows(flows.map(|&(l, r)| (l, r, None)).collect::<Vec<_>>());
        if !c.listen_claims.is_empty() {
            let mut p = self.engine.prog();
            for a in &c.listen_claims {
                p.prog.unclaim_tcp_listener(*a.ip(), a.port());
            }
        }
        let mut g = self.engine.rx();
        publish_counters(&self.engine.page, c);
        g.demux.remove(c.id);
        bump(self.engine.page.e(E::Sockets), 0);
    }
}

/// Add what this stack counted since the last call to the engine's stats
/// page (`nanowire stats`: the `tcp_*` counters, summed over every TCP stack
/// of the engine). Call with the engine's RX lock held (single writer).
fn publish_counters(page: &super::shm::StatsPage, core: &mut Core) {
    let c = core.stack.counters();
    // The engine table's `tcp_*` rows name the fields they publish.
    super::shm::publish_tcp(page, c, &core.published);
    core.published = c.clone();
    super::shm::set(page.e(E::TcpAcceptLate), core.accept_late);
    // The engine's table counts for all its stacks: its totals.
    for (why, n) in core.ends.iter().flat_map(|r| r.slab_misses()) {
        super::shm::set(page.e(E::slab_miss(why)), n);
    }
}

/// A listening TCP socket on the xdp engine.
pub struct XdpTcpListener {
    eng: Arc<TcpEngine>,
    l: ListenerId,
    local: SocketAddrV4,
    /// Not accepting (issue 24: a fork's parent sharing the listener with
    /// its workers through the engine service): a duplicate of the
    /// listening socket to join its group again with at the next accept or
    /// readiness look ([`XdpTcpListener::stop_accepting`]); -1: accepting.
    idle: AtomicI32,
}

impl XdpTcpListener {
    /// Listen on `local` (port 0 is not supported: the port must be known to
    /// claim it). The kernel keeps a listening socket on the port so it is
    /// never handed out; the steering program takes every segment for it.
    pub fn bind(
        local: SocketAddrV4,
        backlog: usize,
        opts: &EngineOptions,
    ) -> io::Result<XdpTcpListener> {
        off_loopback(&[*local.ip()])?;
        let engine = super::socket::engine_for(*local.ip(), opts).map_err(open_err)?;
        let cfg = TcpEngine::config(&engine, opts);
        let (fd, got) = reserve(local, true)?;
        let eng = TcpEngine::new(engine, opts.wait, cfg)?;
        let l = {
            let mut c = eng.core();
            let raw = fd.as_raw_fd();
            c.reservations.push(fd);
            eng.claim_listener(&mut c, got, raw)?;
            let so = SocketOptions::from_config(c.stack.config());
            c.stack
                .listen_with(got, backlog.max(1), so)
                .map_err(tcp_err)?
        };
        Ok(XdpTcpListener {
            eng,
            l,
            local: got,
            idle: AtomicI32::new(-1),
        })
    }

    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    /// The next connection, or `Ok(None)` at the deadline.
    pub fn accept(&self, deadline: Option<Instant>) -> io::Result<Option<XdpTcpStream>> {
        let l = self.l;
        Ok(self
            .eng
            .until(deadline, |s| s.accept(l))
            .map(|c| XdpTcpStream::opened(self.eng.clone(), c)))
    }

    /// Counters of this listener's stack (all its connections).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.eng.core().stack.counters().iter().collect()
    }
}

/// A spinning reader's look at its stack without the stack's lock
/// ([`XdpTcpStream::recv_wait`] makes it when it finds nothing,
/// [`XdpTcpStream::coast`] answers from it): the engine's delivery count
/// as the attempt's turn left it, and the idle turns it may still answer.
#[derive(Debug, Clone, Copy)]
pub struct TcpIdle {
    mark: u64,
    left: u32,
}

/// A TCP connection on the xdp engine.
pub struct XdpTcpStream {
    eng: Arc<TcpEngine>,
    c: ConnId,
    /// The application's kernel socket holds the connection's port (a
    /// connect that bound it, an accept's listener holds it anyway): not
    /// for a port of the client port block.
    port_in_fd: bool,
}

impl XdpTcpStream {
    /// The application's handle of connection `c` (made by connect or
    /// accept): the timer service, asleep for long if it saw no open
    /// connection, now looks at the engine every `SERVICE_RX_NS`.
    fn opened(eng: Arc<TcpEngine>, c: ConnId) -> XdpTcpStream {
        service_nudge();
        XdpTcpStream {
            eng,
            c,
            port_in_fd: true,
        }
    }

    /// On the engine service (a forked child holding a copy could take it
    /// onto its own engine: [`XdpTcpStream::move_out`]).
    pub fn on_service(&self) -> bool {
        self.eng.engine.on_service()
    }

    /// Must the application's kernel socket be kept after its close until
    /// the connection is finished ([`XdpTcpStream::close_keep`])? Not when
    /// the port is the client port block's (connect_adopt).
    pub fn port_in_fd(&self) -> bool {
        self.port_in_fd
    }
}

impl XdpTcpStream {
    /// Connect to `remote` from an ephemeral port the kernel reserves for us.
    pub fn connect(
        remote: SocketAddrV4,
        opts: &EngineOptions,
        timeout: Duration,
    ) -> io::Result<XdpTcpStream> {
        // The route to the peer gives the source address, and so the interface.
        let route = nanowire_xdp::netlink::route_get(*remote.ip())?;
        if route.kind == nanowire_xdp::netlink::RTN_LOCAL {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                format!("{} is local: loopback TCP stays on the kernel", remote.ip()),
            ));
        }
        let hint = route.prefsrc.unwrap_or(Ipv4Addr::UNSPECIFIED);
        let engine = super::socket::engine_for(hint, opts).map_err(open_err)?;
        let cfg = TcpEngine::config(&engine, opts);
        let src = route.prefsrc.or(engine.iface().addr).ok_or_else(|| {
            io_err(
                io::ErrorKind::AddrNotAvailable,
                "the interface has no IPv4 address",
            )
        })?;
        let (fd, local) = reserve(SocketAddrV4::new(src, 0), false)?;
        let eng = TcpEngine::new(engine, opts.wait, cfg)?;
        eng.resolve(*remote.ip(), timeout)?;
        let c = {
            let mut core = eng.core();
            let raw = fd.as_raw_fd();
            core.reservations.push(fd);
            eng.claim_flow(&mut core, local, remote, raw)?;
            let now = now_ns();
            core.stack.connect(now, local, remote).map_err(tcp_err)?
        };
        let end = Instant::now() + timeout;
        let r = eng.until(Some(end), |s| match s.state(c) {
            Ok(State::SynSent) => None,
            Ok(_) => Some(s.error(c)),
            Err(e) => Some(Some(e)),
        });
        match r {
            Some(None) => Ok(XdpTcpStream::opened(eng, c)),
            Some(Some(e)) => Err(tcp_err(e)),
            None => Err(io_err(
                io::ErrorKind::TimedOut,
                format!("connect to {remote} timed out"),
            )),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddrV4> {
        self.eng.core().stack.local_addr(self.c).map_err(tcp_err)
    }
    pub fn peer_addr(&self) -> io::Result<SocketAddrV4> {
        self.eng.core().stack.peer_addr(self.c).map_err(tcp_err)
    }
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.eng
            .core()
            .stack
            .set_nodelay(self.c, on)
            .map_err(tcp_err)
    }
    /// IP_TTL / IP_TOS of this connection's segments from now on.
    pub fn set_ip_header(&self, ttl: u8, tos: u8) -> io::Result<()> {
        self.eng
            .core()
            .stack
            .set_ip_header(self.c, ttl, tos)
            .map_err(tcp_err)
    }
    pub fn set_quickack(&self, on: bool) -> io::Result<()> {
        self.eng
            .core()
            .stack
            .set_quickack(self.c, on)
            .map_err(tcp_err)
    }
    pub fn info(&self) -> io::Result<TcpInfo> {
        self.eng.core().stack.info(self.c).map_err(tcp_err)
    }

    /// This connection's stack counters (retransmissions, drops by reason).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.eng.core().stack.counters().iter().collect()
    }

    /// The engine's counters (the stats page: drops by reason, injected
    /// faults, the engine's summed `tcp_*`).
    pub fn engine_counters(&self) -> Vec<(&'static str, u64)> {
        self.eng.engine.counters()
    }

    /// Read at least one byte (0 = end of file); `Ok(None)` at the deadline.
    pub fn read(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<Option<usize>> {
        let c = self.c;
        match self.eng.until(deadline, |s| match s.recv(c, buf) {
            Err(TcpError::WouldBlock) => None,
            r => Some(r),
        }) {
            None => Ok(None),
            Some(Ok(n)) => Ok(Some(n)),
            Some(Err(e)) => Err(tcp_err(e)),
        }
    }

    /// Read what is there without waiting (one engine turn).
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut core = self.eng.core();
        self.eng.turn(&mut core);
        let r = core.stack.recv(self.c, buf);
        if r != Err(TcpError::WouldBlock) {
            // Reading may open the window: announce it now.
            let now = now_ns();
            self.eng.transmit(&mut core, now);
        }
        match r {
            Ok(n) => Ok(Some(n)),
            Err(TcpError::WouldBlock) => Ok(None),
            Err(e) => Err(tcp_err(e)),
        }
    }

    /// Write all of `data`, waiting while the send buffer is full.
    pub fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        let c = self.c;
        if !data.is_empty() {
            // Latency first: what fits leaves before any receive work
            // beyond what already arrived (`send_once` takes that in
            // first, then turns only when the send buffer is full).
            match self.send_once(data) {
                Ok(n) => data = &data[n..],
                Err(TcpError::WouldBlock) => {}
                Err(e) => return Err(tcp_err(e)),
            }
        }
        while !data.is_empty() {
            let n = self
                .eng
                .until(None, |s| match s.send(c, data) {
                    Err(TcpError::WouldBlock) => None,
                    r => Some(r),
                })
                .unwrap_or(Ok(0))
                .map_err(tcp_err)?;
            data = &data[n..];
        }
        Ok(())
    }

    /// shutdown(SHUT_WR).
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        let mut core = self.eng.core();
        core.stack.shutdown_write(self.c).map_err(tcp_err)?;
        let now = now_ns();
        self.eng.transmit(&mut core, now);
        Ok(())
    }
}

impl XdpTcpStream {
    /// The connection's state for another owner, after one turn takes in
    /// what arrived (`what` it qualifies for, for the error).
    fn export(&self, core: &mut Core, what: &str) -> io::Result<(Handover, u64)> {
        self.eng.turn(core);
        let now = now_ns();
        let h = core.stack.hand_over_state(now, self.c).map_err(|e| {
            let state = core.stack.state(self.c).map_or("closed", |s| s.as_str());
            io_err(
                io::ErrorKind::NotConnected,
                format!("only an established connection {what} (it is {state}: {e:?})"),
            )
        })?;
        Ok((h, now))
    }

    /// The connection went to another owner (the kernel, another
    /// process): its demux flow goes, the stack forgets it without a word,
    /// and a call asleep on it (another thread's recv or send) wakes and
    /// finds it gone (`InvalidHandle`).
    fn forget_gone(&self, core: &mut Core, now: u64, (l, r): (SocketAddrV4, SocketAddrV4)) {
        let id = core.id;
        self.eng
            .engine
            .rx()
            .demux
            .set_flow(id, PROTO_TCP, (l, r), false);
        let _ = core.stack.hand_over_done(now, self.c);
        self.eng.engine.rx().demux.wake_sleepers(id);
        TcpEngine::held_may_have_ended(core);
    }

    /// Hand the connection over to another owner (the kernel, through
    /// TCP_REPAIR). Under the engine's lock, so nothing moves meanwhile:
    /// one turn takes in what arrived, `build` makes the new owner from the
    /// state (only an ESTABLISHED connection without FIN qualifies), then
    /// the steering program stops taking the 4-tuple (its claim goes, or,
    /// under a listener the engine still claims, the 4-tuple is passed to
    /// the kernel) and the engine forgets the connection without sending
    /// anything. Segments still on the ring are dropped and counted
    /// (`tcp_handover_drops`); the peer retransmits them to the new owner.
    /// On any error nothing changed and the connection stays here.
    pub fn hand_over<T>(&self, build: impl FnOnce(&Handover) -> io::Result<T>) -> io::Result<T> {
        if !self.eng.engine.is_own() {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                "the steering program belongs to another process",
            ));
        }
        let mut core = self.eng.core();
        let (h, now) = self.export(&mut core, "can be handed over")?;
        let t = build(&h)?;
        let (l, r) = (h.tuple.local, h.tuple.remote);
        if self.eng.engine.service_lost() {
            // The engine service and its program are gone: every segment
            // of the 4-tuple reaches the kernel already; nothing to steer.
            core.held.retain(|h| !(h.local == l && h.remote == r));
            core.flow_claims.retain(|&(a, b)| !(a == l && b == r));
        } else {
            let mut p = self.eng.engine.prog();
            let held = core.held.iter().find(|h| h.local == l && h.remote == r);
            let moved = held.is_some_and(|h| h.moved);
            if let Some(i) = held.and_then(|h| h.block) {
                // The kernel's connection holds a 4-tuple of that port now.
                core.block.retire(i);
            }
            core.held.retain(|h| !(h.local == l && h.remote == r));
            let flow = core.flow_claims.iter().position(|&(a, b)| a == l && b == r);
            if let Some(i) = flow.filter(|_| !moved) {
                core.flow_claims.swap_remove(i);
                p.prog.unclaim_tcp_flow(l, r);
            } else {
                if let Some(i) = flow {
                    // Moved here: the claim is passed (below), not dropped.
                    core.flow_claims.swap_remove(i);
                }
                p.prog
                    .pass_tcp_flow(l, r)
                    .map_err(|e| io_err(io::ErrorKind::Other, e))?;
                // Removed when the kernel's connection is gone (the timer
                // service's `sweep_passes`), or with the engine.
                core.pass_claims.push((l, r));
            }
        }
        self.forget_gone(&mut core, now, (l, r));
        Ok(t)
    }
}

/// This process's engine that can take a connection moved to it
/// ([`XdpTcpStream::can_take`], [`XdpTcpStream::move_in`]).
pub struct Taker(Arc<TcpEngine>);

/// A connection [`XdpTcpStream::move_out`] took off this engine and offered
/// to another process: its exported state, and what to restore here if the
/// other process never takes it ([`XdpTcpStream::move_back`]).
pub struct MovedOut {
    /// `Handover::to_bytes` of the connection's state.
    pub bytes: Vec<u8>,
    /// It was this engine's flow claim (else its listener's or port's).
    flow: bool,
}

impl XdpTcpStream {
    /// Move the connection to another process of the engine service that
    /// holds its socket `sock` (a forked child's copy of the same open
    /// file; issue 24 item 1). Under the engine's lock, as
    /// [`XdpTcpStream::hand_over`]: one turn takes in what arrived, the
    /// state is exported (ESTABLISHED or CLOSE-WAIT), the service is
    /// *offered* the 4-tuple with the socket (`K_TCP_MOVE`; it keeps
    /// steering here until the other process takes it), and the engine
    /// forgets the connection without sending anything; segments that
    /// reach it until the take are dropped and counted
    /// (`tcp_handover_drops`), the peer retransmits them to the taker. On
    /// any error nothing changed. The taker calls [`XdpTcpStream::move_in`]
    /// with the bytes; if it never does, [`XdpTcpStream::move_back`] takes
    /// the connection back here.
    pub fn move_out(&self, sock: RawFd) -> io::Result<MovedOut> {
        if !self.eng.engine.is_own() || !self.eng.engine.on_service() {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                "only a connection on this process's engine service client moves",
            ));
        }
        let mut core = self.eng.core();
        let (h, now) = self.export(&mut core, "moves")?;
        let (l, r) = (h.tuple.local, h.tuple.remote);
        self.eng
            .engine
            .prog()
            .prog
            .move_tcp_flow(false, l, r, sock)
            .map_err(|e| io_err(io::ErrorKind::Other, e))?;
        if let Some(i) = core
            .held
            .iter()
            .find(|h| h.local == l && h.remote == r)
            .and_then(|h| h.block)
        {
            // The 4-tuple is the taker's now: this port is never given again.
            core.block.retire(i);
        }
        core.held.retain(|h| !(h.local == l && h.remote == r));
        let flow = match core.flow_claims.iter().position(|&(a, b)| a == l && b == r) {
            Some(i) => {
                // The service gives the claim to the taker with the move.
                core.flow_claims.swap_remove(i);
                true
            }
            None => false,
        };
        self.forget_gone(&mut core, now, (l, r));
        Ok(MovedOut {
            bytes: h.to_bytes(),
            flow,
        })
    }

    /// The connection [`XdpTcpStream::move_out`] offered was not taken (the
    /// other process could not, or died first): this engine takes it back
    /// from its own export (the service still steers it here). A new
    /// handle; `self` stays forgotten.
    pub fn move_back(&self, m: &MovedOut) -> io::Result<XdpTcpStream> {
        let h = Handover::from_bytes(&m.bytes)
            .ok_or_else(|| io_err(io::ErrorKind::InvalidData, "not a moved connection's state"))?;
        let mut core = self.eng.core();
        let now = now_ns();
        let c = core.stack.adopt_state(now, &h).map_err(tcp_err)?;
        let (l, r) = (h.tuple.local, h.tuple.remote);
        if m.flow {
            self.eng.flow_claimed(&mut core, l, r);
        }
        core.held.push(Held {
            local: l,
            remote: r,
            keep: None,
            block: None,
            moved: false,
        });
        self.eng.transmit(&mut core, now);
        drop(core);
        let mut s = XdpTcpStream::opened(self.eng.clone(), c);
        s.port_in_fd = self.port_in_fd;
        Ok(s)
    }

    /// Could this process take over the connection (local, remote) from
    /// another process ([`XdpTcpStream::move_in`])? Its engine on the
    /// engine service is made (or found) and the peer's address resolved,
    /// so a process that cannot (no process slot on the service) does not
    /// ask for a move it would refuse. The returned [`Taker`] holds that
    /// engine for [`XdpTcpStream::move_in`].
    pub fn can_take(
        local: SocketAddrV4,
        remote: SocketAddrV4,
        opts: &EngineOptions,
    ) -> io::Result<Taker> {
        let (engine, _) = Self::routed(remote, local, opts)?;
        if !engine.on_service() {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                "this process's engine is not on the engine service",
            ));
        }
        let eng = TcpEngine::clients(&engine, opts)?;
        eng.resolve(*remote.ip(), Duration::from_secs(3))?;
        Ok(Taker(eng))
    }

    /// Take over a connection another process of the engine service moved
    /// out ([`XdpTcpStream::move_out`]'s bytes), through `sock`, this
    /// process's copy of its socket: the shared client stack of the
    /// interface adopts the state (same sequence numbers, queues, RTT,
    /// window, options), then the service steers the 4-tuple here
    /// (`K_TCP_MOVE` take; the stack's lock is held across both, so no
    /// segment meets the stack before the connection). On an error nothing
    /// is steered here (the offerer may take it back).
    pub fn move_in(sock: RawFd, bytes: &[u8], taker: Taker) -> io::Result<XdpTcpStream> {
        let h = Handover::from_bytes(bytes)
            .ok_or_else(|| io_err(io::ErrorKind::InvalidData, "not a moved connection's state"))?;
        let (l, r) = (h.tuple.local, h.tuple.remote);
        let eng = taker.0;
        if super::config::config().test_kill_in_move {
            test_kill_self("in a move, before the take");
        }
        let mut core = eng.core();
        let now = now_ns();
        let c = core.stack.adopt_state(now, &h).map_err(tcp_err)?;
        if let Err(e) = eng.engine.prog().prog.move_tcp_flow(true, l, r, sock) {
            // Not steered here: the stack forgets it without a word.
            let _ = core.stack.hand_over_done(now, c);
            return Err(io_err(io::ErrorKind::Other, e));
        }
        eng.flow_claimed(&mut core, l, r);
        core.held.push(Held {
            local: l,
            remote: r,
            keep: None,
            block: None,
            moved: true,
        });
        eng.transmit(&mut core, now);
        drop(core);
        let mut s = XdpTcpStream::opened(eng, c);
        s.port_in_fd = false;
        Ok(s)
    }
}

impl XdpTcpStream {
    /// Take over the connection the kernel carries on the socket `fd`, a
    /// connection this program inherited as the kernel's (issue 24 item 2:
    /// its old image handed it over at exec). Under the stack's lock, so
    /// nothing the steering sends here meets the stack before the
    /// connection does: the 4-tuple is claimed (on the engine service by
    /// showing `fd`, the kernel connection itself), then `dump` reads the
    /// kernel's state (TCP_REPAIR: the caller puts the socket in repair
    /// mode, silent from then on; it waits out segments that passed the
    /// program before the claim and reach the kernel socket late) and the shared
    /// client stack adopts it (same sequence numbers, queues, windows,
    /// options, RTT). An ACK goes out at once. On any error the claim is
    /// released and the kernel keeps the connection (the caller takes its
    /// socket out of repair mode); segments of the 4-tuple that reached
    /// the engine meanwhile are dropped and counted, never answered (the
    /// peer retransmits them to the kernel). `taker`: the engine to take
    /// it onto ([`XdpTcpStream::can_take`]'s), else this process's for the
    /// route with `opts`.
    pub fn adopt_kernel(
        fd: RawFd,
        opts: &EngineOptions,
        taker: Option<Taker>,
        dump: impl FnOnce() -> io::Result<Handover>,
    ) -> io::Result<XdpTcpStream> {
        let local = sock_local(fd)?;
        let remote = sock_peer(fd)?;
        off_loopback(&[*local.ip(), *remote.ip()])?;
        // The engine [`XdpTcpStream::can_take`] made ready, else this
        // process's for the route.
        let eng = match taker {
            Some(t) => t.0,
            None => {
                let (engine, _) = Self::routed(remote, local, opts)?;
                TcpEngine::clients(&engine, opts)?
            }
        };
        eng.resolve(*remote.ip(), Duration::from_secs(3))?;
        let mut core = eng.core();
        eng.steer_flow(local, remote, fd)?;
        let undo = |core: &mut Core| {
            eng.engine.prog().prog.unclaim_tcp_flow(local, remote);
            core.stack
                .remember_handed(nanowire_tcp::FourTuple { local, remote }, now_ns());
        };
        let mut h = match dump() {
            Ok(h) if h.tuple.local == local && h.tuple.remote == remote => h,
            Ok(_) => {
                undo(&mut core);
                return Err(io_err(
                    io::ErrorKind::InvalidData,
                    "the kernel's state names another 4-tuple",
                ));
            }
            Err(e) => {
                undo(&mut core);
                return Err(e);
            }
        };
        // The buffers: the engine's own sizes (or the application's), and
        // room for what the kernel holds and the window it advertised.
        let so = sized_options(core.stack.config(), opts);
        let e = &mut h.engine;
        e.sndbuf = so.sndbuf.max(h.send.len());
        e.rcvbuf = so
            .rcvbuf
            .max(h.recv.len() + h.rcv_wnd as usize)
            .min(64 << 20);
        e.rcvbuf_max = so.rcvbuf_max.max(e.rcvbuf);
        let now = now_ns();
        let c = match core.stack.adopt_state(now, &h) {
            Ok(c) => c,
            Err(err) => {
                undo(&mut core);
                return Err(tcp_err(err));
            }
        };
        eng.flow_claimed(&mut core, local, remote);
        core.held.push(Held {
            local,
            remote,
            keep: None,
            block: None,
            moved: false,
        });
        eng.transmit(&mut core, now);
        drop(core);
        Ok(XdpTcpStream::opened(eng, c))
    }
}

/// A connection's socket options from the stack's configuration, with the
/// buffer sizes the application gave (`opts`: at least 4 KiB; a receive
/// buffer it sized is not autotuned).
fn sized_options(cfg: &Config, opts: &EngineOptions) -> SocketOptions {
    let mut so = SocketOptions::from_config(cfg);
    if let Some(b) = opts.rcvbuf {
        so.rcvbuf = b.max(4096);
        so.rcvbuf_max = 0;
    }
    if let Some(b) = opts.sndbuf {
        so.sndbuf = b.max(4096);
    }
    so
}

/// The remote IPv4 address of a connected kernel socket.
fn sock_peer(fd: RawFd) -> io::Result<SocketAddrV4> {
    sock_addr(fd, libc::getpeername)
}

/// How often the pass entries of handed-over connections are checked.
const PASS_SWEEP_NS: u64 = 1_000_000_000;

impl TcpEngine {
    /// Remove the pass entries of handed-over connections the kernel no
    /// longer has (closed, or in TIME-WAIT, whose stray segments the
    /// engine's listener answers as the kernel's would be: nobody's
    /// connection) — issue 20, 13b: a splice proxy would otherwise fill
    /// the flow map. At most every PASS_SWEEP_NS; the kernel is asked
    /// without the engine's lock held (one sock_diag look-up per entry).
    /// Returns how many entries went.
    fn sweep_passes(&self, diag: &mut Option<nanowire_xdp::netlink::SockDiag>) -> usize {
        let list = {
            let Some(mut c) = order::try_lock_owned(&self.core, Tier::Stack) else {
                return 0;
            };
            let now = now_ns();
            if c.pass_claims.is_empty() || now < c.pass_sweep_at {
                return 0;
            }
            c.pass_sweep_at = now.saturating_add(PASS_SWEEP_NS);
            c.pass_claims.clone()
        };
        if diag.is_none() {
            match nanowire_xdp::netlink::SockDiag::open() {
                Ok(d) => *diag = Some(d),
                Err(e) => {
                    warn_sweep(&e);
                    return 0;
                }
            }
        }
        let Some(d) = diag.as_mut() else { return 0 };
        let mut gone = Vec::new();
        for (l, r) in list {
            match d.tcp_state(l, r) {
                Ok(None)
                | Ok(Some(
                    nanowire_xdp::netlink::TCP_TIME_WAIT | nanowire_xdp::netlink::TCP_CLOSE,
                )) => gone.push((l, r)),
                Ok(Some(_)) => {}
                Err(e) => {
                    // Keep the entry: better a stale pass than a live
                    // kernel connection's segments taken by the engine.
                    warn_sweep(&e);
                    *diag = None;
                    break;
                }
            }
        }
        if gone.is_empty() {
            return 0;
        }
        let mut c = self.core();
        let mut ended = Vec::new();
        for (l, r) in gone {
            if let Some(i) = c.pass_claims.iter().position(|&(a, b)| a == l && b == r) {
                c.pass_claims.swap_remove(i);
                ended.push((l, r, None));
            }
        }
        let n = ended.len();
        self.engine.release_flows(ended);
        n
    }
}

fn warn_sweep(e: &io::Error) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        eprintln!(
            "nanowire: cannot ask the kernel about handed-over TCP connections ({e}); \
             their flow-map entries stay until the listener closes"
        )
    });
}

impl Drop for XdpTcpStream {
    fn drop(&mut self) {
        let mut core = self.eng.core();
        let now = now_ns();
        let _ = core.stack.close(now, self.c);
        self.eng.transmit(&mut core, now);
        if core.shared && core.held.len() > core.stack.connection_count() {
            self.eng.reap(&mut core);
        }
        TcpEngine::held_may_have_ended(&mut core);
    }
}

/// Non-blocking reads: one engine turn, then `WouldBlock` if nothing came.
impl io::Read for XdpTcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.try_read(buf)? {
            Some(n) => Ok(n),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// Non-blocking writes: what fits the send buffer goes (and is transmitted
/// at once); `WouldBlock` when it is full.
impl io::Write for XdpTcpStream {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.send_once(data).map_err(tcp_err)
    }
    fn flush(&mut self) -> io::Result<()> {
        let mut core = self.eng.core();
        self.eng.turn(&mut core);
        Ok(())
    }
}

impl XdpTcpStream {
    /// Wait for the engine (the bench's blocking mode): sleep until a frame
    /// may be there or a timer is due, at most `timeout`.
    pub fn wait(&self, timeout: Duration) {
        self.eng.sleep(Some(Instant::now() + timeout));
    }
}

/// The stream contract every engine meets (`crate::TcpEndpoint`).
impl crate::TcpEndpoint for XdpTcpStream {
    fn wait_io(&self, _write: bool, timeout: Duration) -> io::Result<()> {
        self.wait(timeout);
        Ok(())
    }
    fn set_nodelay(&self, on: bool) -> io::Result<()> {
        XdpTcpStream::set_nodelay(self, on)
    }
    fn peer_addr(&self) -> io::Result<SocketAddrV4> {
        XdpTcpStream::peer_addr(self)
    }
}

/// The listener contract every engine meets (`crate::TcpAcceptor`).
impl crate::TcpAcceptor for XdpTcpListener {
    type Stream = XdpTcpStream;
    fn try_accept(&self) -> io::Result<Option<(XdpTcpStream, SocketAddrV4)>> {
        match self.accept(Some(Instant::now()))? {
            Some(s) => {
                let peer = s.peer_addr()?;
                Ok(Some((s, peer)))
            }
            None => Ok(None),
        }
    }
    fn local_addr(&self) -> io::Result<SocketAddrV4> {
        Ok(self.local)
    }
}

// ------------------------------------------------ the shim's interface
//
// `nanowire run` serves TCP sockets of unmodified programs with these: the
// application's own fd stays the kernel reservation (bound; listening for a
// listener), every call is one attempt (one engine turn at most) and the
// shim does the waiting, so a call never holds the stack's lock across a
// sleep and two threads may read and write one connection at once.

/// IP_TTL and IP_TOS of a kernel socket (what the application set, as the
/// kernel resolved it: IP_TTL -1 reads back as the default TTL, a TCP
/// socket's IP_TOS without the ECN bits).
/// SO_REUSEADDR of the kernel socket `fd` (`SocketOptions::reuseaddr`).
fn reuseaddr_of(fd: RawFd) -> bool {
    super::socket::int_opt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR).is_some_and(|v| v != 0)
}

pub fn ip_header_of(fd: RawFd) -> (u8, u8) {
    let get = |name| super::socket::ip_int_opt(fd, name);
    let ttl = get(libc::IP_TTL).map_or(nanowire_tcp::DEFAULT_TTL, |v| v.clamp(1, 255) as u8);
    let tos = get(libc::IP_TOS).map_or(0, |v| v as u8);
    (ttl, tos)
}

/// The local IPv4 address of a kernel socket.
fn sock_local(fd: RawFd) -> io::Result<SocketAddrV4> {
    sock_addr(fd, libc::getsockname)
}

/// An IPv4 address of a kernel socket, as `name` (getsockname or
/// getpeername) tells it.
fn sock_addr(
    fd: RawFd,
    name: unsafe extern "C" fn(
        libc::c_int,
        *mut libc::sockaddr,
        *mut libc::socklen_t,
    ) -> libc::c_int,
) -> io::Result<SocketAddrV4> {
    // SAFETY: an all-zero sockaddr_in is a valid out-buffer.
    let mut out: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: out/len are valid for writes; `name` is getsockname(2) or
    // getpeername(2).
    if unsafe { name(fd, (&mut out as *mut libc::sockaddr_in).cast(), &mut len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if out.sin_family != libc::AF_INET as libc::sa_family_t {
        return Err(io_err(io::ErrorKind::Unsupported, "not an IPv4 socket"));
    }
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(out.sin_addr.s_addr)),
        u16::from_be(out.sin_port),
    ))
}

/// Readiness bits of [`XdpTcpStream::poll_ready`] (as `nanowire_tcp::ready`).
pub use nanowire_tcp::ready as tcp_ready;
pub use nanowire_tcp::{
    EngineState, Error as XdpTcpError, FourTuple, Handover, State as XdpTcpState,
    TcpInfo as XdpTcpInfo,
};

impl XdpTcpListener {
    /// Serve the application's listening socket `fd` (bound and listening
    /// in the kernel, which keeps holding the port) on the engine. The
    /// steering program takes every segment for the port on the engine's
    /// interface; connections the kernel still gets (loopback) stay in the
    /// kernel's accept queue of `fd`.
    pub fn adopt(fd: RawFd, backlog: usize, opts: &EngineOptions) -> io::Result<XdpTcpListener> {
        Self::serve(fd, backlog, opts, false)
    }

    /// A listening socket inherited through fork (issue 24), `fd` this
    /// process's copy of it: served on this process's own engine, which
    /// joins the listener's group on the engine service (the service checks
    /// that `fd` is the very socket its claim holds): new connections are
    /// spread over the processes accepting from it, and each one's engine
    /// completes the handshakes it gets and queues them on its copy. An
    /// engine of its own cannot (the parent's program owns the interface):
    /// the error says so.
    pub fn join(fd: RawFd, backlog: usize, opts: &EngineOptions) -> io::Result<XdpTcpListener> {
        Self::serve(fd, backlog, opts, true)
    }

    fn serve(
        fd: RawFd,
        backlog: usize,
        opts: &EngineOptions,
        join: bool,
    ) -> io::Result<XdpTcpListener> {
        let local = sock_local(fd)?;
        off_loopback(&[*local.ip()])?;
        let engine = super::socket::engine_for(*local.ip(), opts).map_err(open_err)?;
        if !engine.is_own() {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                "the engine belongs to the parent process (fork)",
            ));
        }
        let cfg = TcpEngine::config(&engine, opts);
        let eng = TcpEngine::new(engine, opts.wait, cfg)?;
        let l = {
            let mut c = eng.core();
            eng.claim_listener_as(&mut c, local, fd, join)?;
            let mut so = SocketOptions::from_config(c.stack.config());
            (so.ttl, so.tos) = ip_header_of(fd);
            so.reuseaddr = reuseaddr_of(fd);
            c.stack
                .listen_with(local, backlog.max(1), so)
                .map_err(tcp_err)?
        };
        Ok(XdpTcpListener {
            eng,
            l,
            local,
            idle: AtomicI32::new(-1),
        })
    }

    /// On the engine service (where a listener can be shared with a forked
    /// child)?
    pub fn on_service(&self) -> bool {
        self.eng.engine.service_slot().is_some()
    }

    /// Stop accepting for now (issue 24: a fork's parent, whose workers
    /// accept): the service steers no new connection here; the ones this
    /// process has stay. `sock` is the listening socket: a duplicate is
    /// kept to join again with at this listener's next accept or readiness
    /// look (a parent that accepts after all).
    pub fn stop_accepting(&self, sock: RawFd) -> Result<(), String> {
        let keep = rustix::io::fcntl_dupfd_cloexec(
            // SAFETY: the caller's open listening socket, borrowed for the dup.
            unsafe { rustix::fd::BorrowedFd::borrow_raw(sock) },
            0,
        )
        .map_err(|e| format!("dup of the listening socket: {e}"))?;
        let keep = nanowire_xdp::sys::above_floor(keep);
        // The requests without the stack lock (round trips to the
        // service: the listener's connections turn under that lock).
        let claims = self.claims_of_port();
        let mut p = self.eng.engine.prog();
        for a in &claims {
            p.prog.idle_tcp_listener(*a.ip(), a.port())?;
        }
        drop(p);
        let old = self
            .idle
            .swap(std::os::fd::IntoRawFd::into_raw_fd(keep), Ordering::AcqRel);
        if old >= 0 {
            nanowire_xdp::sys::close(old);
        }
        Ok(())
    }

    /// Accepting again after [`XdpTcpListener::stop_accepting`] (one load
    /// when accepting).
    #[inline]
    fn accepting(&self) {
        if self.idle.load(Ordering::Relaxed) >= 0 {
            self.rejoin();
        }
    }

    #[cold]
    fn rejoin(&self) {
        let fd = self.idle.swap(-1, Ordering::AcqRel);
        if fd < 0 {
            return;
        }
        {
            let claims = self.claims_of_port();
            let mut p = self.eng.engine.prog();
            for a in &claims {
                // Refused (the service went): the connections go to the
                // other members, or to the kernel's listening socket.
                let _ = p.prog.join_tcp_listener(*a.ip(), a.port(), fd);
            }
        }
        nanowire_xdp::sys::close(fd);
    }

    /// The listener's claimed addresses (taken under the stack lock, used
    /// after it is let go).
    fn claims_of_port(&self) -> Vec<SocketAddrV4> {
        self.eng
            .core()
            .listen_claims
            .iter()
            .filter(|a| a.port() == self.local.port())
            .copied()
            .collect()
    }

    /// See [`XdpTcpStream::sleep_arm`].
    pub fn sleep_arm(&self) -> Option<Armed> {
        Armed::of(&self.eng)
    }

    /// One engine turn, then the next established connection, if any.
    pub fn try_accept(&self) -> Option<XdpTcpStream> {
        self.accepting();
        let mut c = self.eng.core();
        self.eng.turn(&mut c);
        let id = c.stack.accept(self.l)?;
        let now = now_ns();
        self.eng.transmit(&mut c, now);
        drop(c);
        Some(XdpTcpStream::opened(self.eng.clone(), id))
    }

    /// IP_TTL / IP_TOS for the connections this listener creates from now
    /// on (and its cookie SYN-ACKs).
    pub fn set_ip_header(&self, ttl: u8, tos: u8) {
        self.eng
            .core()
            .stack
            .set_listener_ip_header(self.l, ttl, tos);
    }

    /// Stop steering the listener's port to the engine: new connections
    /// go to the kernel's listening socket (which has an option the engine
    /// does not honour); the connections the engine already made, accepted
    /// or queued, stay on it and are accepted as before.
    /// True when it did (false: already released).
    pub fn release_to_kernel(&self) -> bool {
        let mut c = self.eng.core();
        if !c
            .listen_claims
            .iter()
            .any(|a| a.port() == self.local.port())
        {
            return false;
        }
        self.eng.release_listener(&mut c, self.local.port());
        true
    }

    /// A connection is waiting to be accepted (one engine turn if `turn`).
    /// Which engine serves this listener (an address: equal for sockets
    /// of one engine stack, for turning it once per readiness pass).
    pub fn engine_key(&self) -> usize {
        Arc::as_ptr(&self.eng) as usize
    }

    pub fn acceptable(&self, turn: bool) -> bool {
        self.accepting();
        let mut c = self.eng.core();
        if turn {
            self.eng.turn(&mut c);
        }
        c.stack.accept_queue_len(self.l) > 0
    }

    /// Connections of this listener are held by the application (their
    /// users turn the engine). Not a half-open one, one waiting to be
    /// accepted or one the application closed: nobody turns the engine for
    /// those but the accept itself (it slept without the engine's fds
    /// beside a SYN-RECEIVED connection, and the peer's ACK and request
    /// waited for the timer service's look, 20 ms: session 26).
    ///
    /// A blocking accept that asks this sleeps without the engine's fds when
    /// it is true; the accept fd is then signalled when no held connection
    /// is left, by whatever route (`TcpEngine::held_may_have_ended`), so it
    /// looks again and sleeps on them.
    pub fn busy(&self) -> bool {
        let mut c = self.eng.core();
        c.accept_busy = TcpEngine::holds(&mut c);
        c.accept_busy
    }

    /// The fds a sleeping waiter polls: the engine's AF_XDP sockets and the
    /// listener's wake-up eventfd.
    pub fn poll_fds(&self) -> Vec<RawFd> {
        self.eng.poll_fds()
    }

    /// Readable when a connection may wait in the accept queue (signalled by
    /// whichever thread turned the engine); drain with
    /// [`XdpTcpListener::accept_drain`].
    pub fn accept_fd(&self) -> RawFd {
        self.eng.core().accept_fd.as_raw_fd()
    }

    pub fn accept_drain(&self) {
        eventfd_drain(self.accept_fd());
    }

    /// A blocking accept begins (`true`) or ends (`false`) waiting on
    /// [`XdpTcpListener::accept_fd`]: while one waits, a turn that queues
    /// a connection signals it. Begin before the first
    /// [`XdpTcpListener::try_accept`] of the wait (a connection queued
    /// before that is found by it; one queued after, signalled).
    pub fn accept_waiting(&self, on: bool) {
        let mut c = self.eng.core();
        if on {
            c.accept_waiters += 1;
        } else {
            c.accept_waiters = c.accept_waiters.saturating_sub(1);
        }
    }

    /// Sleep until a frame may be there or a timer is due (at most `timeout`).
    pub fn wait(&self, timeout: Duration) {
        self.eng.sleep(Some(Instant::now() + timeout));
    }

    /// A blocking accept that slept without the engine's fds ([`XdpTcpListener::busy`])
    /// until its time slice ended found a connection: it waited for the
    /// slice, not for its frames (`tcp_accept_late`).
    pub fn note_late(&self) {
        self.eng.core().accept_late += 1;
    }
}

/// A sleep armed on an engine stack ([`XdpTcpStream::sleep_arm`],
/// [`XdpTcpListener::sleep_arm`]): dropped when the sleep ends, it
/// disarms (see `TcpEngine::disarm`). It holds the engine, not the socket:
/// a socket closed by another thread meanwhile still disarms.
pub struct Armed(Arc<TcpEngine>);

impl Armed {
    fn of(eng: &Arc<TcpEngine>) -> Option<Armed> {
        eng.arm().then(|| Armed(eng.clone()))
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        self.0.disarm();
    }
}

impl TcpEngine {
    /// Stop steering the listener's port (new SYNs go to the kernel): the
    /// connections it accepted keep their segments through per-4-tuple
    /// claims.
    fn release_listener(&self, core: &mut Core, port: u16) {
        if !self.engine.is_own() {
            return;
        }
        let tuples = core.stack.tuples();
        let mut p = self.engine.prog();
        for t in tuples.iter().filter(|t| t.local.port() == port) {
            if p.prog.claim_tcp_flow(t.local, t.remote, None).is_ok() {
                core.flow_claims.push((t.local, t.remote));
            }
        }
        let mut kept = Vec::new();
        for a in core.listen_claims.drain(..) {
            if a.port() == port {
                p.prog.unclaim_tcp_listener(*a.ip(), a.port());
            } else {
                kept.push(a);
            }
        }
        core.listen_claims = kept;
    }

    fn poll_fds(&self) -> Vec<RawFd> {
        let mut v = self.engine.fds.clone();
        v.push(self.core().wake_fd);
        v
    }
}

impl XdpTcpStream {
    /// Start a connection from the application's socket `fd` to `remote`
    /// (non-blocking: the SYN is sent, the stream is in SYN-SENT; see
    /// [`XdpTcpStream::connect_done`]). An unbound `fd` gets a port of
    /// the client port block (ports.rs: reserved and claimed once, `fd`
    /// stays unbound), or, when the block has none to give, `fd` is bound
    /// here to the route's source address and an ephemeral port, so the
    /// kernel keeps the port, and the steering program takes the 4-tuple.
    pub fn connect_adopt(
        fd: RawFd,
        remote: SocketAddrV4,
        opts: &EngineOptions,
    ) -> io::Result<XdpTcpStream> {
        let mut local = sock_local(fd)?;
        off_loopback(&[*remote.ip(), *local.ip()])?;
        // The engine and source address: from the last engine's neighbour
        // table when it knows the peer (memory only), else from the
        // kernel's route (netlink, once per destination the table does not
        // hold).
        let (engine, src) = match Self::known_route(fd, remote, local, opts) {
            Some(v) => v,
            None => Self::routed(remote, local, opts)?,
        };
        let eng = TcpEngine::clients(&engine, opts)?;
        eng.resolve(*remote.ip(), Duration::from_secs(3))?;
        let mut block = None;
        let c = {
            let mut core = eng.core();
            if local.port() == 0 {
                // A port of the client port block (nothing to bind or
                // claim), else one bound for this connection: known unless
                // the kernel chose it (no getsockname per connect).
                block = eng.block_port(&mut core, src, remote);
                local = match block {
                    Some(i) => SocketAddrV4::new(src, core.block.port(i)),
                    None => match bind_ephemeral(fd, src)? {
                        Some(port) => SocketAddrV4::new(src, port),
                        None => sock_local(fd)?,
                    },
                };
            }
            let local = SocketAddrV4::new(src, local.port());
            let mut so = sized_options(core.stack.config(), opts);
            (so.ttl, so.tos) = if opts.ip_header_default {
                eng.engine.ip_defaults(fd)
            } else {
                ip_header_of(fd)
            };
            so.reuseaddr = !opts.reuseaddr_unset && reuseaddr_of(fd);
            if block.is_none() {
                // On the engine service the claim is a round trip: made
                // without this stack's lock, which every connection of
                // the process's shared client stack turns under (the SYN
                // goes after, so nothing arrives for the 4-tuple before
                // the demux has it).
                drop(core);
                eng.steer_flow(local, remote, fd)?;
                core = eng.core();
                eng.flow_claimed(&mut core, local, remote);
            }
            core.held.push(Held {
                local,
                remote,
                keep: None,
                block,
                moved: false,
            });
            let now = now_ns();
            match core.stack.connect_with(now, local, remote, &so) {
                Ok(c) => {
                    eng.transmit(&mut core, now);
                    c
                }
                Err(e) => {
                    // Nothing of it stays: the held entry goes at once.
                    eng.reap(&mut core);
                    return Err(tcp_err(e));
                }
            }
        };
        let mut s = XdpTcpStream::opened(eng, c);
        s.port_in_fd = block.is_none();
        Ok(s)
    }

    /// The engine and source address for `remote` if the last engine a
    /// connect used already knows how to reach it through its interface
    /// and the socket `fd` is in the engine's network namespace (its
    /// cookie: one getsockopt; the /proc inode only where the kernel has no
    /// cookie).
    fn known_route(
        fd: RawFd,
        remote: SocketAddrV4,
        local: SocketAddrV4,
        opts: &EngineOptions,
    ) -> Option<(Arc<Engine>, Ipv4Addr)> {
        let e = LAST_CLIENT_ENGINE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .upgrade()?;
        let same_netns = match (e.netns_cookie, super::registry::sock_netns_cookie(fd)) {
            (Some(a), Some(b)) => a == b,
            _ => super::registry::netns_id() == e.netns,
        };
        if !e.is_own() || opts.iface.as_ref().is_some_and(|i| *i != e.iface().name) || !same_netns {
            return None;
        }
        match e.neigh.lookup(*remote.ip()) {
            Lookup::Ready(Hop::Xdp { src, .. })
                if local.ip().is_unspecified() || *local.ip() == src =>
            {
                Some((e, src))
            }
            _ => None,
        }
    }

    /// The engine and source address for `remote` from the kernel's route.
    fn routed(
        remote: SocketAddrV4,
        local: SocketAddrV4,
        opts: &EngineOptions,
    ) -> io::Result<(Arc<Engine>, Ipv4Addr)> {
        let route = nanowire_xdp::netlink::route_get(*remote.ip())?;
        if route.kind == nanowire_xdp::netlink::RTN_LOCAL {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                format!("{} is a local address (loopback)", remote.ip()),
            ));
        }
        let hint = if local.ip().is_unspecified() {
            route.prefsrc.unwrap_or(Ipv4Addr::UNSPECIFIED)
        } else {
            *local.ip()
        };
        let engine = super::socket::engine_for(hint, opts).map_err(open_err)?;
        if !engine.is_own() {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                "the engine belongs to the parent process (fork)",
            ));
        }
        if route.oif != 0 && route.oif != engine.iface().index {
            return Err(io_err(
                io::ErrorKind::Unsupported,
                format!(
                    "the route to {} does not leave by {}",
                    remote.ip(),
                    engine.iface().name
                ),
            ));
        }
        let src = if local.ip().is_unspecified() {
            route.prefsrc.or(engine.iface().addr).ok_or_else(|| {
                io_err(
                    io::ErrorKind::AddrNotAvailable,
                    "the interface has no IPv4 address",
                )
            })?
        } else {
            *local.ip()
        };
        *LAST_CLIENT_ENGINE.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&engine);
        Ok((engine, src))
    }

    /// Before sleeping on [`XdpTcpStream::poll_fds`]: frames another
    /// thread queues for this connection's stack wake the sleeper until
    /// the returned [`Armed`] is dropped (when the sleep ends). `None`:
    /// frames are queued already (turn instead of sleeping).
    pub fn sleep_arm(&self) -> Option<Armed> {
        Armed::of(&self.eng)
    }

    /// One engine turn; `None` while the handshake runs, then its outcome.
    pub fn connect_done(&self) -> Option<Result<(), XdpTcpError>> {
        let mut core = self.eng.core();
        self.eng.turn(&mut core);
        match core.stack.state(self.c) {
            Ok(State::SynSent) | Ok(State::SynReceived) => None,
            Ok(_) => Some(match core.stack.error(self.c) {
                Some(e) => Err(e),
                None => Ok(()),
            }),
            Err(e) => Some(Err(e)),
        }
    }

    /// One receive attempt (one engine turn): bytes copied, 0 at end of
    /// file, `WouldBlock` if nothing is there. `peek`: MSG_PEEK.
    /// `clock`: the monotonic clock as the caller read it a moment ago (a
    /// spinning wait's turn), if it did: the time of what this attempt's
    /// turn takes in, instead of a clock read between the segment and the
    /// return (see `TcpEngine::turn_into`).
    pub fn recv_once(
        &self,
        buf: &mut [u8],
        peek: bool,
        clock: Option<u64>,
    ) -> Result<usize, XdpTcpError> {
        let mut core = self.eng.core();
        let r = self.read_ring(&mut core, buf, peek, None);
        if r != Err(TcpError::WouldBlock) {
            return r;
        }
        // The ring is empty: a turn. Nothing came in and nothing went out:
        // the connection is as it was (no second look, no clock).
        self.turn_then_read(&mut core, buf, peek, clock, false, 1)
    }

    /// [`XdpTcpStream::recv_once`] for an attempt of a wait, after one
    /// that found nothing: the turn first (what came since is found by
    /// it, and in order data goes straight into `buf`), the receive ring
    /// after it (data another thread's turn took in meanwhile).
    ///
    /// When the turn found nothing and the stack has nothing of its own to
    /// do (no segment to send or waiting for a next hop, no frame to give
    /// back): a reader that spins alone on the engine (no other thread
    /// waited on it since, `Engine::rx_spin_alone`) polls the RX rings up
    /// to `polls` times more with the stack's and the RX locks held, so
    /// that the segment that comes is taken by the poll that sees it. A
    /// look without the locks ([`XdpTcpStream::coast`]) found it just as
    /// soon, but then took both locks and went through a turn's start
    /// before its first descriptor was read: ~40 ns of each side's path
    /// from the segment to the reply in a ping-pong (session 36, the
    /// probe's marks). What the polls defer (a signal, a close by another
    /// thread, the timeout, the timers) is what coasting defers, for as
    /// many turns (`polls` is the caller's coasting bound); other threads'
    /// takes of these locks wait that long (none is alone then), and the
    /// timer service's try skips the stack for the round. Otherwise, and
    /// after polls that found nothing, `idle` is the look the wait's next
    /// idle turns answer from without the locks, or `None` (then the wait
    /// makes its next attempt at its next turn).
    pub fn recv_wait(
        &self,
        buf: &mut [u8],
        peek: bool,
        clock: Option<u64>,
        polls: u32,
        idle: &mut Option<TcpIdle>,
    ) -> Result<usize, XdpTcpError> {
        let mut core = self.eng.core();
        probe::mark(Mark::StackLocked);
        let mut r = self.turn_then_read(&mut core, buf, peek, clock, true, 1);
        let quiet = |core: &mut Core| {
            core.parked.is_empty() && core.recycle.is_empty() && !core.stack.wants_transmit()
        };
        let mut polled = false;
        if r == Err(TcpError::WouldBlock)
            && polls > 0
            && !peek
            && quiet(&mut core)
            && self.eng.engine.rx_spin_alone()
        {
            polled = true;
            r = self.turn_then_read(&mut core, buf, peek, clock, true, polls);
        }
        let mark = core.rx_mark;
        *idle = match mark {
            Some(mark) if !polled && r == Err(TcpError::WouldBlock) && quiet(&mut core) => {
                Some(TcpIdle {
                    mark,
                    left: COAST_TURNS,
                })
            }
            _ => None,
        };
        r
    }

    /// An idle turn of a spinning reader without the stack's lock: `true`
    /// while nothing was delivered to any endpoint of the engine since
    /// `idle` was made and nothing waits on its RX rings (a few loads,
    /// `Engine::rx_wait_quiet`, which also prefetches the next RX slot as
    /// the poll of an empty ring does), for at most `COAST_TURNS` turns;
    /// `false`: the wait's next attempt turns the stack. Sound as a quiet
    /// turn of [`TcpEngine::turn_into`] is: a segment for this stack
    /// reaches it only through a poll, which bumps the delivery count (the
    /// argument at `Engine::rx_quiet`); what no delivery changes (a timer,
    /// a close or shutdown by another thread) is seen by the attempt after
    /// at most `COAST_TURNS` of these turns.
    #[inline(always)]
    pub fn coast(&self, idle: &mut TcpIdle) -> bool {
        if idle.left == 0 || !self.eng.engine.rx_wait_quiet(idle.mark) {
            return false;
        }
        idle.left -= 1;
        true
    }

    /// The receive ring's bytes, if any (`WouldBlock` when empty). Reading
    /// may open the window: announce it now, at `turned` (the clock as the
    /// turn that brought the data read it) or a fresh reading (most reads
    /// owe nothing: a request's read before its reply, whose segment
    /// carries the ACK).
    #[inline]
    fn read_ring(
        &self,
        core: &mut Core,
        buf: &mut [u8],
        peek: bool,
        turned: Option<u64>,
    ) -> Result<usize, XdpTcpError> {
        let r = if peek {
            core.stack.peek(self.c, buf)
        } else {
            core.stack.recv(self.c, buf)
        };
        if r != Err(TcpError::WouldBlock) && !peek && core.stack.wants_transmit() {
            let now = turned.unwrap_or_else(now_ns);
            self.eng.transmit(core, now);
        }
        r
    }

    /// A turn in which (unless peeking) what arrives in order for this
    /// connection is copied straight into `buf` (DirectRead: one copy per
    /// byte, not two), then the ring if the turn moved anything (or
    /// `always`). `polls` > 1: the turn's receive half polls up to that
    /// many times until something comes (a lone reader's idle turns, see
    /// [`XdpTcpStream::recv_wait`]; its caller checked that the turn has
    /// nothing else to do, so the quiet turn's check is not made).
    #[inline]
    fn turn_then_read(
        &self,
        core: &mut Core,
        buf: &mut [u8],
        peek: bool,
        clock: Option<u64>,
        always: bool,
        polls: u32,
    ) -> Result<usize, XdpTcpError> {
        let mut direct = DirectRead {
            conn: self.c,
            buf: &mut *buf,
            filled: 0,
        };
        let read = (!peek).then_some(&mut direct);
        let moved = if polls > 1 {
            self.eng.turn_rx(core, false, read, clock, polls)
        } else {
            self.eng.turn_into(core, false, read, clock)
        };
        probe::mark(Mark::TurnDone);
        let direct = direct.filled;
        if direct > 0 {
            // The turn's own transmit sent what the data owes (an ACK);
            // the ring, and so the window, did not change.
            return Ok(direct);
        }
        if !moved && !always {
            return Err(TcpError::WouldBlock);
        }
        // A turn that brought data read the clock just now.
        let turned = moved.then_some(core.last_turn);
        self.read_ring(core, buf, peek, turned)
    }

    /// One send attempt: what fits the send buffer is queued and
    /// transmitted at once; `WouldBlock` when it is full.
    pub fn send_once(&self, data: &[u8]) -> Result<usize, XdpTcpError> {
        probe::mark(Mark::SendOnce);
        let mut core = self.eng.core();
        probe::mark(Mark::SendLocked);
        self.eng.take_input(&mut core);
        probe::mark(Mark::InputTaken);
        // The send's end tracking and timer are owed, paid with the
        // segment's after the kick (`tx_segments`), or below when nothing
        // went out.
        let mut r = core.stack.send_owing(self.c, data);
        if r == Err(TcpError::WouldBlock) {
            // ACKs may have freed room.
            core.stack.settle_owed();
            self.eng.turn(&mut core);
            r = core.stack.send_owing(self.c, data);
        }
        // The TSC's extrapolation, not a clock read, before the segment
        // goes out (`super::tsc`).
        probe::mark(Mark::Queued);
        let now = core.tsc.now(now_ns);
        probe::mark(Mark::Clock);
        self.eng.transmit_for(&mut core, now, true);
        core.stack.settle_owed();
        // Data queued but not sent (the peer's window closed) moves the
        // end too (the bytes a death must deliver end later): published
        // now, not at a next turn that a kill -9 may never see (the
        // warden or service then delivered the stream only up to the
        // previous send's end, then the FIN: run_exit kill_9_with_data_
        // unacknowledged, 1 in 10 runs on an own engine, session 22).
        publish_ends(&mut core);
        r
    }

    /// Readiness bits ([`tcp_ready`]), after one engine turn if `turn`.
    pub fn poll_ready(&self, turn: bool) -> u8 {
        let mut core = self.eng.core();
        if turn {
            self.eng.turn(&mut core);
        }
        core.stack.readiness(self.c)
    }

    /// `poll_ready`, with the bytes received so far (data arriving while
    /// the readable bit stays set is an edge for EPOLLET, as in the kernel).
    /// Which engine serves this connection (an address: equal for sockets
    /// of one engine stack, for turning it once per readiness pass).
    pub fn engine_key(&self) -> usize {
        Arc::as_ptr(&self.eng) as usize
    }

    pub fn poll_ready_edge(&self, turn: bool) -> (u8, u64) {
        let mut core = self.eng.core();
        if turn {
            self.eng.turn(&mut core);
        }
        (
            core.stack.readiness(self.c),
            core.stack.bytes_received(self.c).unwrap_or(0),
        )
    }

    /// shutdown(SHUT_WR) without `&mut`.
    pub fn shut_write(&self) -> Result<(), XdpTcpError> {
        let mut core = self.eng.core();
        core.stack.shutdown_write(self.c)?;
        let now = now_ns();
        self.eng.transmit(&mut core, now);
        Ok(())
    }

    /// SO_ERROR: the pending error, cleared by reading it.
    pub fn take_error(&self) -> Option<XdpTcpError> {
        self.eng.core().stack.take_error(self.c).ok().flatten()
    }
    pub fn state(&self) -> Option<State> {
        self.eng.core().stack.state(self.c).ok()
    }
    pub fn set_linger0(&self, on: bool) -> io::Result<()> {
        self.eng
            .core()
            .stack
            .set_linger0(self.c, on)
            .map_err(tcp_err)
    }
    pub fn set_keepalive(&self, on: bool, idle_s: u64, intvl_s: u64, cnt: u32) -> io::Result<()> {
        self.eng
            .core()
            .stack
            .set_keepalive(
                self.c,
                on,
                idle_s.saturating_mul(1_000_000_000),
                intvl_s.saturating_mul(1_000_000_000),
                cnt,
            )
            .map_err(tcp_err)
    }
    /// Bytes ready to read (FIONREAD).
    pub fn recv_queue(&self) -> usize {
        self.eng.core().stack.recv_queue(self.c).unwrap_or(0)
    }
    /// Bytes a send could queue now.
    pub fn send_space(&self) -> usize {
        self.eng.core().stack.send_space(self.c).unwrap_or(0)
    }
    /// Bytes not yet acknowledged (SIOCOUTQ).
    pub fn send_queue(&self) -> usize {
        self.eng.core().stack.send_queue(self.c).unwrap_or(0)
    }
    /// The fds a sleeping waiter polls.
    pub fn poll_fds(&self) -> Vec<RawFd> {
        self.eng.poll_fds()
    }
    /// The engine service this connection's engine was attached to is
    /// gone: nothing reaches the connection any more (it can still send).
    pub fn service_lost(&self) -> bool {
        self.eng.engine.service_lost()
    }
    /// Abort with RST (close with SO_LINGER 0 does this itself).
    pub fn abort(&self) {
        let mut core = self.eng.core();
        let _ = core.stack.abort(self.c);
        let now = now_ns();
        self.eng.transmit(&mut core, now);
    }
}

// ------------------------------------------------------ timer service
//
// A program that computes, or blocks on a file the engine does not serve,
// does not call in: its connections' timers (retransmit, delayed ACK,
// keepalive, FIN, TIME-WAIT) still have to run. One thread per process
// sleeps until the earliest deadline of the registered engines and then
// turns each engine whose turn is due and that nobody turned meanwhile
// (a `try_lock`: never waits for an application thread). It never spins:
// between deadlines it sleeps in poll(2) on its own eventfd only (woken
// when an engine registers), and it holds no lock while it sleeps. Its
// signals are blocked. Closed connections (the application's fd is gone)
// keep their engine here until the stack has finished them.

struct Service {
    live: Vec<std::sync::Weak<TcpEngine>>,
    /// Engines whose application sockets are closed: kept until their
    /// connections are finished (FIN exchange, TIME-WAIT).
    closing: Vec<Arc<TcpEngine>>,
    wake: Option<OwnedFd>,
    started: bool,
}

/// The service's state behind a spin lock a forked child can reset (a
/// std Mutex held by a parent thread at fork stays held in the child for
/// ever; the registry's lock is made the same way): held only to copy or
/// change the lists, never while sleeping or turning an engine.
struct ServiceCell {
    locked: AtomicBool,
    s: std::cell::UnsafeCell<Service>,
}

// SAFETY: `s` is reached only through `service()`'s guard, which holds
// `locked`, or by the fork child handler, which runs alone.
unsafe impl Sync for ServiceCell {}

static SERVICE: ServiceCell = ServiceCell {
    locked: AtomicBool::new(false),
    s: std::cell::UnsafeCell::new(Service {
        live: Vec::new(),
        closing: Vec::new(),
        wake: None,
        started: false,
    }),
};

struct ServiceGuard;

impl std::ops::Deref for ServiceGuard {
    type Target = Service;
    fn deref(&self) -> &Service {
        // SAFETY: the guard holds the lock.
        unsafe { &*SERVICE.s.get() }
    }
}
impl std::ops::DerefMut for ServiceGuard {
    fn deref_mut(&mut self) -> &mut Service {
        // SAFETY: the guard holds the lock (one guard at a time).
        unsafe { &mut *SERVICE.s.get() }
    }
}
impl Drop for ServiceGuard {
    fn drop(&mut self) {
        SERVICE.locked.store(false, Ordering::Release);
    }
}

fn service() -> ServiceGuard {
    while SERVICE.locked.swap(true, Ordering::Acquire) {
        std::thread::yield_now();
    }
    ServiceGuard
}

/// In a forked child (the registry's `pthread_atfork` child handler, its
/// child hook): the
/// parent's timer thread does not exist here and its engines are not the
/// child's. The lists are forgotten (never dropped: the engines are the
/// parent's), the lock is reset, and the child's first engine starts a
/// timer thread of its own.
pub(crate) fn service_after_fork() {
    SERVICE.locked.store(false, Ordering::Release);
    // SAFETY: the child runs this handler alone (one thread), the lock
    // just reset; nothing else reaches the state meanwhile.
    let s = unsafe { &mut *SERVICE.s.get() };
    std::mem::forget(std::mem::take(&mut s.live));
    std::mem::forget(std::mem::take(&mut s.closing));
    std::mem::forget(s.wake.take());
    s.started = false;
    wake::after_fork();
}

/// Longest sleep of the service with nothing due (it then looks again).
const SERVICE_IDLE_MS: i32 = 1000;
/// An application whose last turn is this recent is turning (spinning).
const SERVICE_ACTIVE_NS: u64 = 1_000_000;
/// With connections open, the service turns an engine nobody turned for
/// this long (segments that arrived while the program computes).
const SERVICE_RX_NS: u64 = 20_000_000;

fn service_register(eng: &Arc<TcpEngine>) {
    let mut s = service();
    s.live.retain(|w| w.strong_count() > 0);
    s.live.push(Arc::downgrade(eng));
    if !s.started {
        s.started = true;
        let Ok(wake) = eventfd() else { return };
        let fd = wake.as_raw_fd();
        SERVICE_WAKE.store(fd, Ordering::Release);
        s.wake = Some(wake);
        drop(s);
        let _ = std::thread::Builder::new()
            .name("nanowire-tcp-timers".into())
            .spawn(move || service_main(fd));
    } else if let Some(w) = &s.wake {
        let one = 1u64;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(w.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// Keep `eng` until its stack holds no connection (its last application
/// socket is closed).
fn service_linger(eng: Arc<TcpEngine>) {
    if eng.core().stack.connection_count() == 0 {
        return;
    }
    {
        let mut s = service();
        if !s.closing.iter().any(|e| Arc::ptr_eq(e, &eng)) {
            s.closing.push(eng);
        }
    }
    service_nudge();
}

fn service_main(wake: RawFd) {
    as_engine_thread(&mut || service_loop(wake));
}

fn service_loop(wake: RawFd) {
    // SAFETY: blocking every signal in this thread only (a fresh sigset).
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    // Kept open between sweeps of handed-over connections' pass entries.
    let mut diag = None;
    loop {
        // Before the pass (see `service_nudge`); cleared below if the pass
        // finds an open connection or a near deadline.
        SERVICE_NAPPING.store(true, Ordering::SeqCst);
        let unpark = UNPARK_DUE.swap(false, Ordering::SeqCst);
        let engines: Vec<Arc<TcpEngine>> = {
            let mut s = service();
            s.closing.retain(|e| {
                // A finished closed engine goes (its claims with it).
                order::try_lock_owned(&e.core, Tier::Stack)
                    .is_none_or(|c| c.stack.connection_count() > 0)
            });
            s.live.retain(|w| w.strong_count() > 0);
            let mut v: Vec<Arc<TcpEngine>> = s.live.iter().filter_map(|w| w.upgrade()).collect();
            for e in &s.closing {
                if !v.iter().any(|x| Arc::ptr_eq(x, e)) {
                    v.push(e.clone());
                }
            }
            v
        };
        let mut sleep_ns = SERVICE_IDLE_MS as u64 * 1_000_000;
        for e in &engines {
            let Some(mut c) = order::try_lock_owned(&e.core, Tier::Stack) else {
                // The application is turning it right now, and so runs the
                // timers itself (see `active` below); its turn sends parked
                // segments too (`unpark_due`), else the next pass, soon.
                sleep_ns = sleep_ns.min(if unpark { 1_000_000 } else { SERVICE_RX_NS });
                continue;
            };
            let now = now_ns();
            if e.unpark_due(&c) {
                // A next hop became known (`neighbour_changed`).
                e.unpark(&mut c, now);
                e.transmit(&mut c, now);
            }
            // An application that turned within SERVICE_ACTIVE_NS (a
            // spinner reads the clock and runs the timers every few µs)
            // serves the deadlines itself: waking for each of them would
            // only preempt it on its own CPU (a pinned program's threads all
            // share it), ~190 times a second in a TCP ping-pong, in its tail.
            // Should it stop calling in, what is due waits at most
            // SERVICE_RX_NS, as its segments in the ring do.
            let active =
                c.last_turn > c.service_turn && now.saturating_sub(c.last_turn) < SERVICE_ACTIVE_NS;
            if c.stack.connection_count() > 0 {
                // Segments may wait in the rings while the program computes:
                // look at least every SERVICE_RX_NS when nobody did.
                if now.saturating_sub(c.last_turn) >= SERVICE_RX_NS {
                    e.service_turn(&mut c);
                }
                sleep_ns = sleep_ns.min(SERVICE_RX_NS);
            }
            if let Some(d) = c.stack.next_deadline() {
                if d <= now && c.last_turn < d {
                    e.service_turn(&mut c);
                }
                let now = now_ns();
                if !active && let Some(d) = c.stack.next_deadline() {
                    // A deadline already passed that an application turn
                    // did not serve: look again in 1 ms at the latest.
                    sleep_ns = sleep_ns.min(d.saturating_sub(now).max(1_000_000));
                }
            }
        }
        for e in &engines {
            e.sweep_passes(&mut diag);
        }
        drop(engines);
        let mut p = libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        };
        if sleep_ns <= SERVICE_RX_NS {
            SERVICE_NAPPING.store(false, Ordering::Relaxed);
        }
        let ms = sleep_ns.div_ceil(1_000_000).min(SERVICE_IDLE_MS as u64) as i32;
        // SAFETY: one pollfd on our stack, a bounded timeout.
        unsafe { libc::poll(&mut p, 1, ms) };
        if p.revents != 0 {
            eventfd_drain(wake);
        }
    }
}

impl XdpTcpStream {
    /// Close as close(2) does (FIN, or RST with SO_LINGER 0 or unread
    /// data); the timer service finishes the connection. `reserve`: a
    /// duplicate of the application's fd that keeps the port held in the
    /// kernel until then.
    pub fn close_keep(self, reserve: Option<OwnedFd>) {
        let eng = self.eng.clone();
        if let Some(fd) = reserve {
            let mut c = eng.core();
            if c.shared {
                // Kept with the connection's other resources until the
                // stack forgets it (a finished one lets it go at once).
                let t = (c.stack.local_addr(self.c), c.stack.peer_addr(self.c));
                if let (Ok(l), Ok(r)) = t
                    && let Some(h) = c.held.iter_mut().find(|h| h.local == l && h.remote == r)
                {
                    h.keep = Some(fd);
                }
            } else {
                c.reservations.push(fd);
            }
        }
        drop(self);
        service_linger(eng);
    }
}

impl Drop for XdpTcpListener {
    fn drop(&mut self) {
        // The kept duplicate of the listening socket (stop_accepting) must
        // not keep the socket alive after the application closed it.
        let fd = self.idle.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            nanowire_xdp::sys::close(fd);
        }
    }
}

impl XdpTcpListener {
    /// The engine service this listener's engine was attached to is gone:
    /// new connections reach the kernel's listening socket.
    pub fn service_lost(&self) -> bool {
        self.eng.engine.service_lost()
    }

    /// Close the listener (queued, not accepted connections are reset, as
    /// the kernel does); accepted connections carry on. On the engine
    /// service the process first stops accepting from the listener's group
    /// (issue 24): the kernel's listening socket lives on while another
    /// process holds it, so a SYN that comes while this one closes goes to
    /// another member (or to the kernel's listening socket), never to an
    /// engine whose listener is gone, which would reset it.
    pub fn close(self) {
        let eng = self.eng.clone();
        if eng.engine.is_own() && self.on_service() {
            let claims = self.claims_of_port();
            let mut p = eng.engine.prog();
            for a in &claims {
                // Refused (the service went): nothing steers here any more.
                let _ = p.prog.idle_tcp_listener(*a.ip(), a.port());
            }
        }
        {
            let mut c = eng.core();
            c.stack.close_listener(self.l);
            let now = now_ns();
            eng.transmit(&mut c, now);
            if super::config::config().test_listener_close_stop && self.on_service() {
                eprintln!("nanowire: test hook: stopped at a listener's close");
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::STOP,
                );
            }
            eng.release_listener(&mut c, self.local.port());
        }
        drop(self);
        service_linger(eng);
    }
}

/// The engine service is gone (service/client.rs `Watch`; after the shim
/// moved what it could to the kernel): the connections still on the lost
/// engines -- ones the application closed and the engine was finishing,
/// and any the shim could not hand over -- can never receive again (no
/// program steers to them; the kernel answers their peers' segments with
/// RST). Each is reset now (RST, sent while the engine can still
/// transmit), so its peer learns at once, and the engines are let go (their
/// AF_XDP sockets close with them, which frees the queue for a restarted
/// service). Returns how many were reset.
pub fn tcp_service_lost() -> usize {
    let engines: Vec<Arc<TcpEngine>> = {
        let mut s = service();
        let mut v: Vec<Arc<TcpEngine>> = s.live.iter().filter_map(|w| w.upgrade()).collect();
        for e in &s.closing {
            if !v.iter().any(|x| Arc::ptr_eq(x, e)) {
                v.push(e.clone());
            }
        }
        s.closing.retain(|e| !e.engine.service_lost());
        v
    };
    let mut reset = 0;
    for e in engines.iter().filter(|e| e.engine.service_lost()) {
        let mut c = e.core();
        reset += c.stack.abort_active();
        e.transmit(&mut c, now_ns());
    }
    reset
}

/// At process exit. The kernel finishes a closed connection after its
/// process is gone (the orphan keeps sending, retransmitting and probing);
/// the engine goes with the process, so it finishes them first: every byte
/// still unsent or unacknowledged and the FIN exchange, for as long as the
/// peer makes progress (acknowledges or sends data, or a state moves: see
/// `TcpStack::progress`). Only connections none of which moved for `idle`
/// (a peer gone, or one keeping its window shut) are reset: an RST, so the
/// peer learns it at once and never waits for bytes that will not come.
/// TIME-WAIT is not waited for. Without this the peer's last segments
/// would reach the kernel, which answers RST, or, for a peer that only
/// waits for data, nothing would come at all. Returns the connections reset.
pub fn tcp_drain(idle: Duration) -> Drained {
    let mut seen = None;
    let mut since = Instant::now();
    let reset = loop {
        let engines: Vec<Arc<TcpEngine>> = service().closing.clone();
        let mut active = 0;
        let mut moved = 0u64;
        for e in &engines {
            let mut c = e.core();
            e.service_turn(&mut c);
            let (n, p) = c.stack.progress();
            active += n;
            moved = moved.rotate_left(13) ^ p;
        }
        if active == 0 {
            break 0;
        }
        if seen != Some(moved) {
            seen = Some(moved);
            since = Instant::now();
        } else if since.elapsed() >= idle {
            let mut reset = 0;
            for e in &engines {
                let mut c = e.core();
                reset += c.stack.abort_active();
                e.transmit(&mut c, now_ns());
            }
            break reset;
        }
        std::thread::sleep(Duration::from_micros(500));
    };
    let (time_wait, time_wait_note) = time_waits_to_kernel();
    Drained {
        reset,
        time_wait,
        time_wait_note,
    }
}

/// What [`tcp_drain`] did.
#[derive(Debug, Default)]
pub struct Drained {
    /// Connections reset: they made no progress for the idle time.
    pub reset: usize,
    /// Connections in TIME-WAIT handed to the kernel for the rest of their
    /// wait (`conns::time_wait_take`).
    pub time_wait: usize,
    /// Why some were not (the first error), for the caller to say.
    pub time_wait_note: Option<String>,
}

/// At exit, after the drain: every connection in TIME-WAIT goes to the
/// kernel for what its wait has left, without a segment on the wire
/// (`conns::time_wait_take`), while this process's claims still steer its
/// 4-tuple to the engine. The kernel keeps a closed socket's TIME-WAIT
/// after the process exits and ACKs the peer's retransmitted FIN (the
/// peer in LAST-ACK lost our last ACK, or died before taking it in and
/// its end was handed to its kernel, which sends the FIN again); without
/// this the segment reached a kernel without a socket for it, which reset
/// the connection (run_tcp's sockperf case on a loaded machine: the
/// server killed while our last ACK waited in its RX ring). Needs
/// CAP_NET_ADMIN (repair) and CAP_NET_RAW; returns how many, and the
/// first error.
fn time_waits_to_kernel() -> (usize, Option<String>) {
    let engines: Vec<Arc<TcpEngine>> = service().closing.clone();
    let now = now_ns();
    let mut waits = Vec::new();
    for e in &engines {
        e.core().stack.time_wait_ends(now, |s, left| {
            waits.push((super::service::conns::Entry::from(&s), left));
        });
    }
    if waits.is_empty() {
        return (0, None);
    }
    let ender = match super::service::conns::Ender::open() {
        Ok(r) => r,
        Err(e) => {
            return (
                0,
                Some(format!(
                    "{} tcp connection(s) in TIME-WAIT not handed to the kernel (a raw socket: {e}): their peers' late segments are reset",
                    waits.len()
                )),
            );
        }
    };
    // NANOWIRE_TCP_ORPHANS=0: nothing is handed to the kernel.
    let Some(raw) = ender.raw_for_repair() else {
        return (0, None);
    };
    let now_ms = (now / 1_000_000) as u32;
    let mut n = 0;
    let mut first = None;
    for (e, left) in &waits {
        let left_s = left.div_ceil(1_000_000_000).min(u64::from(u32::MAX)) as u32;
        match super::service::conns::time_wait_take(raw, e, now_ms, left_s) {
            Ok(()) => n += 1,
            Err(err) => {
                let denied = err.kind() == std::io::ErrorKind::PermissionDenied;
                first.get_or_insert(err);
                if denied {
                    break;
                }
            }
        }
    }
    let note = first.map(|err| {
        format!(
            "{} of {} tcp connection(s) in TIME-WAIT not handed to the kernel ({err}): their peers' late segments are reset",
            waits.len() - n,
            waits.len()
        )
    });
    (n, note)
}

/// The TCP driver's receive half: poll the receive device, then feed every
/// frame queued for endpoint `id` to `stack` (the payload is copied into
/// the connection's ring straight from the frame's buffers, a
/// super-frame's chain too, without gathering it; the frames go to `done`,
/// which hands them to the device's recycle list together, one lock for
/// all, when it is flushed or dropped: the TCP driver flushes it at its
/// next turn, `Core::recycle`). `now` is read (`clock`) only when a
/// segment came. Returns segments fed. Call under the RX lock (`g`).
/// `read`: the connection an application is reading meanwhile
/// ([`DirectRead`]), if any.
#[inline]
pub(crate) fn rx_segments<D: RxDevice>(
    g: &mut RxPath<D>,
    id: EndpointId,
    stack: &mut TcpStack,
    done: &mut nanowire_xdp::Recycler,
    now: &mut Option<u64>,
    clock: impl Fn() -> u64,
    mut read: Option<&mut DirectRead<'_>>,
) -> usize {
    let mut fed = 0;
    let mut feed = |d: super::demux::Delivery, h: &HeldBudget<'_>| {
        let t = *now.get_or_insert_with(&clock);
        input_one(stack, t, d, h, read.as_deref_mut(), done);
        fed += 1;
    };
    // What another endpoint's poll queued for this one came first.
    while let Some(d) = g.demux.pop(id, &g.page) {
        feed(d, &g.budget());
    }
    // Frames for a UDP socket whose queue is full wait in it past its cap
    // (bounded) rather than being dropped: this turn takes them off the
    // ring only to reach the stack's own segments (a readiness pass over a
    // TCP and a UDP socket turns the engine through the TCP one every call).
    // The stack's own segments go to it as the poll finds them, not through
    // its queue.
    g.demux.spill_for(Some(id));
    g.poll_own(RX_BUDGET, Some(id), usize::MAX, &mut feed);
    g.demux.spill_for(None);
    fed
}

/// One segment for the stack (under the RX lock); its frame goes to `done`.
/// A small one in one buffer (a request, a reply, an ACK) goes straight in;
/// the others are offered to keep (`input_held`), out of line.
#[inline]
fn input_one(
    stack: &mut TcpStack,
    t: u64,
    d: super::demux::Delivery,
    h: &HeldBudget<'_>,
    read: Option<&mut DirectRead<'_>>,
    done: &mut nanowire_xdp::Recycler,
) {
    probe::mark(Mark::TcpInputIn);
    if d.payload_len as usize >= nanowire_tcp::HOLD_MIN || d.frame.frames() != 1 {
        input_held(stack, (t, &d), h, read);
    } else {
        let to = Intake { read, hold: None };
        stack.input_with(t, *d.src.ip(), *d.dst.ip(), d.segment(), &[], to);
    }
    probe::mark(Mark::TcpInputOut);
    d.frame.recycle_into(done);
}

/// [`input_one`] for a segment with data enough to keep, or in several
/// buffers: offered to its connection with its frame (`Hold`) while the
/// engine's budget of held frames allows: kept, its bytes are copied once,
/// by the application's read, instead of into the receive ring and out
/// again (a kept frame's clone stays out of the fill ring until the
/// application read its bytes).
#[inline(never)]
fn input_held(
    stack: &mut TcpStack,
    (t, d): (u64, &super::demux::Delivery),
    h: &HeldBudget<'_>,
    read: Option<&mut DirectRead<'_>>,
) {
    let frames = d.frame.frames();
    let big = d.payload_len as usize >= nanowire_tcp::HOLD_MIN;
    let offer = big && h.held.load(Ordering::Relaxed) + frames <= h.limit;
    if big && !offer && h.limit > 0 {
        bump(h.page.e(E::TcpRxHoldLimited), 1);
    }
    let mut keep = || -> Box<dyn nanowire_tcp::HeldBytes> { Box::new(HeldFrame::new(d, h.held)) };
    let mut hold = offer.then(|| Hold {
        len: d.payload_len as usize,
        truesize: d.frame.truesize(),
        keep: &mut keep,
        kept: false,
    });
    let to = Intake {
        read,
        hold: hold.as_mut(),
    };
    if frames == 1 {
        // One buffer (every segment up to the MTU): no piece table
        // (MAX_PIECES slices, ~100 stores to set up per segment).
        stack.input_with(t, *d.src.ip(), *d.dst.ip(), d.segment(), &[], to);
    } else {
        input_chain(stack, t, d, to);
    }
    if hold.is_some_and(|k| k.kept) {
        peak(
            h.page.e(E::PeakTcpRxHeldFrames),
            h.held.load(Ordering::Relaxed) as u64,
        );
    }
}

/// A multi-buffer segment (a GSO/GRO super-frame) fed in its pieces.
#[inline(never)]
fn input_chain(stack: &mut TcpStack, t: u64, d: &super::demux::Delivery, to: Intake<'_, '_, '_>) {
    let mut rest: [&[u8]; MAX_PIECES] = [&[]; MAX_PIECES];
    let (head, n) = d.segment_parts(&mut rest);
    stack.input_with(t, *d.src.ip(), *d.dst.ip(), head, &rest[..n], to);
}

/// A segment's payload kept in its receive frame(s) by a connection
/// (`nanowire_tcp::Hold`): a clone of the frame (its reference keeps the
/// frame out of the fill ring), read in place piece by piece, counted in
/// the engine's held frames (`RxPath::held`) until dropped, when the last
/// reference gives the frame back.
struct HeldFrame {
    frame: nanowire_xdp::RxFrame,
    /// The payload: `[off, off + len)` of the packet's bytes.
    off: usize,
    len: usize,
    frames: usize,
    held: Arc<AtomicUsize>,
}

impl HeldFrame {
    fn new(d: &super::demux::Delivery, held: &Arc<AtomicUsize>) -> HeldFrame {
        let frames = d.frame.frames();
        held.fetch_add(frames, Ordering::Relaxed);
        HeldFrame {
            frame: d.frame.clone(),
            off: d.payload_off as usize,
            len: d.payload_len as usize,
            frames,
            held: held.clone(),
        }
    }
}

impl nanowire_tcp::HeldBytes for HeldFrame {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_out(&self, at: usize, out: &mut [u8]) -> usize {
        let want = out.len().min(self.len.saturating_sub(at));
        // Packet offsets: [from, from + want), walked over the buffers.
        let from = self.off + at;
        let (mut base, mut n) = (0usize, 0usize);
        for p in self.frame.pieces() {
            if n == want {
                break;
            }
            let end = base + p.len();
            if from + n < end {
                let s = from + n - base;
                let k = (p.len() - s).min(want - n);
                out[n..n + k].copy_from_slice(&p[s..s + k]);
                n += k;
            }
            base = end;
        }
        n
    }
}

impl Drop for HeldFrame {
    fn drop(&mut self) {
        self.held.fetch_sub(self.frames, Ordering::Relaxed);
    }
}

/// What the TCP driver builds frames with: the stack's next hops (a
/// bounded cache of the engine's neighbour table), one scratch segment (one
/// whose next hop was not cached, or a parked one), the IP id counter and
/// the interface's MAC.
pub(crate) struct Framer {
    hops: Box<[HopSlot; HOP_CACHE]>,
    scratch: Vec<u8>,
    ip_id: u16,
    src_mac: [u8; 6],
}

impl Framer {
    fn new(src_mac: [u8; 6]) -> Framer {
        Framer {
            hops: Box::new([HOP_EMPTY; HOP_CACHE]),
            scratch: vec![0u8; SLOT],
            ip_id: 1,
            src_mac,
        }
    }

    /// The TCP driver's transmit half: up to `TX_BATCH` segments of `stack`
    /// built straight in the transmit device's frames (one copy of the
    /// payload, Ethernet/IPv4 headers written in place for a next hop in
    /// the hop cache of neighbour generation `generation`), posted as one
    /// batch. A segment whose next hop is not cached ends the batch: it is
    /// moved to the scratch (after `HDRS` bytes) and returned, for the
    /// caller to finish outside the TX lock. Returns (segments posted, that
    /// segment). Call under the TX lock (`tx`).
    #[inline]
    fn tx_segments<D: TxDevice>(
        &mut self,
        tx: &mut TxPath<D>,
        stack: &mut TcpStack,
        generation: u64,
        now: u64,
    ) -> (usize, Option<nanowire_tcp::Transmit>) {
        let mut miss = None;
        let mut offloaded = 0u64;
        let Framer {
            hops,
            scratch,
            ip_id,
            src_mac,
        } = self;
        // `poll_transmit_owing` answers None when nothing is due (the frame goes
        // back to the pool): no separate `wants_transmit` per frame (the
        // caller asked it once before taking the TX lock). After a segment
        // that left nothing queued (`transmit_queued`: a ping-pong's one
        // segment) the batch ends without asking the stack again.
        let mut more = true;
        let n = tx.post_with(TX_BATCH, |_, fr| {
            if !more {
                return None;
            }
            let end = fr.len().min(SLOT);
            probe::mark(Mark::FrameFor);
            let t = stack.poll_transmit_owing(now, &mut fr[HDRS..end])?;
            probe::mark(Mark::SegmentBuilt);
            more = stack.transmit_queued();
            match cached_hop(hops, generation, t.dst) {
                Some(mac) => {
                    *ip_id = ip_id.wrapping_add(1);
                    write_hdrs(&mut fr[..HDRS], mac, *src_mac, &t, *ip_id);
                    offloaded += u64::from(t.csum_partial);
                    Some((HDRS + t.len, t.csum_partial.then_some(CSUM_REQUEST)))
                }
                None => {
                    scratch[HDRS..HDRS + t.len].copy_from_slice(&fr[HDRS..HDRS + t.len]);
                    miss = Some(t);
                    None
                }
            }
        });
        // The frames left (`post_with` kicked): the sender's end tracking
        // and timer now, not before the kick.
        stack.settle_owed();
        if offloaded > 0 {
            bump(tx.page.e(E::TxCsumOffload), offloaded);
        }
        (n, miss)
    }
}

/// Where a segment's checksum lies for an offload to complete it: from the
/// TCP header (after the Ethernet and IPv4 headers the engine writes), at
/// the checksum field.
const CSUM_REQUEST: nanowire_xdp::CsumRequest = nanowire_xdp::CsumRequest {
    start: HDRS as u16,
    offset: nanowire_wire::tcp::CHECKSUM_OFFSET,
};

/// Complete in software the checksum of a segment the stack left partial
/// (`Transmit::csum_partial`) that goes out as a finished frame (`post`).
#[cold]
fn finish_checksum(seg: &mut [u8], t: &nanowire_tcp::Transmit) {
    if t.csum_partial {
        nanowire_wire::tcp::fill_checksum(seg, t.src, t.dst);
    }
}

/// The cached next hop's MAC for `dst` if the cache entry is of the current
/// neighbour generation (no lock: for use under the TX lock).
#[inline]
fn cached_hop(hops: &[HopSlot; HOP_CACHE], generation: u64, dst: Ipv4Addr) -> Option<[u8; 6]> {
    let h = &hops[hop_slot(dst)];
    (h.dst == dst && h.generation == generation).then_some(h.mac)
}

/// Write the Ethernet and IPv4 headers of segment `t` into `f` (`HDRS` bytes).
#[inline]
fn write_hdrs(
    f: &mut [u8],
    mac: [u8; 6],
    src_mac: [u8; 6],
    t: &nanowire_tcp::Transmit,
    ident: u16,
) {
    eth_ipv4(mac, src_mac).emit(f);
    Ipv4Repr {
        src: t.src,
        dst: t.dst,
        protocol: PROTO_TCP,
        payload_len: t.len,
        ttl: t.ttl,
        ident,
    }
    .emit_tos(&mut f[ETH_HDR..], t.tos);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One host of a loopback wire: the engine's receive and transmit paths
    /// over the in-memory device, a TCP stack and the driver's framer.
    struct Host {
        rx: RxPath<crate::xdp::device::loopback::LoopRx>,
        tx: TxPath<crate::xdp::device::loopback::LoopTx>,
        id: EndpointId,
        stack: TcpStack,
        fr: Framer,
        /// The driver's deferred frames (`Core::recycle`).
        recycle: nanowire_xdp::Recycler,
        now: u64,
    }

    impl Host {
        fn new(
            dev: (
                crate::xdp::device::loopback::LoopRx,
                crate::xdp::device::loopback::LoopTx,
            ),
            me: (Ipv4Addr, [u8; 6]),
            peer: (Ipv4Addr, [u8; 6]),
        ) -> Host {
            use crate::xdp::testkit::{efd, page};
            let p = page();
            let mut rx = RxPath::new(
                dev.0,
                crate::xdp::demux::Demux::new(1024),
                vec![me.0],
                p.clone(),
            );
            rx.mac = Some(me.1);
            let id = rx.demux.add(EndpointKind::Tcp, efd(), 64).unwrap();
            rx.demux
                .bind(id, PROTO_TCP, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 80));
            rx.demux.bind(
                id,
                PROTO_TCP,
                SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 4000),
            );
            let cfg = Config {
                verify_checksum: false,
                ..Config::default()
            };
            let mut fr = Framer::new(me.1);
            fr.hops[hop_slot(peer.0)] = HopSlot {
                dst: peer.0,
                generation: 1,
                src: me.0,
                mac: peer.1,
            };
            Host {
                rx,
                tx: TxPath::new(dev.1, me.1, 32, p),
                id,
                stack: TcpStack::new(cfg, Secret::from_bytes([7; 16])),
                fr,
                recycle: Default::default(),
                now: 1_000_000,
            }
        }

        /// One driver turn: receive into the stack, timers, transmit.
        fn turn(&mut self) -> usize {
            self.now += 10_000;
            let t = self.now;
            let mut now = None;
            self.recycle.flush();
            let (stack, done) = (&mut self.stack, &mut self.recycle);
            let fed = rx_segments(&mut self.rx, self.id, stack, done, &mut now, || t, None);
            self.stack.poll_timers(t);
            let (sent, miss) = self.fr.tx_segments(&mut self.tx, &mut self.stack, 1, t);
            assert!(miss.is_none(), "every next hop is cached");
            fed + sent
        }
    }

    fn two_hosts() -> (Host, Host) {
        let (a, b) = crate::xdp::device::loopback::pair(2048);
        let ma = (Ipv4Addr::new(198, 18, 0, 1), [2, 0, 0, 0, 0, 1]);
        let mb = (Ipv4Addr::new(198, 18, 0, 2), [2, 0, 0, 0, 0, 2]);
        (Host::new(a, ma, mb), Host::new(b, mb, ma))
    }

    fn run(a: &mut Host, b: &mut Host) {
        for _ in 0..100 {
            if a.turn() + b.turn() == 0 {
                return;
            }
        }
        panic!("the hosts never went quiet");
    }

    /// A connection from `a` (198.18.0.1:4000) to `b`'s listener on port 80,
    /// established and accepted: (a's end, b's end).
    fn connected(a: &mut Host, b: &mut Host) -> (ConnId, ConnId) {
        let server = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 80);
        let l = b.stack.listen(server, 8).unwrap();
        let local = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 4000);
        let c = a.stack.connect(a.now, local, server).unwrap();
        run(a, b);
        (c, b.stack.accept(l).expect("accepted"))
    }

    /// One round of a stream from `a`'s connection `c`: what fits of
    /// `data` past `sent` is sent, then both hosts take a turn.
    fn step(a: &mut Host, b: &mut Host, c: ConnId, data: &[u8], sent: &mut usize) {
        if *sent < data.len() {
            *sent += a.stack.send(c, &data[*sent..]).unwrap_or(0);
        }
        a.turn();
        b.turn();
    }

    #[test]
    fn the_tcp_driver_connects_and_moves_data_over_the_loopback_device() {
        let (mut a, mut b) = two_hosts();
        let (c, s) = connected(&mut a, &mut b);
        assert_eq!(a.stack.state(c), Ok(State::Established));
        // 100 KB one way (many segments, batches of TX_BATCH), an answer back.
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut sent = 0;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        for _ in 0..1000 {
            step(&mut a, &mut b, c, &data, &mut sent);
            while let Ok(n) = b.stack.recv(s, &mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            if got.len() == data.len() {
                break;
            }
        }
        assert_eq!(got, data);
        b.stack.send(s, b"thanks").unwrap();
        run(&mut a, &mut b);
        let n = a.stack.recv(c, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"thanks");
        // Every frame the driver sent was a valid one the other side took.
        for h in [&a, &b] {
            let p = &h.rx.page;
            assert!(crate::xdp::testkit::identity_holds(p));
            assert_eq!(crate::xdp::testkit::drops(p), 0);
        }
    }

    /// The receive half keeps segments in their frames (`Hold`) within the
    /// engine's limit of held frames, copies past it, and every held frame
    /// is given back once the application read its bytes: the stream
    /// arrives intact, held and copied parts in order.
    #[test]
    fn the_receive_half_holds_frames_within_the_limit_and_releases_them_when_read() {
        let (mut a, mut b) = two_hosts();
        b.rx.hold_limit = 24;
        let (c, s) = connected(&mut a, &mut b);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let (mut sent, mut got, mut peak) = (0, Vec::new(), 0);
        let mut buf = vec![0u8; 5000];
        for round in 0..5000 {
            step(&mut a, &mut b, c, &data, &mut sent);
            peak = peak.max(b.rx.held.load(Ordering::Relaxed));
            // The reader lags: it reads one piece every third round.
            if round % 3 == 0
                && let Ok(n) = b.stack.recv(s, &mut buf)
            {
                got.extend_from_slice(&buf[..n]);
            }
            if got.len() == data.len() {
                break;
            }
        }
        assert!(
            got == data,
            "intact and in order ({} of {})",
            got.len(),
            data.len()
        );
        let held = b.stack.counters().rx_held_bytes;
        assert!(
            held > 0 && held < data.len() as u64,
            "held {held}: both paths"
        );
        assert!(peak > 0 && peak <= 24, "at most the limit held: {peak}");
        assert_eq!(b.rx.held.load(Ordering::Relaxed), 0, "all given back");
        assert_eq!(b.stack.rx_held(s), Ok((0, 0)));
    }

    /// A segment another endpoint's poll queued for the stack (a UDP
    /// socket's receive) goes in before the ones the stack's own turn then
    /// finds on the ring and takes without its queue: in order, none
    /// counted out of order.
    #[test]
    fn queued_segments_go_in_before_the_ones_the_turn_takes_from_the_ring() {
        let (mut a, mut b) = two_hosts();
        let (c, s) = connected(&mut a, &mut b);
        a.stack.set_nodelay(c, true).unwrap();
        a.stack.send(c, b"first ").unwrap();
        a.turn();
        b.rx.poll(RX_BUDGET);
        assert_eq!(b.rx.demux.get(b.id).unwrap().queue.len(), 1, "queued");
        a.stack.send(c, b"second").unwrap();
        a.turn();
        b.turn();
        assert!(b.rx.demux.get(b.id).unwrap().queue.is_empty());
        let (mut buf, mut got) = ([0u8; 64], Vec::new());
        while let Ok(n @ 1..) = b.stack.recv(s, &mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"first second");
        assert_eq!(b.stack.counters().out_of_order, 0);
        let p = &b.rx.page;
        assert!(crate::xdp::testkit::identity_holds(p));
        assert_eq!(crate::xdp::testkit::drops(p), 0);
    }

    #[test]
    fn an_uncached_next_hop_ends_the_batch_with_the_segment_kept() {
        let (mut a, _b) = two_hosts();
        let far = SocketAddrV4::new(Ipv4Addr::new(10, 9, 9, 9), 80);
        let local = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 4000);
        a.stack.connect(a.now, local, far).unwrap();
        let (sent, miss) = a.fr.tx_segments(&mut a.tx, &mut a.stack, 1, a.now);
        assert_eq!(sent, 0);
        let t = miss.expect("the SYN, kept for the slow path");
        assert_eq!(t.dst, *far.ip());
        // The segment sits after the headers' room in the scratch.
        let syn = &a.fr.scratch[HDRS..HDRS + t.len];
        assert_eq!(u16::from_be_bytes([syn[2], syn[3]]), 80);
        assert_eq!(syn[13] & 0x02, 0x02, "SYN");
        // A newer neighbour generation makes the cached hop stale too.
        let mut b = two_hosts().1;
        let to_a = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 80);
        let l2 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 4000);
        b.stack.connect(b.now, l2, to_a).unwrap();
        assert!(
            b.fr.tx_segments(&mut b.tx, &mut b.stack, 2, b.now)
                .1
                .is_some()
        );
    }

    #[test]
    fn the_receive_half_reads_the_clock_only_for_a_segment() {
        let (mut a, _b) = two_hosts();
        let mut now = None;
        let reads = std::cell::Cell::new(0);
        let done = &mut a.recycle;
        let clock = || {
            reads.set(reads.get() + 1);
            5
        };
        let fed = rx_segments(&mut a.rx, a.id, &mut a.stack, done, &mut now, clock, None);
        assert_eq!((fed, reads.get(), now), (0, 0, None));
    }

    #[test]
    fn a_corrupted_segment_is_dropped_by_the_classifier_not_fed_to_the_stack() {
        let (mut a, mut b) = two_hosts();
        let server = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 80);
        b.stack.listen(server, 8).unwrap();
        let local = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 4000);
        a.stack.connect(a.now, local, server).unwrap();
        a.turn();
        // Flip a bit of the SYN on the wire.
        let mut f = a.tx.dev.drain();
        assert_eq!(f.len(), 1);
        let last = f[0].len() - 1;
        f[0][last] ^= 1;
        b.rx.dev.inject(f.pop().unwrap());
        assert_eq!(b.turn(), 0, "nothing fed, nothing answered");
        assert_eq!(b.stack.counters().segs_in, 0);
        assert_eq!(crate::xdp::testkit::drops(&b.rx.page), 1);
    }

    /// The host secret is made once and then read back by every later
    /// caller (two processes get the same key, so their ISNs and TSvals
    /// for one 4-tuple keep increasing); a planted symlink or a file open
    /// to others is refused, never used.
    #[test]
    fn host_secret_is_shared_and_refuses_planted_files() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("nw-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
        let dir = base.join("run");
        let t = nanowire_tcp::FourTuple {
            local: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000),
            remote: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80),
        };
        let a = host_secret(&dir).unwrap();
        let b = host_secret(&dir).unwrap();
        assert_eq!(a.isn(&t, 0), b.isn(&t, 0));
        assert_eq!(a.ts_offset(&t), b.ts_offset(&t));
        let m = std::fs::metadata(dir.join("tcp-secret")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        // Open to others: refused.
        std::fs::set_permissions(
            dir.join("tcp-secret"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert!(host_secret(&dir).is_err());
        // A symlink in its place: refused (O_NOFOLLOW).
        std::fs::remove_file(dir.join("tcp-secret")).unwrap();
        std::os::unix::fs::symlink(base.join("elsewhere"), dir.join("tcp-secret")).unwrap();
        assert!(host_secret(&dir).is_err());
        let _ = std::fs::remove_dir_all(&base);
    }
    use nanowire_wire::Ipv4Packet;

    /// The two halves of the ephemeral range: the first has the parity
    /// opposite to the range start's (bind(0)'s; the kernel's connect()
    /// takes the start's), and together they cover every port once.
    #[test]
    fn ephemeral_halves_split_the_range_by_parity() {
        for (lo, hi) in [
            (32768u16, 60999u16),
            (32769, 61000),
            (1024, 1024),
            (40000, 40001),
            (1, 65535),
        ] {
            let mut seen = std::collections::BTreeSet::new();
            for half in 0..2 {
                let (first, count) = parity_half(lo, hi, half);
                for i in 0..count {
                    let p = first + 2 * i as u16;
                    assert!((lo..=hi).contains(&p), "{p} outside {lo}-{hi}");
                    assert_eq!(
                        p % 2 == lo % 2,
                        half == 1,
                        "{p} in half {half} of {lo}-{hi}"
                    );
                    assert!(seen.insert(p), "{p} twice");
                }
            }
            assert_eq!(seen.len(), usize::from(hi - lo) + 1);
        }
    }

    #[test]
    fn cached_hop_takes_only_the_current_generation() {
        let a = Ipv4Addr::new(198, 18, 0, 2);
        let b = Ipv4Addr::new(198, 18, 0, 3);
        let src = Ipv4Addr::new(198, 18, 0, 1);
        let mut hops = [HOP_EMPTY; HOP_CACHE];
        for (dst, generation, mac) in [(a, 7, [1; 6]), (b, 6, [2; 6])] {
            hops[hop_slot(dst)] = HopSlot {
                dst,
                generation,
                src,
                mac,
            };
        }
        assert_eq!(cached_hop(&hops, 7, a), Some([1; 6]));
        // A stale entry (the neighbour table changed since) is a miss: the
        // segment takes the locked path, which looks the hop up again.
        assert_eq!(cached_hop(&hops, 7, b), None);
        assert_eq!(cached_hop(&hops, 7, Ipv4Addr::new(10, 0, 0, 1)), None);
    }

    #[test]
    fn headers_written_in_place_are_a_valid_ipv4_frame() {
        let t = nanowire_tcp::Transmit {
            csum_partial: false,
            src: Ipv4Addr::new(198, 18, 0, 1),
            dst: Ipv4Addr::new(198, 18, 0, 2),
            len: 1000,
            ttl: 64,
            tos: 0x10,
        };
        let mut f = vec![0xAAu8; HDRS + t.len];
        write_hdrs(&mut f[..HDRS], [2; 6], [3; 6], &t, 0x1234);
        assert_eq!(&f[0..6], &[2; 6]);
        assert_eq!(&f[6..12], &[3; 6]);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        let p = Ipv4Packet::new_checked(&f[ETH_HDR..]).expect("checked view");
        assert!(p.verify_checksum());
        let r = Ipv4Repr::parse(&p, true).expect("parses");
        assert_eq!((r.src, r.dst, r.payload_len), (t.src, t.dst, t.len));
        assert_eq!((r.ttl, r.ident, r.protocol), (64, 0x1234, PROTO_TCP));
        // The segment after the headers is left alone.
        assert!(f[HDRS..].iter().all(|&b| b == 0xAA));
    }
}
