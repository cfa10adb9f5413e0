//! Wire compatibility with the real Linux TCP, before any engine: our stack
//! runs in namespace `a` over an AF_PACKET socket on one end of a veth pair;
//! the peer in namespace `b` is a plain kernel socket (Python). The address
//! our stack uses is not configured in `a`'s kernel, so the kernel there
//! neither answers nor resets (not forwarding: it drops silently); `b` has a
//! permanent neighbour entry for it. Needs root: every test here is
//! `#[ignore = "needs root"]` (`make test` runs them).

mod host;
use host::Link;
use nanowire_tcp::{Config, ConnId, Error, Secret, State, TcpStack};
use nanowire_wire::ethernet::EthernetFrame;
use nanowire_wire::ipv4::{Ipv4Packet, Ipv4Repr, PROTO_TCP};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const OURS: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 2);

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output();
    nanowire_testkit::ok(&o.unwrap_or_else(|e| panic!("{args:?}: {e}")));
}

/// Two namespaces and a veth pair, removed on drop (made as root only:
/// `Lab::new` fails with testkit's one line otherwise).
struct Lab {
    a: String,
    b: String,
    ifa: String,
    ifb: String,
}

impl Lab {
    fn new(tag: &str) -> Lab {
        nanowire_testkit::require_root();
        let id = std::process::id() % 100_000;
        let l = Lab {
            a: format!("nwtcp{tag}{id}a"),
            b: format!("nwtcp{tag}{id}b"),
            ifa: format!("nwt{tag}{id}a"),
            ifb: format!("nwt{tag}{id}b"),
        };
        let _ = Command::new("ip").args(["netns", "del", &l.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &l.b]).output();
        sh(&["ip", "netns", "add", &l.a]);
        sh(&["ip", "netns", "add", &l.b]);
        sh(&[
            "ip", "link", "add", &l.ifa, "netns", &l.a, "type", "veth", "peer", "name", &l.ifb,
            "netns", &l.b,
        ]);
        sh(&["ip", "-n", &l.a, "link", "set", &l.ifa, "up"]);
        sh(&["ip", "-n", &l.b, "link", "set", &l.ifb, "up"]);
        sh(&["ip", "-n", &l.b, "link", "set", "lo", "up"]);
        sh(&[
            "ip",
            "-n",
            &l.b,
            "addr",
            "add",
            &format!("{PEER}/24"),
            "dev",
            &l.ifb,
        ]);
        // b's offloads as the kernel sets them (TSO/GSO on): its segments
        // reach our packet socket as 64 KiB super-segments with partial
        // checksums, which our stack takes as they come.
        let mac_a = l.mac(&l.a, &l.ifa);
        sh(&[
            "ip",
            "-n",
            &l.b,
            "neigh",
            "add",
            &OURS.to_string(),
            "lladdr",
            &mac_a,
            "dev",
            &l.ifb,
            "nud",
            "permanent",
        ]);
        l
    }

    fn mac(&self, ns: &str, dev: &str) -> String {
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "cat",
                &format!("/sys/class/net/{dev}/address"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    fn python(&self, script: &str, args: &[&str]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.b, "python3", "-c", script])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}

fn parse_mac(s: &str) -> [u8; 6] {
    let mut m = [0u8; 6];
    for (i, p) in s.split(':').enumerate().take(6) {
        m[i] = u8::from_str_radix(p, 16).unwrap();
    }
    m
}

/// An AF_PACKET socket bound to one interface, opened inside a namespace.
struct Raw {
    fd: OwnedFd,
    ifindex: i32,
    mac: [u8; 6],
    peer_mac: [u8; 6],
}

impl Raw {
    fn open(ns: &str, dev: &str, mac: [u8; 6], peer_mac: [u8; 6]) -> Raw {
        let nsf = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("netns file");
        // SAFETY: setns on a valid namespace fd only changes this thread's
        // network namespace; the test thread owns it and never returns to
        // code that assumes the original namespace.
        let rc = unsafe { libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        let proto = (libc::ETH_P_IP as u16).to_be();
        // SAFETY: plain socket(2) call; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK,
                i32::from(proto),
            )
        };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a fresh descriptor we own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let cname = std::ffi::CString::new(dev).unwrap();
        // SAFETY: cname is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        assert!(ifindex > 0, "no interface {dev}");
        // SAFETY: an all-zero sockaddr_ll is a valid value of the type.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex;
        // SAFETY: sll is a properly initialised sockaddr_ll and the length matches.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        Raw {
            fd,
            ifindex,
            mac,
            peer_mac,
        }
    }

    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: buf is valid for writes of buf.len() bytes.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        (n > 0).then_some(n as usize)
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: an all-zero sockaddr_ll is a valid value of the type.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&self.peer_mac);
        // SAFETY: frame and sll are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(
            n as usize,
            frame.len(),
            "sendto: {}",
            std::io::Error::last_os_error()
        );
    }

    fn wait(&self, timeout: Duration) {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(0, 10) as i32;
        // SAFETY: p is one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) };
    }
}

