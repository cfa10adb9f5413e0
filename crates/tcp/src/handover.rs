//! Handing a connection over to another TCP implementation (the kernel's,
//! through TCP_REPAIR): everything the new owner needs to carry on as if it
//! had been the connection all along, taken from an ESTABLISHED connection
//! that the stack then forgets without sending anything.
//!
//! Segments of a handed-over 4-tuple that still reach the stack (they were
//! on the receive ring before the steering changed) are dropped and counted
//! (`handover_drops`), never answered with a RST: the peer retransmits them
//! to the new owner.

use crate::conn::{Conn, State};
use crate::stack::{ConnId, TcpStack};
use crate::{Error, FourTuple};

/// How long segments of a handed-over 4-tuple are recognised and dropped
/// (rather than answered as segments for nobody).
const REMEMBER_NS: u64 = 10_000_000_000;
/// The most handed-over 4-tuples remembered at once.
const REMEMBER_MAX: usize = 4096;

/// The state of a connection at the hand-over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    pub tuple: FourTuple,
    /// First unacknowledged sequence number: `send` starts here.
    pub snd_una: u32,
    /// Bytes from `snd_una`: first the `sent` bytes in flight
    /// (`snd_una..snd_nxt`), then the ones never sent.
    pub send: Vec<u8>,
    pub sent: usize,
    /// Next sequence number expected: `recv` (read by nobody yet) ends
    /// here. With `peer_fin`, the peer's FIN is at `rcv_nxt` (not counted).
    pub rcv_nxt: u32,
    pub recv: Vec<u8>,
    /// The peer's MSS (what it announced, before timestamp room).
    pub mss: u32,
    /// Window scaling (None without): (the peer's shift, ours).
    pub wscale: Option<(u8, u8)>,
    pub sack: bool,
    /// Our timestamp clock now (TSval of a segment sent now), with
    /// timestamps on.
    pub tsval: Option<u32>,
    /// Send window: the segment that last updated it, its size, the largest seen.
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_snd_wnd: u32,
    /// Receive window advertised (bytes from `rcv_nxt`).
    pub rcv_wnd: u32,
    pub nodelay: bool,
    /// The peer's FIN was received (CLOSE-WAIT): the new owner must learn
    /// it too, from [`Handover::peer_fin_packet`].
    pub peer_fin: bool,
    /// The peer's latest TSval (for the FIN the new owner is given).
    pub ts_recent: u32,
    /// SO_REUSEADDR of the kernel socket (`SocketOptions::reuseaddr`): the
    /// new owner sets it again after repair mode, which clears it.
    pub reuseaddr: bool,
    /// What only another engine takes over ([`TcpStack::adopt_state`]; the
    /// kernel's TCP_REPAIR has no place for it).
    pub engine: EngineState,
}

/// The part of a connection's state an engine keeps beyond what TCP_REPAIR
/// carries: the RTT estimate, the congestion window, the buffer sizes and
/// the socket options, so a connection moved between engines goes on at
/// the pace it had.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineState {
    /// Smoothed RTT, its variation and the retransmission timeout (ns).
    pub srtt: u64,
    pub rttvar: u64,
    pub rto: u64,
    pub cwnd: u32,
    pub ssthresh: u32,
    /// SO_SNDBUF / SO_RCVBUF (the rings' sizes) and autotuning's limit.
    pub sndbuf: usize,
    pub rcvbuf: usize,
    pub rcvbuf_max: usize,
    pub keepalive: Option<(u64, u64, u32)>,
    pub ttl: u8,
    pub tos: u8,
    pub linger0: bool,
}

/// Bytes of [`Handover::to_bytes`] before the two queues.
const WIRE_HEAD: usize = 4 + 12 + 4 * 8 + 8 * 7 + 4 * 3 + 8 + 4 * 5;
/// Flags of the encoded form.
const F_WSCALE: u8 = 1;
const F_SACK: u8 = 2;
const F_TS: u8 = 4;
const F_NODELAY: u8 = 8;
const F_PEER_FIN: u8 = 16;
const F_REUSEADDR: u8 = 32;
const F_KEEPALIVE: u8 = 64;
const F_LINGER0: u8 = 128;
/// Leads the encoded form (and says its version).
const WIRE_MAGIC: u32 = 0x6e77_6801;

