//! Issue 11: 1,000 concurrent TCP connections through an accelerated server
//! and an accelerated client (native API, both on the xdp engine, one lab,
//! prefix `ts`). Every connection is open at the same time and carries a
//! small exchange hashed end to end: the client sends a message of its own
//! size and content, the server answers with the message's length and
//! CRC-32, the client checks it. No connection may be lost, reset or left
//! without its answer; the server's stack demultiplexes all of them through
//! its 4-tuple hash map (and the engine's demux through its own).

use nanowire_lab::testbed::Host;
use nanowire_stack::xdp::{XdpTcpListener, XdpTcpStream};
use nanowire_stack::{EngineKind, EngineOptions};
use nanowire_testkit::in_ns;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const PORT: u16 = 11420;
/// Concurrent connections (NANOWIRE_TCP_CONNS overrides).
const CONNS: usize = 1000;

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Connection `i`'s message: 4-byte length header + a size and content of its own.
fn message(i: usize) -> Vec<u8> {
    let n = 200 + (i * 37) % 1800;
    let mut m = Vec::with_capacity(4 + n);
    m.extend_from_slice(&(n as u32).to_le_bytes());
    m.extend((0..n).map(|k| ((i * 131 + k * 7) ^ (k >> 3)) as u8));
    m
}

fn opts() -> EngineOptions {
    let mut o = EngineOptions::new(EngineKind::Xdp);
    o.fallback = false;
    o
}

fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

struct ServerConn {
    /// Dropped (closed: FIN) once the client's FIN arrived.
    s: Option<XdpTcpStream>,
    buf: Vec<u8>,
    answered: bool,
    closed: bool,
}

#[test]
#[ignore = "needs root"]
fn a_thousand_concurrent_connections_between_two_xdp_tcp_peers() {
    let conns: usize = nanowire_testkit::env_or("NANOWIRE_TCP_CONNS", CONNS);
    raise_nofile();
    let l = nanowire_testkit::lab("tsk");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let nsb = l.netns(Host::B);
    let server = std::thread::spawn(move || {
        in_ns(&nsb, move || {
            let lst = XdpTcpListener::bind(SocketAddrV4::new(B, PORT), 1024, &opts())
                .expect("xdp listener");
            ready_tx.send(()).unwrap();
            let mut cs: Vec<ServerConn> = Vec::new();
            let end = Instant::now() + Duration::from_secs(120);
            let mut answered = 0usize;
            let mut closed = 0usize;
            while closed < conns && Instant::now() < end {
                while let Some(s) = lst.accept(Some(Instant::now())).expect("accept") {
                    cs.push(ServerConn {
                        s: Some(s),
                        buf: Vec::new(),
                        answered: false,
                        closed: false,
                    });
                }
                let mut chunk = [0u8; 4096];
                for c in cs.iter_mut().filter(|c| !c.closed) {
                    let Some(s) = c.s.as_mut() else { continue };
                    match s.try_read(&mut chunk) {
                        Ok(Some(0)) => {
                            // Half-closed by the client: close our side too.
                            c.s = None;
                            c.closed = true;
                            closed += 1;
                            continue;
                        }
                        Ok(Some(n)) => c.buf.extend_from_slice(&chunk[..n]),
                        Ok(None) => {}
                        Err(e) => panic!("server read: {e}"),
                    }
                    if !c.answered && c.buf.len() >= 4 {
                        let n = u32::from_le_bytes(c.buf[..4].try_into().unwrap()) as usize;
                        if c.buf.len() >= 4 + n {
                            let mut reply = (n as u32).to_le_bytes().to_vec();
                            reply.extend_from_slice(&crc32(&c.buf[4..4 + n]).to_le_bytes());
                            s.write_all(&reply).expect("server write");
                            c.answered = true;
                            answered += 1;
                        }
                    }
                }
            }
            // Let the last ACKs of our FINs arrive (LAST-ACK -> CLOSED).
            let _ = lst.accept(Some(Instant::now() + Duration::from_millis(300)));
            let counters: Vec<(&'static str, u64)> = lst.counters();
            (cs.len(), answered, closed, counters)
        })
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("server listening");
    let nsa = l.netns(Host::A);
    let client = in_ns(&nsa, move || {
        let dst = SocketAddrV4::new(B, PORT);
        // Open every connection first: all of them are live at once.
        let mut ss: Vec<XdpTcpStream> = (0..conns)
            .map(|i| {
                XdpTcpStream::connect(dst, &opts(), Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("connection {i}: {e}"))
            })
            .collect();
        let mut ok = 0usize;
        let mut retrans = 0u64;
        for (i, s) in ss.iter_mut().enumerate() {
            s.write_all(&message(i)).expect("client write");
        }
        for (i, s) in ss.iter_mut().enumerate() {
            let m = message(i);
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            while got.len() < 8 {
                let mut b = [0u8; 64];
                match s.read(&mut b, Some(deadline)).expect("client read") {
                    Some(0) => panic!("connection {i}: closed before the answer"),
                    Some(n) => got.extend_from_slice(&b[..n]),
                    None => panic!("connection {i}: no answer: {:?}", s.info()),
                }
            }
            let n = u32::from_le_bytes(got[..4].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(got[4..8].try_into().unwrap());
            assert_eq!(n, m.len() - 4, "connection {i}: length seen by the server");
            assert_eq!(
                crc,
                crc32(&m[4..]),
                "connection {i}: hash seen by the server"
            );
            retrans += s.info().map(|x| x.total_retrans).unwrap_or(0);
            ok += 1;
        }
        // Half-close them all (FIN); the server closes its side on seeing
        // it, and every connection reads its end of stream before it goes
        // (a stream dropped first would leave the server's FIN to the
        // kernel, which answers RST: the engine's TCP has no TIME-WAIT
        // after its last handle is gone, docs/architecture.md).
        for s in ss.iter_mut() {
            s.shutdown_write().expect("shutdown");
        }
        for (i, s) in ss.iter_mut().enumerate() {
            let mut b = [0u8; 64];
            let deadline = Some(Instant::now() + Duration::from_secs(20));
            match s.read(&mut b, deadline).expect("client read at the end") {
                Some(0) => {}
                other => panic!("connection {i}: expected end of stream, got {other:?}"),
            }
        }
        drop(ss);
        (ok, retrans)
    });
    let (accepted, answered, closed, counters) = server.join().expect("server thread");
    let c = |k: &str| counters.iter().find(|x| x.0 == k).map_or(0, |x| x.1);
    eprintln!(
        "{conns} connections: client ok {}, client retransmissions {}; server accepted {accepted}, answered {answered}, closed {closed}; server counters {counters:?}",
        client.0, client.1
    );
    assert_eq!(client.0, conns, "every exchange checked by the client");
    assert_eq!(accepted, conns, "every connection accepted");
    assert_eq!(answered, conns, "every message answered");
    assert_eq!(closed, conns, "every connection closed cleanly (FIN seen)");
    assert_eq!(c("passive_opens"), conns as u64, "{counters:?}");
    assert_eq!(c("listen_overflows"), 0, "{counters:?}");
    assert_eq!(c("connections_reset"), 0, "{counters:?}");
    assert_eq!(c("rst_sent"), 0, "{counters:?}");
}
