//! `nanowire stats`: the sockets more than one process holds (issue 24
//! item 5), as the kernel and the shim's fork-share pages say it.
//!
//! The processes looked at are those running the shim (its library in
//! `/proc/PID/maps`) that this reader may inspect (root: all). A socket
//! is shared when the fd tables of two or more of them name it
//! (`/proc/PID/fd`: `socket:[INODE]`):
//!
//! * a kernel socket (a UDP socket a child used after fork, a connection
//!   moved to the kernel, anything the engine never served) is named by
//!   the namespace's socket tables (`/proc/PID/net/{udp,tcp}`: address,
//!   state); IPv4 only, as the engine;
//! * a UDP socket or TCP connection still on its owner's engine while
//!   forked children hold copies (`forkshare`: taking it off waits until a
//!   child uses it) is in the owner's fork-share page (a memfd every process of the tree
//!   maps: `nanowire_stack::xdp::forkpage`), read through
//!   `/proc/PID/map_files/`: addresses, owner, holders, and the inode of
//!   the socket under the fds, by which the holders' pids are found.
//!
//! Listeners the engine service shares across fork are its own lines
//! (`tcp listener ... shared by`), not repeated here.
use nanowire_sockabi::procnet;
use nanowire_stack::xdp::forkpage;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{SocketAddr, SocketAddrV4};

/// Part of the shim's file name (libnanowire_preload.so).
const SHIM: &str = "nanowire_preload";

/// A socket of the kernel's tables.
struct KernelSock {
    udp: bool,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    state: u8,
}

/// Every socket held by two or more shim processes (see the module doc);
/// `service_listeners`: the TCP listeners on the engine service, with the
/// number of processes in each one's group.
pub fn shared(service_listeners: &BTreeMap<String, usize>) -> Vec<Value> {
    let mut holders: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut kernel: HashMap<u64, KernelSock> = HashMap::new();
    let mut netns: BTreeSet<String> = BTreeSet::new();
    let mut pages: BTreeMap<u64, (u32, String)> = BTreeMap::new();
    for pid in shim_pids(&mut pages) {
        // (/proc lists pids in ascending order: each list is sorted.)
        for ino in socket_inodes(pid) {
            holders.entry(ino).or_default().push(pid);
        }
        // Each network namespace's tables once.
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/net"))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| pid.to_string());
        if netns.insert(ns) {
            for (file, udp) in [("udp", true), ("tcp", false)] {
                kernel_table(pid, file, udp, &mut kernel);
            }
        }
    }
    // The fork-share pages' sockets (on an engine; the owner alive).
    let mut on_engine: Vec<Value> = Vec::new();
    for (pid, range) in pages.values() {
        let Ok(bytes) = std::fs::read(format!("/proc/{pid}/map_files/{range}")) else {
            continue;
        };
        for s in forkpage::read(&bytes).unwrap_or_default() {
            // The owner gone, its engine went with it.
            let owner = s["owner"].as_u64().unwrap_or(0);
            if std::path::Path::new(&format!("/proc/{owner}")).exists() {
                on_engine.push(s);
            }
        }
    }
    let engine_inos: BTreeSet<u64> = on_engine.iter().filter_map(|s| s["ino"].as_u64()).collect();
    let mut out = Vec::new();
    for (ino, pids) in &holders {
        let Some(k) = kernel.get(ino).filter(|_| pids.len() > 1) else {
            continue;
        };
        // A bound UDP socket is in the kernel's table while the engine
        // serves it: its fork-share slot is its line.
        if engine_inos.contains(ino) {
            continue;
        }
        // A listener on the engine service: its group, when it has two or
        // more processes, is the service's own line.
        let on_service = (!k.udp && k.state == LISTEN)
            .then(|| service_listeners.get(&k.local.to_string()))
            .flatten();
        if on_service.is_some_and(|n| *n > 1) {
            continue;
        }
        let connected = k.remote.port() != 0;
        out.push(json!({
            "proto": if k.udp { "udp" } else { "tcp" },
            "local": k.local.to_string(),
            "remote": connected.then(|| k.remote.to_string()),
            "pids": pids,
            "on": if on_service.is_some() { "engine service" } else { "kernel" },
            "kernel_state": (!k.udp).then(|| forkpage::tcp_state_name(k.state)),
        }));
    }
    for mut s in on_engine {
        let (owner, ino) = (s["owner"].as_u64().unwrap_or(0), s["ino"].as_u64());
        // The owner first, then the other holders seen.
        let mut pids = vec![owner];
        let seen = ino.and_then(|i| holders.get(&i)).into_iter().flatten();
        pids.extend(seen.map(|p| u64::from(*p)).filter(|p| *p != owner));
        // The kernel's table names the protocol (a UDP socket's
        // bound twin; an engine connection's placeholder is no TCP
        // socket the table shows as connected).
        let udp = ino.and_then(|i| kernel.get(&i)).is_some_and(|k| k.udp);
        s["proto"] = if udp { "udp" } else { "tcp" }.into();
        s["pids"] = pids.into();
        s["on"] = if s["busy"] == true {
            "moving to the kernel"
        } else {
            "engine"
        }
        .into();
        out.push(s);
    }
    out
}

