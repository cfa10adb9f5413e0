//! Receive processing of one segment on one connection (RFC 9293 3.10.7,
//! with RFC 5961's blind-attack checks, RFC 7323 PAWS, RFC 2018 SACK, and
//! NewReno's duplicate-ACK logic).

use crate::conn::{Conn, SCOREBOARD, State};
use crate::payload::Payload;
use crate::seq;
use crate::stack::{HOLD_MIN, Intake};
use crate::{Config, Counters, Error};
use nanowire_probe::{self as probe, Mark};
use nanowire_wire::tcp::{Flags, TcpRepr};

impl Conn {
    pub(crate) fn input(
        &mut self,
        now: u64,
        cfg: &Config,
        r: &TcpRepr,
        payload: Payload<'_>,
        ctr: &mut Counters,
        to: Intake<'_, '_, '_>,
    ) {
        if self.predicted(r, payload.len()) {
            self.input_predicted(now, cfg, r, payload, ctr, to);
            return;
        }
        match self.state {
            State::Closed => {}
            State::SynSent => self.input_syn_sent(now, cfg, r, ctr),
            _ => self.input_synchronized(now, cfg, r, payload, ctr, to),
        }
    }

    /// Header prediction (Linux's `tcp_rcv_established` fast path): the
    /// next in-order segment of an established connection, with data that
    /// fits the window, only ACK (and PSH) set, no SACK blocks, a timestamp
    /// that passes PAWS, an ACK within what was sent, and nothing unusual
    /// on the connection (no holes, no recovery, no duplicate ACKs counted,
    /// no SACK scoreboard, not orphaned). Every check of the general path
    /// passes for such a segment and most of its branches are not taken:
    /// [`Conn::input_predicted`] does what the general path does for it,
    /// through the same helpers, without the checks (a ping-pong's every
    /// segment; the code the general path runs for it did not stay in a
    /// 32 KiB instruction cache with the rest of the message's path).
    #[inline]
    fn predicted(&self, r: &TcpRepr, len: usize) -> bool {
        self.state == State::Established
            && r.flags.0 & !Flags::PSH == Flags::ACK
            && r.seq == self.rcv_nxt
            && r.sack_len == 0
            && len > 0
            && len <= self.rx_free()
            && match r.timestamp {
                Some((val, _)) => !self.ts_ok || seq::ge(val, self.ts_recent),
                None => !self.ts_ok,
            }
            && seq::ge(r.ack, self.snd_una)
            && seq::le(r.ack, self.snd_max)
            && self.dupacks == 0
            && !self.in_recovery
            && self.n_sacked == 0
            && self.asm.is_empty()
            && self.ooo_fin.is_none()
            && !self.orphan
    }

    /// [`Conn::input_synchronized`] for a segment [`Conn::predicted`]
    /// accepts: the same steps in the same order (ACK, window, in-order
    /// data, the ACK policy), without the checks it passes.
    fn input_predicted(
        &mut self,
        now: u64,
        cfg: &Config,
        r: &TcpRepr,
        payload: Payload<'_>,
        ctr: &mut Counters,
        to: Intake<'_, '_, '_>,
    ) {
        self.last_rx = now;
        self.ka_probes = 0;
        if self.ts_ok
            && let Some((val, _)) = r.timestamp
        {
            self.ts_recent = val;
        }
        if seq::gt(r.ack, self.snd_una) {
            // ESTABLISHED: no FIN of ours to acknowledge, nothing closes.
            let closed = self.ack_new(now, cfg, r.ack, ctr);
            debug_assert!(!closed);
        }
        probe::mark(Mark::TcpAcked);
        self.window_update(r.seq, r.ack, u32::from(r.window) << self.snd_wscale);
        self.rcv_mss = self
            .rcv_mss
            .max(payload.len() as u32)
            .min(u32::from(cfg.mss));
        let len = payload.len();
        probe::mark(Mark::TcpWindow);
        self.take_in_order(now, payload, 0, len, false, ctr, to);
        probe::mark(Mark::TcpDataTaken);
        self.ack_policy(now, cfg, false);
    }

