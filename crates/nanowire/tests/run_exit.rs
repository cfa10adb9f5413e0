//! Issue 24 item 3 (the part a process does itself): a program that writes
//! to a TCP connection and exits at once — `exit()`, `_exit()` or the
//! `exit_group` system call — leaves the kernel to finish the connection:
//! every byte reaches the peer, then its FIN. Under `nanowire run` the
//! engine's connection ends with the process unless the shim finishes it on
//! the way out (`tcpx::exiting`, called from the atexit handler and from the
//! interposed `_exit`, `_Exit` and `syscall(SYS_exit_group)`). Each case
//! runs the same writer plainly and under run against a plain sink that
//! reads slowly, and compares what the sink received.

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host};
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn script(name: &str) -> String {
    format!("{}/tests/exit/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
#[ignore = "needs root"]
fn write_then_exit_delivers_every_byte_and_the_fin() {
    let l = lab("ex");
    let addr = ADDR_B.to_string();
    let mut port = 14700u16;
    for how in ["exit", "_exit", "exit_group"] {
        let mut seen = Vec::new();
        for run in [false, true] {
            let port_s = port.to_string();
            port += 1;
            let mut sink = spawn(
                &format!("sink-{how}-{run}"),
                plain_in(
                    &l,
                    Host::B,
                    &["python3", &script("sink.py"), &addr, &port_s, "0.5"],
                ),
            );
            sink.wait_for("ready", Duration::from_secs(20));
            let argv = ["python3", &script("writer.py"), &addr, &port_s, how];
            let cmd = if run {
                run_in(&l, Host::A, &["--engine", "xdp", "-o", "log=info"], &argv)
            } else {
                plain_in(&l, Host::A, &argv)
            };
            let mut w = spawn(&format!("writer-{how}-{run}"), cmd);
            let st = w.wait(T);
            assert!(
                st.success(),
                "writer {how} (run: {run}) failed ({st}):\n{}",
                w.both()
            );
            if run {
                assert!(
                    w.stderr().contains("tcp") && w.stderr().contains("xdp"),
                    "writer {how}: the connection was not on the engine:\n{}",
                    w.stderr()
                );
            }
            sink.success(T);
            seen.push(sink.stdout());
        }
        assert!(
            seen[0].contains(&format!("EOF {}", 4 << 20)),
            "{how} plainly: {}",
            seen[0]
        );
        assert_eq!(seen[0], seen[1], "{how}: plain vs under run");
    }
}
