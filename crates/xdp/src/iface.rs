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

/// Look up an interface by name (once per name inside [`one_read`]).
pub fn lookup(name: &str) -> io::Result<IfaceInfo> {
    let known = SNAPSHOT.with(|s| {
        s.borrow()
            .as_ref()
            .and_then(|s| s.ifaces.iter().find(|i| i.name == name).cloned())
    });
    if let Some(i) = known {
        return Ok(i);
    }
    let i = read_iface(name)?;
    SNAPSHOT.with(|s| {
        if let Some(s) = s.borrow_mut().as_mut() {
            s.ifaces.push(i.clone());
        }
    });
    Ok(i)
}

fn read_iface(name: &str) -> io::Result<IfaceInfo> {
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

/// One interface's IPv4 address and netmask, as getifaddrs(3) gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub addr: Ipv4Addr,
    pub netmask: Ipv4Addr,
}

/// Inside [`one_read`]: the answers read so far on this thread (`None`:
/// outside, every call asks the kernel).
#[derive(Default)]
struct Snapshot {
    addrs: Option<std::rc::Rc<Vec<IfAddr>>>,
    ifaces: Vec<IfaceInfo>,
}

thread_local! {
    static SNAPSHOT: std::cell::RefCell<Option<Snapshot>> = const { std::cell::RefCell::new(None) };
}

/// Run `f` with the interface facts read from the kernel at most once on
/// this thread: the address list ([`ipv4_ifaddrs`], [`ipv4_addrs`],
/// [`iface_for_addr`]) and each interface's [`lookup`]. getifaddrs(3) is
/// two netlink dumps (links and addresses) over a socket of its own (nine
/// system calls); an engine's open asked it five times on the way to its
/// first socket (docs/benchmarks.md, "Session 13: churn and engine
/// start"). Facts change only by an administrator's hand, and whatever
/// changes during an open is what a route or neighbour event tells the
/// open engine next. Nested calls share the outermost one's answers.
pub fn one_read<R>(f: impl FnOnce() -> R) -> R {
    struct Scope(bool);
    impl Drop for Scope {
        fn drop(&mut self) {
            if self.0 {
                SNAPSHOT.with(|s| s.borrow_mut().take());
            }
        }
    }
    let outer = SNAPSHOT.with(|s| {
        let mut s = s.borrow_mut();
        let outer = s.is_none();
        if outer {
            *s = Some(Snapshot::default());
        }
        outer
    });
    let _scope = Scope(outer);
    f()
}

/// Every interface's IPv4 addresses with netmasks, from getifaddrs(3)
/// (once inside [`one_read`]).
pub fn ipv4_ifaddrs() -> io::Result<std::rc::Rc<Vec<IfAddr>>> {
    if let Some(a) = SNAPSHOT.with(|s| s.borrow().as_ref().and_then(|s| s.addrs.clone())) {
        return Ok(a);
    }
    let a = std::rc::Rc::new(read_ifaddrs()?);
    SNAPSHOT.with(|s| {
        if let Some(s) = s.borrow_mut().as_mut() {
            s.addrs = Some(a.clone());
        }
    });
    Ok(a)
}

/// All (interface, IPv4 address) pairs, from getifaddrs(3) (once inside
/// [`one_read`]).
pub fn ipv4_addrs() -> io::Result<Vec<(String, Ipv4Addr)>> {
    Ok(ipv4_ifaddrs()?
        .iter()
        .map(|a| (a.name.clone(), a.addr))
        .collect())
}

/// The IPv4 addresses of interface `ifname` (none when getifaddrs(3)
/// fails: the caller then knows no address of its own).
pub fn ipv4_addrs_of(ifname: &str) -> Vec<Ipv4Addr> {
    ipv4_addrs()
        .unwrap_or_default()
        .into_iter()
        .filter(|(n, _)| n == ifname)
        .map(|(_, a)| a)
        .collect()
}

fn read_ifaddrs() -> io::Result<Vec<IfAddr>> {
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
                let netmask = if ifa.ifa_netmask.is_null() {
                    Ipv4Addr::BROADCAST
                } else {
                    // SAFETY: an AF_INET address's netmask is a sockaddr_in.
                    let m = unsafe { &*(ifa.ifa_netmask as *const libc::sockaddr_in) };
                    Ipv4Addr::from(u32::from_be(m.sin_addr.s_addr))
                };
                // SAFETY: ifa_name is a NUL-terminated string owned by the list.
                let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
                    .to_string_lossy()
                    .into_owned();
                out.push(IfAddr {
                    name,
                    addr: Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                    netmask,
                });
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

    /// Inside one_read the kernel is asked once; outside, every time
    /// (the answers are the same either way).
    #[test]
    fn one_read_answers_from_one_look() {
        let fresh = ipv4_addrs().unwrap();
        let lo = lookup("lo").unwrap();
        one_read(|| {
            let a = ipv4_ifaddrs().unwrap();
            let b = ipv4_ifaddrs().unwrap();
            assert!(std::rc::Rc::ptr_eq(&a, &b));
            assert_eq!(ipv4_addrs().unwrap(), fresh);
            // Nested: the same answers.
            one_read(|| assert!(std::rc::Rc::ptr_eq(&ipv4_ifaddrs().unwrap(), &a)));
            assert_eq!(lookup("lo").unwrap(), lo);
            assert!(SNAPSHOT.with(|s| s.borrow().as_ref().unwrap().ifaces.len()) == 1);
            assert!(lookup("nw-nonexist0").is_err());
        });
        assert!(SNAPSHOT.with(|s| s.borrow().is_none()));
        let lo_a = ipv4_ifaddrs()
            .unwrap()
            .iter()
            .find(|a| a.name == "lo")
            .cloned()
            .unwrap();
        assert_eq!(lo_a.netmask, Ipv4Addr::new(255, 0, 0, 0));
    }

    #[test]
    fn unknown_interface_is_an_error() {
        assert!(lookup("nw-nonexist0").is_err());
        assert!(lookup("").is_err());
    }
}
