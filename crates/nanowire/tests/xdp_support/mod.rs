//! A child process for the xdp test files: stdout lines on a channel, killed
//! and reaped on drop.
#![allow(dead_code)]

use std::net::{SocketAddrV4, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child killed (and reaped) on drop, with its stdout lines on a channel.
pub struct Proc {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn");
        let lines = nanowire_testkit::line_channel(child.stdout.take().unwrap());
        Proc { child, lines }
    }

    pub fn line(&self, timeout: Duration) -> serde_json::Value {
        let l = self
            .lines
            .recv_timeout(timeout)
            .expect("child printed a line in time");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}"))
    }

    /// Close stdin and collect the final counters line.
    pub fn finish(mut self) -> serde_json::Value {
        drop(self.child.stdin.take());
        let v = self.line(Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        v
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Send `msg` and wait for its echo (up to 3 sends); late replies to
/// earlier messages are skipped, so a slow machine cannot shift the pairs.
pub fn udp_echo(sock: &UdpSocket, dst: SocketAddrV4, msg: &[u8]) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 65536];
    for _ in 0..3 {
        sock.send_to(msg, dst).unwrap();
        let deadline = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < deadline {
            if let Ok((n, _)) = sock.recv_from(&mut buf)
                && &buf[..n] == msg
            {
                return Some(buf[..n].to_vec());
            }
        }
    }
    None
}

/// Engine options of the tests' xdp sockets: `iface`, rings of `ring`
/// frames, no fallback.
pub fn xdp_opts(iface: String, ring: u32) -> nanowire_stack::EngineOptions {
    let mut o = nanowire_stack::EngineOptions::new(nanowire_stack::EngineKind::Xdp);
    o.iface = Some(iface);
    o.ring_depth = ring;
    o.fallback = false;
    o
}

/// An xdp socket bound to `port` (0: any) of every address, [`xdp_opts`].
pub fn xdp_socket(iface: String, ring: u32, port: u16) -> nanowire_stack::xdp::XdpSocket {
    let any = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, port);
    nanowire_stack::xdp::XdpSocket::open(any, &xdp_opts(iface, ring))
        .unwrap_or_else(|e| panic!("xdp socket on port {port}: {e}"))
}

/// `serve` on a kernel UDP socket bound to `bind` in namespace `ns`, on a
/// thread of its own: returns once `prepare` has set the socket up (5 s at
/// most), so what the test sends next finds it bound.
pub fn kernel_udp_in<T: Send + 'static>(
    ns: String,
    bind: SocketAddrV4,
    prepare: impl FnOnce(&UdpSocket) + Send + 'static,
    serve: impl FnOnce(UdpSocket) -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        nanowire_testkit::in_ns(&ns, move || {
            let u = UdpSocket::bind(bind).unwrap_or_else(|e| panic!("bind {bind}: {e}"));
            prepare(&u);
            tx.send(()).unwrap();
            serve(u)
        })
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the kernel socket is ready");
    h
}
