//! Receive: a budgeted poll of the receive device into the demux.
//!
//! `RxPath` lives under the engine's RX lock: the receive device (the
//! AF_XDP rings of every queue, with the tap, fault and stamp wrappers; or
//! the loopback device in tests), the demux with every endpoint's queue.
//! The lock is held for one budgeted poll and/or one pop, never across a
//! user closure or a netlink call. Every frame taken off the device ends up
//! exactly once as delivered (`rx_packets`) or under one drop reason, so
//! `rx_frames = rx_packets + sum(drop_*)`; the RX counters have this lock
//! as their single writer.
//!
//! One frame's way: device → [`RxPath::poll`] → `handle`: other host? →
//! `classify` (classify.rs) → fragment? `reasm.rs` → martian? → demux
//! (demux.rs) onto its endpoint's queue → [`RxPath::pop_or_poll`] by the
//! socket.

use super::classify::{DropReason, PROTO_UDP, classify_frame, for_other_host};
use super::demux::{Delivery, Demux, EndpointId, Outcome};
use super::device::RxDevice;
use super::reasm::Reassembly;
use super::shm::{E, StatsPage, bump};
use nanowire_probe::{self as probe, Mark};
use nanowire_xdp::RxFrame;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Descriptors one poll takes at most (bounds the time the RX lock is
/// held, and so the wait of any other socket of the process).
pub(crate) const RX_BUDGET: u32 = 256;
/// Idle polls between two looks at expired fragments.
const IDLE_EXPIRE_EVERY_MASK: u32 = (1 << 16) - 1;

pub(crate) struct RxPath<D> {
    pub dev: D,
    pub demux: Demux,
    /// The interface's own addresses: a frame from one of them is martian.
    pub own: Vec<Ipv4Addr>,
    pub page: Arc<StatsPage>,
    idle: u32,
    /// Fragments of the engine's TCP flows being reassembled.
    reasm: Reassembly,
    /// The interface's MAC: a unicast frame for another one is dropped
    /// (`drop_other_host`) as the kernel drops PACKET_OTHERHOST (the
    /// steering program already passes those to the kernel).
    pub mac: Option<[u8; 6]>,
    /// Bumped after every poll that took descriptors (whatever it delivered
    /// to which endpoint), read without the RX lock: a reader that found its
    /// queue empty and sees this unchanged (and nothing on the rings) knows
    /// nothing arrived for it since ([`super::Engine::rx_quiet`]).
    pub delivered: Arc<AtomicU64>,
    /// Frames TCP connections of this engine keep in their receive queues
    /// now (`nanowire_tcp::Hold`, tcp.rs `HeldFrame`), all stacks
    /// together, and the most they may: a frame held is one the fill ring
    /// lacks, so past the limit segments are copied as before.
    pub held: Arc<AtomicUsize>,
    pub hold_limit: usize,
}

/// Of the UMEM's RX frames, at most this fraction (1/4) is held in TCP
/// receive queues (an engine on the service's shared UMEM: half of that).
pub(crate) const HOLD_DIVISOR: usize = 4;

impl<D: RxDevice> RxPath<D> {
    pub fn new(dev: D, demux: Demux, own: Vec<Ipv4Addr>, page: Arc<StatsPage>) -> Self {
        RxPath {
            dev,
            own,
            page,
            idle: 0,
            reasm: Reassembly::new(),
            mac: None,
            delivered: Arc::new(AtomicU64::new(0)),
            held: Arc::new(AtomicUsize::new(0)),
            hold_limit: demux.umem_frames() / HOLD_DIVISOR,
            demux,
        }
    }

    /// Take at most `budget` descriptors from the device into the endpoint
    /// queues. Returns descriptors taken.
    #[inline]
    pub fn poll(&mut self, budget: u32) -> u32 {
        self.poll_own(budget, None, 0, |_, _| {
            unreachable!("no endpoint's frames are taken by this poll")
        })
    }

    /// [`RxPath::poll`] by endpoint `own`'s consumer (the TCP driver's turn,
    /// a UDP reader whose queue is empty): up to `quota` unicast frames for
    /// `own` are not queued to be popped again at once but go straight to
    /// `take`, counted as a pop counts them (and waking a thread asleep on
    /// `own`, as a push does); its frames past the quota and frames for
    /// other endpoints are queued as by `poll`. The caller pops what was
    /// queued for `own` before, so the frames keep their order.
    #[inline]
    pub fn poll_own(
        &mut self,
        budget: u32,
        own: Option<EndpointId>,
        quota: usize,
        mut take: impl FnMut(Delivery, &HeldBudget<'_>),
    ) -> u32 {
        let RxPath {
            dev,
            demux,
            own: addrs,
            page,
            reasm,
            mac,
            held,
            hold_limit,
            ..
        } = self;
        let mut frames = Frames {
            demux,
            own: addrs,
            page,
            reasm,
            mac: *mac,
            mine: own,
            quota,
        };
        let h = HeldBudget {
            page,
            held,
            limit: *hold_limit,
        };
        probe::mark(Mark::PollIn);
        let n = dev.receive(budget, |f, at| frames.handle(f, at, &mut |d| take(d, &h)));
        if n > 0 {
            // After the pushes (made under the lock this poll holds). The
            // only writer is a poll (`&mut self`: under the RX lock), so a
            // load and a store, not a locked read-modify-write on the
            // path from the ring to the reply.
            let d = self.delivered.load(Ordering::Relaxed);
            self.delivered.store(d.wrapping_add(1), Ordering::Release);
        } else {
            self.idle = self.idle.wrapping_add(1);
            if self.idle & IDLE_EXPIRE_EVERY_MASK == 0 && !self.reasm.is_empty() {
                self.reasm.expire(super::reasm::mono_ns());
                count_frags(&self.page, &mut self.reasm);
            }
        }
        n
    }

    /// What a consumer of the frames needs of the path besides them (see
    /// [`HeldBudget`]).
    pub fn budget(&self) -> HeldBudget<'_> {
        HeldBudget {
            page: &self.page,
            held: &self.held,
            limit: self.hold_limit,
        }
    }

    /// Pop endpoint `id`'s next frame, polling the device if it has none
    /// (the first frame that poll finds for `id` comes straight back, not
    /// through its queue: [`RxPath::poll_own`]).
    #[inline]
    pub fn pop_or_poll(&mut self, id: EndpointId) -> Option<Delivery> {
        if let Some(d) = self.demux.pop(id, &self.page) {
            return Some(d);
        }
        let mut got = None;
        if self.poll_own(RX_BUDGET, Some(id), 1, |d, _| got = Some(d)) > 0 && got.is_none() {
            // Queued by the poll (a multicast datagram).
            return self.demux.pop(id, &self.page);
        }
        got
    }

    /// Return frames to the device (after endpoints dropped theirs).
    pub fn refill(&mut self) {
        self.dev.refill();
    }

    /// Refresh the device's counters (the kernel's XDP_STATISTICS).
    pub fn refresh_kernel_stats(&mut self) {
        self.dev.refresh_stats();
    }

    /// Fragments being reassembled (tests).
    #[cfg(test)]
    pub fn reassembling(&self) -> usize {
        self.reasm.datagrams()
    }
}

/// What a frame's consumer may use of the receive path while it takes the
/// frame (the stats page, and the frames held in TCP receive queues
/// against their limit: `RxPath::held`, `RxPath::hold_limit`).
pub(crate) struct HeldBudget<'a> {
    pub page: &'a StatsPage,
    pub held: &'a Arc<AtomicUsize>,
    pub limit: usize,
}

