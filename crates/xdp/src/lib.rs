//! nanowire-xdp
