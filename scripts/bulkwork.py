#!/usr/bin/env python3
"""Per-segment work of bulk TCP (iperf3 -P 4) with one end under `nanowire run`, without a PMU.

The bulk counterpart of scripts/msgwork.py (which is for ping-pong). One end (or both) of an
iperf3 -P 4 transfer of a fixed byte count runs under `nanowire run --engine xdp` in a lab of its
own (the default lab: TSO/GSO on, one queue), the other end is a plain iperf3 (or under run too). What does not depend on load:

* callgrind: user-space instructions of the end under run, per 1,448-byte segment of payload
  (bytes / 1448), in total, without libc's memcpy, and by function (exclusive, inlined code
  charged to the function it was inlined into). Note: valgrind counts every iteration of a `rep
  movsb` as one instruction, so a large memcpy (glibc uses `rep movsb` above ~2 KiB) counts ~1 Ir
  per byte, a small one a few per 32 bytes: compare memcpy counts only between runs of the same
  shape, and read the rest apart from it;
* strace: system calls per segment (sendto = TX kicks, ppoll/poll = waits and mixed readiness);
* counters (always, no valgrind): the engine's counters sampled while it runs (`nanowire stats
  --json`, the last sample before the end): TX frames, RX frames, TCP segments in/out, TX ring
  full, and from them segments per kick (with strace) and the peer's ACKs per data segment.

    scripts/bulkwork.py --end client                   # client under run (sender), callgrind
    scripts/bulkwork.py --end server --tool strace     # receiver under run, syscalls
    scripts/bulkwork.py --end client --tool none       # counters only (no valgrind, fast)
    scripts/bulkwork.py --end both                     # both under run, the receiver counted
    scripts/bulkwork.py --end server --tool none --capture   # + the receiver's ACK delay

* capture (`--capture`): `nanowire capture` of the client's veth (host a, kernel packet taps:
  a data frame is stamped as the sender hands it to the veth, an ACK as it arrives from the
  receiver; snaplen 128), and from it per connection: ACKs per MB, bytes per ACK, and each
  advancing ACK's delay after the NEWEST data it covers (how long the receiver sat on what it
  had: the ring wait + the turn) and after the OLDEST data it newly covers (the round trip the
  sender's RTT estimate and congestion control see), p50/p90/p99 in µs. With `--end both` or
  `client` the client's engine is tapped instead (its RX stamp is when the engine takes a frame
  off its ring, later than the arrival).

Prints one JSON object (and a short table on stderr).
"""
import argparse, bisect, collections, json, os, re, signal, statistics, struct, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worklib import largest_profile, ns, perf_counts, read_pcapng, strace_counts, wrap  # noqa: E402

NW = os.path.abspath(os.environ.get("NANOWIRE", "target/release/nanowire"))
A, B = "198.18.0.1", "198.18.0.2"
PORT = 5209
SEG = 1448


def sample_stats(stop, last, lab):
    """Keep the `nanowire stats --json` sample whose engines in this lab moved the most (the last
    sample may catch the engines gone or a fresh one)."""
    def moved(doc):
        return sum(engine_counters(doc, lab, h).get("tcp_segs_in", 0) for h in "ab")
    while not stop.is_set():
        p = subprocess.run([NW, "stats", "--json"], capture_output=True, text=True)
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            doc = None
        if doc and (last[0] is None or moved(doc) >= moved(last[0])):
            last[0] = doc
        stop.wait(0.25)


