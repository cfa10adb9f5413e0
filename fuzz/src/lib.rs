//! Fuzz targets: each takes arbitrary bytes and must never panic, hang or
//! break a round-trip property. The same functions are driven three ways:
//!
//! * `make fuzz` builds `src/bin/nanowire-fuzz.rs` with libFuzzer and
//!   sanitizer coverage (stable Rust: `-Cpasses=sancov-module` and LLVM
//!   coverage options, no `-Z` flag) and runs every target for
//!   `FUZZ_SECONDS`; a crash is copied into `regressions/<target>/`.
//! * `cargo test -p nanowire-fuzz` (so `make test`) replays every input in
//!   `regressions/<target>/` and runs a short, deterministic mutation smoke
//!   of each target from its seeds.
//!
//! Targets: the wire parsers, the engine's frame classifier (`classify`),
//! TCP segment input (`tcp`) and the whole TCP stack (`tcp_stack`).
#![forbid(unsafe_code)]

use nanowire_wire::pcapng::{PcapngWriter, read_packets};
use nanowire_wire::sockperf::server_action;
use nanowire_wire::tcp::{TcpRepr, TcpSegment};
use nanowire_wire::udp::ChecksumState;
use nanowire_wire::{
    EtherType, EthernetFrame, Ipv4Packet, Ipv4Repr, SockperfHeader, UdpDatagram, UdpRepr,
};

/// A fuzz target: name, entry point, seed inputs.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target `make fuzz` runs. Add new ones here (and nowhere else).
pub const TARGETS: &[Target] = &[
    Target {
        name: "ethernet",
        run: ethernet,
        seeds: frame_seeds,
    },
    Target {
        name: "ipv4",
        run: ipv4,
        seeds: ip_seeds,
    },
    Target {
        name: "udp",
        run: udp,
        seeds: udp_seeds,
    },
    Target {
        name: "sockperf",
        run: sockperf,
        seeds: sockperf_seeds,
    },
    Target {
        name: "pcapng",
        run: pcapng,
        seeds: pcapng_seeds,
    },
    Target {
        name: "frame",
        run: frame,
        seeds: frame_seeds,
    },
    Target {
        name: "classify",
        run: classify,
        seeds: frame_seeds,
    },
    Target {
        name: "tcp",
        run: tcp,
        seeds: tcp_seeds,
    },
    Target {
        name: "tcp_stack",
        run: tcp_stack,
        seeds: tcp_stack_seeds,
    },
    Target {
        name: "reasm",
        run: reasm,
        seeds: reasm_seeds,
    },
    Target {
        name: "sockabi_iov",
        run: sockabi_iov,
        seeds: sockabi_iov_seeds,
    },
    Target {
        name: "sockabi_msg",
        run: sockabi_msg,
        seeds: sockabi_msg_seeds,
    },
];

/// The shim's iovec checks (`nanowire_sockabi::iov`): bytes as an array
/// of (base, len) pairs. Never panics; an accepted array's total is the
/// clamped sum; a scatter never writes past a segment or the data; the
/// gather chunks cover exactly the clamped data, each at most a chunk.
pub fn sockabi_iov(data: &[u8]) {
    use nanowire_sockabi::iov::{self, Call, MAX_RW_COUNT, Seg};
    use nanowire_sockabi::space::UserSpace;
    let segs: Vec<Seg> = data
        .chunks_exact(16)
        .map(|c| Seg {
            base: u64::from_le_bytes(c[..8].try_into().unwrap()) as usize,
            len: u64::from_le_bytes(c[8..].try_into().unwrap()) as usize,
        })
        .collect();
    let _ = iov::check_count(segs.len(), Call::Msg);
    let sp = UserSpace::X86_64_4LEVEL;
    if let Ok(total) = iov::import(segs.iter().copied(), &sp) {
        assert!(total <= MAX_RW_COUNT);
        let lens: Vec<usize> = iov::clamped_lens(&segs).collect();
        assert_eq!(lens.iter().sum::<usize>(), total);
        let n = data.first().map_or(0, |&b| (b as usize) << 4).min(total);
        let mut got = 0;
        for p in iov::scatter(lens.iter().copied(), n) {
            assert!(p.len <= lens[p.seg] && p.len > 0);
            assert_eq!(p.src_off, got);
            got += p.len;
        }
        assert_eq!(got, n);
        let small: Vec<Seg> = segs
            .iter()
            .map(|s| Seg {
                base: s.base,
                len: s.len % 4096,
            })
            .collect();
        let mut g = iov::gather_chunks(&small, 1000);
        let mut out = Vec::new();
        let mut sum = 0;
        loop {
            let k = g.next_chunk(&mut out);
            if k == 0 {
                break;
            }
            assert!(k <= 1000);
            sum += k;
        }
        assert_eq!(sum, small.iter().map(|s| s.len).sum::<usize>());
    }
}

