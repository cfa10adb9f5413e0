//! Transmit: frames lent by the transmit device, Ethernet/IPv4/UDP headers
//! with a full UDP checksum (or the pseudo-header's sum for the device to
//! complete, where it offers that: `TxDevice::csum_offload`), batches of at
//! most one kick's budget.
//!
//! `TxPath` lives under the engine's TX lock, which is held only while
//! frames are written and posted (never across a netlink call or a user
//! closure; the kick is a non-blocking sendto). Counters written here (`tx_*`, per-socket `tx_*`) have this
//! lock as their single writer.

use super::device::{KickCounts, TxDevice};
use super::shm::{E, S, StatsPage, bump};
use nanowire_probe::{self as probe, Mark};
use nanowire_wire::{EtherType, EthernetRepr, Ipv4Repr, MacAddr, UdpRepr, checksum};
use nanowire_xdp::CsumRequest;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

// The header lengths are `wire`'s (one set of constants, under short names).
pub(crate) use nanowire_wire::ethernet::HEADER_LEN as ETH_HDR;
pub(crate) use nanowire_wire::ipv4::HEADER_LEN as IP_HDR;
pub(crate) use nanowire_wire::udp::HEADER_LEN as UDP_HDR;
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

pub(crate) struct TxPath<D> {
    /// The transmit device (the engine's: AF_XDP TX ring with the stamp,
    /// fault and tap wrappers; tests: the loopback device).
    pub dev: D,
    pub ip_id: u16,
    pub mac: [u8; 6],
    /// Frames per kick (the copy-mode budget).
    pub per_kick: usize,
    pub page: Arc<StatsPage>,
    /// Scratch for multi-buffer (jumbo) frames.
    pub big: Vec<u8>,
    /// The device's kick totals already on the stats page.
    kicks: KickCounts,
}

/// What one `send` did.
pub(crate) struct Sent {
    pub n: usize,
}

impl<D: TxDevice> TxPath<D> {
    pub fn new(dev: D, mac: [u8; 6], per_kick: usize, page: Arc<StatsPage>) -> TxPath<D> {
        TxPath {
            dev,
            ip_id: 1,
            mac,
            per_kick,
            page,
            big: Vec::new(),
            kicks: KickCounts::default(),
        }
    }

    /// Send `bufs` (each `fits`) as datagrams; counted on socket `slot`.
    /// `Ok(n)`: n queued (fewer when the ring stayed full after a kick).
    /// (Headers built for this call only: the neighbour queue's sends.)
    pub fn send(&mut self, bufs: &[&[u8]], w: Wire, slot: usize) -> io::Result<Sent> {
        let t = UdpTemplate::new(self.mac, w, IpHeader::default());
        self.send_hdr(bufs, &t, slot)
    }

    /// One datagram with the headers of `t` (a socket's [`Ready`]): the
    /// straight line of a send. A frame taken from the pool, the template
    /// and the payload written into it, one descriptor posted, the kick
    /// and the reap ([`TxPath::done`]). A datagram longer than a frame goes
    /// the way of [`TxPath::send_hdr`].
    #[inline]
    pub fn send_one(&mut self, b: &[u8], t: &UdpTemplate, slot: usize) -> io::Result<()> {
        if HDRS + b.len() > self.dev.frame_size() {
            return self.send_hdr(&[b], t, slot).map(|_| ());
        }
        if self.put(&[b], t, slot) == 0 {
            return Err(self.ring_full(slot));
        }
        self.done()
    }

