//! Socket options on engine sockets (issue 20, finding 2): the same
//! program plainly and under `nanowire run`, the same wire and the same
//! outcome. IP_TTL / IP_TOS reach the headers the engine writes (UDP and
//! TCP, seen by a plain peer); TCP_MD5SIG connections never go on the
//! engine (signed as plainly, unsigned never accepted); every TCP-AO
//! option answers as plainly; IP_MINTTL on a server under run refuses
//! segments with a lower TTL as the kernel does; IP_PKTINFO (an option
//! the engine does not apply) moves a UDP socket to the kernel, whose
//! ancillary data is then the plain one.
//! The probe is `scripts/opts_probe.py`; each test has a lab of its own.

mod run_support;
use nanowire_lab::testbed::{Host, ScopedLab};
use nanowire_testkit::{A, B};
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn probe() -> String {
    format!("{}/../../scripts/opts_probe.py", env!("CARGO_MANIFEST_DIR"))
}

fn cmd_in(l: &ScopedLab, h: Host, run: bool, args: &[&str]) -> std::process::Command {
    let p = probe();
    let mut argv = vec!["python3", p.as_str()];
    argv.extend_from_slice(args);
    xdp_or_plain(l, h, run, &argv)
}

/// A probe server in host b (`srv`: under run?, its arguments), once it
/// printed `ready`, then a probe client in host a (`cli`) run to success:
/// the server (still running) and the client's output. Named `name`-srv
/// and `name`-cli.
fn probe_pair(
    l: &ScopedLab,
    name: &str,
    (srv_run, srv, ready): (bool, &[&str], &str),
    (cli_run, cli): (bool, &[&str]),
) -> (Kid, String) {
    let mut s = spawn(&format!("{name}-srv"), cmd_in(l, Host::B, srv_run, srv));
    s.wait_for(ready, T);
    let mut c = spawn(&format!("{name}-cli"), cmd_in(l, Host::A, cli_run, cli));
    (s, c.success(T))
}

#[test]
#[ignore = "needs root"]
fn udp_ip_ttl_and_tos_leave_as_set_in_both_placements() {
    let l = lab("ou");
    for (run, port) in with_ports(14100, [false, true]) {
        let recv = (false, &["udp-recv", B, &port][..], "ready");
        let (mut r, sent) = probe_pair(
            &l,
            &format!("udp-{port}"),
            recv,
            (run, &["udp-send", B, &port]),
        );
        let got = r.success(T);
        assert_eq!(line_of(&got, "ttl="), "ttl=7 tos=0xb8", "run={run}\n{got}");
        // getsockopt reads back what was set, as plainly.
        assert_eq!(
            line_of(&sent, "ttl="),
            "ttl=7 tos=0xb8",
            "run={run}\n{sent}"
        );
        if run {
            // Honoured on the engine (not by moving the socket away).
            assert!(
                sent.contains(": xdp (") && !sent.contains("xdp not used"),
                "the sender did not stay on the engine:\n{sent}"
            );
        }
    }
}

/// An option the engine does not apply moves a UDP socket to the kernel
/// (issue 20, "any other option"): an echo server answers its first
/// datagram on the engine, then sets IP_PKTINFO and IP_RECVTTL (`Off` rows
/// of `opts.rs`: honoured only while off) and answers three more, each
/// printed with its ancillary data (interface, addresses, TTL): the same
/// output plainly and under run, where the shim says the socket left the
/// engine for that option.
#[test]
#[ignore = "needs root"]
fn udp_pktinfo_moves_the_socket_to_the_kernel_with_the_plain_ancillary_data() {
    let l = lab("op");
    let mut want = None;
    for (run, port) in with_ports(14600, [false, true]) {
        let srv = (run, &["udp-pktinfo-echo", B, &port, "3"][..], "ready");
        let cli = ["udp-ping", B, &port, "3"];
        let (mut s, co) = probe_pair(&l, &format!("pktinfo-{port}"), srv, (false, &cli));
        assert_eq!(co, "ping 0\nping 1\nping 2\nping 3\n", "run={run}");
        s.success(T);
        same_as_first(&mut want, "udp-pktinfo-echo", s.stdout(), &s.stderr());
        if run {
            on_engine(&s, &format!("udp {B}:{port}"));
            assert!(
                s.stderr().contains(
                    "taken off the xdp engine (kernel socket, spin engine): option IP_PKTINFO is not honoured"
                ),
                "{}",
                s.both()
            );
            // Said once, though a second option (IP_RECVTTL) follows.
            assert_eq!(
                s.stderr().matches("taken off the xdp engine").count(),
                1,
                "{}",
                s.both()
            );
        }
    }
    let out = want.expect("plain output");
    assert!(
        out.contains(&format!(
            "pktinfo if={} spec_dst={B} addr={B} ttl=64",
            l.iface(Host::B)
        )),
        "{out}"
    );
}

