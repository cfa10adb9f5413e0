//! The engine service (`nanowire engine serve`): one per network namespace,
//! root. It owns, per interface, the steering program, the claims, and per
//! queue the shared UMEM (memfd) with its fill and completion rings; each
//! attached process gets its own AF_XDP socket per queue, made and bound
//! here with `XDP_SHARED_UMEM`, and runs its data path itself.
//!
//! One thread, one poll loop; every request is answered or refused with a
//! counted reason, and nothing a client sends can take the service down.
//! A client that closes its socket (exit, kill -9) is detached at once: its
//! claims go, its sockets leave the XSKMAP, and its frames go back to the
//! fill ring (nanowire_xdp::shared). The service exits when no process has
//! been attached for `idle` (the steering program goes with it).

use super::policy::Policy;
use super::proto::{self, Request};
use crate::xdp::shm;
use nanowire_xdp::shared::{Geometry, Member, SharedQueue};
use nanowire_xdp::{AttachMode, SteerProgram, XskStats, iface};
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

/// Slots per shared UMEM (processes attached to one interface at once).
pub const SLOTS: u32 = 32;
/// TX frames of each slot.
pub const TX_PER_SLOT: u32 = 256;
/// A slot a dead process used is not handed out again for this long: TX
/// frames it had in flight complete into its mailbox meanwhile.
const SLOT_COOLING: Duration = Duration::from_secs(1);

/// Close a detached process's member sockets on the service's closer
/// thread, not in its loop: the last close of an AF_XDP socket waits in
/// the kernel's `synchronize_net` (`xsk_release`), 10-20 ms on this
/// machine, and every request of every attached process waited behind it
/// (session 26: a fork-per-connection server's child attached while the
/// last child's sockets closed, and its first byte came ~17 ms later).
/// Their XSKMAP entries are gone already and their frames reclaimed; the
/// slot cools for [`SLOT_COOLING`] before reuse. Closed here if the
/// thread cannot be had.
fn close_later(members: Vec<Member>) {
    use std::sync::mpsc::{Sender, channel};
    static CLOSER: std::sync::Mutex<Option<Sender<Vec<Member>>>> = std::sync::Mutex::new(None);
    if members.is_empty() {
        return;
    }
    let mut g = CLOSER.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        let (tx, rx) = channel::<Vec<Member>>();
        let spawned = std::thread::Builder::new()
            .name("nw-svc-closer".into())
            .spawn(move || {
                while let Ok(m) = rx.recv() {
                    drop(m);
                }
            });
        if spawned.is_ok() {
            *g = Some(tx);
        }
    }
    match g.as_ref() {
        Some(tx) => {
            if let Err(std::sync::mpsc::SendError(m)) = tx.send(members) {
                *g = None;
                drop(m);
            }
        }
        None => drop(members),
    }
}
/// Connections served at once; more are closed at once (counted), so no
/// client can exhaust the service's descriptors.
const MAX_CLIENTS: usize = 512;
/// How often the pins of finished connections are looked for (a pin
/// found stale twice in a row goes: see `Service::sweep_pins`).
const PIN_SWEEP: Duration = Duration::from_secs(5);

/// What the service counted (`nanowire engine status`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Counters {
    pub connections: u64,
    pub attaches: u64,
    pub attach_refused: u64,
    pub detaches: u64,
    /// Claims granted and refused, TCP connections claimed (by 4-tuple) and
    /// passed to the kernel: the sums of every process's own counters.
    #[serde(flatten)]
    pub requests: ClientCounters,
    /// Connections of dead processes the service ended (issue 24):
    /// `tcp_ended_repaired`: handed to the kernel (TCP_REPAIR), which sent
    /// the FIN and finishes them (retransmissions, TIME-WAIT);
    /// `tcp_ended_fin`: one FIN (where the kernel could not take it:
    /// data unacknowledged, or repair refused) or a RST (`tcp_ended_rst`);
    /// `tcp_end_failed`: nothing could be sent; `tcp_end_left`: in
    /// FIN-WAIT-2 and not handed to the kernel (nothing to send);
    /// `tcp_end_refused`: a table entry the process had no claim for (not
    /// acted on).
    pub tcp_ended_repaired: u64,
    pub tcp_ended_fin: u64,
    pub tcp_ended_rst: u64,
    pub tcp_end_failed: u64,
    pub tcp_end_left: u64,
    pub tcp_end_refused: u64,
    /// A dead process's connection the program refused to give to the
    /// kernel (`pass_tcp_flow`; its end was still sent, and said on the
    /// service's log).
    pub tcp_end_unpassed: u64,
    /// Connection tables handed over (one per attached process with TCP).
    pub conn_tables: u64,
    pub frames_reclaimed: u64,
    pub reclaim_deferred: u64,
    /// A dead process held the shared UMEM's lock: the service took it
    /// over (issue 24).
    pub locks_taken_over: u64,
    /// Pins of shared listeners' finished connections removed.
    pub tcp_pins_swept: u64,
    /// Dead processes' connections given to the kernel in the program
    /// (`Iface::handed`) whose pass went once the kernel finished them.
    pub tcp_handed_swept: u64,
    /// The generic-mode program replaced by the frags-aware one at a
    /// process's first multi-buffer packet (`K_FRAGS`).
    pub frags_upgrades: u64,
    /// Messages refused, by reason (bad_magic, short_message, ...).
    pub bad_messages: HashMap<String, u64>,
}

/// What the service counted for one attached process (`nanowire stats`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ClientCounters {
    pub claims: u64,
    pub claims_refused: u64,
    pub unclaims: u64,
    pub tcp_flows: u64,
    pub tcp_passes: u64,
    pub tcp_flows_refused: u64,
    /// Shared listeners (issue 24): joins granted (a process holding the
    /// same listening socket added to its group) and refused, and
    /// "not accepting now" notes (a fork's parent).
    pub tcp_joins: u64,
    pub tcp_joins_refused: u64,
    pub tcp_idles: u64,
    /// Connections moved between processes holding one socket (issue 24,
    /// `K_TCP_MOVE`): offered by their owner, taken by another holder, and
    /// requests refused (either half).
    pub tcp_offers: u64,
    pub tcp_moves: u64,
    pub tcp_moves_refused: u64,
}

/// A connection its owner offers to the processes holding its socket
/// (`K_TCP_MOVE` offer; `Iface::offers`).
#[derive(Debug, Clone, Copy)]
struct Offer {
    /// (st_dev, st_ino) of the socket the owner passed.
    ino: (u64, u64),
    /// The owner's client id.
    from: u64,
}

/// A TCP listener claim on the service is a group (issue 24): the
/// processes holding the same listening socket (the one whose claim made
/// it: same socket inode), each with its slot and whether it accepts now.
/// New connections are spread over the accepting slots (steer.c
/// `group_owner`); the claim lives while any member does, and after the
/// last member left while the kernel still has the listening socket (a
/// process that never joined holds it: a daemon whose first process made
/// the listener and exited, before its workers accept): a group without
/// members (its new connections the kernel's) that the next holder joins,
/// until the socket is gone ([`Service::prune_groups`]).
struct Group {
    /// Index in the program's `nw_tcp_groups`.
    gid: u32,
    /// (st_dev, st_ino) of the listening socket.
    ino: (u64, u64),
    /// (client id, slot, accepting).
    members: Vec<(u64, u32, bool)>,
}

struct Client {
    sock: OwnedFd,
    pid: i32,
    uid: u32,
    attached: Option<(String, u32)>,
    members: Vec<Member>,
    claims: Vec<(u8, Ipv4Addr, u16)>,
    /// TCP connections claimed or passed by 4-tuple (local, remote, what).
    tcp_flows: Vec<(SocketAddrV4, SocketAddrV4, proto::TcpFlow)>,
    counters: ClientCounters,
    /// The process's TCP connection table (conns.rs), read when it dies.
    conn_table: Option<OwnedFd>,
    /// Its engine's stats page, when it handed one over (a sealed memfd:
    /// mapped only while a status is made).
    page: Option<OwnedFd>,
    /// The sockets holding its client ports (`CLAIM_CLIENT_PORT`), kept
    /// while their claims last: the port stays held even if the process
    /// closes its own descriptor.
    client_ports: Vec<(Ipv4Addr, u16, OwnedFd)>,
}

/// Most client ports (`CLAIM_CLIENT_PORT`) one process may claim (its
/// block holds at most 256; the listen map, 4,096 entries, is everyone's).
const MAX_CLIENT_PORTS: usize = 512;

struct Iface {
    index: u32,
    prog: SteerProgram,
    queues: Vec<SharedQueue>,
    /// Client id per slot.
    slots: Vec<Option<u64>>,
    freed: Vec<Option<Instant>>,
    /// The user whose processes share the UMEM now (None: nobody attached).
    uid: Option<u32>,
    /// The user whose packets the UMEM last held.
    last_uid: Option<u32>,
    claims: HashMap<(u8, u32, u16), u64>,
    /// TCP 4-tuples (local, remote) claimed or passed, by client.
    tcp_flows: HashMap<(SocketAddrV4, SocketAddrV4), u64>,
    /// TCP listener claims' groups, by (addr, port).
    groups: HashMap<(u32, u16), Group>,
    /// Connections of dead processes handed to the kernel (issue 24): each
    /// 4-tuple given to the kernel in the program (`pass_tcp_flow`) before
    /// its end was sent, so that no segment of the peer reaches the kernel
    /// before its socket, nor a live member of a listener group by the
    /// hash; forgotten when the kernel no longer has the connection, not
    /// even in TIME-WAIT (`Service::sweep_pins`), or when a process claims
    /// the 4-tuple anew. Each with whose it was and how it ended (shown
    /// by `nanowire stats` as the host's orphans).
    handed: HashMap<(SocketAddrV4, SocketAddrV4), Orphan>,
    /// Connections offered to another holder of their socket, by 4-tuple
    /// (one at a time per 4-tuple: a new offer replaces the old one).
    offers: HashMap<(SocketAddrV4, SocketAddrV4), Offer>,
    mode: AttachMode,
    budget: u32,
}

/// A dead process's connection the kernel finishes (`Iface::handed`).
#[derive(Debug, Clone, Copy)]
struct Orphan {
    /// The process it was of.
    pid: i32,
    /// How the service ended it (`conns::Ended`'s counter name).
    ended: &'static str,
    /// When.
    at: Instant,
}

/// A dead client's sockets whose frames could not be taken back yet (a live
/// process held the shared lock): retried every loop turn.
struct Pending {
    iface: String,
    slot: u32,
    members: Vec<Member>,
}

