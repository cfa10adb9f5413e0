//! Diagnostics on stderr, written with a raw syscall (no stdio locks, no
//! recursion into the shim's own `write`).

use nanowire_options::Level;
use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

#[inline]
pub fn enabled(l: Level) -> bool {
    l as u8 <= LEVEL.load(Ordering::Relaxed) && l != Level::Off
}

pub fn emit(l: Level, args: std::fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    let mut s = format!("nanowire[{}]: ", std::process::id());
    let _ = std::fmt::write(&mut s, args);
    s.push('\n');
    // SAFETY: fd 2 is only borrowed for the write; if it is closed the
    // write fails with EBADF and the line is lost, nothing else.
    let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(2) };
    let mut b = s.as_bytes();
    while !b.is_empty() {
        match rustix::io::write(fd, b) {
            Ok(0) | Err(_) => break,
            Ok(n) => b = &b[n..],
        }
    }
}

macro_rules! log {
    ($lvl:expr, $($t:tt)*) => {
        if $crate::log::enabled($lvl) {
            $crate::log::emit($lvl, format_args!($($t)*));
        }
    };
}
pub(crate) use log;
