//! Receive what kernels send (issue 21 item 1): in the lab as it comes
//! (`nanowire lab up`: TSO/GSO on), a kernel TCP peer hands the veth 64 KiB
//! super-frames; the engine receives them as AF_XDP multi-buffer chains and
//! its TCP takes the super-segments. Real programs, hashed end to end, in
//! both attach modes (generic XDP sees the super-frames unsegmented; native
//! XDP on veth makes the peer segment them).
//!
//! Every test here needs root (`make test` runs them with
//! `--include-ignored`).

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host, ScopedLab};
use nanowire_testkit::B;
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(180);
const MODES: [&str; 2] = ["generic", "native"];

/// `cmd` in host `h` under `nanowire run --engine xdp` in XDP attach `mode`.
fn under_run(l: &ScopedLab, h: Host, mode: &str, cmd: &[&str]) -> std::process::Command {
    let mut c = run_in(l, h, &["--engine", "xdp", "-o", "log=info"], cmd);
    c.env("NANOWIRE_XDP_MODE", mode);
    c
}

/// `argv` in host b under run (`mode` XDP), named `name`, once it printed
/// `ready` (30 s at most).
fn server_under_run(l: &ScopedLab, name: &str, mode: &str, argv: &[&str], ready: &str) -> Kid {
    let mut k = spawn(name, under_run(l, Host::B, mode, argv));
    k.wait_for(ready, Duration::from_secs(30));
    k
}

/// The last whitespace-separated word of the line starting with `key`.
fn field(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key:?} line in:\n{out}"))
        .trim()
        .to_string()
}

/// Reads to EOF, prints `got <bytes> <sha256>`, then stays (its engine's
/// counters readable with `nanowire stats`) until killed.
const SINK_PY: &str = r#"
import socket, sys, hashlib
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
h, n = hashlib.sha256(), 0
while True:
    d = c.recv(1 << 20)
    if not d: break
    h.update(d); n += len(d)
c.close()
print(f"got {n} {h.hexdigest()}", flush=True)
import time; time.sleep(120)
"#;

/// Writes TOTAL random bytes in large writes (TSO/GSO super-frames), prints
/// `sent <bytes> <sha256>`.
const SOURCE_PY: &str = r#"
import socket, sys, hashlib, os
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
total = int(sys.argv[3]); block = os.urandom(4 << 20); h = hashlib.sha256(); sent = 0
while sent < total:
    b = block[: min(len(block), total - sent)]
    c.sendall(b); h.update(b); sent += len(b)
    block = block[1:] + block[:1]
c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
print(f"sent {sent} {h.hexdigest()}", flush=True)
"#;

/// [`SINK_PY`] on `port` in host b, until it listens; then `source` (a
/// [`SOURCE_PY`]) in host a writing `total` bytes to it; the one in host
/// `runs` under run (`mode` XDP, `env` set), the other plainly. Returns
/// the sink and the source, still running (their engines too), once the
/// source said "sent " and the sink has its stream.
fn sink_and_source(
    l: &ScopedLab,
    tag: &str,
    (runs, mode, env): (Host, &str, &[(&str, &str)]),
    (port, total): (&str, &str),
    source: &str,
) -> (Kid, Kid) {
    let placed = |h: Host, argv: &[&str]| {
        if h != runs {
            return plain_in(l, h, argv);
        }
        let mut cmd = under_run(l, h, mode, argv);
        cmd.envs(env.iter().copied());
        cmd
    };
    let sink = ["python3", "-c", SINK_PY, B, port];
    let mut srv = spawn(&format!("sink-{tag}"), placed(Host::B, &sink));
    srv.wait_for("listening", Duration::from_secs(30));
    let source = ["python3", "-c", source, B, port, total];
    let mut cli = spawn(&format!("source-{tag}"), placed(Host::A, &source));
    cli.wait_for("sent ", T);
    srv.wait_for("got ", T);
    (srv, cli)
}

