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
//! costing one predictable branch per batch or per frame when off; each
//! implements [`RxWrap`] or [`TxWrap`] and writes only the operations it
//! changes, the rest forward to the inner device):
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

/// The [`Wrap`] impl of wrappers whose inner device is their field
/// `inner` (all of them): `wrapper!(RxTap, TxTap);`.
macro_rules! wrapper {
    ($($t:ident),+) => {$(
        impl<D> super::Wrap for $t<D> {
            type Inner = D;
            #[inline]
            fn inner(&self) -> &D {
                &self.inner
            }
            #[inline]
            fn inner_mut(&mut self) -> &mut D {
                &mut self.inner
            }
        }
    )+};
}

/// A wrapper trait and its blanket impl from one list of operations: each
/// is a default method of `$wrap` that forwards to the inner device (a
/// wrapper overrides what it changes), and every `$wrap` is a `$dev` whose
/// operations are the wrapper's. `forwarding!(@calls T fn ...;)` alone
/// writes trait methods that call `T`'s own (inherent) ones.
macro_rules! forwarding {
    ($(#[$doc:meta])* pub trait $wrap:ident: $dev:ident { $($ops:tt)+ }) => {
        $(#[$doc])*
        pub trait $wrap: Wrap<Inner: $dev> {
            forwarding!(@defaults $($ops)+);
        }

        // The blanket impl (generic: inlined where the engine's types are
        // fixed).
        impl<W: $wrap> $dev for W {
            forwarding!(@calls $wrap $($ops)+);
        }
    };
    (@defaults) => {};
    (@defaults fn $name:ident(&mut self $(, $a:ident: $t:ty)*) $(-> $r:ty)?; $($more:tt)*) => {
        #[inline]
        fn $name(&mut self $(, $a: $t)*) $(-> $r)? {
            self.inner_mut().$name($($a),*)
        }
        forwarding!(@defaults $($more)*);
    };
    (@defaults fn $name:ident(&self $(, $a:ident: $t:ty)*) $(-> $r:ty)?; $($more:tt)*) => {
        #[inline]
        fn $name(&self $(, $a: $t)*) $(-> $r)? {
            self.inner().$name($($a),*)
        }
        forwarding!(@defaults $($more)*);
    };
    (@calls $wrap:ident) => {};
    (@calls $wrap:ident fn $name:ident(&mut self $(, $a:ident: $t:ty)*) $(-> $r:ty)?; $($more:tt)*) => {
        #[inline]
        fn $name(&mut self $(, $a: $t)*) $(-> $r)? {
            $wrap::$name(self $(, $a)*)
        }
        forwarding!(@calls $wrap $($more)*);
    };
    (@calls $wrap:ident fn $name:ident(&self $(, $a:ident: $t:ty)*) $(-> $r:ty)?; $($more:tt)*) => {
        #[inline]
        fn $name(&self $(, $a: $t)*) $(-> $r)? {
            $wrap::$name(self $(, $a)*)
        }
        forwarding!(@calls $wrap $($more)*);
    };
}

pub mod faults;
pub mod loopback;
pub mod stamp;
pub mod tap;
pub mod xsk;

use nanowire_xdp::{CsumRequest, RxFrame};
use std::io;

/// What fills packet `i` of a send into a frame: its length, or `None` to
/// stop ([`TxDevice::send_with`]).
pub trait Fill: FnMut(usize, &mut [u8]) -> Option<usize> {}
impl<F: FnMut(usize, &mut [u8]) -> Option<usize>> Fill for F {}

/// [`Fill`] that may also ask for the transport checksum to be completed
/// ([`TxDevice::send_with_csum`]).
pub trait FillCsum: FnMut(usize, &mut [u8]) -> Option<(usize, Option<CsumRequest>)> {}
impl<F: FnMut(usize, &mut [u8]) -> Option<(usize, Option<CsumRequest>)>> FillCsum for F {}

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
    fn send_with(&mut self, max: usize, fill: impl Fill) -> usize;
    /// Whether [`TxDevice::send_with_csum`]'s checksum requests are
    /// completed by the kernel or the NIC (AF_XDP TX metadata) rather than
    /// in software here.
    fn csum_offload(&self) -> bool {
        false
    }
    /// [`TxDevice::send_with`] where `fill` may also ask for the packet's
    /// transport checksum to be completed on the way out ([`CsumRequest`]:
    /// the field holds the pseudo-header's sum, as a CHECKSUM_PARTIAL
    /// skb's). Every request is honoured: by offload where
    /// [`TxDevice::csum_offload`] says so, else in software before posting
    /// (this default).
    fn send_with_csum(&mut self, max: usize, mut fill: impl FillCsum) -> usize {
        self.send_with(max, |i, fr| checksummed(&mut fill, i, fr))
    }
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
    /// Totals since the device opened: packets the kernel completed
    /// without sending (a kick answered EBUSY), and kicks tried again.
    fn kick_counts(&self) -> KickCounts {
        KickCounts::default()
    }
}

/// [`TxDevice::kick_counts`]: totals of the device's kicks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KickCounts {
    /// Packets the kernel took and completed but did not send.
    pub kernel_dropped: u64,
    /// Kicks tried again after a refusal for now.
    pub retries: u64,
}

