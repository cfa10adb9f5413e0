//! The engine service (issue 23, `NANOWIRE_SERVICE=1`): many processes on
//! one single-queue interface, each with its own AF_XDP socket on the
//! service's shared UMEM, all on xdp; an unprivileged user accelerated; a
//! process cannot claim a port it does not hold; garbage on the control
//! socket is refused and counted; kill -9 under traffic gives back the
//! process's claims and frames while the others go on. Each test in its own
//! lab (`tsv<tag><pid>`), real AF_XDP, real programs (python3) under
//! `nanowire run`.

mod run_support;
use nanowire_lab::testbed::{ADDR_A, ADDR_B, Host, ScopedLab};
use nanowire_stack::xdp::service::client::Conn;
use run_support::*;
use std::process::Command;
use std::time::{Duration, Instant};

/// A UDP echo server: prints "ready" once bound, echoes every datagram.
const ECHO: &str = UDP_ECHO_PY;

/// Python, put before a UDP client script: `echoed(s, host, p, i)` sends
/// datagram number `i` to port `p` and waits for its echo, byte for byte
/// (a lost one is resent, at most 5 times): how many sends it took; no
/// echo after 5 exits 1 with what failed.
macro_rules! py_echoed {
    () => {
        r#"
import socket, sys
def echoed(s, host, p, i):
    m = b"%d:%d:" % (p, i) + bytes(range(i % 200))
    for attempt in range(5):
        s.sendto(m, (host, p))
        try:
            while True:
                d, a = s.recvfrom(65536)
                if d == m and a == (host, p):
                    return attempt + 1
        except socket.timeout:
            continue
    print("no echo from port %d for message %d" % (p, i), flush=True); sys.exit(1)
"#
    };
}

/// Send N numbered datagrams to each port in turn, one at a time, and check
/// each echo byte for byte (a lost one is resent, at most 5 times, and
/// counted). Prints "ok SENT RESENT" or exits 1 with what failed.
const CLIENT: &str = concat!(
    py_echoed!(),
    r#"
host, ports, n = sys.argv[1], [int(p) for p in sys.argv[2].split(",")], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
sent = resent = 0
for p in ports:
    for i in range(n):
        k = echoed(s, host, p, i)
        sent += k; resent += k - 1
print("ok", sent, resent, flush=True)
"#
);

/// Send datagrams to a port (or to each of a comma-separated list in turn)
/// as fast as it can for SECONDS (no reading); prints "flooding" as it
/// starts.
const FLOOD: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ports = [int(p) for p in sys.argv[2].split(",")]
print("flooding", flush=True)
end = time.time() + float(sys.argv[3]); m = b"x" * 64; n = 0
while time.time() < end:
    try:
        s.sendto(m, (sys.argv[1], ports[n % len(ports)])); n += 1
    except OSError:
        pass
print("flooded", n, flush=True)
"#;

/// Ping-pong with each port in turn for SECONDS: every datagram numbered
/// and checked byte for byte (a lost one is resent, at most 5 times, and
/// counted). Prints "started" after the first echo of every port, then
/// "ok ECHOED RESENT", or exits 1 with what failed.
const STEADY: &str = concat!(
    py_echoed!(),
    r#"
import time
host, ports, secs = sys.argv[1], [int(p) for p in sys.argv[2].split(",")], float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
n = resent = i = 0
end = None
while end is None or time.time() < end:
    for p in ports:
        resent += echoed(s, host, p, i) - 1
        n += 1
    i += 1
    if end is None:
        print("started", flush=True)
        end = time.time() + secs
print("ok", n, resent, flush=True)
"#
);

const T: Duration = Duration::from_secs(60);

fn env_service(c: &mut Command) {
    c.env("NANOWIRE_SERVICE", "1")
        .env("NANOWIRE_LOG", "info")
        // Waits sleep: eight spinning processes on two vCPUs would starve
        // everything else.
        .env("NANOWIRE_SPIN_US", "0")
        // Small rings (the first attach sizes the service's UMEM: 1024 RX
        // frames, 512 on each process's ring): without frames taken back
        // from killed processes, a few kills under traffic strand them all.
        .env("NANOWIRE_RING_DEPTH", "1024");
}

/// An echo server under `nanowire run` on the service, once it is bound.
fn echo(lab: &ScopedLab, name: &str, port: u16, prefix: &[&str]) -> Kid {
    let (p, addr) = (port.to_string(), ADDR_B.to_string());
    let argv = ["python3", "-c", ECHO, &addr, &p];
    let mut k = spawn(name, svc_or_plain(lab, Host::B, true, prefix, &argv));
    k.wait_for("ready", T);
    k
}

/// `python3 -c SCRIPT ARGS` in host `h`, under run on its service when
/// `run` ([`svc_or_plain`]).
fn py(lab: &ScopedLab, h: Host, run: bool, name: &str, script: &str, args: &[&str]) -> Kid {
    let mut argv = vec!["python3", "-c", script];
    argv.extend_from_slice(args);
    spawn(name, svc_or_plain(lab, h, run, &[], &argv))
}

fn on_xdp(k: &Kid, port: u16) {
    let want = format!("udp {ADDR_B}:{port}: xdp (interface");
    assert!(
        until(Duration::from_secs(10), || k.stderr().contains(&want)),
        "{} not on xdp:\n{}",
        k.name,
        k.both()
    );
}

fn client(lab: &ScopedLab, name: &str, ports: &[u16], n: u32) -> String {
    let ports: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
    let (addr, ports, n) = (ADDR_B.to_string(), ports.join(","), n.to_string());
    let mut k = py(lab, Host::A, false, name, CLIENT, &[&addr, &ports, &n]);
    let out = k.success(T);
    assert!(out.contains("ok "), "{out}");
    out
}

fn status(lab: &ScopedLab) -> serde_json::Value {
    status_in(lab, Host::B)
}

fn status_in(lab: &ScopedLab, h: Host) -> serde_json::Value {
    json_in(lab, h, &["engine", "status"])
}

/// The JSON a `nanowire ARGS` prints in host `h`.
fn json_in(lab: &ScopedLab, h: Host, args: &[&str]) -> serde_json::Value {
    let mut argv = vec![nanowire()];
    argv.extend_from_slice(args);
    let out = nanowire_testkit::ok(&lab.command(h, &argv).output().unwrap());
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} JSON: {e}: {out}"))
}

/// The operator's service, stopped when the test ends (dropped before the
/// lab: declare it right after the lab).
struct Service(u32);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.0.to_string()])
            .status();
    }
}

/// The operator's way: `nanowire engine serve --daemon` in host b (root).
/// A long idle time: on a loaded machine the first program may take
/// seconds to attach, and a service that went idle before it would leave
/// it on spin; the guard stops the service instead.
/// A client of the running service, attached to `ifname` (1,024 frames).
fn attached(ifname: &str) -> nanowire_stack::xdp::service::client::Attached {
    Conn::connect_existing()
        .unwrap()
        .attach(ifname, 1024)
        .unwrap()
}

fn start_service(lab: &ScopedLab) -> Service {
    start_service_with(lab, &[])
}

fn start_service_in(lab: &ScopedLab, h: Host) -> Service {
    start_service_on(lab, h, &[])
}

/// The operators' services on both hosts, host b's first.
fn start_services(lab: &ScopedLab) -> [Service; 2] {
    [start_service(lab), start_service_in(lab, Host::A)]
}

fn start_service_with(lab: &ScopedLab, extra: &[&str]) -> Service {
    start_service_on(lab, Host::B, extra)
}

fn start_service_on(lab: &ScopedLab, h: Host, extra: &[&str]) -> Service {
    let mut argv = vec![
        nanowire(),
        "engine",
        "serve",
        "--daemon",
        "--idle-ms",
        "600000",
    ];
    argv.extend_from_slice(extra);
    assert!(lab.command(h, &argv).status().unwrap().success());
    let st = status_in(lab, h);
    Service(st["pid"].as_u64().expect("service pid") as u32)
}

fn claims_of(st: &serde_json::Value) -> Vec<String> {
    let mut v = Vec::new();
    for i in st["ifaces"].as_array().unwrap() {
        for c in i["clients"].as_array().unwrap() {
            for k in c["claims"].as_array().unwrap() {
                v.push(k.as_str().unwrap().to_string());
            }
        }
    }
    v
}

/// `n` echo servers on the service (ports `first`..), each on xdp.
fn echoes_on_xdp(lab: &ScopedLab, tag: &str, first: u16, n: u16) -> (Vec<u16>, Vec<Kid>) {
    let ports: Vec<u16> = (first..first + n).collect();
    let kids: Vec<Kid> = ports
        .iter()
        .map(|&p| echo(lab, &format!("{tag}-echo-{p}"), p, &[]))
        .collect();
    for (k, &p) in kids.iter().zip(&ports) {
        on_xdp(k, p);
    }
    (ports, kids)
}

