//! Opening an xdp socket with the fallback the engine promises: when the
//! engine cannot be used (no privilege, no AF_XDP, attach refused, queue
//! busy, ...) say which in one line on stderr and serve the socket with the
//! kernel `spin` engine instead, or fail with that line when
//! `opts.fallback` is false.

use super::{OpenError, XdpSocket};
use crate::{EngineKind, EngineOptions, SocketStats, UdpEndpoint, WaitPolicy};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Instant;

/// A socket of another engine standing in for an xdp socket.
pub struct Fallback {
    inner: Box<dyn UdpEndpoint>,
    reason: String,
}

impl Fallback {
    pub fn new(inner: Box<dyn UdpEndpoint>, reason: String) -> Fallback {
        Fallback { inner, reason }
    }
}

/// Open an xdp socket; on an engine-level failure fall back through
/// `open_spin` (given the options with `kind = Spin`).
pub fn open_endpoint(
    bind: SocketAddrV4,
    opts: &EngineOptions,
    open_spin: impl FnOnce(SocketAddrV4, &EngineOptions) -> io::Result<Box<dyn UdpEndpoint>>,
) -> io::Result<Box<dyn UdpEndpoint>> {
    match XdpSocket::open(bind, opts) {
        Ok(s) => Ok(Box::new(s)),
        Err(OpenError::Socket(e)) => Err(e),
        Err(OpenError::Engine(why)) => {
            if !opts.fallback {
                return Err(io::Error::other(format!("xdp engine unavailable: {why}")));
            }
            eprintln!("nanowire: xdp engine unavailable, falling back to spin: {why}");
            let mut o = opts.clone();
            o.kind = EngineKind::Spin;
            o.wait = WaitPolicy::Spin;
            let inner = open_spin(bind, &o)?;
            Ok(Box::new(Fallback::new(inner, why)))
        }
    }
}

impl UdpEndpoint for Fallback {
    fn engine(&self) -> EngineKind {
        self.inner.engine()
    }
    fn fallback_reason(&self) -> Option<&str> {
        Some(&self.reason)
    }
    fn local_addr(&self) -> io::Result<SocketAddrV4> {
        self.inner.local_addr()
    }
    fn connect(&mut self, peer: SocketAddrV4) -> io::Result<()> {
        self.inner.connect(peer)
    }
    fn send_to(&mut self, buf: &[u8], dst: SocketAddrV4) -> io::Result<usize> {
        self.inner.send_to(buf, dst)
    }
    fn send_batch_to(&mut self, bufs: &[&[u8]], dst: SocketAddrV4) -> io::Result<usize> {
        self.inner.send_batch_to(bufs, dst)
    }
    fn recv_from(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<(usize, SocketAddrV4)>> {
        self.inner.recv_from(buf, deadline)
    }
    fn try_recv_from(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddrV4)>> {
        self.inner.try_recv_from(buf)
    }
    fn join_multicast(&mut self, group: Ipv4Addr, iface_addr: Ipv4Addr) -> io::Result<()> {
        self.inner.join_multicast(group, iface_addr)
    }
    fn stats(&self) -> SocketStats {
        self.inner.stats()
    }
    fn engine_counters(&self) -> Vec<(String, u64)> {
        self.inner.engine_counters()
    }
}
