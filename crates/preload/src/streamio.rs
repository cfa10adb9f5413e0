//! Engine TCP calls over the caller's buffers, iovecs and message headers,
//! checked first as the kernel checks them (issue 20, finding 9): a
//! buffer the kernel could not copy is EFAULT (after waiting for data, as
//! the kernel's copy happens then; the data stays queued), an iovec count
//! above UIO_MAXIOV is EMSGSIZE/EINVAL, a negative length EINVAL. Nothing
//! is allocated by the caller's lengths: iovecs are received into
//! directly and gathered for sending in bounded chunks.

use crate::sys::Moved;
use crate::tcpx::{self, TcpRef};
use crate::uaccess::{self, Access, fault};
use libc::{c_int, c_void, iovec, mmsghdr, msghdr, size_t};
use nanowire_sockabi::iov::{self, Call, Piece};
use std::cell::RefCell;

/// The most one gathered send (writev/sendmsg with several iovecs) copies
/// at a time; also the most a MSG_PEEK over several iovecs looks at.
const CHUNK: usize = 64 << 10;

/// A thread's reusable gather state: at most [`CHUNK`] bytes and one
/// entry per iovec (at most UIO_MAXIOV).
struct Scratch {
    buf: Vec<u8>,
    pieces: Vec<Piece>,
    segs: Vec<iov::Seg>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { buf: Vec::new(), pieces: Vec::new(), segs: Vec::new() })
    };
}