/// The service of host b has an interface of `queues` queues with one
/// client per port of `ports`, each claiming its UDP port.
fn assert_one_claim_each(lab: &ScopedLab, queues: u32, ports: &[u16]) {
    let st = status(lab);
    let ifc = &st["ifaces"][0];
    assert_eq!(ifc["queues"], queues, "{st}");
    assert_eq!(
        ifc["clients"].as_array().unwrap().len(),
        ports.len(),
        "{st}"
    );
    let claims = claims_of(&st);
    for p in ports {
        assert!(
            claims.contains(&format!("udp:{ADDR_B}:{p}")),
            "{p} not claimed: {st}"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn eight_udp_echo_processes_share_one_queue_all_on_xdp() {
    let lab = lab("v8");
    let (ports, kids) = echoes_on_xdp(&lab, "v8", 12001, 8);
    let out = client(&lab, "v8-client", &ports, 200);
    eprintln!("client: {out}");
    // The service carries all eight: one slot and one claim each.
    assert_one_claim_each(&lab, 1, &ports);
    // Their own counters say xdp, through the service, with traffic.
    let stats = stats_json(&lab);
    for k in &kids {
        // `nanowire run` execs python: the pid is the engine's.
        let e = engine_of(&stats, k.child.id());
        assert!(
            e["xdp_mode"]
                .as_str()
                .unwrap()
                .contains("via engine service"),
            "{e}"
        );
        assert!(e["counters"]["rx_packets"].as_u64().unwrap() >= 200, "{e}");
        assert!(e["counters"]["tx_packets"].as_u64().unwrap() >= 200, "{e}");
    }
}

/// Issue 23's per-message path: a process on the service reads its UMEM
/// through 2 MiB pages (the service's own huge tmpfs; an own engine's
/// anonymous UMEM has them too) where the status says so, and otherwise
/// the status says why not; its packets ask the kernel for their checksums
/// (TX metadata on the shared UMEM) as an own engine's do.
#[test]
#[ignore = "needs root"]
fn a_process_on_the_service_gets_huge_pages_and_checksum_offload_as_an_own_engine() {
    let lab = lab("vhp");
    let (ports, kids) = echoes_on_xdp(&lab, "vhp", 12101, 1);
    let out = client(&lab, "vhp-client", &ports, 100);
    eprintln!("client: {out}");
    let st = status(&lab);
    let ifc = &st["ifaces"][0];
    let pid = kids[0].child.id();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let pmd_kib: u64 = line_of(&smaps, "ShmemPmdMapped:")
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{smaps}"));
    match ifc["umem_pages"].as_str() {
        Some("huge tmpfs") => assert!(pmd_kib >= 2048, "no 2 MiB page mapped: {smaps}\n{st}"),
        Some(w) => assert!(w.starts_with("4 KiB: ") && w.len() > 7, "{st}"),
        None => panic!("no umem_pages: {st}"),
    }
    let stats = stats_json(&lab);
    let e = engine_of(&stats, pid);
    let offloaded = e["counters"]["tx_csum_offload"].as_u64().unwrap();
    if ifc["tx_metadata"] == true {
        assert!(offloaded >= 100, "{e}\n{st}");
    } else {
        assert_eq!(offloaded, 0, "{e}\n{st}");
    }
}

/// Issue 23's per-message path: while processes are attached and nothing
/// is due (no reclaim deferred, no TCP listener group to sweep), the
/// service sleeps in its poll without a timeout: nothing of it wakes on a
/// timer to compete for a CPU with the processes (it woke 5 times a
/// second). Seen in /proc/PID/syscall: ppoll's timeout argument is NULL.
#[test]
#[ignore = "needs root"]
fn the_service_sleeps_without_a_timer_while_its_processes_are_attached() {
    let lab = lab("vsl");
    let (ports, _kids) = echoes_on_xdp(&lab, "vsl", 12111, 1);
    client(&lab, "vsl-client", &ports, 100);
    let pid = status(&lab)["pid"].as_u64().expect("service pid");
    let mut seen = String::new();
    let asleep = until(Duration::from_secs(10), || {
        seen = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        seen.split_whitespace().next() == Some(libc::SYS_ppoll.to_string().as_str())
    });
    assert!(asleep, "the service is not in ppoll: {seen:?}");
    let timeout = seen.split_whitespace().nth(3);
    assert_eq!(timeout, Some("0x0"), "ppoll with a timeout: {seen:?}");
}

/// The same eight on an interface of 4 RX queues (`lab up --queues 4`):
/// every process gets an AF_XDP socket per queue on the service's shared
/// UMEM of that queue and the program redirects to the owner's socket of
/// the queue a frame arrived on, so flows hashed to any queue reach their
/// owner. Two clients (different source ports, so different hashes).
#[test]
#[ignore = "needs root"]
fn eight_processes_on_four_queues_all_on_xdp() {
    let lab = nanowire_testkit::lab_with(
        "tsv4q",
        nanowire_lab::testbed::LabOptions {
            queues: 4,
            ..Default::default()
        },
    );
    let (ports, _kids) = echoes_on_xdp(&lab, "v4q", 12401, 8);
    client(&lab, "v4q-client1", &ports, 50);
    client(&lab, "v4q-client2", &ports, 50);
    assert_one_claim_each(&lab, 4, &ports);
}

#[test]
#[ignore = "needs root"]
fn an_unprivileged_users_program_is_accelerated() {
    let lab = lab("vu");
    // The operator's service (root); the program runs as nobody.
    let _service = start_service(&lab);
    let k = echo(&lab, "vu-echo", 12100, NOBODY);
    on_xdp(&k, 12100);
    client(&lab, "vu-client", &[12100], 200);
    let st = status(&lab);
    let c = &st["ifaces"][0]["clients"][0];
    assert_eq!(c["uid"], 65534, "{st}");
    assert_eq!(c["claims"][0], format!("udp:{ADDR_B}:12100"), "{st}");
    // Its engine's page is in no directory (the stats directory is
    // root's): it handed the sealed page to the service, which reads its
    // drop counters for `nanowire stats`.
    let st = stats_json(&lab);
    let pid = k.child.id();
    assert!(
        st["engines"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["pid"] != pid),
        "{st}"
    );
    let c = client_of(&st, pid);
    assert!(c["engine_drops"]["drop_no_socket"].is_u64(), "{c}");
    assert!(
        !k.stderr().contains("refused this engine's stats page"),
        "{}",
        k.both()
    );
}

/// A listener on the service that greets one connection, then waits for
/// the flag file before it exits (its engine's counters stay readable).
const GREETER: &str = concat!(
    py_prelude!(),
    r#"
import os, time
c, _ = listener(8).accept()
c.sendall(b"hello\n"); c.close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.01)
print("done", flush=True)
"#
);

/// The kernel's count of SYN retransmissions in host `h`.
fn syn_retrans(lab: &ScopedLab, h: Host) -> u64 {
    let o = lab
        .command(h, &["cat", "/proc/net/netstat"])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<Vec<&str>> = t
        .lines()
        .filter(|l| l.starts_with("TcpExt:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let i = rows[0]
        .iter()
        .position(|k| *k == "TCPSynRetrans")
        .expect("TCPSynRetrans in /proc/net/netstat");
    rows[1][i].parse().unwrap()
}

/// A listener on the service answered a SYN 200-460 ms late when the
/// client's MAC was not in its neighbour cache: the SYN-ACK was parked,
/// the neighbour thread resolved the MAC in < 1 ms but woke nobody, and the
/// blocking accept (busy with the half-open connection) turned the engine
/// every 50 ms and read the clock (which runs `unpark`) every 16th turn.
/// Now the resolution wakes the TCP timer service, which sends what was
/// parked (`neigh_unparked` counts it). The server's neighbour cache is
/// flushed and its engine knows no neighbour: the SYN-ACK is parked; the
/// plain client gets its greeting, with no SYN retransmitted, nothing
/// retransmitted or lost by the engine.
#[test]
#[ignore = "needs root"]
fn a_syn_ack_parked_for_the_clients_mac_leaves_when_it_resolves() {
    let lab = lab("vn");
    let _service = start_service(&lab);
    let addr = ADDR_B.to_string();
    let flag = scratch("vn-flag");
    let _ = std::fs::remove_file(&flag);
    let flag_s = flag.to_string_lossy().into_owned();
    let mut srv = py(
        &lab,
        Host::B,
        true,
        "vn-srv",
        GREETER,
        &[&addr, "12300", &flag_s],
    );
    srv.wait_for("listening", T);
    on_engine(&srv, &format!("tcp listener {addr}:12300"));
    let flush = lab
        .command(Host::B, &["ip", "neigh", "flush", "all"])
        .status()
        .unwrap();
    assert!(flush.success());
    let syn0 = syn_retrans(&lab, Host::A);
    let hello =
        "import socket,sys; c=socket.create_connection((sys.argv[1], 12300)); print(c.recv(100))";
    let mut cli = py(&lab, Host::A, false, "vn-cli", hello, &[&addr]);
    let out = cli.success(T);
    assert!(out.contains("hello"), "{out}");
    let pid = srv.child.id();
    let st = stats_json(&lab);
    let ctr = &engine_of(&st, pid)["counters"];
    std::fs::write(&flag, b"").unwrap();
    assert!(srv.success(T).contains("done"));
    assert!(ctr["neigh_unparked"].as_u64().unwrap_or(0) >= 1, "{ctr}");
    assert_eq!(ctr["drop_neigh_unresolved"], 0, "{ctr}");
    assert_eq!(ctr["tcp_retransmits"], 0, "{ctr}");
    assert_eq!(
        syn_retrans(&lab, Host::A),
        syn0,
        "the client sent its SYN again"
    );
}

#[test]
#[ignore = "needs root"]
fn claims_need_the_port_and_garbage_is_refused_and_counted() {
    let (lab, _service, st) = in_b_beside_a_service("vc", |ifname| {
        use std::os::fd::AsFd;
        let held = std::net::UdpSocket::bind((ADDR_B, 12201)).unwrap();
        let at = attached(&ifname);
        let (c, h) = (&at.conn, held.as_fd());
        // A port the socket does not hold.
        refused(c.claim(ADDR_B, 12202, h), "holds port 12201");
        // Another address than the socket's.
        refused(c.claim(ADDR_A, 12201, h), "not claimed");
        // A TCP socket for a UDP claim.
        let t = std::net::TcpListener::bind((ADDR_B, 12203)).unwrap();
        refused(c.claim(ADDR_B, 12203, t.as_fd()), "not of that protocol");
        // The port it holds.
        c.claim(ADDR_B, 12201, h).unwrap();
        // Another process (connection) with the same socket: refused.
        let other = attached(&ifname);
        refused(
            other.conn.claim(ADDR_B, 12201, h),
            "claimed by another process",
        );
        // Garbage: refused with its reason, the connection closed, the
        // service goes on.
        let g = Conn::connect_existing().unwrap();
        let e = g.raw(b"hello, service").unwrap();
        assert!(e.contains("bad message: bad_magic"), "{e}");
        assert!(g.raw(b"again").is_err(), "the connection must be closed");
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..200usize {
            let c = Conn::connect_existing().unwrap();
            let mut b = Vec::new();
            for _ in 0..(n % 70) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                b.push(seed as u8);
            }
            if n % 3 == 0 && b.len() >= 8 {
                // Right magic, random kind and body.
                b[..4].copy_from_slice(&0x6e77_6531u32.to_le_bytes());
            }
            let _ = c.raw(&b);
        }
        // A claim before attach, and a claim without its socket.
        let c = Conn::connect_existing().unwrap();
        assert!(c.claim(ADDR_B, 12201, held.as_fd()).is_err());
        let s = Conn::connect_existing().unwrap().status().unwrap();
        drop(at);
        s
    });
    let bad = &st["counters"]["bad_messages"];
    assert!(bad["bad_magic"].as_u64().unwrap() >= 1, "{st}");
    assert!(bad["claim_before_attach"].as_u64().unwrap() >= 1, "{st}");
    assert!(
        st["counters"]["claims_refused"].as_u64().unwrap() >= 4,
        "{st}"
    );
    // Still serving.
    let st = status(&lab);
    assert!(
        st["counters"]["connections"].as_u64().unwrap() >= 200,
        "{st}"
    );
}

#[test]
#[ignore = "needs root"]
fn kill_9_under_traffic_gives_back_claims_and_frames_and_the_others_go_on() {
    let lab = lab("vk");
    let (a, b) = (12301u16, 12302u16);
    let keep = echo(&lab, "vk-b", b, &[]);
    on_xdp(&keep, b);
    for round in 0..5 {
        let victim = echo(&lab, &format!("vk-a{round}"), a, &[]);
        on_xdp(&victim, a);
        client(&lab, &format!("vk-pre{round}"), &[a, b], 20);
        let args = [&ADDR_B.to_string(), &a.to_string(), "1.0"];
        let name = format!("vk-flood{round}");
        let mut flood = py(&lab, Host::A, false, &name, FLOOD, &args);
        std::thread::sleep(Duration::from_millis(400));
        kill_9(victim.child.id());
        drop(victim);
        flood.success(T);
        // Its claim goes at once (the service saw the socket close).
        let want = format!("udp:{ADDR_B}:{a}");
        let gone = until(Duration::from_secs(5), || {
            !claims_of(&status(&lab)).contains(&want)
        });
        assert!(gone, "claim of {a} not released: {}", status(&lab));
        // The other process goes on: more datagrams than the whole UMEM
        // has RX frames, each echoed intact.
        client(&lab, &format!("vk-post{round}"), &[b], 1500);
    }
    let st = status(&lab);
    assert!(
        st["counters"]["frames_reclaimed"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert_eq!(st["counters"]["detaches"].as_u64().unwrap(), 5, "{st}");
}

/// Issue 24: a process killed with -9 while it holds the shared UMEM's
/// lock, under load. The test hook `NANOWIRE_TEST_STOP_IN_LOCK=N` makes it
/// stop itself (SIGSTOP) the Nth time it takes the lock, with the lock
/// held; the test waits until it is stopped, kills it, and the other
/// process goes on: more datagrams than the UMEM has RX frames, each echoed
/// intact; the service took the lock over and the dead one's frames back.
#[test]
#[ignore = "needs root"]
fn kill_9_while_holding_the_shared_lock_under_load_the_others_go_on() {
    let lab = lab("vl");
    let (a, b) = (12311u16, 12312u16);
    let keep = echo(&lab, "vl-b", b, &[]);
    on_xdp(&keep, b);
    let victim = echo(&lab, "vl-a", a, &["env", "NANOWIRE_TEST_STOP_IN_LOCK=20"]);
    on_xdp(&victim, a);
    let addr = ADDR_B.to_string();
    let flood = |port: u16, name: &str| {
        spawn(
            name,
            plain_in(
                &lab,
                Host::A,
                &["python3", "-c", FLOOD, &addr, &port.to_string(), "2.0"],
            ),
        )
    };
    let (mut fa, mut fb) = (flood(a, "vl-flood-a"), flood(b, "vl-flood-b"));
    // Stopped with the lock held.
    wait_stopped(&victim, "in the lock");
    kill_9(victim.child.id());
    drop(victim);
    fa.success(T);
    fb.success(T);
    client(&lab, "vl-post", &[b], 1500);
    let st = status(&lab);
    let k = &st["counters"];
    assert_eq!(k["locks_taken_over"], 1, "{st}");
    assert!(k["frames_reclaimed"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(k["detaches"], 1, "{st}");
}

/// Wait until `k` is stopped (state T in /proc/PID/stat: a test hook
/// stopped it `where`).
#[track_caller]
fn wait_stopped(k: &Kid, r#where: &str) {
    let stat = format!("/proc/{}/stat", k.child.id());
    let end = Instant::now() + T;
    loop {
        let s = std::fs::read_to_string(&stat).unwrap_or_default();
        if s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
        {
            return;
        }
        assert!(
            Instant::now() < end,
            "{} never stopped {where}: {s}\n{}",
            k.name,
            k.both()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The service killed (kill -9) under traffic, then restarted. Decided
/// (docs/architecture.md, "The engine service"): the XDP program's link and
/// the claims are the service's, so they go with it and every frame reaches
/// the kernel again, where each claimed port has the kernel socket that
/// held it (a claim needs one). Each attached process sees its control
/// socket hang up, says so at the default log level and moves its sockets
/// to their kernel sockets (datagrams already on its rings delivered
/// first): the traffic goes on, every message echoed intact, nothing hangs.
/// Its engine then goes (closing its AF_XDP sockets frees the queues), so a
/// restarted service can bind them: a new process is on xdp through it, and
/// the old ones keep echoing through the kernel.
#[test]
#[ignore = "needs root"]
fn the_service_killed_under_traffic_processes_fall_back_and_a_restarted_one_serves() {
    let lab = lab("vr");
    let first = start_service(&lab);
    let (a, b, c) = (12501u16, 12502u16, 12503u16);
    let ea = echo(&lab, "vr-a", a, &[]);
    let eb = echo(&lab, "vr-b", b, &[]);
    on_xdp(&ea, a);
    on_xdp(&eb, b);
    let ports = format!("{a},{b}");
    let args = [&ADDR_B.to_string(), &ports, "3.0"];
    let mut steady = py(&lab, Host::A, false, "vr-steady", STEADY, &args);
    steady.wait_for("started", T);
    std::thread::sleep(Duration::from_millis(500));
    kill_9(first.0);
    // Killed: never signal that pid again (it may be reused).
    std::mem::forget(first);
    let out = steady.success(T);
    eprintln!("steady: {out}");
    // Every message echoed intact, none lost on the way (a stop-and-wait
    // ping-pong on a quiet veth: the kernel path loses none either).
    let resent = line_of(&out, "ok ").split_whitespace().nth(2);
    assert_eq!(resent, Some("0"), "{out}\n{}\n{}", ea.both(), eb.both());
    // Announced at the default log level, per process and per socket.
    for (k, p) in [(&ea, a), (&eb, b)] {
        until(Duration::from_secs(10), || {
            k.stderr().contains("taken off the xdp engine")
        });
        let err = k.stderr();
        assert!(err.contains("the engine service is gone"), "{p}: {err}");
        assert!(
            err.contains(
                "udp: taken off the xdp engine (kernel socket, spin engine): \
                 the engine service is gone"
            ),
            "{p}: {err}"
        );
    }
    client(&lab, "vr-after-kill", &[a, b], 100);
    // A restarted service serves a new process on xdp (the old processes'
    // sockets closed theirs, so the queue is free), and the old ones go on.
    let _second = start_service(&lab);
    let ec = echo(&lab, "vr-c", c, &[]);
    on_xdp(&ec, c);
    client(&lab, "vr-after-restart", &[a, b, c], 100);
    let st = status(&lab);
    let clients = st["ifaces"][0]["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 1, "{st}");
    assert_eq!(clients[0]["pid"], ec.child.id(), "{st}");
    assert_eq!(claims_of(&st), vec![format!("udp:{ADDR_B}:{c}")], "{st}");
}

/// The prefix that runs a program as user (and group) `uid`.
const fn as_user(uid: &'static str) -> [&'static str; 7] {
    [
        "setpriv",
        "--reuid",
        uid,
        "--regid",
        uid,
        "--clear-groups",
        "--",
    ]
}

const NOBODY: &[&str] = &as_user("65534");

/// A policy file as the operator writes it (root's, mode 0644).
fn policy_file(name: &str, text: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let f = scratch(name);
    std::fs::write(&f, text).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    f.to_str().unwrap().to_string()
}

/// Two users on one single-queue interface, no trust line: the second
/// user's process is not given the first user's packet memory; it runs on
/// spin with the service's one-line reason, and both echo intact.
#[test]
#[ignore = "needs root"]
fn two_users_without_a_trust_line_never_share_a_umem() {
    let lab = lab("vt");
    let _service = start_service(&lab);
    let root = echo(&lab, "vt-root", 12601, &[]);
    on_xdp(&root, 12601);
    let other = echo(&lab, "vt-nobody", 12602, NOBODY);
    let want = "no policy trust line lets uid 65534 share packet memory";
    until(Duration::from_secs(10), || other.stderr().contains(want));
    let err = other.stderr();
    assert!(err.contains(want), "{err}");
    assert!(err.contains("udp: spin (kernel socket)"), "{err}");
    client(&lab, "vt-client", &[12601, 12602], 50);
    let st = status(&lab);
    let clients = st["ifaces"][0]["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 1, "{st}");
    assert_eq!(clients[0]["uid"], 0, "{st}");
    assert!(
        st["counters"]["bad_messages"]["untrusted_user"]
            .as_u64()
            .unwrap()
            >= 1,
        "{st}"
    );
}

/// With a policy `trust` line the two users' processes share the UMEM,
/// both on xdp; an `allow` line keeps a third user off it. A policy file
/// others may write, or a symbolic link, is refused with a clear line and
/// no service starts.
#[test]
#[ignore = "needs root"]
fn a_trust_line_lets_two_users_share_and_a_bad_policy_file_is_refused() {
    let lab = lab("vp");
    let loose = policy_file("vp-loose", "trust root 65534\n");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let argv = [
        nanowire(),
        "engine",
        "serve",
        "--daemon",
        "--policy",
        &loose,
    ];
    let o = lab.command(Host::B, &argv).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("group or others may write it"), "{err}");
    let link = scratch("vp-link");
    let good = policy_file(
        "vp-good",
        "# root and nobody trust each other; uid 65533 may use no interface\n\
         trust root 65534\nallow 0 *\nallow 65534 *\n",
    );
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let o = lab
        .command(
            Host::B,
            &[
                nanowire(),
                "engine",
                "serve",
                "--daemon",
                "--policy",
                link.to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("symbolic link"),
        "{err}"
    );
    let _service = start_service_with(&lab, &["--policy", &good]);
    let root = echo(&lab, "vp-root", 12701, &[]);
    let other = echo(&lab, "vp-nobody", 12702, NOBODY);
    on_xdp(&root, 12701);
    on_xdp(&other, 12702);
    let third = echo(&lab, "vp-65533", 12703, &as_user("65533"));
    let want = "uid 65533 may not be accelerated on";
    let said = until(Duration::from_secs(10), || third.stderr().contains(want));
    assert!(said, "{}", third.both());
    client(&lab, "vp-client", &[12701, 12702, 12703], 50);
    let st = status(&lab);
    let mut uids: Vec<u64> = st["ifaces"][0]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["uid"].as_u64().unwrap())
        .collect();
    uids.sort();
    assert_eq!(uids, vec![0, 65534], "{st}");
}

// ---------------------------------------------------------------- TCP

/// A TCP server: `ADDR PORT CONNS`. Prints "listening"; per connection it
/// reads to EOF, answers "<bytes> <crc32>\n" and 2 MiB that depend on the
/// byte count, then closes; "done" at the end.
const TCP_SERVER: &str = concat!(
    py_prelude!(),
    r#"
import zlib
s = listener(8)
for _ in range(int(sys.argv[3])):
    c, _ = s.accept()
    crc = n = 0
    while True:
        d = c.recv(1 << 16)
        if not d: break
        crc = zlib.crc32(d, crc); n += len(d)
    c.sendall(b"%d %d\n" % (n, crc) + bytes((i * 7 + n) & 255 for i in range(1 << 20)) * 2)
    c.close()
print("done", flush=True)
"#
);

/// A TCP client: `ADDR PORT SEED [slow]`: sends 1 MiB (from SEED plus 1
/// byte per SEED, so every client's count differs), half-closes, reads to
/// EOF and checks the answer; prints what both sides saw, hashed. `slow`:
/// a 64 KiB receive buffer, and a 2 s pause in reading when 200 KiB of the
/// answer are left (the server has written everything, closed and is
/// exiting while the client's window is shut).
const TCP_CLIENT: &str = r#"
import socket, sys, time, zlib
seed = int(sys.argv[3]); slow = sys.argv[4:] == ["slow"]
c = socket.socket()
if slow: c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
c.settimeout(30); c.connect((sys.argv[1], int(sys.argv[2])))
data = bytes((i * 13 + seed) & 255 for i in range((1 << 20) + seed))
c.sendall(data); c.shutdown(socket.SHUT_WR)
buf = bytearray(); paused = not slow
while True:
    d = c.recv(1 << 16)
    if not d: break
    buf += d
    if not paused and len(buf) > (1 << 21) - (200 << 10):
        paused = True; time.sleep(2)
line, rest = bytes(buf).split(b"\n", 1)
want = bytes((i * 7 + len(data)) & 255 for i in range(1 << 20)) * 2
ok = line == b"%d %d" % (len(data), zlib.crc32(data)) and rest == want
print("server saw", line.decode(), "sent", len(data), zlib.crc32(data))
print("got", len(rest), zlib.crc32(rest), "ok" if ok else "MISMATCH")
"#;

/// A service started in a lab tagged `tag`, then `f` in host b's
/// namespace (given the interface's name), returning the service's status
/// (JSON text): the lab, the service and that status.
fn in_b_beside_a_service(
    tag: &str,
    f: impl FnOnce(String) -> String + Send + 'static,
) -> (ScopedLab, Service, serde_json::Value) {
    let lab = lab(tag);
    let service = start_service(&lab);
    let ifname = lab.iface(Host::B);
    let out = nanowire_testkit::in_ns(&lab.netns(Host::B), move || f(ifname));
    (lab, service, serde_json::from_str(&out).unwrap())
}

/// A request the service refused, saying `why`.
#[track_caller]
fn refused<T: std::fmt::Debug, E: std::fmt::Display>(r: Result<T, E>, why: &str) {
    let e = r.unwrap_err().to_string();
    assert!(e.contains(why), "{e}");
}

/// `argv` in host `h`: under `nanowire run` on the engine service when
/// `run` (after `prefix`, e.g. setpriv), else plainly.
fn svc_or_plain(lab: &ScopedLab, h: Host, run: bool, prefix: &[&str], argv: &[&str]) -> Command {
    let mut v: Vec<&str> = prefix.to_vec();
    if run {
        ensure_preload();
        v.extend_from_slice(&[nanowire(), "run", "--"]);
    }
    v.extend_from_slice(argv);
    let mut c = lab.command(h, &v);
    if run {
        env_service(&mut c);
    }
    c
}

fn tcp_server(
    lab: &ScopedLab,
    name: &str,
    run: bool,
    prefix: &[&str],
    port: u16,
    conns: u32,
) -> Kid {
    let (p, n) = (port.to_string(), conns.to_string());
    let argv = ["python3", "-c", TCP_SERVER, &ADDR_B.to_string(), &p, &n];
    let mut k = spawn(name, svc_or_plain(lab, Host::B, run, prefix, &argv));
    k.wait_for("listening", T);
    if run {
        on_engine(&k, &format!("tcp listener {ADDR_B}:{port}"));
    }
    k
}

fn tcp_client(
    lab: &ScopedLab,
    name: &str,
    run: bool,
    prefix: &[&str],
    port: u16,
    seed: u32,
) -> Kid {
    let (p, s) = (port.to_string(), seed.to_string());
    let argv = ["python3", "-c", TCP_CLIENT, &ADDR_B.to_string(), &p, &s];
    spawn(name, svc_or_plain(lab, Host::A, run, prefix, &argv))
}

/// A TCP server in host b per (port, seed), then a client of each in host
/// a sending its seed's body (`runs`: server, client under run on the
/// service, after `prefix`), all at once; each client's answer checked,
/// each server done. Per port: the client's output and both stderrs.
fn tcp_servers_and_clients(
    lab: &ScopedLab,
    tag: &str,
    (srv_run, cli_run): (bool, bool),
    prefix: &[&str],
    ports: &[(u16, u32)],
) -> Vec<(String, String)> {
    let mut servers: Vec<Kid> = ports
        .iter()
        .map(|&(p, _)| tcp_server(lab, &format!("{tag}-srv{p}"), srv_run, prefix, p, 1))
        .collect();
    let mut clients: Vec<Kid> = ports
        .iter()
        .map(|&(p, seed)| tcp_client(lab, &format!("{tag}-cli{p}"), cli_run, prefix, p, seed))
        .collect();
    let mut outs = Vec::new();
    for ((c, s), &(p, _)) in clients.iter_mut().zip(&mut servers).zip(ports) {
        let out = tcp_client_done(c, cli_run, p);
        let sout = s.success(T);
        assert!(sout.contains("done"), "{sout}");
        outs.push((out, format!("{}\n{}", s.stderr(), c.stderr())));
    }
    outs
}

/// The client finished, its answer checked; under run its connection was
/// on the engine.
fn tcp_client_done(k: &mut Kid, run: bool, port: u16) -> String {
    k.success(T);
    let out = k.stdout();
    assert!(out.contains(" ok"), "{}: {out}\n{}", k.name, k.stderr());
    if run {
        on_engine(k, &format!("-> {ADDR_B}:{port}"));
    }
    out
}

/// TCP through the engine service, differentially: the same client and
/// server plainly, and with the server, the client or both under run on
/// their host's service (each host its own network namespace, so its own
/// service): both ends' bodies hashed, the outputs identical to the plain
/// run's; the service's counters show the listener claim and the
/// client's client-port claim (no 4-tuple claim: docs/architecture.md,
/// "Client port block").
#[test]
#[ignore = "needs root"]
fn tcp_through_the_service_in_all_four_placements() {
    let lab = lab("vt4");
    // The operators' services: one per host for the whole test (one
    // started on demand would exit while a plain placement runs).
    let _services = start_services(&lab);
    let mut want = None;
    for (i, (srv_run, cli_run)) in [(false, false), (true, false), (false, true), (true, true)]
        .into_iter()
        .enumerate()
    {
        let port = 15001 + i as u16;
        let runs = (srv_run, cli_run);
        let (out, ctx) = tcp_servers_and_clients(&lab, "vt4", runs, &[], &[(port, 3)]).remove(0);
        let what = format!("server run {srv_run}, client run {cli_run}");
        same_as_first(&mut want, &what, out, &ctx);
    }
    // Host a's service carried the clients' connections: ports of their
    // client port blocks (claimed once per port, no 4-tuple claim).
    let st = status_in(&lab, Host::A);
    assert!(st["counters"]["claims"].as_u64().unwrap() >= 2, "{st}");
    assert_eq!(st["counters"]["tcp_flows"].as_u64(), Some(0), "{st}");
    let st = status(&lab);
    assert!(st["counters"]["claims"].as_u64().unwrap() >= 2, "{st}");
    // The plain client's 1 MiB came as TSO/GSO super-frames: in generic
    // mode the service started with the program without xdp.frags (a
    // frags-aware one costs generic XDP a copy and an skb per frame) and
    // the server's first multi-buffer packet had it replaced, once.
    let ifc = &st["ifaces"][0];
    assert_eq!(ifc["xdp_frags"], true, "{st}");
    let upgrades = st["counters"]["frags_upgrades"].as_u64().unwrap();
    let want = u64::from(ifc["xdp_mode"] == "generic");
    assert_eq!(upgrades, want, "{st}");
}

/// A TCP echo server: `ADDR PORT`. Prints "listening", then "accepted N"
/// per connection, served on a thread of its own with blocking calls (no
/// timeout): echoes until EOF, then "conn N: eof after BYTES"; an error
/// ends it with "conn N: ERRNO after BYTES".
const TCP_ECHO_SERVER: &str = concat!(
    py_prelude!(),
    r#"
import errno, threading
s = listener(8)
def serve(c, n):
    got = 0
    try:
        while True:
            d = c.recv(65536)
            if not d:
                print("conn %d: eof after %d" % (n, got), flush=True); break
            got += len(d); c.sendall(d)
    except OSError as e:
        print("conn %d: %s after %d" % (n, errno.errorcode.get(e.errno, e), got), flush=True)
    c.close()
n = 0
while True:
    c, _ = s.accept(); n += 1
    print("accepted %d" % n, flush=True)
    threading.Thread(target=serve, args=(c, n), daemon=True).start()
"#
);

/// A TCP ping-pong client: `ADDR PORT SECS [GO]`, blocking calls without
/// a timeout (a hang shows as the test's timeout): 1,000-byte numbered
/// messages, each echo checked byte for byte. Prints "started" after the
/// first echo (then stays idle until the file GO exists), then "end ok N"
/// after SECS, or "end ERRNO after N" / "end eof after N" when the
/// connection ended; a wrong byte exits 1.
const TCP_PINGPONG: &str = r#"
import errno, os, socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
secs = float(sys.argv[3]); i = 0; end = None; outcome = None
go = sys.argv[4] if len(sys.argv) > 4 else None
try:
    while end is None or time.time() < end:
        m = b"%08d" % i + bytes((i + k) & 255 for k in range(992))
        c.sendall(m)
        buf = b""
        while len(buf) < len(m):
            d = c.recv(len(m) - len(buf))
            if not d:
                outcome = "eof after %d" % i; break
            buf += d
        if outcome: break
        if buf != m:
            print("MISMATCH at", i, flush=True); sys.exit(1)
        i += 1
        if end is None:
            print("started", flush=True)
            while go and not os.path.exists(go):
                time.sleep(0.02)
            end = time.time() + secs
except OSError as e:
    outcome = "%s after %d" % (errno.errorcode.get(e.errno, str(e)), i)
print("end", outcome or "ok %d" % i, flush=True)
c.close()
"#;

/// The engine service killed under TCP traffic (issue 23: "processes fall
/// back or re-attach, nothing hangs"). A TCP echo server under run on host
/// b's service, two ping-pong clients under run on host a's, one idle
/// (between its first message and the rest), one busy; host b's service is
/// killed (-9) mid-traffic. Its program and claims go with it, so every
/// segment reaches host b's kernel, which has the listener's socket but no
/// connection for the engine's 4-tuple. The server process, told by its
/// control socket, puts its listener back on the kernel (which listens
/// already) and hands its connections to the kernel (TCP_REPAIR) or resets
/// them, each said at the default log level. Then: every blocking call
/// returned (the clients' calls, the server's recvs), no byte was wrong;
/// the idle connection goes on through the kernel (handed over before its
/// next segment came); the busy one went on or ended (the kernel answers
/// with RST what arrives between the death and the hand-over: then both
/// ends see the reset), printed; a new connection to the same server works
/// (through the kernel); a restarted service carries a new server process
/// on xdp (the old engine let the queue go).
#[test]
#[ignore = "needs root"]
fn the_service_killed_under_tcp_traffic_nothing_hangs_and_new_connections_work() {
    let lab = lab("vkt");
    let first = start_service(&lab);
    let _sa = start_service_in(&lab, Host::A);
    let addr = ADDR_B.to_string();
    let server = |name: &str, port: u16| {
        let p = port.to_string();
        let mut k = py(&lab, Host::B, true, name, TCP_ECHO_SERVER, &[&addr, &p]);
        k.wait_for("listening", T);
        on_engine(&k, &format!("tcp listener {ADDR_B}:{port}"));
        k
    };
    let pingpong = |name: &str, port: u16, secs: &str, go: Option<&str>| {
        let p = port.to_string();
        let mut args = vec![addr.as_str(), &p, secs];
        args.extend(go);
        py(&lab, Host::A, true, name, TCP_PINGPONG, &args)
    };
    let ended = |k: &mut Kid| {
        let all = k.success(T);
        assert!(!all.contains("MISMATCH"), "{}: {all}", k.name);
        line_of(&k.stdout(), "end ").to_string()
    };
    let port = 15401u16;
    let mut srv = server("vkt-srv", port);
    let go = scratch("vkt-go");
    let _ = std::fs::remove_file(&go);
    let mut idle = pingpong("vkt-idle", port, "1", go.to_str());
    idle.wait_for("started", T);
    let mut c1 = pingpong("vkt-c1", port, "3", None);
    c1.wait_for("started", T);
    on_engine(&c1, &format!("-> {ADDR_B}:{port}"));
    std::thread::sleep(Duration::from_millis(500));
    kill_9(first.0);
    // Killed: never signal that pid again (it may be reused).
    std::mem::forget(first);
    // Announced at the default log level: the service, the listener, and
    // each connection's fate (handed over, or reset with the reason).
    let moved = "tcp: moved to the kernel (TCP_REPAIR hand-over): the engine service is gone";
    let reset = "tcp: reset (RST): the engine service is gone";
    let fates = |e: &str| (e.matches(moved).count(), e.matches(reset).count());
    until(T, || fates(&srv.stderr()) != (0, 0));
    std::thread::sleep(Duration::from_millis(200));
    // The idle client sends again only now.
    std::fs::write(&go, b"").unwrap();
    // Every blocking call returns: the clients', and the server's recvs.
    let end0 = ended(&mut idle);
    let end1 = ended(&mut c1);
    srv.wait_for("conn 1: ", T);
    srv.wait_for("conn 2: ", T);
    let err = srv.stderr();
    assert!(err.contains("the engine service is gone"), "{err}");
    assert!(
        err.contains("tcp listener: back on the kernel: the engine service is gone"),
        "{err}"
    );
    let (n_moved, n_reset) = fates(&err);
    assert_eq!(n_moved + n_reset, 2, "{err}");
    // The idle connection was handed over before its next segment: the
    // kernel carries it on, every echo intact.
    assert!(end0.starts_with("end ok "), "{end0}\n{err}");
    assert!(n_moved >= 1, "{err}");
    let busy = line_of(&srv.stdout(), "conn 2: ").to_string();
    // A new connection to the same server: its listener's kernel socket
    // (the server's blocked accept takes it).
    let mut c2 = pingpong("vkt-c2", port, "1", None);
    let end2 = ended(&mut c2);
    assert!(end2.starts_with("end ok "), "{end2}\n{}", c2.stderr());
    srv.wait_for("conn 3: eof", T);
    // A restarted service carries a new server process on xdp.
    let _second = start_service(&lab);
    let port2 = 15402u16;
    let _srv2 = server("vkt-srv2", port2);
    let mut c3 = pingpong("vkt-c3", port2, "1", None);
    let end3 = ended(&mut c3);
    assert!(end3.starts_with("end ok "), "{end3}\n{}", c3.stderr());
    on_engine(&c3, &format!("-> {ADDR_B}:{port2}"));
    eprintln!(
        "the idle connection: {end0:?}; the busy one: client {end1:?}, server {busy:?}; \
         {n_moved} handed over, {n_reset} reset"
    );
}

/// A server under run writes its answer, closes and exits while the
/// (plain) client's window is shut: as with a plain server (whose kernel
/// finishes the orphaned connection), the client gets every byte and the
/// FIN; the exiting process finishes its connections while the peer makes
/// progress (it used to give up after 500 ms, the peer then got an RST or,
/// waiting for data, nothing at all).
#[test]
#[ignore = "needs root"]
fn a_server_exiting_right_after_its_answer_still_delivers_all_of_it() {
    let lab = lab("vtx");
    let _sb = start_service(&lab);
    let mut want = None;
    for (i, srv_run) in [false, true].into_iter().enumerate() {
        let port = 15301 + i as u16;
        let mut s = tcp_server(&lab, &format!("vtx-srv{i}"), srv_run, &[], port, 1);
        let (p, addr) = (port.to_string(), ADDR_B.to_string());
        let args = [addr.as_str(), &p, "7", "slow"];
        let name = format!("vtx-cli{i}");
        let mut c = py(&lab, Host::A, false, &name, TCP_CLIENT, &args);
        let out = tcp_client_done(&mut c, false, port);
        assert!(s.success(T).contains("done"));
        same_as_first(&mut want, "server run", out, &s.stderr());
    }
}

/// Four TCP servers and four clients at once, each a process of its own on
/// its host's engine service (one shared UMEM per host), bodies hashed.
#[test]
#[ignore = "needs root"]
fn four_tcp_servers_and_four_clients_at_once_on_the_service() {
    let lab = lab("vt8");
    // The operator's services, held for the whole test: one started on
    // demand exits 3 s after its last client, and the status asked at the
    // end would find none (seen: "no engine service in this network
    // namespace").
    let _services = start_services(&lab);
    let ports: Vec<(u16, u32)> = (0..4).map(|i| (15101 + i, u32::from(i + 1))).collect();
    tcp_servers_and_clients(&lab, "vt8", (true, true), &[], &ports);
    let st = status(&lab);
    assert_eq!(st["counters"]["attaches"], 4, "{st}");
}

/// An unprivileged user's TCP server and client (the operators' services
/// run as root; the programs as nobody), accelerated, bodies hashed.
#[test]
#[ignore = "needs root"]
fn an_unprivileged_users_tcp_server_and_client_are_accelerated() {
    let lab = lab("vtu");
    let _services = start_services(&lab);
    tcp_servers_and_clients(&lab, "vtu", (true, true), NOBODY, &[(15201, 5)]);
    let st = status(&lab);
    assert_eq!(st["counters"]["claims"], 1, "{st}");
}

/// TCP claims follow the UDP rule: a listener claim needs the kernel
/// socket holding the port; a 4-tuple needs that socket or the process's
/// own listener claim, and is refused when it is another process's or a
/// kernel socket's connection, unless the socket shown is that kernel
/// connection itself.
#[test]
#[ignore = "needs root"]
fn tcp_claims_need_the_socket_that_holds_the_port() {
    use nanowire_stack::xdp::service::proto::TcpFlow;
    use std::net::SocketAddrV4;
    let (lab, _service, st) = in_b_beside_a_service("vtc", |ifname| {
        use std::os::fd::AsFd;
        let l = std::net::TcpListener::bind((ADDR_B, 12211)).unwrap();
        let at = attached(&ifname);
        let c = &at.conn;
        refused(
            c.claim_tcp_listener(ADDR_B, 12212, l.as_fd()),
            "holds port 12211",
        );
        let u = std::net::UdpSocket::bind((ADDR_B, 12213)).unwrap();
        refused(
            c.claim_tcp_listener(ADDR_B, 12213, u.as_fd()),
            "not of that protocol",
        );
        c.claim_tcp_listener(ADDR_B, 12211, l.as_fd()).unwrap();
        let local = SocketAddrV4::new(ADDR_B, 12211);
        let (remote, other_remote) = (
            SocketAddrV4::new(ADDR_A, 40000),
            SocketAddrV4::new(ADDR_A, 40001),
        );
        // A connection of its own listener: no socket needed.
        c.tcp_flow(TcpFlow::Flow, local, remote, None).unwrap();
        let other = attached(&ifname);
        let o = &other.conn;
        let (flow, pass) = (TcpFlow::Flow, TcpFlow::Pass);
        refused(
            o.tcp_flow(flow, local, remote, Some(l.as_fd())),
            "claimed by another process",
        );
        refused(
            o.tcp_flow(pass, local, other_remote, None),
            "neither a socket",
        );
        // A kernel connection's 4-tuple, with another socket holding its
        // port (the listener; the connection is the accepted one).
        let k = std::net::TcpStream::connect((ADDR_B, 12211)).unwrap();
        let (kl, kr) = match (k.local_addr().unwrap(), k.peer_addr().unwrap()) {
            (std::net::SocketAddr::V4(a), std::net::SocketAddr::V4(b)) => (a, b),
            _ => unreachable!(),
        };
        refused(
            other.conn.tcp_flow(TcpFlow::Flow, kr, kl, Some(l.as_fd())),
            "connection of a kernel socket",
        );
        // With the kernel connection's own socket: its holder takes it over
        // (issue 24 item 2: a connection inherited across exec).
        other
            .conn
            .tcp_flow(TcpFlow::Flow, kl, kr, Some(k.as_fd()))
            .unwrap();
        Conn::connect_existing().unwrap().status().unwrap()
    });
    assert_eq!(st["counters"]["tcp_flows"], 2, "{st}");
    assert_eq!(st["counters"]["tcp_flows_refused"], 3, "{st}");
    assert!(
        st["counters"]["claims_refused"].as_u64().unwrap() >= 2,
        "{st}"
    );
    // The test's connections are gone: their claims went with them.
    let st = status(&lab);
    assert!(claims_of(&st).is_empty(), "{st}");
}

/// kill -9 of a TCP server on the service gives its listener claim back at
/// once; a new server on the same port is served on the engine.
#[test]
#[ignore = "needs root"]
fn kill_9_frees_a_tcp_servers_claims() {
    let lab = lab("vtk");
    // Held for the test: an on-demand service would exit on idle once the
    // victim is gone, and the status calls below would find none.
    let _service = start_service(&lab);
    let port = 15301;
    let victim = tcp_server(&lab, "vtk-victim", true, &[], port, 1);
    let want = format!("tcp:{ADDR_B}:{port}");
    assert!(claims_of(&status(&lab)).contains(&want));
    kill_9(victim.child.id());
    drop(victim);
    let gone = until(Duration::from_secs(5), || {
        !claims_of(&status(&lab)).contains(&want)
    });
    assert!(gone, "claim {want} not released");
    tcp_servers_and_clients(&lab, "vtk", (true, false), &[], &[(port, 7)]);
}

/// `nanowire stats --json` in host b.
fn stats_json(lab: &ScopedLab) -> serde_json::Value {
    json_in(lab, Host::B, &["stats", "--json"])
}

/// The attached processes `nanowire stats --json` lists, by pid.
fn stats_clients(st: &serde_json::Value) -> Vec<serde_json::Value> {
    st["service"]["ifaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no service in stats: {st}"))
        .iter()
        .flat_map(|i| i["clients"].as_array().unwrap().clone())
        .collect()
}

/// The attached process `pid` of `nanowire stats --json` output `st`.
fn client_of(st: &serde_json::Value, pid: u32) -> serde_json::Value {
    stats_clients(st)
        .into_iter()
        .find(|c| c["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not listed: {st}"))
}

/// The engine of process `pid` in `nanowire stats --json` output `st`.
fn engine_of(st: &serde_json::Value, pid: u32) -> &serde_json::Value {
    st["engines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["pid"] == pid)
        .unwrap_or_else(|| panic!("no engine of pid {pid}: {st}"))
}

/// Operators (issue 23, step 5): `nanowire stats` shows the service and
/// every attached process: pid, uid, command, its claims, its share of the
/// frames and its drops by reason (the kernel's, on its own sockets, and
/// its engine's own); a process killed with -9 is gone from it at once.
#[test]
#[ignore = "needs root"]
fn stats_lists_every_attached_process_with_its_claims_and_forgets_a_killed_one() {
    let lab = lab("vs");
    let _svc = start_service(&lab);
    let (a, b) = (12401u16, 12402u16);
    let victim = echo(&lab, "vs-a", a, &[]);
    let keep = echo(&lab, "vs-b", b, &[]);
    on_xdp(&victim, a);
    on_xdp(&keep, b);
    client(&lab, "vs-client", &[a, b], 50);
    let st = stats_json(&lab);
    assert!(st["service"]["pid"].as_u64().is_some(), "{st}");
    let clients = stats_clients(&st);
    assert_eq!(clients.len(), 2, "{st}");
    for (k, p) in [(&victim, a), (&keep, b)] {
        let c = client_of(&st, k.child.id());
        assert_eq!(c["uid"], 0, "{c}");
        // `nanowire run` execs python: the command is python's.
        assert!(c["comm"].as_str().unwrap().starts_with("python"), "{c}");
        assert_eq!(
            c["claims"],
            serde_json::json!([format!("udp:{ADDR_B}:{p}")]),
            "{c}"
        );
        let f = &c["frames"];
        assert!(f["rx_ring"].as_u64().unwrap() > 0, "{c}");
        assert!(
            f["rx_held"].as_u64().unwrap() + f["rx_waiting"].as_u64().unwrap()
                <= f["rx_shared"].as_u64().unwrap(),
            "{c}"
        );
        assert!(f["tx_own"].as_u64().unwrap() > 0, "{c}");
        assert!(c["drops"]["xsk_rx_ring_full"].is_u64(), "{c}");
        // Root's engine page is readable: its own drop counters are joined.
        assert!(c["engine_drops"]["drop_socket_queue_full"].is_u64(), "{c}");
        assert_eq!(c["counters"]["claims"], 1, "{c}");
    }
    let text = lab
        .command(Host::B, &[nanowire(), "stats"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("engine service pid"), "{text}");
    assert!(text.contains(&format!("claim udp:{ADDR_B}:{a}")), "{text}");
    let gone = victim.child.id();
    kill_9(gone);
    drop(victim);
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let st = stats_json(&lab);
        let clients = stats_clients(&st);
        if clients.iter().all(|c| c["pid"] != gone) {
            assert_eq!(clients.len(), 1, "{st}");
            assert_eq!(clients[0]["pid"], keep.child.id(), "{st}");
            assert_eq!(
                clients[0]["claims"],
                serde_json::json!([format!("udp:{ADDR_B}:{b}")]),
                "{st}"
            );
            break;
        }
        assert!(Instant::now() < end, "pid {gone} still listed: {st}");
        std::thread::sleep(Duration::from_millis(20));
    }
    client(&lab, "vs-after", &[b], 20);
}

// ------------------------------------------------- issue 24: kill -9

/// The programs of the kill -9 tests (as in run_exit): the process killed
/// (tests/exit/killed.py: holds its connections, prints "held") and its
/// plain peer (tests/exit/peer.py: prints "ready", then one line "<i>
/// eof|reset|data|timeout" per connection as it ends).
fn exit_py(lab: &ScopedLab, h: Host, run: bool, name: &str, args: &[&str]) -> Kid {
    let file = test_file(&format!("exit/{}.py", args[0]));
    let mut argv = vec!["python3", &file];
    argv.extend_from_slice(&args[1..]);
    spawn(name, svc_or_plain(lab, h, run, &[], &argv))
}

/// One round of a kill -9 test: the server in host b, started first, and
/// the client in host a, one of them the process killed (the server if
/// `server_killed`; under run if `run`, where its stderr must show `claim`
/// on the engine) and the other its plain peer. Once the killed one holds
/// its connections and the peer is ready, kill -9; returns the peer's
/// output (a line per connection as it ended) and both outputs for a
/// failure.
fn kill_9_round(
    lab: &ScopedLab,
    name: &str,
    server_killed: bool,
    run: bool,
    claim: &str,
    args: &[&str],
) -> (String, String) {
    let argv = |killed: bool, role: &'static str| {
        [&[if killed { "killed" } else { "peer" }, role], args].concat()
    };
    let srv_argv = argv(server_killed, "server");
    let mut srv = exit_py(
        lab,
        Host::B,
        run && server_killed,
        &format!("{name}-srv"),
        &srv_argv,
    );
    srv.wait_for("listening", T);
    let cli_argv = argv(!server_killed, "client");
    let cli = exit_py(
        lab,
        Host::A,
        run && !server_killed,
        &format!("{name}-cli"),
        &cli_argv,
    );
    let (mut killed, mut peer) = if server_killed {
        (srv, cli)
    } else {
        (cli, srv)
    };
    killed.wait_for("held", T);
    peer.wait_for("ready", T);
    if run {
        on_engine(&killed, claim);
    }
    kill_9(killed.child.id());
    let out = peer.success(T);
    (
        out,
        format!("run {run}: {}\n{}", killed.both(), peer.stderr()),
    )
}

/// Issue 24, exit and kill: a server holding 20 connections (half with the
/// client's data unread) and 2 connections waiting in its accept queue is
/// killed with -9; every client learns at once as with the kernel: plainly
/// the kernel closes the sockets (FIN where nothing was unread, RST where
/// data was unread, RST for the listener's pending connections); under run
/// on the engine service the service ends them from the dead process's
/// connection table. Compared per connection (the kind of end), no timing:
/// the clients wait 60 s and a hang shows as "timeout".
#[test]
#[ignore = "needs root"]
fn kill_9_ends_a_servers_connections_as_the_kernel_does() {
    let lab = lab("vke");
    let _sb = start_service(&lab);
    let (n, pending) = (20u32, 2u32);
    let mut want: Option<String> = None;
    for (i, run) in [false, true].into_iter().enumerate() {
        let port = 15401 + i as u16;
        let (p, ns, addr) = (port.to_string(), n.to_string(), ADDR_B.to_string());
        let args = [addr.as_str(), &p, &ns, &pending.to_string()];
        let claim = format!("tcp listener {ADDR_B}:{port}");
        let (out, ctx) = kill_9_round(&lab, &format!("vke{i}"), true, run, &claim, &args);
        // Under run, the service's counters (ends sent, refused, failed)
        // go with a failure: it then tells whether the service sent no end
        // for a connection or sent one its peer never saw.
        let st = run.then(|| status(&lab));
        let counters = st.as_ref().map(|v| v["counters"].to_string());
        let ctx = format!("{ctx}\nservice counters: {counters:?}");
        let ends = (0..n + pending).map(|k| if k < n && k % 2 == 0 { "eof" } else { "reset" });
        assert_ends(ends, &out, &ctx);
        same_as_first(&mut want, "kill -9 under run", out, &ctx);
        if let Some(st) = st {
            let k = &st["counters"];
            // A pending connection whose handshake's last ACK the engine
            // had not taken in yet is no connection to end: its hello
            // reaches the kernel after the claims went, which resets it.
            // The FIN ends handed to the kernel (TCP_REPAIR), which
            // finishes them (the peers' own FINs after it are answered).
            assert_eq!(k["tcp_ended_repaired"], u64::from(n / 2), "{st}");
            assert_eq!(k["tcp_ended_fin"], 0, "{st}");
            let rst = k["tcp_ended_rst"].as_u64().unwrap();
            assert!(
                (u64::from(n / 2)..=u64::from(n / 2 + pending)).contains(&rst),
                "{st}"
            );
            assert_eq!(k["conn_tables"], 1, "{st}");
        }
    }
}

/// Issue 24, the other side: 20 client connections of a process killed
/// with -9 (half with the server's data unread): plainly the kernel ends
/// them (FIN, RST where data was unread); under run on host a's engine
/// service, the service does the same from the process's table (the
/// connections' 4-tuple claims). The plain server in host b compares the
/// end of each connection, no timing (60 s, a hang shows as "timeout").
#[test]
#[ignore = "needs root"]
fn kill_9_ends_a_clients_connections_as_the_kernel_does() {
    let lab = lab("vkc");
    let _sa = start_service_in(&lab, Host::A);
    let n = 20u32;
    let mut want: Option<String> = None;
    for (i, run) in [false, true].into_iter().enumerate() {
        let port = 15501 + i as u16;
        let (p, ns, addr) = (port.to_string(), n.to_string(), ADDR_B.to_string());
        let args = [addr.as_str(), &p, &ns];
        let claim = format!("-> {ADDR_B}:{port}");
        let (out, ctx) = kill_9_round(&lab, &format!("vkc{i}"), false, run, &claim, &args);
        let ends = (0..n).map(|k| if k % 2 == 0 { "eof" } else { "reset" });
        assert_ends(ends, &out, &ctx);
        same_as_first(&mut want, "kill -9 of the clients under run", out, &ctx);
        if run {
            let st = status_in(&lab, Host::A);
            let k = &st["counters"];
            assert_eq!(k["tcp_ended_repaired"], u64::from(n / 2), "{st}");
            assert_eq!(k["tcp_ended_fin"], 0, "{st}");
            assert_eq!(k["tcp_ended_rst"], u64::from(n / 2), "{st}");
            // `nanowire stats` shows the orphans (issue 24): each FIN end
            // the kernel finishes, whose (the dead pid) and the kernel's
            // state of it (TIME-WAIT for 60 s once the peer closed too).
            let text = lab
                .command(Host::A, &[nanowire(), "stats"])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&text.stdout);
            assert!(
                text.contains(&format!(
                    "dead processes' tcp connections: tcp_ended_repaired {}, tcp_ended_rst {}",
                    n / 2,
                    n / 2
                )),
                "{text}"
            );
            let orphans: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("tcp orphan") && l.contains("ended: repaired"))
                .collect();
            assert_eq!(orphans.len(), (n / 2) as usize, "{text}");
            for o in orphans {
                assert!(
                    o.contains(&format!("<-> {ADDR_B}:{port} of pid ")),
                    "{text}"
                );
                assert!(
                    ["FIN-WAIT-1", "FIN-WAIT-2", "CLOSING", "TIME-WAIT"]
                        .iter()
                        .any(|s| o.ends_with(&format!("kernel {s}"))),
                    "{text}"
                );
            }
        }
    }
}

/// A TCP echo server that closes a connection first when it reads "bye":
/// `ADDR PORT`. Prints "listening".
const BYE_SERVER: &str = r#"
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8)
print("listening", flush=True)
def serve(c):
    while True:
        d = c.recv(65536)
        if not d or d == b"bye":
            break
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// `SERVER PORT LOCAL UDP_PORT GO DONE`: c1 from a bound port (a 4-tuple
/// claim on the service) and c2 from an unbound socket (a port of the
/// client port block), both on the process's one client stack; prints
/// "ready" and waits for the file GO. Then a thread binds a UDP socket (a
/// claim: a request to the service) while the main thread ends c1 (the
/// server closes first, so the stack forgets it at once and a turn
/// releases its claim) and ping-pongs on c2, and says whether the claim
/// had been answered by then. Then "claim returned", "waiting" (for the
/// file DONE), "ok".
const STALL_CLIENT: &str = r#"
import os, socket, sys, threading, time
host, port, local, uport, go, done = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
def pp(c, n):
    for i in range(n):
        m = b"%08d" % i + b"x" * 92
        c.sendall(m)
        buf = b""
        while len(buf) < len(m):
            d = c.recv(len(m) - len(buf))
            if not d:
                print("eof", flush=True); sys.exit(1)
            buf += d
        if buf != m:
            print("MISMATCH", flush=True); sys.exit(1)
c1 = socket.socket(); c1.bind((local, 0)); c1.connect((host, port))
c2 = socket.create_connection((host, port))
pp(c1, 5); pp(c2, 5)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
answered = []
def claim():
    print("claiming", flush=True)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((local, uport))
    answered.append(1)
    print("claim returned", flush=True)
t = threading.Thread(target=claim); t.start()
time.sleep(0.5)
c1.sendall(b"bye")
if c1.recv(10) != b"":
    print("no eof on c1", flush=True); sys.exit(1)
c1.close()
pp(c2, 50)
print("turns done, the claim", "answered" if answered else "outstanding", flush=True)
t.join()
pp(c2, 5)
print("waiting", flush=True)
while not os.path.exists(done):
    time.sleep(0.02)
c2.close()
print("ok", flush=True)
"#;

fn signal(pid: u32, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

/// The TCP flows the service holds for the processes attached in host `h`.
fn tcp_flows_in(lab: &ScopedLab, h: Host) -> Vec<serde_json::Value> {
    let st = status_in(lab, h);
    let mut v = Vec::new();
    for i in st["ifaces"].as_array().unwrap() {
        for c in i["clients"].as_array().unwrap() {
            v.extend(c["tcp_flows"].as_array().unwrap().iter().cloned());
        }
    }
    v
}

/// A request to the engine service is a round trip on the process's
/// control socket; it must never hold up the process's TCP data path. The
/// service in host a is stopped (SIGSTOP), so a UDP bind under run (a
/// claim) waits for its answer; meanwhile the same process ends a
/// connection whose 4-tuple it had claimed (a TCP turn releases the claim)
/// and ping-pongs on another connection of the same client stack: all of
/// that completes while the claim is still unanswered (it used to wait
/// behind it: the release was a round trip under the lock the request
/// held). After SIGCONT the claim is answered and the release, queued,
/// reaches the service (the process's flow list empties); bodies checked.
#[test]
#[ignore = "needs root"]
fn a_tcp_turn_never_waits_behind_a_stalled_request_to_the_service() {
    let lab = lab("vst");
    let sa = start_service_in(&lab, Host::A);
    let port = 15601u16;
    let mut s = spawn(
        "vst-srv",
        plain_in(
            &lab,
            Host::B,
            &[
                "python3",
                "-c",
                BYE_SERVER,
                &ADDR_B.to_string(),
                &port.to_string(),
            ],
        ),
    );
    s.wait_for("listening", T);
    let (go, done) = (scratch("vst-go"), scratch("vst-done"));
    let _ = (std::fs::remove_file(&go), std::fs::remove_file(&done));
    let argv = [
        "python3",
        "-c",
        STALL_CLIENT,
        &ADDR_B.to_string(),
        &port.to_string(),
        &ADDR_A.to_string(),
        "15602",
        go.to_str().unwrap(),
        done.to_str().unwrap(),
    ];
    let mut c = spawn("vst-cli", svc_or_plain(&lab, Host::A, true, &[], &argv));
    c.wait_for("ready", T);
    on_engine(&c, &format!("-> {ADDR_B}:{port}"));
    // c1's 4-tuple is the one flow claimed (c2 is on a block port).
    let flows = tcp_flows_in(&lab, Host::A);
    assert_eq!(flows.len(), 1, "{flows:?}\n{}", c.both());
    signal(sa.0, "-STOP");
    std::fs::write(&go, b"").unwrap();
    // Within the claim's own answer timeout (10 s): the claim must still
    // be outstanding when the TCP work is done.
    let end = Instant::now() + T;
    while Instant::now() < end
        && !c.stdout().contains("turns done")
        && !c.stdout().contains("claim returned")
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = c.stdout();
    signal(sa.0, "-CONT");
    assert!(
        out.contains("turns done, the claim outstanding"),
        "the TCP turns waited for the stalled request to the service:\n{}",
        c.both()
    );
    c.wait_for("waiting", T);
    assert!(c.stdout().contains("claim returned"), "{}", c.both());
    // The release of c1's claim was queued, not lost: the service has it.
    let end = Instant::now() + Duration::from_secs(20);
    let mut flows = tcp_flows_in(&lab, Host::A);
    while !flows.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        flows = tcp_flows_in(&lab, Host::A);
    }
    assert!(
        flows.is_empty(),
        "c1's flow claim stayed: {flows:?}\n{}",
        c.both()
    );
    std::fs::write(&done, b"").unwrap();
    let out = c.success(T);
    assert!(out.contains("ok"), "{}", c.both());
    on_engine(&c, &format!("udp {ADDR_A}:15602"));
}

/// `ADDR PORT`: a UDP socket bound (on the engine service: the service
/// holds the interface), then nothing until killed.
const UDP_HOLDER: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("bound", flush=True)
time.sleep(600)
"#;

/// `ADDR PORT N`: accepts N connections, answers each "hi" and closes it;
/// "done" at the end.
const HI_SERVER: &str = concat!(
    py_prelude!(),
    r#"
s = listener(64)
for _ in range(int(sys.argv[3])):
    c, _ = s.accept()
    c.sendall(b"hi\n")
    c.close()
print("done", flush=True)
"#
);

/// `ADDR PORT N`: N connections one after another, each read to EOF;
/// prints how many answered "hi".
const HI_CLIENT: &str = r#"
import socket, sys
n = 0
for _ in range(int(sys.argv[3])):
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), 10)
    d = b""
    while True:
        x = c.recv(64)
        if not x: break
        d += x
    n += d == b"hi\n"
    c.close()
print("answers", n, flush=True)
"#;

/// With an engine service owning the interface, a process under run NOT
/// set to use it (`NANOWIRE_SERVICE` unset) cannot attach an engine of
/// its own: it falls back to kernel sockets, says why once at the default
/// level, and does not open its engine again at every connect (it did:
/// UMEM, maps, program loads, then EBUSY, ~19 ms of CPU and one warning
/// per connection; the registry now remembers the failure and tries again
/// only after 1 s, then 2, 4 ...). Every connection works as plainly.
#[test]
#[ignore = "needs root"]
fn an_own_engine_refused_by_the_service_is_not_opened_again_per_connect() {
    let lab = lab("svref");
    let _svc = start_service_in(&lab, Host::A);
    // The service holds the interface while a process is attached to it.
    let a = ADDR_A.to_string();
    let mut hold = run_in(
        &lab,
        Host::A,
        &[],
        &["python3", "-c", UDP_HOLDER, &a, "15721"],
    );
    env_service(&mut hold);
    let mut holder = spawn("refused-holder", hold);
    holder.wait_for("bound", T);
    assert!(
        holder.stderr().contains(": xdp"),
        "the holder is on the service: {}",
        holder.both()
    );
    let port = "15720";
    let n = "40";
    let b = ADDR_B.to_string();
    let mut outs = Vec::new();
    for (k, run) in [false, true].into_iter().enumerate() {
        let mut srv = spawn(
            &format!("refused-hi-server-{k}"),
            plain_in(&lab, Host::B, &["python3", "-c", HI_SERVER, &b, port, n]),
        );
        srv.wait_for("listening", T);
        let argv = ["python3", "-c", HI_CLIENT, &b, port, n];
        let cmd = if run {
            let mut c = run_in(&lab, Host::A, &[], &argv);
            c.env_remove("NANOWIRE_SERVICE");
            c
        } else {
            plain_in(&lab, Host::A, &argv)
        };
        let mut cli = spawn(&format!("refused-hi-client-{k}"), cmd);
        cli.success(T);
        srv.success(T);
        outs.push((cli.stdout(), cli.stderr()));
    }
    assert_eq!(outs[0].0, format!("answers {n}\n"));
    assert_eq!(outs[0].0, outs[1].0, "plain (left) and under run (right)");
    let said: Vec<&str> = outs[1]
        .1
        .lines()
        .filter(|l| l.contains("xdp not used"))
        .collect();
    assert_eq!(
        said.len(),
        1,
        "the fallback's reason, said once for {n} connections:\n{}",
        outs[1].1
    );
    assert!(
        said[0].contains("refused"),
        "the reason is the refused attach: {}",
        said[0]
    );
}

/// The spinner registry's entry of `cpu` in the service's status (host b):
/// the pids marked spinning and sleeping there, and the status.
fn seats_of(lab: &ScopedLab, cpu: u64) -> (Vec<u64>, Vec<u64>, serde_json::Value) {
    let st = status(lab);
    let seats = st["ifaces"][0]["seats"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let pids = |c: &serde_json::Value, k: &str| {
        let mut v: Vec<u64> = c[k]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x["pid"].as_u64())
            .collect();
        v.sort();
        v
    };
    match seats.iter().find(|c| c["cpu"] == cpu) {
        Some(c) => (pids(c, "spinning"), pids(c, "sleeping"), st),
        None => (Vec::new(), Vec::new(), st),
    }
}

/// CPU `cpu`'s watcher (the slot passing it by hint) and per slot (parks,
/// hand-offs to it), from the service's status.
fn passes_of(st: &serde_json::Value, cpu: u64) -> (Option<u64>, Vec<(u64, u64, u64)>) {
    let seats = st["ifaces"][0]["seats"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(c) = seats.iter().find(|c| c["cpu"] == cpu) else {
        return (None, Vec::new());
    };
    let n = |p: &serde_json::Value, k: &str| p[k].as_u64().unwrap();
    let passes = c["passes"].as_array().unwrap().iter();
    let passes = passes.map(|p| (n(p, "slot"), n(p, "parks"), n(p, "handoffs")));
    (c["watcher"].as_u64(), passes.collect())
}

/// Issue 23, four processes on one CPU: their waits spin forever
/// (`NANOWIRE_SPIN_US=forever`), all pinned to CPU 1. The service's
/// registry shows the four spinning on CPU 1 (so each is crowded) and
/// nobody on another CPU; one of them watches the CPU and the others park
/// until it hands them the CPU for their datagrams (session 17: counted in
/// the status as parks and hand-offs); all four echo intact; the watcher
/// killed (kill -9) leaves no mark and no watch behind and the three
/// others echo on.
#[test]
#[ignore = "needs root"]
fn four_processes_pinned_to_one_cpu_share_it_through_the_registry_and_all_echo() {
    let lab = lab("v4c");
    let mut ports: Vec<u16> = (12401..12405).collect();
    let addr = ADDR_B.to_string();
    let mut kids: Vec<Kid> = ports
        .iter()
        .map(|&p| {
            let ps = p.to_string();
            let argv = ["python3", "-c", ECHO, &addr, &ps];
            let mut c = svc_or_plain(&lab, Host::B, true, &["taskset", "-c", "1"], &argv);
            c.env("NANOWIRE_SPIN_US", "forever");
            let mut k = spawn(&format!("vc-echo-{p}"), c);
            k.wait_for("ready", T);
            k
        })
        .collect();
    for (k, &p) in kids.iter().zip(&ports) {
        on_xdp(k, p);
    }
    let pids = |kids: &[Kid]| {
        let mut v: Vec<u64> = kids.iter().map(|k| u64::from(k.child.id())).collect();
        v.sort();
        v
    };
    let all = pids(&kids);
    // Idle, all waiting in their receive, spinning on CPU 1.
    let spinning = |want: &[u64]| {
        let (sp, sl, _) = seats_of(&lab, 1);
        sp == want && sl.is_empty()
    };
    assert!(
        until(Duration::from_secs(20), || spinning(&all)),
        "not the four spinning on CPU 1: {}",
        seats_of(&lab, 1).2
    );
    let st = seats_of(&lab, 1).2;
    let elsewhere = st["ifaces"][0]["seats"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["cpu"] != 1);
    assert!(!elsewhere, "a mark on another CPU: {st}");
    // All four echo, each datagram intact; passed by hint: a watcher, the
    // others parked and handed the CPU. Parks follow the scheduler (a
    // process parks when it finds the CPU watched by another on its next
    // spin; on a machine busy with other tests a round can end before the
    // third has): up to five rounds of 200 datagrams a port, each checked.
    let mut rounds = 0;
    let (st, watcher) = loop {
        rounds += 1;
        let out = client(&lab, &format!("vc-client-{rounds}"), &ports, 200);
        eprintln!("client, round {rounds}: {out}");
        let st = seats_of(&lab, 1).2;
        let (watcher, passes) = passes_of(&st, 1);
        let handoffs: u64 = passes.iter().map(|p| p.2).sum();
        let parked = passes.iter().filter(|p| p.1 > 0).count();
        if let Some(w) = watcher.filter(|_| handoffs > 0 && parked >= 3) {
            break (st, w);
        }
        assert!(rounds < 5, "no hand-off by hint in {rounds} rounds: {st}");
    };
    // kill -9 the watcher: the service forgets its marks and its watch.
    let slot_pid = |slot: u64| {
        st["ifaces"][0]["clients"]
            .as_array()?
            .iter()
            .find(|c| c["slot"] == slot)?["pid"]
            .as_u64()
    };
    let dead = slot_pid(watcher).unwrap_or_else(|| panic!("no pid for slot {watcher}: {st}"));
    let i = kids
        .iter()
        .position(|k| u64::from(k.child.id()) == dead)
        .expect("the watcher is one of the four");
    let victim = kids.remove(i);
    let port = ports.remove(i);
    kill_9(victim.child.id());
    drop(victim);
    let rest = pids(&kids);
    assert!(
        until(Duration::from_secs(5), || spinning(&rest)),
        "the killed {dead} is still in the registry: {}",
        seats_of(&lab, 1).2
    );
    let st = seats_of(&lab, 1).2;
    assert_ne!(passes_of(&st, 1).0, Some(watcher), "a dead watcher: {st}");
    client(&lab, "vc-client2", &ports, 200);
    assert!(spinning(&rest), "{}", seats_of(&lab, 1).2);
    let after = passes_of(&seats_of(&lab, 1).2, 1).0;
    eprintln!("the watcher (slot {watcher}, port {port}) killed; watching now: {after:?}");
}

// ------------------------------------------- issue 23: bad input, users

/// Make the calling thread, and only it (the raw system calls, not libc's
/// process-wide wrappers), user and group `id` with no supplementary
/// groups: its connections to the service carry that identity
/// (SO_PEERCRED) and the sockets it makes are that user's.
fn become_user(id: u32) {
    let id = libc::c_long::from(id);
    // SAFETY: setgroups(0, NULL), setresgid and setresuid system calls with
    // plain integers: they change this thread's credentials only.
    let r = unsafe {
        [
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
            libc::syscall(libc::SYS_setresgid, id, id, id),
            libc::syscall(libc::SYS_setresuid, id, id, id),
        ]
    };
    assert_eq!(r, [0, 0, 0], "{}", std::io::Error::last_os_error());
}

/// The frames the steering program redirected to `slot`'s socket on queue
/// 0 so far (steer.c `nw_ready`, the map an attach answer carries last:
/// 4,096 u32 values 8 bytes apart, by slot * 64 + queue).
fn redirected_to(ready: std::os::fd::BorrowedFd<'_>, slot: u32) -> u32 {
    use std::os::fd::AsRawFd;
    let len = 4096 * 8;
    // SAFETY: a read-only shared mapping of the program's mmapable array,
    // `len` bytes (its size); one aligned u32 read inside it, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            ready.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let v = std::ptr::read_volatile(p.cast::<u8>().add(8 * 64 * slot as usize).cast::<u32>());
        libc::munmap(p, len);
        v
    }
}

/// The one client of uid `uid` in a status.
fn client_of_uid(st: &serde_json::Value, uid: u32) -> serde_json::Value {
    let all = st["ifaces"][0]["clients"].as_array().unwrap();
    let mine: Vec<&serde_json::Value> = all.iter().filter(|c| c["uid"] == uid).collect();
    assert_eq!(mine.len(), 1, "{st}");
    mine[0].clone()
}

/// Issue 23 "a process cannot claim a port another user's socket holds, or
/// see its frames", with two users. Root's UDP echo and TCP server run on
/// the service; the other user is a thread of this test turned into uid
/// 65534 (its own credentials: SO_PEERCRED, and its kernel sockets are
/// nobody's), a lying client speaking the service's protocol. With a policy
/// trust line (the only way another user shares the UMEM) it attaches and
/// gets its own rings; every claim of root's ports is refused and counted
/// (UDP, TCP listener, a 4-tuple under root's listener, a join of root's
/// listener group), and the kernel refuses it root's port itself. It
/// claims a port of its own: datagrams sent there reach its ring (the
/// counters are live); then root's ports get traffic, every answer intact,
/// and nothing more reaches anything nobody holds: the program's count of
/// frames redirected to its socket, its ring, its socket's drops and its
/// kernel sockets. A user without a trust line (65533) is not attached, and
/// its claim is refused too.
#[test]
#[ignore = "needs root"]
fn another_users_process_cannot_claim_a_users_port_nor_see_its_frames() {
    use nanowire_stack::xdp::service::proto::TcpFlow;
    use std::net::{SocketAddrV4, TcpListener, UdpSocket};
    use std::os::fd::AsFd;
    use std::sync::mpsc;
    let lab = lab("vx");
    let policy = policy_file("vx-policy", "trust root 65534\n");
    let _service = start_service_with(&lab, &["--policy", &policy]);
    let (p, pt, q) = (12801u16, 12802u16, 12803u16);
    let udp = echo(&lab, "vx-udp", p, &[]);
    on_xdp(&udp, p);
    let mut tcp = tcp_server(&lab, "vx-tcp", true, &[], pt, 1);
    let (ifname, ns) = (lab.iface(Host::B), lab.netns(Host::B));
    let (to_test, from_nobody) = mpsc::channel::<u32>();
    let (go_on, traffic_done) = mpsc::channel::<()>();
    let nobody = std::thread::spawn(move || {
        nanowire_testkit::in_ns(&ns, move || {
            become_user(65534);
            let at = attached(&ifname);
            let (c, slot) = (&at.conn, at.reply.slot);
            let ready = at.ready.as_ref().expect("the program's count map");
            // What the kernel lets it bind: not root's port, on no address.
            for a in [ADDR_B, std::net::Ipv4Addr::UNSPECIFIED] {
                let e = UdpSocket::bind((a, p)).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{a}:{p}: {e}");
            }
            let lo = UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, p)).unwrap();
            let own = UdpSocket::bind((ADDR_B, q)).unwrap();
            let lo_tcp = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, pt)).unwrap();
            // Root's ports, with each socket it holds: refused.
            refused(c.claim(ADDR_B, p, lo.as_fd()), "is bound to 127.0.0.1");
            refused(c.claim(ADDR_B, p, own.as_fd()), &format!("holds port {q}"));
            refused(
                c.claim_tcp_listener(ADDR_B, pt, lo_tcp.as_fd()),
                "is bound to 127.0.0.1",
            );
            let (local, remote) = (
                SocketAddrV4::new(ADDR_B, pt),
                SocketAddrV4::new(ADDR_A, 40000),
            );
            refused(
                c.tcp_flow(TcpFlow::Flow, local, remote, Some(lo_tcp.as_fd())),
                "is bound to 127.0.0.1",
            );
            refused(
                c.tcp_flow(TcpFlow::Pass, local, remote, None),
                "neither a socket",
            );
            refused(
                c.tcp_join(ADDR_B, pt, lo_tcp.as_fd()),
                "is bound to 127.0.0.1",
            );
            // Its own port: granted.
            c.claim(ADDR_B, q, own.as_fd()).unwrap();
            to_test.send(slot).unwrap();
            traffic_done.recv().unwrap();
            // Its kernel sockets got nothing either.
            for s in [&lo, &own] {
                s.set_nonblocking(true).unwrap();
                let e = s.recv(&mut [0u8; 2048]).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
            }
            redirected_to(ready.as_fd(), slot)
        })
    });
    let slot = from_nobody
        .recv_timeout(T)
        .expect("nobody's client attached");
    // A user without a trust line: not attached, its claim refused.
    let ns = lab.netns(Host::B);
    let ifname = lab.iface(Host::B);
    nanowire_testkit::in_ns(&ns, move || {
        become_user(65533);
        let sock = UdpSocket::bind((ADDR_B, 12804)).unwrap();
        let e = Conn::connect_existing()
            .unwrap()
            .attach(&ifname, 1024)
            .err();
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("no policy trust line lets uid 65533")),
            "{e:?}"
        );
        let c = Conn::connect_existing().unwrap();
        refused(c.claim(ADDR_B, p, sock.as_fd()), "claim before attach");
    });
    // Datagrams to nobody's own port reach its ring: the counters are live.
    let a_ns = lab.netns(Host::A);
    nanowire_testkit::in_ns(&a_ns, move || {
        let s = UdpSocket::bind((ADDR_A, 0)).unwrap();
        for i in 0..5u8 {
            s.send_to(&[i; 32], (ADDR_B, q)).unwrap();
        }
    });
    let waiting = |st: &serde_json::Value| client_of_uid(st, 65534)["frames"]["rx_waiting"].clone();
    assert!(
        until(Duration::from_secs(10), || waiting(&status(&lab)) == 5),
        "{}",
        status(&lab)
    );
    // Root's ports under traffic: every answer intact.
    client(&lab, "vx-client", &[p], 300);
    let mut c = tcp_client(&lab, "vx-tcp-client", false, &[], pt, 7);
    tcp_client_done(&mut c, false, pt);
    assert!(tcp.success(T).contains("done"));
    let st = status(&lab);
    go_on.send(()).unwrap();
    let redirected = nobody.join().expect("nobody's client");
    // Nothing of root's reached nobody's socket: the program redirected it
    // the 5 datagrams of its own port, which wait on its ring unread, and
    // the kernel dropped nothing for it.
    assert_eq!(redirected, 5, "slot {slot}: {st}");
    let theirs = client_of_uid(&st, 65534);
    assert_eq!(theirs["frames"]["rx_waiting"], 5, "{st}");
    assert_eq!(theirs["frames"]["rx_held"], 0, "{st}");
    for d in ["xsk_rx_dropped", "xsk_rx_ring_full", "xsk_rx_invalid_descs"] {
        assert_eq!(theirs["drops"][d], 0, "{d}: {st}");
    }
    assert_eq!(
        theirs["claims"],
        serde_json::json!([format!("udp:{ADDR_B}:{q}")]),
        "{st}"
    );
    let k = &theirs["counters"];
    assert_eq!(k["claims"], 1, "{st}");
    assert_eq!(k["claims_refused"], 3, "{st}");
    assert_eq!(k["tcp_flows_refused"], 2, "{st}");
    assert_eq!(k["tcp_joins_refused"], 1, "{st}");
    // Root's claim stands beside nobody's own.
    let claims = claims_of(&st);
    for want in [format!("udp:{ADDR_B}:{p}"), format!("udp:{ADDR_B}:{q}")] {
        assert!(claims.contains(&want), "{want}: {st}");
    }
    let bad = &st["counters"]["bad_messages"];
    assert!(bad["untrusted_user"].as_u64().unwrap() >= 1, "{st}");
    assert!(bad["claim_before_attach"].as_u64().unwrap() >= 1, "{st}");
}

