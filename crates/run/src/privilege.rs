//! Can this process use AF_XDP and attach XDP programs? The one probe,
//! by named capabilities, lives in `nanowire_xdp::privilege` (the engine
//! uses the same); this module keeps the launcher's names for it.

pub use nanowire_xdp::privilege::{Cap, cap_eff, check_caps};

/// Check this process.
pub fn check() -> Result<(), String> {
    nanowire_xdp::privilege::check()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_caps_pass_and_nobody_fails_with_reason() {
        let root = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        assert_eq!(check_caps(cap_eff(root).unwrap()), Ok(()));
        let nobody = "CapEff:\t0000000000000000\n";
        let e = check_caps(cap_eff(nobody).unwrap()).unwrap_err();
        assert!(e.contains("CAP_NET_ADMIN") && e.contains("CAP_BPF"), "{e}");
        assert_eq!(cap_eff("nothing"), None);
    }
}
