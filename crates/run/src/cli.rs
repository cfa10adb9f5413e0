//! `nanowire run`: set up the preload library and its configuration, then
//! exec the command (it replaces this process: signals, exit status and
//! the terminal belong to the application).

use crate::options::{self, Config, Engine, Level};
use clap::Args;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// File name of the shim.
pub const PRELOAD_LIB: &str = "libnanowire_preload.so";
/// Variable that names the shim explicitly (wins over the search).
pub const PRELOAD_ENV: &str = "NANOWIRE_PRELOAD";

#[derive(Debug, Args)]
#[command(
    about = "Run an unmodified program with nanowire acceleration (LD_PRELOAD shim)",
    after_help = "Example: nanowire run --profile latency -- sockperf sr -i 198.18.0.2 -p 11111\n\
                  Options: nanowire run --list-options"
)]
pub struct RunArgs {
    /// Named profile: latency, balanced (default) or throughput.
    #[arg(long)]
    pub profile: Option<String>,
    /// Engine for UDP and TCP sockets: xdp (fall back to spin, saying why), spin or kernel.
    #[arg(long)]
    pub engine: Option<String>,
    /// Set an option of the table: -o spin_us=100 (repeatable).
    #[arg(short = 'o', long = "opt", value_name = "NAME=VALUE")]
    pub opts: Vec<String>,
    /// Print the options table (with --json: as JSON) and exit.
    #[arg(long)]
    pub list_options: bool,
    /// With --list-options: JSON.
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<OsString>,
}

/// Where the shim is: `$NANOWIRE_PRELOAD`, else next to the running
/// executable (`target/release/` in a build tree), else `../lib/nanowire/`.
pub fn find_preload() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(PRELOAD_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(absolute(&p))
        } else {
            Err(format!(
                "{PRELOAD_ENV}={} is not a file",
                p.to_string_lossy()
            ))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate nanowire itself: {e}"))?;
    preload_beside(&exe).map(|c| absolute(&c)).ok_or_else(|| {
        format!(
            "{PRELOAD_LIB} not found next to {} (build it with `make build`, or \
             `cargo build --profile {SHIM_PROFILE} -p nanowire-preload`, or set {PRELOAD_ENV})",
            exe.display()
        )
    })
}

/// The cargo profile the shim is built with (Cargo.toml `[profile.shim]`:
/// release with fat LTO and one codegen unit, so the engine's code the shim
/// calls is inlined across crates). Its output is `target/shim/`, beside
/// `target/release/` where the `nanowire` binary is.
pub const SHIM_PROFILE: &str = "shim";

/// The shim that goes with the executable `exe` (not `$NANOWIRE_PRELOAD`):
/// in a cargo build tree (`exe` in `target/release/`), the `shim` profile's
/// build in `target/shim/` unless the release profile's copy beside `exe` is
/// newer (a `cargo build --release --workspace` after a change to the shim
/// rebuilt only that one); else beside `exe`, in `../lib/nanowire/` (an
/// installed tree) or in `..`.
pub fn preload_beside(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let mtime = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    let here = dir.join(PRELOAD_LIB);
    if dir.file_name().is_some_and(|n| n == "release") {
        let lto = dir.join("..").join(SHIM_PROFILE).join(PRELOAD_LIB);
        if let Some(t) = mtime(&lto).filter(|_| lto.is_file())
            && mtime(&here).is_none_or(|h| t >= h)
        {
            return Some(lto);
        }
    }
    [
        here,
        dir.join("../lib/nanowire").join(PRELOAD_LIB),
        dir.join("..").join(PRELOAD_LIB),
    ]
    .into_iter()
    .find(|c| c.is_file())
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Parse `-o name=value` and the dedicated flags into (option, value) pairs.
fn overrides(args: &RunArgs) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    if let Some(p) = &args.profile {
        out.push(("profile".to_string(), p.clone()));
    }
    for o in &args.opts {
        let (k, v) = o
            .split_once('=')
            .ok_or_else(|| format!("bad -o {o:?}: expected NAME=VALUE"))?;
        let spec = options::find(k)
            .ok_or_else(|| format!("unknown option {k:?} (see nanowire run --list-options)"))?;
        out.push((spec.name.to_string(), v.to_string()));
    }
    if let Some(e) = &args.engine {
        out.push(("engine".to_string(), e.clone()));
    }
    Ok(out)
}

