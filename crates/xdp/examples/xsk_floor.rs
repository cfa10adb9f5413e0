//! The floor: a minimal AF_XDP UDP ping-pong with nothing of the engine in
//! it (no demux, no sockets, no neighbour lookups, no checksums beyond the
//! IPv4 header's, written by the wire crate's `Ipv4Repr`), to hold the engine's numbers against on the machine at
//! hand. Both ends claim one UDP port with the steering program and poll
//! their rings; the echo swaps the addresses of what it gets and sends it
//! back; the pinger times each round trip.
//!
//!   xsk_floor echo IFACE PORT [CPU] [spin|yield|sleep] [sockperf]
//!   xsk_floor ping IFACE PEER_IP PEER_MAC|auto PORT SECONDS [CPU] [spin|yield|sleep]
//!
//! `spin` (the default) polls the RX ring without a break; `yield` polls
//! it with a sched_yield(2) after each empty look (the turn a crowded
//! engine wait takes); `sleep` waits in poll(2) on the socket whenever its
//! RX ring is empty (the kernel's wake-up on each frame, as a blocking
//! server pays it): the floors of waiters that share their CPU, for
//! several ping-pongs on one CPU (`scripts/compare.py --scenario service`:
//! four pairs at once).
//!
//! The transmit floor (issue 21, bulk): how many full-size (1,514-byte)
//! frames one copy-mode AF_XDP socket gets through the veth, with
//! nothing of the engine in it (no TCP, no checksum: UDP checksum 0).
//!
//!   xsk_floor sink IFACE xdp|xdp-native|udp|xsk PORT SECONDS [CPU]
//!   xsk_floor blast IFACE PEER_IP PEER_MAC|auto PORT SECONDS [BATCH] [CPU]
//!
//! The sink runs on the peer: `xdp` attaches an XDP program that drops
//! every frame (generic mode, as the lab's engines attach; `xdp-native`:
//! veth's native XDP), `udp` reads with a kernel UDP socket (recvmmsg, 64
//! at a time: the kernel's per-frame receive, IP and UDP, as a plain
//! receiver pays it per segment), `xsk` receives with an AF_XDP socket
//! (the steering program claims the port, generic XDP copies each frame
//! into the UMEM; the frames are recycled unread: the receive of an
//! engine, without its TCP). It prints the frames the interface
//! received (and for `udp` the datagrams read) in its SECONDS. The blaster
//! posts BATCH frames (default 64) and kicks once (sendto), reaps
//! completions, for SECONDS after a 300 ms warm-up, and prints frames,
//! kicks, frames per kick and per second, the rate in Gbit/s of TCP
//! payload (1,448 bytes a frame, what an MSS-sized TCP segment carries)
//! and its own CPU time (user, system: the copy-mode transmit and,
//! on veth, the peer's receive run in the sender's system time).
//!
//!   xsk_floor echo-all NETNS:IFACE[,NETNS:IFACE...] PORT [CPU] [sockperf]
//!
//! `echo-all` is one process spinning over the sockets of several
//! interfaces (each opened in its network namespace): the best a server
//! side can do for several ping-pongs on one CPU (no context switch, every
//! ring looked at in turn), the floor of the service's four at once.
//! `echo ... sockperf` answers `sockperf pp` clients (see `sockperf_reply`):
//! the minimal AF_XDP server against the clients of the service's rows.
//!
//! CPU `-`: unpinned. The pinger also prints the round trips it sent in
//! all (the warm-up's included), its CPU time and context switches per
//! timed round trip.
//!
//! `auto` takes the peer's MAC from the kernel's ARP table (after one
//! datagram from a kernel socket has made the kernel resolve it).
//! The pinger prints one JSON line: one-way latency (round trip / 2) in µs,
//! min/p50/p90/p99/max, and the number of round trips. Used by
//! `scripts/compare.py --scenario floor`.

use nanowire_wire::ipv4::PROTO_UDP;
use nanowire_wire::{EtherType, EthernetRepr, Ipv4Repr, MacAddr};
use nanowire_xdp::{
    AttachMode, DropProgram, SteerProgram, XskConfig, XskRx, XskSocket, XskTx, iface,
};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const PAYLOAD: usize = 64;
const HDRS: usize = 14 + 20 + 8;

fn die(msg: String) -> ! {
    eprintln!("xsk_floor: {msg}");
    std::process::exit(1);
}

