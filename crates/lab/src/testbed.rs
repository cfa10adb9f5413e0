//! Two hosts on one machine: namespaces `<name>-a` and `<name>-b` joined by
//! the veth pair `<name>-a0` / `<name>-b0`, addressed 198.18.0.1/24 and
//! 198.18.0.2/24 (the RFC 2544 benchmarking range).
//!
//! `up` is idempotent and repairs a half-built lab; `down` removes
//! everything `up` made (deleting the namespaces deletes the veth pair and
//! with it any XDP program attached to it).

use serde::Serialize;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

pub const DEFAULT_NAME: &str = "nw";
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const PREFIX_LEN: u8 = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Host {
    A,
    B,
}

impl Host {
    pub fn peer(self) -> Host {
        match self {
            Host::A => Host::B,
            Host::B => Host::A,
        }
    }
}

impl std::str::FromStr for Host {
    type Err = String;
    fn from_str(s: &str) -> Result<Host, String> {
        match s {
            "a" | "A" => Ok(Host::A),
            "b" | "B" => Ok(Host::B),
            o => Err(format!("unknown lab host {o:?}: expected a or b")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Prefix of every object the lab makes (namespaces, interfaces).
    pub name: String,
    /// RX/TX queues of each veth end (AF_XDP binds one socket per queue).
    pub queues: u32,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            name: DEFAULT_NAME.to_string(),
            queues: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HostStatus {
    pub netns: String,
    pub iface: String,
    pub addr: Ipv4Addr,
    pub mac: Option<String>,
    pub up: bool,
    pub driver: Option<String>,
    /// XDP program attached to the interface, as `ip -d link` reports it.
    pub xdp: Option<String>,
    /// Offload settings (`ethtool -k`), name -> on/off.
    pub offloads: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LabStatus {
    pub name: String,
    pub complete: bool,
    pub a: Option<HostStatus>,
    pub b: Option<HostStatus>,
}

#[derive(Debug, Clone)]
pub struct Lab {
    opts: LabOptions,
}

pub type Error = String;

fn run(cmd: &mut Command) -> Result<String, Error> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        let args: Vec<_> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return Err(format!(
            "`{} {}` failed: {}",
            cmd.get_program().to_string_lossy(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String, Error> {
    run(Command::new("ip").args(args))
}

/// True when this process may create namespaces and attach XDP programs.
pub fn have_root() -> bool {
    rustix::process::geteuid().is_root()
}

impl Lab {
    pub fn new(opts: LabOptions) -> Result<Lab, Error> {
        let n = &opts.name;
        if n.is_empty() || n.len() > 12 || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(format!(
                "lab name {n:?} must be 1-12 characters of [A-Za-z0-9_] (interface names are limited to 15)"
            ));
        }
        if opts.queues == 0 || opts.queues > 64 {
            return Err(format!("lab queues must be 1..=64, got {}", opts.queues));
        }
        Ok(Lab { opts })
    }

    pub fn named(name: &str) -> Result<Lab, Error> {
        Lab::new(LabOptions {
            name: name.to_string(),
            ..LabOptions::default()
        })
    }

    pub fn name(&self) -> &str {
        &self.opts.name
    }
    pub fn netns(&self, h: Host) -> String {
        match h {
            Host::A => format!("{}-a", self.opts.name),
            Host::B => format!("{}-b", self.opts.name),
        }
    }
    pub fn iface(&self, h: Host) -> String {
        format!("{}0", self.netns(h))
    }
    pub fn addr(&self, h: Host) -> Ipv4Addr {
        match h {
            Host::A => ADDR_A,
            Host::B => ADDR_B,
        }
    }

    fn netns_exists(&self, h: Host) -> bool {
        std::path::Path::new("/run/netns")
            .join(self.netns(h))
            .exists()
    }

    fn link_in_ns(&self, h: Host) -> bool {
        ip(&["-n", &self.netns(h), "link", "show", "dev", &self.iface(h)]).is_ok()
    }

    /// Build the lab, or repair whatever part of it is missing. Idempotent.
    pub fn up(&self) -> Result<LabStatus, Error> {
        if !have_root() {
            return Err(
                "the lab needs root: network namespaces and veth cannot be created otherwise"
                    .into(),
            );
        }
        for h in [Host::A, Host::B] {
            if !self.netns_exists(h) {
                ip(&["netns", "add", &self.netns(h)])?;
            }
        }
        let (a_ok, b_ok) = (self.link_in_ns(Host::A), self.link_in_ns(Host::B));
        if !(a_ok && b_ok) {
            // Half-built: remove whichever end survived (wherever it is) and start over.
            for h in [Host::A, Host::B] {
                let _ = ip(&["-n", &self.netns(h), "link", "del", "dev", &self.iface(h)]);
                let _ = ip(&["link", "del", "dev", &self.iface(h)]);
            }
            let q = self.opts.queues.to_string();
            ip(&[
                "link",
                "add",
                &self.iface(Host::A),
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "netns",
                &self.netns(Host::A),
                "type",
                "veth",
                "peer",
                "name",
                &self.iface(Host::B),
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "netns",
                &self.netns(Host::B),
            ])?;
        }
        for h in [Host::A, Host::B] {
            let ns = self.netns(h);
            // IPv6 off: no DAD, router solicitations or MLD noise during measurements.
            let _ = run(Command::new("ip").args([
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
            ]));
            ip(&["-n", &ns, "link", "set", "dev", "lo", "up"])?;
            let cidr = format!("{}/{}", self.addr(h), PREFIX_LEN);
            ip(&["-n", &ns, "addr", "replace", &cidr, "dev", &self.iface(h)])?;
            ip(&["-n", &ns, "link", "set", "dev", &self.iface(h), "up"])?;
        }
        let st = self.status();
        if !st.complete {
            return Err(format!(
                "lab {} did not come up completely: {st:?}",
                self.name()
            ));
        }
        Ok(st)
    }

    /// Remove everything `up` made. Succeeds when nothing is left.
    pub fn down(&self) -> Result<(), Error> {
        if !have_root() {
            return Err("the lab needs root to remove network namespaces".into());
        }
        let mut errs = Vec::new();
        for h in [Host::A, Host::B] {
            // An end that escaped to the root namespace (crash mid-build).
            let _ = ip(&["link", "del", "dev", &self.iface(h)]);
            if self.netns_exists(h)
                && let Err(e) = ip(&["netns", "del", &self.netns(h)])
            {
                errs.push(e);
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }

    fn host_status(&self, h: Host) -> Option<HostStatus> {
        if !self.netns_exists(h) {
            return None;
        }
        let ns = self.netns(h);
        let dev = self.iface(h);
        let link = ip(&["-n", &ns, "-d", "link", "show", "dev", &dev]).ok()?;
        let mac = link
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .map(str::to_string);
        let up = link.contains("state UP") || link.contains(",UP");
        let xdp = link
            .lines()
            .find(|l| l.contains("prog/xdp"))
            .map(|l| l.trim().to_string());
        let in_ns = |args: &[&str]| {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns]).args(args);
            run(&mut c).ok()
        };
        let driver = in_ns(&["ethtool", "-i", &dev]).and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("driver:").map(|d| d.trim().to_string()))
        });
        let offloads = in_ns(&["ethtool", "-k", &dev])
            .map(|s| {
                s.lines()
                    .filter_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        let v = v.split_whitespace().next()?;
                        (v == "on" || v == "off").then(|| (k.trim().to_string(), v.to_string()))
                    })
                    .filter(|(k, _)| {
                        matches!(
                            k.as_str(),
                            "rx-checksumming"
                                | "tx-checksumming"
                                | "scatter-gather"
                                | "tcp-segmentation-offload"
                                | "generic-segmentation-offload"
                                | "generic-receive-offload"
                                | "rx-gro-hw"
                                | "rx-udp-gro-forwarding"
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(HostStatus {
            netns: ns,
            iface: dev,
            addr: self.addr(h),
            mac,
            up,
            driver,
            xdp,
            offloads,
        })
    }

    pub fn status(&self) -> LabStatus {
        let a = self.host_status(Host::A);
        let b = self.host_status(Host::B);
        let complete = a.as_ref().is_some_and(|s| s.up) && b.as_ref().is_some_and(|s| s.up);
        LabStatus {
            name: self.name().to_string(),
            complete,
            a,
            b,
        }
    }

    /// A command that runs `argv` inside host `h`'s namespace.
    ///
    /// The command is killed (SIGKILL) when the thread that spawned it exits:
    /// `setpriv --pdeathsig` sets PR_SET_PDEATHSIG, which survives the execs
    /// of `ip netns exec` and of `nanowire run`. A test or report that dies
    /// hard (SIGKILL, timeout) therefore never leaves a spinning peer behind
    /// in a namespace that no longer exists.
    pub fn command(&self, h: Host, argv: &[impl AsRef<std::ffi::OsStr>]) -> Command {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &self.netns(h),
            "setpriv",
            "--pdeathsig",
            "KILL",
            "--",
        ]);
        c.args(argv);
        c
    }
}

/// A lab that is brought up on creation and taken down on drop: for tests.
pub struct ScopedLab {
    pub lab: Lab,
}

impl ScopedLab {
    pub fn new(opts: LabOptions) -> Result<ScopedLab, Error> {
        let lab = Lab::new(opts)?;
        let _ = lab.down();
        lab.up()?;
        Ok(ScopedLab { lab })
    }
}

impl std::ops::Deref for ScopedLab {
    type Target = Lab;
    fn deref(&self) -> &Lab {
        &self.lab
    }
}

impl Drop for ScopedLab {
    fn drop(&mut self) {
        let _ = self.lab.down();
    }
}
