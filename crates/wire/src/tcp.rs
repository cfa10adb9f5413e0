//! TCP segments (RFC 9293) and the options the nanowire TCP speaks:
//! MSS, window scale (RFC 7323), SACK-permitted and SACK blocks (RFC 2018),
//! timestamps (RFC 7323).
//!
//! `TcpSegment::new_checked` validates the data offset against the buffer (the
//! IP payload); after it succeeds no accessor panics. Errors are the crate's
//! one error enum, [`Malformed`] (`Truncated`, `BadTcpDataOffset`,
//! `BadTcpOptions`; `BadTcpChecksum` for a caller that verified). `TcpRepr::parse` walks
//! the options and refuses malformed ones (a length that runs past the header,
//! a wrong length for a known kind). Unknown options are skipped.

use crate::checksum;
use crate::ipv4::PROTO_TCP;
use crate::udp::ChecksumState;
use crate::{Malformed, Result};
use std::net::Ipv4Addr;

pub const HEADER_LEN: usize = 20;
/// Largest TCP header (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;
/// Most SACK blocks one segment carries (with timestamps only 3 fit).
pub const MAX_SACK_BLOCKS: usize = 4;

/// The control bits, as on the wire (low 8 bits of offset/flags word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Flags(pub u8);

impl Flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;

    /// Is flag `bit` (one of the constants above) set?
    #[inline(always)]
    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
    pub fn fin(self) -> bool {
        self.has(Self::FIN)
    }
    pub fn syn(self) -> bool {
        self.has(Self::SYN)
    }
    pub fn rst(self) -> bool {
        self.has(Self::RST)
    }
    pub fn psh(self) -> bool {
        self.has(Self::PSH)
    }
    pub fn ack(self) -> bool {
        self.has(Self::ACK)
    }
    pub fn urg(self) -> bool {
        self.has(Self::URG)
    }
}

view!(TcpSegment, fixed: HEADER_LEN);

impl<T: AsRef<[u8]>> TcpSegment<T> {
    /// `buffer` is exactly the IP payload.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = Self::fixed(&buffer)?;
        let off = usize::from(b[12] >> 4) * 4;
        if off < HEADER_LEN || off > b.len() {
            return Err(Malformed::BadTcpDataOffset);
        }
        Ok(TcpSegment { buffer })
    }

    #[inline]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    be_fields! {
        src_port: u16 = 0;
        dst_port: u16 = 2;
        seq: u32 = 4;
        ack: u32 = 8;
        window: u16 = 14;
        checksum: u16 = 16;
        urgent: u16 = 18;
    }
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[12] >> 4) * 4
    }
    #[inline]
    pub fn flags(&self) -> Flags {
        Flags(self.b()[13])
    }
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.header_len()]
    }
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
    /// Sequence space the segment occupies (payload + SYN + FIN).
    #[inline]
    pub fn seq_len(&self) -> u32 {
        let f = self.flags();
        self.payload().len() as u32 + u32::from(f.syn()) + u32::from(f.fin())
    }

    /// Classify the checksum like `UdpDatagram::checksum_state` (a partial,
    /// pseudo-header-only checksum from a TX-offloading peer is `Partial`,
    /// recognised before any pass over the segment). TCP has no "absent"
    /// checksum: zero is checked like any other value.
    #[inline]
    pub fn checksum_state(&self, src: Ipv4Addr, dst: Ipv4Addr) -> ChecksumState {
        let data = self.b();
        let pseudo = checksum::pseudo_header(src, dst, PROTO_TCP, data.len() as u16);
        ChecksumState::of(pseudo, self.checksum(), || {
            checksum::accumulate(pseudo, data)
        })
    }
}

/// A parsed TCP header with the options nanowire understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: Flags,
    pub window: u16,
    pub mss: Option<u16>,
    pub window_scale: Option<u8>,
    pub sack_permitted: bool,
    /// SACK blocks (left, right); only the first `sack_len` are meaningful.
    pub sack: [(u32, u32); MAX_SACK_BLOCKS],
    pub sack_len: u8,
    /// (TSval, TSecr).
    pub timestamp: Option<(u32, u32)>,
}

