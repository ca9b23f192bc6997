"""The import rules of docs/DESIGN.md §4 and docs/STYLE.md (Shape), checked by walking every module with ``ast``.

- ``core/mqstore`` (the storage engine and every feature's domain: ``core/mqstore/<feature>/``) imports no
  grpc, google.protobuf, generated stubs (mqstore_rpc), pyspark or service package.
- SQL only in ``core/mqstore/meta/``: no other module of the project (core, services, spark, bench)
  imports SQLAlchemy.
- ``mqstore_rpc`` (shared gRPC glue) imports no service package, nor the command line, and holds no
  service's servicer or composition: each service's are its own package's (its one subpackage is gen/).
- ``mqstore_cli`` (``services/cli/``, the ``mqstore`` command line) is a client: it talks to the services
  through their stubs and imports no service package.
- No service package imports another service package (they talk through gRPC stubs only).
- ``mqstore_launcher`` (``services/launcher/``) is the composition root above the services: the only package
  that may import more than one service package, and none of core, the shared glue, the command line, a
  service or the Spark job imports it.
- ``services/<name>/`` holds composition (``main``), the servicer and adapters to other services and
  processes; the domain of a feature (its state machine, its formats' use) is ``core/mqstore/<feature>/``
  (index, txn, compaction), so it is covered by the first rule.
- ``spark/`` (the Spark job) imports the storage engine and pyspark, never grpc, stubs or a service;
  ``bench/`` talks to the services through gRPC stubs and imports no service package.

Imports inside functions count too, and so do ``importlib.import_module("...")`` / ``__import__("...")``
with a literal name.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORE = ROOT / "core" / "mqstore"
SERVICES = ROOT / "services"
SHARED = SERVICES / "common" / "mqstore_rpc"
CLI = SERVICES / "cli" / "mqstore_cli"
LAUNCHER = SERVICES / "launcher" / "mqstore_launcher"
META = CORE / "meta"
SPARK = ROOT / "spark" / "mqstore_spark"
BENCH = ROOT / "bench"

FORBIDDEN_IN_CORE = ("grpc", "grpc_health", "grpc_reflection", "grpc_tools", "google.protobuf", "mqstore_rpc",
                     "pyspark")


def service_packages() -> dict[str, pathlib.Path]:
    """Every package directly under services/<service>/ except the shared one, the command line and the
    launcher: name -> directory."""
    found = {}
    for init in sorted(SERVICES.glob("*/*/__init__.py")):
        package = init.parent
        if package not in (SHARED, CLI, LAUNCHER):
            found[package.name] = package
    return found


def _module_name(path: pathlib.Path, package_root: pathlib.Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


# The compiled codec's Cython sources (core/mqstore/codec): read as the .py files are, by their import lines.
CYTHON_SUFFIXES = (".pyx", ".pxd")
_TRIPLE_QUOTED = re.compile(r'""".*?"""|\'\'\'.*?\'\'\'', re.S)
_CYTHON_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+c?import[ \t]+(\([^)]*\)|[^\n#]*)"
                            r"|c?import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*))", re.M)


def sources(package_root: pathlib.Path) -> list[pathlib.Path]:
    """Every source file of the tree whose imports the layer rules read: .py, and Cython's .pyx and .pxd."""
    return sorted(p for suffix in (".py", *CYTHON_SUFFIXES) for p in package_root.rglob(f"*{suffix}"))


def _cython_imports_of(path: pathlib.Path, package_root: pathlib.Path) -> list[tuple[int, str]]:
    """imports_of for a Cython file (not Python to ``ast``): its ``import``, ``cimport``, ``from ... import``
    and ``from ... cimport`` lines (parenthesised names over several lines too), docstrings left out."""
    text = _TRIPLE_QUOTED.sub(lambda m: "\n" * m.group().count("\n"), path.read_text())
    module = _module_name(path, package_root)
    found = []
    for match in _CYTHON_IMPORT.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        source, names, plain = match.groups()
        if plain is not None:
            found += [(line, name.strip()) for name in plain.split(",")]
            continue
        level = len(source) - len(source.lstrip("."))
        name = _resolve_relative(module, False, level, source.lstrip(".") or None) if level else source
        found.append((line, name))
        aliases = (a.split()[0] for a in names.strip("()").replace("\n", " ").split(",") if a.strip())
        found += [(line, f"{name}.{alias}") for alias in aliases if alias != "*"]
    return found


