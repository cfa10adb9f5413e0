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
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join(PRELOAD_LIB),
        dir.join("../lib/nanowire").join(PRELOAD_LIB),
        dir.join("..").join(PRELOAD_LIB),
    ];
    for c in &candidates {
        if c.is_file() {
            return Ok(absolute(c));
        }
    }
    Err(format!(
        "{PRELOAD_LIB} not found next to {} (build it with `cargo build --release --workspace`, \
         or set {PRELOAD_ENV})",
        exe.display()
    ))
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
