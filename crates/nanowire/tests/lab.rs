//! The virtual testbed: `nanowire lab up|down|status|exec` as a user runs them.

use nanowire_testkit::{LabDown, ok};
use std::process::{Command, Output};

fn nanowire(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nanowire"))
        .args(args)
        .output()
        .expect("run nanowire")
}

/// `nanowire lab exec --name N HOST -- CMD...`.
fn lab_exec(n: &str, host: &str, cmd: &[&str]) -> Output {
    let mut argv = vec!["lab", "exec", "--name", n, host, "--"];
    argv.extend_from_slice(cmd);
    nanowire(&argv)
}

/// `nanowire lab up --name N` as a user types it (needs root): the lab's
/// name `tl<tag><pid>` and the guard that takes it down.
fn up(tag: &str) -> (String, LabDown) {
    nanowire_testkit::require_root();
    let n = nanowire_testkit::lab_name(&format!("tl{tag}"));
    let g = LabDown(n.clone());
    ok(&nanowire(&["lab", "up", "--name", &n]));
    (n, g)
}

fn netns_list() -> String {
    String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned()
}

#[test]
#[ignore = "needs root"]
fn up_is_idempotent_exec_reaches_peer_and_down_removes_everything() {
    let (n, _g) = up("u");
    ok(&nanowire(&["lab", "up", "--name", &n]));
    let st: serde_json::Value =
        serde_json::from_str(&ok(&nanowire(&["lab", "status", "--name", &n, "--json"]))).unwrap();
    assert_eq!(st["complete"], true);
    assert_eq!(st["a"]["addr"], "198.18.0.1");
    assert_eq!(st["b"]["addr"], "198.18.0.2");
    assert_eq!(st["a"]["driver"], "veth");
    assert!(
        st["a"]["offloads"]
            .as_array()
            .is_some_and(|o| !o.is_empty()),
        "offloads recorded"
    );

    // Host a reaches host b through the veth pair (ARP + ICMP through the kernel).
    ok(&lab_exec(
        &n,
        "a",
        &["ping", "-c", "1", "-W", "2", "198.18.0.2"],
    ));
    // exec propagates the command's exit code.
    let o = lab_exec(&n, "b", &["sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7));

    ok(&nanowire(&["lab", "down", "--name", &n]));
    let l = netns_list();
    assert!(
        !l.contains(&format!("{n}-a")) && !l.contains(&format!("{n}-b")),
        "namespaces left: {l}"
    );
    let st = nanowire(&["lab", "status", "--name", &n]);
    assert!(
        !st.status.success(),
        "status of a lab that is down exits non-zero"
    );
    // down twice is fine.
    ok(&nanowire(&["lab", "down", "--name", &n]));
}

#[test]
#[ignore = "needs root"]
fn lab_commands_die_with_their_spawner() {
    use nanowire_lab::testbed::Host;
    let lab = nanowire_testkit::lab("tlk");
    // A thread spawns a long sleeper in host b and exits without killing it.
    let l2 = lab.lab.clone();
    // (It stays until `setpriv` has set the signal, that is until it has
    // exec'd the sleeper: a spawner that exits within microseconds of
    // spawning is not the case this guards against. A fixed 500 ms could
    // end first on a loaded machine, and the sleeper outlive it.)
    let pid = std::thread::spawn(move || {
        let id = l2.command(Host::B, &["sleep", "300"]).spawn().unwrap().id();
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(format!("/proc/{id}/comm"))
            .map_or(true, |c| c.trim() != "sleep")
        {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(30),
                "{id} never became the sleeper"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        id
    })
    .join()
    .unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting to be reaped: either way it is not running.
        if state.is_empty() || state.split_whitespace().nth(2) == Some("Z") {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "child {pid} outlived its spawner: {state}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs root"]
fn up_repairs_a_half_built_lab() {
    let (n, _g) = up("r");
    // Simulate a crash: one namespace and the veth pair gone.
    assert!(
        Command::new("ip")
            .args(["netns", "del", &format!("{n}-b")])
            .status()
            .unwrap()
            .success()
    );
    assert!(!nanowire(&["lab", "status", "--name", &n]).status.success());
    ok(&nanowire(&["lab", "up", "--name", &n]));
    ok(&lab_exec(
        &n,
        "b",
        &["ping", "-c", "1", "-W", "2", "198.18.0.1"],
    ));
}

#[test]
fn bad_lab_arguments_give_one_line_errors() {
    for args in [
        vec!["lab", "up", "--name", "this-name-is-far-too-long"],
        vec!["lab", "exec", "--name", "tlnotthere", "a", "--", "true"],
        vec!["lab", "up", "--name", "tlq", "--queues", "0"],
    ] {
        let o = nanowire(&args);
        let err = nanowire_testkit::one_line_failure(&format!("{args:?}"), &o, "");
        assert!(err.starts_with("nanowire: error: "), "{args:?}: {err}");
    }
    let o = nanowire(&["lab", "exec", "--name", "tlnotthere", "c", "--", "true"]);
    assert!(!o.status.success());
}
