//! Shared helpers of the `run_*` integration tests: build the shim, start
//! children that are killed on drop, bounded waits, one lab per test.
#![allow(dead_code)]

use nanowire_lab::testbed::{Host, ScopedLab};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Compile the C test program `src` (relative to this crate) to `name`,
/// in a directory of this test process next to the `nanowire` binary (not
/// in world-writable /tmp: the tests run as root).
/// Its directory is removed when the binary exits (see [`scratch_dir`]).
pub fn build_c(name: &str, src: &str) -> PathBuf {
    let dir = c_dir();
    scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc (gcc) is needed for this test");
    assert!(st.success(), "compiling {} failed", src.display());
    bin
}

/// A scratch file removed when dropped (a test's big body goes when the
/// test ends, not with the binary's directory).
pub struct ScratchFile(pub PathBuf);

impl std::ops::Deref for ScratchFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// [`build_c`]'s directory of this test binary: `c-tests-<pid>` next to
/// the `nanowire` binary.
fn c_dir() -> PathBuf {
    Path::new(nanowire())
        .parent()
        .unwrap()
        .join(format!("c-tests-{}", std::process::id()))
}

/// Remove [`build_c`] directories of test binaries that are gone (beside
/// the `nanowire` binary in the target directory: not world-writable).
fn sweep_c_dirs() {
    let dir = Path::new(nanowire()).parent().unwrap();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let pid = name.to_str().and_then(|n| n.strip_prefix("c-tests-"));
        let Some(pid) = pid.and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: kill with signal 0 sends nothing; it only asks whether
        // the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && pid as u32 != std::process::id() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// `nanowire ARGS` run here (no lab) to its end: its output.
pub fn nanowire_out(args: &[&str]) -> std::process::Output {
    Command::new(nanowire()).args(args).output().unwrap()
}

/// The shim built and the C test program `src` compiled as `name`
/// ([`build_c`]): the program's path.
pub fn shim_and_c(name: &str, src: &str) -> String {
    ensure_preload();
    build_c(name, src).to_string_lossy().into_owned()
}

pub fn nanowire() -> &'static str {
    env!("CARGO_BIN_EXE_nanowire")
}

/// Build `libnanowire_preload.so` next to the `nanowire` binary (cargo
/// does not build a cdylib for another package's tests) and, for a release
/// build, with the `shim` profile in `target/shim/` (fat LTO, as shipped:
/// `nanowire run` takes that one, `nanowire_run::cli::preload_beside`). Once per test
/// binary; fast when up to date, but under load (and when the workspace
/// build unified other features) it can take tens of seconds: a test must
/// not start a peer with a deadline (an alarm, a read window) before its
/// first `run_in`, or the peer can die before the program under run sends
/// (dropin_matrix drop_membership_stops_the_group: the sender's alarm(30)
/// went off 52 s after it was ready, the request met no socket). [`lab`]
/// calls it first.
pub fn ensure_preload() -> PathBuf {
    static DONE: OnceLock<PathBuf> = OnceLock::new();
    DONE.get_or_init(|| {
        let exe = Path::new(nanowire());
        let dir = exe.parent().unwrap().to_path_buf();
        let release = dir.file_name().is_some_and(|n| n == "release");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-q", "-p", "nanowire-preload", "--manifest-path"])
            .arg(&manifest);
        if release {
            c.arg("--release");
        }
        let st = c.status().expect("run cargo build for the preload library");
        assert!(st.success(), "building nanowire-preload failed");
        let mut so = dir.join("libnanowire_preload.so");
        if release {
            let st = Command::new(env!("CARGO"))
                .args(["build", "-q", "-p", "nanowire-preload", "--profile"])
                .arg(nanowire_run::cli::SHIM_PROFILE)
                .arg("--manifest-path")
                .arg(&manifest)
                .status()
                .expect("run cargo build for the preload library (shim profile)");
            assert!(
                st.success(),
                "building nanowire-preload (shim profile) failed"
            );
            // Built last, so `nanowire run` takes it (`preload_beside`: the
            // newer of the two) even when cargo found it up to date and
            // only relinked the release copy (the `-p` build above unifies
            // fewer features than the workspace's, so it relinks often).
            let lto = dir
                .join("..")
                .join(nanowire_run::cli::SHIM_PROFILE)
                .join("libnanowire_preload.so");
            std::fs::File::options()
                .write(true)
                .open(&lto)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()))
                .unwrap_or_else(|e| panic!("touch {}: {e}", lto.display()));
            so = nanowire_run::cli::preload_beside(exe).expect("the shim after its build");
            assert!(
                so.parent().and_then(|d| d.file_name())
                    == Some(nanowire_run::cli::SHIM_PROFILE.as_ref()),
                "nanowire run would not take the shim profile's build: {}",
                so.display()
            );
        }
        assert!(so.is_file(), "{} missing after the build", so.display());
        so
    })
    .clone()
}

