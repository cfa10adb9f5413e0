//! Real programs over TCP, differentially (issue 21 item 5): each client and
//! server pair in all four placements — client/server plain/plain,
//! run/plain, plain/run, run/run — in the default lab as `nanowire lab up`
//! makes it (TSO/GSO on: a kernel peer hands the wire 64 KiB super-frames;
//! nothing here turns an offload off). Every body is hashed end to end.
//!
//! The programs: nginx (2 workers, sendfile on) with curl for a 100 MB file
//! and for small files, `python3 -m http.server` with curl, ab (-c 1 and
//! -c 20: zero failed requests), wrk (10 and 50 connections: zero socket
//! errors), redis-server with redis-cli (a 2 MB value) and redis-benchmark,
//! memcached with a Python client, iperf3 both directions and with -P 4,
//! and Python for 1,000 sequential and 200 concurrent connections.
//!
//! Each case in each placement is its own test (`<case>::<client>_<server>`,
//! e.g. `ab_c20::run_plain`), so a failure names the program pair and the
//! placement. All need root: `make test` runs them.

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host, ScopedLab};
use run_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The longest any one program may take (a hang fails the test, bounded).
const T: Duration = Duration::from_secs(90);

/// Where each end runs: under `nanowire run` (true) or plainly.
#[derive(Clone, Copy, Debug)]
struct P {
    cli: bool,
    srv: bool,
}

impl P {
    fn code(self) -> &'static str {
        match (self.cli, self.srv) {
            (false, false) => "pp",
            (true, false) => "rp",
            (false, true) => "pr",
            (true, true) => "rr",
        }
    }
}

/// One test's world: its lab, its placement, a scratch directory of its own.
struct Case {
    lab: ScopedLab,
    p: P,
    tag: String,
    dir: PathBuf,
}

impl Case {
    /// A case needing `programs` (installed by scripts/install-deps.sh).
    fn new(code: &str, p: P, programs: &[&str]) -> Case {
        nanowire_testkit::require(programs);
        let tag = format!("am{code}{}", p.code());
        let lab = nanowire_testkit::lab(&tag);
        let dir = scratch(&tag);
        std::fs::create_dir_all(&dir).unwrap();
        Case { lab, p, tag, dir }
    }

    /// `argv` in host `h`, under `nanowire run --engine xdp -o log=info`
    /// when `run`, else plainly.
    fn cmd(&self, h: Host, run: bool, argv: &[&str]) -> Command {
        if run {
            run_in(&self.lab, h, &["--engine", "xdp", "-o", "log=info"], argv)
        } else {
            plain_in(&self.lab, h, argv)
        }
    }

    /// The server (host b), started in its placement.
    fn server(&self, name: &str, argv: &[&str]) -> Kid {
        spawn(
            &format!("{}-{name}", self.tag),
            self.cmd(Host::B, self.p.srv, argv),
        )
    }

    /// A client (host a) in its placement, run to success; its stdout.
    fn client(&self, name: &str, argv: &[&str]) -> String {
        let mut k = self.client_kid(name, argv);
        k.success(T);
        self.check_client_engine(&k);
        k.stdout()
    }

    fn client_kid(&self, name: &str, argv: &[&str]) -> Kid {
        spawn(
            &format!("{}-{name}", self.tag),
            self.cmd(Host::A, self.p.cli, argv),
        )
    }

    /// A client under run put its connections on the engine (the shim says
    /// so at log level info), not silently on the kernel.
    fn check_client_engine(&self, k: &Kid) {
        let to_b = format!("-> {ADDR_B}:");
        let marks = [to_b.as_str(), ": xdp"];
        on_engine(self.p.cli, k, marks, "the client's connections are");
    }

    /// A server under run listens on the engine.
    fn check_server_engine(&self, k: &Kid, port: u16) {
        let on_port = format!(":{port}: xdp");
        let marks = [on_port.as_str(), "tcp listener"];
        on_engine(self.p.srv, k, marks, "the server's listener is");
    }

