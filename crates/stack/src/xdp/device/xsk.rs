//! The AF_XDP device: the fill/RX rings of every queue ([`XskQueues`]) and
//! the TX/completion rings with their frame pool (`nanowire_xdp::XskTx`).
//!
//! Counters only the rings know are counted here, on the engine's stats
//! page, under the RX lock (their single writer): descriptors that were
//! not ours (`drop_bad_desc`) and chains dropped whole (`drop_rx_chain`),
//! each also one `rx_frames`; packets gathered from several buffers
//! (`rx_multi_buffer`); the RX ring's high-water mark; the kernel's
//! XDP_STATISTICS.

use super::{RxDevice, TxDevice};
use crate::xdp::shm::{E, StatsPage, bump, peak, set};
use nanowire_xdp::{RxFrame, XskRx, XskStats, XskTx};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Descriptors per ring visit (between two refills of the fill ring).
pub(crate) const RX_BATCH: u32 = 64;
/// Polls between two XDP_STATISTICS refreshes (a syscall per queue).
const KERNEL_STATS_EVERY_MASK: u32 = (1 << 22) - 1;
/// Idle polls (nothing on the rings) between two refreshes.
const IDLE_STATS_EVERY_MASK: u32 = (1 << 16) - 1;

/// The receive halves of the engine's AF_XDP sockets, one per queue.
pub(crate) struct XskQueues {
    queues: Vec<XskRx>,
    page: Arc<StatsPage>,
    polls: u32,
    bad_descs: u64,
    chain_drops: u64,
    /// (interface, frame size, multi-buffer) for the one warning about
    /// frames the kernel dropped (without multi-buffer: frames it could not
    /// fit in a frame); `None` once warned.
    oversize_warn: Option<(String, usize, bool)>,
    /// Asked once at the first multi-buffer packet (`Frags::Lazy`).
    frags_wanted: Option<Arc<FragsWanted>>,
}

/// The receive side's half of `nanowire_xdp::Frags::Lazy`: the engine
/// attached `nw_steer` in generic mode, and the first packet that arrives
/// as a chain of buffers (a kernel peer's TSO/GSO super-frame, linearised
/// by generic XDP and split by the XDP_USE_SG socket) asks the neighbour
/// thread, once, to put the multi-buffer aware program in its place
/// (mod.rs, `Engine::assemble`): a ring visit never loads a program.
/// The device knows nothing of that thread: `wake` is how it is asked.
pub(crate) struct FragsWanted {
    asked: AtomicBool,
    wake: Box<dyn Fn() + Send + Sync>,
}

impl FragsWanted {
    pub fn new(wake: impl Fn() + Send + Sync + 'static) -> FragsWanted {
        FragsWanted {
            asked: AtomicBool::new(false),
            wake: Box::new(wake),
        }
    }

    #[cold]
    fn ask(&self) {
        if !self.asked.swap(true, Ordering::AcqRel) {
            (self.wake)();
        }
    }

    /// Whether a multi-buffer packet asked for the upgrade.
    pub fn asked(&self) -> bool {
        self.asked.load(Ordering::Acquire)
    }
}

impl XskQueues {
    /// Rings made by anyone (this process's `XskSocket::split`, or handed
    /// over by an engine service).
    pub fn new(queues: Vec<XskRx>, page: Arc<StatsPage>) -> XskQueues {
        XskQueues {
            queues,
            page,
            polls: 0,
            bad_descs: 0,
            chain_drops: 0,
            oversize_warn: None,
            frags_wanted: None,
        }
    }

    /// Warn (once) when the kernel drops frames for this engine's sockets
    /// that it could not place (`xsk_rx_dropped`). Without multi-buffer
    /// (`mb` false) these are frames larger than `frame` bytes, such as a
    /// veth peer's TSO/GSO super-frames in generic XDP mode.
    pub fn set_oversize_hint(&mut self, iface: &str, frame: usize, mb: bool) {
        self.oversize_warn = Some((iface.to_string(), frame, mb));
    }

    /// Ask `w` at the first multi-buffer packet (see [`FragsWanted`]).
    pub fn set_frags_wanted(&mut self, w: Arc<FragsWanted>) {
        self.frags_wanted = Some(w);
    }

    /// Count what the rings dropped since the last call (each one frame).
    #[cold]
    fn count_ring_drops(&mut self) {
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
    }
}

impl RxDevice for XskQueues {
    #[inline]
    fn receive(&mut self, budget: u32, mut f: impl FnMut(RxFrame, u64)) -> u32 {
        self.polls = self.polls.wrapping_add(1);
        if self.polls & KERNEL_STATS_EVERY_MASK == 0 {
            self.refresh_stats();
        }
        let mut total = 0;
        let page = &self.page;
        let wanted = self.frags_wanted.as_deref();
        for q in self.queues.iter_mut() {
            if total >= budget {
                break;
            }
            let info = q.poll(budget - total, RX_BATCH, |fr| {
                if fr.is_multi_buffer() {
                    bump(page.e(E::RxMultiBuffer), 1);
                    if let Some(w) = wanted {
                        w.ask();
                    }
                }
                f(fr, 0)
            });
            if info.descs > 0 {
                peak(page.e(E::PeakRxRing), u64::from(info.ring_peak));
            }
            total += info.descs;
        }
        if total == 0 {
            // Idle: refresh the kernel's counters now and then as well, so
            // that drops the kernel made (a frame too big for ours, which
            // never reaches the ring) are counted and warned about even
            // when nothing else arrives.
            if self.polls & IDLE_STATS_EVERY_MASK == 0 {
                self.refresh_stats();
            }
            return 0;
        }
        let bad = self.queues.iter().map(|q| q.bad_descs() + q.chain_drops());
        if bad.sum::<u64>() != self.bad_descs + self.chain_drops {
            self.count_ring_drops();
        }
        total
    }

    fn refill(&mut self) {
        for q in &mut self.queues {
            q.refill();
        }
    }

    fn refresh_stats(&mut self) {
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

impl TxDevice for XskTx {
    forwarding!(@calls XskTx
        fn frame_size(&self) -> usize;
        fn send_with(&mut self, max: usize, fill: impl super::Fill) -> usize;
        fn csum_offload(&self) -> bool;
        fn send_with_csum(&mut self, max: usize, fill: impl super::FillCsum) -> usize;
        fn send_large(&mut self, pkt: &[u8]) -> bool;
    );
    #[inline]
    fn flush(&mut self) {
        // A kick the kernel could not finish (EAGAIN/ENOBUFS) leaves frames
        // in the ring: kick once more rather than strand them until the
        // next send.
        if self.occupancy() > 0 {
            self.kick();
        }
        self.reap();
    }
    fn kick_now(&mut self) {
        self.kick();
        self.reap();
    }
    #[inline]
    fn take_error(&mut self) -> Option<io::Error> {
        self.kick_error()
    }
    #[inline]
    fn kick_counts(&self) -> super::KickCounts {
        super::KickCounts {
            kernel_dropped: self.kernel_dropped(),
            retries: self.kick_retries(),
        }
    }
}
