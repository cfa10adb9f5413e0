//! The one table of tuning options of drop-in acceleration, in the manner
//! of Onload's `EF_*` table: every option has a name, the environment
//! variable the shim reads, a type, a default, a range and a doc line, and
//! a value in each named profile.
//!
//! Precedence (lowest to highest): the built-in default, the profile
//! (`NANOWIRE_PROFILE`, default `balanced`), an explicit `NANOWIRE_*`
//! variable in the environment, then `nanowire run --engine/-o`.
//!
//! A crate of its own (no clap, no JSON, no engine): the launcher
//! (`nanowire-run`) prints and validates the table, the preload shim builds
//! its typed [`Config`] from the environment with it, and neither depends on
//! the other.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::time::Duration;

/// The named profiles, in the column order of [`OptSpec::profiles`].
pub const PROFILES: [&str; 3] = ["latency", "balanced", "throughput"];
/// Used when `NANOWIRE_PROFILE` is unset.
pub const DEFAULT_PROFILE: &str = "balanced";
/// The variable naming the profile.
pub const PROFILE_ENV: &str = "NANOWIRE_PROFILE";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptType {
    /// `xdp`, `spin` or `kernel`.
    Engine,
    /// Microseconds, or `forever`.
    Micros,
    /// An unsigned integer.
    Count,
    /// `0`/`1` (also `false`/`true`, `off`/`on`, `no`/`yes`).
    Bool,
    /// `off`, `error`, `warn`, `info` or `debug`.
    Level,
    /// Free text.
    Text,
    /// The fault injector's `key=value,...` form (nanowire_tcp::fault::EngineFaults).
    Faults,
}

impl OptType {
    pub fn as_str(self) -> &'static str {
        match self {
            OptType::Engine => "engine",
            OptType::Micros => "usec",
            OptType::Count => "count",
            OptType::Bool => "bool",
            OptType::Level => "level",
            OptType::Text => "string",
            OptType::Faults => "faults",
        }
    }
}

