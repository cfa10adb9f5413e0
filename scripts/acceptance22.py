#!/usr/bin/env python3
"""Issue 22's countable acceptance, counted (run as root from the checkout's top).

Prints one line a count, with what it was compared to, then how it was counted:

- shim library unit tests: the shim's library crates (`nanowire-shimcore`,
  `nanowire-sockabi`, `nanowire-owner`: the testable core of crates/preload,
  its ABI rules, and its owned lock, which the engine's locks use too)
  built with `cargo test --release --lib --no-run`, each test binary then run
  as `nobody` (`setpriv --reuid 65534 --regid 65534 --clear-groups`); the
  count is the "N passed" of their harnesses (acceptance: >= 25).
- engine unit tests: likewise for the engine's crates, `nanowire-stack` and
  `nanowire-xdp` (acceptance: >= 60); `nanowire-tcp` and `nanowire-wire` (the
  sans-IO TCP and the packet views under it) are printed beside them.
- root tests: every test binary `make test` builds (`cargo test --release
  --workspace --no-run`), asked `--list --ignored`: the tests marked
  `#[ignore = ...]`, which `make test` runs with `--include-ignored`
  (acceptance: >= 40). The source is read too: every `#[ignore]` must say
  "needs root" (an ignore with another reason, or none, is listed).
- import cycles: `scripts/import_cycles.py` (acceptance: none).
- the frame's path in docs/architecture.md ("How a frame flows"): every
  file it names exists (a bare `x.rs` is looked for beside the file named
  before it), and every `Type::function` or `module::function` it names is a
  `fn` (or a field, constant or macro) somewhere in the source.
- repeated places: `duplicates --seconds 120` when the machine has that
  tool (acceptance: <= 60 pairs); skipped otherwise.

Exits 1 when a count misses its bound. The test binaries are built (or
found up to date) with `cargo test --release --no-run`.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
SHIM_LIBS = ["nanowire-shimcore", "nanowire-sockabi", "nanowire-owner"]
ENGINE_LIBS = ["nanowire-stack", "nanowire-xdp"]
UNDER_ENGINE = ["nanowire-tcp", "nanowire-wire"]


def test_binaries(cargo_args):
    """(package name, target name, kind, executable) of each test binary that
    `cargo test --release --no-run ARGS` builds."""
    cmd = ["cargo", "test", "--release", "--locked", "--no-run", "--message-format=json"]
    cmd += cargo_args
    out = subprocess.run(cmd, cwd=TOP, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    bins = []
    for line in out.stdout.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
            pkg = m["package_id"].split("#")[-1].split("@")[0]
            pkg = re.sub(r".*/", "", pkg)
            bins.append((pkg, m["target"]["name"], m["target"]["kind"][0], m["executable"]))
    return bins


def passed_as_nobody(exe):
    """Run one test binary as nobody; (passed, failed, failing output)."""
    r = subprocess.run(
        NOBODY + [exe, "--test-threads=2"],
        cwd=TOP,
        capture_output=True,
        text=True,
        timeout=600,
    )
    m = re.search(r"test result: \w+\. (\d+) passed; (\d+) failed", r.stdout)
    if not m:
        return 0, 1, r.stdout[-2000:] + r.stderr[-2000:]
    p, f = int(m.group(1)), int(m.group(2))
    return p, f, "" if f == 0 and r.returncode == 0 else r.stdout[-3000:]


def unit_tests(pkgs):
    args = ["--lib"] + [a for p in pkgs for a in ("-p", p)]
    per = {}
    for pkg, _, _, exe in test_binaries(args):
        p, f, why = passed_as_nobody(exe)
        per[pkg] = (p, f)
        if f:
            print(f"  {pkg}: {f} failed as nobody:\n{why}")
    return per


def root_tests():
    """Tests marked ignored in every test binary of the workspace."""
    total, per = 0, {}
    for pkg, name, kind, exe in test_binaries(["--workspace"]):
        r = subprocess.run([exe, "--list", "--ignored", "--format", "terse"], cwd=TOP,
                           capture_output=True, text=True)
        n = sum(1 for ln in r.stdout.splitlines() if ln.endswith(": test"))
        if n:
            per[f"{pkg} {kind} {name}"] = n
            total += n
    return total, per


def ignores_in_source():
    """(needs-root ignores, other ignores as 'file:line: text') in the source."""
    root, other = 0, []
    for base in ("crates", "fuzz"):
        for d, _, files in os.walk(os.path.join(TOP, base)):
            if "/target" in d:
                continue
            for fn in files:
                if not fn.endswith(".rs"):
                    continue
                path = os.path.join(d, fn)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for i, ln in enumerate(f, 1):
                        s = ln.strip()
                        if not s.startswith("#[ignore"):
                            continue
                        if s == '#[ignore = "needs root"]':
                            root += 1
                        else:
                            other.append(f"{os.path.relpath(path, TOP)}:{i}: {s}")
    return root, other


def frame_path_names():
    """(files, names, missing) of docs/architecture.md's "How a frame flows"."""
    with open(os.path.join(TOP, "docs/architecture.md"), encoding="utf-8") as f:
        doc = f.read()
    m = re.search(r"^## How a frame flows.*?(?=^## )", doc, re.S | re.M)
    if not m:
        return 0, 0, ["docs/architecture.md has no section \"How a frame flows\""]
    sec = m.group(0)
    src = []
    for base in ("crates", "bpf"):
        for d, _, files in os.walk(os.path.join(TOP, base)):
            for fn in files:
                if fn.endswith((".rs", ".c", ".h")):
                    with open(os.path.join(d, fn), encoding="utf-8", errors="replace") as f:
                        src.append(f.read())
    src = "\n".join(src)
    missing, files, names = [], 0, 0
    here = ""
    for tok in re.findall(r"`([^`]+)`", sec):
        for path in re.findall(r"((?:[\w.-]+/)*[\w-]+\.(?:rs|c))\b", tok):
            files += 1
            if "/" in path and path.split("/")[0] in ("crates", "bpf"):
                full = path
            else:
                cand = [os.path.join(here, path)] if here else []
                cand += [os.path.join("crates/stack/src/xdp", path), os.path.join("crates/preload/src", path)]
                full = next((c for c in cand if os.path.exists(os.path.join(TOP, c))), cand[0])
            if os.path.exists(os.path.join(TOP, full)):
                here = os.path.dirname(full)
            else:
                missing.append(f"file {path}")
        for item in re.findall(r"\b(?:[A-Za-z_]\w*::)+([a-z_][a-z0-9_]*)\b", tok):
            names += 1
            if not re.search(rf"\b(?:fn|macro_rules!)\s+{item}\b|\b{item}\s*:|\b{item}!", src):
                missing.append(f"name {tok}")
    return files, names, missing


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-root-tests", action="store_true",
                    help="do not build/list every workspace test binary")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (the unit tests are run as nobody through setpriv)")
    ok = True

    def bound(name, n, good, want):
        nonlocal ok
        ok &= good
        print(f"{name}: {n} ({'ok' if good else 'SHORT'}: acceptance {want})")

    shim = unit_tests(SHIM_LIBS)
    n = sum(p for p, f in shim.values())
    fails = sum(f for p, f in shim.values())
    bound("shim library unit tests passing as nobody", n, n >= 25 and fails == 0, ">= 25, none failing")
    print("  " + ", ".join(f"{k} {p}" for k, (p, _) in sorted(shim.items())))

    eng = unit_tests(ENGINE_LIBS + UNDER_ENGINE)
    n = sum(eng.get(k, (0, 0))[0] for k in ENGINE_LIBS)
    fails = sum(f for p, f in eng.values())
    bound("engine unit tests passing as nobody", n, n >= 60 and fails == 0, ">= 60, none failing")
    print("  " + ", ".join(f"{k} {eng.get(k, (0, 0))[0]}" for k in ENGINE_LIBS + UNDER_ENGINE)
          + f" (with tcp and wire: {sum(p for p, _ in eng.values())})")

    src_root, other = ignores_in_source()
    if not a.skip_root_tests:
        total, per = root_tests()
        bound("root tests marked ignored, run by make test (--include-ignored)", total,
              total >= 40 and not other, ">= 40, every ignore says why")
        print(f"  {len(per)} test binaries hold them; #[ignore = \"needs root\"] lines in the source: "
              f"{src_root} (a test macro's one line makes several tests)")
    else:
        print(f'#[ignore = "needs root"] lines in the source: {src_root} (binaries not listed)')
    for o in other:
        print(f"  an ignore without the reason: {o}")

    r = subprocess.run([sys.executable, os.path.join(TOP, "scripts/import_cycles.py")], cwd=TOP,
                       capture_output=True, text=True)
    cycles = r.stdout.strip().splitlines()
    bound("import cycles", "none" if r.returncode == 0 else len(cycles), r.returncode == 0, "none")
    if r.returncode:
        print("\n".join("  " + c for c in cycles))

    files, names, missing = frame_path_names()
    bound("names on the frame's path (docs/architecture.md) not in the source", len(missing),
          not missing, f"none; {files} file and {names} function names checked")
    for x in missing:
        print(f"  {x}")

    if shutil.which("duplicates"):
        r = subprocess.run(["duplicates", "--seconds", "120"], cwd=TOP, capture_output=True, text=True)
        first = r.stdout.splitlines()[0] if r.stdout else ""
        m = re.match(r"(\d+) pairs", first)
        n = int(m.group(1)) if m else 0
        bound("pairs of places repeating six or more lines", n, n <= 60, "<= 60")
    else:
        print("pairs of places repeating six or more lines: not counted (no `duplicates` here)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
