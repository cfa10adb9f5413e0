//! Host b on another machine, reached over OpenSSH (`lab report --remote`).
//!
//! Every command for host b runs as `ssh ... DEST -- NANOWIRE lab hostexec
//! -- ARGV` (BatchMode, the user's own keys and ssh config). `hostexec` (in
//! host b) starts the command in its own process group and ties its life to
//! the ssh session's stdin: end of input (this report ended, died or was
//! interrupted; the connection dropped) kills the whole group. Locally every
//! ssh client carries `setpriv --pdeathsig KILL`, so a report killed hard
//! takes its ssh clients with it, and their sessions' commands follow.
//!
//! Small line protocol on the session's stdin: `close` closes the command's
//! stdin (the sink's end-of-input), `cpu` asks for its CPU seconds (answered
//! on stderr as `NWCPU <seconds>`). `hostexec` announces the started command
//! with `NWHOSTEXEC <pid>` on stderr: until that line the failure is ssh's.

use std::io::{BufRead, Write};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

/// Marker env var on ssh commands built here: its value is the destination.
pub const HOSTEXEC_ENV: &str = "NANOWIRE_HOSTEXEC_DEST";
pub const READY: &str = "NWHOSTEXEC";
pub const CPU: &str = "NWCPU";
/// ip, ethtool, sysctl live in /usr/sbin, not in a non-root user's PATH on Debian.
const PATH_FIX: &str = "PATH=\"$PATH:/usr/sbin:/sbin\";";

/// How to reach host b.
#[derive(Debug, Clone)]
pub struct Ssh {
    /// USER@HOST (or a Host alias from the user's ssh config).
    pub dest: String,
    /// Extra `-o` options (`--ssh-opt`), e.g. Port=2222.
    pub opts: Vec<String>,
}

/// Single-quote for the remote shell.
pub fn shq(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@%+,".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl Ssh {
    /// `ssh` with our options; `remote` is one shell command line for host b.
    pub fn command(&self, remote: &str) -> Command {
        let mut c = Command::new("setpriv");
        c.args(["--pdeathsig", "KILL", "--", "ssh"]);
        // ssh keeps the first value of an option: the user's come first.
        for o in &self.opts {
            c.args(["-o", o]);
        }
        for o in [
            "BatchMode=yes",
            "ConnectTimeout=10",
            "ServerAliveInterval=5",
            "ServerAliveCountMax=3",
            "LogLevel=ERROR",
        ] {
            c.args(["-o", o]);
        }
        c.args(["-T", "--", &self.dest, remote]);
        c.env(HOSTEXEC_ENV, &self.dest);
        c
    }

    /// Run a shell command line on host b to completion: its stdout, or a
    /// one-line error naming the host and what failed.
    pub fn run(&self, remote: &str, what: &str, input: Option<&Path>) -> Result<String, String> {
        let mut c = self.command(remote);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.stdin(match input {
            Some(p) => Stdio::from(
                std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?,
            ),
            None => Stdio::null(),
        });
        let child = c
            .spawn()
            .map_err(|e| format!("cannot run ssh (install openssh-client): {e}"))?;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(format!("{}: ssh failed: {e}", self.dest)),
            Err(_) => return Err(format!("{}: {what}: no answer within 120 s", self.dest)),
        };
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("no error output")
            .to_string();
        Err(if out.status.code() == Some(255) {
            format!("ssh to {} failed: {line}", self.dest)
        } else {
            format!("{}: {what} failed: {line}", self.dest)
        })
    }
}

/// What `connect` learnt about a host.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HostInfo {
    pub hostname: String,
    pub arch: String,
    pub kernel: String,
    pub iface: String,
    pub addr: String,
    pub driver: Option<String>,
    pub cpu_model: Option<String>,
    pub cpus: Option<u64>,
    /// `nanowire doctor IFACE --json` there (findings included).
    pub doctor: Option<serde_json::Value>,
}

/// Host b over ssh, ready to run nanowire there.
#[derive(Debug)]
pub struct Remote {
    pub ssh: Ssh,
    pub local_addr: Ipv4Addr,
    pub remote_addr: Ipv4Addr,
    /// This binary (its path in argv[0] of host-b commands is replaced).
    pub local_exe: String,
    /// nanowire on host b.
    pub nanowire: String,
    /// The directory this report copied nanowire into (removed at the end).
    pub copied: Option<String>,
    pub a: HostInfo,
    pub b: HostInfo,
    /// What happened while connecting (for the progress output).
    pub notes: Vec<String>,
    /// The session that removes `copied` when it ends (this report's end, or death).
    keeper: Option<std::process::Child>,
}

fn lines_of(s: &str) -> Vec<String> {
    s.lines().map(|l| l.trim().to_string()).collect()
}

