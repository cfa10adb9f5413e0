//! The engine's process-wide settings, typed. The library never reads the
//! environment: the program around it (the `nanowire` binary, the preload
//! shim, a test program) resolves its settings once and hands them over with
//! [`configure`] before the first engine opens. An engine opened without
//! that runs with the defaults.
//!
//! [`EngineConfig::from_vars`] builds the settings from variables by name
//! (the binary passes the environment as the lookup; the names are the
//! options table's rows that reach the engine and the test/ops knobs, see
//! [`VARS`]).

use nanowire_tcp::fault::EngineFaults;
use nanowire_xdp::program::AttachMode;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The options table's `faults` row.
pub const FAULTS_VAR: &str = "NANOWIRE_FAULTS";
/// The options table's `tcp_rto_min_us` row.
pub const TCP_RTO_MIN_VAR: &str = "NANOWIRE_TCP_RTO_MIN_US";
/// The options table's `tx_csum_offload` row (`0`: TCP checksums in
/// software even where AF_XDP TX metadata offers the offload).
pub const TX_CSUM_OFFLOAD_VAR: &str = "NANOWIRE_TX_CSUM_OFFLOAD";
/// The options table's `tcp_rx_hold` row (`0`: TCP copies every segment
/// into the connection's receive ring, keeps no frame).
pub const TCP_RX_HOLD_VAR: &str = "NANOWIRE_TCP_RX_HOLD";
/// The options table's `spin_share` row (`0`: a process on the engine
/// service spins as if alone on its CPUs, no spinner registry).
pub const SPIN_SHARE_VAR: &str = "NANOWIRE_SPIN_SHARE";
/// The options table's `spin_hint` row (`0`: crowded waits on the engine
/// service yield at every idle turn instead of passing the CPU by the
/// steering program's per-process frame count; waits with a spin budget
/// yield so either way, the shim's waiter).
pub const SPIN_HINT_VAR: &str = "NANOWIRE_SPIN_HINT";
/// Force an XDP attach mode (`native` or `generic`).
pub const XDP_MODE_VAR: &str = "NANOWIRE_XDP_MODE";
/// `1`: behave as an engine without multi-buffer receive (tests).
pub const NO_MULTI_BUFFER_VAR: &str = "NANOWIRE_XDP_NO_MULTI_BUFFER";
/// `1`: no quiet turns (every idle turn of a spinning receive takes the RX
/// lock and polls, as before e6f2901; for comparisons: session 19 found the
/// quiet turn is main's whole far-placement p50 gap, docs/benchmarks.md).
pub const RX_NO_QUIET_VAR: &str = "NANOWIRE_XDP_RX_NO_QUIET";
/// Another directory for the stats pages.
pub const STATS_DIR_VAR: &str = "NANOWIRE_STATS_DIR";
/// The options table's `service` row: attach to the engine service.
pub const SERVICE_VAR: &str = "NANOWIRE_SERVICE";
/// The nanowire binary that can start the engine service (`nanowire run`
/// sets it for the programs it runs).
pub const SERVICE_BIN_VAR: &str = "NANOWIRE_BIN";
/// Test hook (issue 24), `1`: a process stops itself (SIGSTOP) when it
/// closes a TCP listener on the engine service, after the engine closed it
/// and before it leaves the listener's group (`run_fork`
/// `a_worker_closing_its_listener_copy_leaves_the_group_first`).
pub const TEST_LISTENER_CLOSE_STOP_VAR: &str = "NANOWIRE_TEST_LISTENER_CLOSE_STOP";
/// Test hook (issue 24), a FIFO's path: the warden's `posix_spawn` child
/// opens it for reading before its exec, so it waits there, holding its
/// copies of the process's fds, until the test opens the FIFO
/// (`run_procs an_exec_right_after_the_first_tcp_stack_waits_for_the_warden_spawn`).
pub const TEST_WARDEN_SPAWN_FIFO_VAR: &str = "NANOWIRE_TEST_WARDEN_SPAWN_FIFO";
/// Test hook (issue 24), `1`: a process kills itself (SIGKILL) right after
/// the TX kick of an application's TCP send that put frames on the wire,
/// before anything else runs (`run_exit
/// kill_9_right_after_an_answer_left_ends_it_after_the_answer`): the
/// moment the connection table must already name the end after the sent
/// bytes.
pub const TEST_KILL_AFTER_SEND_VAR: &str = "NANOWIRE_TEST_KILL_AFTER_SEND";
/// Test hook (issue 24 item 1), `1`: a forked child taking a connection its
/// parent moved off its engine kills itself (SIGKILL) after reading the
/// state, before the take (`run_procs
/// a_child_killed_while_taking_a_connection_leaves_it_to_the_parent`): the
/// owner must take it back and hand it to the kernel.
pub const TEST_KILL_IN_MOVE_VAR: &str = "NANOWIRE_TEST_KILL_IN_MOVE";
/// Test hook (issue 22, the lock rules), milliseconds: every engine open
/// (an own engine's or an attach to the service) waits this long first,
/// as an open waiting for a busy AF_XDP queue does (`run_procs
/// a_udp_bind_waits_for_no_other_threads_engine_open`: another thread's
/// bind must not wait behind it).
pub const TEST_OPEN_DELAY_MS_VAR: &str = "NANOWIRE_TEST_OPEN_DELAY_MS";
/// Every variable [`EngineConfig::from_vars`] looks up.
pub const VARS: [&str; 17] = [
    FAULTS_VAR,
    TCP_RTO_MIN_VAR,
    TX_CSUM_OFFLOAD_VAR,
    TCP_RX_HOLD_VAR,
    SPIN_SHARE_VAR,
    SPIN_HINT_VAR,
    XDP_MODE_VAR,
    NO_MULTI_BUFFER_VAR,
    RX_NO_QUIET_VAR,
    STATS_DIR_VAR,
    SERVICE_VAR,
    SERVICE_BIN_VAR,
    TEST_LISTENER_CLOSE_STOP_VAR,
    TEST_WARDEN_SPAWN_FIFO_VAR,
    TEST_KILL_AFTER_SEND_VAR,
    TEST_KILL_IN_MOVE_VAR,
    TEST_OPEN_DELAY_MS_VAR,
];

