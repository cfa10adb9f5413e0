//! Can this process use AF_XDP and attach XDP programs? The one probe,
//! by named capabilities, lives in `nanowire_xdp::privilege` (the engine
//! uses the same); this module keeps the launcher's names for it.

pub use nanowire_xdp::privilege::{Cap, cap_eff, check_caps};

/// Check this process.
pub fn check() -> Result<(), String> {
    nanowire_xdp::privilege::check()
}