/// The shim's sockaddr, cmsg, /proc/self/maps and /proc/net socket-table
/// parsers: never panic; what `put` writes, `walk` reads back; a cached
/// range is one `covering` returned.
pub fn sockabi_msg(data: &[u8]) {
    use nanowire_sockabi::space::{Access, Maps, RangeCache};
    use nanowire_sockabi::{addr, cmsg, procnet};
    let _ = (procnet::table(data).count(), procnet::addr(data));
    let _ = addr::udp_dest(data);
    if let Ok(a) = addr::inet_addr(data) {
        assert_eq!(addr::inet_addr(&addr::encode_inet(a)), Ok(a));
    }
    let _ = addr::writeback(data.len() as u32, 16);
    for m in cmsg::walk(data).flatten() {
        assert!(m.data.len() <= data.len());
    }
    let mut buf = vec![0u8; data.len() % 97];
    let p = cmsg::put(&mut buf, 0, 1, 2, data);
    assert!(p.used <= buf.len());
    if !p.truncated {
        let m = cmsg::walk(&buf[..p.used]).next().unwrap().unwrap();
        assert_eq!(m.data, data);
    }
    let maps = Maps(data);
    let _ = maps.vmas().count();
    let base = data.len() * 4096;
    for a in [Access::Read, Access::Write] {
        if let Some((s, e)) = maps.covering(base, 100, a) {
            assert!(s <= base && base + 100 <= e);
            let mut c = RangeCache::new();
            c.insert(1, s, e, a);
            assert!(c.hit(1, base, 100, a));
        }
    }
}

fn sockabi_iov_seeds() -> Vec<Vec<u8>> {
    let pair = |b: u64, l: u64| [b.to_le_bytes(), l.to_le_bytes()].concat();
    vec![
        pair(0x1000, 100),
        [pair(0x1000, 3), pair(0, 0), pair(0x2000, 1 << 40)].concat(),
        pair(u64::MAX - 5, 10),
        pair(0x1000, u64::MAX),
    ]
}

fn sockabi_msg_seeds() -> Vec<Vec<u8>> {
    let mut c = vec![0u8; 32];
    nanowire_sockabi::cmsg::put(&mut c, 0, 0, 8, &[1, 2, 3, 4]);
    vec![
        nanowire_sockabi::addr::encode_inet("198.18.0.2:9".parse().unwrap()).to_vec(),
        c,
        b"00001000-00003000 rw-p 00000000 00:00 0  [heap]\n00003000-00005000 r--p 0 0 0\n".to_vec(),
        b"  sl local rem st\n 1: 020012C6:1F90 00000000:0000 0A 0:0 0:0 0 0 0 597 1\n".to_vec(),
    ]
}

/// The engine's frame classifier (`nanowire_stack::xdp::classify`): never
/// panics; what it accepts has in-bounds offsets, a non-martian source, a
/// UDP or TCP protocol, and agrees with the wire parsers.
pub fn classify(data: &[u8]) {
    use nanowire_stack::xdp::classify::{PROTO_TCP, PROTO_UDP, classify, is_martian_source};
    let Ok(c) = classify(data) else {
        return;
    };
    assert!(c.proto == PROTO_UDP || c.proto == PROTO_TCP, "{c:?}");
    assert!(c.l4_off >= 34 && c.l4_off <= c.payload_off, "{c:?}");
    assert!(c.payload_off + c.payload_len <= data.len(), "{c:?}");
    assert!(!is_martian_source(*c.src.ip()), "{c:?}");
    let ip = Ipv4Packet::new_checked(&data[14..]).expect("accepted frames parse");
    assert_eq!(*c.src.ip(), ip.src());
    assert_eq!(*c.dst.ip(), ip.dst());
    assert_eq!(c.ip_options, ip.header_len() > 20);
    assert!(!ip.is_fragment());
    assert!(ip.verify_checksum());
    if c.proto == PROTO_UDP {
        let u = UdpDatagram::new_checked(ip.payload()).expect("accepted datagrams parse");
        assert_eq!(c.src.port(), u.src_port());
        assert_eq!(c.dst.port(), u.dst_port());
        assert_eq!(c.payload_len, u.payload().len());
    } else {
        let t = TcpSegment::new_checked(ip.payload()).expect("accepted segments parse");
        assert_eq!(c.src.port(), t.src_port());
        assert_eq!(c.dst.port(), t.dst_port());
        assert_eq!(c.payload_len, t.payload().len());
        let state = t.checksum_state(ip.src(), ip.dst());
        assert_ne!(state, ChecksumState::Bad, "{c:?}");
        assert_eq!(c.csum_partial, state == ChecksumState::Partial, "{c:?}");
    }
}

