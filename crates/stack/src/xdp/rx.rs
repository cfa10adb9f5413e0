//! Receive: a budgeted poll of the RX rings into the demux.
//!
//! `RxPath` lives under the engine's RX lock: the rings of every queue, the
//! demux with every endpoint's queue. The lock is held for one budgeted
//! poll and/or one pop, never across a user closure or a netlink call.
//! Every frame taken off a ring ends up exactly once as delivered
//! (`rx_packets`) or under one drop reason, so
//! `rx_frames = rx_packets + sum(drop_*)`; the RX counters have this lock
//! as their single writer.

use super::classify::{DropReason, classify, for_other_host};
use super::demux::{Delivery, Demux, EndpointId, Outcome};
use super::reasm::Reassembly;
use super::shm::{E, StatsPage, bump, peak, set};
use nanowire_xdp::{RxFrame, XskRx, XskStats};
use std::net::Ipv4Addr;
use std::sync::Arc;

/// Descriptors per ring visit (between two refills of the fill ring).
pub(crate) const RX_BATCH: u32 = 64;
/// Descriptors one poll takes at most (bounds the time the RX lock is
/// held, and so the wait of any other socket of the process).
pub(crate) const RX_BUDGET: u32 = 256;
/// Polls between two XDP_STATISTICS refreshes (a syscall per queue).
const KERNEL_STATS_EVERY_MASK: u32 = (1 << 22) - 1;
/// Idle polls (nothing on the rings) between two refreshes.
const IDLE_STATS_EVERY_MASK: u32 = (1 << 16) - 1;

pub(crate) struct RxPath {
    pub queues: Vec<XskRx>,
    pub demux: Demux,
    /// The interface's own addresses: a frame from one of them is martian.
    pub own: Vec<Ipv4Addr>,
    pub page: Arc<StatsPage>,
    polls: u32,
    bad_descs: u64,
    chain_drops: u64,
    /// Copies of received frames for `nanowire capture` (crates/tap).
    pub tap: nanowire_tap::TapWriter,
    /// The seeded fault injector of the `faults` option (off: `None`).
    faults: Option<RxFaults>,
    /// (interface, frame size, multi-buffer) for the one warning about
    /// frames the kernel dropped (without multi-buffer: frames it could not
    /// fit in a frame); `None` once warned.
    oversize_warn: Option<(String, usize, bool)>,
    /// Sockets of the engine that want receive stamps: while non-zero each
    /// frame is stamped (`CLOCK_REALTIME`) as it is taken off the ring.
    pub stamp_users: u32,
    /// Fragments of the engine's TCP flows being reassembled.
    reasm: Reassembly,
    /// The interface's MAC: a unicast frame for another one is dropped
    /// (`drop_other_host`) as the kernel drops PACKET_OTHERHOST (the
    /// steering program already passes those to the kernel).
    pub mac: Option<[u8; 6]>,
}

/// Receive-side fault injection: every frame off the ring is copied into
/// the injector (its UMEM frame goes straight back to the fill ring); what
/// comes out when due (dropped, duplicated, held back, corrupted) is
/// classified and delivered like any frame, so `rx_frames = rx_packets +
/// drops` still holds (an injected loss counts as `drop_fault_rx`, an
/// injected duplicate as one more frame).
pub(crate) struct RxFaults {
    inj: nanowire_tcp::fault::FaultInjector,
    epoch: std::time::Instant,
    seen: nanowire_tcp::fault::FaultStats,
}

impl RxFaults {
    pub fn new(cfg: nanowire_tcp::fault::FaultConfig) -> RxFaults {
        RxFaults {
            inj: nanowire_tcp::fault::FaultInjector::new(cfg),
            epoch: std::time::Instant::now(),
            seen: Default::default(),
        }
    }
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
    /// Count what the injector did since the last call.
    fn account(&mut self, page: &StatsPage) {
        let st = &self.inj.stats;
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let lost = d(st.dropped, self.seen.dropped);
        if lost > 0 {
            bump(page.e(E::RxFrames), lost);
            bump(page.e(E::DropFaultRx), lost);
        }
        bump(
            page.e(E::FaultRxDuplicated),
            d(st.duplicated, self.seen.duplicated),
        );
        bump(
            page.e(E::FaultRxReordered),
            d(st.reordered, self.seen.reordered),
        );
        bump(
            page.e(E::FaultRxCorrupted),
            d(st.corrupted, self.seen.corrupted),
        );
        self.seen = st.clone();
    }
}

