//! The steering program attached before exec (issue 21, "prestart").
//!
//! A process's first accelerated socket used to wait for its engine's
//! start, and most of that start is the steering program's: the verifier
//! (`BPF_PROG_LOAD`, ~2.5 ms) and the XDP link (`BPF_LINK_CREATE`, whose
//! `synchronize_rcu` takes ~10 ms and more on a loaded machine). A client
//! that times itself from before its first socket (`ab -c 1`) counted it.
//!
//! So `nanowire run` loads and attaches the program itself, on the
//! interfaces the program will likely use ([`candidates`]), before it
//! (`SteerProgram::prepare`)
//! execs the application: exec keeps the pid, so the link's owner is the
//! process that uses it. The fds (link, program, maps) stay open across
//! the exec and are described in [`ENV`] ([`describe`]). The shim, when it
//! loads, takes them ([`receive`]): it checks what the kernel says of each
//! (`BPF_OBJ_GET_INFO_BY_FD`: an XDP link on that interface, running an
//! XDP program named `nw_steer` or `nw_steer_frags` whose maps are the
//! ones listed, each map of its name), marks them close-on-exec and
//! removes the variable from the environment; whatever does not check out
//! is closed (only fds the kernel says are BPF objects, never another
//! file) and that interface's engine starts as before, with one line.
//! The first own engine on the interface adopts them ([`take`],
//! `SteerProgram::adopt_private`), after checking that the numbers still
//! name the same objects (their ids).
//!
//! Nothing leaks to children: a process that forks, spawns or execs before
//! it started the engine gives the prepared program up ([`give_up`]: the
//! fds are closed), so that a child's own engine can attach (a parent
//! holding an unused link would make its children's attach fail with
//! EBUSY), and `sh -c '...'` trees are no worse than without. A process
//! that never uses the network holds the link until it exits: harmless,
//! the program passes every frame that is not claimed.

use crate::load::{LINK_TYPE_XDP, link_info, map_info, name_of, prog_info};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The variable `nanowire run` describes the prepared fds in:
/// `IFNAME,IFINDEX,MODE,FRAGS,LINK,PROG,MAP=FD,...`, one such list per
/// interface, separated by `;`.
pub const ENV: &str = "NANOWIRE_PREPARED";

/// `BPF_PROG_TYPE_XDP`.
const PROG_TYPE_XDP: u32 = 6;

/// A steering program loaded and attached by `nanowire run`, held by this
/// process until its engine adopts it. Dropping it closes its fds (raw
/// closes: never through the shim).
pub struct Prepared {
    pub ifname: String,
    pub ifindex: u32,
    /// Attached in native (driver) mode; else generic.
    pub native: bool,
    pub frags: bool,
    link: RawFd,
    prog: RawFd,
    /// Each map by name (taken out by the adoption).
    pub(crate) maps: Vec<(String, RawFd)>,
    /// The first queue's UMEM, populated ([`crate::UmemArea::populated_file`]):
    /// its file and geometry (RX frames, TX frames, frame size).
    umem: Option<(RawFd, [u32; 3])>,
    /// The UMEM file's inode, as first checked.
    umem_ino: u64,
    /// The ids of the link, the program and the maps (in `maps`' order),
    /// as first checked.
    ids: Vec<u32>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        for fd in self.all() {
            crate::sys::close(fd);
        }
    }
}

impl Prepared {
    fn all(&self) -> Vec<RawFd> {
        [self.link, self.prog]
            .into_iter()
            .chain(self.maps.iter().map(|(_, fd)| *fd))
            .chain(self.umem.map(|(fd, _)| fd))
            .filter(|&fd| fd >= 0)
            .collect()
    }

    /// The link and the program, owned by the caller from now on.
    pub(crate) fn take_link_and_prog(&mut self) -> (OwnedFd, OwnedFd) {
        let (l, p) = (self.link, self.prog);
        self.link = -1;
        self.prog = -1;
        // SAFETY: both were this value's (checked by `probe` when received
        // and again by `take`); they are no longer.
        unsafe { (OwnedFd::from_raw_fd(l), OwnedFd::from_raw_fd(p)) }
    }

