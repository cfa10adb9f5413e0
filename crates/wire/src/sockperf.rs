//! The sockperf 3.x message header, so nanowire interoperates with sockperf.
//!
//! Layout (14 bytes, network byte order), learned from sockperf's public
//! documentation and source:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | sequence number |
//! | 8 | 2 | flags: 1 = from client, 2 = pong requested, 4 = warm-up |
//! | 10 | 4 | total message length, header included |
//!
//! A server answers a client message that requests a pong with the same
//! message, client flag cleared; it never answers warm-up messages and
//! ignores messages without the client flag. Over TCP the length field frames
//! the byte stream.

use crate::{Malformed, Result};

pub const SOCKPERF_HEADER_LEN: usize = 14;
pub const FLAG_CLIENT: u16 = 1;
pub const FLAG_PONG_REQUEST: u16 = 2;
pub const FLAG_WARMUP: u16 = 4;

view!(SockperfHeader, fixed: SOCKPERF_HEADER_LEN);

impl<T: AsRef<[u8]>> SockperfHeader<T> {
    /// The buffer must hold at least the 14-byte header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        Self::fixed(&buffer)?;
        Ok(SockperfHeader { buffer })
    }

    be_fields! {
        seq: u64 = 0;
        flags: u16 = 8;
        /// Total message length as written by the sender (header included).
        length: u32 = 10;
    }
    pub fn is_client(&self) -> bool {
        self.flags() & FLAG_CLIENT != 0
    }
    pub fn is_pong_request(&self) -> bool {
        self.flags() & FLAG_PONG_REQUEST != 0
    }
    pub fn is_warmup(&self) -> bool {
        self.flags() & FLAG_WARMUP != 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SockperfHeader<T> {
    pub fn set_seq(&mut self, seq: u64) {
        self.buffer.as_mut()[0..8].copy_from_slice(&seq.to_be_bytes());
    }
    pub fn set_flags(&mut self, flags: u16) {
        self.buffer.as_mut()[8..10].copy_from_slice(&flags.to_be_bytes());
    }
    pub fn set_length(&mut self, len: u32) {
        self.buffer.as_mut()[10..14].copy_from_slice(&len.to_be_bytes());
    }
    /// Turn a client request into the server's reply in place.
    pub fn make_reply(&mut self) {
        let f = self.flags() & !FLAG_CLIENT;
        self.set_flags(f);
    }
    /// Fill a whole client message: header plus a deterministic payload.
    pub fn fill_request(&mut self, seq: u64, flags: u16) {
        let len = self.buffer.as_ref().len();
        self.set_seq(seq);
        self.set_flags(flags | FLAG_CLIENT);
        self.set_length(len as u32);
    }
}

/// What a server should do with one received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerAction {
    /// Not a client message (e.g. our own reply looped back): ignore.
    Ignore,
    /// Warm-up: count nothing, answer nothing.
    Warmup,
    /// Count it; no reply requested.
    Count,
    /// Count it and send the reply (`make_reply` applied by the caller).
    Reply,
}

/// Decide the server's action for a received message, following sockperf.
pub fn server_action(msg: &[u8], max_len: usize) -> Result<ServerAction> {
    let h = SockperfHeader::new_checked(msg)?;
    if h.length() as usize > max_len {
        return Err(Malformed::BadTotalLength);
    }
    Ok(if !h.is_client() {
        ServerAction::Ignore
    } else if h.is_warmup() {
        ServerAction::Warmup
    } else if h.is_pong_request() {
        ServerAction::Reply
    } else {
        ServerAction::Count
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_bytes() {
        // seq 0x0102, flags client|pong, length 64
        let mut m = [0u8; 64];
        SockperfHeader::new_checked(&mut m[..])
            .unwrap()
            .fill_request(0x0102, FLAG_PONG_REQUEST);
        assert_eq!(&m[..14], &[0, 0, 0, 0, 0, 0, 1, 2, 0, 3, 0, 0, 0, 64]);
        assert_eq!(server_action(&m, 65536).unwrap(), ServerAction::Reply);
        SockperfHeader::new_unchecked(&mut m[..]).make_reply();
        assert_eq!(m[9], 2);
        assert_eq!(server_action(&m, 65536).unwrap(), ServerAction::Ignore);
    }

    #[test]
    fn actions() {
        let mut m = [0u8; 14];
        SockperfHeader::new_unchecked(&mut m[..]).fill_request(1, FLAG_WARMUP | FLAG_PONG_REQUEST);
        assert_eq!(server_action(&m, 100).unwrap(), ServerAction::Warmup);
        SockperfHeader::new_unchecked(&mut m[..]).fill_request(1, 0);
        assert_eq!(server_action(&m, 100).unwrap(), ServerAction::Count);
        assert_eq!(
            server_action(&m[..13], 100).unwrap_err(),
            Malformed::Truncated
        );
        assert_eq!(
            server_action(&m, 10).unwrap_err(),
            Malformed::BadTotalLength
        );
    }
}
