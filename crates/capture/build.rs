//! Compiles bpf/capture.c (the dedicated capture program) into a BPF object
//! embedded in the crate.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let src = manifest.join("../../bpf/capture.c");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("capture.o");
    println!("cargo:rerun-if-changed={}", src.display());
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let status = Command::new(&clang)
        .args([
            "-O2",
            "-g",
            "-target",
            "bpf",
            "-I/usr/include/x86_64-linux-gnu",
            "-Wall",
            "-c",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("clang failed to compile {} ({s})", src.display()),
        Err(e) => panic!(
            "cannot run {clang} to build the XDP program ({e}); install clang and libbpf-dev (make deps)"
        ),
    }
}
