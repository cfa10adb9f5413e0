//! Faults under traffic (issue 12): SIGKILL at random moments, SIGSTOP and
//! SIGCONT under load, and the interface changing under a running xdp
//! engine (down/up, MTU, address removal, the interface deleted, the
//! namespace deleted). Lab prefix `tf`.
//!
//! `NANOWIRE_KILL_CYCLES` sets the number of kill cycles (10 here, 100 in
//! `make soak`).

mod bench_server;

use bench_server::xdp_server;
use nanowire_lab::testbed::{Host, ScopedLab};
use nanowire_testkit::{in_ns, ip_ns};
use std::io::Read;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nanowire");
const B: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 18, 0, 2);

fn lab(tag: char) -> ScopedLab {
    nanowire_testkit::lab(&format!("tf{tag}"))
}

fn xdp_on(lab: &ScopedLab, h: Host) -> bool {
    lab.status()
        .a
        .iter()
        .chain(lab.status().b.iter())
        .any(|s| s.iface == lab.iface(h) && s.xdp.is_some())
}

fn stats_pids() -> Vec<u64> {
    let v = nanowire_testkit::stats_json(BIN).unwrap_or_default();
    v["engines"]
        .as_array()
        .map(|a| a.iter().filter_map(nanowire_testkit::engine_pid).collect())
        .unwrap_or_default()
}

fn shm_pages_of(pid: u32) -> Vec<String> {
    std::fs::read_dir("/dev/shm/nanowire")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{pid}-")))
                .collect()
        })
        .unwrap_or_default()
}

/// One datagram from a to b:port answered by a kernel socket in b.
fn kernel_roundtrip(lab: &ScopedLab, port: u16) -> bool {
    let rx = in_ns(&lab.netns(Host::B), move || {
        UdpSocket::bind(SocketAddrV4::new(B, port)).expect("kernel bind after the engine")
    });
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let tx = in_ns(&lab.netns(Host::A), || {
        UdpSocket::bind("198.18.0.1:0").expect("bind a")
    });
    let mut buf = [0u8; 64];
    for _ in 0..25 {
        tx.send_to(b"kernel?", SocketAddrV4::new(B, port)).unwrap();
        if let Ok((n, _)) = rx.recv_from(&mut buf)
            && &buf[..n] == b"kernel?"
        {
            return true;
        }
    }
    false
}

/// A sender in host a: datagrams to b:port until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(lab: &ScopedLab, port: u16) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let n2 = Arc::new(AtomicU64::new(0));
        let s2 = stop.clone();
        let path = format!("/run/netns/{}", lab.netns(Host::A));
        let th = std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).unwrap();
            // SAFETY: setns on a valid netns fd affects only this thread.
            assert_eq!(
                unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            let s = UdpSocket::bind("198.18.0.1:0").unwrap();
            let mut msg = [0u8; 64];
            while !s2.load(Ordering::Relaxed) {
                // A sockperf request asking for a reply.
                nanowire_wire::SockperfHeader::new_unchecked(&mut msg[..])
                    .fill_request(n2.load(Ordering::Relaxed), 2);
                let _ = s.send_to(&msg, SocketAddrV4::new(B, port));
                n2.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        Traffic { stop, th: Some(th) }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.th.take() {
            let _ = t.join();
        }
    }
}

/// `bench pp` for half a second, no warm-up.
fn pp(lab: &ScopedLab, port: u16, extra: &[&str]) -> Option<serde_json::Value> {
    let mut args = vec!["-t", "0.5", "--warmup-ms", "0"];
    args.extend_from_slice(extra);
    bench_server::pp(lab, port, &args)
}

#[test]
#[ignore = "needs root"]
fn sigkill_at_random_moments_leaves_nothing_behind() {
    let cycles: usize = nanowire_testkit::env_or("NANOWIRE_KILL_CYCLES", 10);
    let lab = lab('k');
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill cycles: {cycles}, seed {seed}");
    for cycle in 0..cycles {
        let port = 11280;
        let traffic = Traffic::start(&lab, port);
        let mut s = xdp_server(&lab, port, &[], &[]);
        let pid = s.pid();
        assert!(xdp_on(&lab, Host::B), "cycle {cycle}: program attached");
        // A random moment 0..400 ms into serving traffic.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(seed % 400));
        s.signal(libc::SIGKILL);
        let (st, _) = s.wait(Duration::from_secs(10)).expect("SIGKILL ends it");
        assert!(!st.success());
        drop(traffic);
        // The BPF link went with the process: no program on the interface.
        let t0 = Instant::now();
        while xdp_on(&lab, Host::B) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "cycle {cycle}: XDP program left after SIGKILL: {:?}",
                lab.status().b
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Its stats page is not listed, and the reader removed it.
        assert!(
            !stats_pids().contains(&u64::from(pid)),
            "cycle {cycle}: dead engine {pid} listed"
        );
        assert!(
            shm_pages_of(pid).is_empty(),
            "cycle {cycle}: stats page left: {:?}",
            shm_pages_of(pid)
        );
        // Kernel traffic on the same port works again.
        assert!(
            kernel_roundtrip(&lab, port),
            "cycle {cycle}: kernel path not restored"
        );
    }
}

