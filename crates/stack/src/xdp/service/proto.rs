//! The engine service's control protocol: fixed-layout messages on a
//! `SOCK_SEQPACKET` unix socket in the abstract namespace (one per network
//! namespace, so one service per network namespace), file descriptors with
//! `SCM_RIGHTS`. Every message starts with a magic word and a kind; a
//! message of the wrong size, magic or kind is refused with a counted
//! reason and the connection closed. Requests and answers strictly
//! alternate; the service never sends anything unasked.

use nanowire_xdp::shared::Geometry;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddrV4};

/// The abstract socket name (per network namespace).
pub const SOCKET_NAME: &[u8] = b"nanowire-engine-1";
pub const MAGIC: u32 = 0x6e77_6531; // "nwe1"
/// Longest message either side accepts (a status answer may be longer: it
/// is read with a larger buffer by the client).
pub const MAX_REQUEST: usize = 256;
/// Most descriptors in one message (2 per queue of an attach answer).
pub const MAX_FDS: usize = 128;

pub const K_ATTACH: u16 = 1;
pub const K_CLAIM: u16 = 2;
pub const K_UNCLAIM: u16 = 3;
pub const K_STATUS: u16 = 4;
/// Claim / release one TCP connection by 4-tuple (a connect, a listener's
/// connection after the listener is released, a hand-over's pass entry).
pub const K_TCP_FLOW: u16 = 5;
pub const K_TCP_UNFLOW: u16 = 6;
/// The process's TCP connection table (a memfd, SCM_RIGHTS; conns.rs):
/// what the service reads to end its connections when it dies.
pub const K_CONN_TABLE: u16 = 7;
/// The process's stats page (a sealed memfd, SCM_RIGHTS) when no directory
/// lists it (an unprivileged process): the service reads its counters for
/// `nanowire stats`.
pub const K_STATS_PAGE: u16 = 8;
/// The process received a packet larger than one frame: the service puts
/// the multi-buffer aware steering program in place of the one without
/// (generic mode, `Frags::Lazy`; no body, no descriptors).
pub const K_FRAGS: u16 = 9;
/// Join a TCP listener claim's group (issue 24: a forked worker holding
/// the same listening socket, which comes with it, SCM_RIGHTS): new
/// connections are spread over the group's accepting members. Body as
/// `K_CLAIM`'s (protocol 6).
pub const K_TCP_JOIN: u16 = 10;
/// A member of a listener group stops accepting for now (a fork's parent);
/// body as `K_CLAIM`'s (protocol 6), no descriptor.
pub const K_TCP_IDLE: u16 = 11;
/// Move one TCP connection (4-tuple) between two processes holding its
/// socket (issue 24: a forked child uses its copy, and the connection stays
/// on the engine). Body as `K_TCP_FLOW`'s, what 1: the owner *offers* it
/// (its socket comes with it, SCM_RIGHTS: the service keeps the socket's
/// inode); what 2: the requester *takes* it (its copy of that socket comes
/// with it: the same inode, or refused): the 4-tuple is steered to its slot.
pub const K_TCP_MOVE: u16 = 12;
pub const K_OK: u16 = 0x81;
pub const K_ERR: u16 = 0x82;
pub const K_STATUS_REPLY: u16 = 0x83;

pub const PROTO_UDP: u8 = 17;
pub const PROTO_TCP: u8 = 6;

/// `K_CLAIM` flag (the byte after the protocol): a TCP port of the
/// process's client port block (docs/architecture.md, "Client port
/// block"): the socket must hold the port alone (no SO_REUSEADDR,
/// SO_REUSEPORT or device binding), and the service keeps it while the
/// claim lasts.
pub const CLAIM_CLIENT_PORT: u8 = 1;

