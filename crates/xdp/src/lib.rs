//! nanowire-xdp: the AF_XDP plumbing under the xdp engine.
//!
//! * [`program`]: the steering XDP program (bpf/steer.c, built by build.rs),
//!   loaded with aya and attached through a BPF link owned by this process,
//!   so it disappears with the process, even after SIGKILL.
//! * [`xsk`]: UMEM, fill/completion/RX/TX rings and AF_XDP sockets.
//! * [`netlink`]: routes and neighbours from the kernel (rtnetlink).
//! * [`iface`]: interface index, MAC, MTU and queue count from the kernel.
//!
//! Every `unsafe` block carries a `// SAFETY:` comment.

pub mod iface;
pub mod netlink;
pub mod program;
pub mod xsk;

pub use program::{AttachMode, SteerProgram};
pub use xsk::{XskConfig, XskSocket, XskStats};

/// The compiled steering program.
pub fn steer_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o"))
}