/// A child process killed (and reaped) when dropped; its output goes to
/// files so nothing blocks on a full pipe.
pub struct Kid {
    pub child: Child,
    pub name: String,
    pub out: PathBuf,
    pub err: PathBuf,
}

/// A path for `name` in this test process's private scratch directory
/// (fresh, mode 0700, checked to be ours: never a predictable /tmp path).
pub fn scratch(name: &str) -> PathBuf {
    scratch_dir().join(name)
}

/// The tags of the private directories (`nanowire_lab::tmp::private_dir`)
/// the test binaries make in the temporary directory: swept when their
/// process is gone.
pub const SCRATCH_TAGS: &[&str] = &[
    "nanowire-ts-",
    "nanowire-dropin-",
    "nwcap",
    "nw-report-",
    "nwout-",
    "tb_fulllog-",
    "nanowire-report-capture-",
    "nanowire-tmp-test-",
];

/// This test process's private scratch directory. Made once per test
/// binary; first the directories of test binaries that are gone are
/// removed ([`SCRATCH_TAGS`], `nanowire_lab::tmp::sweep_stale`: a binary
/// killed by a timeout never removes its own), and this one goes when the
/// binary exits ([`remove_scratch_at_exit`]).
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        nanowire_lab::tmp::sweep_stale(SCRATCH_TAGS, Duration::from_secs(60));
        sweep_c_dirs();
        let d = nanowire_lab::tmp::private_dir("nanowire-ts").unwrap();
        remove_scratch_at_exit(d.clone());
        d
    })
}

/// Remove `dir` (and [`build_c`]'s directory) when this test binary exits
/// (libtest ends with `exit`, which runs `atexit` handlers): all of it if
/// no test failed, otherwise only its files over 1 MiB (the failure's
/// outputs stay for a look; the next binary's sweep removes the rest once
/// this process is gone). `NANOWIRE_KEEP_SCRATCH=1` keeps everything.
fn remove_scratch_at_exit(dir: PathBuf) {
    static AT_EXIT: OnceLock<PathBuf> = OnceLock::new();
    static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if std::env::var_os("NANOWIRE_KEEP_SCRATCH").is_some_and(|v| v == "1")
        || AT_EXIT.set(dir).is_err()
    {
        return;
    }
    let next = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        next(info)
    }));
    extern "C" fn at_exit() {
        let Some(dir) = AT_EXIT.get() else { return };
        let _ = std::fs::remove_dir_all(c_dir());
        if !FAILED.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = std::fs::remove_dir_all(dir);
            return;
        }
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.metadata().is_ok_and(|m| m.is_file() && m.len() > 1 << 20) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    // SAFETY: atexit only records a function pointer; `at_exit` is an
    // `extern "C" fn` that does not unwind (its removals return errors).
    unsafe { libc::atexit(at_exit) };
}