impl RxPath {
    pub fn new(
        queues: Vec<XskRx>,
        demux: Demux,
        own: Vec<Ipv4Addr>,
        page: Arc<StatsPage>,
        tap: nanowire_tap::TapWriter,
    ) -> Self {
        RxPath {
            queues,
            demux,
            own,
            page,
            polls: 0,
            bad_descs: 0,
            chain_drops: 0,
            tap,
            faults: None,
            oversize_warn: None,
            stamp_users: 0,
            reasm: Reassembly::new(),
            mac: None,
        }
    }

    /// Warn (once) when the kernel drops frames for this engine's sockets
    /// that it could not place (`xsk_rx_dropped`). Without multi-buffer
    /// (`mb` false) these are frames larger than `frame` bytes, such as a
    /// veth peer's TSO/GSO super-frames in generic XDP mode.
    pub fn set_oversize_hint(&mut self, iface: &str, frame: usize, mb: bool) {
        self.oversize_warn = Some((iface.to_string(), frame, mb));
    }

    /// Turn the receive-side fault injector on (the `faults` option).
    pub fn set_faults(&mut self, f: Option<RxFaults>) {
        self.faults = f;
    }

    /// Take at most `budget` descriptors from the rings into the endpoint
    /// queues. Returns descriptors taken.
    #[inline]
    pub fn poll(&mut self, budget: u32) -> u32 {
        self.polls = self.polls.wrapping_add(1);
        if self.polls & KERNEL_STATS_EVERY_MASK == 0 {
            self.refresh_kernel_stats();
        }
        let mut total = 0;
        let RxPath {
            queues,
            demux,
            own,
            page,
            tap,
            faults,
            stamp_users,
            reasm,
            mac,
            ..
        } = self;
        let stamping = *stamp_users > 0;
        for q in queues.iter_mut() {
            if total >= budget {
                break;
            }
            let info = q.poll(budget - total, RX_BATCH, |f| {
                // One predictable branch when no socket wants stamps.
                let at = if stamping { nanowire_tap::now_ns() } else { 0 };
                tap.record(f.data());
                if let Some(m) = mac
                    && for_other_host(f.data(), m)
                {
                    bump(page.e(E::RxFrames), 1);
                    return bump(page.e(DropReason::OtherHost.counter()), 1);
                }
                if f.is_multi_buffer() {
                    bump(page.e(E::RxMultiBuffer), 1);
                }
                match faults.as_mut() {
                    None => handle(demux, own, page, reasm, f, at),
                    Some(x) => {
                        let now = x.now();
                        x.inj.push(now, f.data());
                    }
                }
            });
            if info.descs > 0 {
                peak(page.e(E::PeakRxRing), u64::from(info.ring_peak));
            }
            total += info.descs;
        }
        if let Some(x) = faults.as_mut() {
            let now = x.now();
            let mut released = 0;
            while let Some(p) = x.inj.pop(now) {
                // Stamped when the injector releases it: that is when it
                // reaches the engine's receive path, as far as sockets see.
                let at = if stamping { nanowire_tap::now_ns() } else { 0 };
                handle(demux, own, page, reasm, RxFrame::from_vec(p), at);
                released += 1;
            }
            x.account(page);
            if total == 0 {
                return released;
            }
        }
        if total == 0 {
            // Idle: refresh the kernel's counters now and then as well, so
            // that drops the kernel made (a frame too big for ours, which
            // never reaches the ring) are counted and warned about even
            // when nothing else arrives.
            if self.polls & IDLE_STATS_EVERY_MASK == 0 {
                self.refresh_kernel_stats();
                if !self.reasm.is_empty() {
                    self.reasm.expire(super::reasm::mono_ns());
                    count_frags(&self.page, &mut self.reasm);
                }
            }
            return 0;
        }
        let bad: u64 = self.queues.iter().map(|q| q.bad_descs()).sum();
        if bad != self.bad_descs {
            bump(self.page.e(E::DropBadDesc), bad - self.bad_descs);
            bump(self.page.e(E::RxFrames), bad - self.bad_descs);
            self.bad_descs = bad;
        }
        let chain: u64 = self.queues.iter().map(|q| q.chain_drops()).sum();
        if chain != self.chain_drops {
            // A multi-buffer packet dropped whole (chain too long, or a piece
            // outside our frames): one frame, one drop.
            bump(self.page.e(E::DropRxChain), chain - self.chain_drops);
            bump(self.page.e(E::RxFrames), chain - self.chain_drops);
            self.chain_drops = chain;
        }
        total
    }