/// Issue 23 "a client that dies mid-attach": a UDP echo server under run on
/// the service is stopped (the test hook `NANOWIRE_TEST_ATTACH_STOP=STEP`,
/// SIGSTOP) at each step of attaching: connected, attach request sent,
/// answer and descriptors received, engine built before its first claim,
/// claim sent; its port is flooded meanwhile, then it is killed with -9.
/// Each time the service recovers everything: no client and no claim of
/// the dead one is left, the frames the program steered to its ring come
/// back (`frames_reclaimed`), and another process keeps echoing more
/// datagrams than the UMEM has RX frames. Then a new process on the dead
/// ones' port is served on xdp.
#[test]
#[ignore = "needs root"]
fn a_process_killed_at_each_step_of_attaching_leaves_nothing_behind() {
    let lab = lab("vm");
    let _service = start_service(&lab);
    let (keep_port, port) = (12901u16, 12902u16);
    let keep = echo(&lab, "vm-keep", keep_port, &[]);
    on_xdp(&keep, keep_port);
    let (addr, p) = (ADDR_B.to_string(), port.to_string());
    let only_keep = |st: &serde_json::Value| {
        let clients = st["ifaces"][0]["clients"].as_array().unwrap();
        clients.len() == 1
            && clients[0]["pid"] == keep.child.id()
            && claims_of(st) == vec![format!("udp:{ADDR_B}:{keep_port}")]
    };
    let mut reclaimed = 0;
    for step in ["connected", "asked", "answered", "built", "claiming"] {
        let env = format!("NANOWIRE_TEST_ATTACH_STOP={step}");
        let argv = ["python3", "-c", ECHO, &addr, &p];
        let cmd = svc_or_plain(&lab, Host::B, true, &["env", &env], &argv);
        let victim = spawn(&format!("vm-{step}"), cmd);
        wait_stopped(&victim, &format!("at attach step {step}"));
        let said = format!("stopped at attach step {step}");
        assert!(victim.stderr().contains(&said), "{}", victim.both());
        let args = [&addr, &p, "0.6"];
        let mut flood = py(
            &lab,
            Host::A,
            false,
            &format!("vm-flood-{step}"),
            FLOOD,
            &args,
        );
        flood.wait_for("flooding", T);
        std::thread::sleep(Duration::from_millis(200));
        if step == "claiming" {
            // Its claim was granted: the flood reaches its ring.
            let pid = victim.child.id();
            let on_ring = |st: &serde_json::Value| {
                st["ifaces"][0]["clients"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["pid"] == pid && c["frames"]["rx_waiting"].as_u64() > Some(0))
            };
            let on = until(Duration::from_secs(5), || on_ring(&status(&lab)));
            assert!(on, "{step}: {}", status(&lab));
        }
        kill_9(victim.child.id());
        drop(victim);
        flood.success(T);
        assert!(
            until(Duration::from_secs(5), || only_keep(&status(&lab))),
            "{step}: the dead process left something: {}",
            status(&lab)
        );
        let st = status(&lab);
        let now = st["counters"]["frames_reclaimed"].as_u64().unwrap();
        if step == "claiming" {
            // What was on its ring came back.
            assert!(now > reclaimed, "{step}: {st}");
        }
        reclaimed = now;
        client(&lab, &format!("vm-after-{step}"), &[keep_port], 1100);
    }
    let next = echo(&lab, "vm-next", port, &[]);
    on_xdp(&next, port);
    client(&lab, "vm-next-client", &[port, keep_port], 100);
    let k = &status(&lab)["counters"];
    // Attached: the keeper, the four stopped after their attach request
    // (the service answered each), the next one; each of the four detached.
    assert_eq!(k["attaches"], 6, "{k}");
    assert_eq!(k["detaches"], 4, "{k}");
    assert!(k["connections"].as_u64().unwrap() >= 7, "{k}");
}