/// One row of the options table.
#[derive(Debug, Clone, Copy)]
pub struct OptSpec {
    pub name: &'static str,
    pub env: &'static str,
    pub ty: OptType,
    /// Built-in default (equal to the `balanced` profile's value).
    pub default: &'static str,
    /// Accepted values, for people.
    pub range: &'static str,
    /// Inclusive numeric bounds for `Micros`/`Count` (`forever` is separate).
    pub min: u64,
    pub max: u64,
    /// Value per profile, in [`PROFILES`] order.
    pub profiles: [&'static str; 3],
    pub doc: &'static str,
}

impl OptSpec {
    /// A boolean option that is on in every profile.
    const fn switch_on(name: &'static str, env: &'static str, doc: &'static str) -> OptSpec {
        OptSpec {
            name,
            env,
            ty: OptType::Bool,
            default: "1",
            range: "0|1",
            min: 0,
            max: 1,
            profiles: ["1", "1", "1"],
            doc,
        }
    }
}

/// The options table. Add a row here and it is parsed, validated, listed
/// by `nanowire run --list-options` and settable with `-o name=value`.
pub const OPTIONS: &[OptSpec] = &[
    OptSpec {
        name: "engine",
        env: "NANOWIRE_ENGINE",
        ty: OptType::Engine,
        default: "xdp",
        range: "xdp|spin|kernel",
        min: 0,
        max: 0,
        profiles: ["xdp", "xdp", "xdp"],
        doc: "Engine for UDP and TCP/IPv4 sockets. xdp: AF_XDP bypass where possible, else spin (and say why). \
              spin: kernel sockets whose blocking waits busy-poll first. kernel: no acceleration.",
    },
    OptSpec {
        name: "spin_us",
        env: "NANOWIRE_SPIN_US",
        ty: OptType::Micros,
        default: "500",
        range: "0..=60000000|forever",
        min: 0,
        max: 60_000_000,
        profiles: ["forever", "500", "50"],
        doc: "How long a blocking recv/read/poll/select/epoll_wait busy-polls with non-blocking \
              attempts before it sleeps in the real call (never longer than the call's own timeout). \
              0 disables spinning.",
    },
    OptSpec::switch_on(
        "spin_poll",
        "NANOWIRE_SPIN_POLL",
        "Spin in poll/ppoll/select/pselect/epoll_wait too (only when the set holds an IPv4/IPv6 \
         UDP or TCP socket).",
    ),
    OptSpec::switch_on(
        "spin_tcp",
        "NANOWIRE_SPIN_TCP",
        "Spin on TCP sockets (they always stay kernel sockets).",
    ),
    OptSpec {
        name: "ring_depth",
        env: "NANOWIRE_RING_DEPTH",
        ty: OptType::Count,
        default: "16384",
        range: "64..=65536, power of two",
        min: 64,
        max: 65536,
        profiles: ["65536", "16384", "65536"],
        doc: "AF_XDP RX and fill ring depth in frames (xdp engine): the largest burst absorbed \
              while the application is not reading.",
    },
    OptSpec {
        name: "rcvbuf",
        env: "NANOWIRE_RCVBUF",
        ty: OptType::Count,
        default: "0",
        range: "0..=1073741824 bytes",
        min: 0,
        max: 1 << 30,
        profiles: ["0", "0", "8388608"],
        doc: "Minimum SO_RCVBUF given to every new UDP kernel socket (SO_RCVBUFFORCE when \
              privileged); 0 keeps the kernel default. An application's own larger setsockopt wins.",
    },
    OptSpec {
        name: "iface",
        env: "NANOWIRE_IFACE",
        ty: OptType::Text,
        default: "",
        range: "interface name, empty = from the route",
        min: 0,
        max: 0,
        profiles: ["", "", ""],
        doc: "Interface the xdp engine binds; empty derives it from the socket's address and the \
              kernel's routes.",
    },
    OptSpec {
        name: "tcp_rto_min_us",
        env: "NANOWIRE_TCP_RTO_MIN_US",
        ty: OptType::Micros,
        default: "200000",
        range: "1000..=60000000",
        min: 1000,
        max: 60_000_000,
        profiles: ["10000", "200000", "200000"],
        doc: "Minimum retransmission timeout of TCP on the xdp engine (RFC 6298's floor). balanced \
              and throughput: 200 ms as Linux; latency: 10 ms, so one lost segment of a ping-pong \
              costs about 10 ms instead of 200 ms (still above the 4 ms scheduler tick of a busy \
              virtual machine, so delayed ACKs do not cause spurious retransmissions).",
    },
    OptSpec {
        name: "faults",
        env: "NANOWIRE_FAULTS",
        ty: OptType::Faults,
        default: "",
        range: "empty (off) | seed=N,loss=P,dup=P,reorder=P,reorder_delay_us=N,delay_us=N,jitter_us=N,corrupt=P,dir=rx|tx|both",
        min: 0,
        max: 0,
        profiles: ["", "", ""],
        doc: "Seeded fault injector in the xdp engine's receive and transmit paths, for every \
              protocol (tests only; off by default). P is a probability (0.01) or a percentage \
              (1%). Delay, jitter and reordering act on receive; loss, duplication and corruption \
              on both paths (dir= narrows it). Every injected fault is counted on the stats page \
              (drop_fault_rx, fault_rx_*, fault_tx_*); the engine says so on stderr when it starts.",
    },
    OptSpec::switch_on(
        "tx_csum_offload",
        "NANOWIRE_TX_CSUM_OFFLOAD",
        "xdp engine: bind AF_XDP sockets with TX metadata (kernel 6.11+) so the kernel or the \
         driver completes TCP checksums (counted as tx_csum_offload); 0: every checksum in \
         software.",
    ),
    OptSpec::switch_on(
        "spin_share",
        "NANOWIRE_SPIN_SHARE",
        "xdp engine on the engine service: processes whose threads may run on the same CPUs take \
         turns to spin (one spinner per CPU in the service's registry; the others sleep until their \
         data arrives and the spinner yields to them at every idle turn); a process alone on its \
         CPUs spins as always. 0: every process spins as if alone.",
    ),
    OptSpec::switch_on(
        "spin_hint",
        "NANOWIRE_SPIN_HINT",
        "xdp engine on the engine service, with spin_share, for waits that spin forever \
         (spin_us=forever, the latency profile): a process pinned to one CPU it shares with others \
         watches it for their frames (the steering program counts each process's) and hands it to \
         the one whose frame arrived, or sleeps until handed it. A wait with a spin budget, or with \
         0: crowded waits yield at every idle turn.",
    ),
    OptSpec::switch_on(
        "tcp_rx_hold",
        "NANOWIRE_TCP_RX_HOLD",
        "xdp engine: TCP keeps in-order data in the receive frames it arrived in until the \
         application reads it (one copy per byte, frame to buffer; counted as tcp_rx_held_bytes), \
         within 1/4 of the UMEM's RX frames (1/8 on the engine service); 0: every segment copied \
         into the connection's receive ring first.",
    ),
    OptSpec::switch_on(
        "prestart",
        "NANOWIRE_PRESTART",
        "xdp engine, own engine: `nanowire run` loads and attaches the steering program (and makes \
         the first engine's UMEM) before it execs the program (on NANOWIRE_IFACE, else on the \
         interfaces of the namespace's IPv4 routes but the loopback), so that the first \
         accelerated socket does not wait for the verifier, the XDP link and the UMEM's zeroing; \
         the program's engine adopts them. A process that forks or execs before its engine starts \
         closes them. 0: each engine makes its own at its start.",
    ),
    OptSpec {
        name: "service",
        env: "NANOWIRE_SERVICE",
        ty: OptType::Bool,
        default: "0",
        range: "0|1",
        min: 0,
        max: 1,
        profiles: ["0", "0", "0"],
        doc: "xdp engine: attach to the network namespace's engine service (`nanowire engine \
              serve`, started on demand when this process is root) instead of opening an engine \
              of the process's own: every process on the interface accelerated, no capability \
              needed (issue 23; UDP only, TCP stays on the kernel). 0: an engine per process.",
    },
    OptSpec {
        name: "log",
        env: "NANOWIRE_LOG",
        ty: OptType::Level,
        default: "warn",
        range: "off|quiet|error|warn|info|debug",
        min: 0,
        max: 0,
        profiles: ["warn", "warn", "warn"],
        doc: "Diagnostics on stderr. warn: one line per socket meant for the xdp engine that \
              does not get it, with the reason (quiet = error: silences it); info: one line per \
              socket saying which engine serves it.",
    },
];

/// Look an option up by its name or its variable.
pub fn find(name: &str) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|o| o.name == name || o.env == name)
}

