//! `nanowire bench server|pp|ul|tp`, with sockperf's options and vocabulary.
use crate::client::{ClientConfig, Mode, Protocol, Rate, resolve, run_client};
use crate::server::{ServerConfig, bind_server};
use clap::{Args, Subcommand};
use nanowire_stack::{EngineKind, EngineOptions, WaitPolicy};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// Answer sockperf-compatible clients (like `sockperf sr`); Ctrl-C prints the summary.
    #[command(alias = "sr")]
    Server(ServerArgs),
    /// Ping-pong: one message in flight, latency of every round trip.
    #[command(alias = "ping-pong")]
    Pp(ClientArgs),
    /// Latency under load: paced messages, every N-th answered.
    #[command(alias = "under-load")]
    Ul(ClientArgs),
    /// Throughput: paced or maximal messages, none answered (the server counts loss).
    #[command(alias = "throughput")]
    Tp(ClientArgs),
    /// Microburst generator: N datagrams back to back (or paced / for a duration).
    Burst(crate::burst::BurstArgs),
    /// Microburst receiver: spins, stalls or echoes, and accounts for every loss.
    Sink(crate::burst::SinkArgs),
    /// Tick-to-trade exchange: multicast ticks (+ background feed), stamps the orders' arrival.
    Exchange(crate::trade::ExchangeArgs),
    /// Tick-to-trade strategy: reads the ticks on an engine, answers each with a TCP order.
    Strategy(crate::trade::StrategyArgs),
}

#[derive(Debug, Args)]
struct Common {
    /// Server address (IPv4 or host name).
    #[arg(short = 'i', long = "ip")]
    ip: String,
    /// Server port.
    #[arg(short = 'p', long, default_value_t = 11111)]
    port: u16,
    /// Use TCP instead of UDP.
    #[arg(long)]
    tcp: bool,
    /// Engine: kernel (blocking recv), spin (polled non-blocking recv), xdp.
    #[arg(long, default_value = "kernel")]
    engine: EngineKind,
    /// Spin this many microseconds before blocking (overrides the engine's wait policy).
    #[arg(long, value_name = "US")]
    spin_then_block_us: Option<u64>,
    /// Pin the benchmark thread to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Socket receive buffer (SO_RCVBUF) in bytes.
    #[arg(long)]
    rcvbuf: Option<usize>,
    /// Socket send buffer (SO_SNDBUF) in bytes.
    #[arg(long)]
    sndbuf: Option<usize>,
    /// xdp engine: interface to attach to (default: the one owning the address).
    #[arg(long)]
    iface: Option<String>,
    /// xdp engine: RX/fill ring depth in frames (64..=65536, a power of two).
    #[arg(long, value_parser = parse_ring_depth)]
    ring_depth: Option<u32>,
    /// xdp engine: fail instead of falling back to the spin engine.
    #[arg(long)]
    no_fallback: bool,
}

/// `--ring-depth`: the same range as `nanowire run`'s ring_depth option,
/// so 4294967295 or 1048576 is one clear line instead of a wrapped ring.
fn parse_ring_depth(v: &str) -> Result<u32, String> {
    let n: u64 = v
        .trim()
        .parse()
        .map_err(|_| format!("{v:?} is not a number (64..=65536, a power of two)"))?;
    if !(64..=65536).contains(&n) || !n.is_power_of_two() {
        return Err(format!("{n} is out of range (64..=65536, a power of two)"));
    }
    Ok(n as u32)
}

impl Common {
    fn engine(&self) -> EngineOptions {
        let mut o = EngineOptions::new(self.engine);
        if let Some(us) = self.spin_then_block_us {
            o.wait = WaitPolicy::SpinThenBlock(Duration::from_micros(us));
        }
        o.rcvbuf = self.rcvbuf;
        o.sndbuf = self.sndbuf;
        o.iface = self.iface.clone();
        if let Some(d) = self.ring_depth {
            o.ring_depth = d;
        }
        o.fallback = !self.no_fallback;
        o
    }
    fn protocol(&self) -> Protocol {
        if self.tcp {
            Protocol::Tcp
        } else {
            Protocol::Udp
        }
    }
}

#[derive(Debug, Args)]
struct ServerArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct ClientArgs {
    #[command(flatten)]
    common: Common,
    /// Message size in bytes, the 14-byte header included (UDP 14..=65507).
    #[arg(short = 'm', long = "msg-size", default_value_t = 14)]
    msg_size: usize,
    /// Test time in seconds.
    #[arg(short = 't', long = "time", default_value_t = 1.0)]
    time: f64,
    /// Messages per second (ul default 10000, tp default max), or "max".
    #[arg(long)]
    mps: Option<Rate>,
    /// ul: ask for a reply on every N-th message.
    #[arg(long, default_value_t = 100)]
    reply_every: u64,
    /// Write every latency sample (seq,tx_ns,rx_ns,rtt_ns) to this CSV file.
    #[arg(long, value_name = "FILE")]
    full_log: Option<PathBuf>,
    /// pp, xdp engine: also report ring → application per reply (the engine's
    /// receive stamp, taken when it takes the frame off its RX ring, to the
    /// return of the receive call): `ring_to_app_us` in the JSON. Costs one
    /// clock read per frame in the engine and one per reply.
    #[arg(long)]
    rx_stamps: bool,
    /// Leave the first MS milliseconds of samples out (at most half the run).
    #[arg(long, default_value_t = 400)]
    warmup_ms: u64,
    /// A reply later than this counts as dropped (un-dropped if it turns
    /// up). Default 100 over UDP (a datagram may be lost); 10000 over TCP,
    /// where a live connection loses no reply: a late one is a stall (a
    /// retransmission, a descheduled peer), not a drop.
    #[arg(long)]
    reply_timeout_ms: Option<u64>,
    /// Exit 3 when the accounting identity (asked = received + dropped) fails.
    #[arg(long)]
    strict: bool,
}