#[test]
#[ignore = "needs root"]
fn tcp_ip_ttl_and_tos_on_the_engines_segments() {
    let l = lab("ot");
    // (server under run, client under run): the plain end captures.
    for (i, (srv_run, cli_run)) in [(false, false), (true, false), (false, true)]
        .into_iter()
        .enumerate()
    {
        let port = (14200 + i).to_string();
        let (name, p) = (format!("hdr-{i}"), probe());
        let (srv, cli) = (["tcp-hdr-server", B, &port], ["tcp-hdr-client", B, &port]);
        let (s, c) = script_pair(&l, (&name, &p), (srv_run, &srv), (cli_run, &cli), T);
        let (co, so) = (c.both(), s.both());
        let want = "seen ttl=7 tos=0xb8";
        if !srv_run {
            assert_eq!(line_of(&so, "seen"), want, "server's capture\n{so}\n{co}");
        }
        if !cli_run {
            assert_eq!(line_of(&co, "seen"), want, "client's capture\n{co}\n{so}");
        }
        assert_eq!(line_of(&so, "accepted"), "accepted ttl=7 tos=0xb8", "{so}");
        if srv_run {
            on_engine(&s, &format!("tcp listener {B}:{port}"));
        }
        if cli_run {
            on_engine(&c, &format!("-> {B}:{port}"));
        }
    }
}

/// A connect that set neither IP_TTL nor IP_TOS sends the namespace's
/// defaults (the engine reads them once, not per connect: host a's
/// `ip_default_ttl` changed to 33 must show on every segment), and an
/// option set later still reaches the next connection's segments: the
/// same capture plainly and with the client under run.
#[test]
#[ignore = "needs root"]
fn tcp_connects_without_options_send_the_namespaces_defaults() {
    let l = lab("od");
    nanowire_testkit::ok(
        &plain_in(
            &l,
            Host::A,
            &["sysctl", "-qw", "net.ipv4.ip_default_ttl=33"],
        )
        .output()
        .expect("sysctl"),
    );
    let mut seen = Vec::new();
    for (cli_run, port) in with_ports(14300, [false, true]) {
        let (name, p) = (format!("dflt-{port}"), probe());
        let srv = ["tcp-echo-capture", B, &port, "3", A];
        let cli = ["tcp-default-client", B, &port];
        let (s, c) = script_pair(&l, (&name, &p), (false, &srv), (cli_run, &cli), T);
        let (so, co) = (s.both(), c.both());
        assert_eq!(co.matches("connected hdr").count(), 3, "{co}\n{so}");
        if cli_run {
            on_engine(&c, &format!("-> {B}:{port}"));
        }
        seen.push(line_of(&so, "seen").to_string());
    }
    assert_eq!(seen[0], "seen ttl=9 tos=0x00 ttl=33 tos=0x00", "plainly");
    assert_eq!(seen[1], seen[0], "under run (left) and plainly (right)");
}

#[test]
#[ignore = "needs root"]
fn tcp_md5sig_never_goes_unsigned() {
    let l = lab("om");
    // A signing client against a server with no key: no connection, in
    // both placements of the client.
    for (run, port) in with_ports(14300, [false, true]) {
        let srv = (false, &["md5-server", B, &port][..], "listening");
        let cli = ["md5-client", B, &port, "nanowire-md5-key"];
        let (_s, co) = probe_pair(&l, &format!("md5-nokey-{port}"), srv, (run, &cli));
        assert_eq!(line_of(&co, "timeout"), "timeout", "run={run}\n{co}");
        if run {
            assert!(
                co.contains("xdp not used: option TCP_MD5SIG is not honoured"),
                "{co}"
            );
        }
    }
    // Matching keys on both ends connect, whichever end is under run.
    for (i, (srv_run, cli_run)) in [(false, false), (false, true), (true, false)]
        .into_iter()
        .enumerate()
    {
        let port = (14310 + i).to_string();
        let srv = (srv_run, &["md5-server", B, &port, A][..], "listening");
        let cli = ["md5-client", B, &port, "nanowire-md5-key"];
        let (mut s, co) = probe_pair(&l, &format!("md5-key-{i}"), srv, (cli_run, &cli));
        assert_eq!(line_of(&co, "connected"), "connected signed", "{co}");
        let so = s.success(T);
        assert!(so.contains("accepted"), "{so}");
    }
}