fn profile_index(profile: &str) -> Result<usize, String> {
    PROFILES.iter().position(|p| *p == profile).ok_or_else(|| {
        format!(
            "unknown profile {profile:?}: expected one of {}",
            PROFILES.join(", ")
        )
    })
}

/// Check a value against an option's type and range.
pub fn validate(o: &OptSpec, v: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "bad value {v:?} for {} ({}): {why}; expected {}",
            o.name, o.env, o.range
        ))
    };
    match o.ty {
        OptType::Engine => match v {
            "xdp" | "spin" | "kernel" => Ok(()),
            _ => bad("unknown engine"),
        },
        OptType::Bool => match parse_bool(v) {
            Some(_) => Ok(()),
            None => bad("not a boolean"),
        },
        OptType::Level => match Level::parse(v) {
            Some(_) => Ok(()),
            None => bad("unknown level"),
        },
        OptType::Text => Ok(()),
        OptType::Faults => match nanowire_tcp::fault::EngineFaults::parse(v) {
            Ok(_) => Ok(()),
            Err(e) => bad(&e),
        },
        OptType::Micros | OptType::Count => {
            if o.ty == OptType::Micros && v == "forever" && o.name != "tcp_rto_min_us" {
                return Ok(());
            }
            match v.parse::<u64>() {
                Ok(n) if n < o.min || n > o.max => bad("out of range"),
                Ok(n) if o.name == "ring_depth" && !n.is_power_of_two() => {
                    bad("not a power of two")
                }
                Ok(_) => Ok(()),
                Err(_) => bad("not a number"),
            }
        }
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    pub fn parse(v: &str) -> Option<Level> {
        match v {
            "off" | "0" => Some(Level::Off),
            // quiet: no fallback lines, errors only.
            "error" | "quiet" => Some(Level::Error),
            "warn" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" => Some(Level::Debug),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Xdp,
    Spin,
    Kernel,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Xdp => "xdp",
            Engine::Spin => "spin",
            Engine::Kernel => "kernel",
        }
    }
}

