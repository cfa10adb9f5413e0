//! The transmission control block: state, constructors, and the operations
//! an application performs on it (send, recv, shutdown, close, options).
//! Receive processing is in `input.rs`, transmit in `output.rs`, timers in
//! `timer.rs`.

use crate::buffer::{Assembler, Ring, RxQueue};
use crate::cc::NewReno;
use crate::isn::Secret;
use crate::seq;
use crate::{Config, Error, FourTuple, SocketOptions, TcpInfo, ready};
use nanowire_wire::tcp::TcpRepr;

/// RFC 9293 connection states (LISTEN lives in the stack's listeners).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    SynSent,
    SynReceived,
    Established,
    FinWait1,
    FinWait2,
    CloseWait,
    Closing,
    LastAck,
    TimeWait,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "CLOSED",
            State::SynSent => "SYN-SENT",
            State::SynReceived => "SYN-RECEIVED",
            State::Established => "ESTABLISHED",
            State::FinWait1 => "FIN-WAIT-1",
            State::FinWait2 => "FIN-WAIT-2",
            State::CloseWait => "CLOSE-WAIT",
            State::Closing => "CLOSING",
            State::LastAck => "LAST-ACK",
            State::TimeWait => "TIME-WAIT",
        }
    }
    /// After the handshake and before our FIN is acknowledged: data may be sent.
    pub(crate) fn can_send(self) -> bool {
        matches!(
            self,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::Closing
                | State::LastAck
        )
    }
    /// States that accept data from the peer.
    pub(crate) fn can_recv(self) -> bool {
        matches!(self, State::Established | State::FinWait1 | State::FinWait2)
    }
}

/// Most SACK scoreboard blocks remembered by the sender.
pub const SCOREBOARD: usize = 8;

