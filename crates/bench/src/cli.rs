//! `nanowire bench ...` (stub; filled in by the bench work).
use clap::Args;

#[derive(Debug, Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> Result<i32, String> {
    Err("nanowire bench is not built yet".into())
}
