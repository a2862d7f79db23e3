#!/usr/bin/env python3
"""Prints the import circles among a crate's modules; exits 1 when there is one.

A module is a file under `src/` (`lib.rs` is the crate root, `a/mod.rs` and `a.rs` are `a`,
`a/b.rs` is `a::b`). Module A depends on module B when A's code names a path into B:
`crate::b::…`, `super::…` from a file in a folder, a `use crate::{b, c::…}` group, or, in
`lib.rs`, a path starting with one of the root's modules. Comments and `#[cfg(test)]` modules
are left out: a module's tests may drive the modules above it. A name the crate root
re-exports (`pub use config::Config`) counts as the module it comes from.

Usage: scripts/module-cycles.py [-v] [CRATE_SRC_DIR]   (default: crates/herald-server/src;
-v also prints every module's imports)
"""

import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(src: Path, file: Path) -> str:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return "::".join(parts) or "crate"


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def strip_test_modules(text: str) -> str:
    """Removes every `#[cfg(test)] mod name { … }` block (braces matched)."""
    out, pos = [], 0
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{")
    while (m := pattern.search(text, pos)) is not None:
        out.append(text[pos : m.start()])
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        pos = i
    out.append(text[pos:])
    return "".join(out)


def expand_groups(path: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> [`a::b`, `a::c::d`, `a::c::e`]."""
    if "{" not in path:
        return [path]
    head, rest = path.split("{", 1)
    inner = rest[: rest.rfind("}")]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    return [p for item in items if item.strip() for p in expand_groups(head + item.strip())]


def graph(src: Path) -> dict[str, set[str]]:
    files = sorted(src.rglob("*.rs"))
    modules = {module_of(src, f): f for f in files}
    root_text = strip_comments(modules["crate"].read_text())
    reexports = {
        name: path.split("::")[0]
        for path, name in re.findall(r"pub use (" + IDENT + r"(?:::" + IDENT + r")*)::(" + IDENT + r")\s*;", root_text)
    }

    def resolve(path: list[str]) -> str | None:
        """The longest module `path` names, or the module a root re-export comes from."""
        for n in range(len(path), 0, -1):
            name = "::".join(path[:n])
            if name in modules:
                return name
        return reexports.get(path[0]) if path else None

    edges: dict[str, set[str]] = {m: set() for m in modules if m != "crate"}
    for module, file in modules.items():
        text = strip_test_modules(strip_comments(file.read_text()))
        is_folder_file = file.name == "mod.rs"
        here = module.split("::") if module != "crate" else []
        paths: list[list[str]] = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            for p in expand_groups(re.sub(r"\s+", "", m.group(1))):
                paths.append(p.split("::"))
        for m in re.finditer(r"\b((?:crate|super)(?:::" + IDENT + r")+)", text):
            paths.append(m.group(1).split("::"))
        # A module brought in by `use` (`use crate::cluster::{self, …}`) names paths below it.
        aliases = {p[-2] if p[-1] == "self" else p[-1]: p[:-1] if p[-1] == "self" else p for p in paths if p[0] == "crate"}
        for name, full in aliases.items():
            if resolve(full[1:]) != "::".join(full[1:]):
                continue
            for m in re.finditer(r"(?<![:\w])" + name + r"((?:::" + IDENT + r")+)", text):
                paths.append(full + m.group(1).split("::")[1:])
        for p in paths:
            if p[0] == "crate":
                target = resolve(p[1:])
            elif p[0] == "super":
                # `super` in `a/b.rs` and in `a/mod.rs`'s parent alike: one level up.
                target = resolve(here[:-1] + p[1:])
            elif p[0] == "self":
                target = resolve(here + p[1:])
            elif module == "crate" or is_folder_file:
                # Relative to the root (in lib.rs) or to a folder module (its children).
                target = resolve(here + p)
            else:
                target = None
            if target and target != module and module != "crate" and target != "crate":
                edges[module].add(target)
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; components with more than one module (or a self-loop)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "-v"]
    src = Path(args[0]) if args else Path(__file__).parent.parent / "crates/herald-server/src"
    edges = graph(src)
    if "-v" in sys.argv:
        for m in sorted(edges):
            print(f"{m} -> {', '.join(sorted(edges[m])) or '-'}")
    circles = strongly_connected(edges)
    for c in circles:
        print(f"import circle of {len(c)} modules: {' '.join(c)}")
        for m in c:
            inside = sorted(edges[m] & set(c))
            print(f"  {m} -> {', '.join(inside)}")
    if not circles:
        print(f"no import circle among {len(edges)} modules of {src}")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
