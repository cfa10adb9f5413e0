//! Issue 24, exit and kill: a kernel socket outlives its process — the
//! kernel finishes an exiting process's connections (every byte, then the
//! FIN) and closes a killed one's (FIN, or RST where data was unread or a
//! connection waited in an accept queue). Each case runs the same program
//! plainly, under `nanowire run` on an engine of its own and on the engine
//! service (`NANOWIRE_SERVICE=1`), against a plain peer in the other host,
//! and compares what the peer saw.
//!
//! * Write-then-exit: 4 MiB written, then `exit()`, `_exit()`, the
//!   `exit_group` system call, or `close()` + `_exit()`; the sink reads
//!   slowly, so most bytes are in flight when the process goes. Under run
//!   the shim finishes the connections on the way out (`tcpx::exiting`,
//!   from the atexit handler and the interposed `_exit`, `_Exit`,
//!   `syscall(SYS_exit_group)`).
//! * kill -9 of a process holding 100 connections, a server (half with
//!   the client's data unread, 4 more waiting in its accept queue) and a
//!   client (half with the server's data unread): every peer sees the end
//!   it sees plainly. On the service the service ends them from the
//!   process's connection table; on an engine of its own its warden does
//!   (a process of its own, started with the first TCP stack). The first
//!   FIN of every connection is dropped on the killed host's way out
//!   (nftables), so the end is seen only if the FIN is retransmitted, as
//!   the kernel does; and each peer that saw the end of file sends its own
//!   FIN afterwards, which the kernel's closed socket (FIN-WAIT-2) answers
//!   with an ACK, not a RST. Plainly and on the service the killed
//!   process also half-closes every 4th connection (i = 2 mod 4) at the
//!   kill, so the peer's ACKs of those FINs come after the death, and the
//!   service takes 300 ms to begin its end (`NANOWIRE_TEST_END_PAUSE_MS`):
//!   the ACKs arrive before the hand-over, and the killed host's kernel
//!   must send no RST at all (no segment of a peer reached it before the
//!   socket the service gave the connection). Not on an engine of its
//!   own: there the peer's segments between the death and the warden's
//!   end reach a kernel without a socket (docs/architecture.md).
//! * kill -9 right after an answer left: the process dies inside its
//!   send, right after the TX kick (a test hook of the engine), so the
//!   peer reads the answer whatever the connection table said before it;
//!   the end must come after the answer (before session 24 it was
//!   published after the kick: a FIN before the answer, which the peer
//!   drops as old, and no end at all).
//! * TIME-WAIT after exit: a client closes first and exits at once; its
//!   last ACKs are dropped on their way into the plain server's host, so
//!   the server retransmits its FINs after the client is gone; host a's
//!   kernel must ACK them (its TIME-WAIT), not reset them.

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host};
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn script(name: &str) -> String {
    test_file(&format!("exit/{name}"))
}

#[test]
#[ignore = "needs root"]
fn write_then_exit_delivers_every_byte_and_the_fin() {
    let l = lab("ex");
    let addr = ADDR_B.to_string();
    let mut port = 14700u16;
    let hows = ["exit", "_exit", "exit_group", "close"];
    let mut seen: Vec<Option<String>> = vec![None; hows.len()];
    // Placements outside: an engine of its own cannot attach while the
    // service started on demand still holds the interface (it stays a few
    // seconds after its last process), so the service runs come last.
    for p in Placement::ALL {
        for (h, how) in hows.into_iter().enumerate() {
            let port_s = port.to_string();
            port += 1;
            let mut sink = spawn(
                &format!("sink-{how}-{p:?}"),
                plain_in(
                    &l,
                    Host::B,
                    &["python3", &script("sink.py"), &addr, &port_s, "0.5"],
                ),
            );
            sink.wait_for("ready", Duration::from_secs(20));
            let argv = ["python3", &script("writer.py"), &addr, &port_s, how];
            let mut w = spawn(
                &format!("writer-{how}-{p:?}"),
                p.command(&l, Host::A, &argv),
            );
            let st = w.wait(T);
            assert!(
                st.success(),
                "writer {how} ({p:?}) failed ({st}):\n{}",
                w.both()
            );
            if p != Placement::Plain {
                on_engine(&w, &format!("-> {addr}:{port_s}"));
            }
            let out = sink.success(T);
            if p == Placement::Plain {
                assert!(
                    out.contains(&format!("EOF {}", 4 << 20)),
                    "{how} plainly: {out}"
                );
            }
            let ctx = format!("{how} {p:?}:\n{}", w.stderr());
            same_as_first(&mut seen[h], "write then exit", out, &ctx);
        }
    }
}

