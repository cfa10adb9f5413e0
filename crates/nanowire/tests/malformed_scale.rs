//! Malformed traffic at scale (issue 12): more than 1,000,000 malformed
//! frames of every kind the engine knows, plus VLAN tags, martian sources
//! and non-first fragments, interleaved with valid datagrams, sent with
//! AF_PACKET (sendmmsg) from host a into an xdp `bench sink` on host b.
//! Every valid datagram is delivered in order, and the engine's counters
//! equal what was sent, kind by kind. Lab prefix `tm`.
//!
//! What the engine does with each kind is the table `KINDS` below: change an
//! `Expect` there when the engine's classification changes (IPv4 options
//! delivered like the kernel does, martian sources dropped under their own
//! reason, first fragments passed to the kernel).

use nanowire_lab::testbed::Host;
use nanowire_stack::kernel::send_each;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nanowire");
const PORT: u16 = 11270;
/// Malformed frames to send, at least.
const MALFORMED: u64 = 1_000_000;
/// Frames in flight (sent, not yet taken off the ring by the engine) at most.
const WINDOW: u64 = 32_768;
const RING: &str = "65536";

/// What the engine must do with a kind of frame.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Delivered to the socket (counted in rx_packets).
    Deliver,
    /// Dropped and counted under this counter.
    Drop(&'static str),
    /// Never reaches the engine: the XDP program passes it to the kernel.
    Pass,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Truncated,
    BadVersion,
    BadIhl,
    IpOptions,
    BadTotalLength,
    FirstFragment,
    LaterFragment,
    BadIpChecksum,
    BadUdpLength,
    BadUdpChecksum,
    Vlan,
    MartianLoopbackSource,
    MartianZeroSource,
}

/// The engine's classification, kind by kind (the engine of issue 12's
/// merge): IPv4 options are delivered like the kernel does, every fragment
/// is passed to the kernel by the XDP program (which reassembles them for
/// the socket's kernel twin), martian sources are dropped under their own
/// reason, VLAN-tagged frames go to the kernel.
const KINDS: &[(Kind, Expect)] = &[
    (Kind::Truncated, Expect::Drop("drop_truncated")),
    (Kind::BadVersion, Expect::Drop("drop_bad_version")),
    (Kind::BadIhl, Expect::Drop("drop_bad_ihl")),
    (Kind::IpOptions, Expect::Deliver),
    (Kind::BadTotalLength, Expect::Drop("drop_bad_total_length")),
    (Kind::FirstFragment, Expect::Pass),
    (Kind::LaterFragment, Expect::Pass),
    (Kind::BadIpChecksum, Expect::Drop("drop_bad_ip_checksum")),
    (Kind::BadUdpLength, Expect::Drop("drop_bad_udp_length")),
    (Kind::BadUdpChecksum, Expect::Drop("drop_bad_udp_checksum")),
    (Kind::Vlan, Expect::Pass),
    (Kind::MartianLoopbackSource, Expect::Drop("drop_martian")),
    (Kind::MartianZeroSource, Expect::Drop("drop_martian")),
];

fn csum(data: &[u8], init: u32) -> u16 {
    let mut s = init;
    for c in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The sink's datagram header (crates/bench/src/burst.rs `BurstHeader`):
/// magic, run, seq, total, tx_ns. Run 1 is counted; others are ignored.
fn burst_payload(run: u32, seq: u64, total: u64) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    nanowire_bench::burst::BurstHeader {
        run,
        seq,
        total,
        tx_ns: 0,
    }
    .write(&mut p);
    p
}

struct Macs {
    a: [u8; 6],
    b: [u8; 6],
}