/// A process that hoards frames: `ADDR X YS N`: binds UDP X and each port
/// of YS (comma-separated), prints "ready", echoes N datagrams on X and
/// never reads the others, then prints "hoarding" and reads nothing more.
const HOARD: &str = r#"
import socket, sys, time
x = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
x.bind((sys.argv[1], int(sys.argv[2])))
ys = []
for p in sys.argv[3].split(","):
    y = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    y.bind((sys.argv[1], int(p)))
    ys.append(y)
print("ready", flush=True)
for _ in range(int(sys.argv[4])):
    d, a = x.recvfrom(65536)
    x.sendto(d, a)
print("hoarding", flush=True)
while True:
    time.sleep(3600)
"#;

/// Issue 23 "exhausts its frame share / never returns frames": a live
/// process on the service that takes frames and never gives them back. It
/// reads one socket while six others it never reads are flooded (each of
/// its polls moves their datagrams into their queues), then stops reading
/// altogether while the flood goes on (its RX ring fills). Its share is
/// bounded: its queues hold at most a quarter of the shared RX frames, its
/// ring half; what it cannot take is counted with its reason
/// (`drop_process_share` in its engine, `xsk_rx_ring_full` on its socket);
/// and another process on the same UMEM keeps receiving: more datagrams
/// than the UMEM has RX frames, each echoed intact, none lost. (Before,
/// its queues could hold as much as its sockets' shares added up to, here
/// every frame of the UMEM: the other process's datagrams found the fill
/// ring empty and were dropped.)
#[test]
#[ignore = "needs root"]
fn a_process_that_hoards_frames_is_bounded_and_the_others_keep_receiving() {
    let lab = lab("vh");
    let _service = start_service(&lab);
    let (keep_port, x) = (13101u16, 13102u16);
    let ys: Vec<String> = (13103u16..13109).map(|p| p.to_string()).collect();
    let (addr, ys) = (ADDR_B.to_string(), ys.join(","));
    let keep = echo(&lab, "vh-keep", keep_port, &[]);
    on_xdp(&keep, keep_port);
    let args = [addr.as_str(), &x.to_string(), &ys, "50"];
    let mut hoarder = py(&lab, Host::B, true, "vh-hoarder", HOARD, &args);
    hoarder.wait_for("ready", T);
    on_xdp(&hoarder, x);
    let flood = |name: &str, secs: &str| {
        let mut k = py(&lab, Host::A, false, name, FLOOD, &[&addr, &ys, secs]);
        k.wait_for("flooding", T);
        k
    };
    let mut f = flood("vh-flood-reading", "30");
    client(&lab, "vh-x", &[x], 50);
    hoarder.wait_for("hoarding", T);
    kill_9(f.child.id());
    f.wait(T);
    // It reads nothing now: its ring fills.
    flood("vh-flood-stopped", "1.0").success(T);
    // The other process keeps receiving: none lost.
    let out = client(&lab, "vh-after", &[keep_port], 1100);
    let resent = line_of(&out, "ok ").split_whitespace().nth(2);
    assert_eq!(resent, Some("0"), "{out}\n{}", status(&lab));
    let st = status(&lab);
    let ifc = &st["ifaces"][0];
    let frames = ifc["rx_frames"].as_u64().unwrap();
    let of = |pid: u32| {
        ifc["clients"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["pid"] == pid)
            .cloned()
            .unwrap_or_else(|| panic!("pid {pid} not attached: {st}"))
    };
    let (h, k) = (of(hoarder.child.id()), of(keep.child.id()));
    eprintln!("hoarder {}\nkeeper {}", h, k);
    let (held, waiting) = (
        h["frames"]["rx_held"].as_u64().unwrap(),
        h["frames"]["rx_waiting"].as_u64().unwrap(),
    );
    // Its ring is full (half the frames); its queues hold at most a
    // quarter (plus the frames of its last poll, given back by 32s).
    assert_eq!(waiting, frames / 2, "{st}");
    assert!(held <= frames / 4 + 64, "{held} of {frames} held: {st}");
    assert!(h["drops"]["xsk_rx_ring_full"].as_u64().unwrap() > 0, "{st}");
    for d in ["xsk_rx_dropped", "xsk_rx_ring_full"] {
        assert_eq!(k["drops"][d], 0, "{d}: {st}");
    }
    let stats = stats_json(&lab);
    let e = engine_of(&stats, hoarder.child.id());
    assert!(
        e["counters"]["drop_process_share"].as_u64().unwrap() > 0,
        "{e}"
    );
}

