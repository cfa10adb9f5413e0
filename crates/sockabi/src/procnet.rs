//! The kernel's socket tables as `/proc/net/{tcp,udp}{,6}` print them
//! (`/proc/PID/net/...` alike), read from bytes: one parser for the shim's
//! shared-port watcher (its fallback when sock_diag is refused) and for
//! `nanowire stats` (the sockets several processes hold).
//!
//! A line is `sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...`;
//! an address is the address as the kernel holds it (network order)
//! printed as native-endian 32-bit words in hex (IPv4: one word, 8
//! digits; IPv6: four, 32 digits), ':', the port in hex. A line that is
//! not such a line (the header, a cut or garbled one) gives `None`,
//! never a panic.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// One socket of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The state number (`TCP_ESTABLISHED` 1 .. `TCP_LISTEN` 10; UDP: 7
    /// unconnected, 1 connected).
    pub state: u8,
    pub inode: u64,
}

/// The sockets of a whole table (the header and bad lines skipped).
pub fn table(text: &[u8]) -> impl Iterator<Item = Entry> + '_ {
    text.split(|&b| b == b'\n').filter_map(line)
}

/// One line of a table; `None` for the header or anything malformed.
pub fn line(l: &[u8]) -> Option<Entry> {
    let mut f = l.split(u8::is_ascii_whitespace).filter(|w| !w.is_empty());
    let _slot = f.next()?;
    let local = addr(f.next()?)?;
    let remote = addr(f.next()?)?;
    let state = u8::try_from(hex(f.next()?, 2)?).ok()?;
    // tx:rx, tr:when, retrnsmt, uid, timeout, then the inode.
    let inode = decimal(f.nth(5)?)?;
    Some(Entry {
        local,
        remote,
        state,
        inode,
    })
}

/// `ADDR:PORT` as the tables print it.
pub fn addr(s: &[u8]) -> Option<SocketAddr> {
    let colon = s.iter().position(|&b| b == b':')?;
    let (ip, port) = (&s[..colon], &s[colon + 1..]);
    let port = u16::try_from(hex(port, 4)?).ok()?;
    let word = |i: usize| hex(ip.get(i * 8..i * 8 + 8)?, 8).map(u32::to_ne_bytes);
    match ip.len() {
        8 => Some(SocketAddrV4::new(Ipv4Addr::from(word(0)?), port).into()),
        32 => {
            let mut b = [0u8; 16];
            for (i, chunk) in b.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            Some(SocketAddrV6::new(Ipv6Addr::from(b), port, 0, 0).into())
        }
        _ => None,
    }
}

/// At most `digits` hex digits (at least one), nothing else.
fn hex(s: &[u8], digits: usize) -> Option<u32> {
    if s.is_empty() || s.len() > digits {
        return None;
    }
    s.iter()
        .try_fold(0u32, |v, &c| Some(v << 4 | char::from(c).to_digit(16)?))
}

/// Decimal digits only (no sign), within u64.
fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |v, &c| {
        v.checked_mul(10)?
            .checked_add(u64::from(char::from(c).to_digit(10)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address words as this machine's kernel prints them.
    fn le(little: &'static str, big: &'static str) -> &'static str {
        if cfg!(target_endian = "little") {
            little
        } else {
            big
        }
    }

    #[test]
    fn ipv4_addresses_read_as_the_kernel_prints_them() {
        let a = addr(le("020012C6:1F90", "C6120002:1F90").as_bytes());
        assert_eq!(a, Some("198.18.0.2:8080".parse().unwrap()));
        assert_eq!(addr(b"00000000:0000"), Some("0.0.0.0:0".parse().unwrap()));
    }

    #[test]
    fn ipv6_addresses_read_word_by_word() {
        let mapped = le(
            "0000000000000000FFFF0000020012C6:0035",
            "00000000000000000000FFFFC6120002:0035",
        );
        assert_eq!(
            addr(mapped.as_bytes()),
            Some("[::ffff:198.18.0.2]:53".parse().unwrap())
        );
        let any = "00000000000000000000000000000000:1F90";
        assert_eq!(addr(any.as_bytes()), Some("[::]:8080".parse().unwrap()));
    }

    #[test]
    fn a_table_gives_its_sockets_and_skips_the_header() {
        let t = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             \x20  0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 597 1 0000000000000000 100 0 0 10 0\n\
             \x20  1: {} {} 01 00000000:00000000 00:00000000 00000000     0        0 41234 1 0000000000000000 20 4 30 10 -1\n",
            le("020012C6:1F90", "C6120002:1F90"),
            le("010012C6:D431", "C6120001:D431"),
        );
        let v: Vec<Entry> = table(t.as_bytes()).collect();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].local, "0.0.0.0:2024".parse().unwrap());
        assert_eq!((v[0].state, v[0].inode), (10, 597));
        assert_eq!(v[1].local, "198.18.0.2:8080".parse().unwrap());
        assert_eq!(v[1].remote, "198.18.0.1:54321".parse().unwrap());
        assert_eq!((v[1].state, v[1].inode), (1, 41234));
    }

    #[test]
    fn the_kernels_own_table_names_a_listener_by_its_inode() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let me = l.local_addr().unwrap();
        let fd = format!("/proc/self/fd/{}", l.as_raw_fd());
        let ino = std::fs::metadata(fd).unwrap().ino();
        let t = std::fs::read("/proc/self/net/tcp").unwrap();
        let lines = t.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
        let all: Vec<Entry> = table(&t).collect();
        assert_eq!(all.len(), lines - 1, "every line but the header");
        let e = all.iter().find(|e| e.inode == ino).unwrap();
        assert_eq!((e.local, e.state), (me, 10));
        assert_eq!(e.remote, "0.0.0.0:0".parse().unwrap());
    }

    #[test]
    fn bad_lines_give_none() {
        let good = "0: 00000000:07E8 00000000:0000 0A 0:0 0:0 0 0 0 597";
        assert!(line(good.as_bytes()).is_some());
        for bad in [
            "",
            "0:",
            "0: 00000000:07E8 00000000:0000 0A 0:0 0:0 0 0 0", // no inode
            "0: 0000000:07E8 00000000:0000 0A 0:0 0:0 0 0 0 597", // 7 digits
            "0: 00000000:107E8 00000000:0000 0A 0:0 0:0 0 0 0 597", // port > 4 digits
            "0: 00000000 00000000:0000 0A 0:0 0:0 0 0 0 597",  // no port
            "0: 0000000G:07E8 00000000:0000 0A 0:0 0:0 0 0 0 597", // not hex
            "0: 00000000:07E8 00000000:0000 100 0:0 0:0 0 0 0 597", // state
            "0: 00000000:07E8 00000000:0000 0A 0:0 0:0 0 0 0 -597", // sign
            "0: 00000000:07E8 00000000:0000 0A 0:0 0:0 0 0 0 99999999999999999999",
            "0: +0000000:07E8 00000000:0000 0A 0:0 0:0 0 0 0 597",
            "0: 00000000:07E8 00000000:0000 0A 0:0 0:0 0 0 0 5\u{e9}7",
        ] {
            assert_eq!(line(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(table(b"\n\n\xff\xfe garbage\n").count(), 0);
    }
}
