//! Transmit: frames from the TX pool, Ethernet/IPv4/UDP headers with a full
//! UDP checksum, batches of at most one kick's budget.
//!
//! `TxPath` lives under the engine's TX lock, which is held only while
//! frames are written and posted (never across a netlink call or a user
//! closure). Counters written here (`tx_*`, per-socket `tx_*`) have this
//! lock as their single writer.

use super::shm::{E, S, StatsPage, bump};
use nanowire_wire::{Ipv4Repr, UdpRepr};
use nanowire_xdp::XskTx;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

pub(crate) const ETH_HDR: usize = 14;
pub(crate) const IP_HDR: usize = 20;
pub(crate) const UDP_HDR: usize = 8;
pub(crate) const HDRS: usize = ETH_HDR + IP_HDR + UDP_HDR;

/// Where a datagram goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wire {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub mac: [u8; 6],
}

/// The IP header fields a UDP socket's options set: IP_TTL (unicast),
/// IP_MULTICAST_TTL and IP_TOS, as the kernel socket resolved them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHeader {
    pub ttl: u8,
    pub mcast_ttl: u8,
    pub tos: u8,
}

impl Default for IpHeader {
    /// A fresh socket's: TTL 64, multicast TTL 1, TOS 0.
    fn default() -> IpHeader {
        IpHeader {
            ttl: 64,
            mcast_ttl: 1,
            tos: 0,
        }
    }
}

impl IpHeader {
    #[inline]
    fn ttl_to(&self, dst: &Ipv4Addr) -> u8 {
        if dst.is_multicast() {
            self.mcast_ttl
        } else {
            self.ttl
        }
    }
}

pub(crate) struct TxPath {
    pub xsk: XskTx,
    pub ip_id: u16,
    pub mac: [u8; 6],
    /// Frames per kick (the copy-mode budget).
    pub per_kick: usize,
    pub page: Arc<StatsPage>,
    /// Scratch for multi-buffer (jumbo) frames.
    pub big: Vec<u8>,
    /// Copies of sent frames for `nanowire capture` (crates/tap).
    pub tap: nanowire_tap::TapWriter,
    /// Transmit-side faults of the `faults` option (loss, duplication,
    /// corruption of whole frames; off: `None`).
    pub faults: Option<TxFaults>,
    /// Set by a socket with transmit stamping around its `send` (None: no
    /// cost but one branch per frame).
    pub stamp: Option<TxStamp>,
}

pub(crate) struct TxFaults {
    inj: nanowire_tcp::fault::FaultInjector,
    seen: nanowire_tcp::fault::FaultStats,
    out: Vec<Vec<u8>>,
}

impl TxFaults {
    pub fn new(cfg: nanowire_tcp::fault::FaultConfig) -> TxFaults {
        TxFaults {
            inj: nanowire_tcp::fault::FaultInjector::new(cfg),
            seen: Default::default(),
            out: Vec::new(),
        }
    }
    /// Run built frames through the injector: `self.out` gets what goes on
    /// the wire (none, one, two copies; maybe with a flipped bit).
    fn run(&mut self, frames: &[&[u8]], page: &StatsPage) {
        self.out.clear();
        for f in frames {
            self.inj.push(0, f);
            while let Some(p) = self.inj.pop(0) {
                self.out.push(p);
            }
        }
        let st = &self.inj.stats;
        let d = |a: u64, b: u64| a.saturating_sub(b);
        bump(page.e(E::FaultTxLost), d(st.dropped, self.seen.dropped));
        bump(
            page.e(E::FaultTxDuplicated),
            d(st.duplicated, self.seen.duplicated),
        );
        bump(
            page.e(E::FaultTxCorrupted),
            d(st.corrupted, self.seen.corrupted),
        );
        self.seen = st.clone();
    }
}