/// Issue 24 item 3's fallback, counted per engine with its reason (item
/// 5: shown by `nanowire stats`): a client on the service whose send
/// buffer (SO_SNDBUF 1 MiB) is larger than a slab of the connection table
/// (256 KiB) has its send ring on the heap (its unacknowledged bytes would
/// not be delivered after a kill -9); its second connection, with the
/// default buffer, takes a slab. Its engine counts exactly one fallback,
/// "large buffer", none for the other reasons, and `nanowire stats` says
/// so; the sink gets every byte of both.
const BIG_SNDBUF_CLIENT: &str = r#"
import os, socket, sys, time
addr, port, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
big = socket.socket(); big.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
big.connect((addr, port))
small = socket.create_connection((addr, port))
for s in (big, small):
    s.sendall(b"x" * (1 << 20))
print("sent", os.getpid(), flush=True)
while not os.path.exists(flag):
    time.sleep(0.05)
big.close(); small.close()
print("done", flush=True)
"#;

const TWO_SINKS: &str = concat!(
    py_prelude!(),
    r#"
import threading
ls = listener(8)
got = []
def sink(c):
    got.append(sum(len(d) for d in chunks(c)))
ts = []
for i in range(2):
    c, _ = ls.accept()
    ts.append(threading.Thread(target=sink, args=(c,)))
    ts[-1].start()
for t in ts:
    t.join()
print("got", sorted(got), flush=True)
"#
);

