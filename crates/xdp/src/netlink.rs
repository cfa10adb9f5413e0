//! Routes and neighbours from the kernel over rtnetlink. nanowire never
//! speaks ARP itself: a missing neighbour is resolved by the kernel
//! ([`solicit`] makes it send an ARP request), and the answer arrives as a
//! neighbour event on a [`Monitor`]. Nothing here waits for the network.

use crate::sys;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

// The kernel's rtnetlink numbers, from libc (as the uapi headers have them).
use libc::{
    NDA_DST, NDA_LLADDR, RTA_DST, RTA_GATEWAY, RTA_OIF, RTA_PREFSRC, RTM_DELNEIGH, RTM_DELROUTE,
    RTM_GETNEIGH, RTM_GETROUTE, RTM_NEWNEIGH, RTM_NEWROUTE,
};
/// RTN_* route types; NUD_FAILED / NUD_INCOMPLETE: no usable address.
pub use libc::{NUD_FAILED, NUD_INCOMPLETE, RTN_BROADCAST, RTN_LOCAL, RTN_MULTICAST, RTN_UNICAST};

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
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
        Nl::open_proto(libc::NETLINK_ROUTE)
    }

    fn open_proto(proto: i32) -> io::Result<Nl> {
        let fd = sys::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        let _ = crate::sock::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv);
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
        let n = unsafe {
            sys::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                std::ptr::null(),
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32768];
        loop {
            // SAFETY: buf is a valid writable buffer of buf.len() bytes.
            let n = unsafe {
                sys::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
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

/// Kernel TCP states (include/net/tcp_states.h) that `SockDiag` reports.
pub const TCP_TIME_WAIT: u8 = 6;
pub const TCP_CLOSE: u8 = 7;
pub const TCP_LISTEN: u8 = 10;

/// The name `ss` gives a kernel TCP state (include/net/tcp_states.h).
pub fn tcp_state_name(s: u8) -> &'static str {
    match s {
        1 => "ESTAB",
        2 => "SYN-SENT",
        3 => "SYN-RECV",
        4 => "FIN-WAIT-1",
        5 => "FIN-WAIT-2",
        TCP_TIME_WAIT => "TIME-WAIT",
        TCP_CLOSE => "CLOSE",
        8 => "CLOSE-WAIT",
        9 => "LAST-ACK",
        TCP_LISTEN => "LISTEN",
        11 => "CLOSING",
        12 => "NEW-SYN-RECV",
        _ => "?",
    }
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;

/// Exact look-ups of kernel TCP sockets by 4-tuple (NETLINK_SOCK_DIAG,
/// inet_diag without a dump): one request and one answer per look-up.
pub struct SockDiag(Nl);

impl SockDiag {
    pub fn open() -> io::Result<SockDiag> {
        Nl::open_proto(libc::NETLINK_SOCK_DIAG).map(SockDiag)
    }

    /// The kernel's state of the TCP connection (`local`, `remote`) in this
    /// network namespace (TIME-WAIT included), or `None` if it has none.
    /// The kernel's exact look-up falls back to a listener on the local
    /// port: that answer (another 4-tuple) is `None` too.
    pub fn tcp_state(
        &mut self,
        local: std::net::SocketAddrV4,
        remote: std::net::SocketAddrV4,
    ) -> io::Result<Option<u8>> {
        // struct inet_diag_msg: family, state, timer, retrans, then the
        // sockid (sport at 4, dport at 6, src at 8, dst at 24).
        Ok(self.look_up(local, remote)?.and_then(|m| {
            let m = m.get(..28)?;
            let same = m[4..6] == local.port().to_be_bytes()
                && m[6..8] == remote.port().to_be_bytes()
                && m[24..28] == remote.ip().octets();
            (same && m[1] != TCP_LISTEN).then_some(m[1])
        }))
    }

    /// The kernel's TCP connection (`local`, `remote`): its state and its
    /// socket's inode (`idiag_inode`, the st_ino of the socket's fd), or
    /// `None` if it has none (a listener's answer included).
    pub fn tcp_conn_inode(
        &mut self,
        local: std::net::SocketAddrV4,
        remote: std::net::SocketAddrV4,
    ) -> io::Result<Option<(u8, u64)>> {
        Ok(self.look_up(local, remote)?.and_then(|m| {
            let m = m.get(..72)?;
            let same = m[4..6] == local.port().to_be_bytes()
                && m[6..8] == remote.port().to_be_bytes()
                && m[24..28] == remote.ip().octets();
            (same && m[1] != TCP_LISTEN).then(|| {
                (
                    m[1],
                    u64::from(u32::from_ne_bytes(m[68..72].try_into().unwrap())),
                )
            })
        }))
    }

    /// The inode of the kernel's TCP socket listening on `local` (its
    /// address or the wildcard), or `None` if none listens there.
    pub fn tcp_listener_inode(&mut self, local: std::net::SocketAddrV4) -> io::Result<Option<u64>> {
        // From a remote 0.0.0.0:0: the kernel's exact look-up finds no
        // connection and answers with the listener. struct inet_diag_msg:
        // state at 1, sport at 4, ..., idiag_inode (u32) at 68.
        let any = std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
        Ok(self.look_up(local, any)?.and_then(|m| {
            let m = m.get(..72)?;
            (m[1] == TCP_LISTEN && m[4..6] == local.port().to_be_bytes())
                .then(|| u64::from(u32::from_ne_bytes(m[68..72].try_into().unwrap())))
        }))
    }

    /// The kernel's answer (its first message) to an exact look-up of the
    /// TCP socket (`local`, `remote`), `None` if it has none.
    fn look_up(
        &mut self,
        local: std::net::SocketAddrV4,
        remote: std::net::SocketAddrV4,
    ) -> io::Result<Option<Vec<u8>>> {
        // struct inet_diag_req_v2: family, protocol, ext, pad, states, then
        // inet_diag_sockid: sport, dport (be16), src[4], dst[4] (be32),
        // if, cookie[2] (INET_DIAG_NOCOOKIE).
        let mut body = Vec::with_capacity(56);
        body.extend_from_slice(&[libc::AF_INET as u8, libc::IPPROTO_TCP as u8, 0, 0]);
        body.extend_from_slice(&u32::MAX.to_ne_bytes());
        body.extend_from_slice(&local.port().to_be_bytes());
        body.extend_from_slice(&remote.port().to_be_bytes());
        body.extend_from_slice(&local.ip().octets());
        body.extend_from_slice(&[0; 12]);
        body.extend_from_slice(&remote.ip().octets());
        body.extend_from_slice(&[0; 12]);
        body.extend_from_slice(&0u32.to_ne_bytes());
        body.extend_from_slice(&[0xff; 8]);
        match self
            .0
            .request(SOCK_DIAG_BY_FAMILY, 0, &body, SOCK_DIAG_BY_FAMILY)
        {
            Ok(m) => Ok(m.into_iter().next()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// What a device's driver offers for XDP and AF_XDP, as the kernel reports
/// it over the generic netlink family "netdev" (`NETDEV_CMD_DEV_GET`,
/// kernel 6.3+; `xsk-features` 6.8+). Bit values from
/// include/uapi/linux/netdev.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetdevFeatures {
    /// `xdp-features` (`NETDEV_XDP_ACT_*`).
    pub xdp: u64,
    /// `xdp-zc-max-segs`: frags of one zero-copy multi-buffer packet.
    pub xdp_zc_max_segs: Option<u32>,
    /// `xdp-rx-metadata-features` (`NETDEV_XDP_RX_METADATA_*`).
    pub rx_metadata: u64,
    /// `xsk-features` (`NETDEV_XSK_FLAGS_*`); `None` on kernels before 6.8.
    pub xsk: Option<u64>,
}

pub const XDP_ACT_BASIC: u64 = 1;
pub const XDP_ACT_REDIRECT: u64 = 2;
pub const XDP_ACT_NDO_XMIT: u64 = 4;
pub const XDP_ACT_XSK_ZEROCOPY: u64 = 8;
pub const XDP_ACT_HW_OFFLOAD: u64 = 16;
pub const XDP_ACT_RX_SG: u64 = 32;
pub const XDP_ACT_NDO_XMIT_SG: u64 = 64;

fn flag_names(v: u64, table: &[(u64, &'static str)]) -> Vec<&'static str> {
    table
        .iter()
        .filter(|(b, _)| v & b != 0)
        .map(|(_, n)| *n)
        .collect()
}

impl NetdevFeatures {
    /// The `xdp-features` names the kernel's netdev.yaml uses.
    pub fn xdp_names(&self) -> Vec<&'static str> {
        flag_names(
            self.xdp,
            &[
                (XDP_ACT_BASIC, "basic"),
                (XDP_ACT_REDIRECT, "redirect"),
                (XDP_ACT_NDO_XMIT, "ndo-xmit"),
                (XDP_ACT_XSK_ZEROCOPY, "xsk-zerocopy"),
                (XDP_ACT_HW_OFFLOAD, "hw-offload"),
                (XDP_ACT_RX_SG, "rx-sg"),
                (XDP_ACT_NDO_XMIT_SG, "ndo-xmit-sg"),
            ],
        )
    }
    pub fn rx_metadata_names(&self) -> Vec<&'static str> {
        flag_names(
            self.rx_metadata,
            &[(1, "timestamp"), (2, "hash"), (4, "vlan-tag")],
        )
    }
    pub fn xsk_names(&self) -> Vec<&'static str> {
        flag_names(
            self.xsk.unwrap_or(0),
            &[
                (1, "tx-timestamp"),
                (2, "tx-checksum"),
                (4, "tx-launch-time-fifo"),
            ],
        )
    }
}

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
const NETDEV_A_DEV_XDP_ZC_MAX_SEGS: u16 = 4;
const NETDEV_A_DEV_XDP_RX_METADATA_FEATURES: u16 = 5;
const NETDEV_A_DEV_XSK_FEATURES: u16 = 6;

fn uint(d: &[u8]) -> Option<u64> {
    match d.len() {
        4 => Some(u64::from(u32::from_ne_bytes([d[0], d[1], d[2], d[3]]))),
        8 => Some(u64::from_ne_bytes([
            d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
        ])),
        _ => None,
    }
}

/// The XDP/AF_XDP features of `ifindex` (in this network namespace), or
/// `None` when the kernel has no "netdev" generic netlink family (before 6.3).
pub fn netdev_features(ifindex: u32) -> io::Result<Option<NetdevFeatures>> {
    let mut nl = Nl::open_proto(libc::NETLINK_GENERIC)?;
    let mut body = vec![CTRL_CMD_GETFAMILY, 1, 0, 0];
    push_attr(&mut body, CTRL_ATTR_FAMILY_NAME, b"netdev\0");
    let family = match nl.request(GENL_ID_CTRL, 0, &body, GENL_ID_CTRL) {
        Ok(m) => m.first().and_then(|m| m.get(4..)).and_then(|a| {
            attrs(a)
                .find(|(t, d)| *t == CTRL_ATTR_FAMILY_ID && d.len() == 2)
                .map(|(_, d)| u16::from_ne_bytes([d[0], d[1]]))
        }),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
        Err(e) => return Err(e),
    };
    let Some(family) = family else {
        return Ok(None);
    };
    let mut body = vec![NETDEV_CMD_DEV_GET, 1, 0, 0];
    push_attr(&mut body, NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
    let msgs = nl.request(family, 0, &body, family)?;
    let m = msgs.first().ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, "netdev: no reply for the device")
    })?;
    let mut f = NetdevFeatures::default();
    for (ty, d) in attrs(m.get(4..).unwrap_or(&[])) {
        match ty {
            NETDEV_A_DEV_XDP_FEATURES => f.xdp = uint(d).unwrap_or(0),
            NETDEV_A_DEV_XDP_ZC_MAX_SEGS => f.xdp_zc_max_segs = uint(d).map(|v| v as u32),
            NETDEV_A_DEV_XDP_RX_METADATA_FEATURES => f.rx_metadata = uint(d).unwrap_or(0),
            NETDEV_A_DEV_XSK_FEATURES => f.xsk = uint(d),
            _ => {}
        }
    }
    Ok(Some(f))
}

/// RTM_GETROUTE for `dst` (a netlink socket for this one call).
pub fn route_get(dst: Ipv4Addr) -> io::Result<Route> {
    Nl::open()?.route_get(dst)
}

/// RTM_GETNEIGH: the MAC of `ip` on `ifindex`, if the kernel has a usable
/// entry (a netlink socket for this one call).
pub fn neigh_get(ifindex: u32, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
    Nl::open()?.neigh_get(ifindex, ip)
}

/// A netlink socket kept for route and neighbour queries, its number above
/// the program's ([`sys::above_floor`]): an engine thread that asks the
/// kernel never opens a descriptor, so it never takes a number the program
/// just freed (a single-threaded program's next socket or file gets the
/// number it gets plainly).
pub struct Query(Nl);

impl Query {
    pub fn open() -> io::Result<Query> {
        let Nl { fd, seq } = Nl::open()?;
        Ok(Query(Nl {
            fd: sys::above_floor(fd),
            seq,
        }))
    }
    pub fn route_get(&mut self, dst: Ipv4Addr) -> io::Result<Route> {
        self.0.route_get(dst)
    }
    pub fn neigh_get(&mut self, ifindex: u32, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
        self.0.neigh_get(ifindex, ip)
    }
}

impl Nl {
    fn route_get(&mut self, dst: Ipv4Addr) -> io::Result<Route> {
        let nl = self;
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

    fn neigh_get(&mut self, ifindex: u32, ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
        let nl = self;
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
}

/// The MAC of a destination that needs no neighbour resolution
/// (multicast, broadcast), if it is one.
pub fn static_mac(dst: Ipv4Addr, route: &Route) -> Option<[u8; 6]> {
    if dst.is_multicast() {
        let o = dst.octets();
        return Some([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]);
    }
    if dst.is_broadcast() || route.kind == RTN_BROADCAST {
        return Some([0xff; 6]);
    }
    None
}

/// Ask the kernel to resolve `hop` (it sends an ARP request): a
/// zero-length datagram to the discard port from a kernel UDP socket.
/// Never waits; the answer shows up as an RTM_NEWNEIGH on a [`Monitor`].
pub fn solicit(hop: Ipv4Addr) {
    if let Ok(s) = solicit_socket() {
        solicit_with(&s, hop);
    }
}

/// A socket for [`solicit_with`], its number above the program's
/// ([`sys::above_floor`]), to keep.
pub fn solicit_socket() -> io::Result<OwnedFd> {
    // Raw syscalls: under the LD_PRELOAD shim this socket must stay a
    // plain kernel socket (see crate::sys).
    let fd = sys::socket(
        libc::AF_INET,
        libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        0,
    );
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(sys::above_floor(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// [`solicit`] through a kept socket (from [`solicit_socket`]).
pub fn solicit_with(sock: &OwnedFd, hop: Ipv4Addr) {
    let fd = sock.as_raw_fd();
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 9u16.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(hop).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: an empty datagram; sa is a valid sockaddr_in of the size given.
    unsafe {
        sys::sendto(
            fd,
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
}

/// A change the kernel announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A neighbour entry was added, changed or deleted.
    Neigh {
        ifindex: u32,
        ip: Ipv4Addr,
        /// The link-layer address when the entry is usable.
        mac: Option<[u8; 6]>,
        state: u16,
        deleted: bool,
    },
    /// An IPv4 route was added or deleted.
    Route,
    /// The kernel dropped notifications (socket buffer overrun): assume
    /// anything may have changed.
    Overrun,
}

/// A netlink socket subscribed to neighbour and IPv4 route changes
/// (RTNLGRP_NEIGH, RTNLGRP_IPV4_ROUTE). Non-blocking.
pub struct Monitor {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Monitor {
    pub fn open() -> io::Result<Monitor> {
        let fd = sys::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::NETLINK_ROUTE,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own. Kept for the engine's
        // life: above the program's numbers.
        let fd = sys::above_floor(unsafe { OwnedFd::from_raw_fd(fd) });
        // SAFETY: all-zero sockaddr_nl is valid; fields set below.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = (libc::RTMGRP_NEIGH | libc::RTMGRP_IPV4_ROUTE) as u32;
        // SAFETY: sa is a valid sockaddr_nl of the size passed.
        if unsafe {
            sys::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(Monitor {
            fd,
            buf: vec![0u8; 65536],
        })
    }

    /// Everything announced since the last call (never blocks).
    pub fn read(&mut self, out: &mut Vec<Event>) {
        loop {
            // SAFETY: buf is a valid writable buffer of buf.len() bytes.
            let n = unsafe {
                sys::recvfrom(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            if n < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::ENOBUFS) {
                    out.push(Event::Overrun);
                    continue;
                }
                return;
            }
            if n == 0 {
                return;
            }
            parse_events(&self.buf[..n as usize], out);
        }
    }
}

impl AsRawFd for Monitor {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// Parse a buffer of netlink messages into events (bounded: garbage
/// yields nothing, never a panic).
pub fn parse_events(mut b: &[u8], out: &mut Vec<Event>) {
    while b.len() >= 16 {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let ty = u16::from_ne_bytes([b[4], b[5]]);
        if len < 16 || len > b.len() {
            return;
        }
        let m = &b[16..len];
        match ty {
            RTM_NEWNEIGH | RTM_DELNEIGH if m.len() >= 12 && m[0] == libc::AF_INET as u8 => {
                let ifindex = i32::from_ne_bytes([m[4], m[5], m[6], m[7]]) as u32;
                let state = u16::from_ne_bytes([m[8], m[9]]);
                let (mut ip, mut mac) = (None, None);
                for (t, d) in attrs(&m[12..]) {
                    match t {
                        NDA_DST => ip = ip4(d),
                        NDA_LLADDR => mac = <[u8; 6]>::try_from(d).ok(),
                        _ => {}
                    }
                }
                let deleted = ty == RTM_DELNEIGH;
                if let Some(ip) = ip {
                    out.push(Event::Neigh {
                        ifindex,
                        ip,
                        mac: mac.filter(|_| !deleted && state & NUD_VALID != 0),
                        state,
                        deleted,
                    });
                }
            }
            RTM_NEWROUTE | RTM_DELROUTE if m.first() == Some(&(libc::AF_INET as u8)) => {
                out.push(Event::Route)
            }
            _ => {}
        }
        b = &b[((len + 3) & !3).min(b.len())..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sock_diag_finds_exactly_the_connection() {
        use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let v4 = |a: SocketAddr| match a {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!(),
        };
        let (local, remote) = (v4(s.local_addr().unwrap()), v4(s.peer_addr().unwrap()));
        let mut d = SockDiag::open().unwrap();
        assert_eq!(d.tcp_state(local, remote).unwrap(), Some(1)); // ESTABLISHED
        // Same listener port, no such peer: the kernel's fallback to the
        // listener is not that connection.
        let other = SocketAddrV4::new(*remote.ip(), remote.port() ^ 0x5555);
        assert_eq!(d.tcp_state(local, other).unwrap(), None);
        drop(s);
        drop(c);
        // The side that closed first is in TIME-WAIT (or gone).
        let st = d.tcp_state(local, remote).unwrap();
        assert!(
            matches!(st, Some(4..=6) | None),
            "state after close: {st:?}"
        );
    }

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

    #[test]
    fn neighbour_events_parse_and_garbage_does_not_panic() {
        let mut body = vec![libc::AF_INET as u8, 0, 0, 0];
        body.extend_from_slice(&7i32.to_ne_bytes());
        body.extend_from_slice(&0x02u16.to_ne_bytes()); // REACHABLE
        body.extend_from_slice(&[0, 0]);
        push_attr(&mut body, NDA_DST, &[10, 0, 0, 2]);
        push_attr(&mut body, NDA_LLADDR, &[2, 3, 4, 5, 6, 7]);
        let mut msg = Vec::new();
        msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&RTM_NEWNEIGH.to_ne_bytes());
        msg.extend_from_slice(&[0u8; 10]);
        msg.extend_from_slice(&body);
        let mut ev = Vec::new();
        parse_events(&msg, &mut ev);
        assert_eq!(
            ev,
            vec![Event::Neigh {
                ifindex: 7,
                ip: Ipv4Addr::new(10, 0, 0, 2),
                mac: Some([2, 3, 4, 5, 6, 7]),
                state: 2,
                deleted: false
            }]
        );
        for n in 0..msg.len() {
            parse_events(&msg[..n], &mut ev);
        }
    }
}
