//! The impaired lab (`lab up --impair`, `lab impair`): a third namespace
//! forwards every frame between the hosts with nftables, hosts keep their
//! names, addresses and see each other's MACs, and kernel as well as xdp
//! traffic crosses it. Lab prefix `ti`.

mod bench_server;

use bench_server::xdp_server;
use nanowire_lab::testbed::ScopedLab;
use nanowire_lab::testbed::{Direction, Host, Impairment, LabOptions};
use nanowire_testkit::{LabDown, ok};
use std::process::{Command, Output};

const NW: &str = env!("CARGO_BIN_EXE_nanowire");

fn nanowire(args: &[&str]) -> Output {
    Command::new(NW).args(args).output().expect("run nanowire")
}

/// `nanowire lab exec --name N HOST -- CMD...`.
fn lab_exec(n: &str, host: &str, cmd: &[&str]) -> Output {
    let mut argv = vec!["lab", "exec", "--name", n, host, "--"];
    argv.extend_from_slice(cmd);
    nanowire(&argv)
}

fn ping(n: &str, count: &str, interval: &str) -> Output {
    lab_exec(
        n,
        "a",
        &[
            "ping",
            "-c",
            count,
            "-i",
            interval,
            "-W",
            "1",
            "-q",
            "198.18.0.2",
        ],
    )
}

fn status(n: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&nanowire(&["lab", "status", "--name", n, "--json"]))).unwrap()
}

#[test]
#[ignore = "needs root"]
fn impaired_wire_forwards_drops_duplicates_and_clears() {
    nanowire_testkit::require_root();
    nanowire_testkit::require(&["nft"]);
    let n = nanowire_testkit::lab_name("tiw");
    let _g = LabDown(n.clone());
    ok(&nanowire(&["lab", "up", "--impair", "--name", &n]));
    // Idempotent.
    ok(&nanowire(&["lab", "up", "--impair", "--name", &n]));
    let st = status(&n);
    assert_eq!(st["complete"], true, "{st}");
    assert_eq!(st["a"]["iface"], format!("{n}-a0"));
    assert_eq!(st["b"]["addr"], "198.18.0.2");
    assert_eq!(st["wire"]["forwarding"], true, "{st}");

    // Clear wire: every ping answered, and a sees b's own MAC.
    let o = ping(&n, "20", "0.01");
    assert!(ok(&o).contains(" 0% packet loss"), "{o:?}");
    let neigh = ok(&lab_exec(&n, "a", &["ip", "neigh", "show", "198.18.0.2"]));
    let b_mac = st["b"]["mac"].as_str().unwrap();
    assert!(neigh.contains(b_mac), "a sees b at {b_mac}: {neigh}");

    // All frames a->b lost: nothing answered, every frame counted as dropped.
    ok(&nanowire(&[
        "lab", "impair", "--name", &n, "--loss", "100", "--dir", "ab",
    ]));
    let o = ping(&n, "5", "0.01");
    assert!(!o.status.success(), "pings through a dead wire fail");
    let st = status(&n);
    let ab = &st["wire"]["ab"];
    assert_eq!(ab["impairment"]["loss_pct"], 100.0, "{st}");
    assert!(ab["frames_in"].as_u64().unwrap() >= 5, "{st}");
    assert_eq!(ab["frames_in"], ab["dropped_loss"], "{st}");
    assert_eq!(st["wire"]["ba"]["impairment"]["loss_pct"], 0.0, "{st}");

    // Duplicate every frame a->b: ping reports duplicates.
    ok(&nanowire(&[
        "lab", "impair", "--name", &n, "--dup", "100", "--dir", "ab",
    ]));
    let o = ping(&n, "3", "0.05");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.contains("duplicates"), "{text}");

    // The text status names the settings.
    let t = ok(&nanowire(&["lab", "status", "--name", &n]));
    assert!(t.contains("a->b: dup 100%"), "{t}");

    // --clear: nothing lost again.
    ok(&nanowire(&["lab", "impair", "--name", &n, "--clear"]));
    let o = ping(&n, "20", "0.01");
    assert!(ok(&o).contains(" 0% packet loss"), "{o:?}");

    // `up` without --impair turns it back into a plain pair; down removes all three namespaces.
    ok(&nanowire(&["lab", "up", "--name", &n]));
    assert!(status(&n).get("wire").is_none());
    ok(&ping(&n, "2", "0.01"));
    let o = nanowire(&["lab", "impair", "--name", &n, "--loss", "1"]);
    assert!(!o.status.success(), "impair on a plain lab is an error");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--impair"),
        "{o:?}"
    );
    ok(&nanowire(&["lab", "up", "--impair", "--name", &n]));
    ok(&nanowire(&["lab", "down", "--name", &n]));
    let l = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(!l.contains(&format!("{n}-")), "namespaces left: {l}");
}

