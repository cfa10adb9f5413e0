//! Real programs under `nanowire run` in a lab: python3 socket and asyncio
//! UDP echo servers, socat (fork + exec per datagram), iperf3 -u both
//! ways, and an unprivileged user running sockperf with the spin engine.
//! Every echo is checked byte for byte; every datagram iperf3 finds lost is
//! a counted drop (kernel or engine), plainly and under run alike. The servers and clients run with the default
//! engine (xdp: their UDP sockets go onto AF_XDP, and the log says so).

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host, ScopedLab};
use nanowire_testkit::B;
use run_support::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../preload/tests")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn echo_roundtrip(
    lab: &nanowire_lab::testbed::ScopedLab,
    tag: &str,
    server: &[&str],
    port: u16,
    count: u32,
    ready: Option<&str>,
    engine: &[&str],
) {
    let mut cmd = run_in(lab, Host::B, engine, server);
    cmd.env("NANOWIRE_LOG", "info");
    let mut srv = spawn(&format!("{tag}-srv"), cmd);
    match ready {
        Some(r) => srv.wait_for(r, Duration::from_secs(20)),
        None => std::thread::sleep(Duration::from_millis(500)),
    }
    let check = fixture("udp_check.py");
    let ports = port.to_string();
    let counts = count.to_string();
    let mut cli = spawn(
        &format!("{tag}-cli"),
        run_in(
            lab,
            Host::A,
            engine,
            &["python3", &check, B, &ports, &counts, "--quit"],
        ),
    );
    let out = cli.success(T);
    assert!(
        out.contains(&format!("ok {}", count + 160)),
        "{tag}: {out}\nserver:\n{}",
        srv.both()
    );
    let want = if engine.is_empty() {
        format!("{B}:{port}: xdp (interface")
    } else {
        "udp: spin (kernel socket".to_string()
    };
    assert!(
        srv.stderr().contains(&want),
        "{tag}: {want:?} not in the server's log:\n{}",
        srv.stderr()
    );
}

#[test]
#[ignore = "needs root"]
fn python_socket_and_asyncio_echo_servers() {
    let lab = lab("p");
    let echo = fixture("udp_echo.py");
    let engines: [&[&str]; 2] = [&[], &["--engine", "spin"]];
    for (e, engine) in engines.into_iter().enumerate() {
        for (i, mode) in ["blocking", "timeout", "asyncio"].into_iter().enumerate() {
            let port = 12000 + 10 * e as u16 + i as u16;
            let ports = port.to_string();
            echo_roundtrip(
                &lab,
                &format!("{mode}{e}"),
                &["python3", &echo, mode, B, &ports],
                port,
                500,
                Some("ready"),
                engine,
            );
        }
    }
}

#[test]
#[ignore = "needs root"]
fn socat_udp_echo_forks_and_execs_per_datagram() {
    let lab = lab("c");
    let listen = format!("UDP4-RECVFROM:12100,bind={ADDR_B},fork");
    echo_roundtrip(
        &lab,
        "socat",
        &["socat", "-T", "30", &listen, "EXEC:cat"],
        12100,
        40,
        None,
        // socat forks a child per datagram that reads the datagram its
        // parent peeked at: a forked child only has the kernel socket (the
        // engine's rings stay with the parent), so this needs the spin engine.
        &["--engine", "spin"],
    );
}

