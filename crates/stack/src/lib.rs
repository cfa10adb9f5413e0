//! nanowire engines: `kernel` (blocking kernel sockets), `spin` (polled
//! non-blocking kernel sockets) and `xdp` (AF_XDP kernel bypass).
pub mod cli;
