//! The AF_XDP socket calls both the private engine's sockets (`xsk`) and
//! the engine service's shared UMEM (`shared`) are made of: socket, socket
//! options, ring offsets and mappings, bind.

use crate::mmap::Mmap;
use crate::ring::Ring;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// SOL_XDP option raising the frames a copy-mode TX kick may send (6.17+).
pub const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;
/// Bind flag: multi-buffer (scatter-gather) packets (6.6+).
pub const XDP_USE_SG: u16 = 1 << 4;

pub(crate) fn setsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: &T,
) -> io::Result<()> {
    // SAFETY: v points to a live T of size_of::<T>() bytes.
    let r = unsafe {
        crate::sys::setsockopt(
            fd,
            level,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub(crate) fn mmap_offsets(fd: RawFd) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: zeroed offsets struct is valid; getsockopt fills it.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: off/len describe a writable buffer of the right size.
    if unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            (&mut off as *mut libc::xdp_mmap_offsets).cast(),
            &mut len,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(off)
}

pub(crate) fn map_ring<T: Copy>(
    fd: RawFd,
    o: &libc::xdp_ring_offset,
    n: u32,
    pgoff: u64,
) -> io::Result<Ring<T>> {
    let mut m = Mmap::map(
        o.desc as usize + n as usize * std::mem::size_of::<T>(),
        Some((fd, pgoff as libc::off_t)),
    )?;
    // Not inherited by forked children: a ring's mapping holds its AF_XDP
    // socket, so a child's copy kept the queue bound after its parent's
    // engine was gone (a daemon forked by its parent could never open an
    // engine of its own: EBUSY), and a service member's socket after the
    // service closed it. A child never uses its parent's engine.
    m.dont_fork();
    Ok(Ring::new(m, o, n))
}

pub(crate) fn xsk_socket() -> io::Result<OwnedFd> {
    let raw = crate::sys::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor we own. Kept: above the
    // program's numbers.
    Ok(crate::sys::above_floor(unsafe {
        OwnedFd::from_raw_fd(raw)
    }))
}

pub(crate) fn bind_xsk(
    fd: RawFd,
    ifindex: u32,
    queue: u32,
    flags: u16,
    shared: u32,
) -> io::Result<()> {
    let sa = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: flags,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: shared,
    };
    // SAFETY: sa is a valid sockaddr_xdp of the size passed.
    if unsafe {
        crate::sys::bind(
            fd,
            (&sa as *const libc::sockaddr_xdp).cast(),
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
