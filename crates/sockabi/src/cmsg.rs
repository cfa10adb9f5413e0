//! Control messages (`msg_control`) over a byte slice: walking the
//! caller's for sendmsg with the kernel's checks, writing ours for
//! recvmsg with `put_cmsg`'s truncation rules. 64-bit layout: a 16-byte
//! header (`size_t cmsg_len`, `int level`, `int type`), 8-byte alignment.

use crate::Errno;

/// `sizeof(struct cmsghdr)`.
pub const HDR: usize = 16;
const ALIGN: usize = 8;

/// `CMSG_ALIGN`.
pub const fn align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// `CMSG_LEN(n)`.
pub const fn len(n: usize) -> usize {
    HDR + n
}

/// `CMSG_SPACE(n)`.
pub const fn space(n: usize) -> usize {
    HDR + align(n)
}

/// One control message of the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cmsg<'a> {
    pub level: i32,
    pub ty: i32,
    pub data: &'a [u8],
}

/// The messages of a sendmsg control buffer, as `for_each_cmsghdr` with
/// `CMSG_OK` walks them: a header whose length is below the header size
/// or beyond the buffer is EINVAL (and ends the walk).
pub fn walk(buf: &[u8]) -> impl Iterator<Item = Result<Cmsg<'_>, Errno>> {
    let mut off = 0usize;
    let mut done = false;
    std::iter::from_fn(move || {
        if done || buf.len().saturating_sub(off) < HDR {
            return None;
        }
        let h = &buf[off..];
        let l = u64::from_ne_bytes(h[..8].try_into().expect("8 bytes")) as usize;
        if l < HDR || l > h.len() {
            done = true;
            return Some(Err(libc::EINVAL));
        }
        let level = i32::from_ne_bytes(h[8..12].try_into().expect("4 bytes"));
        let ty = i32::from_ne_bytes(h[12..16].try_into().expect("4 bytes"));
        let data = &h[HDR..l];
        off = off.saturating_add(align(l));
        Some(Ok(Cmsg { level, ty, data }))
    })
}

/// What [`put`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Put {
    /// Bytes of the buffer used after this message.
    pub used: usize,
    /// The message did not fit whole (the kernel sets MSG_CTRUNC).
    pub truncated: bool,
}

/// `put_cmsg`: append one message at `used` in `buf`; a message that does
/// not fit is cut to the room left (its `cmsg_len` says the cut length)
/// or, with less room than a header, not written at all.
pub fn put(buf: &mut [u8], used: usize, level: i32, ty: i32, data: &[u8]) -> Put {
    let room = buf.len().saturating_sub(used);
    if room < HDR {
        return Put {
            used,
            truncated: true,
        };
    }
    let full = len(data.len());
    let cm = full.min(room);
    let out = &mut buf[used..used + cm];
    out[..8].copy_from_slice(&(cm as u64).to_ne_bytes());
    out[8..12].copy_from_slice(&level.to_ne_bytes());
    out[12..16].copy_from_slice(&ty.to_ne_bytes());
    let n = cm - HDR;
    out[HDR..].copy_from_slice(&data[..n]);
    Put {
        used: used + space(data.len()).min(room),
        truncated: cm < full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_libc() {
        assert_eq!(HDR, std::mem::size_of::<libc::cmsghdr>());
        for n in [0u32, 1, 4, 8, 12, 16, 17] {
            // SAFETY-free: CMSG_* are const fns in libc for these.
            assert_eq!(space(n as usize), libc_space(n));
        }
    }

    fn libc_space(n: u32) -> usize {
        // CMSG_SPACE for 64-bit Linux, written out (libc's is unsafe).
        16 + ((n as usize + 7) & !7)
    }

    #[test]
    fn put_then_walk_round_trips() {
        let mut b = [0u8; 64];
        let p = put(&mut b, 0, libc::SOL_SOCKET, 35, &[1, 2, 3, 4, 5]);
        assert_eq!(
            p,
            Put {
                used: 24,
                truncated: false
            }
        );
        let q = put(&mut b, p.used, libc::IPPROTO_IP, 8, &[9; 12]);
        assert_eq!(q.used, 24 + 32);
        let v: Vec<_> = walk(&b[..q.used]).collect();
        assert_eq!(v.len(), 2);
        assert_eq!(
            v[0],
            Ok(Cmsg {
                level: libc::SOL_SOCKET,
                ty: 35,
                data: &[1, 2, 3, 4, 5]
            })
        );
        assert_eq!(v[1].unwrap().data, &[9; 12]);
    }

    #[test]
    fn put_truncates_like_put_cmsg() {
        let mut b = [0u8; 20];
        let p = put(&mut b, 0, 1, 2, &[7; 16]);
        assert_eq!(
            p,
            Put {
                used: 20,
                truncated: true
            }
        );
        assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), 20);
        assert_eq!(&b[16..], &[7; 4]);
        let mut s = [0u8; 10];
        assert_eq!(
            put(&mut s, 0, 1, 2, &[1]),
            Put {
                used: 0,
                truncated: true
            }
        );
    }

    #[test]
    fn walk_refuses_bad_lengths() {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&8u64.to_ne_bytes());
        assert_eq!(walk(&b).next(), Some(Err(libc::EINVAL)));
        b[..8].copy_from_slice(&33u64.to_ne_bytes());
        assert_eq!(walk(&b).collect::<Vec<_>>(), vec![Err(libc::EINVAL)]);
        assert_eq!(walk(&b[..15]).count(), 0);
        b[..8].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert_eq!(walk(&b).next(), Some(Err(libc::EINVAL)));
    }

    #[test]
    fn a_full_buffer_stops_the_next_message() {
        let mut b = [0u8; 24];
        let p = put(&mut b, 0, 1, 2, &[1, 2, 3, 4]);
        assert_eq!(
            p,
            Put {
                used: 24,
                truncated: false
            }
        );
        let q = put(&mut b, p.used, 1, 3, &[5]);
        assert_eq!(
            q,
            Put {
                used: 24,
                truncated: true
            }
        );
        assert_eq!(walk(&b).count(), 1);
    }
}