/// A request as the service reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Attach to an interface: `ring_depth` is a hint used when the service
    /// first opens the interface.
    Attach {
        iface: String,
        ring_depth: u32,
    },
    /// Claim (proto, addr, port); the kernel socket holding the port comes
    /// with it (SCM_RIGHTS).
    Claim {
        proto: u8,
        addr: Ipv4Addr,
        port: u16,
        /// [`CLAIM_CLIENT_PORT`].
        client_port: bool,
    },
    Unclaim {
        proto: u8,
        addr: Ipv4Addr,
        port: u16,
    },
    Status,
    /// A TCP connection: `Flow` steers it to the process (the kernel socket
    /// holding `local`'s port comes with it, unless the process holds the
    /// listener claim of `local`); `Pass` gives it to the kernel under the
    /// process's own listener claim.
    TcpFlow {
        what: TcpFlow,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    },
    TcpUnflow {
        local: SocketAddrV4,
        remote: SocketAddrV4,
    },
    ConnTable,
    /// The process's stats page comes with it (SCM_RIGHTS).
    StatsPage,
    /// Upgrade the interface's program to the multi-buffer aware one.
    Frags,
    /// Join the listener group of (addr, port); the process's copy of the
    /// listening socket comes with it (SCM_RIGHTS).
    TcpJoin {
        addr: Ipv4Addr,
        port: u16,
    },
    /// Stop accepting from the listener group of (addr, port) for now.
    TcpIdle {
        addr: Ipv4Addr,
        port: u16,
    },
    /// Offer (`take` false: the owner) or take (`take` true: a process
    /// holding the same socket) the TCP connection (local, remote); the
    /// process's copy of its socket comes with it (SCM_RIGHTS).
    TcpMove {
        take: bool,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    },
}

/// What a `K_TCP_FLOW` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpFlow {
    /// Steer the 4-tuple to this process.
    Flow = 1,
    /// Give the 4-tuple to the kernel (a connection handed over).
    Pass = 2,
}

/// Descriptors an attach answer carries per queue, in queue order: the
/// UMEM's file, the control area's memfd, the member socket.
pub const ATTACH_FDS_PER_QUEUE: usize = 3;

/// What an attach is answered with (and [`ATTACH_FDS_PER_QUEUE`]
/// descriptors per queue, then, from session 17 on, the steering program's
/// count of frames redirected per socket: `nw_ready`, an mmapable map the
/// members read to pass a shared CPU by hint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachReply {
    pub slot: u32,
    pub queues: u32,
    pub geo: Geometry,
    pub zero_copy: bool,
    pub multi_buffer: bool,
    /// 0 native, 1 generic.
    pub xdp_generic: bool,
    /// XDP_MAX_TX_SKB_BUDGET in effect, 0 = the kernel's default.
    pub tx_budget: u32,
    /// The program is `nw_steer` (generic mode, `Frags::Lazy`): the first
    /// multi-buffer packet a process sees asks for the frags-aware one
    /// (`K_FRAGS`).
    pub frags_lazy: bool,
    /// The shared UMEM has TX metadata (`TX_METADATA_LEN` bytes before
    /// each transmitted packet: checksum offload, as on an own engine).
    pub tx_metadata: bool,
}

fn header(kind: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}
fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    b.get(off..off + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
}

/// The kind of a message, after its magic word is checked.
pub fn kind(b: &[u8]) -> Result<u16, &'static str> {
    if b.len() < 8 {
        return Err("short_message");
    }
    if u32_at(b, 0) != Some(MAGIC) {
        return Err("bad_magic");
    }
    u16_at(b, 4).ok_or("short_message")
}

pub fn encode_attach(iface: &str, ring_depth: u32) -> Vec<u8> {
    let mut v = header(K_ATTACH);
    let mut name = [0u8; 16];
    let n = iface.len().min(15);
    name[..n].copy_from_slice(&iface.as_bytes()[..n]);
    v.extend_from_slice(&name);
    v.extend_from_slice(&ring_depth.to_le_bytes());
    v
}

pub fn encode_claim(claim: bool, proto: u8, addr: Ipv4Addr, port: u16) -> Vec<u8> {
    encode_claim_flags(claim, proto, 0, addr, port)
}

