//! Internet checksum (RFC 1071) with incremental accumulation.

use std::net::Ipv4Addr;

/// Add `data`, as 16-bit big-endian words (an odd last byte padded with
/// zero), to the ones' complement accumulator `sum`. The result is folded
/// to at most 17 bits, so callers may add a few more words with
/// `wrapping_add` before [`fold`].
///
/// Eight bytes at a time: the sum of big-endian 32-bit words is congruent
/// to the sum of their 16-bit halves modulo 0xffff (2^16 ≡ 1), which is
/// all a ones' complement sum keeps; u64 cannot overflow below 2^32 words.
pub fn accumulate(sum: u32, data: &[u8]) -> u32 {
    let mut s = u64::from(sum);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_be_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        s += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut pairs = words.remainder().chunks_exact(2);
    for c in &mut pairs {
        s += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = pairs.remainder() {
        s += u64::from(*last) << 8;
    }
    // Fold to at most 17 bits, in fixed steps.
    s = (s >> 32) + (s & 0xffff_ffff);
    s = (s >> 16) + (s & 0xffff);
    s = (s >> 16) + (s & 0xffff);
    s as u32
}

/// Fold a 32-bit accumulator into 16 bits (ones' complement sum, not inverted).
pub fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Full internet checksum of `data` (inverted ones' complement sum).
pub fn checksum(data: &[u8]) -> u16 {
    !fold(accumulate(0, data))
}

/// The ones' complement sum (folded to 16 bits, not inverted) of a
/// 20-byte IPv4 header, as five 32-bit words: the sum of every header a
/// datagram carries on the fast path (no options), without
/// [`accumulate`]'s loops. Equal to `fold(accumulate(0, h))`.
#[inline]
pub fn sum20(h: &[u8; 20]) -> u16 {
    let w = |i: usize| u64::from(u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
    let s = w(0) + w(4) + w(8) + w(12) + w(16);
    fold64(s)
}

/// Fold a 64-bit accumulator of at most a few 32-bit words into 16 bits
/// (not inverted).
#[inline]
pub fn fold64(mut s: u64) -> u16 {
    s = (s >> 32) + (s & 0xffff_ffff);
    s = (s >> 16) + (s & 0xffff);
    s = (s >> 16) + (s & 0xffff);
    s = (s >> 16) + (s & 0xffff);
    s as u16
}

/// Accumulator for the IPv4 pseudo header of an upper-layer protocol.
pub fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u16) -> u32 {
    let (s, d) = (src.to_bits(), dst.to_bits());
    (s >> 16) + (s & 0xffff) + (d >> 16) + (d & 0xffff) + u32::from(protocol) + u32::from(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3 example: sum of these words is 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(accumulate(0, &data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    /// The 16-bit-at-a-time definition, for comparison.
    fn reference(data: &[u8]) -> u16 {
        let mut s = 0u64;
        for c in data.chunks(2) {
            s += u64::from(c[0]) << 8 | u64::from(*c.get(1).unwrap_or(&0));
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    #[test]
    fn eight_bytes_at_a_time_equals_the_definition() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in (0..200).chain([1500, 9000, 65535, 200_000]) {
            let data = crate::xorshift_bytes(&mut x, len);
            assert_eq!(fold(accumulate(0, &data)), reference(&data), "len {len}");
            let ones = vec![0xffu8; len];
            assert_eq!(
                fold(accumulate(0, &ones)),
                reference(&ones),
                "ones len {len}"
            );
        }
    }

    #[test]
    fn a_twenty_byte_header_sums_as_the_definition() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let v = crate::xorshift_bytes(&mut x, 20);
            let h: &[u8; 20] = v[..].try_into().unwrap();
            assert_eq!(sum20(h), reference(h));
        }
        assert_eq!(sum20(&[0xff; 20]), reference(&[0xff; 20]));
        assert_eq!(sum20(&[0; 20]), 0);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(checksum(&[0xab]), checksum(&[0xab, 0x00]));
    }

    #[test]
    fn verifying_a_checksummed_buffer_gives_zero() {
        let mut data = vec![
            0x45, 0x00, 0x00, 0x1c, 0x12, 0x34, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = checksum(&data);
        data[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(&data), 0);
    }
}