/// The engine's IPv4 reassembly (`nanowire_stack::xdp::reasm`), fed a
/// sequence of frames: each is a 2-byte length, a 1-byte clock step (in
/// seconds/8) and the frame. Never panics; the bounds hold after every
/// frame; every frame is counted exactly once (merged, dropped, or still
/// held); a completed datagram is an unfragmented IPv4 packet with a valid
/// header checksum and a total length that fits the frame exactly.
pub fn reasm(mut data: &[u8]) {
    use nanowire_stack::xdp::reasm::{MAX_BYTES, MAX_DATAGRAMS, Reassembly};
    let mut r = Reassembly::new();
    let (mut now, mut pushed, mut counted) = (0u64, 0u64, 0u64);
    while data.len() >= 3 {
        let len = usize::from(u16::from_be_bytes([data[0], data[1]])).min(data.len() - 3);
        now += u64::from(data[2]) * 125_000_000;
        let frame = &data[3..3 + len];
        data = &data[3 + len..];
        let whole = r.push(frame, now);
        pushed += 1;
        let t = r.take_tally();
        counted += t.merged + t.timeout + t.overlap + t.too_many + t.malformed;
        assert!(r.datagrams() <= MAX_DATAGRAMS);
        assert!(r.held_bytes() <= MAX_BYTES);
        assert_eq!(pushed, counted + r.held_frames());
        if let Some(w) = whole {
            let ip = Ipv4Packet::new_checked(&w[14..]).expect("a reassembled datagram parses");
            assert!(ip.verify_checksum());
            assert!(!ip.is_fragment());
            assert_eq!(usize::from(ip.total_len()), w.len() - 14);
        }
    }
}

/// Fragments of a few datagrams, in and out of order, as `reasm` input.
fn reasm_seeds() -> Vec<Vec<u8>> {
    let frag = |id: u16, off: usize, more: bool, n: usize| -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20];
        f[12] = 0x08;
        nanowire_wire::Ipv4Repr {
            src: [198, 18, 0, 1].into(),
            dst: [198, 18, 0, 2].into(),
            protocol: 6,
            payload_len: n,
            ttl: 64,
            ident: id,
        }
        .emit_fragment(&mut f[14..], off, more);
        f.extend((0..n).map(|i| (off + i) as u8));
        f
    };
    let rec = |frames: &[Vec<u8>], step: u8| -> Vec<u8> {
        let mut v = Vec::new();
        for f in frames {
            v.extend_from_slice(&(f.len() as u16).to_be_bytes());
            v.push(step);
            v.extend_from_slice(f);
        }
        v
    };
    vec![
        rec(
            &[
                frag(1, 0, true, 800),
                frag(1, 800, true, 800),
                frag(1, 1600, false, 100),
            ],
            0,
        ),
        rec(
            &[
                frag(2, 1600, false, 64),
                frag(2, 0, true, 800),
                frag(2, 800, true, 800),
            ],
            1,
        ),
        rec(
            &[
                frag(3, 0, true, 800),
                frag(3, 400, true, 800),
                frag(4, 0, true, 16),
            ],
            0,
        ),
        rec(&[frag(5, 0, true, 800), frag(5, 800, false, 8)], 255),
    ]
}

pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Ethernet view: accessors never panic once `new_checked` said yes; a
/// frame rewritten with its own fields reads back the same.
pub fn ethernet(data: &[u8]) {
    let Ok(f) = EthernetFrame::new_checked(data) else {
        return;
    };
    let (d, s, t, p) = (f.dst(), f.src(), f.ethertype(), f.payload().len());
    let _ = d.is_multicast();
    assert_eq!(p + 14, data.len());
    let mut buf = data.to_vec();
    let mut g = EthernetFrame::new_checked(&mut buf[..]).expect("same bytes");
    g.set_dst(d);
    g.set_src(s);
    g.set_ethertype(t);
    assert_eq!(&buf[..], data, "ethernet rewrite changed bytes");
}

