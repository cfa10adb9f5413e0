//! Frame classification: a pure function from received bytes to either
//! the transport 5-tuple with payload bounds, or the reason to drop.
//!
//! No state, no allocation, no panics on any input (fuzzed by the fuzzing
//! targets; `garbage_never_panics` below is the in-tree smoke version). The
//! receive path counts every `Err` under [`DropReason::counter`].
//!
//! Policy, following what the kernel does with the same frame:
//! * IPv4 with options (IHL > 5) is accepted when the options are well
//!   formed (and the header checksum, which covers them, is right); the
//!   payload starts after the options.
//! * Fragments are not reassembled here: the steering program passes UDP
//!   fragments to the kernel, which reassembles them for the socket's kernel
//!   twin, and redirects those of the engine's TCP flows, which the receive
//!   path reassembles (`reasm.rs`) when classify says `Fragment`.
//! * Martian sources (0.0.0.0/8, 255.255.255.255, multicast, loopback) are
//!   dropped as `Martian` (the receive path adds "one of our own
//!   addresses", which needs state).
//! * UDP and TCP are classified through `wire`'s checked views
//!   (`UdpDatagram`, `TcpSegment`: ports, lengths, checksum; partial
//!   checksums left by TX offload on the sender's side are accepted and
//!   flagged); a non-IPv4 frame is `NotIpv4`, another IP protocol
//!   `OtherProtocol`.

use super::shm::E;
use nanowire_probe::{self as probe, Mark};
use nanowire_wire::checksum;
use nanowire_wire::ethernet::HEADER_LEN as ETH_HDR;
use nanowire_wire::tcp::TcpSegment;
use nanowire_wire::udp::ChecksumState;
use nanowire_wire::{EtherType, EthernetFrame, Ipv4Packet, Malformed, UdpDatagram};
use nanowire_xdp::RxFrame;
use std::net::{Ipv4Addr, SocketAddrV4};

/// The IP protocol numbers, `wire`'s (re-exported for the engine's users).
pub use nanowire_wire::ipv4::{PROTO_TCP, PROTO_UDP};

/// A frame worth delivering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    /// IP protocol (17 UDP, 6 TCP).
    pub proto: u8,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    /// Offset of the transport header in the frame.
    pub l4_off: usize,
    /// Offset and length of the transport payload in the frame.
    pub payload_off: usize,
    pub payload_len: usize,
    /// The transport checksum was a partial (offload) one. Either way it
    /// was verified here, once per segment: the verdict travels with the
    /// frame, and nothing after the classifier checksums it again (the
    /// engine's TCP runs with `Config::verify_checksum` off).
    pub csum_partial: bool,
    /// The IPv4 header carried options.
    pub ip_options: bool,
}

/// Why a frame is not delivered. Each reason has its own counter
/// ([`DropReason::counter`]), named for what it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// A malformed header or a bad checksum, by `wire`'s one error enum
    /// (`drop_<reason>`: `drop_bad_udp_checksum`, `drop_bad_tcp_checksum`, ...).
    Malformed(Malformed),
    /// Not an IPv4 frame (`drop_not_ipv4`).
    NotIpv4,
    /// IPv4, but neither UDP nor TCP (`drop_other_protocol`).
    OtherProtocol,
    /// A martian source address.
    Martian,
    /// A unicast frame for another host's MAC (the kernel's
    /// PACKET_OTHERHOST; the steering program passes these to the kernel,
    /// this is the engine's own check behind it).
    OtherHost,
}

impl DropReason {
    /// The engine counter this reason is counted under.
    pub fn counter(self) -> E {
        match self {
            DropReason::Malformed(m) => E::malformed(m),
            DropReason::NotIpv4 => E::DropNotIpv4,
            DropReason::OtherProtocol => E::DropOtherProtocol,
            DropReason::Martian => E::DropMartian,
            DropReason::OtherHost => E::DropOtherHost,
        }
    }
}

impl From<Malformed> for DropReason {
    #[inline]
    fn from(m: Malformed) -> Self {
        DropReason::Malformed(m)
    }
}

