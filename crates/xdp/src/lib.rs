//! nanowire-xdp: the AF_XDP plumbing under the xdp engine.
//!
//! * [`program`]: the steering XDP program (bpf/steer.c, built by build.rs),
//!   loaded with aya and attached through a BPF link owned by this process,
//!   so it disappears with the process, even after SIGKILL.
//! * [`xsk`]: AF_XDP sockets, split into a receive half ([`XskRx`]: fill
//!   and RX rings, owned [`RxFrame`]s) and a transmit half ([`XskTx`]: TX
//!   and completion rings, TX frame pool). The rings are private.
//! * [`umem`]: the packet memory and the owned, refcounted [`RxFrame`].
//! * [`shared`]: a UMEM shared by several processes on one queue (the
//!   engine service's half, and the layout; the process's half is
//!   [`XskSocket::attach_shared`]).
//! * [`privilege`]: the one capability probe (engine and `nanowire run`).
//! * [`netlink`]: routes and neighbours from the kernel (rtnetlink).
//! * [`iface`]: interface index, MAC, MTU and queue count from the kernel.
//!
//! Every `unsafe` block carries a `// SAFETY:` comment.

mod ctl;
pub mod iface;
mod load;
mod mmap;
pub mod netlink;
pub mod prestart;
pub mod privilege;
pub mod program;
mod ring;
pub mod seats;
pub mod shared;
mod sock;
pub mod sys;
pub mod umem;
pub mod xsk;

pub use program::{AttachMode, DropProgram, Frags, SteerProgram};
pub use umem::{Recycler, RxFrame, UmemArea, UmemInfo};
pub use xsk::{CsumRequest, RxPeek, XskConfig, XskRx, XskSocket, XskStats, XskTx};

/// The compiled steering program (bpf/steer.c; built by this crate's
/// build.rs with every other BPF program of the workspace).
pub fn steer_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o"))
}

/// The compiled dedicated-capture program (bpf/capture.c), used by
/// `nanowire-capture`.
pub fn capture_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/capture.o"))
}