/// The engine's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The seeded fault injector (`None`: off). `Err`: the value was bad;
    /// every engine refuses to open with this line (rather than run
    /// unimpaired when faults were asked for).
    pub faults: Result<Option<(String, EngineFaults)>, String>,
    /// The RTO floor of TCP on the engine, µs (`None`: 200 ms, as Linux).
    pub tcp_rto_min_us: Option<u64>,
    /// A forced XDP attach mode (`None`: per driver, `mode_order`).
    pub xdp_mode: Option<AttachMode>,
    /// Attach and bind without multi-buffer receive even where the kernel has it.
    pub no_multi_buffer: bool,
    /// Directory of the stats pages (`None`: /dev/shm/nanowire).
    pub stats_dir: Option<PathBuf>,
    /// Attach to the network namespace's engine service (service/) instead
    /// of opening an engine of the process's own.
    pub service: bool,
    /// The nanowire binary that starts the service on demand (`None`: this
    /// program, when it is a nanowire binary).
    pub service_bin: Option<PathBuf>,
    /// Bind with AF_XDP TX metadata (XDP_UMEM_TX_METADATA_LEN) so the
    /// kernel or the driver completes TCP checksums where it can (6.11+);
    /// `false`: every checksum in software (the path of older kernels and
    /// of zero-copy drivers without the offload; for tests and comparisons).
    pub tx_csum_offload: bool,
    /// TCP keeps in-order data in its receive frames until read
    /// (`nanowire_tcp::Hold`); `false`: copied into the receive ring.
    pub tcp_rx_hold: bool,
    /// On the engine service: publish the spinner registry of the shared
    /// UMEM to this process's waits (`nanowire_xdp::seats`).
    pub spin_share: bool,
    /// With `spin_share`: pass a shared CPU by the steering program's
    /// per-process frame count (`nanowire_xdp::seats`, "passing the CPU").
    pub spin_hint: bool,
    /// No quiet turns ([`RX_NO_QUIET_VAR`]).
    pub rx_no_quiet: bool,
    /// [`TEST_LISTENER_CLOSE_STOP_VAR`].
    pub test_listener_close_stop: bool,
    /// [`TEST_WARDEN_SPAWN_FIFO_VAR`].
    pub test_warden_spawn_fifo: Option<PathBuf>,
    /// [`TEST_KILL_AFTER_SEND_VAR`].
    pub test_kill_after_send: bool,
    /// [`TEST_KILL_IN_MOVE_VAR`].
    pub test_kill_in_move: bool,
    /// [`TEST_OPEN_DELAY_MS_VAR`].
    pub test_open_delay_ms: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            faults: Ok(None),
            tcp_rto_min_us: None,
            xdp_mode: None,
            no_multi_buffer: false,
            stats_dir: None,
            service: false,
            service_bin: None,
            tx_csum_offload: true,
            tcp_rx_hold: true,
            spin_share: true,
            spin_hint: true,
            rx_no_quiet: false,
            test_listener_close_stop: false,
            test_warden_spawn_fifo: None,
            test_kill_after_send: false,
            test_kill_in_move: false,
            test_open_delay_ms: 0,
        }
    }
}

