//! Memory mappings owned by value: the UMEM and the ring mappings.

use std::io;
use std::os::fd::RawFd;

/// A mapping, unmapped on drop.
pub(crate) struct Mmap {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    /// The process that made the mapping, when it is not inherited by a
    /// fork ([`Mmap::dont_fork`]); 0: an ordinary mapping.
    only_in: u32,
}

impl Mmap {
    /// The value owning a mapping of `len` bytes at `ptr` just made.
    fn of(ptr: *mut u8, len: usize) -> Mmap {
        Mmap {
            ptr,
            len,
            only_in: 0,
        }
    }

    pub(crate) fn map(len: usize, fd: Option<(RawFd, libc::off_t)>) -> io::Result<Mmap> {
        Self::map_prot(
            len,
            fd,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_POPULATE,
        )
    }

    /// A read-only shared mapping of `fd` (not populated).
    pub(crate) fn map_read_only(len: usize, fd: RawFd) -> io::Result<Mmap> {
        Self::map_prot(len, Some((fd, 0)), libc::PROT_READ, 0)
    }

    fn map_prot(
        len: usize,
        fd: Option<(RawFd, libc::off_t)>,
        prot: libc::c_int,
        populate: libc::c_int,
    ) -> io::Result<Mmap> {
        let (flags, fd, off) = match fd {
            Some((fd, off)) => (libc::MAP_SHARED | populate, fd, off),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate, -1, 0),
        };
        // SAFETY: a fresh mapping; the kernel chooses the address; checked below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap::of(p.cast(), len))
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
        let m = Mmap::of(start as *mut u8, len);
        // SAFETY: advice on our own mapping; a failure only means 4 KiB pages.
        unsafe { libc::madvise(m.ptr.cast(), len, libc::MADV_HUGEPAGE) };
        m.populate();
        Ok(m)
    }
}

impl Mmap {
    /// A new shared file's pages mapped (`fd`, from offset 0), asking for
    /// huge pages first (`MADV_HUGEPAGE`: the kernel may compact for them,
    /// where `defrag` is `madvise`), then faulted in. For a file just made
    /// (its pages are zero and nobody else maps it yet): the engine
    /// service's UMEM on its huge tmpfs.
    pub(crate) fn map_new_shared_huge(len: usize, fd: RawFd) -> io::Result<Mmap> {
        // SAFETY: a fresh shared mapping of the caller's file; the kernel
        // chooses the (huge-aligned, for a huge tmpfs) address; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let m = Mmap::of(p.cast(), len);
        // SAFETY: advice on our own mapping; a failure only means 4 KiB pages.
        unsafe { libc::madvise(m.ptr.cast(), len, libc::MADV_HUGEPAGE) };
        m.populate_range(0, len);
        Ok(m)
    }

    /// Fault in every page of the mapping for writing, the upper half on a
    /// second thread when the machine has more than one CPU.
    ///
    /// Zeroing tens of MB is the longest part of an own engine's start,
    /// and runs while the caller's thread mostly sleeps (its XDP link waits
    /// for an RCU grace period): two threads halve it. The pages are
    /// faulted by writing to each, not with `MADV_POPULATE_WRITE`: that
    /// holds the process's mmap lock for the range it is given, and any
    /// other thread's `mmap`, `munmap`, `brk` or `mprotect` -- the engine's
    /// own open beside this (map creation, ring mappings, malloc growing
    /// the heap) -- waited for it: up to 42 ms on a quiet machine, more
    /// when the populating thread was preempted holding it
    /// (docs/benchmarks.md, "Session 13: churn and engine start"). A write
    /// fault takes only this mapping's own lock (per-VMA locking, Linux
    /// 6.4+), which nothing else of the process wants meanwhile. With huge
    /// pages the first write of each 2 MiB faults the whole huge page in;
    /// the other 511 writes find it mapped.
    fn populate(&self) {
        let chunks = self.len.div_ceil(HUGE);
        let two = chunks >= 4 && cpus() > 1;
        if !two {
            self.populate_range(0, self.len);
            return;
        }
        let mid = (chunks / 2) * HUGE;
        std::thread::scope(|s| {
            let upper = std::thread::Builder::new()
                .name("nanowire-umem2".into())
                .spawn_scoped(s, || self.populate_range(mid, self.len));
            self.populate_range(0, mid);
            if upper.is_err() {
                self.populate_range(mid, self.len);
            }
        });
    }

    /// Write a zero into every 4 KiB page of `[from, to)`.
    fn populate_range(&self, from: usize, to: usize) {
        for o in (from..to).step_by(4096) {
            // SAFETY: o < to <= len: inside our own writable mapping, which
            // nobody else uses yet (each thread writes its own range); the
            // memory is fresh pages (anonymous, or a file just made), zero
            // already.
            unsafe { self.ptr.add(o).write_volatile(0) };
        }
    }
}

/// CPUs this thread may run on (sched_getaffinity: one system call, no
/// file read -- std's `available_parallelism` reads cgroup files, through
/// the shim's interposed `open`/`read`, which engine threads never enter).
fn cpus() -> usize {
    // SAFETY: cpu_set_t is plain bits, all-zero valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return 1;
    }
    // SAFETY: CPU_COUNT only reads the set sched_getaffinity filled.
    unsafe { libc::CPU_COUNT(&set) as usize }
}

impl Mmap {
    /// Keep this mapping out of forked children (`MADV_DONTFORK`). For an
    /// engine's own UMEM: private anonymous memory the kernel has pinned
    /// for AF_XDP, which a fork must copy whole into the child (a pinned
    /// page cannot be shared copy-on-write), ~40 ms for the 32 MiB of one
    /// queue here, in every fork of a process under run while its engine
    /// lives (session 26: a fork-per-connection server's every answer). A
    /// child never reads its parent's UMEM (it uses the kernel sockets
    /// under inherited fds); in a child the value only forgets the range
    /// (see `Drop`), which may hold another mapping of the child's by then.
    pub(crate) fn dont_fork(&mut self) {
        // SAFETY: advice on our own mapping; on failure it stays inherited.
        if unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_DONTFORK) } == 0 {
            // SAFETY: getpid has no preconditions.
            self.only_in = unsafe { libc::getpid() } as u32;
        }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: getpid has no preconditions.
        if self.only_in != 0 && self.only_in != unsafe { libc::getpid() } as u32 {
            // A forked child: the range was never mapped here.
            return;
        }
        // SAFETY: ptr/len describe a mapping we created and unmap once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: a Mmap is plain memory owned by this value; who may read or
// write which bytes is decided by the types built on it (Ring, Umem).
unsafe impl Send for Mmap {}
// SAFETY: as above; Mmap itself exposes no access, only ptr/len.
unsafe impl Sync for Mmap {}