/// Pin to CPU `cpu` (none or `-`: stay unpinned).
fn pin(cpu: Option<&String>) {
    let Some(c) = cpu.filter(|c| *c != "-") else {
        return;
    };
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

/// Turn a sockperf ping-pong request (in place, addresses swapped) into the
/// reply a sockperf server sends: its header's client flag cleared (bit 0
/// of the byte after the 8-byte sequence number: 0x03 -> 0x02). The UDP
/// checksum goes to 0 (none, allowed for IPv4): a kernel sender on veth
/// leaves only the pseudo-header's partial sum in it, which the peer's
/// kernel would verify and drop.
fn sockperf_reply(f: &mut [u8]) {
    f[HDRS + 9] &= !1;
    f[40..42].fill(0);
}

/// The optional last argument of the echoes: `sockperf` (see
/// [`sockperf_reply`]).
fn sockperf_arg(arg: Option<&String>) -> bool {
    match arg.map(String::as_str) {
        None => false,
        Some("sockperf") => true,
        Some(x) => die(format!("bad echo kind {x} (sockperf)")),
    }
}

/// One turn of an echo: send back what its RX ring holds (addresses
/// swapped), kick once; the frames sent.
fn echo_turn(rx: &mut XskRx, tx: &mut XskTx, sockperf: bool) -> usize {
    let mut n = 0;
    rx.poll(64, 64, |f| {
        let d = f.data();
        n += tx.send_with(1, |_, fr| {
            fr[..d.len()].copy_from_slice(d);
            swap(&mut fr[..d.len()]);
            if sockperf && d.len() >= HDRS + 10 {
                sockperf_reply(&mut fr[..d.len()]);
            }
            Some(d.len())
        });
    });
    if n > 0 {
        tx.kick();
        tx.reap();
    }
    n
}

/// Enter network namespace `name` (`ip netns`'s /run/netns/NAME).
fn enter_netns(name: &str) {
    let f = std::fs::File::open(format!("/run/netns/{name}"))
        .unwrap_or_else(|e| die(format!("netns {name}: {e}")));
    // SAFETY: setns reads the descriptor we hold open for the call.
    if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) } != 0 {
        die(format!("setns {name}: {}", std::io::Error::last_os_error()));
    }
}

/// How a side waits for its next frame: spinning on the RX ring (with a
/// sched_yield(2) after each empty look, or not), or asleep in poll(2) on
/// the socket (woken by the kernel when a frame lands).
#[derive(Clone, Copy, PartialEq)]
enum Wait {
    Spin,
    Yield,
    Sleep,
}

impl Wait {
    fn name(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::Yield => "yield",
            Wait::Sleep => "sleep",
        }
    }
}

fn wait_kind(arg: Option<&String>) -> Wait {
    match arg.map(String::as_str) {
        None | Some("spin") => Wait::Spin,
        Some("yield") => Wait::Yield,
        Some("sleep") => Wait::Sleep,
        Some(x) => die(format!("bad wait {x} (spin, yield, sleep)")),
    }
}

/// The idle turn of a side whose RX ring was empty: a pause, a yield, or
/// poll(2) on the socket for up to `ms` (-1: no limit).
fn idle(wait: Wait, rx: &XskRx, ms: i32) {
    match wait {
        Wait::Spin => return std::hint::spin_loop(),
        Wait::Yield => {
            // SAFETY: sched_yield takes no arguments.
            unsafe { libc::sched_yield() };
            return;
        }
        Wait::Sleep => {}
    }
    let mut p = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(rx),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll reads and writes the one pollfd we own.
    unsafe { libc::poll(&mut p, 1, ms) };
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

/// A full-size frame: 1,514 bytes on the wire (Ethernet + IPv4 + UDP +
/// 1,472 bytes), the size of an MSS-sized TCP segment's frame.
const BULK_FRAME: usize = 1514;
/// TCP payload a 1,514-byte frame carries (MSS 1,448 with timestamps).
const TCP_PAYLOAD: f64 = 1448.0;

/// This process's resource use so far.
fn rusage() -> libc::rusage {
    // SAFETY: getrusage writes the zeroed struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    }
}

/// (user, system) CPU seconds of this process so far.
fn cpu_times() -> (f64, f64) {
    let ru = rusage();
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(ru.ru_utime), s(ru.ru_stime))
}