#[derive(Debug)]
pub(crate) struct Conn {
    pub tuple: FourTuple,
    pub state: State,
    pub error: Option<Error>,
    /// Parent listener while half-open or waiting in the accept queue.
    pub listener: Option<u32>,
    /// The application closed its handle; the stack frees it when it dies.
    pub orphan: bool,
    /// Counted in the listener's half-open (SYN queue) total.
    pub half_open_counted: bool,
    pub in_accept_queue: bool,
    // --- send sequence space
    pub iss: u32,
    pub snd_una: u32,
    pub snd_nxt: u32,
    pub snd_max: u32,
    pub snd_wnd: u32,
    pub max_snd_wnd: u32,
    pub snd_wl1: u32,
    pub snd_wl2: u32,
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
    pub tx: Ring,
    /// Sequence number of `tx[0]`.
    pub tx_seq0: u32,
    pub fin_queued: bool,
    pub sndbuf: usize,
    // --- receive sequence space
    pub irs: u32,
    pub rcv_nxt: u32,
    pub rx: RxQueue,
    pub rcvbuf: usize,
    /// Autotuning's limit for `rcvbuf` (0: the application fixed it).
    pub rcvbuf_max: usize,
    /// Autotuning (Linux's rcvq_space): bytes the application read per RTT
    /// at the last measurement, bytes read in all, the count at the start
    /// of this measurement and when it started.
    pub rcv_space: u64,
    pub rcv_copied: u64,
    pub rcv_space_mark: u64,
    pub rcv_space_time: u64,
    pub asm: Assembler,
    /// A FIN seen beyond `rcv_nxt` (out of order).
    pub ooo_fin: Option<u32>,
    /// The peer's FIN was processed: reads return end of file once drained.
    pub rx_fin: bool,
    /// Right edge of the window last advertised.
    pub rcv_adv: u32,
    // --- options
    pub snd_mss: u32,
    pub rcv_mss: u32,
    pub ts_ok: bool,
    pub ws_ok: bool,
    pub ts_recent: u32,
    /// `ts_recent` is not known yet (a connection taken from the kernel,
    /// which does not tell it): no PAWS check until a segment sets it.
    pub ts_unknown: bool,
    pub ts_offset: u32,
    pub sack_ok: bool,
    pub sacked: [(u32, u32); SCOREBOARD],
    pub n_sacked: usize,
    /// Next hole to retransmit during SACK recovery.
    pub rtx_next: u32,
    // --- RTT / RTO (RFC 6298), nanoseconds
    pub srtt: u64,
    pub rttvar: u64,
    pub rto: u64,
    pub rtt_seq: Option<(u32, u64)>,
    pub backoff: u32,
    // --- timers (absolute deadlines)
    pub rtx_deadline: Option<u64>,
    /// `rtx_deadline` is a tail-loss probe timeout, not the RTO (RFC 8985 7).
    pub tlp_armed: bool,
    /// A probe went out for the current flight (reset by an ACK of new data).
    pub tlp_done: bool,
    pub delack_deadline: Option<u64>,
    pub persist_deadline: Option<u64>,
    pub persist_backoff: u32,
    /// TIME-WAIT expiry, or FIN-WAIT-2 timeout of an orphan.
    pub state_deadline: Option<u64>,
    pub keepalive: bool,
    pub ka_idle: u64,
    pub ka_intvl: u64,
    pub ka_cnt: u32,
    pub ka_probes: u32,
    pub ka_last: u64,
    pub last_rx: u64,
    /// Last time new data was sent (idle restart of cwnd).
    pub last_tx: u64,
    /// Last rate-limited out-of-window or challenge ACK.
    pub last_oow_ack: u64,
    // --- congestion control
    pub cc: NewReno,
    pub dupacks: u32,
    pub in_recovery: bool,
    /// Duplicate ACKs in recovery not yet spent on SACK hole retransmissions.
    pub sack_credit: u32,
    /// Segments beyond cwnd allowed by limited transmit (RFC 3042).
    pub lt_segments: u32,
    pub recover: u32,
    /// Segments are emitted with a partial checksum (`Config::tx_checksum_partial`).
    pub csum_partial: bool,
    // --- per-socket options
    pub nodelay: bool,
    pub quickack: u32,
    pub linger0: bool,
    /// IP_TTL / IP_TOS of this connection's segments.
    pub ip_ttl: u8,
    pub ip_tos: u8,
    /// SO_REUSEADDR of the kernel socket (`SocketOptions::reuseaddr`).
    pub reuseaddr: bool,
    /// Send one runt segment despite sender SWS avoidance (persist fired).
    pub nodelay_once: bool,
    // --- pending output
    pub ack_now: bool,
    /// Extra duplicate ACKs owed for out-of-order segments of one batch.
    pub dup_acks_due: u8,
    /// Until when a new hole is not announced (`Config::reorder_grace_ns`).
    pub sack_hold: Option<u64>,
    pub rx_unacked: u32,
    /// The quick ACK owed is deferred (`Config::quickack_defer_ns`): the
    /// segment that carries it carries the window too.
    pub ack_deferred: bool,
    /// The application set TCP_QUICKACK: its quick ACKs are never deferred.
    pub app_quickack: bool,
    pub rst_pending: bool,
    /// A RST answering one bad segment (seq, ack, ACK flag); the connection lives on.
    pub rst_reply: Option<(u32, u32, bool)>,
    /// SYN-SENT answered an ACK that was not for our SYN (a peer's
    /// TIME-WAIT on this 4-tuple) with a RST once, and resent the SYN
    /// right behind it instead of after the 1 s initial RTO.
    pub syn_rst_retry: bool,
    pub syn_pending: bool,
    pub probe_pending: bool,
    pub rtx_once: Option<u32>,
    // --- statistics
    pub total_retrans: u64,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    /// The deadline this connection is armed at in the stack's timer wheel.
    pub armed: Option<u64>,
    pub queued: bool,
    /// Readiness last reported through the stack's event queue.
    pub ev_mask: u8,
    pub ev_queued: bool,
}

/// Quick ACKs at the start of a connection (Linux's quickack mode).
pub(crate) const INITIAL_QUICKACKS: u32 = 16;

fn wscale_for(buf: usize) -> u8 {
    let mut s = 0u8;
    while s < 14 && (buf >> s) > 65535 {
        s += 1;
    }
    s
}

