//! Loading and attaching the steering program; claiming flows.

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, XskMap};
use aya::programs::links::FdLink;
use aya::programs::{Xdp, XdpMode};
use aya::{Ebpf, Pod};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};

/// A flow entry's value with this bit: the connection is the kernel's
/// (steer.c's NW_FLOW_PASS); otherwise the value is the owner's pid.
pub const FLOW_PASS: u32 = 0x8000_0000;

/// Key of the `nw_claims` map: destination address and port, network order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimKey {
    pub addr: u32,
    pub port: u16,
    pub pad: u16,
}

// SAFETY: ClaimKey is repr(C), Copy, has no padding bytes beyond the explicit
// `pad` field (4 + 2 + 2 bytes) and every bit pattern is valid.
unsafe impl Pod for ClaimKey {}

impl ClaimKey {
    pub fn new(addr: Ipv4Addr, port: u16) -> ClaimKey {
        ClaimKey {
            addr: u32::from_ne_bytes(addr.octets()),
            port: port.to_be(),
            pad: 0,
        }
    }
}

/// Key of the `nw_tcp_flows` map: a TCP connection as the packets that
/// reach us carry it (remote = source), all in network order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpFlowKey {
    pub raddr: u32,
    pub laddr: u32,
    pub rport: u16,
    pub lport: u16,
}

// SAFETY: TcpFlowKey is repr(C), Copy, 4 + 4 + 2 + 2 bytes with no padding,
// and every bit pattern is valid.
unsafe impl Pod for TcpFlowKey {}

impl TcpFlowKey {
    pub fn new(local: SocketAddrV4, remote: SocketAddrV4) -> TcpFlowKey {
        TcpFlowKey {
            raddr: u32::from_ne_bytes(remote.ip().octets()),
            laddr: u32::from_ne_bytes(local.ip().octets()),
            rport: remote.port().to_be(),
            lport: local.port().to_be(),
        }
    }
}

/// How the program ended up attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// Native (driver) XDP.
    Driver,
    /// Generic (SKB) XDP.
    Skb,
}

impl AttachMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::Driver => "native",
            AttachMode::Skb => "generic",
        }
    }
}

/// The steering program attached to one interface through a BPF link.
/// Dropping it (or the process dying) closes the link and detaches it.
pub struct SteerProgram {
    // Field order: the link goes first so it is closed before the program.
    _link: FdLink,
    claims: BpfHashMap<MapData, ClaimKey, u32>,
    tcp_listen: BpfHashMap<MapData, ClaimKey, u32>,
    tcp_flows: BpfHashMap<MapData, TcpFlowKey, u32>,
    xsks: XskMap<MapData>,
    stats: PerCpuArray<MapData, u64>,
    mode: AttachMode,
    _ebpf: Ebpf,
    /// Every BPF object fd the load and attach opened (link, program,
    /// maps): a forked child must not keep them (see [`SteerProgram::fds`]).
    fds: Vec<RawFd>,
}

/// The fd numbers of this process that name BPF objects (link, program,
/// map), from /proc/self/fd.
fn bpf_fds() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            target.to_str()?.starts_with("anon_inode:bpf").then_some(fd)
        })
        .collect()
}

fn map_err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Which attach modes to try, in order.
///
/// `forced` (the program's setting, e.g. `NANOWIRE_XDP_MODE=native|generic`
/// as the binary read it) is the only one tried. Otherwise native (driver)
/// mode comes first, generic second, except on drivers where measurement
/// showed generic to be faster for AF_XDP: veth. veth is copy-only for
/// AF_XDP either way, and its native XDP path first copies every frame into
/// a page-pool page and defers it to a NAPI poll before the XSK copy; the
/// generic path goes from the sender's skb straight to the socket. In the
/// lab (docs/benchmarks.md) 64 B ping-pong was 2.09 us one-way in generic
/// mode against 2.87 us native, same run.
pub fn mode_order(ifname: &str, forced: Option<AttachMode>) -> Vec<AttachMode> {
    if let Some(m) = forced {
        return vec![m];
    }
    if crate::iface::driver(ifname).as_deref() == Some("veth") {
        vec![AttachMode::Skb, AttachMode::Driver]
    } else {
        vec![AttachMode::Driver, AttachMode::Skb]
    }
}

