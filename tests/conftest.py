"""Shared fixtures: temporary stores with small segments, a fake clock, failpoints."""

from __future__ import annotations

import contextlib
import os
import pathlib

# Before anything imports grpc (it reads the variable once): a process that has used grpc and then
# forks for subprocess.Popen with a preexec_fn (pyspark starts its JVM so) runs grpc's post-fork
# handler in the child, which restarts a poller whose epoll fd Popen's close_fds then closes; the child
# can die before exec ("epoll_wait error: Bad file descriptor", grpc/grpc#43055), and the Spark session
# fixture failed with JAVA_GATEWAY_EXITED in a full run. The tests fork only to exec, so they need no
# fork support; the variable also reaches the service processes they start.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# The disk guard (StoreConfig.disk_max_used_ratio, 90% by default) measures the file system of the test's
# temp dir, which this machine shares with whatever else runs on it: CI's disk stood at 90-91% once and 261
# tests failed on "the store is read-only: disk 90.4% full" though the suite writes 2-3 GB. Every store the
# suite opens gets 0.99 instead: the services it starts through the variable (they read MQSTORE_<FIELD>),
# stores in this process through _test_disk_limit below. The tests of the guard itself give their own
# ratio (0.0001), which wins.
os.environ.setdefault("MQSTORE_DISK_MAX_USED_RATIO", "0.99")
from typing import Iterator

import hypothesis  # noqa: F401  (imported here, before any test starts a thread: hypothesis's pytest plugin
#   imports it at the terminal summary otherwise, and CPython 3.11's parser is not thread-safe (gh-106905): a
#   compile() there while a test's leftover thread imports fails the run with 'AST constructor recursion depth
#   mismatch' after every test passed)
import pytest
import structlog

from mqstore import failpoints
from mqstore import system_writers  # noqa: F401  (the composition of a process: every system writer registered)
from mqstore.clock import FakeClock
from mqstore.config import StoreConfig
from tests.support import shards

GOLDEN = pathlib.Path(__file__).parent / "golden"


def _test_disk_limit(init):
    """StoreConfig's __init__ with the suite's disk limit as the default of disk_max_used_ratio."""
    def init_with_test_limit(self, *args, **kwargs):
        kwargs.setdefault("disk_max_used_ratio", float(os.environ["MQSTORE_DISK_MAX_USED_RATIO"]))
        init(self, *args, **kwargs)
    return init_with_test_limit


StoreConfig.__init__ = _test_disk_limit(StoreConfig.__init__)


def pytest_report_header(config):
    from mqstore import codec
    return f"mqstore codec: {codec.ACTIVE}" + (f" ({codec.REASON})" if codec.REASON else "")


def pytest_configure(config):
    # Tests log through structlog's default dev renderer: keep output quiet and deterministic.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    if config.getoption("--timings-out", default=""):
        config.pluginmanager.register(shards.UnitTimer(pathlib.Path(config.getoption("--timings-out"))))


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


class ArmedFailpoints:
    """What the ``failpoint`` fixture gives a test: ``failpoint(name)`` arms one (action "raise", or
    "exit"), ``with failpoint.armed(name):`` arms one for a block, ``failpoint.disarm()`` disarms all."""

    def __call__(self, name: str, action: str = "raise") -> None:
        failpoints.arm(name, action)

    @contextlib.contextmanager
    def armed(self, name: str, action: str = "raise") -> Iterator[None]:
        failpoints.arm(name, action)
        try:
            yield
        finally:
            failpoints.disarm_all()

    def disarm(self) -> None:
        failpoints.disarm_all()


@pytest.fixture
def failpoint() -> Iterator[ArmedFailpoints]:
    """Arms failpoints for one test; every failpoint is disarmed after it, whatever happens in it (and
    before it, in case one leaked)."""
    failpoints.disarm_all()
    yield ArmedFailpoints()
    failpoints.disarm_all()


@pytest.fixture
def small_config(tmp_path):
    def make(**overrides) -> StoreConfig:
        base = dict(data_dir=tmp_path / "store", segment_size_bytes=16 * 1024, cq_entries_per_file=64,
                    flush_interval_ms=20, checkpoint_interval_ms=50, clean_interval_ms=100_000)
        base.update(overrides)
        return StoreConfig(**base)
    return make