/// A transmit stamp request (`SOF_TIMESTAMPING_TX_SOFTWARE` in the shim).
#[derive(Debug, Default)]
pub(crate) struct TxStamp {
    /// Keep a copy of the last frame sent (the error queue returns it
    /// unless `SOF_TIMESTAMPING_OPT_TSONLY`).
    pub want_frame: bool,
    /// The last frame sent through the ring (when `want_frame`).
    pub frame: Vec<u8>,
    /// `CLOCK_REALTIME` ns when the kick that handed the frames to the
    /// driver returned; 0: nothing went through the ring.
    pub at: u64,
    /// The `OPT_ID` key of the datagram being sent, for the kernel path
    /// (`SCM_TS_OPT_ID`: the kernel stamps it under the same key).
    pub key: Option<u32>,
}

/// What one `send` did.
pub(crate) struct Sent {
    pub n: usize,
}

impl TxPath {
    /// Send `bufs` (each `fits`) as datagrams; counted on socket `slot`.
    /// `Ok(n)`: n queued (fewer when the ring stayed full after a kick).
    pub fn send(&mut self, bufs: &[&[u8]], w: Wire, slot: usize) -> io::Result<Sent> {
        self.send_hdr(bufs, w, IpHeader::default(), slot)
    }

    /// `send` with the socket's IP header fields `h`.
    pub fn send_hdr(
        &mut self,
        bufs: &[&[u8]],
        w: Wire,
        h: IpHeader,
        slot: usize,
    ) -> io::Result<Sent> {
        // Faults act on datagrams of one frame; a jumbo (multi-buffer)
        // datagram takes the plain path.
        if self.faults.is_some()
            && bufs
                .first()
                .is_some_and(|b| HDRS + b.len() <= self.xsk.frame_size())
        {
            return self.send_faulty(bufs, w, h, slot);
        }
        let per_kick = self.per_kick;
        let fs = self.xsk.frame_size();
        let mut sent = 0;
        let mut i = 0;
        while i < bufs.len() {
            // A run of datagrams that fit one frame, at most one kick's worth.
            let mut j = i;
            while j < bufs.len() && j - i < per_kick && HDRS + bufs[j].len() <= fs {
                j += 1;
            }
            let k = if j > i {
                let chunk = &bufs[i..j];
                let (mac, mut id) = (self.mac, self.ip_id);
                let tap = &mut self.tap;
                let stamp = &mut self.stamp;
                let k = self.xsk.send_with(chunk.len(), |n, fr| {
                    id = id.wrapping_add(1);
                    let len = build_frame_hdr(
                        fr,
                        mac,
                        w.mac,
                        *w.src.ip(),
                        w.src.port(),
                        w.dst,
                        chunk[n],
                        id,
                        h,
                    );
                    tap.record(&fr[..len]);
                    if let Some(s) = stamp.as_mut()
                        && s.want_frame
                    {
                        s.frame.clear();
                        s.frame.extend_from_slice(&fr[..len]);
                    }
                    Some(len)
                });
                self.ip_id = self.ip_id.wrapping_add(k as u16);
                self.count(&chunk[..k], slot);
                k
            } else {
                // One jumbo datagram in several buffers.
                let b = bufs[i];
                self.big.resize(HDRS + b.len(), 0);
                self.ip_id = self.ip_id.wrapping_add(1);
                let n = build_frame_hdr(
                    &mut self.big,
                    self.mac,
                    w.mac,
                    *w.src.ip(),
                    w.src.port(),
                    w.dst,
                    b,
                    self.ip_id,
                    h,
                );
                if self.xsk.send_large(&self.big[..n]) {
                    self.tap.record(&self.big[..n]);
                    if let Some(s) = self.stamp.as_mut()
                        && s.want_frame
                    {
                        s.frame.clear();
                        s.frame.extend_from_slice(&self.big[..n]);
                    }
                    self.count(&bufs[i..i + 1], slot);
                    1
                } else {
                    0
                }
            };
            sent += k;
            if i + k < j.max(i + 1) {
                break; // ring or pool full
            }
            i += k;
        }
        if sent == 0 && !bufs.is_empty() {
            // Ring full even after reaping: kick and report the drop.
            self.xsk.kick();
            self.xsk.reap();
            bump(self.page.e(E::DropTxRingFull), 1);
            bump(self.page.s(slot, S::DropTxRingFull), 1);
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "xdp tx ring full",
            ));
        }
        // A kick the kernel could not finish (EAGAIN/ENOBUFS) leaves frames
        // in the ring: kick once more rather than strand them until the
        // next send.
        if self.xsk.occupancy() > 0 {
            self.xsk.kick();
        }
        self.xsk.reap();
        if let Some(s) = self.stamp.as_mut() {
            // The kick has returned: in copy mode the kernel has passed the
            // frames through the driver's transmit (where it stamps its own
            // sockets' frames); in zero-copy mode they are posted.
            s.at = nanowire_tap::now_ns();
        }
        if let Some(e) = self.xsk.kick_error() {
            return Err(e);
        }
        Ok(Sent { n: sent })
    }

    /// `send` with the transmit fault injector on: frames are built in
    /// memory, run through the injector and what survives is posted. A
    /// datagram the injector drops counts as sent (it was lost on the wire).
    fn send_faulty(
        &mut self,
        bufs: &[&[u8]],
        w: Wire,
        h: IpHeader,
        slot: usize,
    ) -> io::Result<Sent> {
        let fs = self.xsk.frame_size();
        // The run of datagrams that fit one frame, at most one kick's worth
        // (the caller sends the rest with its next call, as for a full ring).
        let bufs: Vec<&[u8]> = bufs
            .iter()
            .copied()
            .take_while(|b| HDRS + b.len() <= fs)
            .take(self.per_kick)
            .collect();
        let mut built: Vec<Vec<u8>> = Vec::with_capacity(bufs.len());
        for b in &bufs {
            let mut f = vec![0u8; HDRS + b.len()];
            self.ip_id = self.ip_id.wrapping_add(1);
            build_frame_hdr(
                &mut f,
                self.mac,
                w.mac,
                *w.src.ip(),
                w.src.port(),
                w.dst,
                b,
                self.ip_id,
                h,
            );
            built.push(f);
        }
        let refs: Vec<&[u8]> = built.iter().map(|f| &f[..]).collect();
        self.post(&refs);
        self.count(&bufs, slot);
        if let Some(e) = self.xsk.kick_error() {
            return Err(e);
        }
        Ok(Sent { n: bufs.len() })
    }

    /// Post whole frames (the engine's TCP builds its own), through the
    /// transmit fault injector when it is on. Returns how many of `frames`
    /// were taken (lost-by-injection counts as taken); fewer when the ring
    /// is full.
    pub fn post(&mut self, frames: &[&[u8]]) -> usize {
        let mut faults = self.faults.take();
        let n = match faults.as_mut() {
            None => self.post_plain(frames),
            Some(f) => {
                f.run(frames, &self.page);
                let out: Vec<&[u8]> = f.out.iter().map(|v| &v[..]).collect();
                self.post_plain(&out);
                frames.len()
            }
        };
        self.faults = faults;
        if self.xsk.occupancy() > 0 {
            self.xsk.kick();
        }
        self.xsk.reap();
        n
    }

    /// Build up to `max` frames straight in the TX ring's frames (one copy
    /// per frame: `fill` writes headers and payload in place, returning the
    /// length, or `None` to stop with nothing queued for that frame), post
    /// them as one batch, kick once and reap completions. Not for the
    /// `faults` injector (which needs the frames as slices: `post`).
    /// Returns frames posted; the ring or pool running out ends the batch
    /// early without calling `fill` again (nothing is lost).
    #[inline]
    pub fn post_with(
        &mut self,
        max: usize,
        mut fill: impl FnMut(usize, &mut [u8]) -> Option<usize>,
    ) -> usize {
        debug_assert!(self.faults.is_none());
        let TxPath { xsk, tap, .. } = self;
        let n = xsk.send_with(max, |i, fr| {
            let len = fill(i, fr)?;
            tap.record(&fr[..len.min(fr.len())]);
            Some(len)
        });
        if self.xsk.occupancy() > 0 {
            self.xsk.kick();
        }
        self.xsk.reap();
        n
    }

    fn post_plain(&mut self, frames: &[&[u8]]) -> usize {
        let tap = &mut self.tap;
        self.xsk.send_with(frames.len(), |i, fr| {
            let f = frames[i];
            if f.len() > fr.len() {
                return None;
            }
            fr[..f.len()].copy_from_slice(f);
            tap.record(f);
            Some(f.len())
        })
    }

    fn count(&self, sent: &[&[u8]], slot: usize) {
        let p = &self.page;
        let b: u64 = sent.iter().map(|b| b.len() as u64).sum();
        bump(p.e(E::TxPackets), sent.len() as u64);
        bump(p.e(E::TxBytes), b);
        bump(p.s(slot, S::TxPackets), sent.len() as u64);
        bump(p.s(slot, S::TxBytes), b);
    }
}