impl Handover {
    /// The state as bytes (little-endian, fixed head, then the send and the
    /// receive queue): what one process writes into shared memory for
    /// another to adopt ([`Handover::from_bytes`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let e = &self.engine;
        let mut b = Vec::with_capacity(WIRE_HEAD + self.send.len() + self.recv.len());
        b.extend_from_slice(&WIRE_MAGIC.to_le_bytes());
        for a in [self.tuple.local, self.tuple.remote] {
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&a.port().to_le_bytes());
        }
        let (ws_peer, ws_ours) = self.wscale.unwrap_or((0, 0));
        let ka = e.keepalive.unwrap_or((0, 0, 0));
        for v in [
            self.snd_una,
            self.rcv_nxt,
            self.mss,
            self.tsval.unwrap_or(0),
            self.snd_wl1,
            self.snd_wnd,
            self.max_snd_wnd,
            self.rcv_wnd,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [e.srtt, e.rttvar, e.rto, ka.0, ka.1, e.rcvbuf_max as u64] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(self.sent as u64).to_le_bytes());
        for v in [self.ts_recent, e.cwnd, e.ssthresh] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let flag = |on: bool, f: u8| if on { f } else { 0 };
        b.extend_from_slice(&[
            flag(self.wscale.is_some(), F_WSCALE)
                | flag(self.sack, F_SACK)
                | flag(self.tsval.is_some(), F_TS)
                | flag(self.nodelay, F_NODELAY)
                | flag(self.peer_fin, F_PEER_FIN)
                | flag(self.reuseaddr, F_REUSEADDR)
                | flag(e.keepalive.is_some(), F_KEEPALIVE)
                | flag(e.linger0, F_LINGER0),
            ws_peer,
            ws_ours,
            e.ttl,
            e.tos,
            0,
            0,
            0,
        ]);
        b.extend_from_slice(&ka.2.to_le_bytes());
        b.extend_from_slice(&(self.send.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.recv.len() as u32).to_le_bytes());
        b.extend_from_slice(&(e.sndbuf as u32).to_le_bytes());
        b.extend_from_slice(&(e.rcvbuf as u32).to_le_bytes());
        debug_assert_eq!(b.len(), WIRE_HEAD);
        b.extend_from_slice(&self.send);
        b.extend_from_slice(&self.recv);
        b
    }

    /// [`Handover::to_bytes`] read back; None if `b` is not one (another
    /// version, cut short, or inconsistent).
    pub fn from_bytes(b: &[u8]) -> Option<Handover> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = b.get(at..at + n)?;
            at += n;
            Some(s)
        };
        let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap_or([0; 4]));
        let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]));
        if u32_(take(4)?) != WIRE_MAGIC {
            return None;
        }
        let mut addr = || -> Option<std::net::SocketAddrV4> {
            let ip: [u8; 4] = take(4)?.try_into().ok()?;
            let port = u16::from_le_bytes(take(2)?.try_into().ok()?);
            Some(std::net::SocketAddrV4::new(ip.into(), port))
        };
        let tuple = FourTuple {
            local: addr()?,
            remote: addr()?,
        };
        let mut w = [0u32; 8];
        for v in &mut w {
            *v = u32_(take(4)?);
        }
        let mut d = [0u64; 7];
        for v in &mut d {
            *v = u64_(take(8)?);
        }
        let mut t = [0u32; 3];
        for v in &mut t {
            *v = u32_(take(4)?);
        }
        let f: [u8; 8] = take(8)?.try_into().ok()?;
        let mut l = [0u32; 5];
        for v in &mut l {
            *v = u32_(take(4)?);
        }
        let send = take(l[1] as usize)?.to_vec();
        let recv = take(l[2] as usize)?.to_vec();
        let sent = d[6] as usize;
        if sent > send.len() {
            return None;
        }
        let on = |x: u8| f[0] & x != 0;
        Some(Handover {
            tuple,
            snd_una: w[0],
            send,
            sent,
            rcv_nxt: w[1],
            recv,
            mss: w[2],
            wscale: on(F_WSCALE).then_some((f[1], f[2])),
            sack: on(F_SACK),
            tsval: on(F_TS).then_some(w[3]),
            snd_wl1: w[4],
            snd_wnd: w[5],
            max_snd_wnd: w[6],
            rcv_wnd: w[7],
            nodelay: on(F_NODELAY),
            peer_fin: on(F_PEER_FIN),
            ts_recent: t[0],
            reuseaddr: on(F_REUSEADDR),
            engine: EngineState {
                srtt: d[0],
                rttvar: d[1],
                rto: d[2],
                cwnd: t[1],
                ssthresh: t[2],
                sndbuf: l[3] as usize,
                rcvbuf: l[4] as usize,
                rcvbuf_max: d[5] as usize,
                keepalive: on(F_KEEPALIVE).then_some((d[3], d[4], l[0])),
                ttl: f[3],
                tos: f[4],
                linger0: on(F_LINGER0),
            },
        })
    }

    /// The peer's FIN as an IPv4 packet from the peer to us, for a new owner
    /// that cannot be told of it otherwise (TCP_REPAIR has no FIN): sequence
    /// `rcv_nxt`, acknowledging `snd_una`, with the peer's last TSval.
    pub fn peer_fin_packet(&self) -> Vec<u8> {
        peer_fin_packet(
            &self.tuple,
            self.rcv_nxt,
            self.snd_una,
            self.tsval.map(|_| self.ts_recent),
        )
    }
}

