//! `nanowire doctor [IFACE...]`: what decides, on this host and for each
//! interface, whether acceleration will work and how well, each finding
//! with the one thing to do about it. Read-only: every probe reads sysfs,
//! procfs, netlink or `ethtool`/`ip` output and changes nothing.
//!
//! Run it where the application will run: in a network namespace with
//! `ip netns exec NS nanowire doctor IFACE` (sysfs and netlink then show
//! that namespace's interfaces).
#![forbid(unsafe_code)]

use clap::Args;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

#[derive(Debug, Args)]
#[command(
    about = "Check what decides whether acceleration works, and how well, on this host and its interfaces",
    after_help = "Example: nanowire doctor eth0 --json\n\
                  In a namespace: ip netns exec NS nanowire doctor IFACE"
)]
pub struct DoctorArgs {
    /// Interfaces to check (default: every interface but lo).
    pub ifaces: Vec<String>,
    /// One JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How much a finding matters for acceleration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// As good as it gets.
    Ok,
    /// Worth knowing; nothing to change for most uses.
    Info,
    /// Works, but costs latency or throughput.
    Warn,
    /// Acceleration will not work (or not as asked).
    Bad,
}

impl Level {
    fn tag(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Bad => "BAD",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Which probe: driver, queues, irq, xdp, zero-copy, multi-buffer, mtu,
    /// offloads, busy-poll, cpu-isolation, governor, c-states, hugepages,
    /// privilege, memlock, xdp-attached.
    pub check: &'static str,
    pub level: Level,
    /// What was found and what it does to the engine.
    pub what: String,
    /// The one thing to do about it (absent when nothing needs doing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn finding(check: &'static str, level: Level, what: String, fix: Option<String>) -> Finding {
    Finding {
        check,
        level,
        what,
        fix,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Irq {
    pub irq: u32,
    pub name: String,
    pub cpus: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IfaceReport {
    pub name: String,
    pub ifindex: u32,
    pub driver: Option<String>,
    pub driver_version: Option<String>,
    pub firmware: Option<String>,
    pub bus_info: Option<String>,
    pub mtu: u32,
    pub rx_queues: u32,
    pub tx_queues: u32,
    pub irqs: Vec<Irq>,
    /// `xdp-features` names, `None` when the kernel does not report them.
    pub xdp_features: Option<Vec<&'static str>>,
    pub xsk_features: Option<Vec<&'static str>>,
    pub xdp_zc_max_segs: Option<u32>,
    /// The engine's UMEM frame size for this MTU, and whether packets span frames.
    pub frame_size: u32,
    pub multi_buffer: bool,
    /// Programs attached now: [{mode: driver|generic|offload, id, name}].
    pub xdp_attached: Vec<Value>,
    /// ethtool -k, the features that matter to the engine.
    pub offloads: BTreeMap<String, String>,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    pub hostname: Option<String>,
    pub kernel: Option<String>,
    pub arch: String,
    pub cpus: usize,
    pub isolated_cpus: Option<String>,
    pub nohz_full: Option<String>,
    /// governor -> number of CPUs using it.
    pub governors: BTreeMap<String, usize>,
    pub cpuidle_driver: Option<String>,
    pub sysctls: BTreeMap<String, Option<String>>,
    pub hugepages_total: Option<u64>,
    pub hugepage_size_kb: Option<u64>,
    pub transparent_hugepage: Option<String>,
    pub privileged: bool,
    pub memlock: Option<String>,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub host: HostReport,
    pub interfaces: Vec<IfaceReport>,
}

/// A file's contents, trimmed; `None` when it cannot be read.
pub fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// stdout of a tool, `None` when it is missing or fails.
pub fn tool(prog: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// `key: value` lines (ethtool -i, ethtool -k).
fn kv(s: &str) -> BTreeMap<String, String> {
    s.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.len() < 16 && !n.contains('/') && n != "." && n != ".."
}

/// The engine's UMEM frame for an MTU (crates/stack/src/xdp: 2 KiB frames hold
/// MTU 1500 with the kernel's 256 B headroom, 4 KiB up to MTU 3826, beyond
/// 4 KiB frames and multi-buffer packets).
pub fn frame_for_mtu(mtu: u32) -> (u32, bool) {
    let eth = mtu + 14;
    if eth <= 2048 - 256 {
        (2048, false)
    } else if eth <= 4096 - 256 {
        (4096, false)
    } else {
        (4096, true)
    }
}

/// The interfaces to check: the ones named, each of which must exist here.
pub fn resolve(names: &[String]) -> Result<Vec<String>, String> {
    if names.is_empty() {
        let mut all: Vec<String> = std::fs::read_dir("/sys/class/net")
            .map_err(|e| format!("cannot list /sys/class/net: {e}"))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "lo")
            .collect();
        all.sort();
        return Ok(all);
    }
    for n in names {
        if !valid_name(n) || !Path::new("/sys/class/net").join(n).exists() {
            return Err(format!(
                "no network interface named {n:?} here (ip link lists them; in a namespace: ip netns exec NS nanowire doctor)"
            ));
        }
    }
    Ok(names.to_vec())
}

pub fn run(args: DoctorArgs) -> Result<i32, String> {
    let ifaces = resolve(&args.ifaces)?;
    let report = Report {
        schema: "nanowire-doctor/1",
        host: host(),
        interfaces: ifaces.iter().map(|n| iface(n)).collect(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", render(&report));
    }
    Ok(0)
}

fn render_findings(out: &mut String, f: &[Finding]) {
    for x in f {
        out.push_str(&format!(
            "  [{:<4}] {:<13} {}\n",
            x.level.tag(),
            x.check,
            x.what
        ));
        if let Some(fix) = &x.fix {
            out.push_str(&format!("  {:<20} -> {fix}\n", ""));
        }
    }
}

pub fn render(r: &Report) -> String {
    let h = &r.host;
    let mut out = format!(
        "host {} ({}, {}, {} CPUs)\n",
        h.hostname.as_deref().unwrap_or("?"),
        h.kernel.as_deref().unwrap_or("?"),
        h.arch,
        h.cpus
    );
    render_findings(&mut out, &h.findings);
    for i in &r.interfaces {
        out.push_str(&format!(
            "\ninterface {} (driver {}, {} rx / {} tx queues, MTU {})\n",
            i.name,
            i.driver.as_deref().unwrap_or("?"),
            i.rx_queues,
            i.tx_queues,
            i.mtu
        ));
        render_findings(&mut out, &i.findings);
    }
    if r.interfaces.is_empty() {
        out.push_str("\nno interfaces to check\n");
    }
    out
}

// ---------------------------------------------------------------- host

fn sysctl(name: &str) -> Option<String> {
    read(format!("/proc/sys/{}", name.replace('.', "/")))
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn cmdline_param(cmdline: &str, key: &str) -> Option<String> {
    cmdline.split_whitespace().find_map(|w| {
        w.strip_prefix(key)
            .and_then(|r| r.strip_prefix('='))
            .map(String::from)
    })
}

fn meminfo(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|r| r.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CAP_IPC_LOCK (bit 14) in the effective set: UMEM is then not charged to RLIMIT_MEMLOCK.
fn has_ipc_lock() -> bool {
    read("/proc/self/status")
        .and_then(|s| nanowire_xdp::privilege::cap_eff(&s))
        .is_some_and(|e| e & (1 << 14) != 0)
}

pub fn host() -> HostReport {
    let mut f = vec![];
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // Privilege.
    let privileged = match nanowire_xdp::privilege::check() {
        Ok(()) => {
            f.push(finding(
                "privilege",
                Level::Ok,
                "this user may open AF_XDP sockets and attach XDP programs (CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF)".into(),
                None,
            ));
            true
        }
        Err(why) => {
            f.push(finding(
                "privilege",
                Level::Bad,
                format!("{why}: the xdp engine falls back to spin (kernel sockets, polled)"),
                Some("run as root, or give the program CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF (setcap ... +ep, or AmbientCapabilities= in its systemd unit)".into()),
            ));
            false
        }
    };
    let limits = read("/proc/self/limits");
    let memlock = limits.as_deref().and_then(|l| {
        l.lines()
            .find(|x| x.starts_with("Max locked memory"))
            .map(|x| {
                x.split_whitespace()
                    .skip(3)
                    .take(1)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
    });
    match memlock.as_deref() {
        Some("unlimited") | None => {}
        Some(_) if has_ipc_lock() => {}
        Some(v) => f.push(finding(
            "memlock",
            Level::Warn,
            format!("RLIMIT_MEMLOCK is {v} bytes and this user lacks CAP_IPC_LOCK: every UMEM (ring depth x frame size per RX queue, 8 MiB per queue at the default depth) is charged to it, and a socket that does not fit fails to open"),
            Some("raise it (ulimit -l unlimited, LimitMEMLOCK=infinity in a systemd unit) or grant CAP_IPC_LOCK".into()),
        )),
    }
    // CPU isolation.
    let cmdline = read("/proc/cmdline").unwrap_or_default();
    let isolated = read("/sys/devices/system/cpu/isolated")
        .filter(|s| !s.is_empty())
        .or_else(|| cmdline_param(&cmdline, "isolcpus"));
    let nohz = read("/sys/devices/system/cpu/nohz_full")
        .filter(|s| !s.is_empty() && s != "(null)")
        .or_else(|| cmdline_param(&cmdline, "nohz_full"));
    match (&isolated, &nohz) {
        (None, _) => f.push(finding(
            "cpu-isolation",
            Level::Warn,
            format!("no isolated CPUs (of {cpus}): the spinning engines share their CPU with other tasks, kernel threads and timer ticks, which shows up in the tails"),
            Some("boot with isolcpus=managed_irq,domain,N-M nohz_full=N-M rcu_nocbs=N-M and pin the application there (nanowire bench --cpu, taskset)".into()),
        )),
        (Some(i), None) => f.push(finding(
            "cpu-isolation",
            Level::Info,
            format!("isolated CPUs {i}, but no nohz_full: the scheduler tick still interrupts a spinning engine every 1-4 ms"),
            Some(format!("add nohz_full={i} rcu_nocbs={i} to the kernel command line")),
        )),
        (Some(i), Some(n)) => f.push(finding(
            "cpu-isolation",
            Level::Ok,
            format!("isolated CPUs {i}, nohz_full {n}: pin the application there"),
            None,
        )),
    }
    // Frequency governor.
    let mut governors: BTreeMap<String, usize> = BTreeMap::new();
    for c in 0..cpus {
        if let Some(g) = read(format!(
            "/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor"
        )) {
            *governors.entry(g).or_default() += 1;
        }
    }
    if governors.is_empty() {
        f.push(finding(
            "governor",
            Level::Info,
            "no cpufreq interface (a virtual machine, or firmware-controlled frequency): whoever runs the host decides the clock".into(),
            None,
        ));
    } else if governors.keys().all(|g| g == "performance") {
        f.push(finding(
            "governor",
            Level::Ok,
            "every CPU runs the performance governor".into(),
            None,
        ));
    } else {
        let list: Vec<String> = governors
            .iter()
            .map(|(g, n)| format!("{g} on {n}"))
            .collect();
        f.push(finding(
            "governor",
            Level::Warn,
            format!("frequency governor {}: a CPU that idles between messages slows down, and the next message pays for the ramp", list.join(", ")),
            Some("cpupower frequency-set -g performance (or echo performance > /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor)".into()),
        ));
    }
    // C-states.
    let cpuidle_driver = read("/sys/devices/system/cpu/cpuidle/current_driver");
    let mut deep = vec![];
    if let Ok(rd) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cpuidle") {
        let mut states: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        states.sort();
        for s in states {
            let lat: u64 = read(s.join("latency"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let disabled = read(s.join("disable")).as_deref() == Some("1");
            if lat > 10 && !disabled {
                deep.push(format!(
                    "{} ({lat} µs)",
                    read(s.join("name")).unwrap_or_else(|| "?".into())
                ));
            }
        }
    }
    if deep.is_empty() {
        f.push(finding(
            "c-states",
            Level::Ok,
            match &cpuidle_driver {
                Some(d) => format!("cpuidle driver {d}: no idle state with an exit latency above 10 µs enabled"),
                None => "no cpuidle states exposed (a virtual machine, or idle=poll): nothing to tune here".into(),
            },
            None,
        ));
    } else {
        f.push(finding(
            "c-states",
            Level::Warn,
            format!("deep idle states enabled: {}; an engine that sleeps between messages (the balanced profile's spin-then-block) wakes through them", deep.join(", ")),
            Some("cpupower idle-set -D 10 (or intel_idle.max_cstate=1 processor.max_cstate=1 on the kernel command line); the latency profile spins and never idles".into()),
        ));
    }
    // Busy polling (kernel sockets only).
    let mut sysctls = BTreeMap::new();
    for k in [
        "net.core.busy_poll",
        "net.core.busy_read",
        "net.core.rmem_max",
        "net.core.wmem_max",
    ] {
        sysctls.insert(k.to_string(), sysctl(k));
    }
    let bp = |k: &str| {
        sysctls
            .get(k)
            .cloned()
            .flatten()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (bp("net.core.busy_poll"), bp("net.core.busy_read")) {
        (Some(0), Some(0)) => f.push(finding(
            "busy-poll",
            Level::Info,
            "kernel busy polling is off (busy_poll=0, busy_read=0): this only matters for the kernel engine and for sockets nanowire leaves to the kernel; the spin and xdp engines poll by themselves".into(),
            Some("for a kernel baseline that polls too: sysctl -w net.core.busy_poll=50 net.core.busy_read=50".into()),
        )),
        (Some(p), Some(r)) => f.push(finding(
            "busy-poll",
            Level::Ok,
            format!("kernel busy polling on (busy_poll={p}, busy_read={r}) for kernel sockets; the spin and xdp engines poll by themselves"),
            None,
        )),
        _ => f.push(finding(
            "busy-poll",
            Level::Info,
            "net.core.busy_poll/busy_read are not visible here (a network namespace other than the initial one, where they live, or a kernel without CONFIG_NET_RX_BUSY_POLL); they only matter for kernel sockets".into(),
            None,
        )),
    }
    // Hugepages: nanowire's UMEM is ordinary pages.
    let hugepages_total = meminfo("HugePages_Total");
    let hugepage_size_kb = meminfo("Hugepagesize");
    let thp = read("/sys/kernel/mm/transparent_hugepage/enabled").and_then(|s| {
        s.split_whitespace()
            .find(|w| w.starts_with('['))
            .map(|w| w.trim_matches(['[', ']']).to_string())
    });
    f.push(finding(
        "hugepages",
        Level::Info,
        format!(
            "{} hugepages of {} KiB reserved, transparent hugepages {}: nanowire's UMEM uses ordinary 4 KiB pages (a 2 KiB frame never crosses a page), so none are needed",
            hugepages_total.map_or("?".into(), |v| v.to_string()),
            hugepage_size_kb.map_or("?".into(), |v| v.to_string()),
            thp.as_deref().unwrap_or("unknown")
        ),
        None,
    ));
    HostReport {
        hostname: read("/proc/sys/kernel/hostname"),
        kernel: read("/proc/sys/kernel/osrelease").map(|r| format!("Linux {r}")),
        arch: std::env::consts::ARCH.to_string(),
        cpus,
        isolated_cpus: isolated,
        nohz_full: nohz,
        governors,
        cpuidle_driver,
        sysctls,
        hugepages_total,
        hugepage_size_kb,
        transparent_hugepage: thp,
        privileged,
        memlock,
        findings: f,
    }
}

// ---------------------------------------------------------------- interface

/// Interrupts of a device: its MSI vectors, else /proc/interrupts lines naming it.
fn irqs(name: &str) -> Vec<Irq> {
    let table = read("/proc/interrupts").unwrap_or_default();
    let label = |irq: u32| -> String {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{irq}:")))
            .and_then(|l| l.split_whitespace().last())
            .unwrap_or("")
            .to_string()
    };
    let mut nums: Vec<u32> = std::fs::read_dir(format!("/sys/class/net/{name}/device/msi_irqs"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if nums.is_empty() {
        // Named vectors: the interface's name, or its device's (virtio0-input.0).
        let mut names = vec![name.to_string()];
        if let Ok(dev) = std::fs::read_link(format!("/sys/class/net/{name}/device"))
            && let Some(b) = dev.file_name()
        {
            names.push(b.to_string_lossy().into_owned());
        }
        nums = table
            .lines()
            .filter(|l| {
                l.split_whitespace().last().is_some_and(|w| {
                    names
                        .iter()
                        .any(|n| w == n || w.starts_with(&format!("{n}-")))
                })
            })
            .filter_map(|l| l.trim_start().split(':').next()?.trim().parse().ok())
            .collect();
    }
    nums.sort_unstable();
    nums.into_iter()
        .map(|irq| Irq {
            irq,
            name: label(irq),
            cpus: read(format!("/proc/irq/{irq}/smp_affinity_list")),
        })
        .collect()
}

fn irqbalance_running() -> bool {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .any(|e| read(e.path().join("comm")).as_deref() == Some("irqbalance"))
        })
        .unwrap_or(false)
}

/// Programs attached to the interface, from `ip -j -d link show`.
fn attached(name: &str) -> Vec<Value> {
    let Some(out) = tool("ip", &["-j", "-d", "link", "show", "dev", name]) else {
        return vec![];
    };
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    let xdp = &v[0]["xdp"];
    let mode = |m: &Value| match m.as_u64() {
        Some(1) => "driver",
        Some(2) => "generic",
        Some(3) => "offload",
        _ => "?",
    };
    let one = |m: &Value, p: &Value| json!({"mode": mode(m), "id": p["id"], "name": p["name"]});
    match xdp["attached"].as_array() {
        Some(list) => list.iter().map(|a| one(&a["mode"], &a["prog"])).collect(),
        None if xdp["prog"].is_object() => vec![one(&xdp["mode"], &xdp["prog"])],
        None => vec![],
    }
}

fn count_queues(name: &str, prefix: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .count() as u32
        })
        .unwrap_or(0)
}

pub fn iface(name: &str) -> IfaceReport {
    let mut f = vec![];
    let ifindex: u32 = read(format!("/sys/class/net/{name}/ifindex"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mtu: u32 = read(format!("/sys/class/net/{name}/mtu"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let virtual_dev = !Path::new(&format!("/sys/class/net/{name}/device")).exists();

    // Driver.
    let info = tool("ethtool", &["-i", name]).map(|s| kv(&s));
    let get = |k: &str| {
        info.as_ref()
            .and_then(|m| m.get(k).cloned())
            .filter(|v| !v.is_empty())
    };
    let driver = get("driver").or_else(|| nanowire_xdp::iface::driver(name));
    let (driver_version, firmware, bus_info) =
        (get("version"), get("firmware-version"), get("bus-info"));
    if info.is_none() {
        f.push(finding(
            "driver",
            Level::Info,
            "ethtool is not installed or does not know this device: driver, offload and channel checks are partial".into(),
            Some("apt-get install ethtool".into()),
        ));
    }
    let d = driver.clone().unwrap_or_else(|| "unknown".into());
    let note = match d.as_str() {
        "veth" => {
            "a virtual pair: native XDP without zero-copy; good for testing, its numbers say nothing about a NIC"
        }
        "virtio_net" => {
            "a paravirtual NIC: native XDP needs spare queue pairs and the host's receive offloads (guest_tso*, LRO) off; zero-copy depends on the kernel"
        }
        "mlx5_core" | "ice" | "i40e" | "ixgbe" | "igc" | "igb" | "stmmac" | "ena" | "bnxt_en"
        | "mlx4_en" | "sfc" | "nfp" | "qede" | "idpf" | "gve" | "tsnep" => {
            "a NIC driver with native XDP"
        }
        "tun" | "bridge" | "bond" | "dummy" | "vxlan" | "macvlan" | "ipvlan" | "wireguard" => {
            "not a NIC: generic XDP only; accelerate on the physical interface underneath"
        }
        _ => "see the XDP modes below for what it offers",
    };
    f.push(finding(
        "driver",
        Level::Info,
        format!(
            "driver {d}{}{}: {note}",
            driver_version
                .as_deref()
                .map(|v| format!(" {v}"))
                .unwrap_or_default(),
            firmware
                .as_deref()
                .map(|v| format!(", firmware {v}"))
                .unwrap_or_default()
        ),
        None,
    ));

    // Queues and their interrupts.
    let rx_queues = nanowire_xdp::iface::rx_queue_count(name).max(1);
    let tx_queues = count_queues(name, "tx-").max(1);
    if rx_queues == 1 {
        f.push(finding(
            "queues",
            Level::Ok,
            "one RX queue: every flow reaches the engine's one AF_XDP socket".into(),
            None,
        ));
    } else {
        f.push(finding(
            "queues",
            Level::Info,
            format!("{rx_queues} RX queues: the engine opens one AF_XDP socket (and one UMEM, 8 MiB at the default ring depth) per queue and polls them all; RSS spreads flows across them"),
            Some(format!("for the lowest latency use one queue (ethtool -L {name} combined 1) or steer the flow to one (ethtool -N {name} flow-type udp4 dst-port PORT action Q)")),
        ));
    }
    let irqs = irqs(name);
    if irqs.is_empty() {
        f.push(finding(
            "irq",
            Level::Info,
            if virtual_dev {
                "no device interrupts (virtual device): receive processing runs in the sender's softirq".into()
            } else {
                "no interrupts found for this device in /proc/interrupts".into()
            },
            None,
        ));
    } else {
        let list: Vec<String> = irqs
            .iter()
            .take(8)
            .map(|i| format!("{} -> CPU {}", i.irq, i.cpus.as_deref().unwrap_or("?")))
            .collect();
        let more = if irqs.len() > 8 {
            format!(" (+{} more)", irqs.len() - 8)
        } else {
            String::new()
        };
        let balanced = irqbalance_running();
        f.push(finding(
            "irq",
            if balanced { Level::Warn } else { Level::Info },
            format!(
                "{} interrupts: {}{more}{}",
                irqs.len(),
                list.join(", "),
                if balanced { "; irqbalance is running and moves them" } else { "" }
            ),
            Some(if balanced {
                "stop irqbalance (or ban the application's CPUs with IRQBALANCE_BANNED_CPULIST) and pin each queue's IRQ to a CPU other than the application's".into()
            } else {
                "keep the queues' IRQs off the application's CPU: echo CPU > /proc/irq/N/smp_affinity_list".into()
            }),
        ));
    }

    // XDP modes the driver offers.
    let feats = match nanowire_xdp::netlink::netdev_features(ifindex) {
        Ok(v) => v,
        Err(e) => {
            f.push(finding(
                "xdp",
                Level::Info,
                format!("cannot read xdp-features over netdev netlink: {e}"),
                None,
            ));
            None
        }
    };
    let (frame_size, multi_buffer) = frame_for_mtu(mtu);
    let mut native = None;
    match &feats {
        None => f.push(finding(
            "xdp",
            Level::Info,
            "the kernel does not report xdp-features (netdev netlink, Linux 6.3+): the engine tries native XDP and falls back to generic, saying so".into(),
            None,
        )),
        Some(x) => {
            use nanowire_xdp::netlink::{XDP_ACT_BASIC, XDP_ACT_REDIRECT, XDP_ACT_RX_SG, XDP_ACT_XSK_ZEROCOPY};
            let names = x.xdp_names().join(", ");
            let nat = x.xdp & (XDP_ACT_BASIC | XDP_ACT_REDIRECT) == XDP_ACT_BASIC | XDP_ACT_REDIRECT;
            native = Some(nat);
            f.push(if nat {
                finding(
                    "xdp",
                    Level::Ok,
                    format!("native XDP with redirect offered ({names}): the engine attaches in driver mode, before any skb is built"),
                    None,
                )
            } else {
                finding(
                    "xdp",
                    Level::Warn,
                    format!("no native XDP redirect (xdp-features: {}): only generic (skb) mode, where the kernel builds an skb and copies every packet; gains come from polling only", if names.is_empty() { "none".into() } else { names }),
                    Some("use a NIC whose driver has native XDP (mlx5, ice, i40e, ixgbe, igc, ena, virtio_net, ...) or a newer kernel".into()),
                )
            });
            let zc = x.xdp & XDP_ACT_XSK_ZEROCOPY != 0;
            f.push(if zc {
                finding(
                    "zero-copy",
                    Level::Ok,
                    format!(
                        "AF_XDP zero-copy offered: the NIC writes straight into the engine's UMEM{}",
                        x.xdp_zc_max_segs.map(|s| format!(" (up to {s} frags per packet)")).unwrap_or_default()
                    ),
                    None,
                )
            } else {
                finding(
                    "zero-copy",
                    Level::Info,
                    "no AF_XDP zero-copy: copy mode, one memcpy per packet between the driver's buffers and the UMEM (cheap next to a kernel socket, but not free)".into(),
                    if d == "veth" { None } else { Some("zero-copy needs driver support (mlx5, ice, i40e, ixgbe, igc, stmmac, ...)".into()) },
                )
            });
            let sg = x.xdp & XDP_ACT_RX_SG != 0;
            f.push(match (multi_buffer, sg) {
                (true, false) => finding(
                    "multi-buffer",
                    Level::Bad,
                    format!("MTU {mtu} needs multi-buffer packets (several {frame_size} B frames) and the driver offers no rx-sg: native attach of the frags-aware program fails"),
                    Some(format!("ip link set dev {name} mtu 3826 (or lower)")),
                ),
                (true, true) => finding(
                    "multi-buffer",
                    Level::Info,
                    format!("MTU {mtu}: packets span several {frame_size} B frames (rx-sg offered); more descriptors per packet"),
                    None,
                ),
                (false, s) => finding(
                    "multi-buffer",
                    Level::Ok,
                    format!("not needed at MTU {mtu} (rx-sg {})", if s { "offered" } else { "not offered" }),
                    None,
                ),
            });
            if let Some(xsk) = x.xsk {
                let n = x.xsk_names();
                f.push(finding(
                    "xsk-features",
                    Level::Info,
                    if xsk == 0 {
                        "no AF_XDP TX metadata offloads (tx-timestamp, tx-checksum): the engine checksums in software".into()
                    } else {
                        format!("AF_XDP TX metadata offloads: {}", n.join(", "))
                    },
                    None,
                ));
            }
        }
    }

    // MTU against the frame.
    f.push(if frame_size == 2048 {
        finding(
            "mtu",
            Level::Ok,
            format!("MTU {mtu}: one 2 KiB UMEM frame per packet"),
            None,
        )
    } else if !multi_buffer {
        finding(
            "mtu",
            Level::Info,
            format!("MTU {mtu}: 4 KiB UMEM frames (twice the memory per ring slot of MTU 1500)"),
            None,
        )
    } else {
        finding(
            "mtu",
            Level::Warn,
            format!("MTU {mtu} exceeds a 4 KiB frame: packets span several frames (XDP multi-buffer), more work per packet"),
            Some(format!("keep MTU at 3826 or below unless jumbo frames are needed: ip link set dev {name} mtu 3826")),
        )
    });

    // Offloads.
    let feats_k = tool("ethtool", &["-k", name])
        .map(|s| kv(&s))
        .unwrap_or_default();
    let mut offloads = BTreeMap::new();
    for k in [
        "tcp-segmentation-offload",
        "generic-segmentation-offload",
        "generic-receive-offload",
        "large-receive-offload",
        "rx-gro-hw",
        "rx-checksumming",
        "tx-checksumming",
    ] {
        if let Some(v) = feats_k.get(k) {
            offloads.insert(k.to_string(), v.clone());
        }
    }
    let on = |k: &str| offloads.get(k).is_some_and(|v| v.starts_with("on"));
    let xdp_now = attached(name);
    let generic_now = xdp_now.iter().any(|p| p["mode"] == "generic");
    if on("large-receive-offload") || on("rx-gro-hw") {
        f.push(finding(
            "offloads",
            Level::Warn,
            "hardware receive aggregation is on (LRO / rx-gro-hw): most drivers refuse native XDP while it is, and aggregated frames do not fit the engine's frames".into(),
            Some(format!("ethtool -K {name} lro off rx-gro-hw off")),
        ));
    }
    let tso = on("tcp-segmentation-offload") || on("generic-segmentation-offload");
    if tso && (d == "veth" || generic_now || native == Some(false)) {
        f.push(finding(
            "offloads",
            Level::Info,
            format!(
                "TSO/GSO on{}: in generic XDP mode a kernel peer's 64 KiB TSO/GSO super-frames (and GRO super-frames) reach the engine as one multi-buffer chain each (frags-aware program, XDP_USE_SG) and its TCP takes them whole; native mode on veth makes the peer stop GSO by itself. Without multi-buffer (an old kernel) the engine leaves TCP on the kernel and says so (tcp_no_multi_buffer)",
                if generic_now { " with a generic-mode XDP program attached" } else { "" }
            ),
            None,
        ));
    } else {
        f.push(finding(
            "offloads",
            Level::Info,
            format!(
                "TSO {}, GSO {}, GRO {}, LRO {}: native XDP sees wire frames before GRO, so these only shape the kernel engine's traffic (bulk TCP over the kernel uses them; the xdp engine segments and checksums itself)",
                offloads.get("tcp-segmentation-offload").map_or("?", |s| s.as_str()),
                offloads.get("generic-segmentation-offload").map_or("?", |s| s.as_str()),
                offloads.get("generic-receive-offload").map_or("?", |s| s.as_str()),
                offloads.get("large-receive-offload").map_or("?", |s| s.as_str()),
            ),
            None,
        ));
    }
    // Interrupt deferral (preferred busy polling).
    let defer = read(format!("/sys/class/net/{name}/napi_defer_hard_irqs"));
    let gro_flush = read(format!("/sys/class/net/{name}/gro_flush_timeout"));
    if let (Some(d), Some(g)) = (&defer, &gro_flush) {
        f.push(finding(
            "busy-poll",
            Level::Info,
            format!("napi_defer_hard_irqs {d}, gro_flush_timeout {g} ns: the xdp engine kicks the driver with sendto/poll and keeps interrupts on, so these only change how often this queue interrupts"),
            None,
        ));
    }

    // Programs attached now.
    if xdp_now.is_empty() {
        f.push(finding(
            "xdp-attached",
            Level::Ok,
            "no XDP program attached: the engine attaches its own".into(),
            None,
        ));
    } else {
        for p in &xdp_now {
            let pname = p["name"].as_str().unwrap_or("?");
            let mode = p["mode"].as_str().unwrap_or("?");
            let id = &p["id"];
            if pname.starts_with("nw_steer") {
                f.push(finding(
                    "xdp-attached",
                    Level::Info,
                    format!("nanowire's program {pname} (id {id}) attached in {mode} mode: a nanowire engine owns this interface; a second engine on it falls back to spin"),
                    None,
                ));
            } else {
                f.push(finding(
                    "xdp-attached",
                    Level::Bad,
                    format!("another XDP program {pname} (id {id}) is attached in {mode} mode: nanowire cannot attach its steering program, its engines fall back to spin"),
                    Some(format!(
                        "detach it if nothing needs it: ip link set dev {name} {} off",
                        match mode {
                            "generic" => "xdpgeneric",
                            "offload" => "xdpoffload",
                            _ => "xdpdrv",
                        }
                    )),
                ));
            }
        }
    }

    IfaceReport {
        name: name.to_string(),
        ifindex,
        driver,
        driver_version,
        firmware,
        bus_info,
        mtu,
        rx_queues,
        tx_queues,
        irqs,
        xdp_features: feats.as_ref().map(|x| x.xdp_names()),
        xsk_features: feats.as_ref().and_then(|x| x.xsk.map(|_| x.xsk_names())),
        xdp_zc_max_segs: feats.as_ref().and_then(|x| x.xdp_zc_max_segs),
        frame_size,
        multi_buffer,
        xdp_attached: xdp_now,
        offloads,
        findings: f,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_size_follows_the_engine() {
        assert_eq!(frame_for_mtu(1500), (2048, false));
        assert_eq!(frame_for_mtu(1778), (2048, false));
        assert_eq!(frame_for_mtu(1779), (4096, false));
        assert_eq!(frame_for_mtu(3826), (4096, false));
        assert_eq!(frame_for_mtu(9000), (4096, true));
    }

    #[test]
    fn a_missing_or_bad_interface_name_is_one_line() {
        for n in ["nw-no-such-if0", "../etc", "", "a/b"] {
            let e = resolve(&[n.to_string()]).unwrap_err();
            assert!(
                !e.contains('\n') && e.contains("no network interface"),
                "{e}"
            );
        }
    }

    #[test]
    fn ethtool_key_values() {
        let m =
            kv("driver: veth\nversion: 1.0\nfirmware-version: \n\ttx-checksum-ipv4: off [fixed]\n");
        assert_eq!(m["driver"], "veth");
        assert_eq!(m["firmware-version"], "");
        assert_eq!(m["tx-checksum-ipv4"], "off [fixed]");
    }

    #[test]
    fn cmdline_parameters() {
        let c = "quiet isolcpus=2-3 nohz_full=2-3 rcu_nocbs=2-3";
        assert_eq!(cmdline_param(c, "isolcpus").as_deref(), Some("2-3"));
        assert_eq!(cmdline_param(c, "nohz"), None);
    }
}