impl EngineConfig {
    /// From variables by name (`lookup` is the environment in a binary, a
    /// table in a test). A bad fault specification is kept as its error
    /// (engines refuse to open with it); a bad RTO floor or attach mode is
    /// ignored with one line on stderr, as before.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> EngineConfig {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let faults = match get(FAULTS_VAR) {
            None => Ok(None),
            Some(v) => match EngineFaults::parse(&v) {
                Ok(f) => Ok(f.map(|f| (v, f))),
                Err(e) => Err(format!("{FAULTS_VAR}={v:?}: {e}")),
            },
        };
        let tcp_rto_min_us = get(TCP_RTO_MIN_VAR).and_then(|v| match v.trim().parse::<u64>() {
            Ok(us) if (1000..=60_000_000).contains(&us) => Some(us),
            _ => {
                eprintln!(
                    "nanowire: ignoring {TCP_RTO_MIN_VAR}={v:?}: expected 1000..=60000000 (µs); using 200000 µs"
                );
                None
            }
        });
        let xdp_mode = get(XDP_MODE_VAR).and_then(|v| match v.as_str() {
            "native" => Some(AttachMode::Driver),
            "generic" => Some(AttachMode::Skb),
            o => {
                eprintln!(
                    "nanowire: ignoring {XDP_MODE_VAR}={o:?}: expected native or generic; the mode follows the driver"
                );
                None
            }
        });
        // The options table validates the boolean where the launcher sees
        // it; here anything but an explicit "off" keeps the offload.
        let on = |var| !matches!(get(var).as_deref(), Some("0" | "false" | "off" | "no"));
        let tx_csum_offload = on(TX_CSUM_OFFLOAD_VAR);
        let tcp_rx_hold = on(TCP_RX_HOLD_VAR);
        let spin_share = on(SPIN_SHARE_VAR);
        let spin_hint = on(SPIN_HINT_VAR);
        EngineConfig {
            faults,
            tcp_rto_min_us,
            xdp_mode,
            no_multi_buffer: get(NO_MULTI_BUFFER_VAR).as_deref() == Some("1"),
            rx_no_quiet: get(RX_NO_QUIET_VAR).as_deref() == Some("1"),
            test_listener_close_stop: get(TEST_LISTENER_CLOSE_STOP_VAR).as_deref() == Some("1"),
            test_warden_spawn_fifo: get(TEST_WARDEN_SPAWN_FIFO_VAR).map(PathBuf::from),
            test_kill_after_send: get(TEST_KILL_AFTER_SEND_VAR).as_deref() == Some("1"),
            test_kill_in_move: get(TEST_KILL_IN_MOVE_VAR).as_deref() == Some("1"),
            test_open_delay_ms: get(TEST_OPEN_DELAY_MS_VAR)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0),
            stats_dir: get(STATS_DIR_VAR).map(PathBuf::from),
            service: matches!(
                get(SERVICE_VAR).as_deref(),
                Some("1" | "true" | "on" | "yes")
            ),
            service_bin: get(SERVICE_BIN_VAR).map(PathBuf::from),
            tx_csum_offload,
            tcp_rx_hold,
            spin_share,
            spin_hint,
        }
    }
}

