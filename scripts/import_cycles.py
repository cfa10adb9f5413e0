#!/usr/bin/env python3
"""Import cycles between the modules (files) of each crate of the workspace.

One module per file: crates/X/src/a/b.rs and crates/X/src/a/b/mod.rs are
`crate::a::b`; lib.rs/main.rs are the crate root; examples/, tests/ and
benches/ are their own crates and are not read. An edge A -> B is a
`use crate::..`/`use super::..`/`use self::..` of something B defines, or
a `crate::..`/`super::..` path in A's code naming it. A name a module only
re-exports (`pub use b::Thing`) is followed to the module that defines it,
so a facade module that re-exports its children makes no cycle by itself.
`mod b;` declarations are not edges, nor are the items of a macro_rules!
body (they resolve where the macro is expanded). `#[cfg(test)]` modules
(unit tests, test support) are left out unless --with-tests: a test may
use any module of its crate.

Usage: scripts/import_cycles.py [--crate NAME] [--edges] [ROOT]
Prints each cycle (strongly connected set of modules, and one cycle
through it) per crate; exits 1 when any crate has one, 0 otherwise.
"""

import argparse
import os
import re
import sys

DEF = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+|async\s+|const\s+|extern\s+\"C\"\s+)*"
    r"(?:fn|struct|enum|trait|const|static|type|union|mod|macro_rules!)\s+(?:mut\s+)?(\w+)"
)
MACRO_EXPORT = re.compile(r"^\s*macro_rules!\s+(\w+)")
USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+(.*)$")
PATH = re.compile(r"\b((?:crate|super|self)(?:::\w+)+)")


