//! CPU cost of the sans-IO TCP itself, with no I/O: two stacks in one
//! thread hand segments to each other. Ping-pong of 64-byte messages (both
//! sides' input + output per round trip) and a one-way bulk stream.
//! Prints one JSON object. `cargo run --release -p nanowire-tcp --example stack_cost`

use nanowire_tcp::{Config, ConnId, Secret, TcpStack};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Instant;

/// CPU time of this thread in ns (the machine is shared: wall time lies).
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for clock_gettime to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pump(from: &mut TcpStack, to: &mut TcpStack, now: u64, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while let Some(t) = from.poll_transmit(now, buf) {
        to.input(now, t.src, t.dst, &buf[..t.len]);
        n += 1;
    }
    n
}

fn pair(now: u64, buf: &mut [u8]) -> (TcpStack, TcpStack, ConnId, ConnId) {
    let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let cfg = Config {
        rcvbuf: 4 << 20,
        sndbuf: 4 << 20,
        ..Config::default()
    };
    let mut sa = TcpStack::new(cfg.clone(), Secret::from_bytes([1; 16]));
    let mut sb = TcpStack::new(cfg, Secret::from_bytes([2; 16]));
    let l = sa.listen(SocketAddrV4::new(a, 80), 8).unwrap();
    let cb = sb
        .connect(now, SocketAddrV4::new(b, 0), SocketAddrV4::new(a, 80))
        .unwrap();
    for _ in 0..3 {
        pump(&mut sb, &mut sa, now, buf);
        pump(&mut sa, &mut sb, now, buf);
    }
    let ca = sa.accept(l).unwrap();
    (sa, sb, ca, cb)
}

fn main() {
    let mut buf = vec![0u8; 70_000];
    let mut now = 1_000_000_000u64;
    let (mut sa, mut sb, ca, cb) = pair(now, &mut buf);
    sa.set_nodelay(ca, true).unwrap();
    sb.set_nodelay(cb, true).unwrap();
    let msg = [7u8; 64];
    let mut rx = [0u8; 64];
    let rounds = 1_000_000u64;
    let t = Instant::now();
    let c0 = cpu_ns();
    for _ in 0..rounds {
        now += 1000;
        sb.send(cb, &msg).unwrap();
        pump(&mut sb, &mut sa, now, &mut buf);
        assert_eq!(sa.recv(ca, &mut rx).unwrap(), 64);
        sa.send(ca, &rx).unwrap();
        pump(&mut sa, &mut sb, now, &mut buf);
        assert_eq!(sb.recv(cb, &mut rx).unwrap(), 64);
        sb.poll_timers(now);
        sa.poll_timers(now);
    }
    let pp_wall_ns = t.elapsed().as_nanos() as f64 / rounds as f64;
    let pp_ns = (cpu_ns() - c0) as f64 / rounds as f64;

    let (mut sa, mut sb, ca, cb) = pair(now, &mut buf);
    let chunk = vec![1u8; 256 * 1024];
    let mut sink = vec![0u8; 256 * 1024];
    let total: u64 = 1 << 30;
    let (mut sent, mut got, mut segs) = (0u64, 0u64, 0usize);
    let c0 = cpu_ns();
    while got < total {
        now += 1000;
        if sent < total
            && let Ok(k) = sb.send(cb, &chunk)
        {
            sent += k as u64;
        }
        segs += pump(&mut sb, &mut sa, now, &mut buf);
        while let Ok(k) = sa.recv(ca, &mut sink) {
            if k == 0 {
                break;
            }
            got += k as u64;
        }
        pump(&mut sa, &mut sb, now, &mut buf);
    }
    let secs = (cpu_ns() - c0) as f64 / 1e9;
    println!(
        "{{\"clock\": \"thread CPU time\", \"pingpong_wall_ns\": {pp_wall_ns:.0}, \"pingpong_64B_round_trip_ns\": {pp_ns:.0}, \"per_segment_ns\": {:.0}, \"bulk_gbit_s\": {:.2}, \"bulk_segments\": {segs}, \"bulk_ns_per_segment\": {:.0}, \"note\": \"one thread, both stacks, no I/O: checksums, copies into/out of the rings, state machine\"}}",
        pp_ns / 2.0,
        total as f64 * 8.0 / secs / 1e9,
        secs * 1e9 / segs as f64
    );
}
