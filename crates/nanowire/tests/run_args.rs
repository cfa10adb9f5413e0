//! Arguments checked as the kernel checks them (issue 20, findings 9 and
//! 10): the same C program (`crates/preload/tests/args_check.c`) makes
//! calls with huge iovec counts, NULL/unmapped/read-only buffers, negative
//! and terabyte lengths, bad names, a 256 MiB non-blocking writev, and a
//! timed receive interrupted by an SA_RESTART handler — on a UDP socket
//! and a TCP connection in host a, to a plain echo peer in host b —
//! plainly and under `nanowire run`; the outputs must be identical.

mod run_support;
use nanowire_lab::testbed::Host;
use nanowire_testkit::{A, B};
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

#[test]
#[ignore = "needs root"]
fn argument_errors_and_timed_signals_match_the_kernel_on_engine_sockets() {
    let lab = lab("args");
    let bin = &shim_and_c("args_check", "../preload/tests/args_check.c");
    let port = "14200";
    let mut peer = spawn("args-peer", lab.command(Host::B, &[bin, "peer", port]));
    peer.wait_for("ready", Duration::from_secs(20));
    let argv = [bin, "client", A, B, port];
    let mut plain = spawn("args-plain", lab.command(Host::A, &argv));
    plain.success(T);
    let want = plain.stdout();
    assert!(want.contains("done"), "{want}");
    // The cases of buffers used, then unmapped or made read-only (by this
    // thread or another) ran, and the kernel refused them.
    for p in ["udp", "tcp"] {
        for case in [
            "recv into a used page since unmapped",
            "recv into a used page since read-only",
            "recv into a used page another thread unmapped",
            "a new thread's recv into a page another used and unmapped",
        ] {
            let line = want.lines().find(|l| l.starts_with(&format!("{p} {case}")));
            assert!(
                line.is_some_and(|l| l.contains("EFAULT")),
                "{p} {case}: {want}"
            );
        }
    }
    let mut c = run_in(&lab, Host::A, &["--engine", "xdp", "-o", "log=info"], &argv);
    let mut k = spawn("args-run", {
        c.env("NANOWIRE_LOG", "info");
        c
    });
    k.success(T);
    let err = k.stderr();
    assert!(
        err.contains("udp") && err.contains(": xdp (interface"),
        "{err}"
    );
    assert_same_output("args_check", &want, &k.stdout(), &format!("stderr:\n{err}"));
}
