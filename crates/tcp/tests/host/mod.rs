//! Test support (not part of the library): a driver around the sans-IO
//! stack for the kernel-interop tests. A [`Link`] moves segments between a
//! [`TcpStack`] and the wire (an AF_PACKET socket), and [`Host`] runs the
//! loop with a real monotonic clock and offers blocking-style helpers
//! (connect, accept, write all, read with a deadline) that spin or wait on
//! the link. The stack itself stays free of clocks and I/O.
#![allow(dead_code)]

use nanowire_tcp::{ConnId, Error, ListenerId, State, TcpStack};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

/// The wire side of a [`Host`].
pub trait Link {
    /// Feed every received segment to `stack.input(now, ..)`; return how many.
    fn receive(&mut self, now: u64, stack: &mut TcpStack) -> usize;
    /// Drain `stack.poll_transmit(now, ..)` onto the wire; return how many.
    fn transmit(&mut self, now: u64, stack: &mut TcpStack) -> usize;
    /// Nothing to do: wait for input at most `max` (or return at once to spin).
    fn wait(&mut self, max: Duration);
}

pub struct Host<L: Link> {
    pub stack: TcpStack,
    pub link: L,
    epoch: Instant,
}

impl<L: Link> Host<L> {
    pub fn new(stack: TcpStack, link: L) -> Host<L> {
        Host {
            stack,
            link,
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds on the host's monotonic clock.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// One pass: receive, timers, transmit. True if anything moved.
    pub fn turn(&mut self) -> bool {
        let now = self.now();
        let r = self.link.receive(now, &mut self.stack);
        self.stack.poll_timers(now);
        let t = self.link.transmit(now, &mut self.stack);
        r + t > 0
    }

    /// Wait on the link until the next timer (at most `cap`).
    pub fn idle(&mut self, cap: Duration) {
        let now = self.now();
        let d = self.stack.next_deadline().map_or(cap, |t| {
            Duration::from_nanos(t.saturating_sub(now)).min(cap)
        });
        self.link.wait(d);
    }

    fn until<T>(
        &mut self,
        deadline: Option<Instant>,
        mut f: impl FnMut(&mut TcpStack) -> Option<T>,
    ) -> Option<T> {
        loop {
            self.turn();
            if let Some(v) = f(&mut self.stack) {
                // Flush what the call queued (an ACK, a window update, data).
                self.turn();
                return Some(v);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            self.idle(Duration::from_millis(1));
        }
    }

    /// Active open; waits for the handshake.
    pub fn connect(
        &mut self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        timeout: Duration,
    ) -> Result<ConnId, Error> {
        let now = self.now();
        let c = self.stack.connect(now, local, remote)?;
        let deadline = Instant::now() + timeout;
        let r = self.until(Some(deadline), |s| match s.state(c) {
            Ok(State::SynSent) | Ok(State::SynReceived) => None,
            Ok(_) => Some(s.error(c).map_or(Ok(()), Err)),
            Err(e) => Some(Err(e)),
        });
        match r {
            Some(Ok(())) => Ok(c),
            Some(Err(e)) => {
                let _ = self.stack.close(self.now(), c);
                Err(e)
            }
            None => {
                let _ = self.stack.abort(c);
                Err(Error::TimedOut)
            }
        }
    }

    /// The next connection of `l`, or `None` at the deadline.
    pub fn accept(&mut self, l: ListenerId, deadline: Option<Instant>) -> Option<ConnId> {
        self.until(deadline, |s| s.accept(l))
    }

    /// Send all of `data` (waits while the send buffer is full).
    pub fn write_all(&mut self, c: ConnId, mut data: &[u8]) -> Result<(), Error> {
        while !data.is_empty() {
            match self.stack.send(c, data) {
                Ok(n) => data = &data[n..],
                Err(Error::WouldBlock) => {
                    if !self.turn() {
                        self.idle(Duration::from_millis(1));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.turn();
        Ok(())
    }

    /// Read what is there (at least one byte), 0 at end of file, `None` at the deadline.
    pub fn read(
        &mut self,
        c: ConnId,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> Option<Result<usize, Error>> {
        self.until(deadline, |s| match s.recv(c, buf) {
            Err(Error::WouldBlock) => None,
            r => Some(r),
        })
    }

    /// Close and keep driving until nothing moves any more (the FIN or RST
    /// went out and was answered), bounded by `linger`.
    pub fn close(&mut self, c: ConnId, linger: Duration) -> Result<(), Error> {
        let now = self.now();
        self.stack.close(now, c)?;
        let end = Instant::now() + linger;
        let mut quiet = 0;
        while Instant::now() < end && quiet < 3 {
            if self.turn() {
                quiet = 0;
            } else {
                quiet += 1;
                self.idle(Duration::from_millis(1));
            }
        }
        Ok(())
    }
}
