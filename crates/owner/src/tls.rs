//! Per-thread words reached in two instructions: a block of *initial-exec*
//! thread-local storage ([`initial_exec_block!`]).
//!
//! Code in a shared object (the preload shim, and the engine and this
//! crate linked into it) reaches a Rust `thread_local!` through
//! `__tls_get_addr` (the general/local-dynamic model: a call of ~11
//! instructions, and the caller's registers saved around it), once per
//! function that touches one. The owned lock reads its thread's token at
//! every take: the engine's RX, TX and stack locks, taken about eight times
//! a message on each side of a TCP ping-pong, made eight such calls
//! (session 36, `scripts/msgwork.py --tcp`: ~100 instructions a message in
//! `__tls_get_addr`). A block made here is reached as the initial-exec
//! model does: the thread pointer (`%fs:0`) plus the block's offset, which
//! the dynamic linker writes once into the GOT (`R_X86_64_TPOFF64`): two
//! instructions, no call.
//!
//! Initial-exec TLS is served from the static TLS area: an object loaded at
//! program start (an executable, a library in `LD_PRELOAD`, as `nanowire
//! run` loads the shim) always has its blocks there; one `dlopen`ed later
//! takes them from glibc's surplus (hundreds of bytes; the shim's blocks
//! are ~400). Every thread's block starts zeroed, which must be a valid
//! value of the block's type and its initial value; nothing in it has a
//! destructor. Reading it is async-signal-safe, unlike a first
//! `__tls_get_addr`.
//!
//! Other targets use an ordinary `thread_local!` holding the same value.

/// A type a thread's block of [`initial_exec_block!`] may hold.
///
/// # Safety
///
/// All-zero bytes are a valid value of the type, and the value its `init`
/// expression makes (every thread's block starts zeroed; on x86-64 the
/// expression is not run); it is not `Sync` (the block's `'static`
/// reference must not reach another thread, whose block it is not). The
/// macro itself refuses a type with drop glue (blocks are never dropped).
pub unsafe trait ZeroInit {}

/// The macro's check that `T` may be a block (not for other use).
#[doc(hidden)]
#[inline(always)]
pub const fn zero_init<T: ZeroInit>() {
    assert!(!std::mem::needs_drop::<T>(), "a TLS block is never dropped");
}

/// Define `fn $name() -> &'static $ty`: the calling thread's block of type
/// `$ty` ([`ZeroInit`]), a symbol `$sym` (unique in the program) in
/// initial-exec TLS on x86-64, an ordinary `thread_local!` made with
/// `$init` (a `const` expression) elsewhere.
#[macro_export]
macro_rules! initial_exec_block {
    ($(#[$m:meta])* $vis:vis fn $name:ident() -> $ty:ty = $init:expr, $sym:literal) => {
        #[cfg(target_arch = "x86_64")]
        ::std::arch::global_asm!(
            concat!(".pushsection .tbss.", $sym, ",\"awT\",@nobits"),
            ".balign {align}",
            concat!(".globl ", $sym),
            concat!(".hidden ", $sym),
            concat!(".type ", $sym, ",@object"),
            concat!(".size ", $sym, ",{size}"),
            concat!($sym, ":"),
            ".zero {size}",
            ".popsection",
            align = const ::std::mem::align_of::<$ty>(),
            size = const ::std::mem::size_of::<$ty>(),
        );

        $(#[$m])*
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        $vis fn $name() -> &'static $ty {
            const { $crate::tls::zero_init::<$ty>() };
            let p: *const $ty;
            // SAFETY: the initial-exec sequence: `%fs:0` is the thread
            // pointer (the TCB's self pointer, x86-64 TLS ABI) and the GOT
            // entry holds this block's offset from it (`R_X86_64_TPOFF64`,
            // written by the dynamic linker before any code of the object
            // runs). Neither changes during the thread's life, so the
            // result is the same on every call (`pure`, `nomem`: the
            // compiler may share one computation). The block is this
            // thread's, zero-initialised (a valid value: `ZeroInit`, checked
            // above), and lives as long as the thread; the `'static`
            // reference never leaves the thread (`ZeroInit`: not `Sync`).
            unsafe {
                ::std::arch::asm!(
                    "mov {p}, qword ptr fs:[0]",
                    concat!("add {p}, qword ptr [rip + ", $sym, "@GOTTPOFF]"),
                    p = out(reg) p,
                    options(pure, nomem, nostack),
                );
                &*p
            }
        }

        $(#[$m])*
        #[cfg(not(target_arch = "x86_64"))]
        #[inline(always)]
        $vis fn $name() -> &'static $ty {
            const { $crate::tls::zero_init::<$ty>() };
            ::std::thread_local! {
                static BLOCK: $ty = const { $init };
            }
            // SAFETY: the thread-local outlives every use on this thread
            // (no destructor; the reference never leaves the thread).
            BLOCK.with(|s| unsafe { &*(s as *const $ty) })
        }
    };
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    #[repr(C)]
    struct Block {
        a: Cell<u64>,
        b: Cell<bool>,
    }

    // SAFETY: integers and a bool in cells: zeros are (0, false), the
    // initial value; `Cell` is not `Sync`; no drop glue.
    unsafe impl super::ZeroInit for Block {}

    crate::initial_exec_block!(
        fn block() -> Block = Block {
            a: Cell::new(0),
            b: Cell::new(false),
        },
        "nanowire_owner_tls_test"
    );

    #[test]
    fn each_thread_has_its_own_block_starting_zeroed() {
        block().a.set(7);
        block().b.set(true);
        let other = std::thread::spawn(|| {
            let s = block();
            let fresh = (s.a.get(), s.b.get());
            s.a.set(9);
            (fresh, s as *const Block as usize)
        })
        .join()
        .unwrap();
        assert_eq!(other.0, (0, false));
        assert_ne!(other.1, block() as *const Block as usize);
        assert_eq!((block().a.get(), block().b.get()), (7, true));
        // The same block at every call.
        assert!(std::ptr::eq(block(), block()));
    }
}
