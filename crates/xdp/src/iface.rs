//! Interface facts from the kernel: index, MAC, MTU, addresses, queues.

use std::ffi::{CStr, CString};
use std::io;
use std::net::Ipv4Addr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfaceInfo {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// Primary IPv4 address, if any.
    pub addr: Option<Ipv4Addr>,
    /// RX queues (one AF_XDP socket each).
    pub rx_queues: u32,
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    // SAFETY: ifreq is a plain C struct for which all-zero bytes are valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

fn ioctl_sock() -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly created descriptor we own.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Look up an interface by name.
pub fn lookup(name: &str) -> io::Result<IfaceInfo> {
    use std::os::fd::AsRawFd;
    let cname = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has NUL"))?;
    // SAFETY: cname is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("unknown interface {name:?}"),
        ));
    }
    let sock = ioctl_sock()?;
    let mut req = ifreq_for(name)?;
    // SAFETY: SIOCGIFHWADDR fills ifr_hwaddr of the ifreq we pass by pointer.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut mac = [0u8; 6];
    // SAFETY: after SIOCGIFHWADDR the ifru_hwaddr member is the active one.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    let mut req = ifreq_for(name)?;
    // SAFETY: SIOCGIFMTU fills ifru_mtu of the ifreq we pass by pointer.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFMTU the ifru_mtu member is the active one.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu } as u32;
    let addr = ipv4_addrs()?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, a)| a);
    Ok(IfaceInfo {
        name: name.to_string(),
        index,
        mac,
        mtu,
        addr,
        rx_queues: rx_queue_count(name),
    })
}

/// RX queues: from the driver (ETHTOOL_GCHANNELS, right in any network
/// namespace), else /sys/class/net/IF/queues, else 1.
pub fn rx_queue_count(name: &str) -> u32 {
    channels(name)
        .filter(|&n| n > 0)
        .unwrap_or_else(|| sys_rx_queue_count(name))
}

/// rx + combined channels in use, per ETHTOOL_GCHANNELS.
fn channels(name: &str) -> Option<u32> {
    use std::os::fd::AsRawFd;
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    // cmd, max_rx, max_tx, max_other, max_combined, rx, tx, other, combined
    let mut ch = [0u32; 9];
    ch[0] = ETHTOOL_GCHANNELS;
    let sock = ioctl_sock().ok()?;
    let mut req = ifreq_for(name).ok()?;
    req.ifr_ifru.ifru_data = ch.as_mut_ptr().cast();
    // SAFETY: SIOCETHTOOL reads the command from and writes the answer to
    // `ch` (9 u32, the size of struct ethtool_channels), which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) } < 0 {
        return None;
    }
    Some(ch[5] + ch[8])
}

/// The interface's driver name (ETHTOOL_GDRVINFO), e.g. "veth", "ice", "mlx5_core".
pub fn driver(name: &str) -> Option<String> {
    use std::os::fd::AsRawFd;
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    // struct ethtool_drvinfo: cmd u32, driver[32], version[32], fw_version[32],
    // bus_info[32], erom_version[32], reserved2[12], 5 x u32 = 196 bytes.
    let mut info = [0u8; 196];
    info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    let sock = ioctl_sock().ok()?;
    let mut req = ifreq_for(name).ok()?;
    req.ifr_ifru.ifru_data = info.as_mut_ptr().cast();
    // SAFETY: SIOCETHTOOL reads the command from and writes struct
    // ethtool_drvinfo (196 bytes) into `info`, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) } < 0 {
        return None;
    }
    let d = &info[4..36];
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    Some(String::from_utf8_lossy(&d[..end]).into_owned())
}

fn sys_rx_queue_count(name: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32
        })
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

/// All (interface, IPv4 address) pairs, from getifaddrs(3).
pub fn ipv4_addrs() -> io::Result<Vec<(String, Ipv4Addr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of at least sa_family size.
            let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if fam == libc::AF_INET {
                // SAFETY: family AF_INET means the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                // SAFETY: ifa_name is a NUL-terminated string owned by the list.
                let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
                    .to_string_lossy()
                    .into_owned();
                out.push((name, Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The interface that owns `addr`, or for an unspecified address the only
/// non-loopback interface with an IPv4 address.
pub fn iface_for_addr(addr: Ipv4Addr) -> Result<String, String> {
    let all = ipv4_addrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
    if !addr.is_unspecified() && !addr.is_multicast() {
        return all
            .into_iter()
            .find(|(_, a)| *a == addr)
            .map(|(n, _)| n)
            .ok_or_else(|| {
                format!("no interface has address {addr}; pass the interface explicitly")
            });
    }
    let cands: Vec<_> = all.into_iter().filter(|(_, a)| !a.is_loopback()).collect();
    match cands.as_slice() {
        [(n, _)] => Ok(n.clone()),
        [] => Err("no non-loopback IPv4 interface for the xdp engine".into()),
        _ => Err(format!(
            "several IPv4 interfaces ({}); choose one for the xdp engine (iface option)",
            cands
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found() {
        let lo = lookup("lo").unwrap();
        assert!(lo.index > 0);
        assert_eq!(lo.addr, Some(Ipv4Addr::LOCALHOST));
        assert!(lo.mtu > 0);
    }

    #[test]
    fn unknown_interface_is_an_error() {
        assert!(lookup("nw-nonexist0").is_err());
        assert!(lookup("").is_err());
    }
}
