"""The measures of issue 33 ("one shape for the house") at a tree: ``python scripts/shape_measures.py [--root DIR]
[--json]``. Run from the repository (the root defaults to it); ``--root`` measures another checkout (``git
archive REV | tar -x -C DIR``), so that a closing note's before and after figures come from the same script.

  measure                      how it is counted
  ---------------------------  ------------------------------------------------------------------------------
  largest class, module        lines of the longest ``class`` statement and of the longest .py file under
                               core/ and services/ (generated stubs, ``gen/``, left out)
  store's face                 public methods (and properties) of ``MessageStore`` (core/mqstore/store.py),
                               those made by ``waits.blocking_version`` included
  import cycles in core        strongly connected components of core's import graph, between modules and
                               between its parts (tests/test_layering_core.py's walk: every import, module
                               level, inside functions and importlib's with a literal name, and the compiled
                               codec's .pyx and .pxd imports and cimports)
  services importing services  imports, by any package but the launcher (the composition root above them),
                               of a service package other than its own
  sync/async pairs             functions of one scope (a module, a class, a function) whose names are the same
                               but for an ``async`` part (``append``/``append_async``, ``_unary``/
                               ``_async_unary``): one operation written twice, or an adapter pair around one.
                               Not counted, listed as *one version, run on a thread*: a coroutine function
                               whose synchronous twin is made by ``waits.blocking_version(...)`` or is only
                               ``return waits.blocking(<twin>(<names>))`` (or ``blocking_iter``: an async
                               generator's steps; mqstore.waits: the rule is written
                               once, the thread's version holds nothing of its own). Pairs that stay are
                               listed with their reason (STAYING, bench/README.md)
  interceptor implementations  per server interceptor (mqstore_rpc.errors, .metrics, .auth): 1, or 2 when one
                               of its sync/async pairs holds its rule itself (one of RULE_MARKS: a status
                               mapped, a log event, a figure labelled or observed, a refusal), not only calls
                               to it: the rule was written twice, once for each kind of handler

The pairs and the rule-holding pairs are listed, so a reader can judge each.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent

# What shows that a function holds an interceptor's rule rather than calling it (source text of the function).
RULE_MARKS = {
    "errors": (r"\bstatus_for\(", r"\blog\.\w+\(", r"set_trailing_metadata\(", r"StatusCode\."),
    "metrics": (r"StatusCode\.", r"\.observe\(", r"\.labels\(", r"CancelledError"),
    "auth": (r"\._deny\(", r"\blog\.\w+\(", r"\braise\b", r"parse_credentials\(", r"\.deferred\b",
             r"\._authority\.\w+\("),
}
# The pairs that stay (issue 33: every port is one grpc.aio server now, bench/README.md's "One concurrency model";
# what is left is not a second kind of port): each reason is printed beside its pair.
STAYING = {
    ("services/common/mqstore_rpc/commitlog_client.py", "CommitLogClient", "internal_append_batches"):
        "one transport each: a synchronous channel for the gateway's coalescing thread, a grpc.aio channel "
        "for a caller on a loop (Cluster mode's Transaction port)",
    ("services/common/mqstore_rpc/commitlog_client.py", "CommitLogClient", "close"):
        "one transport each: the synchronous channels, and the grpc.aio channels closed on their loop",
}
INTERCEPTORS = {name: f"services/common/mqstore_rpc/{name}.py" for name in RULE_MARKS}
SKIPPED_DIRS = {"gen", "__pycache__"}


def python_files(root: pathlib.Path) -> list[pathlib.Path]:
    files = []
    for top in ("core", "services"):
        for path in sorted((root / top).rglob("*.py")):
            if not SKIPPED_DIRS & set(path.relative_to(root).parts):
                files.append(path)
    return files


def largest(root: pathlib.Path) -> dict:
    best_module, best_class = ("", 0), ("", 0)
    for path in python_files(root):
        text = path.read_text()
        lines = len(text.splitlines())
        name = str(path.relative_to(root))
        if lines > best_module[1]:
            best_module = (name, lines)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > best_class[1]:
                    best_class = (f"{name}:{node.name}", size)
    return {"largest_module": {"where": best_module[0], "lines": best_module[1]},
            "largest_class": {"where": best_class[0], "lines": best_class[1]}}


def store_face(root: pathlib.Path) -> dict:
    tree = ast.parse((root / "core/mqstore/store.py").read_text())
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MessageStore")
    methods, properties = [], []
    for node in store.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            decorators = {ast.unparse(d) for d in node.decorator_list}
            if "property" in decorators or any(d.endswith(".setter") for d in decorators):
                if node.name not in properties:
                    properties.append(node.name)
            else:
                methods.append(node.name)
    methods += [name for name in _made_blocking(store.body) if not name.startswith("_")]  # made methods count too
    return {"public_methods": len(methods), "properties": len(properties), "methods": methods,
            "property_names": properties}


def _layering(root: pathlib.Path):
    """tests/test_layering(_core)'s walk of imports, imported from this checkout (its rules, one copy)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests import test_layering, test_layering_core
    return test_layering, test_layering_core


