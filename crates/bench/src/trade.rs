//! Tick-to-trade (the idea of Onload's trade_sim): `nanowire bench exchange`
//! and `nanowire bench strategy`.
//!
//! * The **exchange** (host b) publishes market data as UDP multicast to one
//!   group and port: *ticks* at `--tick-rate` (default 1000/s) and, with
//!   `--feed-rate N`, background *feed* messages on the same group and port
//!   (a flag in the message says which, as in trade_sim: the strategy has to
//!   read and look at every message, but only a tick asks for an order).
//!   Every tick carries its send time (`CLOCK_REALTIME`, stamped just before
//!   `sendto`). The exchange accepts the strategy's TCP connection and
//!   stamps each order's arrival with the kernel's receive timestamp
//!   (`SO_TIMESTAMPNS`: when the segment reached the exchange's host, not
//!   when the exchange's loop got round to reading it). A kernel
//!   market-data socket also gets each tick's transmit stamp from the driver
//!   (`SO_TIMESTAMPING`, software): when the tick left the exchange's host.
//! * The **strategy** (host a, on the engine under test) joins the group,
//!   connects to the exchange over TCP, and answers every tick with an order
//!   that echoes the tick's sequence number and send time.
//!
//! Tick-to-trade = order arrival - tick send, on one clock (both hosts are
//! namespaces of one kernel). With transmit stamps the exchange also reports
//! wire to wire (order arrival - tick transmit stamp, as STAC-T0 measures
//! between the wires), which leaves out the exchange's own send path. The
//! exchange prints the JSON (min, p50, p99, p99.9, max in µs; ticks, orders,
//! missing orders, the feed rate reached); the strategy prints its own
//! (engine used, fallback, messages read).

use crate::le::{Fields, put_u64};
use crate::result::{Latency, LatencyRecorder};
use crate::transport::retry_busy;
use clap::Args;
use nanowire_stack::kernel::{
    enable_rx_timestamps, realtime_ns, recv_stamped, set_tx_timestamps, tx_stamp,
};
use nanowire_stack::{EngineKind, EngineOptions, UdpEndpoint, WaitPolicy};
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// Magic of a market-data message.
pub const MD_MAGIC: [u8; 4] = *b"NWMD";
/// Magic of an order.
pub const ORDER_MAGIC: [u8; 4] = *b"NWOR";
/// Bytes of a market-data header (the smallest message).
pub const MD_LEN: usize = 24;
/// Bytes of an order.
pub const ORDER_LEN: usize = 24;
/// Ticks whose wire stamps are kept (an order older than this many ticks
/// gets no wire-to-wire sample).
const WIRE_SLOTS: usize = 4096;
/// Sequence number of the strategy's hello (sent once it is ready).
const HELLO: u64 = u64::MAX;

/// What a market-data message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Background feed: read it, do nothing.
    Feed = 0,
    /// A tick: answer with an order.
    Tick = 1,
    /// The exchange is done.
    End = 2,
}

/// A market-data message: magic, kind, sequence, send time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Md {
    pub kind: Kind,
    pub seq: u64,
    pub tx_ns: u64,
}

impl Md {
    pub fn write(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&MD_MAGIC);
        b[4] = self.kind as u8;
        b[5..8].fill(0);
        put_u64(b, 8, self.seq);
        put_u64(b, 16, self.tx_ns);
    }
    pub fn parse(b: &[u8]) -> Option<Md> {
        let f = Fields::check(b, MD_MAGIC, MD_LEN)?;
        let kind = match f.u8_at(4) {
            0 => Kind::Feed,
            1 => Kind::Tick,
            2 => Kind::End,
            _ => return None,
        };
        Some(Md {
            kind,
            seq: f.u64_at(8),
            tx_ns: f.u64_at(16),
        })
    }
}

/// An order: magic, the strategy's engine, the tick's sequence and send time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    pub engine: u8,
    pub seq: u64,
    pub tick_ns: u64,
}

impl Order {
    pub fn bytes(&self) -> [u8; ORDER_LEN] {
        let mut b = [0u8; ORDER_LEN];
        b[0..4].copy_from_slice(&ORDER_MAGIC);
        b[4] = self.engine;
        put_u64(&mut b, 8, self.seq);
        put_u64(&mut b, 16, self.tick_ns);
        b
    }
    pub fn parse(b: &[u8]) -> Option<Order> {
        let f = Fields::check(b, ORDER_MAGIC, ORDER_LEN)?;
        Some(Order {
            engine: f.u8_at(4),
            seq: f.u64_at(8),
            tick_ns: f.u64_at(16),
        })
    }
}