    fn input_syn_sent(&mut self, now: u64, cfg: &Config, r: &TcpRepr, ctr: &mut Counters) {
        let f = r.flags;
        if f.ack() && (seq::le(r.ack, self.iss) || seq::gt(r.ack, self.snd_max)) {
            // Not for our SYN: RST it (unless it is one), RFC 9293 3.10.7.3.
            if !f.rst() {
                ctr.out_of_window += 1;
                self.rst_reply = Some((r.ack, 0, false));
                // Most often the peer still holds an earlier connection
                // on this 4-tuple in TIME-WAIT (one a kernel socket of
                // this host made, whose ISN and timestamp clock we cannot
                // follow) and answered our SYN with its ACK. Our RST ends
                // that TIME-WAIT (RFC 1337 is off by default on Linux), so
                // the SYN goes again at once, once per connect, rather
                // than after the 1 s initial RTO.
                if !self.syn_rst_retry {
                    self.syn_rst_retry = true;
                    self.rtx_deadline = Some(now.saturating_add(1_000_000));
                }
            }
            return;
        }
        if f.rst() {
            if f.ack() {
                ctr.rst_received += 1;
                self.set_closed(Some(Error::ConnectionRefused));
            }
            return;
        }
        if !f.syn() {
            return;
        }
        self.irs = r.seq;
        self.rcv_nxt = r.seq.wrapping_add(1);
        self.negotiate(r, cfg);
        self.snd_wnd = u32::from(r.window); // never scaled in a SYN
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = r.seq;
        self.snd_wl2 = r.ack;
        self.last_rx = now;
        if f.ack() {
            self.snd_una = r.ack;
            if let Some((s, t)) = self.rtt_seq.take()
                && seq::ge(r.ack, s)
                && self.backoff == 0
            {
                self.rtt_sample(now.saturating_sub(t), cfg);
            }
            self.backoff = 0;
            self.rtx_deadline = None;
            self.state = State::Established;
            self.on_established();
            self.rcv_adv = self.rcv_nxt;
            self.ack_now = true;
        } else {
            // Simultaneous open.
            self.state = State::SynReceived;
            self.syn_pending = true;
            self.snd_nxt = self.iss;
        }
    }

    /// Whether a SYN (no ACK, no RST) to this connection in TIME-WAIT
    /// opens a new one on the 4-tuple, as Linux's
    /// `tcp_timewait_state_process`: not when its timestamp is older than
    /// the last one seen (PAWS), and then if it starts after everything
    /// received or, with timestamps, carries a newer one (RFC 6191: a new
    /// owner of the 4-tuple whose ISN clock differs still gets in).
    pub(crate) fn time_wait_takes_syn(&self, r: &TcpRepr) -> bool {
        let tsval = r
            .timestamp
            .filter(|_| self.ts_ok && !self.ts_unknown)
            .map(|(v, _)| v);
        if tsval.is_some_and(|v| seq::lt(v, self.ts_recent)) {
            return false;
        }
        seq::gt(r.seq, self.rcv_nxt) || tsval.is_some_and(|v| seq::gt(v, self.ts_recent))
    }

    /// RFC 9293 3.10.7.4 acceptability, Linux style: the segment must end at
    /// or after rcv_nxt and start no later than the right window edge.
    fn acceptable(&self, r: &TcpRepr, seg_len: u32) -> bool {
        let wnd = self.max_window() as u32;
        let wnd = wnd.max(seq::dist(self.rcv_adv, self.rcv_nxt));
        let end = r.seq.wrapping_add(seg_len);
        if seg_len == 0 {
            if wnd == 0 {
                return r.seq == self.rcv_nxt;
            }
            return seq::ge(r.seq, self.rcv_nxt) && seq::lt(r.seq, self.rcv_nxt.wrapping_add(wnd))
                || r.seq == self.rcv_nxt;
        }
        seq::gt(end, self.rcv_nxt) && seq::le(r.seq, self.rcv_nxt.wrapping_add(wnd))
    }

