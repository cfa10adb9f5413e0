//! What nanowire's integration tests share, kept out of the shipped
//! libraries (a dev-dependency only):
//!
//! - one root check ([`is_root`], [`require_root`]): a test that needs root
//!   is `#[ignore = "needs root"]` (`make test` runs it with
//!   `--include-ignored`) and fails with one clear line when run
//!   unprivileged — never an early return that reports a pass;
//! - one lab guard ([`lab`], [`lab_with`], [`lab_impaired`]): a uniquely
//!   named [`ScopedLab`] (the default lab, TSO/GSO on) removed on drop;
//! - [`require`]: a program a test drives (sockperf, iperf3, nginx...) must be
//!   installed (`scripts/install-deps.sh` installs them); a missing one fails
//!   the test with its name rather than skipping it silently;
//! - [`in_ns`]: run a closure in a lab namespace;
//! - [`ok`], [`one_line_failure`]: a command's stdout when it succeeded,
//!   its one line when it failed;
//! - [`stats_json`], [`engines_on`], [`engine_pid`], [`engine_counters_of`]:
//!   the engines `nanowire stats --json` lists (the machine's: pick yours by
//!   interface or pid);
//! - [`Reaped`], [`spawn_piped`], [`wait_output`]: a child process killed
//!   and reaped on drop, started with its output piped, waited for with a
//!   deadline;
//! - [`HASHED_PEER_PY`]: a kernel TCP peer that hashes what it reads and
//!   streams hashed bytes back;
//! - [`LabDown`]: a lab
//!   made by name (through the CLI) taken down when the test ends;
//! - [`xdp_test_bin`]: the `nanowire-xdp-test` program (the engine's
//!   echo/count/ping-pong test mode), built on first use;
//! - [`A`], [`B`]: the lab hosts' addresses as text, for command lines;
//! - [`items`]: the elements of a JSON list.

use nanowire_lab::testbed::{Lab, LabOptions, ScopedLab};
use std::io::{BufRead, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

/// Host a's address (`testbed::ADDR_A`) as text, for command lines.
pub const A: &str = "198.18.0.1";
/// Host b's address (`testbed::ADDR_B`) as text.
pub const B: &str = "198.18.0.2";

/// The elements of a JSON list (a report's or a results file's), failing
/// the test with the value when it is not a list.
#[track_caller]
pub fn items(v: &serde_json::Value) -> std::slice::Iter<'_, serde_json::Value> {
    match v.as_array() {
        Some(a) => a.iter(),
        None => panic!("not a JSON list: {v}"),
    }
}

/// True when this process runs as root (namespaces, XDP, AF_XDP).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fail the test with one clear line unless it runs as root. Tests that call
/// this are `#[ignore = "needs root"]`; `make test` runs them as root.
#[track_caller]
pub fn require_root() {
    assert!(
        is_root(),
        "this test needs root (network namespaces, XDP, AF_XDP): run it as root, e.g. `make test` \
         or `cargo test --release -- --include-ignored`"
    );
}

/// True when `program` is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program} >/dev/null")])
        .status()
        .is_ok_and(|s| s.success())
}

/// Fail the test with one clear line unless every program is on PATH.
#[track_caller]
pub fn require(programs: &[&str]) {
    let missing: Vec<&str> = programs.iter().copied().filter(|p| !have(p)).collect();
    assert!(
        missing.is_empty(),
        "this test needs {} (not on PATH): `scripts/install-deps.sh` (or `make deps`) installs it",
        missing.join(", ")
    );
}

/// The name of a lab for `tag` in this process: `<tag><pid mod 10000>`.
/// `tag` names the test file and the test (distinct tags in one test binary
/// never collide; the pid separates concurrent test binaries).
///
/// Two tests of one binary asking for the same tag fail here, whatever
/// their timing: tests run two at a time, and a lab brought up under a
/// name in use first takes the other test's lab down (session 18 found
/// three such pairs, each a failure by chance of the order).
#[track_caller]
pub fn lab_name(tag: &str) -> String {
    let name = format!("{tag}{}", std::process::id() % 10000);
    assert!(
        name.len() <= 12,
        "lab tag {tag:?} too long: lab names are at most 12 characters"
    );
    claim_tag(tag);
    name
}