def strip(line):
    """The code of one line: no // comment, no string literal contents."""
    out, i, n = [], 0, len(line)
    in_str = False
    while i < n:
        c = line[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_str = False
                out.append('"')
            i += 1
            continue
        if c == '"':
            in_str = True
            out.append('"')
        elif line.startswith("//", i):
            break
        else:
            out.append(c)
        i += 1
    return "".join(out)


def code_lines(text):
    """Lines with comments (line and block) and string contents removed."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    # raw strings r"..." / r#"..."# (test programs, Python sources)
    text = re.sub(
        r'r(#*)"(.*?)"\1',
        lambda m: '""' + "\n" * m.group(2).count("\n"),
        text,
        flags=re.S,
    )
    return [strip(line) for line in text.split("\n")]


def modules_of(src):
    """{module path tuple: file} for one crate's src directory."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts == ["lib"] or parts == ["main"]:
                key = ()
            elif parts[-1] == "mod":
                key = tuple(parts[:-1])
            elif len(parts) > 1 and parts[0] == "bin":
                continue
            else:
                key = tuple(parts)
            if key == () and () in mods and parts == ["main"]:
                continue  # a crate with both: the library is the root
            mods[key] = os.path.join(src, rel)
    return mods


def expand_use(body):
    """`a::{b, c::{d, e as f}}` -> [a::b, a::c::d, a::c::e] (no `as`)."""
    body = body.strip().rstrip(";").strip()
    body = re.sub(r"\s+as\s+\w+", "", body)
    body = re.sub(r"\s+", "", body)

    def split_top(s):
        depth, cur, out = 0, "", []
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                out.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            out.append(cur)
        return out

    def go(prefix, s):
        i = s.find("{")
        if i < 0:
            return [prefix + s]
        head = s[:i]
        inner = s[i + 1 : s.rfind("}")]
        res = []
        for part in split_top(inner):
            res.extend(go(prefix + head, part))
        return res

    return [p.rstrip(":") for p in go("", body) if p]


class Crate:
    def __init__(self, name, src, with_tests=False):
        self.name = name
        self.with_tests = with_tests
        self.test_mods = set()  # file modules declared under #[cfg(test)]
        self.mods = modules_of(src)
        self.defs = {m: set() for m in self.mods}
        self.reexports = {m: {} for m in self.mods}  # name -> absolute path
        self.uses = {m: [] for m in self.mods}  # (absolute path, line)
        for m, f in self.mods.items():
            self.read(m, f)
        if not with_tests:
            for t in self.test_mods:
                for k in [k for k in self.mods if k[: len(t)] == t]:
                    del self.mods[k], self.defs[k], self.reexports[k], self.uses[k]

    def absolute(self, m, path, inline_depth):
        parts = path.split("::")
        if parts[0] == "crate":
            return tuple(parts[1:])
        base = list(m)
        if parts[0] == "self":
            return tuple(base + parts[1:])
        # super: inside an inline module (e.g. mod tests) the first `super`
        # is the file's module itself
        i = 0
        depth = inline_depth
        while i < len(parts) and parts[i] == "super":
            if depth > 0:
                depth -= 1
            elif base:
                base.pop()
            i += 1
        return tuple(base + parts[i:])

    def read(self, m, f):
        with open(f, encoding="utf-8", errors="replace") as fh:
            lines = code_lines(fh.read())
        depth = 0
        inline = []  # brace depths where inline modules opened
        macro = None  # brace depth where a macro_rules! body opened
        test_attr = False  # the last attribute line was #[cfg(test)]
        test_skip = None  # brace depth where a #[cfg(test)] module opened
        pending = None
        for no, line in enumerate(lines, 1):
            if macro is None and MACRO_EXPORT.match(line):
                macro = depth
            if macro is not None:
                # a macro's paths resolve where it is expanded, not here
                self.defs[()].add(MACRO_EXPORT.match(line).group(1)) if MACRO_EXPORT.match(line) else None
                depth += line.count("{") - line.count("}")
                if depth <= macro and ("}" in line or ";" in line):
                    macro = None
                continue
            mm = re.match(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{", line)
            if mm:
                inline.append(depth)
                if test_attr and not self.with_tests and test_skip is None:
                    test_skip = depth
            fm = re.match(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", line)
            if fm and test_attr:
                self.test_mods.add(m + (fm.group(1),))
            if line.strip():
                test_attr = bool(re.match(r"^\s*#\[cfg\((?:test|all\(test.*)\)\]", line)) or (
                    test_attr and line.strip().startswith("#[")
                )
            if test_skip is not None:
                depth += line.count("{") - line.count("}")
                while inline and depth <= inline[-1]:
                    inline.pop()
                if depth <= test_skip:
                    test_skip = None
                continue
            d = DEF.match(line)
            if d and not inline:
                self.defs[m].add(d.group(1))
            if pending is not None:
                pending[0] += " " + line
                if ";" in line:
                    self.take_use(m, pending, len(inline))
                    pending = None
            else:
                u = USE.match(line)
                if u:
                    pending = [u.group(2), no, bool(u.group(1))]
                    if ";" in line:
                        self.take_use(m, pending, len(inline))
                        pending = None
                else:
                    for p in PATH.findall(line):
                        self.uses[m].append((self.absolute(m, p, len(inline)), no))
            depth += line.count("{") - line.count("}")
            while inline and depth <= inline[-1]:
                inline.pop()

    def take_use(self, m, pending, inline_depth):
        body, no, public = pending
        for p in expand_use(body.split(";")[0]):
            head = p.split("::")[0]
            if head not in ("crate", "super", "self"):
                # `use child::Thing` inside a module: a child module path
                if head in {k[len(m)] for k in self.mods if len(k) == len(m) + 1 and k[: len(m)] == m}:
                    p = "self::" + p
                else:
                    continue
            a = self.absolute(m, p, inline_depth)
            if public and inline_depth == 0 and a and a[-1] != "*":
                # a re-export: the module's face, not a use of its own
                # (like `mod b;`); a use of it is followed to where it is
                # defined
                self.reexports[m][a[-1]] = a
            else:
                self.uses[m].append((a, no))

    def resolve(self, path, seen=None):
        """The module that defines what `path` names (None: not this crate's)."""
        seen = seen or set()
        if path in seen:
            return None
        seen.add(path)
        path = tuple(x for x in path if x != "*")
        for k in range(len(path), -1, -1):
            prefix = path[:k]
            if prefix in self.mods:
                if k == len(path):
                    return prefix
                name = path[k]
                if name in self.reexports[prefix] and name not in self.defs[prefix]:
                    r = self.resolve(self.reexports[prefix][name], seen)
                    return r if r is not None else prefix
                return prefix
        return None

    def edges(self):
        e = {m: {} for m in self.mods}
        for m, uses in self.uses.items():
            if m not in self.mods:
                continue
            for path, no in uses:
                t = self.resolve(path)
                if t is None or t == m or t not in self.mods:
                    continue
                e[m].setdefault(t, no)
        return e


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def one_cycle(graph, comp):
    inside = set(comp)
    start = sorted(comp)[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in graph[v]:
            if w not in inside:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return [start]


def name(m):
    return "crate::" + "::".join(m) if m else "crate"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--crate", help="only this crate (directory name under crates/)")
    ap.add_argument("--edges", action="store_true", help="print every edge too")
    ap.add_argument(
        "--with-tests",
        action="store_true",
        help="also read #[cfg(test)] modules (unit tests may use any module)",
    )
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    crates = []
    for d in sorted(os.listdir(os.path.join(root, "crates"))):
        if a.crate and d != a.crate:
            continue
        src = os.path.join(root, "crates", d, "src")
        if os.path.isdir(src):
            crates.append((d, src))
    if os.path.isdir(os.path.join(root, "fuzz", "src")) and not a.crate:
        crates.append(("fuzz", os.path.join(root, "fuzz", "src")))
    bad = 0
    total_mods = total_edges = 0
    for d, src in crates:
        c = Crate(d, src, a.with_tests)
        g = c.edges()
        total_mods += len(g)
        total_edges += sum(len(v) for v in g.values())
        if a.edges:
            for m in sorted(g):
                for t, no in sorted(g[m].items()):
                    print(f"{d}: {name(m)} -> {name(t)} ({c.mods[m]}:{no})")
        for comp in sccs(g):
            bad += 1
            cyc = one_cycle(g, comp)
            steps = []
            for x, y in zip(cyc, cyc[1:]):
                steps.append(f"{name(x)} -> {name(y)} ({os.path.relpath(c.mods[x], root)}:{g[x][y]})")
            print(f"{d}: cycle among {len(comp)} modules: {', '.join(name(x) for x in sorted(comp))}")
            for s in steps:
                print(f"    {s}")
    print(
        f"{len(crates)} crates, {total_mods} modules, {total_edges} module edges: "
        + ("no import cycle" if not bad else f"{bad} cycle(s)")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
