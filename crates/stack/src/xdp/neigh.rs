//! Neighbours as the kernel sees them, without ever making a sender wait,
//! in bounded state.
//!
//! Two tables, both bounded and aged (entries unused for [`IDLE`] go; a full
//! table evicts its least recently used entry, as the kernel's neighbour
//! garbage collector does past `gc_thresh3`):
//! * **routes**, per destination that is *not* on-link: how it is reached
//!   (through our interface via a next hop and from a source address, or by
//!   the kernel: loopback, another NIC, a local address), from one
//!   RTM_GETROUTE. On-link destinations (inside a prefix of the
//!   interface's own addresses, where the kernel's prefix route sends them)
//!   need no entry: the destination is the next hop. At most [`MAX_ROUTES`].
//! * **neighbours**, per next hop (gateway or on-link destination), at most
//!   [`MAX_NEIGH`]:
//!   * `Ready(mac)`: frames go out through the rings;
//!   * `Pending`: the kernel is resolving it (ARP). Datagrams wait in the
//!     entry, bounded as the kernel bounds its `arp_queue` (by default
//!     `unres_qlen_bytes` = 212992 bytes of truesize, ~101 full-size
//!     packets; the old default of 3 packets is too few: a sender whose
//!     first datagrams are a warm-up, e.g. sockperf, would lose the real
//!     ones). When full, the oldest is dropped, counted, as in the kernel.
//!     The send itself returns success, as the kernel's does;
//!   * `Failed`: resolution failed less than [`NEGATIVE_TTL`] ago (the
//!     negative cache). Sends are counted drops; a connected socket gets
//!     EHOSTUNREACH, as from the kernel.
//!
//! So a thousand peers behind one gateway share one neighbour entry, and a
//! flood from spoofed sources (SYNs, datagrams answered to each source)
//! grows nothing past the bounds: `neigh_entries` and `neigh_routes` on the
//! stats page say how full the tables are.
//!
//! Route and neighbour lookups (rtnetlink) run on a cache miss, outside
//! every lock: in the sending thread for UDP sockets and connects
//! ([`Neigh::learn`]), in the neighbour thread for the TCP engine's
//! transmit path ([`Neigh::request`]: the TCP engine never calls netlink
//! under its lock; it parks the segment until the answer is there).
//! Waiting for an ARP answer happens in the neighbour thread, which also
//! follows the kernel's neighbour and route changes
//! (RTM_NEWNEIGH/DELNEIGH, RTM_NEWROUTE/DELROUTE) so that a changed MAC or
//! route is used within milliseconds. Each change bumps a generation
//! number; sockets cache their last destination and revalidate it with one
//! atomic load.

use super::demux::FastMap;
use super::device::EngineTx;
use super::order::{self, Guard, Tier};
use super::shm::{E, S, StatsPage, add, set};
use super::tx::{TxPath, Wire};
use nanowire_xdp::netlink::{self, Event, Monitor, Query, Route};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
/// Neighbour entries (per next hop) at most: the kernel's default
/// `gc_thresh3`.
pub const MAX_NEIGH: usize = 1024;
/// Route entries (per off-link destination) at most.
pub const MAX_ROUTES: usize = 1024;
/// An entry nobody used for this long goes (the next use looks it up
/// again; the kernel's `gc_stale_time` is 60 s).
pub const IDLE: Duration = Duration::from_secs(60);
/// Destinations waiting for the neighbour thread to look them up.
const MAX_REQUESTS: usize = 64;

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
    Ready([u8; 6]),
    Pending {
        since: Instant,
        checked: Instant,
        queue: Vec<Queued>,
    },
    Failed {
        until: Instant,
    },
}

struct NeighEntry {
    state: State,
    used: Instant,
}

#[derive(Clone, Copy)]
enum Via {
    /// Through our interface to `hop`, from `src`.
    Xdp {
        hop: Ipv4Addr,
        src: Ipv4Addr,
    },
    /// Needs no resolution (multicast, broadcast).
    Static {
        src: Ipv4Addr,
        mac: [u8; 6],
    },
    Kernel,
}

struct RouteEntry {
    via: Via,
    used: Instant,
}

#[derive(Default)]
struct Tables {
    routes: FastMap<u32, RouteEntry>,
    neigh: FastMap<u32, NeighEntry>,
    /// Destinations for the neighbour thread to look up ([`Neigh::request`]).
    requests: Vec<Ipv4Addr>,
}

