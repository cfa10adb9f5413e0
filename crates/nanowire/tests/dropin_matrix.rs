//! The drop-in differential matrix (issue 9): every case runs the same
//! program plainly and under `nanowire run` in a lab and compares what the
//! program observes (its stdout, and the peers' stdout). Programs: the C
//! semantics program (`crates/preload/tests/shim_semantics.c`, one mode per
//! case), Python senders/receivers, raw hand-made frames, Java 17
//! (`java UdpEcho.java`), Node.js 20 (`dgram`), dnsmasq answered by dig.
//!
//! Items of the issue and their cases:
//! 1 options before bind/connect/first send: `c_cases_match_plain` (opts *)
//! 2 fragmented datagrams both ways: `fragments_both_directions`
//! 3 multicast, mixed receivers: `multicast_every_receiver_gets_every_datagram`
//! 4 bind precedence: `specific_bind_in_another_process_wins`
//! 5 fork: `fork_with_bound_and_unbound_sockets`
//! 6 fallback announced: `fallback_is_announced_at_the_default_level`
//! 7 fds: `c_cases_match_plain` (fds 300 under RLIMIT_NOFILE 1024)
//! 8 IP options and martians: `ip_options_delivered_martians_dropped`
//! 9 epoll duplicate data, select tv_sec, dup2 vs spinners, sigaction race:
//!   `c_cases_match_plain`; IP_DROP_MEMBERSHIP: `drop_membership_stops_the_group`;
//!   exit status 127/126 and `bench --ring-depth`: `exit_statuses_and_ring_depth`
//! 10 stats pages: `stats_dir_symlink_attack_leaves_the_target_untouched`
//! and real runtimes: `java_node_dnsmasq_match_plain`.

mod run_support;
use nanowire_lab::testbed::{Host, ScopedLab};
use nanowire_testkit::{A, B};
use run_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const T: Duration = Duration::from_secs(40);

fn lab_of(tag: &str) -> ScopedLab {
    // Never between a peer's start and the program under run (see
    // `run_support::ensure_preload`).
    ensure_preload();
    nanowire_testkit::lab(&format!("nwdi{tag}"))
}

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../preload/tests")
}

fn script(name: &str) -> String {
    tests_dir().join(name).to_string_lossy().into_owned()
}

/// The C semantics program, compiled once per test binary.
fn sem() -> String {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = scratch_dir().join("shim_semantics");
        let st = Command::new("cc")
            .args(["-O1", "-pthread", "-o"])
            .arg(&bin)
            .arg(tests_dir().join("shim_semantics.c"))
            .status()
            .expect("run cc");
        assert!(st.success(), "compiling shim_semantics.c failed");
        bin.to_string_lossy().into_owned()
    })
    .clone()
}

fn envs(c: &mut Command, env: &[(&str, &str)]) {
    for (k, v) in env {
        c.env(k, v);
    }
}

/// Run `argv` to completion in host `h`, plainly or under `nanowire run`.
fn once(
    lab: &ScopedLab,
    h: Host,
    run: bool,
    env: &[(&str, &str)],
    argv: &[&str],
    name: &str,
) -> Kid {
    let mut c = run_or_plain(lab, h, run, argv);
    envs(&mut c, env);
    let mut k = spawn(name, c);
    k.wait(T);
    k
}

fn assert_same(case: &str, plain: &str, run: &str, run_err: &str) {
    assert!(
        plain == run,
        "{case}: the program observes something else under nanowire run\n--- plain\n{plain}--- run\n{run}--- run stderr\n{run_err}"
    );
}

fn started(k: &mut Kid) {
    k.wait_for("ready", Duration::from_secs(30));
}

// ------------------------------------------------------------ C cases