    /// The first queue's UMEM made by `nanowire run` if it has geometry
    /// `geo` (RX frames, TX frames, frame size), mapped (its file is closed:
    /// the mapping holds the pages); `None` if there is none or it is of
    /// another geometry (then closed).
    pub fn take_umem(&mut self, geo: [u32; 3]) -> Option<crate::UmemArea> {
        let (fd, g) = self.umem.take()?;
        let area = (g == geo)
            .then(|| crate::UmemArea::from_file(fd, g[0], g[1], g[2]).ok())
            .flatten();
        crate::sys::close(fd);
        area
    }

    /// Forget the fds without closing them (they no longer name what was
    /// received: another file may have their numbers now).
    fn disarm(&mut self) {
        self.link = -1;
        self.prog = -1;
        self.maps.clear();
        self.umem = None;
    }

    /// What the kernel says of every fd, checked: the ids of the link, the
    /// program and the maps, or why they are not what `nanowire run` makes.
    fn probe(&self) -> Result<Vec<u32>, String> {
        let floor = crate::sys::fd_floor();
        if let Some(fd) = self.all().into_iter().find(|&fd| fd < floor) {
            return Err(format!(
                "fd {fd} is below the engine's fd floor ({floor}): not one nanowire run made"
            ));
        }
        if self.link < 0 || self.prog < 0 {
            return Err("no link or no program".into());
        }
        let l = link_info(self.link).map_err(|e| format!("link fd {}: {e}", self.link))?;
        if l.link_type != LINK_TYPE_XDP || l.ifindex != self.ifindex {
            return Err(format!(
                "fd {} is not an XDP link on interface {} (type {}, ifindex {})",
                self.link, self.ifindex, l.link_type, l.ifindex
            ));
        }
        let (p, used) =
            prog_info(self.prog).map_err(|e| format!("program fd {}: {e}", self.prog))?;
        let want = if self.frags {
            "nw_steer_frags"
        } else {
            "nw_steer"
        };
        if p.prog_type != PROG_TYPE_XDP || p.id != l.prog_id || name_of(&p.name) != want {
            return Err(format!(
                "fd {} is not the {want} program behind link {} (type {}, id {} against the link's {}, name {:?})",
                self.prog,
                self.link,
                p.prog_type,
                p.id,
                l.prog_id,
                name_of(&p.name)
            ));
        }
        let mut ids = vec![l.id, p.id];
        for (name, fd) in &self.maps {
            let m = map_info(*fd).map_err(|e| format!("map {name} fd {fd}: {e}"))?;
            let short: String = name.chars().take(15).collect();
            if name_of(&m.name) != short {
                return Err(format!(
                    "fd {fd} is not the map {name} (its name: {:?})",
                    name_of(&m.name)
                ));
            }
            ids.push(m.id);
        }
        if let Some(id) = used.iter().find(|id| !ids[2..].contains(id)) {
            return Err(format!("the program uses map {id}, which is not listed"));
        }
        Ok(ids)
    }

    /// The UMEM file's inode if it is one `nanowire run` makes: an unnamed
    /// (no link) tmpfs file at least as long as its geometry says (0: no
    /// UMEM); else why not.
    fn probe_umem(&self) -> Result<u64, String> {
        let Some((fd, g)) = self.umem else {
            return Ok(0);
        };
        let len = crate::UmemArea::len_of(g[0], g[1], g[2]);
        // SAFETY: fstat/fstatfs fill the structs we pass; fd is borrowed.
        let (st, fs) = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            let mut fs: libc::statfs = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 || libc::fstatfs(fd, &mut fs) != 0 {
                return Err(format!("UMEM fd {fd}: {}", std::io::Error::last_os_error()));
            }
            (st, fs)
        };
        const TMPFS_MAGIC: libc::__fsword_t = 0x0102_1994;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG
            || st.st_nlink != 0
            || fs.f_type != TMPFS_MAGIC
            || (st.st_size as u64) < len as u64
        {
            return Err(format!(
                "fd {fd} is not an unnamed tmpfs file of {len} bytes (a UMEM nanowire run makes)"
            ));
        }
        Ok(st.st_ino)
    }
}

