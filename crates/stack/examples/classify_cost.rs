//! Cost of the engine's per-frame classifier (`xdp::classify::classify`)
//! on a 64-byte UDP datagram and a 64-byte TCP segment, frames built with
//! `wire`'s writers. Instruction counts are repeatable where timing is not:
//!
//!     N=1000000 valgrind --tool=callgrind target/release/examples/classify_cost udp
//!
//! and divide the total by N (the frame building is a constant).
use nanowire_stack::xdp::classify::{PROTO_TCP, PROTO_UDP, classify};
use nanowire_wire::tcp::{Flags, TcpRepr};
use nanowire_wire::{EtherType, EthernetRepr, Ipv4Repr, MacAddr, UdpRepr};
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant;

const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// Ethernet + IPv4 headers for `l4_len` transport bytes of `proto`.
fn headers(f: &mut [u8], proto: u8, l4_len: usize) {
    EthernetRepr {
        dst: MacAddr([2; 6]),
        src: MacAddr([4; 6]),
        ethertype: EtherType::Ipv4,
    }
    .emit(f);
    Ipv4Repr {
        src: SRC,
        dst: DST,
        protocol: proto,
        payload_len: l4_len,
        ttl: 64,
        ident: 1,
    }
    .emit(&mut f[14..]);
}

fn udp_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 42 + payload.len()];
    headers(&mut f, PROTO_UDP, 8 + payload.len());
    f[42..].copy_from_slice(payload);
    UdpRepr {
        src_port: 9000,
        dst_port: 7,
    }
    .emit(&mut f[34..], payload.len(), SRC, DST);
    f
}

fn tcp_frame(payload: &[u8]) -> Vec<u8> {
    let r = TcpRepr {
        src_port: 40000,
        dst_port: 80,
        seq: 1,
        ack: 1,
        flags: Flags(Flags::ACK | Flags::PSH),
        window: 1024,
        timestamp: Some((1, 1)),
        ..Default::default()
    };
    let hl = r.header_len();
    let mut f = vec![0u8; 34 + hl + payload.len()];
    headers(&mut f, PROTO_TCP, hl + payload.len());
    f[34 + hl..].copy_from_slice(payload);
    r.emit(&mut f[34..], payload.len(), SRC, DST);
    f
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "udp".into());
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let f = match which.as_str() {
        "tcp" => tcp_frame(&[0x5a; 64]),
        _ => udp_frame(&[0x5a; 64]),
    };
    let c = classify(&f).expect("a valid frame");
    let t = Instant::now();
    let mut sum = 0usize;
    for _ in 0..n {
        if let Ok(c) = classify(black_box(&f)) {
            sum += c.payload_len;
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    assert_eq!(sum, c.payload_len * n as usize);
    println!(
        "{which}: {n} frames, {ns:.1} ns per classify (payload {} B)",
        c.payload_len
    );
}
