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
