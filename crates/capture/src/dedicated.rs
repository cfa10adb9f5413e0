//! Dedicated capture (`nanowire capture --xdp`): our own small XDP program
//! (bpf/capture.c) takes the interface's frames, all or those the filters
//! select, into one AF_XDP socket per RX queue with a deep ring; frames are
//! stamped when taken off the ring and written to pcapng as they come. A
//! burst as deep as the ring is absorbed even while the writer is busy;
//! anything beyond it is counted by the kernel (XDP_STATISTICS) and
//! reported, never silent.

use crate::filter::Filter;
use crate::session::{CaptureArgs, STOP};
use aya::maps::{Array, MapData, PerCpuArray, XskMap};
use aya::programs::links::FdLink;
use aya::programs::{Xdp, XdpMode};
use aya::{Ebpf, Pod};
use nanowire_xdp::xsk::{XskConfig, XskRx, XskSocket, XskStats};
use nanowire_xdp::{AttachMode, iface};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const CAP_ADDR: u16 = 1;
const CAP_PORT: u16 = 2;

/// Value of `nw_cap_cfg` (bpf/capture.c `struct cap_cfg`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CapCfg {
    addr: u32,
    port: u16,
    flags: u16,
}

// SAFETY: repr(C), Copy, 4 + 2 + 2 bytes without padding; every bit
// pattern is a valid value.
unsafe impl Pod for CapCfg {}

/// bpf/capture.c, compiled by crates/xdp/build.rs (the one place that
/// builds the workspace's BPF programs).
fn capture_object() -> &'static [u8] {
    nanowire_xdp::capture_object()
}

/// The capture program attached through a BPF link (gone with the process).
struct Attached {
    _link: FdLink,
    xsks: XskMap<MapData>,
    stats: PerCpuArray<MapData, u64>,
    mode: AttachMode,
    _ebpf: Ebpf,
}

fn attach(
    ifname: &str,
    ifindex: u32,
    filter: Filter,
    forced: Option<AttachMode>,
) -> Result<Attached, String> {
    let mut ebpf = Ebpf::load(capture_object()).map_err(|e| {
        format!("cannot load the capture XDP program (root or CAP_BPF+CAP_NET_ADMIN needed): {e}")
    })?;
    let mut cfg: Array<MapData, CapCfg> =
        Array::try_from(ebpf.take_map("nw_cap_cfg").ok_or("no nw_cap_cfg map")?)
            .map_err(|e| format!("nw_cap_cfg: {e}"))?;
    let mut c = CapCfg::default();
    if let Some(a) = filter.addr {
        c.addr = u32::from_ne_bytes(a.octets());
        c.flags |= CAP_ADDR;
    }
    if let Some(p) = filter.port {
        c.port = p.to_be();
        c.flags |= CAP_PORT;
    }
    cfg.set(0, c, 0).map_err(|e| format!("nw_cap_cfg: {e}"))?;
    let xsks = XskMap::try_from(ebpf.take_map("nw_cap_xsks").ok_or("no nw_cap_xsks map")?)
        .map_err(|e| format!("nw_cap_xsks: {e}"))?;
    let stats = PerCpuArray::try_from(ebpf.take_map("nw_cap_stats").ok_or("no nw_cap_stats map")?)
        .map_err(|e| format!("nw_cap_stats: {e}"))?;
    let prog: &mut Xdp = ebpf
        .program_mut("nw_capture")
        .ok_or("no nw_capture program")?
        .try_into()
        .map_err(|e| format!("nw_capture: {e}"))?;
    prog.load()
        .map_err(|e| format!("the kernel refused the capture XDP program: {e}"))?;
    let mut errs = Vec::new();
    let mut done = None;
    for am in nanowire_xdp::program::mode_order(ifname, forced) {
        let mode = match am {
            AttachMode::Driver => XdpMode::Driver,
            AttachMode::Skb => XdpMode::Skb,
        };
        match prog.attach_to_if_index(ifindex, mode) {
            Ok(id) => {
                done = Some((id, am));
                break;
            }
            Err(e) => errs.push(format!("{} mode: {e}", am.as_str())),
        }
    }
    let (id, mode) = done.ok_or_else(|| {
        format!(
            "XDP attach to {ifname} refused (is an xdp engine or another XDP program on it? a dedicated capture needs the interface to itself): {}",
            errs.join("; ")
        )
    })?;
    let link = prog.take_link(id).map_err(|e| format!("take_link: {e}"))?;
    let link = FdLink::try_from(link).map_err(|_| {
        format!("the kernel attached XDP to {ifname} without a bpf_link; refusing, it would outlive this process")
    })?;
    Ok(Attached {
        _link: link,
        xsks,
        stats,
        mode,
        _ebpf: ebpf,
    })
}

