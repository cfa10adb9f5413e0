#!/usr/bin/env python3
"""Run latency comparisons in the nanowire lab and print one JSON object.

Each scenario names configurations (a server command in host b, a client command in host a).
Configurations are run back to back, interleaved, `--repeats` times; each reports p50/p99/...
(one-way µs). The JSON has every run, the medians per configuration, the ratios of each
configuration's median to the scenario's baseline, and the environment.

    scripts/compare.py --scenario issue2-interop --repeats 3 --seconds 5

Scenario `apps` (issue 10) is different: it runs the echo programs of scripts/apps (Node.js dgram,
JVM NIO, Python asyncio, multi-threaded C) plainly and under `nanowire run`, both ends, 1 and 8
datagrams in flight, interleaved, and reports the client's elapsed ms and the ratio run/plain:

    scripts/compare.py --scenario apps --repeats 3 --count 5000

Issue 8 (engine core) compares two nanowire binaries, the baseline one ($NANOWIRE_BASE,
e.g. /work/baseline/nanowire) and this tree's ($NANOWIRE), alternately in one run:

    NANOWIRE_BASE=/work/baseline/nanowire scripts/compare.py --scenario issue8-core
    NANOWIRE_BASE=/work/baseline/nanowire scripts/compare.py --scenario issue8-burst --repeats 3

Issue 11: tick-to-trade (`bench exchange` in b, `bench strategy` in a on spin and on xdp,
interleaved, without and with a 100k msg/s background feed; ratio xdp/spin of the medians), and
the TCP message rate of `bench tp --tcp --mps max` per engine (ratio to spin):

    scripts/compare.py --scenario tick-to-trade --repeats 3 --seconds 5
    scripts/compare.py --scenario tcp-msg-rate --repeats 3 --seconds 3 --size 64
    scripts/compare.py --scenario issue21-iperf --repeats 5 --seconds 10   # iperf3 -P 4: plain / server / client / both under run

issue21-iperf also runs the transmit floor beside iperf3 (crates/xdp/examples/xsk_floor.rs `blast`/`sink`):
one copy-mode AF_XDP socket sending 1,514-byte frames, 64 per kick, into an XDP drop, a kernel UDP reader
and an AF_XDP receiver in b; Gbit/s of TCP payload against plain iperf3 -P 4 (NANOWIRE_NO_TXFLOOR=1: skip).

Wave 3: sockperf UDP and TCP under `nanowire run`, this tree's shim against an older one
(e.g. the session's starting point), interleaved, with spinning kernel TCP as the TCP yardstick:

    NANOWIRE_OLD_PRELOAD=/work/baseline/libnanowire_preload.so scripts/compare.py --scenario wave3-regress

Each row with an "(old shim)" twin also gets `run_to_old` in the JSON (and a line on stderr): the
ratio of the medians of p50 (new/old), its bootstrap 95% interval over the interleaved repeats
(the repeats resampled with replacement, both rows' p50s of a repeat kept together, 10,000
resamples, seeded: the same runs give the same interval) and the per-repeat ratios, with a verdict:
"no measurable change" when the interval holds 1.0, "slower"/"faster" (measurable) when it
excludes it, and whether its top is within 1.05x (issues 20/24's acceptance; `within_1_05`).

The floor of the machine: a minimal AF_XDP UDP ping-pong (crates/xdp/examples/xsk_floor.rs, built
on demand) against `nanowire bench` xdp↔xdp, sockperf under `nanowire run` and plain sockperf, 64 B,
interleaved; ratios to the floor (what is the engine's own cost) and floor/plain (the best any
AF_XDP engine could do against plain sockperf here):

    scripts/compare.py --scenario floor --repeats 5 --seconds 3

Connection churn (issue 21 item 2): a plain nginx in b; in a, `ab -n N -c 1` and `-c 20` (one
connection per request) and a Python connect()+close() loop (p50/p99 µs of connect), each plainly
and under `nanowire run` (default profile), interleaved; then the reverse shape, a plain `ab -c 1`
against an nginx under run (started for each of its runs, on another port) next to the same
against the plain nginx; ratios run/plain. The client-side tests also run with the client on
the engine service of host a (`NANOWIRE_SERVICE=1`, the service started before and stopped after
each such run, outside the client's timing): ratios service/plain (the engine start becomes an
attach: no program load, no UMEM to zero):

    scripts/compare.py --scenario churn --repeats 5 --requests 1000

(ab's time includes the engine's start under run, about 0.1 s here: use at least 1000 requests.)
The nginx 4-workers rows (issue 24) run `--nginx4-requests` requests (default 10000: 1000 take under
0.1 s at ~13,000/s), each after `--nginx4-warmup` requests to the same nginx (default 200; the one
under run is started for its run), plain and run in alternating order from repeat to repeat; the
JSON has each repeat's ratio run/plain (`ratio_per_repeat`: each, median, min, max, how many >= 1,
and `ci95`, the bootstrap 95% interval of the ratio of medians: above 1.0 says >= plain beyond noise).
`--rows nginx4` runs only those rows (e.g. `--rows nginx4 --repeats 9` for the issue 24 row alone).

The engine service (issue 23): sockperf sr under `nanowire run` in b, one process on an engine of
its own (today's), one on the engine service, and 4 on the service at once (`NANOWIRE_SERVICE=1`,
the operator's `nanowire engine serve --daemon`, stopped after each run), each with its own plain
sockperf pp in a, all clients at once; interleaved; p50 of each process (median and worst of the
4) against one process's, and memory: PSS (/proc/PID/smaps_rollup) of the servers, the service
included, 4 on the service against one on its own engine. Servers on CPU 1, clients on CPU 0
(--no-pin: unpinned); the servers' profile is --profiles (default balanced: 4 spinning servers on
one CPU would measure the scheduler). What the machine can do with that placement: the same with
plain kernel servers (one, and 4 at once), and the 4 on the service pinged one at a time (every
server up, one busy); `worst_to_one` has each worst / one, and one on the service / own engine, with
its bootstrap 95% interval over the paired repeats (`--rows floor`: only those rows and one and 4 on
the service):

    scripts/compare.py --scenario service --repeats 5 --seconds 5

Its raw AF_XDP floor (session 22), interleaved with those rows: xsk_floor (crates/xdp/examples) one pair
and 4 pairs at once, each pair on a veth pair of its own (this run's lab and LABx1..x3, made and removed
by the scenario), echoes on CPU 1 and pingers on CPU 0, for each way to wait (spin, yield: a sched_yield
at each empty look, sleep: poll(2)); and xsk_floor's echo against the service rows' own clients (plain
sockperf pp), yielding, sleeping, or one process spinning over all four sockets (echo-all: no switch
between servers, the best a server side can do on one CPU). Per row also the servers' CPU, run-queue
wait and context switches per message (/proc/PID/task/*/schedstat, status), the service's rows
included; ratios four / one per wait, p50 (worst) and mean (`--rows xskfloor`: only the xsk_floor rows).

The placement of the two vCPUs (session 18): on this VM the host runs CPU 0 and CPU 1 either on
cores that share an L3 ("near": a cache line crosses in ~50 ns) or not ("far": ~245 ns), and moves
them every few seconds; every ping-pong p50 follows it (the floor 1.47 near / ~2.0 far, sockperf
under run ~1.87 / ~2.5, kernel TCP spinning ~4.3 / ~6.5), whatever the code. The ping-pong scenarios
(the floor, wave3-regress, shims, issue*) measure it before each run's server starts and after it
stops (scripts/machine-probes/c2c.c, 60 ms) and record it per run (`placement`); the JSON has the
medians per placement and run_to_old per placement (`same_placement`). `--placement near` runs
every repeat of every row only in the near placement (each run waits up to `--placement-wait`
seconds for it, 120 by default, the scenario up to `--placement-budget` in all, 1800, and is run again,
up to 3 times, when the placement after it differs): like with like. `--probe` adds per repeat the kernel's event counts of each side and per CPU
(scripts/modeprobe.py; its tracepoints add ~0.5 µs one-way, so its p50s are not comparable to a
run without it):

    NANOWIRE_OLD_PRELOAD=/work/baseline/libnanowire_preload.so scripts/compare.py --scenario wave3-regress --placement near
    scripts/compare.py --scenario floor --repeats 6 --seconds 2 --probe
"""
import argparse, json, os, platform, re, resource, shlex, shutil, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modeprobe  # noqa: E402

NW = os.path.abspath(os.environ.get("NANOWIRE", "target/release/nanowire"))
BASE = os.path.abspath(os.environ.get("NANOWIRE_BASE", "/work/baseline/nanowire"))
A, B = "198.18.0.1", "198.18.0.2"
PORT = 11111


def ns(lab, host):
    return f"{lab}-{host}"


def scan(text, table, out):
    """For each (pattern, keys, convert) of `table` that `text` matches:
    out[key] = convert(group) for its keys and groups in order."""
    for pattern, keys, convert in table:
        m = re.search(pattern, text)
        if m:
            for k, g in zip(keys, m.groups()):
                out[k] = convert(g)


# What sockperf_parse takes besides percentiles and MAX/MIN.
SOCKPERF_FIELDS = [
    (r"Summary: Latency is ([\d.]+) usec", ["avg"], float),
    (r"\[Valid Duration\] RunTime=[\d.]+ sec; SentMessages=(\d+); ReceivedMessages=(\d+)",
     ["sent", "received"], int),
    (r"\[Total Run\] RunTime=([\d.]+) sec; Warm up time=\d+ msec; SentMessages=(\d+)",
     ["run_s", "sent_total"], float),
]


def sockperf_parse(text):
    vals = {}
    for line in text.splitlines():
        m = re.search(r"---> percentile\s+([\d.]+)\s*=\s*([\d.]+)", line)
        if m:
            vals["p" + m.group(1).rstrip("0").rstrip(".")] = float(m.group(2))
        m = re.search(r"---> <(MAX|MIN)> observation\s*=\s*([\d.]+)", line)
        if m:
            vals[m.group(1).lower()] = float(m.group(2))
        scan(line, SOCKPERF_FIELDS, vals)
    if "p50" not in vals:
        raise RuntimeError("could not parse sockperf output:\n" + text[-2000:])
    return vals


def nanowire_parse(text):
    d = json.loads(text[text.index("{"):])
    lat = d["latency_us"]
    out = {k: lat[k] for k in lat}
    out.update(sent=d.get("sent"), received=d.get("received"), dropped=d.get("dropped"))
    return out


def run_client(lab, argv, parser, timeout):
    cmd = ["ip", "netns", "exec", ns(lab, "a")] + argv
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"client failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-2000:]}")
    return parser(p.stdout)