/// A prefix of one of the interface's addresses: (network, mask, address).
type Prefix = (u32, u32, Ipv4Addr);

pub(crate) struct Neigh {
    generation: AtomicU64,
    tables: Mutex<Tables>,
    wake: OwnedFd,
    stop: AtomicBool,
    ifindex: u32,
    ifaddr: Option<Ipv4Addr>,
    /// The interface's on-link prefixes (read when the engine opens; a
    /// route change re-reads them).
    onlink: Mutex<Vec<Prefix>>,
    page: Arc<StatsPage>,
    /// Kept for route and neighbour queries and ARP solicitations, opened
    /// with the engine (never in the neighbour thread, which would take a
    /// number the program just freed), above the program's numbers
    /// (`sys::above_floor`). `None` if they could not be opened: a socket
    /// per query then.
    query: Mutex<Option<Query>>,
    solicit: Option<OwnedFd>,
}

use nanowire_xdp::sys::eventfd;

/// The IPv4 prefixes of interface `ifindex` (its name, then
/// [`prefixes_of`]; after route changes, never per packet).
fn onlink_prefixes(ifindex: u32) -> Vec<Prefix> {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: name has IF_NAMESIZE bytes, as if_indextoname requires.
    if unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) }.is_null() {
        return Vec::new();
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    prefixes_of(&name.to_string_lossy())
}

/// The IPv4 prefixes of interface `name` (getifaddrs: one dump, shared
/// with the rest of an engine's open: `iface::one_read`).
fn prefixes_of(name: &str) -> Vec<Prefix> {
    let Ok(all) = nanowire_xdp::iface::ipv4_ifaddrs() else {
        return Vec::new();
    };
    all.iter()
        .filter(|a| a.name == name)
        .filter_map(|a| {
            let addr = a.addr.to_bits();
            let mask = a.netmask.to_bits();
            // /31 and /32 have no neighbours of their own to speak of.
            (mask.leading_ones() <= 30).then_some((addr & mask, mask, a.addr))
        })
        .collect()
}

/// Evict the least recently used entry of `m` when it holds `max`.
fn make_room<V>(m: &mut FastMap<u32, V>, max: usize, used: impl Fn(&V) -> Instant) -> Option<V> {
    if m.len() < max {
        return None;
    }
    let k = m.iter().min_by_key(|(_, v)| used(v)).map(|(k, _)| *k)?;
    m.remove(&k)
}

impl Neigh {
    pub fn new(
        ifname: &str,
        ifindex: u32,
        ifaddr: Option<Ipv4Addr>,
        page: Arc<StatsPage>,
    ) -> io::Result<Neigh> {
        Ok(Neigh {
            generation: AtomicU64::new(1),
            tables: Mutex::new(Tables::default()),
            wake: eventfd()?,
            stop: AtomicBool::new(false),
            ifindex,
            ifaddr,
            onlink: Mutex::new(prefixes_of(ifname)),
            page,
            query: Mutex::new(Query::open().ok()),
            solicit: netlink::solicit_socket().ok(),
        })
    }

    /// RTM_GETROUTE through the kept query socket.
    fn route_get(&self, dst: Ipv4Addr) -> io::Result<Route> {
        let mut q = order::lock(&self.query, Tier::Leaf, "the netlink query socket");
        match q.as_mut() {
            Some(q) => q.route_get(dst),
            None => netlink::route_get(dst),
        }
    }

    /// RTM_GETNEIGH through the kept query socket.
    fn neigh_get(&self, hop: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
        let mut q = order::lock(&self.query, Tier::Leaf, "the netlink query socket");
        match q.as_mut() {
            Some(q) => q.neigh_get(self.ifindex, hop),
            None => netlink::neigh_get(self.ifindex, hop),
        }
    }

    fn solicit(&self, hop: Ipv4Addr) {
        match &self.solicit {
            Some(s) => netlink::solicit_with(s, hop),
            None => netlink::solicit(hop),
        }
    }

