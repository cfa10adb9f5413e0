//! `libnanowire_preload.so`: the LD_PRELOAD shim behind `nanowire run`.
//!
//! It interposes the socket, I/O and readiness calls of an unmodified
//! program. What it does today:
//!
//! * **spin engine** (works without privilege): sockets stay kernel
//!   sockets, but a *blocking* `recv`/`recvfrom`/`recvmsg`/`recvmmsg`/
//!   `read`/`readv` on an IPv4/IPv6 UDP or TCP socket, and a `poll`/
//!   `ppoll`/`select`/`pselect`/`epoll_wait`/`epoll_pwait`/`epoll_pwait2`
//!   whose set holds one, first busy-polls with non-blocking attempts
//!   (`MSG_DONTWAIT`, zero timeouts) for the profile's `spin_us`, then falls
//!   into the real blocking call with what is left of the caller's timeout.
//!   Sleeping costs ~20 us of wake-up on these VMs; spinning removes it.
//! * diagnostics: `NANOWIRE_LOG=info` prints one line per socket saying
//!   which engine serves it and why it is not accelerated.
//!
//! Semantics are the kernel's: every result and errno comes from a real
//! call with the caller's own flags, except that a waiting call returns as
//! soon as a non-blocking attempt succeeds. Non-blocking fds, `MSG_DONTWAIT`,
//! zero timeouts and sockets with `SO_RCVTIMEO` go straight to the kernel.
//! `MSG_WAITALL` and `recvmmsg` without `MSG_WAITFORONE` spin only until the
//! socket is readable and then make the real blocking call.
//!
//! Rules of this library (see also `hooks`):
//! * no recursion: the shim calls the real functions through
//!   `dlsym(RTLD_NEXT)` ([`real`]) or raw syscalls (rustix, which also leave
//!   `errno` alone), never the plain libc names;
//! * no unwinding: profiles are workspace-wide so `panic = "abort"` cannot
//!   be set for this crate alone; instead every exported function is a
//!   plain `extern "C"` function, and since Rust 1.81 a panic that reaches
//!   an `extern "C"` boundary aborts the process (after the panic message).
//!   We do not install a panic hook: it would replace the host program's.
//! * fork: the table is plain memory and is inherited as is; a forked
//!   child that keeps using a socket keeps using the same kernel socket, so
//!   spinning stays correct. exec starts clean (the child loads the shim
//!   afresh from `LD_PRELOAD`, with an empty table).
//! * close while another thread waits: `close` bumps the fd's generation
//!   before closing; a thread spinning on it sees that and fails with EBADF
//!   (the kernel would leave a blocked `recv` asleep on the dead socket).
//!
//! The testable core (fd table, waiter) is the library crate
//! `nanowire-shimcore`, the ABI rules (iovec, sockaddr, msghdr, cmsg) are
//! `nanowire-sockabi`, both with unit tests; the shim reaches the engine
//! only through `nanowire-stack` and reads its typed configuration from
//! `nanowire-options`.
//!
//! Layers (a module uses only the ones below it; no import cycle):
//!
//! * `exports`: the C entry points, generated from the one table in `abi`
//!   (which also generates `real`): engine code → libc, else → dispatch;
//!   plus the naked trampolines of the variadic `fcntl`/`fcntl64`/`ioctl`.
//! * `exports_fd`: the C entry points of the calls that close, create or
//!   hand on fds behind the socket API (close_range, fclose, open, syscall,
//!   vfork, posix_spawn, exec, ...; issue 20).
//! * `dispatch`: what each call does; receives and sends normalise their
//!   arguments (`ops::Recv`, `ops::Send`) and make one call through `ops`.
//! * `ops`: what serves an fd (the one lookup, `ops::of`, in the one table
//!   of engine socket records) and the per-protocol operations (trait
//!   `Ops`: TCP → `streamio`, UDP → `ahooks`, the kernel → `kernelio`).
//! * `ahooks`: the UDP operations over the caller's memory (→ `accel`).
//! * `streamio`: the TCP operations over the caller's memory (→ `tcpx`).
//! * `handover`: an engine TCP connection handed to the kernel (fork,
//!   MSG_OOB, options the engine does not honour); fork's TCP prepare
//!   handler.
//! * `opts`: which options each protocol's engine honours.
//! * `kernelio`: receives on fds the engine does not serve: candidates and
//!   spinning kernel sockets wait the shim's way, then the real call.
//! * `spawn`: children never hold engine sockets (vfork, posix_spawn, exec).
//! * `fdlife`: an fd is what the kernel says it is (close paths, creations,
//!   socket identity).
//! * `ready`: poll/select/epoll over sets with accelerated sockets.
//! * `share`: ports other sockets on the host share go to the kernel.
//! * `tstamp`: SO_TIMESTAMP/SO_TIMESTAMPNS/SO_TIMESTAMPING on accelerated
//!   sockets (control messages, the transmit-stamp error queue).
//! * `accel`: UDP sockets on the xdp engine (records in `table::record`).
//! * `tcpx`: TCP sockets on the xdp engine (records in `table::record`):
//!   the lowest TCP layer, it calls nothing above it.
//! * `spin`: configuration and busy-poll loops of kernel sockets.
//! * `adapt`: the one waiter (`nanowire_shimcore::waiter` over this
//!   process's clock, fd table and signal counts): every blocking call
//!   attempts, asks `Waiter::turn` (EINTR, EBADF by generation, timeout,
//!   spin or sleep a slice) and attempts again.
//! * `signals`: the sigaction trampoline and per-thread delivery counts.
//! * `table`: the process's fd table and its one table of engine socket
//!   records (`nanowire_shimcore::fdtable`: `FdTable`, `SockTable`) and
//!   socket identity (SO_COOKIE).
//! * `log`, `real` (libc through dlsym), `abi`, `sys` (errno, clock, the
//!   engine-call flag).

mod abi;
mod accel;
mod adapt;
mod ahooks;
mod dispatch;
mod execnames;
mod exports;
mod exports_fd;
mod fdlife;
mod forkshare;
mod handover;
mod inject;
mod kernelio;
mod log;
mod ops;
mod opts;
mod owner;
mod placeholder;
mod ready;
mod real;
mod share;
mod signals;
mod spawn;
mod spin;
mod splice;
mod streamio;
mod sys;
mod table;
mod tcpx;
mod tls;
mod tstamp;
mod uaccess;

/// Runs when the library is loaded (before `main`): read the configuration.
extern "C" fn nanowire_preload_init() {
    accel::init();
    tcpx::init();
    handover::init();
    fdlife::init();
    share::init();
    spin::init();
    spawn::receive_prepared();
    spawn::receive_exec_marker();
    if spin::xdp_candidates() {
        tcpx::size_fd_table();
    }
    nanowire_stack::xdp::set_service_lost_hook(service_lost);
}

/// The engine service an engine of this process was attached to is gone
/// (runs on the engine's watch thread): UDP sockets are taken off it
/// (`accel`), then TCP listeners go back to the kernel and connections are
/// handed over or reset (`handover`).
fn service_lost() {
    accel::service_lost();
    handover::service_lost();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = nanowire_preload_init;
