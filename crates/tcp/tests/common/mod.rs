//! A deterministic two-host network on a simulated clock: stacks `a` and `b`
//! joined by a link with a fault injector in each direction.

#![allow(dead_code)]

use nanowire_tcp::fault::{FaultConfig, FaultInjector};
use nanowire_tcp::{
    Config, ConnId, DirectRead, HeldBytes, Hold, Intake, Secret, TcpStack, Transmit,
};
use nanowire_wire::checksum;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const MS: u64 = 1_000_000;
pub const S: u64 = 1_000_000_000;

pub fn sa(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}

/// Decides whether a segment (TCP bytes) is dropped.
pub type DropFn = Box<dyn FnMut(&[u8]) -> bool>;

pub struct Net {
    pub now: u64,
    pub a: TcpStack,
    pub b: TcpStack,
    pub ab: FaultInjector,
    pub ba: FaultInjector,
    /// Drop everything (a cable pulled).
    pub down: bool,
    buf: Vec<u8>,
    /// Segments that crossed the link (after the injector).
    pub delivered: u64,
    /// Drop a b→a segment (TCP bytes) when this says so.
    pub drop_ba: Option<DropFn>,
    /// Hand every segment to the receiving stack in pieces (as a
    /// multi-buffer packet's buffers, odd lengths among them).
    pub split: bool,
    /// Flip a byte in a later piece of the next split segment with data.
    pub corrupt_piece: bool,
    /// Segments sent with a partial checksum, completed by the link as a
    /// device's checksum offload does.
    pub offloaded: u64,
    /// An application of a waiting in a read when segments arrive.
    pub reader: Option<Reader>,
    /// Offer a's connections every arriving segment's "frame" to keep
    /// ([`Hold`]), as the engine does, within a budget of frames.
    pub hold: Option<HoldSim>,
}

/// The engine's side of [`Hold`] in the simulation: "frames" of
/// `frame_bytes` (each carrying `frame_payload` bytes of a segment), at
/// most `budget` of them held at once over all connections; `live` counts
/// those held now (each held body gives its frames back when dropped),
/// `peak` the most ever held.
pub struct HoldSim {
    pub budget: usize,
    pub frame_bytes: usize,
    pub frame_payload: usize,
    pub live: Arc<AtomicUsize>,
    pub peak: usize,
    /// Offers made and kept.
    pub offered: u64,
    pub kept: u64,
}

impl HoldSim {
    pub fn new(budget: usize) -> HoldSim {
        HoldSim {
            budget,
            frame_bytes: 2048,
            frame_payload: 1792,
            live: Arc::new(AtomicUsize::new(0)),
            peak: 0,
            offered: 0,
            kept: 0,
        }
    }
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

/// A held "frame": a copy of the segment's payload standing for the
/// receive memory it arrived in.
struct SimFrame {
    data: Vec<u8>,
    frames: usize,
    live: Arc<AtomicUsize>,
}

impl HeldBytes for SimFrame {
    fn len(&self) -> usize {
        self.data.len()
    }
    fn copy_out(&self, at: usize, out: &mut [u8]) -> usize {
        let src = self.data.get(at..).unwrap_or(&[]);
        let n = src.len().min(out.len());
        out[..n].copy_from_slice(&src[..n]);
        n
    }
}

impl Drop for SimFrame {
    fn drop(&mut self) {
        self.live.fetch_sub(self.frames, Ordering::Relaxed);
    }
}

fn wire(src: Ipv4Addr, dst: Ipv4Addr, seg: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + seg.len());
    v.extend_from_slice(&src.octets());
    v.extend_from_slice(&dst.octets());
    v.extend_from_slice(seg);
    v
}

impl Net {
    pub fn new(ca: Config, cb: Config, fault: FaultConfig) -> Net {
        let mut fb = fault.clone();
        fb.seed = fault.seed.wrapping_add(1);
        let base = FaultConfig {
            delay_ns: fault.delay_ns.max(10_000),
            ..fault
        };
        let fb = FaultConfig {
            delay_ns: base.delay_ns,
            ..fb
        };
        Net {
            now: 1_000 * S,
            a: TcpStack::new(ca, Secret::from_bytes([1; 16])),
            b: TcpStack::new(cb, Secret::from_bytes([2; 16])),
            ab: FaultInjector::new(base),
            ba: FaultInjector::new(fb),
            down: false,
            buf: vec![0u8; 70_000],
            delivered: 0,
            drop_ba: None,
            split: false,
            corrupt_piece: false,
            offloaded: 0,
            reader: None,
            hold: None,
        }
    }

    pub fn plain() -> Net {
        Net::new(Config::default(), Config::default(), FaultConfig::default())
    }

    /// Both ends with `cfg`, over a clean link.
    pub fn both(cfg: Config) -> Net {
        Net::new(cfg.clone(), cfg, FaultConfig::default())
    }

