//! Issue 8 (engine core) acceptance tests, each in its own lab (prefix
//! `tc`): isolation of an unread socket, sends to an unresolvable address
//! beside a ping-pong, a peer MAC change mid-stream, a forked child, MTU
//! 9000 echo, fragmented datagrams both ways. Behaviour only: every wait
//! is a bound, never a measured threshold.

mod xdp_support;

use nanowire_lab::testbed::{Host, ScopedLab};
use nanowire_testkit::{in_ns, ip_ns, words, xdp_test_bin};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use xdp_support::{Proc, kernel_udp_in, udp_echo, xdp_opts};

const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

fn lab(tag: char) -> ScopedLab {
    nanowire_testkit::lab(&format!("tc{tag}"))
}

fn xdp_test(lab: &ScopedLab, args: &[&str]) -> Proc {
    let ifb = lab.iface(Host::B);
    let mut argv = vec![xdp_test_bin(), "--iface", &ifb];
    argv.extend_from_slice(args);
    let p = Proc::spawn(lab.command(Host::B, &argv));
    let ready = p.line(Duration::from_secs(20));
    assert_eq!(ready["ready"], true, "{ready}");
    p
}

fn kernel_client() -> UdpSocket {
    let s = UdpSocket::bind("0.0.0.0:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s
}

/// An echo server on a kernel socket in `ns` until `stop` is set.
fn kernel_echo(
    ns: String,
    bind: SocketAddrV4,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let poll = |u: &UdpSocket| u.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    kernel_udp_in(ns, bind, poll, move |u| {
        let mut b = vec![0u8; 65536];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((n, src)) = u.recv_from(&mut b) {
                let _ = u.send_to(&b[..n], src);
            }
        }
    })
}

#[test]
#[ignore = "needs root"]
fn unread_socket_drops_its_own_traffic_not_its_neighbours() {
    let lab = lab('i');
    let (ifa, nsb) = (lab.iface(Host::A), lab.netns(Host::B));
    const FLOOD: u32 = 100_000;
    const MINE: u32 = 1000;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (flooded_tx, flooded_rx) = mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        in_ns(&nsb, move || {
            ready_rx.recv_timeout(Duration::from_secs(20)).unwrap();
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            let m = [7u8; 64];
            for _ in 0..FLOOD {
                let _ = s.send_to(&m, (A, 6001));
            }
            flooded_tx.send(()).unwrap();
            for i in 0..MINE {
                let mut m = [0u8; 64];
                m[..4].copy_from_slice(&i.to_le_bytes());
                s.send_to(&m, (A, 6002)).unwrap();
                if i % 100 == 99 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        })
    });
    let (got, unread) = in_ns(&lab.netns(Host::A), move || {
        use nanowire_stack::xdp::XdpSocket;
        use nanowire_stack::{UdpEndpoint, WaitPolicy};
        let o = xdp_opts(ifa, 16384);
        let x = XdpSocket::open(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 6001), &o)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut y = XdpSocket::open(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 6002), &o)
            .unwrap_or_else(|e| panic!("{e}"));
        let _ = WaitPolicy::Spin;
        ready_tx.send(()).unwrap();
        let mut seen = vec![false; MINE as usize];
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut flooded = false;
        while seen.iter().any(|s| !s) && Instant::now() < deadline {
            // y reads (and so drains the shared rings, x's frames included).
            y.recv_batch(64, |p, _| {
                let i = u32::from_le_bytes(p[..4].try_into().unwrap()) as usize;
                if i < seen.len() {
                    seen[i] = true;
                }
            });
            flooded = flooded || flooded_rx.try_recv().is_ok();
        }
        assert!(flooded, "the flood was sent");
        let xs = x.stats();
        let cap = x.queue_capacity();
        let c: std::collections::HashMap<String, u64> = x.engine_counters().into_iter().collect();
        (
            seen.iter().filter(|s| **s).count(),
            (
                xs,
                cap,
                c["socket.queue_depth"],
                c["drop_socket_queue_full"],
            ),
        )
    });
    sender.join().unwrap();
    let (xs, cap, depth, engine_full) = unread;
    assert_eq!(
        got, MINE as usize,
        "the read socket got every one of its own"
    );
    assert_eq!(xs.rx_packets, 0, "x read nothing");
    assert!(
        depth as usize <= cap,
        "x holds at most its share: {depth} > {cap}"
    );
    assert!(cap < 16384, "the share is a part of the UMEM: {cap}");
    assert!(xs.rx_drop_queue_full > 0, "x's overflow is counted on x");
    assert_eq!(engine_full, xs.rx_drop_queue_full, "and only x overflowed");
}