/// IPv4: parse with and without checksum verification; what parses emits
/// a header that parses back to the same representation.
pub fn ipv4(data: &[u8]) {
    let Ok(p) = Ipv4Packet::new_checked(data) else {
        return;
    };
    let _ = (
        p.dscp_ecn(),
        p.more_fragments(),
        p.dont_fragment(),
        p.frag_offset(),
    );
    let _ = (p.header_checksum(), p.verify_checksum());
    assert!(p.payload().len() + p.header_len() <= data.len());
    let lax = Ipv4Repr::parse(&p, false);
    if let Ok(strict) = Ipv4Repr::parse(&p, true) {
        assert_eq!(Ok(strict), lax, "strict parse implies lax parse");
    }
    if let Ok(r) = lax {
        let mut buf = vec![0u8; 20 + r.payload_len];
        r.emit(&mut buf);
        let q = Ipv4Packet::new_checked(&buf[..]).expect("emitted header is valid");
        assert_eq!(
            Ipv4Repr::parse(&q, true),
            Ok(r),
            "ipv4 emit/parse round trip"
        );
    }
}

/// UDP: the view and the checksum classifier never panic; a datagram we
/// emit verifies as Valid.
pub fn udp(data: &[u8]) {
    let Ok(u) = UdpDatagram::new_checked(data) else {
        return;
    };
    let (sp, dp) = (u.src_port(), u.dst_port());
    let _ = (u.is_empty(), u.checksum());
    let payload = u.payload().to_vec();
    assert!(payload.len() + 8 <= data.len());
    let (s, d) = ([198, 18, 0, 1].into(), [198, 18, 0, 2].into());
    let _ = u.checksum_state(s, d);
    let mut buf = vec![0u8; 8 + payload.len()];
    buf[8..].copy_from_slice(&payload);
    UdpRepr {
        src_port: sp,
        dst_port: dp,
    }
    .emit(&mut buf, payload.len(), s, d);
    let v = UdpDatagram::new_checked(&buf[..]).expect("emitted datagram is valid");
    assert_eq!(v.checksum_state(s, d), ChecksumState::Valid);
    assert_eq!(v.payload(), &payload[..]);
}

/// sockperf header and the server's decision; a reply is never a request.
pub fn sockperf(data: &[u8]) {
    let max = data.first().map_or(0, |&b| usize::from(b) << 4);
    let _ = server_action(data, max);
    let _ = server_action(data, 65536);
    let Ok(h) = SockperfHeader::new_checked(data) else {
        return;
    };
    let _ = (
        h.seq(),
        h.flags(),
        h.length(),
        h.is_warmup(),
        h.is_pong_request(),
    );
    let mut buf = data.to_vec();
    let mut h = SockperfHeader::new_checked(&mut buf[..]).expect("same bytes");
    h.make_reply();
    assert!(
        !h.is_client(),
        "a reply must not look like a client message"
    );
}

/// pcapng reader: malformed input is an error, never a panic; what the
/// writer writes reads back.
pub fn pcapng(data: &[u8]) {
    let _ = read_packets(data);
    // Round trip: split the input into a few frames and write them.
    let mut w = PcapngWriter::new(Vec::new(), "fuzz", 256).expect("vec write");
    let i = w.add_interface("fuzz0").expect("vec write");
    let frames: Vec<&[u8]> = data.chunks(97).take(8).collect();
    for (n, f) in frames.iter().enumerate() {
        let comment = (n % 2 == 0).then_some("c");
        w.write_packet(i, n as u64 * 1_000_000_007, f, f.len(), comment)
            .expect("vec write");
    }
    let back = read_packets(&w.into_inner()).expect("own output parses");
    assert_eq!(back.len(), frames.len());
    for (b, f) in back.iter().zip(&frames) {
        assert_eq!(&b.data[..], *f);
    }
}

/// A whole frame the way the receive path walks it: Ethernet, (one VLAN
/// tag skipped), IPv4, UDP, sockperf.
pub fn frame(data: &[u8]) {
    let Ok(eth) = EthernetFrame::new_checked(data) else {
        return;
    };
    let mut l3 = eth.payload();
    let mut et = eth.ethertype();
    if u16::from(et) == 0x8100 && l3.len() >= 4 {
        et = EtherType::from(u16::from_be_bytes([l3[2], l3[3]]));
        l3 = &l3[4..];
    }
    if et != EtherType::Ipv4 {
        return;
    }
    let Ok(ip) = Ipv4Packet::new_checked(l3) else {
        return;
    };
    let Ok(r) = Ipv4Repr::parse(&ip, true) else {
        return;
    };
    if r.protocol != 17 {
        return;
    }
    let Ok(u) = UdpDatagram::new_checked(ip.payload()) else {
        return;
    };
    let _ = u.checksum_state(r.src, r.dst);
    let _ = server_action(u.payload(), 65507);
}

