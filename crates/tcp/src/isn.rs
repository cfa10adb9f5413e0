//! Initial sequence numbers (RFC 6528), SYN cookies, timestamp offsets: all
//! keyed SipHash-2-4 of the 4-tuple with a secret from the OS.

use crate::FourTuple;

/// 128-bit key. `Secret::from_os()` reads it with getrandom(2).
#[derive(Clone, Copy)]
pub struct Secret([u64; 2]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn from_bytes(b: [u8; 16]) -> Secret {
        let mut k0 = [0u8; 8];
        let mut k1 = [0u8; 8];
        k0.copy_from_slice(&b[..8]);
        k1.copy_from_slice(&b[8..]);
        Secret([u64::from_le_bytes(k0), u64::from_le_bytes(k1)])
    }

    /// A fresh key from the kernel's CSPRNG.
    pub fn from_os() -> std::io::Result<Secret> {
        let mut b = [0u8; 16];
        let mut got = 0;
        while got < b.len() {
            got += rustix::rand::getrandom(&mut b[got..], rustix::rand::GetRandomFlags::empty())?;
        }
        Ok(Secret::from_bytes(b))
    }

    /// SipHash-2-4 of the tuple plus two extra words, domain-separated by `tag`.
    fn hash(&self, tag: u64, t: &FourTuple, a: u64, b: u64) -> u64 {
        let w0 = (u64::from(u32::from(*t.local.ip())) << 32) | u64::from(u32::from(*t.remote.ip()));
        let w1 = (u64::from(t.local.port()) << 48) | (u64::from(t.remote.port()) << 32) | tag;
        siphash24(self.0[0], self.0[1], &[w0, w1, a, b])
    }

    /// RFC 6528: ISN = M + F(4-tuple, key), M a 4 µs clock.
    pub fn isn(&self, t: &FourTuple, now_ns: u64) -> u32 {
        ((now_ns / 4000) as u32).wrapping_add(self.hash(1, t, 0, 0) as u32)
    }

    /// Random offset of our TSval clock per address pair, as Linux's
    /// `secure_tcp_ts_off(saddr, daddr)`: successive connections to a peer
    /// send increasing timestamps, so a peer holding an earlier one on the
    /// same 4-tuple in TIME-WAIT accepts the new SYN (RFC 6191).
    pub fn ts_offset(&self, t: &FourTuple) -> u32 {
        let pair = FourTuple {
            local: std::net::SocketAddrV4::new(*t.local.ip(), 0),
            remote: std::net::SocketAddrV4::new(*t.remote.ip(), 0),
        };
        self.hash(2, &pair, 0, 0) as u32
    }

    /// The ISN of a SYN-ACK sent without state: 5 bits of a 64 s counter,
    /// 3 bits of MSS index, 24 bits of MAC over (tuple, counter, peer ISN).
    pub fn cookie(&self, t: &FourTuple, now_ns: u64, peer_isn: u32, mss_idx: u8) -> u32 {
        self.cookie_at(t, now_ns / COOKIE_PERIOD_NS, peer_isn, mss_idx)
    }

    fn cookie_at(&self, t: &FourTuple, count: u64, peer_isn: u32, mss_idx: u8) -> u32 {
        let mac = self.hash(3, t, count, u64::from(peer_isn)) as u32 & 0x00ff_ffff;
        ((count as u32 & 0x1f) << 27) | (u32::from(mss_idx & 7) << 24) | mac
    }

    /// Check a cookie (the ACK's ack - 1); returns the MSS index if it is
    /// ours and at most one period old.
    pub fn check_cookie(
        &self,
        t: &FourTuple,
        now_ns: u64,
        peer_isn: u32,
        cookie: u32,
    ) -> Option<u8> {
        let cur = now_ns / COOKIE_PERIOD_NS;
        let mss_idx = ((cookie >> 24) & 7) as u8;
        let periods = if cur == 0 {
            &[0u64][..]
        } else {
            &[cur, cur - 1][..]
        };
        for &count in periods {
            if count as u32 & 0x1f == cookie >> 27
                && self.cookie_at(t, count, peer_isn, mss_idx) == cookie
            {
                return Some(mss_idx);
            }
        }
        None
    }
}

pub const COOKIE_PERIOD_NS: u64 = 64_000_000_000;
/// MSS values a cookie can carry (the largest not above the peer's is chosen).
pub const COOKIE_MSS: [u16; 8] = [536, 1200, 1360, 1400, 1440, 1452, 1460, 8960];

/// The demux maps' hasher: a folded 64×64→128 multiply per word, keyed by
/// the stack's secret. SipHash (std's default) cost about a fifth of a
/// message's stack time; this keeps the maps' keys unpredictable to a
/// peer (collisions need the key) at a few instructions per lookup.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DemuxHash {
    k0: u64,
    k1: u64,
}

