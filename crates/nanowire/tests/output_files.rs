//! Output files as root (issue 20, finding 11): `nanowire capture -w` and
//! `bench --full-log` refuse a planted symlink with a one-line error and
//! leave its target untouched; what they create is not world-readable.
//! (The report writer uses the same `nanowire_outfile::create`, unit-tested
//! in crates/outfile.)

use std::os::unix::fs::MetadataExt;
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
