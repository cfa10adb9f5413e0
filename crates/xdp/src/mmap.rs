//! Memory mappings owned by value: the UMEM and the ring mappings.

use std::io;
use std::os::fd::RawFd;

/// A mapping, unmapped on drop.
pub(crate) struct Mmap {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

impl Mmap {
    pub(crate) fn map(len: usize, fd: Option<(RawFd, libc::off_t)>) -> io::Result<Mmap> {
        let (flags, fd, off) = match fd {
            Some((fd, off)) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd, off),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            ),
        };
        // SAFETY: a fresh mapping; the kernel chooses the address; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap { ptr: p.cast(), len })
    }
}

const HUGE: usize = 2 << 20;

impl Mmap {
    /// Anonymous memory for a UMEM, backed by transparent huge pages when
    /// the kernel gives them (`madvise` mode): the RX frames cycle through
    /// the whole UMEM (the fill ring is FIFO), and with 4 KiB pages nearly
    /// every frame costs a TLB miss. Falls back to plain pages.
    pub(crate) fn map_umem(len: usize) -> io::Result<Mmap> {
        if len < HUGE {
            return Mmap::map(len, None);
        }
        let len = len.next_multiple_of(HUGE);
        let total = len + HUGE;
        // SAFETY: a fresh private anonymous mapping (not populated yet);
        // checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Mmap::map(len, None);
        }
        let base = p as usize;
        let start = base.next_multiple_of(HUGE);
        let head = start - base;
        let tail = total - head - len;
        // SAFETY: head/tail are the unaligned ends of the mapping just made
        // (page multiples, as both base and HUGE are page aligned); the
        // aligned middle [start, start+len) stays mapped and owned by Mmap.
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
        }
        let m = Mmap {
            ptr: start as *mut u8,
            len,
        };
        // SAFETY: advice and population on our own mapping; failures only
        // mean 4 KiB pages or faults populated below.
        unsafe {
            libc::madvise(m.ptr.cast(), len, libc::MADV_HUGEPAGE);
            if libc::madvise(m.ptr.cast(), len, libc::MADV_POPULATE_WRITE) != 0 {
                // Older kernel: touch every page so the hot path never faults.
                for off in (0..len).step_by(4096) {
                    m.ptr.add(off).write_volatile(0);
                }
            }
        }
        Ok(m)
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping we created and unmap once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: a Mmap is plain memory owned by this value; who may read or
// write which bytes is decided by the types built on it (Ring, Umem).
unsafe impl Send for Mmap {}
// SAFETY: as above; Mmap itself exposes no access, only ptr/len.
unsafe impl Sync for Mmap {}
