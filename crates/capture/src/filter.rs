//! The capture filters (`--port`, `--addr`), one definition for every
//! source: kernel tap, engine taps and the dedicated XDP program (which
//! applies the same rule in bpf/capture.c).

use nanowire_wire::ipv4::{PROTO_TCP, PROTO_UDP};
use nanowire_wire::{EtherType, EthernetFrame, Ipv4Packet};
use std::net::Ipv4Addr;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filter {
    /// UDP or TCP frames to or from this port (first fragments only).
    pub port: Option<u16>,
    /// IPv4 frames to or from this address.
    pub addr: Option<Ipv4Addr>,
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.port.is_none() && self.addr.is_none()
    }

    /// Does `frame` pass? Frames that cannot be parsed far enough to decide
    /// fail any filter that is set.
    pub fn matches(&self, frame: &[u8]) -> bool {
        if self.is_empty() {
            return true;
        }
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return false;
        };
        if eth.ethertype() != EtherType::Ipv4 {
            return false;
        }
        let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
            return false;
        };
        if let Some(a) = self.addr
            && ip.src() != a
            && ip.dst() != a
        {
            return false;
        }
        if let Some(port) = self.port {
            let p = ip.payload();
            if !matches!(ip.protocol(), PROTO_TCP | PROTO_UDP)
                || p.len() < 4
                || ip.frag_offset() != 0
            {
                return false;
            }
            return u16::from_be_bytes([p[0], p[1]]) == port
                || u16::from_be_bytes([p[2], p[3]]) == port;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet + IPv4 (IHL 5) + 4 bytes of ports.
    fn frame(proto: u8, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, frag: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&28u16.to_be_bytes());
        ip[6..8].copy_from_slice(&frag.to_be_bytes());
        ip[8] = 64;
        ip[9] = proto;
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        let c = nanowire_wire::checksum::checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn port_and_address_either_direction() {
        let a = [198, 18, 0, 1];
        let b = [198, 18, 0, 2];
        let f = Filter {
            port: Some(5000),
            addr: None,
        };
        assert!(f.matches(&frame(17, a, b, 1234, 5000, 0)));
        assert!(f.matches(&frame(6, b, a, 5000, 1234, 0)));
        assert!(!f.matches(&frame(17, a, b, 1234, 5001, 0)));
        assert!(!f.matches(&frame(1, a, b, 5000, 5000, 0)), "not UDP/TCP");
        assert!(
            !f.matches(&frame(17, a, b, 5000, 5000, 100)),
            "later fragment"
        );
        let g = Filter {
            port: None,
            addr: Some(Ipv4Addr::from(b)),
        };
        assert!(g.matches(&frame(1, a, b, 0, 0, 0)));
        assert!(g.matches(&frame(17, b, a, 1, 2, 0)));
        assert!(!g.matches(&frame(17, a, [10, 0, 0, 1], 1, 2, 0)));
        assert!(
            Filter::default().matches(&[0u8; 3]),
            "no filter takes everything"
        );
        assert!(!f.matches(&[0u8; 3]), "unparsable fails a set filter");
    }
}
