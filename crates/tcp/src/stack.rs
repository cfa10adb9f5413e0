//! The container: O(1) demux by 4-tuple (connections) and by local address
//! (listeners, exact before wildcard), the listeners' SYN queue (bounded,
//! SYN cookies beyond it) and accept queue, RSTs for unknown segments, the
//! transmit queue and the timer wheel.
//!
//! Connections live in a slab sized at creation (`Config::max_connections`);
//! the demux map, timer wheel and queues are preallocated, so the data path
//! does not allocate (buffers are allocated once per connection).

use crate::conn::{Conn, State};
use crate::fault::{FaultConfig, FaultInjector, FaultStats};
use crate::isn::{COOKIE_MSS, DemuxHash, Secret, cookie_mss_index};
use crate::payload::Payload;
use crate::wheel::Wheel;
use crate::{Config, Counters, Error, FourTuple, SocketOptions, TcpInfo};
use nanowire_probe::{self as probe, Mark};
use nanowire_wire::checksum;
use nanowire_wire::tcp::{Flags, TcpRepr, TcpSegment};
use nanowire_wire::udp::ChecksumState;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};

/// The checksum of a segment whose header is in `s` and whose payload
/// continues in `rest` (valid, a TX offload's partial one, or bad).
fn checksum_state(
    s: &TcpSegment<&[u8]>,
    head: &[u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    rest: &[&[u8]],
) -> ChecksumState {
    if rest.is_empty() {
        return s.checksum_state(src, dst);
    }
    let seg = Payload::new(head, rest);
    let pseudo = checksum::pseudo_header(src, dst, 6, seg.len() as u16);
    ChecksumState::of(pseudo, s.checksum(), || seg.accumulate(pseudo))
}

/// Handle of a connection (slot index + generation; stale handles are refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub(crate) idx: u32,
    generation: u32,
}

/// An application's read in progress, for the input path
/// ([`TcpStack::input_with`]): in-order data for connection `conn`
/// that arrives while its receive ring is empty is copied straight into
/// `buf` after its first `filled` bytes, not into the ring and out again
/// (one copy per byte instead of two, as Linux's receive into a waiting
/// reader's buffer, the old prequeue/ucopy, did). The bytes count as
/// received and read at once; the window the connection announces is
/// unchanged (the ring stays empty).
pub struct DirectRead<'a> {
    pub conn: ConnId,
    pub buf: &'a mut [u8],
    pub filled: usize,
}

/// A received segment's frame offered to the connection it is for
/// ([`TcpStack::input_with`]): in-order data that would be copied into the
/// connection's receive ring stays in the frame instead
/// ([`crate::buffer::RxQueue`]), and the application's read copies it once,
/// from the frame into its buffer (one copy per byte instead of two). The
/// engine offers a frame only while its budget of held frames over all
/// connections allows (a frame held is one the fill ring lacks); the
/// connection takes it when the data is in order with no hole behind it,
/// at least [`HOLD_MIN`] bytes, and its held frames stay within twice its
/// receive buffer. Otherwise the bytes are copied as before (held and
/// copied runs interleave in the queue in stream order).
pub struct Hold<'a> {
    /// The segment's payload length as the frame holds it: kept only when
    /// it is the payload the stack parsed (no padding, no trimmed tail).
    pub len: usize,
    /// Receive memory the frame pins (its frames × the frame size).
    pub truesize: usize,
    /// Makes what is kept (the frame's payload, `len` bytes), called once
    /// if the connection keeps it.
    pub keep: &'a mut dyn FnMut() -> Box<dyn crate::buffer::HeldBytes>,
    /// Set when the connection kept it.
    pub kept: bool,
}

/// Smallest in-order piece of a segment kept in its frame: a smaller one is
/// copied (cheaper than the bookkeeping, and a request/response connection
/// keeps its frames turning).
pub const HOLD_MIN: usize = 1024;

/// Where an arriving segment's data may go besides the receive ring
/// ([`TcpStack::input_with`]).
#[derive(Default)]
pub struct Intake<'r, 'd, 'h> {
    /// An application's read in progress ([`DirectRead`]).
    pub read: Option<&'r mut DirectRead<'d>>,
    /// The segment's frame, to keep ([`Hold`]).
    pub hold: Option<&'r mut Hold<'h>>,
}

/// Handle of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenerId(u32);

/// One segment written by `poll_transmit`: `buf[..len]` is the TCP segment;
/// the caller prepends the IP header with these addresses, TTL and TOS
/// (the connection's IP_TTL / IP_TOS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub len: usize,
    pub ttl: u8,
    pub tos: u8,
    /// The checksum field holds the pseudo-header's sum only
    /// (`Config::tx_checksum_partial`): the transmit path completes it, by
    /// offload or with `nanowire_wire::tcp::fill_checksum`.
    pub csum_partial: bool,
}

pub(crate) struct Slot {
    generation: u32,
    pub(crate) conn: Option<Conn>,
    /// Listed in `TcpStack::ends` (end tracking is on and the slot changed
    /// since the owner last took the changes).
    end_dirty: bool,
}

/// Something whose readiness changed (see [`TcpStack::poll_ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// A connection and its current `crate::ready` bits.
    Conn(ConnId, u8),
    /// A listener's accept queue became non-empty.
    Listener(ListenerId),
}

struct Listener {
    local: SocketAddrV4,
    opts: SocketOptions,
    backlog: usize,
    accept_q: VecDeque<u32>,
    half_open: usize,
    /// When the SYN queue last overflowed (a cookie was sent). A bare ACK
    /// is checked as a cookie only while one could be live
    /// (`COOKIE_LIFE_NS`), as Linux's tcp_synq_no_recent_overflow: else it
    /// gets the RST of a segment for no connection.
    last_overflow: Option<u64>,
}

/// How long a cookie sent at an overflow can be answered: `check_cookie`
/// accepts the current and the previous counter period.
const COOKIE_LIFE_NS: u64 = 2 * crate::isn::COOKIE_PERIOD_NS;

/// Stateless replies.
#[derive(Debug, Clone, Copy)]
enum Ctrl {
    Rst {
        tuple: FourTuple,
        seq: u32,
        ack: u32,
        with_ack: bool,
    },
    CookieSynAck {
        tuple: FourTuple,
        seq: u32,
        ack: u32,
        mss: u16,
        window: u16,
    },
}

const CTRL_QUEUE: usize = 1024;

/// Arm a connection's timer at its earliest deadline when that comes
/// before the one armed, or (`exact`) differs from it. A later one is left
/// by the common path (settle's fast one, `idle`): the armed entry fires
/// early, finds nothing due and re-arms then (one move per RTO instead of
/// one per ACK). The rare path moves it (a connection entering TIME-WAIT:
/// from its FIN's RTO to 60 s, instead of a fire at the RTO).
#[inline]
fn arm(timers: &mut Wheel, c: &mut Conn, idx: u32, exact: bool) {
    if let Some(d) = c.next_deadline()
        && c.armed.is_none_or(|a| d < a || (exact && d != a))
    {
        c.armed = Some(d);
        timers.arm(idx, d);
    }
}

/// The front of a FIFO queue; a queue that this empties starts again at
/// its first slot. A `VecDeque` used as a FIFO otherwise walks its whole
/// buffer (the ready and event queues are sized for every connection):
/// each page of it is touched in turn, and a process's resident memory
/// creeps up by the whole buffer over its first thousands of connections
/// (tcp_churn's bounded-memory test saw it as growth that varied with the
/// load).
#[inline]
fn pop_front<T>(q: &mut VecDeque<T>) -> Option<T> {
    let v = q.pop_front();
    if q.is_empty() {
        // Empty: only the start moves back (no element to drop).
        q.clear();
    }
    v
}
/// The fault injector's per-segment prefix: source, destination, TTL, TOS.
const FAULT_HDR: usize = 10;
const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;