/// The wire side for `host::Host`: frames over the raw socket.
struct RawLink {
    raw: Raw,
    rx: Vec<u8>,
    tx: Vec<u8>,
}

impl Link for RawLink {
    fn receive(&mut self, now: u64, stack: &mut TcpStack) -> usize {
        let mut n = 0;
        while let Some(len) = self.raw.recv(&mut self.rx) {
            let Ok(eth) = EthernetFrame::new_checked(&self.rx[..len]) else {
                continue;
            };
            let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                continue;
            };
            if ip.protocol() != PROTO_TCP || ip.dst() != OURS {
                continue;
            }
            stack.input(now, ip.src(), ip.dst(), ip.payload());
            n += 1;
        }
        n
    }

    fn transmit(&mut self, now: u64, stack: &mut TcpStack) -> usize {
        let (eh, ih) = (14, 20);
        let mut n = 0;
        while let Some(t) = stack.poll_transmit(now, &mut self.tx[eh + ih..]) {
            self.tx[0..6].copy_from_slice(&self.raw.peer_mac);
            self.tx[6..12].copy_from_slice(&self.raw.mac);
            self.tx[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
            Ipv4Repr {
                src: t.src,
                dst: t.dst,
                protocol: PROTO_TCP,
                payload_len: t.len,
                ttl: 64,
                ident: 0,
            }
            .emit(&mut self.tx[eh..]);
            self.raw.send(&self.tx[..eh + ih + t.len]);
            n += 1;
        }
        n
    }

    fn wait(&mut self, max: Duration) {
        self.raw.wait(max);
    }
}

type Host = host::Host<RawLink>;

fn new_host(raw: Raw, cfg: Config) -> Host {
    Host::new(
        TcpStack::new(cfg, Secret::from_os().unwrap()),
        RawLink {
            raw,
            rx: vec![0u8; 70_000],
            tx: vec![0u8; 70_000],
        },
    )
}

const IDLE: Duration = Duration::from_millis(5);

fn crc32(mut crc: u32, data: &[u8]) -> u32 {
    crc = !crc;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

fn pattern(off: u64) -> u8 {
    (off.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 29) as u8 ^ off as u8
}

/// Opens the raw link on lab host a in the thread that calls it (the open
/// moves that thread into host a's namespace).
fn raw_link(lab: &Lab) -> impl FnOnce() -> Raw + Send + 'static {
    let (a, ifa) = (lab.a.clone(), lab.ifa.clone());
    let mac_a = parse_mac(&lab.mac(&lab.a, &lab.ifa));
    let mac_b = parse_mac(&lab.mac(&lab.b, &lab.ifb));
    move || Raw::open(&a, &ifa, mac_a, mac_b)
}

/// A host on the lab's raw link with `cfg`, handed to `f` on a thread of
/// its own.
fn host_thread<T: Send + 'static>(
    lab: &Lab,
    cfg: Config,
    f: impl FnOnce(Host) -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let open = raw_link(lab);
    std::thread::spawn(move || f(new_host(open(), cfg)))
}

fn host(lab: &Lab) -> Host {
    new_host(
        raw_link(lab)(),
        Config {
            mss: Config::mss_for_mtu(1500),
            rto_min_ns: 20_000_000,
            ..Config::default()
        },
    )
}

