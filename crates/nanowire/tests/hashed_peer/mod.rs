//! The kernel TCP peer of the hashed-stream tests (xdp_tcp.rs, xdp_faults.rs)
//! and the CRC-32 (zlib's) both ends agree on.
#![allow(dead_code)]

use nanowire_lab::testbed::{Host, ScopedLab};
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Stdio};

pub use nanowire_testkit::HASHED_PEER_PY;

/// [`HASHED_PEER_PY`] running in host b on `198.18.0.2:port`, listening;
/// killed and reaped on drop.
pub struct KernelPeer {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl KernelPeer {
    /// Start the peer, which streams `total` bytes back, and wait until it
    /// listens.
    pub fn start(l: &ScopedLab, port: u16, total: u64) -> KernelPeer {
        let (p, t) = (port.to_string(), total.to_string());
        let argv = ["python3", "-c", HASHED_PEER_PY, "198.18.0.2", &p, &t];
        let mut child = l
            .command(Host::B, &argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut out = BufReader::new(child.stdout.take().expect("stdout piped"));
        let mut line = String::new();
        out.read_line(&mut line).expect("the peer's first line");
        assert_eq!(line.trim(), "listening");
        KernelPeer { child, out }
    }

    /// Its last line, `sent <bytes> <crc32>`, once it has sent everything.
    pub fn finish(mut self) -> String {
        let mut last = String::new();
        self.out.read_line(&mut last).expect("the peer's last line");
        let _ = self.child.wait();
        last.trim().to_string()
    }
}

impl Drop for KernelPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the engine side reads from the peer: its reply line (`"<bytes>
/// <crc32>"`, its view of our stream), then its own stream, counted and
/// hashed.
#[derive(Default)]
pub struct Readback {
    head: Vec<u8>,
    pub reply: Option<String>,
    pub got: u64,
    pub crc: u32,
}

impl Readback {
    pub fn feed(&mut self, crc32: &Crc32, data: &[u8]) {
        let data = if self.reply.is_some() {
            data
        } else {
            self.head.extend_from_slice(data);
            let Some(p) = self.head.iter().position(|&b| b == b'\n') else {
                return;
            };
            self.reply = Some(String::from_utf8_lossy(&self.head[..p]).into_owned());
            let rest = self.head.split_off(p + 1);
            self.crc = crc32.update(self.crc, &rest);
            self.got += rest.len() as u64;
            return;
        };
        self.crc = crc32.update(self.crc, data);
        self.got += data.len() as u64;
    }
}

/// zlib's CRC-32, continued from `crc` (0 to start), table-driven.
pub struct Crc32([u32; 256]);

impl Crc32 {
    pub fn new() -> Crc32 {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        Crc32(t)
    }

    pub fn update(&self, crc: u32, data: &[u8]) -> u32 {
        let mut c = !crc;
        for &b in data {
            c = self.0[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
        }
        !c
    }
}

/// Byte `off` of the test stream (a position-dependent pattern, so a
/// misplaced segment changes the hash).
pub fn pattern(off: u64) -> u8 {
    (off.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 29) as u8 ^ off as u8
}

/// Write `total` bytes of the pattern through `write` in chunks of at most
/// `chunk`; the CRC-32 of what was written.
pub fn send_pattern(total: u64, chunk: usize, mut write: impl FnMut(&[u8])) -> u32 {
    let crc32 = Crc32::new();
    let mut buf = vec![0u8; chunk];
    let (mut sent, mut crc) = (0u64, 0u32);
    while sent < total {
        let n = ((total - sent) as usize).min(buf.len());
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = pattern(sent + i as u64);
        }
        crc = crc32.update(crc, &buf[..n]);
        write(&buf[..n]);
        sent += n as u64;
    }
    crc
}