/// nftables in host `h`: the first FIN of each connection leaving it is
/// dropped (a set of the 4-tuples whose FIN was seen), later ones pass.
fn drop_first_fins(l: &nanowire_lab::testbed::ScopedLab, h: Host) {
    let rules = "add table ip nwfin; \
        add set ip nwfin seen { type ipv4_addr . inet_service . inet_service; flags dynamic; }; \
        add chain ip nwfin out { type filter hook output priority 0; }; \
        add rule ip nwfin out tcp flags & fin == fin ip daddr . tcp sport . tcp dport @seen accept; \
        add rule ip nwfin out tcp flags & fin == fin add @seen { ip daddr . tcp sport . tcp dport } drop";
    let o = plain_in(l, h, &["nft", rules]).output().unwrap();
    assert!(o.status.success(), "nft: {o:?}");
}

/// kill -9 of a process holding `n` connections (`pending` more in its
/// accept queue when it is the server), plainly, on an engine of its own
/// and on the service, its first FIN of each connection dropped on the
/// wire (`drop_first_fins`); the plain peer's view of each connection's
/// end, and of the answer to its own FIN after it, must be the same.
/// Returns the plain run's ends.
fn kill_9_ends(role: &str, port: u16, n: u32, pending: u32) -> String {
    nanowire_testkit::require(&["nft"]);
    let l = lab(if role == "server" { "ks" } else { "kc" });
    drop_first_fins(&l, if role == "server" { Host::B } else { Host::A });
    let addr = ADDR_B.to_string();
    let (ns, ps) = (n.to_string(), pending.to_string());
    let (killed, peer_py) = (script("killed.py"), script("peer.py"));
    let mut seen: Option<String> = None;
    let mut plain = String::new();
    for (i, p) in Placement::ALL.into_iter().enumerate() {
        let port_s = (port + i as u16).to_string();
        let mut killed_argv = vec!["python3", &killed, role, &addr, &port_s, &ns];
        let peer_role = if role == "server" { "client" } else { "server" };
        let mut peer_argv = vec!["python3", &peer_py, peer_role, &addr, &port_s, &ns];
        if role == "server" {
            killed_argv.push(&ps);
            peer_argv.push(&ps);
        }
        // The server in host b, the client in host a.
        let (kh, ph) = if role == "server" {
            (Host::B, Host::A)
        } else {
            (Host::A, Host::B)
        };
        let (mut k, mut peer);
        let mut killed_cmd = p.command(&l, kh, &killed_argv);
        if p != Placement::Own {
            killed_cmd.env("KILLED_FIN_AT_KILL", "1");
        }
        if p == Placement::Service {
            // Inherited by the service it starts on demand.
            killed_cmd.env("NANOWIRE_TEST_END_PAUSE_MS", "300");
        }
        if role == "server" {
            k = spawn(&format!("k{role}-{p:?}"), killed_cmd);
            k.wait_for("listening", T);
            peer = spawn(&format!("peer{role}-{p:?}"), plain_in(&l, ph, &peer_argv));
        } else {
            peer = spawn(&format!("peer{role}-{p:?}"), plain_in(&l, ph, &peer_argv));
            peer.wait_for("listening", T);
            k = spawn(&format!("k{role}-{p:?}"), killed_cmd);
        }
        k.wait_for("held", T);
        peer.wait_for("ready", T);
        if p != Placement::Plain {
            let what = if role == "server" {
                format!("tcp listener {addr}:{port_s}")
            } else {
                format!("-> {addr}:{port_s}")
            };
            on_engine(&k, &what);
        }
        let rsts = out_rsts(&l, kh);
        // Its FINs at the kill, then kill -9 of itself.
        let st = std::process::Command::new("kill")
            .args(["-USR1", &k.child.id().to_string()])
            .status();
        assert!(st.is_ok_and(|s| s.success()), "kill -USR1");
        let out = peer.success(T);
        let _ = k.wait(T);
        let ctx = format!(
            "{role} {p:?} killed:\n{}\npeer:\n{}",
            k.stderr(),
            peer.stderr()
        );
        if p == Placement::Service {
            assert_eq!(
                out_rsts(&l, kh),
                rsts,
                "the killed host's kernel sent RST: {ctx}"
            );
        }
        if p == Placement::Plain {
            plain = out.clone();
        }
        same_as_first(&mut seen, "the ends after kill -9", out, &ctx);
    }
    plain
}