/// [`sink_and_source`] of `total` bytes from [`SOURCE_PY`] to `port`, to
/// the end, once both ends saw the same bytes (count and sha256): the
/// sink's output, and the sink still running (its engine's counters
/// readable with `nanowire stats` while it is kept).
fn hashed_stream(
    l: &ScopedLab,
    tag: &str,
    run: (Host, &str, &[(&str, &str)]),
    port: &str,
    total: u64,
) -> (String, Kid) {
    let total = total.to_string();
    let (srv, mut cli) = sink_and_source(l, tag, run, (port, &total), SOURCE_PY);
    let c = cli.success(T);
    let s = srv.both();
    let sent = field(&c, "sent");
    assert!(sent.starts_with(&format!("{total} ")), "{tag}: {c}");
    assert_eq!(
        field(&s, "got"),
        sent,
        "{tag}: bytes and sha256 differ between the ends"
    );
    (s, srv)
}

#[test]
#[ignore = "needs root"]
fn a_plain_client_writes_300_mb_to_an_accelerated_python_server() {
    let l = lab("sfw");
    for (mode, port) in with_ports(14100, MODES) {
        let run = (Host::B, mode, &[][..]);
        let (s, _srv) = hashed_stream(&l, mode, run, &port, 300 << 20);
        assert!(
            s.contains(&format!("tcp listener {B}:{port}: xdp")),
            "{mode}: the server is not on the engine:\n{s}"
        );
        let e = engine_counters(&l, Host::B);
        eprintln!("{mode}: {e}");
        assert_eq!(e["drop_rx_chain"], 0, "{mode}: {e}");
        assert_eq!(e["xsk_rx_dropped"], 0, "{mode}: {e}");
        if mode == "generic" {
            // Generic XDP sees the peer's super-frames whole: they came as
            // multi-buffer chains.
            assert!(e["rx_multi_buffer"].as_u64() > Some(0), "{mode}: {e}");
        }
        // Native mode attaches the frags-aware program; generic mode
        // starts without xdp.frags and the first chain replaced it.
        assert_eq!(xdp_prog(&l, Host::B), "nw_steer_frags", "{mode}");
    }
}

/// The name of the XDP program attached to host `h`'s interface.
fn xdp_prog(l: &ScopedLab, h: Host) -> String {
    let ifn = l.iface(h);
    let out = plain_in(l, h, &["ip", "-d", "-j", "link", "show", "dev", &ifn])
        .output()
        .expect("ip link");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j output");
    v[0]["xdp"]["prog"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("no XDP program on {ifn}: {v}"))
        .to_string()
}

/// The counters of the one engine on host `h`'s interface (`nanowire stats`).
fn engine_counters(l: &ScopedLab, h: Host) -> serde_json::Value {
    let ifn = l.iface(h);
    let mine = nanowire_testkit::engines_on(nanowire(), &ifn);
    assert_eq!(mine.len(), 1, "one engine on {ifn}: {mine:?}");
    mine[0]["counters"].clone()
}

#[test]
#[ignore = "needs root"]
fn lost_and_reordered_super_frames_keep_a_hashed_stream_intact() {
    // The engine's seeded receive-side injector acts on whole packets after
    // chain assembly: 64 KiB super-frames arrive late (out of order) or not
    // at all, and the TCP recovers as the kernel's would (SACK, fast
    // retransmit, RTO). A bad checksum is the same as a loss to the sender
    // (classify.rs tests the 64 KiB bad-checksum drop itself).
    let l = lab("sfo");
    let faults = "seed=21,loss=0.5%,reorder=3%,reorder_delay_us=300,dir=rx";
    let run = (Host::B, "generic", &[("NANOWIRE_FAULTS", faults)][..]);
    let (s, _srv) = hashed_stream(&l, "faults", run, "14300", 64 << 20);
    assert!(s.contains("fault injection on"), "{s}");
    let e = engine_counters(&l, Host::B);
    eprintln!("{e}");
    for k in ["rx_multi_buffer", "fault_rx_reordered", "drop_fault_rx"] {
        assert!(e[k].as_u64() > Some(0), "{k}: {e}");
    }
    assert_eq!(e["drop_rx_chain"], 0, "{e}");
}