const CLIENT_PY: &str = r#"
import socket, sys, hashlib, os
n = int(sys.argv[3])
data = os.urandom(n)
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sent = 0
got = bytearray()
c.setblocking(False)
import select
while sent < n or True:
    r, w, _ = select.select([c], [c] if sent < n else [], [], 90)
    if not r and not w: raise SystemExit("stalled")
    if w:
        sent += c.send(data[sent:sent + (1 << 16)])
        if sent == n: c.shutdown(socket.SHUT_WR)
    if r:
        d = c.recv(1 << 16)
        if not d: break
        got += d
ok = hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
print("OK" if ok else "MISMATCH", len(got), flush=True)
"#;

fn wait_line(child: &mut Child) -> String {
    use std::io::{BufRead, BufReader};
    let out = child.stdout.as_mut().unwrap();
    let mut l = String::new();
    BufReader::new(out).read_line(&mut l).unwrap();
    l
}

#[test]
#[ignore = "needs root"]
fn our_client_to_kernel_server_32_mib_hashed() {
    client_to_kernel("c", 32 << 20, None);
}

#[test]
#[ignore = "needs root"]
fn our_client_with_injected_faults_to_kernel_server_8_mib_hashed() {
    // Our stack drops, duplicates, reorders and corrupts on both its paths:
    // the kernel sees a lossy, reordering peer and both recover.
    // No corruption on our receive side: the kernel's segments arrive over
    // veth with partial (offload) checksums, which cannot catch a flipped
    // bit, so a corrupted timestamp would poison PAWS (on a real NIC the
    // checksum is complete). Our corrupted transmissions are caught by the
    // kernel's checksum check.
    let f = |corrupt, seed| {
        nanowire_tcp::fault::FaultConfig::parse(&format!(
            "loss=0.01,dup=0.01,reorder=0.02,reorder_delay_us=300,corrupt={corrupt},seed={seed}"
        ))
        .unwrap()
    };
    client_to_kernel("i", 8 << 20, Some((f(0.0, 11), f(0.002, 12))));
}

fn client_to_kernel(
    tag: &str,
    total: u64,
    faults: Option<(
        nanowire_tcp::fault::FaultConfig,
        nanowire_tcp::fault::FaultConfig,
    )>,
) {
    let lab = Lab::new(tag);
    // The peer reads to EOF, answers "<bytes> <crc32>" and sends nothing more.
    let mut py = lab.python(
        nanowire_testkit::HASHED_PEER_PY,
        &[&PEER.to_string(), "5001", "0"],
    );
    assert_eq!(wait_line(&mut py).trim(), "listening");
    let lab_ref = &lab;
    let faults_on = faults.is_some();
    let (crc_local, reply, info) = std::thread::scope(|s| {
        s.spawn(move || {
            let mut h = host(lab_ref);
            if let Some((rx, tx)) = faults {
                h.stack.set_faults(rx, tx);
            }
            let now = h.now();
            let c = h
                .stack
                .connect(
                    now,
                    SocketAddrV4::new(OURS, 0),
                    SocketAddrV4::new(PEER, 5001),
                )
                .unwrap();
            let total_bytes = total;
            let mut sent = 0u64;
            let mut crc = 0u32;
            let mut chunk = vec![0u8; 65536];
            let mut reply = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut shut = false;
            loop {
                assert!(
                    Instant::now() < deadline,
                    "transfer stalled: {:?} {:?} {:?}",
                    h.stack.info(c),
                    h.stack.counters(),
                    h.stack.fault_stats()
                );
                h.turn();
                if h.stack.state(c) == Ok(State::SynSent) {
                    h.idle(IDLE);
                    continue;
                }
                while sent < total_bytes {
                    let n = ((total_bytes - sent) as usize).min(chunk.len());
                    for (i, b) in chunk[..n].iter_mut().enumerate() {
                        *b = pattern(sent + i as u64);
                    }
                    match h.stack.send(c, &chunk[..n]) {
                        Ok(k) => {
                            crc = crc32(crc, &chunk[..k]);
                            sent += k as u64;
                        }
                        Err(Error::WouldBlock) => break,
                        Err(e) => panic!("send: {e}"),
                    }
                }
                if sent == total_bytes && !shut {
                    h.stack.shutdown_write(c).unwrap();
                    shut = true;
                }
                match h.stack.recv(c, &mut chunk) {
                    Ok(0) => break,
                    Ok(k) => reply.extend_from_slice(&chunk[..k]),
                    Err(Error::WouldBlock) => h.idle(IDLE),
                    Err(e) => panic!("recv: {e}"),
                }
            }
            let info = h.stack.info(c).unwrap();
            eprintln!("faults: {:?}", h.stack.fault_stats());
            h.stack.close(h.now(), c).unwrap();
            for _ in 0..20 {
                h.turn();
                h.idle(IDLE);
            }
            (crc, String::from_utf8(reply).unwrap(), info)
        })
        .join()
        .unwrap()
    });
    nanowire_testkit::ok(&py.wait_with_output().unwrap());
    eprintln!("client side: {info:?}");
    assert_eq!(reply.trim(), format!("{total} {crc_local}"));
    assert!(
        info.sack && info.timestamps && info.snd_wscale > 0,
        "{info:?}"
    );
    if faults_on {
        assert!(info.total_retrans > 0, "{info:?}");
    }
}

