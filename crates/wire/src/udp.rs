//! UDP datagrams.
//!
//! `UdpDatagram::new_checked` validates the length field against the buffer
//! (the IP payload); after it succeeds no accessor panics and `payload()` is
//! exactly the datagram's data.

use crate::checksum;
use crate::ipv4::PROTO_UDP;
use crate::{Malformed, Result};
use std::net::Ipv4Addr;

pub const HEADER_LEN: usize = 8;
/// Largest UDP payload over IPv4 (65535 - 20 - 8).
pub const MAX_PAYLOAD: usize = 65507;

view!(UdpDatagram, fixed: HEADER_LEN);

/// What the receive path concluded about the checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumState {
    /// Sender sent zero (no checksum, legal over IPv4).
    Absent,
    /// Verified correct.
    Valid,
    /// Only the pseudo-header sum is present (partial checksum from a peer
    /// with TX offload, e.g. a kernel socket over veth): cannot be verified.
    Partial,
    /// Genuinely wrong.
    Bad,
}

impl ChecksumState {
    /// The state of a transport checksum whose field holds `stored`, given
    /// the pseudo-header sum `pseudo` and `sum`, the pass that adds the
    /// whole segment to it. A partial checksum (the field holds the folded
    /// pseudo-header sum, or its complement) is recognised first, without
    /// the pass: the verdict would be the same after it (a partial checksum
    /// is accepted, unverifiable), and a peer with TX offload, such as
    /// another engine or a kernel socket over veth, sends nothing else, so
    /// summing first cost a full pass over every such segment (a third of
    /// an accelerated bulk receiver's instructions). A full checksum that
    /// happens to equal the pseudo-header sum is taken as partial: accepted
    /// either way.
    #[inline]
    pub fn of(pseudo: u32, stored: u16, sum: impl FnOnce() -> u32) -> ChecksumState {
        let partial = checksum::fold(pseudo);
        if stored == partial || stored == !partial {
            ChecksumState::Partial
        } else if checksum::fold(sum()) == 0xffff {
            ChecksumState::Valid
        } else {
            ChecksumState::Bad
        }
    }
}

impl<T: AsRef<[u8]>> UdpDatagram<T> {
    /// `buffer` is the IP payload. The UDP length must be at least 8 and at
    /// most the IP payload length.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = Self::fixed(&buffer)?;
        let len = usize::from(u16::from_be_bytes([b[4], b[5]]));
        if len < HEADER_LEN || len > b.len() {
            return Err(Malformed::BadUdpLength);
        }
        Ok(UdpDatagram { buffer })
    }

    be_fields! {
        src_port: u16 = 0;
        dst_port: u16 = 2;
        len: u16 = 4;
        checksum: u16 = 6;
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() as usize == HEADER_LEN
    }
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }

    /// Classify the checksum. A partial checksum (the folded pseudo-header
    /// sum, as written by a sender with TX checksum offload) is reported as
    /// `Partial` rather than `Bad`, recognised before any pass over the data.
    #[inline]
    pub fn checksum_state(&self, src: Ipv4Addr, dst: Ipv4Addr) -> ChecksumState {
        let stored = self.checksum();
        if stored == 0 {
            return ChecksumState::Absent;
        }
        let data = &self.buffer.as_ref()[..usize::from(self.len())];
        let pseudo = checksum::pseudo_header(src, dst, PROTO_UDP, self.len());
        ChecksumState::of(pseudo, stored, || checksum::accumulate(pseudo, data))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpDatagram<T> {
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let l = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..l]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
}

impl UdpRepr {
    /// Write the 8-byte header for a payload already in `buf[8..8+payload_len]`
    /// and fill in the full checksum. Panics if `buf` is too short (caller bug).
    pub fn emit(&self, buf: &mut [u8], payload_len: usize, src: Ipv4Addr, dst: Ipv4Addr) {
        let len = self.header(buf, payload_len);
        let d = &mut buf[..usize::from(len)];
        d[6] = 0;
        d[7] = 0;
        let pseudo = checksum::pseudo_header(src, dst, PROTO_UDP, len);
        let mut c = !checksum::fold(checksum::accumulate(pseudo, d));
        if c == 0 {
            c = 0xffff;
        }
        d[6..8].copy_from_slice(&c.to_be_bytes());
    }

    /// [`UdpRepr::emit`] without the pass over the datagram: the checksum
    /// field holds the pseudo-header's folded sum only (never 0: the sum
    /// includes the protocol), for a transmit offload to complete (the
    /// kernel's CHECKSUM_PARTIAL: the ones' complement sum from the UDP
    /// header's first byte, folded and inverted, 0 sent as 0xffff, goes
    /// into the field at [`CHECKSUM_OFFSET`]). Receivers see it complete;
    /// a partial one (veth, no device in between) is accepted as the
    /// kernel accepts a CHECKSUM_PARTIAL skb ([`ChecksumState::Partial`]).
    pub fn emit_partial(&self, buf: &mut [u8], payload_len: usize, src: Ipv4Addr, dst: Ipv4Addr) {
        let len = self.header(buf, payload_len);
        let pseudo = checksum::pseudo_header(src, dst, PROTO_UDP, len);
        buf[6..8].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
    }