/// `K_CLAIM` / `K_UNCLAIM`: protocol, flags ([`CLAIM_CLIENT_PORT`]), 2 zero
/// bytes, address, port, 2 zero bytes.
pub fn encode_claim_flags(claim: bool, proto: u8, flags: u8, addr: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut v = header(if claim { K_CLAIM } else { K_UNCLAIM });
    v.extend_from_slice(&[proto, flags, 0, 0]);
    v.extend_from_slice(&addr.octets());
    v.extend_from_slice(&port.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v
}

/// `K_TCP_FLOW` / `K_TCP_UNFLOW`: what (1 flow, 2 pass; 0 for unflow),
/// 3 zero bytes, local address, local port, remote port, remote address.
pub fn encode_tcp_flow(
    what: Option<TcpFlow>,
    local: SocketAddrV4,
    remote: SocketAddrV4,
) -> Vec<u8> {
    let k = if what.is_some() {
        K_TCP_FLOW
    } else {
        K_TCP_UNFLOW
    };
    encode_tuple(k, what.map_or(0, |w| w as u8), local, remote)
}

/// `K_TCP_MOVE`: as `K_TCP_FLOW`, what 1 offer, 2 take.
pub fn encode_tcp_move(take: bool, local: SocketAddrV4, remote: SocketAddrV4) -> Vec<u8> {
    encode_tuple(K_TCP_MOVE, 1 + u8::from(take), local, remote)
}

fn encode_tuple(k: u16, what: u8, local: SocketAddrV4, remote: SocketAddrV4) -> Vec<u8> {
    let mut v = header(k);
    v.extend_from_slice(&[what, 0, 0, 0]);
    v.extend_from_slice(&local.ip().octets());
    v.extend_from_slice(&local.port().to_le_bytes());
    v.extend_from_slice(&remote.port().to_le_bytes());
    v.extend_from_slice(&remote.ip().octets());
    v
}

/// `K_TCP_JOIN` (`join`) or `K_TCP_IDLE`: a TCP listener's (addr, port).
pub fn encode_tcp_group(join: bool, addr: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut v = encode_claim(true, PROTO_TCP, addr, port);
    let k = if join { K_TCP_JOIN } else { K_TCP_IDLE };
    v[4..6].copy_from_slice(&k.to_le_bytes());
    v
}

pub fn encode_conn_table() -> Vec<u8> {
    header(K_CONN_TABLE)
}

pub fn encode_status() -> Vec<u8> {
    header(K_STATUS)
}

pub fn encode_stats_page() -> Vec<u8> {
    header(K_STATS_PAGE)
}

pub fn encode_frags() -> Vec<u8> {
    header(K_FRAGS)
}

/// Parse a request; `Err` names the counted reason.
pub fn decode_request(b: &[u8]) -> Result<Request, &'static str> {
    match kind(b)? {
        K_ATTACH => {
            if b.len() != 8 + 16 + 4 {
                return Err("bad_length");
            }
            let name = &b[8..24];
            let end = name.iter().position(|&c| c == 0).ok_or("bad_iface_name")?;
            let iface = std::str::from_utf8(&name[..end]).map_err(|_| "bad_iface_name")?;
            if iface.is_empty()
                || !iface
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.@".contains(&c))
            {
                return Err("bad_iface_name");
            }
            Ok(Request::Attach {
                iface: iface.to_string(),
                ring_depth: u32_at(b, 24).ok_or("bad_length")?,
            })
        }
        k @ (K_CLAIM | K_UNCLAIM | K_TCP_JOIN | K_TCP_IDLE) => {
            if b.len() != 8 + 12 {
                return Err("bad_length");
            }
            let proto = b[8];
            if proto != PROTO_UDP && proto != PROTO_TCP {
                return Err("bad_protocol");
            }
            if proto != PROTO_TCP && (k == K_TCP_JOIN || k == K_TCP_IDLE) {
                return Err("bad_protocol");
            }
            let flags = if k == K_CLAIM { b[9] } else { 0 };
            if flags & !CLAIM_CLIENT_PORT != 0 || (flags != 0 && proto != PROTO_TCP) {
                return Err("bad_flags");
            }
            let addr = Ipv4Addr::new(b[12], b[13], b[14], b[15]);
            let port = u16_at(b, 16).ok_or("bad_length")?;
            if port == 0 {
                return Err("bad_port");
            }
            Ok(match k {
                K_CLAIM => Request::Claim {
                    proto,
                    addr,
                    port,
                    client_port: flags & CLAIM_CLIENT_PORT != 0,
                },
                K_UNCLAIM => Request::Unclaim { proto, addr, port },
                K_TCP_JOIN => Request::TcpJoin { addr, port },
                _ => Request::TcpIdle { addr, port },
            })
        }
        k @ (K_TCP_FLOW | K_TCP_UNFLOW | K_TCP_MOVE) => {
            if b.len() != 8 + 16 {
                return Err("bad_length");
            }
            let local = SocketAddrV4::new(
                Ipv4Addr::new(b[12], b[13], b[14], b[15]),
                u16_at(b, 16).ok_or("bad_length")?,
            );
            let remote = SocketAddrV4::new(
                Ipv4Addr::new(b[20], b[21], b[22], b[23]),
                u16_at(b, 18).ok_or("bad_length")?,
            );
            if local.port() == 0 || remote.port() == 0 {
                return Err("bad_port");
            }
            if k == K_TCP_UNFLOW {
                return Ok(Request::TcpUnflow { local, remote });
            }
            if k == K_TCP_MOVE {
                return match b[8] {
                    w @ (1 | 2) => Ok(Request::TcpMove {
                        take: w == 2,
                        local,
                        remote,
                    }),
                    _ => Err("bad_move_kind"),
                };
            }
            let what = match b[8] {
                1 => TcpFlow::Flow,
                2 => TcpFlow::Pass,
                _ => return Err("bad_flow_kind"),
            };
            Ok(Request::TcpFlow {
                what,
                local,
                remote,
            })
        }
        K_CONN_TABLE if b.len() == 8 => Ok(Request::ConnTable),
        K_CONN_TABLE => Err("bad_length"),
        K_STATUS if b.len() == 8 => Ok(Request::Status),
        K_STATUS => Err("bad_length"),
        K_STATS_PAGE if b.len() == 8 => Ok(Request::StatsPage),
        K_STATS_PAGE => Err("bad_length"),
        K_FRAGS if b.len() == 8 => Ok(Request::Frags),
        K_FRAGS => Err("bad_length"),
        _ => Err("unknown_kind"),
    }
}

