//! `nanowire`: one binary for the lab, the benchmark, the engine's counters
//! and drop-in acceleration. Each subcommand lives in its crate; this file
//! only dispatches and turns errors into one line and a non-zero exit.

use clap::{Parser, Subcommand};

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
    Stats(nanowire_stack::cli::StatsArgs),
    /// Run an unmodified program with drop-in acceleration (LD_PRELOAD shim).
    Run(nanowire_run::cli::RunArgs),
    /// Timestamped packet capture to pcapng (nanosecond resolution).
    Capture(nanowire_capture::cli::CaptureArgs),
    /// xdp engine test/demo mode (echo, multicast, counters).
    #[command(hide = true)]
    XdpTest(nanowire_stack::cli::XdpTestArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Bench(a) => nanowire_bench::cli::run(a),
        Cmd::Lab(a) => nanowire_lab::cli::run(a),
        Cmd::Stats(a) => nanowire_stack::cli::run(a),
        Cmd::Run(a) => nanowire_run::cli::run(a),
        Cmd::Capture(a) => nanowire_capture::cli::run(a),
        Cmd::XdpTest(a) => nanowire_stack::cli::xdp_test(a),
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("nanowire: error: {e}");
            std::process::exit(1);
        }
    }
}
