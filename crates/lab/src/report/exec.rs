//! Running the measurement processes: on the lab's two hosts (namespaces),
//! or locally against a real peer (`--peer`). Every child is killed when its
//! guard is dropped; every wait has a timeout.

use crate::testbed::{Host, Lab};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where one host's commands run.
#[derive(Debug, Clone, Copy)]
pub enum HostRunner<'a> {
    /// This machine, as it is (host a of a two-host report).
    Local,
    /// A network namespace of the lab.
    Netns(&'a Lab, Host),
    /// Another machine over ssh, under `nanowire lab hostexec`.
    Ssh(&'a super::remote::Remote),
    /// Not reachable from here (host b of `--peer`).
    Unreachable,
}

impl HostRunner<'_> {
    pub fn command(&self, argv: &[String]) -> Result<Command, String> {
        match self {
            HostRunner::Local => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                Ok(c)
            }
            HostRunner::Netns(l, h) => Ok(l.command(*h, argv)),
            HostRunner::Ssh(r) => Ok(r.command(argv)),
            HostRunner::Unreachable => Err(format!(
                "needs `{}` on the peer; in --peer mode only the client side runs here",
                argv.iter()
                    .skip(1)
                    .take(2)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
        }
    }
}

/// Where the experiments run.
#[derive(Debug, Clone)]
pub enum Target {
    /// The virtual testbed: client in host a, server in host b.
    Lab(Lab),
    /// Two real hosts: host a is this machine, host b is reached over ssh
    /// and every server there is started (and stopped) by the report.
    Remote(std::sync::Arc<super::remote::Remote>),
    /// Two real hosts: the client side here, `nanowire bench server` on the peer.
    Peer {
        addr: Ipv4Addr,
        iface: String,
        /// Port of the `nanowire bench server` (UDP and TCP) on the peer.
        port: u16,
    },
}

impl Target {
    pub fn server_addr(&self) -> Ipv4Addr {
        match self {
            Target::Lab(l) => l.addr(Host::B),
            Target::Remote(r) => r.remote_addr,
            Target::Peer { addr, .. } => *addr,
        }
    }
    /// Host a's address (the xdp engine finds its interface from it).
    pub fn client_addr(&self) -> Option<Ipv4Addr> {
        match self {
            Target::Lab(l) => Some(l.addr(Host::A)),
            Target::Remote(r) => Some(r.local_addr),
            Target::Peer { .. } => None,
        }
    }
    pub fn describe(&self) -> String {
        match self {
            Target::Lab(l) => format!("lab:{}", l.name()),
            Target::Remote(r) => format!(
                "hosts:{} ({}) -> {} ({} over ssh)",
                r.a.hostname, r.local_addr, r.b.hostname, r.ssh.dest
            ),
            Target::Peer { addr, iface, port } => format!("peer:{addr}:{port}%{iface}"),
        }
    }
    /// Both hosts are started by the report (server side included).
    pub fn runs_servers(&self) -> bool {
        !matches!(self, Target::Peer { .. })
    }
    /// Host b is another machine: a real wire between the hosts.
    pub fn real_wire(&self) -> bool {
        !matches!(self, Target::Lab(_))
    }
    pub fn runner(&self, h: Host) -> HostRunner<'_> {
        match (self, h) {
            (Target::Lab(l), h) => HostRunner::Netns(l, h),
            (Target::Remote(_) | Target::Peer { .. }, Host::A) => HostRunner::Local,
            (Target::Remote(r), Host::B) => HostRunner::Ssh(r),
            (Target::Peer { .. }, Host::B) => HostRunner::Unreachable,
        }
    }
    /// A command running `argv` on host `h`. In peer mode host b is remote
    /// and cannot be started from here.
    pub fn command(&self, h: Host, argv: &[String]) -> Result<Command, String> {
        self.runner(h).command(argv)
    }
}

/// A running child process, killed on drop.
pub struct Proc {
    child: Child,
    pub name: String,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    lines: Receiver<String>,
    stdin: Option<std::process::ChildStdin>,
    readers: Vec<std::thread::JoinHandle<()>>,
    /// Runs in host b over ssh (under `hostexec`): its destination.
    remote: Option<String>,
}

impl Proc {
    pub fn spawn(cmd: Command, name: &str) -> Result<Proc, String> {
        Proc::spawn_io(cmd, name, false)
    }