pub fn spawn(name: &str, mut cmd: Command) -> Kid {
    let out = scratch(&format!("{name}.out"));
    let err = scratch(&format!("{name}.err"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    Kid {
        child,
        name: name.to_string(),
        out,
        err,
    }
}

impl Kid {
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }
    pub fn both(&self) -> String {
        format!("{}{}", self.stdout(), self.stderr())
    }
    /// Wait for exit, at most `limit`; panics with the output on timeout.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                    self.name,
                    self.stdout(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    /// Wait until the output contains `needle`, at most `limit`.
    pub fn wait_for(&mut self, needle: &str, limit: Duration) {
        self.wait_until(&format!("printing {needle:?}"), limit, |k| {
            k.both().contains(needle)
        });
    }
    /// Wait until `cond` holds (asked every 20 ms), at most `limit`; the
    /// test fails naming `what` if it does not, or if the process exits
    /// first.
    pub fn wait_until(&mut self, what: &str, limit: Duration, mut cond: impl FnMut(&Kid) -> bool) {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if cond(self) {
                return;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("{} exited ({st}) before {what}\n{}", self.name, self.both());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{}: no {what} within {limit:?}\n{}", self.name, self.both());
    }
    /// Finish successfully within `limit`, or panic with the output.
    pub fn success(&mut self, limit: Duration) -> String {
        let st = self.wait(limit);
        let all = self.both();
        assert!(st.success(), "{} failed ({st}):\n{all}", self.name);
        all
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        // nginx's workers outlive a master killed with SIGKILL (they are
        // reparented to init and keep serving): stop it as its operator
        // does, SIGTERM (the master stops its workers), and kill only if
        // it has not gone within 3 s.
        if self.name.contains("nginx") && matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `c` to its end: its stdout and stderr, one after the other; the
/// test fails (naming `what`, with both) if it did not succeed.
#[track_caller]
pub fn output(mut c: Command, what: &str) -> String {
    let o = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{what} failed ({}):\n{all}", o.status);
    all
}

/// The lines of file `path` (a trace a test made).
pub fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

/// Poll `cond` every 20 ms until it holds or `limit` has passed: whether
/// it held.
pub fn until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A lab named `ts<tag><pid>` (unique per test and process), removed on drop.
/// The preload library is built (checked) first: never between a peer's
/// start and the program under run (see [`ensure_preload`]).
pub fn lab(tag: &str) -> ScopedLab {
    ensure_preload();
    nanowire_testkit::lab(&format!("ts{tag}"))
}

/// `nanowire run ARGS -- CMD...` inside lab host `h`.
pub fn run_in(lab: &ScopedLab, h: Host, run_args: &[&str], cmd: &[&str]) -> Command {
    ensure_preload();
    let mut argv: Vec<&str> = vec![nanowire(), "run"];
    argv.extend_from_slice(run_args);
    argv.push("--");
    argv.extend_from_slice(cmd);
    lab.command(h, &argv)
}

/// A plain command inside lab host `h`.
pub fn plain_in(lab: &ScopedLab, h: Host, cmd: &[&str]) -> Command {
    lab.command(h, cmd)
}

/// `cmd` in host `h`: under `nanowire run` (its defaults) when `run`,
/// else plainly.
pub fn run_or_plain(lab: &ScopedLab, h: Host, run: bool, cmd: &[&str]) -> Command {
    if run {
        run_in(lab, h, &[], cmd)
    } else {
        plain_in(lab, h, cmd)
    }
}

/// Each case of `cases` with a port of its own, `first` upward: the
/// placements a test compares (`with_ports(14100, [false, true])`: plainly
/// on 14100, under run on 14101), or the XDP attach modes.
pub fn with_ports<T>(
    first: u16,
    cases: impl IntoIterator<Item = T>,
) -> impl Iterator<Item = (T, String)> {
    cases
        .into_iter()
        .zip(first..)
        .map(|(c, port)| (c, port.to_string()))
}

/// `case(run, port)` plainly, then under run (`run` true), each on a port
/// of its own from `first` ([`with_ports`]): what each returned, plainly
/// first, for the test to compare.
pub fn plain_and_run(first: u16, mut case: impl FnMut(bool, &str) -> String) -> [String; 2] {
    let mut outs = with_ports(first, [false, true]).map(|(run, port)| case(run, &port));
    [(); 2].map(|()| outs.next().expect("two placements"))
}

/// `sockperf sr ARGS` in host b under `nanowire run RUN_ARGS` (log level
/// info), named `name`, once it waits on its socket.
pub fn sockperf_sr_run(lab: &ScopedLab, name: &str, run_args: &[&str], args: &[&str]) -> Kid {
    let argv = [&["sockperf", "sr"], args].concat();
    let mut cmd = run_in(lab, Host::B, run_args, &argv);
    cmd.env("NANOWIRE_LOG", "info");
    let mut k = spawn(name, cmd);
    k.wait_for("to block on socket", Duration::from_secs(20));
    k
}

/// `cmd` in host `h`: under `nanowire run --engine xdp -o log=info` when
/// `run`, else plainly.
pub fn xdp_or_plain(lab: &ScopedLab, h: Host, run: bool, cmd: &[&str]) -> Command {
    if run {
        run_in(lab, h, &["--engine", "xdp", "-o", "log=info"], cmd)
    } else {
        plain_in(lab, h, cmd)
    }
}

/// A server (`srv`, in host `sh`) and a client (`cli`, in host `ch`), each
/// under `nanowire run --engine xdp` when its flag says so: the server
/// waited for until it prints `listening`, the client run to success, then
/// the server, each within `limit`. Both are returned, finished.
pub fn server_then_client(
    lab: &ScopedLab,
    name: &str,
    (sh, srv_run, srv): (Host, bool, &[&str]),
    (ch, cli_run, cli): (Host, bool, &[&str]),
    limit: Duration,
) -> (Kid, Kid) {
    let mut s = spawn(&format!("{name}-srv"), xdp_or_plain(lab, sh, srv_run, srv));
    s.wait_for("listening", limit);
    let mut c = spawn(&format!("{name}-cli"), xdp_or_plain(lab, ch, cli_run, cli));
    c.success(limit);
    s.success(limit);
    (s, c)
}

/// [`server_then_client`] of one Python script (`script`, a path) in its
/// two roles: `python3 SCRIPT SRV…` in host b, `python3 SCRIPT CLI…` in
/// host a.
pub fn script_pair(
    lab: &ScopedLab,
    (name, script): (&str, &str),
    (srv_run, srv): (bool, &[&str]),
    (cli_run, cli): (bool, &[&str]),
    limit: Duration,
) -> (Kid, Kid) {
    let py = ["python3", script];
    let (srv, cli) = ([&py[..], srv].concat(), [&py[..], cli].concat());
    server_then_client(
        lab,
        name,
        (Host::B, srv_run, &srv),
        (Host::A, cli_run, &cli),
        limit,
    )
}

/// A program under run put socket `what` (`tcp listener ADDR:PORT`, `->
/// ADDR:PORT`) on the engine: the shim says so at log level info.
#[track_caller]
pub fn on_engine(k: &Kid, what: &str) {
    let err = k.stderr();
    assert!(
        err.contains(&format!("{what}: xdp")),
        "{} not on the engine:\n{err}",
        k.name
    );
}

/// The line of `out` that starts with `key`.
#[track_caller]
pub fn line_of<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|x| x.starts_with(key))
        .unwrap_or_else(|| panic!("no {key:?} line in:\n{out}"))
}

/// A UDP echo server (argv: addr port): prints `ready` once bound, echoes
/// every datagram, but answers `rss` with its VmRSS in KiB.
pub const UDP_ECHO_PY: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    d, a = s.recvfrom(65536)
    if d == b"rss":
        d = open("/proc/self/status").read().split("VmRSS:")[1].split()[0].encode()
    s.sendto(d, a)
"#;

/// A Python program for the memory-bound tests (argv: dst port n mark):
/// `one` (Python source: module-level set-up, then `def one():`, one
/// socket's life) runs n times; the program prints `<what> n rss_kib A B`,
/// the process's VmRSS (KiB) after the first `mark` rounds (A) and after
/// all of them (B). Read it with [`assert_rss_bounded`].
pub fn rss_loop_py(what: &str, one: &str) -> String {
    format!(
        r#"
import socket, sys
dst, port, n, mark = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1])
{one}
for i in range(mark):
    one()
first = rss()
for i in range(mark, n):
    one()
print("{what}", n, "rss_kib", first, rss(), flush=True)
"#
    )
}

/// The bound of the memory tests ([`rss_loop_py`]'s outputs, plainly and
/// under run): after all `n` rounds the process's resident memory is what
/// it was after the first `mark` plus at most `slack_kib` (a record leaked
/// per socket grows it by megabytes over 18,000 rounds).
#[track_caller]
pub fn assert_rss_bounded(what: &str, n: usize, (plain, under): (&str, &str), slack_kib: u64) {
    let rss = |out: &str| -> (u64, u64) {
        let v: Vec<u64> = line_of(out, &format!("{what} {n} rss_kib"))
            .split_whitespace()
            .skip(3)
            .map(|x| x.parse().unwrap())
            .collect();
        (v[0], v[1])
    };
    let (p0, p1) = rss(plain);
    let (r0, r1) = rss(under);
    eprintln!("VmRSS KiB plain {p0} -> {p1}, under run {r0} -> {r1}");
    assert!(p1 <= p0 + slack_kib, "plain: {p0} -> {p1} KiB");
    assert!(
        r1 <= r0 + slack_kib,
        "under run the process grew {r0} -> {r1} KiB over {n} {what}:\n{under}"
    );
}

/// A differential check: `got` (the program's stdout under `nanowire run`)
/// is `want` (its stdout run plainly), to the byte; a difference names
/// every line that differs, then both outputs and `context` (what else
/// helps, e.g. the run's stderr).
#[track_caller]
/// A differential loop's step: the first (plain) placement's output is kept
/// in `want`, every later one must equal it ([`assert_same_output`]).
pub fn same_as_first(want: &mut Option<String>, what: &str, out: String, context: &str) {
    match want {
        None => *want = Some(out),
        Some(w) => assert_same_output(what, w, &out, context),
    }
}

pub fn assert_same_output(what: &str, want: &str, got: &str, context: &str) {
    if want == got {
        return;
    }
    let diff: Vec<String> = want
        .lines()
        .zip(got.lines())
        .filter(|(x, y)| x != y)
        .map(|(x, y)| format!("plain: {x}\n  run: {y}"))
        .collect();
    panic!(
        "{what}: the output under run differs from the plain run ({} against {} lines):\n{}\nplain:\n{want}\nrun:\n{got}\n{context}",
        want.lines().count(),
        got.lines().count(),
        diff.join("\n")
    );
}

/// Value after `key=` in sockperf's output (e.g. `ReceivedMessages`).
pub fn sockperf_field(out: &str, key: &str) -> Option<u64> {
    let i = out.find(&format!("{key}="))?;
    let rest = &out[i + key.len() + 1..];
    let num: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    num.parse().ok()
}

/// A sockperf ping-pong client's output: every request answered, none
/// dropped, duplicated or out of order.
///
/// Over the whole run ([Total Run]): replies were received, and as many as
/// requests were sent but the last (a ping-pong has one request in flight,
/// and the timer that ends the run may cut its reply). Over sockperf's
/// statistics window ([Valid Duration]: the run without its first 400 ms
/// and last 50 ms, sockperf's own constants): no drop, duplicate or
/// reordering, and each request answered. A window can be empty: when the
/// machine stalls the pair for more than 550 ms of a 1 s run, every
/// request's send time falls before the window's start or after its end,
/// and sockperf prints "No valid observations found" instead of the
/// window's lines. Not a loss (the whole run's counts still say every
/// request was answered): at load 8-13 on this 2-vCPU machine it happened
/// under run (2 of 11 runs of the feed-mode test, [Total Run] 4441 sent
/// 4440 received, 8486 / 8485) and plain sockperf's window shrank to 9 ms
/// in the same way (1,507 messages in 1.367 s: the timer's signal itself
/// came 367 ms late), docs/benchmarks.md "Session 17: flakes".
#[track_caller]
pub fn assert_sockperf_complete(out: &str) {
    let line = |tag: &str| out.lines().find(|l| l.contains(tag));
    let total = line("[Total Run]").unwrap_or_else(|| panic!("no [Total Run] line:\n{out}"));
    let sent = sockperf_field(total, "SentMessages").expect("SentMessages");
    let recv = sockperf_field(total, "ReceivedMessages").expect("ReceivedMessages");
    assert!(recv > 0, "no reply:\n{out}");
    assert!(
        recv <= sent && sent - recv <= 1,
        "requests without a reply:\n{out}"
    );
    if out.contains("No valid observations found") {
        return;
    }
    assert!(
        out.contains(
            "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0"
        ),
        "losses:\n{out}"
    );
    let valid =
        line("[Valid Duration]").unwrap_or_else(|| panic!("no [Valid Duration] line:\n{out}"));
    let sent = sockperf_field(valid, "SentMessages").expect("SentMessages");
    let recv = sockperf_field(valid, "ReceivedMessages").expect("ReceivedMessages");
    assert!(sent > 0, "{out}");
    assert_eq!(sent, recv, "{out}");
}

#[allow(unused_imports)]
pub use nanowire_testkit::{have, require, words};

/// Where a program of a differential test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Plain,
    /// Under run, on an engine of the process's own.
    Own,
    /// Under run, on the engine service (`NANOWIRE_SERVICE=1`, started on
    /// demand).
    Service,
}

