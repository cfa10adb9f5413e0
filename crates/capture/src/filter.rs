//! The capture filters (`--port`, `--addr`), one definition for every
//! source: kernel tap, engine taps and the dedicated XDP program (which
//! applies the same rule in bpf/capture.c).

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
            if !matches!(ip.protocol(), 6 | 17) || p.len() < 4 || ip.frag_offset() != 0 {
                return false;
            }
            return u16::from_be_bytes([p[0], p[1]]) == port
                || u16::from_be_bytes([p[2], p[3]]) == port;
        }
        true
    }
}