    /// Ports and length into `buf[..6]`; the datagram's length.
    #[inline]
    fn header(&self, buf: &mut [u8], payload_len: usize) -> u16 {
        let len = (HEADER_LEN + payload_len) as u16;
        let d = &mut buf[..usize::from(len)];
        d[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        d[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        d[4..6].copy_from_slice(&len.to_be_bytes());
        len
    }
}

/// Offset of the checksum field in a UDP header.
pub const CHECKSUM_OFFSET: u16 = 6;

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    fn datagram(payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + payload.len()];
        b[HEADER_LEN..].copy_from_slice(payload);
        UdpRepr {
            src_port: 1000,
            dst_port: 11111,
        }
        .emit(&mut b, payload.len(), A, B);
        b
    }

    #[test]
    fn emit_then_verify() {
        let b = datagram(b"hello world");
        let d = UdpDatagram::new_checked(&b[..]).unwrap();
        assert_eq!(d.payload(), b"hello world");
        assert_eq!(d.dst_port(), 11111);
        assert_eq!(d.checksum_state(A, B), ChecksumState::Valid);
        assert_eq!(
            d.checksum_state(B, Ipv4Addr::new(1, 2, 3, 4)),
            ChecksumState::Bad
        );
    }

    #[test]
    fn partial_checksum_is_recognised() {
        let mut b = datagram(b"abcdef");
        let pseudo = checksum::fold(checksum::pseudo_header(A, B, PROTO_UDP, b.len() as u16));
        b[6..8].copy_from_slice(&pseudo.to_be_bytes());
        let d = UdpDatagram::new_checked(&b[..]).unwrap();
        assert_eq!(d.checksum_state(A, B), ChecksumState::Partial);
    }

    #[test]
    fn a_partial_checksum_completed_like_an_offload_is_the_full_one() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in [0, 1, 2, 7, 64, 1472] {
            let payload = crate::xorshift_bytes(&mut x, len);
            let full = datagram(&payload);
            let mut p = vec![0u8; HEADER_LEN + len];
            p[HEADER_LEN..].copy_from_slice(&payload);
            let r = UdpRepr {
                src_port: 1000,
                dst_port: 11111,
            };
            r.emit_partial(&mut p, len, A, B);
            let d = UdpDatagram::new_checked(&p[..]).unwrap();
            assert_eq!(d.checksum_state(A, B), ChecksumState::Partial, "{len}");
            // What the kernel's skb_checksum_help does with CHECKSUM_PARTIAL.
            let at = usize::from(CHECKSUM_OFFSET);
            let c = !checksum::fold(checksum::accumulate(0, &p));
            p[at..at + 2].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
            assert_eq!(p, full, "{len}");
        }
    }

    #[test]
    fn bad_checksum_is_bad() {
        let mut b = datagram(b"abcdef");
        b[9] ^= 0x55;
        let d = UdpDatagram::new_checked(&b[..]).unwrap();
        assert_eq!(d.checksum_state(A, B), ChecksumState::Bad);
    }

    #[test]
    fn zero_checksum_is_absent() {
        let mut b = datagram(b"x");
        b[6] = 0;
        b[7] = 0;
        assert_eq!(
            UdpDatagram::new_checked(&b[..])
                .unwrap()
                .checksum_state(A, B),
            ChecksumState::Absent
        );
    }

    #[test]
    fn length_checks() {
        let b = datagram(b"abcd");
        crate::assert_refused(
            |b| UdpDatagram::new_checked(b).map(drop),
            &b,
            &[
                (7, b"", Malformed::Truncated),
                (4, &100u16.to_be_bytes(), Malformed::BadUdpLength),
                (4, &7u16.to_be_bytes(), Malformed::BadUdpLength),
            ],
        );
        // Shorter UDP length than buffer: payload is bounded by the field.
        let mut c = b.clone();
        c[4..6].copy_from_slice(&10u16.to_be_bytes());
        assert_eq!(UdpDatagram::new_checked(&c[..]).unwrap().payload(), b"ab");
    }

    #[test]
    fn a_partial_checksum_is_recognised_without_a_pass_over_the_data() {
        let pseudo = checksum::pseudo_header(A, B, PROTO_UDP, 12);
        let partial = checksum::fold(pseudo);
        for stored in [partial, !partial] {
            let s = ChecksumState::of(pseudo, stored, || panic!("summed a partial checksum"));
            assert_eq!(s, ChecksumState::Partial);
        }
        let data = [1u8, 2, 3, 4, 0, 0, 7, 8];
        let full = !checksum::fold(checksum::accumulate(pseudo, &data));
        let mut d = data;
        d[4..6].copy_from_slice(&full.to_be_bytes());
        let sum = || checksum::accumulate(pseudo, &d);
        assert_eq!(ChecksumState::of(pseudo, full, sum), ChecksumState::Valid);
        let wrong = full.wrapping_add(1);
        let mut e = d;
        e[4..6].copy_from_slice(&wrong.to_be_bytes());
        let sum = || checksum::accumulate(pseudo, &e);
        assert_eq!(ChecksumState::of(pseudo, wrong, sum), ChecksumState::Bad);
    }
}