def engine_counters(doc, lab, host):
    """Sum the counters of the engines on this lab's interface of `host` (a: client, b: server;
    other helpers' engines run on other interfaces)."""
    tot = collections.Counter()
    for e in doc.get("engines", []) if isinstance(doc, dict) else []:
        if e.get("iface") != f"{lab}-{host}0":
            continue
        for k, v in (e.get("counters") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                tot[k] += v
    return tot


def run_once(args, lab, out):
    env = dict(os.environ, NANOWIRE_LOG="error")
    run = [NW, "run", "--engine", "xdp", "--"]
    # As compare.py --scenario issue21-iperf: the server on CPU 1, the client on CPU 0.
    pin = (lambda c: ["taskset", "-c", str(c)]) if args.pin else (lambda c: [])
    srv = pin(1) + ["iperf3", "-s", "-1", "-B", B, "-p", str(PORT)]
    cli = pin(0) + ["iperf3", "-c", B, "-p", str(PORT), "-P", "4", "-n", args.bytes, "-J"]
    if args.end in ("server", "both"):
        srv = run + srv
    if args.end in ("client", "both"):
        cli = run + cli
    # The profiled end's output is "run"; with perf the other end is counted too ("peer"): the
    # kernel's work runs in whichever end's context the softirq found (a kick, a write).
    for end in ("server", "client"):
        if args.profile == end or args.tool == "perf":
            w = wrap(args.tool, out, "run" if args.profile == end else "peer")
            if end == "server":
                srv = w + srv
            else:
                cli = w + cli
    s = subprocess.Popen(ns(lab, "b") + srv, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    cap = None
    if args.capture:
        # The client's veth: kernel taps see a plain client's frames as it sends them and the
        # receiver's ACKs as they arrive; an engine client's own tap is used with --end client/both.
        # tcpdump (a TPACKET ring cut to the snaplen): `nanowire capture`'s kernel tap takes one
        # frame per recvmsg into a socket buffer that 64 KiB super-frames fill at once (it lost
        # nearly all of them here). With the client under run its engine's tap is read instead.
        if args.end == "server":
            cmd = ["tcpdump", "-i", f"{lab}-a0", "-s", "128", "-B", "65536", "--time-stamp-precision=nano",
                   "-w", os.path.join(out, "a.pcap"), "tcp", "port", str(PORT)]
        else:
            cmd = [NW, "capture", "-i", f"{lab}-a0", "--snaplen", "128", "--port", str(PORT),
                   "-w", os.path.join(out, "a.pcapng")]
        cap = subprocess.Popen(ns(lab, "a") + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(args.settle)
    if s.poll() is not None:
        raise SystemExit("server exited: " + s.stderr.read()[-2000:])
    stop, last = threading.Event(), [None]
    t = threading.Thread(target=sample_stats, args=(stop, last, lab), daemon=True)
    t.start()
    try:
        c = subprocess.run(ns(lab, "a") + cli, env=env, capture_output=True, text=True, timeout=900)
    finally:
        stop.set()
        t.join()
        try:
            s.wait(60)
        except subprocess.TimeoutExpired:
            s.kill()
            s.wait()
        if cap is not None:
            cap.send_signal(signal.SIGINT)
            err = cap.communicate(timeout=60)[1]
            print("capture: " + err.strip()[-500:], file=sys.stderr)
    if c.returncode != 0:
        raise SystemExit("client failed: " + (c.stdout + c.stderr)[-2000:])
    end = json.loads(c.stdout[c.stdout.index("{"):])["end"]
    # Wall-clock rate: printed on stderr as a hint only (a loaded machine's rate is no result).
    cpu = end.get("cpu_utilization_percent", {})
    print(f"(hint only, wall clock) {end['sum_received']['bits_per_second'] / 1e9:.2f} Gbit/s, CPU % client "
          f"{cpu.get('host_total', 0):.0f} server {cpu.get('remote_total', 0):.0f}", file=sys.stderr)
    return end["sum_received"]["bytes"], end["sum_sent"].get("retransmits", 0), last[0]


def tcp_of(frame):
    """(src port, dst port, seq, ack, payload length, flags) of an Ethernet/IPv4/TCP frame."""
    if len(frame) < 54 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
        return None
    ihl = (frame[14] & 15) * 4
    tot = struct.unpack_from(">H", frame, 16)[0]
    t = 14 + ihl
    sp, dp, seq, ack, off = struct.unpack_from(">HHIIB", frame, t)
    return sp, dp, seq, ack, tot - ihl - (off >> 4) * 4, frame[t + 13]


def read_pcap(path):
    """[(ts_ns, frame)] of a little-endian pcap (tcpdump --time-stamp-precision=nano: ns stamps)."""
    data = open(path, "rb").read()
    magic = struct.unpack_from("<I", data, 0)[0]
    scale = 1 if magic == 0xA1B23C4D else 1000
    off, out = 24, []
    while off + 16 <= len(data):
        sec, frac, cap, _orig = struct.unpack_from("<IIII", data, off)
        out.append(((sec * 1_000_000_000 + frac * scale), data[off + 16: off + 16 + cap]))
        off += 16 + cap
    return out


def ack_delays(out):
    """The receiver's ACKs against the data they cover, per connection (see --capture)."""
    pcap = os.path.join(out, "a.pcap")
    frames = (read_pcap(pcap) if os.path.exists(pcap)
              else [(ts, fr) for _n, ts, _c, fr in read_pcapng(os.path.join(out, "a.pcapng"))])
    flows = collections.defaultdict(lambda: {"data": [], "acks": []})
    for ts, frame in frames:
        h = tcp_of(frame)
        if h is None:
            continue
        sp, dp, seq, ack, plen, flags = h
        if dp == PORT and plen > 0:
            flows[sp]["data"].append((ts, seq, seq + plen))
        elif sp == PORT and flags & 0x10 and not flags & 0x07:
            flows[dp]["acks"].append((ts, ack, plen))
    newest, oldest = [], []
    acks = advancing = acked = data_frames = 0
    for f in flows.values():
        if not f["data"]:
            continue
        base = f["data"][0][1]
        rel = lambda x: (x - base) & 0xFFFFFFFF  # noqa: E731
        ts_of, ends, top = [], [], 0
        for ts, _s, e in sorted(f["data"]):
            if rel(e) > top:  # a retransmission covers nothing new
                ts_of.append(ts)
                ends.append(rel(e))
                top = rel(e)
        data_frames += len(ends)
        last = 0
        for ts, a, _plen in sorted(f["acks"]):
            acks += 1
            a = rel(a)
            if a <= last or a > top + 1:
                continue
            j = bisect.bisect_right(ends, a) - 1  # newest data segment the ACK covers
            i = bisect.bisect_right(ends, last)  # oldest data segment it newly covers
            if 0 <= i <= j and ts_of[j] <= ts:
                advancing += 1
                acked += a - last
                newest.append(ts - ts_of[j])
                oldest.append(ts - ts_of[i])
            last = a
    q = lambda xs, p: round(xs[min(len(xs) - 1, int(p * len(xs)))] / 1000, 1) if xs else None  # noqa: E731
    newest.sort()
    oldest.sort()
    return {
        "connections": len(flows), "data_frames": data_frames, "acks": acks, "advancing_acks": advancing,
        "acks_per_mb": round(acks * 1e6 / acked, 2) if acked else None,
        "bytes_per_ack": round(acked / advancing) if advancing else None,
        "delay_newest_us": {f"p{int(p * 100)}": q(newest, p) for p in (0.5, 0.9, 0.99)},
        "delay_oldest_us": {f"p{int(p * 100)}": q(oldest, p) for p in (0.5, 0.9, 0.99)},
        "delay_newest_mean_us": round(statistics.fmean(newest) / 1000, 1) if newest else None,
    }


def callgrind(out):
    best = largest_profile(out, "run")
    text = subprocess.run(["callgrind_annotate", "--threshold=100", best[1]],
                          capture_output=True, text=True).stdout
    funcs = collections.Counter()
    body = text.split("file:function", 1)[-1]
    for line in body.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+\S+?:(.*?)(?: \[.*\])?$", line)
        if m:
            funcs[m.group(2).strip()] += int(m.group(1).replace(",", ""))
    return best[0], funcs


def strace(out):
    return strace_counts(os.path.join(out, "run.strace"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--end", choices=["client", "server", "both"], required=True,
                    help="which end runs under `nanowire run` (client = the sender)")
    ap.add_argument("--profile", choices=["client", "server"], default=None,
                    help="the end whose work is counted (default: the end under run; "
                         "with --end both, the server)")
    ap.add_argument("--tool", choices=["callgrind", "strace", "perf", "none"], default="callgrind")
    ap.add_argument("--capture", action="store_true", help="the receiver's ACK delay (see above)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="leave both ends unpinned (default: server on CPU 1, client on CPU 0, as compare.py)")
    ap.add_argument("--bytes", default="200M", help="iperf3 -n (total over the 4 streams)")
    ap.add_argument("--top", type=int, default=25, help="functions listed (callgrind)")
    ap.add_argument("--settle", type=float, default=None, help="seconds for the server to start")
    args = ap.parse_args()
    if args.profile is None:
        args.profile = "client" if args.end == "client" else "server"
    if args.settle is None:
        args.settle = 8.0 if (args.tool == "callgrind" and args.profile == "server") else 1.5
    lab = f"bw{os.getpid()}"
    subprocess.run([NW, "lab", "up", "--name", lab], check=True, stdout=subprocess.DEVNULL)
    out = tempfile.mkdtemp(prefix="bulkwork.")
    try:
        nbytes, retrans, stats = run_once(args, lab, out)
    finally:
        subprocess.run([NW, "lab", "down", "--name", lab], stdout=subprocess.DEVNULL)
    segs = nbytes / SEG
    res = {"end": args.end, "profiled": args.profile, "tool": args.tool, "bytes": nbytes, "segments_1448": round(segs),
           "retransmits": retrans, "dir": out, "per_segment": {}}
    keep = ["tx_packets", "rx_frames", "rx_packets", "rx_bytes", "tx_bytes", "tcp_segs_out", "tcp_segs_in",
            "drop_tx_ring_full", "xsk_tx_ring_empty", "rx_multi_buffer", "rx_csum_partial",
            "tx_csum_offload", "tcp_retransmits", "tcp_rx_direct_bytes", "tcp_rx_held_bytes",
            "tcp_rx_hold_declined", "tcp_rx_hold_limited", "peak_tcp_rx_held_frames", "xsk_rx_fill_ring_empty", "xsk_rx_dropped",
            "xsk_rx_ring_full", "drop_socket_queue_full", "tcp_out_of_order", "tcp_drop_out_of_window",
            "tcp_beyond_window_bytes", "tcp_paws_rejected", "tcp_ooo_dropped"]
    res["counters"] = {}
    for side, host in (("client", "a"), ("server", "b")):
        c = engine_counters(stats, lab, host) if stats else {}
        if c:
            c = {k: c[k] for k in keep if k in c}
            # The data sender's segments against the receiver's (ACKs) on one engine.
            if c.get("tcp_segs_out") and c.get("tcp_segs_in"):
                c["segs_in_per_seg_out"] = round(c["tcp_segs_in"] / c["tcp_segs_out"], 3)
            # A receiver's: bytes per received packet (a super-frame's size) and ACKs sent per
            # 64 KiB received (the kernel's GRO receiver sends about one per super-frame).
            if c.get("rx_packets") and c.get("rx_bytes", 0) >= 65536:
                c["rx_bytes_per_packet"] = round(c["rx_bytes"] / c["rx_packets"])
                c["segs_out_per_64k_in"] = round(c.get("tcp_segs_out", 0) * 65536 / c["rx_bytes"], 3)
                # Bytes that went straight into the reader's buffer (one user-space copy,
                # not two: the frame into the receive ring, the ring into the buffer).
                c["rx_direct_share"] = round(c.get("tcp_rx_direct_bytes", 0) / c["rx_bytes"], 3)
                # Bytes kept in their frames until read (one copy, frame to buffer); the rest
                # (1 - direct - held) was copied into the receive ring first (two copies).
                c["rx_held_share"] = round(c.get("tcp_rx_held_bytes", 0) / c["rx_bytes"], 3)
                c["user_copies_per_byte"] = round(2 - c["rx_direct_share"] - c["rx_held_share"], 3)
            res["counters"][side] = c
    per = res["per_segment"]
    if args.tool == "callgrind":
        time.sleep(2)
        total, funcs = callgrind(out)
        mc = sum(v for k, v in funcs.items() if k.startswith("__mem"))
        per["ir"] = round(total / segs, 1)
        per["ir_without_memcpy"] = round((total - mc) / segs, 1)
        per["functions"] = {k: round(v / segs, 1) for k, v in funcs.most_common(args.top)}
    elif args.tool == "perf":
        # Kernel events of the profiled end (all threads) and of the other end: work, not time.
        per["events"] = {k: round(v / segs, 4) for k, v in perf_counts(os.path.join(out, "run.perf")).items()}
        per["peer_events"] = {k: round(v / segs, 4) for k, v in perf_counts(os.path.join(out, "peer.perf")).items()}
    elif args.tool == "strace":
        calls = strace(out)
        per["syscalls"] = {k: round(v / segs, 4) for k, v in sorted(calls.items(), key=lambda kv: -kv[1])[:12]}
        if calls.get("sendto"):
            # The counters are a sample taken during the run: the whole transfer's segments.
            res["segments_per_sendto"] = round(segs / calls["sendto"], 1)
    if args.capture:
        res["ack_delay"] = ack_delays(out)
        for f in ("a.pcap", "a.pcapng"):  # tens of MB per run: the disk is shared
            if os.path.exists(os.path.join(out, f)):
                os.unlink(os.path.join(out, f))
    if not os.listdir(out):  # nothing kept (--tool none)
        os.rmdir(out)
        res["dir"] = None
    print(json.dumps(res, indent=1))
    print(f"{args.end} under run ({args.profile} counted), {nbytes} B = {segs:.0f} segments of {SEG} B", file=sys.stderr)
    for k, v in per.items():
        if isinstance(v, dict):
            for f, x in v.items():
                print(f"  {x:>10}  {f[:110]}", file=sys.stderr)
        else:
            print(f"{k}: {v}", file=sys.stderr)


if __name__ == "__main__":
    main()