#[test]
#[ignore = "needs root"]
fn tcp_minttl_refuses_lower_ttls_as_the_kernel() {
    let l = lab("on");
    // IP_MINTTL 255 set before listen, or after (the engine's listener
    // then sends new connections to the kernel), plainly and under run.
    for (i, (run, when)) in [
        (false, "before"),
        (true, "before"),
        (false, "after"),
        (true, "after"),
    ]
    .into_iter()
    .enumerate()
    {
        let port = (14400 + i).to_string();
        let srv = (
            run,
            &["minttl-server", B, &port, when][..],
            "listening minttl=255",
        );
        let cli = ["ttl-client", B, &port, "64"];
        let (mut s, lo) = probe_pair(&l, &format!("minttl-{i}"), srv, (false, &cli));
        assert_eq!(line_of(&lo, "timeout"), "timeout", "run={run} {when}\n{lo}");
        let mut high = spawn(
            &format!("ttl255-{i}"),
            cmd_in(&l, Host::A, false, &["ttl-client", B, &port, "255"]),
        );
        let hi = high.success(T);
        assert_eq!(line_of(&hi, "connected"), "connected ttl ok", "{hi}");
        let so = s.success(T);
        assert!(so.contains("accepted 1"), "{so}");
        if run && when == "after" {
            assert!(
                so.contains("new connections go to the kernel: option IP_MINTTL"),
                "{so}"
            );
        }
    }
}

/// TCP-AO (options 38-42: ADD_KEY, DEL_KEY, INFO, GET_KEYS, REPAIR), set
/// and read on a socket before bind/connect, on a listener, on a connected
/// and on an accepted connection (`ao-server`/`ao-client`), each end in
/// turn under run: every call answers as plainly (result or errno, line
/// for line) and the echo after them goes through. Where the kernel takes
/// a key, the socket under run must say it left the engine (the shim's
/// TCP-AO row, `crates/preload/src/opts.rs`, the path
/// `tcp_md5sig_never_goes_unsigned` drives with TCP_MD5SIG); where every
/// call failed (this kernel has no CONFIG_TCP_AO: ENOPROTOOPT, EPERM for
/// TCP_AO_REPAIR on a listener) nothing was set, so the socket stays on
/// the engine, as a failed option leaves a plain socket as it was.
#[test]
#[ignore = "needs root"]
fn tcp_ao_options_answer_as_plainly_and_a_keyed_socket_leaves_the_engine() {
    let l = lab("oa");
    let (mut want_s, mut want_c) = (None, None);
    for (i, (srv_run, cli_run)) in [(false, false), (true, false), (false, true)]
        .into_iter()
        .enumerate()
    {
        let port = (14500 + i).to_string();
        let (name, p) = (format!("ao-{i}"), probe());
        let (srv, cli) = (["ao-server", B, &port, A], ["ao-client", B, &port]);
        let (s, c) = script_pair(&l, (&name, &p), (srv_run, &srv), (cli_run, &cli), T);
        let ctx = format!("{}\n{}", s.stderr(), c.stderr());
        same_as_first(&mut want_s, "ao-server", s.stdout(), &ctx);
        same_as_first(&mut want_c, "ao-client", c.stdout(), &ctx);
        assert!(c.stdout().contains("echo ao"), "{}", c.both());
        let (k, what) = match (srv_run, cli_run) {
            (true, _) => (&s, format!("tcp listener {B}:{port}")),
            (_, true) => (&c, format!("-> {B}:{port}")),
            _ => continue,
        };
        let keyed = k.stdout().contains("TCP_AO_ADD_KEY set: ok");
        if keyed {
            assert!(
                k.stderr().contains("option TCP-AO is not honoured"),
                "a TCP-AO key was taken but the socket did not leave the engine:\n{}",
                k.both()
            );
        } else {
            on_engine(k, &what);
            assert!(!k.stderr().contains("TCP-AO"), "{}", k.both());
        }
    }
}