#[test]
#[ignore = "needs root"]
fn a_send_buffer_larger_than_a_slab_is_counted_with_its_reason() {
    let lab = lab("vsb");
    let _sb = start_service(&lab);
    let (addr, port) = (ADDR_A.to_string(), "15801");
    let mut sink = py(&lab, Host::A, false, "vsb-sink", TWO_SINKS, &[&addr, port]);
    sink.wait_for("listening", T);
    let flag = scratch("vsb-flag");
    let _ = std::fs::remove_file(&flag);
    let flag_s = flag.display().to_string();
    let args = [addr.as_str(), port, &flag_s];
    let mut c = py(&lab, Host::B, true, "vsb-cli", BIG_SNDBUF_CLIENT, &args);
    c.wait_for("sent ", T);
    let pid: u64 = line_of(&c.stdout(), "sent ")[5..].trim().parse().unwrap();
    let iface = lab.iface(Host::B);
    let reasons = [
        "tcp_slab_fallback_large_buffer",
        "tcp_slab_fallback_no_free_slab",
        "tcp_slab_fallback_forked_child",
    ];
    let mut seen = Vec::new();
    let counted = until(T, || {
        seen = nanowire_testkit::engines_on(nanowire(), &iface)
            .iter()
            .filter(|e| nanowire_testkit::engine_pid(e) == Some(pid))
            .map(|e| reasons.map(|k| e["counters"][k].as_u64().unwrap_or(u64::MAX)))
            .collect();
        seen == [[1, 0, 0]]
    });
    assert!(
        counted,
        "fallbacks by reason of pid {pid}'s engine: {seen:?}"
    );
    let text = output(lab.command(Host::B, &[nanowire(), "stats"]), "stats");
    assert!(
        text.contains(
            "tcp send rings on the heap, not in slabs (their unacknowledged bytes are not delivered after a kill -9): 1 (send buffer over 256 KiB)"
        ),
        "{text}"
    );
    std::fs::write(&flag, b"").unwrap();
    assert!(c.success(T).contains("done"));
    assert!(sink.success(T).contains("got [1048576, 1048576]"));
    let _ = std::fs::remove_file(&flag);
}

