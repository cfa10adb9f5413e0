//! The device seam (smoltcp's `phy`): what the engine's data path needs
//! from whatever moves frames.
//!
//! [`RxDevice`] hands received packets over as owned [`RxFrame`]s;
//! [`TxDevice`] lends frames to fill and posts them. The receive path
//! (`rx.rs`: classify, reassemble, demux) and the transmit path (`tx.rs`:
//! headers, batching) are generic over them, so a frame costs no dynamic
//! call: the engine's types are fixed at compile time ([`EngineRx`],
//! [`EngineTx`]), and the same code runs in unit tests over the in-memory
//! [`loopback`] device without root.
//!
//! Implementations:
//! * [`xsk`]: the AF_XDP rings (`XskQueues`: the fill/RX rings of every
//!   queue; `nanowire_xdp::XskTx`: the TX/completion rings and pool). Both
//!   take rings made elsewhere, so an engine service can hand a process
//!   rings it did not create.
//! * [`loopback`]: in-memory queues (tests; a frame sent on one end is
//!   received on the other).
//!
//! Wrappers (each a device around a device, each in its own file, each
//! costing one predictable branch per batch or per frame when off):
//! * [`tap::RxTap`], [`tap::TxTap`]: copies for `nanowire capture`;
//! * [`faults::RxFaults`], [`faults::TxFaults`]: the seeded fault injector
//!   of the `faults` option;
//! * [`stamp::RxStamps`], [`stamp::TxStamps`]: receive and transmit
//!   timestamps.
//!
//! The receive chain, outermost first, is stamp → faults → tap → rings: the
//! tap sees what came off the ring, the injector acts before the engine
//! sees a frame, and a stamp is taken when the frame reaches the engine
//! (for an injected delay: when the injector releases it). Transmit is the
//! mirror: stamp (copy of the frame built) → faults → tap (what went on the
//! ring) → rings.

pub mod faults;
pub mod loopback;
pub mod stamp;
pub mod tap;
pub mod xsk;

use nanowire_xdp::RxFrame;
use std::io;

/// Receives packets.
pub trait RxDevice {
    /// Take at most `budget` descriptors' worth of packets; each whole
    /// packet goes to `f` with its receive stamp (`CLOCK_REALTIME` ns; 0:
    /// none asked for). Returns descriptors taken (0: nothing there).
    fn receive(&mut self, budget: u32, f: impl FnMut(RxFrame, u64)) -> u32;
    /// Give frames whose last owner dropped them back to the device (the
    /// fill ring), outside a receive.
    fn refill(&mut self) {}
    /// Refresh the counters the device keeps on the stats page (the
    /// kernel's statistics: a syscall per queue; off the frame path).
    fn refresh_stats(&mut self) {}
}

/// Transmits packets.
pub trait TxDevice {
    /// Bytes one frame holds.
    fn frame_size(&self) -> usize;
    /// Send up to `max` packets: for packet `i`, `fill(i, frame)` writes it
    /// into a frame and returns its length, or `None` to stop (nothing is
    /// sent for that frame). Returns packets taken (fewer when the ring or
    /// pool ran out; `fill` is then not called again).
    fn send_with(
        &mut self,
        max: usize,
        fill: impl FnMut(usize, &mut [u8]) -> Option<usize>,
    ) -> usize;
    /// Send one packet longer than a frame in several descriptors; `false`
    /// when the device cannot (no multi-buffer, no room).
    fn send_large(&mut self, pkt: &[u8]) -> bool;
    /// After a batch: have the kernel take what waits in the ring (kick
    /// only when needed) and reclaim completed frames.
    fn flush(&mut self);
    /// The ring stayed full: kick and reclaim regardless.
    fn kick_now(&mut self) {
        self.flush();
    }
    /// An error that will not go away by retrying (the interface went
    /// down), once.
    fn take_error(&mut self) -> Option<io::Error> {
        None
    }
}

/// The receive device of an xdp engine.
pub(crate) type EngineRx = stamp::RxStamps<faults::RxFaults<tap::RxTap<xsk::XskQueues>>>;
/// The transmit device of an xdp engine.
pub(crate) type EngineTx = stamp::TxStamps<faults::TxFaults<tap::TxTap<nanowire_xdp::XskTx>>>;
