//! Ports shared with other sockets on the host (issue 9, items 3 and 4).
//!
//! The kernel gives a unicast datagram to the best-matching bound socket
//! (a specific address beats the wildcard) and a multicast or broadcast
//! datagram to every socket bound to its port. The engine's XDP program
//! steers a port's traffic to ONE accelerated socket, so an accelerated
//! socket whose port another socket of this network namespace also binds
//! (any process, plain or accelerated: SO_REUSEADDR) would take datagrams
//! the kernel gives to the other one. Such a socket is served by the
//! kernel instead, with one warn line saying so:
//!
//! * at `bind` and at `IP_ADD_MEMBERSHIP`: when another socket already
//!   shares the port, the socket is not put on (or is taken off) the engine;
//! * afterwards: a watcher thread (started with the first accelerated
//!   socket) looks every [`PERIOD_MS`] ms at the namespace's count of
//!   bound UDP sockets (/proc/net/sockstat{,6}) and, when it moved (or
//!   every [`FULL_EVERY`] periods), lists the bound sockets (sock_diag
//!   netlink; /proc/net/udp{,6} if refused) and takes a socket off the
//!   engine as soon as another socket shares its port. Datagrams the
//!   engine had queued are delivered first; what arrives between the
//!   other socket's bind and the next scan still goes to the accelerated
//!   socket (a window of at most one period; [`FULL_EVERY`] periods if a
//!   socket closed and another bound within the same period).
//!
//! "Shares" means: same port, and the addresses overlap — equal, either
//! one the wildcard (a loopback-bound socket never competes with a socket
//! on the lab interface: loopback traffic does not pass XDP). IPv6 sockets
//! bound to `::` (dual-stack: Java, Node) or to an IPv4-mapped address
//! count too. The socket itself (same inode: dups, a forked child) does not.
//! Counted: [`TAKEN_OFF`], and every decision has its own log line.

use crate::accel;
use crate::sys;
use libc::c_int;
use nanowire_sockabi::procnet;
use nanowire_stack::xdp::host::above_floor;
use rustix::fd::OwnedFd;
use rustix::fs::OFlags;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub const PERIOD_MS: u64 = 20;

/// Sockets kept on, or taken back to, the kernel because their port is shared.
pub static TAKEN_OFF: AtomicU64 = AtomicU64::new(0);

/// One bound UDP socket of the namespace.
struct Bound {
    addr: Ipv4Addr,
    port: u16,
    inode: u64,
}

/// The bound sockets of `/proc/net/udp{,6}` (IPv6: those that receive
/// IPv4 traffic, see [`v6_as_v4`]).
fn read_table(path: &str, out: &mut Vec<Bound>) {
    let Ok(text) = std::fs::read(path) else {
        return;
    };
    for e in procnet::table(&text) {
        let addr = match e.local.ip() {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(a) => v6_as_v4(&a.octets()),
        };
        if let Some(addr) = addr {
            let (port, inode) = (e.local.port(), e.inode);
            out.push(Bound { addr, port, inode });
        }
    }
}

