//! `nanowire engine`: the engine service (crates/stack/src/xdp/service/).

use clap::{Args, Subcommand};
use nanowire_stack::xdp::service::{client, server};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct EngineArgs {
    #[command(subcommand)]
    pub cmd: EngineCmd,
}

#[derive(Debug, Subcommand)]
pub enum EngineCmd {
    /// Serve this network namespace's engine (root; processes attach with
    /// NANOWIRE_SERVICE=1). Exits when no process has been attached for
    /// --idle-ms.
    Serve {
        /// Detach: start the service in the background and return at once.
        #[arg(long)]
        daemon: bool,
        /// Exit after this long without an attached process.
        #[arg(long, default_value_t = 3000)]
        idle_ms: u64,
        /// Log attaches, detaches and refusals on stderr.
        #[arg(long)]
        verbose: bool,
        /// The policy file (who may be accelerated where, who trusts whom;
        /// root's, not group/world-writable, no symbolic link). Default:
        /// /etc/nanowire/engine.policy if it exists, else every user on every
        /// interface, no user sharing a UMEM with another.
        #[arg(long)]
        policy: Option<String>,
    },
    /// Print the service's status (JSON): interfaces, attached processes,
    /// their claims, counters.
    Status,
    /// The warden of a process on an engine of its own (started by the
    /// engine with its first TCP stack, not by hand): ends the process's
    /// TCP connections with FIN or RST when it dies (kill -9).
    #[command(hide = true)]
    Warden {
        /// The process.
        #[arg(long)]
        pid: u32,
        /// Its pidfd (a descriptor this process inherited).
        #[arg(long)]
        pidfd: i32,
        /// Its connection table (a descriptor this process inherited).
        #[arg(long)]
        table_fd: i32,
        /// The warden's end of a socket pair with the process (its exec
        /// asks for the link's release there).
        #[arg(long, requires = "link_fd")]
        ctl_fd: Option<i32>,
        /// The engine's XDP link, held until the connections are ended.
        #[arg(long, requires = "ctl_fd")]
        link_fd: Option<i32>,
    },
}

pub fn run(a: EngineArgs) -> Result<i32, String> {
    match a.cmd {
        EngineCmd::Serve {
            daemon,
            idle_ms,
            verbose,
            policy,
        } => {
            server::close_inherited();
            if daemon {
                let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
                let mut cmd = std::process::Command::new(exe);
                cmd.args(["engine", "serve", "--idle-ms", &idle_ms.to_string()]);
                if verbose {
                    cmd.arg("--verbose");
                }
                if let Some(p) = &policy {
                    // Checked here too: a bad file is the operator's error
                    // at once, not a service that never comes up.
                    nanowire_stack::xdp::service::policy::Policy::load(p, true)?;
                    cmd.args(["--policy", p]);
                }
                use std::os::unix::process::CommandExt;
                cmd.env_remove("LD_PRELOAD")
                    .process_group(0)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null());
                if !verbose {
                    cmd.stderr(std::process::Stdio::null());
                }
                cmd.spawn()
                    .map_err(|e| format!("cannot start the engine service: {e}"))?;
                // Return once it answers, so a client may connect at once.
                let t0 = std::time::Instant::now();
                while t0.elapsed() < Duration::from_secs(3) {
                    if client::Conn::connect_existing().is_ok() {
                        return Ok(0);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                return Err("the engine service did not come up within 3 s".into());
            }
            server::serve(Duration::from_millis(idle_ms), verbose, policy.as_deref())
        }
        EngineCmd::Warden {
            pid,
            pidfd,
            table_fd,
            ctl_fd,
            link_fd,
        } => {
            let held = ctl_fd.zip(link_fd);
            let top = held.map_or(-1, |(c, l)| c.max(l));
            server::close_inherited_above(pidfd.max(table_fd).max(top));
            nanowire_stack::xdp::service::warden::run(pid, pidfd, table_fd, held)
                .map_err(|e| format!("warden of process {pid}: {e}"))
        }
        EngineCmd::Status => {
            let c = client::Conn::connect_existing()?;
            println!("{}", c.status()?);
            Ok(0)
        }
    }
}