    /// With `keep_stdin`, the child's stdin is a pipe closed by [`Proc::close_stdin`].
    pub fn spawn_io(mut cmd: Command, name: &str, keep_stdin: bool) -> Result<Proc, String> {
        // A command in host b over ssh lives as long as its session's stdin
        // is open: always a pipe, held until the Proc is dropped.
        let remote = cmd
            .get_envs()
            .find(|(k, _)| *k == super::remote::HOSTEXEC_ENV)
            .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()));
        let name = match &remote {
            Some(d) => format!("{name} on {d}"),
            None => name.to_string(),
        };
        let name = name.as_str();
        let keep_stdin = keep_stdin || remote.is_some();
        cmd.stdin(if keep_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = channel();
        let mut readers = vec![];
        if let Some(mut out) = child.stdout.take() {
            let so = stdout.clone();
            readers.push(std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                if let Ok(mut g) = so.lock() {
                    g.push_str(&s);
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            let se = stderr.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if let Ok(mut g) = se.lock() {
                        g.push_str(&line);
                        g.push('\n');
                    }
                    let _ = tx.send(line);
                }
            }));
        }
        let mut p = Proc {
            child,
            name: name.to_string(),
            stdout,
            stderr,
            lines: rx,
            stdin,
            readers,
            remote,
        };
        if let Some(dest) = p.remote.clone() {
            // Until hostexec says it started the command, a failure is ssh's.
            if let Err(e) = p.wait_ready(super::remote::READY, Duration::from_secs(30)) {
                let code = p.child.try_wait().ok().flatten().and_then(|s| s.code());
                return Err(if code == Some(255) {
                    format!("ssh to {dest} failed: {}", p.err_line())
                } else if e.contains("not ready") {
                    format!("{dest}: {name} did not start within 30 s")
                } else {
                    format!("{dest}: cannot start {name}: {}", p.err_line())
                });
            }
        }
        Ok(p)
    }

    /// Signal end of input (the sink's `--stop-on-eof`).
    pub fn close_stdin(&mut self) {
        if self.remote.is_some() {
            // The session's stdin must stay open (its end kills the command).
            if let Some(w) = self.stdin.as_mut() {
                use std::io::Write;
                let _ = w.write_all(b"close\n").and_then(|_| w.flush());
            }
        } else {
            self.stdin.take();
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait for a stderr line starting with `token` (e.g. the sink's READY).
    pub fn wait_ready(&mut self, token: &str, timeout: Duration) -> Result<(), String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(l) if l.starts_with(token) => return Ok(()),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = self.child.wait();
                    return Err(format!("{} exited: {}", self.name, self.err_line()));
                }
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                // Give the reader a moment to collect the reason.
                std::thread::sleep(Duration::from_millis(20));
                return Err(format!("{} exited ({st}): {}", self.name, self.err_line()));
            }
            if Instant::now() >= end {
                return Err(format!("{} not ready after {timeout:?}", self.name));
            }
        }
    }

    /// Still running after `settle`? (for servers without a readiness line)
    pub fn settle(&mut self, settle: Duration) -> Result<(), String> {
        let end = Instant::now() + settle;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(20));
                return Err(format!("{} exited ({st}): {}", self.name, self.err_line()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The last meaningful stderr line (why it failed).
    pub fn err_line(&self) -> String {
        let s = self.stderr.lock().map(|g| g.clone()).unwrap_or_default();
        pick_err(&s)
    }

    /// CPU seconds (utime + stime) the process has used so far (in host b
    /// over ssh: asked of hostexec there).
    pub fn cpu_seconds(&mut self) -> Option<f64> {
        if self.remote.is_none() {
            return super::remote::proc_cpu_seconds(self.child.id());
        }
        {
            use std::io::Write;
            let w = self.stdin.as_mut()?;
            w.write_all(b"cpu\n").and_then(|_| w.flush()).ok()?;
        }
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(l) => {
                    if let Some(v) = l.strip_prefix(super::remote::CPU) {
                        return v.trim().parse().ok().filter(|v: &f64| *v >= 0.0);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
        None
    }

    /// Wait for exit; on timeout kill it and fail.
    pub fn finish(mut self, timeout: Duration) -> Result<(i32, String), String> {
        let end = Instant::now() + timeout;
        let st = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!("{} did not finish within {timeout:?}", self.name));
                }
                Err(e) => return Err(format!("waiting for {}: {e}", self.name)),
            }
        };
        for r in std::mem::take(&mut self.readers) {
            let _ = r.join();
        }
        let out = self.stdout.lock().map(|g| g.clone()).unwrap_or_default();
        Ok((st.code().unwrap_or(-1), out))
    }

    /// Run to completion and parse the last JSON object it printed.
    pub fn finish_json(self, timeout: Duration) -> Result<Value, String> {
        let name = self.name.clone();
        let stderr = self.stderr.clone();
        let (code, out) = self.finish(timeout)?;
        let last_err = || pick_err(&stderr.lock().map(|g| g.clone()).unwrap_or_default());
        // One JSON document (possibly pretty-printed), or the last JSON line.
        let json = serde_json::from_str::<Value>(out.trim())
            .ok()
            .filter(Value::is_object)
            .or_else(|| {
                out.lines()
                    .rev()
                    .find(|l| l.trim_start().starts_with('{'))
                    .and_then(|l| serde_json::from_str::<Value>(l).ok())
            });
        match json {
            Some(v) => Ok(v),
            None if code != 0 => Err(format!("{name} failed: {}", last_err())),
            None => Err(format!("{name} printed no JSON ({})", last_err())),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The line that says why a process failed: the first `error` line (clap,
/// nanowire), else the last non-empty one.
fn pick_err(s: &str) -> String {
    let clean = |l: &str| {
        l.trim()
            .trim_start_matches("nanowire: error: ")
            .trim_start_matches("error: ")
            .to_string()
    };
    let lines: Vec<&str> = s
        .lines()
        .filter(|l| {
            !l.trim().is_empty()
                && !l.starts_with("READY")
                && !l.starts_with(super::remote::READY)
                && !l.starts_with(super::remote::CPU)
        })
        .collect();
    lines
        .iter()
        .find(|l| l.contains("error"))
        .or(lines.last())
        .map(|l| clean(l))
        .unwrap_or_else(|| "no error output".into())
}

/// Run a command to completion with a timeout; stdout and stderr captured.
pub fn run_capture(mut cmd: Command, timeout: Duration) -> Option<String> {
    cmd.stdin(Stdio::null());
    let p = Proc::spawn(cmd, "probe").ok()?;
    let (code, out) = p.finish(timeout).ok()?;
    (code == 0).then_some(out)
}
