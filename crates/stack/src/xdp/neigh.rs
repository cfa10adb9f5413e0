//! Neighbours as the kernel sees them, without ever making a sender wait.
//!
//! A destination's entry is one of:
//! * `Ready(Xdp{src, mac})`: frames go out through the rings;
//! * `Ready(Kernel)`: not through our interface (loopback, another NIC, a
//!   local address): the socket's kernel twin sends it;
//! * `Pending`: the kernel is resolving the next hop (ARP). Datagrams wait
//!   in the entry, bounded as the kernel bounds its `arp_queue` (by
//!   default `unres_qlen_bytes` = 212992 bytes of truesize, ~101 full-size
//!   packets; the old default of 3 packets is too few: a sender whose
//!   first datagrams are a warm-up, e.g. sockperf, would lose the real
//!   ones). When full, the oldest is dropped, counted, as in the kernel.
//!   The send itself returns success, as the kernel's does;
//! * `Failed`: resolution failed less than [`NEGATIVE_TTL`] ago (the
//!   negative cache). Sends are counted drops; a connected socket gets
//!   EHOSTUNREACH, as from the kernel.
//!
//! Route and neighbour lookups (rtnetlink) run in the sending thread only
//! on a cache miss and outside every lock; waiting for an ARP answer
//! happens in the engine's neighbour thread, which also follows the
//! kernel's neighbour and route changes (RTM_NEWNEIGH/DELNEIGH,
//! RTM_NEWROUTE/DELROUTE) so that a changed MAC or route is used within
//! milliseconds. Each change bumps a generation number; sockets cache their
//! last destination and revalidate it with one atomic load.

use super::demux::FastMap;
use super::shm::{E, S, StatsPage, add};
use super::tx::{TxPath, Wire};
use nanowire_xdp::netlink::{self, Event, Monitor, Route};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Datagrams held per unresolved neighbour at most (the kernel's
/// `unres_qlen` default).
pub const QUEUE_PER_NEIGH: usize = 101;
/// Bytes held per unresolved neighbour, counting each datagram as the
/// kernel counts an skb's truesize (payload + ~768 bytes of overhead); the
/// kernel's `unres_qlen_bytes` default.
pub const QUEUE_BYTES_PER_NEIGH: usize = 212_992;
const TRUESIZE_OVERHEAD: usize = 768;
/// Give up resolving after this long (the kernel's default: 3 probes, 1 s
/// apart).
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a failed resolution is remembered.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(1);
/// Re-read the kernel's entry of a pending neighbour this often (a safety
/// net: the answer normally arrives as an event).
const RECHECK: Duration = Duration::from_millis(50);

/// How a destination is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    Xdp { src: Ipv4Addr, mac: [u8; 6] },
    Kernel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    Ready(Hop),
    Unknown,
    Pending,
    Failed,
}

pub(crate) struct Queued {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub slot: usize,
    pub payload: Vec<u8>,
}

enum State {
    Ready(Hop),
    Pending {
        since: Instant,
        checked: Instant,
        queue: Vec<Queued>,
    },
    Failed {
        until: Instant,
    },
}

struct Entry {
    /// The next hop whose MAC this entry needs (gateway or destination).
    hop: Ipv4Addr,
    src: Ipv4Addr,
    state: State,
}

pub(crate) struct Neigh {
    generation: AtomicU64,
    map: Mutex<FastMap<u32, Entry>>,
    wake: OwnedFd,
    stop: AtomicBool,
    ifindex: u32,
    ifaddr: Option<Ipv4Addr>,
    page: Arc<StatsPage>,
}

