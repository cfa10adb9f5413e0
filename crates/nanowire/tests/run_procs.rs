//! Connections that cross processes (issue 24): the shapes Unix servers
//! use, plainly and under `nanowire run` on an engine of the process's own
//! and on the engine service (`NANOWIRE_SERVICE=1`), with a plain client
//! in the other host checking every body by hash:
//!
//! * a fork-per-connection server (the parent accepts and forks, the child
//!   serves the connection and exits, the parent closes its copy);
//! * a parent and a child writing one connection in turns (a pipe passes
//!   the turn), the client checking the interleaving byte for byte;
//! * a bound UDP socket kept on the parent's engine across a fork until a
//!   child uses it;
//! * a connected socket inherited across exec: fork + exec, posix_spawn
//!   (Python's subprocess), fork + exec of a program without the shim, and
//!   the server exec'ing itself into the handler (inetd style), each with
//!   unread request bytes waiting when the new program starts.
//!
//! The outputs (the client's and the server's) must be the same in the
//! three placements. Under run the shim says what it did with each shared
//! connection (kept on the engine, or moved to the kernel); the test
//! prints those lines.

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host, ScopedLab};
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// The server (`srv` with `args`) in host b of a lab tagged `tag` in each
/// placement, port `port + i`, and the plain client `cli` in host a, both
/// Python after [`READLINE`]: the client's outputs and the server's
/// stdout must be the same in every placement. Returns the run
/// placements' server stderr.
fn three_ways(tag: &str, name: &str, (srv, cli): (&str, &str), port: u16, args: &[&str]) -> String {
    let srv = &format!("{READLINE}{srv}");
    let server = |addr: &str, port: &str| {
        let mut argv = vec!["python3", "-c", srv, addr, port];
        argv.extend_from_slice(args);
        argv.into_iter().map(String::from).collect()
    };
    let logs = placed(tag, name, &server, cli, port, &mut |p, _, s, port| {
        if !matches!(p, Placement::Plain) {
            on_engine(s, &format!("tcp listener {ADDR_B}:{port}"));
        }
    });
    // What the shim did with the shared connections (for the reader).
    for line in logs
        .lines()
        .filter(|x| x.starts_with("---") || x.contains("fork") || x.contains("exec"))
    {
        eprintln!("{name}: {line}");
    }
    logs
}

/// The server `server(addr, port)` (its argv) in host b of a lab tagged
/// `tag` in each placement, port `port + i`, and the plain client `cli`
/// (Python after [`READLINE`]) in host a: the client's outputs and the
/// server's stdout must be the same in every placement. `between` runs
/// after the client's success, before the server is waited for. Returns
/// the run placements' server stderr.
fn placed(
    tag: &str,
    name: &str,
    server: &dyn Fn(&str, &str) -> Vec<String>,
    cli: &str,
    port: u16,
    between: &mut dyn FnMut(Placement, &ScopedLab, &Kid, &str),
) -> String {
    nanowire_testkit::require(&["python3"]);
    let l = &lab(tag);
    let cli = &format!("{READLINE}{cli}");
    let addr = ADDR_B.to_string();
    let mut want: Option<String> = None;
    let mut want_srv: Option<String> = None;
    let mut logs = String::new();
    for (i, p) in Placement::ALL.into_iter().enumerate() {
        let port = (port + i as u16).to_string();
        let argv = server(&addr, &port);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut s = spawn(&format!("{name}-{p:?}"), p.command(l, Host::B, &argv));
        s.wait_for("listening", T);
        let mut c = spawn(
            &format!("{name}-{p:?}-cli"),
            plain_in(l, Host::A, &["python3", "-c", cli, &addr, &port]),
        );
        let st = c.wait(T);
        assert!(
            st.success(),
            "{name} {p:?}: the client failed ({st}):\n{}\nserver:\n{}",
            c.both(),
            s.both()
        );
        between(p, l, &s, &port);
        s.success(T);
        let (out, srv_out) = (c.stdout(), s.stdout());
        let err = s.stderr();
        assert!(!err.contains("panicked"), "{p:?}:\n{err}");
        let ctx = format!("server ({p:?}):\n{}", s.both());
        same_as_first(&mut want, &format!("{name}: client"), out, &ctx);
        same_as_first(&mut want_srv, &format!("{name}: server"), srv_out, &ctx);
        if !matches!(p, Placement::Plain) {
            logs.push_str(&format!("--- {p:?}\n{err}"));
        }
    }
    let w = want.unwrap();
    assert!(w.contains("all ok"), "{w}");
    logs
}

/// The argv of Python program `src` serving `addr` `port` (for [`placed`]).
fn python_server(src: &str) -> impl Fn(&str, &str) -> Vec<String> + '_ {
    move |addr, port| {
        ["python3", "-c", src, addr, port]
            .into_iter()
            .map(String::from)
            .collect()
    }
}

/// The shared prelude (`listener`, `chunks`), then: reads a line byte by
/// byte (nothing after the newline is taken), and a body sent as its
/// length on a line, then the bytes.
const READLINE: &str = concat!(
    py_prelude!(),
    r#"
def readline(c):
    return recv_line(c, 1)
def read_sized(c):
    n = int(readline(c))
    b = b""
    while len(b) < n:
        d = c.recv(min(1 << 16, n - len(b)))
        if not d:
            break
        b += d
    return b
"#
);

/// Fork per connection: the parent accepts, forks and closes its copy;
/// the child reads the request (spanning several segments), answers a
/// body of up to ~700 kB and exits. The parent reaps its children by pid.
const FORK_PER_CONN: &str = r#"
import hashlib, os, socket, sys
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ls = listener(64)
kids = set()
statuses = []
def reap(block):
    for p in list(kids):
        q, st = os.waitpid(p, 0 if block else os.WNOHANG)
        if q == p:
            kids.discard(p)
            statuses.append(os.waitstatus_to_exitcode(st))
for i in range(n):
    c, _ = ls.accept()
    pid = os.fork()
    if pid == 0:
        ls.close()
        req = recv_line(c)
        k = int(req.split()[1])
        c.sendall(hashlib.sha256(req).digest() * (64 + k * 997))
        c.close()
        os._exit(0)
    c.close()
    kids.add(pid)
    reap(False)
reap(True)
print("served", n, "children exited", sorted(set(statuses)), len(statuses), flush=True)
"#;

const FORK_PER_CONN_CLIENT: &str = r#"
import hashlib, socket, sys, threading
addr, port = sys.argv[1], int(sys.argv[2])
def one(k):
    c = socket.create_connection((addr, port), timeout=60)
    req = (b"get %d " % k) + bytes((k * 13 + j) % 251 for j in range(k * 3001)) + b"\n"
    c.sendall(req)
    b = b"".join(chunks(c))
    c.close()
    ok = b == hashlib.sha256(req).digest() * (64 + k * 997)
    return "%d %d %s %s" % (k, len(b), hashlib.sha256(b).hexdigest()[:16], "ok" if ok else "BAD")
lines = [one(k) for k in range(12)]
res = {}
def t(k):
    res[k] = one(k)
ts = [threading.Thread(target=t, args=(k,)) for k in range(12, 20)]
for x in ts: x.start()
for x in ts: x.join()
lines += [res[k] for k in range(12, 20)]
print("\n".join(lines))
print("all ok" if all(l.endswith(" ok") for l in lines) else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_fork_per_connection_server_serves_as_plainly() {
    let progs = (FORK_PER_CONN, FORK_PER_CONN_CLIENT);
    let logs = three_ways("pfpc", "fork-per-conn", progs, 14600, &["20"]);
    // On the engine service the parent's close keeps each connection on
    // its engine until the child's first use moves it to the child's own
    // engine (issue 24 item 1); a child the service has no slot for (16
    // processes at most, a dead one's slot rests a while) gets the
    // kernel's. On an engine of its own the kernel's, as before.
    let moved = |p: &str| placement_log(&logs, p).matches(MOVED_IN).count();
    assert_eq!(moved("Own"), 0, "{logs}");
    assert!(moved("Service") >= 8, "{logs}");
}

/// A fork-per-connection server that ignores SIGCHLD (its children are
/// reaped by the kernel, a common shape) from the start: under run on the
/// engine service the shim starts the service for it, whose starter the
/// kernel reaps too (before session 25 that wait failed with ECHILD and
/// the sockets stayed on the kernel: `cannot start the engine service: No
/// child processes`). The listener must be on the engine (`three_ways`
/// checks it) and the answers as plainly.
const SIGIGN: &str = r#"
import os, signal, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
ls = listener()
for k in range(3):
    c, _ = ls.accept()
    if os.fork() == 0:
        ls.close()
        c.sendall(b"child got " + readline(c))
        c.close()
        os._exit(0)
    c.close()
print("served 3", flush=True)
"#;

const SIGIGN_CLIENT: &str = r#"
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
ok = True
for k in range(3):
    c = socket.create_connection((addr, port), timeout=30)
    c.sendall(b"hello %d\n" % k)
    b = b"".join(chunks(c))
    print(b.decode().strip())
    ok &= b == b"child got hello %d\n" % k
print("all ok" if ok else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_server_ignoring_sigchld_gets_the_engine_service() {
    let logs = three_ways("psig", "sigign", (SIGIGN, SIGIGN_CLIENT), 14760, &[]);
    let svc = placement_log(&logs, "Service");
    assert!(!svc.contains("cannot start the engine service"), "{svc}");
}

/// What a forked child says when a connection its parent shared moved to
/// its own engine.
const MOVED_IN: &str = "moved to this process's xdp engine (engine service)";

/// A holder's log line when it takes a connection its owner left to it
/// (handed over to the kernel at the owner's exit) onto its engine.
const FROM_KERNEL: &str = "taken onto this process's xdp engine from the kernel";

/// The server stderr of placement `p` ("Own", "Service") in what
/// [`three_ways`] returned.
fn placement_log<'a>(logs: &'a str, p: &str) -> &'a str {
    let head = format!("--- {p}\n");
    let Some(i) = logs.find(&head) else {
        panic!("no {p} placement in:\n{logs}")
    };
    let rest = &logs[i + head.len()..];
    &rest[..rest.find("\n--- ").unwrap_or(rest.len())]
}

