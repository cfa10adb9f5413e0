#!/usr/bin/env bash
# Write ROOT/DEBIAN/control for a staged nanowire install (used by `make deb`).
# Version from the binary itself; Depends from the glibc symbol versions the
# ELF files need (what dpkg-shlibdeps would find for libc6) plus the tools
# nanowire runs: iproute2 (ip, lab), ethtool (lab, doctor), procps (sysctl).
set -euo pipefail
root=${1:?usage: deb-control.sh ROOT}
bin="$root/usr/bin/nanowire"
shim="$root/usr/lib/nanowire/libnanowire_preload.so"
version=$("$bin" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
# Highest GLIBC_x.y symbol version referenced by either file.
glibc=$(objdump -T "$bin" "$shim" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CTRL
Package: nanowire
Version: $version
Architecture: $arch
Maintainer: nanowire developers <nanowire@example.invalid>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1, iproute2, ethtool, procps
Recommends: bpftool, sockperf, iperf3, openssh-client
Section: net
Priority: optional
Homepage: https://example.invalid/nanowire
Description: kernel-bypass low-latency UDP/TCP for Linux over AF_XDP
 nanowire accelerates unmodified programs (nanowire run, an LD_PRELOAD shim
 in /usr/lib/nanowire), measures them against the kernel (nanowire bench,
 nanowire lab report, also across two hosts over ssh) and explains what a
 NIC and host setup will do to acceleration (nanowire doctor).
CTRL
cat "$root/DEBIAN/control"
