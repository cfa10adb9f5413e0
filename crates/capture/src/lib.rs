//! `nanowire capture`: timestamped packet capture to pcapng with nanosecond
//! resolution, of the kernel's traffic and of the xdp engines' traffic.
//!
//! * Tap mode (default, [`merged`]): frames from an `AF_PACKET` socket bound to one
//!   interface (both directions, kernel `SO_TIMESTAMPNS` stamps taken at the
//!   packet tap), merged in timestamp order with what every xdp engine on
//!   the interface receives and sends, copied by the engines into their
//!   capture taps (crates/tap; stamped when the engine takes the frame off
//!   its RX ring or puts it on its TX ring). XDP takes redirected frames
//!   before the packet taps and AF_XDP transmit bypasses them, so without
//!   the engine taps accelerated traffic would be invisible.
//! * Dedicated mode (`--xdp`, [`dedicated`]): a capture XDP program takes
//!   the frames into AF_XDP with a deep ring.
//!
//! [`cli`] checks the arguments and picks the mode; what both modes share
//! (the arguments, the output file, the stop flag) is in `session`, below
//! them both.

pub mod cli;
mod dedicated;
pub mod filter;
mod merged;
mod session;
mod socket;

pub use socket::PacketSocket;