#[test]
#[ignore = "needs root"]
fn kernel_client_to_our_server_echo_16_mib_hashed() {
    let lab = Lab::new("s");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let server = host_thread(
        &lab,
        Config {
            rto_min_ns: 20_000_000,
            ..Config::default()
        },
        move |mut h| {
            let l = h.stack.listen(SocketAddrV4::new(OURS, 5002), 16).unwrap();
            tx.send(()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut conn: Option<ConnId> = None;
            let mut pending: Vec<u8> = Vec::new();
            let mut buf = vec![0u8; 65536];
            let mut echoed = 0u64;
            loop {
                assert!(
                    Instant::now() < deadline,
                    "echo stalled: pending {} echoed {echoed} {:?} {:?}",
                    pending.len(),
                    conn.map(|c| h.stack.info(c)),
                    h.stack.counters()
                );
                h.turn();
                if conn.is_none() {
                    conn = h.stack.accept(l);
                }
                let Some(c) = conn else {
                    h.idle(IDLE);
                    continue;
                };
                // Echo: flush what is pending, then read more.
                if !pending.is_empty() {
                    match h.stack.send(c, &pending) {
                        Ok(k) => {
                            pending.drain(..k);
                            echoed += k as u64;
                        }
                        Err(Error::WouldBlock) => {}
                        Err(e) => panic!("send: {e}"),
                    }
                }
                if pending.len() < (1 << 20) {
                    match h.stack.recv(c, &mut buf) {
                        Ok(0) if pending.is_empty() => {
                            h.stack.close(h.now(), c).unwrap();
                            break;
                        }
                        Ok(k) => pending.extend_from_slice(&buf[..k]),
                        Err(Error::WouldBlock) => h.idle(IDLE),
                        Err(e) => panic!("recv: {e}"),
                    }
                } else {
                    h.idle(IDLE);
                }
            }
            for _ in 0..50 {
                h.turn();
                h.idle(IDLE);
            }
            (echoed, h.stack.counters().clone())
        },
    );
    rx.recv().unwrap();
    let py = lab.python(
        CLIENT_PY,
        &[&OURS.to_string(), "5002", &(16u32 << 20).to_string()],
    );
    let out = py.wait_with_output().unwrap();
    let (echoed, counters) = server.join().unwrap();
    let stdout = nanowire_testkit::ok(&out);
    assert_eq!(stdout.trim(), format!("OK {}", 16u32 << 20));
    eprintln!("server counters: {counters:?}");
    assert_eq!(echoed, 16 << 20);
    assert_eq!(counters.bad_checksum, 0, "{counters:?}");
}

const FLOOD_PY: &str = r#"
import socket, struct, sys, random
dst = sys.argv[1]; port = int(sys.argv[2]); n = int(sys.argv[3])
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
r.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
d = socket.inet_aton(dst)
rnd = random.Random(7)
for i in range(n):
    src = socket.inet_aton("198.18.%d.%d" % (128 + (i >> 8) % 64, i & 0xff or 1))
    sport = 1024 + rnd.randrange(60000)
    tcp = struct.pack("!HHIIBBHHH", sport, port, rnd.getrandbits(32), 0, 5 << 4, 0x02, 64240, 0, 0)
    tcp = tcp[:16] + struct.pack("!H", csum(src + d + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, i & 0xffff, 0, 64, 6, 0, src, d)
    r.sendto(ip + tcp, (dst, 0))
print("flooded", n, flush=True)
c = socket.create_connection((dst, port), timeout=20)
c.sendall(b"legit")
print("reply", c.recv(16).decode(), flush=True)
"#;

#[test]
#[ignore = "needs root"]
fn syn_flood_of_100k_from_a_raw_socket_then_a_kernel_client_connects() {
    let lab = Lab::new("f");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let server = host_thread(&lab, Config::default(), move |mut h| {
        let l = h.stack.listen(SocketAddrV4::new(OURS, 5003), 128).unwrap();
        tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut served = false;
        let mut buf = [0u8; 64];
        let mut conns = Vec::new();
        while done_rx.try_recv().is_err() {
            assert!(Instant::now() < deadline, "flood test stalled");
            h.turn();
            while let Some(c) = h.stack.accept(l) {
                conns.push(c);
            }
            for c in &conns {
                if let Ok(5) = h.stack.recv(*c, &mut buf) {
                    assert_eq!(&buf[..5], b"legit");
                    h.stack.send(*c, b"welcome").unwrap();
                    served = true;
                }
            }
            h.idle(IDLE);
        }
        for _ in 0..20 {
            h.turn();
            h.idle(IDLE);
        }
        (served, conns.len(), h.stack.counters().clone())
    });
    rx.recv().unwrap();
    let py = lab.python(FLOOD_PY, &[&OURS.to_string(), "5003", "100000"]);
    let out = py.wait_with_output().unwrap();
    done_tx.send(()).unwrap();
    let (served, accepted, c) = server.join().unwrap();
    let stdout = nanowire_testkit::ok(&out);
    eprintln!("flood: {stdout} accepted={accepted} counters={c:?}");
    assert!(stdout.contains("reply welcome"), "{stdout}");
    assert!(served);
    assert!(
        c.syncookies_sent > 0,
        "the SYN queue overflowed into cookies: {c:?}"
    );
}

const DIFF_CLIENT_PY: &str = r#"
import socket, sys, json, struct, time
def run(addr):
    out = {}
    def conn(port):
        return socket.create_connection((addr, port), timeout=10)
    # 6001: half-close; the server answers with the byte count after our FIN.
    c = conn(6001); c.sendall(b"abc"); c.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        d = c.recv(100)
        if not d: break
        data += d
    out["half_close"] = data.decode() + "+eof"; c.close()
    # 6002: the server closes with SO_LINGER 0 at once.
    # (The RST may land before a timed connect() reads SO_ERROR: same outcome.)
    try:
        c = conn(6002)
        d = c.recv(100); out["linger0"] = "eof" if not d else "data"
        c.close()
    except ConnectionResetError: out["linger0"] = "reset"
    # 6003: the server closes with our data unread.
    c = conn(6003); c.sendall(b"unread")
    time.sleep(0.3)
    try:
        d = c.recv(100); out["unread_close"] = "eof" if not d else "data"
    except ConnectionResetError: out["unread_close"] = "reset"
    c.close()
    # 6004: nobody listens.
    try:
        conn(6004); out["no_listener"] = "connected"
    except ConnectionRefusedError: out["no_listener"] = "refused"
    # 6005: the server sends and closes; we read to EOF, then write into the closed socket.
    c = conn(6005)
    data = b""
    while True:
        d = c.recv(100)
        if not d: break
        data += d
    out["server_fin"] = data.decode() + "+eof"
    try:
        c.sendall(b"late"); time.sleep(0.3); c.sendall(b"later"); out["write_after_peer_close"] = "ok"
    except (BrokenPipeError, ConnectionResetError): out["write_after_peer_close"] = "reset"
    c.close()
    # 6006: we abort (SO_LINGER 0) after sending; the server reports what it saw.
    c = conn(6006); c.sendall(b"x"); time.sleep(0.2)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
    c = conn(6007)
    out["abort_seen_by_server"] = c.recv(100).decode()
    c.close()
    return out
print(json.dumps(run(sys.argv[1]), sort_keys=True), flush=True)
"#;

const DIFF_SERVER_PY: &str = r#"
import socket, sys, struct, time, select
addr = sys.argv[1]
ls = {}
for p in (6001, 6002, 6003, 6005, 6006, 6007):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, p)); s.listen(8); ls[p] = s
print("listening", flush=True)
c, _ = ls[6001].accept(); n = 0
while True:
    d = c.recv(100)
    if not d: break
    n += len(d)