impl SteerProgram {
    /// Load the program and attach it to `ifindex`: native mode first,
    /// generic mode when the driver refuses.
    ///
    /// `frags`: attach the multi-buffer aware variant (xdp.frags), needed
    /// when packets may be larger than one buffer (jumbo MTU).
    ///
    /// `forced`: the only attach mode to try (`None`: [`mode_order`]).
    pub fn attach(
        ifname: &str,
        ifindex: u32,
        frags: bool,
        forced: Option<AttachMode>,
    ) -> Result<SteerProgram, String> {
        // The BPF fds that exist before the load are not ours.
        let before = bpf_fds();
        // No kernel BTF: the program needs no CO-RE relocation, and parsing
        // /sys/kernel/btf/vmlinux costs ~15 MB of heap that stays with the
        // process (measured RSS, docs/benchmarks.md).
        let mut ebpf = aya::EbpfLoader::new()
            .btf(None)
            .load(crate::steer_object()).map_err(|e| {
            let s = e.to_string();
            if s.contains("Operation not permitted") || s.contains("EPERM") {
                format!(
                    "no privilege to load XDP programs (need root or CAP_BPF+CAP_NET_ADMIN): {e}"
                )
            } else {
                format!("cannot load the XDP steering program: {e}")
            }
        })?;
        let claims: BpfHashMap<MapData, ClaimKey, u32> = BpfHashMap::try_from(
            ebpf.take_map("nw_claims")
                .ok_or("steering object has no nw_claims map")?,
        )
        .map_err(|e| map_err("nw_claims", e))?;
        let tcp_listen: BpfHashMap<MapData, ClaimKey, u32> = BpfHashMap::try_from(
            ebpf.take_map("nw_tcp_listen")
                .ok_or("steering object has no nw_tcp_listen map")?,
        )
        .map_err(|e| map_err("nw_tcp_listen", e))?;
        let tcp_flows: BpfHashMap<MapData, TcpFlowKey, u32> = BpfHashMap::try_from(
            ebpf.take_map("nw_tcp_flows")
                .ok_or("steering object has no nw_tcp_flows map")?,
        )
        .map_err(|e| map_err("nw_tcp_flows", e))?;
        let xsks = XskMap::try_from(ebpf.take_map("nw_xsks").ok_or("no nw_xsks map")?)
            .map_err(|e| map_err("nw_xsks", e))?;
        let stats = PerCpuArray::try_from(ebpf.take_map("nw_stats").ok_or("no nw_stats map")?)
            .map_err(|e| map_err("nw_stats", e))?;
        // The interface's MAC and MTU, before anything is claimed: unicast
        // frames for another host are the kernel's to drop (steer.c
        // `other_host`); UDP datagrams no longer than the MTU skip the exact
        // super-frame check.
        if let Ok(info) = crate::iface::lookup(ifname) {
            let mac = info.mac;
            let on = u8::from(mac != [0; 6]);
            let mtu = info.mtu.to_ne_bytes();
            // Borrowed, not taken: the map stays with the object (and its
            // fd open) for the program's load below.
            let mut cfg: aya::maps::Array<&mut MapData, [u8; 12]> = aya::maps::Array::try_from(
                ebpf.map_mut("nw_config")
                    .ok_or("steering object has no nw_config map")?,
            )
            .map_err(|e| map_err("nw_config", e))?;
            let v = [
                mac[0], mac[1], mac[2], mac[3], mac[4], mac[5], on, 0, mtu[0], mtu[1], mtu[2],
                mtu[3],
            ];
            cfg.set(0, v, 0).map_err(|e| map_err("nw_config", e))?;
        }
        let name = if frags { "nw_steer_frags" } else { "nw_steer" };
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or("steering object has no nw_steer program")?
            .try_into()
            .map_err(|e| map_err("nw_steer", e))?;
        prog.load()
            .map_err(|e| format!("the kernel refused the XDP program: {e}"))?;
        let mut errs = Vec::new();
        let mut attached = None;
        let order = mode_order(ifname, forced);
        for am in order {
            let mode = match am {
                AttachMode::Driver => XdpMode::Driver,
                AttachMode::Skb => XdpMode::Skb,
            };
            match prog.attach_to_if_index(ifindex, mode) {
                Ok(id) => {
                    attached = Some((id, am));
                    break;
                }
                Err(e) => errs.push(format!("{} mode: {}", am.as_str(), error_chain(&e))),
            }
        }
        let (id, mode) = attached.ok_or_else(|| {
            let busy = errs
                .iter()
                .any(|e| e.contains("busy") || e.contains("EBUSY"));
            format!(
                "XDP attach to {ifname} refused{}: {}",
                if busy {
                    " (another XDP program, e.g. another nanowire engine, owns the interface)"
                } else {
                    ""
                },
                errs.join("; ")
            )
        })?;
        let link = prog.take_link(id).map_err(|e| map_err("take_link", e))?;
        // Only a bpf_link is owner-bound; aya falls back to the netlink
        // attachment on old kernels, which would outlive a killed process.
        let link = FdLink::try_from(link).map_err(|_| {
            format!("the kernel attached XDP to {ifname} without a bpf_link (kernel < 5.9?); refusing, it would outlive this process")
        })?;
        // The link, the program and every map of the object, by difference
        // (aya does not show a link's fd).
        let mut fds = bpf_fds();
        fds.retain(|f| !before.contains(f));
        Ok(SteerProgram {
            fds,
            _link: link,
            claims,
            tcp_listen,
            tcp_flows,
            xsks,
            stats,
            mode,
            _ebpf: ebpf,
        })
    }

    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// The fds of the link, the program and its maps. A forked child
    /// replaces them (see the stack's registry): while any process holds
    /// the link the program stays attached, and a map fd lets its holder
    /// rewrite the claims.
    pub fn fds(&self) -> &[RawFd] {
        &self.fds
    }

