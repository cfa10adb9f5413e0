//! `nanowire lab report --remote` (issue 25): host b is a real OpenSSH
//! server running inside the lab's namespace b (its own host key, key
//! authentication only), host a is the report run in namespace a. The
//! report reaches host b over ssh exactly as it would reach another machine:
//! BatchMode, the keys and options given, nanowire copied there (namespace
//! b's PATH has none). Also: each ssh failure mode is one line naming the
//! host, and an interrupted report leaves no process behind in host b.

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host, ScopedLab};
use nanowire_testkit::{A, B, items};
use run_support::*;
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests of this file look at the same `/tmp/nanowire.*` copies (host
/// b's namespace shares the file system): one at a time, so one test's
/// live copy is never taken for another's leftover.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// sshd in lab host b, killed on drop.
struct Sshd {
    child: Child,
    dir: PathBuf,
    port: u16,
    pid_in_b: u32,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test's setup: its turn (`serial`), its lab (`lab_tag`) and an sshd
/// in host b (`sshd_tag`), dropped in reverse order (sshd, lab, turn).
fn remote(lab_tag: &str, sshd_tag: &str) -> (std::sync::MutexGuard<'static, ()>, ScopedLab, Sshd) {
    let turn = serial();
    let lab = lab(lab_tag);
    let sshd = sshd(&lab, sshd_tag);
    (turn, lab, sshd)
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen (openssh-client)");
    assert!(st.success());
}

fn sshd(lab: &ScopedLab, tag: &str) -> Sshd {
    sshd_with(lab, tag, "")
}

/// `extra`: more sshd_config lines.
fn sshd_with(lab: &ScopedLab, tag: &str, extra: &str) -> Sshd {
    let dir = scratch(&format!("sshd-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    keygen(&dir.join("host_key"));
    keygen(&dir.join("id"));
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
    let port = 2200 + (std::process::id() % 700) as u16 + tag.len() as u16;
    let d = dir.display();
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "Port {port}\nListenAddress {ADDR_B}\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
             PidFile {d}/sshd.pid\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n{extra}"
        ),
    )
    .unwrap();
    let hk = std::fs::read_to_string(dir.join("host_key.pub")).unwrap();
    std::fs::write(dir.join("known_hosts"), format!("[{ADDR_B}]:{port} {hk}")).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let cfg = dir.join("sshd_config");
    let log = std::fs::File::create(dir.join("sshd.log")).unwrap();
    let child = lab
        .command(
            Host::B,
            &["/usr/sbin/sshd", "-D", "-e", "-f", cfg.to_str().unwrap()],
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start sshd (openssh-server)");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let l = std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default();
        if l.contains("Server listening") {
            break;
        }
        assert!(Instant::now() < end, "sshd did not start: {l}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid_in_b = std::fs::read_to_string(dir.join("sshd.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(child.id());
    Sshd {
        child,
        dir,
        port,
        pid_in_b,
    }
}

impl Sshd {
    /// The ssh options of a user who has the key and knows the host key.
    fn opts(&self) -> Vec<String> {
        let d = self.dir.display();
        vec![
            format!("Port={}", self.port),
            format!("IdentityFile={d}/id"),
            "IdentitiesOnly=yes".into(),
            format!("UserKnownHostsFile={d}/known_hosts"),
            "StrictHostKeyChecking=yes".into(),
        ]
    }
}

fn report_cmd(
    lab: &ScopedLab,
    dest: &str,
    local: &str,
    remote: &str,
    opts: &[String],
    extra: &[&str],
) -> Command {
    let mut argv: Vec<String> = [
        nanowire(),
        "lab",
        "report",
        "--remote",
        dest,
        "--local-addr",
        local,
        "--remote-addr",
        remote,
    ]
    .map(String::from)
    .to_vec();
    for o in opts {
        argv.push("--ssh-opt".into());
        argv.push(o.clone());
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    let mut c = lab.command(Host::A, &argv);
    c.env_remove("SSH_AUTH_SOCK");
    c
}

/// The report (`cmd`, a [`report_cmd`]) writing to `out`, run to success:
/// its stderr and its results.json.
fn report_ok(mut cmd: Command, out: &Path) -> (String, Value) {
    let o = cmd.arg("--out").arg(out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "remote report failed:\n{err}");
    let results = std::fs::read_to_string(out.join("results.json")).unwrap();
    (err, serde_json::from_str(&results).unwrap())
}

/// Processes in host b's namespace other than the sshd listener.
fn left_in_b(lab: &ScopedLab, sshd: &Sshd) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "pids", &lab.netns(Host::B)])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .filter(|&p| p != sshd.pid_in_b && p != sshd.child.id())
        .filter_map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            // The test's own sshd (its listener may fork a pre-auth child briefly).
            (!cmd.contains("sshd -D -e -f")).then(|| format!("{p}: {cmd}"))
        })
        .collect()
}

