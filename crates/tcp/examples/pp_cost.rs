//! CPU cost of one TCP ping-pong message through two in-memory stacks.
//! `MOVE=1`: the server's connection moves to another stack and back
//! between messages (issue 24 item 1: export, byte form, import; the
//! difference against `MOVE=0` under callgrind is the cost of a move).
use nanowire_tcp::{Config, Secret, TcpStack};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Instant;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn pump(now: u64, from: &mut TcpStack, to: &mut TcpStack, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while let Some(t) = from.poll_transmit(now, buf) {
        to.input(now, t.src, t.dst, &buf[..t.len]);
        n += 1;
    }
    while from.poll_ready().is_some() {}
    n
}

fn main() {
    let mut a = TcpStack::new(Config::default(), Secret::from_bytes([1; 16]));
    let mut b = TcpStack::new(Config::default(), Secret::from_bytes([2; 16]));
    let mut buf = vec![0u8; 70_000];
    let l = b.listen(SocketAddrV4::new(B, 80), 16).unwrap();
    let mut now = 1_000_000_000u64;
    let ca = a
        .connect(now, SocketAddrV4::new(A, 40000), SocketAddrV4::new(B, 80))
        .unwrap();
    for _ in 0..4 {
        pump(now, &mut a, &mut b, &mut buf);
        pump(now, &mut b, &mut a, &mut buf);
    }
    let cb = b.accept(l).unwrap();
    a.set_nodelay(ca, true).unwrap();
    b.set_nodelay(cb, true).unwrap();
    let msg = [7u8; 64];
    let mut r = [0u8; 64];
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let moving = std::env::var("MOVE").is_ok_and(|v| v == "1");
    let mut b2 = TcpStack::new(Config::default(), Secret::from_bytes([3; 16]));
    let mut cb = cb;
    let mut segs = 0;
    let t0 = Instant::now();
    for _ in 0..n {
        if moving {
            let h = b.hand_over_state(now, cb).unwrap();
            b.hand_over_done(now, cb).unwrap();
            let h = nanowire_tcp::Handover::from_bytes(&h.to_bytes()).unwrap();
            cb = b2.adopt_state(now, &h).unwrap();
            std::mem::swap(&mut b, &mut b2);
        }
        now += 5_000;
        a.poll_timers(now);
        a.send(ca, &msg).unwrap();
        segs += pump(now, &mut a, &mut b, &mut buf);
        b.poll_timers(now);
        assert_eq!(b.recv(cb, &mut r).unwrap(), 64);
        b.send(cb, &r).unwrap();
        segs += pump(now, &mut b, &mut a, &mut buf);
        assert_eq!(a.recv(ca, &mut r).unwrap(), 64);
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "{ns:.0} ns per round trip ({:.0} per message, send+transmit+input+recv), {:.2} segments per message",
        ns / 2.0,
        segs as f64 / (2 * n) as f64
    );
}
