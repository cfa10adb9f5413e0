//! The environment a result was measured in.

use serde::Serialize;

use nanowire_doctor::{read, tool};
use std::net::Ipv4Addr;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
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
    /// What this machine runs on (see [`virtualization`]).
    pub virtualization: String,
}

/// Name the virtualization from evidence, most specific first: the
/// hypervisor (CPUID flag, kvm-clock, the kernel's "Hypervisor detected"),
/// the VMM (Firecracker's init on the kernel command line; Firecracker
/// guests have no DMI tables), then a container. `systemd-detect-virt`
/// answers "docker" inside a Firecracker guest whose root file system came
/// from a Docker image (it sees /.dockerenv first), so it is only a witness.
/// Returns the name and the evidence behind it.
pub fn virtualization() -> (String, Vec<String>) {
    let mut ev = vec![];
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hv_flag = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.split_whitespace().any(|f| f == "hypervisor"));
    if hv_flag {
        ev.push("cpuinfo: hypervisor flag".to_string());
    }
    let clocks = read("/sys/devices/system/clocksource/clocksource0/available_clocksource")
        .unwrap_or_default();
    let mut hv = None;
    if clocks.contains("kvm-clock") {
        ev.push("clocksource: kvm-clock available".into());
        hv = Some("KVM");
    }
    if let Some(d) = tool("dmesg", &[])
        && let Some(l) = d.lines().find(|l| l.contains("Hypervisor detected"))
    {
        let name = l.rsplit(':').next().unwrap_or("").trim().to_string();
        ev.push(format!("kernel log: Hypervisor detected: {name}"));
        if hv.is_none() && !name.is_empty() {
            hv = Some(if name == "KVM" { "KVM" } else { "other" });
            if name != "KVM" {
                ev.push(format!("hypervisor {name}"));
            }
        }
    }
    let dmi =
        read("/sys/class/dmi/id/sys_vendor").or_else(|| read("/sys/class/dmi/id/product_name"));
    if let Some(d) = &dmi {
        ev.push(format!("DMI vendor: {d}"));
    } else {
        ev.push("no DMI tables".into());
    }
    let cmdline = read("/proc/cmdline").unwrap_or_default();
    let vmm = if cmdline.contains("firecracker") {
        ev.push("kernel command line: firecracker init".into());
        Some("Firecracker microVM")
    } else {
        match dmi.as_deref() {
            Some(d) if d.contains("QEMU") => Some("QEMU VM"),
            Some(d) if d.contains("Amazon EC2") => Some("EC2 instance"),
            Some(d) if d.contains("Google") => Some("GCE VM"),
            Some(d) if d.contains("Microsoft") => Some("Hyper-V VM"),
            Some(d) if d.contains("VMware") => Some("VMware VM"),
            _ => None,
        }
    };
    let sdv = tool("systemd-detect-virt", &[]).map(|s| s.trim().to_string());
    if let Some(v) = &sdv {
        ev.push(format!("systemd-detect-virt: {v}"));
    }
    let docker = std::path::Path::new("/.dockerenv").exists();
    if docker {
        ev.push("/.dockerenv present (root file system from a Docker image)".into());
    }
    let name = match (vmm, hv, hv_flag) {
        (Some(v), Some(h), _) => format!("{v} on {h}"),
        (Some(v), None, _) => v.to_string(),
        (None, Some(h), _) => format!("{h} virtual machine"),
        (None, None, true) => "virtual machine (hypervisor not identified)".into(),
        (None, None, false) => match sdv.as_deref() {
            Some("none") | None if !docker => "bare metal".into(),
            Some(v) if v != "none" => format!("container ({v})"),
            _ => "container (docker)".into(),
        },
    };
    (name, ev)
}

/// The interface holding IPv4 address `addr` in this network namespace.
pub fn iface_of(addr: Ipv4Addr) -> Option<String> {
    if addr.is_unspecified() {
        return None;
    }
    if addr.is_loopback() {
        return Some("lo".into());
    }
    let out = tool("ip", &["-o", "-4", "addr", "show"])?;
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
    let from_ethtool = tool("ethtool", &["-i", iface]).and_then(|s| {
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
            kernel: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
            cpu_model,
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            iface,
            driver,
            hostname: read("/proc/sys/kernel/hostname").unwrap_or_default(),
            netns: tool("ip", &["netns", "identify"])
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
            virtualization: virtualization().0,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn virtualization_has_a_name_and_evidence() {
        let (name, ev) = super::virtualization();
        assert!(!name.is_empty());
        assert!(!ev.is_empty(), "{name}");
        eprintln!("{name}: {ev:?}");
    }
}
