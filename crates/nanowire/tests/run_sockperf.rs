//! Real, unmodified sockperf under `nanowire run` on both hosts of a lab:
//! ping-pong, under-load and throughput, UDP and TCP, with the select,
//! poll and epoll feed modes. Results must be complete (nothing dropped).

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host};
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn feed_file(name: &str, proto: char, port: u16) -> String {
    let p = scratch(&format!("{name}.feed"));
    std::fs::write(&p, format!("{proto}:{ADDR_B}:{port}\n")).unwrap();
    p.to_string_lossy().into_owned()
}

/// Start `sockperf sr` under `nanowire run` in host B and wait until it
/// listens. `feed`: Some(s|p|e) uses a feed file and that iomux.
fn server(
    lab: &nanowire_lab::testbed::ScopedLab,
    tag: &str,
    port: u16,
    tcp: bool,
    feed: Option<&str>,
    run_args: &[&str],
) -> Kid {
    let ports = port.to_string();
    let addr = ADDR_B.to_string();
    let mut cmd: Vec<String> = vec![];
    match feed {
        Some(m) => {
            let f = feed_file(tag, if tcp { 'T' } else { 'U' }, port);
            cmd.extend(["-f".into(), f, "-F".into(), m.into()]);
        }
        None => {
            cmd.extend(["-i".into(), addr, "-p".into(), ports]);
            if tcp {
                cmd.push("--tcp".into());
            }
        }
    }
    let argv: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
    sockperf_sr_run(lab, &format!("{tag}-sr"), run_args, &argv)
}

fn client(
    lab: &nanowire_lab::testbed::ScopedLab,
    tag: &str,
    mode: &str,
    port: u16,
    tcp: bool,
    extra: &[&str],
) -> String {
    let ports = port.to_string();
    let addr = ADDR_B.to_string();
    let mut argv = vec![
        "sockperf", mode, "-i", &addr, "-p", &ports, "-t", "1", "-m", "64",
    ];
    if tcp {
        argv.push("--tcp");
    }
    argv.extend_from_slice(extra);
    let mut k = spawn(
        &format!("{tag}-{mode}"),
        run_in(lab, Host::A, &["--engine", "spin"], &argv),
    );
    k.success(T)
}

#[test]
#[ignore = "needs root"]
fn sockperf_udp_and_tcp_pp_ul_tp_under_run() {
    let lab = lab("s");
    for (i, tcp) in [false, true].into_iter().enumerate() {
        let port = 11110 + i as u16;
        let tag = if tcp { "tcp" } else { "udp" };
        // A deep receive buffer rides out the hypervisor/neighbour stalls of
        // a shared 2-vCPU machine (the server is what gets starved).
        let _srv = server(
            &lab,
            tag,
            port,
            tcp,
            None,
            &["--engine", "spin", "-o", "rcvbuf=4194304"],
        );
        let out = client(&lab, tag, "pp", port, tcp, &[]);
        assert_sockperf_complete(&out);
        // ul: only every 5th message is answered (--reply-every).
        let out = client(
            &lab,
            tag,
            "ul",
            port,
            tcp,
            &["--mps", "1000", "--reply-every", "5"],
        );
        assert!(
            out.contains(
                "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0"
            ),
            "{out}"
        );
        assert!(
            sockperf_field(&out, "ReceivedMessages").unwrap_or(0) > 0,
            "{out}"
        );
        let out = client(&lab, tag, "tp", port, tcp, &["--mps", "10000"]);
        assert!(out.contains("Summary: Message Rate is"), "{out}");
        let sent: u64 = out
            .split("Total of ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no message count:\n{out}"));
        assert!(sent > 1000, "{out}");
    }
}

#[test]
#[ignore = "needs root"]
fn sockperf_feed_modes_select_poll_epoll_udp_and_tcp() {
    let lab = lab("f");
    let mut port = 11200;
    for tcp in [false, true] {
        for mode in ["s", "p", "e"] {
            port += 1;
            let tag = format!("{}{mode}", if tcp { "tcp" } else { "udp" });
            let srv = server(
                &lab,
                &tag,
                port,
                tcp,
                Some(mode),
                &["--engine", "spin", "-o", "rcvbuf=4194304"],
            );
            let want = match mode {
                "s" => "select()",
                "p" => "poll()",
                _ => "epoll()",
            };
            assert!(srv.both().contains(want), "{tag}: {}", srv.both());
            let out = client(&lab, &tag, "pp", port, tcp, &[]);
            assert_sockperf_complete(&out);
        }
    }
}

#[test]
#[ignore = "needs root"]
fn run_logs_the_engine_of_each_socket() {
    let lab = lab("l");
    let addr = ADDR_B.to_string();
    let srv = sockperf_sr_run(
        &lab,
        "log-sr",
        &["--engine", "spin"],
        &["-i", &addr, "-p", "11300"],
    );
    let err = srv.stderr();
    assert!(err.contains("udp: spin (kernel socket"), "{err}");
    assert!(err.contains("xdp not used: engine spin requested"), "{err}");
}
