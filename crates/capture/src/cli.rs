//! `nanowire capture -i IFACE -w FILE [-c N] [-t SECS] [--port P] [--addr A]
//! [--pid PID] [--xdp [--ring N]]`: the arguments checked, then one of the
//! two capture modes ([`crate::merged`], [`crate::dedicated`]).

use crate::filter::Filter;
pub use crate::session::CaptureArgs;
use crate::session::ctrlc_stop;
use nanowire_xdp::AttachMode;

/// `xdp_mode`: the attach mode `--xdp` forces (the program's setting,
/// `NANOWIRE_XDP_MODE` as the binary read it; `None`: per driver).
pub fn run(a: CaptureArgs, xdp_mode: Option<AttachMode>) -> Result<i32, String> {
    if let Some(t) = a.time
        && !(t.is_finite() && t > 0.0)
    {
        return Err(format!(
            "--time must be a positive number of seconds, got {t}"
        ));
    }
    let filter = Filter {
        port: a.port,
        addr: a.addr,
    };
    ctrlc_stop();
    if a.xdp {
        return crate::dedicated::run(&a, filter, xdp_mode);
    }
    crate::merged::run(&a, filter)
}