/// The peer's FIN of connection `tuple` as an IPv4 packet from the peer to
/// us (TCP_REPAIR has no FIN: a kernel socket taking a connection in
/// CLOSE-WAIT over is shown this instead): sequence `rcv_nxt` (the FIN's),
/// acknowledging `snd_una`, with the peer's last TSval `ts_recent` when
/// timestamps are on.
pub fn peer_fin_packet(
    tuple: &FourTuple,
    rcv_nxt: u32,
    snd_una: u32,
    ts_recent: Option<u32>,
) -> Vec<u8> {
    peer_packet(tuple, rcv_nxt, snd_una, ts_recent, true)
}

/// [`peer_fin_packet`], or (`fin` false) the peer's bare ACK of `snd_una`
/// at `rcv_nxt`: a kernel socket taking a TIME-WAIT over is shown the
/// peer's ACK of our FIN with it (`xdp::service::conns::time_wait_take`).
pub fn peer_packet(
    tuple: &FourTuple,
    rcv_nxt: u32,
    snd_una: u32,
    ts_recent: Option<u32>,
    fin: bool,
) -> Vec<u8> {
    use nanowire_wire::ipv4::{HEADER_LEN, Ipv4Repr, PROTO_TCP};
    use nanowire_wire::tcp::{Flags, TcpRepr};
    let t = TcpRepr {
        src_port: tuple.remote.port(),
        dst_port: tuple.local.port(),
        seq: rcv_nxt,
        ack: snd_una,
        flags: Flags(if fin {
            Flags::FIN | Flags::ACK
        } else {
            Flags::ACK
        }),
        window: 65535,
        timestamp: ts_recent.map(|r| (r, 0)),
        ..TcpRepr::default()
    };
    let mut b = vec![0u8; HEADER_LEN + 60];
    let n = t.emit(
        &mut b[HEADER_LEN..],
        0,
        *tuple.remote.ip(),
        *tuple.local.ip(),
    );
    Ipv4Repr {
        src: *tuple.remote.ip(),
        dst: *tuple.local.ip(),
        protocol: PROTO_TCP,
        payload_len: n,
        ttl: 64,
        ident: 0,
    }
    .emit(&mut b);
    b.truncate(HEADER_LEN + n);
    b
}

