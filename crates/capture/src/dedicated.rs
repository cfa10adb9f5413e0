//! Dedicated capture (`nanowire capture --xdp`): lands with the owned-frame
//! crates/xdp API (engine rewrite); see docs/architecture.md.

use crate::cli::CaptureArgs;
use crate::filter::Filter;

pub fn run(_a: &CaptureArgs, _filter: Filter) -> Result<i32, String> {
    Err("dedicated capture (--xdp) is not in this build yet".into())
}