    fn input_synchronized(
        &mut self,
        now: u64,
        cfg: &Config,
        r: &TcpRepr,
        payload: Payload<'_>,
        ctr: &mut Counters,
        to: Intake<'_, '_, '_>,
    ) {
        let f = r.flags;
        let seg_len = payload.len() as u32 + u32::from(f.syn()) + u32::from(f.fin());

        // PAWS (RFC 7323 5.3): an old timestamp means an old duplicate.
        if self.ts_ok
            && !f.rst()
            && let Some((val, _)) = r.timestamp
            && seq::lt(val, self.ts_recent)
            && !self.ts_unknown
        {
            ctr.paws_rejected += 1;
            self.oow_ack(now, cfg, payload.is_empty() && !f.syn() && !f.fin(), ctr);
            return;
        }

        // Passive open: a retransmitted SYN gets the SYN-ACK again.
        if self.state == State::SynReceived && f.syn() && !f.ack() && r.seq == self.irs {
            self.syn_pending = true;
            return;
        }

        if !self.acceptable(r, seg_len) {
            if !f.rst() {
                ctr.out_of_window += 1;
                self.oow_ack(now, cfg, payload.is_empty() && !f.syn() && !f.fin(), ctr);
            }
            return;
        }

        // RST (RFC 5961 3.2): exact match resets, in-window gets a challenge.
        if f.rst() {
            ctr.rst_received += 1;
            if r.seq != self.rcv_nxt {
                ctr.challenge_acks += 1;
                self.oow_ack(now, cfg, true, ctr);
                return;
            }
            ctr.connections_reset += 1;
            let err = match self.state {
                State::SynReceived if self.listener.is_none() => Some(Error::ConnectionRefused),
                State::SynReceived => None,
                State::Closing | State::LastAck | State::TimeWait => None,
                _ => Some(Error::ConnectionReset),
            };
            self.set_closed(err);
            return;
        }

        // SYN in a synchronized state (RFC 5961 4.2): challenge ACK.
        if f.syn() {
            ctr.challenge_acks += 1;
            self.oow_ack(now, cfg, true, ctr);
            return;
        }

        if !f.ack() {
            return;
        }

        // Every acceptability test comes before any state update (issue 20,
        // finding 5): a blind segment at rcv_nxt with a forged ACK must not
        // move ts_recent (every later real segment would fail PAWS), the
        // windows, the keepalive clock or the scoreboard.
        if self.state == State::SynReceived
            && (seq::le(r.ack, self.snd_una) || seq::gt(r.ack, self.snd_max))
        {
            self.rst_reply = Some((r.ack, 0, false));
            return;
        }
        // ACK checks (RFC 5961 5.2): an ACK for data never sent, or older
        // than the peer's largest window (bounded by what was ever acked,
        // as Linux does), is dropped with a rate-limited challenge ACK.
        if seq::gt(r.ack, self.snd_max) {
            ctr.ack_too_new += 1;
            self.challenge_ack(now, cfg, ctr);
            return;
        }
        let max_back = u64::from(self.max_snd_wnd.max(1)).min(self.bytes_acked.max(1)) as u32;
        if seq::lt(r.ack, self.snd_una.wrapping_sub(max_back)) {
            ctr.ack_too_old += 1;
            self.challenge_ack(now, cfg, ctr);
            return;
        }

        // The segment is acceptable: from here on it may change state.
        self.last_rx = now;
        self.ka_probes = 0;

        // Timestamp to echo (RFC 7323 4.3): only from segments at the left edge.
        if self.ts_ok
            && let Some((val, _)) = r.timestamp
            && seq::le(r.seq, self.rcv_adv_ack())
        {
            self.ts_recent = val;
            self.ts_unknown = false;
        }

        if self.state == State::SynReceived {
            self.state = State::Established;
            self.on_established();
            self.rcv_adv = self
                .rcv_nxt
                .wrapping_add(self.max_window().min(65535) as u32);
        }

        self.process_ack(now, cfg, r, payload.len(), ctr);
        if self.state == State::Closed {
            return;
        }

        // Data.
        if !payload.is_empty() || f.fin() {
            if self.state.can_recv() {
                self.process_data(now, cfg, r, payload, ctr, to);
            } else if self.state == State::TimeWait && f.fin() {
                // Retransmitted FIN: ACK it again and restart the 2MSL wait.
                self.ack_now = true;
                self.state_deadline = Some(now.saturating_add(cfg.time_wait_ns));
            } else if !payload.is_empty() {
                ctr.data_after_fin += 1;
                self.ack_now = true;
            }
        }
    }

