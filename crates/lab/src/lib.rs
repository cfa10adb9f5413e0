//! The nanowire lab: a virtual two-host testbed built from network
//! namespaces and a veth pair (`testbed`), and the seed-suite report that runs
//! on it (`report`, issue 5).
#![forbid(unsafe_code)]

pub mod cli;
pub mod report;
pub mod testbed;
pub mod tmp;

pub use testbed::{Host, Lab, LabOptions, LabStatus};