/// recv/recvfrom/read on an engine connection.
pub fn recv(t: TcpRef, fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> isize {
    match uaccess::buf_mut(buf, len) {
        Some(b) => tcpx::recv(t, fd, b, flags),
        None => recv_fault(t, fd, flags),
    }
}

/// recvfrom on an engine connection: a connected stream reports no source
/// address (a non-null name's length is set to 0, as before the receive).
/// The common case, the buffer and the length seen before, is one look at
/// the thread's cache for both (`uaccess::all_cached`) instead of two
/// checks; otherwise each is checked on its own as before.
#[inline]
pub fn recv_from(
    t: TcpRef,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> isize {
    let named = !addr.is_null() && !alen.is_null() && alen.is_aligned();
    let l = if named {
        (alen as usize, std::mem::size_of::<libc::socklen_t>())
    } else {
        (0, 0)
    };
    if len > 0 && uaccess::all_cached(&[(buf as usize, len), l], Access::Write).still() {
        if named {
            // SAFETY: non-null, aligned and mapped writable (the cache's
            // answer covered it); lent by the caller.
            unsafe { *alen = 0 };
        }
        // SAFETY: `len` bytes at `buf` are mapped writable (the cache's
        // answer covered them); the caller lent them to this call.
        let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        return tcpx::recv(t, fd, b, flags);
    }
    if !addr.is_null()
        && let Some(l) = uaccess::obj_mut(alen)
    {
        *l = 0;
    }
    recv(t, fd, buf, len, flags)
}

/// A receive into memory the kernel could not write: like the kernel,
/// wait for data as the call would, then fail with EFAULT and leave the
/// data queued (0 at the end of the stream, errors as they are).
fn recv_fault(t: TcpRef, fd: c_int, flags: c_int) -> isize {
    let mut one = [0u8; 1];
    let r = tcpx::recv(
        t,
        fd,
        &mut one,
        (flags | libc::MSG_PEEK) & !libc::MSG_WAITALL,
    );
    if r > 0 { fault(libc::EFAULT) } else { r }
}

/// send/sendto/write on an engine connection.
pub fn send(t: TcpRef, fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> isize {
    match uaccess::buf(buf, len) {
        Some(b) => tcpx::send(t, fd, b, flags),
        None => fault(libc::EFAULT),
    }
}

/// readv/recvmsg into checked iovecs.
pub fn recv_iov(t: TcpRef, fd: c_int, v: &[iovec], total: usize, flags: c_int) -> isize {
    if !uaccess::bufs_ok(v, total, Access::Write) {
        return recv_fault(t, fd, flags);
    }
    if total == 0 {
        return tcpx::recv(t, fd, &mut [], flags);
    }
    if flags & libc::MSG_PEEK != 0 {
        // A peek cannot continue where the last one ended: one bounded copy.
        return SCRATCH.with(|s| {
            let Ok(mut s) = s.try_borrow_mut() else {
                return fault(libc::ENOBUFS);
            };
            let n = total.min(CHUNK);
            s.buf.resize(n, 0);
            let r = tcpx::recv(t, fd, &mut s.buf[..n], flags);
            if r > 0 {
                uaccess::scatter(v, &s.buf[..r as usize]);
            }
            r
        });
    }
    // Straight into each iovec in turn; after the first, only what is
    // already there (unless MSG_WAITALL).
    let mut m = Moved::start();
    let mut fl = flags;
    for (i, len) in iov::clamped_lens_of(uaccess::segs(v)).enumerate() {
        if len == 0 {
            continue;
        }
        // SAFETY: `len` bytes at this iovec's base are mapped writable
        // (`bufs_ok` above covered every byte up to `total`).
        let b = unsafe { std::slice::from_raw_parts_mut(v[i].iov_base.cast::<u8>(), len) };
        match m.step(tcpx::recv(t, fd, b, fl)) {
            Ok(r) if r < len => break,
            Ok(_) => {}
            Err(ret) => return ret,
        }
        if flags & libc::MSG_WAITALL == 0 {
            fl |= libc::MSG_DONTWAIT;
        }
    }
    m.end()
}

/// writev/sendmsg from checked iovecs: one iovec is sent as is, several
/// are gathered in chunks of at most [`CHUNK`] bytes; a chunk not taken
/// whole (non-blocking, timeout, signal) ends the call.
pub fn send_iov(t: TcpRef, fd: c_int, v: &[iovec], total: usize, flags: c_int) -> isize {
    // A fault anywhere in the data: EFAULT, nothing sent (as the kernel
    // answers a writev whose later iovec faults).
    if !uaccess::bufs_ok(v, total, Access::Read) {
        return fault(libc::EFAULT);
    }
    let nonempty = v.iter().filter(|x| x.iov_len > 0).count();
    if nonempty <= 1 {
        let (base, len) = v
            .iter()
            .find(|x| x.iov_len > 0)
            .map_or((std::ptr::null(), 0), |x| (x.iov_base.cast_const(), total));
        return send(t, fd, base, len, flags);
    }
    SCRATCH.with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            return fault(libc::ENOBUFS);
        };
        let Scratch { buf, pieces, segs } = &mut *s;
        let mut m = Moved::start();
        segs.clear();
        segs.extend(
            iov::scatter(iov::clamped_lens_of(uaccess::segs(v)), total).map(|p| iov::Seg {
                base: v[p.seg].iov_base as usize,
                len: p.len,
            }),
        );
        let mut g = iov::gather_chunks(segs, CHUNK);
        loop {
            let n = g.next_chunk(pieces);
            if n == 0 {
                break;
            }
            buf.clear();
            for p in pieces.iter() {
                // SAFETY: inside the first `total` bytes of the iovecs,
                // checked readable above (`segs` holds their bases).
                buf.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(
                        (segs[p.seg].base as *const u8).add(p.src_off),
                        p.len,
                    )
                });
            }
            match m.step(tcpx::send(t, fd, buf, flags)) {
                Ok(r) if r < n => break,
                Ok(_) => {}
                Err(ret) => return ret,
            }
        }
        m.end()
    })
}

/// The iovecs of a caller's msghdr, checked (`Err(errno)`).
fn msg_iovecs<'a>(m: &msghdr) -> Result<(&'a [iovec], usize), c_int> {
    uaccess::iovecs(m.msg_iov, m.msg_iovlen, Call::Msg)
}

/// recvmsg on an engine connection.
pub fn recvmsg(t: TcpRef, fd: c_int, msg: *mut msghdr, flags: c_int) -> isize {
    let Some(m) = uaccess::obj_mut(msg) else {
        return fault(libc::EFAULT);
    };
    let (v, total) = match msg_iovecs(m) {
        Ok(x) => x,
        Err(e) => return fault(e),
    };
    m.msg_namelen = 0;
    m.msg_controllen = 0;
    m.msg_flags = 0;
    recv_iov(t, fd, v, total, flags)
}