/// A correct Ethernet/IPv4/UDP frame (full UDP checksum) with IP options
/// `opts`, source `src`, fragment field `frag`.
fn frame(m: &Macs, src: [u8; 4], opts: &[u8], frag: u16, payload: &[u8]) -> Vec<u8> {
    let hl = 20 + opts.len();
    let udp_len = (8 + payload.len()) as u16;
    let mut f = Vec::with_capacity(14 + hl + udp_len as usize);
    f.extend_from_slice(&m.b);
    f.extend_from_slice(&m.a);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (hl + udp_len as usize) as u16;
    let mut ip = vec![0x40 | (hl / 4) as u8, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0x12, 0x34]);
    ip.extend_from_slice(&frag.to_be_bytes());
    ip.extend_from_slice(&[64, 17, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&[198, 18, 0, 2]);
    ip.extend_from_slice(opts);
    let c = csum(&ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut udp = Vec::new();
    udp.extend_from_slice(&40000u16.to_be_bytes());
    udp.extend_from_slice(&PORT.to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut pseudo = 0u32;
    for w in [&src[..], &[198, 18, 0, 2][..]] {
        pseudo += u32::from(u16::from_be_bytes([w[0], w[1]]));
        pseudo += u32::from(u16::from_be_bytes([w[2], w[3]]));
    }
    pseudo += 17 + u32::from(udp_len);
    let mut c = csum(&udp, pseudo);
    if c == 0 {
        c = 0xffff;
    }
    udp[6..8].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&udp);
    f
}

fn fix_ip_csum(f: &mut [u8]) {
    let hl = usize::from(f[14] & 0xf) * 4;
    let hl = hl.clamp(20, f.len() - 14);
    f[24..26].copy_from_slice(&[0, 0]);
    let c = csum(&f[14..14 + hl], 0);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

fn make(kind: Kind, m: &Macs) -> Vec<u8> {
    // Payloads of malformed or delivered-but-foreign frames carry run 2: the
    // sink ignores them, so only run 1 (the valid stream) is sequenced.
    let pl = burst_payload(2, 0, 0);
    let src = [198, 18, 0, 1];
    match kind {
        Kind::Truncated => {
            // UDP header cut after 5 bytes, IP total length saying so.
            let mut t = frame(m, src, &[], 0, &pl);
            t.truncate(14 + 20 + 5);
            t[16..18].copy_from_slice(&25u16.to_be_bytes());
            fix_ip_csum(&mut t);
            t
        }
        Kind::BadVersion => {
            let mut f = frame(m, src, &[], 0, &pl);
            f[14] = 0x65;
            fix_ip_csum(&mut f);
            f
        }
        Kind::BadIhl => {
            let mut f = frame(m, src, &[], 0, &pl);
            f[14] = 0x43;
            f
        }
        Kind::IpOptions => frame(m, src, &[1, 1, 1, 0], 0, &pl),
        Kind::BadTotalLength => {
            let mut f = frame(m, src, &[], 0, &pl);
            f[16..18].copy_from_slice(&1400u16.to_be_bytes());
            fix_ip_csum(&mut f);
            f
        }
        Kind::FirstFragment => frame(m, src, &[], 0x2000, &pl),
        Kind::LaterFragment => frame(m, src, &[], 0x0010, &pl),
        Kind::BadIpChecksum => {
            let mut f = frame(m, src, &[], 0, &pl);
            f[24] ^= 0x5a;
            f
        }
        Kind::BadUdpLength => {
            let mut f = frame(m, src, &[], 0, &pl);
            f[38..40].copy_from_slice(&900u16.to_be_bytes());
            f
        }
        Kind::BadUdpChecksum => {
            let mut f = frame(m, src, &[], 0, &pl);
            f[40..42].copy_from_slice(&[0x12, 0x34]);
            f
        }
        Kind::Vlan => {
            let mut f = frame(m, src, &[], 0, &pl);
            f.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
            f
        }
        Kind::MartianLoopbackSource => frame(m, [127, 0, 0, 1], &[], 0, &pl),
        Kind::MartianZeroSource => frame(m, [0, 0, 0, 0], &[], 0, &pl),
    }
}

/// AF_PACKET socket on `iface`, sending with sendmmsg.
struct RawTx {
    fd: std::os::fd::OwnedFd,
    sll: libc::sockaddr_ll,
}

impl RawTx {
    fn open(iface: &str, dst: [u8; 6]) -> RawTx {
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let c = std::ffi::CString::new(iface).unwrap();
        // SAFETY: c is a valid NUL-terminated string.
        let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
        assert!(idx > 0, "no interface {iface}");
        // SAFETY: an all-zero sockaddr_ll is valid; fields are set below.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = idx as i32;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&dst);
        RawTx { fd, sll }
    }

    /// Send every frame (retrying on ENOBUFS/EAGAIN).
    fn send_all(&self, frames: &[&[u8]]) {
        let mut off = 0;
        while off < frames.len() {
            let chunk = &frames[off..frames.len().min(off + 64)];
            match send_each(self.fd.as_raw_fd(), chunk, Some(&self.sll), 0) {
                Ok((n, _)) => off += n,
                Err(e) => match e.raw_os_error() {
                    Some(libc::ENOBUFS) | Some(libc::EAGAIN) | Some(libc::EINTR) => {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    _ => panic!("sendmmsg: {e}"),
                },
            }
        }
    }
}

/// The engine counters of process `pid` from `nanowire stats --json`.
fn engine_counters(pid: u32) -> Option<serde_json::Value> {
    nanowire_testkit::engine_counters_of(BIN, pid)
}

#[test]
#[ignore = "needs root"]
fn a_million_malformed_frames_counted_kind_by_kind_valid_ones_in_order() {
    let lab = nanowire_testkit::lab("tm");
    let (a, b) = nanowire_testkit::lab_macs(&lab);
    let macs = Macs { a, b };
    let kinds = KINDS.len() as u64;
    let rounds = MALFORMED.div_ceil(kinds);
    let valid_total = rounds;

    let mut sink = nanowire_testkit::spawn_piped(&mut lab.command(
        Host::B,
        &[
            BIN,
            "bench",
            "sink",
            "-i",
            "198.18.0.2",
            "-p",
            &PORT.to_string(),
            "--engine",
            "xdp",
            "--ring-depth",
            RING,
            "--timeout",
            "120",
            "--idle-ms",
            "20000",
            "--json",
        ],
    ));
    let pid = sink.id();
    let err = sink.stderr.take().unwrap();
    let mut out = sink.stdout.take().unwrap();
    let mut err = BufReader::new(err);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "sink exited early");
        if line.starts_with("READY") {
            break;
        }
    }
    std::thread::spawn(move || for _ in err.lines() {});

    // The frames of one round: every kind once, then one valid datagram.
    let malformed: Vec<Vec<u8>> = KINDS.iter().map(|(k, _)| make(*k, &macs)).collect();
    let ifa = lab.iface(Host::A);
    let netns_a = format!("/run/netns/{}", lab.netns(Host::A));
    let sent = std::thread::spawn(move || {
        let f = std::fs::File::open(&netns_a).unwrap();
        // SAFETY: setns on a valid netns fd changes only this thread.
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        let tx = RawTx::open(&ifa, macs.b);
        let engine_seen = || -> u64 {
            engine_counters(pid)
                .expect("the sink's stats page")
                .get("rx_frames")
                .and_then(|v| v.as_u64())
                .expect("rx_frames counter")
        };
        let per_round_engine = KINDS.iter().filter(|(_, e)| *e != Expect::Pass).count() as u64 + 1;
        let mut engine_sent = 0u64;
        let mut seen = 0u64;
        let mut batch: Vec<Vec<u8>> = Vec::new();
        for r in 0..rounds {
            for f in &malformed {
                batch.push(f.clone());
            }
            batch.push(frame(
                &macs,
                [198, 18, 0, 1],
                &[],
                0,
                &burst_payload(1, r, valid_total),
            ));
            engine_sent += per_round_engine;
            if batch.len() >= 1024 || r + 1 == rounds {
                let refs: Vec<&[u8]> = batch.iter().map(|b| b.as_slice()).collect();
                tx.send_all(&refs);
                batch.clear();
                // Keep at most WINDOW frames between us and the engine
                // (its rx_frames, read only when the window may be full).
                if engine_sent > seen + WINDOW {
                    let t0 = Instant::now();
                    loop {
                        seen = engine_seen();
                        if engine_sent <= seen + WINDOW / 4 {
                            break;
                        }
                        assert!(
                            t0.elapsed() < Duration::from_secs(60),
                            "engine stopped taking frames: {:?}",
                            engine_counters(pid)
                        );
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            }
        }
        rounds * (kinds + 1)
    })
    .join()
    .expect("sender");
    eprintln!("sent {sent} frames");

    let mut s = String::new();
    std::io::Read::read_to_string(&mut out, &mut s).unwrap();
    drop(sink);
    let rep: serde_json::Value =
        serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("{e}: {s}"));
    // Every valid datagram, in order, once.
    assert_eq!(rep["engine"], "xdp", "{rep}");
    assert_eq!(rep["received"].as_u64(), Some(valid_total), "{rep}");
    assert_eq!(rep["missing"], 0, "{rep}");
    assert_eq!(rep["out_of_order"], 0, "{rep}");
    assert_eq!(rep["duplicates"], 0, "{rep}");
    // Counters kind by kind.
    let c = &rep["engine_counters"];
    let mut want_drops: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut delivered = valid_total;
    for (_, e) in KINDS {
        match e {
            Expect::Drop(k) => *want_drops.entry(k).or_default() += rounds,
            Expect::Deliver => delivered += rounds,
            Expect::Pass => {}
        }
    }
    for (k, n) in &want_drops {
        assert_eq!(c[*k].as_u64(), Some(*n), "{k}: {c}");
    }
    // No other drop reason moved.
    for (k, v) in c.as_object().unwrap() {
        if k.starts_with("drop_") && !want_drops.contains_key(k.as_str()) {
            assert_eq!(v.as_u64(), Some(0), "unexpected {k}: {c}");
        }
    }
    assert_eq!(c["rx_packets"].as_u64(), Some(delivered), "{c}");
    let drops: u64 = want_drops.values().sum();
    assert_eq!(c["rx_frames"].as_u64(), Some(delivered + drops), "{c}");
    assert!(
        drops
            + (rounds * KINDS.iter().filter(|(_, e)| *e == Expect::Pass).count() as u64)
            + (delivered - valid_total)
            >= MALFORMED
    );
}
