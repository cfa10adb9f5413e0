//! C entry points for the calls that close, create or hand on fds behind
//! the socket API (issue 20): `close_range`, `closefrom`, `fclose`,
//! `fdopen`, the `open` family, `fopen`, `tmpfile`, `mkstemp`, `opendir`,
//! `pipe`, `socketpair`, `eventfd`, `timerfd_create`, `signalfd`,
//! `memfd_create`, `inotify_init`, `syscall`, `vfork`, `posix_spawn`,
//! `system`, `popen` and the `exec` family. Each does the shim's
//! bookkeeping (`fdlife`, `spawn`) around libc's own function, found with
//! `dlsym(RTLD_NEXT)`; engine code (a thread inside `sys::engine_call`,
//! or a vfork child) goes straight to libc.
//!
//! Variadic functions (`open`, `openat`, `syscall`, `execl`...) are naked
//! entry points, as `fcntl` in `exports` (see the crate doc).

use crate::fdlife;
use crate::ops;
use crate::real::Sym;
use crate::spawn;
use crate::sys::in_engine;
use libc::{DIR, FILE, c_char, c_int, c_long, c_uint, mode_t, pid_t, sigset_t};

/// libc's function `$name` with the given C signature.
macro_rules! libc_fn {
    ($name:literal, fn($($t:ty),* $(,)?) -> $r:ty) => {{
        static SYM: Sym = Sym::new(concat!($name, "\0").as_bytes());
        // SAFETY: the symbol is libc's function of exactly this C signature
        // (glibc's prototype); a non-null address from dlsym.
        let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { core::mem::transmute(SYM.get()) };
        f
    }};
    ($name:literal, fn($($t:ty),* ; ...) -> $r:ty) => {{
        static SYM: Sym = Sym::new(concat!($name, "\0").as_bytes());
        // SAFETY: as above, a variadic C function.
        let f: unsafe extern "C" fn($($t),* , ...) -> $r = unsafe { core::mem::transmute(SYM.get()) };
        f
    }};
}

// ------------------------------------------------------------ closing

/// # Safety
/// As libc's `close_range`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let f = libc_fn!("close_range", fn(c_uint, c_uint, c_int) -> c_int);
    if !in_engine() && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && first <= last {
        ops::pre_close_range(first, last);
    }
    // SAFETY: the caller's arguments to libc's function.
    unsafe { f(first, last, flags) }
}

/// # Safety
/// As libc's `closefrom`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(low: c_int) {
    let f = libc_fn!("closefrom", fn(c_int) -> ());
    if !in_engine() {
        ops::pre_close_range(low.max(0) as u32, u32::MAX);
    }
    // SAFETY: the caller's argument to libc's function.
    unsafe { f(low) }
}

/// # Safety
/// As libc's `fclose`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    let f = libc_fn!("fclose", fn(*mut FILE) -> c_int);
    if !in_engine() && !stream.is_null() {
        // SAFETY: the caller's open stream (fclose's contract).
        let fd = unsafe { libc::fileno(stream) };
        if fd >= 0 {
            ops::pre_close(fd);
        }
    }
    // SAFETY: the caller's stream to libc's function.
    unsafe { f(stream) }
}

/// # Safety
/// As libc's `fdopen`. stdio reads and writes the fd with libc's internal
/// calls, which the shim cannot see: an engine socket goes to the kernel
/// first (a connection is handed over, a UDP socket taken off the engine).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    let f = libc_fn!("fdopen", fn(c_int, *const c_char) -> *mut FILE);
    if !in_engine() {
        fdlife::io_check(fd);
        spawn::prepare_stdio(fd);
    }
    // SAFETY: the caller's arguments to libc's function.
    unsafe { f(fd, mode) }
}

// ----------------------------------------------------------- creating

extern "C" fn open_entry(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let f = libc_fn!("open", fn(*const c_char, c_int ; ...) -> c_int);
    // SAFETY: the caller's path and flags; `mode` is its (possibly absent)
    // third argument register, read by libc only with O_CREAT/O_TMPFILE.
    let r = unsafe { f(path, flags, mode) };
    if !in_engine() {
        fdlife::created(r);
    }
    r
}

