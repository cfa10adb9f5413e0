//! Connection churn on the xdp engine (issue 21 item 2, issue 20 findings 4
//! and 6: also a UDP echo answering spoofed sources), each test in its own
//! lab with the default offloads: real programs (ab, wrk, nginx, Python)
//! plainly and under `nanowire run`, the same outcome expected from both.

mod run_support;

use nanowire_lab::testbed::{Host, ScopedLab};
use run_support::*;
use std::time::Duration;

const B: &str = "198.18.0.2";

fn need(cmd: &str) {
    assert!(
        have(cmd),
        "{cmd} is needed for this test (scripts/install-deps.sh installs it)"
    );
}

/// A plain nginx in host b serving a small file on `port` (one worker, no
/// access log), in a private scratch directory.
fn nginx(lab: &ScopedLab, port: u16, tag: &str) -> Kid {
    need("nginx");
    let dir = scratch(&format!("nginx-{tag}"));
    std::fs::create_dir_all(dir.join("html")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::write(dir.join("html/index.html"), "hello from nginx\n").unwrap();
    let d = dir.display();
    let conf = format!(
        "user root;\nworker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp;\n\
         fastcgi_temp_path {d}/tmp; uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
         server {{ listen {B}:{port}; root {d}/html; }} }}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let conf = dir.join("nginx.conf");
    let conf = conf.to_str().unwrap();
    let mut k = spawn(
        &format!("nginx-{tag}"),
        plain_in(
            lab,
            Host::B,
            &["nginx", "-c", conf, "-p", &dir.display().to_string()],
        ),
    );
    wait_port(lab, port);
    assert!(
        k.child.try_wait().unwrap().is_none(),
        "nginx exited:\n{}",
        k.both()
    );
    k
}

