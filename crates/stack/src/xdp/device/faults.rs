//! The engine's seeded fault injector (the `faults` option,
//! docs/robustness.md) as device wrappers, below every protocol.
//!
//! [`RxFaults`]: every frame off the inner device is copied into the
//! injector (its frame goes straight back to the device); what comes out
//! when due (dropped, duplicated, held back, corrupted) reaches the engine
//! like any frame, so `rx_frames = rx_packets + drops` still holds (an
//! injected loss counts as `drop_fault_rx`, an injected duplicate as one
//! more frame). [`TxFaults`]: frames are built in memory, run through the
//! injector and what survives is posted; a frame the injector drops counts
//! as sent (it was lost on the wire). Loss, duplication and corruption act
//! on both paths; delay, jitter and reordering on receive only. Off
//! (`None`): one branch per batch.

use super::{RxDevice, TxDevice};
use crate::xdp::shm::{E, StatsPage, bump};
use nanowire_tcp::fault::{FaultConfig, FaultInjector, FaultStats};
use nanowire_xdp::RxFrame;
use std::sync::Arc;

struct RxInjector {
    inj: FaultInjector,
    epoch: std::time::Instant,
    seen: FaultStats,
}

/// Receive-side faults.
pub struct RxFaults<D> {
    pub inner: D,
    on: Option<RxInjector>,
    page: Arc<StatsPage>,
}

impl<D> RxFaults<D> {
    /// `cfg` None: off.
    pub fn new(inner: D, cfg: Option<FaultConfig>, page: Arc<StatsPage>) -> RxFaults<D> {
        RxFaults {
            inner,
            on: cfg.map(|c| RxInjector {
                inj: FaultInjector::new(c),
                epoch: std::time::Instant::now(),
                seen: FaultStats::default(),
            }),
            page,
        }
    }
}

impl RxInjector {
    /// Count what the injector did since the last call.
    fn account(&mut self, page: &StatsPage) {
        let n = self.inj.stats.since(&mut self.seen);
        if n.dropped > 0 {
            bump(page.e(E::RxFrames), n.dropped);
            bump(page.e(E::DropFaultRx), n.dropped);
        }
        bump(page.e(E::FaultRxDuplicated), n.duplicated);
        bump(page.e(E::FaultRxReordered), n.reordered);
        bump(page.e(E::FaultRxCorrupted), n.corrupted);
    }
}

impl<D: RxDevice> super::RxWrap for RxFaults<D> {
    #[inline]
    fn receive(&mut self, budget: u32, mut f: impl FnMut(RxFrame, u64)) -> u32 {
        let Some(x) = self.on.as_mut() else {
            return self.inner.receive(budget, f);
        };
        let now = x.epoch.elapsed().as_nanos() as u64;
        let taken = self
            .inner
            .receive(budget, |fr, _| x.inj.push(now, fr.data()));
        let mut released = 0;
        while let Some(p) = x.inj.pop(now) {
            f(RxFrame::from_vec(p), 0);
            released += 1;
        }
        x.account(&self.page);
        if taken == 0 { released } else { taken }
    }
}

struct TxInjector {
    inj: FaultInjector,
    seen: FaultStats,
    scratch: Vec<u8>,
    out: Vec<Vec<u8>>,
}

impl TxInjector {
    fn account(&mut self, page: &StatsPage) {
        let n = self.inj.stats.since(&mut self.seen);
        bump(page.e(E::FaultTxLost), n.dropped);
        bump(page.e(E::FaultTxDuplicated), n.duplicated);
        bump(page.e(E::FaultTxCorrupted), n.corrupted);
    }
}

/// Transmit-side faults.
pub struct TxFaults<D> {
    pub inner: D,
    on: Option<TxInjector>,
    page: Arc<StatsPage>,
}

impl<D> TxFaults<D> {
    /// `cfg` None: off.
    pub fn new(inner: D, cfg: Option<FaultConfig>, page: Arc<StatsPage>) -> TxFaults<D> {
        TxFaults {
            inner,
            on: cfg.map(|c| TxInjector {
                inj: FaultInjector::new(c),
                seen: FaultStats::default(),
                scratch: Vec::new(),
                out: Vec::new(),
            }),
            page,
        }
    }
}

impl<D: TxDevice> super::TxWrap for TxFaults<D> {
    #[inline]
    fn send_with(&mut self, max: usize, mut fill: impl super::Fill) -> usize {
        let Some(x) = self.on.as_mut() else {
            return self.inner.send_with(max, fill);
        };
        let fs = self.inner.frame_size();
        x.scratch.resize(fs, 0);
        x.out.clear();
        let mut n = 0;
        while n < max {
            match fill(n, &mut x.scratch) {
                Some(len) if len <= fs => {
                    x.inj.push(0, &x.scratch[..len]);
                    while let Some(p) = x.inj.pop(0) {
                        x.out.push(p);
                    }
                    n += 1;
                }
                _ => break,
            }
        }
        x.account(&self.page);
        let out = &x.out;
        let posted = self.inner.send_with(out.len(), |i, fr| {
            let f = &out[i];
            fr.get_mut(..f.len())?.copy_from_slice(f);
            Some(f.len())
        });
        if posted < out.len() {
            // The ring stayed full: lost like frames on the wire, counted.
            bump(self.page.e(E::DropTxRingFull), (out.len() - posted) as u64);
        }
        n
    }
    #[inline]
    fn csum_offload(&self) -> bool {
        // The injector copies frames: checksums are completed before it.
        self.on.is_none() && self.inner.csum_offload()
    }
    #[inline]
    fn send_with_csum(&mut self, max: usize, mut fill: impl super::FillCsum) -> usize {
        if self.on.is_none() {
            return self.inner.send_with_csum(max, fill);
        }
        super::TxWrap::send_with(self, max, |i, fr| super::checksummed(&mut fill, i, fr))
    }
    // send_large is the inner device's: faults act on datagrams of one
    // frame; a jumbo (multi-buffer) packet takes the plain path.
}