    /// Pop endpoint `id`'s next frame, polling the rings if it has none.
    #[inline]
    pub fn pop_or_poll(&mut self, id: EndpointId) -> Option<Delivery> {
        if let Some(d) = self.demux.pop(id, &self.page) {
            return Some(d);
        }
        if self.poll(RX_BUDGET) > 0 {
            return self.demux.pop(id, &self.page);
        }
        None
    }

    /// Return frames to the fill ring (after endpoints dropped theirs).
    pub fn refill(&mut self) {
        for q in &mut self.queues {
            q.refill();
        }
    }

    pub fn refresh_kernel_stats(&mut self) {
        let mut t = XskStats::default();
        for q in &self.queues {
            let s = q.stats();
            t.rx_dropped += s.rx_dropped;
            t.rx_ring_full += s.rx_ring_full;
            t.rx_fill_ring_empty_descs += s.rx_fill_ring_empty_descs;
            t.rx_invalid_descs += s.rx_invalid_descs;
            t.tx_invalid_descs += s.tx_invalid_descs;
            t.tx_ring_empty_descs += s.tx_ring_empty_descs;
        }
        let p = &self.page;
        // The kernel counts a fill-ring-empty drop in rx_dropped too; keep
        // the counters disjoint so that they add up.
        let dropped = t.rx_dropped.saturating_sub(t.rx_fill_ring_empty_descs);
        set(p.e(E::XskRxDropped), dropped);
        if dropped > 0
            && let Some((iface, frame, mb)) = self.oversize_warn.take()
        {
            if mb {
                eprintln!(
                    "nanowire: {iface}: the kernel dropped {dropped} frame(s) for this engine \
                     (counted as xsk_rx_dropped)"
                );
            } else {
                eprintln!(
                    "nanowire: {iface}: the kernel dropped {dropped} frame(s) for this engine that did not fit its \
                     {frame}-byte AF_XDP frames (counted as xsk_rx_dropped; no multi-buffer AF_XDP here): a peer's \
                     TSO/GSO/GRO super-frames? turn them off on the peer (ethtool -K <peer> tso off gso off gro off)"
                );
            }
        }
        set(p.e(E::XskRxRingFull), t.rx_ring_full);
        set(p.e(E::XskRxFillRingEmpty), t.rx_fill_ring_empty_descs);
        set(p.e(E::XskRxInvalidDescs), t.rx_invalid_descs);
        set(p.e(E::XskTxInvalidDescs), t.tx_invalid_descs);
        set(p.e(E::XskTxRingEmpty), t.tx_ring_empty_descs);
    }
}

/// One frame: classify, check the source against our own addresses,
/// deliver or count the drop.
#[inline]
fn handle(
    demux: &mut Demux,
    own: &[Ipv4Addr],
    page: &StatsPage,
    reasm: &mut Reassembly,
    f: RxFrame,
    at: u64,
) {
    bump(page.e(E::RxFrames), 1);
    let c = match classify(f.data()) {
        Ok(c) => c,
        Err(DropReason::Malformed(nanowire_wire::Malformed::Fragment)) => {
            return reassemble(demux, own, page, reasm, f, at);
        }
        Err(why) => return bump(page.e(why.counter()), 1),
    };
    if own.contains(c.src.ip()) {
        return bump(page.e(E::DropMartian), 1);
    }
    if c.csum_partial {
        bump(page.e(E::RxCsumPartial), 1);
    }
    let len = c.payload_len as u64;
    match demux.deliver_at(&c, f, at, page) {
        Outcome::Delivered => {
            bump(page.e(E::RxPackets), 1);
            bump(page.e(E::RxBytes), len);
        }
        Outcome::NoEndpoint => bump(page.e(E::DropNoSocket), 1),
        Outcome::QueueFull => bump(page.e(E::DropSocketQueueFull), 1),
    }
}

/// A fragment (the steering program redirects only those of the engine's
/// TCP flows): into the reassembly; a completed datagram goes through
/// `handle` as one more frame.
#[cold]
fn reassemble(
    demux: &mut Demux,
    own: &[Ipv4Addr],
    page: &StatsPage,
    reasm: &mut Reassembly,
    f: RxFrame,
    at: u64,
) {
    let whole = reasm.push(f.data(), super::reasm::mono_ns());
    drop(f); // back to the fill ring: the bytes were copied
    count_frags(page, reasm);
    if let Some(v) = whole {
        handle(demux, own, page, reasm, RxFrame::from_vec(v), at);
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
