//! Compiles the workspace's BPF programs (bpf/*.c) into BPF objects embedded
//! in this crate: `steer.c` (the xdp engine's steering program,
//! [`steer_object`]) and `capture.c` (the dedicated capture program of
//! `nanowire capture --xdp`, [`capture_object`]). One place, one clang
//! invocation for every program.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The programs, by file stem under bpf/.
const PROGRAMS: &[&str] = &["steer", "capture"];

fn compile(clang: &str, src: &Path, out: &Path) {
    println!("cargo:rerun-if-changed={}", src.display());
    let status = Command::new(clang)
        .args([
            "-O2",
            "-g",
            "-target",
            "bpf",
            "-I/usr/include/x86_64-linux-gnu",
            "-Wall",
            "-c",
        ])
        .arg(src)
        .arg("-o")
        .arg(out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("clang failed to compile {} ({s})", src.display()),
        Err(e) => panic!(
            "cannot run {clang} to build the XDP programs ({e}); install clang and libbpf-dev (make deps)"
        ),
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    println!("cargo:rerun-if-env-changed=CLANG");
    for p in PROGRAMS {
        compile(
            &clang,
            &manifest.join(format!("../../bpf/{p}.c")),
            &out_dir.join(format!("{p}.o")),
        );
    }
}
