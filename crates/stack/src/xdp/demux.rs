//! The protocol-neutral demultiplexer: classified frames to endpoints.
//!
//! Endpoints are registered by IP protocol and address, with the kernel's
//! precedence on lookup:
//! 1. connected: the full 5-tuple (proto, local ip, local port, remote ip,
//!    remote port), the local ip possibly the wildcard;
//! 2. a specific bind: (proto, local ip, local port);
//! 3. the wildcard bind: (proto, 0.0.0.0, local port).
//!
//! A unicast frame goes to the one endpoint found first; a multicast or
//! broadcast frame to every endpoint bound to (proto, group, port) (each
//! gets a clone of the same owned frame, no copy). Each endpoint has its
//! own bounded queue of owned frames ([`Delivery`]); a full queue drops
//! the frame for that endpoint only, counted on it.
//!
//! The demux knows nothing of UDP beyond the protocol number: a TCP
//! listener registers `bind(PROTO_TCP, ...)`, a TCP connection
//! `connect(PROTO_TCP, ...)`, and reads its segments with [`Demux::pop`]
//! (the frame and the transport header offset are in the `Delivery`). The
//! receive loop never changes for a new endpoint kind.

use super::classify::{Classified, MAX_PIECES, pieces_after_first};
use super::shm::{E, S, StatsPage, bump, peak, set};
use nanowire_xdp::RxFrame;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};

/// Multiply-shift hasher for the address tables.
#[derive(Default)]
pub(crate) struct FastHash(u64);
impl Hasher for FastHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v ^ (v >> 29)).wrapping_mul(0x9e3779b97f4a7c15);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
}
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHash>>;

/// (proto, address, port) packed.
#[inline]
fn key(proto: u8, a: SocketAddrV4) -> u64 {
    (u64::from(proto) << 48) | (u64::from(a.ip().to_bits()) << 16) | u64::from(a.port())
}

/// An endpoint's handle (also its stats-page slot).
pub type EndpointId = usize;

/// What kind of endpoint (for stats and future protocol handlers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointKind {
    Udp,
    /// All TCP segments of one `TcpEngine` (its listeners and connections).
    Tcp,
}

/// A frame delivered to an endpoint.
#[derive(Debug)]
pub struct Delivery {
    pub frame: RxFrame,
    pub proto: u8,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub l4_off: u32,
    pub payload_off: u32,
    pub payload_len: u32,
    /// `CLOCK_REALTIME` ns when the engine took the frame off its RX ring;
    /// 0 when no socket of the engine asked for receive stamps
    /// (`XdpSocket::set_rx_stamping`).
    pub stamp: u64,
}

impl Delivery {
    /// `frame`, as the classifier found it (`c`), received at `stamp`.
    #[inline]
    pub fn new(c: &Classified, frame: RxFrame, stamp: u64) -> Delivery {
        Delivery {
            frame,
            proto: c.proto,
            src: c.src,
            dst: c.dst,
            l4_off: c.l4_off as u32,
            payload_off: c.payload_off as u32,
            payload_len: c.payload_len as u32,
            stamp,
        }
    }

    /// The transport payload (UDP data, TCP segment data).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let (o, l) = (self.payload_off as usize, self.payload_len as usize);
        self.frame.data().get(o..o + l).unwrap_or(&[])
    }
    /// The transport header and payload (a multi-buffer packet is
    /// gathered for this, once).
    pub fn segment(&self) -> &[u8] {
        self.frame.data().get(self.l4_off as usize..).unwrap_or(&[])
    }

    /// The transport header and payload without gathering a multi-buffer
    /// packet: the first buffer from the transport header on, and the
    /// further buffers (up to the end of the IP packet) in `rest[..n]`;
    /// returns (first, n). A packet of one buffer is `segment()`, n = 0;
    /// so is a chain whose TCP header is not all in its first buffer
    /// (gathered).
    pub fn segment_parts<'a>(&'a self, rest: &mut [&'a [u8]; MAX_PIECES]) -> (&'a [u8], usize) {
        if self.frame.frames() == 1 {
            return (self.segment(), 0);
        }
        let (l4, end) = (
            self.l4_off as usize,
            (self.payload_off + self.payload_len) as usize,
        );
        let head = self.frame.head();
        let header_in_head = head.len() >= l4 + 20
            && head.len() >= l4 + usize::from(head[l4 + 12] >> 4) * 4
            && end >= l4;
        let Some(n) = header_in_head
            .then(|| pieces_after_first(&self.frame, rest))
            .flatten()
        else {
            return (self.segment(), 0);
        };
        let first = head.get(l4..head.len().min(end)).unwrap_or(&[]);
        let (mut at, mut k) = (head.len(), 0);
        for i in 0..n {
            if at >= end {
                break;
            }
            let p = rest[i];
            rest[k] = &p[..p.len().min(end - at)];
            at += p.len();
            k += 1;
        }
        (first, k)
    }
}

