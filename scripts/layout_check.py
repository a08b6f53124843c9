#!/usr/bin/env python3
"""Check the workspace's Rust sources against the house layout rules.

Rules, applied to every *.rs file git knows about (tracked, or untracked and
not ignored), except under target/ or node_modules/:

  1. no file is over 800 lines (counted as `wc -l` does);
  2. no `fn name` item is over 80 lines, from the line of `fn` to the line of
     its closing brace (free fns, methods, nested fns, tests alike);
  3. no import cycle between files of one crate. An edge A -> B is any path in
     A's code that resolves into file B: `use crate::..`, `crate::x::Y`,
     `super::..`, `self::..`, or `child::..` for a module file declared in A.
     A `mod child;` declaration alone is not an edge; `pub use child::X` is.

Usage: scripts/layout_check.py [--summary] [--root DIR]
Exits 1 on any violation. Standard library only.
"""
import argparse
import glob
import os
import posixpath
import re
import subprocess
import sys
from collections import defaultdict, deque

MAX_FILE_LINES = 800
MAX_FN_LINES = 80
SKIP_DIRS = {"target", "node_modules"}


def git_files(root, *patterns):
    """Existing files git tracks or would track (untracked, not ignored)."""
    found = set()
    for extra in ([], ["--others", "--exclude-standard"]):
        out = subprocess.run(["git", "ls-files", "-z", *extra, "--", *patterns], cwd=root,
                             check=True, capture_output=True, text=True).stdout
        found.update(p for p in out.split("\0") if p)
    return sorted(p for p in found if not SKIP_DIRS.intersection(p.split("/"))
                  and os.path.isfile(os.path.join(root, p)))


# ---------------------------------------------------------------- tokenizer

def _skip_block_comment(src, i):
    """Index just past the (possibly nested) block comment opening at i."""
    depth, n = 0, len(src)
    while i < n:
        if src.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif src.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return n


def _string_end(src, i):
    """Index just past the "..." string whose opening quote is at i."""
    j, n = i + 1, len(src)
    while j < n and src[j] != '"':
        j += 2 if src[j] == "\\" else 1
    return min(j + 1, n)


def _ident_end(src, i):
    """Index just past the identifier starting at i."""
    while i < len(src) and (src[i].isalnum() or src[i] == "_"):
        i += 1
    return i


def tokenize(src):
    """Split Rust source into (kind, text, line) tokens, dropping comments.

    kinds: id (identifier/keyword), str (string, text = contents), char,
    life (lifetime or label), num, p (punctuation; `::` `->` `=>` are one token).
    """
    toks, i, n, line = [], 0, len(src), 1
    while i < n:
        c, start = src[i], i
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            eol = src.find("\n", i)
            i = n if eol < 0 else eol
        elif src.startswith("/*", i):
            i = _skip_block_comment(src, i)
        elif c == '"':
            i = _string_end(src, i)
            toks.append(("str", src[start + 1:i - 1], line))
        elif c == "'":
            if src[i + 1:i + 2] == "\\":                      # '\n' '\'' '\u{7b}'
                i = src.find("'", i + 3) + 1 or n
                toks.append(("char", src[start:i], line))
            elif src[i + 2:i + 3] == "'":                     # '{' '"' 'a'
                i += 3
                toks.append(("char", src[start:i], line))
            else:                                             # 'a 'static 'outer:
                i = _ident_end(src, i + 1)
                toks.append(("life", src[start:i], line) if i > start + 1 else ("p", "'", line))
                i = max(i, start + 1)
        elif c.isalpha() or c == "_":
            i = _ident_end(src, i)
            word = src[start:i]
            if word in ("r", "br", "cr") and src[i:i + 1] in ('"', "#"):
                k = i
                while src[k:k + 1] == "#":
                    k += 1
                if src[k:k + 1] == '"':                       # raw string r#"..."#
                    close = '"' + "#" * (k - i)
                    end = src.find(close, k + 1)
                    i = n if end < 0 else end + len(close)
                    toks.append(("str", src[k + 1:i - len(close)], line))
                elif word == "r" and k == i + 1 and _ident_end(src, k) > k:   # r#ident
                    i = _ident_end(src, k)
                    toks.append(("id", src[k:i], line))
                else:
                    toks.append(("id", word, line))
            elif word in ("b", "c") and src[i:i + 1] == '"' or word == "b" and src[i:i + 1] == "'":
                pass                                          # prefix; literal is next
            else:
                toks.append(("id", word, line))
        elif c.isdigit():
            while i < n and (src[i].isalnum() or src[i] == "_"
                             or src[i] == "." and src[i + 1:i + 2].isdigit()):
                i += 1
            toks.append(("num", src[start:i], line))
        else:
            two = src[i:i + 2]
            i += 2 if two in ("::", "->", "=>") else 1
            toks.append(("p", src[start:i], line))
        line += src.count("\n", start, i)
    return toks