c.sendall(str(n).encode()); c.close()
c, _ = ls[6002].accept()
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
c, _ = ls[6003].accept(); select.select([c], [], [], 5); c.close()
c, _ = ls[6005].accept(); c.sendall(b"bye"); c.close()
c, _ = ls[6006].accept(); seen = ""
while True:
    try:
        d = c.recv(100)
    except ConnectionResetError:
        seen += "reset"; break
    if not d:
        seen += "eof"; break
    seen += d.decode() + ","
c.close()
c, _ = ls[6007].accept(); c.sendall(seen.encode()); c.close()
time.sleep(0.5)
"#;

/// The same scenarios through our server: returns when the client is done.
fn diff_server(
    h: &mut Host,
    stop: &std::sync::mpsc::Receiver<()>,
    ready: std::sync::mpsc::Sender<()>,
) {
    let mut ls = std::collections::HashMap::new();
    for p in [6001u16, 6002, 6003, 6005, 6006, 6007] {
        ls.insert(p, h.stack.listen(SocketAddrV4::new(OURS, p), 8).unwrap());
    }
    ready.send(()).unwrap();
    struct C {
        id: ConnId,
        port: u16,
        n: usize,
        done: bool,
    }
    let mut conns: Vec<C> = Vec::new();
    let mut seen = String::new();
    let mut seen_done = false;
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(60);
    while stop.try_recv().is_err() {
        assert!(Instant::now() < deadline, "differential server stalled");
        h.turn();
        for (&p, &l) in &ls {
            while let Some(id) = h.stack.accept(l) {
                conns.push(C {
                    id,
                    port: p,
                    n: 0,
                    done: false,
                });
            }
        }
        let now = h.now();
        for c in conns.iter_mut().filter(|c| !c.done) {
            match c.port {
                6001 => match h.stack.recv(c.id, &mut buf) {
                    Ok(0) => {
                        h.stack.send(c.id, c.n.to_string().as_bytes()).unwrap();
                        h.stack.close(now, c.id).unwrap();
                        c.done = true;
                    }
                    Ok(k) => c.n += k,
                    Err(_) => {}
                },
                6002 => {
                    h.stack.set_linger0(c.id, true).unwrap();
                    h.stack.close(now, c.id).unwrap();
                    c.done = true;
                }
                6003 => {
                    if h.stack.recv_queue(c.id).unwrap_or(0) > 0 {
                        h.stack.close(now, c.id).unwrap();
                        c.done = true;
                    }
                }
                6005 => {
                    h.stack.send(c.id, b"bye").unwrap();
                    h.stack.close(now, c.id).unwrap();
                    c.done = true;
                }
                6006 => match h.stack.recv(c.id, &mut buf) {
                    Ok(0) => {
                        seen.push_str("eof");
                        seen_done = true;
                        c.done = true;
                    }
                    Ok(k) => {
                        seen.push_str(std::str::from_utf8(&buf[..k]).unwrap());
                        seen.push(',');
                    }
                    Err(Error::WouldBlock) => {}
                    Err(Error::ConnectionReset) => {
                        seen.push_str("reset");
                        seen_done = true;
                        h.stack.close(now, c.id).unwrap();
                        c.done = true;
                    }
                    Err(e) => panic!("6006: {e}"),
                },
                6007 => {
                    if seen_done {
                        h.stack.send(c.id, seen.as_bytes()).unwrap();
                        h.stack.close(now, c.id).unwrap();
                        c.done = true;
                    }
                }
                _ => unreachable!(),
            }
        }
        h.idle(IDLE);
    }
}