/// A source address the kernel would refuse on input (without the
/// "is one of ours" check, which needs the interface's addresses).
pub fn is_martian_source(a: Ipv4Addr) -> bool {
    a.octets()[0] == 0 || a.is_broadcast() || a.is_multicast() || a.is_loopback()
}

/// Options well formed: EOL/NOP single bytes, every other option a length
/// byte of at least 2 that fits.
fn options_ok(mut o: &[u8]) -> bool {
    while let Some(&t) = o.first() {
        match t {
            0 => return true,
            1 => o = &o[1..],
            _ => {
                let Some(&l) = o.get(1) else { return false };
                let l = usize::from(l);
                if l < 2 || l > o.len() {
                    return false;
                }
                o = &o[l..];
            }
        }
    }
    true
}

/// Is `frame` a unicast frame whose destination MAC is not `mac`? The
/// kernel drops such a frame (PACKET_OTHERHOST); broadcast and multicast
/// frames (the group bit) are not "other host".
/// A frame too short for an Ethernet header is not: classify counts it.
/// The destination is the frame's first six bytes, compared in place.
#[inline]
pub fn for_other_host(frame: &[u8], mac: &[u8; 6]) -> bool {
    match frame.get(..ETH_HDR) {
        Some(h) => h[0] & 1 == 0 && h[..6] != mac[..],
        None => false,
    }
}

/// What the kernel checks in an IPv4 header before the transport (its
/// checksum, options, fragment, martian source), on a packet whose version,
/// header length and total length were checked: (source, destination).
/// The common header (no options, not a fragment, right checksum) in one
/// pass (`Ipv4Packet::plain_addrs`); any other, check by check.
#[inline]
fn ip_header_checks(ip: &Ipv4Packet<&[u8]>) -> Result<(Ipv4Addr, Ipv4Addr), DropReason> {
    let (src, dst) = match ip.plain_addrs() {
        Some(a) => a,
        None => ip_header_checks_each(ip)?,
    };
    if is_martian_source(src) {
        return Err(DropReason::Martian);
    }
    Ok((src, dst))
}

/// [`ip_header_checks`] for a header with options, a fragment or a bad
/// checksum: the first failing check, in the kernel's order.
#[cold]
fn ip_header_checks_each(ip: &Ipv4Packet<&[u8]>) -> Result<(Ipv4Addr, Ipv4Addr), DropReason> {
    let hl = ip.header_len();
    if !ip.verify_checksum() {
        return Err(Malformed::BadIpChecksum.into());
    }
    if hl > 20 && !options_ok(ip.options()) {
        return Err(Malformed::IpOptions.into());
    }
    if ip.is_fragment() {
        return Err(Malformed::Fragment.into());
    }
    Ok((ip.src(), ip.dst()))
}

/// Most buffers of one received packet.
pub(crate) const MAX_PIECES: usize = nanowire_xdp::xsk::MAX_CHAIN_FRAMES as usize;

/// The buffers of `f` after its first, in order, into `out`: how many
/// (`None` if more than `out` holds, which a chain never has).
pub(crate) fn pieces_after_first<'a>(
    f: &'a RxFrame,
    out: &mut [&'a [u8]; MAX_PIECES],
) -> Option<usize> {
    let mut n = 0;
    for p in f.pieces().skip(1) {
        *out.get_mut(n)? = p;
        n += 1;
    }
    Some(n)
}

/// Classify a received packet: [`classify`] on its bytes, except that a
/// multi-buffer TCP segment (a GSO/GRO super-frame) is classified in
/// place, from the headers in its first buffer and a checksum summed
/// over its buffers where they lie, without gathering it. Anything else
/// in several buffers (UDP, headers not in the first buffer) is gathered
/// once and classified like one buffer.
/// (Always inlined into its callers, the receive path's `handle` first:
/// one call and one copy of the result fewer per frame; the chain's case
/// stays a call.)
#[inline(always)]
pub fn classify_frame(f: &RxFrame) -> Result<Classified, DropReason> {
    if f.frames() == 1 {
        return classify(f.data());
    }
    match classify_chain(f) {
        Some(r) => r,
        None => classify(f.data()),
    }
}

