//! Ethernet II frames.

use crate::Result;

pub const HEADER_LEN: usize = 14;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The multicast MAC for an IPv4 group (RFC 1112: 01:00:5e + low 23 bits).
    pub fn from_ipv4_multicast(group: std::net::Ipv4Addr) -> MacAddr {
        let o = group.octets();
        MacAddr([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
    }

    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl std::fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl std::str::FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts
                .next()
                .ok_or_else(|| format!("bad MAC address {s:?}"))?;
            *b = u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC address {s:?}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("bad MAC address {s:?}"));
        }
        Ok(MacAddr(out))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtherType {
    Ipv4,
    Arp,
    Ipv6,
    Vlan,
    Other(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        match v {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x86dd => EtherType::Ipv6,
            0x8100 => EtherType::Vlan,
            o => EtherType::Other(o),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> u16 {
        match v {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Vlan => 0x8100,
            EtherType::Other(o) => o,
        }
    }
}

view!(
    /// A view of an Ethernet II frame. Invariant: `buffer.len() >= HEADER_LEN`
    /// once `new_checked` succeeded.
    EthernetFrame,
    fixed: HEADER_LEN
);

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        Self::fixed(&buffer)?;
        Ok(EthernetFrame { buffer })
    }

    #[inline]
    pub fn dst(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    #[inline]
    pub fn src(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        MacAddr([b[6], b[7], b[8], b[9], b[10], b[11]])
    }

    #[inline]
    pub fn ethertype(&self) -> EtherType {
        let b = self.buffer.as_ref();
        EtherType::from(u16::from_be_bytes([b[12], b[13]]))
    }

    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst(&mut self, m: MacAddr) {
        self.buffer.as_mut()[0..6].copy_from_slice(&m.0);
    }
    pub fn set_src(&mut self, m: MacAddr) {
        self.buffer.as_mut()[6..12].copy_from_slice(&m.0);
    }
    pub fn set_ethertype(&mut self, t: EtherType) {
        self.buffer.as_mut()[12..14].copy_from_slice(&u16::from(t).to_be_bytes());
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// The fields of an Ethernet II header: what a sender writes with
/// [`EthernetRepr::emit`] (the engine builds every frame's link header with
/// it) and what [`EthernetRepr::parse`] reads back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    pub dst: MacAddr,
    pub src: MacAddr,
    pub ethertype: EtherType,
}

impl EthernetRepr {
    pub fn parse<T: AsRef<[u8]>>(f: &EthernetFrame<T>) -> EthernetRepr {
        EthernetRepr {
            dst: f.dst(),
            src: f.src(),
            ethertype: f.ethertype(),
        }
    }

    /// Write the 14-byte header into `buf[..HEADER_LEN]`. Panics if `buf`
    /// is shorter (a caller bug, not input: senders size their frames).
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) {
        let h = &mut buf[..HEADER_LEN];
        h[0..6].copy_from_slice(&self.dst.0);
        h[6..12].copy_from_slice(&self.src.0);
        h[12..14].copy_from_slice(&u16::from(self.ethertype).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Malformed;

    #[test]
    fn short_frame_is_truncated() {
        assert_eq!(
            EthernetFrame::new_checked(&[0u8; 13][..]).unwrap_err(),
            Malformed::Truncated
        );
    }

    #[test]
    fn fields_roundtrip() {
        let mut buf = [0u8; 20];
        let mut f = EthernetFrame::new_checked(&mut buf[..]).unwrap();
        f.set_dst(MacAddr([1, 2, 3, 4, 5, 6]));
        f.set_src(MacAddr([7, 8, 9, 10, 11, 12]));
        f.set_ethertype(EtherType::Ipv4);
        assert_eq!(f.dst(), MacAddr([1, 2, 3, 4, 5, 6]));
        assert_eq!(f.src(), MacAddr([7, 8, 9, 10, 11, 12]));
        assert_eq!(f.ethertype(), EtherType::Ipv4);
        assert_eq!(f.payload().len(), 6);
    }

    #[test]
    fn repr_emits_what_the_view_reads() {
        let r = EthernetRepr {
            dst: MacAddr([1, 2, 3, 4, 5, 6]),
            src: MacAddr([7, 8, 9, 10, 11, 12]),
            ethertype: EtherType::Ipv4,
        };
        let mut buf = [0xaau8; 20];
        r.emit(&mut buf);
        assert_eq!(&buf[12..14], &[0x08, 0x00]);
        assert_eq!(buf[14], 0xaa, "only the header is written");
        let f = EthernetFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f), r);
    }

    #[test]
    fn mac_parse_and_multicast() {
        let m: MacAddr = "0a:1b:2c:3d:4e:5f".parse().unwrap();
        assert_eq!(m.to_string(), "0a:1b:2c:3d:4e:5f");
        assert!("0a:1b".parse::<MacAddr>().is_err());
        assert!("0a:1b:2c:3d:4e:5f:00".parse::<MacAddr>().is_err());
        let g = MacAddr::from_ipv4_multicast("239.129.2.3".parse().unwrap());
        assert_eq!(g, MacAddr([0x01, 0x00, 0x5e, 0x01, 2, 3]));
        assert!(g.is_multicast());
    }
}