pub(crate) struct Endpoint {
    /// Read by protocol handlers once there is more than one kind.
    #[allow(dead_code)]
    pub kind: EndpointKind,
    pub queue: VecDeque<Delivery>,
    /// UMEM frames the queue holds (a multi-buffer packet holds one per
    /// buffer): what the endpoint's share bounds.
    frames: usize,
    /// Of `frames`, those taken past the cap by another endpoint's poll
    /// (see [`Demux::spill_for`]).
    over: usize,
    /// Frames this endpoint may hold (from SO_RCVBUF; `usize::MAX`: the
    /// engine's share only).
    pub rcvbuf_frames: usize,
    /// The owner sleeps in poll(): whoever queues a frame for it signals
    /// `wake` (an eventfd in the sleeper's poll set).
    pub sleeping: bool,
    /// `wake` was written since it was last drained: a sleeper that arms
    /// again drains it only then (no read syscall per sleep for nothing).
    pub signalled: bool,
    /// Threads sleeping on `wake` now (TCP: armed and not yet disarmed);
    /// `sleeping` stays set until the last of them wakes.
    pub sleepers: u32,
    pub wake: OwnedFd,
    /// Connected peer: multicast from anyone else is not for it either.
    pub peer: Option<SocketAddrV4>,
    /// Keys it is registered under.
    binds: Vec<u64>,
    conns: Vec<(u64, u64)>,
    /// The most frames its queue held so far (a push that does not pass
    /// it leaves both high-water marks of the page as they are).
    peak: u64,
}

pub(crate) struct Demux {
    eps: Vec<Option<Endpoint>>,
    bound: FastMap<u64, Vec<EndpointId>>,
    connected: FastMap<(u64, u64), EndpointId>,
    /// RX frames of the UMEM: the budget all queues share.
    umem_frames: usize,
    /// Frames one endpoint may hold (its share of the UMEM).
    share: usize,
    live: usize,
    /// The endpoint whose poll is taking frames off the rings now (`None`:
    /// nobody's in particular, e.g. a hand-over's drain; see `spill_for`).
    poller: Option<EndpointId>,
    /// Frames queued past their endpoint's cap, all endpoints together
    /// (at most `umem_frames / SPILL_DIVISOR`).
    spilled: usize,
    /// Frames in every endpoint's queue together, and the most they may
    /// be ([`Demux::set_process_limit`]; `usize::MAX`: no bound but the
    /// shares, an engine of its own).
    queued: usize,
    limit: usize,
}

/// At most this fraction of the RX frames of the UMEM (1/4) is held in
/// queues past their caps, so the rest keeps the fill ring going.
const SPILL_DIVISOR: usize = 4;

/// Outcome of one delivery.
pub(crate) enum Outcome {
    Delivered,
    NoEndpoint,
    QueueFull,
    /// For the endpoint the caller takes frames for (`deliver_at`'s
    /// `mine`): not queued, counted as received by it.
    Mine(Delivery),
    /// The process's queues hold its whole share of a UMEM other processes
    /// share ([`Demux::set_process_limit`]): dropped, counted on the
    /// socket (`drop_queue_full`) and the engine (`drop_process_share`).
    ShareFull,
}

impl Demux {
    pub fn new(umem_frames: usize) -> Demux {
        let mut d = Demux {
            eps: Vec::new(),
            bound: FastMap::default(),
            connected: FastMap::default(),
            umem_frames,
            share: 0,
            live: 0,
            poller: None,
            spilled: 0,
            queued: 0,
            limit: usize::MAX,
        };
        d.reshare();
        d
    }

    /// On the engine service (issue 23): the RX frames of the UMEM are
    /// every attached process's, and each process's RX ring alone can
    /// hold half of them (the kernel fills it while the process does not
    /// read); so the frames this process's queues hold together are
    /// bounded too, at `frames`, whatever its sockets' shares and caps
    /// add up to (many sockets never read, large SO_RCVBUFs). Without it
    /// one process that stops reading took every frame of the UMEM and
    /// the others' datagrams found the fill ring empty.
    pub fn set_process_limit(&mut self, frames: usize) {
        self.limit = frames.max(1);
    }

    /// The share: together, the endpoints' queues hold at most half the
    /// UMEM (the other half keeps the fill ring going), with a floor of
    /// 256 frames (or half the UMEM if smaller) so that a socket is never
    /// starved by a small ring and many sockets.
    fn reshare(&mut self) {
        let half = (self.umem_frames / 2).max(1);
        self.share = (half / self.live.max(1)).max(half.min(256));
    }

