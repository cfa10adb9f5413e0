//! Timers of one connection: retransmission (RFC 6298 with exponential
//! backoff), delayed ACK, persist (zero-window probes), keepalive
//! (RFC 1122 4.2.3.6, Linux's idle/intvl/cnt), TIME-WAIT and FIN-WAIT-2.

use crate::conn::{Conn, State};
use crate::{Config, Counters, Error};

impl Conn {
    fn keepalive_deadline(&self) -> Option<u64> {
        if !self.keepalive
            || !matches!(self.state, State::Established | State::CloseWait)
            || self.snd_una != self.snd_max
            || !self.tx.is_empty()
        {
            return None;
        }
        Some(if self.ka_probes == 0 {
            self.last_rx.max(self.ka_last).saturating_add(self.ka_idle)
        } else {
            self.ka_last.saturating_add(self.ka_intvl)
        })
    }

    /// Earliest instant at which `on_timer` has something to do.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        // Called on every settle: a plain min of the set deadlines (u64::MAX
        // is never a real one), not an iterator chain.
        let m = [
            self.rtx_deadline,
            self.delack_deadline,
            self.persist_deadline,
            self.state_deadline,
            self.keepalive_deadline(),
        ]
        .iter()
        .fold(u64::MAX, |m, d| m.min(d.unwrap_or(u64::MAX)));
        (m != u64::MAX).then_some(m)
    }

    pub(crate) fn on_timer(&mut self, now: u64, cfg: &Config, ctr: &mut Counters) {
        if self.state == State::Closed {
            return;
        }
        if self.state_deadline.is_some_and(|d| d <= now) {
            self.set_closed(None);
            return;
        }
        if self.delack_deadline.is_some_and(|d| d <= now) {
            self.delack_deadline = None;
            self.ack_now = true;
        }
        if self.rtx_deadline.is_some_and(|d| d <= now) && self.tlp_armed {
            // Tail-loss probe (RFC 8985 7.3): no ACK for 2·SRTT with data
            // out. Resend the last segment so that the receiver answers
            // (its ACK, or SACK, shows what is missing and fast recovery
            // repairs it) instead of waiting for the RTO. One per flight.
            self.rtx_deadline = None;
            self.tlp_armed = false;
            self.tlp_done = true;
            if self.snd_una != self.snd_max {
                let flight = crate::seq::dist(self.snd_max, self.snd_una);
                let last = self.snd_max.wrapping_sub(flight.min(self.snd_mss).max(1));
                // In recovery the cumulative ACK stalled at the first hole:
                // resend it (its retransmission was likely lost).
                self.rtx_once = Some(if self.in_recovery { self.snd_una } else { last });
                ctr.tail_loss_probes += 1;
                // The RTO stays armed behind the probe.
                self.rtx_deadline = Some(now.saturating_add(self.backed_off_rto(cfg)));
            }
        }
        if self.rtx_deadline.is_some_and(|d| d <= now) {
            self.rtx_deadline = None;
            self.on_rto(now, cfg, ctr);
            if self.state == State::Closed {
                return;
            }
        }
        if self.persist_deadline.is_some_and(|d| d <= now) {
            self.persist_deadline = None;
            if self.snd_wnd == 0 && self.snd_una == self.snd_max {
                self.probe_pending = true;
                ctr.zero_window_probes += 1;
                self.persist_backoff += 1;
                let d = self
                    .rto
                    .saturating_mul(1 << self.persist_backoff.min(20))
                    .min(cfg.rto_max_ns);
                self.persist_deadline = Some(now.saturating_add(d));
            } else {
                // A window-limited runt (sender SWS) is sent now.
                self.nodelay_once = true;
            }
        }
        if self.keepalive_deadline().is_some_and(|d| d <= now) {
            if self.ka_probes >= self.ka_cnt {
                ctr.keepalive_timeouts += 1;
                self.abort(Error::TimedOut);
                return;
            }
            self.ka_probes += 1;
            self.ka_last = now;
            self.probe_pending = true;
            ctr.keepalive_probes += 1;
        }
    }

    fn on_rto(&mut self, now: u64, cfg: &Config, ctr: &mut Counters) {
        ctr.rto_expirations += 1;
        match self.state {
            State::SynSent | State::SynReceived => {
                let limit = if self.state == State::SynSent {
                    cfg.syn_retries
                } else {
                    cfg.synack_retries
                };
                if self.backoff >= limit {
                    ctr.syn_timeouts += 1;
                    self.set_closed(Some(Error::TimedOut));
                    return;
                }
                self.backoff += 1;
                self.rtt_seq = None;
                self.syn_pending = true;
            }
            _ => {
                if self.snd_una == self.snd_max {
                    return;
                }
                if self.backoff >= cfg.retries {
                    ctr.retransmit_timeouts += 1;
                    self.set_closed(Some(Error::TimedOut));
                    return;
                }
                let flight = crate::seq::dist(self.snd_max, self.snd_una);
                self.cc.on_timeout(flight, self.snd_mss);
                self.in_recovery = false;
                self.sack_credit = 0;
                self.dupacks = 0;
                self.recover = self.snd_max;
                // RFC 2018 8: forget SACK information after a timeout.
                self.n_sacked = 0;
                self.rtx_once = None;
                self.rtt_seq = None;
                self.snd_nxt = self.snd_una;
                self.rtx_next = self.snd_una;
                self.backoff += 1;
            }
        }
        self.rtx_deadline = Some(now.saturating_add(self.backed_off_rto(cfg)));
        self.tlp_armed = false;
    }
}