impl Conn {
    pub(crate) fn blank(
        tuple: FourTuple,
        cfg: &Config,
        opts: &SocketOptions,
        iss: u32,
        ts_offset: u32,
        now: u64,
    ) -> Conn {
        let (keepalive, (ka_idle, ka_intvl, ka_cnt)) = match opts.keepalive {
            Some(k) => (true, k),
            None => (
                false,
                (
                    cfg.keepalive_idle_ns,
                    cfg.keepalive_intvl_ns,
                    cfg.keepalive_cnt,
                ),
            ),
        };
        Conn {
            tuple,
            state: State::Closed,
            error: None,
            listener: None,
            orphan: false,
            half_open_counted: false,
            in_accept_queue: false,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: 0,
            snd_wl2: 0,
            snd_wscale: 0,
            rcv_wscale: 0,
            tx: Ring::new(0),
            tx_seq0: iss.wrapping_add(1),
            fin_queued: false,
            sndbuf: opts.sndbuf.max(1),
            irs: 0,
            rcv_nxt: 0,
            rx: RxQueue::new(0),
            rcvbuf: opts.rcvbuf.max(1),
            rcvbuf_max: opts.rcvbuf_max,
            rcv_space: 10 * u64::from(cfg.mss),
            rcv_copied: 0,
            rcv_space_mark: 0,
            rcv_space_time: 0,
            asm: Assembler::default(),
            ooo_fin: None,
            rx_fin: false,
            rcv_adv: 0,
            snd_mss: 536,
            rcv_mss: u32::from(cfg.mss),
            ts_ok: false,
            ws_ok: false,
            ts_recent: 0,
            ts_unknown: false,
            ts_offset,
            sack_ok: false,
            sacked: [(0, 0); SCOREBOARD],
            n_sacked: 0,
            rtx_next: iss,
            tlp_armed: false,
            tlp_done: false,
            srtt: 0,
            rttvar: 0,
            rto: cfg.rto_initial_ns,
            rtt_seq: None,
            backoff: 0,
            rtx_deadline: None,
            delack_deadline: None,
            persist_deadline: None,
            persist_backoff: 0,
            state_deadline: None,
            keepalive,
            ka_idle,
            ka_intvl,
            ka_cnt,
            ka_probes: 0,
            ka_last: now,
            last_rx: now,
            last_tx: now,
            last_oow_ack: 0,
            cc: NewReno::new(cfg.initial_cwnd * 536),
            dupacks: 0,
            in_recovery: false,
            sack_credit: 0,
            sack_hold: None,
            lt_segments: 0,
            recover: iss,
            csum_partial: cfg.tx_checksum_partial,
            nodelay: opts.nodelay,
            quickack: INITIAL_QUICKACKS,
            linger0: opts.linger0,
            ip_ttl: opts.ttl,
            ip_tos: opts.tos,
            reuseaddr: opts.reuseaddr,
            nodelay_once: false,
            ack_now: false,
            dup_acks_due: 0,
            rx_unacked: 0,
            ack_deferred: false,
            app_quickack: false,
            rst_pending: false,
            rst_reply: None,
            syn_rst_retry: false,
            syn_pending: false,
            probe_pending: false,
            rtx_once: None,
            total_retrans: 0,
            bytes_acked: 0,
            bytes_received: 0,
            armed: None,
            queued: false,
            ev_mask: 0,
            ev_queued: false,
        }
    }

    /// An opening connection: in `state` (SYN-SENT or SYN-RECEIVED) with
    /// its SYN pending, its ISN and timestamp offset from `secret`.
    fn opening(
        tuple: FourTuple,
        cfg: &Config,
        opts: &SocketOptions,
        secret: &Secret,
        now: u64,
        state: State,
    ) -> Conn {
        let isn = secret.isn(&tuple, now);
        let mut c = Conn::blank(tuple, cfg, opts, isn, secret.ts_offset(&tuple), now);
        c.state = state;
        c.syn_pending = true;
        c
    }

    /// Active open: SYN-SENT with the SYN pending.
    pub fn connect(
        tuple: FourTuple,
        cfg: &Config,
        opts: &SocketOptions,
        secret: &Secret,
        now: u64,
    ) -> Conn {
        let mut c = Conn::opening(tuple, cfg, opts, secret, now, State::SynSent);
        c.rcv_wscale = if cfg.window_scaling {
            wscale_for(c.rcvbuf.max(c.rcvbuf_max))
        } else {
            0
        };
        c.alloc_buffers();
        c
    }

    /// Passive open from a SYN: SYN-RECEIVED with the SYN-ACK pending.
    /// Buffers are allocated when the handshake completes.
    pub fn accept_syn(
        tuple: FourTuple,
        syn: &TcpRepr,
        cfg: &Config,
        opts: &SocketOptions,
        secret: &Secret,
        now: u64,
    ) -> Conn {
        let mut c = Conn::opening(tuple, cfg, opts, secret, now, State::SynReceived);
        c.irs = syn.seq;
        c.rcv_nxt = syn.seq.wrapping_add(1);
        c.negotiate(syn, cfg);
        c.snd_wnd = u32::from(syn.window);
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = syn.seq;
        c.snd_wl2 = c.iss;
        c
    }