fn sum_stat(a: &Attached, k: u32) -> u64 {
    a.stats.get(&k, 0).map(|v| v.iter().sum()).unwrap_or(0)
}

pub fn run(a: &CaptureArgs, filter: Filter, forced: Option<AttachMode>) -> Result<i32, String> {
    if !a.ring.is_power_of_two() || !(64..=(1 << 20)).contains(&a.ring) {
        return Err(format!(
            "--ring must be a power of two in 64..=1048576, got {}",
            a.ring
        ));
    }
    let info = iface::lookup(&a.iface).map_err(|e| format!("interface {}: {e}", a.iface))?;
    let eth = info.mtu as usize + 14;
    let frame_size = if eth <= 2048 - 256 { 2048 } else { 4096 };
    let mut prog = attach(&a.iface, info.index, filter, forced)?;
    let cfg = XskConfig {
        rx_frames: a.ring,
        tx_frames: 64,
        frame_size,
        try_zero_copy: prog.mode == AttachMode::Driver,
        multi_buffer: eth > 4096 - 256,
        tx_metadata: false,
    };
    let mut rxs: Vec<XskRx> = Vec::new();
    for q in 0..info.rx_queues.max(1) {
        let s = XskSocket::open(&a.iface, info.index, q, cfg)?;
        prog.xsks
            .set(q, s.as_raw_fd(), 0)
            .map_err(|e| format!("cannot register the capture socket of queue {q}: {e}"))?;
        let (rx, _tx) = s.split();
        rxs.push(rx);
    }
    let mut w = crate::session::writer(a)?;
    let ifid = w.add_interface(&a.iface).map_err(|e| e.to_string())?;
    eprintln!(
        "nanowire capture: dedicated XDP capture on {} ({} XDP, {} queue(s), ring {} frames){}",
        a.iface,
        prog.mode.as_str(),
        rxs.len(),
        a.ring,
        if filter.is_empty() {
            "; every frame is taken from the kernel stack".to_string()
        } else {
            "; frames the filter selects are taken from the kernel stack".to_string()
        }
    );
    let deadline = a.time.map(|t| Instant::now() + Duration::from_secs_f64(t));
    let mut n = 0u64;
    let mut err: Option<String> = None;
    let fds: Vec<i32> = rxs.iter().map(|r| r.as_raw_fd()).collect();
    while !STOP.load(Ordering::Relaxed)
        && a.count.is_none_or(|c| n < c)
        && deadline.is_none_or(|d| Instant::now() < d)
        && err.is_none()
    {
        let mut got = 0;
        for rx in &mut rxs {
            let room = a
                .count
                .map_or(u32::MAX, |c| (c - n).min(u32::MAX as u64) as u32);
            if room == 0 {
                break;
            }
            let info = rx.poll(room.min(4096), 64, |f| {
                let ts = nanowire_tap::now_ns();
                let d = f.data();
                if let Err(e) = w.write_packet(ifid, ts, d, d.len(), None) {
                    err.get_or_insert(e.to_string());
                }
                n += 1;
            });
            got += info.descs;
        }
        if got == 0 {
            // Nothing waiting: sleep until a frame comes (the ring holds
            // what arrives meanwhile).
            let mut pfds: Vec<libc::pollfd> = fds
                .iter()
                .map(|&fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: pfds is a valid array of pollfd of the given length.
            unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 10) };
        }
    }
    if let Some(e) = err {
        return Err(format!("writing {}: {e}", a.write.display()));
    }
    w.flush().map_err(|e| e.to_string())?;
    let mut k = XskStats::default();
    for r in &rxs {
        let s = r.stats();
        k.rx_dropped += s.rx_dropped;
        k.rx_ring_full += s.rx_ring_full;
        k.rx_fill_ring_empty_descs += s.rx_fill_ring_empty_descs;
        k.rx_invalid_descs += s.rx_invalid_descs;
    }
    let bad: u64 = rxs.iter().map(|r| r.bad_descs()).sum();
    let lost = k.rx_dropped + k.rx_invalid_descs + bad;
    eprintln!(
        "nanowire capture: {n} frames written to {}; taken {}, lost {lost} (ring full {}, fill ring empty {}, invalid {}), passed to the kernel: {} filtered out, {} on a queue without a socket",
        a.write.display(),
        sum_stat(&prog, 0),
        k.rx_ring_full,
        k.rx_fill_ring_empty_descs,
        k.rx_invalid_descs + bad,
        sum_stat(&prog, 1),
        sum_stat(&prog, 2),
    );
    Ok(0)
}