impl TcpStack {
    /// What another owner needs to take connection `c` over. Only an
    /// ESTABLISHED connection, or one in CLOSE-WAIT (the peer's FIN in), that
    /// has sent no FIN can be handed over (`Err(NotConnected)` otherwise). Nothing changes until
    /// [`TcpStack::hand_over_done`].
    pub fn hand_over_state(&mut self, now: u64, c: ConnId) -> Result<Handover, Error> {
        let k = self.conn_mut(c)?;
        // ESTABLISHED, or CLOSE-WAIT (the peer's FIN in, none from us).
        let peer_fin = match k.state {
            State::Established if !k.rx_fin => false,
            State::CloseWait if k.rx_fin => true,
            _ => return Err(Error::NotConnected),
        };
        if k.fin_queued || k.ooo_fin.is_some() {
            return Err(Error::NotConnected);
        }
        let mut send = vec![0u8; k.tx.len()];
        k.tx.peek(0, &mut send);
        let mut recv = vec![0u8; k.rx.len()];
        k.rx.peek(0, &mut recv);
        let ts = if k.ts_ok { 12 } else { 0 };
        Ok(Handover {
            tuple: k.tuple,
            snd_una: k.tx_seq0,
            sent: (crate::seq::dist(k.snd_nxt, k.tx_seq0) as usize).min(send.len()),
            send,
            rcv_nxt: k.rcv_nxt.wrapping_sub(u32::from(peer_fin)),
            recv,
            mss: k.snd_mss + ts,
            wscale: k.ws_ok.then_some((k.snd_wscale, k.rcv_wscale)),
            sack: k.sack_ok,
            tsval: k
                .ts_ok
                .then(|| ((now / 1_000_000) as u32).wrapping_add(k.ts_offset)),
            snd_wl1: k.snd_wl1,
            snd_wnd: k.snd_wnd,
            max_snd_wnd: k.max_snd_wnd,
            rcv_wnd: crate::seq::dist(k.rcv_adv, k.rcv_nxt),
            nodelay: k.nodelay,
            peer_fin,
            ts_recent: k.ts_recent,
            reuseaddr: k.reuseaddr,
            engine: EngineState {
                srtt: k.srtt,
                rttvar: k.rttvar,
                rto: k.rto,
                cwnd: k.cc.cwnd,
                ssthresh: k.cc.ssthresh,
                sndbuf: k.sndbuf.max(k.tx.capacity()),
                rcvbuf: k.rcvbuf,
                rcvbuf_max: k.rcvbuf_max,
                keepalive: k.keepalive.then_some((k.ka_idle, k.ka_intvl, k.ka_cnt)),
                ttl: k.ip_ttl,
                tos: k.ip_tos,
                linger0: k.linger0,
            },
        })
    }

    /// Connection `c` now belongs to another owner: the stack sends nothing
    /// more for it (no FIN, no RST, no timers) and forgets it; segments of
    /// its 4-tuple that arrive later are dropped and counted.
    pub fn hand_over_done(&mut self, now: u64, c: ConnId) -> Result<(), Error> {
        let k = self.conn_mut(c)?;
        k.orphan = true;
        k.rst_pending = false;
        k.rst_reply = None;
        k.set_closed(None);
        let tuple = k.tuple;
        self.settle(c.idx);
        self.remember_handed(tuple, now);
        self.counters.handovers += 1;
        Ok(())
    }

    /// Segments of `tuple` that reach this stack for a while are another
    /// owner's: dropped and counted, never answered (a hand-over, or a
    /// take-over from the kernel that did not happen).
    pub fn remember_handed(&mut self, tuple: FourTuple, now: u64) {
        self.handed_over
            .retain(|&(_, t)| now.saturating_sub(t) < REMEMBER_NS);
        if self.handed_over.len() >= REMEMBER_MAX {
            self.handed_over.remove(0);
        }
        self.handed_over.push((tuple, now));
    }

