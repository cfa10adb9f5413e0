//! The real libc functions, found with `dlsym(RTLD_NEXT, ...)` on first use
//! and cached. The shim calls these (never the plain `libc::` names, which
//! inside this library resolve to the shim's own exported definitions).

use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, pollfd,
    sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A lazily resolved symbol.
pub struct Sym {
    name: &'static [u8],
    addr: AtomicUsize,
}

impl Sym {
    pub const fn new(name: &'static [u8]) -> Sym {
        Sym {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    #[inline(always)]
    pub fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 { a } else { self.resolve() }
    }

    #[cold]
    fn resolve(&self) -> usize {
        // SAFETY: `name` is a NUL-terminated literal; dlsym is thread-safe.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) } as usize;
        if p == 0 {
            let msg = b"nanowire preload: a libc function the shim needs is missing; aborting\n";
            // SAFETY: writing a static buffer to stderr with a raw syscall.
            let _ = rustix::io::write(unsafe { rustix::fd::BorrowedFd::borrow_raw(2) }, msg);
            std::process::abort();
        }
        self.addr.store(p, Ordering::Relaxed);
        p
    }
}

macro_rules! real_fns {
    ($( $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty ; )*) => {
        $(
            #[inline(always)]
            #[allow(dead_code)] // some are used only by the accelerated path
            pub unsafe fn $name($($a: $t),*) -> $r {
                static SYM: Sym = Sym::new(concat!(stringify!($name), "\0").as_bytes());
                // SAFETY: the symbol is libc's function of exactly this C
                // signature (glibc's prototypes); a non-null address from dlsym.
                let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { core::mem::transmute(SYM.get()) };
                // SAFETY: the caller upholds the C function's contract.
                unsafe { f($($a),*) }
            }
        )*
    };
}

real_fns! {
    socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    socketpair(domain: c_int, ty: c_int, proto: c_int, sv: *mut c_int) -> c_int;
    accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    close(fd: c_int) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(old: c_int, new: c_int) -> c_int;
    dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, len: size_t, flags: c_int, addr: *const sockaddr, alen: socklen_t) -> ssize_t;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int;
    write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t;
    writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    recvmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int, tmo: *mut timespec) -> c_int;
    read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    __recvfrom_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t;
    poll(fds: *mut pollfd, n: nfds_t, tmo: c_int) -> c_int;
    ppoll(fds: *mut pollfd, n: nfds_t, tmo: *const timespec, mask: *const sigset_t) -> c_int;
    __poll_chk(fds: *mut pollfd, n: nfds_t, tmo: c_int, fdslen: size_t) -> c_int;
    __ppoll_chk(fds: *mut pollfd, n: nfds_t, tmo: *const timespec, mask: *const sigset_t, fdslen: size_t) -> c_int;
    select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, tv: *mut timeval) -> c_int;
    pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, ts: *const timespec, mask: *const sigset_t) -> c_int;
    epoll_create(size: c_int) -> c_int;
    epoll_create1(flags: c_int) -> c_int;
    epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
    epoll_wait(ep: c_int, evs: *mut epoll_event, max: c_int, tmo: c_int) -> c_int;
    epoll_pwait(ep: c_int, evs: *mut epoll_event, max: c_int, tmo: c_int, mask: *const sigset_t) -> c_int;
    epoll_pwait2(ep: c_int, evs: *mut epoll_event, max: c_int, tmo: *const timespec, mask: *const sigset_t) -> c_int;
}

static FCNTL: Sym = Sym::new(b"fcntl\0");
static FCNTL64: Sym = Sym::new(b"fcntl64\0");
static IOCTL: Sym = Sym::new(b"ioctl\0");

/// The real variadic `fcntl`, always called with a third argument (the
/// kernel ignores it for commands that take none).
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: libc's `int fcntl(int, int, ...)`.
    let f: unsafe extern "C" fn(c_int, c_int, ...) -> c_int =
        unsafe { core::mem::transmute(FCNTL.get()) };
    // SAFETY: as above; an integer-class variadic argument.
    unsafe { f(fd, cmd, arg) }
}

/// The real variadic `fcntl64`.
pub unsafe fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: libc's `int fcntl64(int, int, ...)`.
    let f: unsafe extern "C" fn(c_int, c_int, ...) -> c_int =
        unsafe { core::mem::transmute(FCNTL64.get()) };
    // SAFETY: as above.
    unsafe { f(fd, cmd, arg) }
}

/// The real variadic `ioctl` (glibc: `int ioctl(int, unsigned long, ...)`).
pub unsafe fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    // SAFETY: libc's ioctl.
    let f: unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int =
        unsafe { core::mem::transmute(IOCTL.get()) };
    // SAFETY: as above.
    unsafe { f(fd, req, arg) }
}