fn wait_empty(lab: &ScopedLab, sshd: &Sshd) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let left = left_in_b(lab, sshd);
        if left.is_empty() || Instant::now() > end {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn copied_dirs() -> Vec<String> {
    std::fs::read_dir("/tmp")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("nanowire.") && n.len() == "nanowire.".len() + 8)
        .collect()
}

#[test]
#[ignore = "needs root"]
fn remote_report_over_ssh_runs_every_engine_in_host_b() {
    let (_serial, lab, sshd) = remote("rr", "ok");
    let out = scratch("remote-report");
    let dest = format!("root@{B}");
    let quick = words("--quick --only latency_vs_size");
    let (err, r) = report_ok(report_cmd(&lab, &dest, A, B, &sshd.opts(), &quick), &out);
    // Namespace b has no nanowire in PATH: this one was copied, and it said so.
    assert!(
        err.contains("was copied to /tmp/nanowire."),
        "no note about copying nanowire: {err}"
    );
    assert!(
        r["target"].as_str().unwrap().contains("over ssh"),
        "{}",
        r["target"]
    );
    let ex = items(&r["experiments"])
        .find(|e| e["id"] == "latency_vs_size")
        .expect("latency_vs_size ran");
    for e in ["kernel", "spin", "xdp"] {
        for p in ["udp", "tcp"] {
            let c = items(&ex["coverage"])
                .find(|c| c["engine"] == e && c["protocol"] == p)
                .unwrap_or_else(|| panic!("no coverage for {e} {p}"));
            assert_eq!(c["available"], true, "{e} {p}: {c}");
        }
        assert!(
            items(&ex["runs"]).any(|x| x["engine"] == e
                && x["result"]["latency_us"]["p50"]
                    .as_f64()
                    .is_some_and(|v| v > 0.0)),
            "no {e} latency row"
        );
    }
    // Both hosts named, with their NICs, drivers and kernels.
    let hosts = &r["env"]["hosts"];
    assert_eq!(hosts["a"]["iface"], lab.iface(Host::A).as_str());
    assert_eq!(hosts["b"]["iface"], lab.iface(Host::B).as_str());
    for h in ["a", "b"] {
        assert_eq!(hosts[h]["driver"], "veth", "{h}");
        assert!(hosts[h]["kernel"].as_str().is_some_and(|k| !k.is_empty()));
        assert!(
            hosts[h]["doctor"]["interfaces"][0]["findings"].is_array(),
            "doctor of host {h}"
        );
    }
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("host b (servers)") && html.contains(&lab.iface(Host::B)));
    for e in ["kernel", "spin", "xdp"] {
        assert!(
            html.contains(&format!("</span>{e}</td>")),
            "no {e} row in the page"
        );
    }
    // Nothing left in host b, and the copy is gone.
    let left = wait_empty(&lab, &sshd);
    assert!(left.is_empty(), "left in host b: {left:?}");
    let nw_b = r["env"]["lab"]["nanowire_on_b"].as_str().unwrap();
    assert!(
        !Path::new(nw_b).exists(),
        "the copied nanowire {nw_b} is still there"
    );
}

