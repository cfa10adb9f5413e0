//! Two hosts on one machine: namespaces `<name>-a` and `<name>-b` joined by
//! the veth pair `<name>-a0` / `<name>-b0`, addressed 198.18.0.1/24 and
//! 198.18.0.2/24 (the RFC 2544 benchmarking range).
//!
//! `up` is idempotent and repairs a half-built lab; `down` removes
//! everything `up` made (deleting the namespaces deletes the veth pair and
//! with it any XDP program attached to it).
//!
//! An *impaired* lab (`up --impair`) puts a third namespace, the wire
//! `<name>-w`, between the hosts: `<name>-a0` is paired with `<name>-wa` and
//! `<name>-b0` with `<name>-wb`, and an nftables netdev table in the wire
//! forwards every frame unchanged from one end to the other (`dup to` the
//! other end, then `drop`: not `fwd`, whose redirect mark makes generic XDP
//! on the hosts skip the frame). Hosts
//! keep their names, interfaces, addresses, and see each other's MACs as
//! before; kernel and bypass traffic cross the same wire. `impair` adds
//! random loss (`numgen random`), duplication (`dup`) and a rate policer
//! (`limit rate over ... drop`) per direction, each with a counter.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

pub const DEFAULT_NAME: &str = "nw";
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const PREFIX_LEN: u8 = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Host {
    A,
    B,
}

impl Host {
    pub fn peer(self) -> Host {
        match self {
            Host::A => Host::B,
            Host::B => Host::A,
        }
    }
}