extern "C" fn open64_entry(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let f = libc_fn!("open64", fn(*const c_char, c_int ; ...) -> c_int);
    // SAFETY: as in `open_entry`.
    let r = unsafe { f(path, flags, mode) };
    if !in_engine() {
        fdlife::created(r);
    }
    r
}

extern "C" fn openat_entry(dir: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let f = libc_fn!("openat", fn(c_int, *const c_char, c_int ; ...) -> c_int);
    // SAFETY: as in `open_entry`.
    let r = unsafe { f(dir, path, flags, mode) };
    if !in_engine() {
        fdlife::created(r);
    }
    r
}

extern "C" fn openat64_entry(dir: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let f = libc_fn!("openat64", fn(c_int, *const c_char, c_int ; ...) -> c_int);
    // SAFETY: as in `open_entry`.
    let r = unsafe { f(dir, path, flags, mode) };
    if !in_engine() {
        fdlife::created(r);
    }
    r
}

/// Entry points that return a new fd: call libc, then `fdlife::created`.
macro_rules! fd_creators {
    ($( $name:ident ( $($a:ident : $t:ty),* ) ; )*) => {
        $(
            /// # Safety
            /// As libc's function of the same name.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
                static SYM: Sym = Sym::new(concat!(stringify!($name), "\0").as_bytes());
                // SAFETY: the symbol is libc's function of exactly this C
                // signature (glibc's prototype); a non-null address from dlsym.
                let f: unsafe extern "C" fn($($t),*) -> c_int =
                    unsafe { core::mem::transmute(SYM.get()) };
                // SAFETY: the caller's arguments to libc's function.
                let r = unsafe { f($($a),*) };
                if !in_engine() {
                    fdlife::created(r);
                }
                r
            }
        )*
    };
}

fd_creators! {
    __open_2(path: *const c_char, flags: c_int);
    __open64_2(path: *const c_char, flags: c_int);
    __openat_2(dir: c_int, path: *const c_char, flags: c_int);
    __openat64_2(dir: c_int, path: *const c_char, flags: c_int);
    creat(path: *const c_char, mode: mode_t);
    creat64(path: *const c_char, mode: mode_t);
    mkstemp(t: *mut c_char);
    mkstemp64(t: *mut c_char);
    mkostemp(t: *mut c_char, flags: c_int);
    mkostemp64(t: *mut c_char, flags: c_int);
    mkstemps(t: *mut c_char, suffix: c_int);
    mkstemps64(t: *mut c_char, suffix: c_int);
    mkostemps(t: *mut c_char, suffix: c_int, flags: c_int);
    mkostemps64(t: *mut c_char, suffix: c_int, flags: c_int);
    eventfd(init: c_uint, flags: c_int);
    timerfd_create(clock: c_int, flags: c_int);
    memfd_create(name: *const c_char, flags: c_uint);
    inotify_init();
    inotify_init1(flags: c_int);
}

/// # Safety
/// As libc's `signalfd` (a new fd only when `fd` is -1).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signalfd(fd: c_int, mask: *const sigset_t, flags: c_int) -> c_int {
    let f = libc_fn!("signalfd", fn(c_int, *const sigset_t, c_int) -> c_int);
    // SAFETY: the caller's arguments to libc's function.
    let r = unsafe { f(fd, mask, flags) };
    if !in_engine() && fd == -1 {
        fdlife::created(r);
    }
    r
}

/// # Safety
/// As libc's `pipe`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    let f = libc_fn!("pipe", fn(*mut c_int) -> c_int);
    // SAFETY: the caller's array of two ints.
    let r = unsafe { f(fds) };
    if !in_engine() {
        // SAFETY: the kernel wrote two ints on success.
        unsafe { fdlife::created_pair(r, fds) };
    }
    r
}

/// # Safety
/// As libc's `pipe2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    let f = libc_fn!("pipe2", fn(*mut c_int, c_int) -> c_int);
    // SAFETY: the caller's array of two ints.
    let r = unsafe { f(fds, flags) };
    if !in_engine() {
        // SAFETY: the kernel wrote two ints on success.
        unsafe { fdlife::created_pair(r, fds) };
    }
    r
}