/// Records that the running test (its thread's name, as libtest gives it)
/// uses lab tag `tag`; panics if another test of this binary did. Threads
/// without a name (a test's own helpers) are not checked.
#[track_caller]
fn claim_tag(tag: &str) {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static OWNERS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let Some(me) = std::thread::current().name().map(str::to_owned) else {
        return;
    };
    let mut owners = OWNERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let owner = owners.entry(tag.to_owned()).or_insert_with(|| me.clone());
    assert!(
        *owner == me,
        "lab tag {tag:?} is also used by test {owner}: give each test its own tag"
    );
}

/// The default lab (as `nanowire lab up` makes it: TSO/GSO on, one queue),
/// uniquely named after `tag`, taken down on drop. Needs root.
#[track_caller]
pub fn lab(tag: &str) -> ScopedLab {
    lab_with(tag, LabOptions::default())
}

/// A lab with `opts` (its name replaced by one made from `tag`), taken down
/// on drop. Needs root.
#[track_caller]
pub fn lab_with(tag: &str, opts: LabOptions) -> ScopedLab {
    scoped(tag, opts, ScopedLab::new)
}

/// Like [`lab_with`], with the impaired wire between the hosts (clear at
/// first). Needs root.
#[track_caller]
pub fn lab_impaired(tag: &str, opts: LabOptions) -> ScopedLab {
    scoped(tag, opts, ScopedLab::new_impaired)
}

#[track_caller]
fn scoped(
    tag: &str,
    opts: LabOptions,
    up: fn(LabOptions) -> Result<ScopedLab, nanowire_lab::testbed::Error>,
) -> ScopedLab {
    require_root();
    let name = lab_name(tag);
    up(LabOptions {
        name: name.clone(),
        ..opts
    })
    .unwrap_or_else(|e| panic!("bringing up lab {name}: {e}"))
}

/// The MAC addresses of the lab's two ends (host a's, host b's).
pub fn lab_macs(lab: &ScopedLab) -> ([u8; 6], [u8; 6]) {
    let st = lab.status();
    let mac = |h: Option<&nanowire_lab::testbed::HostStatus>| -> [u8; 6] {
        let s = h.and_then(|h| h.mac.as_deref()).expect("the lab's MAC");
        let v: Vec<u8> = s
            .split(':')
            .map(|x| u8::from_str_radix(x, 16).expect("a MAC of hex bytes"))
            .collect();
        v.try_into().expect("a MAC of six bytes")
    };
    (mac(st.a.as_ref()), mac(st.b.as_ref()))
}

