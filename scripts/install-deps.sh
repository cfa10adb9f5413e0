#!/usr/bin/env bash
# Install what nanowire needs on a Debian 12 machine (as root). Idempotent and
# fast when everything is already there: it only calls apt-get for what is missing.
set -euo pipefail

need=()
want() { command -v "$1" >/dev/null 2>&1 || need+=("$2"); }
want clang clang
want llc llvm
want ip iproute2
want ethtool ethtool
want sockperf sockperf
want iperf3 iperf3
want socat socat
want tcpdump tcpdump
want tshark tshark
want bpftool bpftool
want ping iputils-ping
want nft nftables
want python3 python3
# the drop-in matrix (issue 9): a real UDP server answered by a real client
want dnsmasq dnsmasq-base
want dig bind9-dnsutils
# real runtimes of the drop-in matrix
want java openjdk-17-jdk-headless
want node nodejs
want make make
# make deb (strip, objdump) and the two-host report test (ssh client, sshd in host b)
want objdump binutils
want dpkg-deb dpkg
want ssh openssh-client
want cc gcc
# the real-program TCP matrix (crates/nanowire/tests/apps_tcp_matrix.rs, issue 21)
want nginx nginx
want redis-server redis-server
want redis-cli redis-tools
want memcached memcached
want wrk wrk
want ab apache2-utils
want curl curl
# counting syscalls of a process under run (tcp_churn: engine start and per-connection work)
want strace strace
# The runtimes of the event-loop echo programs (scripts/apps, issue 10). Debian 12's nodejs is 18;
# the benchmarks in docs/benchmarks.md ran Node.js 20 (same dgram API).
want node nodejs
want javac openjdk-17-jdk-headless
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
[ -d /usr/include/x86_64-linux-gnu/asm ] || need+=(linux-libc-dev)
if [ "${NANOWIRE_WITH_BROWSER:-0}" = 1 ]; then
  want chromium chromium
  # Only for the tests (`make test` sets this): host b of the two-host report test runs its
  # own sshd inside the lab's namespace. Debian starts ssh.service on install; the tests never use it.
  want sshd openssh-server
fi

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing ${need[*]}; run as root (or install them) first" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # tshark's package asks whether non-root users may capture: answer no, without a prompt.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo (Rust 1.95) is required; install the Rust toolchain with rustup" >&2
  exit 1
fi
if command -v rustup >/dev/null 2>&1; then
  for c in clippy rustfmt; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
fi