/// A parent and its child write one connection in turns, a pipe passing
/// the turn: turn i (parent: even, child: odd) reads the query line "q i"
/// (the client sent all of them at once: the others wait unread in the
/// socket) and writes chunk i at once, then passes the turn; the next
/// writer's bytes must follow on the wire, whatever the first one still
/// had queued. The parent writes "end" after the child exited.
const TURNS: &str = r#"
import os, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
R = 16
ls = listener()
c, _ = ls.accept()
p2c_r, p2c_w = os.pipe()
c2p_r, c2p_w = os.pipe()
pid = os.fork()
mine = 1 if pid == 0 else 0
tok_r, tok_w = (p2c_r, c2p_w) if pid == 0 else (c2p_r, p2c_w)
def chunk(i):
    n = 1 + (i * 7919 * 37) % 400000
    tag = b"[%s %d]" % (b"child" if i % 2 else b"parent", i)
    return (tag * (n // len(tag) + 1))[:n]
bad = 0
for i in range(R):
    if i % 2 != mine:
        continue
    if i > 0:
        os.read(tok_r, 1)
    q = readline(c)
    if q != b"q %d\n" % i:
        bad += 1
    c.sendall(chunk(i))
    os.write(tok_w, b"t")
if pid == 0:
    c.close()
    os._exit(bad)
_, st = os.waitpid(pid, 0)
c.sendall(b"end\n")
c.close()
print("parent bad", bad, "child", os.waitstatus_to_exitcode(st), flush=True)
"#;

const TURNS_CLIENT: &str = r#"
import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
R = 16
def chunk(i):
    n = 1 + (i * 7919 * 37) % 400000
    tag = b"[%s %d]" % (b"child" if i % 2 else b"parent", i)
    return (tag * (n // len(tag) + 1))[:n]
c = socket.create_connection((addr, port), timeout=60)
c.sendall(b"".join(b"q %d\n" % i for i in range(R)))
want = b"".join(chunk(i) for i in range(R)) + b"end\n"
b = b"".join(chunks(c))
off, ok = 0, True
for i in range(R):
    x = chunk(i)
    good = b[off:off + len(x)] == x
    ok &= good
    print("turn", i, len(x), "ok" if good else "BAD at %d" % off)
    off += len(x)
print("total", len(b), hashlib.sha256(b).hexdigest()[:16], "end" if b[off:] == b"end\n" else "NO END")
print("all ok" if ok and b == want else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_parent_and_its_child_write_one_connection_in_turns() {
    let logs = three_ways("ptrn", "turns", (TURNS, TURNS_CLIENT), 14610, &[]);
    // On the engine service each turn after the first moves the connection
    // to the writer's engine (the child's turns, then the parent's: it asks
    // its former copy back), 15 moves in 16 turns; it stays on the engine
    // throughout. The child closes and exits last (its exit hands the
    // connection it owns to the kernel in the shared socket and leaves it
    // to the parent, whose "end" takes it from the kernel onto its engine).
    let svc = placement_log(&logs, "Service");
    assert_eq!(svc.matches(MOVED_IN).count(), 15, "{svc}");
    assert_eq!(svc.matches(FROM_KERNEL).count(), 1, "{svc}");
    assert_eq!(
        svc.matches("the kernel's connection now").count(),
        0,
        "{svc}"
    );
    assert_eq!(placement_log(&logs, "Own").matches(MOVED_IN).count(), 0);
}

/// A parent and its child both waiting in `recv` on one connection at
/// once: the client sends 120 records of 100 bytes one at a time, each
/// answered by whoever read it (a one-byte ack on the same connection),
/// then shuts down its side; both readers see the EOF, and each says so
/// with an "e" (after every ack: a reader's early EOF would show). Every
/// record is read once, whole, by one of them (which one is the
/// scheduler's business: only the totals are printed).
const BOTH_READ: &str = r#"
import os, socket, sys
ls = listener()
c, _ = ls.accept()
r, w = os.pipe()
pid = os.fork()
got = bad = 0
while True:
    d = c.recv(100, socket.MSG_WAITALL)
    if len(d) < 100:
        bad += len(d) != 0
        break
    bad += d != d[:1] * 100
    got += 1
    c.sendall(b"a")
# Each reader says it saw the EOF: an early one shows as an "e" among
# the client's acks.
c.sendall(b"e")
if pid == 0:
    os.write(w, b"%d %d" % (got, bad))
    os._exit(0)
os.waitpid(pid, 0)
cg, cb = map(int, os.read(r, 100).split())
print("records", got + cg, "bad", bad + cb, flush=True)
c.close()
"#;

const BOTH_READ_CLIENT: &str = r#"
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
acks = 0
for i in range(120):
    c.sendall(bytes([i % 251]) * 100)
    acks += c.recv(1) == b"a"
c.shutdown(socket.SHUT_WR)
rest = b"".join(chunks(c))
print("acks", acks, "then", rest, "to EOF")
print("all ok" if acks == 120 and rest == b"ee" else "SOME BAD", flush=True)
"#;

/// Both processes reading one connection at once (issue 24's bad input):
/// each record once, no hang, as plainly. On the engine service each
/// reader's wait asks for the connection: it passes between them until
/// `forkshare::MAX_MOVES`, then the kernel serves both.
#[test]
#[ignore = "needs root"]
fn a_parent_and_its_child_reading_one_connection_at_once_get_each_record_once() {
    let logs = three_ways(
        "pbrd",
        "bothread",
        (BOTH_READ, BOTH_READ_CLIENT),
        14960,
        &[],
    );
    let svc = placement_log(&logs, "Service");
    let moves = svc.matches(MOVED_IN).count();
    assert!((1..=64).contains(&moves), "{moves} moves:\n{svc}");
    assert_eq!(placement_log(&logs, "Own").matches(MOVED_IN).count(), 0);
}

/// A connected socket inherited across exec. Per connection k the server
/// reads the first line, answers, then hands the connection to a new
/// program (CHILD, fd number as its argument) while the client's second
/// line waits unread: k=0 fork + exec, k=1 posix_spawn (subprocess with
/// pass_fds), k=2 fork + exec without the shim (LD_PRELOAD removed), k=3
/// the server execs itself into the handler. The new program reads the
/// second line, answers a body, reads "bye" and answers.
const EXEC_SRV: &str = r#"
import os, socket, subprocess, sys
addr, port, child = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ls = listener()
for k in range(4):
    c, _ = ls.accept()
    line = readline(c)
    c.sendall(b"parent got " + line)
    fd = c.fileno()
    os.set_inheritable(fd, True)
    env = dict(os.environ)
    if k == 2:
        env.pop("LD_PRELOAD", None)
    argv = [sys.executable, "-c", child, str(fd), str(k)]
    if k == 1:
        p = subprocess.Popen(argv, pass_fds=[fd], env=env)
        c.close()
        print(k, "spawned child exited", p.wait(), flush=True)
    elif k in (0, 2):
        pid = os.fork()
        if pid == 0:
            os.execve(sys.executable, argv, env)
        c.close()
        print(k, "child exited", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    else:
        ls.close()
        print(k, "exec", flush=True)
        os.execve(sys.executable, argv, env)
"#;

const EXEC_CHILD: &str = r#"
import hashlib, socket, sys
fd, k = int(sys.argv[1]), int(sys.argv[2])
c = socket.socket(fileno=fd)
line = readline(c)
body = hashlib.sha256(line).digest() * (5000 + 7000 * k)
c.sendall(b"%d\n" % len(body) + body)
bye = readline(c)
c.sendall(b"child %d got " % k + bye)
c.close()
if k == 3:
    print(k, "exec'd server done", flush=True)
"#;

const EXEC_CLIENT: &str = r#"
import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
ok = True
for k in range(4):
    c = socket.create_connection((addr, port), timeout=60)
    second = (b"second %d " % k) * (2000 * (k + 1)) + b"\n"
    c.sendall(b"hello %d\n" % k + second)
    a = readline(c)
    b = read_sized(c)
    n = len(b)
    c.sendall(b"bye %d\n" % k)
    rest = b"".join(chunks(c, 4096))
    good = b == hashlib.sha256(second).digest() * (5000 + 7000 * k) and rest == b"child %d got bye %d\n" % (k, k)
    ok &= good
    print(k, a.decode().strip(), n, hashlib.sha256(b).hexdigest()[:16], rest.decode().strip(), "ok" if good else "BAD")
print("all ok" if ok else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_connection_inherited_across_exec_serves_as_plainly() {
    let child = format!("{READLINE}{EXEC_CHILD}");
    let logs = three_ways("pexe", "exec", (EXEC_SRV, EXEC_CLIENT), 14620, &[&child]);
    // Taken back onto the engine only where the exec'ing image alone held
    // the connection: on the service the fork + exec child's (k=0) when
    // the parent's close (right after its fork) came before the child's
    // exec, and the self-exec's (k=3) when it was accepted on the engine
    // (a fork's parent stops accepting on the service until it accepts
    // again: a SYN that comes first is the kernel listener's): races both;
    // never the spawned child's (the parent held it at the spawn) or the
    // one exec'd without the shim. On an engine of its own none (the
    // listener went back to the kernel at the first fork). No attempt
    // fails. Deterministic shapes:
    // `a_connection_across_two_execs_is_taken_back_onto_the_engine_each_time`,
    // `an_inetd_style_handler_takes_its_connection_onto_the_engine_on_the_service`.
    for (p, most) in [("Own", 0), ("Service", 2)] {
        let l = placement_log(&logs, p);
        assert!(l.matches(TAKEN_BACK).count() <= most, "{p}:\n{l}");
        no_failed_take_back(l, p);
    }
}

/// No connection inherited across exec failed to come back onto the engine
/// (`p`'s log `l`): the shim names only connections the new image can
/// take (on an engine of its own, never a forked child's copy: the
/// parent's engine holds the interface).
fn no_failed_take_back(l: &str, p: &str) {
    assert!(!l.contains("cannot be taken from the kernel"), "{p}:\n{l}");
}

/// What the shim says when it takes a connection inherited across exec
/// back from the kernel.
const TAKEN_BACK: &str = "a connection inherited across exec, taken from the kernel";

/// Issue 24 item 2, the inetd shape: the server accepts, forks, closes its
/// copy at once and tells the child so (a pipe); the child execs the
/// handler with the connection on its fd, which answers each line until
/// the client's end. Three connections one after another. On the engine
/// service the parent's close keeps the connection on its engine for the
/// child, whose exec hands it over to the kernel in the socket only it
/// holds now: the handler takes it back onto the engine at its first read
/// (the first connection at least: a fork's parent stops accepting on the
/// service until it next accepts, so a later connection whose SYN comes
/// while this one waits for its handler is the kernel listener's, a race). On an engine of its own the connection stays the kernel's
/// (the parent's close hands it over at once; the child could not attach
/// an engine while the parent's holds the interface). Outputs as plainly,
/// bodies hashed.
const INETD_SRV: &str = r#"
import os, socket, sys
addr, port, handler = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ls = listener()
for k in range(3):
    c, _ = ls.accept()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ls.close(); os.close(w)
        os.read(r, 1)
        os.set_inheritable(c.fileno(), True)
        os.execv(sys.executable, [sys.executable, "-c", handler, str(c.fileno()), str(k)])
    c.close(); os.close(r)
    os.write(w, b"x"); os.close(w)
    print(k, "handler exited", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"#;

const INETD_HANDLER: &str = r#"
import hashlib, socket, sys
c = socket.socket(fileno=int(sys.argv[1]))
k = int(sys.argv[2])
n = 0
while True:
    line = readline(c)
    if not line:
        break
    body = hashlib.sha256(line).digest() * (100 * (k + 1) * (n + 1))
    c.sendall(b"%d\n" % len(body) + body)
    n += 1
c.close()
"#;

const INETD_CLIENT: &str = r#"
import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
ok = True
for k in range(3):
    c = socket.create_connection((addr, port), timeout=60)
    for n in range(4):
        line = b"conn %d line %d\n" % (k, n)
        c.sendall(line)
        b = read_sized(c)
        good = b == hashlib.sha256(line).digest() * (100 * (k + 1) * (n + 1))
        ok &= good
        print(k, n, len(b), hashlib.sha256(b).hexdigest()[:16], "ok" if good else "BAD")
    c.shutdown(socket.SHUT_WR)
    print(k, "end", c.recv(1) == b"")
    c.close()
print("all ok" if ok else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn an_inetd_style_handler_takes_its_connection_onto_the_engine_on_the_service() {
    let handler = format!("{READLINE}{INETD_HANDLER}");
    let logs = three_ways(
        "pind",
        "inetd",
        (INETD_SRV, INETD_CLIENT),
        14940,
        &[&handler],
    );
    for (p, least, most) in [("Own", 0, 0), ("Service", 1, 3)] {
        let l = placement_log(&logs, p);
        let n = l.matches(TAKEN_BACK).count();
        assert!((least..=most).contains(&n), "{p}: {n} taken back:\n{l}");
        no_failed_take_back(l, p);
    }
}

/// Issue 24 item 2, a connection across two execs: the server accepts,
/// reads a line and answers 1 MiB (much of it unacknowledged when it
/// execs itself: `execv`), its second image reads the next line and
/// answers 256 KiB, execs again (libc's variadic `execl`), and the third reads to the client's end (the last line and
/// the FIN may reach it before it runs: a connection in CLOSE-WAIT) and
/// answers what it read. Under run each new image takes the connection
/// back onto the engine (the old one handed it to the kernel at the exec,
/// alone holding it): the outputs are the plain ones, bodies hashed.
const EXEC_CHAIN_SRV: &str = r#"
import hashlib, os, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
stage = int(sys.argv[3]) if len(sys.argv) > 3 else 0
if stage == 0:
    ls = listener()
    c, _ = ls.accept()
    ls.close()
else:
    c = socket.socket(fileno=int(sys.argv[4]))
if stage < 2:
    line = readline(c)
    body = hashlib.sha256(line).digest() * ((1 << 20) // 32 if stage == 0 else (1 << 18) // 32)
    c.sendall(b"%d\n" % len(body) + body)
    print("stage", stage, "answered", line.decode().strip(), flush=True)
    os.set_inheritable(c.fileno(), True)
    argv = [sys.executable, "-c", "SRC = %r\n%s" % (SRC, SRC), addr, str(port), str(stage + 1), str(c.fileno())]
    if stage == 0:
        os.execv(sys.executable, argv)
    # The second exec through libc's variadic execl.
    import ctypes
    ctypes.CDLL(None).execl(sys.executable.encode(), *[x.encode() for x in argv], None)
    sys.exit("execl failed")
rest = b"".join(chunks(c, 4096))
c.sendall(b"read %d %s\n" % (len(rest), hashlib.sha256(rest).hexdigest()[:16].encode()))
c.close()
print("stage", stage, "read", len(rest), flush=True)
"#;

const EXEC_CHAIN_CLIENT: &str = r#"
import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
c = socket.create_connection((addr, port), timeout=60)
ok = True
for k in range(2):
    line = b"line %d\n" % k
    c.sendall(line)
    b = read_sized(c)
    good = b == hashlib.sha256(line).digest() * ((1 << 20) // 32 if k == 0 else (1 << 18) // 32)
    ok &= good
    print(k, len(b), hashlib.sha256(b).hexdigest()[:16], "ok" if good else "BAD")
last = b"last line " * 3000 + b"\n"
c.sendall(last)
c.shutdown(socket.SHUT_WR)
r = b"".join(chunks(c, 4096))
want = b"read %d %s\n" % (len(last), hashlib.sha256(last).hexdigest()[:16].encode())
ok &= r == want
print(r.decode().strip())
print("all ok" if ok else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_connection_across_two_execs_is_taken_back_onto_the_engine_each_time() {
    // The program's own source, for its exec (it runs as `python3 -c`).
    let src = format!("{READLINE}{EXEC_CHAIN_SRV}");
    let prog = format!("SRC = {src:?}\n{src}");
    let logs = placed(
        "pxch",
        "exec-chain",
        &python_server(&prog),
        EXEC_CHAIN_CLIENT,
        14930,
        &mut |_, _, _, _| {},
    );
    for p in ["Own", "Service"] {
        let l = placement_log(&logs, p);
        assert_eq!(l.matches(TAKEN_BACK).count(), 2, "{p}:\n{l}");
    }
}

/// A server forks children that never use its connection (one exits at
/// once, one execs /bin/true with the socket close-on-exec, one is
/// `subprocess.run`'s, which vforks) between requests on it: plainly
/// nothing changes for the connection; under run it stays on the engine
/// (the hand-over waits for a child's use, which never comes; the vfork
/// is a fork), and the answers are the same.
const IDLE_CHILD: &str = r#"
import hashlib, os, socket, subprocess, sys
addr, port = sys.argv[1], int(sys.argv[2])
ls = listener()
c, _ = ls.accept()
for r in range(6):
    req = readline(c)
    if r == 1:
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    if r == 3:
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/true", ["true"])
        print("exec'd child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    if r == 4:
        print("subprocess", subprocess.run(["/bin/true"]).returncode, flush=True)
    body = hashlib.sha256(req).digest() * (2000 * (r + 1))
    c.sendall(b"%d\n" % len(body) + body)
c.close()
print("done", flush=True)
"#;

const IDLE_CHILD_CLIENT: &str = r#"
import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
c = socket.create_connection((addr, port), timeout=60)
ok = True
for r in range(6):
    req = b"request %d\n" % r
    c.sendall(req)
    b = read_sized(c)
    n = len(b)
    good = b == hashlib.sha256(req).digest() * (2000 * (r + 1))
    ok &= good
    print(r, n, hashlib.sha256(b).hexdigest()[:16], "ok" if good else "BAD")
print("eof" if c.recv(1) == b"" else "NO EOF")
print("all ok" if ok else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_child_that_never_uses_the_connection_leaves_it_on_the_engine() {
    let progs = (IDLE_CHILD, IDLE_CHILD_CLIENT);
    let logs = three_ways("pidl", "idle-child", progs, 14630, &[]);
    // Said once per connection (own engine, service), never moved: not at
    // either fork, nor at the close (both children let go: one exited,
    // the other's exec closed its copy).
    assert!(!logs.contains("moved to the kernel"), "{logs}");
    assert_eq!(
        logs.matches("stays on the xdp engine until the child uses it too")
            .count(),
        2,
        "{logs}"
    );
}

/// Issue 24 item 2, sockets the new program's shim did not make: a
/// launcher (the systemd socket-activation shape) makes a listening TCP or
/// a bound UDP socket, puts it on fd 3 and execs the server (Python,
/// `LISTEN_FDS=1`), which takes fd 3 as its socket. Under run the new
/// program's shim serves it on the engine at its first use (a readiness
/// registration, accept, recvfrom): the engine's counters show the
/// traffic, and the outputs (the server's view of its socket included)
/// are the plain ones. The server ends at a last connection or datagram
/// the test sends after reading the counters.
const SOCKET_LAUNCHER: &str = r#"
import os, socket, sys
addr, port, kind, prog = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if kind == "tcp":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(16)
elif kind == "udp6":
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(("::", port))
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if kind == "udp-reuseport":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if kind == "udp-lo":
        s.bind(("127.0.0.1", port))
    elif kind != "udp-unbound":
        s.bind((addr, port))
if s.fileno() != 3:
    os.dup2(s.fileno(), 3); s.close()
os.set_inheritable(3, True)
if len(sys.argv) > 5:
    os.dup2(3, 4)  # the same socket under a second number
os.environ["LISTEN_FDS"] = "1"
os.execv(sys.executable, [sys.executable, "-c", prog, addr, str(port)])
"#;

/// The activated TCP server: fd 3 registered with a selector (epoll), 4
/// connections each answered by a hash of its request, then a last one.
const ACTIVATED_TCP: &str = r#"
import hashlib, os, selectors, socket, sys
assert os.environ.get("LISTEN_FDS") == "1"
ls = socket.socket(fileno=3)
ls.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(ls, selectors.EVENT_READ)
print("listening", ls.getsockname()[0], ls.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN), flush=True)
n = 0
while n < 4:
    for key, _ in sel.select():
        c, _ = ls.accept()
        c.setblocking(True)
        req = recv_line(c)
        c.sendall(hashlib.sha256(req).digest() * (1000 * (n + 1)))
        c.close()
        n += 1
print("served", n, flush=True)
ls.setblocking(True)
c, _ = ls.accept()
c.close()
print("done", flush=True)
"#;

const ACTIVATED_TCP_CLIENT: &str = r#"
import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
def ask(req):
    with socket.create_connection((addr, port), timeout=30) as c:
        c.sendall(req)
        return b"".join(chunks(c))
ok = True
for k in range(4):
    req = b"req %d " % k * (3000 * (k + 1)) + b"\n"
    b = ask(req)
    good = b == hashlib.sha256(req).digest() * (1000 * (k + 1))
    ok &= good
    print(k, len(b), hashlib.sha256(b).hexdigest()[:16], "ok" if good else "BAD")
print("all ok" if ok else "SOME BAD", flush=True)
"#;

/// The activated UDP server: echoes a hash of each datagram until "done".
const ACTIVATED_UDP: &str = r#"
import hashlib, socket, sys
u = socket.socket(fileno=3)
print("listening", u.getsockname()[0], u.type, u.gettimeout(), flush=True)
n = 0
while True:
    d, peer = u.recvfrom(65536)
    if d == b"done":
        break
    u.sendto(hashlib.sha256(d).digest() + d[:100], peer)
    n += 1
print("served", n, flush=True)
"#;

const ACTIVATED_UDP_CLIENT: &str = r#"
import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(5)
ok = True
for k in range(200):
    d = bytes((k * 7 + j) % 251 for j in range(1 + k * 7))
    ok &= udp_ask(c, d, (addr, port), 5) == hashlib.sha256(d).digest() + d[:100]
print("200 echoes", flush=True)
print("all ok" if ok else "SOME BAD", flush=True)
"#;

/// The end a test sends to an activated server (argv: addr port kind).
const ACTIVATED_END: &str = r#"
import socket, sys
addr, port, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "tcp":
    socket.create_connection((addr, port), timeout=30).close()
else:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"done", (addr, port))
"#;

/// [`SOCKET_LAUNCHER`] with server `srv` (a `kind` socket) and client
/// `cli` in the three placements; under run the engine counter `counter`
/// of the server's engine reaches `at_least` before the end is sent, and
/// the shim said it took the socket it did not make.
fn activated(tag: &str, kind: &str, progs: (&str, &str), port: u16, counter: (&str, u64)) {
    let logs = launched(tag, kind, progs, port, Some(counter));
    assert_eq!(
        logs.matches("this program did not make").count(),
        2,
        "{logs}"
    );
}

/// [`SOCKET_LAUNCHER`] with server `srv` (a `kind` socket) and client
/// `cli` in the three placements (the server ends at [`ACTIVATED_END`]
/// unless `kind` is loopback or unbound, whose servers end by themselves);
/// under run, with `counter`, the engine counter `.0` of the server's
/// engine reaches `.1` first. Returns the run placements' server stderr.
fn launched(
    tag: &str,
    kind: &str,
    (srv, cli): (&str, &str),
    port: u16,
    counter: Option<(&str, u64)>,
) -> String {
    let srv = &format!("{READLINE}{srv}");
    let server = |addr: &str, port: &str| {
        ["python3", "-c", SOCKET_LAUNCHER, addr, port, kind, srv]
            .into_iter()
            .map(String::from)
            .collect()
    };
    let name = &format!("act-{kind}");
    placed(tag, name, &server, cli, port, &mut |p, l, s, port| {
        if let (false, Some((counter, at_least))) = (matches!(p, Placement::Plain), counter) {
            // The engine's counters are published every few turns: wait
            // for them to show the traffic (bounded; not a timing check).
            let pid = s.child.id();
            let seen = until(T, || {
                nanowire_testkit::engine_counters_of(nanowire(), pid)
                    .and_then(|v| v[counter].as_u64())
                    .is_some_and(|n| n >= at_least)
            });
            let now = nanowire_testkit::engine_counters_of(nanowire(), pid);
            assert!(
                seen,
                "{p:?}: {counter} of the server's engine below {at_least}: {now:?}\n{}",
                s.both()
            );
        }
        if matches!(kind, "udp-lo" | "udp-unbound") {
            return;
        }
        let end = [
            "python3",
            "-c",
            ACTIVATED_END,
            &ADDR_B.to_string(),
            port,
            kind,
        ];
        output(plain_in(l, Host::A, &end), "the end");
    })
}

/// The inherited sockets the engine does not take (docs/preload.md's
/// table): each stays the kernel's in the exec'd program, the outputs are
/// the plain ones, and under run (own engine, service) the shim says why,
/// as for a fresh socket: `reason` in each run placement's server stderr.
fn kernel_kept(tag: &str, kind: &str, progs: (&str, &str), port: u16, reason: &str) {
    let logs = launched(tag, kind, progs, port, None);
    eprintln!("{kind}:\n{logs}");
    let runs: Vec<&str> = logs.split("--- ").filter(|x| !x.is_empty()).collect();
    assert_eq!(runs.len(), 2, "{logs}");
    assert!(runs.iter().all(|r| r.contains(reason)), "{logs}");
    assert!(!logs.contains("on the xdp engine"), "{logs}");
}

/// The loopback server: a thread of its own asks [`ACTIVATED_UDP`]'s
/// loop over 127.0.0.1 (host a cannot reach it), then ends it.
const SELF_CLIENT: &str = r#"
import hashlib, socket, sys, threading
def self_client():
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    to = ("127.0.0.1", int(sys.argv[2]))
    ok = True
    for k in range(50):
        d = bytes((k * 7 + j) % 251 for j in range(1 + k * 7))
        c.sendto(d, to)
        ok &= c.recvfrom(65536)[0] == hashlib.sha256(d).digest() + d[:100]
    print("self client", "all ok" if ok else "SOME BAD", flush=True)
    c.sendto(b"done", to)
threading.Thread(target=self_client).start()
"#;

/// Host a's part for the loopback server, which talks to itself.
const NOTHING_CLIENT: &str = "print('all ok', flush=True)\n";

/// The unbound server: its first send (to host a) binds it; 50 datagrams
/// each answered by their hash (repeated until answered), then "done".
const UNBOUND_UDP: &str = r#"
import hashlib, socket, sys
u = socket.socket(fileno=3)
print("listening", u.getsockname(), flush=True)
peer = ("198.18.0.1", int(sys.argv[2]))
u.settimeout(0.5)
ok = True
for k in range(50):
    d = bytes((k * 7 + j) % 251 for j in range(1 + k * 7))
    want, r = hashlib.sha256(d).digest(), b""
    for attempt in range(40):
        u.sendto(d, peer)
        try:
            while r != want:
                r = u.recv(65536)
            break
        except socket.timeout:
            pass
    ok &= r == want
for attempt in range(3):
    u.sendto(b"done", peer)
print("50 echoes", "all ok" if ok else "SOME BAD", flush=True)
"#;

/// Host a's part for the unbound server: answers each datagram with its
/// hash until "done".
const UNBOUND_CLIENT: &str = r#"
import hashlib, socket, sys
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.bind(("", int(sys.argv[2])))
c.settimeout(60)
while True:
    d, peer = c.recvfrom(65536)
    if d == b"done":
        break
    c.sendto(hashlib.sha256(d).digest(), peer)
print("all ok", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_listening_socket_inherited_across_exec_is_served_on_the_engine() {
    let progs = (ACTIVATED_TCP, ACTIVATED_TCP_CLIENT);
    activated("pact", "tcp", progs, 14640, ("tcp_passive_opens", 4));
}

#[test]
#[ignore = "needs root"]
fn a_bound_udp_socket_inherited_across_exec_is_served_on_the_engine() {
    let progs = (ACTIVATED_UDP, ACTIVATED_UDP_CLIENT);
    activated("puct", "udp", progs, 14650, ("rx_packets", 200));
}

/// The activated socket under two numbers (fds 3 and 4, as a launcher may
/// pass one socket twice): the server serves one datagram on fd 4 (on the
/// engine: the shim never saw fd 3), closes it and forks; the child's
/// blocking recvfrom on fd 3, the same socket, must block as the
/// application left it (issue 24: the engine's O_NONBLOCK stayed on the
/// socket after its last known fd closed, and a forked child's blocking
/// recv said EAGAIN, the c_semantics failure of session 18), and the
/// child, which shares fd 3 with its parent, leaves it the kernel's.
const TWO_NUMBERS_UDP: &str = r#"
import os, socket
u4 = socket.socket(fileno=4)
print("listening", flush=True)
serve(u4, b"a")
u4.close()
pid = os.fork()
if pid == 0:
    u3 = socket.socket(fileno=3)
    for want in (b"b", b"c", b"d"):
        serve(u3, want)
    os._exit(0)
print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"#;

const TWO_NUMBERS_CLIENT: &str = r#"
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(5)
def ask(d):
    for attempt in range(5):
        c.sendto(d, (addr, port))
        try:
            while True:
                r = c.recvfrom(100)[0]
                if r == b"got " + d:
                    return r
        except socket.timeout:
            pass
    return b""
r = [ask(d) for d in (b"a", b"b", b"c", b"d")]
print(r)
print("all ok" if all(r) else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn an_inherited_socket_under_two_numbers_keeps_its_mode_for_a_forked_child() {
    let logs = two_numbers("ptwo", TWO_NUMBERS_UDP, 14660);
    // Under run, the child kept fd 3 the kernel's.
    assert_eq!(logs.matches("has forked since").count(), 2, "{logs}");
}

/// The activated socket under two numbers, both used (fd 4, fd 3, fd 4,
/// fd 3): one socket, one engine record (the second number shares the
/// first's, found by the socket's SO_COOKIE). Adopted twice, the second
/// record took the engine's O_NONBLOCK for the application's mode, and
/// the blocking recvfrom on fd 3 said EAGAIN.
const BOTH_NUMBERS_UDP: &str = r#"
import socket
u4, u3 = socket.socket(fileno=4), socket.socket(fileno=3)
print("listening", flush=True)
for u, want in ((u4, b"a"), (u3, b"b"), (u4, b"c"), (u3, b"d")):
    serve(u, want)
print("served", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn an_inherited_socket_used_under_two_numbers_is_one_engine_socket() {
    two_numbers("pboth", BOTH_NUMBERS_UDP, 14670);
}

/// [`SOCKET_LAUNCHER`] putting one bound UDP socket on fds 3 and 4, the
/// server `srv` and [`TWO_NUMBERS_CLIENT`] in the three placements (lab
/// tagged `tag`); under run the socket went onto the engine once (own
/// engine, service: a second number shares its record). Returns the run
/// placements' server stderr.
fn two_numbers(tag: &str, srv: &str, port: u16) -> String {
    // serve(u, want): answer "got WANT" to the datagram WANT (a client's
    // repeat of an earlier one is skipped).
    let srv = &format!(
        "def serve(u, want):\n    d = b''\n    while d != want:\n        d, peer = u.recvfrom(100)\n    u.sendto(b'got ' + d, peer)\n{srv}"
    );
    let server = |addr: &str, port: &str| {
        let argv = ["python3", "-c", SOCKET_LAUNCHER, addr, port, "udp", srv];
        argv.into_iter()
            .chain(["twice"])
            .map(String::from)
            .collect()
    };
    let logs = placed(
        tag,
        tag,
        &server,
        TWO_NUMBERS_CLIENT,
        port,
        &mut |_, _, _, _| {},
    );
    let adopted = "a bound socket this program did not make";
    assert_eq!(logs.matches(adopted).count(), 2, "{logs}");
    logs
}

#[test]
#[ignore = "needs root"]
fn an_inherited_ipv6_socket_stays_the_kernels() {
    let progs = (ACTIVATED_UDP, ACTIVATED_UDP_CLIENT);
    kernel_kept("pv6", "udp6", progs, 14680, "xdp not used: IPv6 socket");
}

#[test]
#[ignore = "needs root"]
fn an_inherited_loopback_socket_stays_the_kernels() {
    let srv = &format!("{SELF_CLIENT}{ACTIVATED_UDP}");
    kernel_kept(
        "plo",
        "udp-lo",
        (srv, NOTHING_CLIENT),
        14690,
        "xdp not used: loopback address",
    );
}

#[test]
#[ignore = "needs root"]
fn an_inherited_reuseport_socket_stays_the_kernels() {
    let progs = (ACTIVATED_UDP, ACTIVATED_UDP_CLIENT);
    let why = "SO_REUSEPORT is set on it";
    kernel_kept("prp", "udp-reuseport", progs, 14700, why);
}

#[test]
#[ignore = "needs root"]
fn an_inherited_unbound_socket_is_decided_at_its_first_send() {
    let progs = (UNBOUND_UDP, UNBOUND_CLIENT);
    let logs = launched("pub", "udp-unbound", progs, 14710, None);
    eprintln!("unbound:\n{logs}");
    // Its first send (to host a, through the lab's interface) put it on
    // the engine, bound to an ephemeral port as the kernel binds it.
    assert_eq!(logs.matches("fd 3 udp 0.0.0.0:").count(), 2, "{logs}");
    assert_eq!(logs.matches(": xdp (interface").count(), 2, "{logs}");
}

/// Issue 24's bad input, two processes reading one socket at once: a UDP
/// socket and a TCP listener made before a fork; parent and child each
/// block in `recvfrom` on the one (the parent says "listening" once the
/// child is about to), then wait on the other. The client sends a
/// burst of 2,000 datagrams, then "end" until both readers said "done",
/// then 100 connections (8 at a time) while both wait on the listener
/// (`select` on it and on a stop pipe, then a non-blocking `accept`), then
/// one "end" connection: its taker says "bye" and stops the other through
/// the pipe. (Not an "end" connection per process: on the engine service
/// a connection whose SYN reaches a member as it closes its copy of the
/// listener is reset, where the kernel's one queue would give it to the
/// other holder; docs/architecture.md, "Listening sockets that cross
/// fork".) Every datagram and every connection must reach exactly one
/// of the two, as the kernel gives them: the parent prints the union's
/// counts (how they split goes to stderr: it differs from run to run).
/// Under run the UDP socket is the kernel's after the fork (both
/// placements); the listener is too on an own engine, and stays on the
/// engine service's listener group (both processes accept from it).
const TWO_READERS: &str = r#"import os, select, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
n, m = 2000, 100
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
u.bind((addr, port))
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((addr, port))
ls.listen(128)
res_r, res_w = os.pipe()
rdy_r, rdy_w = os.pipe()
stop_r, stop_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(rdy_w, b"r")
else:
    os.read(rdy_r, 1)
    print("listening", flush=True)
got, acc = [], []
while True:
    d, src = u.recvfrom(2048)
    if d == b"end":
        u.sendto(b"done", src)
        break
    got.append(d.decode())
ls.setblocking(False)
while True:
    r, _, _ = select.select([ls, stop_r], [], [])
    if stop_r in r:
        break
    try:
        c, _ = ls.accept()
    except BlockingIOError:
        continue
    c.setblocking(True)
    line = readline(c)
    if line == b"end\n":
        c.sendall(b"bye\n")
        c.close()
        os.write(stop_w, b"s")
        break
    acc.append(line.decode().strip())
    c.sendall(line)
    c.close()
ls.close()
mine = "\n".join(["u " + x for x in got] + ["t " + x for x in acc]) + "\n"
who = "child" if pid == 0 else "parent"
print(who, "datagrams", len(got), "connections", len(acc), file=sys.stderr, flush=True)
if pid == 0:
    os.write(res_w, mine.encode())
    os._exit(0)
os.close(res_w)
theirs = b""
while True:
    d = os.read(res_r, 1 << 16)
    if not d:
        break
    theirs += d
st = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
lines = [l for l in (mine + theirs.decode()).splitlines() if l]
us = [l[2:] for l in lines if l.startswith("u ")]
ts = [l[2:] for l in lines if l.startswith("t ")]
print("udp received", len(us), "distinct", len(set(us)), "all", set(us) == {"d %d" % i for i in range(n)})
print("tcp accepted", len(ts), "distinct", len(set(ts)), "all", set(ts) == {"c %d" % i for i in range(m)})
print("child", st, flush=True)
"#;

const TWO_READERS_CLIENT: &str = r#"import socket, sys, threading
addr, port = sys.argv[1], int(sys.argv[2])
n, m = 2000, 100
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(0.3)
for i in range(n):
    u.sendto(b"d %d" % i, (addr, port))
dones = 0
while dones < 2:
    u.sendto(b"end", (addr, port))
    try:
        while dones < 2:
            if u.recv(64) == b"done":
                dones += 1
    except TimeoutError:
        pass
print("udp sent", n, "dones", dones, flush=True)
ok = [0]
lock = threading.Lock()
def conns(k):
    for i in range(k, m, 8):
        c = socket.create_connection((addr, port), timeout=60)
        c.sendall(b"c %d\n" % i)
        b = b"".join(chunks(c))
        c.close()
        if b == b"c %d\n" % i:
            with lock:
                ok[0] += 1
ts = [threading.Thread(target=conns, args=(k,)) for k in range(8)]
for t in ts: t.start()
for t in ts: t.join()
c = socket.create_connection((addr, port), timeout=60)
c.sendall(b"end\n")
bye = b"".join(chunks(c))
c.close()
print("tcp", m, "answered", ok[0], "bye", bye == b"bye\n")
print("all ok" if ok[0] == m else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn two_processes_reading_one_socket_at_once_get_each_datagram_and_connection_once() {
    let progs = (TWO_READERS, TWO_READERS_CLIENT);
    let logs = three_ways("prdr", "two-readers", progs, 14720, &[]);
    // On the service both processes accepted from the listener's group.
    assert!(
        logs.contains("shared with the parent process through the engine service"),
        "{logs}"
    );
}

/// Issue 24's bad input, a child that exits while its parent is mid-send:
/// the server holds one connection and a bound UDP socket; six times it
/// forks a child that sends one datagram on the shared UDP socket, says
/// so through a pipe, then exits (`sys.exit`: Python's finalization
/// closes its copies; `os._exit`; or is killed with -9 by the parent),
/// while a thread of the parent sends 1 MiB on the connection and 200
/// datagrams. The client checks each body by hash and that each round's
/// 201 datagrams came; the connection ends with "end" and the end of
/// file, as plainly.
const MIDSEND: &str = r#"import hashlib, os, signal, socket, sys, threading, time
addr, port = sys.argv[1], int(sys.argv[2])
ls = listener()
c, (peer, _) = ls.accept()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind((addr, port))
dst = (peer, int(readline(c).split()[1]))
for k, mode in enumerate(["exit", "_exit", "kill", "exit", "_exit", "kill"]):
    sent_r, sent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        u.sendto(b"child %d" % k, dst)
        os.write(sent_w, b"s")
        if mode == "kill":
            time.sleep(60)
        time.sleep(0.001)
        if mode == "exit":
            sys.exit(0)
        os._exit(0)
    body = hashlib.sha256(b"%d" % k).digest() * (1 << 15)
    def send():
        c.sendall(b"%d\n" % len(body) + body)
        for i in range(200):
            u.sendto(b"%d %d" % (k, i), dst)
    t = threading.Thread(target=send)
    t.start()
    os.read(sent_r, 1)
    if mode == "kill":
        os.kill(pid, signal.SIGKILL)
    st = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    t.join()
    os.close(sent_r)
    os.close(sent_w)
    print(k, mode, "child", st, readline(c).decode().strip(), flush=True)
c.sendall(b"end\n")
c.close()
print("done", flush=True)
"#;

const MIDSEND_CLIENT: &str = r#"import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)
u.bind(("0.0.0.0", 0))
u.settimeout(30)
c = socket.create_connection((addr, port), timeout=60)
c.sendall(b"udp %d\n" % u.getsockname()[1])
ok = True
for k in range(6):
    n = int(readline(c))
    b = b""
    while len(b) < n:
        d = c.recv(min(1 << 16, n - len(b)))
        if not d:
            break
        b += d
    want = {b"child %d" % k} | {b"%d %d" % (k, i) for i in range(200)}
    got = set()
    while got != want:
        got.add(u.recv(64))
    good = b == hashlib.sha256(b"%d" % k).digest() * (1 << 15)
    ok &= good
    line = "%d %d %s udp %d" % (k, len(b), hashlib.sha256(b).hexdigest()[:16], len(got))
    print(line, "ok" if good else "BAD")
    c.sendall(b"got " + line.encode() + b"\n")
print(readline(c).decode().strip(), "eof" if c.recv(1) == b"" else "NO EOF")
print("all ok" if ok else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_child_exiting_while_its_parent_sends_loses_nothing() {
    three_ways("pmid", "mid-send", (MIDSEND, MIDSEND_CLIENT), 14730, &[]);
}

/// Issue 24 item 1 for UDP: a bound socket stays on the engine across a
/// fork whose child never uses it (a worker pool's shape: the child
/// computes and exits; or `subprocess.run`'s vfork), and goes to the
/// kernel, for both processes, when a child does use it. The server echoes
/// 50 datagrams, forks an idle child, runs /bin/true with subprocess, echoes
/// 50 more (the client's part ends here: under run the engine's
/// counters must show those too, so the socket was still on the engine),
/// then the test's second client says "fork" and sends 100 more: a second
/// child echoes 50 and exits, the parent the last 50. Stop-and-wait, so every datagram
/// has one reader; the outputs are the plain ones in every placement.
const UDP_FORK_SRV: &str = r#"
import hashlib, os, socket, subprocess, sys
addr, port = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
print("listening", flush=True)
def serve(n, who):
    h = hashlib.sha256()
    for _ in range(n):
        d, peer = u.recvfrom(2048)
        h.update(d)
        u.sendto(b"echo " + d, peer)
    print(who, n, h.hexdigest()[:16], flush=True)
serve(50, "parent")
pid = os.fork()
if pid == 0:
    os._exit(sum(range(1000)) % 7)
print("idle child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
print("subprocess", subprocess.run(["/bin/true"]).returncode, flush=True)
serve(50, "parent after the idle child")
d, peer = u.recvfrom(2048)
u.sendto(b"forking after " + d, peer)
pid = os.fork()
if pid == 0:
    serve(50, "serving child")
    os._exit(0)
print("serving child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
serve(50, "parent after the serving child")
"#;

/// Sends datagrams `first..last` one at a time, each until its echo comes
/// (argv: addr port first last); exits 1 on a wrong echo.
const UDP_FORK_CLIENT: &str = r#"
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
first, last = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (0, 100)
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(2)
ok = True
if first > 0:
    c.sendto(b"fork", (addr, port))
    print(c.recvfrom(4096)[0].decode(), flush=True)
for k in range(first, last):
    d = b"datagram %d " % k + bytes(k % 251 for _ in range(k * 5))
    ok &= udp_ask(c, d, (addr, port), 10) == b"echo " + d
print(last - first, "echoed", flush=True)
print("all ok" if ok else "SOME BAD", flush=True)
sys.exit(0 if ok else 1)
"#;

#[test]
#[ignore = "needs root"]
fn a_udp_socket_stays_on_the_engine_until_a_forked_child_uses_it() {
    let srv = format!("{READLINE}{UDP_FORK_SRV}");
    let server = python_server(&srv);
    let rest = format!("{READLINE}{UDP_FORK_CLIENT}");
    let logs = placed(
        "pudf",
        "udp-fork",
        &server,
        UDP_FORK_CLIENT,
        14860,
        &mut |p, l, s, port| {
            if p != Placement::Plain {
                // The 100 datagrams before and after the idle child's fork
                // went through the engine (its counters are published every
                // few turns: waited for, bounded; not a timing check; short:
                // the fork took the socket off).
                counter_reaches(s.child.id(), "rx_packets", 100, (&format!("{p:?}"), s));
            }
            let argv = [
                "python3",
                "-c",
                &rest,
                &ADDR_B.to_string(),
                port,
                "100",
                "200",
            ];
            let out = output(plain_in(l, Host::A, &argv), "the second client");
            assert!(out.contains("all ok"), "{p:?}: {out}");
        },
    );
    eprintln!("{logs}");
    // Kept on the engine at the idle child's fork (said once per run
    // placement), taken off when the second child used it: never at a fork.
    said(
        &logs,
        &[
            (KEPT_AT_FORK, 2),
            ("fork(): the forked child uses it too", 2),
            ("inherited through fork(): the kernel's socket now", 2),
            ("fork(): the child shares this socket", 0),
        ],
    );
}

/// What the shim says when a fork leaves a UDP socket on the engine.
const KEPT_AT_FORK: &str =
    "udp: shared with the forked child: stays on the xdp engine until the child uses it too";

/// Each of `counts`' lines is said that many times in `logs`.
#[track_caller]
fn said(logs: &str, counts: &[(&str, usize)]) {
    for &(line, n) in counts {
        assert_eq!(logs.matches(line).count(), n, "{line:?}:\n{logs}");
    }
}

/// Python's `socketserver.ForkingUDPServer`: the parent receives each
/// datagram and forks a child that sends the answer on the inherited
/// socket and exits; 100 of them, then the parent waits for a "done" (the
/// test reads its engine's counters meanwhile). (argv: addr port)
const FORKING_UDP_SRV: &str = r#"
import ctypes, socket, socketserver, sys
addr, port = sys.argv[1], int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
class MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(IoVec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]
class MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]
def sendmmsg_to(sock, data, peer):
    # One message with its destination (msg_name), through libc's sendmmsg.
    sa = bytearray(16)
    sa[0:2] = socket.AF_INET.to_bytes(2, "little")
    sa[2:4] = peer[1].to_bytes(2, "big")
    sa[4:8] = socket.inet_aton(peer[0])
    name = (ctypes.c_ubyte * 16).from_buffer(sa)
    buf = ctypes.create_string_buffer(data, len(data))
    iov = IoVec(ctypes.cast(buf, ctypes.c_void_p), len(data))
    m = MMsgHdr(MsgHdr(ctypes.cast(name, ctypes.c_void_p), 16, ctypes.pointer(iov), 1, None, 0, 0), 0)
    if libc.sendmmsg(sock.fileno(), ctypes.byref(m), 1, 0) != 1:
        raise OSError(ctypes.get_errno(), "sendmmsg")
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        # In turns: sendto, sendmsg and sendmmsg with a destination.
        turn = int(data.split()[1]) % 3
        if turn == 1:
            sock.sendmsg([b"echo ", data], [], 0, self.client_address)
        elif turn == 2:
            sendmmsg_to(sock, b"echo " + data, self.client_address)
        else:
            sock.sendto(b"echo " + data, self.client_address)
srv = socketserver.ForkingUDPServer((addr, port), Echo)
print("listening", flush=True)
for _ in range(100):
    srv.handle_request()
srv.collect_children(blocking=True)
d, _ = srv.socket.recvfrom(100)
print("served 100, then", d.decode(), flush=True)
srv.server_close()
"#;

/// A forking UDP server (Python's `ForkingUDPServer`: a child per
/// datagram sends the answer, by `sendto`, `sendmsg` or `sendmmsg` with a
/// destination, in turns) answers as plainly and, under run, its socket
/// stays on the parent's engine throughout: the children's sends go out
/// through the kernel socket under their copies without claiming it
/// (before session 33 the first child's send moved it, or took it off the
/// engine for both, and the second's made it the kernel's; before session
/// 34 so did a `sendmsg`, before session 35 a `sendmmsg`).
#[test]
#[ignore = "needs root"]
fn a_forking_udp_server_keeps_its_socket_on_the_engine() {
    let server = python_server(FORKING_UDP_SRV);
    let logs = placed(
        "pufk",
        "udp-forking",
        &server,
        UDP_FORK_CLIENT,
        14990,
        &mut |p, l, s, port| {
            if p != Placement::Plain {
                // All 100 came in through the parent's engine (its counters
                // are published every few turns: waited for, bounded).
                counter_reaches(s.child.id(), "rx_packets", 100, (&format!("{p:?}"), s));
            }
            let done = format!(
                "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'done', ('{ADDR_B}', {port}))"
            );
            output(
                plain_in(l, Host::A, &["python3", "-c", &done]),
                "the done datagram",
            );
        },
    );
    eprintln!("{logs}");
    said(
        &logs,
        &[
            (KEPT_AT_FORK, 2),
            ("the kernel's socket now", 0),
            ("fork(): the forked child uses it too", 0),
            ("moved from the xdp engine", 0),
        ],
    );
}

/// A prefork UDP server: the parent binds, forks two workers and only
/// waits; each worker waits on the inherited socket with epoll (Python's
/// selectors) and echoes what it reads, until a "done". The workers'
/// first use is the epoll registration: under run it has the parent take
/// the socket off its engine, and the workers share the kernel's socket
/// (which of them gets a datagram is the kernel's choice, as plainly). 200
/// datagrams, stop-and-wait, each echoed once, as plainly.
const UDP_PREFORK_SRV: &str = r#"
import os, selectors, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
u.setblocking(False)
kids = []
for w in range(2):
    pid = os.fork()
    if pid == 0:
        sel = selectors.EpollSelector()
        sel.register(u, selectors.EVENT_READ)
        while True:
            sel.select()
            try:
                d, peer = u.recvfrom(2048)
            except BlockingIOError:
                continue
            if d == b"done":
                os._exit(0)
            u.sendto(b"echo " + d, peer)
    kids.append(pid)
print("listening", flush=True)
print("workers", sorted(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids), flush=True)
"#;

const UDP_PREFORK_CLIENT: &str = r#"
import socket, sys, time
addr, port = sys.argv[1], int(sys.argv[2])
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(2)
ok = True
for k in range(200):
    d = b"datagram %d" % k
    r = udp_ask(c, d, (addr, port), 10)
    while r != b"echo " + d and r:
        # A late echo of a resent datagram: the next one is ours.
        try:
            r, _ = c.recvfrom(4096)
        except socket.timeout:
            r = b""
    ok &= r == b"echo " + d
print("200 echoed", flush=True)
for _ in range(2):
    c.sendto(b"done", (addr, port))
    time.sleep(0.2)
print("all ok" if ok else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn prefork_udp_workers_waiting_with_epoll_share_the_socket_as_plainly() {
    let srv = format!("{READLINE}{UDP_PREFORK_SRV}");
    let server = python_server(&srv);
    let logs = placed(
        "pudw",
        "udp-prefork",
        &server,
        UDP_PREFORK_CLIENT,
        14880,
        &mut |_, _, _, _| {},
    );
    eprintln!("{logs}");
    // Under run: kept on the engine at the first fork. On an engine of its
    // own, taken off once, at the first worker's registration (before or
    // after the second fork: then the second worker's copy is the
    // kernel's from its start, or claimed too). On the service the first
    // worker's registration moves it to that worker's engine (the parent
    // never used it since the fork), and the second worker's use has
    // that worker take it off (one move at most); the parent's copy is
    // the kernel's when its exit looks at it.
    let runs: Vec<&str> = logs.split("--- ").filter(|x| !x.is_empty()).collect();
    assert_eq!(runs.len(), 2, "{logs}");
    for run in runs {
        let say = |x: &str| run.matches(x).count();
        let service = run.starts_with("Service");
        assert_eq!(
            say("udp: shared with the forked child"),
            1,
            "said once per socket:\n{run}"
        );
        assert_eq!(say("fork(): the forked child uses it too"), 1, "{run}");
        assert_eq!(
            say("udp: moved to the xdp engine of pid"),
            usize::from(service),
            "{run}"
        );
        assert_eq!(
            say("inherited through fork(): on this process's xdp engine (moved from"),
            usize::from(service),
            "{run}"
        );
        assert!(
            (1..=3).contains(&say("inherited through fork(): the kernel's socket now")),
            "{run}"
        );
    }
}

/// The owner of a UDP socket it shared at fork exits before the child
/// ever used it: the child then serves it alone (the socket left the
/// owner's engine with its queue; on the engine service the child's first
/// use takes it onto the child's engine, on an engine of its own it finds
/// the kernel's; no owner left to ask, nothing hangs). 20 datagrams echoed by the parent,
/// then it forks and exits; the child waits until it is gone and echoes 20
/// more. The client's output is the plain one in every placement.
const UDP_ORPHAN_SRV: &str = r#"
import os, socket, sys, time
addr, port = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
print("listening", flush=True)
def serve(n):
    for _ in range(n):
        d, peer = u.recvfrom(2048)
        u.sendto(b"echo " + d, peer)
serve(20)
parent = os.getpid()
if os.fork() == 0:
    while os.getppid() == parent:
        time.sleep(0.01)
    serve(20)
    os._exit(0)
print("parent leaves", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_udp_socket_a_forked_child_holds_outlives_its_owner() {
    let srv = format!("{READLINE}{UDP_ORPHAN_SRV}");
    let server = python_server(&srv);
    let cli = UDP_FORK_CLIENT.replace("else (0, 100)", "else (0, 40)");
    let logs = placed(
        "pudo",
        "udp-orphan",
        &server,
        &cli,
        14870,
        &mut |_, _, _, _| {},
    );
    eprintln!("{logs}");
    // Python closes the socket as it exits (else the exit leaves it). On
    // an engine of its own that close takes it off (the owner's engine
    // keeps the interface while it lives); on the service it is left to
    // the child, whose first use takes it onto its engine.
    for run in logs.split("--- ").filter(|x| !x.is_empty()) {
        let say = |x: &str| run.matches(x).count();
        let service = run.starts_with("Service");
        assert_eq!(say("its forked child holds it"), 1, "{run}");
        assert_eq!(
            say("taken off the xdp engine (kernel socket, spin engine): "),
            usize::from(!service),
            "{run}"
        );
        assert_eq!(
            say("inherited through fork(): on this process's xdp engine (left to it by pid"),
            usize::from(service),
            "{run}"
        );
    }
}

/// Issue 24's bad input for the move (item 1): a forked child dies by
/// SIGKILL in the middle of taking the connection its parent still holds.
/// Its first use of the connection (a getsockopt) asks for it; under run on
/// the engine service the test hook `NANOWIRE_TEST_KILL_IN_MOVE=1` kills it
/// after the parent's engine gave the connection up and before the child's
/// take; plainly (and on an engine of its own, where nothing moves) the
/// child kills itself right after. The parent must have the connection
/// still (the owner takes back what was not taken, then it is the
/// kernel's): it answers the client's second line, then closes.
const KILLED_TAKER: &str = r#"
import os, signal, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
ls = listener()
c, _ = ls.accept()
c.sendall(b"parent got " + readline(c))
pid = os.fork()
if pid == 0:
    c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)
st = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
c.sendall(b"parent still has it, the child ended with %d, and got " % st + readline(c))
c.close()
print("child", st, flush=True)
"#;

const KILLED_TAKER_CLIENT: &str = r#"
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
c = socket.create_connection((addr, port), timeout=30)
c.sendall(b"one\n")
a = readline(c)
c.sendall(b"two\n")
b = readline(c)
rest = b"".join(chunks(c))
print(a.decode().strip())
print(b.decode().strip())
print("then", len(rest), "bytes and the end")
ok = a == b"parent got one\n" and b.endswith(b"and got two\n") and rest == b""
print("all ok" if ok else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_child_killed_while_taking_a_connection_leaves_it_to_the_parent() {
    let srv = format!("{READLINE}{KILLED_TAKER}");
    let server = |addr: &str, port: &str| {
        let env = "NANOWIRE_TEST_KILL_IN_MOVE=1";
        ["env", env, "python3", "-c", &srv, addr, port]
            .map(String::from)
            .to_vec()
    };
    let logs = placed(
        "pkil",
        "killed-taker",
        &server,
        KILLED_TAKER_CLIENT,
        14750,
        &mut |_, _, _, _| {},
    );
    let svc = placement_log(&logs, "Service");
    assert!(
        svc.contains("test hook: SIGKILL in a move, before the take"),
        "{svc}"
    );
    assert_eq!(svc.matches(MOVED_IN).count(), 0, "{svc}");
}

/// Issue 24's bad input, a fork storm: the server holds a connection and
/// a bound UDP socket and forks 1,000 children as fast as it can reap
/// them; each sends one datagram on the inherited UDP socket (every 100th
/// also a line on the connection) and exits (every 4th by libc `exit`,
/// which runs the shim's exit handling, the others `_exit`). The server
/// counts its fds after the 100th child and after the last (no growth),
/// then answers a ping on the UDP socket and waits for "quit". The
/// client checks every datagram came once and the lines. Under run,
/// before "quit": no process but the server holds an engine on the
/// interface (own engine), and the service lists the server alone as a
/// client and as the listener group's member (no dead child left).
/// A connection taken by a forked child that exits at once, while the
/// parent goes on forking (session 30, found by the fork storm in a
/// clean-clone CI): the parent's broker offered the connection to the
/// first child that wrote on it, the child took it onto its engine and
/// exited (its close handed it to the kernel and freed the fork-share
/// slot), and the parent's next fork made a new slot before the broker
/// looked again: the broker read "not taken" and took the connection
/// back onto the parent's engine, which then held a connection the
/// kernel also had; the parent's last line never reached the peer (2 in
/// 12 runs of this shape). Five rounds of 200 forks, every 50th child
/// writing a line; then the parent's "done" must arrive, as plainly.
const TAKE_AND_EXIT_SRV: &str = r#"
import os, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
ls = listener()
for r in range(5):
    c, _ = ls.accept()
    readline(c)
    kids = []
    for i in range(200):
        pid = os.fork()
        if pid == 0:
            if i % 50 == 0:
                c.sendall(b"round %d kid %d\n" % (r, i))
            os._exit(0)
        kids.append(pid)
    for p in kids:
        os.waitpid(p, 0)
    c.sendall(b"round %d done\n" % r)
    c.close()
print("served", flush=True)
"#;

const TAKE_AND_EXIT_CLIENT: &str = r#"
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
for r in range(5):
    c = socket.create_connection((addr, port), timeout=30)
    c.sendall(b"go\n")
    lines = []
    while True:
        l = readline(c)
        if not l or l.endswith(b"done\n"):
            break
        lines.append(l)
    print(r, sorted(lines), l)
    c.close()
print("all ok", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_child_taking_the_connection_and_exiting_at_once_leaves_the_parents_copy_working() {
    three_ways(
        "ptkx",
        "take-and-exit",
        (TAKE_AND_EXIT_SRV, TAKE_AND_EXIT_CLIENT),
        14950,
        &[],
    );
}

const STORM: &str = r#"import ctypes, os, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
n = 1000
libc = ctypes.CDLL(None)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind((addr, port))
ls = listener()
c, (peer, _) = ls.accept()
dst = (peer, int(readline(c).split()[1]))
def fds():
    return len(os.listdir("/proc/self/fd"))
before = None
codes = {}
kids = set()
def reap(block):
    while kids:
        p, st = os.waitpid(-1, 0 if block else os.WNOHANG)
        if p == 0:
            return
        kids.discard(p)
        e = os.waitstatus_to_exitcode(st)
        codes[e] = codes.get(e, 0) + 1
for i in range(n):
    pid = os.fork()
    if pid == 0:
        u.sendto(b"%d" % i, dst)
        if i % 100 == 0:
            c.sendall(b"kid %d\n" % i)
        if i % 4 == 0:
            libc.exit(i % 3)
        os._exit(i % 3)
    kids.add(pid)
    reap(False)
    if i == 99:
        reap(True)
        before = fds()
reap(True)
after = fds()
print("forked", n, "exit codes", sorted(codes.items()), flush=True)
print("fds", "not grown" if after <= before else "grew from %d to %d" % (before, after), flush=True)
print("fds at the 100th fork", before, "at the end", after, file=sys.stderr, flush=True)
c.sendall(b"done\n")
d, src = u.recvfrom(64)
u.sendto(b"pong " + d, src)
print("stormed", flush=True)
print("then", repr(readline(c)), flush=True)
while u.recv(64) != b"quit":
    pass
"#;

const STORM_CLIENT: &str = r#"import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
n = 1000
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)
u.bind(("0.0.0.0", 0))
u.settimeout(30)
c = socket.create_connection((addr, port), timeout=60)
c.sendall(b"udp %d\n" % u.getsockname()[1])
lines = []
while True:
    l = readline(c)
    if l in (b"done\n", b""):
        break
    lines.append(l)
got = []
u.settimeout(0.5)
try:
    while True:
        got.append(u.recv(64))
except TimeoutError:
    pass
u.settimeout(30)
u.sendto(b"ping", (addr, port))
pong = u.recv(64)
lines_ok = sorted(lines) == sorted(b"kid %d\n" % i for i in range(0, n, 100))
got_ok = len(got) == n and set(got) == {b"%d" % i for i in range(n)}
print("tcp lines", len(lines), lines_ok)
print("datagrams", len(got), "distinct", len(set(got)), got_ok)
print(pong.decode())
print("all ok" if lines_ok and got_ok and pong == b"pong ping" else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_fork_storm_of_1000_children_leaks_nothing_and_answers_as_plainly() {
    let srv = &format!("{READLINE}{STORM}");
    let server = |addr: &str, port: &str| {
        ["python3", "-c", srv, addr, port]
            .into_iter()
            .map(String::from)
            .collect()
    };
    placed(
        "pstm",
        "storm",
        &server,
        STORM_CLIENT,
        14740,
        &mut |p, l, s, port| {
            let pid = u64::from(s.child.id());
            match p {
                Placement::Plain => {}
                Placement::Own => {
                    let iface = l.iface(Host::B);
                    let pids: Vec<Option<u64>> = nanowire_testkit::engines_on(nanowire(), &iface)
                        .iter()
                        .map(nanowire_testkit::engine_pid)
                        .collect();
                    assert!(
                        pids.iter().all(|&e| e == Some(pid)),
                        "engines on {iface} other than the server's ({pid}): {pids:?}"
                    );
                }
                Placement::Service => {
                    let out = nanowire_testkit::ok(
                        &plain_in(l, Host::B, &[nanowire(), "engine", "status"])
                            .output()
                            .unwrap(),
                    );
                    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
                    let ifc = &st["ifaces"][0];
                    let pids = |v: &serde_json::Value| -> Vec<u64> {
                        v.as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c["pid"].as_u64())
                            .collect()
                    };
                    assert_eq!(pids(&ifc["clients"]), [pid], "the service's clients: {st}");
                    let groups = ifc["tcp_listener_groups"].as_array().unwrap();
                    assert!(
                        groups.iter().all(|g| pids(&g["members"]) == [pid]),
                        "the listener group's members: {st}"
                    );
                }
            }
            let quit = "import socket, sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'quit', (sys.argv[1], int(sys.argv[2])))";
            output(
                plain_in(
                    l,
                    Host::A,
                    &["python3", "-c", quit, &ADDR_B.to_string(), port],
                ),
                "quit",
            );
        },
    );
}

/// Issue 24 item 4, a multi-threaded process calling fork: two threads
/// wait on the server's sockets (one in `recvfrom` on a bound UDP socket,
/// one in `recv` on a connection), echoing what comes, while the main
/// thread forks 20 children one after the other (each sends one datagram
/// on the inherited UDP socket and exits). The client's 300 datagrams and
/// 300 lines must each be echoed, as plainly: under run the fork's
/// prepare handler takes the UDP socket off the engine under the waiting
/// thread (which carries on from the kernel socket, queued datagrams
/// first), and the connection stays on the engine (no child uses it).
const THREADED_FORK: &str = r#"import os, socket, sys, threading, time
addr, port = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind((addr, port))
ls = listener()
c, (peer, _) = ls.accept()
got = []
def udp_echo():
    while True:
        d, src = u.recvfrom(64)
        if d == b"stop":
            return
        got.append(d)
        u.sendto(b"echo " + d, src)
def tcp_echo():
    while True:
        l = readline(c)
        if l in (b"", b"stop\n"):
            return
        c.sendall(b"echo " + l)
ts = [threading.Thread(target=udp_echo), threading.Thread(target=tcp_echo)]
for t in ts: t.start()
time.sleep(0.2)
codes = []
for k in range(20):
    pid = os.fork()
    if pid == 0:
        u.sendto(b"child %d" % k, (peer, 9))
        os._exit(k % 3)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    time.sleep(0.01)
print("forked 20 from a threaded program", codes, flush=True)
for t in ts: t.join()
print("udp echoed", len(got), flush=True)
"#;

const THREADED_FORK_CLIENT: &str = r#"import socket, sys, time
addr, port = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(10)
c = socket.create_connection((addr, port), timeout=10)
ok = 0
for i in range(300):
    u.sendto(b"%d" % i, (addr, port))
    ok += u.recv(64) == b"echo %d" % i
    c.sendall(b"%d\n" % i)
    ok += readline(c) == b"echo %d\n" % i
u.sendto(b"stop", (addr, port))
c.sendall(b"stop\n")
print("answers", ok, "of 600")
print("all ok" if ok == 600 else "SOME BAD", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn a_threaded_program_forking_while_its_threads_wait_serves_as_plainly() {
    let progs = (THREADED_FORK, THREADED_FORK_CLIENT);
    three_ways("pthf", "threaded-fork", progs, 14750, &[]);
}

/// Issue 24 item 4, `clone()` called by the program
/// (crates/preload/tests/clone_files.c): children made with
/// clone(CLONE_FILES) and with a plain clone (no pthread_atfork handler
/// runs for either) each read one datagram of the socket the parent
/// serves; the answers must be the plain ones. Before the shim
/// interposed `clone`, the CLONE_FILES child read the datagram from its
/// copy of the engine's ring and the parent read the same one again
/// (the next was lost). Each child is made once its datagram is queued
/// (poll): under run it was then on the engine's queue, and went into the
/// parent's stash when the socket went to the kernel, where the child
/// never looked (session 21: the CI saw "two no answer" when the race
/// fell that way); now it is shown to the kernel socket again.
const CLONE_CLIENT: &str = r#"
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(20)
for w in ["one", "two", "three", "four", "five"]:
    u.sendto(w.encode(), (addr, port))
    try:
        print(u.recv(300).decode())
    except TimeoutError:
        print(w, "no answer")
print("all ok", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn children_made_by_clone_read_the_parents_socket_as_plainly() {
    let bin = shim_and_c("clone_files", "../preload/tests/clone_files.c");
    let server = |addr: &str, port: &str| vec![bin.clone(), addr.to_string(), port.to_string()];
    let logs = placed(
        "pcln",
        "clone",
        &server,
        CLONE_CLIENT,
        14760,
        &mut |_, _, _, _| {},
    );
    assert_eq!(
        logs.matches("clone(CLONE_FILES): the child shares this fd table")
            .count(),
        2,
        "{logs}"
    );
}

/// Issue 24 item 5: `nanowire stats` names every socket a forked child
/// shares with its parent, while both hold it: a bound UDP socket and an
/// accepted connection the child never uses (each stays on the parent's
/// engine: owner, one other holder, both pids; the UDP socket's kernel
/// twin, bound in the kernel's table, is not listed a second time). When the child exits
/// (SIGTERM, its handler `_exit`s) neither is listed any more while the
/// parent still holds both; the parent then answers as plainly. Plain,
/// own engine, service: the client's and the server's outputs are equal.
const SHARED_SRV: &str = r#"
import os, signal, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
ls = listener()
c, _ = ls.accept()
req = recv_line(c)
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    os.write(2, b"child ready\n")
    while True:
        signal.pause()
os.write(2, b"server %d child %d\n" % (os.getpid(), pid))
_, st = os.waitpid(pid, 0)
print("child gone", file=sys.stderr, flush=True)
d, peer = u.recvfrom(100)
c.sendall(b"got " + req + d + b"\n")
c.close()
print("served", d, os.waitstatus_to_exitcode(st), flush=True)
"#;

const SHARED_CLIENT: &str = r#"
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
c.sendall(b"hello\n")
print(recv_line(c), flush=True)
print("all ok", flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn stats_names_the_sockets_a_forked_child_shares_until_it_exits() {
    nanowire_testkit::require(&["python3"]);
    let l = &lab("pshr");
    let (srv, cli) = (
        format!("{READLINE}{SHARED_SRV}"),
        format!("{READLINE}{SHARED_CLIENT}"),
    );
    let addr = ADDR_B.to_string();
    let stats = |json: bool| {
        let mut argv = vec![nanowire(), "stats"];
        argv.extend(json.then_some("--json"));
        let o = plain_in(l, Host::B, &argv).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // The shared sockets naming pid `p`.
    let shared_by = |p: u64| -> Vec<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_str(&stats(true)).unwrap_or_default();
        v["shared_sockets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["pids"].as_array().is_some_and(|a| a.contains(&p.into())))
            .cloned()
            .collect()
    };
    let (mut want, mut want_srv) = (None, None);
    for (i, p) in Placement::ALL.into_iter().enumerate() {
        let port = (14790 + i as u16).to_string();
        let mut s = spawn(
            &format!("shared-{p:?}"),
            p.command(l, Host::B, &["python3", "-c", &srv, &addr, &port]),
        );
        s.wait_for("listening", T);
        let mut c = spawn(
            &format!("shared-{p:?}-cli"),
            plain_in(l, Host::A, &["python3", "-c", &cli, &addr, &port]),
        );
        // The child's SIGTERM handler is in place before the signal below
        // (plainly it was once not yet: the child died of the signal, -15,
        // session 27's CI).
        s.wait_until("its child's pid and handler", T, |k| {
            let e = k.stderr();
            e.lines().any(|x| x.starts_with("server ")) && e.lines().any(|x| x == "child ready")
        });
        let err = s.stderr();
        let ids: Vec<u64> = line_of(&err, "server ")
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let (me, kid) = (ids[0], ids[1]);
        let local = format!("{ADDR_B}:{port}");
        if p != Placement::Plain {
            let mut seen = Vec::new();
            let both = until(T, || {
                seen = shared_by(kid);
                let udp = seen.iter().any(|x| {
                    x["proto"] == "udp"
                        && x["local"] == local.as_str()
                        && x["remote"].is_null()
                        && x["on"] == "engine"
                        && x["owner"] == me
                        && x["holders"] == 1
                        && x["pids"] == serde_json::json!([me, kid])
                });
                let tcp = seen.iter().any(|x| {
                    x["proto"] == "tcp"
                        && x["local"] == local.as_str()
                        && x["remote"].is_string()
                        && x["on"] == "engine"
                        && x["owner"] == me
                        && x["holders"] == 1
                        && x["pids"] == serde_json::json!([me, kid])
                });
                udp && tcp
            });
            assert!(both, "{p:?}: not both listed: {seen:?}\n{}", s.both());
            let udp_lines = seen.iter().filter(|x| x["proto"] == "udp").count();
            assert_eq!(udp_lines, 1, "{p:?}: the UDP socket listed twice: {seen:?}");
            let text = stats(false);
            for want in [
                format!(
                    "udp {local} shared by pid {me} (owner), pid {kid}: on the engine of pid {me} (1 other holder(s))"
                ),
                format!("tcp {local} <-> {}:", nanowire_lab::testbed::ADDR_A),
                format!(
                    "shared by pid {me} (owner), pid {kid}: on the engine of pid {me} (1 other holder(s))"
                ),
            ] {
                assert!(text.contains(&want), "{p:?}: no {want:?} in\n{text}");
            }
        }
        // SAFETY: kill(2) of the server's child, a process of this test.
        unsafe { libc::kill(kid as i32, libc::SIGTERM) };
        s.wait_for("child gone", T);
        if p != Placement::Plain {
            let mut seen = Vec::new();
            let gone = until(T, || {
                seen = shared_by(me);
                seen.is_empty()
            });
            assert!(gone, "{p:?}: still listed after the child's exit: {seen:?}");
        }
        let go = format!(
            "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'go', ('{addr}', {port}))"
        );
        output(plain_in(l, Host::A, &["python3", "-c", &go]), "go");
        c.success(T);
        s.success(T);
        let ctx = format!("server ({p:?}):\n{}", s.both());
        same_as_first(&mut want, "shared: client", c.stdout(), &ctx);
        same_as_first(&mut want_srv, "shared: server", s.stdout(), &ctx);
    }
    assert!(want.unwrap().contains("all ok"));
}

/// The first image: a listener (the engine's first TCP stack, which starts
/// the warden: `posix_spawn` of `nanowire engine warden`), then, once the
/// warden's spawn child exists (a process whose parent is this one; with
/// the test hook it waits before its exec, holding its copies of this
/// process's fds), exec of the second image, a listener on port + 1 that
/// answers one connection.
const SPAWN_THEN_EXEC: &str = r#"import os, socket, sys, time
addr, port = sys.argv[1], int(sys.argv[2])
if len(sys.argv) > 3:
    s = listener()
    c, _ = s.accept()
    c.sendall(readline(c))
    c.close()
    sys.exit(0)
s = socket.socket()
s.bind((addr, port))
s.listen(8)
me = str(os.getpid())
def child():
    for p in os.listdir("/proc"):
        try:
            st = open("/proc/%s/status" % p).read()
        except OSError:
            continue
        if p.isdigit() and p != me and "\nPPid:\t%s\n" % me in st:
            return True
    return False
end = time.time() + 60
while not child() and time.time() < end:
    time.sleep(0.01)
print("spawn child", child(), flush=True)
prog = READLINE_SRC + SELF
os.execv(sys.executable, [sys.executable, "-c", prog, addr, str(port + 1), "again"])
"#;

/// Issue 24, session 21's fix 522d642 made deterministic: an exec right
/// after the first TCP stack, while the warden's `posix_spawn` child still
/// holds copies of the engine's fds (the XDP link's and AF_XDP sockets'),
/// must wait for it (`warden::settle`): else the new image's attach is
/// refused (the interface still held) and its listener stays the
/// kernel's. The test hook `NANOWIRE_TEST_WARDEN_SPAWN_FIFO` holds the
/// child before its exec until the test opens the FIFO, which it does once
/// the exec waits (the shim says so) or the new image listens.
#[test]
#[ignore = "needs root"]
fn an_exec_right_after_the_first_tcp_stack_waits_for_the_warden_spawn() {
    nanowire_testkit::require(&["python3", "mkfifo"]);
    let l = &lab("pwsp");
    let fifo = scratch("warden-spawn.fifo");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    let srv = format!(
        "READLINE_SRC = {:?}\nSELF = {:?}\n{READLINE}{SPAWN_THEN_EXEC}",
        READLINE, SPAWN_THEN_EXEC
    );
    let addr = ADDR_B.to_string();
    let port = 14796u16;
    let mut cmd = xdp_or_plain(
        l,
        Host::B,
        true,
        &["python3", "-c", &srv, &addr, &port.to_string()],
    );
    cmd.env("NANOWIRE_TEST_WARDEN_SPAWN_FIFO", &fifo);
    let mut s = spawn("spawn-exec", cmd);
    s.wait_until("the exec", T, |k| {
        k.stderr().contains("waiting for the warden's start") || k.stdout().contains("listening")
    });
    // Let the warden's spawn child go on (O_RDWR: no wait for a reader).
    let _w = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    s.wait_for("listening", T);
    let cli = format!(
        "{READLINE}import socket, sys\nc = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)\nc.sendall(b'hello\\n')\nprint(readline(c).decode().strip(), flush=True)\n"
    );
    let port1 = (port + 1).to_string();
    let o = plain_in(l, Host::A, &["python3", "-c", &cli, &addr, &port1])
        .output()
        .unwrap();
    s.success(T);
    assert_eq!(nanowire_testkit::ok(&o), "hello\n");
    let out = s.stdout();
    assert!(out.contains("spawn child True"), "{}", s.both());
    assert!(
        s.stderr()
            .contains("exec: waiting for the warden's start in flight"),
        "the exec did not come while the warden's spawn was in flight:\n{}",
        s.both()
    );
    on_engine(&s, &format!("tcp listener {ADDR_B}:{port1}"));
}

/// A listener (so its engine is open), then a fork: the child prints its
/// resident memory and the parent's, read in the child right after the
/// fork (the parent waits for it).
const FORK_RSS_PY: &str = r#"
import os, socket, sys
def rss(pid):
    for l in open("/proc/%d/status" % pid):
        if l.startswith("VmRSS:"):
            return int(l.split()[1])
ls = socket.socket(); ls.bind((sys.argv[1], int(sys.argv[2]))); ls.listen(4)
parent = os.getpid()
pid = os.fork()
if pid == 0:
    print("child", rss(os.getpid()), "parent", rss(parent), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"#;

/// Session 26: a forked child does not get a copy of its parent's packet
/// memory. The engine's own UMEM is private memory the kernel pins for
/// AF_XDP, and a fork copied the pinned pages whole into the child (~40
/// ms per fork for one queue's 32 MiB: a fork-per-connection server's
/// every answer waited for it; `MADV_DONTFORK` now). Plainly the child's
/// resident memory is about the parent's; under run (own engine) it is
/// at least the UMEM's 32 MiB below the parent's (the child's own pages
/// are Python's, as plainly).
#[test]
#[ignore = "needs root"]
fn a_forked_child_gets_no_copy_of_the_engines_packet_memory() {
    const UMEM_KIB: u64 = 32 * 1024;
    let lab = lab("fr");
    let b = ADDR_B.to_string();
    for (run, port) in with_ports(15400, [false, true]) {
        let args = ["python3", "-c", FORK_RSS_PY, &b, &port];
        let out = output(run_or_plain(&lab, Host::B, run, &args), "fork rss");
        let line = line_of(&out, "child");
        let w: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let (child, parent) = (w[0], w[1]);
        eprintln!("run={run}: child {child} KiB, parent {parent} KiB");
        if run {
            assert!(
                child + UMEM_KIB <= parent,
                "run: the child holds {child} KiB, its parent {parent} KiB:\n{out}"
            );
        }
    }
}

/// A UDP server that daemonizes as C daemons do (`daemon(3)`, dnsmasq):
/// it binds, forks; the child calls setsid and forks again and exits; the
/// grandchild (the daemon) says it is up through a pipe and serves; the
/// parent waits for that, prints "listening" and `_exit`s without closing
/// the socket. `now`: the daemon serves at once (its first use may come
/// while the parent lives: on the service the socket moves to the
/// daemon's engine, the parent never having used it since the fork);
/// `after`: the daemon waits until the parent is gone (EOF on a pipe only
/// the parent holds), so the parent's exit leaves the socket to it. The
/// daemon writes its pid on stderr and echoes until a "bye".
const UDP_DAEMON_SRV: &str = r#"
import os, socket, sys
addr, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
r, w = os.pipe()
gr, gw = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    os.close(r); os.close(gw)
    sys.stderr.write("daemon %d\n" % os.getpid()); sys.stderr.flush()
    os.write(w, b"up"); os.close(w)
    if mode == "after":
        os.read(gr, 1)
    while True:
        d, peer = u.recvfrom(2048)
        if d == b"bye":
            os._exit(0)
        u.sendto(b"echo " + d, peer)
os.close(w); os.close(gr)
os.waitpid(pid, 0)
os.read(r, 2)
print("listening", flush=True)
os._exit(0)
"#;

const UDP_DAEMON_CLIENT: &str = r#"
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(1)
got = [udp_ask(c, b"datagram %d" % k, (addr, port), 10) for k in range(100)]
ok = all(g == b"echo datagram %d" % k for k, g in enumerate(got))
print("100 echoed", flush=True)
print("all ok" if ok else "SOME BAD", flush=True)
"#;

/// [`daemonized`]'s check: (placement, mode, lab, server, port, daemon pid).
type DaemonCheck<'a> = &'a dyn Fn(Placement, &str, &ScopedLab, &Kid, &str, u32);

/// The daemonizing server `srv` (Python after [`READLINE`]; argv: address,
/// port, mode) in both modes ("now", "after"), in each placement, lab
/// tag `tag` + the mode's index, ports from `port` (+10 for "after"), with
/// the plain client `cli`: `check(placement, mode, lab, server, port,
/// daemon pid)` runs once the client is done (it ends the daemon if the
/// daemon waits for that), then the daemon must end. Returns each mode's
/// logs ([`placed`]).
fn daemonized(
    (tag, name): (&str, &str),
    (srv, cli): (&str, &str),
    port: u16,
    check: DaemonCheck,
) -> Vec<(&'static str, String)> {
    let srv = format!("{READLINE}{srv}");
    let mut all = Vec::new();
    for (i, mode) in ["now", "after"].into_iter().enumerate() {
        let server = |addr: &str, port: &str| {
            ["python3", "-c", &srv, addr, port, mode]
                .map(String::from)
                .to_vec()
        };
        let logs = placed(
            &format!("{tag}{i}"),
            &format!("{name}-{mode}"),
            &server,
            cli,
            port + 10 * i as u16,
            &mut |p, l, s, port| {
                let err = s.stderr();
                let daemon: u32 = err
                    .lines()
                    .find_map(|x| x.strip_prefix("daemon "))
                    .and_then(|x| x.trim().parse().ok())
                    .unwrap_or_else(|| panic!("{p:?}: no daemon pid:\n{err}"));
                check(p, mode, l, s, port, daemon);
                assert!(
                    until(T, || !std::path::Path::new(&format!("/proc/{daemon}"))
                        .exists()),
                    "{p:?} {mode}: the daemon did not end"
                );
            },
        );
        eprintln!("{logs}");
        all.push((mode, logs));
    }
    all
}

/// Engine counter `key` of process `pid` reaches `min` (counters are
/// published every few turns: waited for, bounded); else a failure that
/// says `what` and the server's output.
fn counter_reaches(pid: u32, key: &str, min: u64, (what, s): (&str, &Kid)) {
    let v = || {
        nanowire_testkit::engine_counters_of(nanowire(), pid)
            .and_then(|v| v[key].as_u64())
            .unwrap_or(0)
    };
    assert!(
        until(T, || v() >= min),
        "{what}: {key} of the engine of pid {pid} {} (wanted {min})\n{}",
        v(),
        s.both()
    );
}

/// The datagrams process `pid`'s engine served reach `min`: those its
/// rings carried (`rx_packets`) and those its sockets read from the kernel
/// socket (`rx_kernel_path`: a datagram that came in between the holder's
/// exit and the daemon's first use, while no engine claimed the port, waits
/// on the kernel socket and is read from there). Waited for, bounded, as
/// [`counter_reaches`].
fn served_reaches(pid: u32, min: u64, (what, s): (&str, &Kid)) {
    let v = || {
        let Some(e) = nanowire_testkit::engine_of(nanowire(), pid) else {
            return (0, 0);
        };
        let kernel = e["sockets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["counters"]["rx_kernel_path"].as_u64())
            .sum::<u64>();
        (e["counters"]["rx_packets"].as_u64().unwrap_or(0), kernel)
    };
    assert!(
        until(T, || {
            let (rings, kernel) = v();
            rings + kernel >= min
        }),
        "{what}: the engine of pid {pid} served {:?} (rings, kernel socket; wanted {min} in all)\n{}",
        v(),
        s.both()
    );
}

#[test]
#[ignore = "needs root"]
fn a_daemonizing_udp_server_is_served_on_its_daemons_engine() {
    let runs = daemonized(
        ("pdm", "udp-daemon"),
        (UDP_DAEMON_SRV, UDP_DAEMON_CLIENT),
        14890,
        &|p, mode, l, s, port, daemon| {
            // Where the daemon's datagrams went: its own engine on the
            // service (moved or left to it), and on an engine of its own
            // once the parent is gone (`after`).
            if p == Placement::Service || (p == Placement::Own && mode == "after") {
                served_reaches(daemon, 100, (mode, s));
            }
            let bye = format!(
                "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'bye', ('{ADDR_B}', {port}))"
            );
            let _ = output(plain_in(l, Host::A, &["python3", "-c", &bye]), "bye");
        },
    );
    for (mode, logs) in runs {
        for run in logs.split("--- ").filter(|x| !x.is_empty()) {
            let say = |x: &str| run.matches(x).count();
            let here = say("inherited through fork(): on this process's xdp engine");
            match (run.starts_with("Service"), mode) {
                (true, _) | (false, "after") => assert_eq!(here, 1, "{mode}: {run}"),
                // On an engine of its own the parent's engine holds the
                // interface while it lives: the kernel's, unless the
                // parent's exit came first.
                _ => assert!(here <= 1, "{mode}: {run}"),
            }
        }
    }
}

/// A TCP server whose connection outlives the process that accepted it
/// (the shape of `ssh -f` and other programs that daemonize holding a
/// connection): it accepts one connection, closes the listener and forks;
/// the child calls setsid, forks again and exits; the grandchild (the
/// daemon) serves the connection; the first process reaps the child and
/// `_exit`s without closing it. `now`: the daemon serves at once (its first
/// use may come while the first process lives: on the service the
/// connection moves to the daemon's engine); `after`: the daemon waits
/// until the first process is gone (EOF on a pipe only it holds), so that
/// process's exit hands the connection to the kernel in the shared socket
/// and leaves it to the daemon, which takes it from the kernel onto its
/// engine on the service. The daemon answers 8 requests with chunks of up
/// to 400 kB (of SHA-256 digests), then "end", and closes.
const TCP_DAEMON_SRV: &str = r#"
import hashlib, os, socket, sys
addr, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
R = 8
def chunk(i):
    return hashlib.sha256(b"daemon %d" % i).digest() * (1 + (i * 7919) % 12500)
ls = listener()
c, _ = ls.accept()
ls.close()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    os.close(w)
    if mode == "after":
        os.read(r, 1)
    sys.stderr.write("daemon %d\n" % os.getpid()); sys.stderr.flush()
    for i in range(R):
        if readline(c) != b"q %d\n" % i:
            os._exit(1)
        c.sendall(chunk(i))
    c.sendall(b"end\n")
    c.close()
    os._exit(0)
os.close(r)
os.waitpid(pid, 0)
os._exit(0)
"#;

const TCP_DAEMON_CLIENT: &str = r#"
import hashlib, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
R = 8
def chunk(i):
    return hashlib.sha256(b"daemon %d" % i).digest() * (1 + (i * 7919) % 12500)
c = socket.create_connection((addr, port), timeout=60)
c.sendall(b"".join(b"q %d\n" % i for i in range(R)))
b = b"".join(chunks(c))
want = b"".join(chunk(i) for i in range(R)) + b"end\n"
print("total", len(b), hashlib.sha256(b).hexdigest()[:16])
print("all ok" if b == want else "SOME BAD", flush=True)
"#;

/// A connection whose first process exits while its daemon holds it is
/// served as plainly, and on the engine service stays accelerated: moved
/// to the daemon's engine (`now`), or taken from the kernel onto it after
/// the first process's exit handed it over (`after`; before session 32 the
/// kernel's from then on); on an engine of its own too once the first
/// process is gone (its engine held the interface while it lived).
#[test]
#[ignore = "needs root"]
fn a_connection_left_by_an_exiting_process_is_served_on_its_daemons_engine() {
    let runs = daemonized(
        ("ptd", "tcp-daemon"),
        (TCP_DAEMON_SRV, TCP_DAEMON_CLIENT),
        14970,
        &|p, mode, _, s, _, daemon| {
            // The answers went out of the daemon's engine (on an engine of
            // its own once the first process is gone: `after`).
            if p == Placement::Service || (p == Placement::Own && mode == "after") {
                counter_reaches(daemon, "tx_packets", 8, (mode, s));
            }
        },
    );
    for (mode, logs) in runs {
        for run in logs.split("--- ").filter(|x| !x.is_empty()) {
            let (moved, taken) = (
                run.matches(MOVED_IN).count(),
                run.matches(FROM_KERNEL).count(),
            );
            match (run.starts_with("Service"), mode) {
                (_, "after") => assert_eq!((moved, taken), (0, 1), "{mode}: {run}"),
                // Moved while the first process lived, or taken from the
                // kernel after it left: once either way.
                (true, _) => assert_eq!(moved + taken, 1, "{mode}: {run}"),
                // On an engine of its own the first process's engine holds
                // the interface while it lives: the kernel's, unless the
                // first process's exit came first.
                _ => assert!(moved == 0 && taken <= 1, "{mode}: {run}"),
            }
        }
    }
}

/// One thread binds a UDP socket to host b's address (under run its
/// engine opens there); a second later the main thread binds another to
/// loopback (under run a decision that opens nothing) and says whether the
/// first bind was still under way. (argv: addr port)
const BIND_WHILE_OPENING_PY: &str = r#"
import socket, sys, threading, time
addr, port = sys.argv[1], int(sys.argv[2])
done = threading.Event()
def engine_bind():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((addr, port))
    done.set()
t = threading.Thread(target=engine_bind)
t.start()
time.sleep(1)
lo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
lo.bind(("127.0.0.1", 0))
print("loopback bound while the other bind was under way:", not done.is_set(), flush=True)
t.join()
print("both bound", flush=True)
"#;

/// Session 35 (issue 22's lock rules): a UDP socket's engine opens before
/// the shim takes the lock that orders the process's placement decisions
/// (`accel::DECIDE`), so one thread's open (netlink, the program's attach,
/// an AF_XDP bind that may wait up to a second for a queue a just-exited
/// process leaves: here 5 s, `NANOWIRE_TEST_OPEN_DELAY_MS`) does not hold
/// up another thread's bind. Before, the loopback bind waited for the
/// other thread's open to end. Both sockets are as plainly: the first on
/// the engine, the loopback one the kernel's.
#[test]
#[ignore = "needs root"]
fn a_udp_bind_waits_for_no_other_threads_engine_open() {
    nanowire_testkit::require(&["python3"]);
    let l = &lab("pbwo");
    let addr = ADDR_B.to_string();
    let port = 15460u16;
    let mut cmd = xdp_or_plain(
        l,
        Host::B,
        true,
        &[
            "python3",
            "-c",
            BIND_WHILE_OPENING_PY,
            &addr,
            &port.to_string(),
        ],
    );
    cmd.env("NANOWIRE_TEST_OPEN_DELAY_MS", "5000");
    let mut s = spawn("bind-while-opening", cmd);
    s.wait_for("both bound", T);
    s.success(T);
    assert!(
        s.stdout()
            .contains("loopback bound while the other bind was under way: True"),
        "the loopback bind waited for the other thread's engine open:\n{}",
        s.both()
    );
    on_engine(&s, &format!("udp {ADDR_B}:{port}"));
}
