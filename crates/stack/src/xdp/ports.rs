//! The client port block (docs/architecture.md, "Client port block").
//!
//! Ports this process reserved once — one kernel socket bound to each,
//! without SO_REUSEADDR/SO_REUSEPORT, so no other socket of the host can
//! take it and the kernel's connect() never picks it — and claimed whole in
//! the steering program, as a listener's (address, port) is. The shared
//! client stack's connects take their local port from here: no bind, no
//! 4-tuple claim (on the engine service: no round trip, no sock_diag) and
//! nothing to give back when the connection ends. A port serves any number
//! of peers at once (the 4-tuples differ) and goes back to a peer only
//! [`REUSE_GAP_NS`] after its last connection ended.
//!
//! The block belongs to the engine (it outlives the client stack, which
//! goes when its last connection does) and closes with it; the steering
//! claims go with the engine's program, or with its connection to the
//! service.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;

/// Most ports one engine's block holds. The listen map (4,096 entries) is
/// shared with listeners, and on the engine service with every process.
pub(super) const MAX_PORTS: usize = 256;
/// Ports looked at per connect before the block grows by one.
const SCAN: usize = 8;
/// A port is taken again for a connection only this long after its last
/// connection ended. A peer that closed first holds that 4-tuple in
/// TIME-WAIT and accepts a new SYN on it only when the SYN's timestamp is
/// newer than the last it saw (RFC 6191; Linux's `tcp_timewait_state_process`)
/// or its sequence number beyond the old connection's: our timestamps for
/// a peer come from one millisecond clock, so 2 ms guarantee a newer one.
pub(super) const REUSE_GAP_NS: u64 = 2_000_000;

struct Port {
    port: u16,
    /// The kernel socket holding the port (the engine's own: closed raw).
    fd: RawFd,
    /// `now_ns` when its last connection ended (0: never used).
    ended: u64,
    /// Its connection was handed over to the kernel: the kernel's socket
    /// now owns a 4-tuple of it, so it is never taken again.
    retired: bool,
}

#[derive(Default)]
pub(super) struct PortBlock {
    src: Option<Ipv4Addr>,
    ports: Vec<Port>,
    /// Where the next look starts (round robin: the port used longest ago
    /// comes first).
    next: usize,
    /// Growing failed for good (the service refused a claim, the listen map
    /// is full): connects bind a port each, as without a block.
    off: bool,
    /// Ports added, or given back by their connection, so far: what can
    /// make a port free for a peer (besides time: [`REUSE_GAP_NS`]).
    changes: u64,
    /// The last look at every port that found none free for a peer: (the
    /// peer, `changes` then, when the first port held back by its reuse
    /// gap becomes free: `u64::MAX` if none was). A full block whose ports all hold a
    /// 4-tuple to that peer (the client's own TIME-WAIT: a connect loop
    /// that closes first) answers the next connects from here instead of a
    /// 4-tuple lookup per port per connect (256 lookups, ~26,000
    /// instructions a connect; docs/benchmarks.md, "Session 15: churn").
    miss: Option<(SocketAddrV4, u64, u64)>,
    /// When the first port the last [`PortBlock::pick`] passed over for its
    /// reuse gap becomes free (`u64::MAX`: none was).
    gap_ends: u64,
}

impl PortBlock {
    /// May the block serve a connect from `src`? (One source address per
    /// block: the route's; other sources bind per connection.)
    pub fn serves(&self, src: Ipv4Addr) -> bool {
        !self.off && self.src.is_none_or(|s| s == src)
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.ports[i].port
    }

    pub fn src(&self) -> Option<Ipv4Addr> {
        self.src
    }

    /// The block's ports (to bind them in a new stack's demux endpoint).
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports.iter().map(|p| p.port)
    }

    /// A port whose 4-tuple to the peer is free (`free(port)`) and whose
    /// last connection ended long enough ago; `all`: look at every port,
    /// else at the next [`SCAN`] only (the caller grows the block first).
    pub fn pick(&mut self, now: u64, all: bool, free: impl Fn(u16) -> bool) -> Option<usize> {
        let n = self.ports.len();
        let look = if all { n } else { n.min(SCAN) };
        let mut gap_ends = u64::MAX;
        for k in 0..look {
            let i = (self.next + k) % n;
            let p = &self.ports[i];
            if p.retired {
                continue;
            }
            if p.ended != 0 && now.saturating_sub(p.ended) < REUSE_GAP_NS {
                gap_ends = gap_ends.min(p.ended + REUSE_GAP_NS);
            } else if free(p.port) {
                self.next = (i + 1) % n;
                return Some(i);
            }
        }
        self.gap_ends = gap_ends;
        None
    }

    /// Did the last look at every port find none for `peer`, with nothing
    /// that could free one since: no port given back or added, and no port
    /// that was held back only by its reuse gap past it yet. (A port whose
    /// 4-tuple to the peer is taken is freed only by its connection's end,
    /// which [`PortBlock::ended`] counts.) A wrong "yes" would cost only a
    /// port bound for that connection alone.
    pub fn known_miss(&self, peer: SocketAddrV4, now: u64) -> bool {
        self.miss
            .is_some_and(|(p, changes, until)| p == peer && changes == self.changes && now < until)
    }

    /// The look [`PortBlock::pick`] just made at every port found none
    /// free for `peer`.
    pub fn note_miss(&mut self, peer: SocketAddrV4) {
        self.miss = Some((peer, self.changes, self.gap_ends));
    }

    /// Add a port the caller bound (`fd`, the engine's own socket) and
    /// claimed; its index.
    pub fn push(&mut self, src: Ipv4Addr, port: u16, fd: RawFd) -> usize {
        self.changes += 1;
        self.src = Some(src);
        self.ports.push(Port {
            port,
            fd,
            ended: 0,
            retired: false,
        });
        self.ports.len() - 1
    }

    /// Connects stop using the block (a claim was refused).
    pub fn turn_off(&mut self) {
        self.off = true;
    }

    /// The connection on port `i` ended at `now`.
    pub fn ended(&mut self, i: usize, now: u64) {
        if let Some(p) = self.ports.get_mut(i) {
            p.ended = now;
            self.changes += 1;
        }
    }

    /// The connection on port `i` went to the kernel.
    pub fn retire(&mut self, i: usize) {
        if let Some(p) = self.ports.get_mut(i) {
            p.retired = true;
        }
    }

    /// Another block's ports join this one (a client stack gave its block
    /// back while a newer stack had started one).
    pub fn absorb(&mut self, mut other: PortBlock) {
        if self.ports.is_empty() {
            std::mem::swap(self, &mut other);
            return;
        }
        if other.src != self.src {
            // Dropped: its sockets close, its ports go back to the kernel
            // (their claims stay until the engine goes: nothing uses them).
            return;
        }
        self.ports.append(&mut other.ports);
        self.off |= other.off;
        self.changes += 1;
    }
}