wrapper!(RxFaults, TxFaults);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdp::device::loopback::{LoopTx, loopback};
    use crate::xdp::rx::{RX_BUDGET, RxPath};
    use crate::xdp::testkit::*;
    use crate::xdp::tx::{TxPath, Wire};

    fn cfg(s: &str) -> Option<FaultConfig> {
        Some(FaultConfig::parse(s).unwrap())
    }

    fn faulty_rx(
        s: &str,
    ) -> (
        RxPath<RxFaults<crate::xdp::device::loopback::LoopRx>>,
        usize,
    ) {
        let p = page();
        let (mut rx, id) = rx_with_udp(RxFaults::new(loop_rx(), cfg(s), p.clone()), 1024, 7);
        rx.page = p;
        (rx, id)
    }

    /// A receive path with the injector of `s`, after one poll of `n`
    /// datagrams `payload` sent to it.
    fn faulty_rx_after(
        s: &str,
        n: usize,
        payload: &[u8],
    ) -> (
        RxPath<RxFaults<crate::xdp::device::loopback::LoopRx>>,
        usize,
    ) {
        let (mut rx, id) = faulty_rx(s);
        for _ in 0..n {
            rx.dev.inner.inject(udp(sa(PEER, 9), sa(OURS, 7), payload));
        }
        rx.poll(RX_BUDGET);
        (rx, id)
    }

    /// Each counter has its value, and the page's frame identity holds.
    #[track_caller]
    fn assert_counts(page: &StatsPage, want: &[(E, u64)]) {
        for &(e, v) in want {
            assert_eq!(get(page, e), v, "{e:?}");
        }
        assert!(identity_holds(page));
    }

    #[test]
    fn receive_loss_is_counted_as_frames_and_drops() {
        let (mut rx, id) = faulty_rx_after("loss=1,seed=3", 10, b"lost");
        assert!(rx.pop_or_poll(id).is_none());
        assert_counts(&rx.page, &[(E::DropFaultRx, 10), (E::RxFrames, 10)]);
    }

    #[test]
    fn receive_duplicates_are_one_more_frame_each() {
        let (mut rx, id) = faulty_rx_after("dup=1,seed=3", 1, b"twice");
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), b"twice");
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), b"twice");
        assert_counts(&rx.page, &[(E::FaultRxDuplicated, 1), (E::RxFrames, 2)]);
    }

    #[test]
    fn receive_delay_holds_frames_until_due() {
        let (mut rx, id) = faulty_rx_after("delay_us=20000,seed=3", 1, b"later");
        assert!(rx.demux.get(id).unwrap().queue.is_empty(), "held back");
        std::thread::sleep(std::time::Duration::from_millis(30));
        rx.poll(RX_BUDGET);
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), b"later");
    }

    #[test]
    fn off_is_the_inner_device() {
        let p = page();
        let (mut rx, id) = rx_with_udp(RxFaults::new(loop_rx(), None, p), 1024, 7);
        rx.dev.inner.inject(udp(sa(PEER, 9), sa(OURS, 7), b"plain"));
        assert_eq!(rx.poll(RX_BUDGET), 1);
        assert_eq!(rx.pop_or_poll(id).unwrap().payload(), b"plain");
    }

    fn faulty_tx(s: &str) -> TxPath<TxFaults<LoopTx>> {
        let p = page();
        let (_, dev) = loopback(2048);
        TxPath::new(TxFaults::new(dev, cfg(s), p.clone()), OUR_MAC, 32, p)
    }

    fn w() -> Wire {
        Wire {
            src: sa(OURS, 7),
            dst: sa(PEER, 9),
            mac: PEER_MAC,
        }
    }

    #[test]
    fn transmit_loss_counts_as_sent_and_puts_nothing_on_the_wire() {
        let mut t = faulty_tx("loss=1,seed=5");
        assert_eq!(t.send(&[b"a", b"b", b"c"], w(), 0).unwrap().n, 3);
        assert_eq!(t.dev.inner.sent, 0);
        assert_eq!(get(&t.page, E::FaultTxLost), 3);
        assert_eq!(get(&t.page, E::TxPackets), 3);
    }

    #[test]
    fn transmit_duplication_and_corruption_reach_the_wire() {
        let mut t = faulty_tx("dup=1,seed=5");
        t.send(&[b"a"], w(), 0).unwrap();
        assert_eq!(t.dev.inner.drain().len(), 2);
        assert_eq!(get(&t.page, E::FaultTxDuplicated), 1);
        let mut t = faulty_tx("corrupt=1,seed=5");
        t.send(&[b"abcdefgh"], w(), 0).unwrap();
        let f = t.dev.inner.drain();
        assert_eq!(f.len(), 1);
        assert_eq!(get(&t.page, E::FaultTxCorrupted), 1);
    }

    #[test]
    fn a_full_ring_under_faults_is_a_counted_drop() {
        let mut t = faulty_tx("dup=1,seed=5");
        t.dev.inner.capacity = 3;
        t.send(&[b"a", b"b"], w(), 0).unwrap();
        assert_eq!(t.dev.inner.sent, 3);
        assert_eq!(get(&t.page, E::DropTxRingFull), 1);
    }
}
