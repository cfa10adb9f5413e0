//! Raw system calls for the engine's own I/O.
//!
//! The engine runs inside applications under the LD_PRELOAD shim, which
//! interposes the libc socket functions (`socket`, `sendto`, `recv`,
//! `poll`, `read`, `write`, `setsockopt`, ...). Calls the engine makes for
//! itself -- netlink, neighbour solicitation, AF_XDP kicks, its eventfds,
//! and everything on its own neighbour thread -- must reach the kernel
//! directly, never the shim (which could, for instance, put the
//! solicitation's UDP socket onto the engine itself). These wrappers issue
//! the system call instruction themselves ([`syscall!`]): not libc's
//! `syscall(3)`, which the shim interposes too (to see `SYS_close` and the
//! other fd-changing calls a program makes by number) and which would cost
//! every TX kick a trip through that interposer (a thread-local lookup
//! and a dispatch on the number) for nothing.

use libc::{c_int, c_long, c_void, size_t, sockaddr, socklen_t};

#[inline]
fn ret(r: c_long) -> c_int {
    r as c_int
}

/// libc's convention for a raw result: -1 and errno for -4095..=-1.
#[inline(always)]
fn errno_ret(r: isize) -> c_long {
    if (-4095..0).contains(&r) {
        // SAFETY: the calling thread's errno, a valid thread-local int.
        unsafe { *libc::__errno_location() = -r as c_int };
        -1
    } else {
        r as c_long
    }
}

/// One system call with up to six integer arguments, made with the
/// architecture's instruction (x86-64 `syscall`, AArch64 `svc 0`; libc's
/// `syscall(3)` elsewhere). Returns like `syscall(3)`: -1 with errno set on
/// failure.
///
/// # Safety
/// As `syscall(3)` with the same number and arguments: pointer arguments
/// must be valid for what the kernel does with them.
#[inline(always)]
unsafe fn raw6(n: c_long, a: usize, b: usize, c: usize, d: usize, e: usize, f: usize) -> c_long {
    #[cfg(target_arch = "x86_64")]
    {
        let r: isize;
        // SAFETY: the x86-64 Linux system call ABI: number in rax, arguments
        // in rdi, rsi, rdx, r10, r8, r9, result in rax; the kernel clobbers
        // rcx and r11 only. Memory effects are the caller's contract.
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") n as isize => r,
                in("rdi") a, in("rsi") b, in("rdx") c,
                in("r10") d, in("r8") e, in("r9") f,
                lateout("rcx") _, lateout("r11") _,
                options(nostack, preserves_flags),
            )
        };
        errno_ret(r)
    }
    #[cfg(target_arch = "aarch64")]
    {
        let r: isize;
        // SAFETY: the AArch64 Linux system call ABI: number in x8, arguments
        // in x0..x5, result in x0. Memory effects are the caller's contract.
        unsafe {
            core::arch::asm!(
                "svc 0",
                in("x8") n,
                inlateout("x0") a as isize => r,
                in("x1") b, in("x2") c, in("x3") d, in("x4") e, in("x5") f,
                options(nostack, preserves_flags),
            )
        };
        errno_ret(r)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    // SAFETY: per this function's contract.
    unsafe {
        libc::syscall(n, a, b, c, d, e, f)
    }
}

/// `syscall!(SYS_x, args..)`: [`raw6`] with the missing arguments zero;
/// each argument is converted with `as usize` (ints, pointers).
macro_rules! syscall {
    (@pad $n:expr; [$a:expr, $b:expr, $c:expr, $d:expr, $e:expr, $f:expr,]; [$($z:expr),*]) => {
        raw6($n, $a, $b, $c, $d, $e, $f)
    };
    (@pad $n:expr; [$($a:expr,)*]; [$z0:expr $(, $z:expr)*]) => {
        syscall!(@pad $n; [$($a,)* $z0,]; [$($z),*])
    };
    ($n:expr $(, $a:expr)* $(,)?) => {
        syscall!(@pad $n; [$($a as usize,)*]; [0usize, 0usize, 0usize, 0usize, 0usize, 0usize])
    };
}

/// socket(2).
pub fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: plain syscall with integer arguments.
    ret(unsafe { syscall!(libc::SYS_socket, domain, ty, proto) })
}

/// bind(2).
///
/// # Safety
/// `addr` must point to `len` readable bytes.
pub unsafe fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: per the caller's contract.
    ret(unsafe { syscall!(libc::SYS_bind, fd, addr, len) })
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
    ret(unsafe { syscall!(libc::SYS_setsockopt, fd, level, opt, v, len) })
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
    unsafe { syscall!(libc::SYS_sendto, fd, buf, len, flags, addr, alen) as isize }
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
    let r = unsafe { syscall!(libc::SYS_sendmsg, fd, &raw const m, flags) as isize };
    if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // A kernel before 6.13 does not know SCM_TS_OPT_ID: send without it
        // (the stamp then carries the kernel socket's own counter). A real
        // EINVAL comes back from this plain send too.
        m.msg_control = std::ptr::null_mut();
        m.msg_controllen = 0;
        // SAFETY: as above, without the control buffer.
        return unsafe { syscall!(libc::SYS_sendmsg, fd, &raw const m, flags) as isize };
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
    unsafe { syscall!(libc::SYS_recvfrom, fd, buf, len, flags, addr, alen) as isize }
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
        syscall!(
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
    unsafe { syscall!(libc::SYS_write, fd, &one as *const u64, 8usize) };
}

