//! `nanowire run` as a command: the options table, argument errors, and the
//! C semantics program run plainly and under the shim with identical output
//! (errno parity, MSG_PEEK/TRUNC/DONTWAIT, poll/select/epoll with mixed
//! fds, dup, fork, fork+exec, shutdown and close while a thread waits).
//! Loopback only: no lab needed.

mod run_support;
use run_support::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn list_options_prints_the_table_and_json() {
    let s = nanowire_testkit::ok(&nanowire_out(&["run", "--list-options"]));
    for needle in words("NANOWIRE_ENGINE NANOWIRE_SPIN_US latency balanced throughput forever") {
        assert!(s.contains(needle), "missing {needle}:\n{s}");
    }
    let out = nanowire_out(&["run", "--list-options", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["env"] == "NANOWIRE_SPIN_US" && r["profiles"]["latency"] == "forever")
    );
}

#[test]
fn bad_arguments_give_one_line_errors() {
    ensure_preload();
    let cases: &[(&[&str], &str)] = &[
        (&["run"], "nothing to run"),
        (
            &["run", "--profile", "fast", "--", "true"],
            "unknown profile",
        ),
        (&["run", "--engine", "dpdk", "--", "true"], "unknown engine"),
        (
            &["run", "-o", "spin_us=abc", "--", "true"],
            "NANOWIRE_SPIN_US",
        ),
        (&["run", "-o", "nosuch=1", "--", "true"], "unknown option"),
        (&["run", "--", "/nonexistent/program"], "cannot run"),
    ];
    for (args, needle) in cases {
        let out = nanowire_out(args);
        nanowire_testkit::one_line_failure(&format!("{args:?}"), &out, needle);
    }
    // A bad variable in the environment is refused the same way.
    let out = Command::new(nanowire())
        .args(["run", "--", "true"])
        .env("NANOWIRE_RING_DEPTH", "1000")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("power of two"));
}

#[test]
fn exit_status_and_environment_pass_through() {
    ensure_preload();
    let out = nanowire_out(&[
        "run",
        "--engine",
        "spin",
        "--",
        "sh",
        "-c",
        "echo $LD_PRELOAD $NANOWIRE_ENGINE; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("libnanowire_preload.so") && s.contains("spin"),
        "{s}"
    );
}

#[test]
fn c_semantics_identical_plain_and_under_every_profile() {
    let bin = &shim_and_c("shim_semantics", "../preload/tests/shim_semantics.c");
    let mut plain = spawn("sem-plain", {
        let mut c = Command::new(bin);
        c.arg("all");
        c
    });
    plain.success(Duration::from_secs(40));
    let want = plain.stdout();
    assert!(want.contains("recv_fd_-1: -1 EBADF"), "{want}");
    assert!(want.lines().count() > 40, "{want}");
    for profile in ["latency", "balanced", "throughput"] {
        for engine in ["spin", "xdp"] {
            let mut c = Command::new(nanowire());
            c.args([
                "run",
                "--profile",
                profile,
                "--engine",
                engine,
                "--",
                bin,
                "all",
            ]);
            let mut k = spawn(&format!("sem-{profile}-{engine}"), c);
            k.success(Duration::from_secs(40));
            assert_same_output(&format!("{profile}/{engine}"), &want, &k.stdout(), "");
        }
    }
}

#[test]
fn close_while_another_thread_spins_gives_ebadf_not_the_reused_fd() {
    let bin = shim_and_c("shim_semantics_cw", "../preload/tests/shim_semantics.c");
    for _ in 0..3 {
        let mut c = Command::new(nanowire());
        c.args(["run", "--profile", "latency", "--engine", "spin", "--"])
            .arg(&bin)
            .arg("close-waiter");
        let mut k = spawn("close-waiter", c);
        let out = k.success(Duration::from_secs(40));
        assert!(out.contains("close_waiter: -1 EBADF reused=1"), "{out}");
    }
}

#[test]
fn log_info_says_why_each_socket_is_not_accelerated() {
    ensure_preload();
    let py = "import socket\n\
              u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
              t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n\
              x = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n";
    let out = Command::new(nanowire())
        .args(["run", "--engine", "spin", "--", "python3", "-c", py])
        .env("NANOWIRE_LOG", "info")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("udp: spin") && err.contains("xdp not used: engine spin requested"),
        "{err}"
    );
    assert!(
        err.contains("tcp: spin") && err.contains("xdp not used: engine spin requested"),
        "{err}"
    );
    let out = Command::new(nanowire())
        .args(["run", "--engine", "kernel", "--", "python3", "-c", py])
        .env("NANOWIRE_LOG", "info")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("udp: kernel (not accelerated: engine kernel requested)"),
        "{err}"
    );
}

/// Not a test on its own: the child side of
/// `a_test_binarys_scratch_goes_when_it_exits` (does nothing unless that
/// test runs this binary with NANOWIRE_SCRATCH_PROBE set).
#[test]
fn scratch_probe() {
    let Some(how) = std::env::var_os("NANOWIRE_SCRATCH_PROBE") else {
        return;
    };
    std::fs::write(scratch("small.out"), b"kept for a look").unwrap();
    std::fs::write(scratch("body.bin"), vec![7u8; 2 << 20]).unwrap();
    println!("scratch={}", scratch_dir().display());
    assert_ne!(how, "fail", "a failing test");
}

/// A test binary's scratch directory goes when the binary exits (the suite
/// once filled the disk with them): all of it after a passing run; after a
/// failing one only its big files (the failure's outputs stay for a look
/// until a later binary sweeps them).
#[test]
fn a_test_binarys_scratch_goes_when_it_exits() {
    for how in ["pass", "fail"] {
        let o = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "scratch_probe",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NANOWIRE_SCRATCH_PROBE", how)
            .env_remove("NANOWIRE_KEEP_SCRATCH")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.success(), how == "pass", "{how}: {o:?}");
        let dir = out
            .lines()
            .find_map(|l| l.split_once("scratch=").map(|(_, d)| d))
            .unwrap_or_else(|| panic!("{how}: no scratch line\n{out}"));
        let dir = std::path::Path::new(dir);
        if how == "pass" {
            assert!(!dir.exists(), "{} left after a passing run", dir.display());
        } else {
            assert!(dir.join("small.out").is_file(), "{how}: outputs gone");
            assert!(!dir.join("body.bin").exists(), "{how}: big file left");
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
}
