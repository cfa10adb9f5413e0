//! A `nanowire bench server` (or any program that prints the bench
//! server's "listen on … (engine E)" line on stderr) in a lab host: its
//! stderr read on a thread, a bounded wait for the listen line, killed and
//! reaped on drop. Shared by xdp_bench, faults, lab_impair and xdp_faults.
#![allow(dead_code)]

use nanowire_lab::testbed::{Host, ScopedLab};
use nanowire_testkit::{Reaped, spawn_piped};
use std::process::{ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const NW: &str = env!("CARGO_BIN_EXE_nanowire");

/// How long a server may take to print its listen line.
const LISTEN_WAIT: Duration = Duration::from_secs(20);

pub struct BenchServer {
    child: Reaped,
    err: mpsc::Receiver<String>,
    /// The server's stdout, for tests that read its final report.
    pub out: Option<ChildStdout>,
}

impl BenchServer {
    /// Spawn `cmd` with stdin closed and stdout and stderr piped.
    pub fn spawn(mut cmd: Command) -> BenchServer {
        let mut child = spawn_piped(&mut cmd);
        let err = nanowire_testkit::line_channel(child.stderr.take().expect("stderr piped"));
        let out = child.stdout.take();
        BenchServer { child, err, out }
    }

    /// Wait (bounded) for the listen line: `Ok((engine line, the lines
    /// before it))`, or `Err(everything it said)` when it printed none.
    pub fn listening(&self) -> Result<(String, Vec<String>), Vec<String>> {
        let end = Instant::now() + LISTEN_WAIT;
        let mut said = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.err.recv_timeout(left) {
                Ok(l) if l.contains("(engine ") => return Ok((l, said)),
                Ok(l) => said.push(l),
                Err(_) => return Err(said),
            }
        }
    }

    /// The listen line, which must say the xdp engine.
    pub fn expect_xdp(&self) {
        match self.listening() {
            Ok((l, _)) => assert!(l.contains("(engine xdp)"), "{l}"),
            Err(said) => panic!("server printed no listen line; it said: {said:?}"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child by pid (it is not reaped before
        // drop, so the pid cannot have been reused).
        unsafe { libc::kill(self.pid() as i32, sig) };
    }

    /// Wait (bounded) for the process to end: its status and the stderr
    /// lines not read yet.
    pub fn wait(&mut self, t: Duration) -> Option<(ExitStatus, Vec<String>)> {
        let end = Instant::now() + t;
        loop {
            if let Some(st) = self.child.try_wait().ok()? {
                std::thread::sleep(Duration::from_millis(20));
                return Some((st, self.err.try_iter().collect()));
            }
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    /// CPU time (user + system, clock ticks) the process used so far.
    pub fn cpu_ticks(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let after = s.rsplit_once(')').map_or("", |x| x.1);
        let f: Vec<&str> = after.split_whitespace().collect();
        f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    }
}

/// `nanowire bench server -i 198.18.0.2 -p PORT ARGS…` in host b.
pub fn server_cmd(lab: &ScopedLab, port: u16, args: &[&str]) -> Command {
    let p = port.to_string();
    let mut argv = vec![NW, "bench", "server", "-i", "198.18.0.2", "-p", &p];
    argv.extend_from_slice(args);
    lab.command(Host::B, &argv)
}

/// `nanowire bench server -i 198.18.0.2 -p PORT --engine xdp --no-fallback
/// EXTRA…` in host b with `env`, once it listens on the xdp engine. While
/// the queue is still held by the AF_XDP socket of a process that just
/// ended (the kernel releases its buffer pool from a workqueue, so the
/// queue can stay busy for a moment after the XDP program is detached),
/// start it again, for at most 5 s.
pub fn xdp_server(lab: &ScopedLab, port: u16, extra: &[&str], env: &[(&str, &str)]) -> BenchServer {
    let mut args = vec!["--engine", "xdp", "--no-fallback"];
    args.extend_from_slice(extra);
    let t0 = Instant::now();
    loop {
        let mut cmd = server_cmd(lab, port, &args);
        cmd.envs(env.iter().copied());
        let s = BenchServer::spawn(cmd);
        match s.listening() {
            Ok((l, _)) => {
                assert!(l.contains("(engine xdp)"), "{l}");
                return s;
            }
            Err(said)
                if said.iter().any(|l| l.contains("queue busy"))
                    && t0.elapsed() < Duration::from_secs(5) =>
            {
                drop(s);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(said) => panic!("server printed no listen line; it said: {said:?}"),
        }
    }
}

/// `nanowire bench pp -i 198.18.0.2 -p PORT -m 64 --json ARGS…` from host
/// a: the JSON it printed (None when it printed none), whatever its exit
/// status; a failure's stderr is printed.
pub fn pp(lab: &ScopedLab, port: u16, args: &[&str]) -> Option<serde_json::Value> {
    let p = port.to_string();
    let mut argv = vec![
        NW,
        "bench",
        "pp",
        "-i",
        "198.18.0.2",
        "-p",
        &p,
        "-m",
        "64",
        "--json",
    ];
    argv.extend_from_slice(args);
    let o = lab
        .command(Host::A, &argv)
        .stdin(Stdio::null())
        .output()
        .expect("run bench pp");
    if !o.status.success() {
        eprintln!("pp failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    serde_json::from_slice(&o.stdout).ok()
}