pub struct Service {
    listener: OwnedFd,
    clients: HashMap<u64, Client>,
    ifaces: HashMap<String, Iface>,
    pending: Vec<Pending>,
    next_id: u64,
    counters: Counters,
    /// Asks the kernel whether a TCP 4-tuple is one of its connections
    /// (a flow claim never takes another socket's connection).
    diag: Option<nanowire_xdp::netlink::SockDiag>,
    /// Raw IPv4 socket (IPPROTO_RAW) the dead processes' connections are
    /// ended with, opened on first use.
    ender: Option<super::conns::Ender>,
    idle: Duration,
    since_idle: Instant,
    log: bool,
    /// Who may be accelerated where, who trusts whom (policy.rs).
    policy: Policy,
    /// Pins found stale at the last sweep (interface, local, remote).
    pin_suspects: std::collections::HashSet<(String, SocketAddrV4, SocketAddrV4)>,
    last_sweep: Instant,
}

fn bad(c: &mut Counters, why: &str) {
    *c.bad_messages.entry(why.to_string()).or_insert(0) += 1;
}

impl Service {
    /// Bind the namespace's service socket. `Ok(None)`: another service
    /// already serves this network namespace.
    pub fn bind(idle: Duration, log: bool, policy: Policy) -> Result<Option<Service>, String> {
        let s = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| format!("engine service socket: {e}"))?;
        let addr = SocketAddrUnix::new_abstract_name(proto::SOCKET_NAME)
            .map_err(|e| format!("engine service address: {e}"))?;
        match rustix::net::bind(&s, &addr) {
            Ok(()) => {}
            Err(rustix::io::Errno::ADDRINUSE) => return Ok(None),
            Err(e) => return Err(format!("engine service bind: {e}")),
        }
        rustix::net::listen(&s, 64).map_err(|e| format!("engine service listen: {e}"))?;
        Ok(Some(Service {
            listener: s,
            clients: HashMap::new(),
            ifaces: HashMap::new(),
            pending: Vec::new(),
            next_id: 1,
            counters: Counters::default(),
            diag: None,
            ender: None,
            idle,
            since_idle: Instant::now(),
            log,
            policy,
            pin_suspects: std::collections::HashSet::new(),
            last_sweep: Instant::now(),
        }))
    }

    fn log(&self, msg: &str) {
        if self.log {
            eprintln!("nanowire engine service: {msg}");
        }
    }

    /// Serve until unused for `idle`.
    pub fn run(&mut self) {
        loop {
            let ids: Vec<u64> = self.clients.keys().copied().collect();
            let mut pfds: Vec<libc::pollfd> = std::iter::once(&self.listener)
                .chain(ids.iter().map(|i| &self.clients[i].sock))
                .map(|f| libc::pollfd {
                    fd: rustix::fd::AsRawFd::as_raw_fd(f),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            nanowire_xdp::sys::poll(&mut pfds, self.poll_timeout_ms());
            if pfds[0].revents & libc::POLLIN != 0 {
                self.accept();
            }
            for (i, id) in ids.iter().enumerate() {
                let r = pfds[i + 1].revents;
                if r & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    self.serve_one(*id);
                }
            }
            self.retry_pending();
            self.sweep_pins();
            if !self.clients.is_empty() {
                self.since_idle = Instant::now();
            } else if self.since_idle.elapsed() >= self.idle && self.pending.is_empty() {
                self.log("no process attached: exiting");
                return;
            }
        }
    }

    /// How long the loop may sleep when nothing arrives: wake-ups only for
    /// work that is due by time (a deferred reclaim, the pin sweep, the exit
    /// when unused), none while processes are attached and nothing waits.
    /// A periodic wake-up of the service competes for a CPU with the
    /// attached processes (two vCPUs: one is the application's).
    fn poll_timeout_ms(&self) -> i32 {
        const RETRY_MS: i32 = 200;
        if !self.pending.is_empty() || self.clients.is_empty() {
            return RETRY_MS;
        }
        let passes = || {
            self.clients
                .values()
                .any(|c| c.tcp_flows.iter().any(|f| f.2 == proto::TcpFlow::Pass))
        };
        if self
            .ifaces
            .values()
            .any(|i| !i.groups.is_empty() || !i.handed.is_empty())
            || passes()
        {
            let left = PIN_SWEEP.saturating_sub(self.last_sweep.elapsed());
            return (left.as_millis() as i32).saturating_add(1);
        }
        -1
    }

    fn accept(&mut self) {
        loop {
            let s = match rustix::net::accept_with(
                &self.listener,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            ) {
                Ok(s) => s,
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => return,
                Err(_) => {
                    // Out of descriptors or memory: do not spin on a
                    // listener that stays readable.
                    bad(&mut self.counters, "accept_failed");
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            };
            if self.clients.len() >= MAX_CLIENTS {
                bad(&mut self.counters, "too_many_connections");
                continue;
            }
            // Identity from the kernel only.
            let Ok(cred) = rustix::net::sockopt::socket_peercred(&s) else {
                bad(&mut self.counters, "no_peer_credentials");
                continue;
            };
            self.counters.connections += 1;
            let id = self.next_id;
            self.next_id += 1;
            self.clients.insert(
                id,
                Client {
                    sock: s,
                    pid: cred.pid.as_raw_nonzero().get(),
                    uid: cred.uid.as_raw(),
                    attached: None,
                    members: Vec::new(),
                    claims: Vec::new(),
                    tcp_flows: Vec::new(),
                    counters: ClientCounters::default(),
                    conn_table: None,
                    page: None,
                    client_ports: Vec::new(),
                },
            );
        }
    }

    fn reply(&mut self, id: u64, msg: &[u8], fds: &[rustix::fd::BorrowedFd<'_>]) -> bool {
        let Some(c) = self.clients.get(&id) else {
            return false;
        };
        proto::send(c.sock.as_fd(), msg, fds).is_ok()
    }

    fn ok(&mut self, id: u64) {
        self.reply(id, &proto::encode_text(proto::K_OK, ""), &[]);
    }

    /// Count a request's outcome in the service's counters and the
    /// process's own (`done`: the field it counts when granted, `no` when
    /// refused).
    fn count(
        &mut self,
        id: u64,
        granted: bool,
        done: fn(&mut ClientCounters) -> &mut u64,
        no: fn(&mut ClientCounters) -> &mut u64,
    ) {
        let pick = if granted { done } else { no };
        *pick(&mut self.counters.requests) += 1;
        if let Some(c) = self.clients.get_mut(&id) {
            *pick(&mut c.counters) += 1;
        }
    }

    /// [`Service::count`] the request, then [`Service::answer`] it.
    fn count_answer(
        &mut self,
        id: u64,
        r: Result<(), String>,
        done: fn(&mut ClientCounters) -> &mut u64,
        no: fn(&mut ClientCounters) -> &mut u64,
    ) {
        self.count(id, r.is_ok(), done, no);
        self.answer(id, r);
    }

    /// Answer client `id`'s request: OK, or refused with the reason.
    fn answer(&mut self, id: u64, r: Result<(), String>) {
        match r {
            Ok(()) => self.ok(id),
            Err(why) => self.refuse(id, &why),
        }
    }

    fn refuse(&mut self, id: u64, why: &str) {
        let m = proto::encode_text(proto::K_ERR, why);
        self.reply(id, &m, &[]);
    }

    fn serve_one(&mut self, id: u64) {
        let got = match self.clients.get(&id) {
            Some(c) => proto::recv(c.sock.as_fd(), proto::MAX_REQUEST, true),
            None => return,
        };
        let m = match got {
            Ok(Some(m)) => m,
            Ok(None) => return self.detach(id),
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => return,
            Err(_) => return self.detach(id),
        };
        if m.truncated {
            bad(&mut self.counters, "too_long");
            self.refuse(id, "message too long");
            return self.detach(id);
        }
        let req = match proto::decode_request(&m.bytes) {
            Ok(r) => r,
            Err(why) => {
                bad(&mut self.counters, why);
                let pid = self.clients.get(&id).map(|c| c.pid).unwrap_or(0);
                self.log(&format!("pid {pid}: refused a bad message ({why})"));
                self.refuse(id, &format!("bad message: {why}"));
                return self.detach(id);
            }
        };
        let fds = m.fds;
        if !matches!(
            req,
            Request::Claim { .. }
                | Request::TcpJoin { .. }
                | Request::TcpFlow { .. }
                | Request::TcpMove { .. }
                | Request::ConnTable
                | Request::StatsPage
        ) && !fds.is_empty()
        {
            bad(&mut self.counters, "unexpected_descriptors");
            self.refuse(id, "bad message: unexpected descriptors");
            return self.detach(id);
        }
        match req {
            Request::Attach { iface, ring_depth } => self.attach(id, &iface, ring_depth),
            Request::Claim {
                proto: p,
                addr,
                port,
                client_port,
            } => {
                let mut fds = fds;
                if fds.len() != 1 {
                    bad(&mut self.counters, "claim_without_socket");
                    self.count(id, false, |c| &mut c.claims, |c| &mut c.claims_refused);
                    self.refuse(id, "a claim needs the kernel socket holding the port");
                    return;
                }
                let fd = fds.pop().expect("one descriptor");
                let r = if client_port {
                    self.claim_client_port(id, addr, port, fd)
                } else {
                    self.claim(id, p, addr, port, &fd)
                };
                self.count_answer(id, r, |c| &mut c.claims, |c| &mut c.claims_refused);
            }
            Request::Unclaim {
                proto: p,
                addr,
                port,
            } => {
                self.unclaim(id, p, addr, port);
                self.ok(id);
            }
            Request::TcpJoin { addr, port } => {
                let r = match fds.as_slice() {
                    [fd] => self.tcp_join(id, addr, port, fd),
                    _ => {
                        bad(&mut self.counters, "claim_without_socket");
                        Err("a join needs the listening socket".to_string())
                    }
                };
                self.count_answer(id, r, |c| &mut c.tcp_joins, |c| &mut c.tcp_joins_refused);
            }
            Request::TcpIdle { addr, port } => {
                let r = self.tcp_idle(id, addr, port);
                if r.is_ok() {
                    self.count(id, true, |c| &mut c.tcp_idles, |c| &mut c.tcp_idles);
                }
                self.answer(id, r);
            }
            Request::TcpFlow {
                what,
                local,
                remote,
            } => {
                if fds.len() > 1 {
                    bad(&mut self.counters, "unexpected_descriptors");
                    self.refuse(id, "bad message: unexpected descriptors");
                    return self.detach(id);
                }
                let r = self.tcp_flow(id, what, local, remote, fds.first());
                let done: fn(&mut ClientCounters) -> &mut u64 = match what {
                    proto::TcpFlow::Flow => |c| &mut c.tcp_flows,
                    proto::TcpFlow::Pass => |c| &mut c.tcp_passes,
                };
                self.count_answer(id, r, done, |c| &mut c.tcp_flows_refused);
            }
            Request::TcpMove {
                take,
                local,
                remote,
            } => {
                let r = match fds.as_slice() {
                    [fd] => self.tcp_move(id, take, (local, remote), fd),
                    _ => {
                        bad(&mut self.counters, "move_without_socket");
                        Err("a move needs the connection's socket".to_string())
                    }
                };
                let done: fn(&mut ClientCounters) -> &mut u64 = if take {
                    |c| &mut c.tcp_moves
                } else {
                    |c| &mut c.tcp_offers
                };
                self.count_answer(id, r, done, |c| &mut c.tcp_moves_refused);
            }
            Request::ConnTable => {
                let mut fds = fds;
                match (fds.pop(), fds.is_empty()) {
                    (Some(fd), true) => match self.conn_table(id, fd) {
                        Ok(()) => {
                            self.counters.conn_tables += 1;
                            self.reply(id, &proto::encode_text(proto::K_OK, ""), &[]);
                        }
                        Err(why) => {
                            bad(&mut self.counters, "bad_conn_table");
                            self.refuse(id, &why);
                        }
                    },
                    _ => {
                        bad(&mut self.counters, "bad_conn_table");
                        self.refuse(id, "a connection table needs exactly one memfd");
                    }
                }
            }
            Request::TcpUnflow { local, remote } => {
                self.tcp_unflow(id, local, remote);
                self.ok(id);
            }
            Request::StatsPage => {
                let mut fds = fds;
                let page = match (fds.pop(), fds.is_empty()) {
                    (Some(fd), true) => fd,
                    _ => {
                        bad(&mut self.counters, "bad_stats_page");
                        return self.refuse(id, "a stats page is one descriptor");
                    }
                };
                // Checked now (a sealed memfd holding a page), so a bad one
                // is refused to its sender rather than skipped in a status.
                match shm::read_fd(page.as_fd()) {
                    Ok(_) => {
                        if let Some(c) = self.clients.get_mut(&id) {
                            c.page = Some(page);
                        }
                        self.ok(id);
                    }
                    Err(why) => {
                        bad(&mut self.counters, "bad_stats_page");
                        self.refuse(id, &format!("stats page refused: {why}"));
                    }
                }
            }
            Request::Frags => {
                let r = self.upgrade_frags(id);
                self.answer(id, r);
            }
            Request::Status => {
                let s = self.status().to_string();
                self.reply(id, &proto::encode_text(proto::K_STATUS_REPLY, &s), &[]);
            }
        }
    }

    /// The interface, opened on first use: the steering program (a BPF
    /// link: it goes with the service) and a shared UMEM per queue.
    fn open_iface(&mut self, name: &str, ring_depth: u32) -> Result<(), String> {
        if self.ifaces.contains_key(name) {
            return Ok(());
        }
        let info = iface::lookup(name).map_err(|e| format!("interface {name}: {e}"))?;
        // The service's own settings (an attach mode forced by its
        // operator, multi-buffer turned off), as an engine of its own has.
        let settings = crate::xdp::config::config();
        let forced = settings.xdp_mode;
        let first = if settings.no_multi_buffer {
            Err("multi-buffer turned off (NANOWIRE_XDP_NO_MULTI_BUFFER=1)".to_string())
        } else {
            // In generic mode `nw_steer` first, the frags-aware program
            // once a process sees a multi-buffer packet (`K_FRAGS`): a
            // frags-aware program costs generic XDP a page-pool copy and a
            // new skb per frame (program.rs, `Frags::Lazy`).
            SteerProgram::attach(name, info.index, nanowire_xdp::Frags::Lazy, forced)
        };
        let (prog, mut mb) = match first {
            Ok(p) => (p, true),
            Err(e) => (
                SteerProgram::attach(name, info.index, nanowire_xdp::Frags::No, forced)
                    .map_err(|e2| format!("{e2} (and the multi-buffer program: {e})"))?,
                false,
            ),
        };
        let eth = info.mtu as usize + 14;
        let frame_size = if eth <= 2048 - 256 { 2048 } else { 4096 };
        let geo = Geometry {
            rx_frames: ring_depth.clamp(1024, 1 << 16).next_power_of_two(),
            tx_per_slot: TX_PER_SLOT,
            slots: SLOTS,
            frame_size,
        };
        let mode = prog.mode();
        let mut queues = Vec::new();
        for q in 0..info.rx_queues {
            let zc = mode == AttachMode::Driver;
            // A queue an exited process held is freed a moment after it is
            // gone: waited for.
            let got = super::super::while_busy(|| SharedQueue::create(info.index, q, geo, zc, mb));
            let sq = match got {
                Ok(s) => s,
                Err(e) if mb && q == 0 && !super::super::queue_busy(&e) => {
                    mb = false;
                    SharedQueue::create(info.index, q, geo, zc, false)
                        .map_err(|e2| format!("{e2} (with XDP_USE_SG: {e})"))?
                }
                Err(e) => return Err(e),
            };
            queues.push(sq);
        }
        if queues.is_empty() {
            return Err(format!("interface {name} has no RX queue"));
        }
        self.log(&format!(
            "{name}: {} XDP, {} queue(s), {} RX frames of {frame_size} B shared, {} slots",
            mode.as_str(),
            queues.len(),
            geo.rx_frames,
            geo.slots
        ));
        if let Some(why) = queues[0].small_pages() {
            // A slower data path than an own engine's (TLB misses): said
            // at the default level.
            eprintln!("nanowire engine service: {name}: shared UMEM on 4 KiB pages ({why})");
        }
        self.ifaces.insert(
            name.to_string(),
            Iface {
                index: info.index,
                prog,
                queues,
                slots: vec![None; SLOTS as usize],
                freed: vec![None; SLOTS as usize],
                uid: None,
                last_uid: None,
                claims: HashMap::new(),
                tcp_flows: HashMap::new(),
                groups: HashMap::new(),
                handed: Default::default(),
                offers: Default::default(),
                mode,
                budget: TX_PER_SLOT.min(256),
            },
        );
        Ok(())
    }

    /// A process received a multi-buffer packet: the interface's program
    /// becomes the frags-aware one (once; later asks have nothing to do).
    fn upgrade_frags(&mut self, id: u64) -> Result<(), String> {
        let (pid, name) = match self.clients.get(&id) {
            Some(Client {
                pid,
                attached: Some((name, _)),
                ..
            }) => (*pid, name.clone()),
            _ => return Err("not attached".into()),
        };
        let ifc = self.ifaces.get_mut(&name).ok_or("not attached")?;
        if ifc.prog.upgrade_frags()? {
            self.counters.frags_upgrades += 1;
            self.log(&format!(
                "{name}: multi-buffer packet seen by pid {pid}: the frags-aware program is in place"
            ));
        }
        Ok(())
    }

    fn attach(&mut self, id: u64, name: &str, ring_depth: u32) {
        let (uid, pid, already) = match self.clients.get(&id) {
            Some(c) => (c.uid, c.pid, c.attached.is_some()),
            None => return,
        };
        if already {
            bad(&mut self.counters, "attach_twice");
            self.counters.attach_refused += 1;
            return self.refuse(id, "already attached");
        }
        if !self.policy.allows(uid, name) {
            bad(&mut self.counters, "not_allowed");
            self.counters.attach_refused += 1;
            self.log(&format!("pid {pid} (uid {uid}): not allowed on {name}"));
            return self.refuse(
                id,
                &format!(
                    "uid {uid} may not be accelerated on {name} (the engine service's policy)"
                ),
            );
        }
        if let Err(e) = self.open_iface(name, ring_depth) {
            self.counters.attach_refused += 1;
            return self.refuse(id, &e);
        }
        let ifc = self.ifaces.get_mut(name).expect("opened above");
        // Sharing a UMEM means reading each other's packets: only users
        // that trust each other (the same user, or a policy `trust` line)
        // share one; another user gets the kernel path, with the reason.
        let strangers: Vec<u32> = ifc
            .slots
            .iter()
            .flatten()
            .filter_map(|c| self.clients.get(c).map(|c| c.uid))
            .filter(|&u| !self.policy.trusts(u, uid))
            .collect();
        if let Some(owner) = strangers.first() {
            bad(&mut self.counters, "untrusted_user");
            self.counters.attach_refused += 1;
            self.log(&format!(
                "pid {pid} (uid {uid}): refused on {name}: uid {owner} holds the UMEM"
            ));
            return self.refuse(
                id,
                &format!(
                    "{name}: the engine service's shared UMEM is in use by uid {owner}'s processes, \
                     and no policy trust line lets uid {uid} share packet memory with them"
                ),
            );
        }
        let now = Instant::now();
        let Some(slot) = (0..SLOTS as usize).find(|&s| {
            ifc.slots[s].is_none() && ifc.freed[s].is_none_or(|t| now - t >= SLOT_COOLING)
        }) else {
            self.counters.attach_refused += 1;
            return self.refuse(
                id,
                &format!("{name}: all {SLOTS} process slots of the engine service are in use"),
            );
        };
        if ifc.uid.is_none() && ifc.last_uid.is_some_and(|u| !self.policy.trusts(u, uid)) {
            // Another user's packets may still lie in the frames.
            for q in &mut ifc.queues {
                if let Err(e) = q.wipe() {
                    bad(&mut self.counters, "umem_resized");
                    self.counters.attach_refused += 1;
                    self.log(&format!("pid {pid} (uid {uid}): refused on {name}: {e}"));
                    return self.refuse(id, &format!("{name}: {e}"));
                }
            }
        }
        let mut members = Vec::new();
        for q in &mut ifc.queues {
            match q.member(slot as u32) {
                Ok(m) => members.push(m),
                Err(e) => {
                    self.counters.attach_refused += 1;
                    return self.refuse(id, &e);
                }
            }
        }
        for (q, m) in members.iter().enumerate() {
            if let Err(e) = ifc.prog.set_slot_xsk(slot as u32, q as u32, m) {
                for q2 in 0..q {
                    ifc.prog.clear_slot_xsk(slot as u32, q2 as u32);
                }
                self.counters.attach_refused += 1;
                return self.refuse(id, &e);
            }
        }
        let geo = ifc.queues[0].geometry();
        let reply = proto::AttachReply {
            slot: slot as u32,
            queues: ifc.queues.len() as u32,
            geo,
            zero_copy: ifc.queues[0].zero_copy(),
            multi_buffer: ifc.queues[0].multi_buffer(),
            xdp_generic: ifc.mode == AttachMode::Skb,
            tx_budget: ifc.budget,
            frags_lazy: ifc.prog.can_upgrade() && ifc.queues[0].multi_buffer(),
            tx_metadata: ifc.queues.iter().all(|q| q.tx_metadata()),
        };
        let mut fds = Vec::new();
        for (q, m) in ifc.queues.iter().zip(&members) {
            fds.push(q.umem_fd());
            fds.push(q.ctl_fd());
            fds.push(m.as_fd());
        }
        fds.push(ifc.prog.ready_fd());
        let msg = proto::encode_attach_reply(&reply);
        let c = &self.clients[&id];
        let sent = proto::send(c.sock.as_fd(), &msg, &fds).is_ok();
        drop(fds);
        let ifc = self.ifaces.get_mut(name).expect("opened above");
        ifc.slots[slot] = Some(id);
        ifc.uid = Some(uid);
        ifc.last_uid = Some(uid);
        let c = self.clients.get_mut(&id).expect("checked above");
        c.attached = Some((name.to_string(), slot as u32));
        c.members = members;
        self.counters.attaches += 1;
        self.log(&format!(
            "pid {pid} (uid {uid}) attached to {name} in slot {slot}"
        ));
        if !sent {
            self.detach(id);
        }
    }

    /// The (interface, slot) client `id` is attached to; a `what` request
    /// before the attach is refused and counted (`claim_before_attach`).
    fn attached(&mut self, id: u64, what: &str) -> Result<(String, u32), String> {
        let c = self.clients.get(&id).ok_or("gone")?;
        match c.attached.clone() {
            Some(a) => Ok(a),
            None => {
                bad(&mut self.counters, "claim_before_attach");
                Err(format!("{what} before attach"))
            }
        }
    }

    fn claim(
        &mut self,
        id: u64,
        p: u8,
        addr: Ipv4Addr,
        port: u16,
        sock: &OwnedFd,
    ) -> Result<(), String> {
        let (name, slot) = self.attached(id, "claim")?;
        // A TCP listener's socket is bound, not yet listening: the shim
        // claims before the kernel listens (else the kernel would complete
        // the handshakes that arrive in between, which the engine resets).
        holds_port(sock, p, addr, port, || iface::ipv4_addrs_of(&name))?;
        let key = (p, addr.to_bits(), port);
        if self.ifaces.get(&name).and_then(|i| i.claims.get(&key)) == Some(&NOBODY) {
            // A listener group without members whose socket may be gone
            // (its last holder died a moment ago): asked now.
            self.prune_groups();
            // Still there: this very socket (a program exec'd with it, a
            // holder that never joined) takes the group up.
            let ino = socket_inode(sock)?;
            let ifc = self.ifaces.get_mut(&name).ok_or("interface gone")?;
            if let Some(g) = ifc.groups.get_mut(&(addr.to_bits(), port))
                && g.members.is_empty()
                && g.ino == ino
            {
                g.members.push((id, slot, true));
                write_group(&mut ifc.prog, g)?;
                ifc.claims.insert(key, id);
                let c = self.clients.get_mut(&id).expect("attached above");
                c.claims.push((p, addr, port));
                return Ok(());
            }
        }
        let ifc = self.ifaces.get_mut(&name).ok_or("interface gone")?;
        if held_by(&ifc.claims, key, id)? {
            return Ok(());
        }
        if p == proto::PROTO_TCP {
            let ino = socket_inode(sock)?;
            let gid = (0..nanowire_xdp::program::GROUPS)
                .find(|g| ifc.groups.values().all(|x| x.gid != *g))
                .ok_or("every listener group of the engine service is in use")?;
            ifc.prog.set_tcp_group(gid, &[slot])?;
            ifc.prog.claim_tcp_listener(
                addr,
                port,
                nanowire_xdp::program::SLOT | nanowire_xdp::program::GROUP | gid,
            )?;
            ifc.groups.insert(
                (addr.to_bits(), port),
                Group {
                    gid,
                    ino,
                    members: vec![(id, slot, true)],
                },
            );
        } else {
            ifc.prog.claim_slot(addr, port, slot)?;
        }
        ifc.claims.insert(key, id);
        self.clients
            .get_mut(&id)
            .expect("checked above")
            .claims
            .push((p, addr, port));
        Ok(())
    }

    /// A port of the process's client port block: the socket must hold it
    /// alone ([`holds_port_alone`]: then no other socket of the host, and no
    /// connection of one, can have that address and port, so every segment
    /// for it is this process's and no sock_diag look per connection is
    /// needed), then it is claimed as a listener's (address, port) and the
    /// socket kept while the claim lasts.
    fn claim_client_port(
        &mut self,
        id: u64,
        addr: Ipv4Addr,
        port: u16,
        sock: OwnedFd,
    ) -> Result<(), String> {
        let c = self.clients.get(&id).ok_or("gone")?;
        if c.client_ports.len() >= MAX_CLIENT_PORTS {
            return Err(format!(
                "{addr}:{port} not claimed: the process holds {MAX_CLIENT_PORTS} client ports already"
            ));
        }
        let (name, slot) = self.attached(id, "claim")?;
        holds_port_alone(&sock, addr, port)?;
        let ifc = self.ifaces.get_mut(&name).ok_or("interface gone")?;
        let key = (proto::PROTO_TCP, addr.to_bits(), port);
        if held_by(&ifc.claims, key, id)? {
            return Ok(());
        }
        // One owner, never a listener group (nothing is accepted on it).
        ifc.prog
            .claim_tcp_listener(addr, port, nanowire_xdp::program::SLOT | slot)?;
        ifc.claims.insert(key, id);
        let c = self.clients.get_mut(&id).expect("checked above");
        c.claims.push((proto::PROTO_TCP, addr, port));
        c.client_ports.push((addr, port, sock));
        Ok(())
    }

    fn unclaim(&mut self, id: u64, p: u8, addr: Ipv4Addr, port: u16) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        if p == proto::PROTO_TCP {
            c.client_ports.retain(|k| (k.0, k.1) != (addr, port));
        }
        let Some(i) = c.claims.iter().position(|&k| k == (p, addr, port)) else {
            return;
        };
        c.claims.swap_remove(i);
        let Some((name, slot)) = c.attached.clone() else {
            return;
        };
        c.counters.unclaims += 1;
        self.counters.requests.unclaims += 1;
        if let Some(ifc) = self.ifaces.get_mut(&name) {
            release_claim(ifc, id, slot, p, addr, port);
        }
        self.prune_groups();
    }

    /// Listener groups without members end once the kernel no longer has
    /// their listening socket (every holder closed it; asked over
    /// sock_diag: a socket of another inode listening there is not it).
    /// Kept when the kernel cannot be asked.
    fn prune_groups(&mut self) {
        let empty: Vec<(String, (u32, u16), u64)> = self
            .ifaces
            .iter()
            .flat_map(|(n, i)| {
                i.groups
                    .iter()
                    .filter(|(_, g)| g.members.is_empty())
                    .map(move |(k, g)| (n.clone(), *k, g.ino.1))
            })
            .collect();
        for (name, gk, ino) in empty {
            let local = SocketAddrV4::new(Ipv4Addr::from_bits(gk.0), gk.1);
            if self.diag.is_none() {
                self.diag = nanowire_xdp::netlink::SockDiag::open().ok();
            }
            let Some(d) = self.diag.as_mut() else {
                return;
            };
            let listening = match d.tcp_listener_inode(local) {
                Ok(i) => i,
                Err(_) => {
                    self.diag = None;
                    continue;
                }
            };
            if listening != Some(ino)
                && let Some(ifc) = self.ifaces.get_mut(&name)
            {
                end_group(ifc, gk);
                self.log(&format!(
                    "TCP listener {local}: no process holds it any more: its group ends"
                ));
            }
        }
    }

    /// A process holding the same listening socket as a TCP listener claim
    /// (a forked worker: `sock` is its copy, the same socket inode) joins
    /// the claim's group, accepting: new connections are spread over it
    /// too. A member joining again is accepting again (a fork's parent
    /// that accepts after all).
    fn tcp_join(
        &mut self,
        id: u64,
        addr: Ipv4Addr,
        port: u16,
        sock: &OwnedFd,
    ) -> Result<(), String> {
        let (name, slot) = self.attached(id, "join")?;
        holds_port(sock, proto::PROTO_TCP, addr, port, || {
            iface::ipv4_addrs_of(&name)
        })?;
        let ino = socket_inode(sock)?;
        let ifc = self.ifaces.get_mut(&name).ok_or("interface gone")?;
        let Some(g) = ifc.groups.get_mut(&(addr.to_bits(), port)) else {
            return Err(format!(
                "TCP {addr}:{port} is no listener on the engine service (nothing to share)"
            ));
        };
        if g.ino != ino {
            return Err(format!(
                "TCP {addr}:{port}: the socket passed is not the listening socket the engine service serves there (another socket holds the port)"
            ));
        }
        match g.members.iter_mut().find(|m| m.0 == id) {
            Some(m) => m.2 = true,
            None => g.members.push((id, slot, true)),
        }
        write_group(&mut ifc.prog, g)?;
        let c = self.clients.get_mut(&id).expect("checked above");
        if !c.claims.contains(&(proto::PROTO_TCP, addr, port)) {
            c.claims.push((proto::PROTO_TCP, addr, port));
        }
        Ok(())
    }

    /// A member of a listener group stops accepting for now (a fork's
    /// parent: its workers accept): no new connection is steered to it;
    /// its own connections stay pinned to it.
    fn tcp_idle(&mut self, id: u64, addr: Ipv4Addr, port: u16) -> Result<(), String> {
        let c = self.clients.get(&id).ok_or("gone")?;
        let Some((name, _)) = c.attached.clone() else {
            return Err("idle before attach".into());
        };
        let ifc = self.ifaces.get_mut(&name).ok_or("interface gone")?;
        let g = ifc
            .groups
            .get_mut(&(addr.to_bits(), port))
            .ok_or_else(|| format!("TCP {addr}:{port} is no listener on the engine service"))?;
        let m = g.members.iter_mut().find(|m| m.0 == id).ok_or_else(|| {
            format!("TCP {addr}:{port}: this process does not share the listener")
        })?;
        m.2 = false;
        write_group(&mut ifc.prog, g)
    }

    /// One TCP connection by 4-tuple. `Flow` (a connect, or a connection of
    /// this process's listener kept when the listener is released): the
    /// kernel socket holding `local`'s port comes with it, or the process
    /// holds the listener claim of `local`; and the kernel has no live
    /// connection on the 4-tuple (never another socket's segments). `Pass`:
    /// a connection handed over to the kernel under the process's own
    /// listener claim, or its own flow claim (a connection moved to it).
    fn tcp_flow(
        &mut self,
        id: u64,
        what: proto::TcpFlow,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        sock: Option<&OwnedFd>,
    ) -> Result<(), String> {
        let (name, slot) = self.attached(id, "claim")?;
        let ifc = self.ifaces.get(&name).ok_or("interface gone")?;
        // A pass of its own flow claim (a connection moved to it, handed
        // over to the kernel) needs no listener.
        let under_listener = under_listener(ifc, id, local)
            || (what == proto::TcpFlow::Pass
                && owns_flow(self.clients.get(&id), ifc, id, (local, remote)));
        // The claimant shows the kernel's live connection itself (its own
        // socket): it takes the 4-tuple over from the kernel, whoever had
        // passed it there.
        let mut its_own_kernel_conn = false;
        match (what, sock) {
            (proto::TcpFlow::Pass, _) | (proto::TcpFlow::Flow, None) if !under_listener => {
                return Err(format!(
                    "TCP {local} <-> {remote} not claimed: neither a socket holding the port nor this process's listener"
                ));
            }
            (proto::TcpFlow::Flow, Some(fd)) if !under_listener => {
                holds_port(fd, proto::PROTO_TCP, *local.ip(), local.port(), || {
                    iface::ipv4_addrs_of(&name)
                })?;
                if self.kernel_has(local, remote)? {
                    if !self.is_that_connection(fd, local, remote)? {
                        return Err(format!(
                            "TCP {local} <-> {remote} not claimed: it is a connection of a kernel socket"
                        ));
                    }
                    its_own_kernel_conn = true;
                }
            }
            _ => {}
        }
        let ifc = self.ifaces.get_mut(&name).ok_or("interface gone")?;
        match ifc.tcp_flows.get(&(local, remote)) {
            Some(&o) if o != id => {
                let passed = self.clients.get(&o).is_some_and(|c| {
                    c.tcp_flows
                        .iter()
                        .any(|f| (f.0, f.1, f.2) == (local, remote, proto::TcpFlow::Pass))
                });
                if !(its_own_kernel_conn && passed) {
                    return Err(format!(
                        "TCP {local} <-> {remote} is claimed by another process on the engine service"
                    ));
                }
                // Passed to the kernel by `o` (a hand-over), taken from the
                // kernel by this process: `o` has no claim on it any more.
                if let Some(c) = self.clients.get_mut(&o) {
                    c.tcp_flows.retain(|f| (f.0, f.1) != (local, remote));
                }
            }
            _ => {}
        }
        let ifc = self.ifaces.get_mut(&name).ok_or("interface gone")?;
        match what {
            proto::TcpFlow::Flow => {
                ifc.prog
                    .claim_tcp_flow(local, remote, nanowire_xdp::program::SLOT | slot)?
            }
            proto::TcpFlow::Pass => ifc.prog.pass_tcp_flow(local, remote)?,
        }
        ifc.tcp_flows.insert((local, remote), id);
        ifc.handed.remove(&(local, remote));
        let flows = &mut self.clients.get_mut(&id).expect("checked above").tcp_flows;
        match flows.iter_mut().find(|f| (f.0, f.1) == (local, remote)) {
            Some(f) => f.2 = what,
            None => flows.push((local, remote, what)),
        }
        Ok(())
    }

    /// `K_TCP_MOVE` of the TCP connection (local, remote) by client `id`,
    /// showing its copy of the connection's socket `sock`:
    ///
    /// * an **offer** (`take` false): its owner offers it to the processes
    ///   holding `sock`. It must steer the 4-tuple now (its flow claim, or
    ///   its listener's, or its client port's claim of `local`, and then the
    ///   kernel has no live connection on it); the service keeps the
    ///   socket's inode. A new offer of the 4-tuple replaces an old one.
    /// * a **take** (`take` true): a process holding the socket of an offered
    ///   connection takes it: `sock` must be that socket (the inode the owner
    ///   passed: a fork's copy of the same open file); then the 4-tuple is
    ///   steered to its slot and is its flow claim (released with its other
    ///   claims, ended by the service if it dies).
    fn tcp_move(
        &mut self,
        id: u64,
        take: bool,
        (local, remote): (SocketAddrV4, SocketAddrV4),
        sock: &OwnedFd,
    ) -> Result<(), String> {
        let (name, slot) = self.attached(id, "move")?;
        let ino = tcp_socket_inode(sock)?;
        if take {
            return self.tcp_take(id, &name, slot, (local, remote), ino);
        }
        let ifc = self.ifaces.get(&name).ok_or("interface gone")?;
        let steers = owns_flow(self.clients.get(&id), ifc, id, (local, remote))
            || (!ifc.tcp_flows.contains_key(&(local, remote))
                && under_listener(ifc, id, local)
                && !self.kernel_has(local, remote)?);
        if !steers {
            return Err(format!(
                "TCP {local} <-> {remote} not offered: this process does not own it on the engine service"
            ));
        }
        let ifc = self.ifaces.get_mut(&name).ok_or("interface gone")?;
        ifc.offers.insert((local, remote), Offer { ino, from: id });
        Ok(())
    }

    /// [`Service::tcp_move`]'s take by client `id` (slot `slot` of
    /// interface `name`), showing the socket of inode `ino`.
    fn tcp_take(
        &mut self,
        id: u64,
        name: &str,
        slot: u32,
        (local, remote): (SocketAddrV4, SocketAddrV4),
        ino: (u64, u64),
    ) -> Result<(), String> {
        let ifc = self.ifaces.get_mut(name).ok_or("interface gone")?;
        let Some(o) = ifc.offers.get(&(local, remote)).copied() else {
            return Err(format!(
                "TCP {local} <-> {remote} not moved: no process offers it"
            ));
        };
        if o.from == id {
            return Err(format!(
                "TCP {local} <-> {remote} not moved: this process offers it"
            ));
        }
        if o.ino != ino {
            return Err(format!(
                "TCP {local} <-> {remote} not moved: the socket passed is not the connection's socket"
            ));
        }
        ifc.prog
            .claim_tcp_flow(local, remote, nanowire_xdp::program::SLOT | slot)?;
        ifc.offers.remove(&(local, remote));
        ifc.tcp_flows.insert((local, remote), id);
        ifc.handed.remove(&(local, remote));
        if let Some(c) = self.clients.get_mut(&o.from) {
            c.tcp_flows.retain(|f| (f.0, f.1) != (local, remote));
        }
        let c = self.clients.get_mut(&id).expect("attached above");
        c.tcp_flows.retain(|f| (f.0, f.1) != (local, remote));
        c.tcp_flows.push((local, remote, proto::TcpFlow::Flow));
        Ok(())
    }

    /// Does the kernel hold a live connection (not TIME-WAIT or closed) on
    /// the 4-tuple? Asked over sock_diag; an error refuses the claim.
    fn kernel_has(&mut self, local: SocketAddrV4, remote: SocketAddrV4) -> Result<bool, String> {
        Ok(!matches!(
            self.kernel_state(local, remote)?,
            None | Some(nanowire_xdp::netlink::TCP_TIME_WAIT | nanowire_xdp::netlink::TCP_CLOSE)
        ))
    }

    /// Is `sock` itself the kernel's live connection (local, remote)? Its
    /// holder takes it onto the engine (issue 24 item 2: a connection an
    /// exec'd program inherited as the kernel's): it can read and write
    /// it already, so the claim gives it nothing it did not have.
    fn is_that_connection(
        &mut self,
        sock: &OwnedFd,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> Result<bool, String> {
        let (_, ino) = tcp_socket_inode(sock)?;
        let d = match self.diag.as_mut() {
            Some(d) => d,
            None => self.diag.insert(
                nanowire_xdp::netlink::SockDiag::open()
                    .map_err(|e| format!("cannot ask the kernel about TCP connections: {e}"))?,
            ),
        };
        match d.tcp_conn_inode(local, remote) {
            Ok(found) => Ok(found.is_some_and(|(_, i)| i == ino)),
            Err(e) => {
                self.diag = None;
                Err(format!("cannot ask the kernel about TCP connections: {e}"))
            }
        }
    }

    /// The kernel's state of its connection on the 4-tuple (None: none),
    /// over sock_diag.
    fn kernel_state(
        &mut self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> Result<Option<u8>, String> {
        if self.diag.is_none() {
            self.diag = Some(
                nanowire_xdp::netlink::SockDiag::open()
                    .map_err(|e| format!("cannot ask the kernel about TCP connections: {e}"))?,
            );
        }
        let d = self.diag.as_mut().expect("opened above");
        match d.tcp_state(local, remote) {
            Ok(s) => Ok(s),
            Err(e) => {
                self.diag = None;
                Err(format!("cannot ask the kernel about TCP connections: {e}"))
            }
        }
    }

    /// Keep the process's connection table: a regular file (memfd) of
    /// exactly the table's size, one per process.
    fn conn_table(&mut self, id: u64, fd: OwnedFd) -> Result<(), String> {
        let st = rustix::fs::fstat(&fd).map_err(|e| format!("connection table: {e}"))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
            || st.st_size as usize != super::conns::TABLE_BYTES
        {
            return Err("connection table: not a memfd of the table's size".into());
        }
        let c = self.clients.get_mut(&id).ok_or("gone")?;
        if c.attached.is_none() {
            return Err("connection table before attach".into());
        }
        if c.conn_table.is_some() {
            return Err("connection table already given".into());
        }
        c.conn_table = Some(fd);
        Ok(())
    }

    /// The entries of a dead client's table (issue 24) the service may
    /// act on: a 4-tuple it had claimed (a connect's flow claim), or one
    /// under its listener claim that is no live kernel connection (a
    /// kernel socket of another process may use the same local port with
    /// SO_REUSEADDR); nothing else.
    fn ends_of(&mut self, c: &Client) -> Vec<(super::conns::Entry, Option<Vec<u8>>)> {
        let Some(fd) = &c.conn_table else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in super::conns::read_all(fd) {
            let ok = c
                .tcp_flows
                .contains(&(e.local, e.remote, proto::TcpFlow::Flow))
                || (c
                    .claims
                    .contains(&(proto::PROTO_TCP, *e.local.ip(), e.local.port()))
                    && self.kernel_has(e.local, e.remote) == Ok(false));
            if ok {
                out.push((e, super::conns::unacked(fd, &e)));
            } else {
                self.counters.tcp_end_refused += 1;
            }
        }
        out
    }

    /// End a dead process's connections on interface `name`, before its
    /// claims go (until then the peer's segments reach the dead process's
    /// AF_XDP socket, which the service holds: they are lost there, as on
    /// a wire, and the peer retransmits). Each in two steps
    /// (`conns::Ender`): a FIN end gets its kernel socket (TCP_REPAIR);
    /// then the 4-tuple is given to the kernel in the program (`handed`),
    /// ahead of any listener claim or group, whose hash would send the
    /// connection to a live member that resets it; then the end is sent:
    /// the kernel closes its socket (it sends the FIN and finishes the
    /// connection as its own closed socket), or, for the others, one
    /// segment through a raw IPv4 socket (the kernel routes it and finds
    /// the next hop; the service has no TX ring of its own, the dead
    /// process's is being taken back), whose answer reaches the kernel,
    /// which resets with the exact sequence number. So no segment of the
    /// peer ever reaches the kernel before its socket does.
    fn send_ends(
        &mut self,
        name: &str,
        pid: i32,
        ends: Vec<(super::conns::Entry, Option<Vec<u8>>)>,
    ) {
        if ends.is_empty() {
            return;
        }
        if self.ender.is_none() {
            match super::conns::Ender::open() {
                Ok(en) => self.ender = Some(en),
                Err(e) => {
                    self.counters.tcp_end_failed += ends.len() as u64;
                    self.log(&format!(
                        "cannot end a dead process's TCP connections (raw socket: {e})"
                    ));
                    return;
                }
            }
        }
        // Test hook: a slow end (the peer's segments meanwhile must still
        // find what they find plainly: tests/run_exit.rs).
        if let Some(ms) = std::env::var("NANOWIRE_TEST_END_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let en = self.ender.as_mut().expect("opened above");
        let now_ms = (crate::xdp::tcp::now_ns() / 1_000_000) as u32;
        for (e, data) in ends {
            let h = en.hold(e, data, now_ms);
            let passed = match self.ifaces.get_mut(name) {
                Some(ifc) => match ifc.prog.pass_tcp_flow(e.local, e.remote) {
                    Ok(()) => true,
                    // Said and counted, not silent: the end still goes
                    // out, but a peer segment may meet a listener group's
                    // live member.
                    Err(why) => {
                        self.counters.tcp_end_unpassed += 1;
                        if self.log {
                            eprintln!(
                                "nanowire engine service: {name}: {} -> {}: not given to the kernel in the program ({why})",
                                e.local, e.remote
                            );
                        }
                        false
                    }
                },
                None => false,
            };
            let k = &mut self.counters;
            let (counter, ended) = match en.finish(h, now_ms) {
                super::conns::Ended::Repaired => (&mut k.tcp_ended_repaired, "repaired"),
                super::conns::Ended::Fin => (&mut k.tcp_ended_fin, "fin"),
                super::conns::Ended::Rst => (&mut k.tcp_ended_rst, "rst"),
                super::conns::Ended::Failed => (&mut k.tcp_end_failed, "failed"),
                super::conns::Ended::Left => (&mut k.tcp_end_left, "left"),
            };
            *counter += 1;
            if passed && let Some(ifc) = self.ifaces.get_mut(name) {
                let at = Instant::now();
                ifc.handed
                    .insert((e.local, e.remote), Orphan { pid, ended, at });
            }
        }
        if let Some(note) = en.note.take() {
            self.log(&note);
        }
    }

    fn tcp_unflow(&mut self, id: u64, local: SocketAddrV4, remote: SocketAddrV4) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        let Some(i) = c
            .tcp_flows
            .iter()
            .position(|f| (f.0, f.1) == (local, remote))
        else {
            return;
        };
        c.tcp_flows.swap_remove(i);
        let Some((name, _)) = c.attached.clone() else {
            return;
        };
        if let Some(ifc) = self.ifaces.get_mut(&name) {
            ifc.offers
                .retain(|&k, o| k != (local, remote) || o.from != id);
        }
        if let Some(ifc) = self.ifaces.get_mut(&name)
            && ifc.tcp_flows.remove(&(local, remote)).is_some()
        {
            ifc.prog.unclaim_tcp_flow(local, remote);
            self.counters.requests.unclaims += 1;
            c.counters.unclaims += 1;
        }
    }

    /// A client is gone (closed, killed, or refused): its claims and
    /// sockets leave the program at once, its frames go back.
    fn detach(&mut self, id: u64) {
        let Some(c) = self.clients.remove(&id) else {
            return;
        };
        let Some((name, slot)) = c.attached.clone() else {
            return;
        };
        self.counters.detaches += 1;
        // Read before the claims go (they say which entries are its own),
        // and ended before they go (`send_ends`).
        let ends = self.ends_of(&c);
        let n_ends = ends.len();
        self.send_ends(&name, c.pid, ends);
        // Its passes of connections the kernel still has (a connection
        // moved to it from another process and handed over to the kernel
        // there: another process holds the socket) stay until the kernel
        // is done with them, as a dead process's handed connections do.
        let passed: Vec<(SocketAddrV4, SocketAddrV4)> = c
            .tcp_flows
            .iter()
            .filter(|f| f.2 == proto::TcpFlow::Pass)
            .map(|f| (f.0, f.1))
            .filter(|&(l, r)| self.kernel_has(l, r).unwrap_or(true))
            .collect();
        let Some(ifc) = self.ifaces.get_mut(&name) else {
            return;
        };
        for (l, r) in passed {
            if ifc.tcp_flows.get(&(l, r)) == Some(&id) {
                let at = Instant::now();
                ifc.handed.entry((l, r)).or_insert(Orphan {
                    pid: c.pid,
                    ended: "passed",
                    at,
                });
            }
        }
        for (p, addr, port) in &c.claims {
            release_claim(ifc, id, slot, *p, *addr, *port);
        }
        let ifc = {
            self.prune_groups();
            match self.ifaces.get_mut(&name) {
                Some(i) => i,
                None => return,
            }
        };
        for (l, r, _) in &c.tcp_flows {
            // A connection handed to the kernel keeps its pass; one it
            // offered keeps steering to its dead slot (dropped there, the
            // peer retransmits) until the taker's claim replaces it.
            let offered = ifc.offers.contains_key(&(*l, *r));
            if ifc.tcp_flows.remove(&(*l, *r)).is_some()
                && !ifc.handed.contains_key(&(*l, *r))
                && !offered
            {
                ifc.prog.unclaim_tcp_flow(*l, *r);
            }
        }
        for q in 0..ifc.queues.len() {
            ifc.prog.clear_slot_xsk(slot, q as u32);
        }
        ifc.slots[slot as usize] = None;
        ifc.freed[slot as usize] = Some(Instant::now());
        if ifc.slots.iter().all(|s| s.is_none()) {
            ifc.uid = None;
        }
        self.pending.push(Pending {
            iface: name.clone(),
            slot,
            members: c.members,
        });
        self.retry_pending();
        self.log(&format!(
            "pid {} detached from {name} (slot {slot}, {} claim(s) and {} TCP connection(s) released, {n_ends} connection(s) ended)",
            c.pid,
            c.claims.len(),
            c.tcp_flows.len()
        ));
    }

    /// The program pins each connection of a shared listener to the slot
    /// its SYN went to (steer.c `group_owner`); the pins of a member that
    /// leaves go with it, those of its finished connections are found here:
    /// a pin whose connection is in no table of its slot's process (conns.rs)
    /// at two sweeps in a row goes (a fresh half-open connection is not in
    /// the table yet; losing its pin only sends its next segments by the
    /// hash, to the same slot while the group is unchanged).
    fn sweep_pins(&mut self) {
        if self.last_sweep.elapsed() < PIN_SWEEP {
            return;
        }
        self.last_sweep = Instant::now();
        self.prune_groups();
        let mut suspects = std::collections::HashSet::new();
        let mut kernel = Vec::new();
        let mut handed = Vec::new();
        let clients = &self.clients;
        for (name, ifc) in self.ifaces.iter_mut() {
            handed.extend(ifc.handed.keys().map(|&(l, r)| (name.clone(), l, r)));
            if ifc.groups.is_empty() {
                continue;
            }
            let pins = ifc.prog.tcp_pins();
            if pins.is_empty() {
                continue;
            }
            // Live connections per slot (a process without a table: its
            // pins are left alone).
            let mut live: HashMap<u32, std::collections::HashSet<(SocketAddrV4, SocketAddrV4)>> =
                HashMap::new();
            for (slot, id) in ifc.slots.iter().enumerate() {
                let Some(fd) = id.and_then(|i| clients.get(&i)?.conn_table.as_ref()) else {
                    continue;
                };
                live.insert(
                    slot as u32,
                    super::conns::read_all(fd)
                        .into_iter()
                        .map(|e| (e.local, e.remote))
                        .collect(),
                );
            }
            let mut gone = Vec::new();
            for (l, r, v) in pins {
                if v == nanowire_xdp::program::PIN_KERNEL {
                    // Asked of the kernel below.
                    kernel.push((name.clone(), l, r));
                    continue;
                }
                let Some(set) = live.get(&(v & 63)) else {
                    continue;
                };
                if set.contains(&(l, r)) {
                    continue;
                }
                let key = (name.clone(), l, r);
                if self.pin_suspects.contains(&key) {
                    gone.push((l, r));
                } else {
                    suspects.insert(key);
                }
            }
            // One system call for all of them (not one per pin).
            self.counters.tcp_pins_swept += ifc.prog.unpin_tcp_flows(&gone) as u64;
        }
        // A kernel pin goes once the kernel no longer has its connection
        // (closed or in TIME-WAIT), at two sweeps in a row.
        for (name, l, r) in kernel {
            if self.kernel_has(l, r).unwrap_or(true) {
                continue;
            }
            let key = (name, l, r);
            if self.pin_suspects.contains(&key) {
                if let Some(ifc) = self.ifaces.get_mut(&key.0)
                    && ifc.prog.unpin_tcp_flow(l, r)
                {
                    self.counters.tcp_pins_swept += 1;
                }
            } else {
                suspects.insert(key);
            }
        }
        // A live process's pass goes once the kernel's connection is
        // closed or in TIME-WAIT, as its engine would sweep it: an engine
        // dropped with passes leaves them here (a connection moved to a
        // process and handed over to the kernel there must keep its pass
        // while a listener's pin would take its segments; issue 24).
        let passes: Vec<(u64, SocketAddrV4, SocketAddrV4)> = self
            .clients
            .iter()
            .flat_map(|(&id, c)| {
                c.tcp_flows
                    .iter()
                    .filter(|f| f.2 == proto::TcpFlow::Pass)
                    .map(move |f| (id, f.0, f.1))
            })
            .collect();
        for (id, l, r) in passes {
            if self.kernel_has(l, r).unwrap_or(true) {
                continue;
            }
            let key = (format!("pass {id}"), l, r);
            if !self.pin_suspects.contains(&key) {
                suspects.insert(key);
                continue;
            }
            self.tcp_unflow(id, l, r);
            self.counters.tcp_handed_swept += 1;
        }
        // A dead process's connection handed to the kernel keeps its pass
        // until the kernel has nothing of it, not even TIME-WAIT.
        for (name, l, r) in handed {
            if self.kernel_state(l, r).map_or(true, |s| s.is_some()) {
                continue;
            }
            if let Some(ifc) = self.ifaces.get_mut(&name)
                && ifc.handed.remove(&(l, r)).is_some()
            {
                ifc.prog.unclaim_tcp_flow(l, r);
                self.counters.tcp_handed_swept += 1;
            }
        }
        self.pin_suspects = suspects;
    }

    fn retry_pending(&mut self) {
        let mut left = Vec::new();
        for mut p in std::mem::take(&mut self.pending) {
            let Some(ifc) = self.ifaces.get_mut(&p.iface) else {
                continue;
            };
            let mut done = true;
            let mut got = 0u64;
            for (q, m) in ifc.queues.iter_mut().zip(p.members.iter_mut()) {
                match q.reclaim(p.slot, m) {
                    Some((n, took_over)) => {
                        got += u64::from(n);
                        self.counters.locks_taken_over += u64::from(took_over);
                    }
                    None => done = false,
                }
            }
            self.counters.frames_reclaimed += got;
            if done {
                // The sockets close now (after their rings were read), off
                // this loop.
                close_later(p.members);
            } else {
                self.counters.reclaim_deferred += 1;
                left.push(p);
            }
        }
        self.pending = left;
    }

    fn status(&mut self) -> serde_json::Value {
        let orphans = self.orphans();
        let ifaces: Vec<serde_json::Value> = self
            .ifaces
            .iter()
            .map(|(n, i)| {
                let mut v = self.iface_status(n, i);
                v["tcp_orphans"] = orphans.get(n).cloned().unwrap_or_default().into();
                v
            })
            .collect();
        serde_json::json!({
            "pid": std::process::id(),
            "ifaces": ifaces,
            "counters": self.counters,
        })
    }

    /// Per interface, the dead processes' connections the kernel finishes
    /// (`Iface::handed`): whose, how the service ended each, how long ago,
    /// and the kernel's state of it now (sock_diag: "none" once it is gone,
    /// until the next sweep forgets it).
    fn orphans(&mut self) -> HashMap<String, Vec<serde_json::Value>> {
        let all: Vec<(String, (SocketAddrV4, SocketAddrV4), Orphan)> = self
            .ifaces
            .iter()
            .flat_map(|(n, i)| i.handed.iter().map(|(k, o)| (n.clone(), *k, *o)))
            .collect();
        let mut out: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
        for (name, (l, r), o) in all {
            let state = match self.kernel_state(l, r) {
                Ok(Some(s)) => nanowire_xdp::netlink::tcp_state_name(s),
                Ok(None) => "none",
                Err(_) => "?",
            };
            out.entry(name).or_default().push(serde_json::json!({
                "local": l.to_string(),
                "remote": r.to_string(),
                "pid": o.pid,
                "ended": o.ended,
                "age_ms": o.at.elapsed().as_millis() as u64,
                "kernel_state": state,
            }));
        }
        out
    }

    /// One interface and its attached processes: who (pid, uid, comm), what
    /// they claim, their share of the frames, and their drops as the kernel
    /// counts them on their own sockets.
    fn iface_status(&self, name: &str, i: &Iface) -> serde_json::Value {
        let g = i.queues.first().map(|q| q.geometry());
        let nq = i.queues.len() as u64;
        // One pass over each queue's owner table for every slot at once.
        let held: Vec<Vec<u32>> = i.queues.iter().map(|q| q.held_by_slot()).collect();
        let clients: Vec<serde_json::Value> = i
            .slots
            .iter()
            .enumerate()
            .filter_map(|(s, c)| Some((s, self.clients.get(&(*c)?)?)))
            .map(|(s, c)| {
                let rx_held: u64 = held.iter().map(|h| u64::from(h[s])).sum();
                let waiting: u64 = c.members.iter().map(|m| u64::from(m.rx_waiting())).sum();
                let k = c.members.iter().fold(XskStats::default(), |a, m| add_stats(a, m.stats()));
                serde_json::json!({
                    "pid": c.pid,
                    "uid": c.uid,
                    "comm": comm(c.pid),
                    "slot": s,
                    "claims": c.claims.iter().map(|(p, a, port)| format!(
                        "{}:{}", proto_name(*p), SocketAddrV4::new(*a, *port))).collect::<Vec<_>>(),
                    "tcp_flows": c.tcp_flows.iter().map(|(l, r, w)| serde_json::json!({
                        "local": l.to_string(),
                        "remote": r.to_string(),
                        "to": match w { proto::TcpFlow::Flow => "process", proto::TcpFlow::Pass => "kernel" },
                    })).collect::<Vec<_>>(),
                    "frames": {
                        "rx_held": rx_held,
                        "rx_waiting": waiting,
                        "rx_ring": g.map_or(0, |g| u64::from(g.member_rx()) * nq),
                        "rx_shared": g.map_or(0, |g| u64::from(g.rx_frames) * nq),
                        "tx_own": g.map_or(0, |g| u64::from(g.tx_per_slot) * nq),
                    },
                    "drops": {
                        "xsk_rx_dropped": k.rx_dropped,
                        "xsk_rx_ring_full": k.rx_ring_full,
                        "xsk_rx_invalid_descs": k.rx_invalid_descs,
                        "xsk_tx_invalid_descs": k.tx_invalid_descs,
                    },
                    "counters": c.counters,
                    "engine_drops": c.page.as_ref().and_then(|p| engine_drops(p.as_fd())),
                })
            })
            .collect();
        let fill_empty: u64 = i
            .queues
            .iter()
            .map(|q| q.stats().rx_fill_ring_empty_descs)
            .sum();
        serde_json::json!({
            "iface": name,
            "ifindex": i.index,
            "xdp_mode": i.mode.as_str(),
            // The steering program is the multi-buffer aware one (native
            // mode, or generic after a process saw a multi-buffer packet).
            "xdp_frags": i.prog.frags(),
            "queues": i.queues.len(),
            "rx_frames": g.map(|g| g.rx_frames),
            "tx_per_slot": g.map(|g| g.tx_per_slot),
            "umem_bytes": i.queues.iter().map(|q| q.umem_bytes()).sum::<usize>(),
            // TX metadata on the shared UMEM: members' checksums offloaded.
            "tx_metadata": i.queues.iter().all(|q| q.tx_metadata()),
            // "huge tmpfs" (2 MiB pages where the kernel had them), or why
            // the UMEM is on 4 KiB pages.
            "umem_pages": i.queues.iter().find_map(|q| q.small_pages()).map_or_else(
                || "huge tmpfs".to_string(),
                |w| format!("4 KiB: {w}"),
            ),
            "uid": i.uid,
            "slots": i.slots.len(),
            "xsk_rx_fill_ring_empty": fill_empty,
            "clients": clients,
            // The spinner registry (nanowire_xdp::seats): per CPU the
            // processes whose waits spin there and those asleep there.
            "seats": i.queues.first().map_or_else(Vec::new, |q| q.seats()).iter().map(|c| {
                let who = |s: u32| serde_json::json!({
                    "slot": s,
                    "pid": i.slots.get(s as usize).copied().flatten()
                        .and_then(|c| self.clients.get(&c)).map(|c| c.pid),
                });
                serde_json::json!({
                    "cpu": c.cpu,
                    "spinning": c.spinning.iter().map(|&s| who(s)).collect::<Vec<_>>(),
                    "sleeping": c.sleeping.iter().map(|&s| who(s)).collect::<Vec<_>>(),
                    // Passing the CPU by hint: who watches it, and per slot
                    // its parks and the watchers' hand-offs to it.
                    "watcher": c.watcher,
                    "passes": c.passes.iter().map(|&(s, parks, handoffs)| serde_json::json!({
                        "slot": s, "parks": parks, "handoffs": handoffs,
                    })).collect::<Vec<_>>(),
                })
            }).collect::<Vec<_>>(),
            "tcp_listener_groups": i.groups.iter().map(|((a, p), g)| serde_json::json!({
                "listener": SocketAddrV4::new(Ipv4Addr::from_bits(*a), *p).to_string(),
                "members": g.members.iter().map(|(c, s, acc)| serde_json::json!({
                    "pid": self.clients.get(c).map(|c| c.pid),
                    "slot": s,
                    "accepting": acc,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

/// The `drop_*` counters (and the TCP stacks' `tcp_drop_*`) of a stats
/// page an attached process handed over; `None` when it cannot be read.
fn engine_drops(page: rustix::fd::BorrowedFd<'_>) -> Option<serde_json::Value> {
    let snap = shm::read_fd(page).ok()??;
    let drops: serde_json::Map<String, serde_json::Value> = snap
        .counters
        .into_iter()
        .filter(|(k, _)| shm::is_drop(k))
        .map(|(k, v)| (k, v.into()))
        .collect();
    Some(drops.into())
}

fn proto_name(p: u8) -> &'static str {
    if p == proto::PROTO_UDP { "udp" } else { "tcp" }
}

fn add_stats(a: XskStats, b: XskStats) -> XskStats {
    XskStats {
        rx_dropped: a.rx_dropped + b.rx_dropped,
        rx_invalid_descs: a.rx_invalid_descs + b.rx_invalid_descs,
        tx_invalid_descs: a.tx_invalid_descs + b.tx_invalid_descs,
        rx_ring_full: a.rx_ring_full + b.rx_ring_full,
        ..XskStats::default()
    }
}

/// The command name of process `pid` (`/proc/PID/comm`; what it runs now,
/// after any exec), `?` when it cannot be read.
fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Does the kernel socket `sock` hold `port` for (proto, addr)? A bound
/// UDP socket of that port, bound to `addr`, or to the wildcard when `addr`
/// is one of the interface's addresses; multicast and broadcast groups for
/// a socket bound to the port on the wildcard or the group.
/// `own` lists the interface's addresses (asked only for a socket bound to
/// the wildcard).
pub fn holds_port(
    sock: &OwnedFd,
    p: u8,
    addr: Ipv4Addr,
    port: u16,
    own: impl FnOnce() -> Vec<Ipv4Addr>,
) -> Result<(), String> {
    let not = |why: &str| format!("{addr}:{port} not claimed: {why}");
    let dom = rustix::net::sockopt::socket_domain(sock).map_err(|_| not("not a socket"))?;
    if dom != AddressFamily::INET {
        return Err(not("not an IPv4 socket"));
    }
    let ty = rustix::net::sockopt::socket_type(sock).map_err(|_| not("not a socket"))?;
    let want = if p == proto::PROTO_UDP {
        SocketType::DGRAM
    } else {
        SocketType::STREAM
    };
    if ty != want {
        return Err(not("the socket passed is not of that protocol"));
    }
    let name = rustix::net::getsockname(sock).map_err(|_| not("the socket has no address"))?;
    let bound = SocketAddrV4::try_from(name).map_err(|_| not("not an IPv4 socket"))?;
    if bound.port() != port {
        return Err(not(&format!(
            "the process's socket holds port {}, not {port}",
            bound.port()
        )));
    }
    let ok = *bound.ip() == addr
        || (bound.ip().is_unspecified()
            && (addr.is_multicast() || addr.is_broadcast() || own().contains(&addr)));
    if !ok {
        return Err(not(&format!("the process's socket is bound to {bound}")));
    }
    Ok(())
}

/// SO_BINDTOIFINDEX (Linux 5.0+; the generic value, x86 and arm).
const SO_BINDTOIFINDEX: libc::c_int = 62;

/// A client port's socket (`CLAIM_CLIENT_PORT`) holds `addr`:`port` alone,
/// as the kernel proves it: a TCP socket bound to that very address (not
/// the wildcard) and port, neither listening nor connected, with neither
/// SO_REUSEADDR nor SO_REUSEPORT (its bind then failed if any socket, a
/// connection or a TIME-WAIT held the port, and no later bind can share
/// it) and no device binding (sockets bound to different devices do not
/// conflict).
pub fn holds_port_alone(sock: &OwnedFd, addr: Ipv4Addr, port: u16) -> Result<(), String> {
    use rustix::net::sockopt;
    let not = |why: &str| format!("{addr}:{port} not claimed as a client port: {why}");
    holds_port(sock, proto::PROTO_TCP, addr, port, Vec::new)?;
    let name = rustix::net::getsockname(sock).map_err(|_| not("the socket has no address"))?;
    if SocketAddrV4::try_from(name).map_or(true, |b| *b.ip() != addr) {
        return Err(not("the socket is not bound to that address itself"));
    }
    if sockopt::socket_reuseaddr(sock).map_err(|e| not(&e.to_string()))?
        || sockopt::socket_reuseport(sock).map_err(|e| not(&e.to_string()))?
    {
        return Err(not(
            "the socket may share its port (SO_REUSEADDR/SO_REUSEPORT)",
        ));
    }
    if sockopt::socket_acceptconn(sock).map_err(|e| not(&e.to_string()))? {
        return Err(not("the socket is listening"));
    }
    if rustix::net::getpeername(sock).is_ok_and(|p| p.is_some()) {
        return Err(not("the socket is connected"));
    }
    let mut dev: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into an int and its length, on a descriptor we hold.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(sock),
            libc::SOL_SOCKET,
            SO_BINDTOIFINDEX,
            (&raw mut dev).cast(),
            &mut len,
        )
    };
    if r != 0 || dev != 0 {
        return Err(not("the socket is bound to a device"));
    }
    Ok(())
}

/// Whether `id` holds the claim `key` (proto, address, port) already
/// (true: nothing to do) or nobody does (false); another process's claim is
/// the refusal.
fn held_by(
    claims: &HashMap<(u8, u32, u16), u64>,
    key: (u8, u32, u16),
    id: u64,
) -> Result<bool, String> {
    match claims.get(&key) {
        Some(&o) if o == id => Ok(true),
        Some(_) => Err(format!(
            "{}:{} is claimed by another process on the engine service",
            Ipv4Addr::from_bits(key.1),
            key.2
        )),
        None => Ok(false),
    }
}

/// Client `id` (in `slot`) lets go of its claim (p, addr, port): a UDP
/// port's goes; a TCP listener's group loses the member (its connections'
/// pins go: their segments reach the kernel, which resets them, as the
/// service ends them) and the claim goes with the last member.
fn release_claim(ifc: &mut Iface, id: u64, slot: u32, p: u8, addr: Ipv4Addr, port: u16) {
    let key = (p, addr.to_bits(), port);
    if p != proto::PROTO_TCP {
        if ifc.claims.get(&key) == Some(&id) {
            ifc.claims.remove(&key);
            unclaim_in(&mut ifc.prog, p, addr, port);
        }
        return;
    }
    let gk = (addr.to_bits(), port);
    let Some(g) = ifc.groups.get_mut(&gk) else {
        // A client port (`CLAIM_CLIENT_PORT`): one owner, no group.
        if ifc.claims.get(&key) == Some(&id) {
            ifc.claims.remove(&key);
            unclaim_in(&mut ifc.prog, p, addr, port);
        }
        return;
    };
    let Some(i) = g.members.iter().position(|m| m.0 == id) else {
        return;
    };
    g.members.remove(i);
    let local = SocketAddrV4::new(addr, port);
    let value = nanowire_xdp::program::SLOT | slot;
    let _ = write_group(&mut ifc.prog, g);
    if ifc.claims.get(&key) == Some(&id) {
        // No member left: nobody's (kept while the kernel has the
        // socket: `Service::prune_groups`).
        ifc.claims
            .insert(key, g.members.first().map_or(NOBODY, |m| m.0));
    }
    ifc.prog.unpin_tcp(|l, v| l == local && v == value);
}

/// The client id a listener claim without members has (no client's).
const NOBODY: u64 = 0;

/// A listener group's end: its claim, steering and pins go.
fn end_group(ifc: &mut Iface, gk: (u32, u16)) {
    let Some(g) = ifc.groups.remove(&gk) else {
        return;
    };
    let addr = Ipv4Addr::from_bits(gk.0);
    let local = SocketAddrV4::new(addr, gk.1);
    ifc.claims.remove(&(proto::PROTO_TCP, gk.0, gk.1));
    unclaim_in(&mut ifc.prog, proto::PROTO_TCP, addr, gk.1);
    let _ = ifc.prog.set_tcp_group(g.gid, &[]);
    ifc.prog.unpin_tcp(|l, _| l == local);
}

/// Write a group's accepting slots to the program.
fn write_group(prog: &mut SteerProgram, g: &Group) -> Result<(), String> {
    let accepting: Vec<u32> = g.members.iter().filter(|m| m.2).map(|m| m.1).collect();
    prog.set_tcp_group(g.gid, &accepting)
}

/// A TCP claim of `local` by client `id`: its own (a client port's, a
/// listener's), or as a member of the listener group there.
fn under_listener(ifc: &Iface, id: u64, local: SocketAddrV4) -> bool {
    ifc.claims
        .get(&(proto::PROTO_TCP, local.ip().to_bits(), local.port()))
        == Some(&id)
        || ifc
            .groups
            .get(&(local.ip().to_bits(), local.port()))
            .is_some_and(|g| g.members.iter().any(|m| m.0 == id))
}

/// Client `id` (`c`) holds the flow claim of the 4-tuple `t` (a connect's,
/// or a connection moved to it).
fn owns_flow(c: Option<&Client>, ifc: &Iface, id: u64, t: (SocketAddrV4, SocketAddrV4)) -> bool {
    c.is_some_and(|c| c.tcp_flows.contains(&(t.0, t.1, proto::TcpFlow::Flow)))
        && ifc.tcp_flows.get(&t) == Some(&id)
}

/// [`socket_inode`] of an IPv4 TCP socket (anything else is refused).
fn tcp_socket_inode(sock: &OwnedFd) -> Result<(u64, u64), String> {
    let tcp = rustix::net::sockopt::socket_domain(sock).ok() == Some(AddressFamily::INET)
        && rustix::net::sockopt::socket_type(sock).ok() == Some(SocketType::STREAM);
    if !tcp {
        return Err("the descriptor passed is no IPv4 TCP socket".into());
    }
    socket_inode(sock)
}

/// (st_dev, st_ino) of a socket: what tells a listening socket and its
/// copies across fork (one open file) from any other socket.
fn socket_inode(sock: &OwnedFd) -> Result<(u64, u64), String> {
    let st = rustix::fs::fstat(sock).map_err(|e| format!("fstat of the socket passed: {e}"))?;
    Ok((st.st_dev, st.st_ino))
}

/// Release a claim of `p` (a UDP port, or a TCP listener's).
fn unclaim_in(prog: &mut SteerProgram, p: u8, addr: Ipv4Addr, port: u16) {
    if p == proto::PROTO_TCP {
        prog.unclaim_tcp_listener(addr, port);
    } else {
        prog.unclaim(addr, port);
    }
}

/// `nanowire engine serve`: serve this network namespace until unused.
pub fn serve(idle: Duration, log: bool, policy: Option<&str>) -> Result<i32, String> {
    if !rustix::process::geteuid().is_root() {
        return Err("the engine service runs as root".into());
    }
    // A bad file refuses the service (one line) rather than run without
    // the operator's restrictions.
    let policy = match policy {
        Some(p) => Policy::load(p, true)?,
        None => Policy::load(super::policy::DEFAULT_PATH, false)?,
    };
    match Service::bind(idle, log, policy)? {
        None => {
            if log {
                eprintln!("nanowire engine service: already running in this network namespace");
            }
            Ok(0)
        }
        Some(mut s) => {
            s.log(&format!("serving (pid {})", std::process::id()));
            s.run();
            Ok(0)
        }
    }
}

/// A service started on demand by an application (client.rs) inherits the
/// application's descriptors that lack close-on-exec: its sockets among
/// them would stay open in the service after the application exits (the
/// port held, the next run refused). The service keeps only stdin, stdout
/// and stderr.
pub fn close_inherited() {
    close_inherited_above(2);
}

/// Close every descriptor above `keep` (a process given fds 3..=keep
/// keeps them).
pub fn close_inherited_above(keep: i32) {
    let first = keep.max(2) as u32 + 1;
    // SAFETY: closes descriptors above `keep` of this process, none of
    // which it has opened yet (the caller runs it first).
    if unsafe { libc::close_range(first, u32::MAX, 0) } == 0 {
        return;
    }
    // No close_range (Linux < 5.9): every descriptor /proc lists.
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|&fd: &i32| fd >= first as i32)
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        // SAFETY: as above (the read_dir's own descriptor is closed already,
        // a failed close of it is harmless).
        unsafe { libc::close(fd) };
    }
}
