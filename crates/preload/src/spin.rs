//! Busy-polling before sleeping: the configuration the shim runs with and
//! the spin loops the hooks share.

use crate::adapt::Turn;
use crate::log::log;
use crate::real;
use crate::table::{self, C_TCP, C_UDP, F_RCVTIMEO};
use libc::c_int;
use nanowire_options::{Config, Engine, Level};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub use crate::adapt::SPIN_NS;
pub static SPIN_POLL: AtomicBool = AtomicBool::new(false);
pub static SPIN_TCP: AtomicBool = AtomicBool::new(false);
/// Minimum SO_RCVBUF for new UDP sockets (0 = leave alone).
pub static RCVBUF: AtomicU64 = AtomicU64::new(0);

pub struct State {
    pub cfg: Option<Config>,
    /// Why UDP sockets are not served by the xdp engine.
    pub xdp_reason: String,
    /// UDP/IPv4 sockets are candidates for the xdp engine.
    pub xdp_ok: bool,
}

/// Are new UDP/IPv4 sockets candidates for the xdp engine?
#[inline]
pub fn xdp_candidates() -> bool {
    STATE.get().is_some_and(|s| s.xdp_ok) && !crate::sys::in_engine()
}

pub static STATE: OnceLock<State> = OnceLock::new();

pub fn init() {
    STATE.get_or_init(|| {
        // The engine's settings (faults, RTO floor, attach mode, stats
        // directory) from the same environment, before any engine opens:
        // the engine library never reads the environment itself.
        use nanowire_stack::xdp::config::{EngineConfig, configure};
        let _ = configure(EngineConfig::from_vars(|k| std::env::var(k).ok()));
        let cfg = match Config::from_env() {
            Ok(c) => c,
            Err(e) => {
                crate::log::set_level(Level::Warn);
                log!(Level::Error, "{e}; acceleration disabled in this process");
                return State {
                    cfg: None,
                    xdp_reason: "configuration error".into(),
                    xdp_ok: false,
                };
            }
        };
        crate::log::set_level(cfg.log);
        let ns = match cfg.spin {
            None => u64::MAX,
            Some(d) => u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1),
        };
        if cfg.spins() {
            SPIN_NS.store(ns, Ordering::Relaxed);
        }
        SPIN_POLL.store(cfg.spin_poll, Ordering::Relaxed);
        SPIN_TCP.store(cfg.spin_tcp, Ordering::Relaxed);
        if cfg.engine != Engine::Kernel {
            RCVBUF.store(cfg.rcvbuf, Ordering::Relaxed);
        }
        let xdp_reason = match cfg.engine {
            Engine::Kernel => "engine kernel requested".to_string(),
            Engine::Spin => match nanowire_stack::xdp::host::privilege_check() {
                Ok(()) => "engine spin requested".to_string(),
                Err(why) => format!("engine spin requested; also {why}"),
            },
            // The engine service does the privileged work.
            Engine::Xdp if cfg.service => String::new(),
            Engine::Xdp => match nanowire_stack::xdp::host::privilege_check() {
                Err(why) => why,
                Ok(()) => String::new(),
            },
        };
        let xdp_ok = cfg.engine == Engine::Xdp && xdp_reason.is_empty();
        log!(
            Level::Debug,
            "shim loaded: profile {} engine {} spin {}",
            cfg.profile,
            cfg.engine.as_str(),
            if ns == u64::MAX {
                "forever".to_string()
            } else {
                format!("{}us", ns / 1000)
            }
        );
        State {
            cfg: Some(cfg),
            xdp_reason,
            xdp_ok,
        }
    });
}

pub use crate::sys::{errno, now_ns, set_errno};

/// Is `fd` blocking? Asked of the kernel with a raw syscall (errno kept).
#[inline]
pub fn is_blocking(fd: c_int) -> bool {
    // SAFETY: borrowed only for one fcntl(F_GETFL); a bad fd is an error.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    matches!(rustix::fs::fcntl_getfl(b), Ok(f) if !f.contains(rustix::fs::OFlags::NONBLOCK))
}

/// Is this class of socket one whose waits spin?
#[inline(always)]
pub fn spins_on(w: u64) -> bool {
    match table::class(w) {
        C_UDP => true,
        C_TCP => SPIN_TCP.load(Ordering::Relaxed),
        _ => false,
    }
}

