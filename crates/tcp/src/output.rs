//! Transmit: at most one segment per call, in priority order — RST, SYN or
//! SYN-ACK, a single retransmission (fast/SACK/partial ACK), new data and FIN
//! (within min(cwnd, snd_wnd), with Nagle and sender SWS avoidance), a
//! zero-window or keepalive probe, and finally a pure ACK.

use crate::conn::{Conn, State};
use crate::seq;
use crate::{Config, Counters};
use nanowire_wire::tcp::{Fixed, Flags, MAX_SACK_BLOCKS, TS_HEADER_LEN, TcpRepr, emit_ts_partial};

impl Conn {
    fn base_repr(&self, seq: u32, flags: u8) -> TcpRepr {
        TcpRepr {
            src_port: self.tuple.local.port(),
            dst_port: self.tuple.remote.port(),
            seq,
            ack: if flags & Flags::ACK != 0 {
                self.rcv_nxt
            } else {
                0
            },
            flags: Flags(flags),
            ..TcpRepr::default()
        }
    }

    fn tsval(&self, now: u64) -> u32 {
        ((now / 1_000_000) as u32).wrapping_add(self.ts_offset)
    }

    /// Window field for a non-SYN segment; updates the advertised edge.
    fn window_field(&mut self) -> u16 {
        let w = self.max_window() as u32;
        // Never shrink the window (RFC 9293 3.8.6.2.2).
        let w = w.max(seq::dist(self.rcv_adv, self.rcv_nxt));
        let field = (w >> self.rcv_wscale).min(65535);
        let edge = self.rcv_nxt.wrapping_add(field << self.rcv_wscale);
        if seq::gt(edge, self.rcv_adv) {
            self.rcv_adv = edge;
        }
        field as u16
    }

    /// Fill options and window, copy `len` bytes of `tx` from `tx_off`, write
    /// the segment into `buf`. Returns the segment length (0 if `buf` is too small).
    fn emit(
        &mut self,
        now: u64,
        buf: &mut [u8],
        mut r: TcpRepr,
        tx_off: usize,
        len: usize,
        ctr: &mut Counters,
    ) -> usize {
        if !r.flags.syn() {
            r.window = self.window_field();
            if self.ts_ok {
                r.timestamp = Some((self.tsval(now), self.ts_recent));
            }
            // A hole within its reorder grace is not announced yet.
            if self.sack_ok
                && r.flags.ack()
                && !self.asm.is_empty()
                && self.sack_hold.is_none_or(|t| now >= t)
            {
                self.sack_blocks(&mut r);
            }
        }
        // SACK blocks must not push a full segment past the MSS (Linux
        // shrinks the payload instead; we drop blocks from data segments —
        // pure ACKs carry them all).
        let base = 20 + if self.ts_ok { 12 } else { 0 } + self.snd_mss as usize;
        while r.sack_len > 0 && r.header_len() + len > base && len > 0 {
            r.sack_len -= 1;
        }
        let hl = r.header_len();
        if buf.len() < hl + len {
            ctr.tx_buffer_too_small += 1;
            return 0;
        }
        self.tx.peek(tx_off, &mut buf[hl..hl + len]);
        let (src, dst) = (*self.tuple.local.ip(), *self.tuple.remote.ip());
        let n = if self.csum_partial {
            r.emit_partial(buf, len, src, dst)
        } else {
            r.emit(buf, len, src, dst)
        };
        self.sent(now, r.flags, ctr);
        n
    }

