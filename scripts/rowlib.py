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
