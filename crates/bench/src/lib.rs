//! `nanowire bench`: a sockperf-compatible latency and throughput benchmark.
//!
//! Use it from the command line (`nanowire bench server|pp|ul|tp`) or as a
//! library: [`run_client`] runs one client measurement and returns a
//! [`BenchResult`] (serialisable to the same JSON `--json` prints);
//! [`start_server`] serves on a thread until the returned [`ServerHandle`]
//! is stopped or dropped, and reports per-client counters.
#![forbid(unsafe_code)]

pub mod burst;
pub mod cli;
pub mod client;
pub mod env;
pub mod le;
pub mod result;
pub mod seq;
pub mod server;
pub mod trade;
mod transport;

pub use client::{ClientConfig, Mode, Protocol, Rate, resolve, run_client};
pub use env::Env;
pub use result::{Accounting, BenchResult, Latency};
pub use server::{
    BoundServer, ClientStats, ServerConfig, ServerHandle, ServerStats, bind_server, run_server,
    start_server,
};
pub use transport::MAX_TCP_MSG;