    /// Frames polled from now on are taken for `poller` (`None`: for
    /// nobody in particular). A frame for another endpoint whose queue is
    /// at its cap then waits in that queue past the cap (bounded, see
    /// `SPILL_DIVISOR`) instead of being dropped: the poll took it off the
    /// ring only to reach the poller's own frames behind it. The owner's
    /// own polls (made only when its queue is empty) and polls for nobody
    /// keep the cap strict, as SO_RCVBUF is.
    #[inline]
    pub fn spill_for(&mut self, poller: Option<EndpointId>) {
        self.poller = poller;
    }

    /// RX frames of the UMEM (the budget every holder shares).
    pub fn umem_frames(&self) -> usize {
        self.umem_frames
    }

    /// Frames queued past their caps (all endpoints).
    #[cfg(test)]
    pub fn spilled(&self) -> usize {
        self.spilled
    }

    /// Frames endpoint `id` may hold now.
    pub fn cap(&self, id: EndpointId) -> usize {
        self.eps
            .get(id)
            .and_then(|e| e.as_ref())
            .map_or(0, |e| e.rcvbuf_frames.min(self.share))
    }

    /// A new endpoint (not yet reachable: bind or connect it).
    pub fn add(&mut self, kind: EndpointKind, wake: OwnedFd, max: usize) -> Option<EndpointId> {
        let id = self
            .eps
            .iter()
            .position(|e| e.is_none())
            .unwrap_or(self.eps.len());
        if id >= max {
            return None;
        }
        let ep = Endpoint {
            kind,
            queue: VecDeque::new(),
            frames: 0,
            over: 0,
            rcvbuf_frames: usize::MAX,
            sleeping: false,
            signalled: false,
            sleepers: 0,
            wake,
            peer: None,
            binds: Vec::new(),
            conns: Vec::new(),
            peak: 0,
        };
        if id == self.eps.len() {
            self.eps.push(Some(ep));
        } else {
            self.eps[id] = Some(ep);
        }
        self.live += 1;
        self.reshare();
        Some(id)
    }

    pub fn get_mut(&mut self, id: EndpointId) -> Option<&mut Endpoint> {
        self.eps.get_mut(id)?.as_mut()
    }

    pub fn get(&self, id: EndpointId) -> Option<&Endpoint> {
        self.eps.get(id)?.as_ref()
    }

    /// Receive what is addressed to (proto, local).
    pub fn bind(&mut self, id: EndpointId, proto: u8, local: SocketAddrV4) {
        let k = key(proto, local);
        let v = self.bound.entry(k).or_default();
        if !v.contains(&id) {
            v.push(id);
        }
        if let Some(e) = self.get_mut(id)
            && !e.binds.contains(&k)
        {
            e.binds.push(k);
        }
    }

    /// Stop receiving what is addressed to (proto, local).
    pub fn unbind(&mut self, id: EndpointId, proto: u8, local: SocketAddrV4) {
        let k = key(proto, local);
        if let Some(v) = self.bound.get_mut(&k) {
            v.retain(|&x| x != id);
            if v.is_empty() {
                self.bound.remove(&k);
            }
        }
        if let Some(e) = self.get_mut(id) {
            e.binds.retain(|&x| x != k);
        }
    }

    /// Receive only from `remote` on (proto, local): moves the endpoint's
    /// unicast bind on `local` to the connected table.
    pub fn connect(
        &mut self,
        id: EndpointId,
        proto: u8,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) {
        self.unbind(id, proto, local);
        let k = (key(proto, local), key(proto, remote));
        self.connected.insert(k, id);
        if let Some(e) = self.get_mut(id) {
            e.conns.retain(|c| c.0 != k.0);
            e.conns.push(k);
            e.peer = Some(remote);
        }
    }

    /// Receive what `remote` sends to (proto, local) ahead of the endpoints
    /// bound on `local` (`on`), or no longer (`!on`; nothing if another
    /// endpoint has it by then): a TCP connection this endpoint took over
    /// (moved in from another process, taken from the kernel) whose local
    /// address a listener's endpoint is bound on. Several per `local`,
    /// unlike [`Demux::connect`].
    pub fn set_flow(
        &mut self,
        id: EndpointId,
        proto: u8,
        tuple: (SocketAddrV4, SocketAddrV4),
        on: bool,
    ) {
        let k = (key(proto, tuple.0), key(proto, tuple.1));
        if on {
            self.connected.insert(k, id);
        } else if self.connected.get(&k) == Some(&id) {
            self.connected.remove(&k);
        }
        if let Some(e) = self.get_mut(id) {
            e.conns.retain(|c| *c != k);
            if on {
                e.conns.push(k);
            }
        }
    }

    /// Wake the threads asleep on endpoint `id` (a connection of its stack
    /// left it: a call waiting on it finds out at once).
    pub fn wake_sleepers(&mut self, id: EndpointId) {
        if let Some(e) = self.get_mut(id)
            && e.sleeping
        {
            wake(e);
        }
    }