fn eventfd() -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain eventfd(2); checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Neigh {
    pub fn new(ifindex: u32, ifaddr: Option<Ipv4Addr>, page: Arc<StatsPage>) -> io::Result<Neigh> {
        Ok(Neigh {
            generation: AtomicU64::new(1),
            map: Mutex::new(FastMap::default()),
            wake: eventfd()?,
            stop: AtomicBool::new(false),
            ifindex,
            ifaddr,
            page,
        })
    }

    fn lock(&self) -> MutexGuard<'_, FastMap<u32, Entry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes so far (a socket's cached hop is good while this is equal).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn wake_worker(&self) {
        super::demux::eventfd_write(self.wake.as_raw_fd());
    }

    pub fn lookup(&self, dst: Ipv4Addr) -> Lookup {
        match self.lock().get(&dst.to_bits()).map(|e| &e.state) {
            None => Lookup::Unknown,
            Some(State::Ready(h)) => Lookup::Ready(*h),
            Some(State::Pending { .. }) => Lookup::Pending,
            Some(State::Failed { until }) if Instant::now() < *until => Lookup::Failed,
            Some(State::Failed { .. }) => Lookup::Unknown,
        }
    }

    /// Find out how `dst` is reached: route and neighbour table lookups
    /// (rtnetlink; quick, never waiting for the network), in the calling
    /// thread with no lock held. An unresolved next hop becomes `Pending`
    /// and the neighbour thread takes over.
    pub fn learn(&self, dst: Ipv4Addr) -> io::Result<()> {
        let route = if dst.is_multicast() || dst.is_broadcast() {
            Route {
                oif: self.ifindex,
                gateway: None,
                prefsrc: self.ifaddr,
                kind: netlink::RTN_MULTICAST,
            }
        } else {
            netlink::route_get(dst).map_err(|e| {
                let kind = match e.raw_os_error() {
                    Some(libc::ENETUNREACH) => io::ErrorKind::NetworkUnreachable,
                    Some(libc::EHOSTUNREACH) => io::ErrorKind::HostUnreachable,
                    _ => e.kind(),
                };
                io::Error::new(kind, format!("no route to {dst}: {e}"))
            })?
        };
        let hop = route.next_hop(dst);
        if route.oif != self.ifindex || route.kind == netlink::RTN_LOCAL {
            self.insert(dst, hop, Ipv4Addr::UNSPECIFIED, State::Ready(Hop::Kernel));
            return Ok(());
        }
        let src = route.prefsrc.or(self.ifaddr).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                "interface has no IPv4 address",
            )
        })?;
        if let Some(mac) = netlink::static_mac(dst, &route) {
            self.insert(dst, hop, src, State::Ready(Hop::Xdp { src, mac }));
            return Ok(());
        }
        match netlink::neigh_get(self.ifindex, hop) {
            Ok(Some(mac)) => {
                self.insert(dst, hop, src, State::Ready(Hop::Xdp { src, mac }));
            }
            _ => {
                let now = Instant::now();
                let fresh = self.insert(
                    dst,
                    hop,
                    src,
                    State::Pending {
                        since: now,
                        checked: now,
                        queue: Vec::new(),
                    },
                );
                if fresh {
                    netlink::solicit(hop);
                    self.wake_worker();
                }
            }
        }
        Ok(())
    }

    /// Insert unless an entry is there already (another thread was
    /// faster); an expired negative entry is replaced. Returns whether it
    /// inserted.
    fn insert(&self, dst: Ipv4Addr, hop: Ipv4Addr, src: Ipv4Addr, state: State) -> bool {
        let mut m = self.lock();
        let k = dst.to_bits();
        let replace = match m.get(&k) {
            None => true,
            Some(Entry {
                state: State::Failed { until },
                ..
            }) => Instant::now() >= *until,
            Some(_) => false,
        };
        if replace {
            m.insert(k, Entry { hop, src, state });
            drop(m);
            self.changed();
        }
        replace
    }

    /// Hold a datagram for a pending neighbour, dropping the oldest held
    /// ones (counted) when over the bounds, as the kernel does.
    /// `Err(datagram, hop)`: the neighbour was resolved meanwhile, send it
    /// now. A neighbour neither pending nor resolved any more (failed,
    /// forgotten): a counted drop.
    pub fn enqueue(&self, q: Queued) -> Result<(), (Queued, Hop)> {
        let mut m = self.lock();
        match m.get_mut(&q.dst.ip().to_bits()).map(|e| &mut e.state) {
            Some(State::Pending { queue, .. }) => {
                let size = |q: &Queued| q.payload.len() + TRUESIZE_OVERHEAD;
                let mut bytes: usize = queue.iter().map(size).sum::<usize>() + size(&q);
                while !queue.is_empty()
                    && (queue.len() >= QUEUE_PER_NEIGH || bytes > QUEUE_BYTES_PER_NEIGH)
                {
                    let old = queue.remove(0);
                    bytes -= size(&old);
                    self.count_drop(old.slot, 1);
                }
                queue.push(q);
                Ok(())
            }
            Some(State::Ready(h)) => {
                let h = *h;
                Err((q, h))
            }
            _ => {
                drop(m);
                self.count_drop(q.slot, 1);
                Ok(())
            }
        }
    }

    pub fn count_drop(&self, slot: usize, n: u64) {
        add(self.page.e(E::DropNeighUnresolved), n);
        add(self.page.s(slot, S::DropNeigh), n);
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake_worker();
    }

    /// Apply kernel events; returns datagrams that became sendable.
    fn apply(&self, events: &[Event], out: &mut Vec<(Queued, [u8; 6])>) {
        if events.is_empty() {
            return;
        }
        let mut m = self.lock();
        let mut changed = false;
        for ev in events {
            match *ev {
                Event::Neigh {
                    ifindex,
                    ip,
                    mac,
                    state,
                    deleted,
                } if ifindex == self.ifindex => {
                    let failed = deleted || state & netlink::NUD_FAILED != 0;
                    let mut gone = Vec::new();
                    for (k, e) in m.iter_mut().filter(|(_, e)| e.hop == ip) {
                        match (&mut e.state, mac) {
                            (State::Ready(Hop::Xdp { mac: old, .. }), Some(new)) if *old != new => {
                                *old = new;
                                changed = true;
                            }
                            (State::Ready(Hop::Xdp { .. }), None) if failed => {
                                gone.push(*k);
                            }
                            (State::Pending { queue, .. }, Some(new)) => {
                                out.extend(std::mem::take(queue).into_iter().map(|q| (q, new)));
                                e.state = State::Ready(Hop::Xdp {
                                    src: e.src,
                                    mac: new,
                                });
                                add(self.page.e(E::NeighResolutions), 1);
                                changed = true;
                            }
                            (State::Pending { queue, .. }, None)
                                if state & netlink::NUD_FAILED != 0 =>
                            {
                                for q in std::mem::take(queue) {
                                    self.count_drop(q.slot, 1);
                                }
                                e.state = State::Failed {
                                    until: Instant::now() + NEGATIVE_TTL,
                                };
                                changed = true;
                            }
                            _ => {}
                        }
                    }
                    for k in gone {
                        m.remove(&k);
                        changed = true;
                    }
                }
                Event::Route | Event::Overrun => {
                    // Sources and next hops may all have changed: forget
                    // what is resolved (pending ones finish on their own).
                    m.retain(|_, e| !matches!(e.state, State::Ready(_)));
                    changed = true;
                }
                _ => {}
            }
        }
        drop(m);
        if changed {
            self.changed();
        }
    }

    /// Time out pending entries; returns the next hops to re-read.
    fn expire(&self) -> (Vec<Ipv4Addr>, bool) {
        let now = Instant::now();
        let mut m = self.lock();
        let mut check = Vec::new();
        let mut changed = false;
        let mut pending = false;
        for e in m.values_mut() {
            if let State::Pending {
                since,
                checked,
                queue,
            } = &mut e.state
            {
                if now.duration_since(*since) >= RESOLVE_TIMEOUT {
                    for q in std::mem::take(queue) {
                        self.count_drop(q.slot, 1);
                    }
                    e.state = State::Failed {
                        until: now + NEGATIVE_TTL,
                    };
                    changed = true;
                } else {
                    pending = true;
                    if now.duration_since(*checked) >= RECHECK {
                        *checked = now;
                        check.push(e.hop);
                    }
                }
            }
        }
        // Expired negative entries go (the next send resolves again).
        m.retain(|_, e| !matches!(e.state, State::Failed { until } if now >= until));
        drop(m);
        if changed {
            self.changed();
        }
        (check, pending)
    }
}