impl Secret {
    pub(crate) fn demux_hash(&self) -> DemuxHash {
        // Domain-separated from the ISN and cookie keys.
        DemuxHash {
            k0: siphash24(self.0[0], self.0[1], &[0x6e77_6465_6d75_7830]) | 1,
            k1: siphash24(self.0[1], self.0[0], &[0x6e77_6465_6d75_7831]) | 1,
        }
    }
}

#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

impl std::hash::BuildHasher for DemuxHash {
    type Hasher = DemuxHasher;
    fn build_hasher(&self) -> DemuxHasher {
        DemuxHasher {
            h: self.k0,
            k: self.k1,
        }
    }
}

pub(crate) struct DemuxHasher {
    h: u64,
    k: u64,
}

impl std::hash::Hasher for DemuxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.h = fold(self.h ^ v, self.k);
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u16(&mut self, v: u16) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        fold(self.h, self.k.rotate_left(29) | 1)
    }
}

pub fn cookie_mss_index(mss: u16) -> u8 {
    COOKIE_MSS.iter().rposition(|&m| m <= mss).unwrap_or(0) as u8
}

fn siphash24(k0: u64, k1: u64, words: &[u64]) -> u64 {
    let mut v0 = k0 ^ 0x736f_6d65_7073_6575;
    let mut v1 = k1 ^ 0x646f_7261_6e64_6f6d;
    let mut v2 = k0 ^ 0x6c79_6765_6e65_7261;
    let mut v3 = k1 ^ 0x7465_6462_7974_6573;
    let round = |v0: &mut u64, v1: &mut u64, v2: &mut u64, v3: &mut u64| {
        *v0 = v0.wrapping_add(*v1);
        *v1 = v1.rotate_left(13) ^ *v0;
        *v0 = v0.rotate_left(32);
        *v2 = v2.wrapping_add(*v3);
        *v3 = v3.rotate_left(16) ^ *v2;
        *v0 = v0.wrapping_add(*v3);
        *v3 = v3.rotate_left(21) ^ *v0;
        *v2 = v2.wrapping_add(*v1);
        *v1 = v1.rotate_left(17) ^ *v2;
        *v2 = v2.rotate_left(32);
    };
    for &m in words {
        v3 ^= m;
        round(&mut v0, &mut v1, &mut v2, &mut v3);
        round(&mut v0, &mut v1, &mut v2, &mut v3);
        v0 ^= m;
    }
    let last = ((words.len() as u64 * 8) & 0xff) << 56;
    v3 ^= last;
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    v0 ^= last;
    v2 ^= 0xff;
    for _ in 0..4 {
        round(&mut v0, &mut v1, &mut v2, &mut v3);
    }
    v0 ^ v1 ^ v2 ^ v3
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddrV4;

    #[test]
    fn siphash_reference_vector() {
        // SipHash-2-4 reference: key 00..0f, message 00..07 → 0x93f5f5799a932462.
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let m = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(siphash24(k0, k1, &[m]), 0x93f5_f579_9a93_2462);
    }

    fn tuple() -> FourTuple {
        FourTuple {
            local: "10.0.0.1:80".parse::<SocketAddrV4>().unwrap(),
            remote: "10.0.0.2:5000".parse::<SocketAddrV4>().unwrap(),
        }
    }

    #[test]
    fn isn_advances_with_the_clock_and_depends_on_key_and_tuple() {
        let s = Secret::from_bytes([7; 16]);
        let t = tuple();
        assert_eq!(s.isn(&t, 4000).wrapping_sub(s.isn(&t, 0)), 1);
        assert_ne!(Secret::from_bytes([8; 16]).isn(&t, 0), s.isn(&t, 0));
        let mut u = t;
        u.remote.set_port(5001);
        assert_ne!(s.isn(&u, 0), s.isn(&t, 0));
        assert!(Secret::from_os().is_ok());
    }

    #[test]
    fn cookies_validate_within_two_periods_only() {
        let s = Secret::from_bytes([9; 16]);
        let t = tuple();
        let now = 1000 * COOKIE_PERIOD_NS + 5;
        let c = s.cookie(&t, now, 42, 6);
        assert_eq!(s.check_cookie(&t, now, 42, c), Some(6));
        assert_eq!(s.check_cookie(&t, now + COOKIE_PERIOD_NS, 42, c), Some(6));
        assert_eq!(s.check_cookie(&t, now + 2 * COOKIE_PERIOD_NS, 42, c), None);
        assert_eq!(s.check_cookie(&t, now, 43, c), None);
        assert_eq!(s.check_cookie(&t, now, 42, c ^ 1), None);
        // Early in the clock's life (no previous period) nothing overflows.
        let c0 = s.cookie(&t, 5, 42, 1);
        assert_eq!(s.check_cookie(&t, 5, 42, c0), Some(1));
        assert_eq!(s.check_cookie(&t, 0, 42, c0 ^ (1 << 27)), None);
        assert_eq!(cookie_mss_index(1460), 6);
        assert_eq!(cookie_mss_index(100), 0);
        assert_eq!(cookie_mss_index(9000), 7);
    }
}