const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_MSS: u8 = 2;
const OPT_WS: u8 = 3;
const OPT_SACK_PERM: u8 = 4;
const OPT_SACK: u8 = 5;
const OPT_TS: u8 = 8;

impl TcpRepr {
    pub fn parse<T: AsRef<[u8]>>(s: &TcpSegment<T>) -> Result<TcpRepr> {
        let mut r = TcpRepr {
            src_port: s.src_port(),
            dst_port: s.dst_port(),
            seq: s.seq(),
            ack: s.ack(),
            flags: s.flags(),
            window: s.window(),
            ..TcpRepr::default()
        };
        let mut o = s.options();
        // What Linux and this stack put on every segment of an established
        // connection that negotiated timestamps (NOP, NOP, TS): taken without
        // the walk, with the walk's result.
        if let [OPT_NOP, OPT_NOP, OPT_TS, 10, v @ ..] = o
            && let [a0, a1, a2, a3, e0, e1, e2, e3] = *v
        {
            r.timestamp = Some((
                u32::from_be_bytes([a0, a1, a2, a3]),
                u32::from_be_bytes([e0, e1, e2, e3]),
            ));
            return Ok(r);
        }
        while let Some(&kind) = o.first() {
            match kind {
                OPT_END => break,
                OPT_NOP => {
                    o = &o[1..];
                    continue;
                }
                _ => {}
            }
            let len = usize::from(*o.get(1).ok_or(Malformed::BadTcpOptions)?);
            if len < 2 || len > o.len() {
                return Err(Malformed::BadTcpOptions);
            }
            let v = &o[2..len];
            match kind {
                OPT_MSS => {
                    let [a, b] = v else {
                        return Err(Malformed::BadTcpOptions);
                    };
                    r.mss = Some(u16::from_be_bytes([*a, *b]));
                }
                OPT_WS => {
                    let [a] = v else {
                        return Err(Malformed::BadTcpOptions);
                    };
                    // RFC 7323 2.3: a shift above 14 is used as 14.
                    r.window_scale = Some((*a).min(14));
                }
                OPT_SACK_PERM => {
                    if !v.is_empty() {
                        return Err(Malformed::BadTcpOptions);
                    }
                    r.sack_permitted = true;
                }
                OPT_SACK => {
                    if v.is_empty() || !v.len().is_multiple_of(8) || v.len() / 8 > MAX_SACK_BLOCKS {
                        return Err(Malformed::BadTcpOptions);
                    }
                    for (i, c) in v.chunks_exact(8).enumerate() {
                        r.sack[i] = (
                            u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
                            u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
                        );
                    }
                    r.sack_len = (v.len() / 8) as u8;
                }
                OPT_TS => {
                    if v.len() != 8 {
                        return Err(Malformed::BadTcpOptions);
                    }
                    r.timestamp = Some((
                        u32::from_be_bytes([v[0], v[1], v[2], v[3]]),
                        u32::from_be_bytes([v[4], v[5], v[6], v[7]]),
                    ));
                }
                _ => {}
            }
            o = &o[len..];
        }
        Ok(r)
    }

    pub fn sack_blocks(&self) -> &[(u32, u32)] {
        &self.sack[..usize::from(self.sack_len).min(MAX_SACK_BLOCKS)]
    }

