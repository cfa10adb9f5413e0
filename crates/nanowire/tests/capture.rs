//! `nanowire capture`: pcapng with nanosecond timestamps that tcpdump reads.

use nanowire_lab::testbed::{Host, ScopedLab};
use nanowire_testkit::Reaped;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[test]
#[ignore = "needs root"]
fn captures_udp_with_nanosecond_timestamps() {
    let lab = nanowire_testkit::lab("tcap");
    let dir = private_dir("nwcap");
    let file = dir.join("c.pcapng");
    let iface = lab.iface(Host::B);
    let cap = lab
        .command(
            Host::B,
            &[
                env!("CARGO_BIN_EXE_nanowire"),
                "capture",
                "-i",
                &iface,
                "-w",
                file.to_str().unwrap(),
                "-c",
                "5",
                "-t",
                "20",
                "--port",
                "9999",
            ],
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut cap = Reaped::new(cap);
    // Its packet socket is open once it has looked for xdp engines (it says
    // so): a fixed sleep could send the datagrams before the capture starts
    // on a loaded machine, and the capture would wait for frames gone by.
    let err = nanowire_testkit::line_channel(cap.stderr.take().unwrap());
    let t0 = Instant::now();
    loop {
        let left = Duration::from_secs(20).saturating_sub(t0.elapsed());
        match err.recv_timeout(left) {
            Ok(l) if l.contains("xdp engine") => break,
            Ok(_) => {}
            Err(e) => panic!("the capture never said it started: {e}"),
        }
    }
    // Five datagrams to port 9999, plus ping traffic the port filter must drop.
    let send = "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\nfor i in range(5):\n    s.sendto(b'nanowire%d'%i,('198.18.0.2',9999)); time.sleep(0.02)\n";
    assert!(
        lab.command(Host::A, &["ping", "-c", "2", "-i", "0.2", "198.18.0.2"])
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    );
    assert!(
        lab.command(Host::A, &["python3", "-c", send])
            .status()
            .unwrap()
            .success()
    );
    let t0 = Instant::now();
    while cap.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(25),
            "capture did not stop after 5 frames"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(cap.wait().unwrap().success());

    let bytes = std::fs::read(&file).unwrap();
    let pkts = nanowire_wire::pcapng::read_packets(&bytes).unwrap();
    assert_eq!(pkts.len(), 5);
    for (i, p) in pkts.iter().enumerate() {
        assert!(
            p.data.ends_with(format!("nanowire{i}").as_bytes()),
            "packet {i} payload"
        );
        assert_eq!(p.orig_len as usize, p.data.len());
    }
    // Timestamps are kernel times in ns since the epoch, increasing, not rounded to µs.
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(pkts.windows(2).all(|w| w[0].ts_ns < w[1].ts_ns));
    assert!(
        pkts.iter()
            .all(|p| p.ts_ns <= now_ns && now_ns - p.ts_ns < 60_000_000_000)
    );
    assert!(
        pkts.iter().any(|p| p.ts_ns % 1000 != 0),
        "nanosecond resolution"
    );

    // A standard reader agrees: tcpdump reads the file with nanosecond precision.
    let td = Command::new("tcpdump")
        .args([
            "-nn",
            "--time-stamp-precision=nano",
            "-r",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = nanowire_testkit::ok(&td);
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("198.18.0.2.9999"))
            .count(),
        5,
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_interface_is_a_clear_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_nanowire"))
        .args(["capture", "-i", "nosuchif0", "-w", "/dev/null", "-c", "1"])
        .output()
        .unwrap();
    let e = nanowire_testkit::one_line_failure("capture", &o, "nosuchif0");
    assert!(e.starts_with("nanowire: error: "), "{e}");
}

// ------------------------------------------------ accelerated traffic

const BIN: &str = env!("CARGO_BIN_EXE_nanowire");

/// Lab `nwcap<tag><pid>`, removed on drop.
fn cap_lab(tag: char) -> ScopedLab {
    nanowire_testkit::lab(&format!("nwcap{tag}"))
}

/// `xdp-test --echo` on `port` in host b, once it is up (it prints its
/// ready line on stdout).
fn xdp_echo(lab: &ScopedLab, port: u16) -> Spawned {
    let ifb = lab.iface(Host::B);
    let p = port.to_string();
    let echo = Spawned::new(
        lab.command(
            Host::B,
            &[
                nanowire_testkit::xdp_test_bin(),
                "--iface",
                &ifb,
                "--port",
                &p,
                "--echo",
            ],
        ),
        true,
    );
    echo.wait_out("\"ready\":true", Duration::from_secs(20));
    echo
}

/// A child with its stderr lines on a channel, killed on drop.
struct Spawned {
    child: Child,
    out: std::sync::mpsc::Receiver<String>,
    err: std::sync::mpsc::Receiver<String>,
}

fn lines_of(r: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            eprintln!("child: {l}");
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

impl Spawned {
    fn new(mut cmd: Command, stdin: bool) -> Spawned {
        let mut child = cmd
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let out = lines_of(child.stdout.take().unwrap());
        let err = lines_of(child.stderr.take().unwrap());
        Spawned { child, out, err }
    }

    /// Wait for a stderr line containing `what`.
    fn wait_line(&self, what: &str, timeout: Duration) -> String {
        Self::wait_on(&self.err, what, timeout)
    }

    /// Wait for a stdout line containing `what`.
    fn wait_out(&self, what: &str, timeout: Duration) -> String {
        Self::wait_on(&self.out, what, timeout)
    }

    fn wait_on(ch: &std::sync::mpsc::Receiver<String>, what: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match ch.recv_timeout(left) {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(_) => panic!("no stderr line with {what:?} in {timeout:?}"),
            }
        }
    }

    /// SIGINT, then wait (bounded) for a clean exit.
    fn interrupt(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < end, "child did not stop after SIGINT");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run a Python snippet in host a; its stdout.
fn py_a(lab: &ScopedLab, code: &str) -> String {
    let o = lab
        .command(Host::A, &["python3", "-c", code])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn udp_payload(frame: &[u8]) -> Option<(u16, u16, Vec<u8>)> {
    let eth = nanowire_wire::EthernetFrame::new_checked(frame).ok()?;
    let ip = nanowire_wire::Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.protocol() != 17 {
        return None;
    }
    let p = ip.payload();
    if p.len() < 8 {
        return None;
    }
    Some((
        u16::from_be_bytes([p[0], p[1]]),
        u16::from_be_bytes([p[2], p[3]]),
        p[8..].to_vec(),
    ))
}

/// `nanowire capture -i IFACE -w FILE ARGS -t 120` on host b's interface,
/// running (the 120 s only bound a capture a test failed to stop).
fn capture_in_b(lab: &ScopedLab, file: &std::path::Path, args: &[&str]) -> Spawned {
    let ifb = lab.iface(Host::B);
    let mut argv = vec![BIN, "capture", "-i", &ifb, "-w", file.to_str().unwrap()];
    argv.extend_from_slice(args);
    argv.extend(["-t", "120"]);
    Spawned::new(lab.command(Host::B, &argv), false)
}

/// A fresh directory only we can use (never a predictable file in /tmp).
fn private_dir(tag: &str) -> std::path::PathBuf {
    nanowire_lab::tmp::private_dir(tag).unwrap()
}

/// Lab `tag` with an xdp echo on `port` in host b and a capture (`args`)
/// tapping its engine into `tap.pcapng` of a private directory: (lab,
/// directory, echo, capture).
fn tapped_echo(tag: char, port: u16, args: &[&str]) -> (ScopedLab, PathBuf, Spawned, Spawned) {
    let lab = cap_lab(tag);
    let dir = private_dir(&format!("nwcap{tag}"));
    let echo = xdp_echo(&lab, port);
    let cap = capture_in_b(&lab, &dir.join("tap.pcapng"), args);
    cap.wait_line("tapping the xdp engine", Duration::from_secs(20));
    (lab, dir, echo, cap)
}

fn tshark_lines(file: &std::path::Path, filter: &str) -> usize {
    let o = Command::new("tshark")
        .args(["-n", "-r", file.to_str().unwrap(), "-Y", filter])
        .args(nanowire_testkit::words("-T fields -e frame.number"))
        .output()
        .expect("tshark is installed (scripts/install-deps.sh)");
    nanowire_testkit::ok(&o).lines().count()
}

/// Issue 13: a capture beside an accelerated echo server holds every frame
/// both ways (the engine's taps; the kernel's packet taps see none of it),
/// in timestamp order, and tshark reads the file.
#[test]
#[ignore = "needs root"]
fn tap_capture_holds_every_accelerated_frame_both_ways() {
    let (lab, dir, echo, mut cap) = tapped_echo('t', 5400, &["--port", "5400"]);
    let file = dir.join("tap.pcapng");
    const N: usize = 300;
    let out = py_a(
        &lab,
        &format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.settimeout(2)\nok=0\nfor i in range({N}):\n    m=b'tap%05d'%i\n    s.sendto(m,('198.18.0.2',5400))\n    d,_=s.recvfrom(100)\n    ok+=d==m\nprint(ok)\n"
        ),
    );
    assert_eq!(out.trim(), N.to_string(), "every echo came back");
    assert!(cap.interrupt().success());
    let summary = cap.wait_line("frames written", Duration::from_secs(5));
    assert!(summary.contains("0 engine copies dropped"), "{summary}");
    drop(echo);

    let pkts = nanowire_wire::pcapng::read_packets(&std::fs::read(&file).unwrap()).unwrap();
    let mut req = vec![0u32; N];
    let mut rep = vec![0u32; N];
    for p in &pkts {
        let (sp, dp, pl) = udp_payload(&p.data).expect("only UDP frames of port 5400");
        let i: usize = std::str::from_utf8(&pl[3..]).unwrap().parse().unwrap();
        match (sp, dp) {
            (_, 5400) => req[i] += 1,
            (5400, _) => rep[i] += 1,
            _ => panic!("port filter"),
        }
        assert_eq!(p.iface, 1, "accelerated frames come from the engine's tap");
    }
    assert!(req.iter().all(|&c| c == 1), "every request once: {req:?}");
    assert!(rep.iter().all(|&c| c == 1), "every reply once: {rep:?}");
    assert!(
        pkts.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns),
        "timestamps never go backwards"
    );
    assert_eq!(tshark_lines(&file, "udp.dstport == 5400"), N);
    assert_eq!(tshark_lines(&file, "udp.srcport == 5400"), N);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 13: the dedicated mode captures a burst as deep as its ring with
/// zero loss, and says so.
#[test]
#[ignore = "needs root"]
fn dedicated_capture_holds_a_ring_deep_burst() {
    let lab = cap_lab('d');
    let dir = private_dir("nwcapd");
    let file = dir.join("ded.pcapng");
    const RING: usize = 2048;
    let ring = RING.to_string();
    let mut cap = capture_in_b(
        &lab,
        &file,
        &["--xdp", "--ring", &ring, "--port", "7400", "-c", &ring],
    );
    cap.wait_line("dedicated XDP capture", Duration::from_secs(20));
    py_a(
        &lab,
        &format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\nfor i in range({RING}):\n    s.sendto(b'burst%06d'%i,('198.18.0.2',7400))\n"
        ),
    );
    let summary = cap.wait_line("frames written", Duration::from_secs(60));
    let end = Instant::now() + Duration::from_secs(10);
    while cap.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "capture did not exit after -c");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cap.child.wait().unwrap().success());
    assert!(
        summary.contains(&format!("{RING} frames written")),
        "{summary}"
    );
    assert!(summary.contains("lost 0"), "{summary}");
    let pkts = nanowire_wire::pcapng::read_packets(&std::fs::read(&file).unwrap()).unwrap();
    let mut seen = vec![false; RING];
    for p in &pkts {
        let (_, dp, pl) = udp_payload(&p.data).unwrap();
        assert_eq!(dp, 7400);
        let i: usize = std::str::from_utf8(&pl[5..]).unwrap().parse().unwrap();
        assert!(!seen[i], "frame {i} twice");
        seen[i] = true;
    }
    assert!(seen.iter().all(|&s| s), "every frame of the burst");
    assert!(pkts.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    assert_eq!(tshark_lines(&file, "udp.dstport == 7400"), RING);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Words of the header of the engine's tap file(s) (`crates/tap`):
/// (`attached`, copies made into the received ring).
fn tap_words(engine_pid: u32) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/dev/shm/nanowire-tap")
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{engine_pid}-")) && name.ends_with(".tap") {
            let b = std::fs::read(e.path()).unwrap();
            let w = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
            v.push((w(128), w(256 + 136)));
        }
    }
    v
}

