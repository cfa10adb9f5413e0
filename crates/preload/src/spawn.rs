//! Children never hold the engine's sockets (issue 20, findings 3 and 7).
//!
//! A socket two processes share can only be served where both can use it:
//! the kernel. `fork()` is handled by the `pthread_atfork` handlers of
//! `accel` and `tcpx` (a TCP connection waits on the parent's engine
//! until a second process uses it: `forkshare`); the calls that start a
//! child without running them are handled here, before the child exists:
//!
//! * `vfork()` (Python's `subprocess`, which then `dup2`s any fd, even a
//!   close-on-exec one, onto the child's stdin/stdout): in a process with
//!   engine sockets it is a `fork()` (session 28): the child gets its own
//!   copy of the tables, so the sockets stay on the engine as at any fork,
//!   and the exec of the child, where the shim sees exactly which fds the
//!   new program inherits, has the owner take off or hand over just
//!   those (`prepare_exec`, a forked child's copies: the owner's broker).
//!   Without engine sockets it is the real vfork, and the shim is switched
//!   off for the child, which runs in the parent's memory until it execs
//!   (the thread's engine-call flag, which the child shares, is set around
//!   the system call and cleared in the parent when it resumes), so
//!   nothing the child does (dup2, close_range, sigaction) can change the
//!   parent's tables.
//! * `posix_spawn`/`posix_spawnp`, `system`, `popen`, `execve` and the
//!   other `exec` functions: the engine sockets the new program inherits
//!   (no FD_CLOEXEC), and those a `posix_spawn_file_actions_adddup2` names.
//!
//! "Prepared" means: a UDP socket is taken off the engine (the kernel socket
//! carries on, in the application's blocking mode), a listener goes back to
//! the kernel, a connection is handed over to the kernel with TCP_REPAIR
//! (`handover.rs`); one that cannot be (no CAP_NET_ADMIN, a state other
//! than ESTABLISHED/CLOSE-WAIT) stays with this process and the child gets
//! an unconnected socket: one warn line says so.

use crate::accel;
use crate::fdlife;
use crate::log::log;
use crate::tcpx;
use libc::{c_char, c_int};
use nanowire_options::Level;
#[cfg(target_arch = "x86_64")]
use std::cell::Cell;

/// Does an exec'd program inherit `fd` (no FD_CLOEXEC)?
pub fn inheritable(fd: c_int) -> bool {
    // SAFETY: the fd is only borrowed for one fcntl.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_getfd(b).is_ok_and(|f| !f.contains(rustix::io::FdFlags::CLOEXEC))
}

/// Prepare the engine sockets a child will share (`inherits`), `why` in
/// the lines that say so.
pub fn prepare(inherits: &dyn Fn(c_int) -> bool, why: &str) {
    let e = crate::sys::errno();
    fdlife::sweep();
    crate::handover::prepare_child(inherits, why, false);
    accel::prepare_child(inherits, why, false);
    crate::sys::set_errno(e);
}

/// At load (after the configuration): take the steering program `nanowire
/// run` attached before it exec'd this program (`NANOWIRE_PREPARED`,
/// nanowire_xdp::prestart), removing the variable from the environment so
/// no child sees it. Its fds are checked and made close-on-exec; one that
/// does not check out is closed with one line (the engine then attaches
/// its own, as without). A process without the xdp engine gives it up.
pub fn receive_prepared() {
    use nanowire_stack::xdp::prestart;
    let Some(v) = std::env::var_os(prestart::ENV) else {
        return;
    };
    // SAFETY: the library's constructor runs before main, when the
    // program has no other thread that could read the environment.
    unsafe { std::env::remove_var(prestart::ENV) };
    let (kept, refused) = prestart::receive(&v.to_string_lossy());
    for why in refused {
        log!(
            Level::Warn,
            "not adopting the steering program nanowire run attached ({why}): the engine attaches its own"
        );
    }
    if kept.is_empty() {
        return;
    }
    if !crate::spin::xdp_candidates() {
        prestart::give_up();
        return;
    }
    log!(
        Level::Info,
        "steering program attached by nanowire run held for the engine on {}",
        kept.join(", ")
    );
    // SAFETY: a plain extern "C" handler.
    unsafe { libc::pthread_atfork(Some(give_up_prepared), None, None) };
}

