"""Core's inner layers (docs/DESIGN.md §4, issue 33): the import graph of ``core/mqstore`` has no cycle, and
a lower layer never imports a higher one. tests/test_layering.py checks core against the rest of the tree;
this module checks core against itself, with its walk of every import (module level, inside functions,
``importlib.import_module`` with a literal name).

  layer  what                                                   may import
  -----  ------------------------------------------------------ ---------------------------
  0      formats and the pieces every part shares: format,      layer 0
         codec, errors, clock, config, model, metrics, fs,
         limits, the names of topics and system writers...
  1      the log, its queues, the metadata database             layers 0-1
  2      the store: MessageStore and the parts it composes      layers 0-2
  3      features, each using the store: pop, txn, compaction,   anything below, and each other
         index, gateway, replication, auth, follow...           (without a cycle)

A module belongs to the layer of the longest name in ``LAYERS`` that is its name or a package above it;
every module of core must have one (a new top-level module or package is placed here, on purpose).
"""

from __future__ import annotations

import pathlib

from tests.test_layering import CORE, _module_name, imports_of, sources

BASE, LOG, STORE, FEATURE = 0, 1, 2, 3
LAYER_NAMES = {BASE: "base (formats, shared pieces)", LOG: "log/queue/meta", STORE: "store", FEATURE: "features"}

LAYERS = {
    # 0: formats and what every part shares. No I/O of the store's own state here except fs and format.
    "mqstore": BASE,                  # the package's docstring, no import
    "mqstore.format": BASE,           # every on-disk byte layout
    "mqstore.codec": BASE,            # the compiled codec: below format, which checks its layouts
    "mqstore.errors": BASE,
    "mqstore.defaults": BASE,         # every default address, port and size limit
    "mqstore.clock": BASE,
    "mqstore.config": BASE,
    "mqstore.model": BASE,
    "mqstore.metrics": BASE,
    "mqstore.fs": BASE,
    "mqstore.failpoints": BASE,
    "mqstore.javahash": BASE,
    "mqstore.disk_space": BASE,
    "mqstore.waits": BASE,
    "mqstore.limits": BASE,
    "mqstore.background": BASE,       # the base of every background thread (Duty)
    "mqstore.message_keys": BASE,     # key rules every topic kind shares
    "mqstore.filters": BASE,          # tag and SQL92 filters over a record's properties (queue.pull applies them)
    "mqstore.topics": BASE,           # topic and group names, the reserved system topics
    "mqstore.writers": BASE,          # the registry system writers register into (the store asks it)
    "mqstore.access": BASE,           # the access model (users, rules): stored by meta, used by auth
    "mqstore.retention_holds": BASE,  # the followers' holds on the log (the store and compaction keep them)
    "mqstore.profiling": BASE,        # MQSTORE_PROFILE's per-thread profiles, imports nothing of ours
    # 1: the log, its consume queues, the metadata database.
    "mqstore.log": LOG,
    "mqstore.queue": LOG,
    "mqstore.meta": LOG,
    # Replication's modules that the write path uses: the gate every append passes (node: SingleNode, or a
    # replicated node's role with its epochs, in-sync set and settings); the rest of replication (leader,
    # replica, controller, the operations on a store's log: store_ops, log_ops) is a feature.
    "mqstore.replication.node": LOG,
    "mqstore.replication.epochs": LOG,
    "mqstore.replication.isr": LOG,
    "mqstore.replication.config": LOG,
    # 2: the store and the parts it composes.
    "mqstore.store": STORE,
    "mqstore.store_topics": STORE,
    "mqstore.consumer_offsets": STORE,  # consumer offsets: records of the log, a map in memory
    "mqstore.store_space": STORE,
    "mqstore.store_retention": STORE,
    "mqstore.maintenance": STORE,     # the store's maintenance duty
    "mqstore.stream_appends": STORE,  # one AppendStream call's appends and their limit
    # 3: features, each using the store (or its log through the services).
    "mqstore.pop": FEATURE,
    "mqstore.txn": FEATURE,
    "mqstore.compaction": FEATURE,
    "mqstore.index": FEATURE,
    "mqstore.gateway": FEATURE,
    "mqstore.replication": FEATURE,
    "mqstore.auth": FEATURE,
    "mqstore.timer": FEATURE,         # delayed delivery: the timer topic, its files and its delivery
    "mqstore.tier": FEATURE,          # the object storage tier: object stores, the uploads' ledger, the uploader
    "mqstore.follow": FEATURE,        # the Tail follower of the services derived from the log
    "mqstore.tailing": FEATURE,       # Tail streams of the log, read through the store
    "mqstore.hot_reads": FEATURE,     # which reads of the store an event loop may run (the CommitLog port)
    "mqstore.store_offsets": FEATURE,  # CommitOffset, QueryOffset and the SQL offsets' import, through the store
    "mqstore.relayed": FEATURE,       # the gateway's rules as a system writer
    "mqstore.system_writers": FEATURE,  # the composition of every system writer's rules
    # Parts that use the store, composed onto its hooks by mqstore.store_parts (the store imports neither):
    "mqstore.topic_admin": FEATURE,   # CreateTopic, DeleteTopic (its crash-safe steps)...: store.topic_admin
    "mqstore.store_replica": FEATURE,  # the visibility of copied records, promotion: store.replica_view
    "mqstore.store_parts": FEATURE,   # build_store: a MessageStore with those parts composed onto it
}


def core_modules(root: pathlib.Path = CORE) -> dict[str, list[pathlib.Path]]:
    """module -> its source files: a .py, or the compiled codec's .pyx and .pxd (its imports count as any)."""
    modules: dict[str, list[pathlib.Path]] = {}
    for path in sources(root):
        modules.setdefault(_module_name(path, root), []).append(path)
    return modules


