//! The capture tap as a device wrapper: each frame taken off the inner
//! device ([`RxTap`]) or put on it ([`TxTap`]) is copied into the engine's
//! tap (crates/tap) for `nanowire capture`; with no capture attached that
//! costs one load and one branch per frame.

use super::{RxDevice, TxDevice};
use nanowire_tap::TapWriter;
use nanowire_xdp::RxFrame;

/// Copies of received frames.
pub struct RxTap<D> {
    pub inner: D,
    tap: TapWriter,
}

impl<D> RxTap<D> {
    pub fn new(inner: D, tap: TapWriter) -> RxTap<D> {
        RxTap { inner, tap }
    }
}

impl<D: RxDevice> super::RxWrap for RxTap<D> {
    #[inline]
    fn receive(&mut self, budget: u32, mut f: impl FnMut(RxFrame, u64)) -> u32 {
        let tap = &mut self.tap;
        self.inner.receive(budget, |fr, at| {
            if tap.on() {
                // A multi-buffer packet is gathered for this only.
                tap.record(fr.data());
            }
            f(fr, at)
        })
    }
}

/// Copies of sent frames.
pub struct TxTap<D> {
    pub inner: D,
    tap: TapWriter,
}

impl<D> TxTap<D> {
    pub fn new(inner: D, tap: TapWriter) -> TxTap<D> {
        TxTap { inner, tap }
    }
}

impl<D: TxDevice> super::TxWrap for TxTap<D> {
    #[inline]
    fn send_with(&mut self, max: usize, fill: impl super::Fill) -> usize {
        let tap = &mut self.tap;
        self.inner
            .send_with(max, super::seen(fill, |&n| n, |fr| tap.record(fr)))
    }
    #[inline]
    fn send_with_csum(&mut self, max: usize, fill: impl super::FillCsum) -> usize {
        let tap = &mut self.tap;
        let seen = super::seen(fill, |&(n, _)| n, |fr| tap.record(fr));
        self.inner.send_with_csum(max, seen)
    }
    fn send_large(&mut self, pkt: &[u8]) -> bool {
        super::send_large_seen(&mut self.inner, pkt, |p| self.tap.record(p))
    }
}

wrapper!(RxTap, TxTap);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdp::device::loopback::loopback;

    #[test]
    fn frames_pass_through_and_an_attached_capture_gets_copies() {
        let (rtap, ttap, path) = nanowire_tap::create(std::process::id(), "nwseam0");
        let (rx, tx) = loopback(64);
        let (mut rx, mut tx) = (RxTap::new(rx, rtap), TxTap::new(tx, ttap));
        // A capture attached where the tap file could be made (not as an
        // unprivileged user without /dev/shm rights): it sees both ways.
        let mut reader = path
            .ok()
            .and_then(|p| nanowire_tap::TapReader::attach(&p).ok());
        assert_eq!(
            tx.send_with(2, |i, fr| {
                fr[..3].copy_from_slice(&[i as u8, 1, 2]);
                Some(3)
            }),
            2
        );
        tx.flush();
        let mut got = Vec::new();
        rx.receive(16, |f, _| got.push(f.data().to_vec()));
        assert_eq!(got, vec![vec![0, 1, 2], vec![1, 1, 2]]);
        if let Some(r) = reader.as_mut() {
            for dir in [nanowire_tap::Dir::Tx, nanowire_tap::Dir::Rx] {
                let mut copies = Vec::new();
                r.drain(dir, 16, |rec| copies.push(rec.data.to_vec()))
                    .unwrap();
                assert_eq!(copies, got, "{dir:?}");
            }
        }
    }
}