pub fn run(args: RunArgs) -> Result<i32, String> {
    if args.list_options {
        if args.json {
            println!("{}", options::table_json());
        } else {
            print!("{}", options::render_table());
        }
        return Ok(0);
    }
    let Some((prog, rest)) = args.cmd.split_first() else {
        return Err("nothing to run: usage: nanowire run [--profile NAME] [--engine xdp|spin|kernel] -- CMD ARGS...".into());
    };
    let ovr = overrides(&args)?;
    // Validate everything here, so that a typo is one clear line and not a
    // shim that silently ignores the variable.
    let cfg = Config::resolve(|k| std::env::var(k).ok(), &ovr)?;
    if cfg.engine == Engine::Xdp
        && let Some(name) = &cfg.iface
        && (name.is_empty()
            || name.contains('/')
            || !std::path::Path::new("/sys/class/net").join(name).exists())
    {
        return Err(format!(
            "iface: no network interface named {name:?} here (NANOWIRE_IFACE / -o iface=)"
        ));
    }
    let lib = find_preload()?;

    let mut cmd = Command::new(prog);
    cmd.args(rest);
    let preload = match std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        Some(old) => {
            let mut s = lib.clone().into_os_string();
            s.push(" ");
            s.push(old);
            s
        }
        None => lib.clone().into_os_string(),
    };
    cmd.env("LD_PRELOAD", preload);
    // The binary that can start the engine service (NANOWIRE_SERVICE=1).
    if let Ok(me) = std::env::current_exe() {
        cmd.env("NANOWIRE_BIN", me);
    }
    cmd.env(options::PROFILE_ENV, cfg.profile);
    for (k, v) in &ovr {
        if let Some(spec) = options::find(k) {
            cmd.env(spec.env, v);
        }
    }

    if cfg.engine == Engine::Xdp
        && cfg.log >= Level::Warn
        && !cfg.service
        && let Err(why) = crate::privilege::check()
    {
        eprintln!("nanowire run: xdp engine not usable: {why}; UDP sockets use the spin engine");
    }
    if let Some(v) = prestart(&cfg, prog) {
        cmd.env(nanowire_xdp::prestart::ENV, v);
    }
    if cfg.log >= Level::Info {
        eprintln!(
            "nanowire run: profile {} engine {} spin {} preload {}",
            cfg.profile,
            cfg.engine.as_str(),
            match cfg.spin {
                None => "forever".to_string(),
                Some(d) => format!("{}us", d.as_micros()),
            },
            lib.display()
        );
    }
    let err = cmd.exec();
    // Like a shell: 127 when the command is not found, 126 when it exists
    // but cannot be executed.
    eprintln!("nanowire run: cannot run {}: {err}", prog.to_string_lossy());
    Ok(exec_failure_status(&err))
}