    /// Answer an unacceptable segment with an ACK, at most once per
    /// `invalid_ratelimit_ns` when it is a bare ACK, RST or SYN (Linux's
    /// tcp_oow_rate_limited; data segments are always answered: they are
    /// not part of an ACK loop).
    fn oow_ack(&mut self, now: u64, cfg: &Config, limited: bool, ctr: &mut Counters) {
        if limited
            && self.last_oow_ack != 0
            && now.saturating_sub(self.last_oow_ack) < cfg.invalid_ratelimit_ns
        {
            ctr.oow_acks_ratelimited += 1;
            return;
        }
        if limited {
            self.last_oow_ack = now.max(1);
        }
        self.ack_now = true;
    }

    /// An RFC 5961 challenge ACK, rate-limited like every other answer to
    /// an unacceptable segment (RFC 5961 7).
    fn challenge_ack(&mut self, now: u64, cfg: &Config, ctr: &mut Counters) {
        ctr.challenge_acks += 1;
        self.oow_ack(now, cfg, true, ctr);
    }

    /// What "Last.ACK.sent" means for RFC 7323 4.3: the rcv_nxt we acked.
    fn rcv_adv_ack(&self) -> u32 {
        self.rcv_nxt
    }

    fn process_ack(
        &mut self,
        now: u64,
        cfg: &Config,
        r: &TcpRepr,
        payload_len: usize,
        ctr: &mut Counters,
    ) {
        let ack = r.ack;
        let mss = self.snd_mss;
        let wnd = u32::from(r.window) << self.snd_wscale;

        if self.sack_ok && r.sack_len > 0 {
            for &(left, right) in r.sack_blocks() {
                if seq::gt(left, self.snd_una)
                    && seq::le(right, self.snd_max)
                    && seq::lt(left, right)
                {
                    self.sack_insert(left, right);
                }
            }
        }

        if seq::gt(ack, self.snd_una) {
            if self.ack_new(now, cfg, ack, ctr) {
                return;
            }
        } else if ack == self.snd_una
            && payload_len == 0
            && !r.flags.fin()
            // RFC 5681's duplicate has an unchanged window; a segment with
            // SACK blocks is a duplicate whatever its window (RFC 6675).
            && (wnd == self.snd_wnd || (self.sack_ok && r.sack_len > 0))
            && self.snd_max != self.snd_una
        {
            self.dupacks += 1;
            ctr.dup_acks += 1;
            if !self.in_recovery && self.dupacks <= 2 {
                // Limited transmit (RFC 3042): a new segment per duplicate
                // keeps the ACK clock going when the window is small.
                self.lt_segments = self.dupacks;
            }
            if self.in_recovery && self.dupacks > 3 {
                // Each further duplicate means a segment left the network:
                // fill a SACK hole if one is known, else inflate (RFC 5681 3.2.4).
                if self.sack_ok && self.next_hole(self.rtx_next).is_some() {
                    self.sack_credit += 1;
                } else {
                    self.cc.cwnd = self.cc.cwnd.saturating_add(mss);
                }
            }
        }
        // Enter fast recovery on the third duplicate ACK, or when SACK shows
        // three segments' worth above a hole (RFC 6675 DupThresh) — the
        // latter also works when ACKs were coalesced.
        let sacked: u32 = self.sacked[..self.n_sacked]
            .iter()
            .map(|&(a, b)| b.wrapping_sub(a))
            .sum();
        if !self.in_recovery
            && self.snd_max != self.snd_una
            && (self.dupacks >= 3 || sacked >= 3 * mss)
            && seq::ge(self.snd_una, self.recover)
            && !(self.snd_una == self.recover && self.dupacks < 3 && sacked < 3 * mss)
        {
            let una = self.snd_una;
            self.in_recovery = true;
            self.lt_segments = 0;
            self.recover = self.snd_max;
            let flight = seq::dist(self.snd_max, una);
            self.cc.enter_recovery(flight, mss);
            self.rtx_once = Some(una);
            self.rtx_next = una.wrapping_add(mss);
            ctr.fast_retransmits += 1;
            if let Some((s, _)) = self.rtt_seq
                && seq::gt(s, una)
            {
                self.rtt_seq = None;
            }
        }

        // Window update (RFC 9293 3.10.7.4, SND.WL1/WL2 rule).
        self.window_update(r.seq, ack, wnd);
    }

