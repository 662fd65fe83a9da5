"""Count import cycles and cross-service imports over the project's module graph.

    python -m scripts.import_graph            counts (cycles, cross-service edges, files over 500 lines)
    python -m scripts.import_graph --list     also list each cycle and each cross-service edge

A cycle is a strongly connected component of more than one module in the graph of every import
(including those under TYPE_CHECKING and inside functions), as grimp builds it for import-linter;
a package cycle is one in the graph of packages (each service, services.cli/up, shared, fleetpulse).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grimp

ROOTS = ("shared", "services", "fleetpulse")
ROOT = Path(__file__).resolve().parent.parent


def _sccs(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the strongly connected components with more than one node."""
    modules = sorted(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in modules:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _component(module: str) -> str:
    """The unit a module belongs to: services.<name>, services.cli/up, shared, fleetpulse."""
    parts = module.split(".")
    if parts[0] == "services" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _long_files(limit: int = 500) -> list[tuple[int, str]]:
    out = []
    for root in ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            n = sum(1 for _ in path.open(encoding="utf-8"))
            if n > limit:
                out.append((n, str(path.relative_to(ROOT))))
    return sorted(out, reverse=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list each cycle and cross-service edge")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(*ROOTS, cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = _sccs(edges)
    # a cycle between packages: components (services.x, shared, ...) that import each other
    comp_graph: dict[str, set[str]] = {}
    cross: list[tuple[str, str]] = []
    for m in graph.modules:
        for dep in graph.find_modules_directly_imported_by(m):
            a, b = _component(m), _component(dep)
            if a != b:
                comp_graph.setdefault(a, set()).add(b)
                if a.startswith("services.") and b.startswith("services."):
                    cross.append((m, dep))
    for a in list(comp_graph):
        for b in comp_graph[a]:
            comp_graph.setdefault(b, set())
    package_cycles = _sccs(comp_graph)
    long_files = _long_files()
    print(f"module cycles (strongly connected sets): {len(cycles)}")
    print(f"modules on a cycle: {sum(len(c) for c in cycles)}")
    print(
        f"package cycles (services.<name>, services.cli/up, shared, fleetpulse): {len(package_cycles)}"
    )
    entry = ("services.cli", "services.up", "services.up_args")
    between = [(a, b) for a, b in cross if _component(a) not in entry]
    print(f"service-to-service imports (edges): {len(cross)}")
    print(f"  of them not from the entry points (cli, up): {len(between)}")
    print(f"files over 500 lines: {len(long_files)}")
    if args.list:
        for c in cycles:
            print(f"  cycle of {len(c)}: {' '.join(c)}")
        for c in package_cycles:
            print(f"  package cycle of {len(c)}: {' '.join(c)}")
        for a, b in sorted(between):
            print(f"  {a} -> {b}")
        for n, p in long_files:
            print(f"  {n:5d} {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
