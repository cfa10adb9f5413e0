//! Loading and attaching the steering program; claiming flows.

use aya::Pod;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, XskMap};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

/// A flow entry's value with this bit: the connection is the kernel's
/// (steer.c's NW_FLOW_PASS); otherwise the value is the owner's pid.
pub const FLOW_PASS: u32 = 0x8000_0000;
/// A claim's value with this bit names the slot whose socket gets the flow
/// (steer.c's NW_SLOT): the engine service's processes on a shared UMEM.
pub const SLOT: u32 = 0x4000_0000;
/// A TCP listener claim's value with this bit (and [`SLOT`]) names a group
/// of processes sharing the listening socket (steer.c's NW_GROUP): the low
/// bits are the group's index in `nw_tcp_groups` ([`SteerProgram::set_tcp_group`]).
pub const GROUP: u32 = 0x2000_0000;
/// A pin with this value: the group listener's connection is the kernel's
/// (its SYN came while no member accepted; steer.c's NW_PIN_KERNEL).
pub const PIN_KERNEL: u32 = 0x1000_0000;
/// Groups the program holds (steer.c's `nw_tcp_groups`).
pub const GROUPS: u32 = 1024;

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

/// The local address of a flow key.
fn local_of(k: &TcpFlowKey) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(k.laddr.to_ne_bytes()), u16::from_be(k.lport))
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

/// Write `value` for `key` in a steering map; `what` names the act in the
/// error ("cannot {what}: ...").
fn put<K: Pod>(
    map: &mut BpfHashMap<MapData, K, u32>,
    key: K,
    value: u32,
    what: std::fmt::Arguments,
) -> Result<(), String> {
    map.insert(key, value, 0)
        .map_err(|e| format!("cannot {what}: {e}"))
}

/// The steering program attached to one interface through a BPF link.
/// Dropping it (or the process dying) closes the link and detaches it.
pub struct SteerProgram {
    // Field order: the link goes first so it is closed before the program.
    _link: OwnedFd,
    _prog: OwnedFd,
    claims: BpfHashMap<MapData, ClaimKey, u32>,
    tcp_listen: BpfHashMap<MapData, ClaimKey, u32>,
    tcp_flows: BpfHashMap<MapData, TcpFlowKey, u32>,
    /// Shared listeners' groups (steer.c `struct nw_group`, 80 bytes).
    tcp_groups: aya::maps::Array<MapData, [u8; 80]>,
    /// A group listener's connections by 4-tuple: the slot their SYN went to.
    tcp_pins: BpfHashMap<MapData, TcpFlowKey, u32>,
    xsks: XskMap<MapData>,
    stats: PerCpuArray<MapData, u64>,
    /// Frames redirected per XSKMAP key under the engine service (steer.c
    /// `nw_ready`, mmapable: the members read it, `seats.rs`).
    ready: MapData,
    mode: AttachMode,
    /// Every BPF object fd the load and attach opened (link, program,
    /// maps): a forked child must not keep them (see [`SteerProgram::fds`]).
    fds: Vec<RawFd>,
    /// The maps among `fds`, by name (what `nanowire run` passes on:
    /// [`SteerProgram::export`]).
    named: Vec<(String, RawFd)>,
    /// Whether the attached program is the multi-buffer aware one.
    frags: bool,
    /// A generic-mode attachment made without xdp.frags ([`Frags::Lazy`]):
    /// the parsed object (its remaining maps stay open: the instructions
    /// name them by number) and the config map, to load `nw_steer_frags`
    /// from later ([`SteerProgram::upgrade_frags`]). Kept for the
    /// program's life once made, so that the numbers in `fds` stay ours.
    lazy: Option<LazyFrags>,
}

/// The parsed object (shared with a [`FragsLoader`]) and the config map.
type LazyFrags = (
    std::sync::Arc<crate::load::Loaded>,
    aya::maps::Array<MapData, [u8; 12]>,
);