def imports_of(path: pathlib.Path, package_root: pathlib.Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file (a Cython one too: .pyx, .pxd)."""
    if path.suffix in CYTHON_SUFFIXES:
        return _cython_imports_of(path, package_root)
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(path, package_root)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = _resolve_relative(module, is_package, node.level, node.module) if node.level else node.module
            found.append((node.lineno, name))
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            found.append((node.lineno, node.args[0].value))
    return found


def _is_dynamic_import(node: ast.Call) -> bool:
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("__import__", "import_module"))
    return named and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(package_root: pathlib.Path, forbidden, allow=lambda path, name: False) -> list[str]:
    found = []
    for path in sources(package_root):
        if "gen" in path.relative_to(package_root).parts[:1]:
            continue  # generated stubs: checked by what imports them
        for line, name in imports_of(path, package_root):
            if any(_matches(name, prefix) for prefix in forbidden) and not allow(path, name):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_the_packages_exist():
    assert (CORE / "store.py").is_file() and (SHARED / "errors.py").is_file()
    assert "commitlog_service" in service_packages()


def test_core_imports_no_adapter():
    assert violations(CORE, (*FORBIDDEN_IN_CORE, *service_packages(), CLI.name)) == []


def test_sql_only_in_meta():
    def allow(path, name):
        return META in path.parents
    found = violations(CORE, ("sqlalchemy",), allow=allow) + violations(SHARED, ("sqlalchemy",))
    for package in (*service_packages().values(), SPARK):
        found += violations(package, ("sqlalchemy",))
    assert found == []


def test_the_domains_live_in_core():
    for feature in ("index", "txn", "compaction"):
        assert (CORE / feature / "__init__.py").is_file(), feature
    for name, package in service_packages().items():
        kept = {path.stem for path in package.glob("*.py")}
        assert "main" in kept, name


def test_spark_job_imports_no_grpc_or_service():
    assert violations(SPARK, (*FORBIDDEN_IN_CORE[:-1], *service_packages(), "sqlalchemy")) == []


def test_bench_imports_no_service_package():
    def allow(path, name):  # the replication floors: the replica's gRPC client and the leader's handler, or
        # (over plain TCP) the leader's data messages and the replica's parse of them: the things they measure
        floors = (BENCH / "replication_floor.py", BENCH / "replication_floor_raw.py")
        return path in floors and _matches(name, "commitlog_service")
    assert violations(BENCH, (*service_packages(), "sqlalchemy"), allow) == []


def test_shared_glue_imports_no_service():
    assert violations(SHARED, (*service_packages(), CLI.name)) == []


def test_each_service_owns_its_servicer_and_the_shared_glue_holds_none():
    """A service's servicers and composition are its own package's (Local mode included: the launcher
    composes them into the commit log's process); mqstore_rpc has no subpackage but the generated stubs."""
    for name, package in service_packages().items():
        assert (package / "servicer.py").is_file(), name
    for name in ("txn_service", "gateway_service"):
        assert (service_packages()[name] / "composition.py").is_file(), name
    assert sorted(p.name for p in SHARED.iterdir() if (p / "__init__.py").is_file()) == ["gen"]


def test_the_command_line_imports_no_service():
    assert (CLI / "main.py").is_file()
    assert violations(CLI, (*service_packages(), "sqlalchemy", LAUNCHER.name)) == []


def test_only_the_launcher_imports_more_than_one_service():
    services = service_packages()
    below = {**services, SHARED.name: SHARED, CLI.name: CLI, "core": CORE, "spark": SPARK}
    for name, package in below.items():
        imported = {other for path in package.rglob("*.py") for _, module in imports_of(path, package)
                    for other in services if _matches(module, other)}
        assert imported <= {name}, f"{package.relative_to(ROOT)} imports {sorted(imported - {name})}"
        assert violations(package, (LAUNCHER.name,)) == []
    assert (LAUNCHER / "__init__.py").is_file()
    assert violations(LAUNCHER, ("sqlalchemy",)) == []


@pytest.mark.parametrize("service", sorted(service_packages()))
def test_services_do_not_import_each_other(service):
    packages = service_packages()
    others = tuple(name for name in packages if name != service)
    assert violations(packages[service], others, lambda path, name: False) == []


def test_the_checker_sees_every_kind_of_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text(
        "import grpc\nfrom google.protobuf import json_format\nfrom ..other import thing\n"
        "def f():\n    import pyspark.sql\n    importlib.import_module('sqlalchemy.orm')\n")
    names = [name for _, name in imports_of(package / "sub" / "mod.py", package)]
    assert names == ["grpc", "google.protobuf", "google.protobuf.json_format", "pkg.other", "pkg.other.thing",
                     "pyspark.sql", "sqlalchemy.orm"]
