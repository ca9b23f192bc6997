"""The README's examples, and those of the ``make run`` banner, run as written against real services.

The services are started the way ``make run`` starts them (``python -m mqstore_launcher`` with a
temporary data dir), on free ports of 127.0.0.1. The test reads every ```sh block of README.md that
follows a ``<!-- runnable`` comment and runs its commands in order, each in ``bash`` from the
repository's root, and checks that each exits 0. Only what must differ is substituted:

* the addresses 127.0.0.1:50051 ... :50054 (and MQSTORE_ADDRESS, MQSTORE_INDEX_ADDRESS,
  MQSTORE_TXN_ADDRESS and MQSTORE_COMPACTOR_ADDRESS are exported, as the banner says to when the ports
  are not the defaults): every service runs on a free port, none on the defaults;
* 32-hex ids: by the offset msg id (or, in ``query id`` / QueryByUniqKey, the UNIQ_KEY) that the last
  ``send`` or ``Append`` printed;
* ``source .venv/bin/activate``: the venv running this test, when it is not the repository's .venv.

Lines that only set shell state (``source``, ``export``, ``NAME=value``) are replayed before each
later command. Commands that run until Ctrl-C (``--follow``, ``/Tail``) must print their first line,
then still be running ``FOREVER_S`` later; then they get SIGINT and must exit within ``STOP_TIMEOUT_S``
(``mqstore`` with 0). Waiting for the first line, not a fixed time, is what makes this hold on a loaded
machine: a Ctrl-C that lands while the interpreter is still importing is not the README's case. Every
command's process group is killed and its pipes closed whatever happens, so a failure never leaves a
process or a pipe behind for the next test. After the README, the banner's commands run the same way.
Finally the launcher gets SIGINT and must exit 0.
"""

from __future__ import annotations

import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

from tests.support.ports import service_ports

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = "<!-- runnable"
COMMAND_TIMEOUT_S = 120     # one command, on a loaded 2-core machine
FOREVER_S = 2.0
START_TIMEOUT_S = 240
STOP_TIMEOUT_S = 30
LAUNCHER_STOP_TIMEOUT_S = 180
BANNER_END = "Ctrl-C stops everything."
HEX_ID = re.compile(r"\b[0-9A-F]{32}\b")
MSG_ID = re.compile(r"""(?:msg_id=|"msgId":\s*"|"msg_id":\s*")([0-9A-F]{32})""")
UNIQ_KEY = re.compile(r"""(?:uniq_key=|"uniqKey":\s*"|"uniq_key":\s*")([0-9A-F]{32})""")
STATE = re.compile(r"^(source |export |[A-Za-z_][A-Za-z0-9_]*=)")
# A command runs as at a terminal, where Ctrl-C's SIGINT is not ignored: a suite started in the background
# (`make test &`, nohup) hands its children SIGINT ignored, a shell cannot undo that, and a Go program (grpcurl)
# keeps an inherited ignore, so a Tail run by the README's "until Ctrl-C" would never stop. The disposition is
# set back to the default in the child before bash starts (exec keeps it; no preexec_fn with threads running).
AT_A_TERMINAL = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                 "os.execvp(sys.argv[1], sys.argv[1:])"]


def runnable_commands(markdown: str) -> list[str]:
    """The commands of the marked ```sh blocks, in order: continuation lines joined, comments and
    blank lines dropped."""
    commands: list[str] = []
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith(MARKER):
            continue
        assert lines[i + 1] == "```sh", f"README.md line {i + 1}: a runnable marker must precede a ```sh block"
        end = lines.index("```", i + 2)
        pending = ""
        for text in lines[i + 2:end]:
            text = pending + text.strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            if text and not text.startswith("#"):
                commands.append(text)
    return commands


def banner_commands(banner: str) -> list[str]:
    lines = banner.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Try"))
    return [line.strip() for line in lines[start + 1:] if line.startswith("  ")]


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the command's process group (bash and what it started), if anything of it is left."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group has exited
    process.wait(STOP_TIMEOUT_S)