    /// One round: transmit everything, deliver what is due, fire timers.
    /// Returns whether anything happened.
    fn round(&mut self) -> bool {
        let mut any = false;
        self.a.poll_timers(self.now);
        self.b.poll_timers(self.now);
        while let Some(t) = transmit(&mut self.a, self.now, &mut self.buf) {
            any = true;
            self.offloaded += u64::from(offload(&t, &mut self.buf));
            if !self.down {
                self.ab
                    .push(self.now, &wire(t.src, t.dst, &self.buf[..t.len]));
            }
        }
        while let Some(t) = transmit(&mut self.b, self.now, &mut self.buf) {
            any = true;
            self.offloaded += u64::from(offload(&t, &mut self.buf));
            if let Some(f) = self.drop_ba.as_mut()
                && f(&self.buf[..t.len])
            {
                continue;
            }
            if !self.down {
                self.ba
                    .push(self.now, &wire(t.src, t.dst, &self.buf[..t.len]));
            }
        }
        while let Some(p) = self.ab.pop(self.now) {
            any = true;
            self.delivered += 1;
            feed(
                &mut self.b,
                self.now,
                &p,
                self.split,
                &mut self.corrupt_piece,
                Intake::default(),
            );
        }
        while let Some(p) = self.ba.pop(self.now) {
            any = true;
            self.delivered += 1;
            let mut buf = vec![0u8; self.reader.as_ref().map_or(0, |r| r.chunk)];
            let mut read = self.reader.as_ref().map(|r| DirectRead {
                conn: r.conn,
                buf: &mut buf,
                filled: 0,
            });
            let seg = &p[8..];
            let payload = if seg.len() >= 20 {
                &seg[(usize::from(seg[12] >> 4) * 4).min(seg.len())..]
            } else {
                &[]
            };
            let frames = payload
                .len()
                .div_ceil(self.hold.as_ref().map_or(1, |h| h.frame_payload));
            let live = self.hold.as_ref().map(|h| h.live.clone());
            let mut keep = || -> Box<dyn HeldBytes> {
                let live = live.clone().expect("offered only with a HoldSim");
                live.fetch_add(frames, Ordering::Relaxed);
                Box::new(SimFrame {
                    data: payload.to_vec(),
                    frames,
                    live,
                })
            };
            let mut offer = self
                .hold
                .as_ref()
                .filter(|h| !payload.is_empty() && h.live() + frames <= h.budget)
                .map(|h| Hold {
                    len: payload.len(),
                    truesize: frames * h.frame_bytes,
                    keep: &mut keep,
                    kept: false,
                });
            feed(
                &mut self.a,
                self.now,
                &p,
                self.split,
                &mut self.corrupt_piece,
                Intake {
                    read: read.as_mut(),
                    hold: offer.as_mut(),
                },
            );
            let offered = offer.is_some();
            let kept = offer.is_some_and(|o| o.kept);
            if let Some(h) = self.hold.as_mut() {
                h.offered += u64::from(offered);
                h.kept += u64::from(kept);
                h.peak = h.peak.max(h.live());
            }
            let filled = read.map_or(0, |d| d.filled);
            if let Some(r) = self.reader.as_mut() {
                r.got.extend_from_slice(&buf[..filled]);
            }
        }
        any
    }