/// The exit status a POSIX shell gives a command it could not execute.
pub fn exec_failure_status(err: &std::io::Error) -> i32 {
    match err.kind() {
        std::io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// The steering program attached before exec (`prestart` option, see
/// nanowire_xdp::prestart): on `iface` if set, else on the interfaces of
/// the namespace's IPv4 routes but the loopback. Only for an own xdp
/// engine that would attach the same program (multi-buffer aware, the
/// forced attach mode if any), with the privilege to. Returns the value
/// of `NANOWIRE_PREPARED` for the program (`None`: nothing prepared; an
/// interface that refuses, e.g. one another XDP program owns, is skipped,
/// said at the info level).
fn prestart(cfg: &Config, prog: &std::ffi::OsStr) -> Option<String> {
    if cfg.engine != Engine::Xdp
        || cfg.service
        || !cfg.prestart
        || std::env::var("NANOWIRE_XDP_NO_MULTI_BUFFER").as_deref() == Ok("1")
        || crate::privilege::check().is_err()
    {
        return None;
    }
    if is_script(prog) {
        // An interpreter (a shell, `env`) that forks or execs before any
        // engine starts would only close it again (a pyenv shim does).
        if cfg.log >= Level::Info {
            eprintln!(
                "nanowire run: {} is a script: steering program not attached before exec",
                prog.to_string_lossy()
            );
        }
        return None;
    }
    let forced = match std::env::var("NANOWIRE_XDP_MODE").as_deref() {
        Ok("native") => Some(nanowire_xdp::AttachMode::Driver),
        Ok("generic") => Some(nanowire_xdp::AttachMode::Skb),
        Ok("") | Err(_) => None,
        // A bad value: the shim's engine says so and follows the driver.
        Ok(_) => None,
    };
    let ifaces = match &cfg.iface {
        Some(i) => vec![i.clone()],
        None => nanowire_xdp::prestart::candidates(),
    };
    let mut out = Vec::new();
    for i in ifaces.iter().take(MAX_PRESTART) {
        // The first interface's engine gets its UMEM made too (tens of MB:
        // not for every interface the routes name).
        let umem = out.is_empty().then_some(cfg.ring_depth);
        match nanowire_xdp::SteerProgram::prepare(i, forced, umem) {
            Ok(d) => out.push(d),
            Err(e) if cfg.log >= Level::Info => {
                eprintln!("nanowire run: {i}: steering program not attached before exec: {e}");
            }
            Err(_) => {}
        }
    }
    (!out.is_empty()).then(|| out.join(";"))
}

/// Interfaces `nanowire run` attaches the steering program on at most
/// (each costs the launcher a program load and a link).
const MAX_PRESTART: usize = 4;

/// Whether `prog` (a path, or a name looked up in `PATH` as exec does)
/// is a `#!` script.
fn is_script(prog: &std::ffi::OsStr) -> bool {
    use std::io::Read;
    let p = Path::new(prog);
    let path = if prog.to_string_lossy().contains('/') {
        Some(p.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|dirs| {
            std::env::split_paths(&dirs)
                .map(|d| d.join(p))
                .find(|c| c.is_file())
        })
    };
    let mut head = [0u8; 2];
    path.and_then(|p| std::fs::File::open(p).ok())
        .is_some_and(|mut f| f.read_exact(&mut head).is_ok() && &head == b"#!")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::time::{Duration, SystemTime};

    /// A fresh `<tmp>/nw-preload-<pid>-<tag>/target/{release,shim}` tree.
    fn tree(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("nw-preload-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["target/release", "target/shim", "bin", "lib/nanowire"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        root
    }

    fn put(p: &Path, age_s: u64) {
        let f = File::create(p).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s))
            .unwrap();
    }

    fn same(a: Option<PathBuf>, b: &Path) -> bool {
        a.is_some_and(|a| absolute(&a) == absolute(b))
    }

    #[test]
    fn a_build_tree_takes_the_shim_profile_unless_the_release_copy_is_newer() {
        let root = tree("build");
        let exe = root.join("target/release/nanowire");
        let release = root.join("target/release").join(PRELOAD_LIB);
        let lto = root.join("target").join(SHIM_PROFILE).join(PRELOAD_LIB);
        assert_eq!(preload_beside(&exe), None, "nothing built");
        put(&release, 100);
        assert!(
            same(preload_beside(&exe), &release),
            "only the release build"
        );
        put(&lto, 50);
        assert!(
            same(preload_beside(&exe), &lto),
            "the shim profile's is newer"
        );
        put(&release, 10);
        assert!(
            same(preload_beside(&exe), &release),
            "the release copy rebuilt after it"
        );
        std::fs::remove_file(&release).unwrap();
        assert!(same(preload_beside(&exe), &lto), "only the shim profile's");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn an_installed_tree_takes_lib_nanowire() {
        let root = tree("installed");
        let exe = root.join("bin/nanowire");
        let lib = root.join("lib/nanowire").join(PRELOAD_LIB);
        // A `shim` directory beside `bin` is not looked at (not a build tree).
        std::fs::create_dir_all(root.join(SHIM_PROFILE)).unwrap();
        put(&root.join(SHIM_PROFILE).join(PRELOAD_LIB), 0);
        assert_eq!(preload_beside(&exe), None);
        put(&lib, 0);
        assert!(same(preload_beside(&exe), &lib));
        let beside = root.join("bin").join(PRELOAD_LIB);
        put(&beside, 0);
        assert!(
            same(preload_beside(&exe), &beside),
            "beside the binary first"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
