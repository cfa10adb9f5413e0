//! The socket system-call ABI as the Linux kernel checks it, as safe
//! functions over plain numbers and byte slices.
//!
//! The preload shim (`crates/preload`) serves socket calls from its own
//! engine, so it must refuse what the kernel refuses, with the kernel's
//! errno, *before* it touches the caller's memory: an iovec count above
//! `UIO_MAXIOV`, a negative length, a range outside user space, a buffer
//! that is not mapped with the access the copy needs. Everything here is
//! decided from numbers (addresses as `usize`) and byte slices the shim
//! has already made safe to read, so it is unit-tested and fuzzed without
//! a process to break. The shim keeps only the raw-pointer reads and the
//! copies, each after these checks said yes.
//!
//! * [`iov`]: iovec counts, lengths, totals ([`iov::import`]) and the
//!   scatter plan of a datagram over iovecs;
//! * [`space`]: which address ranges can be user memory at all
//!   ([`space::UserSpace`]) and the mappings of `/proc/self/maps`
//!   ([`space::Maps`]) that say whether a range is readable/writable;
//! * [`addr`]: `sockaddr` parsing and the kernel's truncating write-back;
//! * [`cmsg`]: control-message walking (sendmsg) and writing with
//!   `put_cmsg`'s truncation rules (recvmsg);
//! * [`procnet`]: the socket tables of `/proc/net/{tcp,udp}{,6}`.
#![forbid(unsafe_code)]

pub mod addr;
pub mod cmsg;
pub mod iov;
pub mod procnet;
pub mod space;

/// An errno value (`libc::E*`).
pub type Errno = i32;