/// Drop counters of lab host `h`'s network namespace: UDP receive errors
/// (InErrors: a full socket buffer, a bad checksum) and its interface's
/// receive and transmit drops, by name.
fn kernel_drops(lab: &ScopedLab, h: Host) -> Vec<(String, u64)> {
    let stat = |f: &str| format!("/sys/class/net/{}/statistics/{f}", lab.lab.iface(h));
    let o = lab
        .command(
            h,
            &[
                "cat",
                "/proc/net/snmp",
                &stat("rx_dropped"),
                &stat("tx_dropped"),
            ],
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let udp: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("Udp: "))
        .copied()
        .collect();
    assert!(
        udp.len() == 2 && lines.len() >= 2,
        "{h:?}: /proc/net/snmp: {text}"
    );
    let col = |name: &str| {
        let i = udp[0].split_whitespace().position(|w| w == name).unwrap();
        udp[1]
            .split_whitespace()
            .nth(i)
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let n = |l: &str| l.trim().parse::<u64>().unwrap();
    vec![
        (format!("{h:?} udp InErrors"), col("InErrors")),
        (format!("{h:?} rx_dropped"), n(lines[lines.len() - 2])),
        (format!("{h:?} tx_dropped"), n(lines[lines.len() - 1])),
    ]
}

/// Every drop counter of the engines whose pages are in `dir` (their
/// processes finished): the engine's `drop_*` and the kernel's AF_XDP
/// receive and transmit drops it reports (`xsk_rx_*`,
/// `xsk_tx_kernel_dropped`), summed over engines, by name.
fn engine_drops(dir: &Path) -> Vec<(String, u64)> {
    let pages = nanowire_stack::xdp::shm::read_finished(dir);
    assert!(pages.unreadable.is_empty(), "{:?}", pages.unreadable);
    let mut sum = std::collections::BTreeMap::<String, u64>::new();
    for e in &pages.engines {
        for (k, v) in &e.counters {
            let drop = k.starts_with("drop_")
                || [
                    "xsk_rx_dropped",
                    "xsk_rx_ring_full",
                    "xsk_rx_fill_ring_empty",
                    "xsk_tx_kernel_dropped",
                ]
                .contains(&k.as_str());
            if drop && *v > 0 {
                *sum.entry(format!("{} {k}", dir.display())).or_default() += v;
            }
        }
    }
    sum.into_iter().collect()
}

/// One iperf3 UDP transfer (20 Mbit/s, 2 s, the server in B, `reverse`:
/// the server sends), both ends plainly or both under run. Returns the
/// client's end summary and the drops counted meanwhile on both hosts
/// (kernel and engines, each with a value).
fn iperf(
    lab: &ScopedLab,
    tag: &str,
    reverse: bool,
    run: bool,
) -> (serde_json::Value, Vec<(String, u64)>) {
    let under = |h: Host, end: &str, argv: &[&str]| {
        if !run {
            return plain_in(lab, h, argv);
        }
        let mut c = run_in(lab, h, &[], argv);
        c.env("NANOWIRE_STATS_DIR", scratch(&format!("stats-{tag}-{end}")));
        c
    };
    let kernel = || [kernel_drops(lab, Host::A), kernel_drops(lab, Host::B)].concat();
    let before = kernel();
    let mut srv = spawn(
        &format!("{tag}-srv"),
        under(
            Host::B,
            "srv",
            &["iperf3", "-s", "-1", "--forceflush", "-B", B, "-p", "5201"],
        ),
    );
    srv.wait_for("Server listening", Duration::from_secs(20));
    let mut args = vec![
        "iperf3", "-u", "-c", B, "-p", "5201", "-b", "20M", "-l", "1000", "-t", "2", "--json",
    ];
    if reverse {
        args.push("-R");
    }
    let mut cli = spawn(&format!("{tag}-cli"), under(Host::A, "cli", &args));
    let st = cli.wait(T);
    let out = cli.stdout();
    assert!(st.success(), "{tag}: {out}\n{}", cli.stderr());
    srv.wait(Duration::from_secs(20));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut drops: Vec<(String, u64)> = kernel()
        .into_iter()
        .zip(before)
        .map(|((k, now), (_, was))| (k, now - was))
        .filter(|(_, d)| *d > 0)
        .collect();
    if run {
        for end in ["srv", "cli"] {
            drops.extend(engine_drops(&scratch(&format!("stats-{tag}-{end}"))));
        }
    }
    (v["end"]["sum"].clone(), drops)
}

/// iperf3 -u both ways, plainly and with both ends under run: datagrams
/// flow (more than 1000 of 2 s at 20 Mbit/s) and every datagram iperf3
/// finds lost is a counted drop: on a quiet machine none is lost; on a
/// loaded one the receiver falls behind and the kernel drops for a full
/// socket buffer (UDP InErrors) plainly, the engine for a full socket
/// queue (drop_socket_queue_full) under run. Zero loss would be a timing
/// assumption the kernel does not meet either.
#[test]
#[ignore = "needs root"]
fn iperf3_udp_client_and_server_both_directions() {
    let lab = lab("i");
    for reverse in [false, true] {
        for run in [false, true] {
            let tag = format!(
                "iperf{}-{}",
                if reverse { "-r" } else { "" },
                if run { "run" } else { "plain" }
            );
            let (sum, drops) = iperf(&lab, &tag, reverse, run);
            let packets = sum["packets"].as_u64().unwrap_or(0);
            let lost = sum["lost_packets"].as_u64().unwrap_or(u64::MAX);
            let counted: u64 = drops.iter().map(|(_, v)| v).sum();
            eprintln!("{tag}: {packets} datagrams, {lost} lost, drops counted: {drops:?}");
            assert!(packets > 1000, "{tag}: {sum}");
            assert!(
                lost <= counted,
                "{tag}: {lost} datagrams lost, {counted} counted as dropped {drops:?}: {sum}"
            );
        }
    }
}

/// The receiver of `a_udp_backlog_read_in_a_select_loop_with_tcp_loses_nothing`:
/// a UDP socket (SO_RCVBUFFORCE 4 MiB: the kernel holds the whole burst)
/// and a TCP connection from the sender; it waits (not reading, the engine
/// turned only by the accept and the TCP timer service) until the sender's
/// file says the burst and its `done` are sent, then a select() loop reads
/// ONE datagram per readable UDP socket (as iperf3 -u does), until the TCP
/// side says `done` and ends; then what is left in the UDP socket.
const BACKLOG_RX: &str = r#"
import os, select, socket, sys, time
addr, port, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)  # SO_RCVBUFFORCE
u.bind((addr, port))
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((addr, port)); l.listen(1)
print("listening", flush=True)
c, _ = l.accept()
while not os.path.exists(flag):
    time.sleep(0.01)