#[test]
#[ignore = "needs root"]
fn kill_9_of_a_server_with_100_connections_ends_each_as_plainly() {
    let (n, pending) = (100, 4);
    let plain = kill_9_ends("server", 14800, n, pending);
    // Plainly: FIN where nothing was unread, RST where the client's hello
    // was unread, RST for the connections in the accept queue.
    let ends = (0..n + pending).map(|k| if k < n && k % 2 == 0 { "eof" } else { "reset" });
    assert_ends(ends, &plain, "plainly");
}

#[test]
#[ignore = "needs root"]
fn kill_9_of_a_client_with_100_connections_ends_each_as_plainly() {
    let n = 100;
    let plain = kill_9_ends("client", 14810, n, 0);
    let ends = (0..n).map(|k| if k % 2 == 0 { "eof" } else { "reset" });
    assert_ends(ends, &plain, "plainly");
}

/// nftables in host `h`: the first pure ACK of each connection to `port`
/// arriving in it is dropped (a set of the 4-tuples whose ACK was seen),
/// later ones pass.
fn drop_first_acks(l: &nanowire_lab::testbed::ScopedLab, h: Host, port: u16) {
    let rules = format!(
        "add table ip nwack{port}; \
        add set ip nwack{port} seen {{ type ipv4_addr . inet_service; flags dynamic; }}; \
        add chain ip nwack{port} in {{ type filter hook input priority 0; }}; \
        add rule ip nwack{port} in tcp dport {port} tcp flags == ack ip saddr . tcp sport @seen accept; \
        add rule ip nwack{port} in tcp dport {port} tcp flags == ack add @seen {{ ip saddr . tcp sport }} drop"
    );
    let o = plain_in(l, h, &["nft", &rules]).output().unwrap();
    assert!(o.status.success(), "nft: {o:?}");
}