/// The stdout of a command that succeeded; otherwise the test fails with
/// both its outputs.
#[track_caller]
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed ({}): {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Each line `r` gives, sent on the returned channel by a thread of its
/// own (until EOF, a read error or the receiver is gone).
pub fn line_channel(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// A test's size knob: environment variable `name` as a number, or
/// `default` when it is unset or not a number.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The first whitespace-separated word after the first `marker` in
/// `text`, parsed (`word_after("PORT = 5001 ...", "PORT =") == Some(5001)`);
/// `None` without the marker or when the word is not a `T`.
pub fn word_after<T: std::str::FromStr>(text: &str, marker: &str) -> Option<T> {
    let (_, rest) = text.split_once(marker)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// The words of a command line, as an argv (for lines with no empty or
/// spaced word: `&words(&format!("memcached -l {addr} -p 11211"))`).
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// `ip -n NS ARGS…` in the lab namespace `ns`: its stdout; the test fails
/// with both outputs unless it succeeded.
#[track_caller]
pub fn ip_ns(ns: &str, args: &[&str]) -> String {
    ok(&Command::new("ip")
        .arg("-n")
        .arg(ns)
        .args(args)
        .output()
        .expect("ip"))
}

/// `nanowire stats --json` (`nanowire`: the binary under test). It lists
/// every engine of the machine, other tests' included.
pub fn stats_json(nanowire: &str) -> Result<serde_json::Value, String> {
    let o = Command::new(nanowire)
        .args(["stats", "--json"])
        .output()
        .map_err(|e| format!("cannot run {nanowire} stats: {e}"))?;
    serde_json::from_slice(&o.stdout).map_err(|e| format!("nanowire stats --json: {e}: {o:?}"))
}

/// The engines running on interface `iface`, as `nanowire stats --json`
/// lists them: a lab's interface names the engines of one test.
pub fn engines_on(nanowire: &str, iface: &str) -> Vec<serde_json::Value> {
    let v = stats_json(nanowire).unwrap_or_else(|e| panic!("{e}"));
    v["engines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["iface"] == iface)
        .cloned()
        .collect()
}

/// The process of an engine that `nanowire stats --json` lists.
pub fn engine_pid(e: &serde_json::Value) -> Option<u64> {
    e["pid"].as_u64().or_else(|| e["info"]["pid"].as_u64())
}

/// Process `pid`'s engine (its counters and sockets), when `nanowire
/// stats --json` lists it.
pub fn engine_of(nanowire: &str, pid: u32) -> Option<serde_json::Value> {
    stats_json(nanowire).ok()?["engines"]
        .as_array()?
        .iter()
        .find(|e| engine_pid(e) == Some(u64::from(pid)))
        .cloned()
}

/// The counters of process `pid`'s engine, when `nanowire stats --json`
/// lists it.
pub fn engine_counters_of(nanowire: &str, pid: u32) -> Option<serde_json::Value> {
    engine_of(nanowire, pid).map(|e| e["counters"].clone())
}

/// A command that failed cleanly: a non-zero exit, no panic, and exactly
/// one line on stderr, which mentions `needle`. Returns that line.
#[track_caller]
pub fn one_line_failure(what: &str, o: &Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "{what}: succeeded, expected a failure: {}{err}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(!err.contains("panicked"), "{what}: panicked: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err:?}");
    assert!(err.contains(needle), "{what}: {needle:?} not said: {err}");
    err.trim_end().to_string()
}

/// A Python kernel TCP peer: `ADDR PORT TOTAL`. Listens, prints `listening`,
/// accepts one connection, reads to EOF and answers `"<bytes> <crc32>\n"`,
/// then streams TOTAL random bytes back, closes, and prints
/// `sent <bytes> <crc32>`.
pub const HASHED_PEER_PY: &str = r#"
import socket, sys, zlib, os
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
crc, n = 0, 0
while True:
    d = c.recv(1 << 20)
    if not d: break
    crc = zlib.crc32(d, crc); n += len(d)
c.sendall(f"{n} {crc}\n".encode())
total = int(sys.argv[3]); block = os.urandom(1 << 20); sent = 0; scrc = 0
while sent < total:
    b = block[: min(len(block), total - sent)]
    c.sendall(b); scrc = zlib.crc32(b, scrc); sent += len(b)
c.close()
print(f"sent {sent} {scrc}", flush=True)
"#;

/// A child process killed and reaped when dropped: a test that fails midway
/// leaves nothing running.
pub struct Reaped(Option<Child>);

impl Reaped {
    pub fn new(child: Child) -> Reaped {
        Reaped(Some(child))
    }

    /// The child, no longer killed on drop (to wait for it).
    pub fn into_inner(mut self) -> Child {
        self.0.take().expect("a child")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("a child")
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("a child")
    }
}

/// Start `cmd` with stdin from /dev/null and stdout and stderr piped.
pub fn spawn_piped(cmd: &mut Command) -> Reaped {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()));
    Reaped::new(child)
}

/// Wait for `child` at most `t`, reading its piped output meanwhile (a full
/// pipe would block it); kill it and fail the test (naming `what`) when it
/// overruns.
pub fn wait_output(mut child: Child, t: Duration, what: &str) -> Output {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut v);
            }
            let _ = tx.send(v);
        });
        rx
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let end = Instant::now() + t;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not finish within {t:?}");
            }
        }
    };
    Output {
        status,
        stdout: out.recv_timeout(Duration::from_secs(5)).unwrap_or_default(),
        stderr: err.recv_timeout(Duration::from_secs(5)).unwrap_or_default(),
    }
}

