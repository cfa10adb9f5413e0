//! The one privilege probe of nanowire: can this process open AF_XDP
//! sockets and attach XDP programs? Answered from the effective capability
//! set (`CapEff` in `/proc/self/status`), by capability name, without
//! trying. Used by the xdp engine and by `nanowire run`.

/// A Linux capability the xdp engine needs (bit numbers from
/// linux/capability.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    NetAdmin,
    NetRaw,
    SysAdmin,
    Bpf,
}

impl Cap {
    pub const fn bit(self) -> u32 {
        match self {
            Cap::NetAdmin => 12,
            Cap::NetRaw => 13,
            Cap::SysAdmin => 21,
            Cap::Bpf => 39,
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            Cap::NetAdmin => "CAP_NET_ADMIN",
            Cap::NetRaw => "CAP_NET_RAW",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::Bpf => "CAP_BPF",
        }
    }
    pub fn is_in(self, eff: u64) -> bool {
        eff & (1u64 << self.bit()) != 0
    }
}

/// Parse the `CapEff:` line of a `/proc/<pid>/status` text.
pub fn cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// `Ok(())` when the effective capabilities allow AF_XDP sockets
/// (CAP_NET_RAW), XDP attachment (CAP_NET_ADMIN) and loading BPF programs
/// (CAP_BPF, or CAP_SYS_ADMIN on kernels before 5.8 or as its superset);
/// otherwise the one-line reason naming what is missing.
pub fn check_caps(eff: u64) -> Result<(), String> {
    let mut missing = Vec::new();
    for c in [Cap::NetAdmin, Cap::NetRaw] {
        if !c.is_in(eff) {
            missing.push(c.name());
        }
    }
    if !Cap::Bpf.is_in(eff) && !Cap::SysAdmin.is_in(eff) {
        missing.push("CAP_BPF (or CAP_SYS_ADMIN)");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "no privilege for AF_XDP/XDP (missing {}; run as root or grant them)",
            missing.join(", ")
        ))
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
    fn named_capabilities() {
        let root = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        assert_eq!(check_caps(cap_eff(root).unwrap()), Ok(()));
        let nobody = "CapEff:\t0000000000000000\n";
        let e = check_caps(cap_eff(nobody).unwrap()).unwrap_err();
        assert!(
            e.contains("CAP_NET_ADMIN") && e.contains("CAP_NET_RAW") && e.contains("CAP_BPF"),
            "{e}"
        );
        // CAP_SYS_ADMIN stands in for CAP_BPF.
        let sys = (1u64 << 12) | (1 << 13) | (1 << 21);
        assert_eq!(check_caps(sys), Ok(()));
        let bpf = (1u64 << 12) | (1 << 13) | (1 << 39);
        assert_eq!(check_caps(bpf), Ok(()));
        assert!(check_caps(1 << 39).unwrap_err().contains("CAP_NET_RAW"));
        assert_eq!(cap_eff("nothing"), None);
    }
}