def core_cycles(root: pathlib.Path) -> dict:
    _, core = _layering(root)
    graph = core.import_graph(root / "core" / "mqstore")
    between_modules = core.cycles(graph)
    between_parts = core.cycles(core.package_graph(graph))
    return {"between_modules": len(between_modules), "between_parts": len(between_parts),
            "cycles": between_modules + between_parts}


def service_imports(root: pathlib.Path) -> dict:
    layering, _ = _layering(root)
    services_dir = root / "services"
    packages = {init.parent.name: init.parent for init in sorted(services_dir.glob("*/*/__init__.py"))}
    shared = {"mqstore_rpc", "mqstore_cli", "mqstore_launcher"}
    services = {name for name in packages if name not in shared}
    found = []
    for name, package in packages.items():
        if name == "mqstore_launcher":
            continue
        for path in sorted(package.rglob("*.py")):
            for line, module in layering.imports_of(path, package):
                top = module.split(".")[0]
                if top in services and top != name:
                    found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return {"count": len(found), "imports": sorted(set(found))}


def _scopes(tree: ast.AST):
    """(scope name, its direct function definitions) for the module, each class and each function."""
    def functions(body):
        return [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    yield "", functions(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, functions(node.body)


def _without_async(name: str) -> str | None:
    """The name with its ``async`` part taken out, None when it has none."""
    parts = name.split("_")
    if "async" not in parts:
        return None
    kept = [p for p in parts if p != "async"]
    return "_".join(kept).replace("__", "_").rstrip("_") or None


def _runs_twin_blocking(function: ast.FunctionDef | ast.AsyncFunctionDef, twin: str) -> bool:
    """Whether ``function``'s body (its docstring aside) is only ``return waits.blocking(<..>.twin(<names>))``
    (or ``waits.blocking_iter``: an async generator's steps)."""
    body = function.body[1:] if (function.body and isinstance(function.body[0], ast.Expr)
                                 and isinstance(function.body[0].value, ast.Constant)) else function.body
    if isinstance(function, ast.AsyncFunctionDef) or len(body) != 1 or not isinstance(body[0], ast.Return):
        return False
    outer = body[0].value
    if not (isinstance(outer, ast.Call) and ast.unparse(outer.func) in ("waits.blocking", "blocking",
                                                                        "waits.blocking_iter", "blocking_iter")
            and len(outer.args) == 1 and not outer.keywords and isinstance(outer.args[0], ast.Call)):
        return False
    inner = outer.args[0]
    name = inner.func.attr if isinstance(inner.func, ast.Attribute) else getattr(inner.func, "id", None)
    plain = (ast.Name, ast.Attribute, ast.Constant)
    return name == twin and all(isinstance(a, plain) for a in [*inner.args, *(k.value for k in inner.keywords)])


def _made_blocking(body) -> dict[str, str]:
    """{name: the coroutine function it runs} of ``name = waits.blocking_version(function)`` in ``body``."""
    made = {}
    for node in body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) in ("waits.blocking_version", "blocking_version")):
            made[node.targets[0].id] = ast.unparse(node.value.args[0])
    return made


