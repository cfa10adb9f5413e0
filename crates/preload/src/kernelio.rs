//! Receives on fds the engine does not serve (yet): the kernel socket
//! answers, but a blocking receive waits the shim's way first.
//!
//! * a UDP *candidate* (a socket that may move onto the engine when another
//!   thread binds, connects or sends first) never sleeps in the kernel: it
//!   spins and polls in slices, and when the socket moves onto the engine
//!   the call starts again from the export (`ahooks::candidate`);
//! * a kernel socket whose waits spin attempts with `MSG_DONTWAIT` for the
//!   profile's budget (`spin::spin_recv`), then makes the real call;
//! * anything else, and non-blocking calls: the real call at once.
//!
//! One function serves `recv`, `recvfrom`, `recvmsg` and `read` (each
//! passes its own non-blocking attempt), so the ladder is written once.

use crate::ahooks;
use crate::spin::{self, recv_spin_word};
use libc::c_int;

/// What the caller of [`recv_wait`] does next.
pub enum Next {
    /// The answer (errno set by the call that produced it).
    Done(isize),
    /// The fd moved onto the engine while we waited: call the export again.
    Again,
    /// Make the real (blocking) call.
    Real,
}

/// A receive with `flags` on `fd`, which no engine record serves: wait as
/// a candidate or a spinning kernel socket. `attempt` is the caller's call
/// with `MSG_DONTWAIT` added.
#[inline]
pub fn recv_wait(fd: c_int, flags: c_int, mut attempt: impl FnMut() -> isize) -> Next {
    if flags & (libc::MSG_DONTWAIT | libc::MSG_ERRQUEUE) != 0 {
        return Next::Real;
    }
    if let Some(r) = ahooks::candidate(fd, &mut attempt) {
        return r.map_or(Next::Again, Next::Done);
    }
    if let Some(w) = recv_spin_word(fd) {
        let r = if flags & libc::MSG_WAITALL != 0 {
            // The blocking form waits for more than "something is there":
            // spin until readable, then the real call.
            spin::spin_until_readable(fd, w)
        } else {
            spin::spin_recv(fd, w, attempt)
        };
        if let Some(r) = r {
            return Next::Done(r);
        }
    }
    Next::Real
}