/// sendmsg on an engine connection.
pub fn sendmsg(t: TcpRef, fd: c_int, msg: *const msghdr, flags: c_int) -> isize {
    let Some(m) = uaccess::obj(msg) else {
        return fault(libc::EFAULT);
    };
    match msg_iovecs(m) {
        Ok((v, total)) => send_iov(t, fd, v, total, flags),
        Err(e) => fault(e),
    }
}

/// readv (`Some`) / writev on an engine connection; `cnt` as the kernel
/// sees it (a negative count is a huge one: EINVAL).
pub fn rwv(t: TcpRef, fd: c_int, iov: *const iovec, cnt: c_int, write: bool) -> isize {
    match uaccess::iovecs(iov, cnt as isize as usize, Call::Vec) {
        Ok((v, total)) if write => send_iov(t, fd, v, total, 0),
        Ok((v, total)) => recv_iov(t, fd, v, total, 0),
        Err(e) => fault(e),
    }
}

/// The loop `sendmmsg` and `recvmmsg` share: `one` moves message `i` (its
/// header, iovecs and their total) and says how many bytes moved (< 0:
/// failed, errno set) and whether to go on. Returns messages done, or -1
/// with errno when none was (EFAULT for an unreadable first header).
fn each_mmsg(
    msgs: *mut mmsghdr,
    vlen: u32,
    mut one: impl FnMut(&mut mmsghdr, &[iovec], usize) -> (isize, bool),
) -> c_int {
    let vlen = (vlen as usize).min(iov::UIO_MAXIOV);
    let mut done = 0usize;
    while done < vlen {
        let r = match uaccess::obj_mut(msgs.wrapping_add(done)) {
            None => Err(libc::EFAULT),
            Some(mm) => msg_iovecs(&mm.msg_hdr).map(|(v, total)| one(mm, v, total)),
        };
        match r {
            Ok((r, _)) if r < 0 => break,
            Ok((_, more)) => {
                done += 1;
                if !more {
                    break;
                }
            }
            Err(e) => {
                if done == 0 {
                    return fault(e);
                }
                break;
            }
        }
    }
    if done == 0 && vlen > 0 {
        -1
    } else {
        done as c_int
    }
}

/// `sendmmsg` on an engine connection: each message's iovecs sent as by
/// `sendmsg` (a stream has no message boundaries); stops at the first
/// message not sent whole. Returns messages sent, or -1 with errno when
/// none was.
pub fn sendmmsg(t: TcpRef, fd: c_int, msgs: *mut mmsghdr, vlen: u32, flags: c_int) -> c_int {
    each_mmsg(msgs, vlen, |mm, v, total| {
        let r = send_iov(t, fd, v, total, flags);
        if r >= 0 {
            mm.msg_len = r as u32;
        }
        (r, r >= 0 && r as usize >= total)
    })
}

/// `recvmmsg` on an engine connection: each message filled as by
/// `recvmsg`; after the first, only what is already there
/// (`MSG_WAITFORONE`) or, without it, as the flags say. Stops at end of
/// stream or when nothing more is ready. Returns messages filled, or -1
/// with errno when none was.
pub fn recvmmsg(t: TcpRef, fd: c_int, msgs: *mut mmsghdr, vlen: u32, flags: c_int) -> c_int {
    let mut fl = flags & !libc::MSG_WAITFORONE;
    each_mmsg(msgs, vlen, |mm, v, total| {
        let r = recv_iov(t, fd, v, total, fl);
        if r >= 0 {
            mm.msg_len = r as u32;
            mm.msg_hdr.msg_controllen = 0;
            mm.msg_hdr.msg_flags = 0;
            if flags & libc::MSG_WAITFORONE != 0 {
                fl |= libc::MSG_DONTWAIT;
            }
        }
        (r, r != 0)
    })
}
