//! Can this process use AF_XDP and attach XDP programs? Answered from the
//! effective capability set in `/proc/self/status`, without trying.

/// Capability bits (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// Parse the `CapEff:` line of a `/proc/<pid>/status` text.
pub fn cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// `Ok(())` when the effective capabilities allow AF_XDP sockets and XDP
/// attachment (CAP_NET_ADMIN + CAP_NET_RAW + CAP_BPF or CAP_SYS_ADMIN);
/// otherwise the one-line reason.
pub fn check_caps(eff: u64) -> Result<(), String> {
    let has = |c: u32| eff & (1u64 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(CAP_NET_RAW) {
        missing.push("CAP_NET_RAW");
    }
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("no privilege (missing {})", missing.join(", ")))
    }
}

/// Check this process.
pub fn check() -> Result<(), String> {
    match std::fs::read_to_string("/proc/self/status") {
        Ok(s) => match cap_eff(&s) {
            Some(eff) => check_caps(eff),
            None => Err("no privilege (cannot read CapEff from /proc/self/status)".into()),
        },
        Err(e) => Err(format!("no privilege (cannot read /proc/self/status: {e})")),
    }
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