/// Wait until something listens on b:port (a plain connect from host a).
fn wait_port(lab: &ScopedLab, port: u16) {
    let probe = format!(
        "import socket,time\nfor i in range(500):\n  try:\n    socket.create_connection(('{B}',{port}),1).close(); break\n  except OSError: time.sleep(0.01)\nelse: raise SystemExit('nothing listens')\n"
    );
    let o = plain_in(lab, Host::A, &["python3", "-c", &probe])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A load tool's lab: the tool checked installed, a lab tagged `tag`, nginx
/// serving in b on `port` (stopped before the lab goes) and the page's URL.
struct Site {
    _nginx: Kid,
    lab: ScopedLab,
    url: String,
}

fn site_for(tool: &str, tag: &str, port: u16) -> Site {
    need(tool);
    let lab = lab(tag);
    let nginx = nginx(&lab, port, tool);
    let url = format!("http://{B}:{port}/index.html");
    Site {
        _nginx: nginx,
        lab,
        url,
    }
}

/// `tool` (its name, then `args` and `url`) against nginx, with `conns`
/// connections at once, from host a plainly and under run: each run's
/// "TOOL -c CONNS (under run: RUN)" and output (both checked by `check`).
fn plainly_and_under_run(
    lab: &ScopedLab,
    (tool, args, url): (&str, &[&str], &str),
    conns: &[&str],
    check: impl Fn(&str, &str),
) {
    for c in conns {
        for under_run in [false, true] {
            let argv = [&[tool], args, &["-c", c, url]].concat();
            let cmd = run_or_plain(lab, Host::A, under_run, &argv);
            let what = format!("{tool} -c {c} (under run: {under_run})");
            check(&what, &output(cmd, &what));
        }
    }
}

fn field(out: &str, key: &str) -> Option<u64> {
    let line = out.lines().find(|l| l.trim_start().starts_with(key))?;
    line[line.find(':')? + 1..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `ab -n 300` with 1 and 20 concurrent connections (one connection per
/// request) against a plain nginx: every request completes, none fails,
/// plainly and with ab under run.
#[test]
#[ignore = "needs root"]
fn ab_one_connection_per_request_against_nginx_plain_and_under_run() {
    let site = site_for("ab", "ab", 8080);
    let ab = (
        "ab",
        &["-q", "-n", "300", "-s", "10"][..],
        site.url.as_str(),
    );
    plainly_and_under_run(&site.lab, ab, &["1", "20"], |what, out| {
        assert_eq!(field(out, "Complete requests"), Some(300), "{what}:\n{out}");
        assert_eq!(field(out, "Failed requests"), Some(0), "{what}:\n{out}");
        assert!(!out.contains("Non-2xx"), "{what}:\n{out}");
    });
}

/// wrk with 10 and 50 connections for 2 s (nginx closes a keep-alive
/// connection after 1000 requests, so wrk reconnects all along): no socket
/// error, plainly and under run.
#[test]
#[ignore = "needs root"]
fn wrk_connections_against_nginx_plain_and_under_run() {
    let site = site_for("wrk", "wr", 8081);
    let wrk = ("wrk", &["-t2", "-d2"][..], site.url.as_str());
    plainly_and_under_run(&site.lab, wrk, &["10", "50"], |what, out| {
        assert!(out.contains("requests in"), "{what}:\n{out}");
        assert!(!out.contains("Socket errors"), "{what}:\n{out}");
    });
}

/// One HTTP/1.0 request per connection (nginx closes first, so host b
/// holds each 4-tuple in TIME-WAIT), `n` in a row; prints the local ports'
/// parities; with `hold`, keeps one more connection open and says `done`
/// (an engine with a connection is turned, and publishes its counters).
const CONNECT_LOOP_PY: &str = r#"
import socket, sys, time
dst, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "hold"
even = 0
for i in range(n):
    s = socket.create_connection((dst, port), 5)
    even += s.getsockname()[1] % 2 == 0
    s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
    while s.recv(65536):
        pass
    s.close()
print("connections", n, "even ports", even, flush=True)
if hold:
    k = socket.create_connection((dst, port), 5)
    print("done", flush=True)
    time.sleep(120)
"#;

/// Connections under run do not land on the 4-tuples the kernel's own
/// connections of the same host just left in the peer's TIME-WAIT (whose
/// ISNs and timestamps, of the kernel's clock and secret, ours cannot
/// follow: a SYN behind them is answered with the TIME-WAIT's ACK and
/// costs a reset and a resend): the engine takes ports of the parity the
/// kernel's connect() leaves alone. Host a's port range is narrowed to
/// 1000 ports so that both walks cover it; after 400 plain connections,
/// 400 under run send no reset.
#[test]
#[ignore = "needs root"]
fn connections_under_run_avoid_the_time_wait_of_the_kernels_connections() {
    let lab = lab("tw");
    output(
        plain_in(
            &lab,
            Host::A,
            &["sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 40999"],
        ),
        "narrow the port range",
    );
    let _ng = nginx(&lab, 8086, "tw");
    let plain = output(
        plain_in(
            &lab,
            Host::A,
            &["python3", "-c", CONNECT_LOOP_PY, B, "8086", "400", "-"],
        ),
        "plain connections",
    );
    eprintln!("plain: {plain}");
    let mut k = spawn(
        "connect-loop-run",
        run_in(
            &lab,
            Host::A,
            &[],
            &["python3", "-c", CONNECT_LOOP_PY, B, "8086", "400", "hold"],
        ),
    );
    k.wait_for("done", Duration::from_secs(60));
    let iface = lab.iface(Host::A);
    let mut c = engine_counters(&iface);
    for _ in 0..100 {
        if c["tcp_active_opens"].as_u64() == Some(401) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        c = engine_counters(&iface);
    }
    eprintln!("under run: {}", k.both());
    assert_eq!(c["tcp_active_opens"].as_u64(), Some(401), "{c}");
    // A collision shows as a reset: the SYN-SENT side answers the
    // TIME-WAIT's ACK with an RST and sends its SYN again. Out-of-window
    // drops are not asserted: on a loaded machine the peer retransmits a
    // FIN or data segment our delayed ACK had not yet covered, and those
    // old duplicates are dropped and counted there, as Linux counts them.
    assert_eq!(c["tcp_rst_sent"].as_u64(), Some(0), "{c}");
}

/// `n` HTTP/1.0 requests, one connection each; prints the process's fd
/// table size (`FDSize`) as it was before the first socket.
const CHURN_PY: &str = r#"
import socket, sys
dst, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fdsize = [l for l in open("/proc/self/status") if l.startswith("FDSize:")][0].split()[1]
for i in range(n):
    s = socket.create_connection((dst, port), 5)
    s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
    while s.recv(65536):
        pass
    s.close()
print("connections", n, "fdsize", fdsize, flush=True)
"#;

/// `nanowire run RUN_ARGV` in host a under `strace -f` (`-e trace=` `calls`),
/// the trace written to the scratch file `name`: the command and the file
/// (one line per call once it has run).
fn traced_run(
    lab: &ScopedLab,
    name: &str,
    calls: &str,
    run_argv: &[&str],
) -> (std::process::Command, std::path::PathBuf) {
    need("strace");
    ensure_preload();
    let trace = scratch(name);
    let t = trace.to_str().unwrap();
    let argv = [
        &[
            "strace",
            "-f",
            "-qq",
            "-o",
            t,
            "-e",
            calls,
            nanowire(),
            "run",
        ],
        run_argv,
    ]
    .concat();
    (plain_in(lab, Host::A, &argv), trace)
}

/// Syscalls of `python3 CHURN_PY` with `n` connections under run, traced
/// by strace (`-e trace=` `calls`): one line per call.
fn churn_trace(lab: &ScopedLab, port: &str, n: usize, calls: &str) -> (String, Vec<String>) {
    let ns = n.to_string();
    let (cmd, trace) = traced_run(
        lab,
        &format!("strace-{n}"),
        calls,
        &["--", "python3", "-c", CHURN_PY, B, port, &ns],
    );
    let out = output(cmd, "connections under run, traced");
    (out, lines_of(&trace))
}

/// What a process under run pays to start its engine, and what stays out
/// of each connection, counted in syscalls: the kernel's BTF is never read
/// (aya's loader parsed all 5.5 MB of it in every process; the steering
/// program needs none), no feature-probe programs are loaded (one program
/// load: the steering program), the netlink sockets are the engine's start
/// only (none per connect: 40 connections open no more than 10 do), one
/// getsockname per connect (the engine knows the port it binds), and the fd
/// table is sized at load for the keep duplicates (so the first close in
/// the threaded process does not grow it behind a synchronize_rcu); per
/// connect: five getsockopts (none of the options a process that set none
/// would read back as defaults), no getpid, no mmap, and fewer binds and
/// steering-map writes than connections (the client port block); and the
/// application's thread never waits for the warden's start.
#[test]
#[ignore = "needs root"]
fn engine_start_and_connects_make_no_avoidable_syscalls() {
    let lab = lab("sc");
    let _ng = nginx(&lab, 8087, "sc");
    let calls = "trace=openat,open,bpf,socket,bind,getsockname,getsockopt,getpid,mmap,wait4,execve";
    let count = |lines: &[String], pat: &str| lines.iter().filter(|l| l.contains(pat)).count();
    let (out10, few) = churn_trace(&lab, "8087", 10, calls);
    let (out40, many) = churn_trace(&lab, "8087", 40, calls);
    assert!(out40.contains("connections 40"), "{out40}");
    for (out, lines) in [(&out10, &few), (&out40, &many)] {
        assert_eq!(
            count(lines, "/sys/kernel/btf"),
            0,
            "kernel BTF read:\n{out}"
        );
        // A load the verifier abandoned for a signal (EAGAIN, on the line
        // itself or on strace's "<... bpf resumed>" line when another
        // thread's call came between) is tried again: not another program.
        let abandoned = lines
            .iter()
            .filter(|l| {
                l.contains("EAGAIN") && (l.contains("BPF_PROG_LOAD") || l.contains("bpf resumed>"))
            })
            .count();
        assert_eq!(
            count(lines, "BPF_PROG_LOAD") - abandoned,
            1,
            "program loads:\n{}",
            lines.join("\n")
        );
        assert_eq!(count(lines, "prog_type=BPF_PROG_TYPE_XDP"), 1);
        // The keep duplicates' floor (3/4 of RLIMIT_NOFILE, at most 4096)
        // fits in the table before any socket.
        let fdsize: usize = out
            .split_whitespace()
            .skip_while(|w| *w != "fdsize")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no fdsize in {out}"));
        assert!(fdsize > 768, "FDSize {fdsize} at start:\n{out}");
    }
    // The warden's start never waits in the application's thread (it did:
    // the first connect waited for its exec and set-up); an engine thread
    // reaps its set-up process. The first line is the exec of the process.
    for lines in [&few, &many] {
        let pid_of = |l: &String| l.split_whitespace().next().unwrap_or("").to_string();
        let main = lines.first().map(pid_of).expect("a traced process");
        let wardens: Vec<String> = lines
            .iter()
            .filter(|l| l.contains("execve(") && l.contains("\"warden\""))
            .map(pid_of)
            .collect();
        let waits: Vec<&String> = lines
            .iter()
            .filter(|l| {
                l.starts_with(&format!("{main} "))
                    && wardens.iter().any(|w| l.contains(&format!("wait4({w},")))
            })
            .collect();
        assert!(
            waits.is_empty(),
            "the application's thread waited for the warden's start: {waits:?}"
        );
    }
    // The engine's start opens a few (and its neighbour thread one, when
    // it gets that far before the exit): never one per connection.
    let (nl_few, nl_many) = (
        count(&few, "socket(AF_NETLINK"),
        count(&many, "socket(AF_NETLINK"),
    );
    assert!(
        nl_many <= nl_few + 1 && nl_many < 20,
        "netlink sockets: {nl_few} with 10 connections, {nl_many} with 40"
    );
    // One getsockname per connect (is the socket bound?): the port the
    // engine binds is known without asking again.
    let (gs_few, gs_many) = (count(&few, "getsockname("), count(&many, "getsockname("));
    assert!(
        gs_many - gs_few <= 30,
        "getsockname: {gs_few} with 10 connections, {gs_many} with 40"
    );
    // Three getsockopts per connect (its netns, and the socket's cookie
    // when the record is made and when it closes): a process that set no
    // buffer, TCP or IP header option has the kernel's defaults, not read
    // back (SO_RCVBUF, SO_SNDBUF, TCP_NODELAY, SO_LINGER, SO_KEEPALIVE
    // were; IP_TTL and IP_TOS were until session 15: the engine reads
    // them once). No getpid per connect (the flow claim's pid is read
    // once).
    let per = |pat: &str| {
        let (a, b) = (count(&few, pat), count(&many, pat));
        (
            b.saturating_sub(a),
            format!("{pat} {a} with 10 connections, {b} with 40"),
        )
    };
    let (d, what) = per("getsockopt(");
    assert!(d <= 3 * 30, "{what}");
    let (d, what) = per("getpid(");
    assert!(d <= 3, "{what}");
    // No mapping per connection: a connection's buffers take storage as
    // bytes arrive (a few KiB here), not 2 x 256 KiB mmap'd per connect.
    let (d, what) = per("mmap(");
    assert!(d <= 10, "{what}");
    // Connects take their ports from the client port block: a port is
    // bound and claimed once, when the block grows, not per connection
    // (that was one bind and two map writes, claim and release, each).
    let (d, what) = per("bind(");
    assert!(d < 30, "{what}");
    let (upd, what_u) = per("BPF_MAP_UPDATE_ELEM");
    let (del, what_d) = per("BPF_MAP_DELETE_ELEM");
    assert!(upd < 30 && del < 30, "{what_u}; {what_d}");
}

/// Three HTTP/1.0 requests, one connection each, a pause after each (the
/// connection's last ACK is long in, so the process holds no socket).
const PAUSED_PY: &str = r#"
import socket, sys, time
dst, port = sys.argv[1], int(sys.argv[2])
for i in range(3):
    s = socket.create_connection((dst, port), 5)
    s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
    body = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        body += d
    s.close()
    print("request", i, "status", body.split(b"\r\n")[0].decode(), "bytes", len(body), flush=True)
    time.sleep(1)
"#;

/// Session 26: a process on an engine of its own whose last connection
/// had ended got kernel sockets from then on: the engine went with the
/// last socket, its warden kept the steering program attached (a copy of
/// the link, for a kill -9), and every later open found the interface
/// held (EBUSY). Under load it struck between the connections of one loop
/// (`engine_start_and_connects_make_no_avoidable_syscalls` counted a
/// second program load). Plainly and under run the client prints the
/// same; under run every connection is on the engine.
#[test]
#[ignore = "needs root"]
fn a_process_whose_connections_all_ended_connects_on_the_engine_again() {
    let lab = lab("pz");
    let _ng = nginx(&lab, 8089, "pz");
    let args = ["python3", "-c", PAUSED_PY, B, "8089"];
    let plain = output(plain_in(&lab, Host::A, &args), "paused connections plainly");
    let mut c = run_in(&lab, Host::A, &[], &args);
    c.env("NANOWIRE_LOG", "info");
    let o = c.output().expect("paused connections under run");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "under run: {}\n{out}{err}", o.status);
    assert_eq!(out.trim(), plain.trim(), "under run:\n{err}");
    let placed: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(" tcp ") || l.contains(" tcp:"))
        .collect();
    assert_eq!(
        placed.iter().filter(|l| l.ends_with(": xdp")).count(),
        3,
        "every connection on the engine:\n{err}"
    );
    assert!(!err.contains("kernel socket"), "{err}");
}

/// A non-blocking connect, to a listening port and to a closed one, seen
/// through connect/poll/SO_ERROR/connect again: the same sequence plainly
/// and under run.
#[test]
#[ignore = "needs root"]
fn nonblocking_connect_errno_sequence_is_the_kernels() {
    let lab = lab("nb");
    let _ng = nginx(&lab, 8082, "nb");
    let script = format!(
        r#"
import errno, select, socket
def name(e): return errno.errorcode.get(e, str(e))
def one(port, tag):
    s = socket.socket(); s.setblocking(False)
    out = [tag, "connect=" + name(s.connect_ex(("{B}", port)))]
    p = select.poll(); p.register(s, select.POLLIN | select.POLLOUT)
    ev = p.poll(5000)
    out.append("poll=%d" % (ev[0][1] if ev else 0))
    out.append("so_error=" + name(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
    out.append("so_error2=" + name(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
    for i in range(2):
        r = s.connect_ex(("{B}", port))
        out.append("again=" + name(r))
        if r == errno.EINPROGRESS:
            ev = p.poll(5000)
            out.append("poll2=%d" % (ev[0][1] if ev else 0))
            out.append("so_error3=" + name(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
    s.close()
    print(" ".join(out))
one(8082, "open")
one(8099, "closed")
"#
    );
    let plain = output(
        plain_in(&lab, Host::A, &["python3", "-c", &script]),
        "plain",
    );
    let run = output(
        run_in(&lab, Host::A, &[], &["python3", "-c", &script]),
        "under run",
    );
    let lines = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("open ") || l.starts_with("closed "))
            .map(String::from)
            .collect()
    };
    assert_eq!(lines(&plain).len(), 2, "{plain}");
    assert_eq!(
        lines(&run),
        lines(&plain),
        "plain:\n{plain}\nunder run:\n{run}"
    );
}

/// Issue 20 finding 4: a client connecting as fast as it can while the
/// server starts: no connection that connect() reported established is
/// reset afterwards (the engine claims the port before the kernel listens),
/// with the server plain and under run.
#[test]
#[ignore = "needs root"]
fn no_reset_after_a_successful_connect_while_the_server_starts() {
    let lab = lab("ls");
    let client = format!(
        r#"
import errno, socket, sys, time
ok = resets = refused = 0
end = time.time() + 60
while time.time() < end and ok < 200:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("{B}", 8083))
    except ConnectionRefusedError:
        refused += 1; s.close(); continue
    except OSError as e:
        s.close(); continue
    try:
        s.sendall(b"ping\n")
        got = s.recv(16)
        if got == b"ping\n": ok += 1
        else: resets += 1
    except ConnectionResetError:
        resets += 1
    except OSError:
        resets += 1
    s.close()
print("ok=%d resets=%d refused=%d" % (ok, resets, refused))
"#
    );
    let server = format!(
        r#"
import socket, threading
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("{B}", 8083)); l.listen(128)
def serve(c):
    try:
        d = c.recv(16)
        if d: c.sendall(d)
    finally:
        c.close()
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#
    );
    for under_run in [false, true] {
        let mut cl = spawn(
            &format!("client-{under_run}"),
            plain_in(&lab, Host::A, &["python3", "-c", &client]),
        );
        // The client is refused for a while before the server starts.
        std::thread::sleep(Duration::from_millis(300));
        let argv = ["python3", "-c", &server];
        let _srv = spawn(
            &format!("server-{under_run}"),
            run_or_plain(&lab, Host::B, under_run, &argv),
        );
        let out = cl.success(Duration::from_secs(90));
        let ok = out
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ok="))
            .and_then(|v| v.parse::<u32>().ok());
        assert_eq!(ok, Some(200), "server under run: {under_run}: {out}");
        assert!(
            out.contains("resets=0 "),
            "server under run: {under_run}: {out}"
        );
    }
}

/// Packets from spoofed sources (raw socket in host a) to b:port: `n_off`
/// off-link ones (10.F.0.0 upward, F = `first`, default 1: addresses host
/// b reaches through host a) and every free on-link address of the lab's
/// /24. `syn`: one SYN each, as fast as it goes. `udp`: one datagram each,
/// in batches of 100, each batch's echoes to the off-link sources
/// awaited (an AF_PACKET socket in host a sees them: host a is their
/// gateway) before the next (a batch fits the plain socket's receive
/// buffer); prints `answered N of M off-link sources`.
/// Argv: syn|udp dst port n_off [first].
const SPOOF_PY: &str = r#"
import socket, struct, sys, time
mode, dst, port, n_off = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
first = int(sys.argv[5]) if len(sys.argv) > 5 else 1
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
d = socket.inet_aton(dst)
off = ["10.%d.%d.%d" % (first + i // 65536, (i // 256) % 256, i % 256) for i in range(n_off)]
srcs = off + ["198.18.0.%d" % i for i in range(3, 255)]
def packet(i, src):
    sa = socket.inet_aton(src)
    sport = 1024 + i % 60000
    if mode == "syn":
        l4 = struct.pack("!HHIIBBHHH", sport, port, 1000 + i, 0, 5 << 4, 0x02, 65535, 0, 0)
        proto, at = 6, 16
    else:
        l4 = struct.pack("!HHHH", sport, port, 8 + 4, 0) + b"echo"
        proto, at = 17, 6
    c = csum(sa + d + struct.pack("!BBH", 0, proto, len(l4)) + l4)
    l4 = l4[:at] + struct.pack("!H", c) + l4[at + 2:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), i & 0xffff, 0, 64, proto, 0, sa, d)
    return ip + l4
if mode == "syn":
    for i, src in enumerate(srcs):
        s.sendto(packet(i, src), (dst, 0))
    print("sent", len(srcs))
    sys.exit(0)
cap = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
cap.settimeout(0.2)
want, answered = set(off), set()
def await_echoes(n):
    last = time.time()
    while len(answered) < n and time.time() - last < 3:
        try:
            p = cap.recv(2048)
        except socket.timeout:
            continue
        if len(p) >= 28 and p[9] == 17 and p[12:16] == d and struct.unpack("!H", p[20:22])[0] == port:
            a = socket.inet_ntoa(p[16:20])
            if a in want and a not in answered:
                answered.add(a)
                last = time.time()
for i, src in enumerate(srcs):
    s.sendto(packet(i, src), (dst, 0))
    if (i + 1) % 50 == 0 or i + 1 == n_off:
        await_echoes(min(i + 1, n_off))
print("answered %d of %d off-link sources" % (len(answered), n_off), flush=True)
"#;

/// The counters of the engine on `iface` (`nanowire stats --json`).
fn engine_counters(iface: &str) -> serde_json::Value {
    let on = nanowire_testkit::engines_on(nanowire(), iface);
    on.first()
        .map(|e| e["counters"].clone())
        .unwrap_or_else(|| panic!("no engine on {iface} in the stats"))
}

/// Host b reaches [`SPOOF_PY`]'s off-link sources (10.0.0.0/8) through
/// host a.
fn route_spoofed_sources(lab: &ScopedLab) {
    output(
        plain_in(
            lab,
            Host::B,
            &["ip", "route", "add", "10.0.0.0/8", "via", "198.18.0.1"],
        ),
        "route to the off-link sources",
    );
}

/// The engine on `iface` keeps its neighbour state within its bounds
/// (`crates/stack/src/xdp/neigh.rs`): routes at most `MAX_ROUTES`,
/// neighbours (per next hop) at most `MAX_NEIGH`.
#[track_caller]
fn assert_neighbours_bounded(iface: &str, round: usize) {
    const MAX_ROUTES: u64 = 1024;
    const MAX_NEIGH: u64 = 1024;
    std::thread::sleep(Duration::from_millis(500));
    let c = engine_counters(iface);
    let routes = c["neigh_routes"].as_u64().expect("neigh_routes gauge");
    let neigh = c["neigh_entries"].as_u64().expect("neigh_entries gauge");
    eprintln!("round {round}: neigh_routes {routes} neigh_entries {neigh}");
    assert!(routes <= MAX_ROUTES, "routes {routes}: {c}");
    assert!(neigh <= MAX_NEIGH, "neighbours {neigh}: {c}");
}

/// Issue 20 finding 6: a SYN flood from thousands of spoofed sources, off
/// link and on link, answered by a listener under run: the engine's
/// neighbour state stays within its bounds ([`assert_neighbours_bounded`]),
/// and the listener still serves a real client.
#[test]
#[ignore = "needs root"]
fn syn_flood_from_spoofed_sources_leaves_the_neighbour_tables_bounded() {
    let lab = lab("sf");
    route_spoofed_sources(&lab);
    let server = format!(
        r#"
import socket
l = socket.socket(); l.bind(("{B}", 8084)); l.listen(64)
print("listening", flush=True)
while True:
    c, _ = l.accept()
    d = c.recv(16)
    if d: c.sendall(d)
    c.close()
"#
    );
    let mut srv = spawn(
        "flood-server",
        run_in(&lab, Host::B, &[], &["python3", "-c", &server]),
    );
    srv.wait_for("listening", Duration::from_secs(20));
    wait_port(&lab, 8084);
    let iface = lab.iface(Host::B);
    for round in 0..2 {
        output(
            plain_in(
                &lab,
                Host::A,
                &["python3", "-c", SPOOF_PY, "syn", B, "8084", "3000"],
            ),
            "SYN flood",
        );
        assert_neighbours_bounded(&iface, round);
    }
    // Still serving.
    let probe = format!(
        "import socket\ns=socket.create_connection(('{B}',8084),5)\ns.sendall(b'hi')\nassert s.recv(2)==b'hi'\nprint('served')\n"
    );
    let out = output(plain_in(&lab, Host::A, &["python3", "-c", &probe]), "probe");
    assert!(out.contains("served"), "{out}");
}

/// Issue 20 finding 6, UDP (a UDP echo answering 18.6k sources grew 3.9 MB,
/// never freed): one echo socket answers 18,600 spoofed off-link sources
/// and every free on-link address, twice (fresh sources each round),
/// plainly and under run. Every off-link source gets its echo in both
/// placements (the datagrams go in paced batches: no loss is excused),
/// under run the engine's neighbour state stays within its bounds after
/// each round, the server's resident memory after the second round is
/// what it was after the first plus a small constant, and it still
/// answers a real client.
#[test]
#[ignore = "needs root"]
fn udp_echo_to_spoofed_sources_keeps_neighbours_and_memory_bounded() {
    const SOURCES: &str = "18600";
    const SLACK_KIB: u64 = 512;
    let lab = lab("ue");
    route_spoofed_sources(&lab);
    let iface = lab.iface(Host::B);
    // The ask waits up to 30 s: plainly the echo server's sendto blocks
    // while its send buffer is held by the echoes the kernel queued for
    // the 252 unresolvable on-link sources, until their ARP fails (~3 s,
    // longer under load; session 26: "run=false round 2", the server had
    // read all but ~45 datagrams and the ask, and sent one fewer than it
    // read). Not a time limit on the server: the answer is what is tested.
    let ask = "import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.settimeout(30)\ns.sendto(b'rss',(sys.argv[1],int(sys.argv[2])))\nprint(s.recv(64).decode())\n";
    for (run, port) in with_ports(9100, [false, true]) {
        let argv = ["python3", "-c", UDP_ECHO_PY, B, &port];
        let mut srv = spawn(
            &format!("udp-echo-{port}"),
            run_or_plain(&lab, Host::B, run, &argv),
        );
        srv.wait_for("ready", Duration::from_secs(20));
        let mut rss = vec![];
        for round in 1..=2 {
            let first = round.to_string();
            let spoof = ["python3", "-c", SPOOF_PY, "udp", B, &port, SOURCES, &first];
            let out = output(plain_in(&lab, Host::A, &spoof), "spoofed datagrams");
            assert_eq!(
                line_of(&out, "answered"),
                format!("answered {SOURCES} of {SOURCES} off-link sources"),
                "run={run} round {round}"
            );
            if run {
                assert_neighbours_bounded(&iface, round);
            }
            let asked = plain_in(&lab, Host::A, &["python3", "-c", ask, B, &port])
                .output()
                .expect("the rss ask");
            let got = String::from_utf8_lossy(&asked.stdout).to_string();
            if !asked.status.success() {
                let snmp = output(plain_in(&lab, Host::B, &["cat", "/proc/net/snmp"]), "snmp");
                let stats = if run {
                    engine_counters(&iface).to_string()
                } else {
                    String::new()
                };
                panic!(
                    "run={run} round {round}: no answer to the rss ask ({}):\n{}\nserver: {}\nhost b: {snmp}\nengine: {stats}",
                    asked.status,
                    String::from_utf8_lossy(&asked.stderr),
                    srv.both()
                );
            }
            rss.push(got.trim().parse::<u64>().expect("VmRSS in KiB"));
        }
        eprintln!(
            "run={run}: VmRSS KiB after round 1 {}, round 2 {}",
            rss[0], rss[1]
        );
        assert!(
            rss[1] <= rss[0] + SLACK_KIB,
            "run={run}: the echo server grew {} -> {} KiB answering fresh sources:\n{}",
            rss[0],
            rss[1],
            srv.both()
        );
    }
}

/// One round of the memory test ([`rss_loop_py`]): an HTTP/1.0 request
/// on a connection of its own (the server closes first: no TIME-WAIT on
/// this side).
const HTTP_ONE_PY: &str = r#"
def one():
    s = socket.create_connection((dst, port), 5)
    s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
    while s.recv(65536):
        pass
    s.close()
"#;

/// Issue 20 finding 6 / issue 21 churn: the shim's per-connection records
/// are reused, not leaked. 20,000 connect/request/close rounds from a
/// Python client against a plain nginx, plainly and under run: the
/// process's resident memory after all of them is what it was after the
/// first 2,000 plus a small constant (leaked records, ~140 bytes each,
/// grew it by 2.4 MB over the last 18,000).
#[test]
#[ignore = "needs root"]
fn twenty_thousand_connections_under_run_keep_memory_bounded() {
    const SLACK_KIB: u64 = 512;
    let lab = lab("rss");
    let _ng = nginx(&lab, 8088, "rss");
    let py = rss_loop_py("connections", HTTP_ONE_PY);
    let args = ["python3", "-c", &py, B, "8088", "20000", "2000"];
    let plain = output(plain_in(&lab, Host::A, &args), "plain connections");
    let under = output(run_in(&lab, Host::A, &[], &args), "connections under run");
    assert_rss_bounded("connections", 20_000, (&plain, &under), SLACK_KIB);
}

/// A thread-per-connection server: the main thread accepts `n`
/// connections, a thread serves each (reads a line, answers 20,000 bytes,
/// closes 20 ms later: the main thread sleeps in its next accept by then,
/// and its sleep's 50 ms slice has not ended),
/// then it prints what it served and waits to be stopped.
const THREAD_SERVER_PY: &str = concat!(
    py_prelude!(),
    r#"
import threading, time
n = int(sys.argv[3])
ls = listener(16)
lines = []
def serve(c):
    b = recv_line(c, 4096)
    lines.append(b.decode().strip())
    c.sendall(b.strip() * (20000 // len(b.strip())))
    time.sleep(0.02)
    c.close()
ts = []
for i in range(n):
    c, _ = ls.accept()
    t = threading.Thread(target=serve, args=(c,)); t.start(); ts.append(t)
for t in ts:
    t.join()
print("served", len(lines), "first", lines[0], "last", lines[-1], flush=True)
time.sleep(600)
"#
);

/// `n` connections one after another: connect, a request line, read to
/// the end; prints how many bytes each answer had and their hash.
const SEQ_CLIENT_PY: &str = concat!(
    py_prelude!(),
    r#"
import hashlib
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
h = hashlib.sha256(); sizes = set()
for i in range(n):
    c = socket.create_connection((addr, port), 30)
    c.sendall(b"request-%04d\n" % i)
    got = b"".join(chunks(c))
    c.close()
    h.update(got); sizes.add(len(got))
print("connections", n, "sizes", sorted(sizes), "sha256", h.hexdigest(), flush=True)
"#
);

/// Session 27: a blocking accept sleeps without the engine's fds while a
/// connection an application holds is open (its user turns the engine and
/// signals the accept fd for a new connection). When a *worker thread*
/// closed the last such connection, nothing woke the accept to sleep on
/// the engine's fds again, and the next SYN waited for the timer service's
/// look (20 ms) or the end of the accept's 50 ms slice: 60 connections/s
/// against 1,100 (`scripts/forkconn_bench.py --shape thread`). The engine
/// counts the connections a waiting accept got that way
/// (`tcp_accept_late`): before the fix 19 of 20 (each after the first);
/// now none, unless the accept thread was not scheduled in time on a
/// loaded machine, so fewer than half is asserted. Plainly and under run
/// the server and client print the same.
#[test]
#[ignore = "needs root"]
fn a_thread_per_connection_server_wakes_its_accept_when_a_worker_closes() {
    const N: usize = 20;
    let lab = lab("tpc");
    let n = N.to_string();
    let mut outs = Vec::new();
    for (under_run, port) in with_ports(8091, [false, true]) {
        let srv = run_or_plain(
            &lab,
            Host::B,
            under_run,
            &["python3", "-c", THREAD_SERVER_PY, B, &port, &n],
        );
        let mut s = spawn(&format!("thread-server-{under_run}"), srv);
        s.wait_for("listening", Duration::from_secs(20));
        let cli = output(
            plain_in(
                &lab,
                Host::A,
                &["python3", "-c", SEQ_CLIENT_PY, B, &port, &n],
            ),
            "sequential client",
        );
        s.wait_for("served", Duration::from_secs(30));
        if under_run {
            // Published every 64th turn: the timer service's looks
            // publish the last ones.
            let iface = lab.iface(Host::B);
            let mut c = engine_counters(&iface);
            until(Duration::from_secs(10), || {
                c = engine_counters(&iface);
                c["tcp_passive_opens"].as_u64() == Some(N as u64)
            });
            let late = c["tcp_accept_late"].as_u64().expect("tcp_accept_late");
            let opens = c["tcp_passive_opens"].as_u64().expect("tcp_passive_opens");
            eprintln!("under run: tcp_accept_late {late} of {opens} connections");
            assert_eq!(opens, N as u64, "every connection on the engine: {c}");
            assert!(
                (late as usize) * 2 < N,
                "{late} of {N} connections waited for the timer service: {c}"
            );
        }
        let served = s.stdout();
        drop(s);
        outs.push(format!("{cli}{served}"));
    }
    assert_same_output("thread-per-connection server", &outs[0], &outs[1], "");
}

/// A program that starts a thread, then sends one UDP datagram.
const THREAD_THEN_SOCKET_PY: &str = r#"
import socket, sys, threading, time
t = threading.Thread(target=time.sleep, args=(0.5,)); t.start()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"x", (sys.argv[1], 9))
t.join()
print("sent", flush=True)
"#;

/// Session 27: the shim registers the process for the expedited
/// membarrier (its owned locks' revocation barrier) when it loads, while
/// the process has one thread: the kernel then only marks it. Registered
/// lazily, at the first owned lock, a program that had started threads by
/// then waited for an RCU grace period inside its first engine socket
/// (5-17 ms here: 12-17 ms of a first UDP socket's 13-18 ms on the engine
/// service). Traced (membarrier and the thread clones of a program that
/// starts a thread before its first socket, under run): the registration
/// comes before the program's first thread, and the datagram went out on
/// the engine.
#[test]
#[ignore = "needs root"]
fn the_membarrier_registration_comes_before_the_programs_threads() {
    let lab = lab("mbr");
    let (mut c, trace) = traced_run(
        &lab,
        "strace-membarrier",
        "trace=execve,membarrier,clone,clone3",
        &[
            "-o",
            "log=info",
            "--",
            "python3",
            "-c",
            THREAD_THEN_SOCKET_PY,
            B,
        ],
    );
    c.env("NANOWIRE_LOG", "info");
    let o = c.output().expect("traced program");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("udp") && err.contains(": xdp"),
        "on the engine: {err}"
    );
    let lines = lines_of(&trace);
    // From python's exec that succeeded (`nanowire run` execs it in
    // place; a launcher such as pyenv's may exec a script and others
    // before), in that process.
    let exec = lines
        .iter()
        .rposition(|l| l.contains("execve(") && l.contains("python3") && !l.contains("= -1"))
        .unwrap_or_else(|| panic!("no exec of python3:\n{}", lines.join("\n")));
    let pid = lines[exec].split_whitespace().next().unwrap_or_default();
    let after: Vec<&String> = lines[exec..]
        .iter()
        .filter(|l| l.split_whitespace().next() == Some(pid))
        .collect();
    let register = after
        .iter()
        .position(|l| l.contains("MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED"));
    let thread = after.iter().position(|l| l.contains("CLONE_THREAD"));
    let all = after
        .iter()
        .map(|l| l.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let (Some(r), Some(th)) = (register, thread) else {
        panic!("a registration and a thread after the exec:\n{all}");
    };
    assert!(
        r < th,
        "registered after the program's first thread:\n{all}"
    );
}