def golden_bytes(name: str, produced: bytes, request) -> bytes:
    """Compare with tests/golden/<name>; write it only when run with --regen-golden."""
    path = GOLDEN / name
    if request.config.getoption("--regen-golden") or not path.exists():
        if not request.config.getoption("--regen-golden"):
            pytest.fail(f"golden file {path} is missing: run pytest --regen-golden once, on purpose, and commit it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(produced)
    return path.read_bytes()


def pytest_addoption(parser):
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite golden byte files from the current code (on purpose only)")
    parser.addoption("--shard", default="", metavar="K/N",
                     help="run only the K-th of N shards of the selected tests (tests/support/shards.py)")
    parser.addoption("--timings-out", default="", metavar="PATH",
                     help="write the seconds each module (scheduling unit) took to PATH, as JSON")


# Shards (scripts/run_suite.py): after -k/-m deselection, keep only this shard's units.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    text = config.getoption("--shard")
    if not text:
        return
    index, count = shards.parse_shard(text)
    tests_per_unit: dict[str, int] = {}
    for item in items:
        unit = shards.unit_of(item.nodeid)
        tests_per_unit[unit] = tests_per_unit.get(unit, 0) + 1
    mine = shards.split(tests_per_unit, shards.load_timings(), count)[index - 1]
    kept = [item for item in items if shards.unit_of(item.nodeid) in mine]
    dropped = [item for item in items if shards.unit_of(item.nodeid) not in mine]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


# The disk the suite's temp dirs take. pytest keeps a failed test's tmp_path and removes a passing one's at
# its end (pyproject: tmp_path_retention_policy = "failed"), so a run holds at a time what its running tests
# and its module-scoped directories write, not the 2-3 GB every test's files add up to. Services started with
# production sizes (a 1 GiB segment allocated for real) once left 25-28 GB and two runs filled the disk; so a
# test whose tmp_path holds more than TEST_TEMP_LIMIT_BYTES at its end, or a run whose temp dir holds more than
# TEMP_LIMIT_BYTES at its end, fails the run, named in the terminal summary (tests/support/processes.py
# SMALL_FILES gives services small files).
TEMP_LIMIT_BYTES = 8 * 1024 ** 3
TEST_TEMP_LIMIT_BYTES = 512 * 1024 ** 2
BASETEMP = pytest.StashKey[pathlib.Path]()
TEMP_USE = pytest.StashKey[tuple[int, list[tuple[int, str]]]]()
TESTS_OVER = pytest.StashKey[list[tuple[int, str]]]()


@pytest.fixture(scope="session", autouse=True)
def _basetemp_to_measure(request, tmp_path_factory) -> None:
    request.config.stash[BASETEMP] = tmp_path_factory.getbasetemp()


def allocated_bytes(path: pathlib.Path) -> int:
    """Bytes of disk the files under ``path`` take (blocks: a sparse file counts what it allocated)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file gone meanwhile
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


@pytest.hookimpl(tryfirst=True)  # before the fixtures' teardown, which removes a passing test's tmp_path
def pytest_runtest_teardown(item):
    path = getattr(item, "funcargs", {}).get("tmp_path")
    if path is None or not path.is_dir():
        return
    size = allocated_bytes(path)
    if size > TEST_TEMP_LIMIT_BYTES:
        item.config.stash.setdefault(TESTS_OVER, []).append((size, item.nodeid))


@pytest.hookimpl(tryfirst=True)  # before pytest's own, which may remove the temp dir of a passing run
def pytest_sessionfinish(session):
    basetemp = session.config.stash.get(BASETEMP, None)
    if basetemp is None or not basetemp.is_dir():
        return
    sizes = sorted(((allocated_bytes(entry), entry.name) for entry in basetemp.iterdir()
                    if not entry.is_symlink()), reverse=True)  # pytest's <name>current links
    total = sum(size for size, _ in sizes)
    session.config.stash[TEMP_USE] = (total, sizes[:5])
    over = total > TEMP_LIMIT_BYTES or session.config.stash.get(TESTS_OVER, [])
    if over and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    if TEMP_USE not in config.stash:
        return
    total, largest = config.stash[TEMP_USE]
    tests_over = sorted(config.stash.get(TESTS_OVER, []), reverse=True)
    over = total > TEMP_LIMIT_BYTES or bool(tests_over)
    terminalreporter.write_sep("=", "disk in the temp dir", red=over, bold=over)
    terminalreporter.write_line(f"{config.stash[BASETEMP]}: {total / 1024 ** 2:,.0f} MiB at the end (limit "
                                f"{TEMP_LIMIT_BYTES / 1024 ** 2:,.0f} MiB); largest: "
                                + ", ".join(f"{name} {size / 1024 ** 2:,.0f} MiB" for size, name in largest))
    for size, nodeid in tests_over:
        terminalreporter.write_line(f"{nodeid}: its tmp_path held {size / 1024 ** 2:,.0f} MiB at its end (limit "
                                    f"{TEST_TEMP_LIMIT_BYTES / 1024 ** 2:,.0f} MiB)", red=True)
    if over:
        terminalreporter.write_line("over the limit: the run fails. A test or helper keeps large files in its "
                                    "tmp_path (services started with production file sizes?): "
                                    "tests/support/processes.py SMALL_FILES", red=True)
