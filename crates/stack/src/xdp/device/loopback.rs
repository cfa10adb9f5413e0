//! An in-memory device: frames sent on a [`LoopTx`] are received on the
//! [`LoopRx`] sharing its queue. With [`pair`] one end's transmit is the
//! other end's receive (two hosts on one wire); with [`loopback`] a device
//! receives what it sent. Tests drive the engine's receive and transmit
//! paths, the demux and the TCP driver over it without root or rings.

use super::{RxDevice, TxDevice};
use nanowire_xdp::RxFrame;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Frames in flight on a loopback wire.
pub type Wire = Arc<Mutex<VecDeque<Vec<u8>>>>;

/// The receiving end of a loopback wire.
pub struct LoopRx {
    wire: Wire,
    /// Packets received so far.
    pub received: u64,
}

/// The sending end of a loopback wire.
pub struct LoopTx {
    wire: Wire,
    frame: usize,
    /// Frames the wire holds at most (a full "ring" refuses more).
    pub capacity: usize,
    /// Packets sent so far, and flushes (kicks) asked for.
    pub sent: u64,
    pub flushes: u64,
    /// Every frame sent, when `keep` (tests look at the bytes).
    pub keep: bool,
    pub log: Vec<Vec<u8>>,
    /// Offer checksum offload: checksum requests are left to "the wire"
    /// (frames arrive with the partial checksum, as over veth).
    pub offload: bool,
    /// What [`TxDevice::kick_counts`] answers (a test sets the kernel's
    /// drops and refusals a real device's kicks would meet).
    pub kicks: super::KickCounts,
}

/// A device that receives what it sends, with `frame`-byte frames.
pub fn loopback(frame: usize) -> (LoopRx, LoopTx) {
    let w = Wire::default();
    (LoopRx::new(w.clone()), LoopTx::new(w, frame))
}

/// Two devices on one wire: what `a` sends, `b` receives and vice versa.
/// Returns ((a's rx, a's tx), (b's rx, b's tx)).
pub fn pair(frame: usize) -> ((LoopRx, LoopTx), (LoopRx, LoopTx)) {
    let ab = Wire::default();
    let ba = Wire::default();
    (
        (LoopRx::new(ba.clone()), LoopTx::new(ab.clone(), frame)),
        (LoopRx::new(ab), LoopTx::new(ba, frame)),
    )
}

impl LoopRx {
    pub fn new(wire: Wire) -> LoopRx {
        LoopRx { wire, received: 0 }
    }
    /// Put a frame on the wire as if a peer sent it.
    pub fn inject(&self, frame: Vec<u8>) {
        lock(&self.wire).push_back(frame);
    }
    /// Frames waiting.
    pub fn waiting(&self) -> usize {
        lock(&self.wire).len()
    }
}

impl LoopTx {
    pub fn new(wire: Wire, frame: usize) -> LoopTx {
        LoopTx {
            wire,
            frame,
            capacity: usize::MAX,
            sent: 0,
            flushes: 0,
            keep: false,
            log: Vec::new(),
            offload: false,
            kicks: super::KickCounts::default(),
        }
    }
    /// Take the frames sent and not yet received (a test's peer reads them).
    pub fn drain(&self) -> Vec<Vec<u8>> {
        lock(&self.wire).drain(..).collect()
    }
}

fn lock(w: &Wire) -> std::sync::MutexGuard<'_, VecDeque<Vec<u8>>> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

impl RxDevice for LoopRx {
    fn receive(&mut self, budget: u32, mut f: impl FnMut(RxFrame, u64)) -> u32 {
        let mut n = 0;
        while n < budget {
            // The wire's lock is not held while `f` runs (it may send).
            let Some(fr) = lock(&self.wire).pop_front() else {
                break;
            };
            f(RxFrame::from_vec(fr), 0);
            n += 1;
        }
        self.received += u64::from(n);
        n
    }
}