/// [`classify_frame`] for an IPv4 TCP segment whose Ethernet, IP and TCP
/// headers lie in the first of its buffers; `None` for anything else.
/// (A call of its own: kept out of `classify_frame`'s inlined body.)
#[inline(never)]
fn classify_chain(f: &RxFrame) -> Option<Result<Classified, DropReason>> {
    let head = f.head();
    let ip_bytes = head.get(ETH_HDR..)?;
    if head[12..14] != [0x08, 0x00] || ip_bytes.len() < 20 || ip_bytes[0] >> 4 != 4 {
        return None;
    }
    let ip = Ipv4Packet::new_unchecked(ip_bytes);
    let hl = ip.header_len();
    let total = usize::from(ip.total_len());
    let l4_off = ETH_HDR + hl;
    if hl < 20
        || ip.protocol() != PROTO_TCP
        || total < hl + 20
        || ETH_HDR + total > f.len()
        || head.len() < l4_off + 20
    {
        return None;
    }
    let doff = usize::from(head[l4_off + 12] >> 4) * 4;
    if doff < 20 || hl + doff > total || head.len() < l4_off + doff {
        return None;
    }
    let (src, dst) = match ip_header_checks(&ip) {
        Ok(a) => a,
        Err(e) => return Some(Err(e)),
    };
    let tcp = &head[l4_off..];
    let seg_len = total - hl;
    let pseudo = checksum::pseudo_header(src, dst, PROTO_TCP, seg_len as u16);
    let stored = u16::from_be_bytes([tcp[16], tcp[17]]);
    let partial = checksum::fold(pseudo);
    // A super-frame from a TSO/GSO sender carries the partial checksum of
    // an offload: recognised before any summing (the verdict is the same
    // either way: a partial checksum is accepted, flagged). Else one pass
    // over the buffers, in place.
    let csum_partial = if stored == partial || stored == !partial {
        true
    } else {
        let mut rest: [&[u8]; MAX_PIECES] = [&[]; MAX_PIECES];
        let n = pieces_after_first(f, &mut rest)?;
        let seg = nanowire_tcp::Payload::new(tcp, &rest[..n]).take(seg_len);
        if checksum::fold(seg.accumulate(pseudo)) != 0xffff {
            return Some(Err(Malformed::BadTcpChecksum.into()));
        }
        false
    };
    Some(Ok(Classified {
        proto: PROTO_TCP,
        src: SocketAddrV4::new(src, u16::from_be_bytes([tcp[0], tcp[1]])),
        dst: SocketAddrV4::new(dst, u16::from_be_bytes([tcp[2], tcp[3]])),
        l4_off,
        payload_off: l4_off + doff,
        payload_len: seg_len - doff,
        csum_partial,
        ip_options: hl > 20,
    }))
}