fn engine_code(e: EngineKind) -> u8 {
    match e {
        EngineKind::Kernel => 0,
        EngineKind::Spin => 1,
        EngineKind::Xdp => 2,
    }
}

fn engine_of(c: u8) -> Option<EngineKind> {
    match c {
        0 => Some(EngineKind::Kernel),
        1 => Some(EngineKind::Spin),
        2 => Some(EngineKind::Xdp),
        _ => None,
    }
}

fn pin(cpu: Option<usize>) -> Result<(), String> {
    match cpu {
        Some(c) => crate::client::pin_to_cpu(c),
        None => Ok(()),
    }
}

#[derive(Debug, Args)]
pub struct ExchangeArgs {
    /// Address of the exchange (its orders port listens here; multicast leaves from it).
    #[arg(short = 'i', long = "ip")]
    pub ip: Ipv4Addr,
    /// TCP port for orders.
    #[arg(short = 'p', long, default_value_t = 11500)]
    pub port: u16,
    /// Multicast group of the market data.
    #[arg(long, default_value = "239.18.0.1")]
    pub group: Ipv4Addr,
    /// UDP port of the market data.
    #[arg(long, default_value_t = 11501)]
    pub md_port: u16,
    /// Ticks (messages that ask for an order) per second.
    #[arg(long, default_value_t = 1000)]
    pub tick_rate: u64,
    /// Background feed messages per second on the same group (0 = none).
    #[arg(long, default_value_t = 0)]
    pub feed_rate: u64,
    /// Size of every market-data message in bytes (at least 24).
    #[arg(short = 'm', long = "msg-size", default_value_t = 64)]
    pub msg_size: usize,
    /// Seconds of ticks (after the warm-up).
    #[arg(short = 't', long = "time", default_value_t = 2.0)]
    pub time: f64,
    /// Ticks of the first MS milliseconds are not measured.
    #[arg(long, default_value_t = 300)]
    pub warmup_ms: u64,
    /// Give up when no strategy connects (and says hello) within this many seconds.
    #[arg(long, default_value_t = 15.0)]
    pub accept_timeout: f64,
    /// Pin the exchange to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Do not ask for transmit stamps of the ticks (no wire-to-wire numbers).
    #[arg(long)]
    pub no_wire_stamps: bool,
    /// Engine of the market-data sender: spin (a kernel socket, the default) or xdp
    /// (the engine's AF_XDP transmit). Orders always arrive on a kernel TCP socket
    /// (for its SO_TIMESTAMPNS stamps).
    #[arg(long, default_value = "spin")]
    pub engine: EngineKind,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StrategyArgs {
    /// Address of the exchange.
    #[arg(short = 'i', long = "ip")]
    pub ip: Ipv4Addr,
    /// The exchange's TCP port for orders.
    #[arg(short = 'p', long, default_value_t = 11500)]
    pub port: u16,
    /// Multicast group of the market data.
    #[arg(long, default_value = "239.18.0.1")]
    pub group: Ipv4Addr,
    /// UDP port of the market data.
    #[arg(long, default_value_t = 11501)]
    pub md_port: u16,
    /// Engine: kernel (blocking), spin (polled kernel sockets), xdp (multicast and TCP on the engine).
    #[arg(long, default_value = "kernel")]
    pub engine: EngineKind,
    /// xdp: fail instead of falling back to the spin engine.
    #[arg(long)]
    pub no_fallback: bool,
    /// Give up after this many seconds without an end message.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Pin the strategy to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// What the exchange prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExchangeReport {
    pub tool: String,
    /// The strategy's engine, as its hello said.
    pub strategy_engine: Option<EngineKind>,
    /// Engine of the exchange's market-data sender.
    #[serde(default = "default_spin")]
    pub exchange_engine: EngineKind,
    pub tick_rate: u64,
    pub feed_rate_target: u64,
    /// Feed messages per second actually sent over the measured period.
    pub feed_rate: f64,
    pub msg_size: usize,
    pub duration_s: f64,
    /// Ticks sent in the measured period.
    pub ticks: u64,
    /// Orders received for those ticks.
    pub orders: u64,
    /// Measured ticks that got no order (never silent).
    pub missing: u64,
    /// Orders read together with another in one read: they share the later
    /// arrival stamp (an upper bound).
    pub coalesced: u64,
    /// Where arrival stamps came from: `kernel` (SO_TIMESTAMPNS) or `user`.
    pub stamp: String,
    pub feed_sent: u64,
    /// Tick-to-trade in µs.
    pub t2t_us: Option<Latency>,
    /// Tick-to-trade from the tick's transmit stamp (when it left the
    /// exchange's host: the driver's software stamp) to the order's arrival
    /// stamp, in µs: wire to wire, as STAC-T0 measures it. Leaves out the
    /// exchange's own send path. Kernel market-data sockets only.
    #[serde(default)]
    pub t2t_wire_us: Option<Latency>,
    /// How long the exchange's send call took per tick, in µs (its stamp to
    /// the call's return): the part of the tick's way spent in the sender.
    #[serde(default)]
    pub tick_send_us: Option<Latency>,
    pub env: crate::env::Env,
}

/// What the strategy prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StrategyReport {
    pub tool: String,
    pub engine: EngineKind,
    pub engine_requested: EngineKind,
    pub fallback_reason: Option<String>,
    pub ticks: u64,
    pub feed: u64,
    pub orders: u64,
    pub ignored: u64,
    pub ended: bool,
    /// Tick one-way latency in µs: the strategy's read (CLOCK_REALTIME after
    /// the receive returned) - the tick's send time. Tick-to-trade minus this
    /// is the order's way back (strategy send + TCP to the exchange's host).
    pub tick_us: Option<Latency>,
    /// How long the strategy's order send call took, in µs (the strategy's
    /// read to the call's return).
    #[serde(default)]
    pub order_send_us: Option<Latency>,
}