/// What ends a connection if its owner dies (issue 24: the engine service
/// answers for a killed process's connections as the kernel would; see
/// [`TcpStack::set_end_tracking`]). Made for ESTABLISHED, CLOSE-WAIT, the
/// states whose FIN is sent but maybe not acknowledged (FIN-WAIT-1,
/// CLOSING, LAST-ACK) and FIN-WAIT-2 (our FIN acknowledged, the peer's to
/// come: a kernel socket taking it over answers that); the others need
/// nothing from a survivor (TIME-WAIT, or no connection exists yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndState {
    pub tuple: FourTuple,
    /// The segment's sequence number: our FIN's (where the sent data ends)
    /// or, for a reset, the highest sent (what the peer expects next when
    /// everything arrived; a peer that expects less answers, and the
    /// kernel, which has no socket for the answer, resets with its number).
    pub seq: u32,
    pub rcv_nxt: u32,
    /// (offset, TS.Recent) when timestamps were negotiated.
    pub ts: Option<(u32, u32)>,
    /// The receive window to advertise, scaled.
    pub window: u16,
    /// Reset, as the kernel does when it closes a socket with unread
    /// data, or a connection not yet accepted; also when data the
    /// application wrote was never sent (it died with the process: a FIN
    /// would end the stream short without a word). Otherwise a FIN.
    pub rst: bool,
    /// What a kernel socket taking the connection over needs (TCP_REPAIR):
    /// the MSS the peer announced (before timestamp room), the window
    /// scaling (the peer's shift, ours), SACK, the peer's window in bytes.
    pub mss: u16,
    pub wscale: Option<(u8, u8)>,
    pub sack: bool,
    pub snd_wnd: u32,
    /// The peer's FIN was received (CLOSE-WAIT, CLOSING, LAST-ACK):
    /// `rcv_nxt` counts it.
    pub peer_fin: bool,
    /// Everything sent was acknowledged (our FIN aside): the FIN's
    /// sequence number is where the peer's data ends, not an assumption.
    pub acked: bool,
    /// Our FIN was acknowledged too (FIN-WAIT-2): the peer needs no FIN,
    /// only an answer to its own.
    pub fin_acked: bool,
    /// SO_REUSEADDR of the kernel socket (`SocketOptions::reuseaddr`).
    pub reuseaddr: bool,
    /// The first unacknowledged byte and the highest sent (`seq` is where
    /// the written data ends), and where the bytes from `snd_una` lie when
    /// the send ring's storage is a slab another process can read
    /// (`TcpStack::set_send_slabs`): then the end is a FIN after them even
    /// with data never sent.
    pub snd_una: u32,
    pub snd_max: u32,
    pub slab: Option<crate::buffer::SlabAt>,
}

impl EndState {
    fn of(c: &Conn) -> Option<EndState> {
        if !matches!(
            c.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::FinWait2
                | State::Closing
                | State::LastAck
        ) {
            return None;
        }
        let data_end = c.tx_seq0.wrapping_add(c.tx.len() as u32);
        let unsent = crate::seq::lt(c.snd_max, data_end) && c.tx.slab_at().is_none();
        let rst = unsent || !c.rx.is_empty() || c.in_accept_queue;
        Some(EndState::with(
            c,
            if rst { c.snd_max } else { data_end },
            rst,
        ))
    }

    /// `c` ended by a segment at `seq` (a RST when `rst`, else a FIN).
    fn with(c: &Conn, seq: u32, rst: bool) -> EndState {
        EndState {
            tuple: c.tuple,
            seq,
            rcv_nxt: c.rcv_nxt,
            ts: c.ts_ok.then_some((c.ts_offset, c.ts_recent)),
            window: (crate::seq::dist(c.rcv_adv, c.rcv_nxt) >> c.rcv_wscale).min(65535) as u16,
            rst,
            mss: (c.snd_mss + if c.ts_ok { 12 } else { 0 }).min(65535) as u16,
            wscale: c.ws_ok.then_some((c.snd_wscale, c.rcv_wscale)),
            sack: c.sack_ok,
            snd_wnd: c.snd_wnd,
            peer_fin: c.rx_fin,
            acked: c.tx.is_empty(),
            fin_acked: matches!(c.state, State::FinWait2 | State::TimeWait),
            reuseaddr: c.reuseaddr,
            snd_una: c.tx_seq0,
            snd_max: c.snd_max,
            slab: if c.tx.is_empty() {
                None
            } else {
                c.tx.slab_at()
            },
        }
    }
}

pub struct TcpStack {
    pub(crate) cfg: Config,
    secret: Secret,
    pub(crate) slots: Vec<Slot>,
    free: Vec<u32>,
    pub(crate) demux: HashMap<FourTuple, u32, DemuxHash>,
    listeners: Vec<Option<Listener>>,
    listen_map: HashMap<SocketAddrV4, u32, DemuxHash>,
    ready: VecDeque<u32>,
    /// Each connection's earliest deadline (`Conn::armed`).
    timers: Wheel,
    /// The timers a poll fires, reused.
    due: Vec<(u64, u32)>,
    ctrl: VecDeque<Ctrl>,
    events: VecDeque<Readiness>,
    pub(crate) counters: Counters,
    /// Handed-over 4-tuples and when (see `handover.rs`).
    pub(crate) handed_over: Vec<(FourTuple, u64)>,
    next_port: u16,
    default_opts: SocketOptions,
    /// Fault injection on received and transmitted segments (off by default).
    fault_rx: Option<FaultInjector>,
    fault_tx: Option<FaultInjector>,
    /// Where send rings take their storage (`set_send_slabs`).
    send_slabs: Option<crate::buffer::SendSlabs>,
    fault_buf: Vec<u8>,
    /// Queue `Readiness::Conn` events (see `set_conn_events`).
    conn_events: bool,
    /// Connection slots touched since the owner last took them, when end
    /// tracking is on (`set_end_tracking`).
    ends: Option<Vec<u32>>,
    /// The latest time the caller gave (input, timers, transmit): the
    /// clock of the calls that take none (`recv`).
    clock: u64,
    /// A connection whose settle's end tracking and timer are owed
    /// ([`TcpStack::send_owing`], [`TcpStack::poll_transmit_owing`]) until
    /// [`TcpStack::settle_owed`].
    owed: Option<u32>,
}