/// The resolved configuration the shim runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub profile: &'static str,
    pub engine: Engine,
    /// `None` = spin forever.
    pub spin: Option<Duration>,
    pub spin_poll: bool,
    pub spin_tcp: bool,
    pub ring_depth: u32,
    pub rcvbuf: u64,
    pub iface: Option<String>,
    pub log: Level,
    /// TCP on the xdp engine: the RTO floor in microseconds.
    pub tcp_rto_min_us: u64,
    /// The fault injector's specification (empty: off).
    pub faults: String,
    /// Attach to the engine service instead of an engine of one's own.
    pub service: bool,
    /// `nanowire run` attaches the steering program before exec.
    pub prestart: bool,
}

impl Config {
    /// Resolve from a variable lookup (the environment). Errors name the
    /// variable and the accepted range. `overrides` (option name, value)
    /// win over the lookup.
    pub fn resolve(
        lookup: impl Fn(&str) -> Option<String>,
        overrides: &[(String, String)],
    ) -> Result<Config, String> {
        let profile_name = overrides
            .iter()
            .find(|(k, _)| k == "profile")
            .map(|(_, v)| v.clone())
            .or_else(|| lookup(PROFILE_ENV).filter(|v| !v.is_empty()))
            .unwrap_or_else(|| DEFAULT_PROFILE.to_string());
        let pi = profile_index(&profile_name)?;
        let get = |name: &str| -> Result<String, String> {
            let o = find(name).expect("option in table");
            let v = overrides
                .iter()
                .rev()
                .find(|(k, _)| k == o.name)
                .map(|(_, v)| v.clone())
                .or_else(|| lookup(o.env))
                .unwrap_or_else(|| o.profiles[pi].to_string());
            validate(o, &v)?;
            Ok(v)
        };
        let engine = match get("engine")?.as_str() {
            "xdp" => Engine::Xdp,
            "spin" => Engine::Spin,
            _ => Engine::Kernel,
        };
        let spin = match get("spin_us")?.as_str() {
            "forever" => None,
            n => Some(Duration::from_micros(n.parse().unwrap_or(0))),
        };
        let iface = get("iface")?;
        Ok(Config {
            profile: PROFILES[pi],
            engine,
            spin,
            spin_poll: parse_bool(&get("spin_poll")?).unwrap_or(true),
            spin_tcp: parse_bool(&get("spin_tcp")?).unwrap_or(true),
            ring_depth: get("ring_depth")?.parse().unwrap_or(16384),
            rcvbuf: get("rcvbuf")?.parse().unwrap_or(0),
            iface: if iface.is_empty() { None } else { Some(iface) },
            log: Level::parse(&get("log")?).unwrap_or(Level::Warn),
            tcp_rto_min_us: get("tcp_rto_min_us")?.parse().unwrap_or(200_000),
            faults: get("faults")?,
            service: parse_bool(&get("service")?).unwrap_or(false),
            prestart: parse_bool(&get("prestart")?).unwrap_or(true),
        })
    }

    /// From the process environment.
    pub fn from_env() -> Result<Config, String> {
        Config::resolve(|k| std::env::var(k).ok(), &[])
    }

    /// Whether blocking waits spin at all.
    pub fn spins(&self) -> bool {
        self.engine != Engine::Kernel && self.spin != Some(Duration::ZERO)
    }
}