/// A poll's way for each frame: the parts of [`RxPath`] it uses besides the
/// device, and the endpoint whose frames go straight to the poll's
/// consumer (`RxPath::poll_own`).
struct Frames<'a> {
    demux: &'a mut Demux,
    /// The interface's own addresses.
    own: &'a [Ipv4Addr],
    page: &'a StatsPage,
    reasm: &'a mut Reassembly,
    mac: Option<[u8; 6]>,
    mine: Option<EndpointId>,
    /// Frames `mine` may still take straight from this poll.
    quota: usize,
}

impl Frames<'_> {
    /// One frame: other host?, classify, check the source against our own
    /// addresses, deliver (to `take` if it is for `mine`) or count the drop.
    #[inline]
    fn handle(&mut self, f: RxFrame, at: u64, take: &mut impl FnMut(Delivery)) {
        probe::mark(Mark::Handled);
        let page = self.page;
        bump(page.e(E::RxFrames), 1);
        probe::mark(Mark::Counted);
        if let Some(m) = &self.mac
            && for_other_host(f.head(), m)
        {
            return bump(page.e(DropReason::OtherHost.counter()), 1);
        }
        probe::mark(Mark::ClassifyIn);
        let c = match classify_frame(&f) {
            Ok(c) => c,
            Err(DropReason::Malformed(nanowire_wire::Malformed::Fragment)) => {
                return self.reassemble(f, at, take);
            }
            Err(why) => return bump(page.e(why.counter()), 1),
        };
        probe::mark(Mark::Classified);
        if self.own.contains(c.src.ip()) {
            return bump(page.e(E::DropMartian), 1);
        }
        if c.csum_partial {
            bump(page.e(E::RxCsumPartial), 1);
        }
        let len = c.payload_len as u64;
        // A multicast or broadcast datagram is queued for every member
        // (`Demux::deliver_at`'s fan-out): from then on this poll queues
        // `mine`'s frames too, behind it (its reader pops them in order).
        // (A TCP endpoint, the TCP driver's `mine`, is never a member.)
        let ip = c.dst.ip();
        if (ip.is_multicast() || ip.is_broadcast()) && c.proto == PROTO_UDP {
            self.quota = 0;
        }
        let mine = self.mine.filter(|_| self.quota > 0);
        match self.demux.deliver_at(&c, f, at, page, mine) {
            Outcome::NoEndpoint => bump(page.e(E::DropNoSocket), 1),
            Outcome::QueueFull => bump(page.e(E::DropSocketQueueFull), 1),
            Outcome::ShareFull => bump(page.e(E::DropProcessShare), 1),
            delivered => {
                bump(page.e(E::RxPackets), 1);
                bump(page.e(E::RxBytes), len);
                if let Outcome::Mine(d) = delivered {
                    self.quota -= 1;
                    probe::mark(Mark::Delivered);
                    take(d);
                }
            }
        }
    }

    /// A fragment (the steering program redirects only those of the
    /// engine's TCP flows): into the reassembly; a completed datagram goes
    /// through `handle` as one more frame.
    #[cold]
    fn reassemble(&mut self, f: RxFrame, at: u64, take: &mut impl FnMut(Delivery)) {
        let whole = self.reasm.push(f.data(), super::reasm::mono_ns());
        drop(f); // back to the fill ring: the bytes were copied
        count_frags(self.page, self.reasm);
        if let Some(v) = whole {
            self.handle(RxFrame::from_vec(v), at, take);
        }
    }
}