/// The value of [`ENV`] for one interface's prepared program.
/// `(native, frags)`: the attach mode and the variant; `(link, prog)`:
/// their fds.
pub fn describe(
    ifname: &str,
    ifindex: u32,
    (native, frags): (bool, bool),
    (link, prog): (RawFd, RawFd),
    maps: &[(String, RawFd)],
    umem: Option<(RawFd, [u32; 3])>,
) -> String {
    let mut s = format!(
        "{ifname},{ifindex},{},{},{link},{prog}",
        if native { "native" } else { "generic" },
        u8::from(frags)
    );
    for (n, fd) in maps {
        s.push_str(&format!(",{n}={fd}"));
    }
    if let Some((fd, [rx, tx, frame])) = umem {
        s.push_str(&format!(",{UMEM_KEY}={fd}/{rx}/{tx}/{frame}"));
    }
    s
}

/// The key of the UMEM's entry in a description (the others are maps).
const UMEM_KEY: &str = "umem";

/// Parse one interface's description ([`describe`]). The fds are not
/// checked here ([`Prepared::probe`]).
fn parse_one(s: &str) -> Result<Prepared, String> {
    let bad = || format!("malformed {ENV} entry {s:?}");
    let mut it = s.split(',');
    let mut next = || it.next().ok_or_else(bad);
    let ifname = next()?.to_string();
    let ifindex: u32 = next()?.parse().map_err(|_| bad())?;
    let native = match next()? {
        "native" => true,
        "generic" => false,
        _ => return Err(bad()),
    };
    let frags = match next()? {
        "0" => false,
        "1" => true,
        _ => return Err(bad()),
    };
    let link: RawFd = next()?.parse().map_err(|_| bad())?;
    let prog: RawFd = next()?.parse().map_err(|_| bad())?;
    let mut maps = Vec::new();
    let mut umem = None;
    for m in it {
        let (n, v) = m.split_once('=').ok_or_else(bad)?;
        if n == UMEM_KEY {
            let v: Vec<u32> = v
                .split('/')
                .map(|x| x.parse().map_err(|_| bad()))
                .collect::<Result<_, _>>()?;
            let [fd, rx, tx, frame] = v[..] else {
                return Err(bad());
            };
            umem = Some((i32::try_from(fd).map_err(|_| bad())?, [rx, tx, frame]));
        } else {
            maps.push((n.to_string(), v.parse().map_err(|_| bad())?));
        }
    }
    if ifname.is_empty() || link < 0 || prog < 0 || maps.iter().any(|(_, fd)| *fd < 0) {
        return Err(bad());
    }
    Ok(Prepared {
        ifname,
        ifindex,
        native,
        frags,
        link,
        prog,
        maps,
        umem,
        ids: Vec::new(),
        umem_ino: 0,
    })
}

/// The prepared programs this process holds (none once given up).
static HELD: Mutex<Vec<Prepared>> = Mutex::new(Vec::new());
/// Whether [`HELD`] may hold one (a fork or exec of a process without any
/// looks no further).
static ANY: AtomicBool = AtomicBool::new(false);

/// Close the fds named in `p` that the kernel says are BPF objects (ours,
/// then: a forged or stale number naming another file is left alone).
fn close_bpf_fds(p: &mut Prepared) {
    let floor = crate::sys::fd_floor();
    if let Some((fd, _)) = p.umem
        && fd >= floor
        && p.probe_umem().is_ok()
    {
        crate::sys::close(fd);
    }
    p.umem = None;
    for fd in p.all() {
        // BPF_OBJ_GET_INFO_BY_FD answers for a BPF object of any kind
        // (map, program, link), and for nothing else.
        if fd >= floor && map_info(fd).is_ok() {
            crate::sys::close(fd);
        }
    }
    p.disarm();
}

/// At the shim's load: take the prepared programs `value` ([`ENV`]'s value)
/// describes. Each one checked is kept (close-on-exec) for [`take`];
/// returns the interfaces kept and, for each refused one, why (its BPF fds
/// are closed).
pub fn receive(value: &str) -> (Vec<String>, Vec<String>) {
    let (mut kept, mut refused) = (Vec::new(), Vec::new());
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    for part in value.split(';').filter(|p| !p.is_empty()) {
        let mut p = match parse_one(part) {
            Ok(p) => p,
            Err(e) => {
                refused.push(e);
                continue;
            }
        };
        match p.probe().and_then(|ids| Ok((ids, p.probe_umem()?))) {
            Ok((ids, ino)) => {
                for fd in p.all() {
                    crate::sys::set_cloexec(fd, true);
                }
                p.ids = ids;
                p.umem_ino = ino;
                kept.push(p.ifname.clone());
                held.push(p);
            }
            Err(e) => {
                refused.push(format!("{}: {e}", p.ifname));
                close_bpf_fds(&mut p);
            }
        }
    }
    ANY.store(!held.is_empty(), Ordering::Release);
    (kept, refused)
}