/// Write Ethernet + IPv4 + UDP (full checksum) + payload into `fr`;
/// returns the frame length. `fr` must hold `HDRS + payload.len()` bytes.
#[allow(clippy::too_many_arguments)]
#[inline]
#[cfg(test)]
pub(crate) fn build_frame(
    fr: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    sport: u16,
    dst: SocketAddrV4,
    payload: &[u8],
    id: u16,
) -> usize {
    build_frame_hdr(
        fr,
        src_mac,
        dst_mac,
        src,
        sport,
        dst,
        payload,
        id,
        IpHeader::default(),
    )
}

/// [`build_frame`] with the socket's IP header fields `h`.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn build_frame_hdr(
    fr: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    sport: u16,
    dst: SocketAddrV4,
    payload: &[u8],
    id: u16,
    h: IpHeader,
) -> usize {
    let total = HDRS + payload.len();
    fr[0..6].copy_from_slice(&dst_mac);
    fr[6..12].copy_from_slice(&src_mac);
    fr[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    fr[HDRS..total].copy_from_slice(payload);
    Ipv4Repr {
        src,
        dst: *dst.ip(),
        protocol: super::classify::PROTO_UDP,
        payload_len: UDP_HDR + payload.len(),
        ttl: h.ttl_to(dst.ip()),
        ident: id,
    }
    .emit_tos(&mut fr[ETH_HDR..], h.tos);
    UdpRepr {
        src_port: sport,
        dst_port: dst.port(),
    }
    .emit(
        &mut fr[ETH_HDR + IP_HDR..total],
        payload.len(),
        src,
        *dst.ip(),
    );
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_frames_use_ttl_1() {
        let mut f = vec![0u8; HDRS + 4];
        let g = SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 5);
        build_frame(
            &mut f,
            [2; 6],
            [1, 0, 0x5e, 1, 2, 3],
            Ipv4Addr::new(10, 0, 0, 1),
            6,
            g,
            b"abcd",
            3,
        );
        assert_eq!(f[ETH_HDR + 8], 1);
    }

    #[test]
    fn socket_ttl_and_tos_reach_the_header() {
        let mut f = vec![0u8; HDRS + 4];
        let h = IpHeader {
            ttl: 7,
            mcast_ttl: 3,
            tos: 0xb8,
        };
        let one = |f: &mut Vec<u8>, dst: Ipv4Addr| {
            build_frame_hdr(
                f,
                [2; 6],
                [4; 6],
                Ipv4Addr::new(10, 0, 0, 1),
                6,
                SocketAddrV4::new(dst, 5),
                b"abcd",
                3,
                h,
            );
            let p = nanowire_wire::Ipv4Packet::new_checked(&f[ETH_HDR..]).unwrap();
            assert!(p.verify_checksum());
            (p.ttl(), p.dscp_ecn())
        };
        assert_eq!(one(&mut f, Ipv4Addr::new(10, 0, 0, 2)), (7, 0xb8));
        assert_eq!(one(&mut f, Ipv4Addr::new(239, 1, 2, 3)), (3, 0xb8));
    }
}
