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
//!   socket) reads `/proc/net/udp` and `/proc/net/udp6` every
//!   [`PERIOD_MS`] ms and takes a socket off the engine as soon as another
//!   socket shares its port. Datagrams the engine had queued are delivered
//!   first; what arrives between the other socket's bind and the next scan
//!   still goes to the accelerated socket (a window of at most one period).
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
use std::net::{Ipv4Addr, SocketAddrV4};
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

fn hex_v4(h: &str) -> Option<Ipv4Addr> {
    // /proc/net/udp prints the address as the host-order u32 of the
    // network-order bytes (little-endian machines: reversed).
    let v = u32::from_str_radix(h, 16).ok()?;
    Some(Ipv4Addr::from(v.to_ne_bytes()))
}

fn hex_v6_as_v4(h: &str) -> Option<Ipv4Addr> {
    if h.len() != 32 {
        return None;
    }
    let words: Vec<u32> = (0..4)
        .map(|i| u32::from_str_radix(&h[i * 8..i * 8 + 8], 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    if bytes.iter().all(|&b| b == 0) {
        return Some(Ipv4Addr::UNSPECIFIED); // "::" (dual-stack wildcard)
    }
    if bytes[..10].iter().all(|&b| b == 0) && bytes[10] == 0xff && bytes[11] == 0xff {
        return Some(Ipv4Addr::new(bytes[12], bytes[13], bytes[14], bytes[15]));
    }
    None // a real IPv6 address: no IPv4 traffic
}

fn read_table(path: &str, v6: bool, out: &mut Vec<Bound>) {
    let Ok(s) = std::fs::read_to_string(path) else {
        return;
    };
    for line in s.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let Some((a, p)) = f[1].split_once(':') else {
            continue;
        };
        let addr = if v6 { hex_v6_as_v4(a) } else { hex_v4(a) };
        let (Some(addr), Ok(port), Ok(inode)) =
            (addr, u16::from_str_radix(p, 16), f[9].parse::<u64>())
        else {
            continue;
        };
        out.push(Bound { addr, port, inode });
    }
}

fn bound_sockets() -> Vec<Bound> {
    let mut v = Vec::new();
    sys::engine_call(|| {
        read_table("/proc/net/udp", false, &mut v);
        read_table("/proc/net/udp6", true, &mut v);
    });
    v
}

fn overlaps(ours: Ipv4Addr, other: Ipv4Addr) -> bool {
    ours == other
        || other.is_unspecified()
        || (ours.is_unspecified() && !other.is_loopback())
        || (ours.is_multicast() || other.is_multicast())
}

fn inode_of(fd: c_int) -> u64 {
    // SAFETY: the fd is only borrowed for fstat; a closed fd gives EBADF.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(b).map_or(0, |st| st.st_ino)
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
    competitor_in(&bound_sockets(), local, inode)
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
        && let Some(o) = competitor(local, inode_of(fd))
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
        std::thread::Builder::new()
            .name("nanowire-share".into())
            .spawn(move || watcher(pid))
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

fn watcher(pid: u32) {
    // Everything this thread does is the shim's own business.
    sys::engine_call(|| {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(PERIOD_MS));
            if std::process::id() != pid {
                return;
            }
            let ours = accel::live_sockets();
            if ours.is_empty() {
                continue;
            }
            let all = bound_sockets();
            for (fd, local) in ours {
                if let Some(o) = competitor_in(&all, local, inode_of(fd)) {
                    TAKEN_OFF.fetch_add(1, Ordering::Relaxed);
                    accel::detach(fd, &why(o));
                }
            }
        }
    });
}