/// TCP segment view: accessors and the checksum classifier never panic;
/// what parses emits a segment that parses back to the same header and
/// verifies as Valid.
pub fn tcp(data: &[u8]) {
    let Ok(s) = TcpSegment::new_checked(data) else {
        return;
    };
    let (sa, da) = ([198, 18, 0, 1].into(), [198, 18, 0, 2].into());
    let _ = (s.urgent(), s.checksum(), s.seq_len(), s.options().len());
    let _ = s.checksum_state(sa, da);
    let Ok(mut r) = TcpRepr::parse(&s) else {
        return;
    };
    r.sack_len = r.sack_len.min(r.max_sack_blocks() as u8);
    if r.header_len() > nanowire_wire::tcp::MAX_HEADER_LEN {
        return;
    }
    let payload = s.payload();
    let mut buf = vec![0u8; r.header_len() + payload.len()];
    buf[r.header_len()..].copy_from_slice(payload);
    let n = r.emit(&mut buf, payload.len(), sa, da);
    let t = TcpSegment::new_checked(&buf[..n]).expect("emitted segment is valid");
    assert_eq!(t.checksum_state(sa, da), ChecksumState::Valid);
    assert_eq!(t.payload(), payload);
    // Only the first `sack_len` SACK blocks are meaningful (a segment with
    // two SACK options leaves the first one's extra blocks behind).
    let norm = |mut r: TcpRepr| {
        for b in r.sack.iter_mut().skip(usize::from(r.sack_len)) {
            *b = (0, 0);
        }
        r
    };
    assert_eq!(
        TcpRepr::parse(&t).map(norm),
        Ok(norm(r)),
        "tcp emit/parse round trip"
    );
}

/// The whole TCP: an established connection, then the input as a series of
/// segments (`[len][bytes]...`) from the peer's address, with time moving.
/// Nothing may panic, and transmit/timer polling must terminate.
pub fn tcp_stack(data: &[u8]) {
    use nanowire_tcp::{Config, Secret, TcpStack};
    use std::net::{Ipv4Addr, SocketAddrV4};
    let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let cfg = Config {
        sndbuf: 8192,
        rcvbuf: 8192,
        ..Config::default()
    };
    let mut sa = TcpStack::new(cfg.clone(), Secret::from_bytes([1; 16]));
    let mut sb = TcpStack::new(cfg, Secret::from_bytes([2; 16]));
    let l = sa.listen(SocketAddrV4::new(a, 80), 4).expect("listen");
    let mut now = 1_000_000_000u64;
    let cb = sb
        .connect(now, SocketAddrV4::new(b, 4000), SocketAddrV4::new(a, 80))
        .expect("connect");
    let mut buf = vec![0u8; 9000];
    for _ in 0..4 {
        while let Some(t) = sb.poll_transmit(now, &mut buf) {
            sa.input(now, t.src, t.dst, &buf[..t.len]);
        }
        while let Some(t) = sa.poll_transmit(now, &mut buf) {
            sb.input(now, t.src, t.dst, &buf[..t.len]);
        }
    }
    let ca = sa.accept(l).expect("handshake completes");
    let _ = sa.send(ca, b"some data from a");
    let _ = sb.send(cb, b"and from b");
    let mut rest = data;
    let mut steps = 0;
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        let (seg, tail) = tail.split_at(n);
        rest = tail;
        // Half the segments get a valid checksum so they reach the state machine.
        let mut seg = seg.to_vec();
        if len & 1 == 0 && seg.len() >= 20 {
            seg[16] = 0;
            seg[17] = 0;
            let sum = nanowire_wire::checksum::pseudo_header(b, a, 6, seg.len() as u16);
            let c = !nanowire_wire::checksum::fold(nanowire_wire::checksum::accumulate(sum, &seg));
            seg[16..18].copy_from_slice(&c.to_be_bytes());
        }
        sa.input(now, b, a, &seg);
        let mut out = 0;
        while sa.poll_transmit(now, &mut buf).is_some() {
            out += 1;
            assert!(out < 10_000, "transmit loop does not end");
        }
        now += u64::from(len) * 7_000_000;
        sa.poll_timers(now);
        let _ = sa.recv(ca, &mut buf);
        let _ = sa.info(ca);
        steps += 1;
        if steps > 4096 {
            break;
        }
    }
}