/// A client that closes first and exits at once (plainly, on an engine of
/// its own, on the service), 4 connections to a plain server in host b
/// that then closes each (its FIN); the client's last ACK of each is
/// dropped on its way into host b (`drop_first_acks`, installed after the
/// handshakes), so the server's kernel retransmits its FIN after the
/// client has exited. The kernel keeps an exited process's TIME-WAIT and
/// ACKs it: host a's kernel sends no RST and the server's connections leave
/// LAST-ACK. Under run the shim hands each TIME-WAIT to host a's kernel at
/// exit (`conns::time_wait_take`); before, the retransmitted FIN reached a
/// kernel without a socket for it, which reset it (run_tcp's sockperf
/// failure under load: the server killed before it took our last ACK in,
/// its end handed to its kernel, which sent the FIN again).
#[test]
#[ignore = "needs root"]
fn an_exited_clients_time_wait_answers_a_retransmitted_fin_as_plainly() {
    nanowire_testkit::require(&["nft", "ss"]);
    let l = lab("tw");
    let addr = ADDR_B.to_string();
    let n = 4u64;
    let tw = script("timewait.py");
    let mut seen: Option<String> = None;
    for (i, p) in Placement::ALL.into_iter().enumerate() {
        let port = 14820 + i as u16;
        let port_s = port.to_string();
        let ns = n.to_string();
        let argv = |role| vec!["python3", tw.as_str(), role, &addr, &port_s, &ns];
        let mut srv = spawn(
            &format!("tw-srv-{p:?}"),
            plain_in(&l, Host::B, &argv("server")),
        );
        srv.wait_for("listening", T);
        let mut cli = spawn(
            &format!("tw-cli-{p:?}"),
            p.command(&l, Host::A, &argv("client")),
        );
        cli.wait_for("held", T);
        srv.wait_for("ready", T);
        if p != Placement::Plain {
            on_engine(&cli, &format!("-> {addr}:{port}"));
        }
        drop_first_acks(&l, Host::B, port);
        let rsts = out_rsts(&l, Host::A);
        let retrans = snmp(&l, Host::B, "Tcp", "RetransSegs");
        let st = std::process::Command::new("kill")
            .args(["-USR1", &cli.child.id().to_string()])
            .status();
        assert!(st.is_ok_and(|s| s.success()), "kill -USR1");
        cli.success(T);
        srv.success(T);
        let ctx = format!("{p:?}: client:\n{}", cli.stderr());
        // The server's connections finish: its retransmitted FINs are
        // answered (an ACK; a RST would end them too, checked below).
        let last_ack = || {
            let argv = [
                "ss",
                "-Htn",
                "state",
                "last-ack",
                "sport",
                "=",
                &format!(":{port}"),
            ];
            output(plain_in(&l, Host::B, &argv), "ss")
        };
        let until = std::time::Instant::now() + T;
        while !last_ack().trim().is_empty() {
            assert!(
                std::time::Instant::now() < until,
                "the server's connections stay in LAST-ACK: {}\n{ctx}",
                last_ack()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            snmp(&l, Host::B, "Tcp", "RetransSegs") >= retrans + n,
            "the server's FINs were not retransmitted: {ctx}"
        );
        assert_eq!(
            out_rsts(&l, Host::A),
            rsts,
            "host a's kernel reset the retransmitted FIN: {ctx}"
        );
        same_as_first(&mut seen, "the client's output", cli.stdout(), &ctx);
    }
}

/// A server (plainly, on an engine of its own, on the service) whose
/// connections end in its own TIME-WAIT (it sends the first FIN, reads the
/// client's, closes) and which then exits; a new listener on its port
/// binds as plainly: with SO_REUSEADDR it binds when the server's listener
/// had it (the kernel's TIME-WAIT of an accepted socket keeps the
/// listener's flag), without it EADDRINUSE. Under run the shim hands each
/// TIME-WAIT to the kernel at exit through a TCP_REPAIR socket, and repair
/// mode off clears SO_REUSEADDR: before it was set again
/// (`repair::reuse_again`), iperf3 -s after an iperf3 -s -1 under run failed
/// "Address already in use" (run_apps, CI of session 20).
#[test]
#[ignore = "needs root"]
fn a_server_exiting_in_time_wait_leaves_its_port_bindable_as_plainly() {
    let l = lab("rbnd");
    let addr = ADDR_B.to_string();
    let rb = script("rebind.py");
    // Placements outer: the service stays on the interface a while after
    // its last process, so an own engine cannot follow it in this lab.
    let mut seen: [Option<String>; 2] = [None, None];
    for (i, p) in Placement::ALL.into_iter().enumerate() {
        for (j, reuse) in ["1", "0"].into_iter().enumerate() {
            let port = 14830 + (2 * i + j) as u16;
            let port_s = port.to_string();
            let mut srv = spawn(
                &format!("rb-srv-{reuse}-{p:?}"),
                p.command(
                    &l,
                    Host::B,
                    &["python3", &rb, "server", &addr, &port_s, "3", reuse],
                ),
            );
            srv.wait_for("listening", T);
            let cli = plain_in(
                &l,
                Host::A,
                &["python3", &rb, "client", &addr, &port_s, "3"],
            );
            let ended = output(cli, "client");
            srv.success(T);
            let ctx = format!("{p:?}, SO_REUSEADDR={reuse}: server:\n{}", srv.stderr());
            assert_eq!(ended.trim(), "ended 3", "{ctx}");
            if p != Placement::Plain {
                on_engine(&srv, &format!("tcp listener {addr}:{port}"));
            }
            let bound = output(
                plain_in(&l, Host::B, &["python3", &rb, "bind", &addr, &port_s]),
                "bind",
            );
            same_as_first(&mut seen[j], "the later binds", bound, &ctx);
        }
    }
}

/// kill -9 of a writer whose bytes are still in its send buffer (the slow
/// plain sink has not read yet: some unsent, some unacknowledged): plainly
/// the kernel delivers every byte, then the FIN; on the engine service the
/// same bytes, hash and end of file, from the send ring's slab in the
/// process's connection table, on the engine service and on an engine of
/// its own (whose warden holds the XDP link through the death: before, a
/// segment of the peer between the death and the warden's end met a kernel
/// without a socket, which reset the peer, 1 in 4 runs; docs/architecture.md).
#[test]
#[ignore = "needs root"]
fn kill_9_with_data_unacknowledged_delivers_every_byte_and_the_fin() {
    let kill = |p: Placement, engine_line: &str, w: &mut Kid| {
        w.wait_for("written pid", T);
        if p != Placement::Plain {
            on_engine(w, engine_line);
        }
        let out = w.stdout();
        let pid = out
            .split_whitespace()
            .skip_while(|t| *t != "pid")
            .nth(1)
            .expect("the writer's pid")
            .to_string();
        let st = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        assert!(st.is_ok_and(|s| s.success()), "kill -9 {pid}");
    };
    let what = "kill -9 with data unacknowledged";
    writer_killed_as_plainly(
        ("kun", 14830, what),
        ("unacked", "3", &[]),
        "EOF 150000",
        kill,
    );
}

/// In a lab tagged `tag`, in each placement (port `port0 + i`): a plain
/// sink (`sink.py`, reading after `delay` seconds) in host b, then the
/// writer `exit/NAME.py ADDR PORT` in host a (placed, with `env`), which
/// `kill` ends (it is given the writer's engine line to look for); the
/// sink's output must equal the plain run's, which must contain
/// `plain_want`.
fn writer_killed_as_plainly(
    (tag, port0, what): (&str, u16, &str),
    (name, delay, env): (&str, &str, &[(&str, &str)]),
    plain_want: &str,
    mut kill: impl FnMut(Placement, &str, &mut Kid),
) {
    let l = lab(tag);
    let addr = ADDR_B.to_string();
    let mut seen: Option<String> = None;
    for (i, p) in Placement::ALL.into_iter().enumerate() {
        let port_s = (port0 + i as u16).to_string();
        let mut sink = spawn(
            &format!("sink-{name}-{p:?}"),
            plain_in(
                &l,
                Host::B,
                &["python3", &script("sink.py"), &addr, &port_s, delay],
            ),
        );
        sink.wait_for("ready", Duration::from_secs(20));
        let py = script(&format!("{name}.py"));
        let mut cmd = p.command(&l, Host::A, &["python3", &py, &addr, &port_s]);
        cmd.envs(env.iter().copied());
        let mut w = spawn(&format!("{name}-{p:?}"), cmd);
        kill(p, &format!("-> {addr}:{port_s}"), &mut w);
        let _ = w.wait(T);
        let got = sink.success(T);
        if p == Placement::Plain {
            assert!(got.contains(plain_want), "plainly: {got}");
        }
        let ctx = format!("{p:?}:\n{}", w.stderr());
        same_as_first(&mut seen, what, got, &ctx);
    }
}

/// kill -9 right after an answer's frame left (the engine's test hook
/// `NANOWIRE_TEST_KILL_AFTER_SEND`: SIGKILL between the TX kick and
/// anything after it): the peer reads the 1,000 bytes, then the end of
/// file, as plainly (where the process kills itself after its send). Before
/// the ends were published ahead of the kick, the connection table still
/// named the end before the answer: the service's or warden's FIN carried
/// that old sequence number, the peer dropped it, and its read timed out.
#[test]
#[ignore = "needs root"]
fn kill_9_right_after_an_answer_left_ends_it_after_the_answer() {
    let killed = |p: Placement, engine_line: &str, w: &mut Kid| {
        let _ = w.wait(T);
        if p == Placement::Own {
            assert!(w.stdout().contains("warden up"), "{}", w.stdout());
        }
        if p != Placement::Plain {
            on_engine(w, engine_line);
            assert!(
                w.stderr()
                    .contains("test hook: SIGKILL after a send's kick"),
                "{p:?}: the hook did not kill it:\n{}",
                w.stderr()
            );
        }
    };
    let what = "kill -9 right after an answer left";
    let env = [("NANOWIRE_TEST_KILL_AFTER_SEND", "1")];
    writer_killed_as_plainly(
        ("kak", 14840, what),
        ("kicked", "0", &env),
        "EOF 1000 ",
        killed,
    );
}
