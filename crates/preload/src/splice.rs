//! `splice` with an engine TCP connection on one side and a pipe on the
//! other (issue 21 item 4), served on the engine as the kernel serves it:
//! pipe → connection moves what the pipe holds (at most `len`, at most
//! what the connection can queue when it is non-blocking), connection →
//! pipe moves what the connection has received (at most `len`, at most
//! what the pipe can take); a blocking side waits as plainly,
//! `SPLICE_F_NONBLOCK` makes the pipe side non-blocking, the socket's own
//! O_NONBLOCK the socket side; 0 at end of stream (or a pipe with no
//! writer). No byte is ever taken from one side that the other did not
//! take: the pipe is read only for what the connection has room for, and
//! the connection is peeked, then consumed by what the pipe took.
//! Offsets on either side are ESPIPE, a non-pipe other side EINVAL, as in
//! the kernel. `vmsplice` and `tee` take only pipes (an engine fd is a
//! socket: the kernel's EBADF/EINVAL answer as plainly), as does
//! `copy_file_range` (regular files): they are not interposed.

use crate::real;
use crate::spin::{errno, set_errno};
use crate::sys::engine_call;
use crate::tcpx::{self, Inner, TcpRef};
use libc::{c_int, c_uint};

/// Bytes moved per call at most (a pipe holds 64 KiB by default).
const CHUNK: usize = 64 * 1024;

fn is_pipe(fd: c_int) -> Result<bool, c_int> {
    // SAFETY: fstat into a zeroed stat of ours.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFIFO)
}

/// poll one fd for `ev` without waiting.
fn ready_now(fd: c_int, ev: i16) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: ev,
        revents: 0,
    };
    // SAFETY: one pollfd of ours, no wait.
    unsafe { real::poll(&mut p, 1, 0) > 0 && p.revents != 0 }
}

fn fail(e: c_int) -> isize {
    set_errno(e);
    -1
}

/// Checks common to both directions: `Err(errno)` as the kernel's.
fn check(other: c_int, offs: (bool, bool)) -> Result<(), c_int> {
    if offs.0 || offs.1 {
        return Err(libc::ESPIPE);
    }
    if !is_pipe(other)? {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// splice between engine connection `t` at `fd` and the pipe `pipe`:
/// into the connection (`into`) or out of it. The checks of both
/// directions first, with the kernel's errors.
pub fn splice(
    t: TcpRef,
    fd: c_int,
    pipe: c_int,
    into: bool,
    offs: (bool, bool),
    len: usize,
    flags: c_uint,
) -> isize {
    if let Err(e) = check(pipe, offs) {
        return fail(e);
    }
    if len == 0 {
        return 0;
    }
    if into {
        to_engine(t, fd, pipe, len, flags)
    } else {
        from_engine(t, fd, pipe, len, flags)
    }
}

/// splice(pipe → engine connection `t` at `out`).
fn to_engine(t: TcpRef, out: c_int, pipe: c_int, len: usize, flags: c_uint) -> isize {
    let Some(i) = t.stream_inner() else {
        return fail(libc::ENOTCONN);
    };
    let Inner::Stream(s) = &*i else {
        return fail(libc::EINVAL);
    };
    let mut want = len.min(CHUNK);
    if t.common.nonblock() {
        // Read from the pipe only what the connection takes now.
        let room = engine_call(|| s.send_space());
        if room == 0 {
            return fail(libc::EAGAIN);
        }
        want = want.min(room);
    }
    if flags & libc::SPLICE_F_NONBLOCK != 0 && !ready_now(pipe, libc::POLLIN) {
        return fail(libc::EAGAIN);
    }
    let mut buf = vec![0u8; want];
    // SAFETY: `want` writable bytes of ours.
    let n = unsafe { real::read(pipe, buf.as_mut_ptr().cast(), want) };
    if n <= 0 {
        return n; // 0: no writer and empty; -1: the pipe's errno
    }
    let n = n as usize;
    let e0 = errno();
    let mut sent = 0;
    while sent < n {
        let r = tcpx::send(t, out, &buf[sent..n], libc::MSG_NOSIGNAL);
        if r < 0 {
            let e = errno();
            if e == libc::EAGAIN || e == libc::EINTR {
                // The room was there a moment ago (another thread took
                // it): the bytes are out of the pipe, so they go.
                std::thread::yield_now();
                continue;
            }
            if sent > 0 {
                break;
            }
            if e == libc::EPIPE {
                // As the kernel's splice to a shut socket.
                // SAFETY: raising SIGPIPE on ourselves, as a send would.
                unsafe { libc::raise(libc::SIGPIPE) };
            }
            return fail(e);
        }
        sent += r as usize;
    }
    set_errno(e0);
    sent as isize
}

/// splice(engine connection `t` at `inp` → pipe).
fn from_engine(t: TcpRef, inp: c_int, pipe: c_int, len: usize, flags: c_uint) -> isize {
    // What the pipe can take: its size less what it holds.
    // SAFETY: fcntl/ioctl on the caller's pipe, an int out-value.
    let cap = unsafe { real::fcntl(pipe, libc::F_GETPIPE_SZ, 0) };
    let mut held: c_int = 0;
    // SAFETY: as above.
    unsafe { libc::ioctl(pipe, libc::FIONREAD, &mut held) };
    let free = (cap.max(0) - held.max(0)).max(0) as usize;
    let pipe_nb = flags & libc::SPLICE_F_NONBLOCK != 0;
    if pipe_nb && (free == 0 || !ready_now(pipe, libc::POLLOUT)) {
        return fail(libc::EAGAIN);
    }
    let want = len.min(CHUNK).min(if free == 0 { 4096 } else { free });
    let mut buf = vec![0u8; want];
    // Peek (waiting as a recv would, per the socket's mode): the bytes
    // stay queued until the pipe has them.
    let k = tcpx::recv(t, inp, &mut buf, libc::MSG_PEEK);
    if k <= 0 {
        return k;
    }
    // SAFETY: `k` bytes of ours.
    let w = unsafe { real::write(pipe, buf.as_ptr().cast(), k as usize) };
    if w <= 0 {
        return w;
    }
    let e0 = errno();
    // Consume exactly what the pipe took (it is queued: no wait).
    let mut got = 0usize;
    while got < w as usize {
        let r = tcpx::recv(t, inp, &mut buf[got..w as usize], libc::MSG_DONTWAIT);
        if r <= 0 {
            break;
        }
        got += r as usize;
    }
    set_errno(e0);
    w
}
