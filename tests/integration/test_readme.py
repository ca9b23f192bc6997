"""The README's examples, and those of the ``make run`` banner, run as written against real services.

The services are started the way ``make run`` starts them (``python -m mqstore_rpc.launcher`` with a
temporary data dir), on free ports of 127.0.0.1. The test reads every ```sh block of README.md that
follows a ``<!-- runnable`` comment and runs its commands in order, each in ``bash`` from the
repository's root, and checks that each exits 0. Only what must differ is substituted:

* the addresses 127.0.0.1:50051 / :50052 (and MQSTORE_ADDRESS / MQSTORE_INDEX_ADDRESS are exported,
  as the banner says to when the ports are not the defaults);
* 32-hex ids: by the offset msg id (or, in ``query id`` / QueryByUniqKey, the UNIQ_KEY) that the last
  ``send`` or ``Append`` printed;
* ``source .venv/bin/activate``: the venv running this test, when it is not the repository's .venv.

Lines that only set shell state (``source``, ``export``, ``NAME=value``) are replayed before each
later command. Commands that run until Ctrl-C (``--follow``, ``/Tail``) get ``FOREVER_S``: they must
still be running then, and are stopped with SIGINT (``mqstore`` must then exit 0). After the README,
the banner's commands run the same way. Finally the launcher gets SIGINT and must exit 0.
"""

from __future__ import annotations

import os
import pathlib
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = "<!-- runnable"
COMMAND_TIMEOUT_S = 60
FOREVER_S = 3.0
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
BANNER_END = "Ctrl-C stops everything."
HEX_ID = re.compile(r"\b[0-9A-F]{32}\b")
MSG_ID = re.compile(r"""(?:msg_id=|"msgId":\s*"|"msg_id":\s*")([0-9A-F]{32})""")
UNIQ_KEY = re.compile(r"""(?:uniq_key=|"uniqKey":\s*"|"uniq_key":\s*")([0-9A-F]{32})""")
STATE = re.compile(r"^(source |export |[A-Za-z_][A-Za-z0-9_]*=)")


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Shell:
    """Runs commands as a user would in the activated shell. Not thread-safe."""

    log_address: str
    index_address: str
    txn_address: str = "127.0.0.1:50053"
    prelude: list[str] = field(default_factory=lambda: ["set -o pipefail"])
    msg_id: str = ""
    uniq_key: str = ""

    def substitute(self, command: str) -> str:
        command = command.replace("127.0.0.1:50051", self.log_address)
        command = command.replace("127.0.0.1:50052", self.index_address)
        command = command.replace("127.0.0.1:50053", self.txn_address)
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
               "MQSTORE_TXN_ADDRESS": self.txn_address}
        forever = "--follow" in actual or "/Tail" in actual
        process = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = process.communicate(timeout=FOREVER_S if forever else COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            assert forever, f"{actual!r} did not finish within {COMMAND_TIMEOUT_S} s"
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C, as the README says
            out, err = process.communicate(timeout=COMMAND_TIMEOUT_S)
            if actual.startswith("mqstore"):
                assert process.returncode == 0, f"{actual!r} exited {process.returncode} on Ctrl-C: {err}"
            return
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_TIMEOUT_S)
        assert not forever, f"{actual!r} should run until Ctrl-C but exited {process.returncode}: {err}"
        assert process.returncode == 0, f"{actual!r} (README: {command!r}) exited {process.returncode}:\n{err}"
        if STATE.match(actual):
            self.prelude.append(actual)
        if " send " in f" {actual} " or "/Append" in actual:
            self._capture(out)

    def _capture(self, out: str) -> None:
        if found := MSG_ID.search(out):
            self.msg_id = found.group(1)
        if found := UNIQ_KEY.search(out):
            self.uniq_key = found.group(1)


class Launcher:
    """``python -m mqstore_rpc.launcher`` as ``make run`` runs it; stdout read by a thread."""

    def __init__(self, data_dir: pathlib.Path, ports: tuple[int, int, int, int]):
        command = [sys.executable, "-m", "mqstore_rpc.launcher", "--data-dir", str(data_dir),
                   "--commitlog-port", str(ports[0]), "--index-port", str(ports[1]), "--txn-port", str(ports[2]),
                   "--gateway-port", str(ports[3])]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="launcher-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def banner(self) -> str:
        seen: list[str] = []
        while True:
            line = self.lines.get(timeout=START_TIMEOUT_S)
            assert line is not None, f"the launcher exited {self.process.wait()} before its banner: {seen}"
            seen.append(line)
            if line.strip() == BANNER_END:
                return "".join(seen)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_S * 3)
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
                     "mqstore receive demo", "xargs mqstore ack demo", "mqstore.v1.Consumer/Receive"):
        assert any(expected in c for c in commands), f"no runnable README command contains {expected!r}"


def test_readme_and_banner_examples_run_as_written(tmp_path):
    ports = (free_port(), free_port(), free_port(), free_port())
    launcher = Launcher(tmp_path / "data", ports)
    try:
        banner = launcher.banner()
        shell = Shell(f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}")
        for command in runnable_commands(README.read_text()):
            shell.run(command)
        assert shell.msg_id and shell.uniq_key and shell.msg_id != shell.uniq_key
        commands = banner_commands(banner)
        assert f"export MQSTORE_ADDRESS={shell.log_address} MQSTORE_INDEX_ADDRESS={shell.index_address} " \
               f"MQSTORE_TXN_ADDRESS={shell.txn_address} MQSTORE_GATEWAY_ADDRESS=127.0.0.1:{ports[3]}" in commands, \
            banner
        banner_shell = Shell(shell.log_address, shell.index_address, shell.txn_address)
        for command in commands:
            banner_shell.run(command)
    finally:
        assert launcher.stop() == 0