/// A fork before the engine started: see [`give_up_prepared_for`].
extern "C" fn give_up_prepared() {
    give_up_prepared_for("fork()");
}

/// `what` (a fork, spawn or exec) before the engine started: the prepared
/// steering program is closed, so that a child's own engine can attach (a
/// link held here would make its attach fail with EBUSY).
fn give_up_prepared_for(what: &str) {
    if nanowire_stack::xdp::prestart::give_up() > 0 {
        log!(
            Level::Info,
            "{what} before the engine started: the steering program nanowire run attached is closed"
        );
    }
}

/// Before `what` (posix_spawn, system, popen, exec): the engine sockets
/// without FD_CLOEXEC.
pub fn prepare_exec(what: &str) {
    // No copy of the engine's fds in a warden spawn's child may outlive
    // the old image (warden::settle).
    if nanowire_stack::xdp::service::warden::spawning() {
        log!(
            Level::Info,
            "{what}: waiting for the warden's start in flight"
        );
        if !nanowire_stack::xdp::service::warden::settle(std::time::Duration::from_secs(2)) {
            log!(
                Level::Warn,
                "{what}: the warden's start is still in flight after 2 s: a new program on this interface may find it held"
            );
        }
    }
    give_up_prepared_for(what);
    if what == "exec"
        && !nanowire_stack::xdp::service::warden::release_link(std::time::Duration::from_secs(2))
    {
        log!(
            Level::Warn,
            "exec: the warden did not let the XDP link go within 2 s: the new program may find the interface held"
        );
    }
    if what == "exec" {
        // The close-on-exec copies of connections a parent shared at fork
        // go with this program.
        tcpx::held_until_exec(&|fd| !inheritable(fd));
        accel::held_until_exec(&|fd| !inheritable(fd));
        accel::owner_leaving("exec: this image goes, its forked child holds it", false);
        nanowire_stack::xdp::before_exec();
    }
    if what == "exec" {
        // Whatever an earlier exec that failed named is forgotten.
        crate::execnames::exec_preparing(true);
    }
    if has_engine_fds() {
        prepare(
            &inheritable,
            &format!("{what}: the new program inherits it (no FD_CLOEXEC)"),
        );
    }
    crate::execnames::exec_preparing(false);
}

/// The variable naming, for the new image, the connections an exec handed
/// over to the kernel while this process alone held them
/// (`handover::exec_sole`): `pid:cookie,cookie`.
const EXEC_ENV: &str = "NANOWIRE_EXEC_TCP";

/// The environment an exec passes on (`envp`, a null-terminated array),
/// with [`EXEC_ENV`] naming the connections the new image may take back
/// onto the engine, when there are any and the new program runs with this
/// shim (its LD_PRELOAD names it; without, nothing is added: a program
/// without the shim never sees the variable). `None`: pass `envp` as it is.
pub fn exec_env(envp: *const *const c_char) -> Option<ExecEnv> {
    let sole = crate::execnames::exec_sole();
    if sole.is_empty() || envp.is_null() {
        return None;
    }
    let mut ptrs = Vec::new();
    let mut shim = false;
    let mut i = 0;
    loop {
        // SAFETY: envp is the caller's null-terminated array of C strings
        // (exec's contract), read up to its terminator.
        let p = unsafe { *envp.add(i) };
        if p.is_null() {
            break;
        }
        i += 1;
        // SAFETY: a NUL-terminated string of that array.
        let v = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        if v.starts_with(EXEC_ENV.as_bytes()) && v.get(EXEC_ENV.len()) == Some(&b'=') {
            continue;
        }
        if let Some(list) = v.strip_prefix(b"LD_PRELOAD=") {
            shim |= list
                .split(|&c| c == b':' || c == b' ')
                .any(|l| l.ends_with(b"libnanowire_preload.so"));
        }
        ptrs.push(p);
    }
    if !shim {
        return None;
    }
    let list: Vec<String> = sole.iter().map(u64::to_string).collect();
    let var = std::ffi::CString::new(format!(
        "{EXEC_ENV}={}:{}",
        std::process::id(),
        list.join(",")
    ))
    .ok()?;
    ptrs.push(var.as_ptr());
    ptrs.push(std::ptr::null());
    Some(ExecEnv { _var: var, ptrs })
}