    /// Bytes of options, padded to a multiple of 4.
    pub fn options_len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        if self.window_scale.is_some() {
            n += 4; // NOP + 3
        }
        if self.timestamp.is_some() {
            n += 12; // NOP NOP + 10 (or SACK-perm + 10)
            if self.sack_permitted {
                // SACK-permitted rides in the two NOPs before the timestamp.
            }
        } else if self.sack_permitted {
            n += 4; // NOP NOP + 2
        }
        if self.sack_len > 0 {
            n += 4 + 8 * usize::from(self.sack_len).min(self.max_sack_blocks());
        }
        n
    }

    /// How many SACK blocks fit beside the other options.
    pub fn max_sack_blocks(&self) -> usize {
        if self.timestamp.is_some() { 3 } else { 4 }
    }

    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options_len()
    }

    /// Write the header into `buf[..header_len()]` for a payload already in
    /// `buf[header_len()..header_len()+payload_len]`, and fill the checksum.
    /// Returns the segment length. Panics if `buf` is too short (caller bug).
    pub fn emit(&self, buf: &mut [u8], payload_len: usize, src: Ipv4Addr, dst: Ipv4Addr) -> usize {
        let total = self.emit_partial(buf, payload_len, src, dst);
        fill_checksum(&mut buf[..total], src, dst);
        total
    }

    /// [`TcpRepr::emit`] without the pass over the segment: the checksum
    /// field holds the pseudo-header's sum only, for a transmit offload to
    /// complete (the kernel's CHECKSUM_PARTIAL: the ones' complement sum
    /// of the segment from its first byte, folded and inverted, goes into
    /// the field at offset 16), or [`fill_checksum`] to finish.
    #[inline]
    pub fn emit_partial(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> usize {
        // What every segment of an established connection that negotiated
        // timestamps carries (NOP, NOP, TS; no SACK blocks): one fixed
        // layout, one bounds check. Everything else through the general
        // writer, out of line, so that this path stays a few code lines.
        if let Some(ts) = self.timestamp
            && self.mss.is_none()
            && self.window_scale.is_none()
            && !self.sack_permitted
            && self.sack_len == 0
        {
            let total = TS_HEADER_LEN + payload_len;
            let d = &mut buf[..total];
            let h = (&mut d[..TS_HEADER_LEN])
                .try_into()
                .expect("a header's bytes");
            return emit_ts_partial(h, &self.fixed(), ts, payload_len, src, dst);
        }
        self.emit_partial_general(buf, payload_len, (src, dst))
    }

    /// The fields of the header's first 16 bytes.
    #[inline(always)]
    fn fixed(&self) -> Fixed {
        Fixed {
            ports: (self.src_port, self.dst_port),
            seq_ack: (self.seq, self.ack),
            flags: self.flags,
            window: self.window,
        }
    }

    /// [`TcpRepr::emit_partial`] with any options.
    #[inline(never)]
    fn emit_partial_general(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        (src, dst): (Ipv4Addr, Ipv4Addr),
    ) -> usize {
        let hl = self.header_len();
        let total = hl + payload_len;
        let d = &mut buf[..total];
        self.fixed()
            .put(d.first_chunk_mut().expect("a header's 16 bytes"), hl);
        d[16] = 0;
        d[17] = 0;
        d[18] = 0;
        d[19] = 0;
        let mut i = HEADER_LEN;
        if let Some(m) = self.mss {
            d[i..i + 2].copy_from_slice(&[OPT_MSS, 4]);
            d[i + 2..i + 4].copy_from_slice(&m.to_be_bytes());
            i += 4;
        }
        if let Some(w) = self.window_scale {
            d[i..i + 4].copy_from_slice(&[OPT_NOP, OPT_WS, 3, w]);
            i += 4;
        }
        if let Some((val, ecr)) = self.timestamp {
            if self.sack_permitted {
                d[i..i + 2].copy_from_slice(&[OPT_SACK_PERM, 2]);
            } else {
                d[i..i + 2].copy_from_slice(&[OPT_NOP, OPT_NOP]);
            }
            d[i + 2..i + 4].copy_from_slice(&[OPT_TS, 10]);
            d[i + 4..i + 8].copy_from_slice(&val.to_be_bytes());
            d[i + 8..i + 12].copy_from_slice(&ecr.to_be_bytes());
            i += 12;
        } else if self.sack_permitted {
            d[i..i + 4].copy_from_slice(&[OPT_NOP, OPT_NOP, OPT_SACK_PERM, 2]);
            i += 4;
        }
        if self.sack_len > 0 {
            let n = usize::from(self.sack_len).min(self.max_sack_blocks());
            d[i..i + 4].copy_from_slice(&[OPT_NOP, OPT_NOP, OPT_SACK, (2 + 8 * n) as u8]);
            i += 4;
            for &(l, r) in &self.sack[..n] {
                d[i..i + 4].copy_from_slice(&l.to_be_bytes());
                d[i + 4..i + 8].copy_from_slice(&r.to_be_bytes());
                i += 8;
            }
        }
        debug_assert_eq!(i, hl);
        let pseudo = checksum::pseudo_header(src, dst, PROTO_TCP, total as u16);
        d[16..18].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
        total
    }
}