class Server:
    def __init__(self, lab, argv):
        self.argv = argv
        self.p = subprocess.Popen(["ip", "netns", "exec", ns(lab, "b")] + argv,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        if self.p.poll() is not None:
            raise RuntimeError(f"server exited: {' '.join(argv)}\n{self.p.stderr.read()[-2000:]}")

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def sp_sr(extra=()):
    return ["taskset", "-c", "1", "sockperf", "sr", "-i", B, "-p", str(PORT), *extra]


def sp_pp(secs, size, extra=()):
    return ["taskset", "-c", "0", "sockperf", "pp", "-i", B, "-p", str(PORT), "-m", str(size), "-t", str(secs), *extra]


def nw_server(engine, extra=(), nw=None):
    return [nw or NW, "bench", "server", "-i", B, "-p", str(PORT), "--engine", engine, "--cpu", "1", *extra]


def nw_pp(engine, secs, size, extra=(), nw=None):
    return [nw or NW, "bench", "pp", "-i", B, "-p", str(PORT), "-m", str(size), "-t", str(secs),
            "--engine", engine, "--cpu", "0", "--json", *extra]


def nw_run(engine, argv, profile="latency"):
    return [NW, "run", "--profile", profile, "--engine", engine, "--"] + argv


def old_shim(argv):
    """`argv` (a `nanowire run` command) with the shim of NANOWIRE_OLD_PRELOAD. Without the
    launcher's prestart: a shim older than it does not adopt the prepared program, whose link
    would then keep its own engine off the interface (EBUSY: it fell back to spin)."""
    return ["env", f"NANOWIRE_PRELOAD={os.environ['NANOWIRE_OLD_PRELOAD']}", "NANOWIRE_PRESTART=0"] + argv


OLD_SHIM = " (old shim)"
BOOT_RESAMPLES, BOOT_SEED, NO_CHANGE = 10000, 17, 1.05


def bootstrap_ratio(new, old, resamples=BOOT_RESAMPLES, seed=BOOT_SEED):
    """Bootstrap 95% interval (percentile method) of median(new) / median(old) over paired
    repeats: repeat i gave new[i] and old[i] back to back (interleaved), so a resample draws
    repeat indices with replacement and keeps each repeat's two values together (the machine's
    drift between repeats moves both). Pure Python, seeded: the same runs give the same interval."""
    import random
    n = len(new)
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        stats.append(statistics.median(new[i] for i in idx) / statistics.median(old[i] for i in idx))
    stats.sort()
    return stats[int(0.025 * resamples)], stats[min(resamples - 1, int(0.975 * resamples))]


def paired_ratio(new, old, of, key="p50"):
    """median(new) / median(old) of paired repeats (new[i] and old[i] ran back to back), its
    bootstrap 95% interval, the per-repeat ratios, and what they say (`of`: what is divided)."""
    pairs = [(n, o) for n, o in zip(new, old) if n is not None and o]
    if not pairs:
        return None
    new, old = [p[0] for p in pairs], [p[1] for p in pairs]
    ratio = statistics.median(new) / statistics.median(old)
    lo, hi = bootstrap_ratio(new, old)
    verdict = "slower (measurable)" if lo > 1.0 else "faster (measurable)" if hi < 1.0 else \
        "no measurable change"
    verdict += f"; within {NO_CHANGE}x" if hi <= NO_CHANGE else \
        f"; the interval reaches past {NO_CHANGE}x"
    if len(pairs) < 5:
        # n repeats have at most C(2n-1, n) distinct resamples (3 for 2 repeats).
        verdict += f" (only {len(pairs)} repeats: the interval understates the spread)"
    return {"of": of, "key": key, "ratio": round(ratio, 3), "ci95": [round(lo, 3), round(hi, 3)],
            "per_repeat": [round(a / b, 3) for a, b in pairs], "repeats": len(pairs),
            "within_1_05": hi <= NO_CHANGE, "verdict": verdict,
            "bootstrap": {"resamples": BOOT_RESAMPLES, "seed": BOOT_SEED,
                          "method": "percentile, repeats resampled in pairs"}}


def run_to_old(runs, key="p50"):
    """For each row with an "(old shim)" twin: new/old of the medians of `key`, its bootstrap 95%
    interval over the repeats, the per-repeat ratios, and what they say."""
    out = {}
    for old_label in runs:
        if not old_label.endswith(OLD_SHIM) or old_label[:-len(OLD_SHIM)] not in runs:
            continue
        label = old_label[:-len(OLD_SHIM)]
        r = paired_ratio([n.get(key) for n in runs[label]], [o.get(key) for o in runs[old_label]],
                         f"{label} / {old_label}", key)
        if r:
            # The same over only the repeats in which both rows ran in one placement of the vCPUs
            # (near or far, held through each run): like against like.
            r["same_placement"] = {}
            for m in ("near", "far"):
                both = [(n.get(key), o.get(key)) for n, o in zip(runs[label], runs[old_label])
                        if n.get("placement", {}).get("mode") == m == o.get("placement", {}).get("mode")]
                x = paired_ratio([b[0] for b in both], [b[1] for b in both], f"{label} / {old_label}, {m}", key)
                if x:
                    r["same_placement"][m] = {"ratio": x["ratio"], "ci95": x["ci95"], "repeats": x["repeats"]}
            out[label] = r
    return out


def paired_to_baseline(runs, base, placement="any", key="p50"):
    """{label: paired_ratio(row, baseline)} for every other row, over the repeats in which both ran
    in `placement` (near/far; any: every repeat); a failed run (no key) leaves its repeat out."""
    def of(x):
        ok = placement == "any" or x.get("placement", {}).get("mode") == placement
        return x.get(key) if ok else None
    b = [of(x) for x in runs[base]]
    out = {}
    for label, rs in runs.items():
        if label != base:
            r = paired_ratio([of(x) for x in rs], b, f"{label} / {base} ({placement})", key)
            if r:
                out[label] = r
    return out


def print_run_to_old(r):
    for v in r.values():
        print(f"# {v['of']}: {v['key']} {v['ratio']:.3f}x, 95% CI {v['ci95'][0]:.3f}-{v['ci95'][1]:.3f} "
              f"over {v['repeats']} repeats (per repeat {' '.join(f'{x:.3f}' for x in v['per_repeat'])}): "
              f"{v['verdict']}", file=sys.stderr)
        for m, x in v.get("same_placement", {}).items():
            print(f"#   {m} placement only: {x['ratio']:.3f}x, 95% CI {x['ci95'][0]:.3f}-{x['ci95'][1]:.3f} "
                  f"over {x['repeats']} repeats", file=sys.stderr)


def one_run(a, srv, cli, parser):
    """One ping-pong run: the server in host b, the client in host a (with the probe if asked)."""
    s = Server(a.lab, srv)
    try:
        if a.probe:
            with tempfile.TemporaryDirectory(prefix="nw-probe-") as tmp:
                res, probe = modeprobe.probed_client(a.lab, cli, parser, a.seconds + 60, s.p.pid, a.seconds, tmp)
                res["probe"] = probe
                return res
        return run_client(a.lab, cli, parser, timeout=a.seconds + 60)
    finally:
        s.stop()


def placed_run(a, srv, cli, parser):
    """One ping-pong run with the host's placement of the two vCPUs measured before the server
    starts and after it stops (modeprobe.placement: "near", one L3, or "far"; it selects the mode of
    the p50, docs/benchmarks.md "Session 18: the bimodal UDP p50"). With `--placement near|far`
    the run waits (up to --placement-wait s) until the placement is that one and is run again (up
    to 3 times) when the placement after it is not; the JSON says what was measured either way."""
    want = None if a.placement == "any" else a.placement
    spent = getattr(a, "placement_spent", 0.0)
    if want and spent >= a.placement_budget:
        want = None  # the scenario's budget for waiting is gone: run at once, record the placement
    limit = min(a.placement_wait, a.placement_budget - spent)
    t0, tries = time.monotonic(), 0
    while True:
        before, before_ns = modeprobe.placement()
        # No measurement (c2c cannot be built, or no undisturbed batch in 5 tries): no wait.
        while want and before is not None and before != want and time.monotonic() - t0 < limit:
            time.sleep(0.5)
            before, before_ns = modeprobe.placement()
        waited = time.monotonic() - t0
        for attempt in range(3):
            try:
                res = one_run(a, srv, cli, parser)
                break
            except RuntimeError as e:
                # Under load a server under `nanowire run` may not be up after its 1 s: the
                # client then gets nothing ("No messages were received"). Again, twice.
                if attempt == 2:
                    raise
                print(f"# run failed, again: {str(e).splitlines()[0]}", file=sys.stderr)
        after, after_ns = modeprobe.placement()
        tries += 1
        if not want or (before == after == want) or tries >= 3 or time.monotonic() - t0 >= limit:
            break
        print(f"# placement {before} -> {after} during the run (wanted {want}): again", file=sys.stderr)
    a.placement_spent = spent + waited
    if a.placement != "any" and spent < a.placement_budget <= a.placement_spent:
        print(f"# --placement-budget ({a.placement_budget:.0f} s) spent: the runs from here on do not wait",
              file=sys.stderr)
    mode = before if before == after else "mixed" if before and after else None
    res["placement"] = {"mode": mode, "before": before, "after": after,
                        "before_ns": round(before_ns) if before_ns else None,
                        "after_ns": round(after_ns) if after_ns else None,
                        "wanted": want, "waited_s": round(waited, 1), "tries": tries}
    return res


def by_placement(runs, key="p50"):
    """{label: {placement: {median of key, repeats}}} over the runs whose placement held; with both
    placements, also far - near and what it counts: a far placement adds (c2c far - c2c near, the
    medians over every run of the scenario) to each cache line a message waits for from the other
    CPU, so (far - near) / that is the number of such lines, one after the other, per one-way."""
    c2c = {}
    for rs in runs.values():
        for x in rs:
            pl = x.get("placement", {})
            if pl.get("mode") in ("near", "far"):
                c2c.setdefault(pl["mode"], []).extend(v for v in (pl.get("before_ns"), pl.get("after_ns")) if v)
    out = {}
    for label, rs in runs.items():
        modes = {}
        for x in rs:
            m = x.get("placement", {}).get("mode")
            if m in ("near", "far") and x.get(key) is not None:
                modes.setdefault(m, []).append(x[key])
        out[label] = {m: {key: round(statistics.median(v), 3), "repeats": len(v)} for m, v in modes.items()}
        if len(modes) == 2 and c2c.get("near") and c2c.get("far"):
            d = statistics.median(modes["far"]) - statistics.median(modes["near"])
            line = statistics.median(c2c["far"]) - statistics.median(c2c["near"])
            out[label]["far_minus_near"] = round(d, 3)
            out[label]["cross_cpu_lines_per_oneway"] = round(d * 1000 / line, 2) if line > 0 else None
    return out


def shim_envs():
    """NANOWIRE_SHIMS="label=PATH[+VAR=VALUE...],...": (label, the `env` prefix of its rows). An
    empty PATH is this tree's shim; VAR=VALUE are added to the rows' environment (e.g.
    `depth4k=+NANOWIRE_RING_DEPTH=4096`, or an old shim's `+NANOWIRE_PRESTART=0`)."""
    out = []
    for kv in os.environ.get("NANOWIRE_SHIMS", "").split(","):
        if kv:
            lab, spec = kv.split("=", 1)
            path, *extra = spec.split("+")
            out.append((lab, ["env"] + ([f"NANOWIRE_PRELOAD={path}"] if path else []) + extra))
    return out


def scenarios(secs, size):
    """name -> (baseline label, [(label, server argv, client argv, parser)])"""
    sp, nw = sockperf_parse, nanowire_parse
    return {
        # Issue 2: our kernel client vs sockperf's against the same sockperf sr.
        "issue2-interop": ("sockperf pp", [
            ("sockperf pp", sp_sr(), sp_pp(secs, size), sp),
            ("nanowire pp kernel", sp_sr(), nw_pp("kernel", secs, size), nw),
        ]),
        # Issue 2: spin vs kernel, both ends the same engine.
        "issue2-spin": ("kernel", [
            ("kernel", nw_server("kernel"), nw_pp("kernel", secs, size), nw),
            ("spin", nw_server("spin"), nw_pp("spin", secs, size), nw),
        ]),
        # Issue 3: xdp vs spin, both ends the same engine.
        "issue3-xdp": ("spin", [
            ("spin", nw_server("spin"), nw_pp("spin", secs, size), nw),
            ("xdp", nw_server("xdp"), nw_pp("xdp", secs, size, ["--no-fallback"]), nw),
        ]),
        # Issue 4: unmodified sockperf, plain vs under nanowire run.
        # Issue 11: TCP on the xdp engine vs spinning kernel TCP, both ends the same
        # engine; the xdp UDP row is the issue's second yardstick (TCP <= 1.3x UDP).
        "issue11-tcp": ("spin tcp", [
            ("spin tcp", nw_server("spin", ["--tcp"]), nw_pp("spin", secs, size, ["--tcp"]), nw),
            ("xdp tcp", nw_server("xdp", ["--tcp", "--no-fallback"]),
             nw_pp("xdp", secs, size, ["--tcp", "--no-fallback"]), nw),
            ("xdp udp", nw_server("xdp", ["--no-fallback"]), nw_pp("xdp", secs, size, ["--no-fallback"]), nw),
        ]),
        # Issue 11 item 4: unmodified sockperf TCP, both ends under `nanowire run`: the xdp
        # engine vs the spin engine (spinning kernel TCP), and sockperf UDP under run (xdp)
        # as the second yardstick (acceptance: xdp TCP p50 <= 0.6x spin TCP, <= 1.3x xdp UDP).
        "issue11-shim": ("run spin tcp", [
            ("run spin tcp", nw_run("spin", sp_sr(["--tcp"])), nw_run("spin", sp_pp(secs, size, ["--tcp"])), sp),
            ("run xdp tcp", nw_run("xdp", sp_sr(["--tcp"])), nw_run("xdp", sp_pp(secs, size, ["--tcp"])), sp),
            ("run xdp udp", nw_run("xdp", sp_sr()), nw_run("xdp", sp_pp(secs, size)), sp),
        ] + ([
            # NANOWIRE_OLD_PRELOAD=PATH: xdp TCP with another build of the shim too (before/after).
            ("run xdp tcp (old shim)", old_shim(nw_run("xdp", sp_sr(["--tcp"]))),
             old_shim(nw_run("xdp", sp_pp(secs, size, ["--tcp"]))), sp),
        ] if os.environ.get("NANOWIRE_OLD_PRELOAD") else [])),
        # Issue 11 item 4: iperf3 TCP throughput and CPU, both ends under `nanowire run` with
        # each engine (see iperf_main).
        "issue11-iperf": ("kernel", [("kernel", None, None, None), ("spin", None, None, None),
                                     ("xdp", None, None, None)]),
        # Issue 21: iperf3 -P 4 against a kernel peer in the default lab (TSO/GSO on):
        # plain, only the server under run, both ends under run (see iperf_p4_main).
        "issue21-iperf": ("plain", [("plain", None, None, None), ("server run", None, None, None),
                                    ("client run", None, None, None), ("both run", None, None, None)]),
        "issue4-udp": ("plain", [
            ("plain", sp_sr(), sp_pp(secs, size), sp),
            ("run spin", nw_run("spin", sp_sr()), nw_run("spin", sp_pp(secs, size)), sp),
            ("run xdp", nw_run("xdp", sp_sr()), nw_run("xdp", sp_pp(secs, size)), sp),
        ]),
        # Issue 8: the engine core rewrite against the baseline binary, xdp on both ends.
        "issue8-core": ("before", [
            ("before", nw_server("xdp", nw=BASE), nw_pp("xdp", secs, size, ["--no-fallback"], nw=BASE), nw),
            ("after", nw_server("xdp"), nw_pp("xdp", secs, size, ["--no-fallback"]), nw),
        ]),
        # Issue 8: stalled-receiver burst (see burst_trial), before and after.
        "issue8-burst": ("before", [("before", BASE, None, None), ("after", NW, None, None)]),
        # Wave 3 (issues 20-22): sockperf under `nanowire run` both ends, this tree's shim against
        # the shim of NANOWIRE_OLD_PRELOAD (the session's starting point), UDP and TCP, with
        # spinning kernel TCP as issue 11's yardstick. Acceptance: new/old p50 ~1.0 (UDP and
        # TCP), run xdp tcp <= 0.6x run spin tcp.
        "wave3-regress": ("run xdp udp (old shim)", [
            ("run xdp udp (old shim)", old_shim(nw_run("xdp", sp_sr())), old_shim(nw_run("xdp", sp_pp(secs, size))), sp),
            ("run xdp udp", nw_run("xdp", sp_sr()), nw_run("xdp", sp_pp(secs, size)), sp),
            ("run xdp tcp (old shim)", old_shim(nw_run("xdp", sp_sr(["--tcp"]))),
             old_shim(nw_run("xdp", sp_pp(secs, size, ["--tcp"]))), sp),
            ("run xdp tcp", nw_run("xdp", sp_sr(["--tcp"])), nw_run("xdp", sp_pp(secs, size, ["--tcp"])), sp),
            ("run spin tcp", nw_run("spin", sp_sr(["--tcp"])), nw_run("spin", sp_pp(secs, size, ["--tcp"])), sp),
        ] if os.environ.get("NANOWIRE_OLD_PRELOAD") else []),
        # Bisecting a shim regression: NANOWIRE_SHIMS="label=PATH,label=PATH,..." (shim_envs) runs sockperf UDP
        # (and TCP with NANOWIRE_SHIMS_TCP=1) under `nanowire run` with each shim, interleaved,
        # against this tree's shim.
        "shims": ("run xdp udp", [
            ("run xdp udp", nw_run("xdp", sp_sr()), nw_run("xdp", sp_pp(secs, size)), sp),
        ] + [(f"run xdp udp ({lab})", pre + nw_run("xdp", sp_sr()), pre + nw_run("xdp", sp_pp(secs, size)), sp)
             for lab, pre in shim_envs()]
          + ([("run xdp tcp", nw_run("xdp", sp_sr(["--tcp"])), nw_run("xdp", sp_pp(secs, size, ["--tcp"])), sp)]
             + [(f"run xdp tcp ({lab})", pre + nw_run("xdp", sp_sr(["--tcp"])),
                 pre + nw_run("xdp", sp_pp(secs, size, ["--tcp"])), sp) for lab, pre in shim_envs()]
             if os.environ.get("NANOWIRE_SHIMS_TCP") else [])),
        # Wave 3: what multi-buffer receive (the xdp.frags program, XDP_USE_SG) costs a UDP ping-pong.
        "wave3-mb": ("run xdp udp", [
            ("run xdp udp", nw_run("xdp", sp_sr()), nw_run("xdp", sp_pp(secs, size)), sp),
            ("run xdp udp, no multi-buffer", ["env", "NANOWIRE_XDP_NO_MULTI_BUFFER=1"] + nw_run("xdp", sp_sr()),
             ["env", "NANOWIRE_XDP_NO_MULTI_BUFFER=1"] + nw_run("xdp", sp_pp(secs, size)), sp),
        ] + ([("run xdp udp (old shim)", old_shim(nw_run("xdp", sp_sr())), old_shim(nw_run("xdp", sp_pp(secs, size))), sp)]
             if os.environ.get("NANOWIRE_OLD_PRELOAD") else [])),
        "issue4-tcp": ("plain", [
            ("plain", sp_sr(["--tcp"]), sp_pp(secs, size, ["--tcp"]), sp),
            ("run", nw_run("xdp", sp_sr(["--tcp"])), nw_run("xdp", sp_pp(secs, size, ["--tcp"])), sp),
        ]),
    }


FLOOR = os.path.abspath(os.environ.get("NANOWIRE_FLOOR", "target/release/examples/xsk_floor"))


def floor_parse(text):
    d = json.loads(text[text.index("{"):])
    extra = {k: d[k] for k in ("sent", "cpu_us_per_rt", "vcsw_per_rt", "ivcsw_per_rt") if k in d}
    return dict(d["oneway_us"], received=d["round_trips"], dropped=d["lost"], **extra)


def floor_configs(a):
    """Scenario `floor`: the raw AF_XDP ping-pong first (the baseline)."""
    build_floor()
    port = str(PORT + 11)
    return "raw AF_XDP", [
        ("raw AF_XDP", [FLOOR, "echo", f"{a.lab}-b0", port, "1"],
         [FLOOR, "ping", f"{a.lab}-a0", B, "auto", port, str(a.seconds), "0"], floor_parse),
        ("nanowire bench xdp", nw_server("xdp", ["--no-fallback"]),
         nw_pp("xdp", a.seconds, a.size, ["--no-fallback"]), nanowire_parse),
        ("sockperf under run xdp", nw_run("xdp", sp_sr()), nw_run("xdp", sp_pp(a.seconds, a.size)), sockperf_parse),
        ("sockperf plain", sp_sr(), sp_pp(a.seconds, a.size), sockperf_parse),
    ]


def iperf3_pair(a, server_argv, client_argv):
    """One iperf3 run in the lab: the server (`-s -1`) in host b, then the client in host a; the
    `end` section of the client's JSON (-J)."""
    s = subprocess.Popen(["ip", "netns", "exec", ns(a.lab, "b")] + server_argv,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    try:
        p = subprocess.run(["ip", "netns", "exec", ns(a.lab, "a")] + client_argv,
                           capture_output=True, text=True, timeout=a.seconds + 60)
    finally:
        try:
            s.wait(10)
        except subprocess.TimeoutExpired:
            s.kill()
            s.wait()
    return json.loads(p.stdout[p.stdout.index("{"):])["end"]


def iperf3_result(end):
    """Throughput (the receiver's count) and the CPU% of each end of one iperf3 run."""
    return {"gbps": round(end["sum_received"]["bits_per_second"] / 1e9, 3),
            "bytes": end["sum_received"]["bytes"],
            "cpu_client_pct": round(end["cpu_utilization_percent"]["host_total"], 1),
            "cpu_server_pct": round(end["cpu_utilization_percent"]["remote_total"], 1)}


def iperf_main(a, base, configs):
    """iperf3 TCP, both ends under `nanowire run --engine E` (kernel, spin, xdp), interleaved:
    throughput and CPU% of each end (iperf3's own accounting), medians and ratios to kernel."""
    runs = {label: [] for label, *_ in configs}
    for r in range(a.repeats):
        for label, *_ in configs:
            port = str(PORT + 7)
            end = iperf3_pair(a, nw_run(label, ["taskset", "-c", "1", "iperf3", "-s", "-1", "-B", B, "-p", port],
                                        profile="throughput"),
                              nw_run(label, ["taskset", "-c", "0", "iperf3", "-c", B, "-p", port,
                                             "-t", str(a.seconds), "-J"], profile="throughput"))
            res = iperf3_result(end)
            res["gbps_per_cpu"] = round(res["gbps"] / max(1e-9, (res["cpu_client_pct"] + res["cpu_server_pct"]) / 100), 3)
            runs[label].append(res)
            print(f"# repeat {r + 1} {label}: {res}", file=sys.stderr)
    keys = ["gbps", "cpu_client_pct", "cpu_server_pct", "gbps_per_cpu"]
    med = {label: {k: statistics.median(x[k] for x in rs) for k in keys} for label, rs in runs.items()}
    ratios = {label: {k: round(m[k] / med[base][k], 3) for k in m if med[base].get(k)} for label, m in med.items()}
    return {"scenario": a.scenario, "baseline": base, "repeats": a.repeats, "seconds": a.seconds,
            "commands": {label: " ".join(nw_run(label, ["iperf3", "-c", B, "-t", str(a.seconds), "-J"],
                                                profile="throughput")) for label, *_ in configs},
            "runs": runs, "median": med, "ratio_to_baseline": ratios, "env": env(a.lab)}


TXFLOOR_SINKS = ["xdp", "udp", "xsk"]


def build_floor():
    if not os.path.exists(FLOOR) or "NANOWIRE_FLOOR" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "--locked", "-q", "-p", "nanowire-xdp",
                        "--example", "xsk_floor"], check=True)