#[test]
#[ignore = "needs root"]
fn remote_report_failures_are_one_line_naming_the_host() {
    let (_serial, lab, sshd) = remote("rf", "fail");
    let dest = format!("root@{B}");
    let d = sshd.dir.display().to_string();
    let with = |replace: &str, by: String| -> Vec<String> {
        let mut o: Vec<String> = sshd
            .opts()
            .into_iter()
            .filter(|x| !x.starts_with(replace))
            .collect();
        o.insert(0, by);
        o
    };
    // A host key that is not host b's.
    keygen(&sshd.dir.join("other"));
    let other = std::fs::read_to_string(sshd.dir.join("other.pub")).unwrap();
    std::fs::write(
        sshd.dir.join("wrong_hosts"),
        format!("[{B}]:{} {other}", sshd.port),
    )
    .unwrap();
    let before = copied_dirs();
    // (what, USER@HOST, --local-addr, --remote-addr, ssh options, expected in the error)
    type Case<'a> = (&'a str, String, &'a str, &'a str, Vec<String>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "no key",
            dest.clone(),
            A,
            B,
            with("IdentityFile", format!("IdentityFile={d}/no-such-key")),
            "Permission denied",
        ),
        (
            "host unreachable",
            "root@198.18.0.77".into(),
            A,
            "198.18.0.77",
            with("ConnectTimeout", "ConnectTimeout=5".into()),
            "ssh to root@198.18.0.77 failed",
        ),
        (
            "host key mismatch",
            dest.clone(),
            A,
            B,
            with(
                "UserKnownHostsFile",
                format!("UserKnownHostsFile={d}/wrong_hosts"),
            ),
            "Host key verification failed",
        ),
        (
            "remote without the address",
            dest.clone(),
            A,
            "198.18.0.9",
            sshd.opts(),
            "has no interface with address 198.18.0.9",
        ),
        (
            "local without the address",
            dest.clone(),
            "198.18.0.9",
            B,
            sshd.opts(),
            "no interface with 198.18.0.9",
        ),
    ];
    let out = scratch("remote-fail");
    for (what, dest, la, ra, opts, expect) in cases {
        let o = report_cmd(
            &lab,
            &dest,
            la,
            ra,
            &opts,
            &["--quick", "--quiet", "--out", out.to_str().unwrap()],
        )
        .output()
        .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{what}: exit 0");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{what}: not one line:\n{err}"
        );
        assert!(err.contains(expect), "{what}: expected {expect:?} in {err}");
        if what != "local without the address" {
            let host = dest.split('@').nth(1).unwrap();
            assert!(err.contains(host), "{what}: the host is not named: {err}");
        }
        assert!(
            !out.join("results.json").exists(),
            "{what}: a report was written"
        );
    }
    assert!(wait_empty(&lab, &sshd).is_empty(), "left in host b");
    drop(sshd);

    // A remote command that dies: host b has "nanowire" of this version in
    // its PATH, which runs everything but a bench server.
    let fake = scratch("fakebin");
    std::fs::create_dir_all(&fake).unwrap();
    let real = std::fs::canonicalize(nanowire()).unwrap();
    std::fs::write(
        fake.join("nanowire"),
        format!(
            "#!/bin/sh\ncase \"$*\" in *'bench server'*) echo 'nanowire: error: injected failure' >&2; exit 3;; esac\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    let st = Command::new("chmod")
        .arg("0755")
        .arg(fake.join("nanowire"))
        .status()
        .unwrap();
    assert!(st.success());
    let sshd = sshd_with(
        &lab,
        "dies",
        &format!(
            "SetEnv PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
            fake.display()
        ),
    );
    let out2 = scratch("remote-dies");
    let smoke = words("--smoke --engines kernel --only latency_vs_size");
    let (err, r) = report_ok(report_cmd(&lab, &dest, A, B, &sshd.opts(), &smoke), &out2);
    assert!(
        err.contains("using the installed"),
        "the fake was not used: {err}"
    );
    let ex = &r["experiments"][0];
    for c in ex["coverage"].as_array().unwrap() {
        assert_eq!(c["available"], false, "{c}");
        let why = c["reason"].as_str().unwrap();
        assert!(
            why.contains(B) && why.contains("injected failure") && !why.contains('\n'),
            "the reason names the host and the failure in one line: {why}"
        );
    }

    // Every copy of nanowire made by the failing runs is gone.
    // (host b removes its copy as its ssh session ends: wait for that,
    // up to 10 s, on a loaded machine.)
    let until = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let after: Vec<String> = copied_dirs()
            .into_iter()
            .filter(|x| !before.contains(x))
            .collect();
        if after.is_empty() || Instant::now() > until {
            break after;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(after.is_empty(), "copies left: {after:?}");
}

#[test]
#[ignore = "needs root"]
fn an_interrupted_remote_report_leaves_no_process_in_host_b() {
    let (_serial, lab, sshd) = remote("ri", "int");
    let out = scratch("remote-int");
    let before = copied_dirs();
    let mut child = report_cmd(
        &lab,
        &format!("root@{B}"),
        A,
        B,
        &sshd.opts(),
        &["--quick", "--quiet", "--out", out.to_str().unwrap()],
    );
    child.stdout(Stdio::null()).stderr(Stdio::null());
    // As a terminal's Ctrl-C finds it: SIGINT at its default. A test run
    // from a non-interactive shell's background job inherits SIGINT
    // ignored (the report installs no handler), and the kill below did
    // nothing: the report ran to its end (264 s) instead of stopping.
    // SAFETY: signal(2) in the forked child before exec, async-signal-safe.
    unsafe {
        child.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = child.spawn().unwrap();
    // Wait for a server of the report in host b.
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        let left = left_in_b(&lab, &sshd);
        if left.iter().any(|p| p.contains("bench server")) {
            break;
        }
        assert!(
            Instant::now() < end,
            "no bench server appeared in host b: {left:?}"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the report ended early"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Ctrl-C of the report alone (`ip netns exec` and setpriv exec it: same pid).
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let end = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "the report did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = wait_empty(&lab, &sshd);
    assert!(
        left.is_empty(),
        "left in host b after the interrupt: {left:?}"
    );
    // Waited for (bounded), not a fixed 500 ms a loaded machine can outlast.
    let new_copies = || -> Vec<String> {
        copied_dirs()
            .into_iter()
            .filter(|x| !before.contains(x))
            .collect()
    };
    until(Duration::from_secs(10), || new_copies().is_empty());
    let after = new_copies();
    assert!(after.is_empty(), "copies left: {after:?}");
}
