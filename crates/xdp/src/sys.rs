//! Raw system calls for the engine's own I/O.
//!
//! The engine runs inside applications under the LD_PRELOAD shim, which
//! interposes the libc socket functions (`socket`, `sendto`, `recv`,
//! `poll`, `read`, `write`, `setsockopt`, ...). Calls the engine makes for
//! itself -- netlink, neighbour solicitation, AF_XDP kicks, its eventfds,
//! and everything on its own neighbour thread -- must reach the kernel
//! directly, never the shim (which could, for instance, put the
//! solicitation's UDP socket onto the engine itself). These wrappers go
//! through `syscall(2)`, which no shim interposes.

use libc::{c_int, c_long, c_void, size_t, sockaddr, socklen_t};

#[inline]
fn ret(r: c_long) -> c_int {
    r as c_int
}

/// socket(2).
pub fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: plain syscall with integer arguments.
    ret(unsafe { libc::syscall(libc::SYS_socket, domain, ty, proto) })
}

/// bind(2).
///
/// # Safety
/// `addr` must point to `len` readable bytes.
pub unsafe fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: per the caller's contract.
    ret(unsafe { libc::syscall(libc::SYS_bind, fd, addr, len) })
}

/// setsockopt(2).
///
/// # Safety
/// `v` must point to `len` readable bytes.
pub unsafe fn setsockopt(
    fd: c_int,
    level: c_int,
    opt: c_int,
    v: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: per the caller's contract.
    ret(unsafe { libc::syscall(libc::SYS_setsockopt, fd, level, opt, v, len) })
}

/// sendto(2).
///
/// # Safety
/// `buf` must point to `len` readable bytes, `addr` (if not null) to
/// `alen` readable bytes.
pub unsafe fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> isize {
    // SAFETY: per the caller's contract.
    unsafe { libc::syscall(libc::SYS_sendto, fd, buf, len, flags, addr, alen) as isize }
}

/// `SCM_TS_OPT_ID` (Linux 6.13): the `SOF_TIMESTAMPING_OPT_ID` key of
/// this one send's transmit stamps, instead of the socket's counter.
pub const SCM_TS_OPT_ID: c_int = 81;

/// sendto(2) of one datagram to `addr` with an `SCM_TS_OPT_ID` control
/// message carrying `key` (a socket whose counter is kept elsewhere: the
/// shim's engine sockets send the datagrams that take the kernel path with
/// the key the engine's counter gives them).
pub fn sendto_tskey(
    fd: c_int,
    buf: &[u8],
    flags: c_int,
    addr: &libc::sockaddr_in,
    key: u32,
) -> isize {
    // CMSG_SPACE(4) on 64-bit: a 16-byte header and 4 bytes, padded to 8.
    let mut ctl = [0u64; 3];
    let hdr = libc::cmsghdr {
        // CMSG_LEN(4): header and 4 data bytes.
        cmsg_len: (std::mem::size_of::<libc::cmsghdr>() + 4) as _,
        cmsg_level: libc::SOL_SOCKET,
        cmsg_type: SCM_TS_OPT_ID,
    };
    // SAFETY: ctl is 24 bytes: the 16-byte header and the key after it fit.
    unsafe {
        let p = ctl.as_mut_ptr().cast::<u8>();
        std::ptr::copy_nonoverlapping(
            (&raw const hdr).cast::<u8>(),
            p,
            std::mem::size_of::<libc::cmsghdr>(),
        );
        std::ptr::copy_nonoverlapping(
            key.to_ne_bytes().as_ptr(),
            p.add(std::mem::size_of::<libc::cmsghdr>()),
            4,
        );
    }
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the fields are set below.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_name = (addr as *const libc::sockaddr_in).cast_mut().cast();
    m.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.as_mut_ptr().cast();
    m.msg_controllen = std::mem::size_of_val(&ctl) as _;
    // SAFETY: every pointer in `m` refers to a live local or the caller's
    // slice (read only by the kernel).
    let r = unsafe { libc::syscall(libc::SYS_sendmsg, fd, &raw const m, flags) as isize };
    if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // A kernel before 6.13 does not know SCM_TS_OPT_ID: send without it
        // (the stamp then carries the kernel socket's own counter). A real
        // EINVAL comes back from this plain send too.
        m.msg_control = std::ptr::null_mut();
        m.msg_controllen = 0;
        // SAFETY: as above, without the control buffer.
        return unsafe { libc::syscall(libc::SYS_sendmsg, fd, &raw const m, flags) as isize };
    }
    r
}

/// recvfrom(2).
///
/// # Safety
/// `buf` must point to `len` writable bytes; `addr`/`alen` null or valid.
pub unsafe fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> isize {
    // SAFETY: per the caller's contract.
    unsafe { libc::syscall(libc::SYS_recvfrom, fd, buf, len, flags, addr, alen) as isize }
}

/// poll(2), through ppoll (every architecture has it).
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: c_int) -> c_int {
    let ts = libc::timespec {
        tv_sec: (timeout_ms.max(0) / 1000) as libc::time_t,
        tv_nsec: ((timeout_ms.max(0) % 1000) as libc::c_long) * 1_000_000,
    };
    let tsp = if timeout_ms < 0 {
        std::ptr::null()
    } else {
        &ts as *const libc::timespec
    };
    // SAFETY: fds is a valid array of its length; tsp null or a live timespec;
    // no signal mask (null) and its size argument as the kernel expects.
    ret(unsafe {
        libc::syscall(
            libc::SYS_ppoll,
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tsp,
            std::ptr::null::<libc::sigset_t>(),
            8usize,
        )
    })
}

/// Add 1 to an eventfd.
pub fn eventfd_signal(fd: c_int) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    unsafe { libc::syscall(libc::SYS_write, fd, &one as *const u64, 8usize) };
}

/// Reset a non-blocking eventfd.
pub fn eventfd_drain(fd: c_int) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    unsafe { libc::syscall(libc::SYS_read, fd, &mut v as *mut u64, 8usize) };
}

/// close(2) of a descriptor we own and nobody else uses.
pub fn close(fd: c_int) {
    // SAFETY: plain syscall; the caller owns fd.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}