/// (CPU seconds, voluntary and involuntary context switches) so far.
fn cpu_and_switches() -> (f64, i64, i64) {
    let (u, s) = cpu_times();
    let ru = rusage();
    (u + s, ru.ru_nvcsw, ru.ru_nivcsw)
}

/// The interface's received-packets counter.
fn rx_packets(ifname: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/statistics/rx_packets"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// `xsk_floor sink`: drop in XDP, or read with a kernel UDP socket, for
/// `secs`; prints what arrived.
fn sink(ifname: &str, how: &str, port: u16, secs: f64) {
    let info = iface::lookup(ifname).unwrap_or_else(|e| die(format!("{ifname}: {e}")));
    let start = rx_packets(ifname);
    let mut read = 0u64;
    match how {
        "xdp" | "xdp-native" => {
            let mode = if how == "xdp" {
                AttachMode::Skb
            } else {
                AttachMode::Driver
            };
            let _drop = DropProgram::attach(info.index, mode).unwrap_or_else(|e| die(e));
            println!("ready");
            std::thread::sleep(Duration::from_secs_f64(secs));
        }
        "udp" => {
            let s = std::net::UdpSocket::bind(("0.0.0.0", port))
                .unwrap_or_else(|e| die(format!("udp bind {port}: {e}")));
            let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
            let big: libc::c_int = 64 << 20;
            // SAFETY: setsockopt reads the int we pass; SO_RCVBUFFORCE
            // needs CAP_NET_ADMIN, SO_RCVBUF is the fallback.
            unsafe {
                for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
                    let p = (&big as *const libc::c_int).cast();
                    if libc::setsockopt(fd, libc::SOL_SOCKET, opt, p, 4) == 0 {
                        break;
                    }
                }
            }
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap_or_else(|e| die(format!("udp: {e}")));
            println!("ready");
            const N: usize = 64;
            let mut bufs = vec![[0u8; 2048]; N];
            let end = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < end {
                // SAFETY: zeroed iovec/mmsghdr arrays are valid; each iovec
                // points into `bufs`, alive and unaliased for the call.
                let n = unsafe {
                    let mut iov: [libc::iovec; N] = std::mem::zeroed();
                    let mut msgs: [libc::mmsghdr; N] = std::mem::zeroed();
                    for i in 0..N {
                        iov[i].iov_base = bufs[i].as_mut_ptr().cast();
                        iov[i].iov_len = bufs[i].len();
                        msgs[i].msg_hdr.msg_iov = &mut iov[i];
                        msgs[i].msg_hdr.msg_iovlen = 1;
                    }
                    libc::recvmmsg(fd, msgs.as_mut_ptr(), N as u32, 0, std::ptr::null_mut())
                };
                if n > 0 {
                    read += n as u64;
                }
            }
        }
        "xsk" => {
            let (_info, _prog, xsk) = open(ifname, port);
            let (mut rx, _tx) = xsk.split();
            println!("ready");
            let end = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < end {
                let got = rx.poll(256, 64, |_| {}).descs;
                read += u64::from(got);
                if got == 0 {
                    std::hint::spin_loop();
                }
            }
        }
        _ => die(format!(
            "sink: unknown kind {how} (xdp, xdp-native, udp, xsk)"
        )),
    }
    println!(
        "{{\"tool\": \"xsk_floor\", \"mode\": \"sink\", \"sink\": \"{how}\", \"seconds\": {secs}, \"rx_packets\": {}, \"read\": {read}}}",
        rx_packets(ifname) - start
    );
}