    /// Forget endpoint `id`; returns its queued frames (to be dropped by
    /// the caller, outside any lock if it likes).
    pub fn remove(&mut self, id: EndpointId) -> Option<Endpoint> {
        let e = self.eps.get_mut(id)?.take()?;
        self.spilled -= e.over;
        self.queued -= e.frames;
        for k in &e.binds {
            if let Some(v) = self.bound.get_mut(k) {
                v.retain(|&x| x != id);
                if v.is_empty() {
                    self.bound.remove(k);
                }
            }
        }
        for k in &e.conns {
            if self.connected.get(k) == Some(&id) {
                self.connected.remove(k);
            }
        }
        self.live -= 1;
        self.reshare();
        Some(e)
    }

    /// The unicast endpoint for `c`, by the kernel's precedence.
    #[inline]
    fn lookup(&self, c: &Classified) -> Option<EndpointId> {
        let remote = key(c.proto, c.src);
        if !self.connected.is_empty() {
            let wild = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, c.dst.port());
            for l in [c.dst, wild] {
                if let Some(&id) = self.connected.get(&(key(c.proto, l), remote)) {
                    return Some(id);
                }
            }
        }
        if let Some(v) = self.bound.get(&key(c.proto, c.dst)) {
            return v.first().copied();
        }
        let wild = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, c.dst.port());
        self.bound.get(&key(c.proto, wild))?.first().copied()
    }

    /// Queue `frame` on its endpoint(s), counting on `page`.
    #[inline]
    #[cfg(test)]
    pub fn deliver(&mut self, c: &Classified, frame: RxFrame, page: &StatsPage) -> Outcome {
        self.deliver_at(c, frame, 0, page, None)
    }

    /// [`Demux::deliver`] with the frame's receive stamp; a unicast frame
    /// for `mine` is handed back (`Outcome::Mine`) instead of queued: the
    /// caller takes it for that endpoint now ([`super::rx::RxPath::poll_own`]).
    #[inline]
    pub fn deliver_at(
        &mut self,
        c: &Classified,
        frame: RxFrame,
        stamp: u64,
        page: &StatsPage,
        mine: Option<EndpointId>,
    ) -> Outcome {
        let d = Delivery::new(c, frame, stamp);
        let ip = c.dst.ip();
        if !(ip.is_multicast() || ip.is_broadcast()) {
            return match self.lookup(c) {
                Some(id) if mine == Some(id) => self.take(id, d, page),
                Some(id) => self.push(id, d, page),
                None => Outcome::NoEndpoint,
            };
        }
        // Fan-out: a clone of the frame per member, the last one moved.
        let Some(members) = self.bound.get(&key(c.proto, c.dst)) else {
            return Outcome::NoEndpoint;
        };
        let members: Vec<EndpointId> = members
            .iter()
            .copied()
            .filter(|&id| {
                self.get(id)
                    .is_some_and(|e| e.peer.is_none_or(|p| p == c.src))
            })
            .collect();
        let (mut any, mut full, mut share) = (false, false, false);
        let n = members.len();
        let mut d = Some(d);
        for (i, id) in members.into_iter().enumerate() {
            let item = if i + 1 == n {
                d.take().expect("last member")
            } else {
                d.as_ref().expect("not last").share()
            };
            match self.push(id, item, page) {
                Outcome::Delivered => any = true,
                Outcome::QueueFull => full = true,
                Outcome::ShareFull => share = true,
                Outcome::NoEndpoint => {}
                Outcome::Mine(_) => unreachable!("a push queues"),
            }
        }
        if any {
            Outcome::Delivered
        } else if share {
            Outcome::ShareFull
        } else if full {
            Outcome::QueueFull
        } else {
            Outcome::NoEndpoint
        }
    }

    #[inline]
    fn push(&mut self, id: EndpointId, d: Delivery, page: &StatsPage) -> Outcome {
        let Some(Some(e)) = self.eps.get_mut(id) else {
            return Outcome::NoEndpoint;
        };
        // `cap(id)`, on the endpoint at hand (one lookup, no call).
        let cap = e.rcvbuf_frames.min(self.share);
        // One frame each: `frames >= cap`, as a count of packets. A chain
        // longer than the whole share still goes into an empty queue.
        let k = d.frame.frames();
        let over = e.frames >= cap || (e.frames > 0 && e.frames + k > cap);
        if over {
            // Taken off the ring by another endpoint's poll (a TCP turn in
            // a readiness pass over a TCP and a UDP socket): had that poll
            // not come, the frame would still wait in the RX ring for its
            // reader (whose own polls look at the ring only when its queue
            // is empty). It waits in the queue instead, past the cap,
            // within the spill bound: the same frames of the UMEM, and the
            // poller's own segments behind it are not held up (a ring left
            // unread would hold them).
            if self.poller.is_none_or(|p| p == id)
                || self.spilled + k > self.umem_frames / SPILL_DIVISOR
            {
                bump(page.s(id, S::DropQueueFull), 1);
                return Outcome::QueueFull;
            }
        }
        if self.queued + k > self.limit {
            bump(page.s(id, S::DropQueueFull), 1);
            return Outcome::ShareFull;
        }
        if over {
            e.over += k;
            self.spilled += k;
        }
        self.queued += k;
        e.frames += k;
        e.queue.push_back(d);
        if e.sleeping {
            wake(e);
        }
        let depth = e.queue.len() as u64;
        set(page.s(id, S::QueueDepth), depth);
        // The marks are raised (`peak`) by every depth past this endpoint's
        // own mark, so each holds what it did when every push raised it
        // (the engine's is at least every endpoint's): one write per push.
        if depth > e.peak {
            e.peak = depth;
            peak(page.s(id, S::PeakQueueDepth), depth);
            peak(page.e(E::PeakSocketQueue), depth);
        }
        Outcome::Delivered
    }

    /// `d`, for `id`, taken by its caller now: counted as received by `id`
    /// (as `pop` counts it) and waking a thread asleep on it (as `push`
    /// does: another thread of its owner may wait for what this one takes
    /// in). Its queue is not touched: the caller emptied it first.
    #[inline]
    fn take(&mut self, id: EndpointId, d: Delivery, page: &StatsPage) -> Outcome {
        let Some(Some(e)) = self.eps.get_mut(id) else {
            return Outcome::NoEndpoint;
        };
        if e.sleeping {
            wake(e);
        }
        bump(page.s(id, S::RxPackets), 1);
        bump(page.s(id, S::RxBytes), u64::from(d.payload_len));
        Outcome::Mine(d)
    }

    /// The next frame queued for `id`, counted as received by it.
    #[inline]
    pub fn pop(&mut self, id: EndpointId, page: &StatsPage) -> Option<Delivery> {
        let e = self.eps.get_mut(id)?.as_mut()?;
        let d = e.queue.pop_front()?;
        let k = d.frame.frames();
        e.frames -= k;
        self.queued -= k;
        // The oldest frames go first: what was past the cap is now within
        // it, frame for frame.
        let back = e.over.min(k);
        e.over -= back;
        self.spilled -= back;
        set(page.s(id, S::QueueDepth), e.queue.len() as u64);
        bump(page.s(id, S::RxPackets), 1);
        bump(page.s(id, S::RxBytes), u64::from(d.payload_len));
        Some(d)
    }
}

