//! Unit-test support for the engine's data path (compiled for tests only):
//! a private stats page, frames, and a receive path over the loopback
//! device. No root, no rings.

use super::demux::{Demux, EndpointId, EndpointKind};
use super::device::loopback::LoopRx;
use super::rx::RxPath;
use super::shm::{E, PageInfo, S, StatsPage};
use super::tx::{HDRS, build_frame};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Our interface's MAC and address, and a peer's.
pub const OUR_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
pub const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
pub const OURS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

pub fn page() -> Arc<StatsPage> {
    Arc::new(StatsPage::create(&PageInfo::default()))
}

pub fn efd() -> OwnedFd {
    // SAFETY: plain eventfd(2), checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// An engine counter's value.
pub fn get(page: &StatsPage, c: E) -> u64 {
    page.e(c).load(Ordering::Relaxed)
}

/// A socket slot's counter's value.
pub fn get_s(page: &StatsPage, slot: usize, c: S) -> u64 {
    page.s(slot, c).load(Ordering::Relaxed)
}

/// The sum of every engine `drop_*` counter.
pub fn drops(page: &StatsPage) -> u64 {
    page.engine_counters()
        .filter(|(n, _)| n.starts_with("drop_"))
        .map(|(_, v)| v)
        .sum()
}

/// `rx_frames = rx_packets + sum(drop_*)` (the accounting identity).
pub fn identity_holds(page: &StatsPage) -> bool {
    get(page, E::RxFrames) == get(page, E::RxPackets) + drops(page)
}

/// A UDP datagram from `src` to `dst` as an Ethernet frame to our MAC.
pub fn udp(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; HDRS + payload.len()];
    let n = build_frame(&mut f, (PEER_MAC, OUR_MAC), src, dst, payload, 7);
    f.truncate(n);
    f
}

pub fn sa(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}

/// A receive path over `dev` owning `OURS` with our MAC, and one UDP
/// endpoint bound to (OURS, `port`).
pub fn rx_with_udp<D: super::device::RxDevice>(
    dev: D,
    umem: usize,
    port: u16,
) -> (RxPath<D>, EndpointId) {
    let mut rx = RxPath::new(dev, Demux::new(umem), vec![OURS], page());
    rx.mac = Some(OUR_MAC);
    let id = rx.demux.add(EndpointKind::Udp, efd(), 64).unwrap();
    rx.demux.bind(id, 17, sa(OURS, port));
    (rx, id)
}

/// A bare loopback receive device (frames are put on it with `inject`).
pub fn loop_rx() -> LoopRx {
    LoopRx::new(Default::default())
}