/// `xsk_floor blast`: full-size UDP frames from one copy-mode socket,
/// `batch` per kick, for `secs` after a warm-up; prints the counts.
fn blast(ifname: &str, peer: Ipv4Addr, peer_mac: [u8; 6], port: u16, secs: f64, batch: usize) {
    let info = iface::lookup(ifname).unwrap_or_else(|e| die(format!("{ifname}: {e}")));
    let me = info
        .addr
        .unwrap_or_else(|| die(format!("{ifname} has no IPv4 address")));
    let cfg = XskConfig {
        rx_frames: 64,
        tx_frames: 4096,
        try_zero_copy: false,
        ..XskConfig::default()
    };
    let xsk = XskSocket::open(ifname, info.index, 0, cfg).unwrap_or_else(|e| die(e.to_string()));
    let budget = xsk.tx_budget();
    let (_rx, mut tx) = xsk.split();
    let payload = vec![0x5au8; BULK_FRAME - HDRS];
    let warm_until = Instant::now() + Duration::from_millis(300);
    let end = warm_until + Duration::from_secs_f64(secs);
    let (mut frames, mut kicks, mut full) = (0u64, 0u64, 0u64);
    let mut cpu0 = (0.0, 0.0);
    let mut counting = false;
    loop {
        let now = Instant::now();
        if !counting && now >= warm_until {
            counting = true;
            (frames, kicks, full) = (0, 0, 0);
            cpu0 = cpu_times();
        }
        if now >= end {
            break;
        }
        // Copy mode always asks for a wakeup: send_with kicks once per
        // batch it posted.
        let n = tx.send_with(batch, |_, fr| {
            Some(build(fr, info.mac, peer_mac, me, peer, port, &payload))
        });
        if n > 0 {
            kicks += 1;
        } else {
            full += 1;
            tx.kick();
        }
        frames += u64::from(tx.reap());
    }
    let dt = Instant::now().duration_since(warm_until).as_secs_f64();
    let cpu1 = cpu_times();
    let fps = frames as f64 / dt;
    let cpu = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
    // Frames per second of this process's own CPU (user + system, the
    // kernel's transmit and the peer's softirq receive included): the rate
    // one core would reach, whatever else the machine was running.
    let per_cpu = frames as f64 / (cpu.0 + cpu.1).max(1e-9);
    if let Some(e) = tx.kick_error() {
        die(format!("kick: {e}"));
    }
    println!(
        "{{\"tool\": \"xsk_floor\", \"mode\": \"blast\", \"frame_bytes\": {BULK_FRAME}, \"batch\": {batch}, \"tx_budget\": {}, \"seconds\": {dt:.3}, \"frames\": {frames}, \"kicks\": {kicks}, \"ring_full\": {full}, \"frames_per_kick\": {:.1}, \"frames_per_s\": {fps:.0}, \"gbps_tcp_payload\": {:.3}, \"gbps_wire\": {:.3}, \"cpu_user_s\": {:.3}, \"cpu_sys_s\": {:.3}, \"frames_per_cpu_s\": {:.0}, \"gbps_tcp_payload_per_cpu\": {:.3}}}",
        budget.map_or("null".into(), |b| b.to_string()),
        frames as f64 / kicks.max(1) as f64,
        fps * TCP_PAYLOAD * 8.0 / 1e9,
        fps * BULK_FRAME as f64 * 8.0 / 1e9,
        cpu.0,
        cpu.1,
        per_cpu,
        per_cpu * TCP_PAYLOAD * 8.0 / 1e9
    );
}