/// For an exec that passes this process's environment and cannot be given
/// another (`execl`, `execlp`, whose arguments are variadic): `environ`
/// becomes [`exec_env`]'s copy, when it makes one. The copy is never freed
/// (a thread reading the environment meanwhile reads the old array or the
/// new one, both whole); if the exec fails the program keeps it, the
/// variable with it (it names this pid's sockets only for an image of
/// this pid that this shim loads).
pub fn exec_environ() {
    unsafe extern "C" {
        static mut environ: *const *const c_char;
    }
    // SAFETY: reading libc's environment pointer, as exec reads it.
    let cur = unsafe { environ };
    if let Some(env) = exec_env(cur) {
        let env = Box::leak(Box::new(env));
        // SAFETY: one pointer store to libc's environment array, which
        // stays valid for ever (leaked above).
        unsafe { environ = env.as_ptr() };
    }
}

/// An exec's environment with [`EXEC_ENV`] added ([`exec_env`]).
pub struct ExecEnv {
    _var: std::ffi::CString,
    ptrs: Vec<*const c_char>,
}

impl ExecEnv {
    /// The null-terminated array, valid while `self` lives.
    pub fn as_ptr(&self) -> *const *const c_char {
        self.ptrs.as_ptr()
    }
}

/// At load: the connections the old image of this process named
/// ([`EXEC_ENV`]), taken out of the environment (no child sees it). Only
/// this process's own name counts (the pid an exec keeps): a variable
/// some other process left in an environment names nothing here.
pub fn receive_exec_marker() {
    let Some(v) = std::env::var_os(EXEC_ENV) else {
        return;
    };
    // SAFETY: the library's constructor runs before main, when the
    // program has no other thread that could read the environment.
    unsafe { std::env::remove_var(EXEC_ENV) };
    let v = v.to_string_lossy();
    let Some((pid, list)) = v.split_once(':') else {
        return;
    };
    if pid.parse::<u32>().ok() != Some(std::process::id()) {
        return;
    }
    let cookies: Vec<u64> = list
        .split(',')
        .filter_map(|c| c.parse().ok())
        .filter(|&c| c != 0)
        .collect();
    crate::execnames::exec_inherited_set(cookies);
}

/// A posix_spawn file action will duplicate `fd` into the child.
pub fn prepare_one(fd: c_int) {
    if accel::lookup(fd).is_some() || tcpx::lookup(fd).is_some() {
        prepare(
            &|f| f == fd,
            "posix_spawn_file_actions_adddup2(): the child gets it",
        );
    }
}

/// `fdopen(fd)`: stdio will read and write `fd` with libc's internal
/// calls, which the shim cannot see: an engine socket goes to the kernel.
pub fn prepare_stdio(fd: c_int) {
    if accel::lookup(fd).is_some() || tcpx::lookup(fd).is_some() {
        prepare(
            &|f| f == fd,
            "fdopen(): stdio reads and writes it with calls the shim cannot see",
        );
    }
}

/// Does the process have any engine socket or candidate (cheap test
/// before the sweeps)?
fn has_engine_fds() -> bool {
    let mut any = false;
    crate::table::each_identity(|_, _| any = true);
    any || crate::table::each_any(crate::table::F_CAND | crate::table::F_TCAND)
}

