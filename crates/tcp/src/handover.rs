//! Handing a connection over to another TCP implementation (the kernel's,
//! through TCP_REPAIR): everything the new owner needs to carry on as if it
//! had been the connection all along, taken from an ESTABLISHED connection
//! that the stack then forgets without sending anything.
//!
//! Segments of a handed-over 4-tuple that still reach the stack (they were
//! on the receive ring before the steering changed) are dropped and counted
//! (`handover_drops`), never answered with a RST: the peer retransmits them
//! to the new owner.

use crate::conn::State;
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
}

impl Handover {
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
        self.handed_over
            .retain(|&(_, t)| now.saturating_sub(t) < REMEMBER_NS);
        if self.handed_over.len() >= REMEMBER_MAX {
            self.handed_over.remove(0);
        }
        self.handed_over.push((tuple, now));
        self.counters.handovers += 1;
        Ok(())
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