#[test]
fn bad_impairments_are_refused_with_one_line() {
    let imp = Impairment {
        loss_pct: 101.0,
        ..Impairment::default()
    };
    assert!(imp.validate().unwrap_err().contains("--loss"));
    let imp = Impairment {
        rate_mbit: Some(0.0),
        ..Impairment::default()
    };
    assert!(imp.validate().unwrap_err().contains("--rate"));
    assert!(<Direction as clap::ValueEnum>::from_str("sideways", false).is_err());
}

/// xdp on both ends through the wire (generic XDP on the hosts' veths).
#[test]
#[ignore = "needs root"]
fn xdp_ping_pong_crosses_the_impaired_wire() {
    nanowire_testkit::require(&["nft"]);
    let lab = nanowire_testkit::lab_impaired("tix", LabOptions::default());
    let server = xdp_server(&lab, 11260, &[], &[]);
    let r = bench_server::pp(
        &lab,
        11260,
        &["--engine", "xdp", "--no-fallback", "-t", "1"],
    )
    .expect("pp JSON");
    // The server's engine itself received the datagrams (not its kernel
    // twin: with nft `fwd` in the wire, generic XDP skipped every frame and
    // UDP "worked" through the twin at kernel latency).
    let stats = engine_stats(&lab);
    drop(server);
    assert!(counter(&stats, "rx_packets").unwrap_or(0) > 0, "{stats}");
    assert_eq!(r["engine"], "xdp", "{r}");
    assert!(r["received"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["dropped"], 0, "{r}");
    // The frames really crossed the wire.
    let w = lab.wire_status().expect("wire");
    assert!(w.ab.frames_in >= r["received"].as_u64().unwrap(), "{w:?}");
    // And the wire's impair API works on a ScopedLab.
    let w = lab
        .impair(
            Direction::Ba,
            Impairment {
                loss_pct: 0.5,
                ..Impairment::default()
            },
        )
        .unwrap();
    assert_eq!(w.ba.impairment.loss_pct, 0.5);
    assert_eq!(w.ab.impairment.loss_pct, 0.0);
}

/// The engine on host b's interface, as `nanowire stats --json` lists it
/// (the listing covers every engine of the machine: other tests' too).
fn engine_stats(lab: &ScopedLab) -> serde_json::Value {
    let ifb = lab.iface(Host::B);
    let mine = nanowire_testkit::engines_on(NW, &ifb);
    assert_eq!(mine.len(), 1, "one engine on {ifb}: {mine:?}");
    mine[0].clone()
}

/// Counter `name` of an engine `nanowire stats --json` listed.
fn counter(engine: &serde_json::Value, name: &str) -> Option<u64> {
    engine["counters"][name].as_u64()
}

/// Issue 11 bug: an xdp TCP connect across the impaired wire timed out. The
/// wire forwarded with nft `fwd`, which marks the skb as redirected; generic
/// XDP on the receiving veth skips redirected skbs, so the server's engine
/// never saw the SYN and its kernel port reservation answered instead.
#[test]
#[ignore = "needs root"]
fn xdp_tcp_crosses_the_impaired_wire() {
    nanowire_testkit::require(&["nft"]);
    let lab = nanowire_testkit::lab_impaired("tit", LabOptions::default());
    let server = xdp_server(&lab, 11261, &["--tcp"], &[]);
    let pp = |engine: &str| {
        bench_server::pp(
            &lab,
            11261,
            &["--tcp", "--engine", engine, "--no-fallback", "-t", "1"],
        )
    };
    // Both a kernel client and an xdp client reach the xdp server.
    let outs = [pp("spin"), pp("xdp")];
    let stats = engine_stats(&lab);
    drop(server);
    for (r, engine) in outs.iter().zip(["spin", "xdp"]) {
        let r = r.as_ref().unwrap_or_else(|| panic!("{engine} pp failed"));
        assert_eq!(r["engine"], engine, "{r}");
        assert!(r["received"].as_u64().unwrap() > 0, "{r}");
    }
    assert!(counter(&stats, "rx_packets").unwrap_or(0) > 0, "{stats}");
    // The engine's TCP counters are on the stats page.
    assert!(counter(&stats, "tcp_segs_in").unwrap_or(0) > 0, "{stats}");
    assert!(
        counter(&stats, "tcp_passive_opens").unwrap_or(0) >= 2,
        "{stats}"
    );
    assert_eq!(counter(&stats, "tcp_rst_sent"), Some(0), "{stats}");
}
