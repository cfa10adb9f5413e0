//! The environment a result was measured in.

use serde::Serialize;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Env {
    pub kernel: String,
    pub cpu_model: String,
    pub nproc: usize,
    /// Interface that owns the local address (None for 0.0.0.0 or unknown).
    pub iface: Option<String>,
    /// Its driver (`ethtool -i`, else sysfs).
    pub driver: Option<String>,
    pub hostname: String,
    /// Network namespace name when run through `ip netns exec`.
    pub netns: Option<String>,
}

fn read_trim(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The interface holding IPv4 address `addr` in this network namespace.
pub fn iface_of(addr: Ipv4Addr) -> Option<String> {
    if addr.is_unspecified() {
        return None;
    }
    if addr.is_loopback() {
        return Some("lo".into());
    }
    let out = output("ip", &["-o", "-4", "addr", "show"])?;
    // "2: nw-a0    inet 198.18.0.1/24 brd ... scope global nw-a0\ ..."
    out.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let _idx = w.next()?;
        let name = w.next()?;
        let _inet = w.next()?;
        let cidr = w.next()?;
        let ip = cidr.split('/').next()?;
        (ip.parse::<Ipv4Addr>().ok()? == addr).then(|| name.trim_end_matches(':').to_string())
    })
}

/// The driver behind an interface.
pub fn driver_of(iface: &str) -> Option<String> {
    let from_ethtool = output("ethtool", &["-i", iface]).and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("driver:").map(|d| d.trim().to_string()))
    });
    if let Some(d) = from_ethtool.filter(|d| !d.is_empty()) {
        return Some(d);
    }
    let link = std::fs::read_link(format!("/sys/class/net/{iface}/device/driver")).ok()?;
    link.file_name().map(|f| f.to_string_lossy().into_owned())
}

impl Env {
    /// Describe this machine; `local` is the address the benchmark used.
    pub fn detect(local: Option<Ipv4Addr>) -> Env {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == "model name").then(|| v.trim().to_string())
                })
            })
            .unwrap_or_default();
        let iface = local.and_then(iface_of);
        let driver = iface.as_deref().and_then(driver_of);
        Env {
            kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
            cpu_model,
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            iface,
            driver,
            hostname: read_trim("/proc/sys/kernel/hostname").unwrap_or_default(),
            netns: output("ip", &["netns", "identify"])
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
        }
    }
}