    /// A connection rebuilt from a valid SYN cookie: ESTABLISHED, no window
    /// scaling, SACK or timestamps (the cookie carries only the MSS).
    pub fn from_cookie(
        tuple: FourTuple,
        ack: &TcpRepr,
        mss: u16,
        cfg: &Config,
        opts: &SocketOptions,
        secret: &Secret,
        now: u64,
    ) -> Conn {
        let iss = ack.ack.wrapping_sub(1);
        let mut c = Conn::blank(tuple, cfg, opts, iss, secret.ts_offset(&tuple), now);
        c.state = State::Established;
        c.irs = ack.seq.wrapping_sub(1);
        c.rcv_nxt = ack.seq;
        c.snd_una = ack.ack;
        c.snd_nxt = ack.ack;
        c.snd_max = ack.ack;
        c.tx_seq0 = ack.ack;
        c.snd_mss = u32::from(mss.min(cfg.mss));
        c.snd_wnd = u32::from(ack.window);
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = ack.seq;
        c.snd_wl2 = ack.ack;
        c.cc = NewReno::new(cfg.initial_cwnd * c.snd_mss);
        c.alloc_buffers();
        c.rcv_adv = c.rcv_nxt.wrapping_add(c.rx_free().min(65535) as u32);
        c
    }