/// Issue 24 item 1, the service's half (`K_TCP_MOVE`): a TCP connection
/// moves between two processes holding its socket, and to no other. Three
/// clients of the service (raw protocol, in this test's process: the
/// service tells them apart by their control sockets). The owner claims the
/// 4-tuple with the socket holding the port; a take before any offer is
/// refused, an offer by a process that does not own it is refused; after
/// the owner's offer, a process showing another socket is refused (the
/// inode), the taker showing its copy (a dup: one open file, as across
/// fork) gets it: the peer's SYN is steered to the taker's slot, not the
/// owner's; the offer is used up; the owner can no longer offer it; the
/// taker offers it back and the owner takes it ("turns"). Counted.
#[test]
#[ignore = "needs root"]
fn a_tcp_connection_moves_between_processes_holding_its_socket_and_to_no_other() {
    use std::net::{SocketAddrV4, TcpListener};
    use std::os::fd::AsFd;
    use std::sync::mpsc;
    let (port, from) = (12901u16, 40901u16);
    let local = SocketAddrV4::new(ADDR_B, port);
    let remote = SocketAddrV4::new(ADDR_A, from);
    let lab = lab("vmv");
    let _service = start_service(&lab);
    let (ifname, ns) = (lab.iface(Host::B), lab.netns(Host::B));
    let (step, steps) = mpsc::channel::<[u32; 2]>();
    let (go_on, go) = mpsc::channel::<()>();
    let clients = std::thread::spawn(move || {
        nanowire_testkit::in_ns(&ns, move || {
            use nanowire_stack::xdp::service::proto::TcpFlow;
            let (owner, taker, stranger) =
                (attached(&ifname), attached(&ifname), attached(&ifname));
            let (o, t, x) = (&owner.conn, &taker.conn, &stranger.conn);
            let ready = owner.ready.as_ref().expect("the program's count map");
            let sock = TcpListener::bind((ADDR_B, port)).unwrap();
            let copy = sock.try_clone().unwrap();
            let other = TcpListener::bind((ADDR_B, port + 1)).unwrap();
            o.tcp_flow(TcpFlow::Flow, local, remote, Some(sock.as_fd()))
                .unwrap();
            // (who, take, showing which socket, refused because: None = granted)
            let (mine, dup, another) = (sock.as_fd(), copy.as_fd(), other.as_fd());
            let script = [
                (t, true, dup, Some("no process offers it")),
                (x, false, another, Some("does not own it")),
                (o, false, mine, None),
                (x, true, another, Some("not the connection's socket")),
                (o, true, mine, Some("this process offers it")),
                (t, true, dup, None),
                (x, true, dup, Some("no process offers it")),
                (o, false, mine, Some("does not own it")),
            ];
            for (who, take, fd, why) in script {
                let r = who.tcp_move(take, local, remote, fd);
                match why {
                    Some(why) => refused(r, why),
                    None => r.unwrap(),
                }
            }
            let slots = [owner.reply.slot, taker.reply.slot];
            let count = |s: &[u32; 2]| s.map(|s| redirected_to(ready.as_fd(), s));
            step.send(count(&slots)).unwrap();
            go.recv().unwrap();
            step.send(count(&slots)).unwrap();
            // Turns: back to the owner.
            t.tcp_move(false, local, remote, copy.as_fd()).unwrap();
            o.tcp_move(true, local, remote, sock.as_fd()).unwrap();
            step.send(count(&slots)).unwrap();
            go.recv().unwrap();
            step.send(count(&slots)).unwrap();
            // Its owner may give it to the kernel (a hand-over), nobody else.
            refused(
                t.tcp_flow(TcpFlow::Pass, local, remote, None),
                "neither a socket",
            );
            o.tcp_flow(TcpFlow::Pass, local, remote, None).unwrap();
            step.send(count(&slots)).unwrap();
            go.recv().unwrap();
        })
    });
    let before = steps.recv_timeout(T).expect("the clients' first steps");
    syn_to(&lab, from, port);
    go_on.send(()).unwrap();
    let after = steps.recv_timeout(T).unwrap();
    assert_eq!(
        after[0], before[0],
        "nothing for the owner: {before:?} {after:?}"
    );
    assert!(
        after[1] > before[1],
        "the taker's SYN: {before:?} {after:?}"
    );
    let back = steps.recv_timeout(T).unwrap();
    syn_to(&lab, from, port);
    go_on.send(()).unwrap();
    let end = steps.recv_timeout(T).unwrap();
    assert!(end[0] > back[0], "moved back: {back:?} {end:?}");
    assert_eq!(
        end[1], back[1],
        "nothing more for the taker: {back:?} {end:?}"
    );
    steps.recv_timeout(T).expect("the passes");
    let st = status(&lab);
    go_on.send(()).unwrap();
    clients.join().expect("the clients");
    let flows = |c: &serde_json::Value| c["tcp_flows"].as_array().unwrap().len();
    let all = st["ifaces"][0]["clients"].as_array().unwrap().clone();
    assert_eq!(all.len(), 3, "{st}");
    assert_eq!(all.iter().map(flows).sum::<usize>(), 1, "{st}");
    let k = &st["counters"];
    assert_eq!(k["tcp_offers"], 2, "{st}");
    assert_eq!(k["tcp_moves"], 2, "{st}");
    assert_eq!(k["tcp_moves_refused"], 6, "{st}");
    assert_eq!(k["tcp_passes"], 1, "{st}");
    assert_eq!(k["tcp_flows_refused"], 1, "{st}");
    let to: Vec<_> = all
        .iter()
        .flat_map(|c| c["tcp_flows"].as_array().unwrap().clone())
        .collect();
    assert_eq!(to[0]["to"], "kernel", "{st}");
}

