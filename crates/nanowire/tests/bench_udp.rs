//! `nanowire bench` over UDP in a lab: our client against a real
//! `sockperf sr`, real `sockperf pp/ul/tp` against our server, both engines.

mod bench_common;
use bench_common::*;
use nanowire_lab::Host;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn check_pp(v: &serde_json::Value, engine: &str, lab_iface: &str) {
    assert_eq!(v["mode"], "pp");
    assert_eq!(v["engine"], engine);
    assert_eq!(v["protocol"], "udp");
    assert_eq!(v["msg_size"], 64);
    let received = v["received"].as_u64().unwrap();
    assert!(received > 0, "{v}");
    assert_eq!(v["sent"].as_u64().unwrap(), received, "{v}");
    // One message in flight at a time on an idle veth: nothing is lost.
    assert_eq!(v["dropped"], 0, "{v}");
    assert_eq!(v["duplicated"], 0);
    let l = &v["latency_us"];
    for k in [
        "min", "p25", "p50", "p75", "p90", "p99", "p99.9", "p99.99", "p99.999", "max", "avg",
        "stddev",
    ] {
        assert!(l[k].is_number(), "latency_us.{k} missing: {v}");
    }
    let (min, p50, max) = (
        l["min"].as_f64().unwrap(),
        l["p50"].as_f64().unwrap(),
        l["max"].as_f64().unwrap(),
    );
    assert!(min > 0.0 && min <= p50 && p50 <= max, "{l}");
    assert_eq!(l["samples"].as_u64().unwrap(), received);
    assert!(v["rate_msg_s"].as_f64().unwrap() > 0.0);
    assert!(v["duration_s"].as_f64().unwrap() > 0.0);
    let env = &v["env"];
    assert_eq!(env["driver"], "veth", "{env}");
    assert_eq!(env["iface"], lab_iface, "{env}");
    assert!(env["kernel"].as_str().is_some_and(|k| !k.is_empty()));
    assert!(env["nproc"].as_u64().unwrap() >= 1);
}

#[test]
#[ignore = "needs root"]
fn udp_client_against_sockperf_sr() {
    let lab = lab("u");
    let _sr = sockperf_sr(&lab, false, PORT);
    let ia = lab.iface(Host::A);
    for engine in ["kernel", "spin"] {
        let o = bench(
            &lab,
            &format!("pp -i 198.18.0.2 -p 11111 -m 64 -t 1 --engine {engine} --cpu 0 --json"),
        );
        let v = json(&o);
        check_pp(&v, engine, &ia);
        assert_eq!(v["cpu"], 0);
        assert!(v["cpu_util"].as_f64().unwrap() > 0.0);
    }

    // Under load: every 10th message answered.
    let v = json(&bench(
        &lab,
        "ul -i 198.18.0.2 -m 64 -t 1 --mps 2000 --reply-every 10 --json",
    ));
    assert_eq!(v["mode"], "ul");
    let (sent, received) = (v["sent"].as_u64().unwrap(), v["received"].as_u64().unwrap());
    assert!(sent > 0 && received > 0, "{v}");
    assert!(received <= sent.div_ceil(10) + 1, "{v}");
    assert!(v["latency_us"]["p50"].as_f64().unwrap() > 0.0);
    assert_eq!(v["reply_every"], 10);

    // Throughput: paced, no replies asked.
    let v = json(&bench(
        &lab,
        "tp -i 198.18.0.2 -m 256 -t 1 --mps 5000 --json",
    ));
    assert_eq!(v["mode"], "tp");
    assert!(v["sent"].as_u64().unwrap() > 0);
    assert!(v["latency_us"].is_null());
    assert!(v["rate_msg_s"].as_f64().unwrap() > 0.0);

    // Human output reads like sockperf's, and --full-log has one row per sample.
    let dir = nanowire_lab::tmp::private_dir("tb_fulllog").unwrap();
    let log = dir.join("pp.csv");
    let out = success(&bench(
        &lab,
        &format!("pp -i 198.18.0.2 -m 64 -t 1 --full-log {}", log.display()),
    ));
    assert!(sockperf_p50(&out).is_some_and(|p| p > 0.0), "{out}");
    assert_eq!(sockperf_dropped(&out), Some(0), "{out}");
    let received: u64 = out
        .lines()
        .find(|l| l.contains("[Valid Duration]"))
        .and_then(|l| nanowire_testkit::word_after(l, "ReceivedMessages="))
        .expect("valid-duration line");
    let csv = std::fs::read_to_string(&log).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("seq,tx_ns,rx_ns,rtt_ns"));
    let rows: Vec<Vec<u64>> = lines
        .map(|l| l.split(',').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len() as u64, received);
    assert!(rows.iter().all(|r| r.len() == 4 && r[2] - r[1] == r[3]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root"]
fn sockperf_clients_against_udp_server() {
    let lab = lab("s");
    for engine in ["kernel", "spin"] {
        let srv = bench_server(&lab, &["-p", "11111", "--engine", engine, "--json"]);
        // The server tells clients apart by address, and the kernel picks a
        // UDP client's ephemeral port at random, a finished client's
        // included (1 in ~28,000 a pair, 6 pairs a round): the sockperf
        // clients bind their own distinct ports, below the ephemeral range
        // that our client's port comes from.
        let (ok, all) = sockperf_in_a(
            &lab,
            "sockperf pp -i 198.18.0.2 -p 11111 -m 64 -t 1 --client_port 21101",
        );
        assert!(ok, "{all}");
        assert_eq!(sockperf_dropped(&all), Some(0), "{all}");
        sockperf_in_a(
            &lab,
            "sockperf ul -i 198.18.0.2 -p 11111 -m 64 -t 1 --mps 2000 --client_port 21102",
        );

        let o = in_a(
            &lab,
            "sockperf tp -i 198.18.0.2 -p 11111 -m 64 -t 1 --mps 5000 --client_port 21103",
        );
        assert!(o.status.success());

        // Our own client against our own server, the other engine.
        let other = if engine == "kernel" { "spin" } else { "kernel" };
        let v = json(&bench(
            &lab,
            &format!("pp -i 198.18.0.2 -m 100 -t 1 --engine {other} --json"),
        ));
        assert_eq!(v["dropped"], 0, "{v}");
        let our_sent = v["total_sent"].as_u64().unwrap();

        let s = json(&srv.signal_and_wait("INT", T));
        assert_eq!(s["mode"], "server");
        assert_eq!(s["engine"], engine);
        assert_eq!(s["malformed"], 0, "{s}");
        let clients = s["clients"].as_array().unwrap();
        assert_eq!(clients.len(), 4, "{s}");
        // pp, ul: everything answered; tp: counted, nothing asked.
        assert!(clients[0]["received"].as_u64().unwrap() > 0);
        assert_eq!(clients[0]["replied"], clients[0]["received"]);
        assert!(clients[1]["replied"].as_u64().unwrap() > 0);
        assert!(clients[2]["received"].as_u64().unwrap() > 0);
        assert_eq!(clients[2]["replied"], 0);
        // Our client: every timed message plus the probe, in order.
        assert_eq!(
            clients[3]["received"].as_u64().unwrap(),
            our_sent + 1,
            "{s}"
        );
        assert_eq!(clients[3]["dropped"], 0);
        assert_eq!(clients[3]["out_of_order"], 0);
        assert!(s["warmup"].as_u64().unwrap() >= 4);
    }
}