n = total = 0
ctl = b""
while not ctl.endswith(b"done\n"):
    r, _, _ = select.select([c, u], [], [])
    if u in r:
        d = u.recv(2048); n += 1; total += sum(d)
    if c in r:
        ctl += c.recv(100)
u.setblocking(False)
while True:
    try:
        d = u.recv(2048); n += 1; total += sum(d)
    except BlockingIOError:
        break
print("udp", n, total)
"#;

/// The sender: connects, sends `count` datagrams of 64 bytes in a burst,
/// then `done` over TCP, then makes the flag file.
const BACKLOG_TX: &str = r#"
import socket, sys
addr, port, count, flag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
c = socket.create_connection((addr, port))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(count):
    u.sendto(bytes([i & 255]) * 64, (addr, port))
c.sendall(b"done\n")
c.close()
open(flag, "w").close()
print("sent", count)
"#;

/// Under a UDP backlog, a select() loop over a TCP and a UDP socket (iperf3
/// -u: control connection + data socket) lost datagrams under run that the
/// kernel kept: each readiness pass turned the engine through the TCP
/// socket, moving up to a poll budget of UDP frames from the RX ring into
/// the UDP socket's queue, while the program read one datagram per pass;
/// past the queue's cap (its UMEM share, 256 frames at ring depth 1024)
/// they were dropped (`drop_socket_queue_full`) although the ring could
/// have held them. Now a frame another endpoint's poll takes off the ring
/// for a full queue waits in that queue (bounded: a quarter of the RX
/// frames). 400 datagrams (more than the cap, less than cap + bound)
/// arrive while nobody reads; plainly and under run all 400 are read.
#[test]
#[ignore = "needs root"]
fn a_udp_backlog_read_in_a_select_loop_with_tcp_loses_nothing() {
    let lab = lab("ub");
    let mut want = None;
    for run in [false, true] {
        let tag = if run { "ub-run" } else { "ub-plain" };
        let port = if run { "5302" } else { "5301" };
        let flag = scratch(&format!("{tag}-flag"));
        let _ = std::fs::remove_file(&flag);
        let flag = flag.to_string_lossy().into_owned();
        let rx = ["python3", "-c", BACKLOG_RX, B, port, &flag];
        let mut cmd = xdp_or_plain(&lab, Host::B, run, &rx);
        cmd.env("NANOWIRE_RING_DEPTH", "1024");
        let mut srv = spawn(&format!("{tag}-rx"), cmd);
        srv.wait_for("listening", T);
        let tx = ["python3", "-c", BACKLOG_TX, B, port, "400", &flag];
        let mut cli = spawn(&format!("{tag}-tx"), plain_in(&lab, Host::A, &tx));
        cli.success(T);
        srv.success(T);
        let out = srv.stdout();
        if run {
            on_engine(&srv, &format!("udp {B}:{port}"));
        }
        assert!(out.contains("udp 400 "), "{tag}: {out}\n{}", srv.stderr());
        same_as_first(&mut want, tag, out, &srv.stderr());
    }
}

#[test]
#[ignore = "needs root"]
fn unprivileged_user_runs_sockperf_with_spin_and_is_told_why_not_xdp() {
    let lab = lab("u");
    ensure_preload();
    let as_nobody = |h: Host, args: &[&str]| {
        let mut argv = vec![
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "env",
            "NANOWIRE_LOG=info",
            nanowire(),
            "run",
        ];
        argv.extend_from_slice(args);
        lab.command(h, &argv)
    };
    let mut srv = spawn(
        "nobody-sr",
        as_nobody(
            Host::B,
            &[
                "--engine", "spin", "--", "sockperf", "sr", "-i", B, "-p", "11400",
            ],
        ),
    );
    srv.wait_for("to block on socket", Duration::from_secs(20));
    // The default engine is xdp: as nobody it must fall back and say why.
    let mut cli = spawn(
        "nobody-pp",
        as_nobody(
            Host::A,
            &[
                "--", "sockperf", "pp", "-i", B, "-p", "11400", "-t", "1", "-m", "64",
            ],
        ),
    );
    let out = cli.success(T);
    assert!(out.contains("# dropped messages = 0"), "{out}");
    assert!(out.contains("xdp engine not usable: no privilege"), "{out}");
    assert!(
        out.contains("udp: spin (kernel socket") && out.contains("xdp not used: no privilege"),
        "{out}"
    );
    let err = srv.stderr();
    assert!(
        err.contains("xdp not used: engine spin requested; also no privilege"),
        "{err}"
    );
}
