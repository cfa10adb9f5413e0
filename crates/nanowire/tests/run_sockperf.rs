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

/// Host `h`'s kernel UDP counters (its namespace's /proc/net/snmp, as
/// `Udp.InDatagrams` ...) and its veth's drops (`link.rx_dropped`,
/// `link.tx_dropped`).
fn kernel_counts(
    lab: &nanowire_lab::testbed::ScopedLab,
    h: Host,
) -> std::collections::BTreeMap<String, u64> {
    let out = |argv: &[&str]| {
        nanowire_testkit::ok(&plain_in(lab, h, argv).output().expect("run in the lab"))
    };
    let snmp = out(&["cat", "/proc/net/snmp"]);
    let udp: Vec<Vec<&str>> = snmp
        .lines()
        .filter(|l| l.starts_with("Udp:"))
        .map(|l| l.split_whitespace().skip(1).collect())
        .collect();
    let mut c: std::collections::BTreeMap<String, u64> = udp[0]
        .iter()
        .zip(&udp[1])
        .map(|(k, v)| (format!("Udp.{k}"), v.parse().unwrap()))
        .collect();
    let ifn = lab.iface(h);
    let link = out(&["ip", "-s", "-j", "link", "show", "dev", &ifn]);
    let v: serde_json::Value = serde_json::from_str(&link).unwrap();
    for dir in ["rx", "tx"] {
        let n = v[0]["stats64"][dir]["dropped"]
            .as_u64()
            .expect("link drops");
        c.insert(format!("link.{dir}_dropped"), n);
    }
    c
}

/// A sockperf `ul` run lost nothing. sockperf counts as "dropped" every
/// reply it asked for (a request sent before the last 50 ms of the run)
/// that it has not read when its timer ends the run: under load (a 13 ms
/// average round trip and a stall near the end: 14 "dropped" at load 17)
/// those are late, not lost. So the kernels' counters decide, from
/// `before` (hosts a, b) to now: over UDP no receive, buffer or checksum
/// error and no veth drop on either host, every request the client sent
/// read by the server, and every reply sockperf calls dropped sent by the
/// server and never read by the client (it came after the client stopped
/// reading; a lost one would show as a drop above). Over TCP a reply
/// cannot be lost without the connection failing (sockperf then fails):
/// "dropped" there is only late. Duplicated and out-of-order messages are
/// none either way, and replies were received.
#[track_caller]
fn assert_ul_lost_nothing(
    lab: &nanowire_lab::testbed::ScopedLab,
    tcp: bool,
    out: &str,
    before: &[std::collections::BTreeMap<String, u64>; 2],
) {
    let count = |what: &str| -> u64 {
        let i = out
            .find(&format!("# {what} messages = "))
            .unwrap_or_else(|| panic!("no {what} count:\n{out}"));
        let rest = &out[i + what.len() + 14..];
        rest.chars()
            .take_while(|c| c.is_ascii_digit())
            .collect::<String>()
            .parse()
            .unwrap()
    };
    assert_eq!(count("duplicated"), 0, "{out}");
    assert_eq!(count("out-of-order"), 0, "{out}");
    assert!(
        sockperf_field(out, "ReceivedMessages").unwrap_or(0) > 0,
        "{out}"
    );
    if tcp {
        return;
    }
    let delta =
        |i: usize, now: &std::collections::BTreeMap<String, u64>, k: &str| now[k] - before[i][k];
    // The server reads what reached it (it may be behind under load).
    let mut now = [Host::A, Host::B].map(|h| kernel_counts(lab, h));
    until(Duration::from_secs(10), || {
        now = [Host::A, Host::B].map(|h| kernel_counts(lab, h));
        delta(1, &now[1], "Udp.InDatagrams") >= delta(0, &now[0], "Udp.OutDatagrams")
    });
    let all = format!("{out}\nkernel counters before {before:?}\nafter {now:?}");
    for (i, host) in ["a", "b"].into_iter().enumerate() {
        for k in [
            "Udp.InErrors",
            "Udp.RcvbufErrors",
            "Udp.SndbufErrors",
            "Udp.InCsumErrors",
            "link.rx_dropped",
            "link.tx_dropped",
        ] {
            assert_eq!(delta(i, &now[i], k), 0, "host {host} {k}\n{all}");
        }
    }
    assert_eq!(
        delta(1, &now[1], "Udp.InDatagrams"),
        delta(0, &now[0], "Udp.OutDatagrams"),
        "requests sent by the client, read by the server\n{all}"
    );
    let unread = delta(1, &now[1], "Udp.OutDatagrams") - delta(0, &now[0], "Udp.InDatagrams");
    assert!(
        count("dropped") <= unread,
        "sockperf's dropped replies were not all sent and left unread ({unread})\n{all}"
    );
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
        let before = [Host::A, Host::B].map(|h| kernel_counts(&lab, h));
        let out = client(
            &lab,
            tag,
            "ul",
            port,
            tcp,
            &["--mps", "1000", "--reply-every", "5"],
        );
        assert_ul_lost_nothing(&lab, tcp, &out, &before);
        let out = client(&lab, tag, "tp", port, tcp, &["--mps", "10000"]);
        assert!(out.contains("Summary: Message Rate is"), "{out}");
        let sent: u64 = nanowire_testkit::word_after(&out, "Total of ")
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

/// What `assert_sockperf_complete` accepts, on sockperf 3.7's own lines
/// (no lab): a run with its statistics window, a run whose window was
/// empty because the machine stalled the pair (the feed-mode test's
/// failures at load 8-13, docs/benchmarks.md "Session 17: flakes"), and
/// not a run with requests left unanswered or a drop in the window.
#[test]
fn sockperf_completeness_is_read_from_the_whole_run_when_the_window_is_empty() {
    let total = |s: u64, r: u64| {
        format!(
            "sockperf: Test end (interrupted by timer)\nsockperf: Test ended\n\
             sockperf: [Total Run] RunTime=1.007 sec; Warm up time=400 msec; \
             SentMessages={s}; ReceivedMessages={r}\n\
             sockperf: ========= Printing statistics for Server No: 0\n"
        )
    };
    let window = |s: u64, r: u64, dropped: u64| {
        format!(
            "sockperf: [Valid Duration] RunTime=0.547 sec; SentMessages={s}; ReceivedMessages={r}\n\
             sockperf: ====> avg-latency=26.839 (std-dev=4.1)\n\
             sockperf: # dropped messages = {dropped}; # duplicated messages = 0; \
             # out-of-order messages = 0\n"
        )
    };
    let empty = "sockperf: No valid observations found. Try tune parameters: \
                 --time/--mps/--reply-every\n";
    let ok = |out: String| std::panic::catch_unwind(|| assert_sockperf_complete(&out)).is_ok();
    assert!(ok(total(29328, 29327) + &window(9670, 9670, 0)));
    assert!(ok(total(4441, 4440) + empty));
    assert!(ok(total(8486, 8486) + empty));
    assert!(!ok(total(4441, 4400) + empty), "unanswered requests");
    assert!(!ok(total(0, 0) + empty), "nothing received");
    assert!(!ok(total(29328, 29327) + &window(9670, 9669, 1)), "a drop");
    assert!(!ok(
        "sockperf: No messages were received from the server.\n".into()
    ));
}