pub fn run(args: BenchArgs) -> Result<i32, String> {
    match args.cmd {
        BenchCmd::Server(a) => server(a),
        BenchCmd::Pp(a) => client(Mode::PingPong, a),
        BenchCmd::Ul(a) => client(Mode::UnderLoad, a),
        BenchCmd::Tp(a) => client(Mode::Throughput, a),
        BenchCmd::Burst(a) => crate::burst::run_burst(a),
        BenchCmd::Sink(a) => crate::burst::run_sink(a),
        BenchCmd::Exchange(a) => crate::trade::run_exchange(a),
        BenchCmd::Strategy(a) => crate::trade::run_strategy(a),
    }
}

fn client(mode: Mode, a: ClientArgs) -> Result<i32, String> {
    let c = &a.common;
    if !(a.time.is_finite() && a.time > 0.0 && a.time < 1e7) {
        return Err(format!("bad test time {}: expected seconds > 0", a.time));
    }
    let mut cfg = ClientConfig::new(mode, std::net::SocketAddrV4::new([0, 0, 0, 0].into(), 1));
    cfg.protocol = c.protocol();
    cfg.msg_size = a.msg_size;
    // Check the size before resolving names or touching the network.
    cfg.validate()?;
    cfg.server = resolve(&c.ip, c.port)?;
    cfg.engine = c.engine();
    cfg.duration = Duration::from_secs_f64(a.time);
    if let Some(r) = a.mps {
        if mode == Mode::PingPong {
            return Err("--mps applies to ul and tp; pp keeps one message in flight".into());
        }
        cfg.mps = r;
    }
    cfg.reply_every = a.reply_every;
    cfg.cpu = c.cpu;
    cfg.full_log = a.full_log.clone();
    cfg.rx_stamps = a.rx_stamps;
    cfg.warmup = Duration::from_millis(a.warmup_ms);
    cfg.reply_timeout = Duration::from_millis(
        a.reply_timeout_ms
            .unwrap_or(match cfg.protocol {
                Protocol::Udp => 100,
                Protocol::Tcp => 10_000,
            })
            .max(1),
    );
    cfg.validate()?;
    if !c.json {
        println!(
            "nanowire: == version #{} == engine {}",
            env!("CARGO_PKG_VERSION"),
            cfg.engine.kind
        );
        println!(
            "nanowire[CLIENT] send on:\n[ 0] IP = {:<15} PORT = {:5} # {}",
            cfg.server.ip(),
            cfg.server.port(),
            cfg.protocol.as_str().to_uppercase()
        );
        println!("nanowire: Warmup stage (sending a few dummy messages)...");
        let _ = std::io::stdout().flush();
    }
    let r = run_client(&cfg)?;
    if c.json {
        crate::result::print_json(&r)?;
    } else {
        println!("nanowire: Starting test...");
        println!("nanowire: Test end (interrupted by timer)");
        print!("{}", r.human());
        if let Some(p) = &cfg.full_log {
            println!("nanowire: full log written to {}", p.display());
        }
    }
    if a.strict && r.accounting.holds == Some(false) {
        eprintln!("nanowire: {}", r.accounting.line());
        return Ok(r.accounting.strict_exit_code());
    }
    Ok(0)
}

fn server(a: ServerArgs) -> Result<i32, String> {
    let c = &a.common;
    let bind = resolve(&c.ip, c.port)?;
    let mut cfg = ServerConfig::new(bind);
    cfg.protocol = c.protocol();
    cfg.engine = c.engine();
    cfg.cpu = c.cpu;
    let stop = nanowire_stack::kernel::stop_on_signals()
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let bound = bind_server(&cfg)?;
    let local = bound.local_addr();
    eprintln!(
        "nanowire: [SERVER] listen on:\n[ 0] IP = {:<15} PORT = {:5} # {} (engine {})",
        local.ip(),
        local.port(),
        cfg.protocol.as_str().to_uppercase(),
        bound.engine()
    );
    if let Some(r) = bound.fallback_reason() {
        eprintln!(
            "nanowire: engine {} fell back to {}: {r}",
            cfg.engine.kind,
            bound.engine()
        );
    }
    let stats = bound.serve(stop, None)?;
    if c.json {
        crate::result::print_json(&stats)?;
    } else {
        print!("{}", stats.human());
    }
    let _ = std::io::stdout().flush();
    Ok(0)
}
