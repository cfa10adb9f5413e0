//! IPv4 headers.
//!
//! `Ipv4Packet::new_checked` validates the structure (version, IHL, total
//! length against the buffer); after it succeeds no accessor panics and
//! `payload()` is exactly the IP payload (link-layer padding is cut off).
//! `Ipv4Repr::parse` adds the policy of the fast path: no options, no
//! fragments, valid header checksum.

use crate::checksum;
use crate::{Malformed, Result};
use std::net::Ipv4Addr;

pub const HEADER_LEN: usize = 20;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_IGMP: u8 = 2;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

view!(Ipv4Packet, fixed: HEADER_LEN);

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Validate version, IHL and total length against the buffer.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = Self::fixed(&buffer)?;
        if b[0] >> 4 != 4 {
            return Err(Malformed::BadVersion);
        }
        let hl = usize::from(b[0] & 0x0f) * 4;
        if hl < HEADER_LEN || hl > b.len() {
            return Err(Malformed::BadIhl);
        }
        let total = usize::from(u16::from_be_bytes([b[2], b[3]]));
        if total < hl || total > b.len() {
            return Err(Malformed::BadTotalLength);
        }
        Ok(Ipv4Packet { buffer })
    }

    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[0] & 0x0f) * 4
    }
    be_fields! {
        dscp_ecn: u8 = 1;
        total_len: u16 = 2;
        ident: u16 = 4;
        ttl: u8 = 8;
        protocol: u8 = 9;
        header_checksum: u16 = 10;
    }
    #[inline]
    pub fn more_fragments(&self) -> bool {
        self.buffer.as_ref()[6] & 0x20 != 0
    }
    #[inline]
    pub fn dont_fragment(&self) -> bool {
        self.buffer.as_ref()[6] & 0x40 != 0
    }
    /// Fragment offset in bytes.
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        let b = self.buffer.as_ref();
        (u16::from_be_bytes([b[6], b[7]]) & 0x1fff) * 8
    }
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.more_fragments() || self.frag_offset() != 0
    }
    #[inline]
    pub fn src(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }
    #[inline]
    pub fn dst(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        let h = &self.buffer.as_ref()[..self.header_len()];
        match <&[u8; HEADER_LEN]>::try_from(h) {
            // The common header (no options): five words, no loop.
            Ok(h) => checksum::sum20(h) == 0xffff,
            Err(_) => checksum::checksum(h) == 0,
        }
    }
    /// The common header in one pass over its 20 bytes (five words, no
    /// loop): `Some((source, destination))` when it has no options, is not
    /// a fragment (MF clear, offset 0) and its checksum is right; `None`
    /// otherwise, and the separate accessors
    /// ([`Ipv4Packet::verify_checksum`], [`Ipv4Packet::options`],
    /// [`Ipv4Packet::is_fragment`]) then say which.
    #[inline]
    pub fn plain_addrs(&self) -> Option<(Ipv4Addr, Ipv4Addr)> {
        let h = <&[u8; HEADER_LEN]>::try_from(self.buffer.as_ref().get(..HEADER_LEN)?).ok()?;
        let w = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let (w0, w1, s, d) = (w(0), w(4), w(12), w(16));
        // Version 4, IHL 5; flags and offset: only DF may be set.
        if w0 >> 24 != 0x45 || w1 & 0x3fff != 0 {
            return None;
        }
        let sum = u64::from(w0) + u64::from(w1) + u64::from(w(8)) + u64::from(s) + u64::from(d);
        (checksum::fold64(sum) == 0xffff).then(|| (Ipv4Addr::from_bits(s), Ipv4Addr::from_bits(d)))
    }
    /// The options bytes (empty without options: IHL 5).
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }
    /// The IP payload, bounded by the total length (padding excluded).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (h, t) = (self.header_len(), usize::from(self.total_len()));
        &mut self.buffer.as_mut()[h..t]
    }
}

/// High-level representation of an option-less, unfragmented IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub payload_len: usize,
    pub ttl: u8,
    pub ident: u16,
}

