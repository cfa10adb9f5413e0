//! Timestamps as device wrappers (issue 13, docs/capture.md).
//!
//! [`RxStamps`]: while any socket of the engine wants receive stamps
//! (`users` > 0), each frame is stamped with `CLOCK_REALTIME` as it reaches
//! the engine; otherwise one predictable branch per frame.
//! [`TxStamps`]: while a socket with transmit stamping sends, the request
//! ([`TxStamp`]) keeps a copy of the last frame built and the time the
//! kick that handed the frames to the driver returned.

use super::{RxDevice, TxDevice};
use nanowire_xdp::RxFrame;

/// Receive stamps.
pub struct RxStamps<D> {
    pub inner: D,
    /// Sockets that want stamps.
    pub users: u32,
}

impl<D> RxStamps<D> {
    pub fn new(inner: D) -> RxStamps<D> {
        RxStamps { inner, users: 0 }
    }
}

impl<D: RxDevice> super::RxWrap for RxStamps<D> {
    #[inline]
    fn receive(&mut self, budget: u32, mut f: impl FnMut(RxFrame, u64)) -> u32 {
        let on = self.users > 0;
        self.inner.receive(budget, |fr, at| {
            // One predictable branch when no socket wants stamps.
            let at = if on { nanowire_tap::now_ns() } else { at };
            f(fr, at)
        })
    }
}

/// A transmit stamp request (`SOF_TIMESTAMPING_TX_SOFTWARE` in the shim).
#[derive(Debug, Default)]
pub(crate) struct TxStamp {
    /// Keep a copy of the last frame sent (the error queue returns it
    /// unless `SOF_TIMESTAMPING_OPT_TSONLY`).
    pub want_frame: bool,
    /// The last frame sent through the ring (when `want_frame`).
    pub frame: Vec<u8>,
    /// `CLOCK_REALTIME` ns when the kick that handed the frames to the
    /// driver returned; 0: nothing went through the ring.
    pub at: u64,
    /// The `OPT_ID` key of the datagram being sent, for the kernel path
    /// (`SCM_TS_OPT_ID`: the kernel stamps it under the same key).
    pub key: Option<u32>,
}

/// Transmit stamps: set `req` around a send (None: one branch per frame).
pub struct TxStamps<D> {
    pub inner: D,
    pub(crate) req: Option<TxStamp>,
}

impl<D> TxStamps<D> {
    pub fn new(inner: D) -> TxStamps<D> {
        TxStamps { inner, req: None }
    }
}

/// Keep a copy of the frame just built when the request wants it.
#[inline]
fn keep(req: &mut Option<TxStamp>, frame: &[u8]) {
    if let Some(s) = req.as_mut()
        && s.want_frame
    {
        s.frame.clear();
        s.frame.extend_from_slice(frame);
    }
}

impl<D: TxDevice> super::TxWrap for TxStamps<D> {
    #[inline]
    fn send_with(&mut self, max: usize, fill: impl super::Fill) -> usize {
        let req = &mut self.req;
        self.inner
            .send_with(max, super::seen(fill, |&n| n, |fr| keep(req, fr)))
    }
    #[inline]
    fn send_with_csum(&mut self, max: usize, fill: impl super::FillCsum) -> usize {
        let req = &mut self.req;
        let seen = super::seen(fill, |&(n, _)| n, |fr| keep(req, fr));
        self.inner.send_with_csum(max, seen)
    }
    fn send_large(&mut self, pkt: &[u8]) -> bool {
        super::send_large_seen(&mut self.inner, pkt, |p| keep(&mut self.req, p))
    }
    #[inline]
    fn flush(&mut self) {
        self.inner.flush();
        if let Some(s) = self.req.as_mut() {
            // The kick has returned: in copy mode the kernel has passed the
            // frames through the driver's transmit (where it stamps its own
            // sockets' frames); in zero-copy mode they are posted.
            s.at = nanowire_tap::now_ns();
        }
    }
}

wrapper!(RxStamps, TxStamps);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdp::device::loopback::loopback;
    use crate::xdp::rx::RX_BUDGET;
    use crate::xdp::testkit::*;
    use crate::xdp::tx::{TxPath, Wire};

    #[test]
    fn receive_stamps_only_while_someone_wants_them() {
        let (mut rx, id) = rx_with_udp(RxStamps::new(loop_rx()), 1024, 7);
        rx.dev.inner.inject(udp(sa(PEER, 9), sa(OURS, 7), b"a"));
        rx.poll(RX_BUDGET);
        assert_eq!(rx.pop_or_poll(id).unwrap().stamp, 0);
        rx.dev.users = 1;
        let before = nanowire_tap::now_ns();
        rx.dev.inner.inject(udp(sa(PEER, 9), sa(OURS, 7), b"b"));
        rx.poll(RX_BUDGET);
        let at = rx.pop_or_poll(id).unwrap().stamp;
        assert!(at >= before && at <= nanowire_tap::now_ns());
    }

    #[test]
    fn a_transmit_request_gets_the_frame_and_the_time_of_the_kick() {
        let (_, dev) = loopback(2048);
        let mut t = TxPath::new(TxStamps::new(dev), OUR_MAC, 32, page());
        let w = Wire {
            src: sa(OURS, 7),
            dst: sa(PEER, 9),
            mac: PEER_MAC,
        };
        // No request: nothing kept.
        t.send(&[b"plain"], w, 0).unwrap();
        assert!(t.dev.req.is_none());
        t.dev.req = Some(TxStamp {
            want_frame: true,
            ..TxStamp::default()
        });
        let before = nanowire_tap::now_ns();
        t.send(&[b"stamped"], w, 0).unwrap();
        let s = t.dev.req.take().unwrap();
        assert!(s.at >= before);
        assert_eq!(s.frame, t.dev.inner.drain().pop().unwrap());
        assert!(s.frame.ends_with(b"stamped"));
    }
}