def match_braces(toks):
    """Map the index of every `{` token to the index of its matching `}`."""
    match, stack = {}, []
    for i, (kind, text, _) in enumerate(toks):
        if kind == "p" and text == "{":
            stack.append(i)
        elif kind == "p" and text == "}" and stack:
            match[stack.pop()] = i
    return match


def is_p(tok, text):
    """True if tok is the punctuation token `text`."""
    return tok[0] == "p" and tok[1] == text


# ---------------------------------------------------------------- rule 2

def functions(toks, match):
    """Yield (name, first_line, last_line) for every `fn name` with a body."""
    for i, tok in enumerate(toks[:-1]):
        if tok[:2] != ("id", "fn") or toks[i + 1][0] != "id":
            continue                                   # not `fn name` (e.g. `fn(u8)`)
        j, depth = i + 2, 0                            # depth of ( [ < in the signature
        while j < len(toks):
            kind, text, _ = toks[j]
            if kind == "p" and text == "{":
                if depth == 0:                         # the body
                    if j in match:
                        yield toks[i + 1][1], tok[2], toks[match[j]][2]
                    break
                j = match.get(j, j)                    # e.g. a const block in generics
            elif kind == "p" and text in "([<":
                depth += 1
            elif kind == "p" and text in ")]>":
                depth = max(depth - 1, 0)
            elif kind == "p" and text == ";" and depth == 0:
                break                                  # declaration without a body
            j += 1


# ---------------------------------------------------------------- rule 3

def scopes(toks, match):
    """For each token index, the tuple of inline `mod name { .. }` names enclosing it."""
    spans = [(i + 2, match[i + 2], toks[i + 1][1]) for i in range(len(toks) - 2)
             if toks[i][:2] == ("id", "mod") and toks[i + 1][0] == "id" and i + 2 in match]
    return [tuple(name for o, c, name in spans if o < i < c) for i in range(len(toks))]


def declared_mods(toks, match):
    """Yield (inline_scope, name, path_attr) for every file module `mod name;`."""
    where, pending = scopes(toks, match), None
    for i, tok in enumerate(toks):
        if tok[:2] == ("id", "path") and i >= 2 and is_p(toks[i - 1], "[") \
                and i + 2 < len(toks) and toks[i + 2][0] == "str":
            pending = toks[i + 2][1]
        if tok[:2] == ("id", "mod") and i + 2 < len(toks) and toks[i + 1][0] == "id" \
                and is_p(toks[i + 2], ";"):
            yield where[i], toks[i + 1][1], pending
        if tok[0] == "p" and tok[1] in ";{}":
            pending = None                             # #[path] applies to the next item only


def parse_use(toks, i, prefix=()):
    """Parse the use tree at toks[i]; return (end_index, [(segments, line)])."""
    segs, out, n = list(prefix), [], len(toks)
    if i < n and is_p(toks[i], "::"):
        segs, i = ["::"], i + 1                        # ::extern_crate path
    while i < n:
        kind, text, line = toks[i]
        if kind == "id":
            if text != "self" or not segs:
                segs.append(text)
            i += 1
            if i < n and is_p(toks[i], "::"):
                i += 1
                continue
            if i < n and toks[i][:2] == ("id", "as"):
                i += 2
            return i, out + [(segs, line)]
        if is_p(toks[i], "*"):
            return i + 1, out + [(segs, line)]
        if is_p(toks[i], "{"):
            i += 1
            while i < n and not is_p(toks[i], "}") and not is_p(toks[i], ";"):
                i, got = parse_use(toks, i, segs)
                out += got
                if i < n and is_p(toks[i], ","):
                    i += 1
            return i + 1, out
        return i + 1, out                              # `$crate`, macro fragments ...
    return i, out