impl Ipv4Repr {
    /// Parse with the fast path's policy: reject options, fragments and
    /// (when `verify_checksum`) a bad header checksum.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>, verify_checksum: bool) -> Result<Ipv4Repr> {
        if p.header_len() > HEADER_LEN {
            return Err(Malformed::IpOptions);
        }
        if p.is_fragment() {
            return Err(Malformed::Fragment);
        }
        if verify_checksum && !p.verify_checksum() {
            return Err(Malformed::BadIpChecksum);
        }
        Ok(Ipv4Repr {
            src: p.src(),
            dst: p.dst(),
            protocol: p.protocol(),
            payload_len: p.payload().len(),
            ttl: p.ttl(),
            ident: p.ident(),
        })
    }

    /// Bytes this header occupies on the wire.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write a 20-byte header (DF set, checksum filled in) into `buf[..20]`.
    /// Panics if `buf` is shorter than 20 bytes (a caller bug, not input).
    pub fn emit(&self, buf: &mut [u8]) {
        self.emit_tos(buf, 0)
    }

    /// [`Ipv4Repr::emit`] with the TOS byte (DSCP and ECN) `tos`, as a
    /// socket's IP_TOS sets it.
    pub fn emit_tos(&self, buf: &mut [u8], tos: u8) {
        self.write(buf, tos, 0x4000) // DF
    }

    /// [`Ipv4Repr::emit`] for one fragment of a datagram (DF clear):
    /// `payload_len` bytes starting `offset` bytes into the datagram's
    /// payload (a multiple of 8), `more` when fragments follow.
    pub fn emit_fragment(&self, buf: &mut [u8], offset: usize, more: bool) {
        debug_assert!(offset.is_multiple_of(8) && offset / 8 <= 0x1fff);
        self.write(buf, 0, (offset / 8) as u16 | if more { 0x2000 } else { 0 })
    }

    /// The header, with flags and fragment offset `frag` (the 16 bits).
    fn write(&self, buf: &mut [u8], tos: u8, frag: u16) {
        let total = (HEADER_LEN + self.payload_len) as u16;
        let h = &mut buf[..HEADER_LEN];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&total.to_be_bytes());
        h[4..6].copy_from_slice(&self.ident.to_be_bytes());
        h[6..8].copy_from_slice(&frag.to_be_bytes());
        h[8] = self.ttl;
        h[9] = self.protocol;
        h[12..16].copy_from_slice(&self.src.octets());
        h[16..20].copy_from_slice(&self.dst.octets());
        // The sum from the fields (the checksum word counted as 0), not
        // read back from the bytes just written.
        let (s, d) = (u64::from(self.src.to_bits()), u64::from(self.dst.to_bits()));
        let sum = (0x4500 | u64::from(tos))
            + u64::from(total)
            + u64::from(self.ident)
            + u64::from(frag)
            + (u64::from(self.ttl) << 8 | u64::from(self.protocol))
            + s
            + d;
        let c = !checksum::fold64(sum);
        h[10..12].copy_from_slice(&c.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(payload: usize) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + payload];
        Ipv4Repr {
            src: Ipv4Addr::new(198, 18, 0, 1),
            dst: Ipv4Addr::new(198, 18, 0, 2),
            protocol: PROTO_UDP,
            payload_len: payload,
            ttl: 64,
            ident: 7,
        }
        .emit(&mut b);
        b
    }

    #[test]
    fn emit_then_parse() {
        let b = sample(12);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        // The sum from the fields is the sum over the bytes written.
        assert_eq!(checksum::checksum(&b[..HEADER_LEN]), 0);
        let r = Ipv4Repr::parse(&p, true).unwrap();
        assert_eq!(r.payload_len, 12);
        assert_eq!(r.src, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(p.payload().len(), 12);
    }

    #[test]
    fn fragments_carry_offset_and_more_and_no_df() {
        let mut b = vec![0u8; HEADER_LEN + 16];
        let r = Ipv4Repr {
            src: Ipv4Addr::new(198, 18, 0, 1),
            dst: Ipv4Addr::new(198, 18, 0, 2),
            protocol: 6,
            payload_len: 16,
            ttl: 64,
            ident: 7,
        };
        r.emit_fragment(&mut b, 1600, true);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum() && p.is_fragment());
        assert_eq!(p.ident(), 7);
        assert_eq!(u16::from_be_bytes([b[6], b[7]]), 0x2000 | 200);
        r.emit_fragment(&mut b, 1600, false);
        assert_eq!(u16::from_be_bytes([b[6], b[7]]), 200);
        assert_eq!(
            Ipv4Repr::parse(&Ipv4Packet::new_checked(&b[..]).unwrap(), true),
            Err(Malformed::Fragment)
        );
    }

    #[test]
    fn tos_is_written_and_covered_by_the_checksum() {
        let mut b = vec![0u8; HEADER_LEN + 4];
        let mut r =
            Ipv4Repr::parse(&Ipv4Packet::new_checked(&sample(4)[..]).unwrap(), true).unwrap();
        r.ttl = 7;
        r.emit_tos(&mut b, 0xb8);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.dscp_ecn(), p.ttl()), (0xb8, 7));
        assert!(p.verify_checksum());
    }

    #[test]
    fn one_pass_takes_only_plain_headers() {
        // Field patch, then the checksum recomputed (so only the field
        // decides), and whether the header is still plain.
        let cases: [(usize, &[u8], bool); 6] = [
            (6, &[0x40, 0], true),  // DF
            (6, &[0x20, 0], false), // MF
            (6, &[0x00, 1], false), // offset 8
            (6, &[0x80, 0], true),  // the reserved bit: ignored, as by `is_fragment`
            (1, &[0xb8], true),     // TOS
            (8, &[1], true),        // TTL 1
        ];
        let good = sample(8);
        let p = Ipv4Packet::new_checked(&good[..]).unwrap();
        assert_eq!(p.plain_addrs(), Some((p.src(), p.dst())));
        for (at, bytes, plain) in cases {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            b[10..12].fill(0);
            let c = checksum::checksum(&b[..HEADER_LEN]);
            b[10..12].copy_from_slice(&c.to_be_bytes());
            let p = Ipv4Packet::new_checked(&b[..]).unwrap();
            assert!(p.verify_checksum());
            assert_eq!(p.plain_addrs().is_some(), plain, "{at} {bytes:?}");
        }
        let mut bad = good.clone();
        bad[10] ^= 1;
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap().plain_addrs(),
            None
        );
    }

    #[test]
    fn padding_is_cut_off() {
        let mut b = sample(4);
        b.extend_from_slice(&[0xee; 10]);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload(), &[0, 0, 0, 0]);
    }

    #[test]
    fn rejects_every_bad_field() {
        let good = sample(8);
        crate::assert_refused(
            |b| Ipv4Packet::new_checked(b).map(drop),
            &good,
            &[
                (19, b"", Malformed::Truncated),
                (0, &[0x65], Malformed::BadVersion),
                (0, &[0x44], Malformed::BadIhl),
                (0, &[0x4f], Malformed::BadIhl), // 60 bytes > 28
                (2, &100u16.to_be_bytes(), Malformed::BadTotalLength),
                (2, &10u16.to_be_bytes(), Malformed::BadTotalLength),
            ],
        );

        let mut b = good.clone();
        b[6] = 0x20; // MF
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p, false).unwrap_err(), Malformed::Fragment);
        let mut b = good.clone();
        b[7] = 1; // offset 8
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.frag_offset(), 8);
        assert_eq!(Ipv4Repr::parse(&p, false).unwrap_err(), Malformed::Fragment);

        let mut b = good.clone();
        b[0] = 0x46;
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Ipv4Repr::parse(&p, false).unwrap_err(),
            Malformed::IpOptions
        );

        let mut b = good.clone();
        b[8] ^= 1;
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Ipv4Repr::parse(&p, true).unwrap_err(),
            Malformed::BadIpChecksum
        );
        assert!(Ipv4Repr::parse(&p, false).is_ok());
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        // Deterministic pseudo-random sweep (xorshift); every accessor is
        // exercised on every buffer that passes `new_checked`.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for len in 0..80 {
            for _ in 0..200 {
                let buf = crate::xorshift_bytes(&mut x, len);
                if let Ok(p) = Ipv4Packet::new_checked(&buf[..]) {
                    let _ = (
                        p.src(),
                        p.dst(),
                        p.payload(),
                        p.frag_offset(),
                        p.verify_checksum(),
                    );
                    assert_eq!(
                        p.verify_checksum(),
                        checksum::checksum(&buf[..p.header_len()]) == 0
                    );
                    let _ = Ipv4Repr::parse(&p, true);
                }
            }
        }
    }
}
