//! `nanowire run [--profile NAME] [--engine xdp|spin|kernel] -- CMD ARGS...`
//!
//! This crate holds everything about drop-in acceleration that is plain,
//! safe Rust: the one declarative table of tuning options and the named
//! profiles ([`options`]), the privilege probe that explains why the xdp
//! engine cannot be used ([`privilege`]), and the launcher ([`cli`]) that
//! finds `libnanowire_preload.so`, sets `LD_PRELOAD` and the `NANOWIRE_*`
//! variables and execs the command.
//!
//! The shim itself lives in `crates/preload` (a cdylib). It is a separate
//! package on purpose: its `#[no_mangle]` `socket`, `recvfrom`, ... must
//! never be linked into the `nanowire` binary, where they would interpose
//! the binary's own calls. The shim depends on this crate to parse the same
//! table from the environment.
#![forbid(unsafe_code)]

pub mod cli;
pub mod options;
pub mod privilege;
