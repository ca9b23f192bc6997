"""scripts/shape_measures.py (issue 33's measures): each measure counted on a small tree made to show it, and
the figures this tree must keep (no cycle in core, no service importing another, one implementation of each
interceptor's rule)."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "shape_measures.py"
_spec = importlib.util.spec_from_file_location("shape_measures", SCRIPT)
shape = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape)


def _write(root: pathlib.Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _tree(root: pathlib.Path) -> None:
    _write(root, "core/mqstore/__init__.py", "")
    _write(root, "core/mqstore/store.py", """\
        from mqstore import a


        class MessageStore:
            def append(self): ...
            def append_async(self): ...
            def _hidden(self): ...

            async def pull_async(self, q): ...
            pull = waits.blocking_version(pull_async)

            async def read_async(self, q): ...
            def read(self, q):
                'Only runs the coroutine: one version.'
                return waits.blocking(self.read_async(q))

            async def scan_async(self, q): ...
            def scan(self, q):
                return waits.blocking(self.scan_async(q + 1))  # something of its own: a pair

            @property
            def running(self): ...
        """)
    _write(root, "core/mqstore/a.py", "def f():\n    from mqstore import store\n")
    for name in ("one", "two"):
        _write(root, f"services/{name}/{name}_service/__init__.py", "")
    _write(root, "services/one/one_service/main.py", "import two_service.main\n")
    _write(root, "services/two/two_service/main.py", "")
    _write(root, "services/launcher/mqstore_launcher/__init__.py", "import one_service\nimport two_service\n")
    _write(root, "services/common/mqstore_rpc/__init__.py", "")
    _write(root, "services/common/mqstore_rpc/gen/big.py", "class Generated:\n" + "    x = 1\n" * 2000)
    _write(root, "services/common/mqstore_rpc/errors.py", """\
        def _abort(exc, context):
            log.info("rpc.cancelled")


        async def _abort_async(exc, context):
            await context.abort(*_ending(exc))
        """)
    _write(root, "services/common/mqstore_rpc/metrics.py", """\
        def _unary(behavior, figures):
            return figures.receive(behavior)


        async def _async_unary(behavior, figures):
            return figures.receive(await behavior)
        """)
    _write(root, "services/common/mqstore_rpc/auth.py", "")


def test_each_measure_is_counted_on_a_tree_made_to_show_it(tmp_path):
    _tree(tmp_path)
    found = shape.measures(tmp_path)
    assert found["largest_class"] == {"where": "core/mqstore/store.py:MessageStore", "lines": 19}  # gen/ left out
    assert found["store_face"]["methods"] == ["append", "append_async", "pull_async", "read_async", "read",
                                              "scan_async", "scan", "pull"]  # a made method counts too
    assert found["store_face"]["properties"] == 1
    assert found["core_import_cycles"]["between_modules"] == 1  # store -> a -> store (inside a function)
    assert found["services_importing_services"]["imports"] == [
        "services/one/one_service/main.py:1 imports two_service.main"]  # the launcher may
    assert [p.split(": ")[-1] for p in found["sync_async_pairs"]["pairs"]] == [
        "append / append_async", "scan / scan_async", "_abort / _abort_async", "_unary / _async_unary"]
    assert [p.split(": ")[-1] for p in found["sync_async_pairs"]["one_version_run_on_a_thread"]] == [
        "read / read_async", "pull / pull_async"]  # the rule written once, the thread's version holds nothing
    interceptors = found["interceptor_implementations"]
    assert interceptors["by_interceptor"]["errors"] == {"implementations": 2,
                                                        "pairs_holding_the_rule": ["_abort/_abort_async"]}
    assert interceptors["by_interceptor"]["metrics"]["implementations"] == 1  # adapters around one rule
    assert interceptors["total"] == 4


def test_the_command_prints_the_measures_of_another_root(tmp_path):
    _tree(tmp_path)
    done = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "MessageStore:    8 public methods, 1 properties" in done.stdout
    assert "sync/async pairs: 4 (0 staying, each with its reason)" in done.stdout  # none in STAYING
    assert "interceptor implementations: 4" in done.stdout


def test_this_tree_keeps_one_implementation_of_each_interceptor_and_no_cycle():
    found = shape.measures(ROOT)
    pairs = found["sync_async_pairs"]
    assert pairs["count"] <= 2 and set(pairs["staying"]) == set(pairs["pairs"]), (
        "a new sync/async pair: write the operation once (mqstore.waits.blocking), or give the reason it "
        f"stays (STAYING, bench/README.md): {sorted(set(pairs['pairs']) - set(pairs['staying']))}")
    assert found["interceptor_implementations"]["total"] == 3, found["interceptor_implementations"]
    assert found["core_import_cycles"]["between_modules"] == 0
    assert found["services_importing_services"]["count"] == 0
    assert found["store_face"]["public_methods"] <= 26, (  # 48 at issue 33; a feature's rule is a module over it
        "MessageStore's face grew: put the new rule in a module that uses the store (mqstore.tailing, "
        f"mqstore.hot_reads), not on it: {found['store_face']['methods']}")
