//! `nanowire capture`: timestamped packet capture to pcapng with nanosecond
//! resolution, of the kernel's traffic and of the xdp engines' traffic.
//!
//! * Tap mode (default): frames from an `AF_PACKET` socket bound to one
//!   interface (both directions, kernel `SO_TIMESTAMPNS` stamps taken at the
//!   packet tap), merged in timestamp order with what every xdp engine on
//!   the interface receives and sends, copied by the engines into their
//!   capture taps (crates/tap; stamped when the engine takes the frame off
//!   its RX ring or puts it on its TX ring). XDP takes redirected frames
//!   before the packet taps and AF_XDP transmit bypasses them, so without
//!   the engine taps accelerated traffic would be invisible.
//! * Dedicated mode (`--xdp`, [`dedicated`]): a capture XDP program takes
//!   the frames into AF_XDP with a deep ring.

pub mod cli;
mod dedicated;
pub mod filter;
mod socket;

pub use socket::PacketSocket;