#[test]
#[ignore = "needs root"]
fn c_cases_match_plain() {
    let lab = lab_of("c");
    let bin = sem();
    let env = [("SEM_ADDR", A), ("SEM_PEER", B)];
    let cases: &[&[&str]] = &[
        &["opts", "bind"],
        &["opts", "connect"],
        &["opts", "send"],
        &["epoll-dup"],
        &["select-huge"],
        &["fds", "300"],
        &["sigaction-race"],
        &["dup2-spinner"],
    ];
    let mut failures = Vec::new();
    for case in cases {
        let mut argv = vec![bin.as_str()];
        argv.extend_from_slice(case);
        let name = case.join("-");
        let p = once(
            &lab,
            Host::A,
            false,
            &env,
            &argv,
            &format!("c-{name}-plain"),
        );
        let r = once(&lab, Host::A, true, &env, &argv, &format!("c-{name}-run"));
        if p.stdout() != r.stdout() || p.stdout().is_empty() {
            failures.push(format!(
                "{name}:\n--- plain\n{}--- run\n{}--- run stderr\n{}",
                p.stdout(),
                r.stdout(),
                r.stderr()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs root"]
fn fork_with_bound_and_unbound_sockets() {
    let lab = lab_of("f");
    let bin = sem();
    let mut echo = spawn(
        "f-echo",
        plain_in(
            &lab,
            Host::B,
            &["python3", &script("udp_echo.py"), "blocking", B, "7007"],
        ),
    );
    started(&mut echo);
    let env = [("SEM_ADDR", A), ("SEM_PEER", B), ("SEM_PORT", "7007")];
    for mode in ["fork-bound", "fork-unbound"] {
        let [p, r] = [("plain", false), ("run", true)].map(|(how, run)| {
            let name = format!("{mode}-{how}");
            once(&lab, Host::A, run, &env, &[&bin, mode], &name)
        });
        assert!(p.stdout().contains("child: 5 of 5"), "{}", p.both());
        assert_same(mode, &p.stdout(), &r.stdout(), &r.stderr());
    }
}

// ------------------------------------------------------------ datagrams

/// A receiver in `rx_host` (plain or run) and a sender in the other host
/// (plain or run); returns the receiver's stdout.
#[allow(clippy::too_many_arguments)]
fn rx_tx(
    lab: &ScopedLab,
    name: &str,
    rx_run: bool,
    rx_args: &[&str],
    tx_run: bool,
    tx_argv: &[&str],
) -> (String, String) {
    let mut rx_argv = vec!["python3".to_string(), script("rx.py")];
    rx_argv.extend(rx_args.iter().map(|s| s.to_string()));
    let rx_argv: Vec<&str> = rx_argv.iter().map(|s| s.as_str()).collect();
    let c = run_or_plain(lab, Host::B, rx_run, &rx_argv);
    let mut rx = spawn(&format!("{name}-rx"), c);
    started(&mut rx);
    let c = run_or_plain(lab, Host::A, tx_run, tx_argv);
    let mut tx = spawn(&format!("{name}-tx"), c);
    tx.success(T);
    rx.success(T);
    (rx.stdout(), format!("{}{}", rx.stderr(), tx.stderr()))
}

#[test]
#[ignore = "needs root"]
fn fragments_both_directions() {
    let lab = lab_of("g");
    let (sizes, tx) = ("1472,1473,4000,9000,65507", script("tx.py"));
    // into an accelerated receiver (sender plain)
    let (t, r) = (
        ["python3", &tx, B, "7101", "10", sizes],
        [B, "7101", "--expect", "50"],
    );
    let (want, _) = rx_tx(&lab, "g-in-p", false, &r, false, &t);
    assert!(want.contains("got 50"), "{want}");
    let (got, err) = rx_tx(&lab, "g-in-r", true, &r, false, &t);
    assert_same("fragments into an accelerated receiver", &want, &got, &err);
    // from an accelerated sender (receiver plain)
    let (t, r) = (
        ["python3", &tx, B, "7102", "10", sizes],
        [B, "7102", "--expect", "50"],
    );
    let (got, err) = rx_tx(&lab, "g-out-r", false, &r, true, &t);
    assert_same(
        "fragments from an accelerated sender",
        &want.replace("7101", "7102"),
        &got,
        &err,
    );
}

#[test]
#[ignore = "needs root"]
fn ip_options_delivered_martians_dropped() {
    let lab = lab_of("o");
    let t = ["python3", &script("rawtx.py"), B, "7201", "10", A];
    let (want, _) = rx_tx(&lab, "o-p", false, &[B, "7201"], false, &t);
    assert!(
        want.contains("opt 8 x10") && want.contains("plain 10 x10"),
        "{want}"
    );
    let (got, err) = rx_tx(&lab, "o-r", true, &[B, "7201"], false, &t);
    assert_same("IP options and martian sources", &want, &got, &err);
}

#[test]
#[ignore = "needs root"]
fn multicast_every_receiver_gets_every_datagram() {
    let lab = lab_of("m");
    let group = "239.7.7.7";
    // Each receiver stops at the 100th datagram. The wait for the first
    // one and the silence that ends a short count are long: receiver 0's
    // wait starts before receiver 1 and the sender have started (three
    // Python start-ups, seconds each under load; with rx.py's default 10 s
    // the fully plain iteration once counted 0), and a sender descheduled
    // for over a second mid-burst must not end the count. A receiver that
    // misses datagrams still fails, once the gap has passed.
    let rx = [
        "python3",
        &script("rx.py"),
        "0.0.0.0",
        "7301",
        "--reuse",
        "--join",
        group,
        B,
        "--expect",
        "100",
        "--first",
        "120",
        "--gap",
        "20",
    ];
    let tx = [
        "python3",
        &script("tx.py"),
        group,
        "7301",
        "100",
        "64",
        "--ifaddr",
        A,
    ];
    for modes in [
        &[false, false][..],
        &[true, false],
        &[false, true],
        &[true, true],
        &[true, true, false],
    ] {
        let mut kids = Vec::new();
        for (i, &run) in modes.iter().enumerate() {
            let c = run_or_plain(&lab, Host::B, run, &rx);
            let mut k = spawn(&format!("m-{modes:?}-{i}"), c);
            started(&mut k);
            kids.push(k);
        }
        let mut t = spawn("m-tx", plain_in(&lab, Host::A, &tx));
        t.success(T);
        for (i, k) in kids.iter_mut().enumerate() {
            k.success(T);
            assert!(
                k.stdout().contains("\ngot 100\n"),
                "receivers {modes:?} (true = under run): receiver {i} saw\n{}{}",
                k.stdout(),
                k.stderr()
            );
        }
    }
}

/// An engine's `nanowire stats --json` entry with only its non-zero
/// counters (its own and its sockets'), for a failure message.
fn nonzero(e: &serde_json::Value) -> serde_json::Value {
    let counters = |c: &serde_json::Value| -> serde_json::Value {
        c.as_object()
            .into_iter()
            .flatten()
            .filter(|(_, v)| v.as_u64() != Some(0))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let sockets: Vec<serde_json::Value> = e["sockets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| serde_json::json!({"local": s["local"], "counters": counters(&s["counters"])}))
        .collect();
    serde_json::json!({
        "pid": e["pid"],
        "xdp_mode": e["xdp_mode"],
        "counters": counters(&e["counters"]),
        "sockets": sockets,
    })
}

#[test]
#[ignore = "needs root"]
fn drop_membership_stops_the_group() {
    let lab = lab_of("d");
    let bin = sem();
    let mut outs = Vec::new();
    for run in [false, true] {
        let mut c = plain_in(
            &lab,
            Host::B,
            &[&bin, "mcast-sender", "239.7.7.8", "7401", "7402"],
        );
        c.env("SEM_ADDR", B);
        let t0 = std::time::Instant::now();
        let mut snd = spawn("d-sender", c);
        snd.wait_for("ready", Duration::from_secs(10));
        let ready = t0.elapsed();
        let env = [("SEM_ADDR", A), ("SEM_PEER", B), ("SEM_PORT", "7402")];
        let argv = [bin.as_str(), "mcast-drop", "239.7.7.8", "7401"];
        let mut c = if run {
            run_in(&lab, Host::A, &[], &argv)
        } else {
            plain_in(&lab, Host::A, &argv)
        };
        envs(&mut c, &env);
        // Host b's side of the wire, for a failure message.
        let ifb = lab.iface(Host::B);
        let dump = spawn(
            &format!("d-tcpdump-{run}"),
            plain_in(
                &lab,
                Host::B,
                &[
                    "tcpdump",
                    "-i",
                    &ifb,
                    "-n",
                    "-l",
                    "-c",
                    "200",
                    "udp or icmp",
                ],
            ),
        );
        std::thread::sleep(Duration::from_millis(300));
        let started = t0.elapsed();
        let mut k = spawn(&format!("d-{run}"), c);
        // The case ends by itself within its alarm(20). One still running
        // after 17 s is stuck (seen once in a full-file run: 'add_membership:
        // 0 OK' and nothing after): keep what its engine counted while it
        // is alive, and the sender's side, for the failure message.
        let stuck = !until(Duration::from_secs(17), || {
            matches!(k.child.try_wait(), Ok(Some(_)))
        });
        let seen = if stuck {
            let engines: Vec<serde_json::Value> =
                nanowire_testkit::engines_on(nanowire(), &lab.iface(Host::A))
                    .iter()
                    .map(nonzero)
                    .collect();
            // What each kernel saw: the links' packet counts, host b's
            // UDP counters (no port, checksum errors).
            let kernel = |h: Host, argv: &[&str]| {
                lab.command(h, argv).output().map_or_else(
                    |e| format!("{argv:?}: {e}\n"),
                    |o| String::from_utf8_lossy(&o.stdout).into_owned(),
                )
            };
            format!(
                "stuck after 17 s; engines on host a's interface then: {}\n\
                 host a links:\n{}host b links:\n{}host b /proc/net/snmp:\n{}host b sockets:\n",
                serde_json::to_string_pretty(&engines).unwrap_or_default(),
                kernel(Host::A, &["ip", "-s", "link"]),
                kernel(Host::B, &["ip", "-s", "link"]),
                kernel(Host::B, &["cat", "/proc/net/snmp"]),
            ) + &kernel(Host::B, &["ss", "-uanp"])
                + "host b's wire:\n"
                + &dump.both()
        } else {
            String::new()
        };
        k.wait(T);
        // The case sends 'quit' last: the sender ends soon after it.
        until(Duration::from_secs(5), || {
            matches!(snd.child.try_wait(), Ok(Some(_)))
        });
        let sender = format!(
            "sender (plain, host b; ready after {ready:?}, the case started after {started:?}, \
             now {:?}, exit {:?}): {}",
            t0.elapsed(),
            snd.child.try_wait(),
            snd.both()
        );
        outs.push((k.stdout(), format!("{}{seen}{sender}", k.stderr())));
    }
    assert!(
        outs[0].0.contains("joined: 20"),
        "{}\n{}",
        outs[0].0,
        outs[0].1
    );
    assert_same("IP_DROP_MEMBERSHIP", &outs[0].0, &outs[1].0, &outs[1].1);
}

#[test]
#[ignore = "needs root"]
fn specific_bind_in_another_process_wins() {
    let lab = lab_of("p");
    let tx = ["python3", &script("tx.py"), B, "7501", "50", "64"];
    let wild = ["python3", &script("rx.py"), "0.0.0.0", "7501", "--reuse"];
    let spec = ["python3", &script("rx.py"), B, "7501", "--reuse"];
    // (wildcard under run?, wildcard binds first?)
    for (wild_run, wild_first) in [(false, true), (true, true), (true, false)] {
        let start = |argv: &[&str], run: bool, n: &str| {
            let c = run_or_plain(&lab, Host::B, run, argv);
            let mut k = spawn(n, c);
            started(&mut k);
            k
        };
        let (mut w, mut s) = if wild_first {
            let w = start(&wild, wild_run, "p-wild");
            (w, start(&spec, false, "p-spec"))
        } else {
            let s = start(&spec, false, "p-spec");
            (start(&wild, wild_run, "p-wild"), s)
        };
        spawn("p-tx", plain_in(&lab, Host::A, &tx)).success(T);
        w.wait(T);
        s.wait(T);
        let what = format!("wildcard under run: {wild_run}, bound first: {wild_first}");
        assert!(
            s.stdout().contains("\ngot 50\n"),
            "{what}: the specific socket saw\n{}\nthe wildcard socket saw\n{}{}",
            s.both(),
            w.stdout(),
            w.stderr()
        );
        assert!(w.stdout().contains("\ngot 0\n"), "{what}: {}", w.both());
    }
}

// ------------------------------------------------------------ runtimes

#[test]
#[ignore = "needs root"]
fn java_node_dnsmasq_match_plain() {
    let lab = lab_of("r");
    let check = [
        "python3",
        &script("udp_check.py"),
        B,
        "7601",
        "20",
        "--quit",
    ];
    let java = script("UdpEcho.java");
    let node = script("udp_echo.js");
    let servers: Vec<(&str, Vec<&str>)> = vec![
        (
            "java",
            vec![
                "java",
                "-Djava.net.preferIPv4Stack=true",
                &java,
                B,
                "7601",
                "1000",
            ],
        ),
        ("node", vec!["node", &node, B, "7601", "1000"]),
    ];
    for (name, argv) in &servers {
        nanowire_testkit::require(&[argv[0]]);
        let mut outs = Vec::new();
        for run in [false, true] {
            let c = run_or_plain(&lab, Host::B, run, argv);
            let mut srv = spawn(&format!("r-{name}-{run}"), c);
            srv.wait_for("ready", Duration::from_secs(60));
            let mut cl = spawn(
                &format!("r-{name}-client-{run}"),
                plain_in(&lab, Host::A, &check),
            );
            cl.wait(T);
            srv.wait(T);
            outs.push((format!("{}{}", srv.stdout(), cl.stdout()), srv.stderr()));
        }
        assert!(outs[0].0.contains("ok 180"), "{name}: {}", outs[0].0);
        assert_same(name, &outs[0].0, &outs[1].0, &outs[1].1);
    }

    // dnsmasq (a real UDP server) answered by dig; then dig under run.
    nanowire_testkit::require(&["dnsmasq", "dig"]);
    let dns_argv = [
        "dnsmasq",
        "--no-daemon",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        "--port=5354",
        &format!("--listen-address={B}"),
        "--address=/matrix.lab/10.9.8.7",
        "--txt-record=txt.matrix.lab,nanowire",
    ]
    .map(|s| s.to_string());
    let dns_argv: Vec<&str> = dns_argv.iter().map(|s| s.as_str()).collect();
    let dig = |run: bool, n: &str| -> String {
        let argv = [
            "dig",
            "+short",
            "+tries=1",
            "+time=3",
            "-p",
            "5354",
            "@198.18.0.2",
            "matrix.lab",
            "A",
            "txt.matrix.lab",
            "TXT",
            "nothere.matrix.lab",
            "A",
        ];
        let c = run_or_plain(&lab, Host::A, run, &argv);
        let mut k = spawn(n, c);
        k.success(T);
        k.stdout()
    };
    let mut results = Vec::new();
    for (srv_run, cl_run) in [(false, false), (true, false), (false, true)] {
        let c = run_or_plain(&lab, Host::B, srv_run, &dns_argv);
        let srv = spawn(&format!("r-dnsmasq-{srv_run}"), c);
        // dnsmasq prints "started" on stderr once its sockets are bound.
        let mut srv = srv;
        srv.wait_for("started", Duration::from_secs(20));
        let out = dig(cl_run, &format!("r-dig-{srv_run}-{cl_run}"));
        results.push((out, srv.stderr()));
        drop(srv);
    }
    assert!(
        results[0].0.contains("10.9.8.7") && results[0].0.contains("\"nanowire\""),
        "{}",
        results[0].0
    );
    assert_same(
        "dnsmasq under run",
        &results[0].0,
        &results[1].0,
        &results[1].1,
    );
    assert_same("dig under run", &results[0].0, &results[2].0, "");
}

// ------------------------------------------------------------ the rest

#[test]
#[ignore = "needs root"]
fn fallback_is_announced_at_the_default_level() {
    let lab = lab_of("w");
    // a bad interface name: one line, exit 1, before anything runs
    let out = run_in(&lab, Host::B, &["-o", "iface=nw-nope0"], &["true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nw-nope0") && err.lines().count() == 1,
        "{err}"
    );
    // an IPv6 UDP socket (what Java and Node use on a dual-stack host)
    let v6 = "import socket; s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(('::', 0)); print('bound')";
    let k = once(&lab, Host::B, true, &[], &["python3", "-c", v6], "w-v6");
    assert!(k.stdout().contains("bound"), "{}", k.both());
    assert!(
        k.stderr().contains("xdp not used: IPv6 socket"),
        "{}",
        k.stderr()
    );
    let k = once(
        &lab,
        Host::B,
        true,
        &[("NANOWIRE_LOG", "quiet")],
        &["python3", "-c", v6],
        "w-v6q",
    );
    assert!(k.stderr().is_empty(), "quiet: {}", k.stderr());
    // a second accelerated process on the same interface: accelerated
    // (listed by `nanowire stats`) or told why not, never silent.
    let rx = |port: &str| -> Vec<String> {
        ["python3", &script("rx.py"), B, port]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let r1 = rx("7701");
    let r1: Vec<&str> = r1.iter().map(|s| s.as_str()).collect();
    let r2 = rx("7702");
    let r2: Vec<&str> = r2.iter().map(|s| s.as_str()).collect();
    let mut k1 = spawn("w-first", run_in(&lab, Host::B, &[], &r1));
    started(&mut k1);
    let mut k2 = spawn("w-second", run_in(&lab, Host::B, &[], &r2));
    started(&mut k2);
    let stats = lab
        .command(Host::B, &[nanowire(), "stats"])
        .output()
        .unwrap();
    let stats = String::from_utf8_lossy(&stats.stdout).into_owned();
    for (k, port) in [(&k1, "7701"), (&k2, "7702")] {
        assert!(
            stats.contains(&format!(":{port}")) || k.stderr().contains("xdp not used"),
            "port {port}: neither accelerated nor announced\nstats:\n{stats}\nstderr:\n{}",
            k.stderr()
        );
    }
}

#[test]
fn exit_statuses_and_ring_depth() {
    ensure_preload();
    let st = nanowire_out(&["run", "--", "/nonexistent/nanowire-no-such-program"]);
    assert_eq!(st.status.code(), Some(127), "{st:?}");
    let not_exec = scratch_dir().join("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    let st = Command::new(nanowire())
        .args(["run", "--"])
        .arg(&not_exec)
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(126), "{st:?}");
    for bad in ["4294967295", "1048576", "100", "0"] {
        let out = nanowire_out(&["bench", "pp", "-i", "127.0.0.1", "--ring-depth", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--ring-depth {bad} accepted");
        assert!(err.contains("--ring-depth") && err.contains(bad), "{err}");
    }
}

#[test]
#[ignore = "needs root"]
fn stats_dir_symlink_attack_leaves_the_target_untouched() {
    let lab = lab_of("s");
    ensure_preload();
    let target = scratch_dir().join("precious");
    std::fs::write(&target, "precious\n").unwrap();
    let victim_dir = scratch_dir().join("victim-dir");
    std::fs::create_dir_all(&victim_dir).unwrap();
    // In a private mount namespace with its own /dev/shm (world-writable,
    // sticky, like the real one): the unprivileged user (uid 65534) gets
    // there first, makes the directory its own and plants symlinks to the
    // target under every page name the next 3000 pids would use (old page
    // names were <pid>-<n>); then an engine runs as root.
    let bind = "import socket,sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 7801)); print('bound')";
    let sh = format!(
        r#"set -e
mount -t tmpfs -o mode=1777 nwdropin-shm /dev/shm
last=$(cat /proc/sys/kernel/ns_last_pid)
setpriv --reuid 65534 --regid 65534 --clear-groups /usr/bin/python3 -c "
import os
os.mkdir('/dev/shm/nanowire', 0o777)
os.chmod('/dev/shm/nanowire', 0o777)
for p in range($last, $last + 3000):
    for n in range(3):
        os.symlink('{target}', f'/dev/shm/nanowire/{{p}}-{{n}}')
"
{nw} run -- python3 -c "{bind}" {B}
ls -la /dev/shm/nanowire | grep -v -- '->' | tail -n +2 || true
echo attacked-dir-done
# the directory as a symlink to a root directory: refused too
rm -rf /dev/shm/nanowire
setpriv --reuid 65534 --regid 65534 --clear-groups ln -s {victim} /dev/shm/nanowire
{nw} run -- python3 -c "{bind}" {B}
echo symlinked-dir-done
"#,
        target = target.display(),
        victim = victim_dir.display(),
        nw = nanowire(),
    );
    let mut k = spawn(
        "s-attack",
        lab.command(
            Host::B,
            &["unshare", "-m", "--propagation", "private", "sh", "-c", &sh],
        ),
    );
    let st = k.wait(T);
    let out = k.both();
    assert!(st.success(), "{out}");
    assert!(out.contains("symlinked-dir-done"), "{out}");
    let now = std::fs::read(&target).unwrap();
    assert!(
        now == b"precious\n",
        "the symlink target was written ({} bytes now)\n{out}",
        now.len()
    );
    assert_eq!(
        std::fs::read_dir(&victim_dir).unwrap().count(),
        0,
        "a page was created through the symlinked directory\n{out}"
    );
    assert!(
        out.matches("stats directory").count() >= 2 && out.contains("refused"),
        "the engine did not say it refused the directory\n{out}"
    );
}

/// dnsmasq as it runs by default: it binds, then daemonizes (fork, setsid,
/// fork; the first process waits on a pipe for the daemon and exits) and
/// drops root for nobody. Plainly, under run on an engine of its own and
/// on the engine service, dig gets the same answers; on the service the
/// daemon (its pid from --pid-file) serves its UDP port from its own
/// engine (the socket moved to it or was left to it at its parent's
/// exit: before, the fork took it to the kernel). On an engine of its own
/// the daemon, as nobody, cannot open one (the kernel's, said why).
#[test]
#[ignore = "needs root"]
fn dnsmasq_daemonized_serves_from_its_daemons_engine_on_the_service() {
    nanowire_testkit::require(&["dnsmasq", "dig"]);
    let lab = lab_of("dd");
    let mut outs = Vec::new();
    for (i, place) in Placement::ALL.into_iter().enumerate() {
        let port = (5360 + i).to_string();
        let pidf = format!("/tmp/nw-dnsmasq-{}-{i}.pid", std::process::id());
        let _ = std::fs::remove_file(&pidf);
        let argv = [
            "dnsmasq",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            &format!("--port={port}"),
            &format!("--listen-address={B}"),
            "--address=/daemon.lab/10.9.8.6",
            &format!("--pid-file={pidf}"),
        ];
        // The first process exits once the daemon is up.
        let mut c = place.command(&lab, Host::B, &argv);
        let out = c.output().expect("dnsmasq");
        assert!(out.status.success(), "{place:?}: {out:?}");
        let pid: u32 = std::fs::read_to_string(&pidf)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("{place:?}: no pid file: {out:?}"));
        let at = format!("@{B}");
        let dig = [
            "dig",
            "+short",
            "+tries=3",
            "+time=2",
            "-p",
            &port,
            &at,
            "daemon.lab",
            "A",
        ];
        let answers: Vec<String> = (0..3)
            .map(|_| output(plain_in(&lab, Host::A, &dig), "dig"))
            .collect();
        if place == Placement::Service {
            // The daemon (nobody: no stats page of its own) holds the
            // claim of its port on the service.
            let st = nanowire_testkit::ok(
                &plain_in(&lab, Host::B, &[nanowire(), "engine", "status"])
                    .output()
                    .unwrap(),
            );
            let st: serde_json::Value = serde_json::from_str(&st).unwrap();
            let claim = format!("udp:{B}:{port}");
            let holder = st["ifaces"][0]["clients"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| {
                    c["claims"]
                        .as_array()
                        .is_some_and(|v| v.iter().any(|x| x.as_str() == Some(claim.as_str())))
                })
                .and_then(|c| c["pid"].as_u64());
            assert_eq!(
                holder,
                Some(u64::from(pid)),
                "the daemon {pid} does not hold {claim}: {st}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // SAFETY: kill(2) of the daemon this test started.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        assert!(
            until(Duration::from_secs(30), || !Path::new(&format!(
                "/proc/{pid}"
            ))
            .exists()),
            "{place:?}: dnsmasq did not end"
        );
        let _ = std::fs::remove_file(&pidf);
        outs.push(answers.join(""));
    }
    assert!(outs[0].contains("10.9.8.6"), "{}", outs[0]);
    assert_eq!(outs[0], outs[1], "own engine");
    assert_eq!(outs[0], outs[2], "service");
}
