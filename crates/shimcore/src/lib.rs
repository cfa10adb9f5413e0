//! The preload shim's core, as plain library code with unit tests.
//!
//! The shim (`crates/preload`, a cdylib) cannot have a unit-test harness:
//! a test binary built from it would interpose its own calls. So what can
//! be tested without interposing anything lives here:
//!
//! * [`fdtable`]: the fd table, one atomic word per fd (class, flags, a
//!   generation that `close`/`dup2`/`shutdown` bump, the count of threads
//!   spinning on it), and per-fd tables of records (the engine sockets),
//!   all in lazily allocated chunks indexed by the fd number: a lookup is
//!   two loads and no lock;
//! * [`pool`]: type-stable storage of those records (a lock-free free
//!   list per type: a closed socket's record is reused, never freed, and
//!   its generation tells a late reader that it is gone);
//! * [`sock`]: the per-fd state every engine socket record shares,
//!   whatever its protocol (blocking mode, timeouts, shutdown, references,
//!   owner process);
//! * [`waiter`]: the one waiter: the adaptive spin policy
//!   ([`waiter::Spin`]) and the loop that every blocking call of the shim
//!   runs ([`waiter::Waiter`]: EINTR, the caller's timeout, EBADF when
//!   another thread closed the fd, spin, then sleep in bounded slices).
//!
//! The ABI rules (iovec, sockaddr, msghdr, cmsg as safe functions over
//! numbers and byte slices) are in `nanowire-sockabi`, beside this crate.
//! Neither crate makes a system call of its own except `sched_yield`
//! (through `std::thread::yield_now`) and what the caller's [`waiter::Host`]
//! does.

pub mod fdtable;
pub mod pool;
pub mod sock;
pub mod waiter;