impl Placement {
    pub const ALL: [Placement; 3] = [Placement::Plain, Placement::Own, Placement::Service];

    /// `cmd` in host `h` placed so (under run: `--engine xdp -o log=info`).
    pub fn command(self, lab: &ScopedLab, h: Host, cmd: &[&str]) -> Command {
        let mut c = xdp_or_plain(lab, h, self != Placement::Plain, cmd);
        if self == Placement::Service {
            c.env("NANOWIRE_SERVICE", "1");
        }
        c
    }
}

/// A file of the nanowire crate's tests (`rel` below `tests/`, e.g.
/// "exit/peer.py"), as a path for a command line.
pub fn test_file(rel: &str) -> String {
    format!("{}/tests/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// `kill -9` a process the test started.
pub fn kill_9(pid: u32) {
    assert!(
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

/// Connection `k` ended as the `k`th of `ends` says ("eof", "reset"):
/// `out` has the line "<k> <end>" (what tests/exit/peer.py prints).
pub fn assert_ends<'a>(ends: impl IntoIterator<Item = &'a str>, out: &str, ctx: &str) {
    for (k, want) in ends.into_iter().enumerate() {
        assert!(
            out.lines().any(|l| l == format!("{k} {want}")),
            "{ctx}: connection {k} did not end with {want}:\n{out}"
        );
    }
}

/// `len` pseudo-random bytes: the little-endian words of a xorshift64
/// stream from `x` (cheap, and a misplaced segment changes the hash).
pub fn xorshift_bytes(len: usize, mut x: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
}

/// Python put before a test program's own (`concat!(py_prelude!(), r#"…"#)`):
/// `listener(backlog=8)`, a TCP socket listening on ADDR PORT
/// (`sys.argv[1]`, `sys.argv[2]`, SO_REUSEADDR) once it has printed
/// "listening"; `chunks(s, n=65536)`, what `s.recv(n)` returns until EOF;
/// `recv_line(s, n=65536)`, `s.recv(n)` until what came ends with a newline
/// (or EOF; n=1 takes nothing after the newline).
#[allow(unused_macros)]
macro_rules! py_prelude {
    () => {
        r#"
import socket, sys
def listener(backlog=8):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(backlog)
    print("listening", flush=True)
    return s
def chunks(s, n=65536):
    while True:
        d = s.recv(n)
        if not d:
            return
        yield d
def recv_line(s, n=65536):
    b = b""
    while not b.endswith(b"\n"):
        d = s.recv(n)
        if not d:
            break
        b += d
    return b
def udp_ask(c, d, dst, tries):
    # Send datagram d until a reply comes (c has a timeout): the reply, or
    # b"" after `tries` sends.
    for _ in range(tries):
        c.sendto(d, dst)
        try:
            return c.recvfrom(65536)[0]
        except socket.timeout:
            pass
    return b""
"#
    };
}
#[allow(unused_imports)]
pub(crate) use py_prelude;

/// Counter `name` of the `group` line ("Tcp", "Ip", ...) of host `h`'s
/// namespace's /proc/net/snmp.
pub fn snmp(l: &ScopedLab, h: Host, group: &str, name: &str) -> u64 {
    let o = l.command(h, &["cat", "/proc/net/snmp"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let head = format!("{group}:");
    let mut lines = text.lines().filter(|x| x.starts_with(&head));
    let names: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let vals: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let i = names.iter().position(|n| *n == name).unwrap();
    vals[i].parse().unwrap()
}

/// Tcp OutRsts of host `h`'s namespace: the RSTs its kernel sent.
pub fn out_rsts(l: &ScopedLab, h: Host) -> u64 {
    snmp(l, h, "Tcp", "OutRsts")
}
