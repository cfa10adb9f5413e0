//! Bad arguments give one line "nanowire: error: ..." and a non-zero exit,
//! never a panic or a hang.

mod bench_common;
use bench_common::*;
use nanowire_lab::Host;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn nw(lab: &nanowire_lab::testbed::ScopedLab, args: &[&str]) -> std::process::Output {
    let mut argv = vec![NW, "bench"];
    argv.extend_from_slice(args);
    run(lab, Host::A, &argv, T)
}

#[test]
#[ignore = "needs root"]
fn bad_arguments_fail_cleanly() {
    let lab = lab("e");
    let srv = bench_server(&lab, &["-p", "11111"]);
    let srv_tcp = bench_server(&lab, &["--tcp", "-p", "11111"]);

    for (size, tcp) in [("0", false), ("70000", false), ("13", false), ("0", true)] {
        let mut a = vec!["pp", "-i", B_ADDR, "-m", size, "-t", "1"];
        if tcp {
            a.push("--tcp");
        }
        assert_clean_error(&nw(&lab, &a), &format!("message size {size}"));
    }
    // TCP takes messages above the UDP limit.
    let v = json(&nw(
        &lab,
        &[
            "pp", "--tcp", "-i", B_ADDR, "-m", "70000", "-t", "0.5", "--json",
        ],
    ));
    assert!(v["received"].as_u64().unwrap() > 0);

    assert_clean_error(
        &nw(&lab, &["pp", "-i", "no-such-host.invalid", "-t", "1"]),
        "unknown host",
    );
    // Nothing listens on port 9: the ICMP port unreachable ends the run.
    for engine in ["kernel", "spin"] {
        assert_clean_error(
            &nw(
                &lab,
                &["pp", "-i", B_ADDR, "-p", "9", "-t", "1", "--engine", engine],
            ),
            "no reply from 198.18.0.2:9",
        );
    }
    assert_clean_error(
        &nw(&lab, &["tp", "-i", B_ADDR, "-p", "9", "-t", "1"]),
        "no reply from 198.18.0.2:9",
    );
    assert_clean_error(
        &nw(&lab, &["pp", "--tcp", "-i", B_ADDR, "-p", "9", "-t", "1"]),
        "connection refused",
    );
    // Port in use, UDP and TCP.
    let o = run(
        &lab,
        Host::B,
        &[NW, "bench", "server", "-i", B_ADDR, "-p", "11111"],
        T,
    );
    assert_clean_error(&o, "address already in use");
    let o = run(
        &lab,
        Host::B,
        &[NW, "bench", "server", "--tcp", "-i", B_ADDR, "-p", "11111"],
        T,
    );
    assert_clean_error(&o, "address already in use");
    // An address this host does not have.
    let o = run(
        &lab,
        Host::B,
        &[NW, "bench", "server", "-i", "198.18.0.77", "-p", "11111"],
        T,
    );
    assert_clean_error(&o, "198.18.0.77");
    assert_clean_error(
        &nw(&lab, &["pp", "-i", B_ADDR, "-t", "1", "--cpu", "4096"]),
        "cannot pin to CPU 4096",
    );
    assert_clean_error(
        &nw(&lab, &["ul", "-i", B_ADDR, "-t", "1", "--reply-every", "0"]),
        "reply-every",
    );
    assert_clean_error(&nw(&lab, &["pp", "-i", B_ADDR, "-t", "0"]), "test time");
    // The servers were not disturbed by any of this.
    let v = json(&nw(&lab, &["pp", "-i", B_ADDR, "-t", "0.5", "--json"]));
    assert!(v["received"].as_u64().unwrap() > 0);
    drop(srv);
    drop(srv_tcp);
}