/// The shim that goes with this binary, as `nanowire run` looks for it.
fn local_shim(exe: &Path) -> Option<PathBuf> {
    nanowire_run::cli::preload_beside(exe)
}

fn local_info(addr: Ipv4Addr) -> Result<HostInfo, String> {
    let iface = nanowire_xdp::iface::iface_for_addr(addr)
        .map_err(|e| format!("this host has no interface with {addr} (--local-addr): {e}"))?;
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let d = nanowire_doctor::iface(&iface);
    let h = nanowire_doctor::host();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    });
    Ok(HostInfo {
        hostname: read("/proc/sys/kernel/hostname").unwrap_or_default(),
        arch: std::env::consts::ARCH.to_string(),
        kernel: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
        iface,
        addr: addr.to_string(),
        driver: d.driver.clone(),
        cpu_model,
        cpus: Some(h.cpus as u64),
        doctor: Some(serde_json::json!({"host": h, "interfaces": [d]})),
    })
}

impl Remote {
    /// Check ssh, the architecture, the addresses, and put nanowire on host b.
    pub fn connect(
        ssh: Ssh,
        local_addr: Ipv4Addr,
        remote_addr: Ipv4Addr,
        local_exe: &str,
    ) -> Result<Remote, String> {
        let a = local_info(local_addr)?;
        let dest = ssh.dest.clone();
        let version = format!("nanowire {}", env!("CARGO_PKG_VERSION"));
        // One round trip: who is it, and does it have this nanowire?
        let probe = ssh.run(
            &format!("{PATH_FIX} uname -m; uname -r; uname -n; p=$(command -v nanowire) && v=$(\"$p\" --version 2>/dev/null) && echo \"$p\" && echo \"$v\" || {{ echo -; echo -; }}; \
             grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2; nproc; \
             ip -o -4 addr show | awk -v a={remote_addr} '{{split($4, x, \"/\"); if (x[1] == a) {{print $2; exit}}}}'"),
            "probing the host",
            None,
        )?;
        let l = lines_of(&probe);
        let get = |i: usize| l.get(i).cloned().unwrap_or_default();
        let (arch, kernel, hostname, path, their_version) =
            (get(0), get(1), get(2), get(3), get(4));
        if arch.is_empty() {
            return Err(format!("{dest}: unexpected answer to uname: {probe:?}"));
        }
        let iface = get(7);
        if iface.is_empty() {
            return Err(format!(
                "{dest} has no interface with address {remote_addr} (--remote-addr; see ip -4 addr there)"
            ));
        }
        let mut notes = vec![];
        let mut copied = None;
        let mut keeper = None;
        let nanowire = if path != "-" && their_version == version {
            notes.push(format!("{dest}: using the installed {version} at {path}"));
            path
        } else {
            if arch != std::env::consts::ARCH {
                return Err(format!(
                    "{dest} is {arch} and this nanowire is {}: install nanowire {} there (make install, or the .deb) and run again",
                    std::env::consts::ARCH,
                    env!("CARGO_PKG_VERSION")
                ));
            }
            let dir = ssh
                .run(
                    "umask 077; mktemp -d /tmp/nanowire.XXXXXXXX",
                    "creating a directory for nanowire",
                    None,
                )?
                .trim()
                .to_string();
            if !dir.starts_with("/tmp/nanowire.") || dir.contains('\'') {
                return Err(format!("{dest}: mktemp answered {dir:?}"));
            }
            // Remove it when this report ends, however it ends.
            let mut k = ssh.command(&format!("cat >/dev/null; rm -rf {}", shq(&dir)));
            k.stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            keeper = Some(
                k.spawn()
                    .map_err(|e| format!("cannot run ssh (install openssh-client): {e}"))?,
            );
            let exe = Path::new(local_exe);
            ssh.run(
                &format!(
                    "cat > {}/nanowire && chmod 0700 {}/nanowire",
                    shq(&dir),
                    shq(&dir)
                ),
                "copying nanowire",
                Some(exe),
            )?;
            if let Some(shim) = local_shim(exe) {
                ssh.run(
                    &format!("cat > {}/libnanowire_preload.so", shq(&dir)),
                    "copying the shim",
                    Some(&shim),
                )?;
            }
            notes.push(format!(
                "{dest}: {} there, so this {version} ({arch}) was copied to {dir} for this report (removed at the end)",
                if path == "-" {
                    "nanowire is not installed".to_string()
                } else {
                    format!("{path} is {their_version}")
                }
            ));
            copied = Some(dir.clone());
            format!("{dir}/nanowire")
        };
        // Host b's view of its interface (driver, offloads, XDP modes, findings).
        let json = ssh.run(
            &format!(
                "{PATH_FIX} {} doctor {} --json",
                shq(&nanowire),
                shq(&iface)
            ),
            &format!("nanowire doctor {iface}"),
            None,
        )?;
        let doctor: Option<serde_json::Value> = serde_json::from_str(&json).ok();
        let driver = doctor
            .as_ref()
            .and_then(|d| d["interfaces"][0]["driver"].as_str().map(String::from));
        let b = HostInfo {
            hostname,
            arch,
            kernel,
            iface,
            addr: remote_addr.to_string(),
            driver,
            cpu_model: Some(get(5)).filter(|s| !s.is_empty()),
            cpus: get(6).parse().ok(),
            doctor,
        };
        Ok(Remote {
            ssh,
            local_addr,
            remote_addr,
            local_exe: local_exe.to_string(),
            nanowire,
            copied,
            a,
            b,
            notes,
            keeper,
        })
    }