/// Issue 13: a capture killed with SIGKILL (no chance to detach) does not
/// leave the engine copying frames for nobody: the engine finds its holder
/// dead and stops.
#[test]
#[ignore = "needs root"]
fn a_capture_killed_with_sigkill_stops_the_engine_copying() {
    let (lab, dir, echo, mut cap) = tapped_echo('k', 5500, &[]);
    let epid = echo.child.id();
    let echoes = |n: usize| {
        let out = py_a(
            &lab,
            &format!(
                "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.settimeout(2)\nok=0\nfor i in range({n}):\n    s.sendto(b'k%d'%i,('198.18.0.2',5500))\n    ok+=len(s.recvfrom(100)[0])>0\n    time.sleep(0.01)\nprint(ok)\n"
            ),
        );
        assert_eq!(out.trim(), n.to_string());
    };
    echoes(5);
    let w = tap_words(epid);
    assert!(
        w.len() == 1 && w[0].0 != 0 && w[0].1 >= 5,
        "attached, copying: {w:?}"
    );
    cap.child.kill().unwrap(); // SIGKILL: no detach
    cap.child.wait().unwrap();
    assert_ne!(tap_words(epid)[0].0, 0, "still marked attached right after");
    // Traffic for longer than the engine's check interval (100 ms).
    echoes(40);
    let (att, made) = tap_words(epid)[0];
    assert_eq!(att, 0, "the engine detached the dead capture");
    echoes(10);
    assert_eq!(tap_words(epid)[0].1, made, "no copies after the detach");
    drop(echo);
    let _ = std::fs::remove_dir_all(&dir);
}