    fn next_event(&self) -> Option<u64> {
        [
            self.a.next_deadline(),
            self.b.next_deadline(),
            self.ab.next_release(),
            self.ba.next_release(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Run until `done` says so (called after every round). Panics after
    /// `limit` of simulated time (a hang the test must report).
    pub fn run_until(&mut self, limit: u64, mut done: impl FnMut(&mut Net) -> bool) {
        let end = self.now + limit;
        loop {
            let any = self.round();
            if done(self) {
                return;
            }
            // What `done` did (reads, writes) may have queued output.
            if !any && !self.round() {
                match self.next_event() {
                    Some(t) if t <= end => self.now = self.now.max(t),
                    _ => panic!(
                        "simulation stalled or timed out at +{} ms",
                        (self.now + limit - end) / MS
                    ),
                }
            }
            assert!(self.now <= end, "simulated time limit reached");
        }
    }

    /// Let time pass (events are processed) for `d`.
    pub fn advance(&mut self, d: u64) {
        let end = self.now + d;
        loop {
            let any = self.round();
            if !any {
                match self.next_event() {
                    Some(t) if t <= end => self.now = self.now.max(t),
                    _ => {
                        self.now = end;
                        self.round();
                        return;
                    }
                }
            }
        }
    }

    /// a listens on port 80, b connects; returns (a's side, b's side).
    pub fn connect_pair(&mut self) -> (ConnId, ConnId) {
        let l = self.a.listen(sa(A, 80), 128).unwrap();
        let cb = self.b.connect(self.now, sa(B, 0), sa(A, 80)).unwrap();
        let mut ca = None;
        self.run_until(10 * S, |n| {
            if ca.is_none() {
                ca = n.a.accept(l);
            }
            ca.is_some() && n.b.state(cb) == Ok(nanowire_tcp::State::Established)
        });
        (ca.unwrap(), cb)
    }
}

/// A device's checksum offload on a segment sent with a partial checksum:
/// the ones' complement sum from the segment's first byte (the field,
/// holding the pseudo-header's sum, included), folded, inverted, stored.
fn offload(t: &Transmit, buf: &mut [u8]) -> bool {
    if !t.csum_partial {
        return false;
    }
    let seg = &mut buf[..t.len];
    let c = !checksum::fold(checksum::accumulate(0, seg));
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    true
}

/// Give `stack` the segment `p` (addresses first) whole, or split into
/// pieces: the header and 3 payload bytes, then 7, 1 and 1000 bytes, then
/// the rest.
fn feed(
    stack: &mut TcpStack,
    now: u64,
    p: &[u8],
    split: bool,
    corrupt: &mut bool,
    to: Intake<'_, '_, '_>,
) {
    let (s, d) = addrs(p);
    let seg = &p[8..];
    if !split || seg.len() < 20 {
        return stack.input_with(now, s, d, seg, &[], to);
    }
    let cut = (usize::from(seg[12] >> 4) * 4 + 3).min(seg.len());
    let mut owned = seg.to_vec();
    if *corrupt && owned.len() > cut + 8 {
        // The 1-byte piece: a byte at an odd offset of its own.
        owned[cut + 7] ^= 0x5a;
        *corrupt = false;
    }
    let mut rest: Vec<&[u8]> = Vec::new();
    let mut at = cut;
    for len in [7usize, 1, 1000, usize::MAX] {
        if at >= owned.len() {
            break;
        }
        let e = at.saturating_add(len).min(owned.len());
        rest.push(&owned[at..e]);
        at = e;
    }
    stack.input_with(now, s, d, &owned[..cut], &rest, to);
}

/// An application of a that waits in a read of `chunk` bytes on `conn`
/// whenever a segment arrives ([`DirectRead`]); what it gets is appended to
/// `got` (a test appends what it reads with `recv` there too: one stream).
pub struct Reader {
    pub conn: ConnId,
    pub chunk: usize,
    pub got: Vec<u8>,
}

fn addrs(p: &[u8]) -> (Ipv4Addr, Ipv4Addr) {
    (
        Ipv4Addr::new(p[0], p[1], p[2], p[3]),
        Ipv4Addr::new(p[4], p[5], p[6], p[7]),
    )
}

/// The byte at stream offset `off` of the test pattern.
pub fn pattern(off: u64) -> u8 {
    let x = off.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 29) as u8 ^ (off as u8)
}

/// Push a patterned stream of `total` bytes through `tx` → `rx`, checking
/// every byte. Returns when everything arrived.
pub struct Stream {
    pub sent: u64,
    pub recvd: u64,
    pub total: u64,
    chunk: Vec<u8>,
}

impl Stream {
    pub fn new(total: u64) -> Stream {
        Stream {
            sent: 0,
            recvd: 0,
            total,
            chunk: vec![0u8; 65536],
        }
    }

    /// Move data; true when all of it arrived intact.
    pub fn pump(
        &mut self,
        tx: &mut TcpStack,
        c_tx: ConnId,
        rx: &mut TcpStack,
        c_rx: ConnId,
    ) -> bool {
        while self.sent < self.total {
            let n = ((self.total - self.sent) as usize).min(self.chunk.len());
            for (i, b) in self.chunk[..n].iter_mut().enumerate() {
                *b = pattern(self.sent + i as u64);
            }
            match tx.send(c_tx, &self.chunk[..n]) {
                Ok(k) => self.sent += k as u64,
                Err(nanowire_tcp::Error::WouldBlock) => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        loop {
            match rx.recv(c_rx, &mut self.chunk) {
                Ok(0) => break,
                Ok(k) => {
                    for (i, b) in self.chunk[..k].iter().enumerate() {
                        assert_eq!(
                            *b,
                            pattern(self.recvd + i as u64),
                            "byte {} corrupted",
                            self.recvd + i as u64
                        );
                    }
                    self.recvd += k as u64;
                }
                Err(nanowire_tcp::Error::WouldBlock) => break,
                Err(e) => panic!("recv: {e}"),
            }
        }
        assert!(self.recvd <= self.total);
        self.recvd == self.total
    }
}

/// `poll_transmit`, as the engine drives it: `wants_transmit` first (the
/// engine takes a TX frame only when it says yes), the segment's settle
/// owed until it left (`poll_transmit_owing`, `settle_owed`). Checks on
/// every call that it never says no while a segment is due, and that after
/// a segment `transmit_queued` never says no while another is due (the
/// engine ends its batch there).
pub fn transmit(stack: &mut TcpStack, now: u64, buf: &mut [u8]) -> Option<Transmit> {
    let want = stack.wants_transmit();
    let t = stack.poll_transmit_owing(now, buf);
    assert!(
        want || t.is_none(),
        "wants_transmit said nothing is due, poll_transmit sent {t:?}"
    );
    if t.is_some() && !stack.transmit_queued() {
        let mut more = vec![0u8; buf.len()];
        let t2 = stack.poll_transmit(now, &mut more);
        assert!(
            t2.is_none(),
            "transmit_queued said nothing is queued after {t:?}, {t2:?} followed"
        );
    }
    stack.settle_owed();
    t
}