    /// An ACK of new data (`ack` after `snd_una`): the RTT sample, the send
    /// ring, the congestion window, the retransmission timer and, for an
    /// ACK of our FIN, the state. True if that closed the connection.
    #[inline]
    fn ack_new(&mut self, now: u64, cfg: &Config, ack: u32, ctr: &mut Counters) -> bool {
        let mss = self.snd_mss;
        let acked = ack.wrapping_sub(self.snd_una);
        let flight_before = seq::dist(self.snd_max, self.snd_una);
        if let Some((s, t)) = self.rtt_seq
            && seq::ge(ack, s)
        {
            self.rtt_seq = None;
            self.rtt_sample(now.saturating_sub(t), cfg);
        }
        let data_acked = (seq::dist(ack, self.tx_seq0) as usize).min(self.tx.len());
        let fin_was_queued_at = self.fin_seq();
        self.tx.consume(data_acked);
        if self.tx.is_empty() {
            // Everything sent was acknowledged (nothing is ever written
            // past the end of the send ring).
            self.tx.rewind();
        }
        self.tx_seq0 = self.tx_seq0.wrapping_add(data_acked as u32);
        let fin_acked = self.fin_queued && seq::gt(ack, fin_was_queued_at);
        self.snd_una = ack;
        if seq::lt(self.snd_nxt, ack) {
            self.snd_nxt = ack;
        }
        if seq::lt(self.rtx_next, ack) {
            self.rtx_next = ack;
        }
        self.sack_trim();
        self.bytes_acked += u64::from(acked);
        self.lt_segments = 0;
        self.backoff = 0;
        self.persist_backoff = 0;

        if self.in_recovery {
            self.recovery_ack(ack, acked, ctr);
        } else {
            self.dupacks = 0;
            // Grow only when the window was the limit (RFC 7661 spirit,
            // Linux's tcp_is_cwnd_limited): an application-limited
            // sender must not build a huge, unvalidated cwnd.
            if 2 * flight_before >= self.cc.cwnd {
                self.cc.on_ack(acked, mss);
            }
        }

        // New data acknowledged: a new flight may be probed again.
        self.tlp_done = false;
        self.rtx_deadline = if self.snd_una == self.snd_max {
            self.tlp_armed = false;
            None
        } else {
            let (d, probe) = self.rtx_timer(cfg);
            self.tlp_armed = probe;
            Some(now.saturating_add(d))
        };

        fin_acked && self.fin_acked(now, cfg)
    }

    /// [`Conn::ack_new`] during fast recovery: a full ACK ends it, a
    /// partial one retransmits the next hole.
    #[cold]
    fn recovery_ack(&mut self, ack: u32, acked: u32, ctr: &mut Counters) {
        let mss = self.snd_mss;
        if seq::ge(ack, self.recover) {
            self.in_recovery = false;
            self.sack_credit = 0;
            self.dupacks = 0;
            let flight = self.flight();
            self.cc.exit_recovery(flight, mss);
        } else {
            // Partial ACK (RFC 6582 3.2 step 4): retransmit the next
            // hole, deflate by the amount acked.
            self.rtx_once = Some(match self.next_hole(ack) {
                Some(h) => {
                    if h != ack {
                        ctr.sack_retransmits += 1;
                    }
                    h
                }
                None => ack,
            });
            self.cc.cwnd = self
                .cc
                .cwnd
                .saturating_sub(acked)
                .saturating_add(mss)
                .max(mss);
        }
    }

    /// Our FIN was acknowledged: the state moves on. True if closed.
    #[cold]
    fn fin_acked(&mut self, now: u64, cfg: &Config) -> bool {
        match self.state {
            State::FinWait1 => {
                self.state = State::FinWait2;
                if self.orphan {
                    self.state_deadline = Some(now.saturating_add(cfg.fin_timeout_ns));
                }
            }
            State::Closing => self.enter_time_wait(now, cfg),
            State::LastAck => {
                self.set_closed(None);
                return true;
            }
            _ => {}
        }
        false
    }