/// Reset a non-blocking eventfd.
pub fn eventfd_drain(fd: c_int) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    unsafe { syscall!(libc::SYS_read, fd, &mut v as *mut u64, 8usize) };
}

/// The lowest number a descriptor the engine keeps may take: half the
/// process's soft `RLIMIT_NOFILE`, at most 512 (below `FD_SETSIZE`, so a
/// program's `select` never meets one of ours). Read once.
pub fn fd_floor() -> c_int {
    static FLOOR: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    *FLOOR.get_or_init(|| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills the rlimit we pass.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return 0;
        }
        (r.rlim_cur / 2).min(512) as c_int
    })
}

/// Move a descriptor the engine keeps above [`fd_floor`] (close-on-exec),
/// as Onload keeps its own: the low numbers stay the program's, so its
/// next socket or file gets the number it gets plainly, and a number it
/// frees is never taken by one of ours. Unchanged where no number above
/// the floor is free.
pub fn above_floor(fd: std::os::fd::OwnedFd) -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};
    let floor = fd_floor();
    if fd.as_raw_fd() >= floor {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC on our own open descriptor; integer arguments.
    let up = ret(unsafe {
        syscall!(
            libc::SYS_fcntl,
            fd.as_raw_fd(),
            libc::F_DUPFD_CLOEXEC,
            floor
        )
    });
    if up < 0 {
        return fd;
    }
    // The old number is closed by the raw syscall, not by dropping `fd`
    // (libc's close, which the shim interposes: engine code must never
    // enter the shim's close, which takes the shim's locks, while it may
    // hold an engine lock).
    close(std::os::fd::IntoRawFd::into_raw_fd(fd));
    // SAFETY: `up` is the fresh duplicate made above; we own it.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(up) }
}

/// [`above_floor`] for a raw descriptor the caller owns: returns the number
/// to use from now on (the old one is closed if it moved).
pub fn raw_above_floor(fd: c_int) -> c_int {
    use std::os::fd::{FromRawFd, IntoRawFd};
    if fd < 0 {
        return fd;
    }
    // SAFETY: the caller owns `fd` and gives it up; it gets the (possibly
    // new) number back as its own.
    above_floor(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }).into_raw_fd()
}

/// A non-blocking, close-on-exec eventfd for the engine to keep, above the
/// program's numbers ([`above_floor`]).
pub fn eventfd() -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd2 with integer arguments only.
    let fd = ret(unsafe {
        syscall!(
            libc::SYS_eventfd2,
            0usize,
            libc::EFD_NONBLOCK | libc::EFD_CLOEXEC
        )
    });
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(above_floor(unsafe {
        std::os::fd::OwnedFd::from_raw_fd(fd)
    }))
}

/// Wait until every CPU has left the receive path it was in when this was
/// called: an RCU grace period (`membarrier(MEMBARRIER_CMD_GLOBAL)` runs
/// `synchronize_rcu`). An XDP program runs, and its redirects to AF_XDP
/// sockets are flushed onto their RX rings, inside one RCU read-side
/// section (the NAPI poll, or the generic-XDP receive), so after a steering
/// map update and this call every frame the old entry steered is on its
/// ring. `false` where the kernel refuses it (nohz_full, before 4.3): a
/// frame still in flight on another CPU may then reach the ring later.
pub fn rcu_grace_period() -> bool {
    const MEMBARRIER_CMD_GLOBAL: usize = 1;
    // SAFETY: integer arguments only; no memory is passed.
    ret(unsafe { syscall!(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0usize, 0usize) }) == 0
}

/// bpf(2): the raw result (-1 and errno on failure).
///
/// # Safety
/// `attr` must point to `size` bytes laid out as the kernel's `union
/// bpf_attr` prefix for `cmd`, with every pointer inside it valid for what
/// the command does with it.
pub unsafe fn bpf(cmd: c_int, attr: *mut c_void, size: usize) -> c_long {
    // SAFETY: per the caller's contract.
    unsafe { syscall!(libc::SYS_bpf, cmd, attr, size) }
}

/// dup3(2) with O_CLOEXEC: `new` names what `old` names from now on.
pub fn dup3_cloexec(old: c_int, new: c_int) -> c_int {
    // SAFETY: integer arguments only.
    ret(unsafe { syscall!(libc::SYS_dup3, old, new, libc::O_CLOEXEC) })
}

/// Set (`on`) or clear FD_CLOEXEC on `fd`; false if the kernel refused
/// (not an open descriptor).
pub fn set_cloexec(fd: c_int, on: bool) -> bool {
    let flag = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: F_SETFD with integer arguments only.
    ret(unsafe { syscall!(libc::SYS_fcntl, fd, libc::F_SETFD, flag) }) >= 0
}

