//! `nanowire capture`: timestamped packet capture to pcapng with nanosecond
//! resolution.
//!
//! Frames come from an `AF_PACKET` socket bound to one interface (both
//! directions), each stamped by the kernel in software with `SO_TIMESTAMPNS`
//! at the moment the packet tap saw it. Frames that an XDP program redirects
//! into AF_XDP never reach the packet taps; to see bypassed traffic, capture
//! on the sending side or use the engine's own counters.

pub mod cli;
mod socket;

pub use socket::PacketSocket;