/// Classify one received frame (Ethernet first), through `wire`'s checked
/// views only; each transport checksum is verified here, once.
pub fn classify(frame: &[u8]) -> Result<Classified, DropReason> {
    let eth = EthernetFrame::new_checked(frame)?;
    if eth.ethertype() != EtherType::Ipv4 {
        return Err(DropReason::NotIpv4);
    }
    let ip = Ipv4Packet::new_checked(eth.payload())?;
    let hl = ip.header_len();
    let (src, dst) = ip_header_checks(&ip)?;
    let l4_off = ETH_HDR + hl;
    let seg = ip.payload();
    let (proto, sport, dport, hdr, payload_len, csum) = match ip.protocol() {
        PROTO_UDP => {
            probe::mark(Mark::L4);
            let udp = UdpDatagram::new_checked(seg)?;
            let csum = match udp.checksum_state(src, dst) {
                ChecksumState::Bad => return Err(Malformed::BadUdpChecksum.into()),
                c => c,
            };
            // The payload's length from the header `new_checked` bounded
            // (8 <= len <= the IP payload): no slice to build per frame.
            let p = usize::from(udp.len()) - nanowire_wire::udp::HEADER_LEN;
            (PROTO_UDP, udp.src_port(), udp.dst_port(), 8, p, csum)
        }
        PROTO_TCP => {
            probe::mark(Mark::L4);
            let tcp = TcpSegment::new_checked(seg)?;
            // TCP has no "absent" checksum: only valid or partial pass.
            let csum = match tcp.checksum_state(src, dst) {
                ChecksumState::Bad | ChecksumState::Absent => {
                    return Err(Malformed::BadTcpChecksum.into());
                }
                c => c,
            };
            let h = tcp.header_len();
            (
                PROTO_TCP,
                tcp.src_port(),
                tcp.dst_port(),
                h,
                seg.len() - h,
                csum,
            )
        }
        _ => return Err(DropReason::OtherProtocol),
    };
    Ok(Classified {
        proto,
        src: SocketAddrV4::new(src, sport),
        dst: SocketAddrV4::new(dst, dport),
        l4_off,
        payload_off: l4_off + hdr,
        payload_len,
        csum_partial: csum == ChecksumState::Partial,
        ip_options: hl > 20,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdp::demux::Delivery;
    use crate::xdp::tx::{HDRS, build_frame};

    fn frame(payload: &[u8]) -> Vec<u8> {
        frame_from(Ipv4Addr::new(198, 18, 0, 1), payload)
    }

    fn frame_from(src: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; HDRS + payload.len()];
        let dst = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 7);
        let n = build_frame(
            &mut f,
            ([2; 6], [4; 6]),
            SocketAddrV4::new(src, 9),
            dst,
            payload,
            1,
        );
        f.truncate(n);
        f
    }

    /// Insert `opts` (a multiple of 4 bytes) as IPv4 options.
    fn with_options(f: &[u8], opts: &[u8]) -> Vec<u8> {
        let mut g = f[..34].to_vec();
        g.extend_from_slice(opts);
        g.extend_from_slice(&f[34..]);
        let hl = 20 + opts.len();
        g[14] = 0x40 | (hl / 4) as u8;
        let total = u16::from_be_bytes([g[16], g[17]]) as usize + opts.len();
        g[16..18].copy_from_slice(&(total as u16).to_be_bytes());
        g[24] = 0;
        g[25] = 0;
        let c = checksum::checksum(&g[14..14 + hl]);
        g[24..26].copy_from_slice(&c.to_be_bytes());
        g
    }

    #[test]
    fn built_frames_parse_back() {
        let f = frame(b"hello");
        let c = classify(&f).unwrap();
        assert_eq!(c.src, "198.18.0.1:9".parse().unwrap());
        assert_eq!(c.dst, "198.18.0.2:7".parse().unwrap());
        assert_eq!(&f[c.payload_off..c.payload_off + c.payload_len], b"hello");
        assert!(!c.csum_partial, "we send full checksums");
        assert!(!c.ip_options);
    }

    #[test]
    fn ip_options_are_delivered_like_the_kernel() {
        let f = frame(b"opts");
        // NOP NOP + a router alert (type 148, length 4).
        let g = with_options(&f, &[1, 1, 148, 4, 0, 0, 0, 0]);
        let c = classify(&g).unwrap();
        assert!(c.ip_options);
        assert_eq!(&g[c.payload_off..c.payload_off + c.payload_len], b"opts");
        // A malformed option (length 1) is dropped under ip_options.
        let bad = with_options(&f, &[7, 1, 0, 0]);
        assert_eq!(
            classify(&bad).unwrap_err(),
            DropReason::Malformed(Malformed::IpOptions)
        );
    }

    #[test]
    fn martian_sources_are_dropped() {
        for src in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::new(0, 1, 2, 3),
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(224, 0, 0, 1),
            Ipv4Addr::new(239, 1, 1, 1),
            Ipv4Addr::LOCALHOST,
        ] {
            let f = frame_from(src, b"x");
            assert_eq!(classify(&f).unwrap_err(), DropReason::Martian, "{src}");
            assert_eq!(DropReason::Martian.counter(), E::DropMartian);
        }
    }

    #[test]
    fn frames_for_another_mac_are_other_host() {
        // build_frame(.., macs ([2; 6], [4; 6]), ..)
        let f = frame(b"x");
        assert!(!for_other_host(&f, &[4; 6]));
        assert!(for_other_host(&f, &[5; 6]));
        let mut b = f.clone();
        b[..6].copy_from_slice(&[0xff; 6]);
        assert!(!for_other_host(&b, &[5; 6]), "broadcast");
        b[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0, 0, 1]);
        assert!(!for_other_host(&b, &[5; 6]), "multicast");
        assert!(
            !for_other_host(&f[..10], &[5; 6]),
            "too short: classify counts it"
        );
        assert_eq!(DropReason::OtherHost.counter(), E::DropOtherHost);
    }

    #[test]
    fn fragments_are_not_ours() {
        let mut f = frame(b"frag");
        f[20] = 0x20; // MF
        f[24] = 0;
        f[25] = 0;
        let c = checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        assert_eq!(
            classify(&f).unwrap_err(),
            DropReason::Malformed(Malformed::Fragment)
        );
    }

    /// xorshift from `seed`: deterministic pseudo-random mutations.
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// A valid frame without and with IPv4 options, to mutate.
    fn frames_to_mutate() -> [Vec<u8>; 2] {
        let base = frame(&[0x55; 40]);
        let opts = with_options(&base, &[1, 1, 148, 4, 0, 0, 0, 0]);
        [base, opts]
    }

    #[test]
    fn the_one_pass_header_check_agrees_with_the_checks_one_by_one() {
        let mut next = xorshift(0x2545f4914f6cdd1d);
        let [base, opts] = frames_to_mutate();
        let (mut plain, mut other) = (0, 0);
        for _ in 0..20000 {
            for b in [&base, &opts] {
                let mut f = b.clone();
                for _ in 0..(next() % 4) {
                    let i = ETH_HDR + (next() as usize) % 24;
                    f[i] ^= 1 << (next() % 8);
                }
                let ip = &mut f[ETH_HDR..];
                if next().is_multiple_of(2) && ip[0] >> 4 == 4 {
                    // A right checksum over whatever the header says it is.
                    let hl = (usize::from(ip[0] & 0xf) * 4).clamp(20, 28);
                    ip[10..12].fill(0);
                    let c = checksum::checksum(&ip[..hl]);
                    ip[10..12].copy_from_slice(&c.to_be_bytes());
                }
                let Ok(ip) = Ipv4Packet::new_checked(&f[ETH_HDR..]) else {
                    continue;
                };
                let each = ip_header_checks_each(&ip).and_then(|(s, d)| {
                    if is_martian_source(s) {
                        Err(DropReason::Martian)
                    } else {
                        Ok((s, d))
                    }
                });
                assert_eq!(ip_header_checks(&ip), each, "{f:?}");
                match ip.plain_addrs() {
                    Some(_) => plain += 1,
                    None => other += 1,
                }
            }
        }
        assert!(plain > 1000 && other > 1000, "{plain} {other}");
    }

    #[test]
    fn garbage_never_panics() {
        let mut next = xorshift(0x9e3779b97f4a7c15);
        let [base, opts] = frames_to_mutate();
        for _ in 0..20000 {
            for b in [&base, &opts] {
                let mut f = b.clone();
                for _ in 0..(next() % 6) {
                    let i = (next() as usize) % f.len();
                    f[i] = next() as u8;
                }
                let cut = (next() as usize) % (f.len() + 1);
                let _ = classify(&f[..cut]);
                if let Ok(c) = classify(&f) {
                    assert!(c.payload_off + c.payload_len <= f.len());
                }
            }
        }
        for n in 0..HDRS + 4 {
            assert!(classify(&base[..n]).is_err());
        }
    }

    /// A TSO/GSO super-segment as generic XDP hands it over: one 64 KiB TCP
    /// segment, its checksum full, partial (the sender's TX offload) or bad.
    fn super_segment(csum: &str) -> Vec<u8> {
        let (src, dst) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let payload = 65535 - 20 - 20;
        let mut f = vec![0u8; ETH_HDR + 20 + 20 + payload];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        nanowire_wire::Ipv4Repr {
            src,
            dst,
            protocol: PROTO_TCP,
            payload_len: 20 + payload,
            ttl: 64,
            ident: 1,
        }
        .emit(&mut f[ETH_HDR..]);
        let seg = &mut f[ETH_HDR + 20..];
        seg[0..2].copy_from_slice(&40000u16.to_be_bytes());
        seg[2..4].copy_from_slice(&80u16.to_be_bytes());
        seg[12] = 5 << 4;
        seg[13] = 0x10;
        for (i, b) in seg[20..].iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let pseudo = checksum::pseudo_header(src, dst, PROTO_TCP, seg.len() as u16);
        let c = match csum {
            "full" => !checksum::fold(checksum::accumulate(pseudo, seg)),
            "partial" => checksum::fold(pseudo),
            _ => 0x1234,
        };
        seg[16..18].copy_from_slice(&c.to_be_bytes());
        f
    }

    #[test]
    fn a_64_kib_super_segment_is_classified_like_any_segment() {
        let f = super_segment("full");
        let c = classify(&f).unwrap();
        assert_eq!(c.proto, PROTO_TCP);
        assert_eq!(c.payload_len, 65535 - 40);
        assert_eq!(c.payload_off + c.payload_len, f.len());
        assert!(!c.csum_partial);
        let p = classify(&super_segment("partial")).unwrap();
        assert!(
            p.csum_partial,
            "TX offload of a local sender: accepted, flagged"
        );
        assert_eq!(
            classify(&super_segment("bad")),
            Err(DropReason::Malformed(Malformed::BadTcpChecksum)),
            "a bad checksum over 64 KiB is a counted drop"
        );
        let mut flipped = super_segment("full");
        let n = flipped.len();
        flipped[n - 1000] ^= 4;
        assert_eq!(
            classify(&flipped),
            Err(DropReason::Malformed(Malformed::BadTcpChecksum))
        );
        assert_eq!(
            DropReason::Malformed(Malformed::BadTcpChecksum).counter(),
            E::DropBadTcpChecksum,
            "a TCP checksum failure is counted as one, not as UDP's"
        );
    }

    /// `f` in the pieces a copy-mode chain has (1792 bytes each; with an
    /// odd-length piece early on), or with the first piece only `first`
    /// bytes long.
    fn chained(f: &[u8], first: usize) -> RxFrame {
        let mut cuts = vec![0, first, first + 1];
        while *cuts.last().unwrap() + 1792 < f.len() {
            cuts.push(cuts.last().unwrap() + 1792);
        }
        cuts.push(f.len());
        let pieces: Vec<&[u8]> = cuts.windows(2).map(|w| &f[w[0]..w[1]]).collect();
        RxFrame::from_pieces(&pieces).unwrap()
    }

    #[test]
    fn a_chained_super_segment_is_classified_in_place_like_a_gathered_one() {
        for csum in ["full", "partial"] {
            let f = super_segment(csum);
            let want = classify(&f).unwrap();
            let c = chained(&f, 1792);
            assert!(c.frames() > 30);
            assert_eq!(classify_frame(&c), Ok(want), "{csum}");
            // Headers split across buffers: gathered, same verdict.
            assert_eq!(classify_frame(&chained(&f, 40)), Ok(want), "{csum}");
            // The segment, without gathering: header piece + the rest.
            let d = Delivery::new(&want, c, 0);
            let mut rest: [&[u8]; MAX_PIECES] = [&[]; MAX_PIECES];
            let (head, n) = d.segment_parts(&mut rest);
            assert!(n > 30);
            let mut seg = head.to_vec();
            rest[..n].iter().for_each(|p| seg.extend_from_slice(p));
            assert_eq!(seg, &f[want.l4_off..]);
        }
        assert_eq!(
            classify_frame(&chained(&super_segment("bad"), 1792)),
            Err(DropReason::Malformed(Malformed::BadTcpChecksum))
        );
        let mut flipped = super_segment("full");
        let n = flipped.len();
        flipped[n - 1000] ^= 4;
        assert_eq!(
            classify_frame(&chained(&flipped, 1792)),
            Err(DropReason::Malformed(Malformed::BadTcpChecksum)),
            "a flipped byte in a later buffer"
        );
        flipped[n - 1000] ^= 4;
        flipped[1793] ^= 4;
        assert_eq!(
            classify_frame(&chained(&flipped, 1792)),
            Err(DropReason::Malformed(Malformed::BadTcpChecksum)),
            "a flipped byte behind the odd-length buffer"
        );
    }
}