/// close(2) of a descriptor we own and nobody else uses.
pub fn close(fd: c_int) {
    // SAFETY: plain syscall; the caller owns fd.
    unsafe { syscall!(libc::SYS_close, fd) };
}

/// An unnamed file of `len` bytes on a tmpfs of our own mounted nowhere
/// (`fsopen`/`fsmount`: a detached mount no path reaches; the file is an
/// `O_TMPFILE`), with `huge=always`: shared memory on 2 MiB pages whatever
/// the host's `shmem_enabled` (which rules memfds and shared anonymous
/// memory only). The mount's `size=` is `len` rounded up to 2 MiB, so the
/// file cannot be grown past it. Needs CAP_SYS_ADMIN (the engine service);
/// an error where the kernel or the caller cannot (then a memfd does).
pub fn huge_tmpfs_file(len: usize) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let err = std::io::Error::last_os_error;
    let own = |fd: c_long| -> std::io::Result<OwnedFd> {
        if fd < 0 {
            return Err(err());
        }
        // SAFETY: a fresh descriptor the kernel just gave us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as c_int) })
    };
    const FSOPEN_CLOEXEC: usize = 1;
    const FSCONFIG_SET_STRING: usize = 1;
    const FSCONFIG_CMD_CREATE: usize = 6;
    const FSMOUNT_CLOEXEC: usize = 1;
    const MOUNT_ATTR_NOSUID: usize = 0x2;
    const MOUNT_ATTR_NODEV: usize = 0x4;
    const MOUNT_ATTR_NOEXEC: usize = 0x8;
    // SAFETY: a NUL-terminated name and a flag.
    let fs = own(unsafe { syscall!(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) })?;
    let size = format!("{}\0", len.next_multiple_of(2 << 20));
    for (k, v) in [
        (c"huge", c"always"),
        (c"mode", c"0700"),
        (c"nr_inodes", c"8"),
    ]
    .iter()
    .map(|(k, v)| (k.as_ptr(), v.as_ptr()))
    .chain(std::iter::once((c"size".as_ptr(), size.as_ptr().cast())))
    {
        // SAFETY: NUL-terminated key and value, alive for the call.
        if unsafe {
            syscall!(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k,
                v,
                0usize
            )
        } < 0
        {
            return Err(err());
        }
    }
    // SAFETY: integer arguments and null pointers.
    if unsafe {
        syscall!(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            0usize,
            0usize,
            0usize
        )
    } < 0
    {
        return Err(err());
    }
    // SAFETY: integer arguments only.
    let mnt = own(unsafe {
        syscall!(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC
        )
    })?;
    // SAFETY: a NUL-terminated path relative to our own mount's root.
    let file = own(unsafe {
        syscall!(
            libc::SYS_openat,
            mnt.as_raw_fd(),
            c".".as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600
        )
    })?;
    // SAFETY: integer arguments on our own descriptor.
    if unsafe { syscall!(libc::SYS_ftruncate, file.as_raw_fd(), len) } < 0 {
        return Err(err());
    }
    Ok(file)
}

/// A memfd of `len` bytes sealed against shrinking and growing: a holder's
/// mapping can never fault past its end (SIGBUS) because someone resized it.
pub(crate) fn sealed_memfd(
    name: &std::ffi::CStr,
    len: usize,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name; the result is checked below.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor we own.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate/fcntl on our own descriptor.
    unsafe {
        if libc::ftruncate(raw, len as libc::off_t) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::fcntl(
            raw,
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        );
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> Option<i32> {
        std::io::Error::last_os_error().raw_os_error()
    }

    #[test]
    fn raw_calls_return_and_set_errno_like_libc() {
        // SAFETY: no buffers: the kernel refuses the fd first.
        let r = unsafe {
            recvfrom(
                -1,
                std::ptr::null_mut(),
                0,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, -1);
        assert_eq!(errno(), Some(libc::EBADF));

        // Six arguments and a result > 0: a datagram to itself on loopback.
        let fd = socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {:?}", errno());
        // SAFETY: an all-zero sockaddr_in is valid.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
        let slen = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
        // SAFETY: a live sockaddr_in of `slen` bytes.
        assert_eq!(unsafe { bind(fd, (&raw const sin).cast(), slen) }, 0);
        let mut len = slen;
        // SAFETY: as above; the kernel writes at most `len` bytes.
        assert_eq!(
            unsafe { libc::getsockname(fd, (&raw mut sin).cast(), &mut len) },
            0
        );
        let msg = b"raw";
        // SAFETY: `msg` readable, `sin` a live address of `slen` bytes.
        let n = unsafe { sendto(fd, msg.as_ptr().cast(), 3, 0, (&raw const sin).cast(), slen) };
        assert_eq!(n, 3);
        let mut p = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(poll(&mut p, 1000), 1);
        let mut buf = [0u8; 8];
        // SAFETY: `buf` writable for its length; no address wanted.
        let n = unsafe {
            recvfrom(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(n, 3);
        assert_eq!(&buf[..3], msg);
        close(fd);
    }
}