impl TxDevice for LoopTx {
    fn frame_size(&self) -> usize {
        self.frame
    }
    fn send_with(&mut self, max: usize, mut fill: impl super::Fill) -> usize {
        let mut buf = vec![0u8; self.frame];
        let mut n = 0;
        while n < max {
            if lock(&self.wire).len() >= self.capacity {
                break;
            }
            match fill(n, &mut buf) {
                Some(len) if len <= self.frame => {
                    let f = buf[..len].to_vec();
                    if self.keep {
                        self.log.push(f.clone());
                    }
                    lock(&self.wire).push_back(f);
                    n += 1;
                }
                _ => break,
            }
        }
        self.sent += n as u64;
        n
    }
    fn csum_offload(&self) -> bool {
        self.offload
    }
    fn kick_counts(&self) -> super::KickCounts {
        self.kicks
    }
    fn send_with_csum(&mut self, max: usize, mut fill: impl super::FillCsum) -> usize {
        if self.offload {
            return self.send_with(max, |i, fr| fill(i, fr).map(|(len, _)| len));
        }
        self.send_with(max, |i, fr| super::checksummed(&mut fill, i, fr))
    }
    fn send_large(&mut self, pkt: &[u8]) -> bool {
        if lock(&self.wire).len() >= self.capacity {
            return false;
        }
        if self.keep {
            self.log.push(pkt.to_vec());
        }
        lock(&self.wire).push_back(pkt.to_vec());
        self.sent += 1;
        true
    }
    fn flush(&mut self) {
        self.flushes += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nanowire_xdp::CsumRequest;
    use std::net::Ipv4Addr;

    fn recv_all(rx: &mut LoopRx) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        rx.receive(u32::MAX, |f, at| {
            assert_eq!(at, 0);
            v.push(f.data().to_vec())
        });
        v
    }

    #[test]
    fn a_loopback_receives_what_it_sent_in_order() {
        let (mut rx, mut tx) = loopback(64);
        let n = tx.send_with(3, |i, fr| {
            fr[..2].copy_from_slice(&[i as u8, 9]);
            Some(2)
        });
        assert_eq!(n, 3);
        assert!(tx.send_large(&[7; 100]), "longer than a frame");
        assert_eq!(
            recv_all(&mut rx),
            vec![vec![0, 9], vec![1, 9], vec![2, 9], vec![7; 100]]
        );
        assert_eq!(rx.received, 4);
    }

    #[test]
    fn a_pair_crosses_and_a_full_wire_refuses() {
        let ((mut arx, mut atx), (mut brx, mut btx)) = pair(64);
        atx.capacity = 2;
        let n = atx.send_with(5, |_, fr| {
            fr[0] = 1;
            Some(1)
        });
        assert_eq!(n, 2, "the wire holds two");
        assert!(!atx.send_large(&[1; 10]));
        btx.send_with(1, |_, fr| {
            fr[0] = 2;
            Some(1)
        });
        assert_eq!(recv_all(&mut brx), vec![vec![1], vec![1]]);
        assert_eq!(recv_all(&mut arx), vec![vec![2]]);
    }

    #[test]
    fn fill_stops_a_batch_and_oversized_frames_are_refused() {
        let (mut rx, mut tx) = loopback(16);
        assert_eq!(tx.send_with(4, |i, _| (i < 2).then_some(1)), 2);
        assert_eq!(tx.send_with(4, |_, _| Some(17)), 0);
        assert_eq!(recv_all(&mut rx).len(), 2);
    }

    #[test]
    fn a_device_without_offload_completes_requested_checksums_in_software() {
        use nanowire_wire::tcp::{Flags, TcpRepr, TcpSegment};
        let (src, dst) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let (mut rx, mut tx) = loopback(2048);
        assert!(!tx.csum_offload());
        let r = TcpRepr {
            src_port: 1,
            dst_port: 2,
            flags: Flags(Flags::ACK),
            ..TcpRepr::default()
        };
        let n = tx.send_with_csum(2, |i, fr| {
            // A TCP segment at offset 10 with its partial checksum only
            // (the first), or a full one and no request (the second).
            fr[10 + 20..10 + 25].copy_from_slice(b"hello");
            let len = if i == 0 {
                r.emit_partial(&mut fr[10..], 5, src, dst)
            } else {
                r.emit(&mut fr[10..], 5, src, dst)
            };
            let req = CsumRequest {
                start: 10,
                offset: nanowire_wire::tcp::CHECKSUM_OFFSET,
            };
            Some((10 + len, (i == 0).then_some(req)))
        });
        assert_eq!(n, 2);
        let got = recv_all(&mut rx);
        assert_eq!(got[0], got[1], "completed like a full checksum");
        let seg = TcpSegment::new_checked(&got[0][10..]).unwrap();
        assert_eq!(
            seg.checksum_state(src, dst),
            nanowire_wire::udp::ChecksumState::Valid
        );
    }
}