fn tcp_seeds() -> Vec<Vec<u8>> {
    let r = TcpRepr {
        src_port: 4000,
        dst_port: 80,
        seq: 1,
        ack: 2,
        flags: nanowire_wire::tcp::Flags(0x12),
        window: 100,
        mss: Some(1460),
        window_scale: Some(7),
        sack_permitted: true,
        timestamp: Some((5, 6)),
        ..TcpRepr::default()
    };
    let mut b = vec![0u8; r.header_len() + 3];
    let n = r.emit(&mut b, 3, [198, 18, 0, 1].into(), [198, 18, 0, 2].into());
    b.truncate(n);
    vec![b, vec![0; 20]]
}

fn tcp_stack_seeds() -> Vec<Vec<u8>> {
    let mut v = tcp_seeds();
    let s = v.remove(0);
    let mut framed = vec![s.len() as u8];
    framed.extend_from_slice(&s);
    framed.push(20);
    framed.extend_from_slice(&[
        0x0f, 0xa0, 0, 80, 0, 0, 0, 9, 0, 0, 0, 0, 0x50, 0x04, 0, 0, 0, 0, 0, 0,
    ]);
    vec![framed, vec![]]
}

fn valid_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8 + payload.len()];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let (s, d) = ([198, 18, 0, 1].into(), [198, 18, 0, 2].into());
    Ipv4Repr {
        src: s,
        dst: d,
        protocol: 17,
        payload_len: 8 + payload.len(),
        ttl: 64,
        ident: 1,
    }
    .emit(&mut f[14..34]);
    f[42..].copy_from_slice(payload);
    UdpRepr {
        src_port: 40000,
        dst_port: 11111,
    }
    .emit(&mut f[34..], payload.len(), s, d);
    f
}

fn sockperf_msg(flags: u16) -> Vec<u8> {
    let mut m = vec![0u8; 64];
    SockperfHeader::new_unchecked(&mut m[..]).fill_request(7, flags);
    m
}

fn sockperf_seeds() -> Vec<Vec<u8>> {
    vec![sockperf_msg(0), sockperf_msg(2), vec![0; 14], vec![]]
}

fn frame_seeds() -> Vec<Vec<u8>> {
    let mut v = vec![valid_frame(&sockperf_msg(2)), valid_frame(b"")];
    let mut vlan = valid_frame(&sockperf_msg(2));
    vlan.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    v.push(vlan);
    v.push(vec![0xff; 14]);
    v
}

fn ip_seeds() -> Vec<Vec<u8>> {
    frame_seeds()
        .into_iter()
        .filter(|f| f.len() > 14)
        .map(|f| f[14..].to_vec())
        .collect()
}

fn udp_seeds() -> Vec<Vec<u8>> {
    vec![
        valid_frame(&sockperf_msg(2))[34..].to_vec(),
        vec![0, 1, 0, 2, 0, 8, 0, 0],
    ]
}

fn pcapng_seeds() -> Vec<Vec<u8>> {
    let mut w = PcapngWriter::new(Vec::new(), "seed", 65535).expect("vec write");
    let i = w.add_interface("seed0").expect("vec write");
    w.write_packet(i, 1, &valid_frame(b"x"), 43, Some("rx"))
        .expect("vec write");
    vec![w.into_inner(), vec![]]
}

/// A small deterministic PRNG for the smoke (xorshift64*).
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Mutate `input` a little: flip, set, insert, delete, truncate, splice
/// interesting values (0, 0xff, lengths). Deterministic for one `rng`.
pub fn mutate(input: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = [0, 0xff, 0x7f, 0x80, 5, 0x45, 0x46, 17][rng.below(8)];
            }
            2 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next_u64() as u8);
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            4 => {
                let n = rng.below(v.len() + 1);
                v.truncate(n);
            }
            5 if v.len() >= 2 => {
                let i = rng.below(v.len() - 1);
                let x = [0u16, 0xffff, 8, 20, 14, v.len() as u16][rng.below(6)];
                v[i..i + 2].copy_from_slice(&x.to_be_bytes());
            }
            _ => {
                let i = rng.below(v.len() + 1);
                v.splice(
                    i..i,
                    std::iter::repeat_n(rng.next_u64() as u8, rng.below(16)),
                );
            }
        }
    }
    v
}
