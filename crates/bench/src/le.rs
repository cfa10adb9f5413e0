//! The bench's own datagrams (burst headers, market data, orders): a 4-byte
//! magic, then little-endian fields at fixed offsets.

/// A datagram checked for its magic and length, read field by field.
pub struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    /// `None` for anything shorter than `len` or not starting with `magic`.
    pub fn check(b: &'a [u8], magic: [u8; 4], len: usize) -> Option<Fields<'a>> {
        (b.len() >= len && b[0..4] == magic).then_some(Fields(b))
    }
    pub fn u8_at(&self, o: usize) -> u8 {
        self.0[o]
    }
    pub fn u32_at(&self, o: usize) -> u32 {
        u32::from_le_bytes(self.0[o..o + 4].try_into().unwrap_or([0; 4]))
    }
    pub fn u64_at(&self, o: usize) -> u64 {
        u64::from_le_bytes(self.0[o..o + 8].try_into().unwrap_or([0; 8]))
    }
}

/// Write `v` at `o`, little-endian.
pub fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use crate::burst::BurstHeader;
    use crate::trade::{Kind, Md, Order};

    /// Every message of the bench round-trips; a short one, one with
    /// another magic or (market data) an unknown kind is refused.
    #[test]
    fn messages_round_trip_and_foreign_ones_are_refused() {
        let mut b = [0u8; 64];
        let h = BurstHeader {
            run: 7,
            seq: 123456789,
            total: 500,
            tx_ns: 42,
        };
        h.write(&mut b);
        assert_eq!(BurstHeader::parse(&b), Some(h));
        assert_eq!(BurstHeader::parse(&b[..31]), None);
        assert_eq!(Md::parse(&b), None);
        b[0] = b'X';
        assert_eq!(BurstHeader::parse(&b), None);

        let m = Md {
            kind: Kind::Tick,
            seq: 7,
            tx_ns: 123,
        };
        m.write(&mut b);
        assert_eq!(Md::parse(&b), Some(m));
        assert_eq!(Md::parse(&b[..10]), None);
        b[4] = 9;
        assert_eq!(Md::parse(&b), None);

        let o = Order {
            engine: 2,
            seq: 9,
            tick_ns: 5,
        };
        assert_eq!(Order::parse(&o.bytes()), Some(o));
        assert_eq!(Order::parse(&o.bytes()[..23]), None);
        assert_eq!(BurstHeader::parse(&o.bytes()), None);
    }
}