fn count_frags(page: &StatsPage, reasm: &mut Reassembly) {
    let t = reasm.take_tally();
    bump(page.e(E::RxFragMerged), t.merged);
    bump(page.e(E::DropFragTimeout), t.timeout);
    bump(page.e(E::DropFragOverlap), t.overlap);
    bump(page.e(E::DropFragTooMany), t.too_many);
    bump(page.e(E::DropFragment), t.malformed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdp::classify::PROTO_TCP;
    use crate::xdp::demux::EndpointKind;
    use crate::xdp::shm::S;
    use crate::xdp::testkit::*;

    #[test]
    fn a_datagram_reaches_its_endpoint_and_is_counted() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 1024, 7);
        rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 7), b"hello"));
        assert_eq!(rx.poll(RX_BUDGET), 1);
        let d = rx.pop_or_poll(id).expect("delivered");
        assert_eq!(d.payload(), b"hello");
        assert_eq!(d.src, sa(PEER, 9));
        assert_eq!(d.stamp, 0, "no stamps asked for");
        let p = &rx.page;
        assert_eq!(get(p, E::RxFrames), 1);
        assert_eq!(get(p, E::RxPackets), 1);
        assert_eq!(get(p, E::RxBytes), 5);
        assert!(identity_holds(p));
    }

    #[test]
    fn pop_or_poll_polls_only_when_the_queue_is_empty() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 1024, 7);
        assert!(rx.pop_or_poll(id).is_none());
        for i in 0..3u8 {
            rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 7), &[i]));
        }
        // The first pop polls the device (taking all three), the next ones
        // come from the queue.
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), &[0]);
        assert_eq!(rx.dev.waiting(), 0);
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), &[1]);
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), &[2]);
        assert!(rx.pop_or_poll(id).is_none());
    }

    #[test]
    fn a_poll_takes_at_most_its_budget() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 4096, 7);
        for _ in 0..300 {
            rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 7), b"x"));
        }
        assert_eq!(rx.poll(RX_BUDGET), RX_BUDGET);
        assert_eq!(rx.poll(RX_BUDGET), 44);
        assert_eq!(rx.poll(RX_BUDGET), 0);
        assert_eq!(rx.demux.get(id).unwrap().queue.len(), 300);
    }

    #[test]
    fn a_poll_for_an_endpoint_hands_its_frames_over_and_queues_the_rest() {
        let (mut rx, a) = rx_with_udp(loop_rx(), 1024, 7);
        let b = rx.demux.add(EndpointKind::Udp, efd(), 64).unwrap();
        rx.demux.bind(b, 17, sa(OURS, 8));
        rx.demux.get_mut(a).unwrap().sleeping = true;
        for (port, data) in [(7, b"one"), (8, b"two"), (7, b"six")] {
            rx.dev.inject(udp(sa(PEER, 9), sa(OURS, port), data));
        }
        let mut got = Vec::new();
        let n = rx.poll_own(RX_BUDGET, Some(a), usize::MAX, |d, _| {
            got.push(d.payload().to_vec())
        });
        assert_eq!(n, 3);
        assert_eq!(got, [b"one", b"six"], "in the order they came");
        let e = rx.demux.get(a).unwrap();
        assert!(e.queue.is_empty(), "not queued");
        assert!(
            !e.sleeping && e.signalled,
            "its sleeper woken, as a push does"
        );
        assert_eq!(rx.demux.get(b).unwrap().queue.len(), 1);
        let p = &rx.page;
        assert_eq!(get_s(p, a, S::RxPackets), 2, "counted as pops count");
        assert_eq!(get_s(p, a, S::RxBytes), 6);
        assert_eq!(get(p, E::RxPackets), 3);
        assert!(identity_holds(p));
        assert_eq!(rx.pop_or_poll(b).unwrap().payload(), b"two");
    }

    #[test]
    fn pop_or_poll_takes_its_frame_straight_from_the_poll_and_queues_the_rest() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 1024, 7);
        for i in 0..3u8 {
            rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 7), &[i; 4]));
        }
        let d = rx.pop_or_poll(id).expect("the first");
        assert_eq!(d.payload(), &[0; 4]);
        let e = rx.demux.get(id).unwrap();
        assert_eq!(e.queue.len(), 2, "the first never queued, the rest are");
        let p = rx.page.clone();
        assert_eq!(get_s(&p, id, S::RxPackets), 1, "counted once, as a pop");
        assert_eq!(get_s(&p, id, S::RxBytes), 4);
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), &[1; 4]);
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), &[2; 4]);
        assert!(rx.pop_or_poll(id).is_none());
        assert_eq!(get_s(&p, id, S::RxPackets), 3);
        assert_eq!(get(&p, E::RxPackets), 3);
        assert!(identity_holds(&p));
    }

    #[test]
    fn a_poll_for_an_endpoint_takes_at_most_its_quota() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 1024, 7);
        for i in 0..5u8 {
            rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 7), &[i]));
        }
        let mut got = Vec::new();
        assert_eq!(rx.poll_own(RX_BUDGET, Some(id), 2, |d, _| got.push(d)), 5);
        let got: Vec<_> = got.iter().map(|d| d.payload()[0]).collect();
        assert_eq!(got, [0, 1]);
        for i in 2..5u8 {
            assert_eq!(rx.pop_or_poll(id).unwrap().payload(), &[i]);
        }
        assert_eq!(get_s(&rx.page, id, S::RxPackets), 5);
        assert!(identity_holds(&rx.page));
    }

    #[test]
    fn a_multicast_datagram_keeps_its_place_before_the_unicast_ones_behind_it() {
        let (mut rx, a) = rx_with_udp(loop_rx(), 1024, 5);
        let g = sa(Ipv4Addr::new(239, 1, 2, 3), 5);
        rx.demux.bind(a, 17, g);
        rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 5), b"one"));
        let mut m = udp(sa(PEER, 9), g, b"two");
        m[0..6].copy_from_slice(&[1, 0, 0x5e, 1, 2, 3]);
        rx.dev.inject(m);
        rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 5), b"six"));
        let mut got = Vec::new();
        rx.poll_own(RX_BUDGET, Some(a), usize::MAX, |d, _| got.push(d));
        assert_eq!(got.len(), 1, "only what came before the multicast one");
        assert_eq!(got[0].payload(), b"one");
        assert_eq!(rx.pop_or_poll(a).unwrap().payload(), b"two");
        assert_eq!(rx.pop_or_poll(a).unwrap().payload(), b"six");
        // A multicast datagram alone: pop_or_poll still returns it.
        let mut m = udp(sa(PEER, 9), g, b"ten");
        m[0..6].copy_from_slice(&[1, 0, 0x5e, 1, 2, 3]);
        rx.dev.inject(m);
        assert_eq!(rx.pop_or_poll(a).unwrap().payload(), b"ten");
        assert!(identity_holds(&rx.page));
    }

    #[test]
    fn no_endpoint_is_a_counted_drop() {
        let (mut rx, _) = rx_with_udp(loop_rx(), 1024, 7);
        rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 8), b"nobody"));
        rx.poll(RX_BUDGET);
        assert_eq!(get(&rx.page, E::DropNoSocket), 1);
        assert_eq!(get(&rx.page, E::RxPackets), 0);
        assert!(identity_holds(&rx.page));
    }

    #[test]
    fn a_frame_for_another_mac_is_dropped_as_other_host() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 1024, 7);
        let mut f = udp(sa(PEER, 9), sa(OURS, 7), b"not mine");
        f[0..6].copy_from_slice(&[2, 9, 9, 9, 9, 9]);
        rx.dev.inject(f);
        // Broadcast and multicast MACs are everyone's.
        let mut b = udp(sa(PEER, 9), sa(OURS, 7), b"all");
        b[0..6].copy_from_slice(&[0xff; 6]);
        rx.dev.inject(b);
        rx.poll(RX_BUDGET);
        assert_eq!(get(&rx.page, E::DropOtherHost), 1);
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), b"all");
        assert!(identity_holds(&rx.page));
    }

    #[test]
    fn our_own_source_address_is_martian() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 1024, 7);
        rx.dev.inject(udp(sa(OURS, 9), sa(OURS, 7), b"spoofed"));
        rx.dev
            .inject(udp(sa(Ipv4Addr::new(127, 0, 0, 1), 9), sa(OURS, 7), b"lo"));
        rx.poll(RX_BUDGET);
        assert_eq!(get(&rx.page, E::DropMartian), 2);
        assert!(rx.pop_or_poll(id).is_none());
        assert!(identity_holds(&rx.page));
    }

    #[test]
    fn a_bad_checksum_is_dropped_under_its_reason() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 1024, 7);
        let mut f = udp(sa(PEER, 9), sa(OURS, 7), b"corrupt me");
        let last = f.len() - 1;
        f[last] ^= 0x40;
        rx.dev.inject(f);
        rx.poll(RX_BUDGET);
        assert!(rx.pop_or_poll(id).is_none());
        assert_eq!(drops(&rx.page), 1);
        assert_eq!(get(&rx.page, E::RxPackets), 0);
        assert!(identity_holds(&rx.page));
    }

    #[test]
    fn every_frame_is_delivered_or_dropped_once_whatever_its_bytes() {
        let (mut rx, id) = rx_with_udp(loop_rx(), 1 << 14, 7);
        let good = udp(sa(PEER, 9), sa(OURS, 7), b"payload!");
        let mut seed = 0x9e37_79b9u32;
        let mut n = 0;
        for len in 0..good.len() + 4 {
            // Truncations, then single-byte corruptions of every header byte.
            rx.dev.inject(good[..len.min(good.len())].to_vec());
            n += 1;
        }
        for i in 0..good.len() {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let mut f = good.clone();
            f[i] ^= (seed >> 16) as u8 | 1;
            rx.dev.inject(f);
            n += 1;
        }
        while rx.poll(RX_BUDGET) > 0 {}
        let p = rx.page.clone();
        assert_eq!(get(&p, E::RxFrames), n);
        assert!(identity_holds(&p), "rx_frames = rx_packets + drops");
        let mut got = 0;
        while rx.pop_or_poll(id).is_some() {
            got += 1;
        }
        assert_eq!(got, get(&p, E::RxPackets));
    }

    #[test]
    fn a_full_queue_drops_for_that_endpoint_only() {
        let (mut rx, a) = rx_with_udp(loop_rx(), 1024, 7);
        let b = rx.demux.add(EndpointKind::Udp, efd(), 64).unwrap();
        rx.demux.bind(b, 17, sa(OURS, 8));
        rx.demux.get_mut(a).unwrap().rcvbuf_frames = 2;
        for _ in 0..5 {
            rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 7), b"a"));
        }
        rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 8), b"b"));
        rx.poll(RX_BUDGET);
        assert_eq!(rx.demux.get(a).unwrap().queue.len(), 2);
        assert_eq!(get(&rx.page, E::DropSocketQueueFull), 3);
        assert_eq!(rx.pop_or_poll(b).unwrap().payload(), b"b");
        assert!(identity_holds(&rx.page));
    }

    #[test]
    fn tcp_fragments_are_reassembled_into_one_delivery() {
        use nanowire_wire::checksum;
        let mut rx = RxPath::new(
            loop_rx(),
            crate::xdp::demux::Demux::new(1024),
            vec![OURS],
            page(),
        );
        let id = rx.demux.add(EndpointKind::Tcp, efd(), 64).unwrap();
        rx.demux.bind(id, PROTO_TCP, sa(OURS, 80));
        // A TCP segment (20-byte header, 1000 bytes) with a valid checksum,
        // in two IP fragments.
        let data: Vec<u8> = (0..1000).map(|i| i as u8).collect();
        let mut seg = vec![0u8; 20];
        seg[0..2].copy_from_slice(&4000u16.to_be_bytes());
        seg[2..4].copy_from_slice(&80u16.to_be_bytes());
        seg[12] = 0x50;
        seg[13] = 0x18;
        seg.extend_from_slice(&data);
        let mut ph = Vec::new();
        ph.extend_from_slice(&PEER.octets());
        ph.extend_from_slice(&OURS.octets());
        ph.extend_from_slice(&[0, PROTO_TCP]);
        ph.extend_from_slice(&(seg.len() as u16).to_be_bytes());
        let sum = checksum::accumulate(checksum::accumulate(0, &ph), &seg);
        seg[16..18].copy_from_slice(&(!checksum::fold(sum)).to_be_bytes());
        for (off, more) in [(0usize, true), (512, false)] {
            let part = &seg[off..if more { 512 } else { seg.len() }];
            let mut f = OUR_MAC.to_vec();
            f.extend_from_slice(&PEER_MAC);
            f.extend_from_slice(&[0x08, 0]);
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + part.len()) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&77u16.to_be_bytes());
            let fo = (off / 8) as u16 | if more { 0x2000 } else { 0 };
            ip[6..8].copy_from_slice(&fo.to_be_bytes());
            ip[8] = 64;
            ip[9] = PROTO_TCP;
            ip[12..16].copy_from_slice(&PEER.octets());
            ip[16..20].copy_from_slice(&OURS.octets());
            let c = !checksum::fold(checksum::accumulate(0, &ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&ip);
            f.extend_from_slice(part);
            rx.dev.inject(f);
        }
        rx.poll(RX_BUDGET);
        assert_eq!(rx.reassembling(), 0);
        let d = rx.pop_or_poll(id).expect("the whole segment");
        assert_eq!(d.payload(), &data[..]);
        assert_eq!(d.src, sa(PEER, 4000));
        // Two fragment frames merged, the datagram one more frame, delivered.
        let p = &rx.page;
        assert_eq!(get(p, E::RxFragMerged), 2);
        assert_eq!(get(p, E::RxFrames), 3);
        assert_eq!(
            get(p, E::RxFrames),
            get(p, E::RxPackets) + drops(p) + get(p, E::RxFragMerged)
        );
    }

    #[test]
    fn multicast_reaches_every_member_through_the_receive_path() {
        let (mut rx, a) = rx_with_udp(loop_rx(), 1024, 5);
        let b = rx.demux.add(EndpointKind::Udp, efd(), 64).unwrap();
        let g = sa(Ipv4Addr::new(239, 1, 2, 3), 5);
        rx.demux.bind(a, 17, g);
        rx.demux.bind(b, 17, g);
        let mut f = udp(sa(PEER, 9), g, b"tick");
        f[0..6].copy_from_slice(&[1, 0, 0x5e, 1, 2, 3]);
        rx.dev.inject(f);
        rx.poll(RX_BUDGET);
        assert_eq!(rx.pop_or_poll(a).unwrap().payload(), b"tick");
        assert_eq!(rx.pop_or_poll(b).unwrap().payload(), b"tick");
        assert_eq!(get(&rx.page, E::RxPackets), 1, "one frame, shared");
    }

    #[test]
    fn a_connected_endpoint_takes_its_peer_before_the_bound_one() {
        let (mut rx, bound) = rx_with_udp(loop_rx(), 1024, 7);
        let conn = rx.demux.add(EndpointKind::Udp, efd(), 64).unwrap();
        rx.demux.connect(conn, 17, sa(OURS, 7), sa(PEER, 9));
        rx.dev.inject(udp(sa(PEER, 9), sa(OURS, 7), b"peer"));
        rx.dev.inject(udp(sa(PEER, 10), sa(OURS, 7), b"other"));
        rx.poll(RX_BUDGET);
        assert_eq!(rx.pop_or_poll(conn).unwrap().payload(), b"peer");
        assert_eq!(rx.pop_or_poll(bound).unwrap().payload(), b"other");
    }
}