def txfloor_trial(a, sink):
    """The transmit floor (issue 21 bulk): one copy-mode AF_XDP socket in a (pinned to CPU 0, like
    the iperf3 client) blasting 1,514-byte frames, 64 per kick, at a sink in b (CPU 1): `xdp` drops
    them in a generic XDP program, `udp` reads them with a kernel UDP socket (the kernel's per-frame
    receive), `xsk` receives them on an AF_XDP socket. The blaster's JSON plus what the sink saw."""
    mac = json.loads(subprocess.run(["ip", "-n", ns(a.lab, "b"), "-j", "link", "show", f"{a.lab}-b0"],
                                    capture_output=True, text=True, check=True).stdout)[0]["address"]
    port = str(PORT + 12)
    s = subprocess.Popen(["ip", "netns", "exec", ns(a.lab, "b"), FLOOR, "sink", f"{a.lab}-b0", sink, port,
                          str(a.seconds + 3), "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        s.stdout.readline()  # "ready"
        p = subprocess.run(["ip", "netns", "exec", ns(a.lab, "a"), FLOOR, "blast", f"{a.lab}-a0", B, mac, port,
                            str(a.seconds), "64", "0"], capture_output=True, text=True, timeout=a.seconds + 30)
        out, _ = s.communicate(timeout=a.seconds + 30)
    finally:
        if s.poll() is None:
            s.kill()
            s.wait()
    if p.returncode != 0:
        raise RuntimeError(f"xsk_floor blast failed: {p.stderr[-2000:]}")
    d = json.loads(p.stdout[p.stdout.index("{"):])
    k = json.loads(out[out.index("{"):])
    return {"gbps": d["gbps_tcp_payload"], "gbps_per_cpu": d["gbps_tcp_payload_per_cpu"],
            "frames_per_s": d["frames_per_s"], "frames_per_kick": d["frames_per_kick"],
            "cpu_sys_s": d["cpu_sys_s"], "cpu_user_s": d["cpu_user_s"],
            "sink_rx_packets": k["rx_packets"], "sink_read": k["read"]}


def iperf_p4_main(a, base, configs):
    """Scenario `issue21-iperf`: iperf3 -P 4 (TCP) in the default lab, interleaved: plain, only
    the server (receiver) under `nanowire run --engine xdp`, only the client, both. Default
    profile (what a user gets); server pinned to CPU 1, client to CPU 0. Throughput
    (receiver's count) and CPU% of each end, medians, ratios to plain. The kernel peer's
    TSO/GSO super-frames reach an accelerated receiver as AF_XDP multi-buffer chains."""
    placement = {"plain": (False, False), "server run": (True, False),
                 "client run": (False, True), "both run": (True, True)}

    def wrap(on, argv):
        return [NW, "run", "--engine", "xdp", "--"] + argv if on else argv

    runs = {label: [] for label, *_ in configs}
    floor = {f"xsk tx -> {k}": [] for k in TXFLOOR_SINKS}
    if os.environ.get("NANOWIRE_NO_TXFLOOR") is None:
        build_floor()
    else:
        floor = {}
    for r in range(a.repeats):
        for sink in TXFLOOR_SINKS if floor else []:
            res = txfloor_trial(a, sink)
            floor[f"xsk tx -> {sink}"].append(res)
            print(f"# repeat {r + 1} floor {sink}: {res}", file=sys.stderr)
        for label, *_ in configs:
            srv_run, cli_run = placement[label]
            port = str(PORT + 8)
            end = iperf3_pair(a, wrap(srv_run, ["taskset", "-c", "1", "iperf3", "-s", "-1", "-B", B, "-p", port]),
                              wrap(cli_run, ["taskset", "-c", "0", "iperf3", "-c", B, "-p", port, "-P", "4",
                                             "-t", str(a.seconds), "-J"]))
            res = iperf3_result(end)
            res["retransmits"] = end["sum_sent"].get("retransmits", 0)
            runs[label].append(res)
            print(f"# repeat {r + 1} {label}: {res}", file=sys.stderr)
    keys = ["gbps", "retransmits", "cpu_client_pct", "cpu_server_pct"]
    med = {label: {k: statistics.median(x[k] for x in rs) for k in keys} for label, rs in runs.items()}
    ratios = {label: {k: round(m[k] / med[base][k], 3) for k in m if med[base].get(k)} for label, m in med.items()}
    # The transmit floor beside iperf3: Gbit/s of TCP payload (1,448 B a frame) one AF_XDP socket
    # moves on one core, and per second of its own CPU; ratios to plain iperf3 -P 4.
    fkeys = ["gbps", "gbps_per_cpu", "frames_per_s", "frames_per_kick", "sink_rx_packets", "sink_read"]
    fmed = {label: {k: statistics.median(x[k] for x in rs) for k in fkeys} for label, rs in floor.items()}
    fratio = {label: {k: round(m[k] / med[base]["gbps"], 3) for k in ("gbps", "gbps_per_cpu")}
              for label, m in fmed.items()}
    return {"scenario": a.scenario, "baseline": base, "repeats": a.repeats, "seconds": a.seconds,
            "txfloor": {"command": f"xsk_floor sink IFACE_B xdp|udp|xsk PORT S 1; "
                                   f"xsk_floor blast IFACE_A {B} MAC_B PORT S 64 0",
                        "runs": floor, "median": fmed, "ratio_to_plain_iperf3": fratio},
            "commands": {label: {"server": " ".join(wrap(placement[label][0], ["iperf3", "-s", "-1", "-B", B])),
                                 "client": " ".join(wrap(placement[label][1], ["iperf3", "-c", B, "-P", "4", "-t",
                                                                               str(a.seconds), "-J"]))}
                         for label, *_ in configs},
            "runs": runs, "median": med, "ratio_to_baseline": ratios, "env": env(a.lab)}


BURST_RING = int(os.environ.get("BURST_RING", "65536"))
BURST_N = int(os.environ.get("BURST_N", "65536"))
BURST_STALL_MS = 800


def wait_ready(p, secs=20):
    """Read `p`'s stderr until a READY line (or its end), for at most about `secs` s."""
    deadline = time.time() + secs
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line or "READY" in line:
            break


def burst_trial(lab, nw, port):
    """A sink on xdp (ring BURST_RING) in b stalls BURST_STALL_MS ms after the first datagram;
    a burst of BURST_N 256 B datagrams from xdp in a. Returns received/missing and drop counters."""
    sink = subprocess.Popen(["ip", "netns", "exec", ns(lab, "b"), nw, "bench", "sink", "-i", B, "-p", str(port),
                             "--behaviour", "stall", "--stall-ms", str(BURST_STALL_MS), "--idle-ms", "300",
                             "--timeout", "30", "--stop-on-eof", "--engine", "xdp", "--cpu", "1", "--json",
                             "--ring-depth", str(BURST_RING)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(sink)  # the sink says READY on stderr
        gen = subprocess.run(["ip", "netns", "exec", ns(lab, "a"), nw, "bench", "burst", "-i", B, "-p", str(port),
                              "-m", "256", "-n", str(BURST_N), "--bind", A, "--engine", "xdp", "--cpu", "0",
                              "--json"], capture_output=True, text=True, timeout=60)
        if gen.returncode != 0:
            raise RuntimeError(f"burst failed: {gen.stderr[-2000:]}")
        sink.stdin.close()
        out = sink.stdout.read()
        sink.wait(60)
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    d = json.loads(out[out.index("{"):])
    c = d.get("engine_counters", {})
    return {"expected": d.get("expected"), "received": d.get("received"), "missing": d.get("missing"),
            "peak_rx_ring": c.get("peak_rx_ring"), "xsk_rx_ring_full": c.get("xsk_rx_ring_full"),
            "xsk_rx_fill_ring_empty": c.get("xsk_rx_fill_ring_empty"), "engine_dropped": d["drops"].get("engine_dropped")}


def run_burst(a, configs):
    runs = {label: [] for label, *_ in configs}
    port = 12000
    for r in range(a.repeats):
        for label, nw, _, _ in configs:
            port += 1
            res = burst_trial(a.lab, nw, port)
            runs[label].append(res)
            print(f"# repeat {r + 1} {label}: received {res['received']} of {res['expected']}", file=sys.stderr)
    med = {label: {k: statistics.median(x[k] for x in rs if x.get(k) is not None)
                   for k in rs[0] if any(x.get(k) is not None for x in rs)} for label, rs in runs.items()}
    return {"scenario": a.scenario, "baseline": "before", "repeats": a.repeats, "ring": BURST_RING,
            "burst": BURST_N, "stall_ms": BURST_STALL_MS, "binaries": {label: nw for label, nw, _, _ in configs},
            "runs": runs, "median": med,
            "ratio_received": round(med["after"]["received"] / max(1, med["before"]["received"]), 4),
            "env": env(a.lab)}


T2T_FEEDS = (0, 100000)
# Engine of the exchange's market-data sender (the same for every strategy): xdp is the fastest
# sender here, so the shared part of tick-to-trade is smallest; T2T_EXCHANGE=spin for kernel sockets.
T2T_EXCHANGE = os.environ.get("T2T_EXCHANGE", "xdp")


def t2t_trial(lab, engine, feed, secs, port):
    """One exchange (b, CPU 1) / strategy (a, CPU 0) run; the exchange's JSON + the strategy's."""
    ex = subprocess.Popen(["ip", "netns", "exec", ns(lab, "b"), NW, "bench", "exchange", "-i", B, "-p", str(port),
                           "--md-port", str(port + 1), "--feed-rate", str(feed), "-t", str(secs), "--cpu", "1",
                           "--engine", T2T_EXCHANGE, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(ex)  # the exchange says READY on stderr
        st = subprocess.run(["ip", "netns", "exec", ns(lab, "a"), NW, "bench", "strategy", "-i", B, "-p", str(port),
                             "--md-port", str(port + 1), "--engine", engine, "--no-fallback", "--cpu", "0",
                             "--json"], capture_output=True, text=True, timeout=secs + 60)
        out, err = ex.communicate(timeout=secs + 60)
    finally:
        if ex.poll() is None:
            ex.kill()
            ex.wait()
    if st.returncode != 0 or ex.returncode != 0:
        raise RuntimeError(f"tick-to-trade {engine} feed {feed} failed:\n{st.stderr[-1500:]}\n{err[-1500:]}")
    d = json.loads(out[out.index("{"):])
    sd = json.loads(st.stdout[st.stdout.index("{"):])
    r = dict(d["t2t_us"])
    w = d.get("t2t_wire_us") or {}
    r.update({f"wire_{k}": w.get(k) for k in ("min", "p50", "p99")})
    r.update(ticks=d["ticks"], missing=d["missing"], feed_rate=d["feed_rate"], engine=sd["engine"],
             tick_oneway_p50=(sd.get("tick_us") or {}).get("p50"),
             tick_send_p50=(d.get("tick_send_us") or {}).get("p50"),
             order_send_p50=(sd.get("order_send_us") or {}).get("p50"))
    return r


def run_t2t(a):
    engines = ("spin", "xdp")
    runs = {f"{e} feed {f}": [] for f in T2T_FEEDS for e in engines}
    port = 13000
    for r in range(a.repeats):
        for f in T2T_FEEDS:
            for e in engines:
                port += 2
                res = t2t_trial(a.lab, e, f, a.seconds, port)
                runs[f"{e} feed {f}"].append(res)
                print(f"# repeat {r + 1} {e} feed {f}: p50={res['p50']} p99={res['p99']}", file=sys.stderr)
    keys = ["min", "p50", "p99", "p99.9", "max", "wire_min", "wire_p50", "wire_p99",
            "tick_oneway_p50", "tick_send_p50", "order_send_p50",
            "missing", "feed_rate"]
    med = {label: {k: statistics.median(x[k] for x in rs if x.get(k) is not None)
                   for k in keys if any(x.get(k) is not None for x in rs)} for label, rs in runs.items()}
    ratios = {f"feed {f}": {k: round(med[f"xdp feed {f}"][k] / med[f"spin feed {f}"][k], 3)
                            for k in ("min", "p50", "p99", "wire_min", "wire_p50", "wire_p99")
                            if med[f"spin feed {f}"].get(k) and med[f"xdp feed {f}"].get(k)} for f in T2T_FEEDS}
    return {"scenario": "tick-to-trade", "baseline": "spin", "repeats": a.repeats, "seconds": a.seconds,
            "commands": {"exchange": f"{NW} bench exchange -i {B} -p PORT --md-port PORT+1 --feed-rate F -t "
                                     f"{a.seconds} --cpu 1 --engine {T2T_EXCHANGE} --json",
                         "strategy": f"{NW} bench strategy -i {B} -p PORT --md-port PORT+1 --engine E "
                                     f"--no-fallback --cpu 0 --json"},
            "runs": runs, "median": med, "ratio_xdp_to_spin": ratios,
            "acceptance": "tick-to-trade p50 on xdp <= 0.5x spin", "env": env(a.lab)}


def run_msg_rate(a):
    engines = ("kernel", "spin", "xdp")
    runs = {e: [] for e in engines}
    for r in range(a.repeats):
        for e in engines:
            srv = Server(a.lab, nw_server(e, ["--tcp", "--no-fallback"]))
            try:
                cli = [NW, "bench", "tp", "-i", B, "-p", str(PORT), "-m", str(a.size), "-t", str(a.seconds),
                       "--mps", "max", "--tcp", "--engine", e, "--no-fallback", "--cpu", "0", "--json"]
                d = run_client(a.lab, cli, lambda t: json.loads(t[t.index("{"):]), timeout=a.seconds + 60)
            finally:
                srv.stop()
            runs[e].append({"rate_msg_s": d["rate_msg_s"], "engine": d["engine"], "cpu_util": d.get("cpu_util")})
            print(f"# repeat {r + 1} {e}: {d['rate_msg_s']:.0f} msg/s", file=sys.stderr)
    med = {e: statistics.median(x["rate_msg_s"] for x in rs) for e, rs in runs.items()}
    return {"scenario": "tcp-msg-rate", "baseline": "spin", "repeats": a.repeats, "seconds": a.seconds,
            "msg_size": a.size, "runs": runs, "median_msg_s": med,
            "ratio_to_spin": {e: round(m / med["spin"], 3) for e, m in med.items() if med["spin"]},
            "env": env(a.lab)}


SVC_N = 4  # processes attached to the service in scenario `service`


def nw_json(lab, host, args):
    """The JSON a `nanowire ARGS` prints in lab host `host`."""
    p = subprocess.run(["ip", "netns", "exec", ns(lab, host), NW, *args], capture_output=True, text=True,
                       timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"nanowire {' '.join(args)} failed ({p.returncode}): {p.stderr[-1000:]}")
    return json.loads(p.stdout)


def pss_kib(pid):
    """Proportional set size of process `pid` (kB, /proc/PID/smaps_rollup): shared pages (a UMEM
    memfd mapped by several processes) are split between their mappers."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")


class EngineService:
    """The operator's engine service in host `host` (`nanowire engine serve --daemon`), stopped and
    waited for by stop(): its XDP program goes with it, so a process's own engine can attach
    afterwards."""

    def __init__(self, lab, host="b"):
        probe = subprocess.run(["ip", "netns", "exec", ns(lab, host), NW, "engine", "status"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            raise RuntimeError(f"an engine service already runs in {ns(lab, host)}: stop it first")
        subprocess.run(["ip", "netns", "exec", ns(lab, host), NW, "engine", "serve", "--daemon",
                        "--idle-ms", "600000"], check=True, timeout=30)
        self.pid = nw_json(lab, host, ["engine", "status"])["pid"]

    def stop(self):
        try:
            os.kill(self.pid, 15)
        except ProcessLookupError:
            return
        end = time.time() + 5
        while os.path.exists(f"/proc/{self.pid}") and time.time() < end:
            time.sleep(0.02)
        if os.path.exists(f"/proc/{self.pid}"):
            os.kill(self.pid, 9)
            while os.path.exists(f"/proc/{self.pid}"):
                time.sleep(0.02)


def service_pids(a, ports, on_service):
    """port -> pid of the sockperf server holding it on xdp: through the service (its status in
    `nanowire stats --json`: the claim udp:B:PORT) or on an engine of its own (its stats page on
    this lab's interface, not via the service). Waits up to 20 s; a server on any other path
    makes the run invalid (never measured as if it were accelerated)."""
    end = time.time() + 20
    while True:
        st = nw_json(a.lab, "b", ["stats", "--json"])
        found = {}
        if on_service:
            for ifc in (st.get("service") or {}).get("ifaces", []):
                for c in ifc["clients"]:
                    for p in ports:
                        if f"udp:{B}:{p}" in c["claims"]:
                            found[p] = c["pid"]
        else:
            for e in st["engines"]:
                if e["iface"] == f"{a.lab}-b0" and "via engine service" not in e["xdp_mode"]:
                    for p in ports:
                        if any(s["local"] == f"{B}:{p}" for s in e["sockets"]):
                            found[p] = e["pid"]
        if len(found) == len(ports):
            return found, st
        if time.time() > end:
            raise RuntimeError(f"not every server is on xdp ({'service' if on_service else 'own engine'}): "
                               f"found {found} for ports {ports}\n{json.dumps(st)[-3000:]}")
        time.sleep(0.2)


def service_trial(a, n, mode, port0, env_extra=(), serial=False):
    """`n` sockperf servers in host b — under `nanowire run` on the engine service (`mode`
    "service"), under run on an engine of its own (`"own"`, one process), or plain kernel sockets
    (`"plain"`) — each with its own plain sockperf pp client in host a, all clients at once (or,
    `serial`, one after the other while every server stays up: one busy process, the others idle);
    each client's latency, and the PSS of the servers (and of the service).
    `env_extra`: NAME=VALUE settings for the servers."""
    profile = a.profiles.split(",")[0]
    pin_s, pin_c = (["taskset", "-c", "1"], ["taskset", "-c", "0"]) if a.pin else ([], [])
    ports = [port0 + i for i in range(n)]
    on_service = mode == "service"
    pre = (["NANOWIRE_SERVICE=1"] if on_service else []) + list(env_extra)
    pre = ["env"] + pre if pre else []
    run = [] if mode == "plain" else [NW, "run", "--profile", profile, "--engine", "xdp", "--"]
    svc = EngineService(a.lab) if on_service else None
    servers = []
    try:
        for p in ports:
            servers.append(Server(a.lab, pre + run + pin_s + ["sockperf", "sr", "-i", B, "-p", str(p)]))
        if mode == "plain":
            # `ip netns exec` and taskset exec the server: the child is sockperf.
            pids = {p: s.p.pid for p, s in zip(ports, servers)}
        else:
            pids, _ = service_pids(a, ports, on_service)

        def client(p):
            return subprocess.Popen(["ip", "netns", "exec", ns(a.lab, "a")] + pin_c +
                                    ["sockperf", "pp", "-i", B, "-p", str(p), "-m", str(a.size), "-t",
                                     str(a.seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def result(p, c):
            out, err = c.communicate(timeout=a.seconds + 60)
            if c.returncode != 0:
                raise RuntimeError(f"sockperf pp to port {p} failed ({c.returncode}): {err[-1500:]}")
            return dict(sockperf_parse(out), port=p, pid=pids[p])
        # The clients' CPU time (user + system: their sends, which on veth carry the peer's receive,
        # XDP and the AF_XDP copy included, their receives and wake-ups): reaped children only, so
        # the servers (still up) are not in it.
        sched0 = sched_counts(pids.values())
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if serial:
            procs = [result(p, client(p)) for p in ports]
        else:
            clients = [client(p) for p in ports]
            procs = [result(p, c) for p, c in zip(ports, clients)]
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        sched1 = sched_counts(pids.values())
        cpu_s = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        # After the traffic, with every server (and the service) still up.
        mem = {str(pids[p]): pss_kib(pids[p]) for p in ports}
        if svc:
            mem[f"service {svc.pid}"] = pss_kib(svc.pid)
    finally:
        for s in servers:
            s.stop()
        if svc:
            svc.stop()
    res = pairs_summary(procs, n, serial, cpu_s, sched1 - sched0 if sched0 is not None else None)
    res.update(pss_kib=sum(mem.values()), pss_kib_by_process=mem)
    return res


def sched_counts(pids):
    """The servers' scheduler counts so far, summed over their threads: CPU time and time waiting
    on a run queue (ns, /proc/PID/task/TID/schedstat), voluntary and involuntary context switches;
    None if a count cannot be read."""
    tot = [0, 0, 0, 0]
    try:
        for pid in pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run_ns, wait_ns, _ = f.read().split()
                tot[0] += int(run_ns)
                tot[1] += int(wait_ns)
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            tot[2] += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches:"):
                            tot[3] += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return SchedCounts(tot)


class SchedCounts:
    def __init__(self, v):
        self.v = v

    def __sub__(self, o):
        return SchedCounts([x - y for x, y in zip(self.v, o.v)]) if o is not None else None


def pairs_summary(procs, n, serial, cpu_s, sched):
    """Scenario `service`'s numbers of one trial of `n` ping-pongs (each client's result in
    `procs`): p50 of the median and of the worst client, p99, mean; the clients' CPU per message
    (`cpu_s`: their user + system time) and, with `sched` (the servers' SchedCounts over the
    clients' run), the servers' CPU, run-queue wait and context switches per message."""
    p50s = [x["p50"] for x in procs]
    res = {"p50": statistics.median(p50s), "p50_max": max(p50s),
           "p99": statistics.median(x["p99"] for x in procs), "p99_max": max(x["p99"] for x in procs),
           "avg": statistics.median(x.get("avg", 0) for x in procs)}
    sent = sum(x.get("sent_total", x.get("sent", 0)) for x in procs)
    run_s = max(x.get("run_s", 0) for x in procs)
    if sent and run_s:
        # CPU 0's work per message (the clients'), and their share of CPU 0 over the run (1.0:
        # CPU 0 saturated: n messages in flight then take n times this per round, so the mean
        # one-way latency of n at once is at least n x client_cpu_us_per_msg / 2).
        res["client_cpu_us_per_msg"] = round(cpu_s * 1e6 / sent, 3)
        res["client_cpu_share"] = round(cpu_s / (run_s * (n if serial else 1)), 3)
        res["client_bound_oneway_us"] = round((1 if serial else n) * cpu_s * 1e6 / sent / 2, 3)
    if sent and sched is not None:
        # CPU 1's side per message: the servers' CPU, their wait on CPU 1's run queue (ready but
        # not running: another server or foreign work had it), their sleeps and preemptions.
        run_ns, wait_ns, vcsw, ivcsw = sched.v
        res.update(server_cpu_us_per_msg=round(run_ns / 1e3 / sent, 3),
                   server_rq_wait_us_per_msg=round(wait_ns / 1e3 / sent, 3),
                   server_vcsw_per_msg=round(vcsw / sent, 4), server_ivcsw_per_msg=round(ivcsw / sent, 4))
    if n > 1:
        res["processes"] = procs
    else:
        res.update({k: v for k, v in procs[0].items() if k not in res})
    return res


FLOOR_WAITS = ("spin", "yield", "sleep")  # xsk_floor's waits for the pairs
FLOOR_SP_WAITS = ("yield", "sleep", "all")  # its echoes with sockperf clients ("all": one echo-all process)


def floor_labs(a, n):
    """The labs of `n` raw AF_XDP pairs: this run's and n - 1 more (`LAB`x1...), one veth pair each (an
    AF_XDP socket that does not share a UMEM needs the queue of an interface to itself)."""
    return [a.lab] + [f"{a.lab}x{i}" for i in range(1, n)]


def floor_trial(a, n, wait, clients):
    """`n` raw AF_XDP echoes (xsk_floor echo, waiting `wait`: spin, yield or sleep), each in host b of its
    own lab, with its client in host a, all at once: xsk_floor ping (`clients` "xsk", waiting the same way)
    or plain sockperf pp ("sockperf": the service rows' clients; the echo answers as a sockperf server).
    `wait` "all": one xsk_floor echo-all spinning over the n labs' sockets (sockperf clients only).
    Echoes on CPU 1, clients on CPU 0 (unless --no-pin), as the service rows."""
    cpu_s, cpu_c = ("1", "0") if a.pin else ("-", "-")
    port = str(PORT + 13)
    echoes, pids = [], []
    sp = ["sockperf"] if clients == "sockperf" else []
    if wait == "all":
        # One process spinning over the n sockets (each opened in its lab's host b).
        spec = ",".join(f"{ns(lab, 'b')}:{lab}-b0" for lab in floor_labs(a, n))
        argvs_e = [[FLOOR, "echo-all", spec, port, cpu_s] + sp]
    else:
        argvs_e = [["ip", "netns", "exec", ns(lab, "b"), FLOOR, "echo", f"{lab}-b0", port, cpu_s, wait] + sp
                   for lab in floor_labs(a, n)]
    try:
        for argv in argvs_e:
            for attempt in range(50):
                e = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                if e.stdout.readline().strip() == "ready":
                    break
                err = e.stderr.read()
                e.wait()
                # The kernel frees the queue of the last trial's echo a moment after it is gone.
                if "busy" not in err or attempt == 49:
                    raise RuntimeError(f"xsk_floor echo failed: {' '.join(argv)}\n{err[-2000:]}")
                time.sleep(0.1)
            echoes.append(e)
            pids.append(e.pid)
        if clients == "xsk":
            argvs = [[FLOOR, "ping", f"{lab}-a0", B, "auto", port, str(a.seconds), cpu_c, wait]
                     for lab in floor_labs(a, n)]
            parse = floor_parse
        else:
            pin_c = ["taskset", "-c", "0"] if a.pin else []
            argvs = [pin_c + ["sockperf", "pp", "-i", B, "-p", port, "-m", str(a.size), "-t", str(a.seconds)]
                     for _ in range(n)]
            parse = sockperf_parse
        sched0 = sched_counts(pids)
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        cl = [subprocess.Popen(["ip", "netns", "exec", ns(lab, "a")] + argv, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for lab, argv in zip(floor_labs(a, n), argvs)]
        outs = [c.communicate(timeout=a.seconds + 60) for c in cl]
        run_s = time.time() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        sched1 = sched_counts(pids)
    finally:
        for e in echoes:
            e.kill()
            e.wait()
    procs = []
    for c, argv, (out, err) in zip(cl, argvs, outs):
        if c.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({c.returncode}): {err[-1500:]}")
        procs.append(dict(parse(out), run_s=run_s) if clients == "xsk" else parse(out))
    cpu_s_used = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    return pairs_summary(procs, n, False, cpu_s_used, sched1 - sched0 if sched0 is not None else None)


SVC_ONE, SVC_OWN, SVC_MANY = "one process on the service", "one process, own engine", \
    f"{SVC_N} processes on the service"
SVC_PLAIN_ONE, SVC_PLAIN_MANY = "one plain process (kernel)", f"{SVC_N} plain processes (kernel)"
SVC_SERIAL = f"{SVC_N} processes on the service, pinged one at a time"
SVC_SHARE0 = f"{SVC_N} processes on the service, spin_share 0"
SVC_HINT0 = f"{SVC_N} processes on the service, spin_hint 0"


def service_configs(rows):
    """Scenario `service`'s rows: (label, processes, mode, env, serial). `rows` "floor": only those
    of the machine's floor (one and four on the service, one and four plain, four one at a time)."""
    configs = [(SVC_OWN, 1, "own", (), False), (SVC_ONE, 1, "service", (), False),
               (SVC_MANY, SVC_N, "service", (), False),
               # The same four without the service's spinner registry (NANOWIRE_SPIN_SHARE=0, each waits
               # as if alone on its CPU: before session 16) and with the registry but without passing the
               # CPU by the steering program's frame counts (NANOWIRE_SPIN_HINT=0: before session 17). Since
               # session 19 only waits that spin forever pass by hint, so with a budget (--profiles balanced)
               # this row is the default's twin (the spread of two alike rows); with latency it is the A/B.
               (SVC_SHARE0, SVC_N, "service", ("NANOWIRE_SPIN_SHARE=0",), False),
               (SVC_HINT0, SVC_N, "service", ("NANOWIRE_SPIN_HINT=0",), False),
               # What this machine can do (session 18): the kernel's own four / one with the same placement
               # (four plain servers on CPU 1, four clients at once on CPU 0), and four attached with one
               # busy at a time (the other three attached and idle).
               (SVC_PLAIN_ONE, 1, "plain", (), False), (SVC_PLAIN_MANY, SVC_N, "plain", (), False),
               (SVC_SERIAL, SVC_N, "service", (), True)]
    # The raw AF_XDP floor of the same placement (issue 23): one xsk_floor pair, and SVC_N at once (each on a
    # veth pair of its own), for each way of waiting; and xsk_floor's echo against the service rows' sockperf
    # clients (spinning echoes with sleeping clients: a p50 of the echo that holds CPU 1, milliseconds for the
    # others, so only the yielding and the sleeping echo, and one process spinning over all the sockets: the
    # best a server side can do on one CPU, no switch between the servers).
    floor = []
    for wait in FLOOR_WAITS:
        floor += [(floor_label(1, wait, "xsk"), 1, ("floor", wait, "xsk"), (), False),
                  (floor_label(SVC_N, wait, "xsk"), SVC_N, ("floor", wait, "xsk"), (), False)]
    for wait in FLOOR_SP_WAITS:
        floor += [(floor_label(1, wait, "sockperf"), 1, ("floor", wait, "sockperf"), (), False),
                  (floor_label(SVC_N, wait, "sockperf"), SVC_N, ("floor", wait, "sockperf"), (), False)]
    if rows == "xskfloor":
        return floor
    if rows == "floor":
        keep = {SVC_ONE, SVC_MANY, SVC_PLAIN_ONE, SVC_PLAIN_MANY, SVC_SERIAL}
        configs = [c for c in configs if c[0] in keep]
    # Interleaved with the rows above, each pair of floor rows after a row of the service.
    out = []
    for i, c in enumerate(configs):
        out += [c] + floor[2 * i:2 * i + 2]
    return out + floor[2 * len(configs):]


def floor_label(n, wait, clients):
    if clients == "xsk":
        return f"xsk_floor, {'one pair' if n == 1 else f'{n} pairs at once'}, {wait}"
    echo = "xsk_floor echo-all (one spinning poller)" if wait == "all" else f"xsk_floor echo {wait}"
    return f"{echo}, {'one sockperf client' if n == 1 else f'{n} sockperf clients at once'}"


def run_service(a):
    """Scenario `service` (issue 23, step 4): one sockperf server under `nanowire run` on an engine
    of its own (today's engine), one on the engine service, and SVC_N on the service at once
    (each with its own client), interleaved; medians of the repeats; ratios of p50 (the median
    process's and the worst's) and of memory (PSS, the service included); the same for plain
    kernel servers, and SVC_N on the service pinged one at a time; the worst / one ratios also as
    paired ratios with their bootstrap 95% interval over the repeats."""
    configs = service_configs(a.rows)
    runs = {label: [] for label, *_ in configs}
    port = PORT + 100
    extra_labs = floor_labs(a, SVC_N)[1:] if any(isinstance(c[2], tuple) for c in configs) else []
    if extra_labs:
        build_floor()
    for lab in extra_labs:
        subprocess.run([NW, "lab", "up", "--name", lab], check=True, stdout=subprocess.DEVNULL)
    try:
        for r in range(a.repeats):
            for label, n, mode, extra, serial in (configs if r % 2 == 0 else configs[::-1]):
                port += SVC_N
                if isinstance(mode, tuple):
                    try:
                        res = floor_trial(a, n, mode[1], mode[2])
                    except RuntimeError as e:
                        # A floor row that failed (e.g. a starved spinning pinger with no reply in its
                        # run) has no numbers in this repeat; the service's rows and the others go on.
                        res = {"failed": str(e)[-300:]}
                else:
                    res = service_trial(a, n, mode, port, extra, serial)
                runs[label].append(res)
                print(f"# repeat {r + 1} {label}: p50={res.get('p50')} (worst {res.get('p50_max')}) mean={res.get('avg')} "
                      f"pss={res.get('pss_kib')} kB; clients' CPU {res.get('client_cpu_us_per_msg')} us/msg, "
                      f"share {res.get('client_cpu_share')}, bound {res.get('client_bound_oneway_us')} us; "
                      f"servers' CPU {res.get('server_cpu_us_per_msg')} us/msg, run-queue wait "
                      f"{res.get('server_rq_wait_us_per_msg')} us/msg, switches {res.get('server_vcsw_per_msg')} "
                      f"+ {res.get('server_ivcsw_per_msg')} (involuntary)/msg", file=sys.stderr)
    finally:
        for lab in extra_labs:
            subprocess.run([NW, "lab", "down", "--name", lab], stdout=subprocess.DEVNULL)
    keys = ["p50", "p50_max", "p99", "p99_max", "avg", "pss_kib", "client_cpu_us_per_msg", "client_cpu_share",
            "client_bound_oneway_us", "server_cpu_us_per_msg", "server_rq_wait_us_per_msg", "server_vcsw_per_msg",
            "server_ivcsw_per_msg"]
    med = {label: {k: statistics.median(x[k] for x in rs if x.get(k) is not None)
                   for k in keys if any(x.get(k) is not None for x in rs)} for label, rs in runs.items()}
    none = {}
    own, one, many = (med.get(label, none) for label in (SVC_OWN, SVC_ONE, SVC_MANY))

    def ratio(x, y, kx, ky=None):
        return round(x[kx] / y[ky or kx], 3) if x.get(kx) and y.get(ky or kx) else None
    ratios = {
        "one on the service / own engine: p50": ratio(one, own, "p50"),
        "one on the service / own engine: p99": ratio(one, own, "p99"),
        f"{SVC_N} on the service, median process / one on the service: p50": ratio(many, one, "p50"),
        f"{SVC_N} on the service, worst process / one on the service: p50": ratio(many, one, "p50_max", "p50"),
        f"{SVC_N} on the service, worst process / own engine: p50": ratio(many, own, "p50_max", "p50"),
        f"{SVC_N} on the service with spin_share 0 (before session 16), worst process / one on the service: p50":
            ratio(med.get(SVC_SHARE0, none), one, "p50_max", "p50"),
        f"{SVC_N} on the service with spin_hint 0 (before session 17), worst process / one on the service: p50":
            ratio(med.get(SVC_HINT0, none), one, "p50_max", "p50"),
        f"memory (PSS) {SVC_N} on the service with the service / one process, own engine":
            ratio(many, own, "pss_kib"),
        "memory (PSS) one on the service with the service / one process, own engine": ratio(one, own, "pss_kib"),
    }
    # The raw AF_XDP floor, per wait: four at once (worst process's p50; the median process's mean) / one, and
    # the best of the waits that share CPU 1 (yield, sleep: issue 23's evidence, the fastest raw AF_XDP server
    # with the same placement and, for the sockperf rows, the same clients) against the best one of any wait.
    # Four spinning pairs are left out of the best: each runs in time slices, a p50 of the round trips inside
    # its slice and a mean of the milliseconds between them (their mean / one's is the row to read).
    for clients, what in (("xsk", "pairs"), ("sockperf", "echoes with sockperf clients")):
        waits = FLOOR_WAITS if clients == "xsk" else FLOOR_SP_WAITS
        many_f, one_f = {}, {}
        for w in waits:
            m, o = med.get(floor_label(SVC_N, w, clients), none), med.get(floor_label(1, w, clients), none)
            ratios[f"xsk_floor {what} ({w}): {SVC_N} at once, worst process / one: p50"] = ratio(m, o, "p50_max", "p50")
            ratios[f"xsk_floor {what} ({w}): {SVC_N} at once / one: mean"] = ratio(m, o, "avg")
            if m.get("p50_max") and w != "spin":
                many_f[w] = m["p50_max"]
            if o.get("p50"):
                one_f[w] = o["p50"]
        if many_f and one_f:
            ratios[f"xsk_floor {what}: best {SVC_N} at once (worst process; not spin) / best one: p50"] = \
                round(min(many_f.values()) / min(one_f.values()), 3)
        if many_f and clients == "sockperf":
            ratios[f"{SVC_N} on the service, worst process / xsk_floor's best {SVC_N} at once with sockperf "
                   f"clients: p50"] = ratio(many, {"x": min(many_f.values())}, "p50_max", "x")
    # Worst / one with the bootstrap interval (repeats paired: the rows of a repeat ran back to back).
    paired = {}
    floor_pairs = [(floor_label(SVC_N, w, "xsk"), floor_label(1, w, "xsk"), f"xsk_floor pairs ({w}), all at once")
                   for w in FLOOR_WAITS]
    floor_pairs += [(floor_label(SVC_N, w, "sockperf"), floor_label(1, w, "sockperf"),
                     f"xsk_floor echoes ({w}) with sockperf clients, all at once") for w in FLOOR_SP_WAITS]
    for many_label, one_label, what in ((SVC_MANY, SVC_ONE, "on the service, all at once"),
                                        (SVC_PLAIN_MANY, SVC_PLAIN_ONE, "plain kernel sockets, all at once"),
                                        (SVC_SERIAL, SVC_ONE, "on the service, one at a time"),
                                        (SVC_HINT0, SVC_ONE, "on the service with spin_hint 0, all at once"),
                                        *floor_pairs):
        if many_label in runs and one_label in runs:
            r = paired_ratio([x.get("p50_max") for x in runs[many_label]], [x.get("p50") for x in runs[one_label]],
                             f"{many_label} (worst) / {one_label}")
            if r:
                paired[f"{SVC_N} {what}: worst / one, p50"] = r
    # One on the service / its own engine, paired the same way (session 18's 1.065 was one repeat's own
    # engine in the faster mode: per repeat 1.179 1.000 1.007 0.997 1.004).
    if SVC_ONE in runs and SVC_OWN in runs:
        r = paired_ratio([x["p50"] for x in runs[SVC_ONE]], [x["p50"] for x in runs[SVC_OWN]],
                         f"{SVC_ONE} / {SVC_OWN}")
        if r:
            paired["one on the service / own engine, p50"] = r
    print_run_to_old(paired)
    profile = a.profiles.split(",")[0]
    pin_s, pin_c = ("taskset -c 1 ", "taskset -c 0 ") if a.pin else ("", "")
    return {"scenario": "service", "baseline": configs[0][0], "repeats": a.repeats, "seconds": a.seconds,
            "msg_size": a.size, "profile": profile, "pinned": a.pin, "rows": a.rows,
            "commands": {"service": f"{NW} engine serve --daemon --idle-ms 600000 (host b; stopped after each "
                                    f"service run)",
                         "server": f"[NANOWIRE_SERVICE=1] {NW} run --profile {profile} --engine xdp -- "
                                   f"{pin_s}sockperf sr -i {B} -p PORT (plain rows: without run)",
                         "client": f"{pin_c}sockperf pp -i {B} -p PORT -m {a.size} -t {a.seconds} (plain, host a; "
                                   f"'one at a time': each client after the last, every server up)",
                         "xsk_floor": f"{FLOOR} echo LAB-b0 PORT {'1' if a.pin else '-'} spin|yield|sleep [sockperf] "
                                      f"(or echo-all LAB-b:LAB-b0,... PORT {'1' if a.pin else '-'} sockperf) "
                                      f"(host b of each pair's lab: {a.lab}, {a.lab}x1..); {FLOOR} ping LAB-a0 {B} "
                                      f"auto PORT {a.seconds} {'0' if a.pin else '-'} spin|yield|sleep (host a), or "
                                      f"the sockperf pp above"},
            "runs": runs, "median": med, "ratios": ratios, "worst_to_one": paired,
            "acceptance": f"issue 23: with {SVC_N} processes attached each one's p50 <= 1.1x a single process's; "
                          "sockperf under run on the service within 1.05x of the single-process engine; memory "
                          f"of {SVC_N} processes on one interface <= 1.5x one process's (PSS)",
            "env": env(a.lab)}


CONNECT_PY = r"""
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lat = []
for i in range(n):
    s = socket.socket()
    t = time.perf_counter_ns()
    s.connect((host, port))
    lat.append(time.perf_counter_ns() - t)
    s.close()
lat.sort()
print("p50_us %.1f p99_us %.1f" % (lat[len(lat) // 2] / 1000, lat[int(len(lat) * 0.99)] / 1000))
"""


def churn_nginx(lab, tmp, port, under_run=False, workers=1, env_extra=()):
    """An nginx (`workers` workers) in host b serving a small file from `tmp`, plain or under run
    (with more than one worker: on the engine service of host b, where workers share the
    listener on the engine, issue 24); `env_extra`: NAME=VALUE settings for the run."""
    for d in ("html", "tmp"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    with open(os.path.join(tmp, "html", "index.html"), "w") as f:
        f.write("hello from nginx\n")
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"user root; worker_processes {workers}; daemon off; pid {tmp}/nginx.pid; error_log {tmp}/error.log;\n"
                f"events {{ worker_connections 4096; }}\n"
                f"http {{ access_log off; client_body_temp_path {tmp}/tmp; proxy_temp_path {tmp}/tmp; "
                f"fastcgi_temp_path {tmp}/tmp; uwsgi_temp_path {tmp}/tmp; scgi_temp_path {tmp}/tmp;\n"
                f"server {{ listen {B}:{port}; root {tmp}/html; }} }}\n")
    argv = ["nginx", "-c", conf, "-p", tmp]
    if under_run:
        argv = (["env", "NANOWIRE_SERVICE=1", *env_extra] if workers > 1 else []) + [NW, "run", "--"] + argv
    return Server(lab, argv)


def run_churn(a):
    port = 8080
    runs = {}
    with tempfile.TemporaryDirectory(prefix="nw-churn-") as tmp:
        srv = churn_nginx(a.lab, tmp, port)
        srv4 = churn_nginx(a.lab, os.path.join(tmp, "w4"), port + 2, workers=4)
        try:
            url = f"http://{B}:{port}/index.html"
            # (name, argv, server under run in the "run" mode: ab stays plain)
            n4 = str(a.nginx4_requests)
            url4 = url.replace(f":{port}/", f":{port + 2}/")
            tests = [
                ("ab -c 1", ["ab", "-q", "-n", str(a.requests), "-c", "1", url], False),
                ("ab -c 20", ["ab", "-q", "-n", str(a.requests), "-c", "20", url], False),
                ("python connect", ["python3", "-c", CONNECT_PY, B, str(port), str(a.requests)], False),
                ("ab -c 1 nginx under run", ["ab", "-q", "-n", str(a.requests), "-c", "1", url], True),
                # Issue 24: connections accepted per second by nginx with 4 workers, plain and
                # under run on the engine service of host b (workers share the listener there).
                ("ab -c 20 nginx 4 workers under run", ["ab", "-q", "-n", n4, "-c", "20", url4], True),
                # The same with the workers' waits not spinning (NANOWIRE_SPIN_US=0): 4 workers and
                # ab on 2 vCPUs leave no idle CPU to spin on; session 15 counted 10-25 % more CPU per
                # request in the workers with the default spin than without (docs/benchmarks.md,
                # "Session 15: nginx workers on the service").
                ("ab -c 20 nginx 4 workers under run spin 0", ["ab", "-q", "-n", n4, "-c", "20", url4], True),
            ]
            if a.rows == "nginx4":
                tests = [t for t in tests if "4 workers" in t[0]]

            def parse(text):
                out = {}
                scan(text, [
                    (r"Requests per second:\s+([\d.]+)", ["req_s"], float),
                    (r"Failed requests:\s+(\d+)", ["failed"], int),
                    (r"p50_us ([\d.]+) p99_us ([\d.]+)", ["p50_us", "p99_us"], float),
                ], out)
                if not out:
                    raise RuntimeError("could not parse:\n" + text[-2000:])
                return out

            for r in range(a.repeats):
                for name, argv, server_run in tests:
                    # "service": the client under run on the engine service of host a (started
                    # before the run, stopped after it: the own-engine runs need the interface),
                    # so its engine start is an attach (issue 21 churn, session 11).
                    modes = ("plain", "run") + (() if server_run else ("service",))
                    # Plain first in odd repeats, last in even ones: no mode always follows the
                    # other (a ratio per repeat compares neighbours in time).
                    for mode in modes if r % 2 == 0 else modes[::-1]:
                        run_srv = None
                        svc = None
                        if mode == "service":
                            svc = EngineService(a.lab, "a")
                            cmd = ["env", "NANOWIRE_SERVICE=1", NW, "run", "--"] + argv
                        elif not server_run:
                            cmd = argv if mode == "plain" else [NW, "run", "--"] + argv
                        elif mode == "plain":
                            cmd = argv
                        elif "4 workers" in name:
                            # nginx with 4 workers under run on host b's engine service, on
                            # the next port but one, for this run only.
                            os.makedirs(os.path.join(tmp, "run4"), exist_ok=True)
                            svc = EngineService(a.lab, "b")
                            run_srv = churn_nginx(a.lab, os.path.join(tmp, "run4"), port + 3, under_run=True,
                                                  workers=4,
                                                  env_extra=("NANOWIRE_SPIN_US=0",) if "spin 0" in name else ())
                            cmd = [x.replace(f":{port + 2}/", f":{port + 3}/") for x in argv]
                        else:
                            # A fresh nginx under run on the next port for this run only (its
                            # engine and XDP program go with it: the plain runs see none).
                            os.makedirs(os.path.join(tmp, "run"), exist_ok=True)
                            run_srv = churn_nginx(a.lab, os.path.join(tmp, "run"), port + 1, under_run=True)
                            cmd = [x.replace(f":{port}/", f":{port + 1}/") for x in argv]
                        try:
                            if "4 workers" in name and a.nginx4_warmup:
                                # The same nginx warmed first (its engine attached, its workers'
                                # first connections made), plainly as under run.
                                i = cmd.index("-n") + 1
                                warm = cmd[:i] + [str(a.nginx4_warmup)] + cmd[i + 1:]
                                run_client(a.lab, warm, parse, timeout=300)
                            res = run_client(a.lab, cmd, parse, timeout=300)
                        finally:
                            if run_srv:
                                run_srv.stop()
                            if svc:
                                svc.stop()
                        runs.setdefault(f"{name} {mode}", []).append(res)
                        print(f"# repeat {r + 1} {name} {mode}: {res}", file=sys.stderr)
        finally:
            srv.stop()
            srv4.stop()
    med = {label: {k: statistics.median(x[k] for x in rs if k in x) for k in rs[0]} for label, rs in runs.items()}
    ratios = {}
    for name, key in (("ab -c 1", "req_s"), ("ab -c 20", "req_s"), ("python connect", "p50_us"),
                      ("python connect", "p99_us"), ("ab -c 1 nginx under run", "req_s"),
                      ("ab -c 20 nginx 4 workers under run", "req_s"),
                      ("ab -c 20 nginx 4 workers under run spin 0", "req_s")):
        p, r = med.get(f"{name} plain", {}).get(key), med.get(f"{name} run", {}).get(key)
        if p and r:
            ratios[f"{name} {key} run/plain"] = round(r / p, 3)
        sv = med.get(f"{name} service", {}).get(key)
        if p and sv:
            ratios[f"{name} {key} service/plain"] = round(sv / p, 3)
    # Each repeat's ratio (plain and run of one repeat are neighbours in time): the spread says
    # whether the median ratio's side of 1.0 is more than noise.
    per_repeat = {}
    for name in ("ab -c 20 nginx 4 workers under run", "ab -c 20 nginx 4 workers under run spin 0"):
        ps, rs = runs.get(f"{name} plain", []), runs.get(f"{name} run", [])
        pairs = [(r["req_s"], p["req_s"]) for p, r in zip(ps, rs) if p.get("req_s") and r.get("req_s")]
        each = [round(r / p, 3) for r, p in pairs]
        if each:
            lo, hi = bootstrap_ratio([r for r, _ in pairs], [p for _, p in pairs])
            # ci95: of the ratio of the medians (run/plain), repeats resampled in pairs.
            per_repeat[f"{name} req_s run/plain"] = {
                "each": each, "median": round(statistics.median(each), 3), "min": min(each), "max": max(each),
                "at_or_above_1": sum(x >= 1.0 for x in each), "ci95": [round(lo, 3), round(hi, 3)]}
    return {"scenario": "churn", "requests": a.requests, "nginx4_requests": a.nginx4_requests,
            "nginx4_warmup": a.nginx4_warmup, "rows": a.rows, "repeats": a.repeats, "runs": runs, "median": med,
            "ratio_run_to_plain": ratios, "ratio_per_repeat": per_repeat,
            "acceptance": "ab -c 1 with ab under run >= 1.0x plain req/s, and against nginx under run no "
                          "slower than plain (issue 21); nginx with 4 workers under run (engine service) "
                          "accepts connections per second >= plain (issue 24)", "env": env(a.lab)}


def env(lab):
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception as e:  # noqa: BLE001 - environment probing is best effort
            return f"unavailable: {e}"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {
        "kernel": platform.release(), "cpu_model": cpu, "nproc": os.cpu_count(),
        "sockperf": sh(["sockperf", "--version"]).splitlines()[0] if sh(["sockperf", "--version"]) else "?",
        "nanowire": sh([NW, "--version"]), "nanowire_base": sh([BASE, "--version"]), "lab": json.loads(sh([NW, "lab", "status", "--name", lab, "--json"]) or "{}"),
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }


APPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "apps")


def apps_build(tmp):
    """Compile the C and Java echo programs into `tmp`; return runtime -> argv prefix."""
    subprocess.run(["cc", "-O2", "-pthread", "-o", os.path.join(tmp, "echo_mt"), os.path.join(APPS, "echo_mt.c")],
                   check=True)
    # A compiled class: `java Echo.java` would compile in every run (~0.5 s of start-up, outside the timing but
    # competing for the CPU while the peer starts).
    subprocess.run(["javac", "-d", tmp, os.path.join(APPS, "Echo.java")], check=True)
    return {
        "node": ["node", os.path.join(APPS, "echo.js")],
        "jvm-nio": ["java", "-cp", tmp, "Echo"],
        "python-asyncio": [sys.executable, os.path.join(APPS, "echo_asyncio.py")],
        "c-mt": [os.path.join(tmp, "echo_mt")],
    }


class ReadyServer:
    """A server in host b that prints 'ready' once bound."""

    def __init__(self, lab, argv, out_path):
        self.out = open(out_path, "w+")
        self.p = subprocess.Popen(["ip", "netns", "exec", ns(lab, "b")] + argv, stdout=self.out,
                                  stderr=subprocess.STDOUT, text=True)
        end = time.time() + 30
        while time.time() < end:
            self.out.seek(0)
            if "ready" in self.out.read():
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.02)
        self.out.seek(0)
        text = self.out.read()
        self.stop()
        raise RuntimeError(f"server not ready: {' '.join(argv)}\n{text[-2000:]}")

    def stop(self):
        Server.stop(self)
        self.out.close()


def apps_main(a):
    subprocess.run([NW, "lab", "up", "--name", a.lab], check=True, stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp(prefix="nanowire-apps-")  # private (0700), unique
    try:
        apps_measure(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def apps_measure(a, tmp):
    progs = apps_build(tmp)
    runtimes = [r for r in a.runtimes.split(",") if r] if a.runtimes else list(progs)
    inflights = [int(k) for k in a.inflight.split(",")]
    modes = ["plain"] + [f"run {p}" for p in a.profiles.split(",")]
    # --also-preload LABEL=PATH: the same profiles with another build of the shim (before/after in one run).
    extra = dict(x.split("=", 1) for x in a.also_preload)
    modes += [f"{label} {p}" for label in extra for p in a.profiles.split(",")]
    pin_c, pin_s = (["taskset", "-c", "0"], ["taskset", "-c", "1"]) if a.pin else ([], [])

    def wrap(mode, argv):
        if mode == "plain":
            return argv
        label, profile = mode.split()
        env = []
        if label in extra:  # PATH[,VAR=VALUE...]: another shim and/or extra environment (empty PATH: this one)
            path, *assign = extra[label].split(",")
            env = ["env"] + ([f"NANOWIRE_PRELOAD={path}"] if path else []) + assign
        return env + [NW, "run", "--profile", profile, "--"] + argv

    runs, commands, port = [], {}, 20000
    for r in range(a.repeats):
        for rt in runtimes:
            for k in inflights:
                order = modes if r % 2 == 0 else modes[::-1]  # alternate who goes first
                for mode in order:
                    port += 1
                    srv = pin_s + wrap(mode, progs[rt] + ["server", B, str(port)])
                    cli = pin_c + wrap(mode, progs[rt] + ["client", B, str(port), str(a.count), str(k),
                                                           str(a.size), str(a.warmup)])
                    commands[f"{rt} {mode}"] = {"server": shlex.join(srv), "client": shlex.join(cli)}
                    s = ReadyServer(a.lab, srv, os.path.join(tmp, "server.out"))
                    try:
                        p = subprocess.run(["ip", "netns", "exec", ns(a.lab, "a")] + cli, capture_output=True,
                                           text=True, timeout=120)
                    finally:
                        s.stop()
                    line = next((l for l in reversed(p.stdout.splitlines()) if l.startswith("{")), None)
                    if p.returncode != 0 or line is None:
                        raise RuntimeError(f"{rt} {mode} k={k} failed ({p.returncode}):\n{p.stdout[-1000:]}"
                                           f"\n{p.stderr[-2000:]}")
                    res = json.loads(line)
                    runs.append({"runtime": rt, "inflight": k, "mode": mode, "repeat": r,
                                 "elapsed_ms": res["elapsed_ms"], "received": res["received"]})
                    print(f"# repeat {r + 1} {rt} k={k} {mode}: {res['elapsed_ms']} ms", file=sys.stderr)
    med, ratio = {}, {}
    for rt in runtimes:
        for k in inflights:
            key = f"{rt} k={k}"
            med[key] = {m: statistics.median(x["elapsed_ms"] for x in runs
                                             if x["runtime"] == rt and x["inflight"] == k and x["mode"] == m)
                        for m in modes}
            ratio[key] = {m: round(med[key][m] / med[key]["plain"], 3) for m in modes if m != "plain"}
    out = {"scenario": "apps", "baseline": "plain", "repeats": a.repeats, "count": a.count, "warmup": a.warmup,
           "msg_size": a.size, "inflight": inflights, "pinned": a.pin,
           "placement": "client CPU 0 in host a, server CPU 1 in host b" if a.pin else "unpinned",
           "commands": commands, "runs": runs, "median_ms": med, "ratio_run_to_plain": ratio,
           "versions": {"node": apps_version(["node", "--version"]),
                        "java": apps_version(["java", "-version"]),
                        "python": platform.python_version()},
           "env": env(a.lab)}
    print(json.dumps(out, indent=1))


def apps_version(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (p.stdout + p.stderr).strip().splitlines()[0]
    except Exception as e:  # noqa: BLE001 - best effort
        return f"unavailable: {e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", required=True,
                    choices=sorted(scenarios(1, 64)) + ["apps", "tick-to-trade", "tcp-msg-rate", "floor", "churn",
                                                        "service"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--lab", default="nw")
    ap.add_argument("--count", type=int, default=5000, help="apps: datagrams timed per run")
    ap.add_argument("--requests", type=int, default=1000, help="churn: ab requests (and connects) per run")
    ap.add_argument("--nginx4-requests", type=int, default=10000,
                    help="churn: ab requests per run of the nginx 4-workers rows (issue 24)")
    ap.add_argument("--nginx4-warmup", type=int, default=200,
                    help="churn: requests to the nginx 4-workers rows' nginx before each timed run (0: none)")
    ap.add_argument("--rows", choices=["all", "nginx4", "floor", "xskfloor"], default="all",
                    help="churn: all rows, or only the nginx 4-workers rows (issue 24); service: all rows, or "
                         "only the machine's floor (one and four on the service, plain, four one at a time, "
                         "the xsk_floor rows), or only the xsk_floor rows (xskfloor)")
    ap.add_argument("--warmup", type=int, default=1000, help="apps: datagrams echoed before the timing starts")
    ap.add_argument("--inflight", default="1,8", help="apps: datagrams in flight, comma-separated")
    ap.add_argument("--runtimes", default="", help="apps: subset of node,jvm-nio,python-asyncio,c-mt")
    ap.add_argument("--profiles", default="balanced",
                    help="apps: nanowire run profiles to compare with plain; service: the servers' profile (the first)")
    ap.add_argument("--also-preload", action="append", default=[], metavar="LABEL=PATH[,VAR=VALUE...]",
                    help="apps: also run the profiles with another shim: LABEL=PATH[,VAR=VALUE...] "
                         "(empty PATH: this build; VAR=VALUE: extra environment, e.g. s0=,NANOWIRE_SPIN_US=0)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="apps, service: do not pin the clients to CPU 0 and the servers to CPU 1")
    ap.add_argument("--probe", action="store_true",
                    help="ping-pong scenarios (floor, wave3-regress, ...): per repeat, kernel event counts of "
                         "each side and per CPU in a window of the client's run (scripts/modeprobe.py), "
                         "in the JSON under runs[label][i].probe and a line on stderr")
    ap.add_argument("--placement", choices=["any", "near", "far"], default="any",
                    help="ping-pong scenarios: run each repeat of each row only while the host has the two vCPUs "
                         "near (one L3, a cache line crosses in ~50 ns) or far (~245 ns), measured before and "
                         "after the run (modeprobe.placement); any: run at once (the placement is recorded "
                         "either way)")
    ap.add_argument("--placement-wait", type=float, default=120,
                    help="--placement near|far: seconds a run waits for the placement before it runs anyway")
    ap.add_argument("--placement-budget", type=float, default=1800,
                    help="--placement near|far: seconds all the runs of the scenario may wait in all; "
                         "after that they run at once (the placement still recorded)")
    a = ap.parse_args()
    if a.scenario == "apps":
        return apps_main(a)
    subprocess.run([NW, "lab", "up", "--name", a.lab], check=True, stdout=subprocess.DEVNULL)
    # Scenarios with a runner of their own (given the arguments).
    own = {"tick-to-trade": run_t2t, "tcp-msg-rate": run_msg_rate, "churn": run_churn,
           "service": run_service}
    if a.scenario in own:
        print(json.dumps(own[a.scenario](a), indent=1))
        return
    if a.scenario == "floor":
        base, configs = floor_configs(a)
    else:
        base, configs = scenarios(a.seconds, a.size)[a.scenario]
    # Scenarios with a runner of their own over the configurations.
    over = {"issue8-burst": lambda: run_burst(a, configs),
            "issue11-iperf": lambda: iperf_main(a, base, configs),
            "issue21-iperf": lambda: iperf_p4_main(a, base, configs)}
    if a.scenario in over:
        print(json.dumps(over[a.scenario](), indent=1))
        return
    runs = {label: [] for label, *_ in configs}
    for r in range(a.repeats):
        for label, srv, cli, parser in configs:
            try:
                res = placed_run(a, srv, cli, parser)
            except RuntimeError as e:
                # Failed three times (run_client's retries): this repeat of the row has no
                # numbers (None in its pairs), the other rows and repeats go on.
                res = {"failed": str(e)[-300:], "placement": {"mode": None, "before_ns": None, "after_ns": None}}
            runs[label].append(res)
            pl = res["placement"]
            print(f"# repeat {r + 1} {label}: p50={res.get('p50')} p99={res.get('p99')} placement={pl['mode']} "
                  f"(c2c {pl['before_ns']}/{pl['after_ns']} ns)"
                  + (modeprobe.summary(res["probe"]) if a.probe else ""), file=sys.stderr)
    keys = ["min", "p50", "p90", "p99", "p99.9", "max", "avg"]
    med = {label: {k: statistics.median(x[k] for x in rs if x.get(k) is not None)
                   for k in keys if any(x.get(k) is not None for x in rs)} for label, rs in runs.items()}
    ratios = {label: {k: round(m[k] / med[base][k], 3) for k in m if med[base].get(k)} for label, m in med.items()}
    if a.scenario == "floor":
        plain = med.get("sockperf plain", {})
        ratios["floor / sockperf plain"] = {k: round(med[base][k] / plain[k], 3) for k in med[base] if plain.get(k)}
    if a.scenario == "issue11-shim":
        udp = med.get("run xdp udp", {})
        ratios["run xdp tcp / run xdp udp"] = {k: round(med["run xdp tcp"][k] / udp[k], 3)
                                               for k in med["run xdp tcp"] if udp.get(k)}
    out = {"scenario": a.scenario, "baseline": base, "repeats": a.repeats, "seconds": a.seconds, "msg_size": a.size,
           "commands": {label: {"server": " ".join(map(shlex.quote, s)), "client": " ".join(map(shlex.quote, c))}
                        for label, s, c, _ in configs},
           "runs": runs, "median": med, "ratio_to_baseline": ratios,
           "placement": {label: [x["placement"]["mode"] for x in rs] for label, rs in runs.items()},
           "median_by_placement": by_placement(runs), "env": env(a.lab)}
    bp = out["median_by_placement"]
    out["ratio_to_baseline_by_placement"] = {
        label: {m: round(x["p50"] / bp[base][m]["p50"], 3) for m, x in v.items()
                if m in ("near", "far") and m in bp.get(base, {})}
        for label, v in bp.items()}
    old = run_to_old(runs)
    if old:
        out["run_to_old"] = old
        print_run_to_old(old)
    if a.scenario == "shims":
        # A bisect's question per row: row/baseline of the p50 medians with the bootstrap interval,
        # over the repeats in which both ran in the wanted placement (--placement; any: all).
        out["paired_to_baseline"] = paired_to_baseline(runs, base, a.placement)
        for label, r in out["paired_to_baseline"].items():
            print(f"# {r['of']}: {r['ratio']:.3f}x, 95% CI {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f} "
                  f"over {r['repeats']} repeats", file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
