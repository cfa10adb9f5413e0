//! `sockaddr_in` to and from `SocketAddrV4`, for the syscalls both
//! engines make (the kernel engine's, the xdp engine's kernel twins) and
//! the preload shim's own calls.

use std::net::{Ipv4Addr, SocketAddrV4};

/// `a` as the kernel takes it (network byte order).
#[inline]
pub fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// The address the kernel wrote.
#[inline]
pub fn from_sockaddr_in(s: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
        u16::from_be(s.sin_port),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_network_byte_order() {
        let a = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 11111);
        let s = sockaddr_in(a);
        assert_eq!(s.sin_port, 11111u16.to_be());
        assert_eq!(s.sin_addr.s_addr.to_ne_bytes(), [198, 18, 0, 2]);
        assert_eq!(from_sockaddr_in(&s), a);
    }
}
