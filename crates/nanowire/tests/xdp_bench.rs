//! `nanowire bench --engine xdp` end to end in a lab (prefix `tx`): xdp on
//! both ends, a real sockperf client against the xdp server, and the
//! fallback of a second xdp process on the same interface.

mod bench_server;

use bench_server::BenchServer;
use nanowire_lab::testbed::{Host, ScopedLab};
use std::process::Stdio;

fn lab(tag: char) -> ScopedLab {
    nanowire_testkit::lab(&format!("txb{tag}"))
}

/// `nanowire bench server --engine xdp` on `port` in host b (it may fall
/// back: no `--no-fallback`).
fn server(lab: &ScopedLab, port: u16) -> BenchServer {
    BenchServer::spawn(bench_server::server_cmd(lab, port, &["--engine", "xdp"]))
}

/// [`server`] on `port` once it is on the xdp engine (not fallen back).
fn xdp_server(lab: &ScopedLab, port: u16) -> BenchServer {
    let s = server(lab, port);
    s.expect_xdp();
    s
}

/// One second of `bench pp` on `engine`; it must succeed.
fn pp(lab: &ScopedLab, port: u16, engine: &str) -> serde_json::Value {
    bench_server::pp(lab, port, &["--engine", engine, "-t", "1"]).expect("pp JSON")
}

#[test]
#[ignore = "needs root"]
fn bench_pp_with_xdp_on_both_ends() {
    let lab = lab('P');
    let _s = xdp_server(&lab, 11200);
    let r = pp(&lab, 11200, "xdp");
    assert_eq!(r["engine"], "xdp", "{r}");
    assert!(r["received"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["dropped"], 0, "{r}");
}

#[test]
#[ignore = "needs root"]
fn real_sockperf_client_against_the_xdp_server() {
    nanowire_testkit::require(&["sockperf"]);
    let lab = lab('R');
    let _s = xdp_server(&lab, 11201);
    let out = lab
        .command(
            Host::A,
            &[
                "sockperf",
                "pp",
                "-i",
                "198.18.0.2",
                "-p",
                "11201",
                "-m",
                "64",
                "-t",
                "1",
            ],
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let valid = text
        .lines()
        .find(|l| l.contains("[Valid Duration]"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(!valid.contains("ReceivedMessages=0"), "{valid}");
    assert!(text.contains("# dropped messages = 0"), "{text}");
}

#[test]
#[ignore = "needs root"]
fn second_xdp_process_on_the_interface_falls_back_to_spin() {
    let lab = lab('S');
    let _first = xdp_server(&lab, 11202);
    let second = server(&lab, 11203);
    let (listen, before) = second.listening().expect("listen line");
    assert!(listen.contains("(engine spin)"), "{listen}");
    let why: Vec<_> = before
        .iter()
        .filter(|l| l.contains("falling back"))
        .collect();
    assert_eq!(why.len(), 1, "exactly one line saying why: {before:?}");
    assert!(
        why[0].contains("falling back to spin") && why[0].contains("another XDP program"),
        "{why:?}"
    );
    // Both serve: the first through XDP, the second through the kernel
    // (its port is not claimed, so the first's program passes it).
    for port in [11202, 11203] {
        let r = pp(&lab, port, "spin");
        assert!(r["received"].as_u64().unwrap() > 0, "{port}: {r}");
        assert_eq!(r["dropped"], 0, "{port}: {r}");
    }
}