/// The prepared program on interface `ifindex`, for the engine to adopt:
/// `None` if there is none; `Err` (why) if its fds no longer name what was
/// received (they are forgotten, not closed: another file may have the
/// numbers now).
pub fn take(ifindex: u32) -> Option<Result<Prepared, String>> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let i = held.iter().position(|p| p.ifindex == ifindex)?;
    let mut p = held.swap_remove(i);
    ANY.store(!held.is_empty(), Ordering::Release);
    drop(held);
    match p.probe().and_then(|ids| Ok((ids, p.probe_umem()?))) {
        Ok((ids, ino)) if ids == p.ids && ino == p.umem_ino => Some(Ok(p)),
        Ok(_) | Err(_) => {
            p.disarm();
            Some(Err(format!(
                "{}: the fds nanowire run prepared were closed or replaced by the program",
                p.ifname
            )))
        }
    }
}

/// Close every prepared program this process holds (a fork, spawn or exec
/// before the engine started; see the module's text). Returns how many.
pub fn give_up() -> usize {
    if !ANY.swap(false, Ordering::AcqRel) {
        return 0;
    }
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let n = held.len();
    held.clear();
    n
}

/// The interfaces a program in this network namespace will likely use:
/// those of its IPv4 routes (`/proc/net/route`), not the loopback, in
/// route order, each once.
pub fn candidates() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    route_devices(&text)
}

fn route_devices(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines().skip(1) {
        let Some(dev) = line.split_whitespace().next() else {
            continue;
        };
        if dev != "lo" && !out.iter().any(|d| d == dev) {
            out.push(dev.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_parses_back() {
        let maps = vec![("nw_claims".to_string(), 600), ("nw_xsks".to_string(), 601)];
        let d = describe("veth-a", 7, (false, false), (598, 599), &maps, None);
        assert_eq!(d, "veth-a,7,generic,0,598,599,nw_claims=600,nw_xsks=601");
        let mut p = parse_one(&d).unwrap();
        assert_eq!(
            (p.ifname.as_str(), p.ifindex, p.native, p.frags),
            ("veth-a", 7, false, false)
        );
        assert_eq!(p.all(), vec![598, 599, 600, 601]);
        assert_eq!(p.maps, maps);
        // Not ours to close in a test.
        p.disarm();
        let d = describe(
            "eth0",
            2,
            (true, true),
            (598, 599),
            &maps,
            Some((602, [16384, 1024, 2048])),
        );
        assert!(d.ends_with(",umem=602/16384/1024/2048"), "{d}");
        let mut p = parse_one(&d).unwrap();
        assert!(p.native && p.frags);
        assert_eq!(p.umem, Some((602, [16384, 1024, 2048])));
        assert_eq!(p.all(), vec![598, 599, 600, 601, 602]);
        p.disarm();
        for bad in [
            "",
            "veth-a",
            "veth-a,x,generic,0,1,2",
            "veth-a,7,fast,0,1,2",
            "veth-a,7,generic,2,1,2",
            "veth-a,7,generic,0,-1,2",
            "veth-a,7,generic,0,1,2,nw_claims",
            "veth-a,7,generic,0,1,2,nw_claims=x",
            "veth-a,7,generic,0,1,2,umem=3/4/5",
            "veth-a,7,generic,0,1,2,umem=3/4/5/x",
        ] {
            assert!(parse_one(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn candidates_are_the_routes_devices_without_the_loopback() {
        let t = "Iface\tDestination\tGateway\tFlags\n\
                 veth-a\t000012C6\t00000000\t0001\n\
                 lo\t0000007F\t00000000\t0001\n\
                 eth1\t00000000\t010012C6\t0003\n\
                 veth-a\t0000FEA9\t00000000\t0001\n";
        assert_eq!(route_devices(t), vec!["veth-a", "eth1"]);
        assert!(route_devices("Iface\tDestination\n").is_empty());
    }
}