    /// Wait (bounded) until a plain kernel client in host a connects to
    /// `port` on host b; fails with the server's output if it exits first.
    fn wait_port(&self, srv: &mut Kid, port: u16) {
        let probe = format!(
            "import socket\ns=socket.create_connection(('{ADDR_B}',{port}),timeout=1)\ns.close()"
        );
        srv.wait_until(
            &format!("accepting on {port}"),
            Duration::from_secs(30),
            |_| {
                plain_in(&self.lab, Host::A, &["python3", "-c", &probe])
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        );
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }
}

/// When `under_run`, `k`'s log (the shim's, level info) has every one of
/// `marks`: `what` is on the engine, not silently on the kernel.
fn on_engine(under_run: bool, k: &Kid, marks: [&str; 2], what: &str) {
    if under_run {
        let err = k.stderr();
        assert!(
            marks.iter().all(|m| err.contains(m)),
            "{}: {what} not on the engine:\n{err}",
            k.name
        );
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The test pattern: `len` bytes of a xorshift stream seeded by `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    xorshift_bytes(len, seed | 1)
}

fn sha256(path: &Path) -> String {
    let o = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(o.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A document root for the HTTP servers of one case, with each file's
/// SHA-256: `s0.bin`..`s19.bin` (1 KB .. 153 KB) always, `big.bin`
/// (100 MB) and `mid.bin` (16 MB) when asked for (the bulk cases only).
struct Www {
    root: PathBuf,
    sums: Vec<(String, String)>,
}

const BIG: usize = 100_000_000;
const MID: usize = 16 << 20;
const SMALL: usize = 20;

impl Www {
    fn new(c: &Case, big: bool, mid: bool) -> Www {
        let root = c.dir.join("www");
        std::fs::create_dir_all(&root).unwrap();
        let mut files = Vec::new();
        if big {
            files.push(("big.bin".to_string(), BIG));
        }
        if mid {
            files.push(("mid.bin".to_string(), MID));
        }
        for i in 0..SMALL {
            files.push((format!("s{i}.bin"), 1000 + i * 8000));
        }
        let mut sums = Vec::new();
        for (i, (name, len)) in files.into_iter().enumerate() {
            let p = root.join(&name);
            std::fs::write(&p, pattern(len, 0x5eed + i as u64)).unwrap();
            sums.push((name, sha256(&p)));
        }
        Www { root, sums }
    }

    fn sum(&self, name: &str) -> &str {
        &self.sums.iter().find(|(n, _)| n == name).unwrap().1
    }
}

// ------------------------------------------------------------------ HTTP

const NGINX_PORT: u16 = 8080;

/// nginx as users run it: a master and 2 workers, sendfile on, keep-alive.
fn nginx(c: &Case, w: &Www) -> Kid {
    let conf = c.dir.join("nginx.conf");
    let d = c.dir.display();
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process on;\nworker_processes 2;\nuser root;\n\
             pid {d}/nginx.pid;\nerror_log stderr warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  keepalive_timeout 65;\n\
             client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n\
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             default_type application/octet-stream;\n\
             server {{ listen {ADDR_B}:{NGINX_PORT}; root {}; }}\n}}\n",
            w.root.display()
        ),
    )
    .unwrap();
    let conf = conf.to_string_lossy().into_owned();
    let prefix = c.dir.to_string_lossy().into_owned();
    let mut s = c.server(
        "nginx",
        &["nginx", "-p", &prefix, "-c", &conf, "-e", "stderr"],
    );
    c.wait_port(&mut s, NGINX_PORT);
    s
}

/// curl (one process, one connection kept alive) fetches `names` from
/// `port`; every body's SHA-256 must match the file's.
fn curl_hashed(c: &Case, w: &Www, port: u16, names: &[&str]) {
    let mut argv: Vec<String> = ["curl", "-sS", "--fail", "--max-time", "80"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for n in names {
        argv.push("-o".into());
        argv.push(c.path(&format!("got-{n}")));
        argv.push(format!("http://{ADDR_B}:{port}/{n}"));
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    c.client("curl", &argv);
    for n in names {
        let got = c.dir.join(format!("got-{n}"));
        assert_eq!(
            sha256(&got),
            w.sum(n),
            "{}: {n} differs after the transfer ({} of {} bytes)",
            c.tag,
            std::fs::metadata(&got).map(|m| m.len()).unwrap_or(0),
            std::fs::metadata(w.root.join(n)).unwrap().len()
        );
        let _ = std::fs::remove_file(got);
    }
}

/// A case with nginx in b serving its files (`big`: with big.bin) on
/// NGINX_PORT, `clients` checked installed. Dropped in field order: nginx
/// stopped, then the files, then the case's lab.
struct NginxSite {
    s: Kid,
    w: Www,
    c: Case,
}

impl NginxSite {
    fn new(code: &str, p: P, clients: &[&str], big: bool) -> NginxSite {
        let c = Case::new(code, p, &[&["nginx"], clients].concat());
        let w = Www::new(&c, big, false);
        let s = nginx(&c, &w);
        NginxSite { s, w, c }
    }

    fn check_engine(&self) {
        self.c.check_server_engine(&self.s, NGINX_PORT);
    }
}

fn small_names() -> Vec<String> {
    (0..SMALL).map(|i| format!("s{i}.bin")).collect()
}

fn nginx_curl_100mb(p: P) {
    let n = NginxSite::new("nb", p, &["curl", "sha256sum"], true);
    curl_hashed(&n.c, &n.w, NGINX_PORT, &["big.bin"]);
    n.check_engine();
}

fn nginx_curl_small_files(p: P) {
    let n = NginxSite::new("ns", p, &["curl", "sha256sum"], false);
    let (c, w) = (&n.c, &n.w);
    let names = small_names();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // One connection kept alive for all, then one connection per file.
    curl_hashed(c, w, NGINX_PORT, &names);
    for f in &names[..5] {
        curl_hashed(c, w, NGINX_PORT, &[f]);
    }
    n.check_engine();
}

fn python_http_server_curl(p: P) {
    let c = Case::new("py", p, &["python3", "curl", "sha256sum"]);
    let w = Www::new(&c, false, true);
    let root = w.root.to_string_lossy().into_owned();
    let addr = ADDR_B.to_string();
    let line = format!("python3 -m http.server 8081 --bind {addr} --directory {root}");
    let mut s = c.server("http.server", &words(&line));
    c.wait_port(&mut s, 8081);
    curl_hashed(&c, &w, 8081, &["mid.bin", "s3.bin", "s19.bin"]);
    c.check_server_engine(&s, 8081);
}

/// The value after `key` on ab's or wrk's report line, e.g. "Failed requests:".
fn field(out: &str, key: &str) -> Option<u64> {
    let line = out.lines().find(|l| l.trim_start().starts_with(key))?;
    line.trim_start()[key.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn ab(p: P, code: &str, conc: u32) {
    let n = NginxSite::new(code, p, &["ab"], false);
    let (c, w) = (&n.c, &n.w);
    let url = format!("http://{ADDR_B}:{NGINX_PORT}/s2.bin");
    let conc = conc.to_string();
    let out = c.client("ab", &["ab", "-n", "500", "-c", &conc, "-s", "30", &url]);
    assert_eq!(field(&out, "Complete requests:"), Some(500), "{out}");
    assert_eq!(field(&out, "Failed requests:"), Some(0), "{out}");
    assert!(!out.contains("Non-2xx responses"), "{out}");
    // Every body whole: 500 × the file's length.
    let len = std::fs::metadata(w.root.join("s2.bin")).unwrap().len();
    assert_eq!(field(&out, "Document Length:"), Some(len), "{out}");
    n.check_engine();
}

fn wrk(p: P, code: &str, conns: u32) {
    let n = NginxSite::new(code, p, &["wrk"], false);
    let c = &n.c;
    let url = format!("http://{ADDR_B}:{NGINX_PORT}/s1.bin");
    let conns = conns.to_string();
    let line = format!("wrk -t 2 -c {conns} -d 2s --timeout 5s {url}");
    let out = c.client("wrk", &words(&line));
    assert!(
        !out.contains("Socket errors"),
        "wrk with {conns} connections: socket errors\n{out}"
    );
    assert!(!out.contains("Non-2xx"), "{out}");
    let reqs = out
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(reqs > 0, "no requests completed:\n{out}");
    n.check_engine();
}

// ------------------------------------------------------- redis, memcached

const REDIS_PORT: u16 = 6379;

fn redis(c: &Case) -> Kid {
    let addr = ADDR_B.to_string();
    let port = REDIS_PORT.to_string();
    let dir = c.dir.to_string_lossy().into_owned();
    let mut s = c.server(
        "redis-server",
        &[
            "redis-server",
            "--bind",
            &addr,
            "--port",
            &port,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            &dir,
        ],
    );
    c.wait_port(&mut s, REDIS_PORT);
    s
}

/// redis-cli SET then GET of a 2 MB value (hex text), hashed.
fn redis_cli_2mb_value(p: P) {
    let c = Case::new("rs", p, &["redis-server", "redis-cli", "sha256sum"]);
    let s = redis(&c);
    let value: String = pattern(1 << 20, 0xfeed)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let vfile = c.path("value");
    std::fs::write(&vfile, &value).unwrap();
    let addr = ADDR_B.to_string();
    let set = format!("redis-cli -h {addr} -p {REDIS_PORT} -x SET big < {vfile}");
    let out = c.client("redis-set", &["sh", "-c", &set]);
    assert!(out.trim().starts_with("OK"), "SET: {out}");
    let got = c.path("got");
    let get = format!("redis-cli -h {addr} -p {REDIS_PORT} --raw GET big > {got}");
    c.client("redis-get", &["sh", "-c", &get]);
    let mut want = value.into_bytes();
    want.push(b'\n'); // --raw ends the reply with a newline
    let body = std::fs::read(&got).unwrap();
    assert_eq!(
        sha256(Path::new(&got)),
        {
            std::fs::write(c.path("want"), &want).unwrap();
            sha256(Path::new(&c.path("want")))
        },
        "GET returned {} bytes, SET stored {}",
        body.len(),
        want.len()
    );
    c.check_server_engine(&s, REDIS_PORT);
}

fn redis_benchmark(p: P) {
    let c = Case::new("rb", p, &["redis-server", "redis-benchmark"]);
    let s = redis(&c);
    let addr = ADDR_B.to_string();
    let port = REDIS_PORT.to_string();
    let t = "set,get,incr,lpush,lrange_100";
    let line = format!("redis-benchmark -h {addr} -p {port} -q -n 2000 -c 10 -d 512 -t {t}");
    let out = c.client("redis-benchmark", &words(&line));
    for t in ["SET", "GET", "INCR", "LPUSH", "LRANGE_100"] {
        assert!(
            out.lines()
                .any(|l| l.contains(t) && l.contains("requests per second")),
            "redis-benchmark did not finish {t}:\n{out}"
        );
    }
    assert!(!out.to_lowercase().contains("error"), "{out}");
    c.check_server_engine(&s, REDIS_PORT);
}

/// A memcached client in Python (the text protocol on one connection):
/// 200 keys of 1 B .. 600 KB set, read back one by one and in multi-gets,
/// every value checked.
const MEMCACHED_PY: &str = r#"
import hashlib, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=20)
f = s.makefile("rb")
def val(i):
    n = 1 + (i * 7919) % 600000
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (n // 32 + 1))[:n]
def reply_line():
    l = f.readline()
    if not l:
        sys.exit("connection closed")
    return l
for i in range(200):
    v = val(i)
    s.sendall(b"set k%d 0 0 %d\r\n" % (i, len(v)) + v + b"\r\n")
    r = reply_line()
    assert r == b"STORED\r\n", (i, r)
def get(keys):
    s.sendall(b"get " + b" ".join(b"k%d" % k for k in keys) + b"\r\n")
    got = {}
    while True:
        l = reply_line()
        if l == b"END\r\n":
            return got
        _, k, _, n = l.split()
        data = f.read(int(n) + 2)
        assert data.endswith(b"\r\n"), k
        got[int(k[1:])] = data[:-2]
for i in range(200):
    assert get([i]) == {i: val(i)}, i
for lo in range(0, 200, 20):
    keys = list(range(lo, lo + 20))
    assert get(keys) == {k: val(k) for k in keys}, lo
s.sendall(b"quit\r\n")
print("ok", 200)
"#;

fn memcached_python(p: P) {
    let c = Case::new("mc", p, &["memcached", "python3"]);
    let addr = ADDR_B.to_string();
    let line = format!("memcached -u root -l {addr} -p 11211 -U 0 -m 256");
    let mut s = c.server("memcached", &words(&line));
    c.wait_port(&mut s, 11211);
    let out = c.client(
        "memcached-py",
        &["python3", "-c", MEMCACHED_PY, &addr, "11211"],
    );
    assert!(out.contains("ok 200"), "{out}");
    c.check_server_engine(&s, 11211);
}

// ----------------------------------------------------------------- iperf3

fn iperf3(p: P, code: &str, extra: &[&str]) {
    let c = Case::new(code, p, &["iperf3"]);
    let addr = ADDR_B.to_string();
    let mut s = c.server(
        "iperf3-s",
        &["iperf3", "-s", "--forceflush", "-B", &addr, "-p", "5201"],
    );
    s.wait_for("Server listening", Duration::from_secs(30));
    let mut argv = vec!["iperf3", "-c", &addr, "-p", "5201", "-t", "2", "-J"];
    argv.extend_from_slice(extra);
    let out = c.client("iperf3-c", &argv);
    let j: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap_or(0)..])
        .unwrap_or_else(|e| {
            panic!("iperf3 printed no JSON ({e}):\n{out}");
        });
    assert!(j.get("error").is_none(), "iperf3 failed: {}", j["error"]);
    let rx = j["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    let tx = j["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0);
    assert!(
        rx > 0 && tx > 0,
        "iperf3 moved nothing: sent {tx}, received {rx}\n{out}"
    );
    c.check_server_engine(&s, 5201);
}

// ------------------------------------------------------- many connections

/// An echo server: a thread per connection (blocking sockets), so that it
/// keeps hundreds of connections at once; every connection echoes until EOF.
const ECHO_SERVER_PY: &str = r#"
import socket, sys, threading
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2])))
l.listen(512)
def serve(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                return
            c.sendall(d)
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Put before SEQUENTIAL_PY and CONCURRENT_PY: `recv_exactly(s, n, i)`,
/// the `n` bytes connection `i` reads next (EOF before: the program
/// fails saying so).
const RECV_EXACTLY_PY: &str = r#"
import socket, sys
def recv_exactly(s, n, i):
    got = b""
    while len(got) < n:
        d = s.recv(65536)
        if not d:
            sys.exit("conn %d: EOF after %d of %d bytes" % (i, len(got), n))
        got += d
    return got
"#;

/// 1,000 connections one after another: connect, send a distinct message,
/// read its echo, close.
const SEQUENTIAL_PY: &str = r#"
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    msg = (b"conn %d " % i) * (1 + i % 50)
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(msg)
    assert recv_exactly(s, len(msg), i) == msg, i
    s.close()
print("ok", n)
"#;

/// 200 connections open at once: connect them all, then send on each, then
/// read every echo, then close them all.
const CONCURRENT_PY: &str = r#"
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = [socket.create_connection((host, port), timeout=20) for _ in range(n)]
msgs = [(b"c%d." % i) * (10 + i) for i in range(n)]
for s, m in zip(socks, msgs):
    s.sendall(m)
for i, (s, m) in enumerate(zip(socks, msgs)):
    assert recv_exactly(s, len(m), i) == m, i
for s in socks:
    s.close()
print("ok", n)
"#;

fn connections(p: P, code: &str, script: &str, n: u32) {
    let c = Case::new(code, p, &["python3"]);
    let addr = ADDR_B.to_string();
    let mut s = c.server("echo", &["python3", "-c", ECHO_SERVER_PY, &addr, "7000"]);
    c.wait_port(&mut s, 7000);
    let (n, script) = (n.to_string(), format!("{RECV_EXACTLY_PY}{script}"));
    let out = c.client("conns", &["python3", "-c", &script, &addr, "7000", &n]);
    assert!(out.contains(&format!("ok {n}")), "{out}");
    c.check_server_engine(&s, 7000);
}

// --------------------------------------------------------------- the matrix

/// One test of a case in one placement: `plain_plain`, `run_plain` (client
/// under run), `plain_run` (server under run) or `run_run`.
macro_rules! placement {
    (plain_plain, $body:expr) => {
        placement!(@test plain_plain, false, false, $body);
    };
    (run_plain, $body:expr) => {
        placement!(@test run_plain, true, false, $body);
    };
    (plain_run, $body:expr) => {
        placement!(@test plain_run, false, true, $body);
    };
    (run_run, $body:expr) => {
        placement!(@test run_run, true, true, $body);
    };
    (@test $p:ident, $cli:expr, $srv:expr, $body:expr) => {
        #[test]
        #[ignore = "needs root"]
        fn $p() {
            ($body)(P {
                cli: $cli,
                srv: $srv,
            })
        }
    };
}

/// The tests of one case (`<case>::<placement>`): all four placements.
macro_rules! matrix {
    ($name:ident, $body:expr) => {
        matrix!($name, $body; plain_plain, run_plain, plain_run, run_run);
    };
    ($name:ident, $body:expr; $($p:ident),+) => {
        mod $name {
            use super::*;
            $(placement!($p, $body);)+
        }
    };
}

matrix!(nginx_curl_100mb, nginx_curl_100mb);
matrix!(nginx_curl_small_files, nginx_curl_small_files);
matrix!(python_http_server_curl, python_http_server_curl);
matrix!(ab_c1, |p| ab(p, "a1", 1));
matrix!(ab_c20, |p| ab(p, "a2", 20));
matrix!(wrk_c10, |p| wrk(p, "w1", 10));
matrix!(wrk_c50, |p| wrk(p, "w5", 50));
matrix!(redis_cli_2mb_value, redis_cli_2mb_value);
matrix!(redis_benchmark, redis_benchmark);
matrix!(memcached_python, memcached_python);
matrix!(iperf3_upload, |p| iperf3(p, "iu", &[]));
matrix!(iperf3_download, |p| iperf3(p, "id", &["-R"]));
matrix!(iperf3_four_streams, |p| iperf3(p, "i4", &["-P", "4"]));
matrix!(connections_1000_sequential, |p| connections(
    p,
    "cs",
    SEQUENTIAL_PY,
    1000
));
matrix!(connections_200_concurrent, |p| connections(
    p,
    "cc",
    CONCURRENT_PY,
    200
));
