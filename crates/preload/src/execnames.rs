//! Connections across exec (issue 24 item 2): which sockets an exec'ing
//! image names for the new one, and which the new image was named.
//!
//! A connection the old image handed over to the kernel at exec while no
//! other process held it (the fresh kernel socket of `handover::hand`, or
//! a forked child's copy whose owner had let go of it) is taken back onto
//! the engine by the new image at its first use. The old image names those
//! sockets (their SO_COOKIE, with its pid) in the new image's environment
//! (`spawn::exec_env`); the new image's shim takes the variable out at load
//! (`spawn::receive_exec_marker`). A connection another process may hold
//! too stays the kernel's. A leaf: the table only.

use libc::c_int;

/// From an exec's preparation to the exec: the sockets named, by cookie.
static EXEC_SOLE: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
/// An exec's preparation is under way (`hand`'s fresh sockets are named).
static EXECING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// In the new image: the sockets its old image named, not yet taken.
static EXEC_INHERITED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
/// [`EXEC_INHERITED`] is not empty (one load on the paths that ask).
static EXEC_PENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn sole() -> std::sync::MutexGuard<'static, Vec<u64>> {
    EXEC_SOLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// An exec's preparation starts (`on`: what an earlier one named is
/// forgotten) or ends (what it named stays, for `spawn::exec_env`).
pub fn exec_preparing(on: bool) {
    if on {
        sole().clear();
    }
    EXECING.store(on, std::sync::atomic::Ordering::Release);
}

/// The cookies of the connections this exec handed over in sockets only
/// this process holds.
pub fn exec_sole() -> Vec<u64> {
    sole().clone()
}

/// The kernel socket `nfd` carries a connection only this process holds
/// now: named for the new image if an exec is being prepared.
pub fn note_sole(nfd: c_int) {
    if EXECING.load(std::sync::atomic::Ordering::Acquire) {
        let c = crate::table::cookie_of(nfd);
        if c != 0 {
            sole().push(c);
        }
    }
}

/// In the new image (at load): the sockets its old image named.
pub fn exec_inherited_set(cookies: Vec<u64>) {
    let any = !cookies.is_empty();
    *EXEC_INHERITED.lock().unwrap_or_else(|e| e.into_inner()) = cookies;
    EXEC_PENDING.store(any, std::sync::atomic::Ordering::Release);
}

/// Are there sockets the old image named, not yet taken?
#[inline(always)]
pub fn exec_pending() -> bool {
    EXEC_PENDING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Was the socket `fd` named by the old image (it alone held it at the
/// exec)? Once: the name is taken.
pub fn exec_named(fd: c_int) -> bool {
    if !exec_pending() {
        return false;
    }
    let c = crate::table::cookie_of(fd);
    let mut g = EXEC_INHERITED.lock().unwrap_or_else(|e| e.into_inner());
    let Some(i) = g.iter().position(|&x| x == c && c != 0) else {
        return false;
    };
    g.swap_remove(i);
    EXEC_PENDING.store(!g.is_empty(), std::sync::atomic::Ordering::Release);
    true
}
