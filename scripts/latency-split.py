#!/usr/bin/env python3
"""Where the time of an xdp ping-pong goes, from the engines' own stamps (issue 13, item 4).

Runs `nanowire bench pp --engine xdp` (64 B) against `nanowire bench server --engine xdp` in the lab
with `nanowire capture` tapping both engines (host a and host b), then matches every datagram's
frames by their UDP payload (sockperf header: sequence number) and splits each round trip:

  a_tx -> b_rx   client engine posts the frame on its TX ring ... server engine takes it off its RX
                 ring: the TX kick syscall, veth_xmit, (generic) XDP, the copy into the UMEM, and
                 the wait until the spinning server engine looks at its ring ("wire -> ring")
  b_rx -> b_tx   server engine takes the request off its ring ... posts the reply: demux, the
                 application's receive, its work, its send ("ring -> application -> ring")
  b_tx -> a_rx   the same as a_tx -> b_rx, the other way
  a_rx (client)  ... the client's `recv` returns ("ring -> application", client): from pp's own
                 receive stamps (`--rx-stamps`: the engine's stamp when it takes the reply off its RX
                 ring, the same point as the tap's a_rx, to a CLOCK_REALTIME read right after the
                 receive call returned: demux, the receive call, one clock read).
  The unstamped remainder of pp's RTT/2 is then the client's send path up to its TX post and
  pp's own clock reads.

All stamps are CLOCK_REALTIME reads of one machine (same clock, no offset between the hosts: they
are network namespaces). The tap adds one clock read and one frame copy at each stamp point (the
cost measured by scripts/bench-capture.py), so the segments describe a run slowed by that much.

    flock /tmp/nanowire-bench.lock scripts/latency-split.py --seconds 3
"""
import argparse, json, os, signal, statistics, struct, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
from worklib import read_pcapng  # noqa: E402

NW = compare.NW


def udp_payload(frame):
    if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return None
    ihl = (frame[14] & 15) * 4
    return frame[14 + ihl + 8:]


def parse_pp(text):
    """compare.nanowire_parse, plus the client's ring -> application stamps (`--rx-stamps`)."""
    out = compare.nanowire_parse(text)
    d = json.loads(text[text.index("{"):])
    out["ring_to_app_us"] = d.get("ring_to_app_us")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--lab", default="nwcapsplit")
    a = ap.parse_args()
    lab = a.lab
    subprocess.run([NW, "lab", "up", "--name", lab], check=True, stdout=subprocess.DEVNULL)
    priv = tempfile.mkdtemp(prefix="nwcap-split-")  # mode 0700, fresh: never a fixed name in /tmp
    files = {h: os.path.join(priv, f"{h}.pcapng") for h in "ab"}
    try:
        srv = compare.Server(lab, compare.nw_server("xdp"))
        caps = []
        try:
            # The client's engine opens with the client: tap it as soon as it appears (200 ms scan).
            for h in "ab":
                caps.append(subprocess.Popen(["ip", "netns", "exec", f"{lab}-{h}", NW, "capture", "-i", f"{lab}-{h}0",
                                              "-w", files[h], "--port", str(compare.PORT)],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            time.sleep(1.0)
            pp = compare.run_client(lab, compare.nw_pp("xdp", a.seconds, 64,
                                                      ["--no-fallback", "--warmup-ms", "1000", "--rx-stamps"]),
                                    parse_pp, timeout=a.seconds + 60)
        finally:
            errs = []
            for c in caps:
                c.send_signal(signal.SIGINT)
                errs.append(c.communicate(timeout=30)[1])
            srv.stop()
        sides = {h: read_pcapng(files[h]) for h in "ab"}
    finally:
        for f in files.values():
            if os.path.exists(f):
                os.unlink(f)
        os.rmdir(priv)
        subprocess.run([NW, "lab", "down", "--name", lab], stdout=subprocess.DEVNULL)
    # A request and its reply carry the same sockperf sequence number (payload bytes 0..8).
    stamps = {}
    for h, pkts in sides.items():
        for _name, ts, comment, frame in pkts:
            if "xdp engine" not in comment:
                continue
            pl = udp_payload(frame)
            if pl is None or len(pl) < 8:
                continue
            d = "tx" if comment.startswith("out") else "rx"
            stamps.setdefault(bytes(pl[:8]), {})[f"{h}_{d}"] = ts
    full = [s for s in stamps.values() if len(s) == 4 and s["a_tx"] <= s["b_rx"] <= s["b_tx"] <= s["a_rx"]]
    req = rep = full
    turn = [s["b_tx"] - s["b_rx"] for s in full]
    med = lambda xs: round(statistics.median(xs) / 1000, 3) if xs else None  # noqa: E731
    out = {
        "pp_one_way_us": {"p50": pp["p50"], "p99": pp["p99"]},
        "pp_samples": pp.get("samples"),
        "client_ring_to_app_us": pp.get("ring_to_app_us"),
        "frames": {h: len(p) for h, p in sides.items()},
        "exchanges_with_all_four_stamps": len(full),
        "segments_p50_us": {
            "a_tx->b_rx (wire->ring)": med([s["b_rx"] - s["a_tx"] for s in req]),
            "b_rx->b_tx (ring->app->ring, server)": med(turn),
            "b_tx->a_rx (wire->ring)": med([s["a_rx"] - s["b_tx"] for s in rep]),
        },
        "capture_stderr": [e.strip().splitlines()[-1] if e.strip() else "" for e in errs],
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }
    seg = out["segments_p50_us"]
    if all(v is not None for v in seg.values()):
        rtt_half_stamped = (seg["a_tx->b_rx (wire->ring)"] + seg["b_rx->b_tx (ring->app->ring, server)"]
                            + seg["b_tx->a_rx (wire->ring)"]) / 2
        out["stamped_half_round_trip_us"] = round(rtt_half_stamped, 3)
        out["unstamped_remainder_us"] = round(pp["p50"] - rtt_half_stamped, 3)
        r2a = (pp.get("ring_to_app_us") or {}).get("p50")
        if r2a is not None:
            # RTT = a_tx->b_rx + b_rx->b_tx + b_tx->a_rx + ring->app (client) + the client's send
            # path up to its TX post (unstamped) + pp's clock reads.
            out["client_ring_to_app_p50_us"] = r2a
            out["client_send_path_and_clock_reads_p50_us"] = round(2 * pp["p50"] - 2 * rtt_half_stamped - r2a, 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