/// A SYN from host a's `from` to host b's `to` (a non-blocking connect,
/// left unanswered: the segment only has to reach the steering program).
fn syn_to(lab: &ScopedLab, from: u16, to: u16) {
    nanowire_testkit::in_ns(&lab.netns(Host::A), move || {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let sa = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: socket(2); the descriptor is owned at once.
        let s = unsafe {
            OwnedFd::from_raw_fd(libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            ))
        };
        let (a, b) = (sa(ADDR_A, from), sa(ADDR_B, to));
        // SAFETY: a sockaddr_in and its size, on our socket.
        unsafe {
            let r = libc::bind(s.as_raw_fd(), (&raw const a).cast(), len);
            // Said with the errno and host a's sockets on the port: in
            // session 26's CI the first call's socket was still in SYN-SENT
            // (EADDRINUSE), held by a child another test thread spawned
            // while it was open (it lacked SOCK_CLOEXEC then).
            assert_eq!(
                r,
                0,
                "bind {}:{from}: {}; host a: {}",
                ADDR_A,
                std::io::Error::last_os_error(),
                std::fs::read_to_string("/proc/thread-self/net/tcp")
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains(&format!(":{from:04X} ")))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            libc::connect(s.as_raw_fd(), (&raw const b).cast(), len);
        }
        std::thread::sleep(Duration::from_millis(300));
    });
}
