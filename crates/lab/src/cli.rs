//! `nanowire lab ...`

use crate::testbed::{Direction, Host, Impairment, Lab, LabOptions, WireStatus};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct LabArgs {
    /// Prefix for the lab's namespaces and interfaces (several labs can run side by side).
    #[arg(long, default_value = crate::testbed::DEFAULT_NAME, global = true)]
    pub name: String,
    #[command(subcommand)]
    pub cmd: LabCmd,
}

#[derive(Debug, Subcommand)]
pub enum LabCmd {
    /// Build the two-host testbed (idempotent; repairs a half-built lab).
    Up {
        /// RX/TX queues per veth end.
        #[arg(long, default_value_t = 1)]
        queues: u32,
        /// Put an impaired wire (a third namespace forwarding frames with
        /// nftables) between hosts a and b; `lab impair` then sets loss,
        /// duplication and rate. Without it, `up` removes a wire.
        #[arg(long)]
        impair: bool,
    },
    /// Set what the wire of a lab made with `up --impair` does to frames.
    Impair {
        /// Percentage of frames dropped at random.
        #[arg(long, default_value_t = 0.0)]
        loss: f64,
        /// Percentage of frames duplicated.
        #[arg(long, default_value_t = 0.0)]
        dup: f64,
        /// Drop frames above this rate (megabit/s; a policer, not a queue).
        #[arg(long)]
        rate: Option<f64>,
        /// Which way: both, ab (a to b) or ba.
        #[arg(long, default_value = "both")]
        dir: Direction,
        /// Remove every impairment (the wire forwards everything).
        #[arg(long, conflicts_with_all = ["loss", "dup", "rate"])]
        clear: bool,
    },
    /// Remove everything `up` made.
    Down,
    /// Show the testbed (JSON with --json).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Run the seed suite on every engine and write DIR/index.html + DIR/results.json.
    Report(crate::report::ReportArgs),
    /// Run ARGV for as long as this ssh session's stdin is open (host b of `report --remote`).
    #[command(hide = true)]
    Hostexec {
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Run a command inside host a or b: `nanowire lab exec a -- ping 198.18.0.2`.
    Exec {
        host: Host,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
}

pub fn run(args: LabArgs) -> Result<i32, String> {
    let mk = |queues| {
        Lab::new(LabOptions {
            name: args.name.clone(),
            queues,
        })
    };
    match args.cmd {
        LabCmd::Up { queues, impair } => {
            let lab = mk(queues)?.impaired(impair);
            let st = lab.up()?;
            for h in [st.a.as_ref(), st.b.as_ref()].into_iter().flatten() {
                println!(
                    "{:<8} {:<10} {}/24  mac {}  driver {}",
                    h.netns,
                    h.iface,
                    h.addr,
                    h.mac.as_deref().unwrap_or("?"),
                    h.driver.as_deref().unwrap_or("?")
                );
            }
            if let Some(w) = &st.wire {
                print_wire(w);
            }
            println!("lab {} is up", lab.name());
            Ok(0)
        }
        LabCmd::Impair {
            loss,
            dup,
            rate,
            dir,
            clear,
        } => {
            let lab = mk(1)?;
            let imp = if clear {
                Impairment::default()
            } else {
                Impairment {
                    loss_pct: loss,
                    dup_pct: dup,
                    rate_mbit: rate,
                }
            };
            let w = lab.impair(if clear { Direction::Both } else { dir }, imp)?;
            print_wire(&w);
            Ok(0)
        }
        LabCmd::Down => {
            let lab = mk(1)?;
            lab.down()?;
            println!("lab {} is down", lab.name());
            Ok(0)
        }
        LabCmd::Status { json } => {
            let lab = mk(1)?;
            let st = lab.status();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&st).map_err(|e| e.to_string())?
                );
            } else {
                println!(
                    "lab {}: {}",
                    st.name,
                    if st.complete {
                        "up"
                    } else {
                        "down or incomplete"
                    }
                );
                for h in [st.a.as_ref(), st.b.as_ref()].into_iter().flatten() {
                    println!(
                        "  {} {} {} up={} xdp={}",
                        h.netns,
                        h.iface,
                        h.addr,
                        h.up,
                        h.xdp.as_deref().unwrap_or("none")
                    );
                    for (k, v) in &h.offloads {
                        println!("    {k}: {v}");
                    }
                }
                match &st.wire {
                    Some(w) => print_wire(w),
                    None => println!("  wire: direct veth pair (no impairment possible)"),
                }
            }
            Ok(if st.complete { 0 } else { 1 })
        }
        LabCmd::Report(a) => crate::report::run(a, &args.name),
        LabCmd::Hostexec { argv } => crate::report::remote::hostexec(&argv),
        LabCmd::Exec { host, argv } => {
            let lab = mk(1)?;
            if !lab.status().complete {
                return Err(format!(
                    "lab {} is not up: run `nanowire lab up --name {}`",
                    lab.name(),
                    lab.name()
                ));
            }
            let st = lab
                .command(host, &argv)
                .status()
                .map_err(|e| format!("cannot run {:?}: {e}", argv[0]))?;
            Ok(st.code().unwrap_or(1))
        }
    }
}

fn print_wire(w: &WireStatus) {
    println!(
        "  wire {} ({} <-> {}) up={} forwarding={}",
        w.netns, w.iface_a, w.iface_b, w.up, w.forwarding
    );
    for (d, x) in [("a->b", &w.ab), ("b->a", &w.ba)] {
        println!(
            "    {d}: {}  (frames in {}, dropped by loss {}, by rate {}, duplicated {})",
            x.impairment, x.frames_in, x.dropped_loss, x.dropped_rate, x.duplicated
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lab: LabArgs,
    }

    #[test]
    fn impair_takes_a_direction_by_name_and_refuses_others() {
        for (arg, want) in [
            ("both", Direction::Both),
            ("ab", Direction::Ab),
            ("ba", Direction::Ba),
        ] {
            let cli = Cli::try_parse_from(["lab", "impair", "--loss", "1", "--dir", arg]).unwrap();
            let LabCmd::Impair { dir, .. } = cli.lab.cmd else {
                panic!("not impair");
            };
            assert_eq!(dir, want);
        }
        let cli = Cli::try_parse_from(["lab", "impair", "--loss", "1"]).unwrap();
        assert!(matches!(
            cli.lab.cmd,
            LabCmd::Impair {
                dir: Direction::Both,
                ..
            }
        ));
        assert!(Cli::try_parse_from(["lab", "impair", "--dir", "up"]).is_err());
    }
}