    /// A synchronized connection's segment at `seq` with `flags` (ACK
    /// among them, not SYN): with timestamps and no SACK blocks to announce
    /// (an established connection's data and ACKs in the common case) the
    /// header is written straight from the connection (`emit_ts_partial`:
    /// no `TcpRepr` built and passed, no option walk, one length); else
    /// through [`Conn::emit`]. The same bytes either way.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn emit_synced(
        &mut self,
        now: u64,
        buf: &mut [u8],
        seq: u32,
        flags: u8,
        tx_off: usize,
        len: usize,
        ctr: &mut Counters,
    ) -> usize {
        debug_assert!(flags & Flags::ACK != 0 && flags & Flags::SYN == 0);
        if !self.ts_ok || (self.sack_ok && !self.asm.is_empty()) || buf.len() < TS_HEADER_LEN + len
        {
            return self.emit(now, buf, self.base_repr(seq, flags), tx_off, len, ctr);
        }
        let f = Fixed {
            ports: (self.tuple.local.port(), self.tuple.remote.port()),
            seq_ack: (seq, self.rcv_nxt),
            flags: Flags(flags),
            window: self.window_field(),
        };
        let ts = (self.tsval(now), self.ts_recent);
        let (h, payload) = buf.split_at_mut(TS_HEADER_LEN);
        self.tx.peek(tx_off, &mut payload[..len]);
        let (src, dst) = (*self.tuple.local.ip(), *self.tuple.remote.ip());
        let h = h.try_into().expect("a header's bytes");
        let n = emit_ts_partial(h, &f, ts, len, src, dst);
        if !self.csum_partial {
            nanowire_wire::tcp::fill_checksum(&mut buf[..n], src, dst);
        }
        self.sent(now, f.flags, ctr);
        n
    }

    /// What sending a segment with `flags` does to the connection and the
    /// counters.
    #[inline]
    fn sent(&mut self, now: u64, flags: Flags, ctr: &mut Counters) {
        if flags.ack() {
            self.ack_now = false;
            // A hole's grace still running: its ACK (with the SACK) is due
            // when the grace ends.
            self.delack_deadline = self.sack_hold.filter(|&t| now < t);
            self.rx_unacked = 0;
            self.ack_deferred = false;
        }
        if flags.rst() {
            ctr.rst_sent += 1;
        }
        ctr.segs_out += 1;
    }

    /// The SACK blocks announcing the receive holes (RFC 2018 4: the most
    /// recent block first): out of line, most segments have none.
    #[cold]
    fn sack_blocks(&self, r: &mut TcpRepr) {
        let ranges = self.asm.ranges();
        let recent = self.asm.recent();
        let max = r.max_sack_blocks().min(MAX_SACK_BLOCKS);
        let nxt = self.rcv_nxt;
        let mut n = 0;
        let order = std::iter::once(recent).chain((0..ranges.len()).filter(|&i| i != recent));
        for i in order {
            if n >= max {
                break;
            }
            let (a, b) = ranges[i];
            r.sack[n] = (nxt.wrapping_add(a), nxt.wrapping_add(b));
            n += 1;
        }
        r.sack_len = n as u8;
    }

    pub(crate) fn arm_rtx(&mut self, now: u64, cfg: &Config) {
        let (d, probe) = self.rtx_timer(cfg);
        let at = now.saturating_add(d);
        match self.rtx_deadline {
            None => {
                self.rtx_deadline = Some(at);
                self.tlp_armed = probe;
            }
            // A flight that grew past one segment gets the probe timeout
            // the first segment (RTO-length) did not.
            Some(cur) if probe && !self.tlp_armed && at < cur => {
                self.rtx_deadline = Some(at);
                self.tlp_armed = true;
            }
            Some(_) => {}
        }
    }

    /// Could [`Conn::poll_output`] write a segment now? Never false when it
    /// could: every branch of `poll_output` that emits is guarded by one of
    /// these conditions (a RST to send, a SYN, an ACK due, a duplicate ACK,
    /// a probe, a retransmission, unsent data or an unsent FIN). False
    /// lets the owner skip taking a transmit frame (and its lock) for a
    /// connection that was queued but has nothing to say: in a ping-pong,
    /// after every received segment (the ACK rides on the answer) and after
    /// every read. The only effects `poll_output` has without emitting
    /// (arming the persist timer, the idle cwnd restart) need unsent data,
    /// for which this is true. Unsent data is asked first: it is what makes
    /// the answer yes after a write (the settle of `send` and the transmit
    /// that follows), while a no asks every test whatever the order.
    #[inline]
    pub(crate) fn may_output(&self) -> bool {
        seq::lt(self.snd_nxt, self.fin_seq())
            || self.rst_reply.is_some()
            || self.rst_pending
            || self.ack_now
            || self.dup_acks_due > 0
            || self.probe_pending
            || self.rtx_once.is_some()
            || matches!(self.state, State::SynSent | State::SynReceived)
            || (self.in_recovery && self.sack_credit > 0)
            || (self.fin_queued && seq::le(self.snd_nxt, self.fin_seq()))
    }

    pub(crate) fn poll_output(
        &mut self,
        now: u64,
        cfg: &Config,
        buf: &mut [u8],
        ctr: &mut Counters,
    ) -> Option<usize> {
        // The rare cases (a RST, a handshake's SYN, a closed connection)
        // out of line: the common one is a synchronized connection's data
        // or ACK.
        if self.rst_reply.is_some()
            || self.rst_pending
            || matches!(
                self.state,
                State::Closed | State::SynSent | State::SynReceived
            )
        {
            return self.poll_output_rare(now, cfg, buf, ctr);
        }
        self.poll_output_synced(now, cfg, buf, ctr)
    }

    /// [`Conn::poll_output`] with a RST to send or not synchronized.
    #[cold]
    #[inline(never)]
    fn poll_output_rare(
        &mut self,
        now: u64,
        cfg: &Config,
        buf: &mut [u8],
        ctr: &mut Counters,
    ) -> Option<usize> {
        if let Some((s, a, with_ack)) = self.rst_reply.take() {
            let mut r = self.base_repr(s, Flags::RST | if with_ack { Flags::ACK } else { 0 });
            r.ack = a;
            return Some(self.emit(now, buf, r, 0, 0, ctr));
        }
        if self.rst_pending {
            self.rst_pending = false;
            let r = self.base_repr(self.snd_nxt, Flags::RST | Flags::ACK);
            return Some(self.emit(now, buf, r, 0, 0, ctr));
        }
        match self.state {
            State::Closed => return None,
            State::SynSent | State::SynReceived => {
                if !self.syn_pending {
                    return self.pure_ack(now, buf, ctr);
                }
                self.syn_pending = false;
                let passive = self.state == State::SynReceived;
                let mut r =
                    self.base_repr(self.iss, Flags::SYN | if passive { Flags::ACK } else { 0 });
                r.mss = Some(cfg.mss);
                r.window = self.rx_free().min(65535) as u16;
                if passive {
                    // Answer only what the peer offered (RFC 7323 1.3, 2018 2).
                    if self.ws_ok {
                        r.window_scale = Some(self.rcv_wscale);
                    }
                    r.sack_permitted = self.sack_ok;
                    if self.ts_ok {
                        r.timestamp = Some((self.tsval(now), self.ts_recent));
                    }
                    r.window = self.rcvbuf.min(65535) as u16;
                } else {
                    if cfg.window_scaling {
                        r.window_scale = Some(self.rcv_wscale);
                    }
                    r.sack_permitted = cfg.sack;
                    if cfg.timestamps {
                        r.timestamp = Some((self.tsval(now), 0));
                    }
                }
                if self.snd_max != self.iss {
                    self.total_retrans += 1;
                    ctr.retransmits += 1;
                } else if self.rtt_seq.is_none() {
                    self.rtt_seq = Some((self.iss.wrapping_add(1), now));
                }
                self.snd_nxt = self.iss.wrapping_add(1);
                self.snd_max = self.snd_nxt;
                self.arm_rtx(now, cfg);
                return Some(self.emit(now, buf, r, 0, 0, ctr));
            }
            _ => {}
        }
        self.poll_output_synced(now, cfg, buf, ctr)
    }

    /// [`Conn::poll_output`] of a synchronized connection: a
    /// retransmission, new data or FIN, a probe, an ACK.
    #[inline]
    fn poll_output_synced(
        &mut self,
        now: u64,
        cfg: &Config,
        buf: &mut [u8],
        ctr: &mut Counters,
    ) -> Option<usize> {
        if self.state.can_send() {
            if let Some(s) = self.rtx_once.take()
                && let Some(n) = self.retransmit_at(now, cfg, s, buf, ctr)
            {
                return Some(n);
            }
            while self.in_recovery && self.sack_credit > 0 {
                self.sack_credit -= 1;
                let Some(h) = self.next_hole(self.rtx_next) else {
                    self.sack_credit = 0;
                    break;
                };
                let end = seq::min(self.hole_end(h), h.wrapping_add(self.snd_mss));
                self.rtx_next = end;
                if let Some(n) = self.retransmit_at(now, cfg, h, buf, ctr) {
                    ctr.sack_retransmits += 1;
                    return Some(n);
                }
            }
            if let Some(n) = self.send_new(now, cfg, buf, ctr) {
                return Some(n);
            }
        }

        if self.probe_pending {
            self.probe_pending = false;
            let s = self.snd_una.wrapping_sub(1);
            return Some(self.emit_synced(now, buf, s, Flags::ACK, 0, 0, ctr));
        }
        self.pure_ack(now, buf, ctr)
    }

    fn pure_ack(&mut self, now: u64, buf: &mut [u8], ctr: &mut Counters) -> Option<usize> {
        if matches!(self.state, State::Closed | State::SynSent) {
            return None;
        }
        if !self.ack_now {
            if self.dup_acks_due == 0 {
                return None;
            }
            self.dup_acks_due -= 1;
        }
        let s = self.snd_nxt;
        Some(self.emit_synced(now, buf, s, Flags::ACK, 0, 0, ctr))
    }

    /// One segment at `s` (a retransmission), up to the next SACKed block.
    fn retransmit_at(
        &mut self,
        now: u64,
        cfg: &Config,
        s: u32,
        buf: &mut [u8],
        ctr: &mut Counters,
    ) -> Option<usize> {
        if seq::lt(s, self.snd_una) || seq::ge(s, self.snd_max) {
            return None;
        }
        let data_end = self.fin_seq();
        let limit = seq::min(self.hole_end(s), seq::min(self.snd_max, data_end));
        let len = seq::dist(limit, s).min(self.snd_mss) as usize;
        let fin = self.fin_queued
            && s.wrapping_add(len as u32) == data_end
            && seq::gt(self.snd_max, data_end);
        if len == 0 && !fin {
            return None;
        }
        let mut flags = Flags::ACK;
        if fin {
            flags |= Flags::FIN;
        }
        if len > 0 {
            flags |= Flags::PSH;
        }
        let off = seq::dist(s, self.tx_seq0) as usize;
        if let Some((t, _)) = self.rtt_seq
            && seq::gt(t, s)
        {
            self.rtt_seq = None;
        }
        self.total_retrans += 1;
        ctr.retransmits += 1;
        self.arm_rtx(now, cfg);
        Some(self.emit_synced(now, buf, s, flags, off, len, ctr))
    }

    fn send_new(
        &mut self,
        now: u64,
        cfg: &Config,
        buf: &mut [u8],
        ctr: &mut Counters,
    ) -> Option<usize> {
        let data_end = self.fin_seq();
        let unsent = seq::dist(data_end, self.snd_nxt);
        let inflight = self.flight();
        // Restart window after an idle period longer than the RTO (RFC 5681 4.1).
        if inflight == 0 && unsent > 0 && now.saturating_sub(self.last_tx) > self.rto {
            self.cc.cwnd = self.cc.cwnd.min(cfg.initial_cwnd * self.snd_mss);
        }
        let cwnd = self.cc.cwnd.saturating_add(self.lt_segments * self.snd_mss);
        let win = self.snd_wnd.min(cwnd);
        let usable = win.saturating_sub(inflight);
        let len = unsent.min(usable).min(self.snd_mss);
        let fin_due = self.fin_queued
            && seq::le(self.snd_nxt, data_end)
            && self.snd_nxt.wrapping_add(len) == data_end
            && matches!(
                self.state,
                State::FinWait1 | State::LastAck | State::Closing
            );
        let is_rtx = seq::lt(self.snd_nxt, self.snd_max);

        if len == 0 && !fin_due {
            if unsent > 0
                && self.snd_wnd == 0
                && self.rtx_deadline.is_none()
                && self.persist_deadline.is_none()
            {
                self.persist_deadline = Some(now.saturating_add(self.backed_off_rto(cfg)));
            }
            return None;
        }
        if len < self.snd_mss && !fin_due && !is_rtx && !self.nodelay_once {
            // Nagle (RFC 896 / 9293 3.8.6.2.1): hold a small segment while
            // data is unacknowledged, unless TCP_NODELAY.
            if len == unsent && !self.nodelay && inflight > 0 {
                return None;
            }
            // Sender SWS: a window-limited runt only if it is half the
            // largest window the peer offered.
            if len < unsent && len < self.max_snd_wnd / 2 {
                if self.rtx_deadline.is_none() && self.persist_deadline.is_none() {
                    self.persist_deadline = Some(now.saturating_add(self.backed_off_rto(cfg)));
                }
                return None;
            }
        }
        let mut flags = Flags::ACK;
        if len > 0 && len == unsent {
            flags |= Flags::PSH;
        }
        if fin_due {
            flags |= Flags::FIN;
        }
        let s = self.snd_nxt;
        let off = seq::dist(s, self.tx_seq0) as usize;
        let n = self.emit_synced(now, buf, s, flags, off, len as usize, ctr);
        if n == 0 {
            return Some(0);
        }
        self.nodelay_once = false;
        self.last_tx = now;
        let adv = len + u32::from(fin_due);
        self.snd_nxt = s.wrapping_add(adv);
        if is_rtx {
            self.total_retrans += 1;
            ctr.retransmits += 1;
        } else if self.rtt_seq.is_none() && len > 0 {
            self.rtt_seq = Some((self.snd_nxt, now));
        }
        if seq::gt(self.snd_nxt, self.snd_max) {
            self.snd_max = self.snd_nxt;
        }
        self.persist_deadline = None;
        self.arm_rtx(now, cfg);
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isn::Secret;
    use crate::{FourTuple, SocketOptions};
    use nanowire_wire::tcp::TcpSegment;
    use std::net::{Ipv4Addr, SocketAddrV4};

    /// An established connection accepted from a SYN offering `ts`, SACK
    /// and window scaling, with 3000 bytes queued to send.
    fn established(ts: bool, partial: bool) -> Conn {
        let cfg = Config {
            tx_checksum_partial: partial,
            ..Config::default()
        };
        let tuple = FourTuple {
            local: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 80),
            remote: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 40_000),
        };
        let syn = TcpRepr {
            seq: 7_000,
            flags: Flags(Flags::SYN),
            window: 65_535,
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamp: ts.then_some((123_456, 0)),
            ..TcpRepr::default()
        };
        let secret = Secret::from_bytes([3; 16]);
        let opts = SocketOptions::from_config(&cfg);
        let mut c = Conn::accept_syn(tuple, &syn, &cfg, &opts, &secret, 5_000_000_000);
        c.alloc_buffers();
        c.state = State::Established;
        c.snd_una = c.iss.wrapping_add(1);
        c.snd_nxt = c.snd_una;
        c.snd_max = c.snd_una;
        c.tx_seq0 = c.snd_una;
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 31 % 251) as u8).collect();
        assert_eq!(c.send(&data), Ok(3000));
        c
    }

    /// `emit_synced` (the header written from the connection) writes the
    /// bytes and leaves the connection and counters as `emit` of the
    /// connection's `TcpRepr` does: with and without timestamps, a receive
    /// hole (SACK blocks), a partial or full checksum, data or none, each
    /// segment kind a synchronized connection sends.
    #[test]
    fn a_header_from_the_connection_is_the_reprs() {
        for (ts, partial, hole) in [
            (true, true, false),
            (true, false, false),
            (false, true, false),
            (true, true, true),
        ] {
            let (mut a, mut b) = (established(ts, partial), established(ts, partial));
            if hole {
                for c in [&mut a, &mut b] {
                    c.asm.add(1000, 1500);
                }
            }
            let (mut ca, mut cb) = (Counters::default(), Counters::default());
            let flags = [Flags::ACK, Flags::ACK | Flags::PSH, Flags::ACK | Flags::FIN];
            for (i, &fl) in flags.iter().enumerate() {
                for (off, len) in [(0, 0), (0, 1), (100, 1448), (7, 333)] {
                    let now = 6_000_000_000 + (i as u64) * 1_234_567;
                    let s = a.snd_una.wrapping_add(off as u32);
                    let (mut fa, mut fb) = ([0u8; 1600], [0u8; 1600]);
                    let na = a.emit_synced(now, &mut fa, s, fl, off, len, &mut ca);
                    let r = b.base_repr(s, fl);
                    let nb = b.emit(now, &mut fb, r, off, len, &mut cb);
                    let what = format!("ts {ts} partial {partial} hole {hole} {fl:#x} {len}");
                    assert!(na > 0, "{what}");
                    assert_eq!(fa[..na], fb[..nb], "{what}");
                    assert_eq!(format!("{a:?}"), format!("{b:?}"), "{what}");
                    assert_eq!(format!("{ca:?}"), format!("{cb:?}"), "{what}");
                    // Parsed back: the fields the connection gave.
                    let seg = TcpSegment::new_checked(&fa[..na]).expect("a segment");
                    let p = TcpRepr::parse(&seg).expect("parses");
                    assert_eq!((p.seq, p.ack, p.flags.0), (s, a.rcv_nxt, fl), "{what}");
                    assert_eq!(p.timestamp.is_some(), ts, "{what}");
                }
            }
        }
    }
}