class Output:
    """A command's stdout and stderr, read by two threads as they come (a command that runs until
    Ctrl-C never fills a pipe and blocks). Thread-safe: lists appended by one thread each."""

    def __init__(self, process: subprocess.Popen):
        self._out: list[str] = []
        self._err: list[str] = []
        self._printed = threading.Event()
        self._threads = [threading.Thread(target=self._read, args=(process.stdout, self._out, self._printed),
                                          name="readme-stdout", daemon=True),
                         threading.Thread(target=self._read, args=(process.stderr, self._err, None),
                                          name="readme-stderr", daemon=True)]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _read(stream, into: list[str], printed: threading.Event | None) -> None:
        for line in stream:
            into.append(line)
            if printed is not None:
                printed.set()

    def first_line(self, process: subprocess.Popen, timeout_s: float) -> bool:
        """True once stdout has a line; False if the process exited first or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while not self._printed.wait(0.05):
            if process.poll() is not None or time.monotonic() > deadline:
                return self._printed.is_set()
        return True

    def join(self) -> None:
        for thread in self._threads:
            thread.join(STOP_TIMEOUT_S)

    def out(self) -> str:
        return "".join(self._out)

    def err(self) -> str:
        return "".join(self._err)


@dataclass
class Shell:
    """Runs commands as a user would in the activated shell. Not thread-safe."""

    log_address: str
    index_address: str
    txn_address: str
    compactor_address: str
    prelude: list[str] = field(default_factory=lambda: ["set -o pipefail"])
    msg_id: str = ""
    uniq_key: str = ""

    def substitute(self, command: str) -> str:
        command = command.replace("127.0.0.1:50051", self.log_address)
        command = command.replace("127.0.0.1:50052", self.index_address)
        command = command.replace("127.0.0.1:50053", self.txn_address)
        command = command.replace("127.0.0.1:50054", self.compactor_address)
        if command.startswith("source .venv/bin/activate") and not (ROOT / ".venv/bin/activate").exists():
            command = command.replace(".venv/bin/activate", str(pathlib.Path(sys.prefix) / "bin/activate"))
        if HEX_ID.search(command):
            uniq = "query id" in command or "QueryByUniqKey" in command
            value = self.uniq_key if uniq else self.msg_id
            assert value, f"{command!r} needs an id that no earlier send/Append printed"
            command = HEX_ID.sub(value, command)
        return command

    def run(self, command: str) -> None:
        actual = self.substitute(command)
        script = "\n".join([*self.prelude, actual])
        env = {**os.environ, "MQSTORE_ADDRESS": self.log_address, "MQSTORE_INDEX_ADDRESS": self.index_address,
               "MQSTORE_TXN_ADDRESS": self.txn_address, "MQSTORE_COMPACTOR_ADDRESS": self.compactor_address}
        forever = "--follow" in actual or "/Tail" in actual
        with subprocess.Popen([*AT_A_TERMINAL, "bash", "-c", script], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) as process:
            output = Output(process)
            try:
                if forever:
                    self._until_ctrl_c(actual, process, output)
                    return
                try:
                    process.wait(COMMAND_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"{actual!r} did not finish within {COMMAND_TIMEOUT_S} s; "
                                         f"stderr: {output.err()}") from None
            finally:
                _kill_group(process)
                output.join()
        out, err = output.out(), output.err()
        assert process.returncode == 0, f"{actual!r} (README: {command!r}) exited {process.returncode}:\n{err}"
        if STATE.match(actual):
            self.prelude.append(actual)
        if " send " in f" {actual} " or "/Append" in actual:
            self._capture(out)

    @staticmethod
    def _until_ctrl_c(actual: str, process: subprocess.Popen, output: "Output") -> None:
        if not output.first_line(process, COMMAND_TIMEOUT_S):
            raise AssertionError(f"{actual!r} should print and run until Ctrl-C, but printed nothing within "
                                 f"{COMMAND_TIMEOUT_S} s (exit status {process.poll()}): {output.err()}")
        try:
            code = process.wait(FOREVER_S)
        except subprocess.TimeoutExpired:
            pass  # still running, as it should
        else:
            raise AssertionError(f"{actual!r} should run until Ctrl-C but exited {code}: {output.err()}")
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C, as the README says
        try:
            code = process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{actual!r} did not stop within {STOP_TIMEOUT_S} s of Ctrl-C") from None
        if actual.startswith("mqstore"):
            assert code == 0, f"{actual!r} exited {code} on Ctrl-C: {output.err()}"

    def _capture(self, out: str) -> None:
        if found := MSG_ID.search(out):
            self.msg_id = found.group(1)
        if found := UNIQ_KEY.search(out):
            self.uniq_key = found.group(1)


class Launcher:
    """``python -m mqstore_launcher`` as ``make run`` runs it, every service on a free port; stdout read
    by a thread, stderr into a file (the services' logs are in <data-dir>/logs)."""

    def __init__(self, data_dir: pathlib.Path, ports: dict[str, int], log_path: pathlib.Path,
                 extra_args: tuple[str, ...] = ()):
        command = [sys.executable, "-m", "mqstore_launcher", "--data-dir", str(data_dir), *extra_args]
        for name, port in ports.items():
            command += [f"--{name}-port", str(port)]
        self.log_path, self.data_dir = log_path, data_dir
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=log, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="launcher-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the launcher's stderr and of each service's log (<data-dir>/logs)."""
        def tail(path: pathlib.Path) -> str:
            return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
        logs = sorted((self.data_dir / "logs").glob("*.log"))
        return tail(self.log_path) + "".join(f"--- {path.name}:\n{tail(path)}" for path in logs)

    def banner(self) -> str:
        seen: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no banner within {START_TIMEOUT_S} s: {seen}\n{self.log_tail()}") from None
            assert line is not None, f"the launcher exited {self.process.wait()} before its banner: {seen}\n" \
                                     f"{self.log_tail()}"
            seen.append(line)
            if line.strip() == BANNER_END:
                return "".join(seen)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(LAUNCHER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._reader.join(STOP_TIMEOUT_S)
        self.process.stdout.close()
        return self.process.returncode


def test_readme_marks_the_blocks_it_promises():
    commands = runnable_commands(README.read_text())
    assert commands[0] == "source .venv/bin/activate"
    for expected in ("grpcurl -plaintext", "mqstore.v1.CommitLog/Append", "mqstore.v1.Index/QueryByKey",
                     "mqstore send demo", "mqstore query id demo", "mqstore get ", "--follow", "/Tail",
                     "mqstore receive demo", "xargs mqstore ack demo", "mqstore.v1.Consumer/Receive",
                     "mqstore topic create kv --kind compaction", "mqstore compact run kv", "mqstore kv get kv",
                     "mqstore.v1.Compactor/Pull", "mqstore txn send", "mqstore pull demo --sql", "FILTER_TYPE_SQL92"):
        assert any(expected in c for c in commands), f"no runnable README command contains {expected!r}"


def test_readme_and_banner_examples_run_as_written(tmp_path):
    names = ("commitlog", "index", "txn", "compactor", "gateway")
    ports = service_ports(names)  # their /metrics ports free too
    launcher = Launcher(tmp_path / "data", ports, tmp_path / "launcher.log")
    try:
        banner = launcher.banner()
        addresses = [f"127.0.0.1:{ports[name]}" for name in ("commitlog", "index", "txn", "compactor")]
        shell = Shell(*addresses)
        for command in runnable_commands(README.read_text()):
            shell.run(command)
        assert shell.msg_id and shell.uniq_key and shell.msg_id != shell.uniq_key
        commands = banner_commands(banner)
        assert f"export MQSTORE_ADDRESS={addresses[0]} MQSTORE_INDEX_ADDRESS={addresses[1]} " \
               f"MQSTORE_TXN_ADDRESS={addresses[2]} MQSTORE_COMPACTOR_ADDRESS={addresses[3]} " \
               f"MQSTORE_GATEWAY_ADDRESS=127.0.0.1:{ports['gateway']}" in commands, banner
        banner_shell = Shell(*addresses)
        for command in commands:
            banner_shell.run(command)
    finally:
        status = launcher.stop()
    assert status == 0, launcher.log_tail()