static CONFIG: OnceLock<EngineConfig> = OnceLock::new();

/// Set the process's engine settings, once, before the first engine opens.
/// `false` when settings were already in force (set earlier, or an engine
/// opened with the defaults): `cfg` is then not used.
pub fn configure(cfg: EngineConfig) -> bool {
    CONFIG.set(cfg).is_ok()
}

/// The settings in force (the defaults unless [`configure`] ran first).
pub fn config() -> &'static EngineConfig {
    CONFIG.get_or_init(EngineConfig::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(kv: &[(&str, &str)]) -> EngineConfig {
        let kv: Vec<(String, String)> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EngineConfig::from_vars(move |k| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn settings_come_from_the_variables_given_never_the_environment() {
        assert_eq!(vars(&[]), EngineConfig::default());
        let c = vars(&[
            (TCP_RTO_MIN_VAR, "10000"),
            (XDP_MODE_VAR, "native"),
            (NO_MULTI_BUFFER_VAR, "1"),
            (STATS_DIR_VAR, "/tmp/x"),
            (FAULTS_VAR, "seed=1,loss=1%"),
            (SERVICE_VAR, "yes"),
            (SERVICE_BIN_VAR, "/usr/bin/nanowire"),
            (TX_CSUM_OFFLOAD_VAR, "0"),
        ]);
        assert!(c.service);
        assert_eq!(c.service_bin, Some(PathBuf::from("/usr/bin/nanowire")));
        assert!(!vars(&[(SERVICE_VAR, "0")]).service);
        assert!(!c.tx_csum_offload);
        assert!(vars(&[(TX_CSUM_OFFLOAD_VAR, "1")]).tx_csum_offload);
        assert!(c.tcp_rx_hold);
        assert!(!vars(&[(TCP_RX_HOLD_VAR, "0")]).tcp_rx_hold);
        assert!(c.spin_share);
        assert!(!vars(&[(SPIN_SHARE_VAR, "0")]).spin_share);
        assert!(c.spin_hint);
        assert!(!vars(&[(SPIN_HINT_VAR, "off")]).spin_hint);
        assert_eq!(c.tcp_rto_min_us, Some(10_000));
        assert_eq!(c.xdp_mode, Some(AttachMode::Driver));
        assert!(c.no_multi_buffer);
        assert_eq!(c.stats_dir, Some(PathBuf::from("/tmp/x")));
        assert!(matches!(&c.faults, Ok(Some((s, _))) if s == "seed=1,loss=1%"));
        // Bad values: faults refuse engines with the parser's line; the
        // others are ignored (defaults).
        let b = vars(&[
            (FAULTS_VAR, "loss=lots"),
            (TCP_RTO_MIN_VAR, "10"),
            (XDP_MODE_VAR, "fast"),
        ]);
        assert!(b.faults.as_ref().unwrap_err().contains(FAULTS_VAR));
        assert_eq!(b.tcp_rto_min_us, None);
        assert_eq!(b.xdp_mode, None);
        assert_eq!(
            vars(&[(XDP_MODE_VAR, "generic")]).xdp_mode,
            Some(AttachMode::Skb)
        );
    }
}