def import_graph(root: pathlib.Path = CORE) -> dict[str, dict[str, int]]:
    """module -> {imported module of the same package tree: first line}. An import of a package above the
    importing module is left out (importing a module initialises its packages first, in any case), and so
    is the package of ``from package import submodule``."""
    modules = core_modules(root)

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph = {}
    for module, paths in modules.items():
        by_line: dict[int, set[str]] = {}  # a .pyx and its .pxd: one module, their lines together
        for path in paths:
            for line, name in imports_of(path, root):
                target = resolve(name)
                if target is not None and target != module and not module.startswith(target + "."):
                    by_line.setdefault(line, set()).add(target)
        edges: dict[str, int] = {}
        for line, targets in sorted(by_line.items()):
            # ``from pkg import sub`` names pkg and pkg.sub: the edge is to pkg.sub (which initialises pkg).
            for target in sorted(t for t in targets if not any(o.startswith(t + ".") for o in targets)):
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def package_graph(graph: dict[str, dict[str, int]], depth: int = 2) -> dict[str, dict[str, str]]:
    """The graph between the top-level parts of the tree (mqstore.format, mqstore.store...): a -> {b: where}."""
    def part(name):
        return ".".join(name.split(".")[:depth])
    out: dict[str, dict[str, str]] = {part(m): {} for m in graph}
    for module, edges in graph.items():
        for target, line in edges.items():
            if part(module) != part(target):
                out[part(module)].setdefault(part(target), f"{module}:{line}")
    return out


def cycles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one node (each is at least one cycle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]  # iterative Tarjan: no recursion limit to meet
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def _described(graph: dict, component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{a} -> {b} ({where})" for a in component for b, where in sorted(graph[a].items())
                     if b in members)


def layer_of(module: str) -> int | None:
    """The layer of the longest entry that is ``module`` or a package above it; the top package ("mqstore")
    places only itself, so a new module directly under it is unplaced until it is given a layer."""
    parts = module.split(".")
    while len(parts) > 1 or (parts and module == parts[0]):
        layer = LAYERS.get(".".join(parts))
        if layer is not None:
            return layer
        parts.pop()
    return None


def test_a_module_under_the_top_package_alone_has_no_layer():
    assert layer_of("mqstore") == BASE
    assert layer_of("mqstore.no_such_module") is None
    assert layer_of("mqstore.format.no_such_module") == BASE


def test_every_module_of_core_has_a_layer():
    unplaced = sorted(m for m in core_modules() if layer_of(m) is None)
    assert unplaced == [], f"place these in LAYERS (tests/test_layering_core.py): {unplaced}"


def test_core_has_no_import_cycle_between_modules():
    graph = import_graph()
    assert [_described(graph, c) for c in cycles(graph)] == []


def test_core_has_no_import_cycle_between_its_parts():
    graph = package_graph(import_graph())
    assert [_described(graph, c) for c in cycles(graph)] == []


def test_a_lower_layer_never_imports_a_higher_one():
    upward = []
    for module, edges in import_graph().items():
        for target, line in sorted(edges.items()):
            here, there = layer_of(module), layer_of(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{module}:{line} ({LAYER_NAMES[here]}) imports {target} ({LAYER_NAMES[there]})")
    assert upward == []


def test_the_cycle_finder_sees_a_cycle_through_packages_and_function_imports(tmp_path):
    package = tmp_path / "pkg"
    for sub in ("low", "high"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("def f():\n    from pkg.high import b\n")
    (package / "high" / "b.py").write_text("from pkg.low.a import f\n")
    (package / "high" / "c.py").write_text("import pkg.high\nfrom . import b\n")
    graph = import_graph(package)
    assert graph["pkg.low.a"] == {"pkg.high.b": 2} and graph["pkg.high.c"] == {"pkg.high.b": 2}
    assert cycles(graph) == [["pkg.high.b", "pkg.low.a"]]
    assert cycles(package_graph(graph)) == [["pkg.high", "pkg.low"]]
    assert cycles({"x": {"y": 1}, "y": {"z": 1}, "z": {}}) == []


def test_the_compiled_codec_s_imports_are_in_the_graph():
    """The .pyx and .pxd files of core/mqstore/codec are read as the .py files are: their imports and
    cimports count, so the layer rule covers the compiled codec too."""
    graph = import_graph()
    assert "mqstore.errors" in graph["mqstore.codec._offset_map"]  # _offset_map.pyx: from mqstore.errors import
    assert "mqstore.codec._wire" in graph["mqstore.codec._records"]  # a cimport, of a .pxd
    assert {"mqstore.codec._walk", "mqstore.codec._wire"} <= set(graph["mqstore.codec._replay"])  # over two lines


def test_the_cython_reader_reads_imports_and_cimports_and_skips_docstrings(tmp_path):
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "high").mkdir()
    for init in (package, package / "low", package / "high"):
        (init / "__init__.py").write_text("")
    (package / "high" / "b.py").write_text("")
    (package / "low" / "w.pxd").write_text("cdef inline int f(): return 0\n")
    (package / "low" / "a.pyx").write_text(
        '# cython: language_level=3\n"""Docstring:\nfrom pkg.high import b\n"""\n'
        "from libc.stdint cimport int64_t\nfrom pkg.low.w cimport (f,\n    f as g)\n\n"
        "def h():\n    from pkg.high import b  # inside a function\n    return b\n")
    graph = import_graph(package)
    assert graph["pkg.low.a"] == {"pkg.low.w": 6, "pkg.high.b": 10}
    assert cycles(graph) == [] and "pkg.low.w" in graph
