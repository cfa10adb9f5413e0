//! sendfile and splice on engine TCP connections (issue 21 item 4): a
//! Python server sends a 50 MB file with `socket.sendfile` (os.sendfile)
//! or from a pipe with `os.splice`, a client hashes the body, in all four
//! placements (plain/plain, run/plain, plain/run, run/run), in the default
//! lab (TSO/GSO on); and a server splices what it receives into a pipe.
//! The probe is `scripts/sendfile_probe.py`.

mod run_support;
use nanowire_lab::testbed::ADDR_B;
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(180);
const SIZE: usize = 50 << 20;

fn probe() -> String {
    format!(
        "{}/../../scripts/sendfile_probe.py",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A 50 MB file of pseudo-random bytes in the private scratch directory
/// (removed when the test ends, passed or failed), and its "SHA LEN"; one
/// file per test (they run in parallel: a shared one would be rewritten
/// under another test's reader).
fn file(tag: &str) -> (ScratchFile, String) {
    let path = ScratchFile(scratch(&format!("body-{tag}.bin")));
    std::fs::write(&*path, xorshift_bytes(SIZE, 0x9e37_79b9_7f4a_7c15)).unwrap();
    let o = std::process::Command::new("sha256sum")
        .arg(&*path)
        .output()
        .expect("sha256sum");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let sha = out.split_whitespace().next().unwrap().to_string();
    (path, format!("{sha} {SIZE}"))
}

const PLACEMENTS: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

/// The server sends the file (`mode`: sendfile, splice) to the client in
/// all four placements, ports `base`.., a lab tagged `tag`.
fn serve_and_fetch(tag: &str, mode: &str, base: u16) {
    let (l, (body, want)) = (&lab(tag), file(tag));
    let path = body.to_string_lossy();
    let (path, want) = (&*path, want.as_str());
    let b = ADDR_B.to_string();
    for (i, (srv_run, cli_run)) in PLACEMENTS.into_iter().enumerate() {
        let port = (base + i as u16).to_string();
        let (name, p) = (format!("{mode}-{i}"), probe());
        let srv = ["server", &b, &port, path, mode];
        let (s, c) = script_pair(
            l,
            (&name, &p),
            (srv_run, &srv),
            (cli_run, &["client", &b, &port]),
            T,
        );
        let (co, so) = (c.both(), s.both());
        let tag = format!("{mode} server run={srv_run} client run={cli_run}");
        assert_eq!(
            line_of(&co, "got "),
            format!("got {want}"),
            "{tag}\n{co}\n{so}"
        );
        assert_eq!(line_of(&so, "sent "), format!("sent {SIZE}"), "{tag}\n{so}");
        if srv_run {
            on_engine(&s, &format!("tcp listener {b}:{port}"));
            assert!(
                !so.contains("moved to the kernel"),
                "{tag}: handed over\n{so}"
            );
        }
        if cli_run {
            on_engine(&c, &format!("-> {b}:{port}"));
        }
    }
}

#[test]
#[ignore = "needs root"]
fn sendfile_50mb_in_all_four_placements() {
    serve_and_fetch("sf", "sendfile", 15100);
}

#[test]
#[ignore = "needs root"]
fn splice_from_a_pipe_into_the_connection_in_all_four_placements() {
    serve_and_fetch("sp", "splice", 15200);
}

#[test]
#[ignore = "needs root"]
fn splice_from_the_connection_into_a_pipe() {
    let l = lab("si");
    let (body, want) = file("si");
    let path = body.to_string_lossy();
    let b = ADDR_B.to_string();
    for (i, (srv_run, cli_run)) in PLACEMENTS.into_iter().enumerate() {
        let port = (15300 + i as u16).to_string();
        let (name, p) = (format!("si-{i}"), probe());
        let (srv, cli) = (
            ["server", &b, &port, "-", "splice-in"],
            ["client-send", &b, &port, &path],
        );
        let (s, _c) = script_pair(&l, (&name, &p), (srv_run, &srv), (cli_run, &cli), T);
        let so = s.both();
        assert_eq!(
            line_of(&so, "in "),
            format!("in {want}"),
            "run={srv_run}\n{so}"
        );
        if srv_run {
            assert!(!so.contains("moved to the kernel"), "handed over\n{so}");
        }
    }
}