/// What [`SteerProgram::frags_loader`] hands out: the parsed object (its
/// maps stay open while this lives, the instructions name them by number),
/// to load `nw_steer_frags` from without holding whatever guards the
/// [`SteerProgram`] (the verifier takes milliseconds).
pub struct FragsLoader(std::sync::Arc<crate::load::Loaded>);

/// A loaded, not yet attached `nw_steer_frags` ([`FragsLoader::load`],
/// [`SteerProgram::install_frags`]). Dropping it unused closes it with the
/// raw syscall (engine code never enters the shim's close).
pub struct FragsProg(Option<OwnedFd>);

impl FragsLoader {
    /// Load `nw_steer_frags` (BPF_PROG_LOAD: the verifier's work).
    pub fn load(&self) -> Result<FragsProg, String> {
        self.0
            .load_xdp("nw_steer_frags", true)
            .map(|fd| FragsProg(Some(fd)))
            .map_err(|e| format!("the kernel refused the multi-buffer XDP program: {e}"))
    }
}

impl Drop for FragsProg {
    fn drop(&mut self) {
        if let Some(fd) = self.0.take() {
            crate::sys::close(std::os::fd::IntoRawFd::into_raw_fd(fd));
        }
    }
}

/// Which variant of the steering program to attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frags {
    /// `nw_steer` (not multi-buffer aware).
    No,
    /// `nw_steer_frags` (xdp.frags) in every mode.
    Yes,
    /// `nw_steer_frags` in native mode; in generic mode `nw_steer` first,
    /// replaced by `nw_steer_frags` in place when the engine asks
    /// ([`SteerProgram::upgrade_frags`], on its first multi-buffer packet).
    ///
    /// Why: generic XDP must give every frame `XDP_PACKET_HEADROOM` (256
    /// bytes), which a sender's skb never has (an AF_XDP copy-mode or a
    /// socket's transmit reserves ~64), so the kernel copies every frame
    /// before the program runs. For a frags-aware program it copies into
    /// page-pool pages and builds a new skb (`skb_cow_data_for_xdp`); for
    /// any other it reallocates the head (`pskb_expand_head`): per 64-byte
    /// datagram, one skb built and one consumed more in the first case
    /// (docs/benchmarks.md, "Session 11: UDP per message"). A packet larger
    /// than one frame (a kernel peer's 64 KiB TSO/GSO super-frame) still
    /// reaches an XDP_USE_SG socket under `nw_steer`: generic XDP
    /// linearises it and the socket's copy splits it into a chain; only
    /// that costs more (one large allocation per super-frame), hence the
    /// upgrade once one is seen.
    Lazy,
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

