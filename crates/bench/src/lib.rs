//! `nanowire bench`: a sockperf-compatible latency and throughput benchmark.
pub mod burst;
pub mod cli;