/// The namespace's bound UDP sockets: a sock_diag netlink dump per family
/// (binary records, nothing formatted or parsed as text), or
/// `/proc/net/udp{,6}` when netlink is refused. Either way the kernel walks
/// its whole UDP hash table (16384 slots here, ~1 ms per family whatever
/// the number of sockets), hence the watcher's gate on the socket count.
/// `kept`: the watcher's sock_diag socket; `None`: one for this call.
fn bound_sockets(kept: Option<&OwnedFd>) -> Vec<Bound> {
    let mut v = Vec::new();
    sys::engine_call(|| {
        let own;
        let fd = match kept {
            Some(fd) => Some(fd),
            None => {
                own = diag_socket().ok();
                own.as_ref()
            }
        };
        if fd.is_none_or(|fd| {
            diag_table(fd, libc::AF_INET as u8, &mut v).is_err()
                || diag_table(fd, libc::AF_INET6 as u8, &mut v).is_err()
        }) {
            v.clear();
            read_table("/proc/net/udp", &mut v);
            read_table("/proc/net/udp6", &mut v);
        }
    });
    v
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// nlmsghdr (16) + inet_diag_req_v2 (8 + a 48-byte inet_diag_sockid).
const REQ_LEN: usize = 72;
/// nlmsghdr (16) + inet_diag_msg up to idiag_inode (4 + 48 + 5 × 4).
const MSG_MIN: usize = 16 + 72;

/// Append the UDP sockets of one family (raw syscalls: rustix, not libc).
fn diag_socket() -> rustix::io::Result<OwnedFd> {
    rustix::net::socket_with(
        rustix::net::AddressFamily::NETLINK,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        Some(rustix::net::netlink::SOCK_DIAG),
    )
}

/// Append the UDP sockets of one family through `fd` (a dump read to its
/// end, or the error; what a failed dump left queued is drained before
/// the next request).
fn diag_table(fd: &OwnedFd, family: u8, out: &mut Vec<Bound>) -> rustix::io::Result<()> {
    use rustix::net::{RecvFlags, SendFlags, netlink};
    let mut buf = vec![0u8; 32 * 1024];
    while rustix::net::recv(fd, &mut buf[..], RecvFlags::DONTWAIT).is_ok_and(|(n, _)| n > 0) {}
    let mut req = [0u8; REQ_LEN];
    req[0..4].copy_from_slice(&(REQ_LEN as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[16] = family;
    req[17] = libc::IPPROTO_UDP as u8;
    req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes()); // every state
    rustix::net::sendto(
        fd,
        &req,
        SendFlags::empty(),
        &netlink::SocketAddrNetlink::new(0, 0),
    )?;
    loop {
        let n = rustix::net::recv(fd, &mut buf[..], RecvFlags::empty())?.0;
        if n == 0 {
            return Err(rustix::io::Errno::IO);
        }
        let mut off = 0;
        while off + 16 <= n {
            let m = &buf[off..n];
            let len = u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) as usize;
            let ty = u16::from_ne_bytes([m[4], m[5]]);
            if len < 16 || len > m.len() {
                return Err(rustix::io::Errno::IO);
            }
            match ty {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => return Err(rustix::io::Errno::IO),
                SOCK_DIAG_BY_FAMILY if len >= MSG_MIN => {
                    let port = u16::from_be_bytes([m[20], m[21]]);
                    let addr = if family == libc::AF_INET as u8 {
                        Some(Ipv4Addr::new(m[24], m[25], m[26], m[27]))
                    } else {
                        v6_as_v4(&m[24..40])
                    };
                    let inode = u32::from_ne_bytes([m[84], m[85], m[86], m[87]]);
                    if let Some(addr) = addr {
                        out.push(Bound {
                            addr,
                            port,
                            inode: u64::from(inode),
                        });
                    }
                }
                _ => {}
            }
            off += (len + 3) & !3;
        }
    }
}

/// An IPv6 socket address as the IPv4 traffic it can receive: `::` (the
/// dual-stack wildcard) or `::ffff:a.b.c.d`; None for a real IPv6 address.
fn v6_as_v4(b: &[u8]) -> Option<Ipv4Addr> {
    if b.iter().all(|&x| x == 0) {
        return Some(Ipv4Addr::UNSPECIFIED);
    }
    if b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff {
        return Some(Ipv4Addr::new(b[12], b[13], b[14], b[15]));
    }
    None
}

fn overlaps(ours: Ipv4Addr, other: Ipv4Addr) -> bool {
    ours == other
        || other.is_unspecified()
        || (ours.is_unspecified() && !other.is_loopback())
        || (ours.is_multicast() || other.is_multicast())
}

fn competitor_in(all: &[Bound], local: SocketAddrV4, inode: u64) -> Option<SocketAddrV4> {
    all.iter()
        .find(|b| b.port == local.port() && b.inode != inode && overlaps(*local.ip(), b.addr))
        .map(|b| SocketAddrV4::new(b.addr, b.port))
}

/// Another socket of this namespace that shares `local`'s port (`inode`:
/// the socket itself, 0 if not bound yet).
pub fn competitor(local: SocketAddrV4, inode: u64) -> Option<SocketAddrV4> {
    if local.port() == 0 {
        return None;
    }
    competitor_in(&bound_sockets(None), local, inode)
}

pub fn why(other: SocketAddrV4) -> String {
    format!(
        "port {} is shared with another socket on this host ({other}): the kernel decides which gets each datagram",
        other.port()
    )
}

/// Check an accelerated socket now (after IP_ADD_MEMBERSHIP).
pub fn check_now(fd: c_int) {
    if let Some(local) = accel::local_addr(fd)
        && let Some(o) = competitor(local, sys::inode_of(fd))
    {
        TAKEN_OFF.fetch_add(1, Ordering::Relaxed);
        accel::detach(fd, &why(o));
    }
}

static WATCHING: AtomicBool = AtomicBool::new(false);

/// Start the watcher (once per process; again in a forked child).
pub fn watch() {
    if WATCHING.swap(true, Ordering::AcqRel) {
        return;
    }
    let pid = std::process::id();
    let r = sys::engine_call(|| {
        let kept = Kept::open();
        std::thread::Builder::new()
            .name("nanowire-share".into())
            .spawn(move || watcher(pid, kept))
    });
    if r.is_err() {
        WATCHING.store(false, Ordering::Release);
    }
}

/// A forked child has no watcher thread (threads do not survive fork).
extern "C" fn after_fork_child() {
    WATCHING.store(false, Ordering::Release);
}

pub fn init() {
    // SAFETY: registering a plain extern "C" handler that only stores to
    // an atomic.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
}

/// A full scan at least this often even when the bound-socket counts did
/// not move (one socket closed and another bound in the same period).
const FULL_EVERY: u32 = 50;

/// The namespace's count of bound UDP and UDP6 sockets ("inuse" of
/// /proc/net/sockstat{,6}: per-CPU counters summed, no table walk).
fn udp_inuse(k: &Kept) -> Option<(u64, u64)> {
    fn inuse(f: Option<&OwnedFd>, key: &str) -> Option<u64> {
        // Read again from the start: procfs makes the text afresh.
        let mut buf = [0u8; 1024];
        let n = rustix::io::pread(f?, &mut buf, 0).ok()?;
        let s = std::str::from_utf8(&buf[..n]).ok()?;
        let line = s.lines().find(|l| l.starts_with(key))?;
        let mut it = line.split_whitespace();
        while let Some(w) = it.next() {
            if w == "inuse" {
                return it.next()?.parse().ok();
            }
        }
        None
    }
    Some((
        inuse(k.sockstat.as_ref(), "UDP:")?,
        inuse(k.sockstat6.as_ref(), "UDP6:").unwrap_or(0),
    ))
}

/// What the watcher reads, opened once by [`watch`] in the caller's thread
/// and kept above the program's numbers (`above_floor`): the watcher
/// thread opens no descriptor (it would take a number the program just
/// freed, every period). `None`: could not be opened (no /proc: the
/// watcher then scans every period; no sock_diag: a socket per scan).
struct Kept {
    sockstat: Option<OwnedFd>,
    sockstat6: Option<OwnedFd>,
    diag: Option<OwnedFd>,
}

impl Kept {
    fn open() -> Kept {
        let file = |p: &str| {
            rustix::fs::open(
                p,
                OFlags::RDONLY | OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok()
            .map(above_floor)
        };
        Kept {
            sockstat: file("/proc/net/sockstat"),
            sockstat6: file("/proc/net/sockstat6"),
            diag: diag_socket().ok().map(above_floor),
        }
    }
}

fn watcher(pid: u32, kept: Kept) {
    // Everything this thread does is the shim's own business.
    sys::engine_call(|| {
        // A scan walks the kernel's whole UDP hash table (~1 ms of memory
        // traffic per family here, whatever the number of sockets): only
        // when the namespace's bound-socket counts moved, or every
        // FULL_EVERY periods.
        let mut last = None;
        let mut since_full = 0u32;
        loop {
            std::thread::sleep(std::time::Duration::from_millis(PERIOD_MS));
            if std::process::id() != pid {
                return;
            }
            let now = udp_inuse(&kept);
            since_full += 1;
            if now.is_some() && now == last && since_full < FULL_EVERY {
                continue;
            }
            last = now;
            since_full = 0;
            let ours = accel::live_sockets();
            if ours.is_empty() {
                continue;
            }
            let all = bound_sockets(kept.diag.as_ref());
            for (fd, local) in ours {
                if let Some(o) = competitor_in(&all, local, sys::inode_of(fd)) {
                    TAKEN_OFF.fetch_add(1, Ordering::Relaxed);
                    accel::detach(fd, &why(o));
                }
            }
        }
    });
}
