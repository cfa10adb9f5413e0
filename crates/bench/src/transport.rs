//! Message transports for the client: UDP over any engine's [`UdpEndpoint`],
//! and TCP framed by the sockperf header's length field.

use nanowire_stack::{EngineKind, UdpEndpoint, WaitPolicy};
use nanowire_wire::sockperf::{SOCKPERF_HEADER_LEN, SockperfHeader};
use std::io::{self, Read};
use std::net::{SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

/// A call that found the socket busy (it would block, or a signal came):
/// worth trying again at once.
pub(crate) fn busy(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// `op` again until the socket is not busy (spinning: the benchmark's
/// sockets are non-blocking by design); its first other result.
pub(crate) fn retry_busy<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match op() {
            Err(e) if busy(&e) => std::hint::spin_loop(),
            r => return r,
        }
    }
}

/// Largest TCP message (header included) the client sends and the server accepts.
pub const MAX_TCP_MSG: usize = 1 << 20;

pub(crate) trait Transport {
    /// Send one whole message (waits/spins while the socket is full).
    fn send_msg(&mut self, msg: &[u8]) -> io::Result<()>;
    /// Send several messages; returns how many went.
    fn send_batch(&mut self, msgs: &[&[u8]]) -> io::Result<usize>;
    /// Receive one whole message into `buf`; `Ok(None)` at the deadline.
    fn recv_msg(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<Option<usize>>;
    /// Receive one whole message if one is already there.
    fn try_recv_msg(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    fn engine(&self) -> EngineKind;
    /// Why the requested engine was not used, if the engine fell back.
    fn fallback_reason(&self) -> Option<String> {
        None
    }
    /// Whether waiting should sleep in the kernel (`kernel` engine).
    fn blocks(&self) -> bool;
    /// The engine's receive stamp of the last message received (0: none).
    fn last_rx_stamp(&self) -> u64 {
        0
    }
}

pub(crate) struct UdpTransport {
    pub ep: Box<dyn UdpEndpoint>,
    pub peer: SocketAddrV4,
    pub block: bool,
}

impl Transport for UdpTransport {
    fn last_rx_stamp(&self) -> u64 {
        self.ep.last_rx_stamp()
    }
    fn send_msg(&mut self, msg: &[u8]) -> io::Result<()> {
        retry_busy(|| self.ep.send_to(msg, self.peer)).map(|_| ())
    }

    fn send_batch(&mut self, msgs: &[&[u8]]) -> io::Result<usize> {
        retry_busy(|| self.ep.send_batch_to(msgs, self.peer))
    }

    fn recv_msg(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<Option<usize>> {
        loop {
            match self.ep.recv_from(buf, deadline) {
                Ok(Some((n, from))) if from == self.peer => return Ok(Some(n)),
                Ok(Some(_)) => continue, // not from our server: ignore
                Ok(None) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn try_recv_msg(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match self.ep.try_recv_from(buf) {
                Ok(Some((n, from))) if from == self.peer => return Ok(Some(n)),
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn engine(&self) -> EngineKind {
        self.ep.engine()
    }
    fn fallback_reason(&self) -> Option<String> {
        self.ep.fallback_reason().map(str::to_string)
    }
    fn blocks(&self) -> bool {
        self.block
    }
}

/// A growable byte queue for reassembling a TCP stream.
#[derive(Debug, Default)]
pub(crate) struct StreamBuf {
    pub buf: Vec<u8>,
    pub start: usize,
    pub end: usize,
}

/// What the next frame in a stream buffer is.
pub(crate) enum Frame {
    /// Not enough bytes yet.
    Incomplete,
    /// A whole frame at `start..start+len`.
    Ready(usize),
    /// The length field is impossible (< header or > limit).
    Bad(u32),
}

impl StreamBuf {
    pub fn with_capacity(n: usize) -> StreamBuf {
        StreamBuf {
            buf: vec![0; n],
            start: 0,
            end: 0,
        }
    }
    pub fn len(&self) -> usize {
        self.end - self.start
    }
    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.end]
    }
    pub fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }
    /// Make room for at least `min` more bytes at the end.
    pub fn reserve(&mut self, min: usize) {
        if self.buf.len() - self.end >= min {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < min {
            let n = (self.end + min).next_power_of_two();
            self.buf.resize(n, 0);
        }
    }
    /// Read what the stream has (non-blocking stream): `Ok(Some(0))` = EOF,
    /// `Ok(None)` = nothing now.
    pub fn fill_from<R: Read>(&mut self, s: &mut R) -> io::Result<Option<usize>> {
        self.reserve(64 * 1024);
        match s.read(&mut self.buf[self.end..]) {
            Ok(n) => {
                self.end += n;
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }
    pub fn frame(&self, max: usize) -> Frame {
        if self.len() < SOCKPERF_HEADER_LEN {
            return Frame::Incomplete;
        }
        let len = SockperfHeader::new_unchecked(self.data()).length();
        if (len as usize) < SOCKPERF_HEADER_LEN || len as usize > max {
            return Frame::Bad(len);
        }
        if self.len() >= len as usize {
            Frame::Ready(len as usize)
        } else {
            Frame::Incomplete
        }
    }
}

/// A non-blocking byte stream the TCP transport and server run on: the
/// stack's stream contract (a kernel `TcpStream` or a connection of the xdp
/// engine's TCP).
pub(crate) use nanowire_stack::TcpEndpoint as TcpIo;

pub(crate) struct TcpTransport<S: TcpIo = TcpStream> {
    pub stream: S,
    pub rbuf: StreamBuf,
    pub wait: WaitPolicy,
    pub engine: EngineKind,
}

impl TcpTransport<TcpStream> {
    pub fn new(stream: TcpStream, wait: WaitPolicy, engine: EngineKind) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        Ok(TcpTransport::with_stream(stream, wait, engine))
    }
}

impl<S: TcpIo> TcpTransport<S> {
    /// A transport on a stream that is already non-blocking.
    pub fn with_stream(stream: S, wait: WaitPolicy, engine: EngineKind) -> Self {
        TcpTransport {
            stream,
            rbuf: StreamBuf::with_capacity(256 * 1024),
            wait,
            engine,
        }
    }

    fn take(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.rbuf.frame(MAX_TCP_MSG) {
            Frame::Incomplete => Ok(None),
            Frame::Bad(l) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("server sent a frame with impossible length {l}"),
            )),
            Frame::Ready(n) => {
                if n > buf.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("server sent a {n}-byte message, larger than ours"),
                    ));
                }
                buf[..n].copy_from_slice(&self.rbuf.data()[..n]);
                self.rbuf.consume(n);
                Ok(Some(n))
            }
        }
    }

    fn fill(&mut self) -> io::Result<bool> {
        match self.rbuf.fill_from(&mut self.stream)? {
            Some(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }
}

impl<S: TcpIo> Transport for TcpTransport<S> {
    fn send_msg(&mut self, msg: &[u8]) -> io::Result<()> {
        let mut off = 0;
        while off < msg.len() {
            match self.stream.write(&msg[off..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the server closed the connection",
                    ));
                }
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Keep reading replies so neither side stalls on a full buffer.
                    let got = self.fill()?;
                    if !got && self.blocks() {
                        self.stream.wait_io(true, Duration::from_millis(10))?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn send_batch(&mut self, msgs: &[&[u8]]) -> io::Result<usize> {
        for m in msgs {
            self.send_msg(m)?;
        }
        Ok(msgs.len())
    }

    fn recv_msg(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<Option<usize>> {
        loop {
            if let Some(n) = self.take(buf)? {
                return Ok(Some(n));
            }
            if self.fill()? {
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            if self.blocks() {
                let rem = deadline.map_or(Duration::from_millis(200), |d| {
                    (d - now).min(Duration::from_millis(200))
                });
                self.stream.wait_io(false, rem)?;
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn try_recv_msg(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if let Some(n) = self.take(buf)? {
            return Ok(Some(n));
        }
        if self.fill()? {
            return self.take(buf);
        }
        Ok(None)
    }

    fn engine(&self) -> EngineKind {
        self.engine
    }
    fn blocks(&self) -> bool {
        matches!(self.wait, WaitPolicy::Block)
    }
}
