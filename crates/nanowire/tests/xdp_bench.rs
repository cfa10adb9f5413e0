//! `nanowire bench --engine xdp` end to end in a lab (prefix `tx`): xdp on
//! both ends, a real sockperf client against the xdp server, and the
//! fallback of a second xdp process on the same interface.

use nanowire_lab::testbed::{Host, LabOptions, ScopedLab};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_nanowire");

fn lab(tag: char) -> Option<ScopedLab> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: needs root");
        return None;
    }
    let name = format!("tx{}{tag}", std::process::id() % 10000);
    Some(
        ScopedLab::new(LabOptions {
            name,
            ..LabOptions::default()
        })
        .expect("lab up"),
    )
}

/// A server killed on drop; its stdout and stderr lines on channels.
struct Server {
    child: Child,
    _out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
}

fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

impl Server {
    fn start(lab: &ScopedLab, port: u16) -> Server {
        let p = port.to_string();
        let mut child = lab
            .command(
                Host::B,
                &[
                    BIN,
                    "bench",
                    "server",
                    "-i",
                    "198.18.0.2",
                    "-p",
                    &p,
                    "--engine",
                    "xdp",
                ],
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = lines(child.stdout.take().unwrap());
        let err = lines(child.stderr.take().unwrap());
        Server {
            child,
            _out: out,
            err,
        }
    }

    /// Wait (bounded) for the "listen on" block (on stderr); returns its
    /// engine line and the lines printed before it.
    fn listening(&self) -> (String, Vec<String>) {
        let mut before = Vec::new();
        loop {
            let l = self
                .err
                .recv_timeout(Duration::from_secs(20))
                .expect("server printed its listen line");
            if l.contains("(engine ") {
                return (l, before);
            }
            before.push(l);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pp(lab: &ScopedLab, port: u16, engine: &str) -> serde_json::Value {
    let p = port.to_string();
    let out = lab
        .command(
            Host::A,
            &[
                BIN,
                "bench",
                "pp",
                "-i",
                "198.18.0.2",
                "-p",
                &p,
                "--engine",
                engine,
                "-m",
                "64",
                "-t",
                "1",
                "--json",
            ],
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pp failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("pp JSON")
}

#[test]
fn bench_pp_with_xdp_on_both_ends() {
    let Some(lab) = lab('P') else { return };
    let s = Server::start(&lab, 11200);
    assert!(s.listening().0.contains("(engine xdp)"));
    let r = pp(&lab, 11200, "xdp");
    assert_eq!(r["engine"], "xdp", "{r}");
    assert!(r["received"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["dropped"], 0, "{r}");
}

#[test]
fn real_sockperf_client_against_the_xdp_server() {
    let Some(lab) = lab('R') else { return };
    if Command::new("sockperf").arg("--version").output().is_err() {
        eprintln!("skipping: sockperf not installed");
        return;
    }
    let s = Server::start(&lab, 11201);
    assert!(s.listening().0.contains("(engine xdp)"));
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
fn second_xdp_process_on_the_interface_falls_back_to_spin() {
    let Some(lab) = lab('S') else { return };
    let first = Server::start(&lab, 11202);
    assert!(first.listening().0.contains("(engine xdp)"));
    let second = Server::start(&lab, 11203);
    let (listen, before) = second.listening();
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