#[test]
#[ignore = "needs root"]
fn unresolvable_sends_do_not_hold_up_a_ping_pong() {
    let lab = lab('u');
    let ifa = lab.iface(Host::A);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let srv = kernel_echo(lab.netns(Host::B), SocketAddrV4::new(B, 6100), stop.clone());
    let r = in_ns(&lab.netns(Host::A), move || {
        use nanowire_stack::UdpEndpoint;
        use nanowire_stack::xdp::XdpSocket;
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
        use std::sync::{Arc, Mutex};
        let o = xdp_opts(ifa, 1024);
        let mut p = XdpSocket::open(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), &o)
            .unwrap_or_else(|e| panic!("{e}"));
        let u = XdpSocket::open(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), &o)
            .unwrap_or_else(|e| panic!("{e}"));
        let nobody = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 99), 9);
        // Resolve b first (its own pending phase is not what is tested).
        p.connect(SocketAddrV4::new(B, 6100)).unwrap();
        let mut buf = [0u8; 64];
        let mut warm = false;
        for _ in 0..50 {
            p.send(b"warm").unwrap();
            if let Ok(Some(_)) =
                p.recv_from(&mut buf, Some(Instant::now() + Duration::from_millis(200)))
            {
                warm = true;
                break;
            }
        }
        assert!(warm, "b answers");
        let done = Arc::new(AtomicBool::new(false));
        let sends = Arc::new(AtomicU32::new(0));
        let (d2, s2) = (done.clone(), sends.clone());
        let u = Arc::new(Mutex::new(u));
        let u2 = u.clone();
        // Another thread sends to an address nobody answers ARP for.
        let t = std::thread::spawn(move || {
            while !d2.load(Ordering::Relaxed) {
                let r = u2.lock().unwrap().send_to(b"void", nobody);
                assert!(
                    r.is_ok(),
                    "an unconnected send succeeds, as in the kernel: {r:?}"
                );
                s2.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        // Wait until the unresolvable sends have started.
        while sends.load(Ordering::Relaxed) < 5 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let c0: std::collections::HashMap<String, u64> = p.engine_counters().into_iter().collect();
        let mut ok = 0;
        for i in 0..300u32 {
            p.send(&i.to_le_bytes()).unwrap();
            let dl = Instant::now() + Duration::from_secs(2);
            while let Ok(Some((n, _))) = p.recv_from(&mut buf, Some(dl)) {
                if buf[..n] == i.to_le_bytes() {
                    ok += 1;
                    break;
                }
            }
        }
        let c1: std::collections::HashMap<String, u64> = p.engine_counters().into_iter().collect();
        done.store(true, Ordering::Relaxed);
        t.join().unwrap();
        // A connected socket learns of the failure as from the kernel.
        let mut c = XdpSocket::open(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), &o)
            .unwrap_or_else(|e| panic!("{e}"));
        c.connect(nobody).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        let err = loop {
            match c.send(b"x") {
                Err(e) => break Some(e.kind()),
                Ok(_) if Instant::now() > deadline => break None,
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let dropped = u
            .lock()
            .unwrap()
            .engine_counters()
            .into_iter()
            .find(|(k, _)| k == "socket.drop_neigh")
            .map(|(_, v)| v)
            .unwrap_or(0);
        (
            ok,
            c0["neigh_resolutions"],
            c1["neigh_resolutions"],
            dropped,
            err,
        )
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    srv.join().unwrap();
    let (ok, res0, res1, dropped, err) = r;
    assert_eq!(ok, 300, "every round trip completed");
    assert_eq!(
        res0, res1,
        "nothing got resolved meanwhile: .99 was pending throughout"
    );
    assert!(
        dropped > 0,
        "datagrams to the unresolvable address are counted drops"
    );
    assert_eq!(err, Some(std::io::ErrorKind::HostUnreachable));
}

#[test]
#[ignore = "needs root"]
fn peer_mac_change_mid_stream_is_followed() {
    let lab = lab('m');
    let (ifa, ifb) = (lab.iface(Host::A), lab.iface(Host::B));
    let (nsa, nsb) = (lab.netns(Host::A), lab.netns(Host::B));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let srv = kernel_echo(nsb.clone(), SocketAddrV4::new(B, 6200), stop.clone());
    let (before, after) = in_ns(&nsa.clone(), move || {
        use nanowire_stack::UdpEndpoint;
        use nanowire_stack::xdp::XdpSocket;
        let o = xdp_opts(ifa.clone(), 1024);
        let mut s = XdpSocket::open(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), &o)
            .unwrap_or_else(|e| panic!("{e}"));
        s.connect(SocketAddrV4::new(B, 6200)).unwrap();
        let mut buf = [0u8; 64];
        let mut round = |i: u32, tries: u32| {
            for _ in 0..tries {
                s.send(&i.to_le_bytes()).unwrap();
                let dl = Instant::now() + Duration::from_millis(500);
                while let Ok(Some((n, _))) = s.recv_from(&mut buf, Some(dl)) {
                    if buf[..n] == i.to_le_bytes() {
                        return true;
                    }
                }
            }
            false
        };
        let before = (0..50).filter(|&i| round(i, 5)).count();
        // Host b changes its MAC; host a's neighbour entry is replaced.
        let new = "02:00:00:aa:bb:cc";
        ip_ns(&nsb, &["link", "set", "dev", &ifb, "address", new]);
        let (peer, nud) = ("198.18.0.2", "reachable");
        ip_ns(
            &nsa,
            &[
                "neigh", "replace", peer, "lladdr", new, "dev", &ifa, "nud", nud,
            ],
        );
        let after = (50..150).filter(|&i| round(i, 5)).count();
        (before, after)
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    srv.join().unwrap();
    assert_eq!(before, 50);
    assert_eq!(after, 100, "the stream goes on to the new MAC");
}

#[test]
#[ignore = "needs root"]
fn forked_child_opens_its_own_socket_while_the_parent_receives() {
    let lab = lab('f');
    let p = xdp_test(
        &lab,
        &words("--port 6300 --echo --ring-depth 1024 --fork-port 6301"),
    );
    let child = p.line(Duration::from_secs(20));
    eprintln!("forked child: {child}");
    assert_eq!(child["child"], true, "{child}");
    // The child has a socket of its own: on its own engine, or on the
    // fallback with the one-line reason.
    let engine = child["engine"]
        .as_str()
        .unwrap_or_else(|| panic!("{child}"));
    if engine != "xdp" {
        let why = child["reason"].as_str().unwrap_or("");
        assert!(!why.is_empty() && !why.contains('\n'), "{child}");
    }
    let (pa, ch) = in_ns(&lab.netns(Host::A), || {
        let s = kernel_client();
        let mut pa = 0;
        let mut ch = 0;
        for i in 0..100u32 {
            let m = i.to_le_bytes();
            if udp_echo(&s, SocketAddrV4::new(B, 6300), &m).is_some() {
                pa += 1;
            }
            if udp_echo(&s, SocketAddrV4::new(B, 6301), &m).is_some() {
                ch += 1;
            }
        }
        (pa, ch)
    });
    assert_eq!(pa, 100, "the parent keeps receiving");
    assert_eq!(ch, 100, "the child serves its own socket");
}

/// Set the MTU of both lab interfaces.
fn set_mtu(lab: &ScopedLab, mtu: u32) {
    for h in [Host::A, Host::B] {
        let (dev, mtu) = (lab.iface(h), mtu.to_string());
        ip_ns(&lab.netns(h), &["link", "set", "dev", &dev, "mtu", &mtu]);
    }
}

/// An xdp echo on `port` in host b (ring depth 1024): every one of `sizes`
/// comes back intact to a kernel client and to an xdp socket in host a
/// ([`echo_sizes`], `what` names the case).
fn all_sizes_echo(
    lab: &ScopedLab,
    (port, sizes, what): (u16, &'static [usize], &str),
    wait: Duration,
    check: impl FnOnce(&nanowire_stack::xdp::XdpSocket) + Send + 'static,
) {
    let p = xdp_test(
        lab,
        &[
            "--port",
            &port.to_string(),
            "--echo",
            "--ring-depth",
            "1024",
        ],
    );
    let (kernel_ok, xdp_ok) = echo_sizes(lab, port, sizes, wait, check);
    drop(p);
    assert_eq!(kernel_ok, sizes.len(), "kernel client <-> xdp echo, {what}");
    assert_eq!(xdp_ok, sizes.len(), "xdp <-> xdp, {what}");
}

/// Each of `sizes` echoed by the xdp echo on `port` in host b, from a
/// kernel client and from an xdp socket in host a (up to 3 and 5 tries, a
/// try waiting `wait`): how many sizes came back intact each way. `check`
/// looks at the xdp socket afterwards.
fn echo_sizes(
    lab: &ScopedLab,
    port: u16,
    sizes: &'static [usize],
    wait: Duration,
    check: impl FnOnce(&nanowire_stack::xdp::XdpSocket) + Send + 'static,
) -> (usize, usize) {
    let ifa = lab.iface(Host::A);
    in_ns(&lab.netns(Host::A), move || {
        use nanowire_stack::UdpEndpoint;
        use nanowire_stack::xdp::XdpSocket;
        let s = kernel_client();
        let kernel_ok = sizes
            .iter()
            .filter(|&&n| {
                udp_echo(&s, SocketAddrV4::new(B, port), &vec![(n % 251) as u8; n]).is_some()
            })
            .count();
        let mut x = XdpSocket::open(
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            &xdp_opts(ifa, 1024),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        x.connect(SocketAddrV4::new(B, port)).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut xdp_ok = 0;
        for &n in sizes {
            let m = vec![(n % 13) as u8; n];
            for _ in 0..5 {
                x.send(&m).unwrap();
                if let Ok(Some((k, _))) = x.recv_from(&mut buf, Some(Instant::now() + wait))
                    && buf[..k] == m[..]
                {
                    xdp_ok += 1;
                    break;
                }
            }
        }
        check(&x);
        (kernel_ok, xdp_ok)
    })
}

#[test]
#[ignore = "needs root"]
fn mtu_9000_echo() {
    let lab = lab('j');
    set_mtu(&lab, 9000);
    const SIZES: &[usize] = &[64, 1472, 3000, 4000, 8000, 8972];
    let case = (6400, SIZES, "MTU 9000");
    all_sizes_echo(&lab, case, Duration::from_millis(500), |_| ());
}

#[test]
#[ignore = "needs root"]
fn fragmented_datagrams_both_directions() {
    let lab = lab('g');
    const SIZES: &[usize] = &[1473, 4000, 9000, 65507];
    let case = (6500, SIZES, "fragmented");
    all_sizes_echo(&lab, case, Duration::from_millis(1000), |x| {
        use nanowire_stack::UdpEndpoint;
        let c: std::collections::HashMap<String, u64> = x.engine_counters().into_iter().collect();
        assert!(
            c["socket.tx_kernel_path"] >= SIZES.len() as u64,
            "sent through the twin"
        );
        assert!(
            c["socket.rx_kernel_path"] >= SIZES.len() as u64,
            "received through the twin"
        );
    });
}

#[test]
#[ignore = "needs root"]
fn adopted_kernel_socket_is_the_twin() {
    let lab = lab('a');
    let p = xdp_test(&lab, &["--port", "6600", "--echo", "--ring-depth", "1024"]);
    let ifa = lab.iface(Host::A);
    let (ok, big, fds) = in_ns(&lab.netns(Host::A), move || {
        use nanowire_stack::UdpEndpoint;
        use nanowire_stack::xdp::XdpSocket;
        let k = UdpSocket::bind("0.0.0.0:0").unwrap();
        let port = k.local_addr().unwrap().port();
        let mut x =
            XdpSocket::adopt(k.as_raw_fd(), &xdp_opts(ifa, 1024)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(x.local_addr().unwrap().port(), port);
        assert_eq!(
            x.kernel_fd(),
            k.as_raw_fd(),
            "no duplicate of the caller's socket"
        );
        let fds = x.poll_fds();
        let dst = SocketAddrV4::new(B, 6600);
        let mut buf = vec![0u8; 65536];
        let mut round = |m: &[u8]| {
            for _ in 0..5 {
                x.send_to(m, dst).unwrap();
                let dl = Instant::now() + Duration::from_millis(500);
                if let Ok(Some((n, _))) = x.recv_from(&mut buf, Some(dl))
                    && buf[..n] == *m
                {
                    return true;
                }
            }
            false
        };
        let ok = (0..20u32).filter(|i| round(&i.to_le_bytes())).count();
        // Larger than the MTU: through the caller's socket, fragmented.
        let big = round(&[5u8; 4000]);
        drop(x);
        // The caller's socket is still open and usable.
        assert!(k.local_addr().is_ok());
        (ok, big, fds.len())
    });
    drop(p);
    assert_eq!(ok, 20);
    assert!(big);
    assert_eq!(fds, 2, "the engine's AF_XDP fd and the wake-up eventfd");
}
