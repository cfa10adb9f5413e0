//! The AF_PACKET socket: the only module of this crate with `unsafe`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// A raw packet socket bound to one interface, with nanosecond software
/// receive timestamps.
pub struct PacketSocket {
    fd: OwnedFd,
}

/// One received frame.
pub struct Frame {
    pub len: usize,
    /// Length on the wire (may exceed `len` when truncated to the buffer).
    pub orig_len: usize,
    /// Kernel timestamp, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    pub outgoing: bool,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The call's error (errno), or `Ok(None)` when it is `nothing`: no frame
/// now, which is not an error.
fn none_if<T>(nothing: io::ErrorKind) -> io::Result<Option<T>> {
    let e = io::Error::last_os_error();
    if e.kind() == nothing {
        Ok(None)
    } else {
        Err(e)
    }
}

impl PacketSocket {
    /// Open and bind to `iface`. Needs CAP_NET_RAW.
    pub fn open(iface: &str) -> io::Result<PacketSocket> {
        let name = std::ffi::CString::new(iface).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "interface name contains NUL")
        })?;
        // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface named {iface:?} in this network namespace"),
            ));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be() as libc::c_int;
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = cvt(unsafe {
            libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto)
        })
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::EPERM) {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "capture needs CAP_NET_RAW (run as root)",
                )
            } else {
                e
            }
        })?;
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto as u16;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and the length passed matches its size.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        let one: libc::c_int = 1;
        // SAFETY: the option value points to a live c_int of the size passed.
        cvt(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        })?;
        Ok(PacketSocket { fd })
    }

    /// Wait up to `timeout` for a frame; `Ok(None)` on timeout.
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<Frame>> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `pfd` is one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            return none_if(io::ErrorKind::Interrupted);
        }
        if n == 0 {
            return Ok(None);
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = [0u64; 16]; // 128 bytes, 8-aligned, room for one timespec cmsg
        // SAFETY: sockaddr_ll and msghdr are plain old data; all-zero is valid.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: every pointer in `msg` refers to live buffers of the stated sizes.
        let r = unsafe {
            libc::recvmsg(
                self.fd.as_raw_fd(),
                &mut msg,
                libc::MSG_TRUNC | libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            return none_if(io::ErrorKind::WouldBlock);
        }
        let orig_len = r as usize;
        let mut ts_ns = 0u64;
        // SAFETY: the CMSG_* macros walk the control buffer the kernel filled,
        // bounded by msg_controllen; the timespec is read unaligned.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    ts_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Some(Frame {
            len: orig_len.min(buf.len()),
            orig_len,
            ts_ns,
            outgoing: from.sll_pkttype == libc::PACKET_OUTGOING,
        }))
    }
}