/// The table word of `fd` if a blocking receive on it should spin.
#[inline(always)]
pub fn recv_spin_word(fd: c_int) -> Option<u64> {
    if SPIN_NS.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let w = table::lookup(fd);
    // A socket that was shut down answers at once in the kernel (a
    // non-blocking attempt would say EAGAIN forever).
    if !spins_on(w) || w & (F_RCVTIMEO | table::F_WOKEN) != 0 {
        return None;
    }
    Some(w)
}

/// Spin a receive: `attempt` is the caller's call with `MSG_DONTWAIT`
/// added. `Some(r)` is the call's answer (errno set by it); `None` means
/// "make the real blocking call" (budget spent, or the fd is not what the
/// table said).
#[inline]
pub fn spin_recv(fd: c_int, w: u64, mut attempt: impl FnMut() -> isize) -> Option<isize> {
    let r = attempt();
    if r >= 0 {
        return Some(r);
    }
    match errno() {
        libc::EAGAIN => {}
        libc::ENOTSOCK => {
            table::set(fd, table::C_OTHER, 0);
            return None;
        }
        _ => return Some(r),
    }
    if !is_blocking(fd) {
        // The caller's fd is non-blocking: EAGAIN is its answer (errno kept).
        return Some(r);
    }
    // No timeout: sockets with SO_RCVTIMEO are not spun (recv_spin_word).
    let mut wait = crate::adapt::waiter(fd, w, crate::signals::seq(), 0, 0);
    let _g = table::spin_enter(fd);
    loop {
        match wait.turn() {
            Turn::Spin => {}
            // Budget spent: the real blocking call; shutdown() by another
            // thread: the real call answers at once.
            Turn::Sleep(_) | Turn::TimedOut | Turn::Woken => {
                set_errno(libc::EAGAIN);
                return None;
            }
            Turn::Interrupted => {
                set_errno(libc::EINTR);
                return Some(-1);
            }
            Turn::Closed => {
                // Closed by another thread: never touch the number again
                // (it may already name another file).
                set_errno(libc::EBADF);
                return Some(-1);
            }
        }
        let r = attempt();
        if r >= 0 {
            return Some(r);
        }
        if errno() != libc::EAGAIN {
            return Some(r);
        }
    }
}

/// Spin until `fd` is readable (for calls whose blocking form waits for
/// more than "something is there": MSG_WAITALL, recvmmsg without
/// MSG_WAITFORONE). The caller then makes its real blocking call.
pub fn spin_until_readable(fd: c_int, w: u64) -> Option<isize> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    match spin_wait(
        SPIN_NS.load(Ordering::Relaxed),
        table::generation(w),
        fd,
        // SAFETY: one valid pollfd on our stack.
        || unsafe { real::poll(&mut p, 1, 0) },
    ) {
        Ok(-1) if errno() == libc::EINTR => Some(-1),
        _ => None,
    }
}

/// Repeat a zero-timeout readiness call until it returns non-zero (ready
/// or an error) or `budget_ns` passes. `Ok(r)`: its answer; `Err(spent)`:
/// nothing within the budget, `spent` ns used. `gen_fd`: an fd whose
/// closing (generation change) ends the spin (-1: none).
#[inline]
pub fn spin_wait(
    budget_ns: u64,
    gen0: u64,
    gen_fd: c_int,
    mut attempt: impl FnMut() -> c_int,
) -> Result<c_int, u64> {
    let mut wait = crate::adapt::Wait::new(budget_ns);
    let s0 = crate::signals::seq_all();
    loop {
        let r = attempt();
        if r != 0 {
            return Ok(r);
        }
        if crate::signals::seq_all() != s0 {
            set_errno(libc::EINTR);
            return Ok(-1);
        }
        // The adaptive policy may end the spin before `budget_ns` (the
        // profile's, capped by the caller's timeout).
        if !wait.spin() {
            return Err(wait.spent());
        }
        if gen_fd >= 0 && table::generation(table::get(gen_fd)) != gen0 {
            return Err(wait.spent());
        }
    }
}

/// Budget for a readiness wait with a timeout in ms (-1 = infinite).
#[inline]
pub fn poll_budget(timeout_ms: i64) -> Option<u64> {
    let spin = SPIN_NS.load(Ordering::Relaxed);
    if spin == 0 || timeout_ms == 0 || !SPIN_POLL.load(Ordering::Relaxed) {
        return None;
    }
    if timeout_ms < 0 {
        Some(spin)
    } else {
        Some(spin.min((timeout_ms as u64).saturating_mul(1_000_000)))
    }
}

