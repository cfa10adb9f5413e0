//! `nanowire run` with the default engine (xdp): UDP sockets of unmodified
//! programs go onto AF_XDP in the lab. sockperf in every mode and feed
//! mode, the C semantics program (identical output to a plain run),
//! `nanowire stats` listing the live accelerated sockets.

mod run_support;
use nanowire_lab::testbed::{ADDR_A, ADDR_B, Host, ScopedLab};
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn feed_file(name: &str, port: u16) -> String {
    let p = scratch(&format!("{name}.feed"));
    std::fs::write(&p, format!("U:{ADDR_B}:{port}\n")).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
#[ignore = "needs root"]
fn sockperf_udp_on_xdp_pp_ul_tp_and_stats_lists_the_socket() {
    let lab = lab("x");
    let addr = ADDR_B.to_string();
    let srv = sockperf_sr_run(&lab, "x-sr", &[], &["-i", &addr, "-p", "11500"]);
    assert!(
        srv.stderr()
            .contains(&format!("udp {addr}:11500: xdp (interface")),
        "{}",
        srv.stderr()
    );
    // nanowire stats (run in the same namespace) sees the live socket.
    let st = lab
        .command(Host::B, &[nanowire(), "stats"])
        .output()
        .unwrap();
    let st = String::from_utf8_lossy(&st.stdout);
    assert!(st.contains(&format!("socket {addr}:11500")), "{st}");

    let client = |tag: &str, extra: &[&str]| {
        let mut argv = vec![
            "sockperf", extra[0], "-i", &addr, "-p", "11500", "-t", "1", "-m", "64",
        ];
        argv.extend_from_slice(&extra[1..]);
        let mut c = run_in(&lab, Host::A, &[], &argv);
        c.env("NANOWIRE_LOG", "info");
        let mut k = spawn(tag, c);
        k.success(T)
    };
    let out = client("x-pp", &["pp"]);
    assert_sockperf_complete(&out);
    assert!(
        out.contains(": xdp (interface"),
        "client not on xdp:\n{out}"
    );
    let out = client("x-ul", &["ul", "--mps", "1000", "--reply-every", "5"]);
    assert!(out.contains("# dropped messages = 0;"), "{out}");
    let out = client("x-tp", &["tp", "--mps", "10000"]);
    assert!(out.contains("Summary: Message Rate is"), "{out}");
}

#[test]
#[ignore = "needs root"]
fn sockperf_feed_modes_on_xdp() {
    let lab = lab("y");
    for (i, mode) in ["s", "p", "e"].into_iter().enumerate() {
        let port = 11600 + i as u16;
        let f = feed_file(&format!("y{mode}"), port);
        let _srv = sockperf_sr_run(&lab, &format!("y-sr-{mode}"), &[], &["-f", &f, "-F", mode]);
        // The client uses the same iomux on its side.
        let mut k = spawn(
            &format!("y-pp-{mode}"),
            run_in(
                &lab,
                Host::A,
                &[],
                &[
                    "sockperf", "pp", "-f", &f, "-F", mode, "-t", "1", "-m", "64",
                ],
            ),
        );
        assert_sockperf_complete(&k.success(T));
    }
}

#[test]
#[ignore = "needs root"]
fn c_semantics_on_xdp_sockets_match_a_plain_run() {
    let lab = lab("z");
    let bin = &shim_and_c("shim_semantics_xdp", "../preload/tests/shim_semantics.c");
    let a = ADDR_A.to_string();
    let mut plain = spawn(
        "z-plain",
        lab.command(Host::A, &["env", &format!("SEM_ADDR={a}"), bin, "all"]),
    );
    plain.success(T);
    let want = plain.stdout();
    for profile in ["balanced", "latency"] {
        let got = sem_on_xdp(&lab, bin, profile, "all", &format!("z-xdp-{profile}"));
        assert_same_output(profile, &want, &got, "");
    }
}

/// The C semantics program's `mode` under run (`profile`) in host a, its
/// sockets on xdp: its stdout.
fn sem_on_xdp(lab: &ScopedLab, bin: &str, profile: &str, mode: &str, name: &str) -> String {
    let mut c = run_in(lab, Host::A, &["--profile", profile], &[bin, mode]);
    c.env("SEM_ADDR", ADDR_A.to_string())
        .env("NANOWIRE_LOG", "info");
    let mut k = spawn(name, c);
    k.success(T);
    assert!(k.stderr().contains(": xdp (interface"), "{}", k.stderr());
    k.stdout()
}

/// The close guard of the thread that owns its socket's record
/// (`nanowire_owner::lock`'s outer section): another thread's close
/// wakes its blocked recv with EBADF, waits for it to leave, and the
/// number, reused at once for another engine socket, never hands it that
/// socket's datagram. Shim only (a plain run leaves such a recv asleep), so
/// the output is checked, not compared; both wait profiles.
#[test]
#[ignore = "needs root"]
fn close_of_a_socket_its_owner_thread_waits_on_gives_ebadf() {
    let lab = lab("cwo");
    let bin = &shim_and_c("shim_semantics_cwo", "../preload/tests/shim_semantics.c");
    for profile in ["balanced", "latency"] {
        for i in 0..3 {
            let out = sem_on_xdp(
                &lab,
                bin,
                profile,
                "close-owner",
                &format!("cwo-{profile}-{i}"),
            );
            assert!(
                out.contains("close_owner: -1 EBADF reused=1"),
                "{profile}: {out}"
            );
        }
    }
}

#[test]
#[ignore = "needs root"]
fn multicast_receiver_on_xdp_joins_and_receives() {
    let lab = lab("m");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../preload/tests/mcast.py")
        .to_string_lossy()
        .into_owned();
    let mut cmd = run_in(
        &lab,
        Host::B,
        &[],
        &[
            "python3",
            &script,
            "recv",
            "239.1.2.3",
            "12300",
            "100",
            &ADDR_B.to_string(),
        ],
    );
    cmd.env("NANOWIRE_LOG", "info");
    let mut rx = spawn("m-rx", cmd);
    rx.wait_for("ready", Duration::from_secs(20));
    assert!(
        rx.stderr().contains("udp 0.0.0.0:12300: xdp (interface"),
        "{}",
        rx.stderr()
    );
    // A plain kernel sender on the other host, through its lab interface.
    let a = ADDR_A.to_string();
    let mut tx = spawn(
        "m-tx",
        lab.command(
            Host::A,
            &["python3", &script, "send", "239.1.2.3", "12300", "300", &a],
        ),
    );
    tx.success(T);
    rx.success(T);
    assert!(rx.stdout().contains("got 100"), "{}", rx.both());
}