/// # Safety
/// As libc's `socketpair`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socketpair(d: c_int, ty: c_int, p: c_int, sv: *mut c_int) -> c_int {
    let f = libc_fn!("socketpair", fn(c_int, c_int, c_int, *mut c_int) -> c_int);
    // SAFETY: the caller's arguments; `sv` holds two ints.
    let r = unsafe { f(d, ty, p, sv) };
    if !in_engine() {
        // SAFETY: the kernel wrote two ints on success.
        unsafe { fdlife::created_pair(r, sv) };
    }
    r
}

/// stdio streams: `fdlife::created` on the stream's fd.
fn stream_created(s: *mut FILE) -> *mut FILE {
    if !in_engine() && !s.is_null() {
        // SAFETY: a stream libc just opened.
        fdlife::created(unsafe { libc::fileno(s) });
    }
    s
}

/// # Safety
/// As libc's `fopen`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    let f = libc_fn!("fopen", fn(*const c_char, *const c_char) -> *mut FILE);
    // SAFETY: the caller's arguments to libc's function.
    stream_created(unsafe { f(path, mode) })
}

/// # Safety
/// As libc's `fopen64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    let f = libc_fn!("fopen64", fn(*const c_char, *const c_char) -> *mut FILE);
    // SAFETY: the caller's arguments to libc's function.
    stream_created(unsafe { f(path, mode) })
}

/// `freopen` and `freopen64`: the stream's old fd is closed (when a path
/// is given), then libc's function.
macro_rules! freopen_export {
    ($name:ident, $sym:literal) => {
        /// # Safety
        #[doc = concat!("As libc's `", $sym, "` (the stream's old fd is closed).")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            path: *const c_char,
            mode: *const c_char,
            s: *mut FILE,
        ) -> *mut FILE {
            let f = libc_fn!(
                $sym,
                fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE
            );
            if !in_engine() && !s.is_null() {
                // SAFETY: the caller's open stream.
                let fd = unsafe { libc::fileno(s) };
                if fd >= 0 && !path.is_null() {
                    ops::pre_close(fd);
                }
            }
            // SAFETY: the caller's arguments to libc's function.
            stream_created(unsafe { f(path, mode, s) })
        }
    };
}

freopen_export!(freopen, "freopen");
freopen_export!(freopen64, "freopen64");

/// # Safety
/// As libc's `tmpfile`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tmpfile() -> *mut FILE {
    let f = libc_fn!("tmpfile", fn() -> *mut FILE);
    // SAFETY: libc's function, no arguments.
    stream_created(unsafe { f() })
}

/// # Safety
/// As libc's `tmpfile64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tmpfile64() -> *mut FILE {
    let f = libc_fn!("tmpfile64", fn() -> *mut FILE);
    // SAFETY: libc's function, no arguments.
    stream_created(unsafe { f() })
}

/// # Safety
/// As libc's `opendir`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn opendir(name: *const c_char) -> *mut DIR {
    let f = libc_fn!("opendir", fn(*const c_char) -> *mut DIR);
    // SAFETY: the caller's path to libc's function.
    let d = unsafe { f(name) };
    if !in_engine() && !d.is_null() {
        // SAFETY: a directory stream libc just opened.
        fdlife::created(unsafe { libc::dirfd(d) });
    }
    d
}

// ------------------------------------------------------------ syscall()