pub fn encode_attach_reply(r: &AttachReply) -> Vec<u8> {
    let mut v = header(K_OK);
    for w in [
        r.slot,
        r.queues,
        r.geo.rx_frames,
        r.geo.tx_per_slot,
        r.geo.slots,
        r.geo.frame_size,
        u32::from(r.zero_copy)
            | u32::from(r.multi_buffer) << 1
            | u32::from(r.xdp_generic) << 2
            | u32::from(r.frags_lazy) << 3
            | u32::from(r.tx_metadata) << 4,
        r.tx_budget,
    ] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v
}

pub fn decode_attach_reply(b: &[u8]) -> Result<AttachReply, String> {
    let w = |i: usize| u32_at(b, 8 + 4 * i).ok_or_else(|| "short attach answer".to_string());
    let flags = w(6)?;
    let r = AttachReply {
        slot: w(0)?,
        queues: w(1)?,
        geo: Geometry {
            rx_frames: w(2)?,
            tx_per_slot: w(3)?,
            slots: w(4)?,
            frame_size: w(5)?,
        },
        zero_copy: flags & 1 != 0,
        multi_buffer: flags & 2 != 0,
        xdp_generic: flags & 4 != 0,
        frags_lazy: flags & 8 != 0,
        tx_metadata: flags & 16 != 0,
        tx_budget: w(7)?,
    };
    r.geo.validate()?;
    if r.queues == 0
        || r.queues as usize * ATTACH_FDS_PER_QUEUE + 1 > MAX_FDS
        || r.slot >= r.geo.slots
    {
        return Err(format!(
            "attach answer out of range (queues {}, slot {})",
            r.queues, r.slot
        ));
    }
    Ok(r)
}

pub fn encode_text(kind: u16, text: &str) -> Vec<u8> {
    let mut v = header(kind);
    v.extend_from_slice(text.as_bytes());
    v
}

/// Send one message with `fds` attached.
pub fn send(sock: BorrowedFd<'_>, msg: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    let n = rustix::net::sendmsg(sock, &[IoSlice::new(msg)], &mut anc, SendFlags::NOSIGNAL)?;
    if n != msg.len() {
        return Err(std::io::Error::other("short send on the control socket"));
    }
    Ok(())
}

/// One received message.
pub struct Received {
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
    /// The message or its descriptors did not fit (they were dropped).
    pub truncated: bool,
}

/// Receive one message (at most `max` bytes); `Ok(None)` at end of stream.
pub fn recv(
    sock: BorrowedFd<'_>,
    max: usize,
    dontwait: bool,
) -> rustix::io::Result<Option<Received>> {
    let mut buf = vec![0u8; max];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if dontwait {
        flags |= RecvFlags::DONTWAIT;
    }
    let r = rustix::net::recvmsg(sock, &mut [IoSliceMut::new(&mut buf)], &mut anc, flags)?;
    let mut fds = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if r.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    buf.truncate(r.bytes.min(max));
    Ok(Some(Received {
        bytes: buf,
        fds,
        truncated: r.flags.contains(ReturnFlags::TRUNC) || r.flags.contains(ReturnFlags::CTRUNC),
    }))
}

