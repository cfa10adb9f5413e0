//! Top layer: the C entry points the program's calls land on, generated
//! from ONE table ([`crate::abi::interposed`]) that also generates the real libc
//! functions ([`crate::real`]). Each export is the same three lines: engine
//! code (a thread inside `sys::engine_call`) goes straight to libc,
//! everything else to [`crate::dispatch`].
//!
//! Layers (each uses only those below it):
//! exports → dispatch → ops → ahooks (UDP) / streamio (TCP) / kernelio →
//! handover, opts → ready → accel, tcpx → spin → adapt → signals → table,
//! log → real → abi, sys.

use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t,
    off64_t, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};

macro_rules! export_fns {
    ($( $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty ; )*) => {
        $(
            /// # Safety
            /// The C library function of the same name: the caller passes
            /// what that function's contract requires.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
                if crate::sys::in_engine() {
                    // SAFETY: the engine's own call with the arguments its
                    // caller made valid for libc's function of this name.
                    return unsafe { crate::real::$name($($a),*) };
                }
                // SAFETY: the application's call; the dispatcher needs the
                // same contract as libc's function, which the caller upholds.
                unsafe { crate::dispatch::$name($($a),*) }
            }
        )*
    };
}

crate::abi::interposed!(export_fns);

// Variadic fcntl/fcntl64/ioctl: stable Rust cannot define a C-variadic
// function, so each export is a naked tail jump to a fixed-arity function
// taking the optional argument as an integer register (see the crate doc).

extern "C" fn fcntl_entry(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if crate::sys::in_engine() {
        // SAFETY: the engine's own call; the real fcntl ignores `arg` for
        // commands that take none.
        return unsafe { crate::real::fcntl(fd, cmd, arg) };
    }
    crate::dispatch::fcntl(fd, cmd, arg, false)
}

extern "C" fn fcntl64_entry(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if crate::sys::in_engine() {
        // SAFETY: as in `fcntl_entry`.
        return unsafe { crate::real::fcntl64(fd, cmd, arg) };
    }
    crate::dispatch::fcntl(fd, cmd, arg, true)
}

extern "C" fn ioctl_entry(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    if crate::sys::in_engine() {
        // SAFETY: the engine's own call, arguments as it passed them.
        return unsafe { crate::real::ioctl(fd, req, arg) };
    }
    crate::dispatch::ioctl(fd, req, arg)
}

/// The architecture's unconditional jump to a symbol, as an asm template.
#[cfg(target_arch = "x86_64")]
macro_rules! jump {
    () => {
        "jmp {}"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! jump {
    () => {
        "b {}"
    };
}

macro_rules! tail_jump {
    ($name:ident => $target:ident) => {
        /// Variadic C entry point: a tail jump to the fixed-arity Rust
        /// function (see the crate doc).
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!($crate::exports::jump!(), sym $target)
        }
    };
}

pub(crate) use {jump, tail_jump};

tail_jump!(fcntl => fcntl_entry);
tail_jump!(fcntl64 => fcntl64_entry);
tail_jump!(ioctl => ioctl_entry);
