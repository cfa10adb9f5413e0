//! Internet checksum (RFC 1071) with incremental accumulation.

use std::net::Ipv4Addr;

/// Sum 16-bit big-endian words into a 32-bit accumulator (not yet folded).
pub fn accumulate(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([c[0], c[1]])));
    }
    if let [last] = chunks.remainder() {
        sum = sum.wrapping_add(u32::from(*last) << 8);
    }
    sum
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
    let mut sum = accumulate(0, &src.octets());
    sum = accumulate(sum, &dst.octets());
    sum = sum.wrapping_add(u32::from(protocol));
    sum.wrapping_add(u32::from(length))
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
