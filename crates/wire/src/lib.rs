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

/// The struct of a checked view over a buffer (see the crate doc) with its
/// `new_unchecked`, `into_inner` and `fixed` (the buffer when it holds at
/// least the view's fixed header, else `Truncated`: where every
/// `new_checked` starts). `new_checked` and the accessors are the view's own.
macro_rules! view {
    ($(#[$doc:meta])* $name:ident, fixed: $min:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// A view of a buffer built here, not checked: an accessor may
            /// panic on a buffer shorter than what it reads.
            #[inline]
            pub fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }

            #[inline]
            fn fixed(buffer: &T) -> $crate::Result<&[u8]> {
                let b = buffer.as_ref();
                if b.len() < $min {
                    return Err($crate::Malformed::Truncated);
                }
                Ok(b)
            }
        }
    };
}

/// Big-endian header fields at fixed offsets: `name: type = offset;` is
/// `pub fn name(&self) -> type` reading `size_of::<type>()` bytes there
/// (inside the fixed header `new_checked` asked for, so never out of range).
macro_rules! be_fields {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $at:expr;)*) => {$(
        $(#[$doc])*
        #[inline]
        pub fn $name(&self) -> $ty {
            const AT: usize = $at;
            let b: &[u8] = self.buffer.as_ref();
            <$ty>::from_be_bytes(b[AT..AT + size_of::<$ty>()].try_into().expect("a fixed width"))
        }
    )*};
}

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

/// Table-driven refusal test shared by the views: each row writes `bytes`
/// at `at` into a copy of `good` (a short row `(n, b"", _)` with `n` below
/// `good`'s length keeps only the first `n` bytes instead) and asserts that
/// `check` refuses the result with exactly that error.
#[cfg(test)]
pub(crate) fn assert_refused(
    check: impl Fn(&[u8]) -> Result<()>,
    good: &[u8],
    rows: &[(usize, &[u8], Malformed)],
) {
    for &(at, bytes, want) in rows {
        let mut b = good.to_vec();
        if bytes.is_empty() {
            b.truncate(at);
        } else {
            b[at..at + bytes.len()].copy_from_slice(bytes);
        }
        assert_eq!(check(&b).unwrap_err(), want, "{bytes:?} at {at}");
    }
}

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