def resolve(segs, here, modmap):
    """File a module path used in module `here` refers to, or None if not local."""
    head, rest = segs[0], list(segs[1:])
    if head == "crate":
        base = ()
    elif head == "self":
        base = here
    elif head == "super":
        base = here[:-1]
    elif here + (head,) in modmap:                    # `child::x` of a declared module
        base, rest = here, list(segs)
    else:
        return None
    while rest and rest[0] in ("super", "self"):
        base = base[:-1] if rest.pop(0) == "super" else base
    full = base + tuple(rest)
    for k in range(len(full), -1, -1):
        if full[:k] in modmap:
            return modmap[full[:k]]
    return None


def references(toks, match, module, modmap):
    """Yield (target_file, line) for every local module path in the file."""
    where, i, n = scopes(toks, match), 0, len(toks)
    while i < n:
        kind, text, _ = toks[i]
        prev = toks[i - 1] if i else ("p", "", 0)
        here = module + where[i]
        if (kind, text) == ("id", "use") and not is_p(prev, "$"):
            i, paths = parse_use(toks, i + 1)
            for segs, line in paths:
                target = segs[0] != "::" and resolve(segs, here, modmap)
                if target:
                    yield target, line
            continue
        if kind == "id" and i + 2 < n and is_p(toks[i + 1], "::") and toks[i + 2][0] == "id" \
                and not (prev[0] == "p" and prev[1] in ("::", "$", ".")) \
                and not (prev[:2] == ("id", "in") and i >= 2 and is_p(toks[i - 2], "(")):
            segs, j = [text], i + 1
            while j + 1 < n and is_p(toks[j], "::") and toks[j + 1][0] == "id":
                segs.append(toks[j + 1][1])
                j += 2
            target = resolve(segs, here, modmap)
            if target:
                yield target, toks[j - 1][2]
            i = j
            continue
        i += 1


def crate_roots(root, rs_files):
    """Root files of every crate target (lib, bins, tests, benches, examples, build)."""
    have, roots = set(rs_files), set()
    for manifest in git_files(root, "Cargo.toml", "*/Cargo.toml"):
        text = open(os.path.join(root, manifest), encoding="utf-8", errors="replace").read()
        if not re.search(r"^\[package\]", text, re.M):
            continue                                   # a virtual workspace manifest
        d = posixpath.dirname(manifest)
        section = ""
        for line in text.splitlines():
            head = re.match(r"^\s*\[\[?([\w.\-]+)\]\]?", line)
            section = head.group(1) if head else section
            m = re.match(r'^\s*(path|build)\s*=\s*"([^"]+)"', line)
            if m and (section in ("lib", "bin", "test", "bench", "example")
                      or section == "package" and m.group(1) == "build"):
                roots.add(posixpath.normpath(posixpath.join(d, m.group(2))))
        for pattern in ("src/lib.rs", "src/main.rs", "build.rs", "src/bin/*.rs", "src/bin/*/main.rs",
                        "tests/*.rs", "tests/*/main.rs", "benches/*.rs", "examples/*.rs"):
            for hit in glob.glob(os.path.join(root, d, pattern)):
                roots.add(posixpath.normpath(os.path.relpath(hit, root).replace(os.sep, "/")))
    return sorted(r for r in roots if r in have)


def module_map(crate_root, have, tokens_of):
    """Map module paths (tuples) to files, following `mod x;` from crate_root."""
    modmap, todo = {(): crate_root}, [(crate_root, ())]
    while todo:
        f, module = todo.pop()
        toks = tokens_of(f)
        own_dir = f == crate_root or posixpath.basename(f) == "mod.rs"
        base = posixpath.dirname(f) if own_dir else posixpath.splitext(f)[0]
        for scope, name, path_attr in declared_mods(toks, match_braces(toks)):
            d = posixpath.join(base, *scope)
            options = [posixpath.normpath(posixpath.join(posixpath.dirname(f), *scope, path_attr))] \
                if path_attr else [posixpath.join(d, name + ".rs"), posixpath.join(d, name, "mod.rs")]
            child = next((o for o in options if o in have), None)
            key = module + scope + (name,)
            if child and key not in modmap:
                modmap[key] = child
                todo.append((child, key))
    return modmap


