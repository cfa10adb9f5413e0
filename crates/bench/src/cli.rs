//! `nanowire bench ...` (the sockperf-compatible modes are filled in by the bench work).
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub cmd: BenchCmd,
}

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Microburst generator: N datagrams back to back (or paced / for a duration).
    Burst(crate::burst::BurstArgs),
    /// Microburst receiver: spins, stalls or echoes, and accounts for every loss.
    Sink(crate::burst::SinkArgs),
}

pub fn run(args: BenchArgs) -> Result<i32, String> {
    match args.cmd {
        BenchCmd::Burst(a) => crate::burst::run_burst(a),
        BenchCmd::Sink(a) => crate::burst::run_sink(a),
    }
}