/// A device around another (the wrappers): its inner device ([`wrapper!`]
/// writes this for a field `inner`).
pub trait Wrap {
    type Inner;
    fn inner(&self) -> &Self::Inner;
    fn inner_mut(&mut self) -> &mut Self::Inner;
}

forwarding! {
    /// A receive device around another (the wrappers below: smoltcp's phy
    /// middleware habit): it names its inner device and writes only the
    /// operations it changes; every other one forwards to the inner device
    /// (these defaults). Each wrapper is an [`RxDevice`] through the blanket
    /// impl.
    pub trait RxWrap: RxDevice {
        fn receive(&mut self, budget: u32, f: impl FnMut(RxFrame, u64)) -> u32;
        fn refill(&mut self);
        fn refresh_stats(&mut self);
    }
}

forwarding! {
    /// A transmit device around another: as [`RxWrap`], the wrapper writes
    /// only what it changes; the rest forwards to the inner device.
    pub trait TxWrap: TxDevice {
        fn frame_size(&self) -> usize;
        fn send_with(&mut self, max: usize, fill: impl Fill) -> usize;
        fn csum_offload(&self) -> bool;
        fn send_with_csum(&mut self, max: usize, fill: impl FillCsum) -> usize;
        fn send_large(&mut self, pkt: &[u8]) -> bool;
        fn flush(&mut self);
        fn kick_now(&mut self);
        fn take_error(&mut self) -> Option<io::Error>;
        fn kick_counts(&self) -> KickCounts;
    }
}

/// `fill`'s packet with any checksum it asked for completed in software
/// (a device without offload).
#[inline]
pub(crate) fn checksummed(fill: &mut impl FillCsum, i: usize, fr: &mut [u8]) -> Option<usize> {
    let (len, c) = fill(i, fr)?;
    if let Some(c) = c {
        let n = len.min(fr.len());
        nanowire_xdp::xsk::complete_checksum(&mut fr[..n], c);
    }
    Some(len)
}

/// The copying wrappers' transmit ([`tap::TxTap`], [`stamp::TxStamps`]):
/// `fill` that shows each frame it builds (`len` of its answer) to `see`
/// (with offload the frame holds the partial checksum, as a kernel capture
/// of a CHECKSUM_PARTIAL skb does).
#[inline]
pub(crate) fn seen<T>(
    mut fill: impl FnMut(usize, &mut [u8]) -> Option<T>,
    len: impl Fn(&T) -> usize,
    mut see: impl FnMut(&[u8]),
) -> impl FnMut(usize, &mut [u8]) -> Option<T> {
    move |i, fr| {
        let got = fill(i, fr)?;
        see(&fr[..len(&got).min(fr.len())]);
        Some(got)
    }
}

/// [`seen`] for [`TxDevice::send_large`]: `see` gets the packet if sent.
pub(crate) fn send_large_seen(
    inner: &mut impl TxDevice,
    pkt: &[u8],
    see: impl FnOnce(&[u8]),
) -> bool {
    let ok = inner.send_large(pkt);
    if ok {
        see(pkt);
    }
    ok
}

/// The receive device of an xdp engine.
pub(crate) type EngineRx = stamp::RxStamps<faults::RxFaults<tap::RxTap<xsk::XskQueues>>>;
/// The transmit device of an xdp engine.
pub(crate) type EngineTx = stamp::TxStamps<faults::TxFaults<tap::TxTap<nanowire_xdp::XskTx>>>;