/// `syscall(n, ...)` with up to six arguments (the sixth is read from the
/// caller's stack, where a six-argument call put it; a shorter call leaves
/// whatever its frame holds there, which nobody uses).
extern "C" fn syscall_entry(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f6: c_long,
) -> c_long {
    let real = libc_fn!("syscall", fn(c_long ; ...) -> c_long);
    // SAFETY: the caller's own system call, passed on unchanged.
    let pass = || unsafe { real(n, a, b, c, d, e, f6) };
    if in_engine() {
        return pass();
    }
    // SAFETY: each branch calls the shim's own function of the same
    // system call with the caller's arguments, the contract being the
    // caller's (who asked the kernel for exactly that).
    unsafe {
        match n {
            libc::SYS_close => crate::dispatch::close(a as c_int) as c_long,
            libc::SYS_exit_group => {
                crate::tcpx::exiting();
                pass()
            }
            libc::SYS_dup => crate::dispatch::dup(a as c_int) as c_long,
            libc::SYS_dup2 => crate::dispatch::dup2(a as c_int, b as c_int) as c_long,
            libc::SYS_dup3 => crate::dispatch::dup3(a as c_int, b as c_int, c as c_int) as c_long,
            libc::SYS_close_range => {
                if (c as c_uint) & libc::CLOSE_RANGE_CLOEXEC == 0 && (a as c_uint) <= (b as c_uint)
                {
                    ops::pre_close_range(a as u32, b as u32);
                }
                pass()
            }
            libc::SYS_io_uring_setup => {
                fdlife::suspect("io_uring_setup()");
                let r = pass();
                fdlife::created(r as c_int);
                r
            }
            libc::SYS_pipe | libc::SYS_pipe2 => {
                let r = pass();
                fdlife::created_pair(r as c_int, a as *const c_int);
                r
            }
            libc::SYS_socketpair => {
                let r = pass();
                fdlife::created_pair(r as c_int, d as *const c_int);
                r
            }
            libc::SYS_fcntl
                if b as c_int == libc::F_DUPFD || b as c_int == libc::F_DUPFD_CLOEXEC =>
            {
                let r = pass();
                if r >= 0 && r != a {
                    fdlife::created(r as c_int);
                }
                r
            }
            libc::SYS_signalfd | libc::SYS_signalfd4 if a as c_int != -1 => pass(),
            libc::SYS_open
            | libc::SYS_openat
            | libc::SYS_openat2
            | libc::SYS_creat
            | libc::SYS_socket
            | libc::SYS_accept
            | libc::SYS_accept4
            | libc::SYS_eventfd
            | libc::SYS_eventfd2
            | libc::SYS_timerfd_create
            | libc::SYS_signalfd
            | libc::SYS_signalfd4
            | libc::SYS_memfd_create
            | libc::SYS_inotify_init
            | libc::SYS_inotify_init1
            | libc::SYS_epoll_create
            | libc::SYS_epoll_create1
            | libc::SYS_pidfd_open
            | libc::SYS_pidfd_getfd
            | libc::SYS_userfaultfd
            | libc::SYS_perf_event_open
            | libc::SYS_fanotify_init
            | libc::SYS_open_by_handle_at => {
                let r = pass();
                fdlife::created(r as c_int);
                r
            }
            _ => pass(),
        }
    }
}

// ------------------------------------------------------------- children

/// `posix_spawn` and `posix_spawnp` (the second argument a path, or a file
/// name searched in PATH): prepare the exec, then libc's function.
macro_rules! spawn_export {
    ($name:ident, $sym:literal) => {
        /// # Safety
        #[doc = concat!("As libc's `", $sym, "`.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            pid: *mut pid_t,
            path: *const c_char,
            fa: *const libc::posix_spawn_file_actions_t,
            attr: *const libc::posix_spawnattr_t,
            argv: *const *mut c_char,
            envp: *const *mut c_char,
        ) -> c_int {
            let f = libc_fn!(
                $sym,
                fn(
                    *mut pid_t,
                    *const c_char,
                    *const libc::posix_spawn_file_actions_t,
                    *const libc::posix_spawnattr_t,
                    *const *mut c_char,
                    *const *mut c_char,
                ) -> c_int
            );
            if !in_engine() {
                spawn::prepare_exec(concat!($sym, "()"));
            }
            // SAFETY: the caller's arguments to libc's function.
            unsafe { f(pid, path, fa, attr, argv, envp) }
        }
    };
}

spawn_export!(posix_spawn, "posix_spawn");
spawn_export!(posix_spawnp, "posix_spawnp");

/// # Safety
/// As libc's `posix_spawn_file_actions_adddup2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(
    fa: *mut libc::posix_spawn_file_actions_t,
    fd: c_int,
    new: c_int,
) -> c_int {
    let f = libc_fn!(
        "posix_spawn_file_actions_adddup2",
        fn(*mut libc::posix_spawn_file_actions_t, c_int, c_int) -> c_int
    );
    if !in_engine() {
        spawn::prepare_one(fd);
    }
    // SAFETY: the caller's arguments to libc's function.
    unsafe { f(fa, fd, new) }
}

/// # Safety
/// As libc's `system`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    let f = libc_fn!("system", fn(*const c_char) -> c_int);
    if !in_engine() && !cmd.is_null() {
        spawn::prepare_exec("system()");
    }
    // SAFETY: the caller's argument to libc's function.
    unsafe { f(cmd) }
}