/// Before `clone(fn, stack, flags, ...)` called by the program itself
/// (glibc's `fork`, `pthread_create` and `posix_spawn` make the system
/// call inside libc and never come here). Without CLONE_VM the child is
/// another process with a copy of this memory, the shim's tables and the
/// engine's ring positions included, but no `pthread_atfork` handler runs
/// for it: both processes would consume one ring (a datagram read twice,
/// the next one lost). So every engine socket is prepared as for vfork
/// (to the kernel: the child may use any of them, and with CLONE_FILES it
/// shares the fd table itself), and the shim is switched off for the
/// child: this thread's engine-call flag is set around the call, and the
/// child, which keeps this thread's TLS (no CLONE_SETTLS without
/// CLONE_VM), runs with it set for its whole life; [`clone_parent`] puts
/// the parent's back. With CLONE_VM (a thread made by hand) nothing is
/// done: it shares this memory, as a thread does. Returns what
/// [`clone_parent`] needs.
pub fn clone_prepare(flags: c_int) -> Option<bool> {
    if flags & libc::CLONE_VM != 0 || crate::sys::in_engine() {
        return None;
    }
    accel::mark_forked();
    give_up_prepared_for("clone()");
    let why = if flags & libc::CLONE_FILES != 0 {
        "clone(CLONE_FILES): the child shares this fd table"
    } else {
        "clone(): the child gets a copy of this fd table"
    };
    prepare(&|_| true, why);
    Some(crate::sys::set_in_engine(true))
}

/// In the parent after `clone` returned: the shim is on again
/// ([`clone_prepare`]'s value).
pub fn clone_parent(prev: Option<bool>) {
    if let Some(p) = prev {
        let e = crate::sys::errno();
        crate::sys::set_in_engine(p);
        crate::sys::set_errno(e);
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The engine-call flag as it was before `vfork_prepare` set it.
    static VFORK_PREV: Cell<bool> = const { Cell::new(false) };
}

/// Before the vfork system call (in the parent). A process with engine
/// sockets forks instead (returns true: the caller tail-calls
/// [`vfork_as_fork`]): a vfork child runs in this memory with the shim off
/// and may take any fd onto its stdin/stdout before it execs, so every
/// engine socket would have to leave the engine first (a server calling
/// `subprocess.run` lost them all); a forked child's exec says which it
/// inherits. POSIX lets a vfork child do nothing but exec or `_exit`, so a
/// fork serves it the same (a program whose vfork child writes its
/// parent's memory is not supported: docs/preload.md). Otherwise the shim
/// is switched off for this thread (and so for the child, which shares the
/// thread's memory until it execs or exits), and false.
#[cfg(target_arch = "x86_64")]
pub extern "C" fn vfork_prepare() -> bool {
    if !crate::sys::in_engine() {
        if has_engine_fds() {
            return true;
        }
        give_up_prepared_for("vfork()");
    }
    let prev = crate::sys::set_in_engine(true);
    VFORK_PREV.with(|c| c.set(prev));
    false
}

/// `vfork()` of a process with engine sockets ([`vfork_prepare`]): a
/// `fork()` (its handlers share the engine sockets with the child, which
/// may use them), said once.
#[cfg(target_arch = "x86_64")]
pub extern "C" fn vfork_as_fork() -> libc::pid_t {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log!(
            Level::Info,
            "vfork(): this process has engine sockets: a fork() instead (the child's exec decides which it takes)"
        );
    }
    // SAFETY: fork(2) through libc (its pthread_atfork handlers run); the
    // child, like a vfork child, only execs or exits.
    unsafe { libc::fork() }
}

/// In the parent after the vfork system call returned `r` (the child's
/// pid, or -errno): the shim is on again. Returns vfork's result.
#[cfg(target_arch = "x86_64")]
pub extern "C" fn vfork_parent(r: isize) -> isize {
    let prev = VFORK_PREV.with(|c| c.get());
    crate::sys::set_in_engine(prev);
    if r < 0 {
        crate::sys::set_errno((-r) as c_int);
        return -1;
    }
    r
}