/// The maps only the engine service fills, made with one entry for one
/// process's own engine ([`SteerProgram::attach_private`]).
const PRIVATE_SIZES: &[(&str, u32)] = &[("nw_tcp_pins", 1), ("nw_tcp_groups", 1), ("nw_ready", 1)];

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
        frags: Frags,
        forced: Option<AttachMode>,
    ) -> Result<SteerProgram, String> {
        Self::attach_sized(ifname, ifindex, frags, forced, &[], None)
    }

    /// As [`SteerProgram::attach`], for one process's own engine: the maps
    /// only the engine service fills (listener groups shared across fork,
    /// their SYN pins) are made with one entry. Made full size they were
    /// the largest part of the program's start (`nw_tcp_pins`: a 65,536
    /// bucket hash table; `nw_tcp_groups`: 80 KB zeroed; docs/benchmarks.md,
    /// "Session 13: churn and engine start"); the program finds no group
    /// in them, which is what an own engine's claims (never [`GROUP`]) ask.
    pub fn attach_private(
        ifname: &str,
        ifindex: u32,
        frags: Frags,
        forced: Option<AttachMode>,
    ) -> Result<SteerProgram, String> {
        Self::attach_sized(ifname, ifindex, frags, forced, PRIVATE_SIZES, None)
    }

    /// As [`SteerProgram::attach_private`] with [`Frags::Lazy`], taking
    /// over what `nanowire run` loaded and attached before it exec'd this
    /// program (prestart.rs): no program load, no link made. Refused (and
    /// `p`'s fds closed) if a map is not what this program makes or the
    /// attach mode is not `forced`.
    pub fn adopt_private(
        p: crate::prestart::Prepared,
        ifname: &str,
        forced: Option<AttachMode>,
    ) -> Result<SteerProgram, String> {
        let mode = if p.native {
            AttachMode::Driver
        } else {
            AttachMode::Skb
        };
        if forced.is_some_and(|m| m != mode) {
            return Err(format!(
                "attached in {} mode, {} mode asked",
                mode.as_str(),
                forced.map_or("", AttachMode::as_str)
            ));
        }
        Self::attach_sized(
            ifname,
            p.ifindex,
            Frags::Lazy,
            forced,
            PRIVATE_SIZES,
            Some(p),
        )
    }

    /// Load and attach the steering program on `ifname` as an own engine
    /// would ([`SteerProgram::attach_private`], [`Frags::Lazy`], `forced`
    /// attach mode) and give it up to the program about to be exec'd: the
    /// value of [`crate::prestart::ENV`] for it (`nanowire run`).
    ///
    /// `ring_depth` (the engine's option): also make its first queue's
    /// UMEM, populated, in a file passed on with the program
    /// ([`crate::UmemArea::populated_file`]; zeroing it is the other long
    /// part of an engine's start). `None`, or a UMEM that cannot be made:
    /// the program only.
    pub fn prepare(
        ifname: &str,
        forced: Option<AttachMode>,
        ring_depth: Option<u32>,
    ) -> Result<String, String> {
        let info = crate::iface::lookup(ifname).map_err(|e| format!("interface {ifname}: {e}"))?;
        let p = Self::attach_private(ifname, info.index, Frags::Lazy, forced)?;
        let umem = ring_depth.and_then(|d| {
            let (rx, tx, frame) = crate::umem::own_geometry(info.mtu, d);
            crate::UmemArea::populated_file(rx, tx, frame)
                .ok()
                .map(|f| (std::os::fd::IntoRawFd::into_raw_fd(f), [rx, tx, frame]))
        });
        Ok(p.export(ifname, info.index, umem))
    }

    /// Give the program up to the next program this process execs
    /// (`nanowire run`): every fd is kept open across exec (no
    /// FD_CLOEXEC) and the value of [`crate::prestart::ENV`] describing
    /// them is returned; the fds are no longer this value's to close.
    pub fn export(self, ifname: &str, ifindex: u32, umem: Option<(RawFd, [u32; 3])>) -> String {
        for &fd in self.fds.iter().chain(umem.as_ref().map(|(fd, _)| fd)) {
            crate::sys::set_cloexec(fd, false);
        }
        let d = crate::prestart::describe(
            ifname,
            ifindex,
            (self.mode == AttachMode::Driver, self.frags),
            (self._link.as_raw_fd(), self._prog.as_raw_fd()),
            &self.named,
            umem,
        );
        // The fds live on in the exec'd program (this process image ends
        // at the exec that follows): nothing here may close them.
        std::mem::forget(self);
        d
    }

    fn attach_sized(
        ifname: &str,
        ifindex: u32,
        frags: Frags,
        forced: Option<AttachMode>,
        sizes: &[(&str, u32)],
        mut adopt: Option<crate::prestart::Prepared>,
    ) -> Result<SteerProgram, String> {
        // Parsed and loaded without aya's EbpfLoader, whose constructor
        // parses the kernel's BTF (tens of ms and ~15 MB of heap per
        // process) that this program does not need (load.rs).
        let made = match adopt.as_mut() {
            None => crate::load::Loaded::new(crate::steer_object(), sizes),
            Some(p) => crate::load::Loaded::adopt(crate::steer_object(), sizes, &mut p.maps),
        };
        let mut obj = made.map_err(|e| {
            if e.contains("Operation not permitted") || e.contains("EPERM") {
                format!(
                    "no privilege to load XDP programs (need root or CAP_BPF+CAP_NET_ADMIN): {e}"
                )
            } else {
                format!("cannot load the XDP steering program: {e}")
            }
        })?;
        // The fds of the maps kept (a forked child closes them).
        let mut map_fds = Vec::new();
        let take = |obj: &mut crate::load::Loaded, name: &str, fds: &mut Vec<(String, RawFd)>| {
            obj.take_map(name).map(|(m, fd)| {
                fds.push((name.to_string(), fd));
                m
            })
        };
        let claims: BpfHashMap<MapData, ClaimKey, u32> =
            BpfHashMap::try_from(take(&mut obj, "nw_claims", &mut map_fds)?)
                .map_err(|e| map_err("nw_claims", e))?;
        let tcp_listen: BpfHashMap<MapData, ClaimKey, u32> =
            BpfHashMap::try_from(take(&mut obj, "nw_tcp_listen", &mut map_fds)?)
                .map_err(|e| map_err("nw_tcp_listen", e))?;
        let tcp_flows: BpfHashMap<MapData, TcpFlowKey, u32> =
            BpfHashMap::try_from(take(&mut obj, "nw_tcp_flows", &mut map_fds)?)
                .map_err(|e| map_err("nw_tcp_flows", e))?;
        let tcp_groups = aya::maps::Array::try_from(take(&mut obj, "nw_tcp_groups", &mut map_fds)?)
            .map_err(|e| map_err("nw_tcp_groups", e))?;
        let tcp_pins: BpfHashMap<MapData, TcpFlowKey, u32> =
            BpfHashMap::try_from(take(&mut obj, "nw_tcp_pins", &mut map_fds)?)
                .map_err(|e| map_err("nw_tcp_pins", e))?;
        let xsks = XskMap::try_from(take(&mut obj, "nw_xsks", &mut map_fds)?)
            .map_err(|e| map_err("nw_xsks", e))?;
        let stats = PerCpuArray::try_from(take(&mut obj, "nw_stats", &mut map_fds)?)
            .map_err(|e| map_err("nw_stats", e))?;
        let aya::maps::Map::Array(ready) = take(&mut obj, "nw_ready", &mut map_fds)? else {
            return Err("nw_ready: not an array map".into());
        };
        // The interface's MAC and MTU, before anything is claimed: unicast
        // frames for another host are the kernel's to drop (steer.c
        // `other_host`); UDP datagrams no longer than the MTU skip the exact
        // super-frame check.
        // (The map stays open until the program is loaded: its
        // instructions name it by fd.)
        let (cfg_map, cfg_fd) = obj.take_map("nw_config")?;
        let named_cfg = ("nw_config".to_string(), cfg_fd);
        let mut cfg: aya::maps::Array<MapData, [u8; 12]> =
            aya::maps::Array::try_from(cfg_map).map_err(|e| map_err("nw_config", e))?;
        if let Ok(info) = crate::iface::lookup(ifname) {
            let mac = info.mac;
            let on = u8::from(mac != [0; 6]);
            let mtu = info.mtu.to_ne_bytes();
            let v = [
                mac[0], mac[1], mac[2], mac[3], mac[4], mac[5], on, 0, mtu[0], mtu[1], mtu[2],
                mtu[3],
            ];
            cfg.set(0, v, 0).map_err(|e| map_err("nw_config", e))?;
        }
        let (link, prog, mode, f) = match adopt {
            Some(mut p) => {
                let (link, prog) = p.take_link_and_prog();
                let mode = if p.native {
                    AttachMode::Driver
                } else {
                    AttachMode::Skb
                };
                (link, prog, mode, p.frags)
            }
            None => Self::load_and_link(&obj, ifname, ifindex, frags, forced)?,
        };
        // Only a bpf_link is owner-bound (a netlink attachment would
        // outlive a killed process): BPF_LINK_CREATE is the only way tried.
        let mut fds = vec![link.as_raw_fd(), prog.as_raw_fd()];
        fds.extend(map_fds.iter().map(|(_, fd)| *fd));
        let mut named = map_fds;
        // The program holds the maps it uses; the ones not kept here go,
        // unless the frags variant may be loaded later (its instructions
        // name them by number).
        let lazy = if frags == Frags::Lazy && !f {
            fds.push(cfg_fd);
            named.push(named_cfg);
            let rest = obj.map_fds_named();
            fds.extend(rest.iter().map(|(_, fd)| *fd));
            named.extend(rest);
            Some((std::sync::Arc::new(obj), cfg))
        } else {
            drop((obj, cfg));
            None
        };
        Ok(SteerProgram {
            fds,
            named,
            frags: f,
            lazy,
            _link: link,
            _prog: prog,
            claims,
            tcp_listen,
            tcp_flows,
            tcp_groups,
            tcp_pins,
            xsks,
            stats,
            ready,
            mode,
        })
    }

    /// Load the variant `frags` asks for in the first attach mode that
    /// takes it, and attach it there: (link, program, mode, frags-aware).
    fn load_and_link(
        obj: &crate::load::Loaded,
        ifname: &str,
        ifindex: u32,
        frags: Frags,
        forced: Option<AttachMode>,
    ) -> Result<(OwnedFd, OwnedFd, AttachMode, bool), String> {
        // Each variant loaded when a mode first wants it ([0]: nw_steer,
        // [1]: nw_steer_frags).
        let mut progs: [Option<OwnedFd>; 2] = [None, None];
        let mut errs = Vec::new();
        let mut attached = None;
        let order = mode_order(ifname, forced);
        for am in order {
            let f = match frags {
                Frags::No => false,
                Frags::Yes => true,
                Frags::Lazy => am == AttachMode::Driver,
            };
            let prog = match &mut progs[usize::from(f)] {
                Some(p) => p,
                slot => slot.insert(
                    obj.load_xdp(if f { "nw_steer_frags" } else { "nw_steer" }, f)
                        .map_err(|e| format!("the kernel refused the XDP program: {e}"))?,
                ),
            };
            let flags = match am {
                AttachMode::Driver => aya_obj::generated::XDP_FLAGS_DRV_MODE,
                AttachMode::Skb => aya_obj::generated::XDP_FLAGS_SKB_MODE,
            };
            match crate::load::link_xdp(prog, ifindex, flags) {
                Ok(link) => {
                    attached = Some((link, am, f));
                    break;
                }
                Err(e) => errs.push(format!("{} mode: {e}", am.as_str())),
            }
        }
        let (link, mode, f) = attached.ok_or_else(|| {
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
        let Some(prog) = progs[usize::from(f)].take() else {
            unreachable!("the attached variant was loaded")
        };
        Ok((link, prog, mode, f))
    }

    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// The map of frames redirected per slot and queue (steer.c
    /// `nw_ready`), for the engine service to hand its members.
    pub fn ready_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.ready.fd().as_fd()
    }

    /// The XDP link: the program stays attached while a copy of it is
    /// open (an own engine's warden holds one until it has given a killed
    /// process's connections to the kernel, service/warden.rs).
    pub fn link_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self._link.as_fd()
    }

    /// Whether the attached program is the multi-buffer aware one
    /// (xdp.frags).
    pub fn frags(&self) -> bool {
        self.frags
    }

    /// Whether [`SteerProgram::upgrade_frags`] has something to do.
    pub fn can_upgrade(&self) -> bool {
        !self.frags && self.lazy.is_some()
    }

    /// A [`Frags::Lazy`] attachment running `nw_steer`: load
    /// `nw_steer_frags` and put it behind the link in its place
    /// ([`SteerProgram::frags_loader`] then [`SteerProgram::install_frags`]
    /// in one go; the engine splits the two so that the load runs outside
    /// its program lock). `Ok(false)`: nothing to do.
    pub fn upgrade_frags(&mut self) -> Result<bool, String> {
        match self.frags_loader() {
            Some(l) => self.install_frags(l.load()?),
            None => Ok(false),
        }
    }

    /// What loads `nw_steer_frags` for [`SteerProgram::install_frags`]
    /// (`None`: nothing to upgrade).
    pub fn frags_loader(&self) -> Option<FragsLoader> {
        if !self.can_upgrade() {
            return None;
        }
        self.lazy.as_ref().map(|(obj, _)| FragsLoader(obj.clone()))
    }

    /// Put a loaded `nw_steer_frags` behind the link in place of
    /// `nw_steer` (BPF_LINK_UPDATE; no frame is lost or passed twice: each
    /// runs one program or the other). The program's fd keeps its number
    /// (the new program is dup'ed onto it), so [`SteerProgram::fds`] stays
    /// true. Two system calls and raw closes only: fit to run under a lock
    /// engine turns take. `Ok(false)`: already upgraded (`new` is closed).
    pub fn install_frags(&mut self, new: FragsProg) -> Result<bool, String> {
        let mut new = new;
        if !self.can_upgrade() {
            return Ok(false);
        }
        let Some(fd) = new.0.as_ref() else {
            return Ok(false);
        };
        crate::load::link_update(&self._link, fd)
            .map_err(|e| format!("cannot replace the XDP program (BPF_LINK_UPDATE): {e}"))?;
        // The old program goes when its last reference (this fd) does.
        if crate::sys::dup3_cloexec(fd.as_raw_fd(), self._prog.as_raw_fd()) < 0 {
            // Still attached and working; the old program's fd stays open
            // (and the new one with it, so that its number is ours).
            if let Some(fd) = new.0.take() {
                std::mem::forget(fd);
            }
        }
        self.frags = true;
        Ok(true)
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
        let what = format_args!("claim {addr}:{port}");
        put(&mut self.claims, ClaimKey::new(addr, port), owner, what)
    }

    /// Steer (addr, port) to the socket of `slot` (the engine service:
    /// `nw_xsks[slot * 64 + queue]`, see [`SteerProgram::set_slot_xsk`]).
    pub fn claim_slot(&mut self, addr: Ipv4Addr, port: u16, slot: u32) -> Result<(), String> {
        if slot >= 64 {
            return Err(format!("slot {slot} out of range"));
        }
        let (key, what) = (
            ClaimKey::new(addr, port),
            format_args!("claim {addr}:{port}"),
        );
        put(&mut self.claims, key, SLOT | slot, what)
    }

    /// Register `slot`'s AF_XDP socket on RX queue `queue`.
    pub fn set_slot_xsk(&mut self, slot: u32, queue: u32, fd: &impl AsRawFd) -> Result<(), String> {
        if slot >= 64 || queue >= 64 {
            return Err(format!("slot {slot} / queue {queue} out of range"));
        }
        self.xsks
            .set(slot * 64 + queue, fd.as_raw_fd(), 0)
            .map_err(|e| {
                format!("cannot register the AF_XDP socket of slot {slot} queue {queue}: {e}")
            })
    }

    /// Forget `slot`'s AF_XDP socket on RX queue `queue`.
    pub fn clear_slot_xsk(&mut self, slot: u32, queue: u32) {
        if slot < 64 && queue < 64 {
            let _ = self.xsks.unset(slot * 64 + queue);
        }
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
        let what = format_args!("claim TCP {addr}:{port}");
        put(&mut self.tcp_listen, ClaimKey::new(addr, port), owner, what)
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
        self.set_tcp_flow(local, remote, owner)
    }

    /// Give one TCP connection (by 4-tuple) to the kernel although its
    /// listener's (addr, port) is claimed: a connection handed over.
    pub fn pass_tcp_flow(
        &mut self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> Result<(), String> {
        self.set_tcp_flow(local, remote, FLOW_PASS)
    }

    /// Write one TCP connection's value: its owner or [`FLOW_PASS`].
    fn set_tcp_flow(&mut self, l: SocketAddrV4, r: SocketAddrV4, v: u32) -> Result<(), String> {
        let act = if v == FLOW_PASS {
            "give the kernel"
        } else {
            "claim"
        };
        let what = format_args!("{act} TCP {l} <-> {r}");
        put(&mut self.tcp_flows, TcpFlowKey::new(l, r), v, what)
    }

    pub fn unclaim_tcp_flow(&mut self, local: SocketAddrV4, remote: SocketAddrV4) {
        let _ = self.tcp_flows.remove(&TcpFlowKey::new(local, remote));
    }

    /// Write group `gid` of a shared listener (steer.c `group_owner`): the
    /// slots accepting from it, in the order their hash buckets are dealt
    /// (bucket i -> `accepting[i % n]`); none: its new connections go to
    /// the kernel's listening socket.
    pub fn set_tcp_group(&mut self, gid: u32, accepting: &[u32]) -> Result<(), String> {
        if gid >= GROUPS || accepting.iter().any(|&s| s >= 64) {
            return Err(format!("group {gid} / slots {accepting:?} out of range"));
        }
        self.tcp_groups
            .set(gid, group_value(accepting), 0)
            .map_err(|e| format!("cannot write listener group {gid}: {e}"))
    }

    /// Forget the pins (a group listener's connections by 4-tuple) that
    /// `drop` selects (by local address, the slot's value). Returns how
    /// many went.
    pub fn unpin_tcp(&mut self, mut drop: impl FnMut(SocketAddrV4, u32) -> bool) -> usize {
        let keys: Vec<TcpFlowKey> = self
            .pins()
            .into_iter()
            .filter(|(k, v)| drop(local_of(k), *v))
            .map(|(k, _)| k)
            .collect();
        self.unpin_keys(&keys)
    }

    /// Forget the pin of one connection (local, remote).
    pub fn unpin_tcp_flow(&mut self, local: SocketAddrV4, remote: SocketAddrV4) -> bool {
        self.tcp_pins
            .remove(&TcpFlowKey::new(local, remote))
            .is_ok()
    }

    /// Forget the pins of these connections (local, remote): one system
    /// call for all (BPF_MAP_DELETE_BATCH). Returns how many went.
    pub fn unpin_tcp_flows(&mut self, flows: &[(SocketAddrV4, SocketAddrV4)]) -> usize {
        let keys: Vec<TcpFlowKey> = flows.iter().map(|&(l, r)| TcpFlowKey::new(l, r)).collect();
        self.unpin_keys(&keys)
    }

    fn unpin_keys(&mut self, keys: &[TcpFlowKey]) -> usize {
        if keys.is_empty() {
            return 0;
        }
        let size = std::mem::size_of::<TcpFlowKey>();
        // SAFETY: TcpFlowKey is Pod (12 bytes, no padding): its bytes are
        // initialized; the slice covers exactly `keys`.
        let bytes = unsafe {
            std::slice::from_raw_parts(keys.as_ptr().cast::<u8>(), std::mem::size_of_val(keys))
        };
        let fd = aya::maps::IterableMap::map(&self.tcp_pins)
            .fd()
            .as_fd()
            .as_raw_fd();
        crate::load::map_delete_keys(fd, bytes, size).unwrap_or_else(|_| {
            // A kernel without batch operations: one call per key.
            keys.iter()
                .filter(|k| self.tcp_pins.remove(k).is_ok())
                .count()
        })
    }

    /// The pins (group listeners' connections by 4-tuple): local, remote,
    /// the slot's value.
    pub fn tcp_pins(&self) -> Vec<(SocketAddrV4, SocketAddrV4, u32)> {
        self.pins()
            .into_iter()
            .map(|(k, v)| {
                let remote =
                    SocketAddrV4::new(Ipv4Addr::from(k.raddr.to_ne_bytes()), u16::from_be(k.rport));
                (local_of(&k), remote, v)
            })
            .collect()
    }

    /// Every pin: BPF_MAP_LOOKUP_BATCH, a few system calls for the whole
    /// map (the map iterator made two per entry: the service's sweep of
    /// 65,536 pins every 5 s was 1.6 `bpf` calls per connection under ab
    /// against nginx with 4 workers; docs/benchmarks.md, "Session 17:
    /// nginx workers on the service").
    fn pins(&self) -> Vec<(TcpFlowKey, u32)> {
        let (ks, vs) = (
            std::mem::size_of::<TcpFlowKey>(),
            std::mem::size_of::<u32>(),
        );
        let fd = aya::maps::IterableMap::map(&self.tcp_pins)
            .fd()
            .as_fd()
            .as_raw_fd();
        match crate::load::map_lookup_all(fd, ks, vs) {
            Ok((keys, values)) => keys
                .chunks_exact(ks)
                .zip(values.chunks_exact(vs))
                .map(|(k, v)| {
                    // SAFETY: `k` holds a whole TcpFlowKey's 12 bytes as the
                    // kernel copied them; any bit pattern is valid (Pod).
                    let key = unsafe { std::ptr::read_unaligned(k.as_ptr().cast::<TcpFlowKey>()) };
                    (key, u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
                })
                .collect(),
            // A kernel without batch operations: the iterator.
            Err(_) => self.tcp_pins.iter().filter_map(Result::ok).collect(),
        }
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

/// An XDP program that drops every frame (`r0 = XDP_DROP; exit`), attached
/// to an interface through a BPF link owned by this value: a sink that
/// costs the receiving end nothing past the driver's (or generic XDP's)
/// own work. Measurement only: `examples/xsk_floor.rs` (`sink xdp`) uses
/// it to see what one AF_XDP socket alone can push through a veth.
pub struct DropProgram {
    _link: OwnedFd,
    _prog: OwnedFd,
}

impl DropProgram {
    /// Load the program and attach it to `ifindex` in `mode`.
    pub fn attach(ifindex: u32, mode: AttachMode) -> Result<DropProgram, String> {
        let prog = crate::load::load_xdp_insns("nw_drop", &crate::load::drop_insns(), false)
            .map_err(|e| format!("the kernel refused the XDP drop program: {e}"))?;
        let flags = match mode {
            AttachMode::Driver => aya_obj::generated::XDP_FLAGS_DRV_MODE,
            AttachMode::Skb => aya_obj::generated::XDP_FLAGS_SKB_MODE,
        };
        let link = crate::load::link_xdp(&prog, ifindex, flags)
            .map_err(|e| format!("XDP attach ({} mode) refused: {e}", mode.as_str()))?;
        Ok(DropProgram {
            _link: link,
            _prog: prog,
        })
    }
}

/// steer.c's `struct nw_group` for the accepting slots `accepting`: the
/// mask, the count, and 64 buckets dealt round-robin.
pub fn group_value(accepting: &[u32]) -> [u8; 80] {
    let mut v = [0u8; 80];
    let mask = accepting.iter().fold(0u64, |m, &s| m | 1u64 << (s & 63));
    v[0..8].copy_from_slice(&mask.to_ne_bytes());
    v[8..12].copy_from_slice(&(accepting.len() as u32).to_ne_bytes());
    if !accepting.is_empty() {
        for (i, b) in v[16..80].iter_mut().enumerate() {
            *b = accepting[i % accepting.len()] as u8;
        }
    }
    v
}

#[cfg(test)]
mod group_tests {
    #[test]
    fn a_group_deals_its_buckets_round_robin() {
        let v = super::group_value(&[3, 5]);
        assert_eq!(
            u64::from_ne_bytes(v[0..8].try_into().unwrap()),
            1 << 3 | 1 << 5
        );
        assert_eq!(u32::from_ne_bytes(v[8..12].try_into().unwrap()), 2);
        assert_eq!(&v[16..20], &[3, 5, 3, 5]);
        let none = super::group_value(&[]);
        assert_eq!(none, [0u8; 80]);
    }
}