    fn lock(&self) -> Guard<'_, Tables> {
        order::lock(&self.tables, Tier::Leaf, "the neighbour lock")
    }

    /// Changes so far (a socket's cached hop is good while this is equal).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn changed(&self) {
        // SeqCst: ordered before the look at parked TCP segments (see
        // `wake::neighbour_changed`).
        self.generation.fetch_add(1, Ordering::SeqCst);
        super::wake::neighbour_changed();
    }

    /// Wake the neighbour thread (it also runs the engine's deferred
    /// control work, see [`spawn`]'s `hook`).
    pub(crate) fn wake_worker(&self) {
        super::demux::eventfd_write(self.wake.as_raw_fd());
    }

    fn publish_sizes(&self, t: &Tables) {
        set(self.page.e(E::NeighRoutes), t.routes.len() as u64);
        set(self.page.e(E::NeighEntries), t.neigh.len() as u64);
    }

    /// The on-link prefix `dst` is in (not the interface's own address nor
    /// the prefix's broadcast address: the kernel routes those itself).
    fn onlink(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        let d = dst.to_bits();
        let p = order::lock(&self.onlink, Tier::Leaf, "the on-link prefixes");
        if p.iter().any(|x| x.2 == dst) {
            return None;
        }
        p.iter()
            .find(|&&(net, mask, _)| d & mask == net && d != net | !mask && d != net)
            .map(|p| p.2)
    }

    /// How `dst` is reached: its route (on-link: none needed) and, through
    /// a next hop, that neighbour's state. Memory only.
    pub fn lookup(&self, dst: Ipv4Addr) -> Lookup {
        let now = Instant::now();
        let (hop, src) = match self.onlink(dst) {
            Some(src) => (dst, src),
            None => {
                let mut t = self.lock();
                let Some(r) = t.routes.get_mut(&dst.to_bits()) else {
                    return Lookup::Unknown;
                };
                r.used = now;
                match r.via {
                    Via::Kernel => return Lookup::Ready(Hop::Kernel),
                    Via::Static { src, mac } => return Lookup::Ready(Hop::Xdp { src, mac }),
                    Via::Xdp { hop, src } => (hop, src),
                }
            }
        };
        let mut t = self.lock();
        match t.neigh.get_mut(&hop.to_bits()) {
            None => Lookup::Unknown,
            Some(e) => match e.state {
                State::Ready(mac) => {
                    e.used = now;
                    Lookup::Ready(Hop::Xdp { src, mac })
                }
                State::Pending { .. } => Lookup::Pending,
                State::Failed { until } if now < until => Lookup::Failed,
                State::Failed { .. } => Lookup::Unknown,
            },
        }
    }

    /// Look `dst` up in the neighbour thread (the caller must not call
    /// netlink: it holds a lock). Bounded: beyond [`MAX_REQUESTS`]
    /// outstanding ones, the request is dropped (the next use asks again).
    pub fn request(&self, dst: Ipv4Addr) {
        let mut t = self.lock();
        if t.requests.len() >= MAX_REQUESTS || t.requests.contains(&dst) {
            return;
        }
        t.requests.push(dst);
        drop(t);
        self.wake_worker();
    }

    /// The next hop and source of `dst` (route lookup on a miss).
    fn route(&self, dst: Ipv4Addr) -> io::Result<Via> {
        if let Some(src) = self.onlink(dst) {
            return Ok(Via::Xdp { hop: dst, src });
        }
        if let Some(r) = self.lock().routes.get(&dst.to_bits()) {
            return Ok(r.via);
        }
        let route = if dst.is_multicast() || dst.is_broadcast() {
            Route {
                oif: self.ifindex,
                gateway: None,
                prefsrc: self.ifaddr,
                kind: netlink::RTN_MULTICAST,
            }
        } else {
            self.route_get(dst).map_err(|e| {
                let kind = match e.raw_os_error() {
                    Some(libc::ENETUNREACH) => io::ErrorKind::NetworkUnreachable,
                    Some(libc::EHOSTUNREACH) => io::ErrorKind::HostUnreachable,
                    _ => e.kind(),
                };
                io::Error::new(kind, format!("no route to {dst}: {e}"))
            })?
        };
        let via = if route.oif != self.ifindex || route.kind == netlink::RTN_LOCAL {
            Via::Kernel
        } else {
            let src = route.prefsrc.or(self.ifaddr).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    "interface has no IPv4 address",
                )
            })?;
            match netlink::static_mac(dst, &route) {
                Some(mac) => Via::Static { src, mac },
                None => Via::Xdp {
                    hop: route.next_hop(dst),
                    src,
                },
            }
        };
        let mut t = self.lock();
        make_room(&mut t.routes, MAX_ROUTES, |r| r.used);
        t.routes.insert(
            dst.to_bits(),
            RouteEntry {
                via,
                used: Instant::now(),
            },
        );
        self.publish_sizes(&t);
        drop(t);
        self.changed();
        Ok(via)
    }

    /// Find out how `dst` is reached: route and neighbour table lookups
    /// (rtnetlink; quick, never waiting for the network), in the calling
    /// thread with no lock held. An unresolved next hop becomes `Pending`
    /// and the neighbour thread takes over.
    pub fn learn(&self, dst: Ipv4Addr) -> io::Result<()> {
        let Via::Xdp { hop, .. } = self.route(dst)? else {
            return Ok(());
        };
        if self
            .lock()
            .neigh
            .get(&hop.to_bits())
            .is_some_and(|e| !matches!(e.state, State::Failed { until } if Instant::now() >= until))
        {
            return Ok(());
        }
        match self.neigh_get(hop) {
            Ok(Some(mac)) => {
                self.insert(hop, State::Ready(mac));
            }
            _ => {
                let now = Instant::now();
                let fresh = self.insert(
                    hop,
                    State::Pending {
                        since: now,
                        checked: now,
                        queue: Vec::new(),
                    },
                );
                if fresh {
                    self.solicit(hop);
                    self.wake_worker();
                }
            }
        }
        Ok(())
    }

    /// Insert unless an entry is there already (another thread was
    /// faster); an expired negative entry is replaced. A full table loses
    /// its least recently used entry (what it held is counted as dropped).
    /// Returns whether it inserted.
    fn insert(&self, hop: Ipv4Addr, state: State) -> bool {
        let mut t = self.lock();
        let k = hop.to_bits();
        let replace = match t.neigh.get(&k) {
            None => true,
            Some(NeighEntry {
                state: State::Failed { until },
                ..
            }) => Instant::now() >= *until,
            Some(_) => false,
        };
        if replace {
            if !t.neigh.contains_key(&k)
                && let Some(NeighEntry {
                    state: State::Pending { queue, .. },
                    ..
                }) = make_room(&mut t.neigh, MAX_NEIGH, |e| e.used)
            {
                for q in queue {
                    self.count_drop(q.slot, 1);
                }
            }
            t.neigh.insert(
                k,
                NeighEntry {
                    state,
                    used: Instant::now(),
                },
            );
            self.publish_sizes(&t);
            drop(t);
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
        let dst = *q.dst.ip();
        let (hop, src) = match self.onlink(dst) {
            Some(src) => (dst, src),
            None => match self.lock().routes.get(&dst.to_bits()).map(|r| r.via) {
                Some(Via::Xdp { hop, src }) => (hop, src),
                Some(Via::Static { src, mac }) => return Err((q, Hop::Xdp { src, mac })),
                Some(Via::Kernel) => return Err((q, Hop::Kernel)),
                None => {
                    self.count_drop(q.slot, 1);
                    return Ok(());
                }
            },
        };
        let mut t = self.lock();
        match t.neigh.get_mut(&hop.to_bits()).map(|e| &mut e.state) {
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
            Some(State::Ready(mac)) => {
                let mac = *mac;
                Err((q, Hop::Xdp { src, mac }))
            }
            _ => {
                drop(t);
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
        let mut routes_changed = false;
        let mut t = self.lock();
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
                    let k = ip.to_bits();
                    let Some(e) = t.neigh.get_mut(&k) else {
                        continue;
                    };
                    match (&mut e.state, mac) {
                        (State::Ready(old), Some(new)) if *old != new => {
                            *old = new;
                            changed = true;
                        }
                        (State::Ready(_), None) if failed => {
                            t.neigh.remove(&k);
                            changed = true;
                        }
                        (State::Pending { queue, .. }, Some(new)) => {
                            out.extend(std::mem::take(queue).into_iter().map(|q| (q, new)));
                            e.state = State::Ready(new);
                            e.used = Instant::now();
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
                Event::Route | Event::Overrun => {
                    // Sources and next hops may all have changed: forget
                    // the routes (neighbours' MACs stay what they are).
                    t.routes.clear();
                    routes_changed = true;
                    changed = true;
                }
                _ => {}
            }
        }
        self.publish_sizes(&t);
        drop(t);
        if routes_changed {
            let p = onlink_prefixes(self.ifindex);
            *order::lock(&self.onlink, Tier::Leaf, "the on-link prefixes") = p;
        }
        if changed {
            self.changed();
        }
    }

    /// Time out pending entries, forget idle ones; returns the next hops
    /// to re-read, whether any is pending, and the looked-up requests.
    fn expire(&self) -> (Vec<Ipv4Addr>, bool, Vec<Ipv4Addr>) {
        let now = Instant::now();
        let mut t = self.lock();
        let mut check = Vec::new();
        let mut changed = false;
        let mut pending = false;
        for (k, e) in t.neigh.iter_mut() {
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
                        check.push(Ipv4Addr::from_bits(*k));
                    }
                }
            }
        }
        // Expired negative entries and idle ones go (the next use looks
        // them up again).
        let n0 = t.neigh.len() + t.routes.len();
        t.neigh.retain(|_, e| match e.state {
            State::Failed { until } => now < until,
            State::Ready(_) => now.duration_since(e.used) < IDLE,
            State::Pending { .. } => true,
        });
        t.routes.retain(|_, r| now.duration_since(r.used) < IDLE);
        changed |= t.neigh.len() + t.routes.len() != n0;
        let requests = std::mem::take(&mut t.requests);
        self.publish_sizes(&t);
        drop(t);
        if changed {
            self.changed();
        }
        (check, pending, requests)
    }
}