#[test]
#[ignore = "needs root"]
fn close_semantics_match_the_kernel_differentially() {
    let lab = Lab::new("d");
    // The kernel twin of our server: same scenarios, kernel sockets, in host a.
    const KADDR: &str = "198.18.7.3";
    sh(&[
        "ip",
        "-n",
        &lab.a,
        "addr",
        "add",
        &format!("{KADDR}/24"),
        "dev",
        &lab.ifa,
    ]);
    let mut ksrv = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.a,
            "python3",
            "-c",
            DIFF_SERVER_PY,
            KADDR,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(wait_line(&mut ksrv).trim(), "listening");
    let kernel = lab
        .python(DIFF_CLIENT_PY, &[KADDR])
        .wait_with_output()
        .unwrap();
    let k = nanowire_testkit::ok(&kernel).trim().to_string();
    let _ = ksrv.wait();

    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let server = host_thread(&lab, Config::default(), move |mut h| {
        diff_server(&mut h, &rx, ready_tx);
        h.stack.counters().clone()
    });
    ready_rx.recv().unwrap();
    let ours = lab
        .python(DIFF_CLIENT_PY, &[&OURS.to_string()])
        .wait_with_output()
        .unwrap();
    tx.send(()).unwrap();
    let counters = server.join().unwrap();
    let o = String::from_utf8_lossy(&ours.stdout).trim().to_string();
    eprintln!("kernel: {k}\nours:   {o}\ncounters: {counters:?}");
    nanowire_testkit::ok(&ours);
    assert_eq!(o, k, "our TCP and the kernel's disagree");
}