/// The length of a header whose only option is the timestamp (NOP, NOP,
/// TS): what every segment of an established connection that negotiated
/// timestamps carries when it announces no SACK blocks.
pub const TS_HEADER_LEN: usize = HEADER_LEN + 12;

/// The header's first 16 bytes, the same in every segment: ports, sequence
/// and acknowledgement numbers, flags, window (and the data offset, from
/// the header's length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    /// Source and destination.
    pub ports: (u16, u16),
    /// Sequence and acknowledgement numbers.
    pub seq_ack: (u32, u32),
    pub flags: Flags,
    pub window: u16,
}

impl Fixed {
    /// Into `h` for a header of `hl` bytes; a fixed-size array, so no
    /// bounds check is left.
    #[inline(always)]
    fn put(&self, h: &mut [u8; 16], hl: usize) {
        h[0..2].copy_from_slice(&self.ports.0.to_be_bytes());
        h[2..4].copy_from_slice(&self.ports.1.to_be_bytes());
        h[4..8].copy_from_slice(&self.seq_ack.0.to_be_bytes());
        h[8..12].copy_from_slice(&self.seq_ack.1.to_be_bytes());
        h[12] = ((hl / 4) as u8) << 4;
        h[13] = self.flags.0;
        h[14..16].copy_from_slice(&self.window.to_be_bytes());
    }
}

/// Write a header with the timestamp option only (`ts`: TSval, TSecr) for
/// a payload of `payload_len` bytes (after the header, in place or to
/// come), the checksum field holding the pseudo-header's sum as
/// [`TcpRepr::emit_partial`] leaves it; returns the segment's length. The
/// bytes `TcpRepr::emit_partial` writes for the same fields, without a
/// `TcpRepr` (a sender that knows its segment has this layout: the TCP
/// crate's established connection).
#[inline(always)]
pub fn emit_ts_partial(
    h: &mut [u8; TS_HEADER_LEN],
    f: &Fixed,
    (val, ecr): (u32, u32),
    payload_len: usize,
    src: Ipv4Addr,
    dst: Ipv4Addr,
) -> usize {
    let total = TS_HEADER_LEN + payload_len;
    f.put(
        h.first_chunk_mut().expect("16 of a header's bytes"),
        TS_HEADER_LEN,
    );
    let pseudo = checksum::pseudo_header(src, dst, PROTO_TCP, total as u16);
    h[16..18].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
    h[18..20].fill(0);
    h[20..24].copy_from_slice(&[OPT_NOP, OPT_NOP, OPT_TS, 10]);
    h[24..28].copy_from_slice(&val.to_be_bytes());
    h[28..32].copy_from_slice(&ecr.to_be_bytes());
    total
}

/// Complete the checksum of a segment written by [`TcpRepr::emit_partial`]
/// (or of any segment: the field is recomputed), in software.
pub fn fill_checksum(seg: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) {
    seg[16] = 0;
    seg[17] = 0;
    let pseudo = checksum::pseudo_header(src, dst, PROTO_TCP, seg.len() as u16);
    let c = !checksum::fold(checksum::accumulate(pseudo, seg));
    seg[16..18].copy_from_slice(&c.to_be_bytes());
}