/// The neighbour thread: waits for kernel events, re-reads pending
/// entries, sends what was waiting for a MAC. Exits when the engine stops
/// it. Runs with every signal blocked (it lives inside applications).
/// `mon`: opened by [`spawn`] in the caller's thread.
/// The engine's deferred control work run by the neighbour thread.
pub(crate) type Hook = Box<dyn FnMut() + Send>;

pub(crate) fn run(
    neigh: Arc<Neigh>,
    tx: Arc<super::order::Owned<TxPath<EngineTx>>>,
    mut watch: Option<super::service::client::Watch>,
    mut mon: Option<Monitor>,
    mut hook: Option<Hook>,
) {
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
            // The engine service's control socket (attached engines): its
            // hang-up means the service is gone.
            libc::pollfd {
                fd: watch.as_ref().map_or(-1, |w| w.fd()),
                events: libc::POLLRDHUP,
                revents: 0,
            },
        ];
        let timeout = if pending || mon.is_none() {
            RECHECK.as_millis() as i32
        } else {
            // Idle entries are aged on the next wake-up at the latest.
            IDLE.as_millis() as i32 / 4
        };
        // Raw syscalls: this thread must never enter the LD_PRELOAD shim.
        nanowire_xdp::sys::poll(&mut pfds, timeout);
        nanowire_xdp::sys::eventfd_drain(neigh.wake.as_raw_fd());
        if neigh.stop.load(Ordering::Acquire) {
            return;
        }
        if pfds[2].revents != 0
            && let Some(w) = watch.take()
        {
            w.lost();
        }
        if let Some(h) = &mut hook {
            h();
        }
        events.clear();
        if let Some(m) = &mut mon {
            m.read(&mut events);
        }
        let (check, p, requests) = neigh.expire();
        pending = p;
        for dst in requests {
            // Netlink with no lock held (asked by the TCP engine's
            // transmit path, which never calls it under its lock).
            let _ = neigh.learn(dst);
        }
        for hop in check {
            // Netlink with no lock held.
            if let Ok(Some(mac)) = neigh.neigh_get(hop) {
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
            let mut t = order::lock_owned(&tx, Tier::Leaf, "the TX lock");
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
/// signal must never be delivered to it). Its event socket is opened here,
/// in the caller's thread (the thread itself opens no descriptor).
/// `hook`: the engine's control work that must not run on a data path
/// (under its locks): called by the thread on every wake-up, with no lock
/// held ([`Neigh::wake_worker`] asks for one).
pub(crate) fn spawn(
    neigh: Arc<Neigh>,
    tx: Arc<super::order::Owned<TxPath<EngineTx>>>,
    watch: Option<super::service::client::Watch>,
    hook: Option<Hook>,
) -> io::Result<std::thread::JoinHandle<()>> {
    let mon = Monitor::open().ok();
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
        .spawn(move || {
            let mut args = Some((neigh, tx, watch, mon, hook));
            order::as_engine_thread(&mut || {
                if let Some((n, t, w, m, h)) = args.take() {
                    run(n, t, w, m, h);
                }
            });
        });
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}