/// Borrow a list of owned descriptors.
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(|f| f.as_fd()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_garbage_is_named() {
        let a = encode_attach("nw-b0", 16384);
        assert_eq!(
            decode_request(&a),
            Ok(Request::Attach {
                iface: "nw-b0".into(),
                ring_depth: 16384
            })
        );
        let c = encode_claim(true, PROTO_UDP, Ipv4Addr::new(198, 18, 0, 2), 9000);
        assert_eq!(
            decode_request(&c),
            Ok(Request::Claim {
                proto: 17,
                addr: Ipv4Addr::new(198, 18, 0, 2),
                port: 9000,
                client_port: false,
            })
        );
        let ip = Ipv4Addr::new(198, 18, 0, 1);
        let cp = encode_claim_flags(true, PROTO_TCP, CLAIM_CLIENT_PORT, ip, 40001);
        assert_eq!(
            decode_request(&cp),
            Ok(Request::Claim {
                proto: 6,
                addr: ip,
                port: 40001,
                client_port: true,
            })
        );
        // Only TCP has client ports, and no other flag exists.
        let u = encode_claim_flags(true, PROTO_UDP, CLAIM_CLIENT_PORT, ip, 40001);
        assert_eq!(decode_request(&u), Err("bad_flags"));
        let x = encode_claim_flags(true, PROTO_TCP, 2, ip, 40001);
        assert_eq!(decode_request(&x), Err("bad_flags"));
        assert_eq!(decode_request(&encode_status()), Ok(Request::Status));
        assert_eq!(decode_request(&encode_stats_page()), Ok(Request::StatsPage));
        let a2 = Ipv4Addr::new(198, 18, 0, 2);
        assert_eq!(
            decode_request(&encode_tcp_group(true, a2, 8080)),
            Ok(Request::TcpJoin {
                addr: a2,
                port: 8080
            })
        );
        assert_eq!(
            decode_request(&encode_tcp_group(false, a2, 8080)),
            Ok(Request::TcpIdle {
                addr: a2,
                port: 8080
            })
        );
        let mut u = encode_tcp_group(true, a2, 8080);
        u[8] = PROTO_UDP;
        assert_eq!(decode_request(&u), Err("bad_protocol"));
        let (l, r) = (
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 5001),
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 40000),
        );
        let f = encode_tcp_flow(Some(TcpFlow::Flow), l, r);
        assert_eq!(
            decode_request(&f),
            Ok(Request::TcpFlow {
                what: TcpFlow::Flow,
                local: l,
                remote: r
            })
        );
        assert_eq!(
            decode_request(&encode_tcp_flow(None, l, r)),
            Ok(Request::TcpUnflow {
                local: l,
                remote: r
            })
        );
        let mut w = f.clone();
        w[8] = 9;
        assert_eq!(decode_request(&w), Err("bad_flow_kind"));
        for take in [false, true] {
            assert_eq!(
                decode_request(&encode_tcp_move(take, l, r)),
                Ok(Request::TcpMove {
                    take,
                    local: l,
                    remote: r
                })
            );
        }
        let mut m = encode_tcp_move(true, l, r);
        m[8] = 3;
        assert_eq!(decode_request(&m), Err("bad_move_kind"));
        m.push(0);
        assert_eq!(decode_request(&m), Err("bad_length"));
        let mut z = f;
        z[16] = 0;
        z[17] = 0;
        assert_eq!(decode_request(&z), Err("bad_port"));
        assert_eq!(decode_request(b"hello"), Err("short_message"));
        assert_eq!(decode_request(&[0xffu8; 64]), Err("bad_magic"));
        assert_eq!(decode_request(&encode_frags()), Ok(Request::Frags));
        let mut fl = encode_frags();
        fl.push(0);
        assert_eq!(decode_request(&fl), Err("bad_length"));
        let mut k = encode_status();
        k[4] = 99;
        assert_eq!(decode_request(&k), Err("unknown_kind"));
        let mut l = c.clone();
        l.push(0);
        assert_eq!(decode_request(&l), Err("bad_length"));
        let mut p = c.clone();
        p[8] = 1;
        assert_eq!(decode_request(&p), Err("bad_protocol"));
        let mut n = a.clone();
        n[8..24].fill(b'a');
        assert_eq!(decode_request(&n), Err("bad_iface_name"));
        let mut s = a;
        s[8] = b'/';
        assert_eq!(decode_request(&s), Err("bad_iface_name"));
    }

    #[test]
    fn attach_answers_are_validated() {
        let r = AttachReply {
            slot: 3,
            queues: 1,
            geo: Geometry {
                rx_frames: 16384,
                tx_per_slot: 256,
                slots: 16,
                frame_size: 2048,
            },
            zero_copy: false,
            multi_buffer: true,
            xdp_generic: true,
            tx_budget: 256,
            frags_lazy: true,
            tx_metadata: true,
        };
        assert_eq!(decode_attach_reply(&encode_attach_reply(&r)), Ok(r));
        let bad = AttachReply { slot: 16, ..r };
        assert!(decode_attach_reply(&encode_attach_reply(&bad)).is_err());
        assert!(decode_attach_reply(&header(K_OK)).is_err());
    }
}
