//! The real libc functions, found with `dlsym(RTLD_NEXT, ...)` on first use
//! and cached. The shim calls these (never the plain `libc::` names, which
//! inside this library resolve to the shim's own exported definitions).

use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t,
    off64_t, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
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

// Every interposed function, from the one table of `exports`.
crate::abi::interposed!(real_fns);

// Functions the shim calls but does not interpose.
real_fns! {
    socketpair(domain: c_int, ty: c_int, proto: c_int, sv: *mut c_int) -> c_int;
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
