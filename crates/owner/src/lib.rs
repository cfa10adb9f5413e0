//! The owned lock ([`lock`]): a mutex that the one thread using it takes
//! with plain stores and loads, revoked for good (with a process-wide
//! memory barrier) when another thread takes it; and the process side it
//! needs ([`process`]: each thread's token, the `membarrier` registration
//! and barrier, the fork rules).
//!
//! Both the preload shim (its per-socket record lock and close guard) and
//! the engine (`nanowire-stack`: its RX and TX locks) use it, so it lives
//! below both (issue 22: docs/architecture.md "The single-owner fast path").

pub mod lock;
pub mod process;
pub mod tls;

pub use lock::{Guard, Inside, OwnedLock, OwnerHost, SHARED, UNOWNED, hammer};
pub use process::Process;
