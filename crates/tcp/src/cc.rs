//! Congestion control: Reno/NewReno (RFC 5681, RFC 6582) with appropriate
//! byte counting (RFC 3465, L = 2) in slow start.

#[derive(Debug, Clone)]
pub struct NewReno {
    pub cwnd: u32,
    pub ssthresh: u32,
    /// Bytes acknowledged in congestion avoidance since cwnd last grew.
    acked_ca: u32,
}

impl NewReno {
    pub fn new(initial_cwnd: u32) -> NewReno {
        NewReno {
            cwnd: initial_cwnd,
            ssthresh: u32::MAX,
            acked_ca: 0,
        }
    }

    /// New data acknowledged outside recovery.
    pub fn on_ack(&mut self, acked: u32, mss: u32) {
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(acked.min(2 * mss));
        } else {
            self.acked_ca = self.acked_ca.saturating_add(acked);
            if self.acked_ca >= self.cwnd {
                self.acked_ca -= self.cwnd;
                self.cwnd = self.cwnd.saturating_add(mss);
            }
        }
    }

    /// Third duplicate ACK: halve (RFC 5681 eq. 4) and inflate by 3 segments.
    pub fn enter_recovery(&mut self, flight: u32, mss: u32) {
        self.ssthresh = (flight / 2).max(2 * mss);
        self.cwnd = self.ssthresh + 3 * mss;
    }

    /// Full ACK ends recovery (RFC 6582 3.2 step 3, option 1 with the
    /// flight-size bound of Linux).
    pub fn exit_recovery(&mut self, flight: u32, mss: u32) {
        self.cwnd = self.ssthresh.min(flight.max(mss) + mss);
        self.acked_ca = 0;
    }

    /// Retransmission timeout: loss window of one segment (RFC 5681 eq. 4 + 3.1).
    pub fn on_timeout(&mut self, flight: u32, mss: u32) {
        self.ssthresh = (flight / 2).max(2 * mss);
        self.cwnd = mss;
        self.acked_ca = 0;
    }
}