    /// Take connection `h` over from another engine (the inverse of
    /// [`TcpStack::hand_over_state`] + [`TcpStack::hand_over_done`] there):
    /// ESTABLISHED (or CLOSE-WAIT with the peer's FIN) at the same sequence
    /// numbers, the unread bytes readable, the unacknowledged ones
    /// retransmitted by this stack's timer (a tail-loss probe or the RTO
    /// the exporter had) and the unsent ones sent, with the exporter's RTT
    /// estimate, congestion window, window scaling, SACK, timestamp clock,
    /// buffers and options. An ACK goes out at once (the window, and any
    /// acknowledgement the exporter still owed). Segments that reached
    /// neither owner during the move are the peer's to retransmit.
    pub fn adopt_state(&mut self, now: u64, h: &Handover) -> Result<ConnId, Error> {
        if self.demux.contains_key(&h.tuple) {
            return Err(Error::AddrInUse);
        }
        let e = &h.engine;
        let opts = crate::SocketOptions {
            sndbuf: e.sndbuf.max(h.send.len()).max(1),
            rcvbuf: e.rcvbuf.max(h.recv.len()).max(1),
            rcvbuf_max: e.rcvbuf_max,
            nodelay: h.nodelay,
            linger0: e.linger0,
            keepalive: e.keepalive,
            ttl: e.ttl,
            tos: e.tos,
            reuseaddr: h.reuseaddr,
        };
        let una = h.snd_una;
        let now_ms = (now / 1_000_000) as u32;
        let ts_offset = h.tsval.map_or(0, |v| v.wrapping_sub(now_ms));
        let mut k = Conn::blank(
            h.tuple,
            &self.cfg,
            &opts,
            una.wrapping_sub(1),
            ts_offset,
            now,
        );
        k.state = if h.peer_fin {
            State::CloseWait
        } else {
            State::Established
        };
        k.rx_fin = h.peer_fin;
        k.irs = h.rcv_nxt.wrapping_sub(h.recv.len() as u32 + 1);
        k.rcv_nxt = h.rcv_nxt.wrapping_add(u32::from(h.peer_fin));
        k.rcv_adv = k.rcv_nxt.wrapping_add(h.rcv_wnd);
        k.tx_seq0 = una;
        k.snd_una = una;
        k.snd_nxt = una.wrapping_add(h.sent as u32);
        k.snd_max = k.snd_nxt;
        k.rtx_next = una;
        k.recover = una;
        k.snd_wnd = h.snd_wnd;
        k.max_snd_wnd = h.max_snd_wnd;
        k.snd_wl1 = h.snd_wl1;
        k.snd_wl2 = una;
        k.ts_ok = h.tsval.is_some();
        k.ts_recent = h.ts_recent;
        // 0: not known (the kernel does not tell it): the first segment's.
        k.ts_unknown = k.ts_ok && h.ts_recent == 0;
        k.sack_ok = h.sack;
        k.ws_ok = h.wscale.is_some();
        (k.snd_wscale, k.rcv_wscale) = h.wscale.unwrap_or((0, 0));
        k.snd_mss = h.mss.saturating_sub(if k.ts_ok { 12 } else { 0 }).max(64);
        if e.cwnd > 0 {
            k.cc = crate::cc::NewReno::new(e.cwnd);
            k.cc.ssthresh = e.ssthresh;
        }
        if e.rto > 0 {
            (k.srtt, k.rttvar, k.rto) = (e.srtt, e.rttvar, e.rto);
        }
        k.alloc_buffers();
        let idx = self.insert(k)?;
        self.handed_over.retain(|(t, _)| *t != h.tuple);
        let cfg = &self.cfg;
        let k = self.slots[idx as usize].conn.as_mut().expect("inserted");
        k.tx.push(&h.send);
        k.rx.write_at(0, &h.recv);
        k.rx.commit(h.recv.len());
        if h.sent > 0 {
            k.arm_rtx(now, cfg);
        }
        k.ack_now = true;
        self.counters.adoptions += 1;
        self.settle(idx);
        Ok(self.id(idx))
    }

    /// A segment for no connection: true (dropped, counted) if its 4-tuple
    /// was handed over.
    pub(crate) fn handed_over_drop(&mut self, tuple: &FourTuple) -> bool {
        if self.handed_over.iter().any(|(t, _)| t == tuple) {
            self.counters.handover_drops += 1;
            return true;
        }
        false
    }
}