    /// Steer (addr, port) to the AF_XDP sockets.
    pub fn claim(&mut self, addr: Ipv4Addr, port: u16, owner: u32) -> Result<(), String> {
        self.claims
            .insert(ClaimKey::new(addr, port), owner, 0)
            .map_err(|e| format!("cannot claim {addr}:{port}: {e}"))
    }

    pub fn unclaim(&mut self, addr: Ipv4Addr, port: u16) {
        let _ = self.claims.remove(&ClaimKey::new(addr, port));
    }

    /// Steer every TCP segment for (addr, port) — a listener's port and the
    /// connections it accepts — to the AF_XDP sockets.
    pub fn claim_tcp_listener(
        &mut self,
        addr: Ipv4Addr,
        port: u16,
        owner: u32,
    ) -> Result<(), String> {
        self.tcp_listen
            .insert(ClaimKey::new(addr, port), owner, 0)
            .map_err(|e| format!("cannot claim TCP {addr}:{port}: {e}"))
    }

    pub fn unclaim_tcp_listener(&mut self, addr: Ipv4Addr, port: u16) {
        let _ = self.tcp_listen.remove(&ClaimKey::new(addr, port));
    }

    /// Steer one TCP connection (by 4-tuple) to the AF_XDP sockets (`owner`,
    /// a pid, must not have FLOW_PASS set).
    pub fn claim_tcp_flow(
        &mut self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        owner: u32,
    ) -> Result<(), String> {
        self.tcp_flows
            .insert(TcpFlowKey::new(local, remote), owner, 0)
            .map_err(|e| format!("cannot claim TCP {local} <-> {remote}: {e}"))
    }

    /// Give one TCP connection (by 4-tuple) to the kernel although its
    /// listener's (addr, port) is claimed: a connection handed over.
    pub fn pass_tcp_flow(
        &mut self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> Result<(), String> {
        self.tcp_flows
            .insert(TcpFlowKey::new(local, remote), FLOW_PASS, 0)
            .map_err(|e| format!("cannot pass TCP {local} <-> {remote} to the kernel: {e}"))
    }

    pub fn unclaim_tcp_flow(&mut self, local: SocketAddrV4, remote: SocketAddrV4) {
        let _ = self.tcp_flows.remove(&TcpFlowKey::new(local, remote));
    }

    /// Register the AF_XDP socket serving RX queue `queue`.
    pub fn set_xsk(&mut self, queue: u32, fd: &impl AsRawFd) -> Result<(), String> {
        self.xsks
            .set(queue, fd.as_raw_fd(), 0)
            .map_err(|e| format!("cannot register the AF_XDP socket of queue {queue}: {e}"))
    }

    /// Claimed packets passed to the kernel because their queue had no socket.
    pub fn no_socket_on_queue(&self) -> u64 {
        self.stats.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// Unicast frames for another host's MAC passed to the kernel (which
    /// drops them as PACKET_OTHERHOST), never steered (issue 20, finding 12).
    pub fn other_host_passes(&self) -> u64 {
        self.stats.get(&1, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