#[test]
#[ignore = "needs root"]
fn curl_under_run_downloads_100_mb_from_a_plain_http_server() {
    require(&["curl"]);
    let l = lab("sfc");
    let dir = scratch("www");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("big.bin");
    // 100 MB of a position-dependent pattern.
    std::fs::write(&file, xorshift_bytes(100_000_000, 0x9e37_79b9_7f4a_7c15)).unwrap();
    let want = sha256(&file);
    let port = "14180";
    let _srv = {
        let mut s = spawn(
            "http-server",
            plain_in(
                &l,
                Host::B,
                &[
                    "python3",
                    "-m",
                    "http.server",
                    port,
                    "--bind",
                    B,
                    "--directory",
                    dir.to_str().unwrap(),
                ],
            ),
        );
        s.wait_for("Serving HTTP", Duration::from_secs(30));
        s
    };
    for mode in MODES {
        let out = scratch(&format!("got-{mode}.bin"));
        let url = format!("http://{ADDR_B}:{port}/big.bin");
        let mut c = spawn(
            &format!("curl-{mode}"),
            under_run(
                &l,
                Host::A,
                mode,
                &[
                    "curl",
                    "-sS",
                    "--max-time",
                    "120",
                    "-o",
                    out.to_str().unwrap(),
                    &url,
                ],
            ),
        );
        let log = c.success(T);
        assert!(
            log.contains(&format!("-> {ADDR_B}:{port}: xdp")),
            "{mode}: curl is not on the engine:\n{log}"
        );
        assert_eq!(sha256(&out), want, "{mode}: the download differs");
        let _ = std::fs::remove_file(&out);
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
#[ignore = "needs root"]
fn iperf3_with_4_streams_into_an_accelerated_server_completes() {
    require(&["iperf3"]);
    let l = lab("sfi");
    for (mode, port) in with_ports(14201, MODES) {
        // iperf3's own banner sits in its stdout buffer; the shim's line
        // says the listener is up (on the engine).
        let up = format!("tcp listener {B}:{port}: xdp");
        let line = format!("iperf3 -s -1 -B {B} -p {port}");
        let argv = words(&line);
        let mut srv = server_under_run(&l, &format!("iperf3-s-{mode}"), mode, &argv, &up);
        let line = format!("iperf3 -c {B} -p {port} -P 4 -n 400M --json");
        let argv = words(&line);
        let mut cli = spawn(&format!("iperf3-c-{mode}"), plain_in(&l, Host::A, &argv));
        cli.success(T);
        let s = srv.success(T);
        assert!(
            s.contains(&format!("tcp listener {B}:{port}: xdp")),
            "{mode}: iperf3 -s is not on the engine:\n{s}"
        );
        let v: serde_json::Value = serde_json::from_str(&cli.stdout())
            .unwrap_or_else(|e| panic!("{mode}: iperf3 --json: {e}\n{}", cli.stdout()));
        let got = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
        let sent = v["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0);
        eprintln!("{mode}: iperf3 -P 4: sent {sent} received {got} bytes");
        // A fixed amount (-n): a stalled stream never completes (the stall
        // this fixes moved ~240 KB in 2 s). iperf3 reads the receiver's
        // count when the sender is done, so what is still in flight (a few
        // windows) is not in it.
        assert!(sent >= 400 << 20, "{mode}: {sent} bytes sent:\n{v}");
        assert!(
            got >= sent / 2,
            "{mode}: {got} of {sent} bytes received:\n{v}"
        );
        let streams = v["end"]["streams"].as_array().map_or(0, |a| a.len());
        assert_eq!(streams, 4, "{mode}: {v}");
    }
}

fn sha256(p: &std::path::Path) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(p)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
#[ignore = "needs root"]
fn without_multi_buffer_tcp_stays_on_the_kernel_and_says_so() {
    // What an engine does where the kernel has no multi-buffer AF_XDP
    // (NANOWIRE_XDP_NO_MULTI_BUFFER=1 makes this kernel behave so): in
    // generic XDP it could not receive a kernel peer's super-frames, so the
    // TCP socket is left to the kernel with one line saying why, and the
    // transfer completes instead of stalling.
    let l = lab("sfn");
    let port = "14400";
    let no_mb = [("NANOWIRE_XDP_NO_MULTI_BUFFER", "1")];
    let run = (Host::B, "generic", &no_mb[..]);
    let (s, _srv) = hashed_stream(&l, "nomb", run, port, 32 << 20);
    assert!(
        s.contains("super-frames; TCP stays on the kernel"),
        "the reason is on stderr:\n{s}"
    );
    assert!(!s.contains(&format!("tcp listener {B}:{port}: xdp")), "{s}");
    // (`tcp_no_multi_buffer` counts it on the stats page of an engine that
    // lives on for other sockets; this one had none, so it closed.)
}

/// UDP receiver: `ADDR PORT N`, prints `got <count> <distinct sizes>`.
/// UDP GSO sender: `ADDR PORT SENDS`, each send 10 datagrams of 1000 bytes
/// in one UDP_SEGMENT super-frame.
const UDP_GSO_PY: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if sys.argv[1] == "server":
    s.bind((sys.argv[2], int(sys.argv[3])))
    print("listening", flush=True)
    sizes = []
    s.settimeout(20)
    while len(sizes) < int(sys.argv[4]):
        sizes.append(len(s.recv(65536)))
    print("got", len(sizes), sorted(set(sizes)), flush=True)
else:
    s.setsockopt(socket.SOL_UDP, 103, 1000)  # UDP_SEGMENT
    for i in range(int(sys.argv[4])):
        s.sendto(bytes([i % 256]) * 10000, (sys.argv[2], int(sys.argv[3])))
    print("sent", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn udp_gso_super_frames_reach_an_accelerated_receiver_as_datagrams() {
    // A kernel sender's UDP_SEGMENT super-frame is many datagrams in one
    // skb; their sizes are known only to the skb, so the steering program
    // passes it to the kernel (longer than the MTU), which splits it for
    // the socket's kernel twin. The receiver sees the datagrams as plainly.
    let l = lab("sfu");
    for (mode, port) in with_ports(14500, MODES) {
        let argv = ["python3", "-c", UDP_GSO_PY, "server", B, &port, "50"];
        let mut srv =
            server_under_run(&l, &format!("udp-gso-srv-{mode}"), mode, &argv, "listening");
        // Generic mode starts with the program without xdp.frags, whose
        // frames the kernel copies more cheaply (nanowire_xdp::Frags::Lazy;
        // no chain reaches this engine: the kernel splits these).
        let prog = xdp_prog(&l, Host::B);
        let want = if mode == "generic" {
            "nw_steer"
        } else {
            "nw_steer_frags"
        };
        plain_in(
            &l,
            Host::A,
            &["python3", "-c", UDP_GSO_PY, "client", B, &port, "5"],
        )
        .status()
        .expect("python3");
        srv.wait_for("got ", Duration::from_secs(30));
        let s = srv.both();
        assert!(
            s.contains(&format!("udp {B}:{port}: xdp")),
            "{mode}: not on the engine:\n{s}"
        );
        assert_eq!(field(&s, "got"), "50 [1000]", "{mode}: {s}");
        assert_eq!(prog, want, "{mode}");
    }
}

#[test]
#[ignore = "needs root"]
fn an_accelerated_sender_leaves_checksums_to_the_kernel_where_offered() {
    // Issue 21 item 3: with AF_XDP TX metadata (kernel 6.11+, copy mode
    // here) the engine's TCP sends each segment with the pseudo-header's
    // sum only and asks the kernel to complete it (the skb is
    // CHECKSUM_PARTIAL, as a local sender's); without it (the variable
    // below: a kernel or driver that does not offer it) it checksums in
    // software. Either way the plain receiver gets the same bytes.
    let l = lab("sfk");
    let total = (64u64 << 20).to_string();
    // The source stays after sending: its engine's counters are read.
    let source = format!("{SOURCE_PY}\nimport time; time.sleep(120)\n");
    for (no_meta, port) in with_ports(14400, [false, true]) {
        let env: &[_] = if no_meta {
            &[("NANOWIRE_TX_CSUM_OFFLOAD", "0")]
        } else {
            &[]
        };
        let run = (Host::A, "generic", env);
        let (srv, cli) = sink_and_source(&l, &format!("{no_meta}"), run, (&port, &total), &source);
        let c = cli.both();
        assert!(c.contains(": xdp"), "the source is not on the engine:\n{c}");
        assert_eq!(
            field(&srv.both(), "got"),
            field(&c, "sent"),
            "no_meta={no_meta}: the stream differs"
        );
        let e = engine_counters(&l, Host::A);
        eprintln!("no_meta={no_meta}: {e}");
        let offloaded = e["tx_csum_offload"].as_u64().unwrap_or(0);
        if no_meta {
            assert_eq!(offloaded, 0, "{e}");
        } else {
            // Every data segment at least (64 MiB / 1448 bytes).
            assert!(offloaded > 40_000, "{e}");
        }
        drop(cli);
    }
}
