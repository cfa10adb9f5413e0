//! `sockaddr` bytes as the kernel reads and writes them.

use crate::Errno;
use std::net::{Ipv4Addr, SocketAddrV4};

/// `sizeof(struct sockaddr_in)`.
pub const SOCKADDR_IN_LEN: usize = 16;
/// `sizeof(struct sockaddr_storage)`: the most the kernel copies in.
pub const SOCKADDR_STORAGE_LEN: usize = 128;

/// The family field (host byte order, first two bytes).
#[inline]
pub fn family(bytes: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(..2)?.try_into().ok()?))
}

/// `move_addr_to_kernel`'s length check (`addr_len` as the caller's
/// signed `socklen_t`): negative or above `sockaddr_storage` is EINVAL.
#[inline]
pub fn check_len(len: u32) -> Result<usize, Errno> {
    let l = len as i32;
    if l < 0 || l as usize > SOCKADDR_STORAGE_LEN {
        return Err(libc::EINVAL);
    }
    Ok(l as usize)
}

/// The address and port of a `sockaddr_in` (no checks: 16 bytes given).
#[inline]
fn inet(bytes: &[u8]) -> SocketAddrV4 {
    let port = u16::from_be_bytes([bytes[2], bytes[3]]);
    let ip = Ipv4Addr::new(bytes[4], bytes[5], bytes[6], bytes[7]);
    SocketAddrV4::new(ip, port)
}

/// A UDP destination (`udp_sendmsg`): shorter than `sockaddr_in` is
/// EINVAL, a family other than AF_INET or AF_UNSPEC is EAFNOSUPPORT.
#[inline]
pub fn udp_dest(bytes: &[u8]) -> Result<SocketAddrV4, Errno> {
    if bytes.len() < SOCKADDR_IN_LEN {
        return Err(libc::EINVAL);
    }
    match family(bytes).map(i32::from) {
        Some(libc::AF_INET) | Some(libc::AF_UNSPEC) => Ok(inet(bytes)),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// An AF_INET address for bind/connect as the shim's engine reads it:
/// too short for the family field is EINVAL, another family is
/// EAFNOSUPPORT, too short for `sockaddr_in` is EINVAL.
#[inline]
pub fn inet_addr(bytes: &[u8]) -> Result<SocketAddrV4, Errno> {
    let fam = family(bytes).ok_or(libc::EINVAL)?;
    if i32::from(fam) != libc::AF_INET {
        return Err(libc::EAFNOSUPPORT);
    }
    if bytes.len() < SOCKADDR_IN_LEN {
        return Err(libc::EINVAL);
    }
    Ok(inet(bytes))
}

/// `sockaddr_in` bytes for `sa`.
#[inline]
pub fn encode_inet(sa: SocketAddrV4) -> [u8; SOCKADDR_IN_LEN] {
    let mut b = [0u8; SOCKADDR_IN_LEN];
    b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    b[2..4].copy_from_slice(&sa.port().to_be_bytes());
    b[4..8].copy_from_slice(&sa.ip().octets());
    b
}

/// `move_addr_to_user`: given the caller's buffer length (`*addrlen`,
/// signed) and the address's full length, how many bytes to copy and
/// what to store back in `*addrlen` (the full length: the caller learns
/// it was truncated). A negative length is EINVAL.
#[inline]
pub fn writeback(cap: u32, full: usize) -> Result<(usize, u32), Errno> {
    let c = cap as i32;
    if c < 0 {
        return Err(libc::EINVAL);
    }
    Ok(((c as usize).min(full), full as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sin(fam: i32, port: u16, ip: [u8; 4]) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        b[..2].copy_from_slice(&(fam as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[4..8].copy_from_slice(&ip);
        b
    }

    #[test]
    fn udp_dest_follows_udp_sendmsg() {
        let a = sin(libc::AF_INET, 9, [198, 18, 0, 2]);
        assert_eq!(udp_dest(&a), Ok("198.18.0.2:9".parse().unwrap()));
        assert_eq!(udp_dest(&a[..15]), Err(libc::EINVAL));
        // Length before family, as the kernel checks.
        assert_eq!(udp_dest(&[0u8; 4]), Err(libc::EINVAL));
        assert_eq!(
            udp_dest(&sin(libc::AF_INET6, 9, [0; 4])),
            Err(libc::EAFNOSUPPORT)
        );
        assert!(udp_dest(&sin(libc::AF_UNSPEC, 9, [1, 2, 3, 4])).is_ok());
    }

    #[test]
    fn inet_addr_checks_family_then_length() {
        assert_eq!(inet_addr(&[]), Err(libc::EINVAL));
        let v6 = sin(libc::AF_INET6, 1, [0; 4]);
        assert_eq!(inet_addr(&v6[..8]), Err(libc::EAFNOSUPPORT));
        let v4 = sin(libc::AF_INET, 80, [10, 0, 0, 1]);
        assert_eq!(inet_addr(&v4[..8]), Err(libc::EINVAL));
        assert_eq!(inet_addr(&v4), Ok("10.0.0.1:80".parse().unwrap()));
    }

    #[test]
    fn encode_round_trips() {
        let sa: SocketAddrV4 = "203.0.113.7:65535".parse().unwrap();
        assert_eq!(inet_addr(&encode_inet(sa)), Ok(sa));
    }

    #[test]
    fn lengths_as_the_kernel_takes_them() {
        assert_eq!(check_len(16), Ok(16));
        assert_eq!(check_len(128), Ok(128));
        assert_eq!(check_len(129), Err(libc::EINVAL));
        assert_eq!(check_len(u32::MAX), Err(libc::EINVAL));
        assert_eq!(writeback(4, 16), Ok((4, 16)));
        assert_eq!(writeback(100, 16), Ok((16, 16)));
        assert_eq!(writeback(u32::MAX, 16), Err(libc::EINVAL));
    }

    #[test]
    fn family_needs_two_bytes() {
        assert_eq!(family(&[]), None);
        assert_eq!(family(&[2]), None);
        assert_eq!(
            family(&(libc::AF_INET as u16).to_ne_bytes()),
            Some(libc::AF_INET as u16)
        );
    }
}