fn default_spin() -> EngineKind {
    EngineKind::Spin
}

fn io_s(what: &str) -> impl Fn(io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

pub fn run_exchange(a: ExchangeArgs) -> Result<i32, String> {
    if a.msg_size < MD_LEN || a.msg_size > 1472 {
        return Err(format!(
            "bad --msg-size {}: expected {MD_LEN}..=1472",
            a.msg_size
        ));
    }
    if a.tick_rate == 0 || a.tick_rate > 100_000 {
        return Err(format!(
            "bad --tick-rate {}: expected 1..=100000",
            a.tick_rate
        ));
    }
    if a.feed_rate > 1_000_000 {
        return Err(format!(
            "bad --feed-rate {}: expected 0..=1000000",
            a.feed_rate
        ));
    }
    if !(a.time.is_finite() && a.time > 0.0 && a.time < 1e6) {
        return Err(format!("bad test time {}: expected seconds > 0", a.time));
    }
    if !a.group.is_multicast() {
        return Err(format!("{} is not a multicast group", a.group));
    }
    pin(a.cpu)?;
    let opts = EngineOptions::new(EngineKind::Spin);
    let listener = nanowire_stack::kernel::tcp_listen(SocketAddrV4::new(a.ip, a.port), &opts)
        .map_err(|e| e.to_string())?;
    // Market data: a kernel socket (default), or the xdp engine's. The kernel
    // socket's ticks (not the feed) get a transmit stamp from the driver (a
    // clone of the socket reads them): the moment the tick left the host.
    let mut wire_sock: Option<std::net::UdpSocket> = None;
    let mut md: Box<dyn UdpEndpoint> = if a.engine == EngineKind::Xdp {
        let mut o = EngineOptions::new(EngineKind::Xdp);
        o.fallback = false;
        o.iface = crate::env::iface_of(a.ip);
        nanowire_stack::open_udp(SocketAddrV4::new(a.ip, 0), &o)
            .map_err(|e| format!("market-data socket on the xdp engine: {e}"))?
    } else {
        let k = nanowire_stack::kernel::KernelUdp::bind(SocketAddrV4::new(a.ip, 0), &opts)
            .map_err(io_s("market-data socket"))?;
        k.set_multicast_if(a.ip).map_err(io_s("IP_MULTICAST_IF"))?;
        k.socket()
            .set_multicast_loop_v4(false)
            .map_err(io_s("IP_MULTICAST_LOOP"))?;
        k.socket()
            .set_multicast_ttl_v4(1)
            .map_err(io_s("IP_MULTICAST_TTL"))?;
        if !a.no_wire_stamps {
            set_tx_timestamps(k.socket().as_fd(), false).map_err(io_s("SO_TIMESTAMPING"))?;
            wire_sock = Some(k.socket().try_clone().map_err(io_s("dup"))?);
        }
        Box::new(k)
    };
    let dst = SocketAddrV4::new(a.group, a.md_port);
    eprintln!(
        "READY exchange orders on {}:{} market data to {dst}",
        a.ip, a.port
    );
    // Accept the strategy and wait for its hello.
    let end_accept = Instant::now() + Duration::from_secs_f64(a.accept_timeout.max(0.1));
    let stream: TcpStream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= end_accept {
                    return Err(format!(
                        "no strategy connected to {}:{} within {} s",
                        a.ip, a.port, a.accept_timeout
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    stream.set_nodelay(true).map_err(io_s("TCP_NODELAY"))?;
    let kernel_stamps = enable_rx_timestamps(stream.as_fd()).is_ok();
    let mut rbuf: Vec<u8> = Vec::with_capacity(1 << 16);
    let mut chunk = vec![0u8; 1 << 16];
    let mut strategy_engine = None;
    while strategy_engine.is_none() {
        match recv_stamped(stream.as_fd(), &mut chunk).map_err(io_s("reading the hello"))? {
            Some((0, _)) => return Err("the strategy closed before its hello".into()),
            Some((n, _)) => {
                rbuf.extend_from_slice(&chunk[..n]);
                if rbuf.len() >= ORDER_LEN {
                    let o = Order::parse(&rbuf[..ORDER_LEN])
                        .filter(|o| o.seq == HELLO)
                        .ok_or("the strategy's first message is not a hello")?;
                    strategy_engine = Some(engine_of(o.engine));
                    rbuf.drain(..ORDER_LEN);
                }
            }
            None => {
                if Instant::now() >= end_accept {
                    return Err("the strategy connected but sent no hello".into());
                }
                std::hint::spin_loop();
            }
        }
    }
    let strategy_engine = strategy_engine.flatten();

    let mut msg = vec![0u8; a.msg_size];
    let tick_period = Duration::from_nanos(1_000_000_000 / a.tick_rate);
    let feed_period = (a.feed_rate > 0).then(|| Duration::from_nanos(1_000_000_000 / a.feed_rate));
    let warmup = Duration::from_millis(a.warmup_ms);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + Duration::from_secs_f64(a.time);
    let mut next_tick = start + tick_period / 2;
    let mut next_feed = start;
    let mut seq = 0u64;
    let mut first_measured: Option<u64> = None;
    let mut rec = LatencyRecorder::new();
    let mut send_rec = LatencyRecorder::new();
    let mut wire_rec = LatencyRecorder::new();
    // Wire stamps of recent ticks by sequence (an order echoes its tick's).
    let mut wire = vec![(u64::MAX, 0u64); WIRE_SLOTS];
    let (mut ticks, mut orders, mut coalesced, mut feed_sent, mut feed_measured) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut last_measured_seq = 0u64;
    // Send one message; returns when the send call returned (CLOCK_REALTIME ns).
    let mut send = |m: &Md, msg: &mut [u8], wire: &mut [(u64, u64)]| -> Result<u64, String> {
        m.write(msg);
        retry_busy(|| md.send_to(msg, dst))
            .map_err(|e| format!("sending market data to {dst}: {e}"))?;
        let returned = realtime_ns();
        if m.kind == Kind::Tick
            && let Some(w) = &wire_sock
        {
            // Stamping is on for this tick only. veth stamps as it
            // transmits, so the stamp is queued by the time the send
            // returns.
            while let Some(ns) = tx_stamp(w.as_fd()).map_err(io_s("reading a transmit stamp"))? {
                wire[m.seq as usize % WIRE_SLOTS] = (m.seq, ns);
            }
            set_tx_timestamps(w.as_fd(), false).map_err(io_s("SO_TIMESTAMPING"))?;
        }
        Ok(returned)
    };
    // Read what orders are there; false at end of stream.
    let mut read_orders = |rbuf: &mut Vec<u8>,
                           first: Option<u64>,
                           wire: &[(u64, u64)],
                           rec: &mut LatencyRecorder,
                           wire_rec: &mut LatencyRecorder,
                           orders: &mut u64,
                           coalesced: &mut u64|
     -> Result<bool, String> {
        loop {
            let Some((n, stamp)) =
                recv_stamped(stream.as_fd(), &mut chunk).map_err(io_s("reading orders"))?
            else {
                return Ok(true);
            };
            if n == 0 {
                return Ok(false);
            }
            let arrival = stamp.unwrap_or_else(realtime_ns);
            rbuf.extend_from_slice(&chunk[..n]);
            let whole = rbuf.len() / ORDER_LEN;
            if whole > 1 {
                *coalesced += whole as u64 - 1;
            }
            for o in rbuf.chunks_exact(ORDER_LEN) {
                let o = Order::parse(o).ok_or("the strategy sent a malformed order")?;
                if first.is_some_and(|f| o.seq >= f) {
                    *orders += 1;
                    rec.record(arrival.saturating_sub(o.tick_ns));
                    let (wseq, wns) = wire[o.seq as usize % WIRE_SLOTS];
                    if wseq == o.seq {
                        wire_rec.record(arrival.saturating_sub(wns));
                    }
                }
            }
            rbuf.drain(..whole * ORDER_LEN);
        }
    };
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if now >= next_tick {
            if now >= measure_from {
                first_measured.get_or_insert(seq);
                ticks += 1;
                last_measured_seq = seq;
            }
            if let Some(w) = &wire_sock {
                // Before the tick's stamp: the call is not part of its way.
                set_tx_timestamps(w.as_fd(), true).map_err(io_s("SO_TIMESTAMPING"))?;
            }
            let m = Md {
                kind: Kind::Tick,
                seq,
                tx_ns: realtime_ns(),
            };
            let returned = send(&m, &mut msg, &mut wire)?;
            if now >= measure_from {
                send_rec.record(returned.saturating_sub(m.tx_ns));
            }
            seq += 1;
            next_tick += tick_period;
            if next_tick < now {
                next_tick = now + tick_period;
            }
        } else if let Some(fp) = feed_period
            && now >= next_feed
        {
            let m = Md {
                kind: Kind::Feed,
                seq: feed_sent,
                tx_ns: 0,
            };
            send(&m, &mut msg, &mut wire)?;
            feed_sent += 1;
            if now >= measure_from {
                feed_measured += 1;
            }
            next_feed += fp;
            // More than 1 ms behind: do not burst to catch up.
            if now.saturating_duration_since(next_feed) > Duration::from_millis(1) {
                next_feed = now;
            }
        }
        if !read_orders(
            &mut rbuf,
            first_measured,
            &wire,
            &mut rec,
            &mut wire_rec,
            &mut orders,
            &mut coalesced,
        )? {
            return Err("the strategy closed its connection during the run".into());
        }
    }
    // Orders still in flight: wait for the last measured tick's order (bounded).
    let drain_end = Instant::now() + Duration::from_millis(300);
    while orders < ticks && Instant::now() < drain_end {
        if !read_orders(
            &mut rbuf,
            first_measured,
            &wire,
            &mut rec,
            &mut wire_rec,
            &mut orders,
            &mut coalesced,
        )? {
            break;
        }
    }
    let _ = last_measured_seq;
    for _ in 0..3 {
        let m = Md {
            kind: Kind::End,
            seq,
            tx_ns: realtime_ns(),
        };
        send(&m, &mut msg, &mut wire)?;
    }
    drop(stream);
    let r = ExchangeReport {
        tool: format!("nanowire bench exchange {}", env!("CARGO_PKG_VERSION")),
        strategy_engine,
        exchange_engine: md.engine(),
        tick_rate: a.tick_rate,
        feed_rate_target: a.feed_rate,
        feed_rate: feed_measured as f64 / a.time,
        msg_size: a.msg_size,
        duration_s: a.time,
        ticks,
        orders,
        missing: ticks.saturating_sub(orders),
        coalesced,
        stamp: if kernel_stamps { "kernel" } else { "user" }.into(),
        feed_sent,
        t2t_us: rec.summary(),
        tick_send_us: send_rec.summary(),
        t2t_wire_us: wire_rec.summary(),
        env: crate::env::Env::detect(Some(a.ip)),
    };
    if a.json {
        crate::result::print_json(&r)?;
    } else {
        let l = r.t2t_us.unwrap_or_default();
        println!(
            "tick-to-trade (strategy engine {}): ticks {} orders {} missing {} feed {:.0} msg/s\n  min {:.2} p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.2} µs",
            r.strategy_engine.map_or("?".into(), |e| e.to_string()),
            r.ticks,
            r.orders,
            r.missing,
            r.feed_rate,
            l.min,
            l.p50,
            l.p99,
            l.p99_9,
            l.max
        );
    }
    let _ = io::stdout().flush();
    Ok(0)
}

/// The order connection of a strategy: a kernel stream or the engine's TCP.
enum OrderConn {
    Kernel(TcpStream),
    Xdp(nanowire_stack::xdp::XdpTcpStream),
}

impl OrderConn {
    fn send(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            OrderConn::Xdp(s) => s.write_all(b),
            OrderConn::Kernel(s) => {
                let mut off = 0;
                while off < b.len() {
                    match retry_busy(|| s.write(&b[off..]))? {
                        0 => return Err(io::ErrorKind::WriteZero.into()),
                        n => off += n,
                    }
                }
                Ok(())
            }
        }
    }
    /// Drive the connection without waiting; false once the exchange closed it.
    fn poll_open(&mut self) -> io::Result<bool> {
        let mut b = [0u8; 256];
        let r = match self {
            OrderConn::Xdp(s) => s.try_read(&mut b).map(|n| n.is_none_or(|n| n > 0)),
            OrderConn::Kernel(s) => match s.read(&mut b) {
                Ok(n) => Ok(n > 0),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
                Err(e) => Err(e),
            },
        };
        match r {
            Err(e) if exchange_left(&e) => Ok(false),
            r => r,
        }
    }
}

/// An order connection's error that means the exchange closed it (its run
/// ended), not a failure of the strategy.
fn exchange_left(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

pub fn run_strategy(a: StrategyArgs) -> Result<i32, String> {
    pin(a.cpu)?;
    let exchange = SocketAddrV4::new(a.ip, a.port);
    // The address (and so the interface) that reaches the exchange.
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").map_err(io_s("udp socket"))?;
    probe
        .connect(exchange)
        .map_err(|e| format!("cannot reach {exchange}: {e}"))?;
    let local_ip = match probe.local_addr() {
        Ok(std::net::SocketAddr::V4(l)) => *l.ip(),
        _ => return Err(format!("no IPv4 address reaches {exchange}")),
    };
    drop(probe);
    let mut opts = EngineOptions::new(a.engine);
    opts.fallback = !a.no_fallback;
    opts.iface = crate::env::iface_of(local_ip);
    // Market data: every engine receives the group on the interface facing
    // the exchange (a kernel socket bound to the wildcard address; the xdp
    // engine claims (group, port) in its steering program).
    let mut md =
        nanowire_stack::open_udp(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, a.md_port), &opts)
            .map_err(|e| format!("cannot open a {} UDP socket: {e}", a.engine))?;
    md.join_multicast(a.group, local_ip)
        .map_err(|e| format!("cannot join {} on {local_ip}: {e}", a.group))?;
    let md_engine = md.engine();
    let mut fallback_reason = md.fallback_reason().map(str::to_string);
    // Orders: TCP on the same engine.
    let mut conn = if md_engine == EngineKind::Xdp {
        match nanowire_stack::xdp::XdpTcpStream::connect(exchange, &opts, Duration::from_secs(5)) {
            Ok(s) => {
                s.set_nodelay(true).map_err(io_s("TCP_NODELAY"))?;
                OrderConn::Xdp(s)
            }
            Err(e) => {
                return Err(format!(
                    "cannot connect to the exchange {exchange} over the xdp engine: {e}"
                ));
            }
        }
    } else {
        let mut o = opts.clone();
        o.kind = md_engine;
        let s = nanowire_stack::kernel::tcp_connect(exchange, &o, Duration::from_secs(5))
            .map_err(|e| format!("cannot connect to the exchange {exchange}: {e}"))?;
        // Non-blocking, so the loop can look for the exchange leaving; a
        // 24-byte write never waits in practice (and spins if it must).
        s.set_nonblocking(true).map_err(io_s("O_NONBLOCK"))?;
        OrderConn::Kernel(s)
    };
    if md_engine != a.engine && fallback_reason.is_none() {
        fallback_reason = Some(format!("ran on {md_engine}"));
    }
    let code = engine_code(md_engine);
    conn.send(
        &Order {
            engine: code,
            seq: HELLO,
            tick_ns: 0,
        }
        .bytes(),
    )
    .map_err(io_s("sending the hello"))?;
    let block = matches!(opts.wait, WaitPolicy::Block) && md_engine == EngineKind::Kernel;
    let give_up = Instant::now() + Duration::from_secs_f64(a.timeout.max(0.1));
    let mut buf = vec![0u8; 2048];
    let (mut ticks, mut feed, mut orders, mut ignored) = (0u64, 0u64, 0u64, 0u64);
    let mut ended = false;
    let mut idle = 0u32;
    let mut tick_rec = LatencyRecorder::new();
    let mut send_rec = LatencyRecorder::new();
    while Instant::now() < give_up {
        let got = if block {
            md.recv_from(&mut buf, Some(Instant::now() + Duration::from_millis(100)))
        } else {
            md.try_recv_from(&mut buf)
        }
        .map_err(io_s("receiving market data"))?;
        match got {
            Some((n, _)) => {
                idle = 0;
                match Md::parse(&buf[..n]) {
                    Some(Md {
                        kind: Kind::Tick,
                        seq,
                        tx_ns,
                    }) => {
                        let rx_ns = realtime_ns();
                        ticks += 1;
                        let sent = conn.send(
                            &Order {
                                engine: code,
                                seq,
                                tick_ns: tx_ns,
                            }
                            .bytes(),
                        );
                        match sent {
                            // The exchange ended its run and closed the order
                            // connection while this strategy, behind, still
                            // had ticks queued (a loaded machine: the ends
                            // are queued behind them): the run is over, as
                            // when `poll_open` sees the exchange leave.
                            Err(e) if exchange_left(&e) => break,
                            r => r.map_err(io_s("sending an order"))?,
                        }
                        orders += 1;
                        // After the order left: the stamps cost the order nothing.
                        tick_rec.record(rx_ns.saturating_sub(tx_ns));
                        send_rec.record(realtime_ns().saturating_sub(rx_ns));
                    }
                    Some(Md {
                        kind: Kind::Feed, ..
                    }) => feed += 1,
                    Some(Md {
                        kind: Kind::End, ..
                    }) => {
                        ended = true;
                        break;
                    }
                    None => ignored += 1,
                }
            }
            None => {
                idle = idle.wrapping_add(1);
                // Now and then (and after every blocking timeout): drive the
                // order connection (ACKs, timers) and notice the exchange leaving.
                if (block || idle.is_multiple_of(256))
                    && !conn.poll_open().map_err(io_s("order connection"))?
                {
                    break;
                }
                if !block {
                    std::hint::spin_loop();
                }
            }
        }
    }
    let r = StrategyReport {
        tool: format!("nanowire bench strategy {}", env!("CARGO_PKG_VERSION")),
        engine: md_engine,
        engine_requested: a.engine,
        fallback_reason,
        ticks,
        feed,
        orders,
        ignored,
        ended,
        tick_us: tick_rec.summary(),
        order_send_us: send_rec.summary(),
    };
    drop(conn);
    if a.json {
        crate::result::print_json(&r)?;
    } else {
        println!(
            "strategy on {}: tick one-way p50 {:.2} µs; ticks {} orders {} feed {} ignored {}{}",
            r.engine,
            r.tick_us.unwrap_or_default().p50,
            r.ticks,
            r.orders,
            r.feed,
            r.ignored,
            if r.ended { "" } else { " (no end message)" }
        );
    }
    if !ended && ticks == 0 {
        return Err("no market data arrived (is `nanowire bench exchange` running?)".into());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_codes_round_trip() {
        for e in [EngineKind::Kernel, EngineKind::Spin, EngineKind::Xdp] {
            assert_eq!(engine_of(engine_code(e)), Some(e));
        }
    }
}
