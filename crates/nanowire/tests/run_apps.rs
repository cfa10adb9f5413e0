//! Real programs under `nanowire run` in a lab: python3 socket and asyncio
//! UDP echo servers, socat (fork + exec per datagram), iperf3 -u both
//! ways, and an unprivileged user running sockperf with the spin engine.
//! Every echo is checked byte for byte; iperf3 must lose nothing at a rate
//! the receiver keeps up with. The servers and clients run with the default
//! engine (xdp: their UDP sockets go onto AF_XDP, and the log says so).

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host};
use run_support::*;
use std::path::PathBuf;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../preload/tests")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn echo_roundtrip(
    lab: &nanowire_lab::testbed::ScopedLab,
    tag: &str,
    server: &[&str],
    port: u16,
    count: u32,
    ready: Option<&str>,
    engine: &[&str],
) {
    let mut cmd = run_in(lab, Host::B, engine, server);
    cmd.env("NANOWIRE_LOG", "info");
    let mut srv = spawn(&format!("{tag}-srv"), cmd);
    match ready {
        Some(r) => srv.wait_for(r, Duration::from_secs(20)),
        None => std::thread::sleep(Duration::from_millis(500)),
    }
    let check = fixture("udp_check.py");
    let addr = ADDR_B.to_string();
    let ports = port.to_string();
    let counts = count.to_string();
    let mut cli = spawn(
        &format!("{tag}-cli"),
        run_in(
            lab,
            Host::A,
            engine,
            &["python3", &check, &addr, &ports, &counts, "--quit"],
        ),
    );
    let out = cli.success(T);
    assert!(
        out.contains(&format!("ok {}", count + 160)),
        "{tag}: {out}\nserver:\n{}",
        srv.both()
    );
    let want = if engine.is_empty() {
        format!("{addr}:{port}: xdp (interface")
    } else {
        "udp: spin (kernel socket".to_string()
    };
    assert!(
        srv.stderr().contains(&want),
        "{tag}: {want:?} not in the server's log:\n{}",
        srv.stderr()
    );
}

#[test]
#[ignore = "needs root"]
fn python_socket_and_asyncio_echo_servers() {
    let lab = lab("p");
    let echo = fixture("udp_echo.py");
    let addr = ADDR_B.to_string();
    let engines: [&[&str]; 2] = [&[], &["--engine", "spin"]];
    for (e, engine) in engines.into_iter().enumerate() {
        for (i, mode) in ["blocking", "timeout", "asyncio"].into_iter().enumerate() {
            let port = 12000 + 10 * e as u16 + i as u16;
            let ports = port.to_string();
            echo_roundtrip(
                &lab,
                &format!("{mode}{e}"),
                &["python3", &echo, mode, &addr, &ports],
                port,
                500,
                Some("ready"),
                engine,
            );
        }
    }
}

#[test]
#[ignore = "needs root"]
fn socat_udp_echo_forks_and_execs_per_datagram() {
    let lab = lab("c");
    let listen = format!("UDP4-RECVFROM:12100,bind={ADDR_B},fork");
    echo_roundtrip(
        &lab,
        "socat",
        &["socat", "-T", "30", &listen, "EXEC:cat"],
        12100,
        40,
        None,
        // socat forks a child per datagram that reads the datagram its
        // parent peeked at: a forked child only has the kernel socket (the
        // engine's rings stay with the parent), so this needs the spin engine.
        &["--engine", "spin"],
    );
}

fn iperf(lab: &nanowire_lab::testbed::ScopedLab, tag: &str, reverse: bool) {
    let addr = ADDR_B.to_string();
    let mut srv = spawn(
        &format!("{tag}-srv"),
        run_in(
            lab,
            Host::B,
            &[],
            &[
                "iperf3",
                "-s",
                "-1",
                "--forceflush",
                "-B",
                &addr,
                "-p",
                "5201",
            ],
        ),
    );
    srv.wait_for("Server listening", Duration::from_secs(20));
    let mut args = vec![
        "iperf3", "-u", "-c", &addr, "-p", "5201", "-b", "20M", "-l", "1000", "-t", "2", "--json",
    ];
    if reverse {
        args.push("-R");
    }
    let mut cli = spawn(&format!("{tag}-cli"), run_in(lab, Host::A, &[], &args));
    let st = cli.wait(T);
    let out = cli.stdout();
    assert!(st.success(), "{tag}: {out}\n{}", cli.stderr());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let sum = &v["end"]["sum"];
    let packets = sum["packets"].as_u64().unwrap_or(0);
    let lost = sum["lost_packets"].as_u64().unwrap_or(u64::MAX);
    assert!(packets > 1000, "{tag}: {sum}");
    assert_eq!(lost, 0, "{tag}: {sum}");
    srv.wait(Duration::from_secs(20));
}

#[test]
#[ignore = "needs root"]
fn iperf3_udp_client_and_server_both_directions() {
    let lab = lab("i");
    iperf(&lab, "iperf", false);
    iperf(&lab, "iperf-r", true);
}

#[test]
#[ignore = "needs root"]
fn unprivileged_user_runs_sockperf_with_spin_and_is_told_why_not_xdp() {
    let lab = lab("u");
    ensure_preload();
    let addr = ADDR_B.to_string();
    let as_nobody = |h: Host, args: &[&str]| {
        let mut argv = vec![
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "env",
            "NANOWIRE_LOG=info",
            nanowire(),
            "run",
        ];
        argv.extend_from_slice(args);
        lab.command(h, &argv)
    };
    let mut srv = spawn(
        "nobody-sr",
        as_nobody(
            Host::B,
            &[
                "--engine", "spin", "--", "sockperf", "sr", "-i", &addr, "-p", "11400",
            ],
        ),
    );
    srv.wait_for("to block on socket", Duration::from_secs(20));
    // The default engine is xdp: as nobody it must fall back and say why.
    let mut cli = spawn(
        "nobody-pp",
        as_nobody(
            Host::A,
            &[
                "--", "sockperf", "pp", "-i", &addr, "-p", "11400", "-t", "1", "-m", "64",
            ],
        ),
    );
    let out = cli.success(T);
    assert!(out.contains("# dropped messages = 0"), "{out}");
    assert!(out.contains("xdp engine not usable: no privilege"), "{out}");
    assert!(
        out.contains("udp: spin (kernel socket") && out.contains("xdp not used: no privilege"),
        "{out}"
    );
    let err = srv.stderr();
    assert!(
        err.contains("xdp not used: engine spin requested; also no privilege"),
        "{err}"
    );
}
