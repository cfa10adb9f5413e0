//! Cost of the sans-IO TCP per short connection, as a worker of the nginx
//! row (issue 24) serves them: a client stack opens a connection to a
//! server stack, sends a request, the server accepts, reads, answers and
//! closes first (its side stays in TIME-WAIT for 60 s), the client reads
//! and closes. One connection every `NANOWIRE_CHURN_GAP_US` (3000: about
//! 20,000 server connections in TIME-WAIT, a worker's count) of simulated
//! time, with timers polled at every step. A warm-up of 80 simulated
//! seconds fills TIME-WAIT to its steady state; then
//! `NANOWIRE_CHURN_CONNS` (10,000) connections are made in `measure`, the
//! function to count (`valgrind --tool=callgrind
//! --toggle-collect='churn_cost::measure*'`: instructions per connection,
//! both stacks). Prints one JSON object.
//! `cargo run --release -p nanowire-tcp --example churn_cost`

use nanowire_tcp::{Config, ListenerId, Secret, TcpStack};
use std::net::{Ipv4Addr, SocketAddrV4};

const REQUEST: &[u8] = b"GET /index.html HTTP/1.0\r\nHost: 198.18.0.2\r\nUser-Agent: ApacheBench/2.3\r\nAccept: */*\r\n\r\n";

fn pump(from: &mut TcpStack, to: &mut TcpStack, now: u64, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while let Some(t) = from.poll_transmit(now, buf) {
        to.input(now, t.src, t.dst, &buf[..t.len]);
        n += 1;
    }
    n
}

struct World {
    server: TcpStack,
    client: TcpStack,
    listener: ListenerId,
    now: u64,
    gap: u64,
    buf: Vec<u8>,
    response: Vec<u8>,
}

impl World {
    fn step(&mut self) {
        self.now += self.gap / 8;
        let now = self.now;
        self.server.poll_timers(now);
        self.client.poll_timers(now);
        pump(&mut self.client, &mut self.server, now, &mut self.buf);
        pump(&mut self.server, &mut self.client, now, &mut self.buf);
    }

    /// One connection, start to end; returns the segments exchanged.
    fn connection(&mut self) {
        let server = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 80);
        let c = self
            .client
            .connect(
                self.now,
                SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 0),
                server,
            )
            .expect("connect");
        self.step();
        self.client.send(c, REQUEST).expect("request");
        self.step();
        let s = self.server.accept(self.listener).expect("accepted");
        let mut req = [0u8; 512];
        assert_eq!(self.server.recv(s, &mut req), Ok(REQUEST.len()));
        self.server.send(s, &self.response).expect("response");
        self.server.close(self.now, s).expect("close");
        self.step();
        let mut rsp = [0u8; 1024];
        assert_eq!(self.client.recv(c, &mut rsp), Ok(self.response.len()));
        assert_eq!(self.client.recv(c, &mut rsp), Ok(0));
        self.client.close(self.now, c).expect("close");
        for _ in 0..5 {
            self.step();
        }
    }
}

#[inline(never)]
fn measure(w: &mut World, n: u64) {
    for _ in 0..n {
        w.connection();
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let gap = env("NANOWIRE_CHURN_GAP_US", 3000) * 1000;
    let conns = env("NANOWIRE_CHURN_CONNS", 10_000);
    let cfg = Config {
        max_connections: 65_536,
        ..Config::default()
    };
    let mut server = TcpStack::new(cfg.clone(), Secret::from_bytes([1; 16]));
    let client = TcpStack::new(cfg.clone(), Secret::from_bytes([2; 16]));
    let listener = server
        .listen(SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 80), 511)
        .expect("listen");
    let mut w = World {
        server,
        client,
        listener,
        now: 1_000_000_000,
        gap,
        buf: vec![0u8; 70_000],
        response:
            b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Length: 17\r\n\r\nhello from nginx\n"
                .to_vec(),
    };
    let warm = 80_000_000_000 / gap;
    for _ in 0..warm {
        w.connection();
    }
    let held = w.server.connection_count();
    measure(&mut w, conns);
    println!(
        "{{\"connections\": {conns}, \"warmup\": {warm}, \"gap_us\": {}, \"server_connections_held\": {held}, \"server_connections_end\": {}, \"client_connections_end\": {}}}",
        gap / 1000,
        w.server.connection_count(),
        w.client.connection_count()
    );
}
