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


# The disk the run's temp dir holds at its end (pytest keeps every test's tmp_path until a later run),
# reported in the terminal summary, with the largest directories: a full run once left 25-28 GB there
# (services started with 1 GiB segments, allocated for real) and two runs filled the disk. A run over
# TEMP_LIMIT_BYTES fails, so that a helper starting services with production sizes again cannot go unseen.
TEMP_LIMIT_BYTES = 8 * 1024 ** 3
BASETEMP = pytest.StashKey[pathlib.Path]()
TEMP_USE = pytest.StashKey[tuple[int, list[tuple[int, str]]]]()


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


@pytest.hookimpl(tryfirst=True)  # before pytest's own, which may remove the temp dir of a passing run
def pytest_sessionfinish(session):
    basetemp = session.config.stash.get(BASETEMP, None)
    if basetemp is None or not basetemp.is_dir():
        return
    sizes = sorted(((allocated_bytes(entry), entry.name) for entry in basetemp.iterdir()
                    if not entry.is_symlink()), reverse=True)  # pytest's <name>current links
    total = sum(size for size, _ in sizes)
    session.config.stash[TEMP_USE] = (total, sizes[:5])
    if total > TEMP_LIMIT_BYTES and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    if TEMP_USE not in config.stash:
        return
    total, largest = config.stash[TEMP_USE]
    over = total > TEMP_LIMIT_BYTES
    terminalreporter.write_sep("=", "disk in the temp dir", red=over, bold=over)
    terminalreporter.write_line(f"{config.stash[BASETEMP]}: {total / 1024 ** 2:,.0f} MiB (limit "
                                f"{TEMP_LIMIT_BYTES / 1024 ** 2:,.0f} MiB); largest: "
                                + ", ".join(f"{name} {size / 1024 ** 2:,.0f} MiB" for size, name in largest))
    if over:
        terminalreporter.write_line("over the limit: the run fails. A test or helper keeps large files in its "
                                    "tmp_path (services started with production file sizes?): "
                                    "tests/support/processes.py SMALL_FILES", red=True)