/// Drops the kernel counts in both hosts: interfaces' rx_dropped, UDP
/// InErrors (receive buffer full, bad checksums), and the softnet backlog
/// drops (machine-wide).
fn kernel_drops(lab: &ScopedLab) -> u64 {
    let mut ifs = 0u64;
    for h in [Host::A, Host::B] {
        let o = Command::new("ip")
            .args(["netns", "exec", &lab.netns(h), "sh", "-c"])
            .arg("cat /sys/class/net/*/statistics/rx_dropped; grep '^Udp:' /proc/net/snmp | tail -1 | cut -d' ' -f4")
            .output()
            .unwrap();
        ifs += String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .filter_map(|v| v.parse::<u64>().ok())
            .sum::<u64>();
    }
    let softnet: u64 = std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|v| u64::from_str_radix(v, 16).ok())
        .sum();
    ifs + softnet
}

#[test]
#[ignore = "needs root"]
fn sigstop_under_load_recovers_and_counts_what_it_dropped() {
    let lab = lab('s');
    let port = 11281;
    let s = xdp_server(&lab, port, &[], &[]);
    let pid = s.pid();
    let kernel_before = kernel_drops(&lab);
    // Client: 20k msg/s for 3 s, every message asks a reply; a reply may
    // take up to 2 s (the stop is 400 ms), so only what the server lost is
    // counted as dropped.
    let client = nanowire_testkit::spawn_piped(&mut lab.command(
        Host::A,
        &[
            BIN,
            "bench",
            "ul",
            "-i",
            "198.18.0.2",
            "-p",
            &port.to_string(),
            "--mps",
            "20000",
            "--reply-every",
            "1",
            "-t",
            "3",
            "--warmup-ms",
            "0",
            "--reply-timeout-ms",
            "2000",
            "--json",
            "--strict",
        ],
    ));
    std::thread::sleep(Duration::from_millis(1000));
    s.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(400));
    s.signal(libc::SIGCONT);
    let out = nanowire_testkit::ok(&client.into_inner().wait_with_output().unwrap());
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["accounting"]["holds"], true, "{r}");
    let counters = nanowire_testkit::engine_counters_of(BIN, pid).expect("server's stats page");
    let counted: u64 = [
        "xsk_rx_dropped",
        "xsk_rx_ring_full",
        "xsk_rx_fill_ring_empty",
        "drop_socket_queue_full",
        "drop_tx_ring_full",
    ]
    .iter()
    .map(|k| counters[*k].as_u64().unwrap_or(0))
    .sum();
    let dropped = r["dropped"].as_u64().unwrap();
    let kernel = kernel_drops(&lab).saturating_sub(kernel_before);
    eprintln!(
        "client dropped {dropped}, engine counted {counted}, kernel counted {kernel}: {counters}"
    );
    let counted = counted + kernel;
    assert!(
        dropped <= counted,
        "every request the stopped server lost is counted by it: client dropped {dropped}, server counted {counted}: {counters}"
    );
    // Recovered: a fresh ping-pong is answered.
    let r = pp(&lab, port, &[]).expect("pp after SIGCONT");
    assert!(r["received"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["dropped"], 0, "{r}");
}