/// What is left of a ms timeout after `spent_ns` (rounded up; -1 stays -1).
#[inline]
pub fn remaining_ms(timeout_ms: c_int, spent_ns: u64) -> c_int {
    if timeout_ms < 0 {
        return -1;
    }
    let total = timeout_ms as u64 * 1_000_000;
    let left = total.saturating_sub(spent_ns);
    left.div_ceil(1_000_000) as c_int
}

/// Log the engine decision for a new socket (one line, info level).
pub fn log_socket(fd: c_int, class: u64, domain: c_int) {
    if !crate::log::enabled(Level::Warn) {
        return;
    }
    let Some(st) = STATE.get() else { return };
    let Some(cfg) = &st.cfg else { return };
    // A UDP or TCP socket meant for the xdp engine (engine xdp requested)
    // that does not get it (IPv6, no privilege): one line at the default
    // level, with the reason. AF_INET TCP sockets are candidates and say
    // it at listen or connect (see `tcpx`).
    if (class == C_UDP || class == C_TCP) && cfg.engine == Engine::Xdp {
        let why = if st.xdp_ok && domain == libc::AF_INET6 {
            "IPv6 socket (the xdp engine is IPv4 only; e.g. java -Djava.net.preferIPv4Stack=true)"
        } else {
            &st.xdp_reason
        };
        if class == C_UDP {
            log!(
                Level::Warn,
                "fd {fd} udp: spin (kernel socket); xdp not used: {why}"
            );
        } else {
            let spinning = SPIN_TCP.load(Ordering::Relaxed) && SPIN_NS.load(Ordering::Relaxed) != 0;
            log!(
                Level::Warn,
                "fd {fd} tcp: kernel socket{}; xdp not used: {why}",
                if spinning { " (spinning)" } else { "" }
            );
        }
        return;
    }
    if !crate::log::enabled(Level::Info) {
        return;
    }
    let spin = match SPIN_NS.load(Ordering::Relaxed) {
        0 => None,
        u64::MAX => Some("busy-polls forever".to_string()),
        n => Some(format!("busy-polls {}us before sleeping", n / 1000)),
    };
    match class {
        C_UDP => match (&spin, cfg.engine) {
            (_, Engine::Kernel) | (None, _) => log!(
                Level::Info,
                "fd {fd} udp: kernel (not accelerated: {})",
                if cfg.engine == Engine::Kernel {
                    "engine kernel requested"
                } else {
                    "spin_us=0"
                }
            ),
            (Some(s), _) => log!(
                Level::Info,
                "fd {fd} udp: spin (kernel socket, {s}); xdp not used: {}",
                if st.xdp_ok && domain == libc::AF_INET6 {
                    "IPv6 (the xdp engine is IPv4 only)"
                } else {
                    &st.xdp_reason
                }
            ),
        },
        C_TCP => match &spin {
            Some(s) if SPIN_TCP.load(Ordering::Relaxed) => log!(
                Level::Info,
                "fd {fd} tcp: spin (kernel socket, {s}); xdp not used: engine {} requested",
                cfg.engine.as_str()
            ),
            _ => log!(
                Level::Info,
                "fd {fd} tcp: kernel (not accelerated: engine {} requested, TCP spinning off)",
                cfg.engine.as_str()
            ),
        },
        _ => log!(
            Level::Debug,
            "fd {fd}: kernel (not accelerated: not an IPv4/IPv6 UDP or TCP socket)"
        ),
    }
}

/// Give a new UDP socket the profile's minimum receive buffer.
pub fn apply_rcvbuf(fd: c_int) {
    let want = RCVBUF.load(Ordering::Relaxed);
    if want == 0 {
        return;
    }
    let want = want.min(i32::MAX as u64) as c_int;
    let mut cur: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: valid pointers to locals of the right sizes.
    unsafe {
        if real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw mut cur).cast(),
            &mut len,
        ) == 0
            && cur / 2 >= want
        {
            return;
        }
        let e = errno();
        let p = (&raw const want).cast();
        let sz = std::mem::size_of::<c_int>() as libc::socklen_t;
        if real::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, p, sz) != 0 {
            let _ = real::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, p, sz);
        }
        set_errno(e);
    }
}
