"""Helpers shared by the interleaved plain / run / before benchmarks of one program (first_socket_bench,
fork_udp_bench, subprocess_bench, range_check_bench): the program's argv in each row, the engine
service started afresh for a row, the rows in rotating order per repeat, the environment block."""

import os, platform, subprocess, sys, time

NW = os.environ.get("NANOWIRE", os.path.join(os.path.dirname(__file__), "..", "target", "release", "nanowire"))
ROWS = ["plain", "run", "before"]


def in_b(argv):
    """`argv` in host b of the default lab."""
    return ["ip", "netns", "exec", "nw-b"] + argv


def row_argv(row, prog, a):
    """`prog` as row `row` runs it: plainly; under this tree's `nanowire run`; or under the other build's
    (`a.before`: its shim, `a.before_bin`: its binary, if given). On the engine service when
    `a.engine == "service"` (an `a` without `engine` means an engine of the process's own)."""
    if row == "plain":
        return prog
    nw = a.before_bin if row == "before" and a.before_bin else NW
    env = ["env"] + (["NANOWIRE_SERVICE=1"] if getattr(a, "engine", "own") == "service" else [])
    if row == "before":
        env.append(f"NANOWIRE_PRELOAD={a.before}")
    return env + [nw, "run", "-o", "log=warn", "--"] + prog


def fresh_service(row, argv, a):
    """On the engine service, before a row's timed runs: every `nanowire engine serve` of the host is
    killed and the row's service starts with a first process (`argv`, in host b), not timed."""
    if getattr(a, "engine", "own") == "service" and row != "plain":
        subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        subprocess.run(in_b(argv), capture_output=True, timeout=60)


def start_listening(row, argv, a):
    """Start the server `argv` in host b for row `row` (on the engine service, a fresh one: every
    `nanowire engine serve` of the host is killed first) and wait for its "listening" line: the
    process (its stdout and stderr piped)."""
    if getattr(a, "engine", "own") == "service" and row != "plain":
        subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    srv = subprocess.Popen(in_b(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if srv.stdout.readline().strip() != "listening":
        raise RuntimeError(f"{row}: server: {srv.stderr.read()[-500:]}")
    return srv


def output_of(argv, row, timeout=120):
    """The stdout of `argv` in host b (row `row` in the error if it fails)."""
    out = subprocess.run(in_b(argv), capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{row}: {out.stderr[-500:]}")
    return out.stdout


def interleave(repeats, one):
    """`one(row)` for each row, in a rotating order per repeat (after the default lab is up): every
    row's results, said on stderr as they come."""
    subprocess.run([NW, "lab", "up"], check=True, stdout=subprocess.DEVNULL)
    runs = {r: [] for r in ROWS}
    for k in range(repeats):
        for row in ROWS[k % 3:] + ROWS[:k % 3]:
            runs[row].append(one(row))
            print(f"repeat {k} {row} {runs[row][-1]}", file=sys.stderr, flush=True)
    return runs


def env_of(a, **more):
    """The environment block of a benchmark's JSON."""
    return {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "nanowire": os.path.realpath(NW), "before": a.before, "before_bin": a.before_bin,
            "date": time.strftime("%F %T"), **more}


def parser(doc, engine="service"):
    """The argument parser of a row benchmark: `--before`, `--before-bin`, `--repeats`, and `--engine`
    (default `engine`; None: the benchmark has no such choice)."""
    import argparse
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the other build's shim (libnanowire_preload.so)")
    p.add_argument("--before-bin", help="the other build's nanowire binary; default: this tree's")
    if engine:
        p.add_argument("--engine", choices=["service", "own"], default=engine)
    p.add_argument("--repeats", type=int, default=5)
    return p


def ratios(med, key=None):
    """run/plain and run/before of the rows' medians `med` (of `med[row][key]` when `key` is given)."""
    v = {r: (m[key] if key else m) for r, m in med.items()}
    return {"run/plain": round(v["run"] / v["plain"], 3), "run/before": round(v["run"] / v["before"], 3)}


def sockperf_p50(argv, row):
    """Run the sockperf client `argv` (in whatever namespace it names): its p50 round trip, µs."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    p50 = [x for x in out.stdout.splitlines() if "percentile 50.000" in x]
    if out.returncode != 0 or not p50:
        raise RuntimeError(f"{row}: client: {out.stdout[-500:]} {out.stderr[-500:]}")
    return float(p50[0].split("=")[-1])


def build_c(src, name):
    """The C program `src` built with `cc -O2` into a new temporary directory others may read: its path."""
    import tempfile
    d = tempfile.mkdtemp(prefix=f"nw-{name}-")
    os.chmod(d, 0o755)
    with open(os.path.join(d, f"{name}.c"), "w") as f:
        f.write(src)
    exe = os.path.join(d, name)
    subprocess.run(["cc", "-O2", "-o", exe, os.path.join(d, f"{name}.c")], check=True)
    return exe


def report(a, one, name, env=None, median=None, **extra):
    """Run `one(row)` interleaved (`a.repeats`) and print the JSON: the environment (`env_of(a, **env)`),
    `extra`, every repeat's value under `name`, their medians under `median` (default `median_<name>`),
    and the ratios."""
    import json, statistics
    runs = interleave(a.repeats, one)
    med = {r: statistics.median(v) for r, v in runs.items()}
    print(json.dumps({"env": env_of(a, **(env or {})), **extra, "repeats": a.repeats, name: runs,
                      median or f"median_{name}": med, "ratios": ratios(med)}, indent=1))