    /// The send window from a segment (RFC 9293 3.10.7.4, the SND.WL1/WL2
    /// rule): `wnd` is the segment's window, scaled.
    #[inline]
    fn window_update(&mut self, seq: u32, ack: u32, wnd: u32) {
        if seq::lt(self.snd_wl1, seq) || (self.snd_wl1 == seq && seq::le(self.snd_wl2, ack)) {
            self.snd_wnd = wnd;
            self.max_snd_wnd = self.max_snd_wnd.max(wnd);
            self.snd_wl1 = seq;
            self.snd_wl2 = ack;
            if wnd > 0 {
                self.persist_deadline = None;
            }
        }
    }

    fn process_data(
        &mut self,
        now: u64,
        cfg: &Config,
        r: &TcpRepr,
        payload: Payload<'_>,
        ctr: &mut Counters,
        to: Intake<'_, '_, '_>,
    ) {
        let mut s = r.seq;
        let mut data = payload;
        // Where `data` starts in the payload (what a held frame skips).
        let mut skip = 0usize;
        let fin_at = r.seq.wrapping_add(payload.len() as u32);
        let mut fin = r.flags.fin();

        if self.orphan && !data.is_empty() && seq::gt(fin_at, self.rcv_nxt) {
            // Data for an application that closed: Linux resets (RFC 2525 2.17).
            self.abort(Error::Aborted);
            return;
        }

        // Cut what was received already.
        if seq::lt(s, self.rcv_nxt) {
            let d = self.rcv_nxt.wrapping_sub(s) as usize;
            data = data.skip(d);
            skip += d.min(payload.len());
            s = self.rcv_nxt;
        }
        // Cut what does not fit the window.
        let off = s.wrapping_sub(self.rcv_nxt) as usize;
        let room = self.rx_free().saturating_sub(off);
        if data.len() > room {
            ctr.beyond_window_bytes += (data.len() - room) as u64;
            data = data.take(room);
            fin = false;
            // What does not fit is acknowledged at once with the window
            // (RFC 9293 3.10.7.4; Linux's tcp_data_queue sends a quick ACK
            // for data into a zero window): above all a zero-window probe
            // carrying a byte (BSD, macOS, Windows send those), which
            // unanswered leaves the sender waiting for a window update
            // that may have been lost.
            self.ack_now = true;
        }

        let had_holes = !self.asm.is_empty();
        if !data.is_empty() {
            // A GRO/LRO/GSO super-segment (several MSS in one, as generic XDP
            // or a receive offload hands them over) counts as full-sized
            // segments, not as one huge one: like Linux (tcp_measure_rcv_mss
            // clamps to the advertised MSS), the estimate never exceeds ours,
            // so such a segment is ACKed at once (two full segments' worth).
            self.rcv_mss = self.rcv_mss.max(data.len() as u32).min(u32::from(cfg.mss));
            if off == 0 {
                self.take_in_order(now, data, skip, payload.len(), had_holes, ctr, to);
            } else if self.asm.add(off as u32, (off + data.len()) as u32) {
                ctr.out_of_order += 1;
                self.rx.write_payload(off, &data);
                if !had_holes
                    && cfg.reorder_grace_ns > 0
                    && self.sack_ok
                    && data.len() > usize::from(cfg.mss)
                {
                    // A new hole behind a super-frame (GSO/GRO: several
                    // MSS in one): the one that fills it may only be late
                    // (`Config::reorder_grace_ns`). The ACK timer announces
                    // it if it is still open when the grace ends. Segments
                    // of an MSS (a sender counting duplicate ACKs for its
                    // limited transmit) are answered at once, as before.
                    let until = now.saturating_add(cfg.reorder_grace_ns);
                    self.sack_hold = Some(until);
                    self.delack_deadline =
                        Some(self.delack_deadline.map_or(until, |d| d.min(until)));
                } else if self.sack_hold.is_none_or(|t| now >= t) {
                    // One duplicate ACK per out-of-order segment, even when
                    // several arrive in one batch (the sender counts them).
                    if self.ack_now {
                        self.dup_acks_due = (self.dup_acks_due + 1).min(3);
                    }
                    self.ack_now = true;
                }
                self.quickack = self.quickack.max(super::conn::INITIAL_QUICKACKS);
            } else {
                ctr.ooo_dropped += 1;
                self.ack_now = true;
            }
        }

        // A FIN that moves ESTABLISHED to CLOSE-WAIT: its ACK is delayed
        // (below), as Linux's `tcp_fin` does (ping-pong mode): the
        // application most often closes at once, and its FIN carries it.
        let mut fin_delayed = false;
        if fin {
            if fin_at == self.rcv_nxt {
                fin_delayed =
                    !had_holes && matches!(self.state, State::Established | State::SynReceived);
                self.receive_fin(now, cfg);
            } else if seq::gt(fin_at, self.rcv_nxt) {
                self.ooo_fin = Some(fin_at);
                self.ack_now = true;
            }
        }
        if let Some(f) = self.ooo_fin
            && f == self.rcv_nxt
            && self.asm.is_empty()
        {
            // A FIN that waited for a hole: acknowledged at once.
            self.receive_fin(now, cfg);
            self.ack_now = true;
        }

        self.ack_policy(now, cfg, fin_delayed);
    }