    /// `send` with the headers of `t` (the socket's template: its IP header
    /// fields, destination, source and next hop).
    pub fn send_hdr(&mut self, bufs: &[&[u8]], t: &UdpTemplate, slot: usize) -> io::Result<Sent> {
        let per_kick = self.per_kick;
        let fs = self.dev.frame_size();
        let mut sent = 0;
        let mut i = 0;
        while i < bufs.len() {
            // A run of datagrams that fit one frame, at most one kick's worth.
            let mut j = i;
            while j < bufs.len() && j - i < per_kick && HDRS + bufs[j].len() <= fs {
                j += 1;
            }
            let k = if j > i {
                self.put(&bufs[i..j], t, slot)
            } else {
                // One jumbo datagram in several buffers.
                let b = bufs[i];
                self.big.resize(HDRS + b.len(), 0);
                self.ip_id = self.ip_id.wrapping_add(1);
                let n = t.write(&mut self.big, b, self.ip_id, false);
                if self.dev.send_large(&self.big[..n]) {
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
            return Err(self.ring_full(slot));
        }
        self.done().map(|()| Sent { n: sent })
    }

    /// Write `chunk` (datagrams that each fit a frame) into frames with the
    /// headers of `t`, post them (a kick if the ring asks) and count them
    /// on socket `slot`; how many were posted (fewer when the ring or the
    /// pool ran out).
    #[inline]
    fn put(&mut self, chunk: &[&[u8]], t: &UdpTemplate, slot: usize) -> usize {
        let mut id = self.ip_id;
        let mut build = |n: usize, fr: &mut [u8], partial: bool| {
            id = id.wrapping_add(1);
            probe::mark(Mark::UdpFrame);
            let r = t.write(fr, chunk[n], id, partial);
            probe::mark(Mark::UdpBuilt);
            r
        };
        // Where the device completes checksums (AF_XDP TX metadata, as for
        // the engine's TCP), the datagram is not summed here.
        let k = if self.dev.csum_offload() {
            let k = self.dev.send_with_csum(chunk.len(), |n, fr| {
                Some((build(n, fr, true), Some(UDP_CSUM_REQUEST)))
            });
            bump(self.page.e(E::TxCsumOffload), k as u64);
            k
        } else {
            self.dev
                .send_with(chunk.len(), |n, fr| Some(build(n, fr, false)))
        };
        self.ip_id = self.ip_id.wrapping_add(k as u16);
        self.count(&chunk[..k], slot);
        k
    }

    /// Nothing could be posted, the ring full even after reaping: kick,
    /// count the drop on socket `slot` and say so (`WouldBlock`).
    #[cold]
    fn ring_full(&mut self, slot: usize) -> io::Error {
        self.dev.kick_now();
        self.note_kicks();
        bump(self.page.e(E::DropTxRingFull), 1);
        bump(self.page.s(slot, S::DropTxRingFull), 1);
        io::Error::new(io::ErrorKind::WouldBlock, "xdp tx ring full")
    }

    /// After a send's frames are posted: the kick (if the ring still holds
    /// any), the reap, the kick counters, an error that will not go away.
    #[inline]
    fn done(&mut self) -> io::Result<()> {
        self.dev.flush();
        self.note_kicks();
        match self.dev.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Post whole frames (built elsewhere: the engine's TCP for a segment
    /// whose next hop was not cached, the neighbour thread). Returns how
    /// many of `frames` were taken (fewer when the ring is full).
    pub fn post(&mut self, frames: &[&[u8]]) -> usize {
        self.post_with(frames.len(), |i, fr| {
            let f = frames[i];
            fr.get_mut(..f.len())?.copy_from_slice(f);
            Some((f.len(), None))
        })
    }

    /// Build up to `max` frames straight in the device's frames (one copy
    /// per frame: `fill` writes headers and payload in place, returning the
    /// length, or `None` to stop with nothing queued for that frame), post
    /// them as one batch, kick once and reap completions. Returns frames
    /// posted; the ring or pool running out ends the batch early without
    /// calling `fill` again (nothing is lost). `fill` may ask for the
    /// frame's transport checksum to be completed on the way out
    /// (`TxDevice::send_with_csum`: by offload, or in software).
    #[inline]
    pub fn post_with(
        &mut self,
        max: usize,
        fill: impl FnMut(usize, &mut [u8]) -> Option<(usize, Option<CsumRequest>)>,
    ) -> usize {
        let n = self.dev.send_with_csum(max, fill);
        self.dev.flush();
        self.note_kicks();
        n
    }

    /// Put what the device's kicks did since the last look on the stats
    /// page: packets the kernel completed without sending
    /// (`xsk_tx_kernel_dropped`) and kicks tried again. Two loads and a
    /// compare when nothing happened.
    #[inline]
    fn note_kicks(&mut self) {
        let now = self.dev.kick_counts();
        if now != self.kicks {
            self.count_kicks(now);
        }
    }

    #[cold]
    fn count_kicks(&mut self, now: KickCounts) {
        let was = std::mem::replace(&mut self.kicks, now);
        let p = &self.page;
        bump(
            p.e(E::XskTxKernelDropped),
            now.kernel_dropped.saturating_sub(was.kernel_dropped),
        );
        bump(
            p.e(E::XskTxKickRetries),
            now.retries.saturating_sub(was.retries),
        );
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

/// Write Ethernet (`macs`: source, destination) + IPv4 + UDP (full
/// checksum) + payload into `fr`; returns the frame length. `fr` must hold
/// `HDRS + payload.len()` bytes.
#[cfg(test)]
pub(crate) fn build_frame(
    fr: &mut [u8],
    macs: ([u8; 6], [u8; 6]),
    from: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &[u8],
    id: u16,
) -> usize {
    let w = Wire {
        src: from,
        dst,
        mac: macs.1,
    };
    UdpTemplate::new(macs.0, w, IpHeader::default()).write(fr, payload, id, false)
}

/// Where a datagram's checksum lies for an offload to complete it: from
/// the UDP header to the end of the frame, into the UDP checksum field.
const UDP_CSUM_REQUEST: CsumRequest = CsumRequest {
    start: (ETH_HDR + IP_HDR) as u16,
    offset: nanowire_wire::udp::CHECKSUM_OFFSET,
};

/// The link header of an IPv4 frame from `src` to `dst`.
#[inline]
pub(crate) fn eth_ipv4(dst: [u8; 6], src: [u8; 6]) -> EthernetRepr {
    EthernetRepr {
        dst: MacAddr(dst),
        src: MacAddr(src),
        ethertype: EtherType::Ipv4,
    }
}

// Where the per-datagram fields lie in a frame (Ethernet + option-less
// IPv4 + UDP), for the template's patches.
const IP_TOTAL_LEN: usize = ETH_HDR + 2;
const IP_IDENT: usize = ETH_HDR + 4;
const IP_CHECKSUM: usize = ETH_HDR + 10;
const UDP_LEN: usize = ETH_HDR + IP_HDR + 4;
const UDP_CHECKSUM: usize = ETH_HDR + IP_HDR + nanowire_wire::udp::CHECKSUM_OFFSET as usize;

/// A socket's headers ready for its next datagram (the straight line,
/// [`TxPath::send_one`]): the template of its last destination through the
/// rings, good for that destination while the neighbour table's generation
/// is still `seen` (no neighbour or route change since: the next hop and
/// source are the ones the template holds) and the socket's IP header
/// options are unchanged (the socket drops it when they change). The check
/// per datagram is two compares ([`Ready::is_for`]); the key's other fields
/// are compared only when the general path looks the hop up
/// ([`Ready::keep`]).
pub(crate) struct Ready {
    seen: u64,
    pub t: UdpTemplate,
}

impl Ready {
    /// The headers of (`src_mac`, `w`, `h`) from `slot`: the ones kept
    /// there if built for the same, else new ones, kept; ready from now on
    /// for `w.dst` while the neighbour generation is `seen` (the one the hop
    /// in `w` was looked up at).
    pub(crate) fn keep(
        slot: &mut Option<Ready>,
        src_mac: [u8; 6],
        w: Wire,
        h: IpHeader,
        seen: u64,
    ) -> &UdpTemplate {
        if !slot.as_ref().is_some_and(|r| r.t.is_for(src_mac, w, h)) {
            let t = UdpTemplate::new(src_mac, w, h);
            *slot = Some(Ready { seen, t });
        }
        let r = slot.as_mut().expect("just set");
        r.seen = seen;
        &r.t
    }

    /// Whether the headers serve a datagram to `dst` now that the
    /// neighbour generation is `now()` (read only if `dst` is the one).
    #[inline(always)]
    pub(crate) fn is_for(&self, dst: SocketAddrV4, now: impl FnOnce() -> u64) -> bool {
        self.t.w.dst == dst && self.seen == now()
    }
}

/// The Ethernet, IPv4 and UDP headers of the datagrams of one (source
/// MAC, [`Wire`], [`IpHeader`]), built once by `wire`'s emitters; a send
/// copies them and patches only what changes per datagram: the two
/// lengths, the IP id, the IPv4 checksum (from the sum of the fixed fields,
/// stored) and the UDP checksum (from the pseudo-header's and ports' sum,
/// stored). Onload's cached headers. A socket keeps the last one it used
/// ([`Ready`]) and it is rebuilt whenever any field of its key differs: a
/// new destination, next hop (route or neighbour change), source, TTL or
/// TOS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UdpTemplate {
    src_mac: [u8; 6],
    w: Wire,
    h: IpHeader,
    /// The headers with both lengths, the IP id and both checksums 0.
    hdr: [u8; HDRS],
    /// Ones' complement sum of the IPv4 header's words but the total
    /// length, id and checksum.
    ip_sum: u32,
    /// Sum of the UDP pseudo-header's addresses and protocol, and of the
    /// ports: the checksum's sum but the two length words and the payload.
    udp_sum: u32,
    /// The pseudo-header's sum without its length (the partial checksum's).
    pseudo: u32,
}

impl UdpTemplate {
    pub(crate) fn new(src_mac: [u8; 6], w: Wire, h: IpHeader) -> UdpTemplate {
        let (src, dst) = (*w.src.ip(), *w.dst.ip());
        let mut hdr = [0u8; HDRS];
        eth_ipv4(w.mac, src_mac).emit(&mut hdr);
        Ipv4Repr {
            src,
            dst,
            protocol: nanowire_wire::ipv4::PROTO_UDP,
            payload_len: 0,
            ttl: h.ttl_to(&dst),
            ident: 0,
        }
        .emit_tos(&mut hdr[ETH_HDR..], h.tos);
        let udp = UdpRepr {
            src_port: w.src.port(),
            dst_port: w.dst.port(),
        };
        udp.emit_partial(&mut hdr[ETH_HDR + IP_HDR..], 0, src, dst);
        for at in [IP_TOTAL_LEN, IP_IDENT, IP_CHECKSUM, UDP_LEN, UDP_CHECKSUM] {
            hdr[at..at + 2].fill(0);
        }
        let pseudo = checksum::pseudo_header(src, dst, nanowire_wire::ipv4::PROTO_UDP, 0);
        UdpTemplate {
            src_mac,
            w,
            h,
            hdr,
            ip_sum: checksum::accumulate(0, &hdr[ETH_HDR..ETH_HDR + IP_HDR]),
            udp_sum: checksum::accumulate(pseudo, &hdr[ETH_HDR + IP_HDR..]),
            pseudo,
        }
    }

    /// Whether this is the template of (`src_mac`, `w`, `h`).
    #[inline]
    pub(crate) fn is_for(&self, src_mac: [u8; 6], w: Wire, h: IpHeader) -> bool {
        self.w == w && self.h == h && self.src_mac == src_mac
    }

    /// The frame of `payload` with IP id `id` into `fr` (which must hold
    /// `HDRS + payload.len()` bytes); its length. `partial`: the UDP
    /// checksum field holds the pseudo-header's sum only, for the device
    /// to complete ([`UDP_CSUM_REQUEST`]).
    #[inline]
    pub(crate) fn write(&self, fr: &mut [u8], payload: &[u8], id: u16, partial: bool) -> usize {
        let total = HDRS + payload.len();
        let fr = &mut fr[..total];
        fr[HDRS..].copy_from_slice(payload);
        fr[..HDRS].copy_from_slice(&self.hdr);
        let ip_len = (total - ETH_HDR) as u16;
        let udp_len = (total - ETH_HDR - IP_HDR) as u16;
        let ip = !checksum::fold(self.ip_sum + u32::from(ip_len) + u32::from(id));
        let udp = if partial {
            checksum::fold(self.pseudo + u32::from(udp_len))
        } else {
            // Ports, both length words, then the payload (at an even
            // offset: its words pair as in one pass over the datagram).
            let s = self.udp_sum + 2 * u32::from(udp_len);
            match !checksum::fold(checksum::accumulate(s, payload)) {
                0 => 0xffff,
                c => c,
            }
        };
        fr[IP_TOTAL_LEN..IP_TOTAL_LEN + 2].copy_from_slice(&ip_len.to_be_bytes());
        fr[IP_IDENT..IP_IDENT + 2].copy_from_slice(&id.to_be_bytes());
        fr[IP_CHECKSUM..IP_CHECKSUM + 2].copy_from_slice(&ip.to_be_bytes());
        fr[UDP_LEN..UDP_LEN + 2].copy_from_slice(&udp_len.to_be_bytes());
        fr[UDP_CHECKSUM..UDP_CHECKSUM + 2].copy_from_slice(&udp.to_be_bytes());
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdp::classify::classify;
    use crate::xdp::device::loopback::{LoopTx, loopback};
    use crate::xdp::testkit::*;

    fn tx(frame: usize, per_kick: usize) -> TxPath<LoopTx> {
        let (_, mut dev) = loopback(frame);
        dev.keep = true;
        TxPath::new(dev, OUR_MAC, per_kick, page())
    }

    fn wire() -> Wire {
        Wire {
            src: sa(OURS, 7),
            dst: sa(PEER, 9),
            mac: PEER_MAC,
        }
    }

    #[test]
    fn sent_datagrams_are_frames_the_classifier_takes_back() {
        let mut t = tx(2048, 32);
        let s = t.send(&[b"one", b"two!"], wire(), 0).unwrap();
        assert_eq!(s.n, 2);
        assert_eq!(t.dev.log.len(), 2);
        for (f, want) in t.dev.log.iter().zip([&b"one"[..], b"two!"]) {
            assert_eq!(&f[0..6], &PEER_MAC);
            assert_eq!(&f[6..12], &OUR_MAC);
            let c = classify(f).expect("valid frame");
            assert_eq!((c.src, c.dst), (sa(OURS, 7), sa(PEER, 9)));
            assert_eq!(&f[c.payload_off..c.payload_off + c.payload_len], want);
        }
        assert_eq!(get(&t.page, E::TxPackets), 2);
        assert_eq!(get(&t.page, E::TxBytes), 7);
        assert_eq!(get_s(&t.page, 0, S::TxPackets), 2);
    }

    #[test]
    fn with_offload_datagrams_leave_the_checksum_to_the_device() {
        let bufs: [&[u8]; 3] = [b"", b"odd", &[0xab; 1000]];
        let mut soft = tx(2048, 32);
        soft.send(&bufs, wire(), 0).unwrap();
        let mut off = tx(2048, 32);
        off.dev.offload = true;
        assert_eq!(off.send(&bufs, wire(), 0).unwrap().n, 3);
        assert_eq!(get(&off.page, E::TxCsumOffload), 3);
        assert_eq!(get(&soft.page, E::TxCsumOffload), 0);
        for (f, full) in off.dev.log.iter().zip(&soft.dev.log) {
            let c = classify(f).expect("a partial checksum is accepted");
            assert!(c.csum_partial);
            assert!(!classify(full).unwrap().csum_partial);
            // Completed as the kernel completes a CHECKSUM_PARTIAL skb,
            // the frame is the software one.
            let mut done = f.clone();
            let at = UDP_CSUM_REQUEST.start as usize;
            let sum =
                !nanowire_wire::checksum::fold(nanowire_wire::checksum::accumulate(0, &done[at..]));
            let sum = if sum == 0 { 0xffff } else { sum };
            let o = at + usize::from(UDP_CSUM_REQUEST.offset);
            done[o..o + 2].copy_from_slice(&sum.to_be_bytes());
            assert_eq!(&done, full);
        }
    }

    #[test]
    fn a_batch_is_cut_at_one_kick_worth_and_flushed_once() {
        let mut t = tx(2048, 4);
        let bufs: Vec<&[u8]> = vec![b"x"; 10];
        assert_eq!(t.send(&bufs, wire(), 0).unwrap().n, 10);
        assert_eq!(t.dev.sent, 10);
        assert_eq!(t.dev.flushes, 1, "one flush per send, not per frame");
        // IP ids are consecutive.
        let ids: Vec<u16> = t
            .dev
            .log
            .iter()
            .map(|f| u16::from_be_bytes([f[ETH_HDR + 4], f[ETH_HDR + 5]]))
            .collect();
        assert!(ids.windows(2).all(|w| w[1] == w[0].wrapping_add(1)));
    }

    #[test]
    fn a_datagram_longer_than_a_frame_goes_in_several_buffers() {
        let mut t = tx(2048, 32);
        let big = vec![0x5a; 3000];
        assert_eq!(t.send(&[b"small", &big], wire(), 0).unwrap().n, 2);
        let f = &t.dev.log[1];
        assert_eq!(f.len(), HDRS + 3000);
        let c = classify(f).unwrap();
        assert_eq!(c.payload_len, 3000);
    }

    #[test]
    fn a_full_ring_is_would_block_and_counted() {
        let mut t = tx(2048, 32);
        t.dev.capacity = 3;
        let bufs: Vec<&[u8]> = vec![b"x"; 5];
        assert_eq!(t.send(&bufs, wire(), 4).unwrap().n, 3);
        let e = t.send(&bufs, wire(), 4).err().expect("ring full");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(get(&t.page, E::DropTxRingFull), 1);
        assert_eq!(get_s(&t.page, 4, S::DropTxRingFull), 1);
    }

    #[test]
    fn packets_the_kernel_completed_without_sending_are_counted() {
        let mut t = tx(2048, 32);
        let bufs: Vec<&[u8]> = vec![b"x"; 3];
        t.send(&bufs, wire(), 0).unwrap();
        assert_eq!(get(&t.page, E::XskTxKernelDropped), 0);
        // The device's kicks met two EBUSY (two packets dropped by the
        // kernel) and five refusals in all: counted once each, on a send
        // and on a post.
        t.dev.kicks.kernel_dropped = 2;
        t.dev.kicks.retries = 5;
        t.send(&bufs, wire(), 0).unwrap();
        t.send(&bufs, wire(), 0).unwrap();
        assert_eq!(get(&t.page, E::XskTxKernelDropped), 2);
        assert_eq!(get(&t.page, E::XskTxKickRetries), 5);
        t.dev.kicks.kernel_dropped = 3;
        assert_eq!(t.post(&[&[0u8; 60]]), 1);
        assert_eq!(get(&t.page, E::XskTxKernelDropped), 3);
        assert_eq!(get(&t.page, E::XskTxKickRetries), 5);
    }

    #[test]
    fn post_takes_whole_frames_and_refuses_oversized_ones() {
        let mut t = tx(128, 32);
        let a = [1u8; 60];
        let b = [2u8; 200];
        assert_eq!(t.post(&[&a, &a]), 2);
        assert_eq!(
            t.post(&[&a, &b, &a]),
            1,
            "stops at the frame that does not fit"
        );
        assert_eq!(t.dev.log, vec![a.to_vec(); 3]);
        // post_with builds in place.
        let n = t.post_with(3, |i, fr| {
            fr[0] = i as u8;
            Some((1, None))
        });
        assert_eq!(n, 3);
        assert_eq!(t.dev.log[3..], [vec![0], vec![1], vec![2]]);
    }

    /// The frame as `wire`'s emitters write it field by field (what sends
    /// built before the template).
    fn reference(w: Wire, h: IpHeader, payload: &[u8], id: u16, partial: bool) -> Vec<u8> {
        let mut fr = vec![0u8; HDRS + payload.len()];
        let (src, dst) = (*w.src.ip(), *w.dst.ip());
        eth_ipv4(w.mac, OUR_MAC).emit(&mut fr);
        fr[HDRS..].copy_from_slice(payload);
        Ipv4Repr {
            src,
            dst,
            protocol: nanowire_wire::ipv4::PROTO_UDP,
            payload_len: UDP_HDR + payload.len(),
            ttl: h.ttl_to(&dst),
            ident: id,
        }
        .emit_tos(&mut fr[ETH_HDR..], h.tos);
        let udp = UdpRepr {
            src_port: w.src.port(),
            dst_port: w.dst.port(),
        };
        let d = &mut fr[ETH_HDR + IP_HDR..];
        if partial {
            udp.emit_partial(d, payload.len(), src, dst);
        } else {
            udp.emit(d, payload.len(), src, dst);
        }
        fr
    }

    #[test]
    fn template_frames_are_the_frames_wire_writes() {
        let hs = [
            IpHeader::default(),
            IpHeader {
                ttl: 7,
                mcast_ttl: 3,
                tos: 0xb8,
            },
        ];
        let dsts = [sa(PEER, 9), sa(Ipv4Addr::new(239, 1, 2, 3), 5)];
        let payload: Vec<u8> = (0..1472u32).map(|i| (i * 7 + 3) as u8).collect();
        for h in hs {
            for dst in dsts {
                let w = Wire {
                    src: sa(OURS, 40000),
                    dst,
                    mac: PEER_MAC,
                };
                let t = UdpTemplate::new(OUR_MAC, w, h);
                for len in [0, 1, 2, 7, 8, 9, 63, 64, 65, 1000, 1472] {
                    for id in [0, 1, 0x8000, 0xffff] {
                        for partial in [false, true] {
                            let p = &payload[..len];
                            let mut fr = vec![0xee; HDRS + len + 5];
                            assert_eq!(t.write(&mut fr, p, id, partial), HDRS + len);
                            let want = reference(w, h, p, id, partial);
                            assert_eq!(&fr[..HDRS + len], &want[..], "{h:?} {dst} {len} {id}");
                            assert_eq!(&fr[HDRS + len..], &[0xee; 5], "nothing past the frame");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_socket_template_follows_its_destination_hop_and_header() {
        let mut t = tx(2048, 32);
        let mut slot = None;
        let h = IpHeader::default();
        let mut w = wire();
        let mut send = |t: &mut TxPath<LoopTx>, w: Wire, h: IpHeader| {
            let tm = Ready::keep(&mut slot, OUR_MAC, w, h, 1);
            t.send_hdr(&[b"abc"], tm, 0).unwrap();
            let f = t.dev.log.last().unwrap().clone();
            assert_eq!(f, reference(w, h, b"abc", t.ip_id, false));
        };
        send(&mut t, w, h);
        send(&mut t, w, h);
        // Another next hop (a neighbour or route change), destination,
        // source, TTL or TOS: the headers follow.
        w.mac = [2, 0, 0, 0, 0, 0x77];
        send(&mut t, w, h);
        w.dst = sa(PEER, 10);
        send(&mut t, w, h);
        w.src = sa(OURS, 8);
        send(&mut t, w, h);
        let h = IpHeader {
            ttl: 9,
            mcast_ttl: 1,
            tos: 4,
        };
        send(&mut t, w, h);
        assert_eq!(t.dev.log.len(), 6);
    }

    #[test]
    fn headers_are_ready_for_their_destination_until_the_generation_moves() {
        let mut slot = None;
        let w = wire();
        Ready::keep(&mut slot, OUR_MAC, w, IpHeader::default(), 5);
        let r = slot.as_ref().unwrap();
        assert!(r.is_for(w.dst, || 5));
        assert!(!r.is_for(w.dst, || 6), "a neighbour or route change");
        assert!(!r.is_for(sa(PEER, 10), || 5), "another port");
        assert!(!r.is_for(sa(OURS, 9), || 5), "another address");
        // The general path looked the hop up again (same hop): kept, and
        // ready at the new generation.
        let before = r.t;
        let t = *Ready::keep(&mut slot, OUR_MAC, w, IpHeader::default(), 6);
        assert_eq!(t, before);
        assert!(slot.as_ref().unwrap().is_for(w.dst, || 6));
    }

    #[test]
    fn one_datagram_is_the_frame_a_batch_of_one_sends() {
        for offload in [false, true] {
            let tm = UdpTemplate::new(OUR_MAC, wire(), IpHeader::default());
            let (mut one, mut batch) = (tx(2048, 32), tx(2048, 32));
            one.dev.offload = offload;
            batch.dev.offload = offload;
            let big = vec![0x5a; 3000];
            for b in [&b"x"[..], &[7u8; 1400], &big, b""] {
                one.send_one(b, &tm, 3).unwrap();
                assert_eq!(batch.send_hdr(&[b], &tm, 3).unwrap().n, 1);
            }
            assert_eq!(one.dev.log, batch.dev.log, "same frames, same ids");
            assert_eq!(one.dev.flushes, 4, "one flush per datagram");
            for c in [E::TxPackets, E::TxBytes, E::TxCsumOffload] {
                assert_eq!(get(&one.page, c), get(&batch.page, c), "{c:?}");
            }
            assert_eq!(get_s(&one.page, 3, S::TxBytes), 4401);
            // The ring full: nothing sent, the drop counted once.
            one.dev.capacity = one.dev.sent as usize;
            let e = one.send_one(b"y", &tm, 3).expect_err("ring full");
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
            assert_eq!(get_s(&one.page, 3, S::DropTxRingFull), 1);
            assert_eq!(get(&one.page, E::TxPackets), 4);
        }
    }

    #[test]
    fn multicast_frames_use_ttl_1() {
        let mut f = vec![0u8; HDRS + 4];
        let g = SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 5);
        let macs = ([2; 6], [1, 0, 0x5e, 1, 2, 3]);
        build_frame(
            &mut f,
            macs,
            sa(Ipv4Addr::new(10, 0, 0, 1), 6),
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
            let w = Wire {
                src: sa(Ipv4Addr::new(10, 0, 0, 1), 6),
                dst: SocketAddrV4::new(dst, 5),
                mac: [4; 6],
            };
            UdpTemplate::new([2; 6], w, h).write(f, b"abcd", 3, false);
            let p = nanowire_wire::Ipv4Packet::new_checked(&f[ETH_HDR..]).unwrap();
            assert!(p.verify_checksum());
            (p.ttl(), p.dscp_ecn())
        };
        assert_eq!(one(&mut f, Ipv4Addr::new(10, 0, 0, 2)), (7, 0xb8));
        assert_eq!(one(&mut f, Ipv4Addr::new(239, 1, 2, 3)), (3, 0xb8));
    }
}
