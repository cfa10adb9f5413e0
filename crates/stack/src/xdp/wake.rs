//! The TCP timer service's wake-ups, below both the TCP driver (`tcp.rs`,
//! which runs the service and parks segments) and the neighbour table
//! (`neigh.rs`, which resolves next hops): the service's eventfd, whether
//! it naps, and how many engines hold segments parked for a next hop. The
//! neighbour table calls [`neighbour_changed`] without reaching up into
//! the TCP driver.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// The service's wake-up eventfd (-1 before it runs), and whether its
/// current sleep is longer than `SERVICE_RX_NS` (it saw no engine with an
/// open connection): [`service_nudge`] then wakes it.
pub(super) static SERVICE_WAKE: AtomicI32 = AtomicI32::new(-1);
pub(super) static SERVICE_NAPPING: AtomicBool = AtomicBool::new(false);

/// Engines (TCP stacks) of this process with segments parked for a next
/// hop (`TcpEngine::park`), and whether a neighbour change since the
/// service's last pass may have made some of them sendable.
pub(super) static PARKED: AtomicUsize = AtomicUsize::new(0);
pub(super) static UNPARK_DUE: AtomicBool = AtomicBool::new(false);

/// The neighbour table changed (a next hop resolved, failed, or a route
/// moved; `Neigh::changed`, mostly in the neighbour thread, which is
/// engine code: a raw eventfd write, never the shim). Segments parked for
/// a next hop go at once: the timer service is woken and sends them
/// (`unpark`) from every engine that has some, instead of their waiting
/// for a turn that reads the clock (a blocking accept whose half-open
/// connection counts as busy turns every 50 ms and reads the clock every
/// 16th turn: a SYN-ACK left 200-460 ms after the resolution). Nothing
/// when no segment is parked (one load).
///
/// No wake-up is lost: a parker counts itself in `PARKED` (SeqCst) and
/// then re-reads the generation (`unpark_due`); the resolver bumps the
/// generation (SeqCst) and then reads `PARKED`. One of the two sees the
/// other's write.
pub(crate) fn neighbour_changed() {
    if PARKED.load(Ordering::SeqCst) == 0 {
        return;
    }
    UNPARK_DUE.store(true, Ordering::SeqCst);
    let fd = SERVICE_WAKE.load(Ordering::Acquire);
    if fd >= 0 {
        nanowire_xdp::sys::eventfd_signal(fd);
    }
}

/// A connection was opened or closed by the application: a service in a
/// long sleep looks again now (in the kernel a segment is taken in when it
/// arrives; here, for a connection whose application does not turn the
/// engine, by the service every `SERVICE_RX_NS`, not after up to
/// `SERVICE_IDLE_MS`). One load when the service is not napping.
///
/// No nudge is lost: the service sets `SERVICE_NAPPING` before its pass
/// looks at the engines (each under its core lock), and the caller changed
/// the connection set under that lock before asking here. Either the pass
/// saw the change (and sleeps at most `SERVICE_RX_NS`), or its store is
/// ordered before the caller's load through the lock, which then sees it.
pub(super) fn service_nudge() {
    if SERVICE_NAPPING.load(Ordering::Relaxed) && SERVICE_NAPPING.swap(false, Ordering::AcqRel) {
        let fd = SERVICE_WAKE.load(Ordering::Acquire);
        if fd >= 0 {
            nanowire_xdp::sys::eventfd_signal(fd);
        }
    }
}

/// In a forked child (`tcp::service_after_fork`): no service runs yet, and
/// the parent's parked segments are not the child's to send.
pub(super) fn after_fork() {
    SERVICE_WAKE.store(-1, Ordering::Release);
    SERVICE_NAPPING.store(false, Ordering::Release);
    PARKED.store(0, Ordering::Release);
    UNPARK_DUE.store(false, Ordering::Release);
}