def strongly_connected(nodes, edges):
    """Tarjan's algorithm: list of SCCs (sorted lists) with more than one node."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
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
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(start, comp, edges):
    """Shortest path start -> ... -> start inside comp, as a list of files."""
    prev, queue = {}, deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges.get(v, ())):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w in comp and w not in prev:
                prev[w] = v
                queue.append(w)
    return [start]


# ---------------------------------------------------------------- driver

def import_cycles(root, files, tokens_of):
    """[(crate_root, files, shortest_cycle, {(a, b): [lines]})] for every cycle."""
    have, cycles, seen, in_crate = set(files), [], set(), set()
    for crate_root in crate_roots(root, files):
        modmap = module_map(crate_root, have, tokens_of)
        in_crate.update(modmap.values())
        edges, examples = defaultdict(set), defaultdict(list)
        for module, f in modmap.items():
            toks = tokens_of(f)
            for target, line in references(toks, match_braces(toks), module, modmap):
                if target != f:
                    edges[f].add(target)
                    examples[f, target].append(line)
        for comp in strongly_connected(set(modmap.values()), edges):
            if tuple(comp) not in seen:
                seen.add(tuple(comp))
                inner = sorted((a, b) for a in comp for b in edges[a] if b in comp)
                cycles.append((crate_root, comp, shortest_cycle(comp[0], set(comp), edges),
                               {e: sorted(set(examples[e])) for e in inner}))
    return cycles, sorted(have - in_crate)


def report(raw, long_files, long_fns, cycles, orphans):
    """Print every violation, one per line (cycles with their edges indented)."""
    def quote(f, line):
        text = raw[f].decode("utf-8", errors="replace").split("\n")[line - 1].strip()
        return f"line {line}: {text[:100]}"

    for f, n in sorted(long_files, key=lambda x: -x[1]):
        print(f"too long: {f} ({n} lines > {MAX_FILE_LINES})")
    for f, line, name, n in sorted(long_fns, key=lambda x: -x[3]):
        print(f"function too long: {f}:{line} fn {name} ({n} lines > {MAX_FN_LINES})")
    for crate_root, comp, path, inner in cycles:
        hops = [f"{b} ({quote(a, inner[a, b][0])})" for a, b in zip(path, path[1:])]
        print("import cycle: " + " -> ".join([path[0]] + hops))
        print(f"  crate {crate_root}: {len(comp)} files in the cycle; every edge among them:")
        for (a, b), lines in inner.items():
            more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
            print(f"    {a} -> {b} ({quote(a, lines[0])}){more}")
    if orphans:
        print(f"note: not in any crate's module tree (rule 3 skipped): {', '.join(orphans)}")
    print("note: references between crates are out of scope (rule 3 is per crate)")


def main():
    """Run the three rules, print violations, exit 1 if there are any."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", action="store_true", help="print only counts per rule")
    ap.add_argument("--root", help="repository root (default: git toplevel of the cwd)")
    args = ap.parse_args()
    root = args.root or subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                                       capture_output=True, text=True).stdout.strip()
    files = git_files(root, "*.rs")
    raw, cache = {}, {}
    for f in files:
        with open(os.path.join(root, f), "rb") as fh:
            raw[f] = fh.read()

    def tokens_of(f):
        if f not in cache:
            cache[f] = tokenize(raw[f].decode("utf-8", errors="replace"))
        return cache[f]

    long_files = [(f, raw[f].count(b"\n")) for f in files if raw[f].count(b"\n") > MAX_FILE_LINES]
    long_fns, n_fns = [], 0
    for f in files:
        for name, first, last in functions(tokens_of(f), match_braces(tokens_of(f))):
            n_fns += 1
            if last - first + 1 > MAX_FN_LINES:
                long_fns.append((f, first, name, last - first + 1))
    cycles, orphans = import_cycles(root, files, tokens_of)
    if args.summary:
        print(f"files over {MAX_FILE_LINES} lines: {len(long_files)}")
        print(f"functions over {MAX_FN_LINES} lines: {len(long_fns)}")
        print(f"import cycles: {len(cycles)} ({sum(len(c[1]) for c in cycles)} files)")
    else:
        report(raw, long_files, long_fns, cycles, orphans)
    failed = long_files or long_fns or cycles
    print(f"layout: {'FAILED' if failed else 'ok'} ({len(files)} files, {n_fns} functions)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