    /// Take the peer's SYN options (ours are offered from `cfg`).
    pub fn negotiate(&mut self, syn: &TcpRepr, cfg: &Config) {
        let peer_mss = u32::from(syn.mss.unwrap_or(536)).max(88);
        self.ts_ok = cfg.timestamps && syn.timestamp.is_some();
        if let Some((val, _)) = syn.timestamp {
            self.ts_recent = val;
        }
        self.sack_ok = cfg.sack && syn.sack_permitted;
        match syn.window_scale {
            Some(s) if cfg.window_scaling => {
                self.ws_ok = true;
                self.snd_wscale = s;
                self.rcv_wscale = wscale_for(self.rcvbuf.max(self.rcvbuf_max));
            }
            _ => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
            }
        }
        self.snd_mss = peer_mss.min(u32::from(cfg.mss)) - if self.ts_ok { 12 } else { 0 };
        self.cc = NewReno::new(cfg.initial_cwnd * self.snd_mss);
    }

    pub fn alloc_buffers(&mut self) {
        if self.tx.capacity() != self.sndbuf {
            self.tx.renew(self.sndbuf);
        }
        if self.rx.capacity() != self.rcvbuf {
            self.rx = RxQueue::new(self.rcvbuf);
        }
    }

    /// Receive space not holding unread data (out-of-order data lives here).
    pub fn rx_free(&self) -> usize {
        self.rcvbuf.saturating_sub(self.rx.len())
    }

    /// Sequence number of our FIN (valid when `fin_queued`).
    pub fn fin_seq(&self) -> u32 {
        self.tx_seq0.wrapping_add(self.tx.len() as u32)
    }

    pub fn flight(&self) -> u32 {
        seq::dist(self.snd_nxt, self.snd_una)
    }

    /// Enter CLOSED with an error for the application (if it still holds us).
    pub fn set_closed(&mut self, err: Option<Error>) {
        self.state = State::Closed;
        if self.error.is_none() {
            self.error = err;
        }
        self.rtx_deadline = None;
        self.delack_deadline = None;
        self.persist_deadline = None;
        self.state_deadline = None;
        self.syn_pending = false;
        self.ack_now = false;
        self.probe_pending = false;
        self.rtx_once = None;
    }

    /// Send RST on the next transmit and close.
    pub fn abort(&mut self, err: Error) {
        let synced = !matches!(self.state, State::Closed | State::SynSent | State::TimeWait);
        self.set_closed(Some(err));
        self.rst_pending = synced;
    }

    pub fn enter_time_wait(&mut self, now: u64, cfg: &Config) {
        self.state = State::TimeWait;
        self.rtx_deadline = None;
        self.persist_deadline = None;
        self.state_deadline = Some(now.saturating_add(cfg.time_wait_ns));
    }

    // ---------------------------------------------------------------- API

    pub fn send(&mut self, data: &[u8]) -> Result<usize, Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.fin_queued {
            return Err(Error::Shutdown);
        }
        match self.state {
            State::SynSent | State::SynReceived | State::Established | State::CloseWait => {}
            _ => return Err(Error::NotConnected),
        }
        let n = self.tx.push(data);
        if n == 0 && !data.is_empty() {
            return Err(Error::WouldBlock);
        }
        Ok(n)
    }

    /// Read into `out`; `now` is the stack's clock (autotuning's).
    pub fn recv(&mut self, out: &mut [u8], now: u64) -> Result<usize, Error> {
        let n = self.rx.read(out);
        if n > 0 {
            if self.rx.is_empty() && self.asm.is_empty() {
                self.rx.rewind();
            }
            self.rcv_copied += n as u64;
            self.rcv_space_adjust(now);
            self.maybe_window_update();
            return Ok(n);
        }
        if self.rx_fin || out.is_empty() {
            return Ok(0);
        }
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.state == State::Closed {
            return Ok(0);
        }
        Err(Error::WouldBlock)
    }

    /// Receive buffer autotuning, as Linux's `tcp_rcv_space_adjust`: once
    /// per RTT, if the application read more than in the last one, the
    /// buffer grows to about twice what it read (plus 16 segments, more
    /// when the rate is still climbing), up to `rcvbuf_max`; the window
    /// follows. A reader that does not keep up reads less per RTT and
    /// grows nothing, so the buffer never grows for data that only waits.
    pub(crate) fn rcv_space_adjust(&mut self, now: u64) {
        if self.rcvbuf >= self.rcvbuf_max || !self.state.can_recv() {
            return;
        }
        if self.rcv_space_time == 0 {
            self.rcv_space_time = now.max(1);
            self.rcv_space_mark = self.rcv_copied;
            return;
        }
        let rtt = if self.srtt > 0 {
            self.srtt
        } else {
            crate::NS_PER_MS
        };
        if now.saturating_sub(self.rcv_space_time) < rtt {
            return;
        }
        let copied = self.rcv_copied - self.rcv_space_mark;
        let space = self.rcv_space.max(1);
        if copied > space {
            let mss = u64::from(self.rcv_mss);
            let mut win = 2 * copied + 16 * mss;
            win += 2 * (win * (copied - space) / space);
            let want = (win.min(self.rcvbuf_max as u64) as usize).next_multiple_of(4096);
            let want = want.min(self.rcvbuf_max);
            if want > self.rcvbuf {
                self.rcvbuf = want;
                self.rx.grow(want);
            }
            self.rcv_space = copied;
        }
        self.rcv_space_mark = self.rcv_copied;
        self.rcv_space_time = now.max(1);
    }

    /// After the application read: a window update of its own (an ACK
    /// that acknowledges nothing new) as Linux's `tcp_cleanup_rbuf`, when
    /// what the peer may still send has fallen to half the largest window
    /// or less and the read at least doubled it (receiver silly-window
    /// avoidance, RFC 9293 3.8.6.2.2), and for a window that was shut (or
    /// below one segment) as soon as it takes a segment again — the sender
    /// of a shut window otherwise waits for its next probe, which backoff
    /// may put a minute away. Otherwise the window rides on the next ACK
    /// of arriving data. (The rule was "grew by two segments": a bulk
    /// reader's every 128 KiB read sent an update, half of its ACKs, each a
    /// TX kick here and an ACK for the sender's CPU to take in.)
    fn maybe_window_update(&mut self) {
        if !self.state.can_recv() {
            return;
        }
        let shut = seq::dist(self.rcv_adv, self.rcv_nxt) < self.rcv_mss;
        if self.ack_deferred && !shut {
            // The deferred ACK (the reply's, or the timer's within
            // `Config::quickack_defer_ns`) announces the window.
            return;
        }
        let new = self.max_window() as u32;
        let now = seq::dist(self.rcv_adv, self.rcv_nxt);
        let half = (self.rcvbuf / 2) as u32;
        let seg = self.rcv_mss.min(half).max(1);
        // What the window field can say (a multiple of the scale unit).
        let usable = new >> self.rcv_wscale << self.rcv_wscale;
        let reopened = now < self.rcv_mss && usable >= seg;
        let clamp = self.rcvbuf.min(65535usize << self.rcv_wscale) as u64;
        let lots = 2 * u64::from(now) <= clamp
            && u64::from(usable) >= (2 * u64::from(now)).max(u64::from(seg));
        if lots || reopened {
            self.ack_now = true;
        }
    }

    /// Largest window we may announce now, in bytes.
    pub fn max_window(&self) -> usize {
        self.rx_free().min(65535usize << self.rcv_wscale)
    }

    /// shutdown(SHUT_WR): queue a FIN after the data.
    pub fn shutdown_write(&mut self) {
        if self.fin_queued {
            return;
        }
        match self.state {
            State::Established => self.state = State::FinWait1,
            State::CloseWait => self.state = State::LastAck,
            State::SynSent | State::SynReceived => {}
            _ => return,
        }
        self.fin_queued = true;
    }

    /// Move to FIN-WAIT-1/LAST-ACK after the handshake if a FIN was queued early.
    pub fn on_established(&mut self) {
        self.alloc_buffers();
        if self.fin_queued {
            self.state = State::FinWait1;
        }
    }

    /// epoll-style readiness (`crate::ready` bits).
    pub fn readiness(&self) -> u8 {
        let mut m = 0;
        if !self.rx.is_empty() || self.rx_fin || self.error.is_some() || self.state == State::Closed
        {
            m |= ready::IN;
        }
        if self.rx_fin {
            m |= ready::RDHUP;
        }
        let sendable =
            matches!(self.state, State::Established | State::CloseWait) && !self.fin_queued;
        if (sendable && self.tx.free() > 0) || self.error.is_some() || self.state == State::Closed {
            m |= ready::OUT;
        }
        if self.error.is_some() {
            m |= ready::ERR;
        }
        if self.state == State::Closed || (self.rx_fin && self.fin_queued) {
            m |= ready::HUP;
        }
        m
    }

    pub fn info(&self) -> TcpInfo {
        TcpInfo {
            state: self.state,
            rtt_us: self.srtt / 1000,
            rttvar_us: self.rttvar / 1000,
            rto_us: self.rto / 1000,
            cwnd: self.cc.cwnd,
            ssthresh: self.cc.ssthresh,
            retransmits: self.backoff,
            total_retrans: self.total_retrans,
            unacked: seq::dist(self.snd_max, self.snd_una),
            snd_mss: self.snd_mss as u16,
            rcv_mss: self.rcv_mss as u16,
            snd_wnd: self.snd_wnd,
            rcv_wnd: seq::dist(self.rcv_adv, self.rcv_nxt),
            rcvbuf: self.rcvbuf as u32,
            snd_wscale: self.snd_wscale,
            rcv_wscale: self.rcv_wscale,
            timestamps: self.ts_ok,
            sack: self.sack_ok,
            bytes_acked: self.bytes_acked,
            bytes_received: self.bytes_received,
            snd_nxt: self.snd_nxt,
            rcv_nxt: self.rcv_nxt,
        }
    }

    /// RFC 6298 2.2/2.3 with the configured bounds.
    pub fn rtt_sample(&mut self, r: u64, cfg: &Config) {
        if self.srtt == 0 {
            self.srtt = r.max(1);
            self.rttvar = r / 2;
        } else {
            let d = self.srtt.abs_diff(r);
            self.rttvar = (3 * self.rttvar + d) / 4;
            self.srtt = ((7 * self.srtt + r) / 8).max(1);
        }
        self.rto = (self.srtt + 4 * self.rttvar).clamp(cfg.rto_min_ns, cfg.rto_max_ns);
    }

    /// The retransmission timer to arm now: a tail-loss probe timeout when
    /// one applies (RFC 8985 7.2, as Linux: 2·SRTT plus 2 ms, plus the
    /// minimum RTO when a single segment is out, which leaves the peer's
    /// delayed ACK alone), else the RTO. Returns (delay, is a probe).
    pub fn rtx_timer(&self, cfg: &Config) -> (u64, bool) {
        let rto = self.backed_off_rto(cfg);
        // In recovery too: there the probe resends the first hole, whose
        // retransmission may itself have been lost (no RACK here).
        if self.tlp_done
            || self.backoff > 0
            || self.srtt == 0
            || !matches!(self.state, State::Established | State::CloseWait)
        {
            return (rto, false);
        }
        let mut pto = 2 * self.srtt + 2_000_000;
        if self.flight() <= self.snd_mss {
            pto += cfg.rto_min_ns;
        }
        if pto < rto { (pto, true) } else { (rto, false) }
    }

    /// The RTO with the current exponential backoff.
    pub fn backed_off_rto(&self, cfg: &Config) -> u64 {
        self.rto
            .saturating_mul(1u64 << self.backoff.min(20))
            .min(cfg.rto_max_ns)
    }
}
