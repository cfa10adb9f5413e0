//! Zero-copy, panic-free packet views for the nanowire data path.
//!
//! Every view follows one pattern (learned from smoltcp's `wire` module):
//! `Packet<T: AsRef<[u8]>>` wraps a buffer; `new_checked` validates every field
//! an attacker controls, and **if `new_checked` returned `Ok`, no accessor
//! panics**. `new_unchecked` exists for buffers we built ourselves. Writers
//! (`set_*`) need `T: AsMut<[u8]>`.
//!
//! No `unsafe` lives in this crate.
#![forbid(unsafe_code)]

pub mod checksum;
pub mod ethernet;
pub mod ipv4;
pub mod pcapng;
pub mod sockperf;
pub mod tcp;
pub mod udp;

pub use ethernet::{EtherType, EthernetFrame, EthernetRepr, MacAddr};
pub use ipv4::{Ipv4Packet, Ipv4Repr};
pub use sockperf::{SOCKPERF_HEADER_LEN, SockperfHeader};
pub use udp::{UdpDatagram, UdpRepr};

/// Why a frame was refused: the one error enum of every view (Ethernet, IPv4,
/// UDP, TCP). Each variant is a drop reason with its own counter in the
/// engine (`drop_<name>`), so the names are stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Malformed {
    /// Buffer shorter than the fixed header.
    Truncated,
    /// IPv4 version field is not 4.
    BadVersion,
    /// IHL below 5 or beyond the buffer.
    BadIhl,
    /// IPv4 header has options (IHL > 5); the fast path refuses them.
    IpOptions,
    /// IPv4 total length smaller than the header or larger than the buffer.
    BadTotalLength,
    /// Fragment (MF set or non-zero offset).
    Fragment,
    /// IPv4 header checksum mismatch.
    BadIpChecksum,
    /// UDP length below 8 or beyond the IP payload.
    BadUdpLength,
    /// UDP checksum mismatch (a genuinely bad one, not an offload artefact).
    BadUdpChecksum,
    /// TCP data offset below 5 or beyond the segment.
    BadTcpDataOffset,
    /// A TCP option runs past the header or has a wrong length.
    BadTcpOptions,
    /// TCP checksum mismatch (neither valid nor an offload's partial sum).
    BadTcpChecksum,
}

impl Malformed {
    /// Stable snake_case name used as the counter key.
    pub fn as_str(self) -> &'static str {
        match self {
            Malformed::Truncated => "truncated",
            Malformed::BadVersion => "bad_version",
            Malformed::BadIhl => "bad_ihl",
            Malformed::IpOptions => "ip_options",
            Malformed::BadTotalLength => "bad_total_length",
            Malformed::Fragment => "fragment",
            Malformed::BadIpChecksum => "bad_ip_checksum",
            Malformed::BadUdpLength => "bad_udp_length",
            Malformed::BadUdpChecksum => "bad_udp_checksum",
            Malformed::BadTcpDataOffset => "bad_tcp_data_offset",
            Malformed::BadTcpOptions => "bad_tcp_options",
            Malformed::BadTcpChecksum => "bad_tcp_checksum",
        }
    }
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for Malformed {}

pub type Result<T> = core::result::Result<T, Malformed>;

/// Deterministic pseudo-random test bytes (xorshift64), shared by the
/// views' sweep tests.
#[cfg(test)]
pub(crate) fn xorshift_bytes(state: &mut u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state as u8
        })
        .collect()
}
