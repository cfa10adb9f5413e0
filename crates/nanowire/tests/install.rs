//! `make install`, `make uninstall` and `make deb` from the workspace root,
//! and the installed binary used as a user would (issue 25). No root needed:
//! everything goes into a temporary prefix (or DESTDIR) or a package file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// `make install` and `make deb` share target/man and target/deb.
static MAKE: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn make(args: &[&str]) -> String {
    let out = Command::new("make")
        .arg("-C")
        .arg(root())
        .arg("--no-print-directory")
        .args(args)
        .output()
        .expect("run make");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "make {args:?} failed:\n{text}");
    text
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nw-install-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const FILES: [&str; 7] = [
    "bin/nanowire",
    "lib/nanowire/libnanowire_preload.so",
    "share/bash-completion/completions/nanowire",
    "share/zsh/site-functions/_nanowire",
    "share/fish/vendor_completions.d/nanowire.fish",
    "share/man/man1/nanowire.1",
    "share/man/man1/nanowire-run.1",
];

#[test]
fn make_install_into_a_prefix_and_the_installed_binary_finds_its_shim() {
    let _g = MAKE.lock().unwrap_or_else(|e| e.into_inner());
    let prefix = tmpdir("prefix");
    let p = prefix.to_str().unwrap();
    make(&["install", &format!("PREFIX={p}")]);
    for f in FILES {
        let path = prefix.join(f);
        let len = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{f} not installed: {e}"))
            .len();
        assert!(len > 0, "{f} is empty");
    }
    // Completions and man pages come from the CLI itself.
    let bash = std::fs::read_to_string(prefix.join(FILES[2])).unwrap();
    assert!(
        bash.contains("nanowire") && bash.contains("report"),
        "bash completion"
    );
    let man = std::fs::read_to_string(prefix.join("share/man/man1/nanowire.1")).unwrap();
    assert!(
        man.starts_with(".ie") || man.contains(".TH nanowire"),
        "man page: {man:.80}"
    );

    let bin = prefix.join("bin/nanowire");
    let v = Command::new(&bin).arg("--version").output().unwrap();
    assert!(v.status.success());
    assert_eq!(
        String::from_utf8_lossy(&v.stdout).trim(),
        format!("nanowire {}", env!("CARGO_PKG_VERSION"))
    );
    // The installed `run` finds the installed shim (PREFIX/lib/nanowire), not
    // the build tree's: the variable that would override the search is unset.
    let out = Command::new(&bin)
        .args(["run", "--engine", "kernel", "-o", "log=info", "--", "true"])
        .env_remove("NANOWIRE_PRELOAD")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "installed nanowire run -- true: {err}"
    );
    let shim = std::fs::canonicalize(prefix.join(FILES[1])).unwrap();
    assert!(
        err.contains(&format!("preload {}", shim.display())),
        "the installed run must use {}: {err}",
        shim.display()
    );

    // DESTDIR stages the same tree under another root.
    let stage = tmpdir("destdir");
    make(&[
        "install",
        "PREFIX=/usr",
        &format!("DESTDIR={}", stage.display()),
        "CARGO=true",
    ]);
    assert!(stage.join("usr/bin/nanowire").is_file());
    assert!(
        stage
            .join("usr/lib/nanowire/libnanowire_preload.so")
            .is_file()
    );

    make(&["uninstall", &format!("PREFIX={p}")]);
    for f in FILES {
        assert!(!prefix.join(f).exists(), "{f} left after uninstall");
    }
    let _ = std::fs::remove_dir_all(&prefix);
    let _ = std::fs::remove_dir_all(&stage);
}

#[test]
fn make_deb_packages_the_same_files_with_dependencies() {
    let _g = MAKE.lock().unwrap_or_else(|e| e.into_inner());
    make(&["deb"]);
    let arch = String::from_utf8(
        Command::new("dpkg")
            .arg("--print-architecture")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let deb = root().join(format!(
        "target/deb/nanowire_{}_{}.deb",
        env!("CARGO_PKG_VERSION"),
        arch.trim()
    ));
    let list = Command::new("dpkg-deb")
        .arg("-c")
        .arg(&deb)
        .output()
        .unwrap();
    assert!(list.status.success(), "dpkg-deb -c {}", deb.display());
    let list = String::from_utf8_lossy(&list.stdout);
    for f in [
        "./usr/bin/nanowire",
        "./usr/lib/nanowire/libnanowire_preload.so",
        "./usr/share/bash-completion/completions/nanowire",
        "./usr/share/zsh/vendor-completions/_nanowire",
        "./usr/share/fish/vendor_completions.d/nanowire.fish",
        "./usr/share/man/man1/nanowire.1.gz",
        "./usr/share/man/man1/nanowire-lab-report.1.gz",
    ] {
        assert!(
            list.lines().any(|l| l.ends_with(f)),
            "{f} not in the package:\n{list}"
        );
    }
    let info = Command::new("dpkg-deb")
        .args(["-f"])
        .arg(&deb)
        .args(["Depends", "Package", "Architecture"])
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    for d in ["libc6 (>= 2.", "iproute2", "ethtool", "Package: nanowire"] {
        assert!(
            info.contains(d),
            "{d} missing from the control file:\n{info}"
        );
    }
}
