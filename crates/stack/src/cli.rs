//! `nanowire stats` (stub; filled in by the engine work).
use clap::Args;

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: StatsArgs) -> Result<i32, String> {
    Err("nanowire stats is not built yet".into())
}