/// The table as text (`nanowire run --list-options`).
pub fn render_table() -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<11} {:<20} {:<7} {:<8} {:<9} {:<9} {:<10} range",
        "option", "variable", "type", "default", "latency", "balanced", "throughput"
    );
    for o in OPTIONS {
        let show = |v: &str| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.to_string()
            }
        };
        let _ = writeln!(
            s,
            "{:<11} {:<20} {:<7} {:<8} {:<9} {:<9} {:<10} {}",
            o.name,
            o.env,
            o.ty.as_str(),
            show(o.default),
            show(o.profiles[0]),
            show(o.profiles[1]),
            show(o.profiles[2]),
            o.range
        );
        let _ = writeln!(
            s,
            "    {}",
            o.doc.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
    let _ = writeln!(
        s,
        "profiles: latency (spin forever, deepest rings), balanced (spin then sleep; default), \
         throughput (short spin, big buffers and rings). Select with --profile or {PROFILE_ENV}."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let v: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        move |k| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone())
    }

    #[test]
    fn table_is_consistent() {
        for o in OPTIONS {
            assert!(o.env.starts_with("NANOWIRE_"), "{}", o.name);
            validate(o, o.default).unwrap();
            for p in o.profiles {
                validate(o, p).unwrap();
            }
            assert_eq!(
                o.default, o.profiles[1],
                "{}: default must be balanced",
                o.name
            );
        }
    }

    #[test]
    fn profiles_and_precedence() {
        let c = Config::resolve(env(&[]), &[]).unwrap();
        assert_eq!(c.profile, "balanced");
        assert_eq!(c.spin, Some(Duration::from_micros(500)));
        let c = Config::resolve(env(&[("NANOWIRE_PROFILE", "latency")]), &[]).unwrap();
        assert_eq!(c.spin, None);
        assert_eq!(c.ring_depth, 65536);
        let c = Config::resolve(
            env(&[("NANOWIRE_PROFILE", "latency"), ("NANOWIRE_SPIN_US", "7")]),
            &[("engine".into(), "spin".into())],
        )
        .unwrap();
        assert_eq!(c.spin, Some(Duration::from_micros(7)));
        assert_eq!(c.engine, Engine::Spin);
        let c = Config::resolve(env(&[("NANOWIRE_PROFILE", "throughput")]), &[]).unwrap();
        assert_eq!(c.rcvbuf, 8 << 20);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = Config::resolve(env(&[("NANOWIRE_SPIN_US", "abc")]), &[]).unwrap_err();
        assert!(e.contains("NANOWIRE_SPIN_US"), "{e}");
        let e = Config::resolve(env(&[("NANOWIRE_RING_DEPTH", "1000")]), &[]).unwrap_err();
        assert!(e.contains("power of two"), "{e}");
        let e = Config::resolve(env(&[("NANOWIRE_PROFILE", "fast")]), &[]).unwrap_err();
        assert!(e.contains("unknown profile"), "{e}");
        assert!(render_table().contains("NANOWIRE_SPIN_US"));
    }

    #[test]
    fn tcp_rto_floor_and_faults_rows() {
        let c = Config::resolve(env(&[]), &[]).unwrap();
        assert_eq!(c.tcp_rto_min_us, 200_000);
        assert_eq!(c.faults, "");
        let c = Config::resolve(env(&[("NANOWIRE_PROFILE", "latency")]), &[]).unwrap();
        assert_eq!(c.tcp_rto_min_us, 10_000);
        let e = Config::resolve(env(&[("NANOWIRE_TCP_RTO_MIN_US", "forever")]), &[]).unwrap_err();
        assert!(e.contains("NANOWIRE_TCP_RTO_MIN_US"), "{e}");
        let e = Config::resolve(env(&[("NANOWIRE_TCP_RTO_MIN_US", "10")]), &[]).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let c = Config::resolve(
            env(&[(
                "NANOWIRE_FAULTS",
                "seed=1,loss=1%,dup=0.5%,reorder=1%,delay_us=50,corrupt=0.1%",
            )]),
            &[],
        )
        .unwrap();
        assert!(c.faults.contains("loss=1%"));
        let e = Config::resolve(env(&[("NANOWIRE_FAULTS", "loss=150%")]), &[]).unwrap_err();
        assert!(e.contains("NANOWIRE_FAULTS") && !e.contains('\n'), "{e}");
        assert!(render_table().contains("NANOWIRE_FAULTS"));
        assert!(render_table().contains("tcp_rto_min_us"));
    }
}