impl Drop for PortBlock {
    fn drop(&mut self) {
        for p in &self.ports {
            // The engine's own descriptors: the raw close (engine code never
            // enters the shim's close).
            nanowire_xdp::sys::close(p.fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: u16) -> PortBlock {
        let mut b = PortBlock::default();
        for p in 0..n {
            // No real descriptors: -1 closes nothing.
            b.push(Ipv4Addr::new(198, 18, 0, 1), 40001 + 2 * p, -1);
        }
        b
    }

    #[test]
    fn ports_come_round_in_turn_and_only_after_the_gap() {
        let mut b = block(3);
        let t = 10 * REUSE_GAP_NS;
        let got: Vec<u16> = (0..3)
            .map(|_| {
                let i = b.pick(t, false, |_| true).unwrap();
                b.port(i)
            })
            .collect();
        assert_eq!(got, [40001, 40003, 40005]);
        b.ended(0, t);
        b.ended(1, t);
        b.ended(2, t + REUSE_GAP_NS / 2);
        assert_eq!(b.pick(t + REUSE_GAP_NS / 2, true, |_| true), None);
        assert_eq!(b.pick(t + REUSE_GAP_NS, true, |_| true), Some(0));
        // Busy 4-tuples (40001 just taken, 40003) are skipped.
        let free = |p: u16| p != 40001 && p != 40003;
        assert_eq!(b.pick(t + REUSE_GAP_NS, true, free), None);
        assert_eq!(b.pick(t + 2 * REUSE_GAP_NS, true, free), Some(2));
    }

    #[test]
    fn a_retired_port_is_never_taken_and_other_sources_are_not_served() {
        let mut b = block(1);
        b.retire(0);
        assert_eq!(b.pick(1, true, |_| true), None);
        assert!(b.serves(Ipv4Addr::new(198, 18, 0, 1)));
        assert!(!b.serves(Ipv4Addr::new(198, 18, 0, 9)));
        b.turn_off();
        assert!(!b.serves(Ipv4Addr::new(198, 18, 0, 1)));
    }

    #[test]
    fn a_miss_for_a_peer_holds_until_a_port_changes_or_the_gap_passes() {
        let mut b = block(4);
        let peer = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 80);
        let other = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 81);
        let t = 10 * REUSE_GAP_NS;
        assert!(!b.known_miss(peer, t));
        // Every 4-tuple to the peer taken (the client's own TIME-WAITs):
        // nothing but a port's end frees one, however long it takes.
        assert_eq!(b.pick(t, true, |_| false), None);
        b.note_miss(peer);
        assert!(b.known_miss(peer, t + 1000 * REUSE_GAP_NS));
        assert!(!b.known_miss(other, t), "another peer's 4-tuples differ");
        // A connection on one of its ports ended: that port may be free.
        b.ended(1, t + 1);
        assert!(!b.known_miss(peer, t + 2));
        // Looked at again within that port's gap: the miss holds until the
        // gap has passed, then the port is taken.
        assert_eq!(b.pick(t + 2, true, |p| p == 40003), None);
        b.note_miss(peer);
        assert!(b.known_miss(peer, t + REUSE_GAP_NS));
        assert!(!b.known_miss(peer, t + 1 + REUSE_GAP_NS));
        assert_eq!(b.pick(t + 1 + REUSE_GAP_NS, true, |p| p == 40003), Some(1));
        // A new port may be free too.
        assert_eq!(b.pick(t + 2, true, |_| false), None);
        b.note_miss(peer);
        assert!(b.known_miss(peer, t + 3));
        b.push(Ipv4Addr::new(198, 18, 0, 1), 50001, -1);
        assert!(!b.known_miss(peer, t + 3));
    }

    #[test]
    fn a_partial_look_sees_at_most_scan_ports() {
        let mut b = block(SCAN as u16 + 2);
        let last = b.len() - 1;
        let port_last = b.ports[last].port;
        assert_eq!(b.pick(1, false, |p| p == port_last), None);
        assert_eq!(b.pick(1, true, |p| p == port_last), Some(last));
    }
}