impl Delivery {
    /// Another delivery of the same frame (shared, not copied).
    fn share(&self) -> Delivery {
        Delivery {
            frame: self.frame.clone(),
            proto: self.proto,
            src: self.src,
            dst: self.dst,
            l4_off: self.l4_off,
            payload_off: self.payload_off,
            payload_len: self.payload_len,
            stamp: self.stamp,
        }
    }
}

/// Signal `e`'s sleepers (the first push or take since they slept).
#[cold]
fn wake(e: &mut Endpoint) {
    e.sleeping = false;
    e.signalled = true;
    eventfd_write(e.wake.as_raw_fd());
}

pub(crate) fn eventfd_write(fd: std::os::fd::RawFd) {
    nanowire_xdp::sys::eventfd_signal(fd);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdp::classify::{PROTO_TCP, PROTO_UDP};
    use crate::xdp::shm::{PageInfo, StatsPage};

    fn efd() -> OwnedFd {
        use std::os::fd::FromRawFd;
        // SAFETY: plain eventfd(2), checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    fn c(src: &str, dst: &str) -> Classified {
        Classified {
            proto: PROTO_UDP,
            src: sa(src),
            dst: sa(dst),
            l4_off: 34,
            payload_off: 42,
            payload_len: 0,
            csum_partial: false,
            ip_options: false,
        }
    }

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    /// A stats page and a demux of `max` endpoints.
    fn setup(max: usize) -> (StatsPage, Demux) {
        (StatsPage::create(&PageInfo::default()), Demux::new(max))
    }

    /// A UDP endpoint (64-frame queue) bound to `at`.
    fn udp(d: &mut Demux, at: &str) -> EndpointId {
        let id = d.add(EndpointKind::Udp, efd(), 64).unwrap();
        d.bind(id, PROTO_UDP, sa(at));
        id
    }

    /// Deliver a 42-byte frame classified as `cl`.
    fn put(d: &mut Demux, page: &StatsPage, cl: &Classified) -> Outcome {
        d.deliver(cl, RxFrame::from_vec(vec![0; 42]), page)
    }

    fn who(
        d: &mut Demux,
        page: &StatsPage,
        cl: &Classified,
        ids: &[EndpointId],
    ) -> Option<EndpointId> {
        match put(d, page, cl) {
            Outcome::Delivered => ids.iter().copied().find(|&id| d.pop(id, page).is_some()),
            _ => None,
        }
    }

    fn drops(page: &StatsPage, id: EndpointId) -> u64 {
        page.s(id, S::DropQueueFull)
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn kernel_precedence_connected_specific_wildcard() {
        let (page, mut d) = setup(1024);
        let wild = udp(&mut d, "0.0.0.0:7");
        let spec = udp(&mut d, "10.0.0.2:7");
        let conn = udp(&mut d, "10.0.0.2:7");
        let ids = [wild, spec, conn];
        d.connect(conn, PROTO_UDP, sa("10.0.0.2:7"), sa("10.0.0.9:99"));
        assert_eq!(
            who(&mut d, &page, &c("10.0.0.9:99", "10.0.0.2:7"), &ids),
            Some(conn)
        );
        assert_eq!(
            who(&mut d, &page, &c("10.0.0.9:98", "10.0.0.2:7"), &ids),
            Some(spec)
        );
        assert_eq!(
            who(&mut d, &page, &c("10.0.0.9:99", "10.0.0.3:7"), &ids),
            Some(wild)
        );
        assert_eq!(
            who(&mut d, &page, &c("10.0.0.9:99", "10.0.0.3:8"), &ids),
            None
        );
        // Another protocol on the same port is another table entry.
        let mut tcp = c("10.0.0.9:99", "10.0.0.2:7");
        tcp.proto = 6;
        assert_eq!(who(&mut d, &page, &tcp, &ids), None);
        // Gone endpoints are gone from every table.
        d.remove(conn);
        assert_eq!(
            who(&mut d, &page, &c("10.0.0.9:99", "10.0.0.2:7"), &ids),
            Some(spec)
        );
    }

    /// A connection taken over by the clients' endpoint on a listener's
    /// local address (moved in, taken from the kernel) gets its segments
    /// ahead of the listener bound there first, several per address; the
    /// listener keeps the rest, and gets them back when a flow is unbound.
    #[test]
    fn a_flow_bound_on_a_listeners_address_goes_ahead_of_the_listener() {
        let (page, mut d) = setup(1024);
        let tcp = |src: &str| Classified {
            proto: PROTO_TCP,
            ..c(src, "10.0.0.2:80")
        };
        let lst = d.add(EndpointKind::Tcp, efd(), 64).unwrap();
        d.bind(lst, PROTO_TCP, sa("10.0.0.2:80"));
        let cli = d.add(EndpointKind::Tcp, efd(), 64).unwrap();
        d.bind(cli, PROTO_TCP, sa("10.0.0.2:80"));
        let ids = [lst, cli];
        let flow = |d: &mut Demux, id, peer: &str, on| {
            d.set_flow(id, PROTO_TCP, (sa("10.0.0.2:80"), sa(peer)), on);
        };
        flow(&mut d, cli, "10.0.0.9:1000", true);
        flow(&mut d, cli, "10.0.0.9:1001", true);
        let to = |d: &mut Demux, peer: &str| who(d, &page, &tcp(peer), &ids);
        assert_eq!(to(&mut d, "10.0.0.9:1000"), Some(cli));
        assert_eq!(to(&mut d, "10.0.0.9:1001"), Some(cli));
        assert_eq!(to(&mut d, "10.0.0.9:1002"), Some(lst));
        flow(&mut d, cli, "10.0.0.9:1000", false);
        assert_eq!(to(&mut d, "10.0.0.9:1000"), Some(lst));
        assert_eq!(to(&mut d, "10.0.0.9:1001"), Some(cli));
        // Another endpoint's flow is not undone by this one.
        flow(&mut d, lst, "10.0.0.9:1001", false);
        assert_eq!(to(&mut d, "10.0.0.9:1001"), Some(cli));
        d.remove(cli);
        assert_eq!(who(&mut d, &page, &tcp("10.0.0.9:1001"), &[lst]), Some(lst));
    }

    /// The queue gauge follows every push and pop; the high-water marks
    /// (the socket's, the engine's over all sockets) hold the deepest
    /// queue, also when a push leaves them alone (not past its own mark),
    /// and when a reused slot's endpoint starts over.
    #[test]
    fn queue_depth_and_high_water_marks() {
        use std::sync::atomic::Ordering::Relaxed;
        let (page, mut d) = setup(1024);
        let a = udp(&mut d, "10.0.0.2:7");
        let b = udp(&mut d, "10.0.0.2:8");
        let (to_a, to_b) = (c("10.0.0.9:1", "10.0.0.2:7"), c("10.0.0.9:1", "10.0.0.2:8"));
        let push = |d: &mut Demux, cl: &Classified| {
            assert!(matches!(put(d, &page, cl), Outcome::Delivered));
        };
        let marks = |id: EndpointId| {
            (
                page.s(id, S::QueueDepth).load(Relaxed),
                page.s(id, S::PeakQueueDepth).load(Relaxed),
                page.e(E::PeakSocketQueue).load(Relaxed),
            )
        };
        for _ in 0..3 {
            push(&mut d, &to_a);
        }
        assert_eq!(marks(a), (3, 3, 3));
        assert!(d.pop(a, &page).is_some() && d.pop(a, &page).is_some());
        assert_eq!(marks(a), (1, 3, 3));
        push(&mut d, &to_a);
        assert_eq!(marks(a), (2, 3, 3));
        for n in 1..=2 {
            push(&mut d, &to_b);
            assert_eq!(marks(b), (n, n, 3));
        }
        for _ in 0..2 {
            push(&mut d, &to_a);
        }
        assert_eq!(marks(a), (4, 4, 4));
        // A new endpoint in a's slot (its page words zeroed at bind, as a
        // socket's are) counts its own marks from nothing.
        d.remove(a);
        page.set_sock_addr(a, Some(sa("10.0.0.2:7")));
        let a2 = udp(&mut d, "10.0.0.2:7");
        assert_eq!(a2, a);
        push(&mut d, &to_a);
        assert_eq!(marks(a2), (1, 1, 4));
    }

    #[test]
    fn multicast_fans_out_one_frame_and_queues_are_bounded() {
        let (page, mut d) = setup(16);
        let a = udp(&mut d, "239.1.1.1:5");
        let b = udp(&mut d, "239.1.1.1:5");
        let m = c("10.0.0.9:1", "239.1.1.1:5");
        assert!(matches!(put(&mut d, &page, &m), Outcome::Delivered));
        assert!(d.pop(a, &page).is_some() && d.pop(b, &page).is_some());
        // Share: half of 16 frames = 8 for all endpoints' queues, floor min(8, 256).
        assert_eq!(d.cap(a), 8);
        if let Some(e) = d.get_mut(a) {
            e.rcvbuf_frames = 3;
        }
        assert_eq!(d.cap(a), 3, "SO_RCVBUF below the share wins");
        for _ in 0..3 {
            put(&mut d, &page, &m);
        }
        assert_eq!(d.get(a).unwrap().queue.len(), 3);
        assert_eq!(d.get(b).unwrap().queue.len(), 3);
        // a is full: b still gets it, a's drop is counted on a.
        assert!(matches!(put(&mut d, &page, &m), Outcome::Delivered));
        assert_eq!(d.get(a).unwrap().queue.len(), 3);
        assert_eq!(d.get(b).unwrap().queue.len(), 4);
        assert_eq!(drops(&page, a), 1);
        assert_eq!(drops(&page, b), 0);
    }

    /// Issue: a select() loop over a TCP and a UDP socket (iperf3 -u)
    /// turned the engine through the TCP socket every call, moving UDP
    /// frames into a full UDP queue, where they were dropped although they
    /// could have waited in the ring. Another endpoint's poll now queues
    /// them past the cap, up to a quarter of the UMEM's RX frames; the
    /// owner's own polls keep the cap strict; the spill is given back frame
    /// for frame as the reader catches up, and with the endpoint.
    #[test]
    fn another_endpoints_poll_spills_past_a_full_queue_within_a_bound() {
        let (page, mut d) = setup(64);
        let udp = udp(&mut d, "10.0.0.2:7");
        let tcp = d.add(EndpointKind::Tcp, efd(), 64).unwrap();
        if let Some(e) = d.get_mut(udp) {
            e.rcvbuf_frames = 4;
        }
        let m = c("10.0.0.9:1", "10.0.0.2:7");
        let offer = |d: &mut Demux| put(d, &page, &m);
        // The owner's (or nobody's) poll: the cap holds.
        for _ in 0..4 {
            assert!(matches!(offer(&mut d), Outcome::Delivered));
        }
        assert!(matches!(offer(&mut d), Outcome::QueueFull));
        d.spill_for(Some(udp));
        assert!(matches!(offer(&mut d), Outcome::QueueFull));
        // The TCP stack's poll: up to 64 / 4 = 16 more wait in the queue.
        d.spill_for(Some(tcp));
        for _ in 0..16 {
            assert!(matches!(offer(&mut d), Outcome::Delivered));
        }
        assert!(matches!(offer(&mut d), Outcome::QueueFull));
        assert_eq!(d.spilled(), 16);
        assert_eq!(d.get(udp).unwrap().queue.len(), 20);
        // The reader takes 3: 3 of the spill are back within the cap.
        for _ in 0..3 {
            assert!(d.pop(udp, &page).is_some());
        }
        assert_eq!(d.spilled(), 13);
        assert!(matches!(offer(&mut d), Outcome::Delivered));
        assert_eq!(d.spilled(), 14);
        d.spill_for(None);
        assert!(matches!(offer(&mut d), Outcome::QueueFull));
        // Every frame taken is accounted for: delivered or counted.
        assert_eq!(drops(&page, udp), 4);
        d.remove(udp);
        assert_eq!(d.spilled(), 0);
    }

    /// Issue 23: on the engine service a process's queues together hold at
    /// most its limit, however many sockets it leaves unread: past it every
    /// socket's datagram is dropped with its reason (`ShareFull`, counted
    /// on the socket), a pop or a removed socket gives room back, and the
    /// spill past a cap is inside the limit too.
    #[test]
    fn a_process_limit_bounds_all_queues_together() {
        let (page, mut d) = setup(1024);
        d.set_process_limit(10);
        let ids: Vec<EndpointId> = (0..4)
            .map(|i| udp(&mut d, &format!("10.0.0.2:{}", 7 + i)))
            .collect();
        let m: Vec<Classified> = (0..4)
            .map(|i| c("10.0.0.9:1", &format!("10.0.0.2:{}", 7 + i)))
            .collect();
        // Each socket's share (half of 1,024 over 4: 128) is far above it.
        for i in 0..10 {
            assert!(matches!(put(&mut d, &page, &m[i % 4]), Outcome::Delivered));
        }
        for cl in &m {
            assert!(matches!(put(&mut d, &page, cl), Outcome::ShareFull));
        }
        assert_eq!(ids.iter().map(|&i| drops(&page, i)).sum::<u64>(), 4);
        assert!(d.pop(ids[1], &page).is_some());
        assert!(matches!(put(&mut d, &page, &m[3]), Outcome::Delivered));
        assert!(matches!(put(&mut d, &page, &m[3]), Outcome::ShareFull));
        // A removed socket's frames leave the count.
        let gone = d.remove(ids[0]).unwrap().queue.len();
        assert_eq!(gone, 3);
        for _ in 0..3 {
            assert!(matches!(put(&mut d, &page, &m[2]), Outcome::Delivered));
        }
        assert!(matches!(put(&mut d, &page, &m[2]), Outcome::ShareFull));
        // Another endpoint's poll spills past a cap only within the limit.
        if let Some(e) = d.get_mut(ids[1]) {
            e.rcvbuf_frames = 1;
        }
        d.spill_for(Some(ids[2]));
        assert!(matches!(put(&mut d, &page, &m[1]), Outcome::ShareFull));
        assert_eq!(d.spilled(), 0);
    }

    #[test]
    fn unbind_and_remove_leave_nothing_behind() {
        let (page, mut d) = setup(1024);
        let a = udp(&mut d, "10.0.0.2:7");
        let m = c("10.0.0.9:1", "10.0.0.2:7");
        assert!(matches!(put(&mut d, &page, &m), Outcome::Delivered));
        d.unbind(a, PROTO_UDP, sa("10.0.0.2:7"));
        assert!(matches!(put(&mut d, &page, &m), Outcome::NoEndpoint));
        // Removing hands back what was queued, and frees the slot.
        let ep = d.remove(a).unwrap();
        assert_eq!(ep.queue.len(), 1);
        assert!(d.get(a).is_none());
        let b = d.add(EndpointKind::Udp, efd(), 64).unwrap();
        assert_eq!(a, b, "the slot is reused");
        assert!(d.add(EndpointKind::Udp, efd(), 2).is_some());
        assert!(d.add(EndpointKind::Udp, efd(), 2).is_none(), "at most max");
    }

    #[test]
    fn a_connected_endpoint_on_the_wildcard_address_matches_any_local_address() {
        let (page, mut d) = setup(1024);
        let a = udp(&mut d, "0.0.0.0:7");
        d.connect(a, PROTO_UDP, sa("0.0.0.0:7"), sa("10.0.0.9:99"));
        assert_eq!(
            who(&mut d, &page, &c("10.0.0.9:99", "10.0.0.3:7"), &[a]),
            Some(a)
        );
        // Another peer: the connected socket takes nothing else.
        assert_eq!(
            who(&mut d, &page, &c("10.0.0.8:99", "10.0.0.3:7"), &[a]),
            None
        );
        // Multicast from someone else is not for a connected socket either.
        d.bind(a, PROTO_UDP, sa("239.1.1.1:7"));
        assert!(matches!(
            put(&mut d, &page, &c("10.0.0.8:1", "239.1.1.1:7")),
            Outcome::NoEndpoint
        ));
    }
}
