//! The page a process shares with its forked children for the engine
//! connections they hold copies of (issue 24; the shim's `forkshare`
//! writes it), as `nanowire stats` reads it.
//!
//! The page is a memfd named [`NAME`] mapped shared by the owner (the
//! process whose engine serves the connections) and inherited by every
//! child, so `/proc/PID/maps` of each names it (`/memfd:nanowire-forkshare
//! (deleted)`) and a reader allowed to (root, or the owner's user) maps it
//! through `/proc/PID/map_files/`. Layout (little-endian, native atomics):
//! a header of [`HEADER_BYTES`] (`req`: u32, the broker's wake-up word;
//! `magic`: u32, [`MAGIC`]), then [`SLOTS`] slots of [`SLOT_BYTES`]:
//!
//! | offset | field | |
//! |---|---|---|
//! | 0 | word: u32 | generation << 3 \| state ([`FREE`], [`ENGINE`], [`BUSY`], [`MOVED`], [`ORPHAN`]) |
//! | 4 | holders: u32 | processes other than the owner holding a copy |
//! | 8 | owner: u32 | the owner's pid |
//! | 12 | want: u32 | a child asked for the hand-over |
//! | 16 | local: u64 | the connection's local address ([`pack`]) |
//! | 24 | remote: u64 | its peer's |
//! | 32 | ino: u64 | the inode of the socket under the fds (`/proc/PID/fd`) |
//! | 40 | taker: u32 | the child that asked to take the connection onto its engine (0: none) |
//! | 44 | xfd: u32 | while [`MOVED`]: the owner's memfd holding the exported state |
//! | 48 | xlen: u32 | its length |
//! | 52 | moves: u32 | how many times the connection moved between engines |
use std::net::{Ipv4Addr, SocketAddrV4};

/// The name of a TCP state number (as `ss` says it), for readers.
pub use nanowire_xdp::netlink::tcp_state_name;

/// The memfd's name.
pub const NAME: &str = "nanowire-forkshare";
pub const MAGIC: u32 = u32::from_le_bytes(*b"NWF1");
pub const SLOTS: usize = 1024;
pub const HEADER_BYTES: usize = 8;
pub const SLOT_BYTES: usize = 56;
pub const PAGE_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;
/// Offsets in a slot.
pub const OFF_HOLDERS: usize = 4;
pub const OFF_OWNER: usize = 8;
pub const OFF_LOCAL: usize = 16;
pub const OFF_REMOTE: usize = 24;
pub const OFF_INO: usize = 32;
/// Slot states (the low 3 bits of a slot's word).
pub const FREE: u32 = 0;
/// On the owner's engine.
pub const ENGINE: u32 = 1;
/// Being decided (the owner's close or its broker is handing it over).
pub const BUSY: u32 = 2;
/// Moved off the owner's engine, its state in the owner's memfd, for the
/// taker to adopt (issue 24 item 1).
pub const MOVED: u32 = 3;
/// A UDP socket whose owner left (exit) while children hold copies no one
/// used yet: off its engine, its queue on the kernel socket; the first
/// holder to use it takes it onto an engine of its own.
pub const ORPHAN: u32 = 4;
pub const STATE: u32 = 7;

/// An address as a slot stores it (0: none).
pub fn pack(a: SocketAddrV4) -> u64 {
    1 << 48 | u64::from(a.ip().to_bits()) << 16 | u64::from(a.port())
}

pub fn unpack(v: u64) -> Option<SocketAddrV4> {
    (v >> 48 == 1).then(|| SocketAddrV4::new(Ipv4Addr::from_bits((v >> 16) as u32), v as u16))
}

/// The connections of a page's bytes that some process other than the
/// owner holds (`holders` > 0), each still on its owner's engine or being
/// handed over to the kernel (`busy`): `{local, remote (null: not known),
/// owner (pid), holders, ino (the socket's inode), busy}`. Err: not such
/// a page.
pub fn read(page: &[u8]) -> Result<Vec<serde_json::Value>, String> {
    let u32_at = |o: usize| u32::from_le_bytes(page[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(page[o..o + 8].try_into().unwrap());
    if page.len() < PAGE_BYTES || u32_at(4) != MAGIC {
        return Err("not a fork-share page of this version".into());
    }
    let addr = |o: usize| unpack(u64_at(o)).map(|a| a.to_string());
    Ok((0..SLOTS)
        .map(|i| HEADER_BYTES + i * SLOT_BYTES)
        .filter_map(|s| {
            let st = u32_at(s) & STATE;
            let holders = u32_at(s + OFF_HOLDERS);
            ((st == ENGINE || st == BUSY || st == MOVED) && holders > 0).then(|| {
                serde_json::json!({
                    "local": addr(s + OFF_LOCAL),
                    "remote": addr(s + OFF_REMOTE),
                    "owner": u32_at(s + OFF_OWNER),
                    "holders": holders,
                    "ino": u64_at(s + OFF_INO),
                    "busy": st != ENGINE,
                })
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_reads_back_its_held_slots_only() {
        let mut p = vec![0u8; PAGE_BYTES];
        assert!(read(&p).is_err());
        p[4..8].copy_from_slice(&MAGIC.to_le_bytes());
        let l = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 80);
        let r = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 40000);
        let put = |p: &mut Vec<u8>, i: usize, word: u32, holders: u32| {
            let s = HEADER_BYTES + i * SLOT_BYTES;
            p[s..s + 4].copy_from_slice(&word.to_le_bytes());
            p[s + OFF_HOLDERS..s + 8].copy_from_slice(&holders.to_le_bytes());
            p[s + OFF_OWNER..s + 12].copy_from_slice(&77u32.to_le_bytes());
            p[s + OFF_LOCAL..s + 24].copy_from_slice(&pack(l).to_le_bytes());
            p[s + OFF_REMOTE..s + 32].copy_from_slice(&pack(r).to_le_bytes());
            p[s + OFF_INO..s + 40].copy_from_slice(&(1000 + i as u64).to_le_bytes());
        };
        put(&mut p, 0, 5 << 3 | ENGINE, 2);
        put(&mut p, 1, 6 << 3 | ENGINE, 0); // nobody else holds it
        put(&mut p, 2, 7 << 3 | FREE, 1); // decided
        put(&mut p, 3, 8 << 3 | BUSY, 1);
        let got = read(&p).unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0],
            serde_json::json!({
                "local": "198.18.0.2:80", "remote": "198.18.0.1:40000", "owner": 77,
                "holders": 2, "ino": 1000, "busy": false,
            })
        );
        assert_eq!(got[1]["busy"], true);
        assert_eq!(unpack(0), None);
    }
}
