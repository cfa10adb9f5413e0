//! SO_TIMESTAMPING / SO_TIMESTAMPNS / SO_TIMESTAMP on sockets the xdp
//! engine serves (issue 13): one C program (crates/preload/tests/
//! timestamping.c) run plainly and under `nanowire run` against a plain
//! echo server on the other lab host; the normalized outputs (which
//! control messages, error-queue fields, OPT_ID sequence, stamps inside
//! [before send, after receive] and monotonic, POLLERR) must be identical,
//! and under run the sockets must really be on the engine (`nanowire stats`).
//! The same for a Python program (socket.recvmsg with ancillary data).
//! Covered: the first datagram to a peer whose neighbour entry is not
//! resolved yet and a datagram above the MTU (both take the kernel path
//! under run, stamped there under the engine's OPT_ID sequence).

mod run_support;
use nanowire_lab::testbed::Host;
use nanowire_testkit::{A, B};
use run_support::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

const ECHO: &str = "import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind((sys.argv[1],12600))\nprint('ready',flush=True)\nwhile True:\n    d,a=s.recvfrom(4096)\n    s.sendto(d,a)\n";

#[test]
#[ignore = "needs root"]
fn timestamping_on_xdp_sockets_matches_a_plain_run() {
    let lab = nanowire_testkit::lab("nwtt");
    ensure_preload();
    let bin = build_c("timestamping", "../preload/tests/timestamping.c");
    let dir = bin.parent().unwrap().to_path_buf();
    let bin = bin.to_str().unwrap();
    let mut echo = spawn(
        "tt-echo",
        plain_in(&lab, Host::B, &["python3", "-c", ECHO, B]),
    );
    echo.wait_for("ready", Duration::from_secs(20));

    // No neighbour entry for the peer before each run: the first datagram
    // waits for ARP (under run it goes through the kernel socket under the
    // fd, which stamps it when it leaves, under the same OPT_ID).
    let flush = || {
        assert!(
            lab.command(Host::A, &["ip", "neigh", "flush", "all"])
                .status()
                .unwrap()
                .success()
        )
    };
    flush();
    let mut plain = spawn("tt-plain", plain_in(&lab, Host::A, &[bin, A, B, "12600"]));
    plain.success(T);
    let want = plain.stdout();
    // The kernel's own answers are what the engine must reproduce.
    for needle in [
        "getsockopt SO_TIMESTAMPING: equal=1",
        "tx 3: pollerr=1",
        "errqueue 3: len=0 namelen=0 flags=ERRQUEUE cmsgs=[SCM_TIMESTAMPING,IP_RECVERR] ts1=0 ts2=0 ee_errno=ENOMSG origin=4 type=0 code=0 info=0 data=3",
        "rx 3: len=7 namelen=16 flags= cmsgs=[SCM_TIMESTAMPING] ts1=0 ts2=0 stamp_in_window=1 monotonic=1",
        "errqueue 0: len=0 namelen=0 flags=ERRQUEUE cmsgs=[SCM_TIMESTAMPING,IP_RECVERR] ts1=0 ts2=0 ee_errno=ENOMSG origin=4 type=0 code=0 info=0 data=0",
        "errqueue big: len=0 namelen=0 flags=ERRQUEUE cmsgs=[SCM_TIMESTAMPING,IP_RECVERR] ts1=0 ts2=0 ee_errno=ENOMSG origin=4 type=0 code=0 info=0 data=4",
        "rx big: len=2048 namelen=16 flags=|TRUNC cmsgs=[SCM_TIMESTAMPING] ts1=0 ts2=0 stamp_in_window=1",
        "errqueue after: EAGAIN",
        "pollerr after: 0",
        "rx ns: len=8 namelen=16 flags= cmsgs=[SCM_TIMESTAMPNS] stamp_in_window=1 monotonic=1",
        "rx us: len=8 namelen=16 flags= cmsgs=[SCM_TIMESTAMP] stamp_in_window=1 monotonic=1",
        "rx off: len=8 namelen=16 flags= cmsgs=[]",
        "rx new: len=8 namelen=16 flags= cmsgs=[SCM_TIMESTAMPNS_NEW,SCM_TIMESTAMPING_NEW] ts1=0 ts2=0 stamp_in_window=1",
        "rx small control: n=8 ctrunc=1",
        "epoll: n=1 err=1 data=7",
        "epoll after: err=0",
        "errqueue6: len=0 namelen=0 flags=ERRQUEUE cmsgs=[SCM_TIMESTAMPING,IP_RECVERR] ts1=0 ts2=0 ee_errno=ENOMSG origin=4 type=0 code=0 info=0 data=1",
        "errqueue6 after: EAGAIN",
        "rx6: 8 8",
    ] {
        assert!(want.contains(needle), "plain run lacks {needle:?}:\n{want}");
    }

    flush();
    let hold = dir.join("release");
    let _ = std::fs::remove_file(&hold);
    let mut c = run_in(&lab, Host::A, &[], &[bin, A, B, "12600"]);
    c.env("NANOWIRE_LOG", "info")
        .env("TS_HOLD", hold.to_str().unwrap());
    let mut k = spawn("tt-xdp", c);
    k.wait_for("holding", T);
    // Every socket of the program is on the engine, none was taken off.
    let st = lab
        .command(Host::A, &[nanowire(), "stats"])
        .output()
        .unwrap();
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    std::fs::write(&hold, b"").unwrap();
    k.success(T);
    for port in [12601, 12602, 12603, 12604, 12605, 12606] {
        // (12606 was taken off the engine on purpose before the look.)
        assert!(
            port == 12606 || st.contains(&format!("socket {A}:{port}")),
            "port {port} not on the engine:\n{st}\n{}",
            k.stderr()
        );
        assert!(
            k.stderr()
                .contains(&format!("udp {A}:{port}: xdp (interface")),
            "{}",
            k.stderr()
        );
    }
    // One socket only is taken off the engine, on purpose (IP_PKTINFO):
    // its unread stamps must still come out.
    assert!(
        k.stderr().matches("taken off").count() == 1
            && k.stderr().contains("IP_PKTINFO")
            && !k.stderr().contains("xdp not used"),
        "{}",
        k.stderr()
    );
    let got = k.stdout().replace("holding\n", "");
    // The same from Python (socket.recvmsg with ancillary data).
    let py = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../preload/tests/timestamping.py")
        .to_string_lossy()
        .into_owned();
    let mut pp = spawn(
        "tt-py-plain",
        plain_in(&lab, Host::A, &["python3", &py, A, B, "12600"]),
    );
    pp.success(T);
    let mut c = run_in(&lab, Host::A, &[], &["python3", &py, A, B, "12600"]);
    c.env("NANOWIRE_LOG", "info");
    let mut px = spawn("tt-py-xdp", c);
    px.success(T);
    assert!(
        pp.stdout().contains("ts errqueue: len=0 errqueue=True TIMESTAMPING in_window=True rest_zero=True; RECVERR errno=42 origin=4 info=0 key=2")
            && pp.stdout().contains("ns rx: len=7 errqueue=False TIMESTAMPNS in_window=True"),
        "{}",
        pp.stdout()
    );
    assert_eq!(pp.stdout(), px.stdout(), "python, plain vs under run");
    for port in [12611, 12612] {
        assert!(
            px.stderr()
                .contains(&format!("udp {A}:{port}: xdp (interface")),
            "{}",
            px.stderr()
        );
    }
    let want = want.replace("holding\n", "");
    assert_same_output("timestamping", &want, &got, "");
}