/// The neighbour thread: waits for kernel events, re-reads pending
/// entries, sends what was waiting for a MAC. Exits when the engine stops
/// it. Runs with every signal blocked (it lives inside applications).
pub(crate) fn run(neigh: Arc<Neigh>, tx: Arc<Mutex<TxPath>>) {
    let mut mon = Monitor::open().ok();
    let mut events = Vec::new();
    let mut ready = Vec::new();
    let mut pending = true;
    loop {
        let mut pfds = [
            libc::pollfd {
                fd: neigh.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: mon.as_ref().map_or(-1, |m| m.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = if pending || mon.is_none() {
            RECHECK.as_millis() as i32
        } else {
            -1
        };
        // Raw syscalls: this thread must never enter the LD_PRELOAD shim.
        nanowire_xdp::sys::poll(&mut pfds, timeout);
        nanowire_xdp::sys::eventfd_drain(neigh.wake.as_raw_fd());
        if neigh.stop.load(Ordering::Acquire) {
            return;
        }
        events.clear();
        if let Some(m) = &mut mon {
            m.read(&mut events);
        }
        let (check, p) = neigh.expire();
        pending = p;
        for hop in check {
            // Netlink with no lock held.
            if let Ok(Some(mac)) = netlink::neigh_get(neigh.ifindex, hop) {
                events.push(Event::Neigh {
                    ifindex: neigh.ifindex,
                    ip: hop,
                    mac: Some(mac),
                    state: 0x02,
                    deleted: false,
                });
            }
        }
        neigh.apply(&events, &mut ready);
        if !ready.is_empty() {
            let mut t = tx.lock().unwrap_or_else(|e| e.into_inner());
            for (q, mac) in ready.drain(..) {
                let w = Wire {
                    src: q.src,
                    dst: q.dst,
                    mac,
                };
                if t.send(&[&q.payload], w, q.slot).is_err() {
                    neigh.count_drop(q.slot, 1);
                }
            }
        }
    }
}

/// Start the neighbour thread with every signal blocked (a process-directed
/// signal must never be delivered to it).
pub(crate) fn spawn(
    neigh: Arc<Neigh>,
    tx: Arc<Mutex<TxPath>>,
) -> io::Result<std::thread::JoinHandle<()>> {
    // SAFETY: sigset_t is plain data; sigfillset initialises it.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset pointers; the calling thread's mask is restored
    // right after the spawn (the new thread inherits the full mask).
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let r = std::thread::Builder::new()
        .name("nanowire-neigh".into())
        .stack_size(256 * 1024)
        .spawn(move || run(neigh, tx));
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}