    /// A command running `argv` in host b under `hostexec`.
    pub fn command(&self, argv: &[String]) -> Command {
        let mut line = format!("{PATH_FIX} exec {} lab hostexec --", shq(&self.nanowire));
        for (i, a) in argv.iter().enumerate() {
            let a = if i == 0 && *a == self.local_exe {
                self.nanowire.as_str()
            } else {
                a.as_str()
            };
            line.push(' ');
            line.push_str(&shq(a));
        }
        self.ssh.command(&line)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // End of input: the keeper session removes the copied nanowire.
        if let Some(mut k) = self.keeper.take() {
            drop(k.stdin.take());
            let (tx, rx) = channel();
            std::thread::spawn(move || {
                let _ = tx.send(k.wait());
            });
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }
    }
}

/// The CPU time (user + system, seconds) process `pid` has used so far
/// (what `hostexec` reports on its `CPU` line).
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((ut + st) / 100.0)
}

/// `nanowire lab hostexec -- ARGV` (in host b): run ARGV in its own process
/// group for as long as this ssh session's stdin is open.
pub fn hostexec(argv: &[String]) -> Result<i32, String> {
    let Some((prog, rest)) = argv.split_first() else {
        return Err("hostexec: nothing to run".into());
    };
    let mut child = Command::new(prog)
        .args(rest)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    let pid = child.id();
    let mut child_in = child.stdin.take();
    eprintln!("{READY} {pid}");
    // The command's stderr goes through here, whole lines at a time: the
    // control lines (READY above, CPU answers) never interleave with its output.
    let fwd = child.stderr.take().map(|err| {
        std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(err);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        let mut e = std::io::stderr().lock();
                        let _ = e.write_all(&line).and_then(|_| e.flush());
                    }
                }
            }
        })
    });
    enum Ev {
        Line(String),
        Eof,
        Exited(std::io::Result<std::process::ExitStatus>),
    }
    let (tx, rx) = channel();
    let t = tx.clone();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            match l {
                Ok(l) => {
                    if t.send(Ev::Line(l)).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = t.send(Ev::Eof);
    });
    std::thread::spawn(move || {
        let _ = tx.send(Ev::Exited(child.wait()));
    });
    let group = rustix::process::Pid::from_raw(pid as i32);
    let kill = |sig| {
        if let Some(g) = group {
            let _ = rustix::process::kill_process_group(g, sig);
        }
    };
    loop {
        match rx.recv() {
            Ok(Ev::Line(l)) if l == "close" => {
                child_in.take();
            }
            Ok(Ev::Line(l)) if l == "cpu" => {
                let mut e = std::io::stderr().lock();
                let _ = writeln!(e, "{CPU} {}", proc_cpu_seconds(pid).unwrap_or(-1.0));
            }
            Ok(Ev::Line(_)) => {}
            Ok(Ev::Exited(st)) => {
                // Whatever the command left in its group goes with it.
                kill(rustix::process::Signal::KILL);
                if let Some(t) = fwd {
                    let _ = t.join();
                }
                use std::os::unix::process::ExitStatusExt;
                return Ok(match st {
                    Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9)),
                    Err(_) => 1,
                });
            }
            Ok(Ev::Eof) | Err(_) => {
                // The report is gone (or done with it): end the command.
                kill(rustix::process::Signal::TERM);
                let end = std::time::Instant::now() + Duration::from_millis(500);
                while std::time::Instant::now() < end {
                    if let Ok(Ev::Exited(_)) = rx.recv_timeout(Duration::from_millis(20)) {
                        break;
                    }
                }
                kill(rustix::process::Signal::KILL);
                if let Some(t) = fwd {
                    let _ = t.join();
                }
                return Ok(143);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shq;

    #[test]
    fn shell_quoting() {
        assert_eq!(shq("bench"), "bench");
        assert_eq!(shq("198.18.0.2"), "198.18.0.2");
        assert_eq!(shq(""), "''");
        assert_eq!(shq("a b"), "'a b'");
        assert_eq!(shq("it's"), "'it'\\''s'");
        assert_eq!(shq("$(rm -rf /)"), "'$(rm -rf /)'");
    }
}
