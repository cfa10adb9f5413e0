//! Packets shown to the kernel as if received (a raw socket's send to an
//! address of ours, delivered locally, never on the wire): the peer's FIN
//! of a TCP connection handed over (`handover`), the datagrams the engine
//! had queued for a UDP socket a child process comes to share (`accel`).

use crate::real;
use libc::socklen_t;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

pub(crate) fn raw_socket(what: &str) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); owned at once.
    let r = unsafe {
        real::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_RAW,
        )
    };
    if r < 0 {
        return Err(last_err(&format!("raw socket (for {what})")));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Deliver `packets` (IPv4 packets to an address of ours, `what` in an
/// error) to the kernel as if received: the peer's FIN of a connection
/// handed over (TCP_REPAIR cannot set CLOSE-WAIT, so the kernel is shown
/// the FIN it would have received, as CRIU does), the datagrams the engine
/// had queued for a UDP socket a child comes to share (`accel::detach`).
/// Sent to our own address, they are delivered locally, never on the
/// wire. Returns how many were delivered before an error (with it).
pub(crate) fn inject(packets: &[&[u8]], what: &str) -> Result<(), (usize, io::Error)> {
    let raw = raw_socket(what).map_err(|e| (0, e))?;
    for (i, packet) in packets.iter().enumerate() {
        let dst = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            // Bytes 16..20 of the IPv4 header: the destination, network order.
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([packet[16], packet[17], packet[18], packet[19]]),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: the packet's bytes and a sockaddr_in, with their sizes.
        let n = unsafe {
            real::sendto(
                raw.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&raw const dst).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as socklen_t,
            )
        };
        if n < 0 {
            return Err((i, last_err(&format!("sending {what} to the kernel"))));
        }
    }
    Ok(())
}
