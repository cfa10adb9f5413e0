//! The engine service (issue 23): one engine per interface for the whole
//! network namespace. `server` is the root service, `client` the attached
//! process's side, `proto` the control protocol. The data path stays in the
//! processes (each has its own AF_XDP socket on a shared UMEM,
//! nanowire_xdp::shared); the service owns the program, the claims, the
//! UMEM and the fill/completion rings' recovery. docs/architecture.md,
//! "The engine service".

pub mod client;
pub mod conns;
pub mod policy;
pub mod proto;
pub mod server;
pub mod warden;