    /// In-order data at `rcv_nxt` that fits the window (`data`, from byte
    /// `skip` of a payload of `payload_len`), no hole behind it unless
    /// `had_holes`: into a waiting reader's buffer (`to.read`), kept in its
    /// frame (`to.hold`) or written to the receive ring; `rcv_nxt` moves
    /// over it and over what became contiguous after it.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn take_in_order(
        &mut self,
        now: u64,
        mut data: Payload<'_>,
        mut skip: usize,
        payload_len: usize,
        had_holes: bool,
        ctr: &mut Counters,
        to: Intake<'_, '_, '_>,
    ) {
        let Intake { read, hold } = to;
        // A reader waits on this connection and has read all it
        // had: in-order bytes go straight into its buffer.
        if let Some(d) = read
            && self.rx.is_empty()
            && !had_holes
        {
            let k = data.len().min(d.buf.len() - d.filled);
            data.take(k).copy_to(&mut d.buf[d.filled..d.filled + k]);
            probe::mark(Mark::TcpCopied);
            d.filled += k;
            data = data.skip(k);
            skip += k;
            self.rcv_nxt = self.rcv_nxt.wrapping_add(k as u32);
            self.bytes_received += k as u64;
            self.rx_unacked += k as u32;
            self.rcv_copied += k as u64;
            ctr.rx_direct_bytes += k as u64;
            self.rcv_space_adjust(now);
            probe::mark(Mark::TcpSpace);
        }
        // The rest stays in its frame when the connection may
        // keep it (`Hold`): the application's read copies it once.
        let held = match hold {
            Some(h)
                if !had_holes
                    && data.len() >= HOLD_MIN
                    && h.len == payload_len
                    && self.rx.can_hold(h.truesize) =>
            {
                self.rx
                    .hold((h.keep)(), skip, skip + data.len(), h.truesize);
                h.kept = true;
                ctr.rx_held_bytes += data.len() as u64;
                true
            }
            Some(_) if data.len() >= HOLD_MIN => {
                ctr.rx_hold_declined += 1;
                false
            }
            _ => false,
        };
        let total = if held {
            // No holes: nothing more becomes contiguous.
            self.asm.advance(data.len() as u32)
        } else {
            self.rx.write_payload(0, &data);
            let total = self.asm.advance(data.len() as u32);
            self.rx.commit(total as usize);
            total
        };
        self.rcv_nxt = self.rcv_nxt.wrapping_add(total);
        self.bytes_received += u64::from(total);
        self.rx_unacked += total;
        if had_holes {
            if self.asm.is_empty() {
                // Filled (within the grace: never announced).
                self.sack_hold = None;
            }
            self.ack_now = true;
            // Linux enters quick-ack mode around a repaired loss: the
            // sender's window is small after recovery, and an ACK
            // delayed for a second segment that is not coming would
            // stall it for the whole delayed-ACK time per loss.
            self.quickack = self.quickack.max(super::conn::INITIAL_QUICKACKS);
        }
    }

    /// The ACK a segment's data owes (RFC 1122 4.2.3.2 / RFC 5681 4.2):
    /// at once in quick-ack mode or for every second full segment, else
    /// within the delayed-ACK time (also for a FIN that moved ESTABLISHED
    /// to CLOSE-WAIT: `fin_delayed`, ping-pong).
    #[inline]
    fn ack_policy(&mut self, now: u64, cfg: &Config, fin_delayed: bool) {
        if fin_delayed && !self.ack_now && self.delack_deadline.is_none() {
            self.delack_deadline = Some(now.saturating_add(cfg.delayed_ack_ns));
        }
        // Delayed ACK (RFC 1122 4.2.3.2 / RFC 5681 4.2): every second full
        // segment, at once in quick-ack mode (not with a FIN: ping-pong),
        // else within delayed_ack.
        if !self.ack_now && self.rx_unacked > 0 {
            if self.quickack > 0 && !fin_delayed {
                self.quickack -= 1;
                if cfg.quickack_defer_ns > 0
                    && !self.app_quickack
                    && self.rx_unacked < 2 * self.rcv_mss
                {
                    // The application's reply carries it (`quickack_defer_ns`).
                    let until = now.saturating_add(cfg.quickack_defer_ns);
                    self.delack_deadline =
                        Some(self.delack_deadline.map_or(until, |d| d.min(until)));
                    self.ack_deferred = true;
                } else {
                    self.ack_now = true;
                }
            } else if self.rx_unacked >= 2 * self.rcv_mss {
                self.ack_now = true;
            } else if self.delack_deadline.is_none() {
                self.delack_deadline = Some(now.saturating_add(cfg.delayed_ack_ns));
            }
        }
    }

    fn receive_fin(&mut self, now: u64, cfg: &Config) {
        self.rcv_nxt = self.rcv_nxt.wrapping_add(1);
        self.ooo_fin = None;
        self.rx_fin = true;
        match self.state {
            // The ACK waits (see `process_data`) unless something else
            // asked for one now.
            State::SynReceived | State::Established => self.state = State::CloseWait,
            State::FinWait1 => {
                self.ack_now = true;
                self.state = State::Closing;
            }
            State::FinWait2 => {
                self.ack_now = true;
                self.enter_time_wait(now, cfg);
            }
            _ => self.ack_now = true,
        }
    }

    fn sack_insert(&mut self, mut l: u32, mut r: u32) {
        // Merge with every overlapping/touching block, then insert sorted.
        let mut out = [(0u32, 0u32); SCOREBOARD];
        let mut n = 0;
        for &(a, b) in &self.sacked[..self.n_sacked] {
            if seq::le(a, r) && seq::ge(b, l) {
                l = seq::min(l, a);
                r = seq::max(r, b);
            } else {
                out[n] = (a, b);
                n += 1;
            }
        }
        // Insert keeping order; drop the highest block if full.
        let pos = out[..n]
            .iter()
            .position(|&(a, _)| seq::gt(a, l))
            .unwrap_or(n);
        if n == SCOREBOARD {
            if pos == n {
                return;
            }
            n -= 1;
        }
        out.copy_within(pos..n, pos + 1);
        out[pos] = (l, r);
        self.sacked = out;
        self.n_sacked = n + 1;
    }

    fn sack_trim(&mut self) {
        let una = self.snd_una;
        let mut n = 0;
        for i in 0..self.n_sacked {
            let (a, b) = self.sacked[i];
            if seq::gt(b, una) {
                self.sacked[n] = (seq::max(a, una), b);
                n += 1;
            }
        }
        self.n_sacked = n;
    }

    /// First unSACKed sequence ≥ `from` that lies below a SACKed block.
    pub(crate) fn next_hole(&self, from: u32) -> Option<u32> {
        let mut p = seq::max(from, self.snd_una);
        for &(a, b) in &self.sacked[..self.n_sacked] {
            if seq::lt(p, a) {
                return Some(p);
            }
            p = seq::max(p, b);
        }
        None
    }

    /// End of the SACKed block starting at or containing `s`, or the start of
    /// the next one (the hole `[s, ret)` is what to retransmit).
    pub(crate) fn hole_end(&self, s: u32) -> u32 {
        for &(a, _) in &self.sacked[..self.n_sacked] {
            if seq::gt(a, s) {
                return a;
            }
        }
        self.snd_max
    }
}
