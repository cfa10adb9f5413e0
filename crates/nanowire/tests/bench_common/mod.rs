//! Helpers shared by the bench_* integration tests: a lab per test, child
//! processes killed on drop, bounded waits.
#![allow(dead_code)]

use nanowire_lab::testbed::{Host, ScopedLab};
use std::process::{Child, Command, Output};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const NW: &str = env!("CARGO_BIN_EXE_nanowire");
pub const B_ADDR: &str = "198.18.0.2";

/// A lab with a unique name: `tb<tag><pid>`.
pub fn lab(tag: &str) -> ScopedLab {
    nanowire_testkit::lab(&format!("tb{tag}"))
}

/// A child process killed (and reaped) when dropped.
pub struct Guard {
    pub child: Option<Child>,
    pub what: String,
}

impl Guard {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Send a signal (by name, e.g. "INT") and collect the output within `t`.
    pub fn signal_and_wait(mut self, sig: &str, t: Duration) -> Output {
        let _ = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status();
        let child = self.child.take().expect("child");
        wait_output(child, t, &self.what)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub use nanowire_testkit::wait_output;

/// Start `argv` in host `h` with piped output.
pub fn spawn(lab: &ScopedLab, h: Host, argv: &[&str]) -> Guard {
    Guard {
        child: Some(nanowire_testkit::spawn_piped(&mut lab.command(h, argv)).into_inner()),
        what: argv.join(" "),
    }
}

/// Run `argv` in host `h` to completion within `t`.
pub fn run(lab: &ScopedLab, h: Host, argv: &[&str], t: Duration) -> Output {
    let g = spawn(lab, h, argv);
    let mut g = g;
    let child = g.child.take().unwrap();
    wait_output(child, t, &argv.join(" "))
}

/// How long one client run may take.
pub const RUN_T: Duration = Duration::from_secs(30);

/// `nanowire bench LINE` in host a, to completion (LINE split at white
/// space, as typed).
pub fn bench(lab: &ScopedLab, line: &str) -> Output {
    let mut argv = vec![NW, "bench"];
    argv.extend(line.split_whitespace());
    run(lab, Host::A, &argv, RUN_T)
}

/// `LINE` (a program and its arguments, split at white space) in host a,
/// to completion.
pub fn in_a(lab: &ScopedLab, line: &str) -> Output {
    let argv: Vec<&str> = line.split_whitespace().collect();
    run(lab, Host::A, &argv, RUN_T)
}

/// A sockperf client `line` in host a: it reported a p50 above zero.
/// Whether it exited successfully, and its stdout and stderr.
pub fn sockperf_in_a(lab: &ScopedLab, line: &str) -> (bool, String) {
    let o = in_a(lab, line);
    let (out, err) = text(&o);
    let all = format!("{out}{err}");
    assert!(sockperf_p50(&all).is_some_and(|p| p > 0.0), "{all}");
    (o.status.success(), all)
}

/// Wait until something listens on `port` (udp or tcp) in host `h`.
pub fn wait_listening(lab: &ScopedLab, h: Host, tcp: bool, port: u16) {
    let end = Instant::now() + Duration::from_secs(10);
    let proto = if tcp { "-tlnH" } else { "-ulnH" };
    loop {
        let o = lab
            .command(h, &["ss", proto, "sport", "=", &format!(":{port}")])
            .output()
            .expect("ss");
        if !String::from_utf8_lossy(&o.stdout).trim().is_empty() {
            return;
        }
        assert!(Instant::now() < end, "nothing listens on {port} after 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The port `sockperf` and `nanowire bench` use when none is given.
pub const PORT: u16 = 11111;

/// `sockperf sr` (over TCP when `tcp`) on `B_ADDR:port` in host b, listening
/// when this returns.
pub fn sockperf_sr(lab: &ScopedLab, tcp: bool, port: u16) -> Guard {
    let p = port.to_string();
    let mut argv = vec!["sockperf", "sr", "-i", B_ADDR, "-p", &p];
    if tcp {
        argv.push("--tcp");
    }
    let g = spawn(lab, Host::B, &argv);
    wait_listening(lab, Host::B, tcp, port);
    g
}

/// `nanowire bench server -i B_ADDR ARGS` in host b (over TCP when ARGS has
/// `--tcp`), listening on [`PORT`] when this returns.
pub fn bench_server(lab: &ScopedLab, args: &[&str]) -> Guard {
    let mut argv = vec![NW, "bench", "server", "-i", B_ADDR];
    argv.extend_from_slice(args);
    let g = spawn(lab, Host::B, &argv);
    wait_listening(lab, Host::B, args.contains(&"--tcp"), PORT);
    g
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

pub fn success(o: &Output) -> String {
    let (out, err) = text(o);
    assert!(o.status.success(), "failed ({}):\n{out}\n{err}", o.status);
    assert!(!err.contains("panicked"), "{err}");
    out
}

pub fn json(o: &Output) -> serde_json::Value {
    let out = success(o);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {out}"))
}

/// The `percentile 50.000 = X` value of sockperf-style output.
pub fn sockperf_p50(out: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.contains("percentile 50.000"))
        .and_then(|l| l.rsplit('=').next())
        .and_then(|v| v.trim().parse().ok())
}

/// `# dropped messages = N` of sockperf-style output.
pub fn sockperf_dropped(out: &str) -> Option<u64> {
    out.lines()
        .find(|l| l.contains("# dropped messages ="))
        .and_then(|l| l.split("# dropped messages =").nth(1))
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.trim().parse().ok())
}

/// Lines of a child's stderr, for readiness checks.
pub fn stderr_lines(g: &mut Guard) -> mpsc::Receiver<String> {
    nanowire_testkit::line_channel(g.child.as_mut().unwrap().stderr.take().unwrap())
}

/// A one-line "nanowire: error: ..." and a non-zero exit, never a panic.
pub fn assert_clean_error(o: &Output, needle: &str) {
    let line = nanowire_testkit::one_line_failure("bench", o, needle);
    assert!(line.starts_with("nanowire: error: "), "{line}");
}