/// After an interface event the engine either still serves (after the
/// interface is restored) or has exited with a one-line error; it never
/// hangs (SIGTERM ends it) and never spins on a dead socket.
fn survives(lab: &ScopedLab, port: u16, what: &str, event: &[&[&str]], restore: &[&[&str]]) {
    let mut s = xdp_server(lab, port, &["--spin-then-block-us", "0"], &[]);
    assert!(pp(lab, port, &[]).is_some_and(|r| r["received"].as_u64() > Some(0)));
    for c in event {
        let o = Command::new(c[0]).args(&c[1..]).output().unwrap();
        assert!(o.status.success(), "{what}: {c:?}: {o:?}");
    }
    std::thread::sleep(Duration::from_millis(300));
    // A blocking engine on a dead or changed interface must not burn CPU.
    let t0 = s.cpu_ticks();
    std::thread::sleep(Duration::from_millis(1000));
    let busy = s.cpu_ticks() - t0;
    for c in restore {
        let _ = Command::new(c[0]).args(&c[1..]).output();
    }
    if s.alive() {
        assert!(
            busy < 50,
            "{what}: a blocking engine used {busy} ticks in 1 s after the event (spinning on a dead socket?)"
        );
        let r = pp(lab, port, &["--reply-timeout-ms", "500"]);
        let served = r.as_ref().is_some_and(|r| r["received"].as_u64() > Some(0));
        eprintln!("{what}: engine alive, serving after restore: {served}");
        // Either it serves again, or it ends cleanly on SIGTERM (no hang).
        s.signal(libc::SIGTERM);
        let (_, lines) = s
            .wait(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{what}: server hangs on SIGTERM"));
        assert!(
            served,
            "{what}: engine alive but not serving after restore; stderr: {lines:?}"
        );
    } else {
        let (st, lines) = s.wait(Duration::from_secs(1)).unwrap();
        let errs: Vec<_> = lines.iter().filter(|l| l.contains("error")).collect();
        eprintln!("{what}: engine exited ({st}): {errs:?}");
        assert!(!st.success(), "{what}: exit status says failure");
        assert_eq!(errs.len(), 1, "{what}: one clear error line: {lines:?}");
    }
    let mut out = String::new();
    if let Some(mut o) = s.out.take() {
        let _ = o.read_to_string(&mut out);
    }
}

#[test]
#[ignore = "needs root"]
fn interface_changes_under_a_running_engine() {
    let lab = lab('i');
    let (nb, ib) = (lab.netns(Host::B), lab.iface(Host::B));
    let cidr = "198.18.0.2/24";
    survives(
        &lab,
        11290,
        "link down/up",
        &[&["ip", "-n", &nb, "link", "set", "dev", &ib, "down"]],
        &[&["ip", "-n", &nb, "link", "set", "dev", &ib, "up"]],
    );
    survives(
        &lab,
        11291,
        "MTU 1400",
        &[&["ip", "-n", &nb, "link", "set", "dev", &ib, "mtu", "1400"]],
        &[&["ip", "-n", &nb, "link", "set", "dev", &ib, "mtu", "1500"]],
    );
    survives(
        &lab,
        11292,
        "address removed",
        &[&["ip", "-n", &nb, "addr", "del", cidr, "dev", &ib]],
        &[&["ip", "-n", &nb, "addr", "add", cidr, "dev", &ib]],
    );
}

#[test]
#[ignore = "needs root"]
fn interface_or_namespace_deleted_under_a_running_engine() {
    // The veth deleted: the engine's interface is gone for good.
    let lab1 = lab('d');
    let mut s = xdp_server(&lab1, 11293, &["--spin-then-block-us", "0"], &[]);
    ip_ns(
        &lab1.netns(Host::A),
        &["link", "del", "dev", &lab1.iface(Host::A)],
    );
    std::thread::sleep(Duration::from_millis(300));
    let t0 = s.cpu_ticks();
    std::thread::sleep(Duration::from_millis(1000));
    let busy = s.cpu_ticks().saturating_sub(t0);
    if s.alive() {
        eprintln!("veth deleted: engine still running ({busy} ticks in 1 s)");
        assert!(
            busy < 50,
            "engine spins on a dead socket: {busy} ticks in 1 s"
        );
        s.signal(libc::SIGTERM);
        assert!(
            s.wait(Duration::from_secs(10)).is_some(),
            "server hangs on SIGTERM after its interface was deleted"
        );
    } else {
        let (st, lines) = s.wait(Duration::from_secs(1)).unwrap();
        eprintln!("veth deleted: engine exited ({st}): {lines:?}");
        assert!(!st.success());
    }
    drop(s);
    drop(lab1);

    // The namespace deleted (its name; the process keeps it alive).
    let lab2 = lab('n');
    let mut s = xdp_server(&lab2, 11294, &["--spin-then-block-us", "0"], &[]);
    let o = Command::new("ip")
        .args(["netns", "del", &lab2.netns(Host::B)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        s.alive(),
        "deleting the namespace's name does not kill its processes"
    );
    // Still serving: the namespace lives on while the engine is in it.
    let r = pp(&lab2, 11294, &[]).expect("pp after netns del");
    assert!(r["received"].as_u64().unwrap() > 0, "{r}");
    s.signal(libc::SIGTERM);
    assert!(
        s.wait(Duration::from_secs(10)).is_some(),
        "server hangs on SIGTERM in a deleted namespace"
    );
}