/// Offset of the checksum field in a TCP header.
pub const CHECKSUM_OFFSET: u16 = 16;

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    /// A header without options: ports, (seq, ack), flags, window.
    fn header(ports: (u16, u16), (seq, ack): (u32, u32), flags: u8, window: u16) -> TcpRepr {
        TcpRepr {
            src_port: ports.0,
            dst_port: ports.1,
            seq,
            ack,
            flags: Flags(flags),
            window,
            ..TcpRepr::default()
        }
    }

    fn build(r: &TcpRepr, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; r.header_len() + payload.len()];
        b[r.header_len()..].copy_from_slice(payload);
        let n = r.emit(&mut b, payload.len(), A, B);
        assert_eq!(n, b.len());
        b
    }

    #[test]
    fn round_trip_with_every_option() {
        let mut r = TcpRepr {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamp: Some((1, 2)),
            ..header(
                (40000, 80),
                (0xdead_beef, 7),
                Flags::SYN | Flags::ACK,
                65535,
            )
        };
        r.sack[0] = (10, 20);
        r.sack[1] = (30, 40);
        r.sack_len = 2;
        let b = build(&r, b"hello");
        assert_eq!(b.len() % 4, 1);
        let s = TcpSegment::new_checked(&b[..]).unwrap();
        assert_eq!(s.checksum_state(A, B), ChecksumState::Valid);
        assert_eq!(
            s.checksum_state(B, A),
            ChecksumState::Valid,
            "pseudo sum is symmetric"
        );
        assert_eq!(
            s.checksum_state(A, Ipv4Addr::new(1, 1, 1, 1)),
            ChecksumState::Bad
        );
        assert_eq!(s.payload(), b"hello");
        assert_eq!(s.seq_len(), 6);
        assert_eq!(TcpRepr::parse(&s).unwrap(), r);
    }

    #[test]
    fn an_established_segments_timestamps_parse_alone_and_before_sack_blocks() {
        let mut r = TcpRepr {
            timestamp: Some((0x0102_0304, 0xa0b0_c0d0)),
            ..header((5201, 40000), (1, 2), Flags::ACK | Flags::PSH, 501)
        };
        let b = build(&r, b"data");
        assert_eq!(
            &b[20..24],
            &[OPT_NOP, OPT_NOP, OPT_TS, 10],
            "the common layout"
        );
        let s = TcpSegment::new_checked(&b[..]).unwrap();
        assert_eq!(TcpRepr::parse(&s).unwrap(), r);
        r.sack[0] = (100, 200);
        r.sack_len = 1;
        let b = build(&r, b"");
        let s = TcpSegment::new_checked(&b[..]).unwrap();
        assert_eq!(TcpRepr::parse(&s).unwrap(), r, "timestamps, then SACK");
    }

    #[test]
    fn plain_header_and_sack_without_timestamps() {
        let mut r = TcpRepr {
            src_port: 1,
            dst_port: 2,
            flags: Flags(Flags::ACK),
            ..TcpRepr::default()
        };
        for i in 0..4 {
            r.sack[i] = (i as u32, i as u32 + 1);
        }
        r.sack_len = 4;
        let b = build(&r, b"");
        assert_eq!(b.len(), 20 + 4 + 32);
        let s = TcpSegment::new_checked(&b[..]).unwrap();
        assert_eq!(TcpRepr::parse(&s).unwrap().sack_blocks().len(), 4);
    }

    #[test]
    fn malformed_headers_and_options_are_refused() {
        let r = TcpRepr {
            mss: Some(1000),
            ..TcpRepr::default()
        };
        let b = build(&r, b"x");
        crate::assert_refused(
            |b| TcpSegment::new_checked(b).map(drop),
            &b,
            &[
                (19, b"", Malformed::Truncated),
                (12, &[4 << 4], Malformed::BadTcpDataOffset),
                (12, &[15 << 4], Malformed::BadTcpDataOffset),
            ],
        );
        for bad in [[2u8, 3, 0, 0], [2, 0, 0, 0], [2, 9, 0, 0], [3, 4, 0, 0]] {
            let mut c = b.clone();
            c[20..24].copy_from_slice(&bad);
            let s = TcpSegment::new_checked(&c[..]).unwrap();
            assert_eq!(TcpRepr::parse(&s).unwrap_err(), Malformed::BadTcpOptions);
        }
        // A lone kind byte at the end of the option space.
        let mut c = b.clone();
        c[20..24].copy_from_slice(&[1, 1, 1, 2]);
        let s = TcpSegment::new_checked(&c[..]).unwrap();
        assert_eq!(TcpRepr::parse(&s).unwrap_err(), Malformed::BadTcpOptions);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x1234_5678;
        for _ in 0..20000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 80) as usize;
            let buf: Vec<u8> = (0..len)
                .map(|i| (x.rotate_left(i as u32) & 0xff) as u8)
                .collect();
            if let Ok(s) = TcpSegment::new_checked(&buf[..]) {
                let _ = TcpRepr::parse(&s);
                let _ = s.checksum_state(A, B);
                let _ = s.payload();
            }
        }
    }

    #[test]
    fn a_partial_checksum_completed_like_an_offload_is_the_full_one() {
        let r = TcpRepr {
            src_port: 1,
            dst_port: 2,
            seq: 3,
            flags: Flags(Flags::ACK),
            timestamp: Some((5, 6)),
            ..TcpRepr::default()
        };
        let payload = b"hello, offload";
        let full = build(&r, payload);
        let mut p = vec![0u8; full.len()];
        p[r.header_len()..].copy_from_slice(payload);
        r.emit_partial(&mut p, payload.len(), A, B);
        let seg = TcpSegment::new_checked(&p[..]).unwrap();
        assert_eq!(seg.checksum_state(A, B), ChecksumState::Partial);
        // What the device (or skb_checksum_help) does: sum from the start,
        // field included, fold, invert, store.
        let c = !checksum::fold(checksum::accumulate(0, &p));
        p[16..18].copy_from_slice(&c.to_be_bytes());
        assert_eq!(p, full);
        let mut q = p.clone();
        q[16] ^= 0xff;
        fill_checksum(&mut q, A, B);
        assert_eq!(q, full);
    }

    #[test]
    fn the_timestamp_only_layout_writes_what_the_general_writer_writes() {
        for flags in [Flags::ACK, Flags::ACK | Flags::PSH, Flags::ACK | Flags::FIN] {
            for len in [0usize, 1, 7, 64, 1448] {
                let r = TcpRepr {
                    src_port: 11111,
                    dst_port: 40123,
                    seq: 0xfedc_ba98,
                    ack: 0x0123_4567,
                    flags: Flags(flags),
                    window: 0x1234,
                    timestamp: Some((0xdead_beef, 0x0bad_cafe)),
                    ..TcpRepr::default()
                };
                let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                let mut fast = vec![0xa5u8; 32 + len + 5];
                let mut general = fast.clone();
                fast[32..32 + len].copy_from_slice(&payload);
                general[32..32 + len].copy_from_slice(&payload);
                assert_eq!(r.emit_partial(&mut fast, len, A, B), 32 + len);
                assert_eq!(r.emit_partial_general(&mut general, len, (A, B)), 32 + len);
                assert_eq!(fast, general, "flags {flags:#x} len {len}");
                let full = build(&r, &payload);
                let s = TcpSegment::new_checked(&full[..]).unwrap();
                assert_eq!(s.checksum_state(A, B), ChecksumState::Valid);
                assert_eq!(TcpRepr::parse(&s).unwrap(), r);
            }
        }
    }
}