/// # Safety
/// As libc's `popen`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut FILE {
    let f = libc_fn!("popen", fn(*const c_char, *const c_char) -> *mut FILE);
    if !in_engine() {
        spawn::prepare_exec("popen()");
    }
    // SAFETY: the caller's arguments to libc's function.
    let s = unsafe { f(cmd, mode) };
    stream_created(s)
}

/// # Safety
/// As libc's `_exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    let f = libc_fn!("_exit", fn(c_int) -> !);
    if !in_engine() {
        // The kernel would finish this process's connections (unsent data,
        // FIN); the engine's end with the process unless finished now.
        crate::tcpx::exiting();
    }
    // SAFETY: the caller's status to libc's function.
    unsafe { f(status) }
}

/// # Safety
/// As libc's `_Exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // glibc's _Exit is its _exit (the same function under two names).
    // SAFETY: as `_exit`, the caller's status.
    unsafe { _exit(status) }
}

type Argv = *const *const c_char;

/// The exec family with an environment argument: prepare the exec, then
/// libc's function with the environment `spawn::exec_env` makes (the
/// connections the new image may take back onto the engine named), or the
/// caller's.
macro_rules! exec_env_export {
    ($name:ident, $sym:literal, ($a0:ident: $t0:ty, $a1:ident: $t1:ty)) => {
        /// # Safety
        #[doc = concat!("As libc's `", $sym, "`.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($a0: $t0, $a1: $t1, envp: Argv) -> c_int {
            let f = libc_fn!($sym, fn($t0, $t1, Argv) -> c_int);
            let env = if in_engine() {
                None
            } else {
                spawn::prepare_exec("exec");
                spawn::exec_env(envp)
            };
            // SAFETY: the caller's arguments to libc's function; the
            // environment is the caller's or a copy of it with one more
            // variable, alive until the call returns.
            unsafe { f($a0, $a1, env.as_ref().map_or(envp, |e| e.as_ptr())) }
        }
    };
}

/// The exec family that passes this process's environment (`environ`):
/// as [`exec_env_export`], through the function that takes one (`$with`)
/// when a variable is added.
macro_rules! exec_environ_export {
    ($name:ident, $sym:literal, $with:literal, ($a0:ident: $t0:ty, $a1:ident: $t1:ty)) => {
        /// # Safety
        #[doc = concat!("As libc's `", $sym, "`.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($a0: $t0, $a1: $t1) -> c_int {
            if !in_engine() {
                spawn::prepare_exec("exec");
                unsafe extern "C" {
                    static environ: Argv;
                }
                // SAFETY: libc's environment array, read as exec reads it.
                if let Some(env) = spawn::exec_env(unsafe { environ }) {
                    let g = libc_fn!($with, fn($t0, $t1, Argv) -> c_int);
                    // SAFETY: the caller's arguments and a copy of this
                    // process's environment, alive until the call returns.
                    return unsafe { g($a0, $a1, env.as_ptr()) };
                }
            }
            let f = libc_fn!($sym, fn($t0, $t1) -> c_int);
            // SAFETY: the caller's arguments to libc's function.
            unsafe { f($a0, $a1) }
        }
    };
}

exec_env_export!(execve, "execve", (path: *const c_char, argv: Argv));
exec_environ_export!(execv, "execv", "execve", (path: *const c_char, argv: Argv));
exec_environ_export!(execvp, "execvp", "execvpe", (file: *const c_char, argv: Argv));
exec_env_export!(execvpe, "execvpe", (file: *const c_char, argv: Argv));
exec_env_export!(fexecve, "fexecve", (fd: c_int, argv: Argv));

/// Before a variadic `execl`/`execlp`/`execle`: prepare, then return
/// libc's function for the naked entry to jump to.
#[cfg(target_arch = "x86_64")]
macro_rules! exec_variadic_prep {
    ($prep:ident, $name:literal, $environ:literal) => {
        extern "C" fn $prep() -> usize {
            static SYM: Sym = Sym::new(concat!($name, "\0").as_bytes());
            if !in_engine() {
                spawn::prepare_exec("exec");
                if $environ {
                    spawn::exec_environ();
                }
            }
            SYM.get()
        }
    };
}
#[cfg(target_arch = "x86_64")]
exec_variadic_prep!(execl_prep, "execl", true);
#[cfg(target_arch = "x86_64")]
exec_variadic_prep!(execlp_prep, "execlp", true);
// execle's environment is its last variadic argument: nothing is added
// (its connections stay the kernel's).
#[cfg(target_arch = "x86_64")]
exec_variadic_prep!(execle_prep, "execle", false);