const ECHO_PY: &str = r#"
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    d = c.recv(65536)
    if not d: break
    c.sendall(d)
c.close()
"#;

#[test]
#[ignore = "needs root"]
fn host_api_ping_pong_against_a_kernel_echo_server() {
    let lab = Lab::new("h");
    let mut py = lab.python(ECHO_PY, &[&PEER.to_string(), "5004"]);
    assert_eq!(wait_line(&mut py).trim(), "listening");
    let lab_ref = &lab;
    let info = std::thread::scope(|s| {
        s.spawn(move || {
            let mut h = host(lab_ref);
            let c = h
                .connect(
                    SocketAddrV4::new(OURS, 0),
                    SocketAddrV4::new(PEER, 5004),
                    Duration::from_secs(10),
                )
                .unwrap();
            h.stack.set_nodelay(c, true).unwrap();
            let mut buf = [0u8; 256];
            for i in 0..2000u32 {
                let msg = [(i % 251) as u8; 64];
                h.write_all(c, &msg).unwrap();
                let mut got = 0;
                while got < 64 {
                    let deadline = Some(Instant::now() + Duration::from_secs(10));
                    let n = h
                        .read(c, &mut buf[got..64], deadline)
                        .expect("reply in time")
                        .unwrap();
                    assert!(n > 0, "echo closed early");
                    got += n;
                }
                assert_eq!(buf[..64], msg);
            }
            h.stack.shutdown_write(c).unwrap();
            let eof = h.read(c, &mut buf, Some(Instant::now() + Duration::from_secs(10)));
            assert_eq!(eof, Some(Ok(0)), "the echo server closes after our FIN");
            let info = h.stack.info(c).unwrap();
            h.close(c, Duration::from_secs(1)).unwrap();
            info
        })
        .join()
        .unwrap()
    });
    nanowire_testkit::ok(&py.wait_with_output().unwrap());
    eprintln!("ping-pong: {info:?}");
    assert_eq!(info.bytes_acked, 2000 * 64 + 1);
    // No assertion on `total_retrans`: with a 20 ms RTO floor, an echo
    // server descheduled longer than that on a loaded machine makes a
    // retransmission that is timing, not behaviour (seen: 1-2 at load 17).
}