/// PEER_IP PEER_MAC|auto PORT SECONDS (arguments 3 to 6 of ping and blast).
fn peer_args(a: &[String]) -> (Ipv4Addr, [u8; 6], u16, f64) {
    let peer: Ipv4Addr = a[3].parse().unwrap_or_else(|_| die("bad peer IP".into()));
    let peer_mac = if a[4] == "auto" {
        arp_mac(peer)
    } else {
        parse_mac(&a[4])
    };
    let port: u16 = a[5].parse().unwrap_or_else(|_| die("bad port".into()));
    let secs: f64 = a[6].parse().unwrap_or_else(|_| die("bad seconds".into()));
    (peer, peer_mac, port, secs)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("echo") if a.len() >= 4 => {
            pin(a.get(4));
            let wait = wait_kind(a.get(5));
            let sockperf = sockperf_arg(a.get(6));
            let port: u16 = a[3].parse().unwrap_or_else(|_| die("bad port".into()));
            let (_info, _prog, xsk) = open(&a[2], port);
            let (mut rx, mut tx) = xsk.split();
            println!("ready");
            loop {
                if echo_turn(&mut rx, &mut tx, sockperf) == 0 {
                    idle(wait, &rx, -1);
                }
            }
        }
        Some("echo-all") if a.len() >= 4 => {
            let port: u16 = a[3].parse().unwrap_or_else(|_| die("bad port".into()));
            let sockperf = sockperf_arg(a.get(5));
            // Each socket opened inside its namespace (it stays bound to its
            // interface there), then all polled from here.
            let mut socks = Vec::new();
            for spec in a[2].split(',') {
                let (netns, ifname) = spec
                    .split_once(':')
                    .unwrap_or_else(|| die(format!("bad NETNS:IFACE {spec}")));
                enter_netns(netns);
                let (_info, prog, xsk) = open(ifname, port);
                let (rx, tx) = xsk.split();
                socks.push((prog, rx, tx));
            }
            pin(a.get(4));
            println!("ready");
            loop {
                let mut n = 0;
                for (_, rx, tx) in socks.iter_mut() {
                    n += echo_turn(rx, tx, sockperf);
                }
                if n == 0 {
                    std::hint::spin_loop();
                }
            }
        }
        Some("ping") if a.len() >= 7 => {
            pin(a.get(7));
            let wait = wait_kind(a.get(8));
            let (peer, peer_mac, port, secs) = peer_args(&a);
            let (info, _prog, xsk) = open(&a[2], port);
            let me = info.addr.unwrap_or(Ipv4Addr::UNSPECIFIED);
            let (mut rx, mut tx) = xsk.split();
            let mut ns: Vec<u64> = Vec::with_capacity(1 << 20);
            let mut payload = [0u8; PAYLOAD];
            let warm_until = Instant::now() + Duration::from_millis(300);
            let end = warm_until + Duration::from_secs_f64(secs);
            let mut seq = 0u64;
            let mut lost = 0u64;
            // Counted from the first timed round trip on.
            let mut used0 = None;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                seq += 1;
                payload[..8].copy_from_slice(&seq.to_le_bytes());
                let t0 = Instant::now();
                if used0.is_none() && t0 >= warm_until {
                    used0 = Some(cpu_and_switches());
                }
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
                    if back {
                        break;
                    }
                    let now = Instant::now();
                    if now >= give_up {
                        lost += 1;
                        break;
                    }
                    if wait != Wait::Spin {
                        idle(wait, &rx, (give_up - now).as_millis() as i32 + 1);
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
            // This side's CPU and context switches per timed round trip
            // (lost ones included: they were sent and waited for too).
            let (c0, v0, i0) = used0.unwrap_or_default();
            let (c1, v1, i1) = cpu_and_switches();
            let per = (ns.len() as u64 + lost).max(1) as f64;
            let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0;
            ns.sort_unstable();
            let q = |p: f64| ns[((ns.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
            println!(
                "{{\"tool\": \"xsk_floor\", \"msg_size\": {PAYLOAD}, \"wait\": \"{}\", \"sent\": {seq}, \"round_trips\": {}, \"lost\": {lost}, \"oneway_us\": {{\"min\": {:.3}, \"p50\": {:.3}, \"p90\": {:.3}, \"p99\": {:.3}, \"max\": {:.3}, \"avg\": {mean:.3}}}, \"cpu_us_per_rt\": {:.3}, \"vcsw_per_rt\": {:.3}, \"ivcsw_per_rt\": {:.3}}}",
                wait.name(),
                ns.len(),
                q(0.0),
                q(0.5),
                q(0.9),
                q(0.99),
                q(1.0),
                (c1 - c0) * 1e6 / per,
                (v1 - v0) as f64 / per,
                (i1 - i0) as f64 / per
            );
        }
        Some("sink") if a.len() >= 6 => {
            pin(a.get(6));
            let port: u16 = a[4].parse().unwrap_or_else(|_| die("bad port".into()));
            let secs: f64 = a[5].parse().unwrap_or_else(|_| die("bad seconds".into()));
            sink(&a[2], &a[3], port, secs);
        }
        Some("blast") if a.len() >= 7 => {
            pin(a.get(8));
            let (peer, peer_mac, port, secs) = peer_args(&a);
            let batch: usize = a
                .get(7)
                .map_or(Ok(64), |b| b.parse())
                .unwrap_or_else(|_| die("bad batch".into()));
            blast(&a[2], peer, peer_mac, port, secs, batch.max(1));
        }
        _ => die(
            "usage: xsk_floor echo IFACE PORT [CPU] [spin|yield|sleep] [sockperf] | echo-all NETNS:IFACE[,...] PORT [CPU] [sockperf] | ping IFACE PEER_IP PEER_MAC|auto PORT SECONDS [CPU] [spin|yield|sleep] | sink IFACE xdp|xdp-native|udp|xsk PORT SECONDS [CPU] | blast IFACE PEER_IP PEER_MAC|auto PORT SECONDS [BATCH] [CPU]"
                .into(),
        ),
    }
}
