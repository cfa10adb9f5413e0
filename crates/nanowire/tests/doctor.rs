//! `nanowire doctor` on the lab's interfaces (issue 25): the default lab
//! (veth, TSO/GSO on, nothing attached), the same lab with TSO/GSO off on
//! one end (an added configuration), a foreign XDP program attached in
//! generic and then in native mode; JSON that parses with the expected
//! fields; a missing interface is one line and a non-zero exit.

mod run_support;
use nanowire_lab::testbed::Host;
use nanowire_testkit::ip_ns;
use run_support::*;
use serde_json::Value;
use std::process::Command;

fn doctor(lab: &nanowire_lab::testbed::ScopedLab, h: Host, args: &[&str]) -> (i32, String, String) {
    let mut argv = vec![nanowire(), "doctor"];
    argv.extend_from_slice(args);
    let out = lab.command(h, &argv).output().expect("run nanowire doctor");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(lab: &nanowire_lab::testbed::ScopedLab, h: Host, iface: &str) -> Value {
    let (code, out, err) = doctor(lab, h, &[iface, "--json"]);
    assert_eq!(code, 0, "doctor --json {iface}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("doctor JSON: {e}\n{out}"))
}

/// The findings of interface 0 for one check.
fn findings<'a>(v: &'a Value, check: &str) -> Vec<&'a Value> {
    v["interfaces"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check)
        .collect()
}

#[test]
#[ignore = "needs root"]
fn doctor_on_the_lab_interfaces() {
    let lab = lab("doc");
    let ifa = lab.iface(Host::A);

    // The default lab: veth, native XDP offered without zero-copy, TSO/GSO on.
    let v = json(&lab, Host::A, &ifa);
    assert_eq!(v["schema"], "nanowire-doctor/1");
    let i = &v["interfaces"][0];
    assert_eq!(i["name"], ifa.as_str());
    assert_eq!(i["driver"], "veth");
    assert_eq!(i["rx_queues"], 1);
    assert_eq!(i["mtu"], 1500);
    assert_eq!(i["frame_size"], 2048);
    assert_eq!(i["offloads"]["tcp-segmentation-offload"], "on");
    let feats: Vec<&str> = i["xdp_features"]
        .as_array()
        .expect("this kernel reports xdp-features")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        feats.contains(&"basic") && feats.contains(&"redirect"),
        "{feats:?}"
    );
    assert!(
        !feats.contains(&"xsk-zerocopy"),
        "veth has no zero-copy: {feats:?}"
    );
    assert_eq!(i["xdp_attached"].as_array().unwrap().len(), 0);
    for check in [
        "driver",
        "queues",
        "irq",
        "xdp",
        "zero-copy",
        "multi-buffer",
        "mtu",
        "offloads",
        "xdp-attached",
    ] {
        assert!(!findings(&v, check).is_empty(), "no {check} finding: {i}");
    }
    for check in [
        "privilege",
        "cpu-isolation",
        "governor",
        "c-states",
        "busy-poll",
        "hugepages",
    ] {
        assert!(
            v["host"]["findings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["check"] == check),
            "no host {check} finding"
        );
    }
    assert_eq!(v["host"]["privileged"], true);
    // Every finding has a level, and every warning says what to do.
    for f in i["findings"].as_array().unwrap() {
        assert!(["ok", "info", "warn", "bad"].contains(&f["level"].as_str().unwrap()));
        if f["level"] == "warn" || f["level"] == "bad" {
            assert!(
                f["fix"].is_string(),
                "a {} finding without a fix: {f}",
                f["level"]
            );
        }
    }
    let tso_warn = |v: &Value| {
        findings(v, "offloads")
            .iter()
            .any(|f| f["level"] == "info" && f["what"].as_str().unwrap().contains("TSO/GSO on"))
    };
    assert!(
        tso_warn(&v),
        "TSO/GSO on veth: the doctor says super-frames arrive as multi-buffer chains"
    );
    let (code, text, _) = doctor(&lab, Host::A, &[&ifa]);
    assert_eq!(code, 0);
    assert!(
        text.contains(&format!("interface {ifa} (driver veth")),
        "{text}"
    );

    // Added configuration: TSO/GSO off on host b's end (the sender of super-frames).
    let ifb = lab.iface(Host::B);
    let st = lab
        .command(
            Host::B,
            &["ethtool", "-K", &ifb, "tso", "off", "gso", "off"],
        )
        .status()
        .unwrap();
    assert!(st.success());
    let vb = json(&lab, Host::B, &ifb);
    assert_eq!(
        vb["interfaces"][0]["offloads"]["tcp-segmentation-offload"],
        "off"
    );
    assert!(!tso_warn(&vb), "TSO/GSO off: no warning");

    // A foreign XDP program, generic mode, then native.
    let dir = scratch("doctor");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("pass.c");
    std::fs::write(
        &src,
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"xdp\") int xdp_pass_all(struct xdp_md *c) { return XDP_PASS; }\n\
         char _license[] SEC(\"license\") = \"GPL\";\n",
    )
    .unwrap();
    let obj = dir.join("pass.o");
    let st = Command::new("clang")
        .args(words(
            "-O2 -g -target bpf -I/usr/include/x86_64-linux-gnu -c",
        ))
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .expect("clang");
    assert!(st.success(), "clang -target bpf");
    let o = obj.to_str().unwrap();
    for (mode, off, name) in [
        ("xdpgeneric", "xdpgeneric", "generic"),
        ("xdpdrv", "xdpdrv", "driver"),
    ] {
        let set = ["link", "set", "dev", &ifa, mode, "obj", o, "sec", "xdp"];
        ip_ns(&lab.netns(Host::A), &set);
        let v = json(&lab, Host::A, &ifa);
        ip_ns(
            &lab.netns(Host::A),
            &["link", "set", "dev", &ifa, off, "off"],
        );
        let att = v["interfaces"][0]["xdp_attached"].as_array().unwrap();
        assert_eq!(att.len(), 1, "{att:?}");
        assert_eq!(att[0]["mode"], name);
        assert_eq!(att[0]["name"], "xdp_pass_all");
        let f = findings(&v, "xdp-attached");
        assert!(
            f.iter().any(|f| f["level"] == "bad"
                && f["what"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("{name} mode"))
                && f["fix"].as_str().unwrap().contains(&format!("{off} off"))),
            "{f:?}"
        );
        if name == "generic" {
            assert!(tso_warn(&v), "generic attach with TSO on is flagged");
        }
    }
}

#[test]
fn doctor_on_a_missing_interface_is_one_line_and_fails() {
    let out = nanowire_out(&["doctor", "nw-missing-if9"]);
    assert!(out.stdout.is_empty());
    let err = nanowire_testkit::one_line_failure("doctor", &out, "no network interface");
    assert!(err.contains("nw-missing-if9"), "{err}");
}