impl std::str::FromStr for Host {
    type Err = String;
    fn from_str(s: &str) -> Result<Host, String> {
        match s {
            "a" | "A" => Ok(Host::A),
            "b" | "B" => Ok(Host::B),
            o => Err(format!("unknown lab host {o:?}: expected a or b")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Prefix of every object the lab makes (namespaces, interfaces).
    pub name: String,
    /// RX/TX queues of each veth end (AF_XDP binds one socket per queue).
    pub queues: u32,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            name: DEFAULT_NAME.to_string(),
            queues: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HostStatus {
    pub netns: String,
    pub iface: String,
    pub addr: Ipv4Addr,
    pub mac: Option<String>,
    pub up: bool,
    pub driver: Option<String>,
    /// XDP program attached to the interface, as `ip -d link` reports it.
    pub xdp: Option<String>,
    /// Offload settings (`ethtool -k`), name -> on/off.
    pub offloads: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LabStatus {
    pub name: String,
    pub complete: bool,
    pub a: Option<HostStatus>,
    pub b: Option<HostStatus>,
    /// The impaired wire between a and b (`up --impair`), or None for a
    /// plain veth pair.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wire: Option<WireStatus>,
}

/// What the wire does to frames in one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Impairment {
    /// Percentage of frames dropped at random (0..=100).
    pub loss_pct: f64,
    /// Percentage of frames sent twice (0..=100).
    pub dup_pct: f64,
    /// Policer: frames above this rate (megabit/s) are dropped. None = no limit.
    pub rate_mbit: Option<f64>,
}

impl Impairment {
    pub fn is_none(&self) -> bool {
        self.loss_pct == 0.0 && self.dup_pct == 0.0 && self.rate_mbit.is_none()
    }
    pub fn validate(&self) -> Result<(), Error> {
        for (what, v) in [("loss", self.loss_pct), ("dup", self.dup_pct)] {
            if !(0.0..=100.0).contains(&v) {
                return Err(format!("--{what} must be a percentage 0..=100, got {v}"));
            }
        }
        if let Some(r) = self.rate_mbit
            && !(r > 0.0 && r <= 1_000_000.0)
        {
            return Err(format!("--rate must be 0 < MBIT <= 1000000, got {r}"));
        }
        Ok(())
    }
}

impl std::fmt::Display for Impairment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_none() {
            return write!(f, "clear");
        }
        let mut parts = vec![];
        if self.loss_pct > 0.0 {
            parts.push(format!("loss {}%", self.loss_pct));
        }
        if self.dup_pct > 0.0 {
            parts.push(format!("dup {}%", self.dup_pct));
        }
        if let Some(r) = self.rate_mbit {
            parts.push(format!("rate {r} Mbit/s"));
        }
        write!(f, "{}", parts.join(", "))
    }
}

/// Which way an impairment applies: a->b, b->a or both.
/// (`--dir`: clap takes its lowercase names, `both`, `ab`, `ba`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Both,
    Ab,
    Ba,
}

/// One direction of the wire: its settings and what it did so far.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WireDir {
    pub impairment: Impairment,
    /// Frames that entered the wire in this direction.
    pub frames_in: u64,
    pub dropped_loss: u64,
    pub dropped_rate: u64,
    pub duplicated: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct WireStatus {
    pub netns: String,
    /// Interfaces in the wire: the peer of a's and of b's interface.
    pub iface_a: String,
    pub iface_b: String,
    pub up: bool,
    /// False when the forwarding table is missing (frames go nowhere).
    pub forwarding: bool,
    pub ab: WireDir,
    pub ba: WireDir,
}

#[derive(Debug, Clone)]
pub struct Lab {
    opts: LabOptions,
    impair: bool,
}

/// The nftables match that is true for `pct` percent of frames.
fn chance(pct: f64) -> String {
    let t = ((pct / 100.0) * NUMGEN_MOD as f64).round() as u64;
    if t >= NUMGEN_MOD {
        String::new()
    } else {
        format!("numgen random mod {NUMGEN_MOD} < {t} ")
    }
}

/// nftables table that forwards frames in the wire namespace.
const WIRE_TABLE: &str = "wire";
/// Loss and duplication probabilities are drawn from 0..NUMGEN_MOD, so
/// percentages have a resolution of 0.0001 %.
const NUMGEN_MOD: u64 = 1_000_000;

pub type Error = String;

fn run(cmd: &mut Command) -> Result<String, Error> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        let args: Vec<_> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return Err(format!(
            "`{} {}` failed: {}",
            cmd.get_program().to_string_lossy(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_stdin(cmd: &mut Command, input: &str) -> Result<String, Error> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(input.as_bytes())
            .map_err(|e| format!("cannot write to {:?}: {e}", cmd.get_program()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed: {}",
            cmd.get_program().to_string_lossy(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String, Error> {
    run(Command::new("ip").args(args))
}

/// True when this process may create namespaces and attach XDP programs.
pub fn have_root() -> bool {
    rustix::process::geteuid().is_root()
}

impl Lab {
    pub fn new(opts: LabOptions) -> Result<Lab, Error> {
        let n = &opts.name;
        if n.is_empty() || n.len() > 12 || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(format!(
                "lab name {n:?} must be 1-12 characters of [A-Za-z0-9_] (interface names are limited to 15)"
            ));
        }
        if opts.queues == 0 || opts.queues > 64 {
            return Err(format!("lab queues must be 1..=64, got {}", opts.queues));
        }
        Ok(Lab {
            opts,
            impair: false,
        })
    }

    /// The same lab with (or without) the impaired wire between a and b:
    /// `up` builds (or removes) the wire namespace accordingly.
    pub fn impaired(mut self, on: bool) -> Lab {
        self.impair = on;
        self
    }

    /// True when `up` builds the wire (see [`Lab::impaired`]).
    pub fn is_impaired(&self) -> bool {
        self.impair
    }

    pub fn named(name: &str) -> Result<Lab, Error> {
        Lab::new(LabOptions {
            name: name.to_string(),
            ..LabOptions::default()
        })
    }

    pub fn name(&self) -> &str {
        &self.opts.name
    }
    pub fn netns(&self, h: Host) -> String {
        match h {
            Host::A => format!("{}-a", self.opts.name),
            Host::B => format!("{}-b", self.opts.name),
        }
    }
    pub fn iface(&self, h: Host) -> String {
        format!("{}0", self.netns(h))
    }
    /// The wire's namespace (an impaired lab only).
    pub fn wire_netns(&self) -> String {
        format!("{}-w", self.opts.name)
    }
    /// The wire's interface paired with host `h`'s interface.
    pub fn wire_iface(&self, h: Host) -> String {
        match h {
            Host::A => format!("{}-wa", self.opts.name),
            Host::B => format!("{}-wb", self.opts.name),
        }
    }
    fn wire_exists(&self) -> bool {
        std::path::Path::new("/run/netns")
            .join(self.wire_netns())
            .exists()
    }
    pub fn addr(&self, h: Host) -> Ipv4Addr {
        match h {
            Host::A => ADDR_A,
            Host::B => ADDR_B,
        }
    }

    fn netns_exists(&self, h: Host) -> bool {
        std::path::Path::new("/run/netns")
            .join(self.netns(h))
            .exists()
    }

    fn link_in_ns(&self, h: Host) -> bool {
        ip(&["-n", &self.netns(h), "link", "show", "dev", &self.iface(h)]).is_ok()
    }

    /// Build the lab, or repair whatever part of it is missing. Idempotent.
    pub fn up(&self) -> Result<LabStatus, Error> {
        if !have_root() {
            return Err(
                "the lab needs root: network namespaces and veth cannot be created otherwise"
                    .into(),
            );
        }
        for h in [Host::A, Host::B] {
            if !self.netns_exists(h) {
                ip(&["netns", "add", &self.netns(h)])?;
            }
        }
        if self.impair {
            self.build_wire()?;
        } else {
            if self.wire_exists() {
                // Was impaired. Deleting an interface is synchronous (and
                // takes its peer with it); deleting a namespace is not.
                for h in [Host::A, Host::B] {
                    let _ = ip(&[
                        "-n",
                        &self.wire_netns(),
                        "link",
                        "del",
                        "dev",
                        &self.wire_iface(h),
                    ]);
                }
                ip(&["netns", "del", &self.wire_netns()])?;
            }
            self.build_pair()?;
        }
        for h in [Host::A, Host::B] {
            let ns = self.netns(h);
            // IPv6 off: no DAD, router solicitations or MLD noise during measurements.
            let _ = run(Command::new("ip").args([
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
            ]));
            ip(&["-n", &ns, "link", "set", "dev", "lo", "up"])?;
            let cidr = format!("{}/{}", self.addr(h), PREFIX_LEN);
            ip(&["-n", &ns, "addr", "replace", &cidr, "dev", &self.iface(h)])?;
            ip(&["-n", &ns, "link", "set", "dev", &self.iface(h), "up"])?;
        }
        let st = self.status();
        if !st.complete {
            return Err(format!(
                "lab {} did not come up completely: {st:?}",
                self.name()
            ));
        }
        Ok(st)
    }

    fn build_pair(&self) -> Result<(), Error> {
        let (a_ok, b_ok) = (self.link_in_ns(Host::A), self.link_in_ns(Host::B));
        if a_ok && b_ok {
            return Ok(());
        }
        // Half-built: remove whichever end survived (wherever it is) and start over.
        for h in [Host::A, Host::B] {
            let _ = ip(&["-n", &self.netns(h), "link", "del", "dev", &self.iface(h)]);
            let _ = ip(&["link", "del", "dev", &self.iface(h)]);
        }
        let q = self.opts.queues.to_string();
        ip(&[
            "link",
            "add",
            &self.iface(Host::A),
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "netns",
            &self.netns(Host::A),
            "type",
            "veth",
            "peer",
            "name",
            &self.iface(Host::B),
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "netns",
            &self.netns(Host::B),
        ])?;
        Ok(())
    }

    fn wire_link(&self, h: Host) -> bool {
        ip(&[
            "-n",
            &self.wire_netns(),
            "link",
            "show",
            "dev",
            &self.wire_iface(h),
        ])
        .is_ok()
    }

    /// Build (or repair) host a <-> wire <-> host b and the forwarding table.
    fn build_wire(&self) -> Result<(), Error> {
        let w = self.wire_netns();
        if !self.wire_exists() {
            ip(&["netns", "add", &w])?;
        }
        let q = self.opts.queues.to_string();
        for h in [Host::A, Host::B] {
            if self.link_in_ns(h) && self.wire_link(h) {
                continue;
            }
            // Missing, half-built or a plain pair (a0 <-> b0): replace it.
            let _ = ip(&["-n", &self.netns(h), "link", "del", "dev", &self.iface(h)]);
            let _ = ip(&["-n", &w, "link", "del", "dev", &self.wire_iface(h)]);
            let _ = ip(&["link", "del", "dev", &self.iface(h)]);
            let _ = ip(&["link", "del", "dev", &self.wire_iface(h)]);
            ip(&[
                "link",
                "add",
                &self.iface(h),
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "netns",
                &self.netns(h),
                "type",
                "veth",
                "peer",
                "name",
                &self.wire_iface(h),
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "netns",
                &w,
            ])?;
        }
        let _ = run(Command::new("ip").args([
            "netns",
            "exec",
            &w,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
        ]));
        ip(&["-n", &w, "link", "set", "dev", "lo", "up"])?;
        for h in [Host::A, Host::B] {
            ip(&["-n", &w, "link", "set", "dev", &self.wire_iface(h), "up"])?;
        }
        // A NIC segments before the wire: with TSO (and UDP GSO) off on the
        // hosts' ends, the kernel segments in software before the veth, so
        // the wire sees (and drops) MTU-sized frames, not 64 KB super-packets.
        for h in [Host::A, Host::B] {
            let _ = run(Command::new("ip").args([
                "netns",
                "exec",
                &self.netns(h),
                "ethtool",
                "-K",
                &self.iface(h),
                "tso",
                "off",
                "tx-udp-segmentation",
                "off",
            ]));
        }
        if self.wire_table().is_err() {
            self.write_wire(Impairment::default(), Impairment::default())?;
        }
        Ok(())
    }

    fn nft(&self, args: &[&str]) -> Result<String, Error> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.wire_netns(), "nft"])
            .args(args);
        run(&mut c).map_err(|e| {
            if e.contains("cannot run") || e.contains("No such file") {
                format!("{e} (install nftables: scripts/install-deps.sh)")
            } else {
                e
            }
        })
    }

    fn wire_table(&self) -> Result<serde_json::Value, Error> {
        let out = self.nft(&["-j", "list", "table", "netdev", WIRE_TABLE])?;
        serde_json::from_str(&out).map_err(|e| format!("cannot parse `nft -j` output: {e}"))
    }

    fn chain_rules(from: &str, to: &str, imp: &Impairment) -> String {
        let mut r = String::new();
        r.push_str("    counter comment \"in\"\n");
        if imp.loss_pct > 0.0 {
            r.push_str(&format!(
                "    {}counter drop comment \"loss {}\"\n",
                chance(imp.loss_pct),
                imp.loss_pct
            ));
        }
        if let Some(mbit) = imp.rate_mbit {
            let bytes = ((mbit * 1e6 / 8.0).round() as u64).max(1);
            // A 10 ms bucket, at least two full frames.
            let burst = (bytes / 100).max(3100);
            r.push_str(&format!(
                "    limit rate over {bytes} bytes/second burst {burst} bytes counter drop comment \"rate {mbit}\"\n"
            ));
        }
        if imp.dup_pct > 0.0 {
            r.push_str(&format!(
                "    {}counter dup to \"{to}\" comment \"dup {}\"\n",
                chance(imp.dup_pct),
                imp.dup_pct
            ));
        }
        // Forward with `dup to` + `drop`, not `fwd to`: nft's `fwd` marks the
        // skb as redirected (skb_set_redirected, for ifb), the mark survives
        // the veth hop, and generic XDP on the receiving host skips every
        // redirected skb (netif_receive_generic_xdp: XDP_PASS). With `fwd`
        // no frame crossing the wire ever reached an xdp engine in generic
        // mode (veth's default): UDP silently took the kernel twin and xdp
        // TCP connects timed out (the kernel's port reservation answered).
        // A `dup` clone carries no such mark; the original is dropped.
        r.push_str(&format!(
            "    dup to \"{to}\" comment \"fwd\"\n    drop comment \"fwd original\"\n"
        ));
        format!(
            "  chain {} {{\n    type filter hook ingress device \"{from}\" priority 0; policy accept;\n{r}  }}\n",
            if from.ends_with("wa") { "ab" } else { "ba" }
        )
    }

    /// Replace the forwarding table in one transaction (counters restart).
    fn write_wire(&self, ab: Impairment, ba: Impairment) -> Result<(), Error> {
        ab.validate()?;
        ba.validate()?;
        let (wa, wb) = (self.wire_iface(Host::A), self.wire_iface(Host::B));
        let script = format!(
            "table netdev {WIRE_TABLE} {{}}\ndelete table netdev {WIRE_TABLE}\ntable netdev {WIRE_TABLE} {{\n{}{}}}\n",
            Self::chain_rules(&wa, &wb, &ab),
            Self::chain_rules(&wb, &wa, &ba)
        );
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.wire_netns(), "nft", "-f", "-"]);
        run_stdin(&mut c, &script)
            .map(|_| ())
            .map_err(|e| format!("cannot program the wire: {e}"))
    }

    /// Set what the wire does in `dir` (the other direction keeps its
    /// settings). The lab must be up with `--impair`.
    pub fn impair(&self, dir: Direction, imp: Impairment) -> Result<WireStatus, Error> {
        imp.validate()?;
        let cur = self.wire_status().ok_or_else(|| {
            format!(
                "lab {} has no impaired wire: run `nanowire lab up --impair --name {}`",
                self.name(),
                self.name()
            )
        })?;
        let (mut ab, mut ba) = (cur.ab.impairment, cur.ba.impairment);
        if matches!(dir, Direction::Both | Direction::Ab) {
            ab = imp;
        }
        if matches!(dir, Direction::Both | Direction::Ba) {
            ba = imp;
        }
        self.write_wire(ab, ba)?;
        self.wire_status()
            .ok_or_else(|| "the wire vanished while being programmed".to_string())
    }

    /// The wire's settings and counters, or None when the lab has no wire.
    pub fn wire_status(&self) -> Option<WireStatus> {
        if !self.wire_exists() {
            return None;
        }
        let w = self.wire_netns();
        let up = [Host::A, Host::B].iter().all(|&h| {
            ip(&["-n", &w, "link", "show", "dev", &self.wire_iface(h)])
                .is_ok_and(|l| l.contains(",UP") || l.contains("state UP"))
        });
        let mut st = WireStatus {
            netns: w,
            iface_a: self.wire_iface(Host::A),
            iface_b: self.wire_iface(Host::B),
            up,
            forwarding: false,
            ab: WireDir::default(),
            ba: WireDir::default(),
        };
        let Ok(t) = self.wire_table() else {
            return Some(st);
        };
        let items = t["nftables"].as_array().cloned().unwrap_or_default();
        for it in &items {
            let Some(rule) = it.get("rule") else { continue };
            let dir = match rule["chain"].as_str() {
                Some("ab") => &mut st.ab,
                Some("ba") => &mut st.ba,
                _ => continue,
            };
            let expr = rule["expr"].as_array().cloned().unwrap_or_default();
            let packets = expr
                .iter()
                .find_map(|e| e.get("counter").and_then(|c| c["packets"].as_u64()))
                .unwrap_or(0);
            let comment = rule["comment"].as_str().unwrap_or("");
            if expr.iter().any(|e| e.get("fwd").is_some())
                || (comment == "fwd" && expr.iter().any(|e| e.get("dup").is_some()))
            {
                st.forwarding = true;
            }
            let (kind, val) = comment.split_once(' ').unwrap_or((comment, ""));
            let val: f64 = val.parse().unwrap_or(0.0);
            match kind {
                "in" => dir.frames_in = packets,
                "loss" => {
                    dir.impairment.loss_pct = val;
                    dir.dropped_loss = packets;
                }
                "rate" => {
                    dir.impairment.rate_mbit = Some(val);
                    dir.dropped_rate = packets;
                }
                "dup" => {
                    dir.impairment.dup_pct = val;
                    dir.duplicated = packets;
                }
                _ => {}
            }
        }
        Some(st)
    }

    /// Remove everything `up` made. Succeeds when nothing is left.
    pub fn down(&self) -> Result<(), Error> {
        if !have_root() {
            return Err("the lab needs root to remove network namespaces".into());
        }
        let mut errs = Vec::new();
        for h in [Host::A, Host::B] {
            // An end that escaped to the root namespace (crash mid-build).
            let _ = ip(&["link", "del", "dev", &self.iface(h)]);
            let _ = ip(&["link", "del", "dev", &self.wire_iface(h)]);
            if self.netns_exists(h)
                && let Err(e) = ip(&["netns", "del", &self.netns(h)])
            {
                errs.push(e);
            }
        }
        if self.wire_exists()
            && let Err(e) = ip(&["netns", "del", &self.wire_netns()])
        {
            errs.push(e);
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }

    fn host_status(&self, h: Host) -> Option<HostStatus> {
        if !self.netns_exists(h) {
            return None;
        }
        let ns = self.netns(h);
        let dev = self.iface(h);
        let link = ip(&["-n", &ns, "-d", "link", "show", "dev", &dev]).ok()?;
        let mac = link
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .map(str::to_string);
        let up = link.contains("state UP") || link.contains(",UP");
        let xdp = link
            .lines()
            .find(|l| l.contains("prog/xdp"))
            .map(|l| l.trim().to_string());
        let in_ns = |args: &[&str]| {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns]).args(args);
            run(&mut c).ok()
        };
        let driver = in_ns(&["ethtool", "-i", &dev]).and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("driver:").map(|d| d.trim().to_string()))
        });
        let offloads = in_ns(&["ethtool", "-k", &dev])
            .map(|s| {
                s.lines()
                    .filter_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        let v = v.split_whitespace().next()?;
                        (v == "on" || v == "off").then(|| (k.trim().to_string(), v.to_string()))
                    })
                    .filter(|(k, _)| {
                        matches!(
                            k.as_str(),
                            "rx-checksumming"
                                | "tx-checksumming"
                                | "scatter-gather"
                                | "tcp-segmentation-offload"
                                | "generic-segmentation-offload"
                                | "generic-receive-offload"
                                | "rx-gro-hw"
                                | "rx-udp-gro-forwarding"
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(HostStatus {
            netns: ns,
            iface: dev,
            addr: self.addr(h),
            mac,
            up,
            driver,
            xdp,
            offloads,
        })
    }

    pub fn status(&self) -> LabStatus {
        let a = self.host_status(Host::A);
        let b = self.host_status(Host::B);
        let wire = self.wire_status();
        let complete = a.as_ref().is_some_and(|s| s.up)
            && b.as_ref().is_some_and(|s| s.up)
            && wire.as_ref().is_none_or(|w| w.up && w.forwarding);
        LabStatus {
            name: self.name().to_string(),
            complete,
            a,
            b,
            wire,
        }
    }

    /// A command that runs `argv` inside host `h`'s namespace.
    ///
    /// The command is killed (SIGKILL) when the thread that spawned it exits:
    /// `setpriv --pdeathsig` sets PR_SET_PDEATHSIG, which survives the execs
    /// of `ip netns exec` and of `nanowire run`. A test or report that dies
    /// hard (SIGKILL, timeout) therefore never leaves a spinning peer behind
    /// in a namespace that no longer exists.
    pub fn command(&self, h: Host, argv: &[impl AsRef<std::ffi::OsStr>]) -> Command {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &self.netns(h),
            "setpriv",
            "--pdeathsig",
            "KILL",
            "--",
        ]);
        c.args(argv);
        c
    }
}

/// A lab that is brought up on creation and taken down on drop: for tests.
pub struct ScopedLab {
    pub lab: Lab,
}

impl ScopedLab {
    pub fn new(opts: LabOptions) -> Result<ScopedLab, Error> {
        Self::build(Lab::new(opts)?)
    }

    /// A lab with the impaired wire between a and b (initially clear).
    pub fn new_impaired(opts: LabOptions) -> Result<ScopedLab, Error> {
        Self::build(Lab::new(opts)?.impaired(true))
    }

    fn build(lab: Lab) -> Result<ScopedLab, Error> {
        let _ = lab.down();
        if let Err(e) = lab.up() {
            let _ = lab.down();
            return Err(e);
        }
        Ok(ScopedLab { lab })
    }
}

impl std::ops::Deref for ScopedLab {
    type Target = Lab;
    fn deref(&self) -> &Lab {
        &self.lab
    }
}

impl Drop for ScopedLab {
    fn drop(&mut self) {
        let _ = self.lab.down();
    }
}
