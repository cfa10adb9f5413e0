//! `nanowire`: one binary for the lab, the benchmark, the engine's counters
//! and drop-in acceleration. Each subcommand lives in its crate; this file
//! only dispatches and turns errors into one line and a non-zero exit.

mod engine;
mod shared;
mod stats;

use clap::{CommandFactory, Parser, Subcommand};
use nanowire_stack::xdp::config;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "nanowire",
    version,
    about = "Kernel-bypass low-latency UDP/TCP for Linux, and the lab that proves it"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// sockperf-compatible latency and throughput benchmark.
    Bench(nanowire_bench::cli::BenchArgs),
    /// The virtual two-host testbed and the seed-suite report.
    Lab(nanowire_lab::cli::LabArgs),
    /// Counters of running nanowire engines.
    Stats(stats::StatsArgs),
    /// The engine service: one engine per interface for the whole network namespace.
    Engine(engine::EngineArgs),
    /// Run an unmodified program with drop-in acceleration (LD_PRELOAD shim).
    Run(nanowire_run::cli::RunArgs),
    /// What decides whether acceleration works, and how well, on this host and its interfaces.
    Doctor(nanowire_doctor::DoctorArgs),
    /// Timestamped packet capture to pcapng (nanosecond resolution).
    Capture(nanowire_capture::cli::CaptureArgs),
    /// Shell completion script on stdout (`make install` uses it).
    #[command(hide = true)]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Man pages (roff) of nanowire and every subcommand into DIR (`make install` uses it).
    #[command(hide = true)]
    Man {
        /// Directory to write nanowire.1, nanowire-run.1, ... into (created).
        dir: PathBuf,
    },
}

/// The generators behind `make install`: everything comes from the clap
/// definition above, so completions and man pages cannot drift from the CLI.
fn completions(shell: clap_complete::Shell) -> Result<i32, String> {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "nanowire", &mut std::io::stdout());
    Ok(0)
}

fn man(dir: PathBuf) -> Result<i32, String> {
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), &dir)
        .map_err(|e| format!("cannot write man pages into {}: {e}", dir.display()))?;
    Ok(0)
}

fn main() {
    let cli = Cli::parse();
    // The engine's process-wide settings, read from the environment once,
    // here: no library crate reads it (nanowire_stack::xdp::config).
    let _ = config::configure(config::EngineConfig::from_vars(|k| std::env::var(k).ok()));
    let res = match cli.cmd {
        Cmd::Bench(a) => nanowire_bench::cli::run(a),
        Cmd::Lab(a) => nanowire_lab::cli::run(a),
        Cmd::Stats(a) => stats::run(a),
        Cmd::Engine(a) => engine::run(a),
        Cmd::Run(a) => nanowire_run::cli::run(a),
        Cmd::Capture(a) => nanowire_capture::cli::run(a, config::config().xdp_mode),
        Cmd::Doctor(a) => nanowire_doctor::run(a),
        Cmd::Completions { shell } => completions(shell),
        Cmd::Man { dir } => man(dir),
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("nanowire: error: {e}");
            std::process::exit(1);
        }
    }
}
