//! Routes and neighbours from the kernel over rtnetlink. nanowire never
//! speaks ARP itself: a missing neighbour is resolved by the kernel (a
//! zero-length datagram to the discard port from a kernel UDP socket makes
//! it send an ARP request), and we wait a bounded time for the answer.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLM_F_REQUEST: u16 = 1;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NUD_VALID: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

/// Where the kernel would send a packet for some destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub oif: u32,
    /// Gateway, or `None` when the destination is on-link.
    pub gateway: Option<Ipv4Addr>,
    /// Preferred source address.
    pub prefsrc: Option<Ipv4Addr>,
    /// RTN_* route type (1 unicast, 2 local, 3 broadcast, 5 multicast).
    pub kind: u8,
}

pub const RTN_UNICAST: u8 = 1;
pub const RTN_LOCAL: u8 = 2;
pub const RTN_BROADCAST: u8 = 3;
pub const RTN_MULTICAST: u8 = 5;

impl Route {
    /// The neighbour whose MAC the frame is addressed to.
    pub fn next_hop(&self, dst: Ipv4Addr) -> Ipv4Addr {
        self.gateway.unwrap_or(dst)
    }
}

struct Nl {
    fd: OwnedFd,
    seq: u32,
}

fn push_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// Iterate the rtattrs of `b`: (type, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let ty = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let data = &b[4..len];
        let adv = (len + 3) & !3;
        b = &b[adv.min(b.len())..];
        Some((ty, data))
    })
}

fn ip4(d: &[u8]) -> Option<Ipv4Addr> {
    <[u8; 4]>::try_from(d).ok().map(Ipv4Addr::from)
}

impl Nl {
    fn open() -> io::Result<Nl> {
        // SAFETY: plain socket(2); checked below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a correctly sized timeval.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Ok(Nl { fd, seq: 1 })
    }

    /// Send one request, return the payload (after nlmsghdr) of each reply
    /// message of type `want` until the kernel is done.
    fn request(&mut self, ty: u16, flags: u16, body: &[u8], want: u16) -> io::Result<Vec<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let mut msg = Vec::with_capacity(16 + body.len());
        msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        // SAFETY: msg is a valid buffer of msg.len() bytes.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32768];
        loop {
            // SAFETY: buf is a valid writable buffer of buf.len() bytes.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut b = &buf[..n as usize];
            let mut multi = false;
            while b.len() >= 16 {
                let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
                let mty = u16::from_ne_bytes([b[4], b[5]]);
                let mflags = u16::from_ne_bytes([b[6], b[7]]);
                let seq = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
                if len < 16 || len > b.len() {
                    break;
                }
                let payload = &b[16..len];
                multi |= mflags & 2 != 0; // NLM_F_MULTI
                if seq == self.seq {
                    match mty {
                        NLMSG_DONE => return Ok(out),
                        NLMSG_ERROR => {
                            let code = payload
                                .get(..4)
                                .map(|e| i32::from_ne_bytes([e[0], e[1], e[2], e[3]]))
                                .unwrap_or(0);
                            if code != 0 {
                                return Err(io::Error::from_raw_os_error(-code));
                            }
                            return Ok(out);
                        }
                        t if t == want => out.push(payload.to_vec()),
                        _ => {}
                    }
                }
                b = &b[((len + 3) & !3).min(b.len())..];
            }
            if !multi {
                return Ok(out);
            }
        }
    }
}

/// RTM_GETROUTE for `dst`.
pub fn route_get(dst: Ipv4Addr) -> io::Result<Route> {
    let mut nl = Nl::open()?;
    let mut body = vec![libc::AF_INET as u8, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    push_attr(&mut body, RTA_DST, &dst.octets());
    let msgs = nl.request(RTM_GETROUTE, 0, &body, RTM_NEWROUTE)?;
    let m = msgs
        .first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no route to {dst}")))?;
    let mut r = Route {
        oif: 0,
        gateway: None,
        prefsrc: None,
        kind: m.get(7).copied().unwrap_or(RTN_UNICAST),
    };
    for (ty, d) in attrs(m.get(12..).unwrap_or(&[])) {
        match ty {
            RTA_OIF if d.len() == 4 => r.oif = u32::from_ne_bytes([d[0], d[1], d[2], d[3]]),
            RTA_GATEWAY => r.gateway = ip4(d),
            RTA_PREFSRC => r.prefsrc = ip4(d),
            _ => {}
        }
    }
    Ok(r)
}

/// RTM_GETNEIGH: the MAC of `ip` on `ifindex`, if the kernel has a usable entry.
pub fn neigh_get(ifindex: u32, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
    let mut nl = Nl::open()?;
    let mut body = vec![libc::AF_INET as u8, 0, 0, 0];
    body.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    body.extend_from_slice(&[0u8; 4]); // state, flags, type
    push_attr(&mut body, NDA_DST, &ip.octets());
    let msgs = match nl.request(RTM_GETNEIGH, 0, &body, RTM_NEWNEIGH) {
        Ok(m) => m,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    for m in msgs {
        if m.len() < 12 {
            continue;
        }
        let state = u16::from_ne_bytes([m[8], m[9]]);
        if state & NUD_VALID == 0 {
            continue;
        }
        for (ty, d) in attrs(&m[12..]) {
            if let (NDA_LLADDR, Ok(mac)) = (ty, <[u8; 6]>::try_from(d)) {
                return Ok(Some(mac));
            }
        }
    }
    Ok(None)
}

/// The MAC to address a frame for `dst` to, leaving `oif`: from the
/// kernel's neighbour table, asking the kernel to resolve it when missing
/// and waiting at most `timeout`.
pub fn resolve_mac(dst: Ipv4Addr, route: &Route, timeout: Duration) -> Result<[u8; 6], String> {
    if dst.is_multicast() {
        let o = dst.octets();
        return Ok([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]);
    }
    if dst.is_broadcast() || route.kind == RTN_BROADCAST {
        return Ok([0xff; 6]);
    }
    let hop = route.next_hop(dst);
    let err = |e: io::Error| format!("neighbour lookup for {hop} failed: {e}");
    if let Some(mac) = neigh_get(route.oif, hop).map_err(err)? {
        return Ok(mac);
    }
    // Let the kernel resolve it: a zero-length datagram to the discard port.
    if let Ok(s) = UdpSocket::bind("0.0.0.0:0") {
        let _ = s.send_to(&[], SocketAddrV4::new(hop, 9));
    }
    let start = Instant::now();
    while start.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(2));
        if let Some(mac) = neigh_get(route.oif, hop).map_err(err)? {
            return Ok(mac);
        }
    }
    Err(format!(
        "the kernel could not resolve the MAC of next hop {hop} within {} ms (no ARP answer)",
        timeout.as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_to_loopback() {
        let r = route_get(Ipv4Addr::LOCALHOST).unwrap();
        assert!(r.oif > 0);
        assert_eq!(r.gateway, None);
        assert_eq!(r.kind, RTN_LOCAL);
    }

    #[test]
    fn attrs_parser_is_bounded() {
        // Garbage must not panic.
        for n in 0..16 {
            let b = vec![0xffu8; n];
            let _ = attrs(&b).count();
        }
        let mut b = Vec::new();
        push_attr(&mut b, 7, &[1, 2, 3, 4]);
        let v: Vec<_> = attrs(&b).collect();
        assert_eq!(v, vec![(7, &[1u8, 2, 3, 4][..])]);
    }
}
