//! `nanowire run [--profile NAME] [--engine xdp|spin|kernel] -- CMD ARGS...`
//!
//! This crate holds the launcher side of drop-in acceleration, plain safe
//! Rust: the one declarative table of tuning options and the named profiles
//! ([`options`], re-exported from `nanowire-options` with its JSON form
//! added), the privilege probe that explains why the xdp
//! engine cannot be used ([`privilege`]), and the launcher ([`cli`]) that
//! finds `libnanowire_preload.so`, sets `LD_PRELOAD` and the `NANOWIRE_*`
//! variables and execs the command.
//!
//! The shim itself lives in `crates/preload` (a cdylib). It is a separate
//! package on purpose: its `#[no_mangle]` `socket`, `recvfrom`, ... must
//! never be linked into the `nanowire` binary, where they would interpose
//! the binary's own calls. The shim reads the same table from the
//! environment through `nanowire-options`, without this crate (or clap).
#![forbid(unsafe_code)]

pub mod cli;
pub mod options;
pub mod privilege;
