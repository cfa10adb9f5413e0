//! Output files as root (issue 20, finding 11): `nanowire capture -w`,
//! `bench --full-log` and the `lab report` writer refuse a planted symlink
//! with a one-line error and leave its target untouched; what they create
//! is not world-readable. The report is driven through its cheapest path,
//! `lab report --render-only` over a results.json with nothing measured
//! (no lab, no measurement), plus the full command's output directory,
//! refused before it makes a lab.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

const NW: &str = env!("CARGO_BIN_EXE_nanowire");

fn plant(tag: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let dir = nanowire_lab::tmp::private_dir(tag).unwrap();
    let target = dir.join("precious");
    std::fs::write(&target, b"keep").unwrap();
    let link = dir.join("out");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    (dir, target, link)
}

fn refused(o: std::process::Output, target: &std::path::Path) {
    nanowire_testkit::one_line_failure("writing through a planted link", &o, "symbolic link");
    assert_eq!(std::fs::read(target).unwrap(), b"keep");
}

#[test]
#[ignore = "needs root"]
fn capture_refuses_a_planted_symlink_and_writes_owner_only_files() {
    let (dir, target, link) = plant("nwout-cap");
    let o = Command::new(NW)
        .args(["capture", "-i", "lo", "-t", "0.2", "-w"])
        .arg(&link)
        .output()
        .unwrap();
    refused(o, &target);
    let fresh = dir.join("fresh.pcapng");
    let o = Command::new(NW)
        .args(["capture", "-i", "lo", "-t", "0.2", "-w"])
        .arg(&fresh)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mode = std::fs::metadata(&fresh).unwrap().mode();
    assert_eq!(mode & 0o077, 0, "mode {:o}", mode & 0o777);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs root"]
fn bench_full_log_refuses_a_planted_symlink() {
    let (dir, target, link) = plant("nwout-bench");
    let o = Command::new(NW)
        .args([
            "bench",
            "pp",
            "-i",
            "127.0.0.1",
            "-m",
            "64",
            "-t",
            "1",
            "--full-log",
        ])
        .arg(&link)
        .output()
        .unwrap();
    refused(o, &target);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A report with nothing measured: all `lab report --render-only` needs.
const TINY_REPORT: &str = r#"{"schema":"nanowire-lab-report/1","generated_unix":0,"mode":"smoke","engines":["kernel"],"repeats":1,"target":"lab:none","elapsed_s":0.0,"env":{},"headline":{"caption":"","columns":[],"rows":[]},"experiments":[]}"#;

/// `lab report --render-only --out OUT`.
fn render(out: &Path) -> std::process::Output {
    Command::new(NW)
        .args(["lab", "report", "--render-only", "--quiet", "--out"])
        .arg(out)
        .output()
        .unwrap()
}

/// A directory `dir/name` holding the tiny report's results.json.
fn report_dir(dir: &Path, name: &str) -> std::path::PathBuf {
    let d = dir.join(name);
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("results.json"), TINY_REPORT).unwrap();
    d
}

/// The report writer: a planted link as index.html, as results.json (to a
/// file holding a report, which is read but never written) or as the
/// `--out` directory (of `--render-only`, and of a full run, which refuses
/// it before making its lab) is refused with one line, what it points to
/// untouched; a real directory renders, its files 0640 at most.
#[test]
fn report_refuses_planted_symlinks_as_its_files_and_its_directory() {
    let (dir, target, _) = plant("nwout-rep");
    let real = report_dir(&dir, "real");
    let o = render(&real);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in ["index.html", "results.json"] {
        let mode = std::fs::metadata(real.join(f)).unwrap().mode();
        assert_eq!(mode & 0o037, 0, "{f}: mode {:o}", mode & 0o777);
    }
    // index.html planted.
    std::fs::remove_file(real.join("index.html")).unwrap();
    std::os::unix::fs::symlink(&target, real.join("index.html")).unwrap();
    refused(render(&real), &target);
    // results.json planted, pointing at a report of someone else's.
    let theirs = dir.join("theirs.json");
    std::fs::write(&theirs, TINY_REPORT).unwrap();
    let linked = dir.join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(&theirs, linked.join("results.json")).unwrap();
    refused(render(&linked), &target);
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), TINY_REPORT);
    // --out planted: --render-only, then a full run (a lab of its own
    // name, which must never be made).
    let pointed = report_dir(&dir, "pointed");
    let out = dir.join("out-dir");
    std::os::unix::fs::symlink(&pointed, &out).unwrap();
    refused(render(&out), &target);
    let name = format!("rp{}", std::process::id() % 100_000);
    let o = Command::new(NW)
        .args(["lab", "report", "--name", &name, "--quick", "--quiet"])
        .args(["--only", "capture", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let made = String::from_utf8_lossy(&netns.stdout).contains(&format!("{name}-a"));
    if made {
        let _ = Command::new(NW)
            .args(["lab", "down", "--name", &name])
            .output();
    }
    assert!(
        !made,
        "lab report made lab {name} before refusing its --out"
    );
    refused(o, &target);
    let left: Vec<_> = std::fs::read_dir(&pointed).unwrap().collect();
    assert_eq!(left.len(), 1, "written through the link: {left:?}");
    assert_eq!(
        std::fs::read_to_string(pointed.join("results.json")).unwrap(),
        TINY_REPORT
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