impl TcpStack {
    pub fn new(cfg: Config, secret: Secret) -> TcpStack {
        let n = cfg.max_connections;
        TcpStack {
            slots: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
            demux: HashMap::with_capacity_and_hasher(n, secret.demux_hash()),
            listeners: Vec::new(),
            listen_map: HashMap::with_hasher(secret.demux_hash()),
            ready: VecDeque::with_capacity(n),
            timers: Wheel::new(n),
            due: Vec::new(),
            ctrl: VecDeque::with_capacity(CTRL_QUEUE),
            events: VecDeque::with_capacity(n),
            counters: Counters::default(),
            handed_over: Vec::new(),
            next_port: *EPHEMERAL.start(),
            default_opts: SocketOptions::from_config(&cfg),
            fault_rx: None,
            fault_tx: None,
            send_slabs: None,
            fault_buf: Vec::new(),
            conn_events: true,
            ends: None,
            clock: 0,
            owed: None,
            cfg,
            secret,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// Connections held (any state, including TIME-WAIT and closed-but-not-released).
    pub fn connection_count(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The 4-tuples of the connections held (any state).
    pub fn tuples(&self) -> Vec<FourTuple> {
        self.demux.keys().copied().collect()
    }

    /// Does the stack still hold a connection (any state) with this
    /// 4-tuple? One demux lookup (`tuples()` walks the whole preallocated
    /// map: ~7,000 instructions at the default capacity).
    pub fn has_tuple(&self, t: &FourTuple) -> bool {
        self.demux.contains_key(t)
    }

    /// Track what would end each connection if the owner died (issue 24):
    /// every connection touched since the last [`TcpStack::take_end_changes`]
    /// is listed once (a flag and a push per touch, nothing more on the
    /// per-segment path). Turned on, every live connection is listed.
    /// Send rings of connections made from now on take their storage
    /// from `slabs` (issue 24: the service delivers a killed process's
    /// unacknowledged bytes from there; `EndState::slab`).
    pub fn set_send_slabs(&mut self, slabs: Option<crate::buffer::SendSlabs>) {
        self.send_slabs = slabs;
    }

    pub fn set_end_tracking(&mut self, on: bool) {
        if !on {
            self.ends = None;
            for s in &mut self.slots {
                s.end_dirty = false;
            }
            return;
        }
        if self.ends.is_some() {
            return;
        }
        let mut d = Vec::with_capacity(self.slots.len().max(64));
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.conn.is_some() {
                s.end_dirty = true;
                d.push(i as u32);
            }
        }
        self.ends = Some(d);
    }

    /// Connections touched since the last take (end tracking on).
    #[inline]
    pub fn has_end_changes(&self) -> bool {
        self.ends.as_ref().is_some_and(|d| !d.is_empty())
    }

    /// Hand `f` each connection slot touched since the last call, with
    /// what would end it now (`None`: nothing, or the slot is free). Slots
    /// are small, reused integers (below the slab's length): a table indexed
    /// by them stays dense.
    /// An owed settle ([`TcpStack::send_owing`]) has noted its end already:
    /// only its timer is owed.
    pub fn take_end_changes(&mut self, mut f: impl FnMut(u32, Option<EndState>)) {
        let Some(mut d) = self.ends.take() else {
            return;
        };
        for &idx in &d {
            let s = &mut self.slots[idx as usize];
            s.end_dirty = false;
            f(idx, s.conn.as_ref().and_then(EndState::of));
        }
        d.clear();
        self.ends = Some(d);
    }

    #[inline]
    fn note_end(&mut self, idx: u32) {
        if let Some(d) = self.ends.as_mut() {
            let s = &mut self.slots[idx as usize];
            if !s.end_dirty {
                s.end_dirty = true;
                d.push(idx);
            }
        }
    }

    /// Hand `f` each connection in TIME-WAIT with what a kernel socket
    /// taking its wait over needs (`seq`: our FIN's sequence number,
    /// `rcv_nxt` past the peer's FIN, `fin_acked` and `peer_fin` set) and
    /// the ns its wait has left at `now`. What an exiting process hands
    /// to the kernel, which keeps a closed socket's TIME-WAIT after the
    /// process.
    pub fn time_wait_ends(&self, now: u64, mut f: impl FnMut(EndState, u64)) {
        for c in self.slots.iter().filter_map(|s| s.conn.as_ref()) {
            if c.state == State::TimeWait {
                let left = c.state_deadline.map_or(0, |d| d.saturating_sub(now));
                f(EndState::with(c, c.fin_seq(), false), left);
            }
        }
    }

    /// The slot of a connection an application holds and may be turning
    /// the engine for: accepted or connected (not half-open, not waiting
    /// in an accept queue), its handle not closed, neither TIME-WAIT nor
    /// closed; `None` if there is none. Looks at `hint` (a slot this
    /// returned before, or `usize::MAX`) first: O(1) while that one stays
    /// held, which a caller asking on every turn relies on; else stops at
    /// the first.
    pub fn held_connection(&self, hint: usize) -> Option<usize> {
        let held = |c: &Conn| {
            c.listener.is_none() && !c.orphan && !matches!(c.state, State::TimeWait | State::Closed)
        };
        if self
            .slots
            .get(hint)
            .and_then(|s| s.conn.as_ref())
            .is_some_and(held)
        {
            return Some(hint);
        }
        self.slots
            .iter()
            .position(|s| s.conn.as_ref().is_some_and(held))
    }

    /// Connections still exchanging segments: neither TIME-WAIT nor closed.
    pub fn active_connection_count(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.conn.as_ref())
            .filter(|c| !matches!(c.state, State::TimeWait | State::Closed))
            .count()
    }

    /// The connections still exchanging segments (as
    /// [`TcpStack::active_connection_count`]) and a value that changes
    /// whenever one of them moves: data acknowledged by the peer or
    /// received from it, or a state change. A peer that only answers
    /// probes without taking data does not change it. What an exiting
    /// process watches while its closed connections finish.
    pub fn progress(&self) -> (usize, u64) {
        let mut n = 0;
        let mut h = 0u64;
        for c in self.slots.iter().filter_map(|s| s.conn.as_ref()) {
            if matches!(c.state, State::TimeWait | State::Closed) {
                continue;
            }
            n += 1;
            let v =
                ((u64::from(c.snd_una) << 32) | u64::from(c.rcv_nxt)) ^ ((c.state as u64) << 60);
            h = h.rotate_left(7) ^ v;
        }
        (n, h)
    }

    /// Reset every connection still exchanging segments (RST now, as
    /// [`TcpStack::abort`]), including closed (orphaned) ones. Returns how
    /// many.
    pub fn abort_active(&mut self) -> usize {
        let mut n = 0;
        for idx in 0..self.slots.len() {
            let Some(c) = self.slots[idx].conn.as_mut() else {
                continue;
            };
            if matches!(c.state, State::TimeWait | State::Closed) {
                continue;
            }
            c.abort(Error::Aborted);
            n += 1;
            self.settle(idx as u32);
        }
        n
    }

    // ------------------------------------------------------------ slab

    /// The slot of `c` while the application holds it: the generation
    /// matches and the connection is not an orphan.
    fn held(&self, c: ConnId) -> Result<usize, Error> {
        match self.slots.get(c.idx as usize) {
            Some(Slot {
                generation,
                conn: Some(k),
                ..
            }) if *generation == c.generation && !k.orphan => Ok(c.idx as usize),
            _ => Err(Error::InvalidHandle),
        }
    }
    fn conn(&self, c: ConnId) -> Result<&Conn, Error> {
        let i = self.held(c)?;
        Ok(self.slots[i].conn.as_ref().expect("held"))
    }
    pub(crate) fn conn_mut(&mut self, c: ConnId) -> Result<&mut Conn, Error> {
        let i = self.held(c)?;
        Ok(self.slots[i].conn.as_mut().expect("held"))
    }
    pub(crate) fn id(&self, idx: u32) -> ConnId {
        ConnId {
            idx,
            generation: self.slots[idx as usize].generation,
        }
    }

    pub(crate) fn insert(&mut self, mut conn: Conn) -> Result<u32, Error> {
        if self.connection_count() >= self.cfg.max_connections {
            return Err(Error::TooManyConnections);
        }
        if self.send_slabs.is_some() {
            conn.tx.use_slabs(self.send_slabs.clone());
        }
        let tuple = conn.tuple;
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize].conn = Some(conn);
                i
            }
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    conn: Some(conn),
                    end_dirty: false,
                });
                (self.slots.len() - 1) as u32
            }
        };
        self.demux.insert(tuple, idx);
        Ok(idx)
    }

    fn release(&mut self, idx: u32) {
        self.note_end(idx);
        let slot = &mut self.slots[idx as usize];
        if let Some(c) = slot.conn.take() {
            if self.demux.get(&c.tuple) == Some(&idx) {
                self.demux.remove(&c.tuple);
            }
            slot.generation = slot.generation.wrapping_add(1);
            self.free.push(idx);
            self.timers.cancel(idx);
        }
    }

    /// Bookkeeping after anything happened to a connection: demux removal
    /// when closed, release when nobody holds it, transmit queue, timer.
    /// Out of line: called from every path that changes a connection (one
    /// copy of its body, not one per caller).
    #[inline(never)]
    pub(crate) fn settle(&mut self, idx: u32) {
        self.settle_with(idx, false)
    }

    /// [`TcpStack::settle`] with its end tracking and timer owed (done by
    /// [`TcpStack::settle_owed`]) when the connection is in the common case:
    /// the transmit queue is seen to at once (a batch that asks
    /// `transmit_queued` must see a connection with more to send). One
    /// connection is owed at a time: another's owed settle is paid first.
    #[inline(never)]
    fn settle_later(&mut self, idx: u32) {
        self.settle_with(idx, true)
    }

    /// Pay the owed settle ([`TcpStack::send_owing`],
    /// [`TcpStack::poll_transmit_owing`]): a load when nothing is owed.
    #[inline]
    pub fn settle_owed(&mut self) {
        if let Some(idx) = self.owed.take() {
            self.settle(idx);
        }
    }

    #[inline(always)]
    fn settle_with(&mut self, idx: u32, later: bool) {
        // The common case (four times a message in a ping-pong: the
        // segment in, the read, the write, the segment out): a connection
        // of the application's in a state that needs none of the rare
        // steps below (no handshake to account to its listener, not
        // closed, no orphan's TIME-WAIT, no readiness events): only the
        // end tracking, the transmit queue and the timer, with one look at
        // the slot instead of four.
        let TcpStack {
            slots,
            ends,
            ready,
            timers,
            conn_events,
            owed,
            ..
        } = self;
        let slot = &mut slots[idx as usize];
        if let Some(c) = slot.conn.as_mut()
            && !c.half_open_counted
            && !c.orphan
            && c.state != State::Closed
            && !*conn_events
        {
            if !c.queued && c.may_output() {
                c.queued = true;
                ready.push_back(idx);
            }
            // The end is noted at once, owed or not: a driver publishes the
            // ends before its kick (a death after the kick must find the
            // end after the bytes just queued), while the settle is owed.
            if let Some(d) = ends.as_mut()
                && !slot.end_dirty
            {
                slot.end_dirty = true;
                d.push(idx);
            }
            if later {
                if let Some(o) = owed.replace(idx)
                    && o != idx
                {
                    self.settle(o);
                }
                return;
            }
            arm(timers, c, idx, false);
            return;
        }
        self.settle_all(idx);
    }

    /// [`TcpStack::settle`], every step.
    #[inline(never)]
    fn settle_all(&mut self, idx: u32) {
        self.note_end(idx);
        let Some(c) = self.slots[idx as usize].conn.as_mut() else {
            return;
        };
        if c.state != State::SynReceived
            && let Some(l) = c.listener
            && c.half_open_counted
        {
            c.half_open_counted = false;
            if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                lst.half_open = lst.half_open.saturating_sub(1);
                if c.state != State::Closed {
                    if lst.accept_q.len() < lst.backlog.max(1) {
                        if lst.accept_q.is_empty() {
                            self.events.push_back(Readiness::Listener(ListenerId(l)));
                        }
                        lst.accept_q.push_back(idx);
                        c.in_accept_queue = true;
                        self.counters.passive_opens += 1;
                    } else {
                        self.counters.accept_queue_full += 1;
                        c.abort(Error::Aborted);
                        c.orphan = true;
                    }
                } else {
                    c.orphan = true;
                }
            } else {
                // Listener gone.
                c.abort(Error::Aborted);
                c.orphan = true;
            }
        }
        let c = self.slots[idx as usize]
            .conn
            .as_mut()
            .expect("checked above");
        if c.state == State::Closed {
            let tuple = c.tuple;
            let done = c.orphan && !c.rst_pending && c.rst_reply.is_none();
            if self.demux.get(&tuple) == Some(&idx) {
                self.demux.remove(&tuple);
            }
            if done {
                self.release(idx);
                return;
            }
        }
        let c = self.slots[idx as usize]
            .conn
            .as_mut()
            .expect("checked above");
        if c.orphan && c.state == State::TimeWait && c.rx.capacity() + c.tx.capacity() > 0 {
            // An orphan in TIME-WAIT keeps its sequence state only (as the
            // kernel's timewait socket): its rings go back to the pool.
            c.tx = crate::buffer::Ring::new(0);
            c.rx = crate::buffer::RxQueue::new(0);
        }
        if self.conn_events
            && !c.orphan
            && !c.in_accept_queue
            && c.listener.is_none()
            && !c.ev_queued
            && c.readiness() != c.ev_mask
        {
            c.ev_queued = true;
            let generation = self.slots[idx as usize].generation;
            self.events
                .push_back(Readiness::Conn(ConnId { idx, generation }, 0));
        }
        let c = self.slots[idx as usize]
            .conn
            .as_mut()
            .expect("checked above");
        // Queued for output only when it has something to send: a
        // connection that has nothing (a segment whose ACK is delayed, a
        // read, a segment just sent) is settled here as `idle` would settle
        // it (timers armed below, a dead orphan released above) instead of
        // going through the queue to be taken off again by the next
        // `wants_transmit`. Whatever later gives it output (input, a timer,
        // an application call) settles it again.
        if !c.queued && c.may_output() {
            c.queued = true;
            self.ready.push_back(idx);
        }
        arm(&mut self.timers, c, idx, true);
    }

    // ------------------------------------------------------------ input

    /// Inject faults (loss, duplication, reordering, delay, corruption) into
    /// what this stack receives and transmits; inactive configurations turn
    /// it off. For tests and impaired-network experiments.
    pub fn set_faults(&mut self, rx: FaultConfig, tx: FaultConfig) {
        self.fault_rx = rx.is_active().then(|| FaultInjector::new(rx));
        self.fault_tx = tx.is_active().then(|| FaultInjector::new(tx));
        if self.fault_tx.is_some() && self.fault_buf.is_empty() {
            self.fault_buf = vec![0u8; 65_536 + FAULT_HDR];
        }
    }

    /// What the injectors did: (receive side, transmit side).
    pub fn fault_stats(&self) -> (FaultStats, FaultStats) {
        (
            self.fault_rx
                .as_ref()
                .map(|f| f.stats.clone())
                .unwrap_or_default(),
            self.fault_tx
                .as_ref()
                .map(|f| f.stats.clone())
                .unwrap_or_default(),
        )
    }

    /// One received TCP segment (`segment` is the IP payload).
    pub fn input(&mut self, now: u64, src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) {
        self.input_with(now, src, dst, segment, &[], Intake::default());
    }

    /// One received TCP segment in pieces: `head` holds the TCP header and
    /// the start of the payload, `rest` the rest of the payload (the
    /// buffers of a multi-buffer packet). The payload is copied into the
    /// connection's receive ring straight from the pieces, never gathered.
    /// With `to.read` (an application reading `read.conn`), that
    /// connection's in-order data goes straight into the reader's buffer
    /// when its receive ring is empty ([`DirectRead`]); with `to.hold`, the
    /// segment's frame is offered to keep ([`Hold`]).
    pub fn input_with(
        &mut self,
        now: u64,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        head: &[u8],
        rest: &[&[u8]],
        to: Intake<'_, '_, '_>,
    ) {
        if let Some(f) = self.fault_rx.as_mut() {
            let seg = Payload::new(head, rest);
            let mut p = vec![0u8; 8 + seg.len()];
            p[..4].copy_from_slice(&src.octets());
            p[4..8].copy_from_slice(&dst.octets());
            seg.copy_to(&mut p[8..]);
            f.push(now, &p);
            self.release_rx(now);
            return;
        }
        let Intake { read, hold } = to;
        let now = self.tick(now);
        self.counters.segs_in += 1;
        let Ok(s) = TcpSegment::new_checked(head) else {
            self.counters.malformed += 1;
            return;
        };
        if self.cfg.verify_checksum
            && checksum_state(&s, head, src, dst, rest) == ChecksumState::Bad
        {
            self.counters.bad_checksum += 1;
            return;
        }
        let Ok(r) = TcpRepr::parse(&s) else {
            self.counters.malformed += 1;
            return;
        };
        probe::mark(Mark::TcpParsed);
        let payload = Payload::new(s.payload(), rest);
        let tuple = FourTuple {
            local: SocketAddrV4::new(dst, r.dst_port),
            remote: SocketAddrV4::new(src, r.src_port),
        };
        if let Some(&idx) = self.demux.get(&tuple) {
            probe::mark(Mark::TcpFound);
            let c = self.slots[idx as usize]
                .conn
                .as_ref()
                .expect("demux points at a live slot");
            // The listener lookup only for a SYN to a TIME-WAIT connection.
            let reuse = c.state == State::TimeWait
                && r.flags.syn()
                && !r.flags.ack()
                && !r.flags.rst()
                && c.time_wait_takes_syn(&r)
                && self.find_listener(&tuple.local).is_some();
            // A direct read only for the connection it names (this slot,
            // this generation).
            let gen_ok = read.as_ref().is_some_and(|d| {
                d.conn.idx == idx && d.conn.generation == self.slots[idx as usize].generation
            });
            let c = self.slots[idx as usize]
                .conn
                .as_mut()
                .expect("demux points at a live slot");
            if !reuse {
                // Linux drops the handshake's final ACK when the accept queue is full.
                if c.state == State::SynReceived
                    && r.flags.ack()
                    && !r.flags.rst()
                    && !r.flags.syn()
                    && let Some(l) = c.listener
                    && let Some(Some(lst)) = self.listeners.get(l as usize)
                    && lst.accept_q.len() >= lst.backlog.max(1)
                {
                    self.counters.accept_queue_full += 1;
                    return;
                }
                c.input(
                    now,
                    &self.cfg,
                    &r,
                    payload,
                    &mut self.counters,
                    Intake {
                        read: read.filter(|_| gen_ok),
                        hold,
                    },
                );
                probe::mark(Mark::TcpConnDone);
                self.settle(idx);
                return;
            }
            self.counters.time_wait_reuse += 1;
            c.orphan = true;
            c.set_closed(None);
            self.release(idx);
        }
        if !self.handed_over.is_empty() && self.handed_over_drop(&tuple) {
            return;
        }
        if let Some(l) = self.find_listener(&tuple.local) {
            self.listener_input(now, l, tuple, &r, payload);
            return;
        }
        self.counters.no_socket += 1;
        if !r.flags.rst() && self.cfg.rst_unknown {
            self.queue_rst_for(tuple, &r, payload.len());
        }
    }

    /// The stack's clock at `now`: it never goes back. Callers read the
    /// clock before they get the stack (an application thread and the
    /// timer service may pass each other); a segment built with an older
    /// time than the last one would carry an older TSval, which the peer
    /// drops as an old duplicate (PAWS, RFC 7323 5) — a lost window update.
    fn tick(&mut self, now: u64) -> u64 {
        self.clock = self.clock.max(now);
        self.clock
    }

    /// Segments the receive-side injector holds that are due (taken out
    /// while they go in, so that they go in straight).
    fn release_rx(&mut self, now: u64) {
        let Some(mut f) = self.fault_rx.take() else {
            return;
        };
        while let Some(p) = f.pop(now) {
            let src = Ipv4Addr::new(p[0], p[1], p[2], p[3]);
            let dst = Ipv4Addr::new(p[4], p[5], p[6], p[7]);
            self.input_with(now, src, dst, &p[8..], &[], Intake::default());
        }
        self.fault_rx = Some(f);
    }

    fn find_listener(&self, local: &SocketAddrV4) -> Option<u32> {
        self.listen_map
            .get(local)
            .or_else(|| {
                self.listen_map
                    .get(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, local.port()))
            })
            .copied()
    }

    /// RFC 9293 3.10.7.1: the reset for a segment nobody owns.
    fn queue_rst_for(&mut self, tuple: FourTuple, r: &TcpRepr, payload_len: usize) {
        let c = if r.flags.ack() {
            Ctrl::Rst {
                tuple,
                seq: r.ack,
                ack: 0,
                with_ack: false,
            }
        } else {
            let len = payload_len as u32 + u32::from(r.flags.syn()) + u32::from(r.flags.fin());
            Ctrl::Rst {
                tuple,
                seq: 0,
                ack: r.seq.wrapping_add(len),
                with_ack: true,
            }
        };
        self.push_ctrl(c);
    }

    fn push_ctrl(&mut self, c: Ctrl) {
        if self.ctrl.len() >= CTRL_QUEUE {
            self.counters.ctrl_queue_full += 1;
        } else {
            self.ctrl.push_back(c);
        }
    }

    fn listener_input(
        &mut self,
        now: u64,
        l: u32,
        tuple: FourTuple,
        r: &TcpRepr,
        payload: Payload<'_>,
    ) {
        let f = r.flags;
        if f.rst() {
            return;
        }
        let Some(Some(lst)) = self.listeners.get(l as usize) else {
            return;
        };
        let queue_full = lst.accept_q.len() >= lst.backlog.max(1);
        let half_open = lst.half_open;
        let recent_overflow = lst
            .last_overflow
            .is_some_and(|t| now.saturating_sub(t) < COOKIE_LIFE_NS);
        if f.ack() {
            if f.syn() {
                self.queue_rst_for(tuple, r, payload.len());
                return;
            }
            if !recent_overflow {
                // No cookie can be live: nobody's connection (issue 20, 13a).
                self.counters.no_socket += 1;
                self.queue_rst_for(tuple, r, payload.len());
                return;
            }
            // The third segment of a handshake answered with a cookie?
            let cookie = r.ack.wrapping_sub(1);
            match self
                .secret
                .check_cookie(&tuple, now, r.seq.wrapping_sub(1), cookie)
            {
                Some(mss_idx) => {
                    if queue_full {
                        self.counters.accept_queue_full += 1;
                        return;
                    }
                    let mss = COOKIE_MSS[usize::from(mss_idx)];
                    let mut c =
                        Conn::from_cookie(tuple, r, mss, &self.cfg, &lst.opts, &self.secret, now);
                    c.listener = Some(l);
                    let Ok(idx) = self.insert(c) else {
                        self.counters.listen_overflows += 1;
                        return;
                    };
                    self.counters.syncookies_ok += 1;
                    self.counters.passive_opens += 1;
                    if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                        if lst.accept_q.is_empty() {
                            self.events.push_back(Readiness::Listener(ListenerId(l)));
                        }
                        lst.accept_q.push_back(idx);
                    }
                    let c = self.slots[idx as usize]
                        .conn
                        .as_mut()
                        .expect("just inserted");
                    c.in_accept_queue = true;
                    if !payload.is_empty() || f.fin() {
                        c.input(
                            now,
                            &self.cfg,
                            r,
                            payload,
                            &mut self.counters,
                            Intake::default(),
                        );
                    }
                    self.settle(idx);
                }
                None => {
                    self.counters.syncookies_failed += 1;
                    self.queue_rst_for(tuple, r, payload.len());
                }
            }
            return;
        }
        if !f.syn() {
            return;
        }
        if queue_full {
            self.counters.listen_overflows += 1;
            return;
        }
        if half_open < self.cfg.syn_queue && self.connection_count() < self.cfg.max_connections {
            let Some(Some(lst)) = self.listeners.get(l as usize) else {
                return;
            };
            let mut c = Conn::accept_syn(tuple, r, &self.cfg, &lst.opts, &self.secret, now);
            c.listener = Some(l);
            c.half_open_counted = true;
            let Ok(idx) = self.insert(c) else {
                return;
            };
            if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                lst.half_open += 1;
            }
            self.settle(idx);
        } else {
            let mss = r.mss.unwrap_or(536).min(self.cfg.mss);
            let idx = cookie_mss_index(mss);
            let cookie = self.secret.cookie(&tuple, now, r.seq, idx);
            self.counters.syncookies_sent += 1;
            if let Some(Some(lst)) = self.listeners.get_mut(l as usize) {
                lst.last_overflow = Some(now);
            }
            self.push_ctrl(Ctrl::CookieSynAck {
                tuple,
                seq: cookie,
                ack: r.seq.wrapping_add(1),
                mss: COOKIE_MSS[usize::from(idx)],
                window: self.cfg.rcvbuf.min(65535) as u16,
            });
        }
    }

    // ------------------------------------------------------------ output

    /// Might [`TcpStack::poll_transmit`] give a segment now? False only
    /// when it certainly gives none: no control segment and no connection
    /// queued to send (a connection that has more to send after a segment
    /// stays queued), no fault injector. A few loads: a driver filling a
    /// batch of frames ends it after the last segment without asking the
    /// stack again.
    #[inline]
    pub fn transmit_queued(&self) -> bool {
        !self.ctrl.is_empty() || !self.ready.is_empty() || self.fault_tx.is_some()
    }

    /// Write the next segment to send into `buf` (room for a TCP header with
    /// options and one MSS: `mss + 60` bytes is always enough).
    pub fn poll_transmit(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        if self.fault_tx.is_none() {
            return self.transmit_now(now, buf, false);
        }
        self.transmit_faulty(now, buf)
    }

    /// [`TcpStack::poll_transmit`] whose settle of the connection that
    /// sent (end tracking, timer: not the transmit queue) is owed until
    /// [`TcpStack::settle_owed`]: a driver pays it after the frame left
    /// (the kick), not before. The caller pays before it does anything
    /// else with the stack but transmit.
    #[inline]
    pub fn poll_transmit_owing(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        if self.fault_tx.is_none() {
            return self.transmit_now(now, buf, true);
        }
        self.transmit_faulty(now, buf)
    }

    /// [`TcpStack::poll_transmit`] through the fault injector.
    #[cold]
    #[inline(never)]
    fn transmit_faulty(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        let mut scratch = std::mem::take(&mut self.fault_buf);
        // Everything the stack wants to send goes through the injector,
        // checksummed (its corruption must be caught by the receiver).
        while let Some(t) = self.transmit_now(now, &mut scratch[FAULT_HDR..], false) {
            if t.csum_partial {
                let seg = &mut scratch[FAULT_HDR..FAULT_HDR + t.len];
                nanowire_wire::tcp::fill_checksum(seg, t.src, t.dst);
            }
            scratch[0..4].copy_from_slice(&t.src.octets());
            scratch[4..8].copy_from_slice(&t.dst.octets());
            scratch[8] = t.ttl;
            scratch[9] = t.tos;
            if let Some(f) = self.fault_tx.as_mut() {
                f.push(now, &scratch[..FAULT_HDR + t.len]);
            }
        }
        self.fault_buf = scratch;
        let p = self.fault_tx.as_mut()?.pop(now)?;
        let len = p.len() - FAULT_HDR;
        if buf.len() < len {
            self.counters.tx_buffer_too_small += 1;
            return None;
        }
        buf[..len].copy_from_slice(&p[FAULT_HDR..]);
        Some(Transmit {
            src: Ipv4Addr::new(p[0], p[1], p[2], p[3]),
            dst: Ipv4Addr::new(p[4], p[5], p[6], p[7]),
            len,
            ttl: p[8],
            tos: p[9],
            csum_partial: false,
        })
    }

    /// The next segment; `owing`: the sender's settle is owed
    /// ([`TcpStack::settle_later`]).
    #[inline]
    fn transmit_now(&mut self, now: u64, buf: &mut [u8], owing: bool) -> Option<Transmit> {
        let now = self.tick(now);
        if !self.ctrl.is_empty()
            && let Some(t) = self.transmit_ctrl(buf)
        {
            return Some(t);
        }
        while let Some(idx) = pop_front(&mut self.ready) {
            let Some(c) = self.slots[idx as usize].conn.as_mut() else {
                continue;
            };
            c.queued = false;
            let out = c.poll_output(now, &self.cfg, buf, &mut self.counters);
            let (src, dst) = (*c.tuple.local.ip(), *c.tuple.remote.ip());
            let (ttl, tos, csum_partial) = (c.ip_ttl, c.ip_tos, c.csum_partial);
            match out {
                Some(len) if len > 0 => {
                    self.settle_with(idx, owing);
                    return Some(Transmit {
                        src,
                        dst,
                        len,
                        ttl,
                        tos,
                        csum_partial,
                    });
                }
                _ => self.idle(idx),
            }
        }
        None
    }

    /// The next control segment (a RST for an unknown segment, a cookie
    /// SYN-ACK), if one is queued: out of line, the common transmit is a
    /// connection's.
    #[cold]
    #[inline(never)]
    fn transmit_ctrl(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(c) = pop_front(&mut self.ctrl) {
            // A cookie SYN-ACK's window and MSS; a RST has neither.
            let (tuple, seq, ack, flags, syn_ack) = match c {
                Ctrl::Rst {
                    tuple,
                    seq,
                    ack,
                    with_ack,
                } => {
                    let flags = Flags::RST | if with_ack { Flags::ACK } else { 0 };
                    (tuple, seq, ack, flags, None)
                }
                Ctrl::CookieSynAck {
                    tuple,
                    seq,
                    ack,
                    mss,
                    window,
                } => (
                    tuple,
                    seq,
                    ack,
                    Flags::SYN | Flags::ACK,
                    Some((window, mss)),
                ),
            };
            let r = TcpRepr {
                src_port: tuple.local.port(),
                dst_port: tuple.remote.port(),
                seq,
                ack,
                flags: Flags(flags),
                window: syn_ack.map_or(0, |(w, _)| w),
                mss: syn_ack.map(|(_, m)| m),
                ..TcpRepr::default()
            };
            if buf.len() < r.header_len() {
                self.counters.tx_buffer_too_small += 1;
                continue;
            }
            let len = r.emit(buf, 0, *tuple.local.ip(), *tuple.remote.ip());
            self.counters.segs_out += 1;
            if r.flags.rst() {
                self.counters.rst_sent += 1;
            }
            // A cookie SYN-ACK carries its listener's IP_TTL / IP_TOS (as
            // the connection made from it will); a stateless RST the
            // defaults.
            let (ttl, tos) = match c {
                Ctrl::CookieSynAck { .. } => self
                    .find_listener(&tuple.local)
                    .and_then(|l| self.listeners.get(l as usize))
                    .and_then(Option::as_ref)
                    .map_or((crate::DEFAULT_TTL, 0), |l| (l.opts.ttl, l.opts.tos)),
                Ctrl::Rst { .. } => (crate::DEFAULT_TTL, 0),
            };
            return Some(Transmit {
                src: *tuple.local.ip(),
                dst: *tuple.remote.ip(),
                len,
                ttl,
                tos,
                csum_partial: false,
            });
        }
        None
    }

    /// A connection taken off the transmit queue with nothing (more) to
    /// send: re-arm its timers, release it if it is dead.
    fn idle(&mut self, idx: u32) {
        let c = self.slots[idx as usize].conn.as_mut().expect("live");
        c.queued = false;
        if c.state == State::Closed && c.orphan && !c.rst_pending && c.rst_reply.is_none() {
            self.release(idx);
        } else {
            arm(&mut self.timers, c, idx, false);
        }
    }

    /// Would [`TcpStack::poll_transmit`] write a segment now? Connections
    /// queued for output that have nothing to send are settled on the way
    /// (as `poll_transmit` would: timers armed, dead orphans released), so
    /// the owner takes a transmit frame (and its lock) only when a segment
    /// will fill it. Never false when `poll_transmit` would send (the
    /// tests' network asserts it on every segment). Costs a few loads per
    /// queued connection.
    #[inline]
    pub fn wants_transmit(&mut self) -> bool {
        // Nothing queued at all (after a received segment whose ACK rides
        // on the answer, after a read, a spinning reader's idle turn): a
        // few loads at the caller, no call.
        if self.ctrl.is_empty() && self.fault_tx.is_none() && self.ready.is_empty() {
            return false;
        }
        self.wants_transmit_queued()
    }

    /// [`TcpStack::wants_transmit`] with something queued.
    #[inline(never)]
    fn wants_transmit_queued(&mut self) -> bool {
        if !self.ctrl.is_empty() || self.fault_tx.is_some() {
            return true;
        }
        while let Some(&idx) = self.ready.front() {
            match self.slots[idx as usize].conn.as_ref() {
                Some(c) if c.may_output() => return true,
                Some(_) => {
                    pop_front(&mut self.ready);
                    self.idle(idx);
                }
                None => {
                    pop_front(&mut self.ready);
                }
            }
        }
        false
    }

    // ------------------------------------------------------------ timers

    /// Earliest instant `poll_timers` should run (may be early, never late).
    pub fn next_deadline(&self) -> Option<u64> {
        debug_assert!(self.owed.is_none(), "a settle is owed");
        [
            self.timers.next_deadline(),
            self.fault_rx.as_ref().and_then(FaultInjector::next_release),
            self.fault_tx.as_ref().and_then(FaultInjector::next_release),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    #[inline]
    pub fn poll_timers(&mut self, now: u64) {
        let now = self.tick(now);
        // No timer due and no injector (every segment's turn but the
        // ms-scale deadlines'): two compares at the caller, no call.
        if self.fault_rx.is_some() || self.timers.is_due(now) {
            self.poll_timers_due(now);
        }
    }

    /// [`TcpStack::poll_timers`] with a timer due or a receive injector.
    #[inline(never)]
    fn poll_timers_due(&mut self, now: u64) {
        if self.fault_rx.is_some() {
            self.release_rx(now);
        }
        if self.timers.is_due(now) {
            self.fire_timers(now);
        }
    }

    /// Fire the connections' timers due at `now`, in the order the heap had
    /// (deadline, then slot); a connection whose timer a fired one re-armed
    /// at or before `now` fires in the next round, as the heap popped it.
    #[inline(never)]
    fn fire_timers(&mut self, now: u64) {
        let mut due = std::mem::take(&mut self.due);
        loop {
            due.clear();
            self.timers.expire(now, &mut due);
            if due.is_empty() {
                break;
            }
            due.sort_unstable();
            for &(t, idx) in &due {
                let Some(c) = self
                    .slots
                    .get_mut(idx as usize)
                    .and_then(|s| s.conn.as_mut())
                else {
                    continue;
                };
                if c.armed != Some(t) {
                    continue;
                }
                c.armed = None;
                c.on_timer(now, &self.cfg, &mut self.counters);
                self.settle(idx);
            }
        }
        self.due = due;
    }

    // ------------------------------------------------------------ API

    pub fn listen(&mut self, local: SocketAddrV4, backlog: usize) -> Result<ListenerId, Error> {
        let o = self.default_opts.clone();
        self.listen_with(local, backlog, o)
    }

    /// Listen with socket options the accepted connections inherit.
    pub fn listen_with(
        &mut self,
        local: SocketAddrV4,
        backlog: usize,
        opts: SocketOptions,
    ) -> Result<ListenerId, Error> {
        if self.listen_map.contains_key(&local) {
            return Err(Error::AddrInUse);
        }
        let l = Listener {
            local,
            opts,
            backlog,
            accept_q: VecDeque::with_capacity(backlog),
            half_open: 0,
            last_overflow: None,
        };
        let idx = match self.listeners.iter().position(Option::is_none) {
            Some(i) => {
                self.listeners[i] = Some(l);
                i
            }
            None => {
                self.listeners.push(Some(l));
                self.listeners.len() - 1
            }
        };
        self.listen_map.insert(local, idx as u32);
        Ok(ListenerId(idx as u32))
    }

    /// Close a listener: connections not yet accepted are reset.
    pub fn close_listener(&mut self, l: ListenerId) {
        let Some(lst) = self.listeners.get_mut(l.0 as usize).and_then(Option::take) else {
            return;
        };
        self.listen_map.remove(&lst.local);
        for idx in lst.accept_q {
            if let Some(c) = self.slots[idx as usize].conn.as_mut() {
                c.abort(Error::Aborted);
                c.orphan = true;
                c.listener = None;
                self.settle(idx);
            }
        }
        let half: Vec<u32> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.conn
                    .as_ref()
                    .is_some_and(|c| c.listener == Some(l.0) && c.state == State::SynReceived)
            })
            .map(|(i, _)| i as u32)
            .collect();
        for idx in half {
            if let Some(c) = self.slots[idx as usize].conn.as_mut() {
                c.abort(Error::Aborted);
                c.orphan = true;
                c.listener = None;
                c.half_open_counted = false;
                self.settle(idx);
            }
        }
    }

    /// The next established connection of a listener.
    pub fn accept(&mut self, l: ListenerId) -> Option<ConnId> {
        let lst = self.listeners.get_mut(l.0 as usize)?.as_mut()?;
        let idx = pop_front(&mut lst.accept_q)?;
        let c = self.slots[idx as usize].conn.as_mut()?;
        c.listener = None;
        c.in_accept_queue = false;
        // Report what happened while it waited in the queue (data, FIN, RST).
        self.settle(idx);
        Some(self.id(idx))
    }

    pub fn accept_queue_len(&self, l: ListenerId) -> usize {
        self.listeners
            .get(l.0 as usize)
            .and_then(Option::as_ref)
            .map_or(0, |l| l.accept_q.len())
    }

    /// Active open. A local port of 0 picks an ephemeral port.
    pub fn connect(
        &mut self,
        now: u64,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> Result<ConnId, Error> {
        let o = self.default_opts.clone();
        self.connect_with(now, local, remote, &o)
    }

    /// Active open with socket options.
    pub fn connect_with(
        &mut self,
        now: u64,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        opts: &SocketOptions,
    ) -> Result<ConnId, Error> {
        let mut tuple = FourTuple { local, remote };
        if local.port() == 0 {
            let span = u32::from(EPHEMERAL.end() - EPHEMERAL.start()) + 1;
            let mut found = false;
            for _ in 0..span {
                let p = self.next_port;
                self.next_port = if p >= *EPHEMERAL.end() {
                    *EPHEMERAL.start()
                } else {
                    p + 1
                };
                tuple.local.set_port(p);
                if !self.demux.contains_key(&tuple) {
                    found = true;
                    break;
                }
            }
            if !found {
                return Err(Error::AddrInUse);
            }
        } else if self.demux.contains_key(&tuple) {
            return Err(Error::AddrInUse);
        }
        let c = Conn::connect(tuple, &self.cfg, opts, &self.secret, now);
        let idx = self.insert(c)?;
        self.counters.active_opens += 1;
        self.settle(idx);
        Ok(self.id(idx))
    }

    fn with<T>(&mut self, c: ConnId, f: impl FnOnce(&mut Conn) -> T) -> Result<T, Error> {
        let k = self.conn_mut(c)?;
        let v = f(k);
        self.settle(c.idx);
        Ok(v)
    }

    pub fn send(&mut self, c: ConnId, data: &[u8]) -> Result<usize, Error> {
        self.with(c, |k| k.send(data))?
    }

    /// [`TcpStack::send`] whose end tracking and timer are owed: the
    /// transmit that follows ([`TcpStack::poll_transmit_owing`]) owes the
    /// same connection's, and one [`TcpStack::settle_owed`] after the frame
    /// left pays both (the timer a write arms is the retransmission's, which
    /// the transmit sets). The caller pays before it does anything else with
    /// the stack.
    pub fn send_owing(&mut self, c: ConnId, data: &[u8]) -> Result<usize, Error> {
        let r = self.conn_mut(c)?.send(data);
        self.settle_later(c.idx);
        r
    }

    pub fn recv(&mut self, c: ConnId, out: &mut [u8]) -> Result<usize, Error> {
        let now = self.clock;
        let k = self.conn_mut(c)?;
        let r = k.recv(out, now);
        // Nothing read, nothing changed: no bookkeeping (a spinning reader
        // calls this in a tight loop).
        if r != Err(Error::WouldBlock) {
            self.settle(c.idx);
        }
        r
    }

    /// shutdown(SHUT_WR).
    pub fn shutdown_write(&mut self, c: ConnId) -> Result<(), Error> {
        self.with(c, |k| k.shutdown_write())
    }

    /// close(): graceful FIN, or RST with SO_LINGER 0 or unread data (as
    /// Linux). The handle is invalid afterwards; the stack finishes the close.
    pub fn close(&mut self, now: u64, c: ConnId) -> Result<(), Error> {
        let fin_timeout = self.cfg.fin_timeout_ns;
        let k = self.conn_mut(c)?;
        match k.state {
            State::Closed | State::SynSent => k.set_closed(None),
            _ if k.linger0 || !k.rx.is_empty() => {
                if !k.rx.is_empty() {
                    k.rx.consume(k.rx.len());
                }
                k.abort(Error::Aborted);
            }
            _ => k.shutdown_write(),
        }
        k.orphan = true;
        if k.state == State::FinWait2 {
            // Already half-closed earlier: start the orphan FIN-WAIT-2 timeout.
            k.state_deadline = Some(now.saturating_add(fin_timeout));
        }
        self.settle(c.idx);
        Ok(())
    }

    /// Abort: RST now, whatever the state.
    pub fn abort(&mut self, c: ConnId) -> Result<(), Error> {
        let k = self.conn_mut(c)?;
        k.abort(Error::Aborted);
        k.orphan = true;
        self.settle(c.idx);
        Ok(())
    }

    pub fn set_nodelay(&mut self, c: ConnId, on: bool) -> Result<(), Error> {
        self.with(c, |k| k.nodelay = on)
    }
    /// TCP_QUICKACK as in Linux: ACK the next segments at once (not sticky).
    pub fn set_quickack(&mut self, c: ConnId, on: bool) -> Result<(), Error> {
        self.with(c, |k| {
            k.app_quickack = on;
            if on {
                k.quickack = k.quickack.max(16);
                if k.delack_deadline.is_some() {
                    k.ack_now = true;
                }
            } else {
                k.quickack = 0;
            }
        })
    }
    /// SO_LINGER with l_onoff=1, l_linger=0: close() sends RST.
    /// IP_TTL / IP_TOS of a connection's segments from now on.
    pub fn set_ip_header(&mut self, c: ConnId, ttl: u8, tos: u8) -> Result<(), Error> {
        let k = self.conn_mut(c)?;
        k.ip_ttl = ttl;
        k.ip_tos = tos;
        Ok(())
    }

    /// IP_TTL / IP_TOS of a listener: its cookie SYN-ACKs and the
    /// connections it creates from now on inherit them (as in Linux, those
    /// already created keep theirs).
    pub fn set_listener_ip_header(&mut self, l: ListenerId, ttl: u8, tos: u8) {
        if let Some(Some(lst)) = self.listeners.get_mut(l.0 as usize) {
            lst.opts.ttl = ttl;
            lst.opts.tos = tos;
        }
    }

    pub fn set_linger0(&mut self, c: ConnId, on: bool) -> Result<(), Error> {
        self.with(c, |k| k.linger0 = on)
    }
    /// SO_KEEPALIVE with TCP_KEEPIDLE/KEEPINTVL/KEEPCNT.
    pub fn set_keepalive(
        &mut self,
        c: ConnId,
        on: bool,
        idle_ns: u64,
        intvl_ns: u64,
        cnt: u32,
    ) -> Result<(), Error> {
        self.with(c, |k| {
            k.keepalive = on;
            k.ka_idle = idle_ns;
            k.ka_intvl = intvl_ns;
            k.ka_cnt = cnt;
        })
    }

    /// The next connection or listener whose readiness changed since it was
    /// last reported (edge-style; the bits are current at the time of the call).
    /// Whether `poll_ready` reports connections' readiness changes (on by
    /// default). An owner that asks `readiness` itself turns them off and
    /// saves a readiness computation and a queue round trip per segment;
    /// listener events stay.
    pub fn set_conn_events(&mut self, on: bool) {
        self.conn_events = on;
    }

    #[inline]
    pub fn poll_ready(&mut self) -> Option<Readiness> {
        // No event (every turn of a connection's owner that turned the
        // connections' events off): one load at the caller, no call.
        if self.events.is_empty() {
            return None;
        }
        self.poll_ready_queued()
    }

    /// [`TcpStack::poll_ready`] with events queued.
    #[inline(never)]
    fn poll_ready_queued(&mut self) -> Option<Readiness> {
        while let Some(ev) = pop_front(&mut self.events) {
            match ev {
                Readiness::Conn(id, _) => {
                    let Some(Slot {
                        generation,
                        conn: Some(c),
                        ..
                    }) = self.slots.get_mut(id.idx as usize)
                    else {
                        continue;
                    };
                    if *generation != id.generation || c.orphan {
                        continue;
                    }
                    c.ev_queued = false;
                    let m = c.readiness();
                    c.ev_mask = m;
                    return Some(Readiness::Conn(id, m));
                }
                l @ Readiness::Listener(_) => return Some(l),
            }
        }
        None
    }

    /// Current `crate::ready` bits of a connection (ERR|HUP for a stale handle).
    pub fn readiness(&self, c: ConnId) -> u8 {
        self.conn(c)
            .map_or(crate::ready::ERR | crate::ready::HUP, Conn::readiness)
    }

    /// MSG_PEEK: copy without consuming.
    pub fn peek(&self, c: ConnId, out: &mut [u8]) -> Result<usize, Error> {
        let k = self.conn(c)?;
        let n = k.rx.peek(0, out);
        if n > 0 || k.rx_fin || out.is_empty() {
            return Ok(n);
        }
        match k.error {
            Some(e) => Err(e),
            None => Err(Error::WouldBlock),
        }
    }

    /// SO_ERROR: the pending error, cleared by reading it.
    pub fn take_error(&mut self, c: ConnId) -> Result<Option<Error>, Error> {
        let k = self.conn_mut(c)?;
        let e = k.error.take();
        if e.is_some() && k.state != State::Closed {
            k.error = e;
        }
        Ok(e)
    }

    pub fn state(&self, c: ConnId) -> Result<State, Error> {
        Ok(self.conn(c)?.state)
    }
    pub fn info(&self, c: ConnId) -> Result<TcpInfo, Error> {
        Ok(self.conn(c)?.info())
    }
    pub fn local_addr(&self, c: ConnId) -> Result<SocketAddrV4, Error> {
        Ok(self.conn(c)?.tuple.local)
    }
    pub fn peer_addr(&self, c: ConnId) -> Result<SocketAddrV4, Error> {
        Ok(self.conn(c)?.tuple.remote)
    }
    /// Bytes received in order so far (grows with every arrival: the edge
    /// of an edge-triggered wait).
    pub fn bytes_received(&self, c: ConnId) -> Result<u64, Error> {
        Ok(self.conn(c)?.bytes_received)
    }

    /// Bytes ready to read.
    pub fn recv_queue(&self, c: ConnId) -> Result<usize, Error> {
        Ok(self.conn(c)?.rx.len())
    }
    /// Of the bytes ready to read, those kept in their frames ([`Hold`]),
    /// and the receive memory those frames pin.
    pub fn rx_held(&self, c: ConnId) -> Result<(usize, usize), Error> {
        let k = self.conn(c)?;
        Ok((k.rx.held_bytes(), k.rx.held_truesize()))
    }
    /// Room in the send buffer.
    pub fn send_space(&self, c: ConnId) -> Result<usize, Error> {
        let k = self.conn(c)?;
        Ok(if k.tx.capacity() == 0 {
            k.sndbuf
        } else {
            k.tx.free()
        })
    }
    /// Bytes written and not yet acknowledged by the peer (SIOCOUTQ).
    pub fn send_queue(&self, c: ConnId) -> Result<usize, Error> {
        Ok(self.conn(c)?.tx.len())
    }
    /// Readable: data, end of file, or an error (EPOLLIN semantics).
    pub fn is_readable(&self, c: ConnId) -> bool {
        self.conn(c).is_ok_and(|k| {
            !k.rx.is_empty() || k.rx_fin || k.error.is_some() || k.state == State::Closed
        })
    }
    /// The peer sent FIN (EPOLLRDHUP).
    pub fn peer_closed(&self, c: ConnId) -> bool {
        self.conn(c).is_ok_and(|k| k.rx_fin)
    }
    pub fn error(&self, c: ConnId) -> Option<Error> {
        self.conn(c).ok().and_then(|k| k.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_fifo_starts_again_at_its_first_slot() {
        let mut q: VecDeque<u64> = VecDeque::with_capacity(1024);
        let first = q.as_slices().0.as_ptr() as usize;
        for i in 0..5000 {
            q.push_back(i);
            q.push_back(i + 1);
            assert_eq!(pop_front(&mut q), Some(i));
            assert_eq!(pop_front(&mut q), Some(i + 1));
        }
        q.push_back(7);
        // Still at the front of its buffer: a queue that never holds more
        // than two touches only its first slots.
        assert_eq!(q.as_slices().0.as_ptr() as usize, first);
        assert_eq!(pop_front(&mut q), Some(7));
        assert_eq!(pop_front(&mut q), None);
    }
}