/// Takes lab `.0` down when dropped, pass or fail: the guard of a test that
/// brings its lab up itself (`nanowire lab up --name ...`).
pub struct LabDown(pub String);

impl Drop for LabDown {
    fn drop(&mut self) {
        if let Ok(l) = Lab::named(&self.0) {
            let _ = l.down();
        }
    }
}

/// Run `f` on a thread that has joined network namespace `ns` (a name under
/// /run/netns) and return its result.
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: setns on a valid netns fd affects only this thread.
        let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("namespace thread")
}

/// The target directory of the running test binary (`target/release` for
/// `target/release/deps/NAME-HASH`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    let deps = exe.parent().expect("test binary directory");
    let dir = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("target directory")
    } else {
        deps
    };
    dir.to_path_buf()
}

/// Build `package`'s binary `bin` (or library when `bin` is None) with the
/// same profile as the running test, once per test binary; fast when up to
/// date. Returns the target directory.
fn cargo_build(package: &str, bin: Option<&str>) -> PathBuf {
    let dir = target_dir();
    let release = dir.file_name().is_some_and(|n| n == "release");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let mut c = Command::new(env!("CARGO"));
    c.args(["build", "-q", "-p", package, "--manifest-path"])
        .arg(&manifest);
    if let Some(b) = bin {
        c.args(["--bin", b]);
    }
    if release {
        c.arg("--release");
    }
    let st = c
        .status()
        .unwrap_or_else(|e| panic!("run cargo build -p {package}: {e}"));
    assert!(st.success(), "building {package} failed");
    dir
}

/// `nanowire-xdp-test`: the engine's test mode (echo, count, multicast,
/// ping-pong client, counters as JSON), built on first use.
pub fn xdp_test_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = cargo_build("nanowire-testkit", Some("nanowire-xdp-test"));
        let bin = dir.join("nanowire-xdp-test");
        assert!(bin.is_file(), "{} missing after the build", bin.display());
        bin.to_string_lossy().into_owned()
    })
}

#[cfg(test)]
mod tests {
    use nanowire_lab::testbed::{ADDR_A, ADDR_B};

    #[test]
    fn the_addresses_as_text_are_the_labs() {
        assert_eq!(
            (super::A, super::B),
            (&*ADDR_A.to_string(), &*ADDR_B.to_string())
        );
    }

    #[test]
    fn word_after_parses_the_word_after_the_first_marker() {
        use super::word_after;
        let line = "sockperf: PORT = 5001 (tcp); PORT = 7";
        assert_eq!(word_after::<u16>(line, "PORT ="), Some(5001));
        assert_eq!(
            word_after::<u64>("ReceivedMessages=42", "ReceivedMessages="),
            Some(42)
        );
        assert_eq!(word_after::<u16>(line, "ADDR ="), None, "no marker");
        assert_eq!(
            word_after::<u16>("PORT = x", "PORT ="),
            None,
            "not a number"
        );
        assert_eq!(word_after::<u16>("PORT =", "PORT ="), None, "nothing after");
    }
}

#[cfg(test)]
mod tag_tests {
    fn claim_in(test: &str, tag: &'static str) -> bool {
        std::thread::Builder::new()
            .name(test.into())
            .spawn(move || super::claim_tag(tag))
            .unwrap()
            .join()
            .is_ok()
    }

    #[test]
    fn a_tag_belongs_to_the_first_test_that_asks_for_it() {
        assert!(claim_in("t1", "zq"));
        assert!(claim_in("t1", "zq"), "the same test may ask again");
        assert!(claim_in("t2", "zr"));
        assert!(!claim_in("t2", "zq"), "another test may not");
    }
}
