//! Event-loop runtimes under `nanowire run` (issue 10): the echo programs of
//! scripts/apps — Node.js `dgram`, JVM NIO `DatagramChannel` + `Selector`,
//! Python asyncio, and a C program with 6 threads sharing one socket per end
//! — each run plainly and under `nanowire run` with every profile (latency,
//! balanced, throughput), both ends the same way, 1 and 8 datagrams in
//! flight. The client checks every echoed datagram (length, sequence seen
//! once, every byte) and that all of them came back; under `run` the
//! server's log must show its socket on the xdp engine. Behaviour only: no
//! timing is asserted (the benchmark is `scripts/compare.py --scenario apps`).

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host, ScopedLab};
use run_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const COUNT: u32 = 300;
const SIZE: u32 = 200;
const T: Duration = Duration::from_secs(90);
const MODES: [Option<&str>; 4] = [None, Some("latency"), Some("balanced"), Some("throughput")];

fn apps_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/apps")
}

/// A private build directory for the C program and the Java class, made
/// afresh (mode 0700) next to the `nanowire` binary in the target directory.
fn build_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = Path::new(nanowire());
        let d = exe.parent().unwrap().join("apps-echo-build");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let src = apps_dir();
        let st = Command::new("cc")
            .args(["-O2", "-pthread", "-o"])
            .arg(d.join("echo_mt"))
            .arg(src.join("echo_mt.c"))
            .status()
            .expect("run cc");
        assert!(st.success(), "compiling echo_mt.c failed");
        let st = Command::new("javac")
            .arg("-d")
            .arg(&d)
            .arg(src.join("Echo.java"))
            .status()
            .expect("run javac (openjdk-17-jdk-headless)");
        assert!(st.success(), "compiling Echo.java failed");
        d
    })
}

/// The argv prefix that starts `runtime`'s echo program.
fn program(runtime: &str) -> Vec<String> {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    match runtime {
        "node" => vec!["node".into(), s(&apps_dir().join("echo.js"))],
        "jvm" => vec!["java".into(), "-cp".into(), s(build_dir()), "Echo".into()],
        "asyncio" => vec!["python3".into(), s(&apps_dir().join("echo_asyncio.py"))],
        "cmt" | "c1" => vec![s(&build_dir().join("echo_mt"))],
        _ => unreachable!(),
    }
}

/// Arguments after the contract's own (echo_mt's THREADS: "c1" is the C
/// program with one thread per end, a lone spinner in each process).
fn tail(runtime: &str) -> Vec<String> {
    match runtime {
        "c1" => vec!["1".into()],
        _ => vec![],
    }
}

fn lab_for(tag: &str) -> ScopedLab {
    nanowire_testkit::lab(&format!("nwrt{tag}"))
}

fn command(lab: &ScopedLab, h: Host, profile: Option<&str>, argv: &[String]) -> Command {
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    match profile {
        None => plain_in(lab, h, &argv),
        Some(p) => run_in(lab, h, &["--profile", p], &argv),
    }
}

/// Every mode × 1 and 8 in flight for one runtime, in its own lab.
fn echo_everywhere(runtime: &str, tag: &str) {
    echo_in_modes(runtime, tag, &MODES);
}

/// `modes` × 1 and 8 in flight for one runtime, in its own lab.
fn echo_in_modes(runtime: &str, tag: &str, modes: &[Option<&str>]) {
    let lab = lab_for(tag);
    let prog = program(runtime);
    let addr = ADDR_B.to_string();
    let mut port = 13000u16;
    for &profile in modes {
        for inflight in [1u32, 8] {
            port += 1;
            let name = format!("{runtime}-{}-{inflight}", profile.unwrap_or("plain"));
            let mut srv_argv = prog.clone();
            srv_argv.extend(["server".into(), addr.clone(), port.to_string()]);
            srv_argv.extend(tail(runtime));
            let mut cmd = command(&lab, Host::B, profile, &srv_argv);
            cmd.env("NANOWIRE_LOG", "info");
            let mut srv = spawn(&format!("{name}-srv"), cmd);
            srv.wait_for("ready", Duration::from_secs(30));
            let mut cli_argv = prog.clone();
            cli_argv.extend(
                [
                    "client",
                    &addr,
                    &port.to_string(),
                    &COUNT.to_string(),
                    &inflight.to_string(),
                    &SIZE.to_string(),
                    "0",
                ]
                .map(String::from),
            );
            cli_argv.extend(tail(runtime));
            let mut cli = spawn(
                &format!("{name}-cli"),
                command(&lab, Host::A, profile, &cli_argv),
            );
            let out = cli.success(T);
            let want = format!("ok {COUNT} datagrams in ");
            assert!(
                out.contains(&want),
                "{name}: {want:?} missing\n{out}\nserver:\n{}",
                srv.both()
            );
            let json = out
                .lines()
                .find(|l| l.starts_with('{'))
                .unwrap_or_else(|| panic!("{name}: no JSON line\n{out}"));
            let v: serde_json::Value =
                serde_json::from_str(json).unwrap_or_else(|e| panic!("{name}: {e}: {json}"));
            assert_eq!(v["received"].as_u64(), Some(COUNT as u64), "{name}: {json}");
            assert_eq!(v["ok"].as_bool(), Some(true), "{name}: {json}");
            if profile.is_some() {
                let log = srv.stderr();
                let on = format!("udp {addr}:{port}: xdp (interface");
                assert!(
                    log.contains(&on),
                    "{name}: {on:?} not in the server's log:\n{log}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs root"]
fn node_dgram_echo_every_profile() {
    echo_everywhere("node", "n");
}

#[test]
#[ignore = "needs root"]
fn jvm_nio_selector_echo_every_profile() {
    echo_everywhere("jvm", "j");
}

#[test]
#[ignore = "needs root"]
fn python_asyncio_echo_every_profile() {
    echo_everywhere("asyncio", "p");
}

#[test]
#[ignore = "needs root"]
fn c_six_threads_sharing_sockets_every_profile() {
    echo_everywhere("cmt", "c");
}

/// More runnable tasks than CPUs for the whole run (busy threads of this
/// test process, unpinned like the program): the six threads of each end
/// then find other threads on their CPU when they yield; `balanced` sleeps
/// after a contended yield, `latency` spins on, yielding. Every datagram
/// must still come back intact. (Lean: the full matrix runs unloaded
/// above; an interpreter's start-up alone takes seconds under this load.)
#[test]
#[ignore = "needs root"]
fn oversubscribed_machine_c_six_threads() {
    oversubscribed("cmt", "o");
}

/// The same load with one thread per end: each is its process's only
/// spinner and unpinned, so it yields on the first idle turn of every wait
/// and finds a busy thread on its CPU (`balanced` then sleeps for a quiet
/// period, `latency` spins on). Every datagram must still come back intact.
#[test]
#[ignore = "needs root"]
fn oversubscribed_machine_c_one_thread() {
    oversubscribed("c1", "q");
}

/// `runtime` under `balanced` and `latency` while busy threads of this test
/// process outnumber the CPUs.
fn oversubscribed(runtime: &str, tag: &str) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let n = std::thread::available_parallelism().map_or(2, |n| n.get()) + 1;
    let hogs: Vec<_> = (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let r = std::panic::catch_unwind(|| {
        echo_in_modes(runtime, tag, &[Some("balanced"), Some("latency")]);
    });
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}