/// One line per shared socket, in the style of the service's listener
/// lines.
pub fn print(all: &[Value]) {
    use std::io::Write;
    for s in all {
        let owner = s["owner"].as_u64();
        let who: Vec<String> = s["pids"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| match p.as_u64() {
                Some(p) if Some(p) == owner => format!("pid {p} (owner)"),
                _ => format!("pid {p}"),
            })
            .collect();
        let what = match (s["local"].as_str(), s["remote"].as_str()) {
            (l, Some(r)) => format!("{} <-> {r}", l.unwrap_or("?")),
            (l, None) => l.unwrap_or("?").to_string(),
        };
        let place = match (owner, s["kernel_state"].as_str()) {
            (Some(o), _) => format!(
                "{} of pid {o} ({} other holder(s))",
                if s["on"] == "engine" {
                    "on the engine"
                } else {
                    "moving to the kernel from the engine"
                },
                s["holders"]
            ),
            (None, Some(_)) if s["on"] == "engine service" => {
                "on the engine service (its listener)".into()
            }
            (None, Some(st)) => format!("the kernel's ({st})"),
            (None, None) => "the kernel's".into(),
        };
        let _ = writeln!(
            std::io::stdout(),
            "  {} {what} shared by {}: {place}",
            s["proto"].as_str().unwrap_or("?"),
            who.join(", ")
        );
    }
}

const LISTEN: u8 = 10;

/// The processes running the shim, and the fork-share pages they map
/// (by the memfd's inode: one reader pid and its mapping's range).
fn shim_pids(pages: &mut BTreeMap<u64, (u32, String)>) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return pids;
    };
    let page = format!("/memfd:{}", forkpage::NAME);
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        if !maps.contains(SHIM) {
            continue;
        }
        pids.push(pid);
        for l in maps.lines().filter(|l| l.contains(&page)) {
            let f: Vec<&str> = l.split_whitespace().collect();
            if let (Some(range), Some(ino)) = (f.first(), f.get(4).and_then(|i| i.parse().ok())) {
                pages.entry(ino).or_insert((pid, range.to_string()));
            }
        }
    }
    pids
}

/// The inodes of the sockets process `pid`'s fds name (each once).
fn socket_inodes(pid: u32) -> BTreeSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let l = std::fs::read_link(e.path()).ok()?;
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// `/proc/PID/net/FILE` (udp or tcp: IPv4) by inode.
fn kernel_table(pid: u32, file: &str, udp: bool, into: &mut HashMap<u64, KernelSock>) {
    let Ok(t) = std::fs::read(format!("/proc/{pid}/net/{file}")) else {
        return;
    };
    for e in procnet::table(&t).filter(|e| e.inode != 0) {
        if let (SocketAddr::V4(local), SocketAddr::V4(remote)) = (e.local, e.remote) {
            let state = e.state;
            into.insert(
                e.inode,
                KernelSock {
                    udp,
                    local,
                    remote,
                    state,
                },
            );
        }
    }
}
