//! The floor: a minimal AF_XDP UDP ping-pong with nothing of the engine in
//! it (no demux, no sockets, no neighbour lookups, no checksums beyond the
//! IPv4 header's, written by the wire crate's `Ipv4Repr`), to hold the engine's numbers against on the machine at
//! hand. Both ends claim one UDP port with the steering program and poll
//! their rings; the echo swaps the addresses of what it gets and sends it
//! back; the pinger times each round trip.
//!
//!   xsk_floor echo IFACE PORT [CPU]
//!   xsk_floor ping IFACE PEER_IP PEER_MAC|auto PORT SECONDS [CPU]
//!
//! `auto` takes the peer's MAC from the kernel's ARP table (after one
//! datagram from a kernel socket has made the kernel resolve it).
//! The pinger prints one JSON line: one-way latency (round trip / 2) in µs,
//! min/p50/p90/p99/max, and the number of round trips. Used by
//! `scripts/compare.py --scenario floor`.

use nanowire_wire::ipv4::PROTO_UDP;
use nanowire_wire::{EtherType, EthernetRepr, Ipv4Repr, MacAddr};
use nanowire_xdp::{SteerProgram, XskConfig, XskSocket, iface};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const PAYLOAD: usize = 64;
const HDRS: usize = 14 + 20 + 8;

fn die(msg: String) -> ! {
    eprintln!("xsk_floor: {msg}");
    std::process::exit(1);
}

fn pin(cpu: Option<&String>) {
    let Some(c) = cpu else { return };
    let c: usize = c.parse().unwrap_or_else(|_| die(format!("bad CPU {c}")));
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(c, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        die(format!("cannot pin to CPU {c}"));
    }
}

fn parse_mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|x| u8::from_str_radix(x, 16).unwrap_or_else(|_| die(format!("bad MAC {s}"))))
        .collect();
    v.try_into().unwrap_or_else(|_| die(format!("bad MAC {s}")))
}