/// `clone(fn, stack, flags, arg, ...)` called by the program: see
/// `spawn::clone_prepare`. The variadic tail (parent_tid, tls, child_tid)
/// is taken as three fixed arguments: x86-64 and AArch64 Linux pass
/// variadic integer arguments where named ones would be, and libc reads
/// each only when `flags` asks for it, so what a caller did not pass is
/// handed on unread.
///
/// # Safety
/// As libc's `clone`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clone(
    func: extern "C" fn(*mut libc::c_void) -> c_int,
    stack: *mut libc::c_void,
    flags: c_int,
    arg: *mut libc::c_void,
    ptid: *mut pid_t,
    tls: *mut libc::c_void,
    ctid: *mut pid_t,
) -> c_int {
    let f = libc_fn!(
        "clone",
        fn(
            extern "C" fn(*mut libc::c_void) -> c_int,
            *mut libc::c_void,
            c_int,
            *mut libc::c_void ;
            ...
        ) -> c_int
    );
    let prev = spawn::clone_prepare(flags);
    // SAFETY: the caller's arguments to libc's function.
    let r = unsafe { f(func, stack, flags, arg, ptid, tls, ctid) };
    spawn::clone_parent(prev);
    r
}

// The variadic entries with a fixed register layout (x86-64 and AArch64
// Linux pass the variadic integer arguments where named ones would be).
crate::exports::tail_jump!(open => open_entry);
crate::exports::tail_jump!(open64 => open64_entry);
crate::exports::tail_jump!(openat => openat_entry);
crate::exports::tail_jump!(openat64 => openat64_entry);
crate::exports::tail_jump!(syscall => syscall_entry);

/// `vfork` and the `execl` family: x86-64 only (elsewhere they are not
/// interposed; docs/preload.md).
#[cfg(target_arch = "x86_64")]
mod naked {
    use super::*;

    /// A variadic entry that calls `$prep` (which returns libc's function)
    /// with every argument register saved, then jumps to libc's function
    /// with the registers and stack exactly as the caller left them.
    macro_rules! prep_then_jump {
        ($name:ident => $prep:ident) => {
            /// Variadic C entry point (see the macro).
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "push rdi", "push rsi", "push rdx", "push rcx", "push r8", "push r9",
                    "push rax",
                    "call {prep}",
                    "mov r11, rax",
                    "pop rax", "pop r9", "pop r8", "pop rcx", "pop rdx", "pop rsi", "pop rdi",
                    "jmp r11",
                    prep = sym $prep,
                )
            }
        };
    }
    prep_then_jump!(execl => execl_prep);
    prep_then_jump!(execlp => execlp_prep);
    prep_then_jump!(execle => execle_prep);

    /// `vfork()`: a process with engine sockets forks instead
    /// (`spawn::vfork_prepare` says so: a tail call of
    /// `spawn::vfork_as_fork`, which returns to our caller); otherwise the
    /// shim is switched off for the child, then the vfork system call as
    /// glibc makes it: the return address is kept in a register across the
    /// call (the child runs on this stack until it execs, and may overwrite
    /// what lies below the caller's frame), then pushed back. In the
    /// parent (a pid or an error) `spawn::vfork_parent` switches the shim
    /// back on and sets errno; the child returns 0 at once.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn vfork() {
        core::arch::naked_asm!(
            "sub rsp, 8",
            "call {prep}",
            "add rsp, 8",
            "test al, al",
            "jnz {fork}",
            "pop rdi",
            "mov eax, 58",
            "syscall",
            "push rdi",
            "test rax, rax",
            "jz 2f",
            "mov rdi, rax",
            "sub rsp, 8",
            "call {parent}",
            "add rsp, 8",
            "ret",
            "2:",
            "ret",
            prep = sym spawn::vfork_prepare,
            fork = sym spawn::vfork_as_fork,
            parent = sym spawn::vfork_parent,
        )
    }
}
