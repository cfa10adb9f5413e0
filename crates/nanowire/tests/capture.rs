//! `nanowire capture`: pcapng with nanosecond timestamps that tcpdump reads.

use nanowire_lab::testbed::{Host, LabOptions, ScopedLab};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn captures_udp_with_nanosecond_timestamps() {
    let lab = ScopedLab::new(LabOptions {
        name: format!("tc{}", std::process::id() % 10000),
        ..Default::default()
    })
    .unwrap();
    let dir = std::env::temp_dir().join(format!("nwcap{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
    let mut cap = Kill(cap);
    std::thread::sleep(Duration::from_millis(300));
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
    while cap.0.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(25),
            "capture did not stop after 5 frames"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(cap.0.wait().unwrap().success());

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
    assert!(
        td.status.success(),
        "{}",
        String::from_utf8_lossy(&td.stderr)
    );
    let text = String::from_utf8_lossy(&td.stdout);
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
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.starts_with("nanowire: error: ") && e.contains("nosuchif0") && !e.contains("panicked"),
        "{e}"
    );
}