def async_pairs(root: pathlib.Path) -> list[dict]:
    """Every pair, each with ``one_version`` True when the thread's version only runs the coroutine's."""
    pairs = []
    for path in python_files(root):
        text = path.read_text()
        tree = ast.parse(text)
        for scope, functions in _scopes(tree):
            by_name = {f.name: f for f in functions}
            for name, function in by_name.items():
                base = _without_async(name)
                if base is None:
                    continue
                twin = by_name.get(base) or by_name.get(base.lstrip("_")) or by_name.get("_" + base.lstrip("_"))
                if twin is not None:
                    relative = str(path.relative_to(root))
                    pairs.append({"file": relative, "scope": scope, "sync": twin.name,
                                  "async": name, "sync_source": ast.get_source_segment(text, twin) or "",
                                  "async_source": ast.get_source_segment(text, function) or "",
                                  "one_version": _runs_twin_blocking(twin, name),
                                  "staying": STAYING.get((relative, scope, twin.name))})
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef)):
                scope = getattr(node, "name", "")
                for made, operation in _made_blocking(node.body).items():
                    pairs.append({"file": str(path.relative_to(root)), "scope": scope, "sync": made,
                                  "async": operation, "sync_source": "", "async_source": "", "one_version": True,
                                  "staying": None})
    return pairs


def _pair_line(p: dict) -> str:
    return f"{p['file']}:{p['scope'] or '<module>'}: {p['sync']} / {p['async']}"


def interceptor_implementations(root: pathlib.Path, pairs: list[dict]) -> dict:
    out = {}
    for name, relative in INTERCEPTORS.items():
        marks = [re.compile(m) for m in RULE_MARKS[name]]
        ruled = [f"{p['sync']}/{p['async']}" for p in pairs if p["file"] == relative and not p["one_version"]
                 and any(m.search(p["sync_source"]) or m.search(p["async_source"]) for m in marks)]
        out[name] = {"implementations": 2 if ruled else 1, "pairs_holding_the_rule": ruled}
    return {"total": sum(v["implementations"] for v in out.values()), "by_interceptor": out}


def measures(root: pathlib.Path) -> dict:
    found = async_pairs(root)
    pairs = [p for p in found if not p["one_version"]]
    return {**largest(root), "store_face": store_face(root), "core_import_cycles": core_cycles(root),
            "services_importing_services": service_imports(root),
            "sync_async_pairs": {"count": len(pairs), "pairs": [_pair_line(p) for p in pairs],
                                 "staying": {_pair_line(p): p["staying"] for p in pairs if p["staying"]},
                                 "one_version_run_on_a_thread": [_pair_line(p) for p in found if p["one_version"]]},
            "interceptor_implementations": interceptor_implementations(root, pairs)}


def report(m: dict) -> str:
    face, cycles, services = m["store_face"], m["core_import_cycles"], m["services_importing_services"]
    interceptors, pairs = m["interceptor_implementations"], m["sync_async_pairs"]
    lines = [
        f"largest class:   {m['largest_class']['lines']} lines ({m['largest_class']['where']})",
        f"largest module:  {m['largest_module']['lines']} lines ({m['largest_module']['where']})",
        f"MessageStore:    {face['public_methods']} public methods, {face['properties']} properties",
        f"core cycles:     {cycles['between_modules']} between modules, {cycles['between_parts']} between parts",
        f"services importing services: {services['count']}",
        *(f"  {line}" for line in services["imports"]),
        f"sync/async pairs: {pairs['count']} ({len(pairs['staying'])} staying, each with its reason)",
        *(f"  {line}" + (f"\n      staying: {pairs['staying'][line]}" if line in pairs["staying"] else "")
          for line in pairs["pairs"]),
        f"one version, run on a thread by mqstore.waits.blocking: {len(pairs['one_version_run_on_a_thread'])}",
        *(f"  {line}" for line in pairs["one_version_run_on_a_thread"]),
        f"interceptor implementations: {interceptors['total']}",
        *(f"  {name}: {v['implementations']}" + (f" (rule written in both: {', '.join(v['pairs_holding_the_rule'])})"
                                                 if v["pairs_holding_the_rule"] else "")
          for name, v in interceptors["by_interceptor"].items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=pathlib.Path, default=REPO, help="the tree to measure (default: this one)")
    parser.add_argument("--json", action="store_true", help="print the measures as JSON")
    args = parser.parse_args(argv)
    found = measures(args.root.resolve())
    print(json.dumps(found, indent=2) if args.json else report(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