/// The peer's MAC from the kernel's ARP table, after asking the kernel to
/// resolve it (one datagram to the discard port from a kernel socket).
fn arp_mac(peer: Ipv4Addr) -> [u8; 6] {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap_or_else(|e| die(format!("udp: {e}")));
    let _ = s.send_to(b"arp", (peer, 9));
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let table = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
        // IP address, HW type, Flags (0x2: complete), HW address, Mask, Device.
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 4 && f[0] == peer.to_string() && f[2] == "0x2" {
                return parse_mac(f[3]);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    die(format!("{peer} has no ARP entry"))
}

/// Ethernet + IPv4 + UDP (checksum 0: allowed for IPv4) + payload.
fn build(
    f: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    port: u16,
    payload: &[u8],
) -> usize {
    let len = HDRS + payload.len();
    EthernetRepr {
        dst: MacAddr(dst_mac),
        src: MacAddr(src_mac),
        ethertype: EtherType::Ipv4,
    }
    .emit(f);
    Ipv4Repr {
        src,
        dst,
        protocol: PROTO_UDP,
        payload_len: 8 + payload.len(),
        ttl: 64,
        ident: 0,
    }
    .emit(&mut f[14..34]);
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&port.to_be_bytes());
    udp[2..4].copy_from_slice(&port.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp[6..8].fill(0);
    f[HDRS..len].copy_from_slice(payload);
    len
}

/// Swap Ethernet, IPv4 and UDP addresses in place (both checksums stay valid).
fn swap(f: &mut [u8]) {
    for i in 0..6 {
        f.swap(i, 6 + i);
    }
    for i in 0..4 {
        f.swap(26 + i, 30 + i);
    }
    for i in 0..2 {
        f.swap(34 + i, 36 + i);
    }
}

fn open(ifname: &str, port: u16) -> (iface::IfaceInfo, SteerProgram, XskSocket) {
    let info = iface::lookup(ifname).unwrap_or_else(|e| die(format!("{ifname}: {e}")));
    let addr = info
        .addr
        .unwrap_or_else(|| die(format!("{ifname} has no IPv4 address")));
    let mut prog = SteerProgram::attach(ifname, info.index, nanowire_xdp::program::Frags::No, None)
        .unwrap_or_else(|e| die(e.to_string()));
    let cfg = XskConfig {
        rx_frames: 2048,
        tx_frames: 512,
        ..XskConfig::default()
    };
    let xsk = XskSocket::open(ifname, info.index, 0, cfg).unwrap_or_else(|e| die(e.to_string()));
    prog.set_xsk(0, &xsk).unwrap_or_else(|e| die(e.to_string()));
    prog.claim(addr, port, std::process::id())
        .unwrap_or_else(|e| die(e.to_string()));
    (info, prog, xsk)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("echo") if a.len() >= 4 => {
            pin(a.get(4));
            let port: u16 = a[3].parse().unwrap_or_else(|_| die("bad port".into()));
            let (_info, _prog, xsk) = open(&a[2], port);
            let (mut rx, mut tx) = xsk.split();
            println!("ready");
            loop {
                let mut n = 0;
                rx.poll(64, 64, |f| {
                    let d = f.data();
                    n += tx.send_with(1, |_, fr| {
                        fr[..d.len()].copy_from_slice(d);
                        swap(&mut fr[..d.len()]);
                        Some(d.len())
                    });
                });
                if n > 0 {
                    tx.kick();
                    tx.reap();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        Some("ping") if a.len() >= 7 => {
            pin(a.get(7));
            let peer: Ipv4Addr = a[3].parse().unwrap_or_else(|_| die("bad peer IP".into()));
            let peer_mac = if a[4] == "auto" {
                arp_mac(peer)
            } else {
                parse_mac(&a[4])
            };
            let port: u16 = a[5].parse().unwrap_or_else(|_| die("bad port".into()));
            let secs: f64 = a[6].parse().unwrap_or_else(|_| die("bad seconds".into()));
            let (info, _prog, xsk) = open(&a[2], port);
            let me = info.addr.unwrap_or(Ipv4Addr::UNSPECIFIED);
            let (mut rx, mut tx) = xsk.split();
            let mut ns: Vec<u64> = Vec::with_capacity(1 << 20);
            let mut payload = [0u8; PAYLOAD];
            let warm_until = Instant::now() + Duration::from_millis(300);
            let end = warm_until + Duration::from_secs_f64(secs);
            let mut seq = 0u64;
            let mut lost = 0u64;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                seq += 1;
                payload[..8].copy_from_slice(&seq.to_le_bytes());
                let t0 = Instant::now();
                let sent = tx.send_with(1, |_, fr| {
                    Some(build(fr, info.mac, peer_mac, me, peer, port, &payload))
                });
                if sent == 0 {
                    tx.reap();
                    continue;
                }
                tx.kick();
                let give_up = t0 + Duration::from_millis(200);
                let mut back = false;
                while !back {
                    rx.poll(8, 8, |f| {
                        let d = f.data();
                        if d.len() >= HDRS + 8 && d[HDRS..HDRS + 8] == seq.to_le_bytes() {
                            back = true;
                        }
                    });
                    if !back && Instant::now() >= give_up {
                        lost += 1;
                        break;
                    }
                }
                let dt = t0.elapsed().as_nanos() as u64;
                tx.reap();
                if back && t0 >= warm_until {
                    ns.push(dt / 2);
                }
            }
            if ns.is_empty() {
                die(format!("no replies ({lost} lost): is the echo running?"));
            }
            ns.sort_unstable();
            let q = |p: f64| ns[((ns.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
            println!(
                "{{\"tool\": \"xsk_floor\", \"msg_size\": {PAYLOAD}, \"round_trips\": {}, \"lost\": {lost}, \"oneway_us\": {{\"min\": {:.3}, \"p50\": {:.3}, \"p90\": {:.3}, \"p99\": {:.3}, \"max\": {:.3}}}}}",
                ns.len(),
                q(0.0),
                q(0.5),
                q(0.9),
                q(0.99),
                q(1.0)
            );
        }
        _ => die(
            "usage: xsk_floor echo IFACE PORT [CPU] | ping IFACE PEER_IP PEER_MAC|auto PORT SECONDS [CPU]"
                .into(),
        ),
    }
}
