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
    /// Next sequence number expected: `recv` (read by nobody yet) ends here.
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
}

impl TcpStack {
    /// What another owner needs to take connection `c` over. Only an
    /// ESTABLISHED connection with no FIN sent or received can be handed
    /// over (`Err(NotConnected)` otherwise). Nothing changes until
    /// [`TcpStack::hand_over_done`].
    pub fn hand_over_state(&mut self, now: u64, c: ConnId) -> Result<Handover, Error> {
        let k = self.conn_mut(c)?;
        if k.state != State::Established || k.fin_queued || k.rx_fin || k.ooo_fin.is_some() {
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
            rcv_nxt: k.rcv_nxt,
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
