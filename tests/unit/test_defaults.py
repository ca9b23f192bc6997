"""One place for every default (issue 33, item 5): the default ports, addresses and the gRPC message limit
are spelled in ``core/mqstore/defaults.py`` only. Every other Python source of the product and its tools
(core, services, spark, bench, scripts; not tests, not the generated stubs) takes them from there.

The scan reads code, not prose: comments and docstrings are left out (they tell the reader the value; what
runs, flag help included, is built from the module). A literal that is right where it is, because it is
another quantity that happens to have the same value, is in ALLOWED with the reason.
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

from mqstore import defaults

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCANNED = ("core", "services", "spark", "bench", "scripts")
DEFAULTS_MODULE = ROOT / "core" / "mqstore" / "defaults.py"

# What must not be spelled outside defaults.py: the services' default ports (and the HA nodes' and the
# metrics ports derived from them), and the 64 MiB gRPC message limit in each of the ways it was written.
PORTS = re.compile(r"(?<![\d.])(5005[1-4]|50061|50071|5015[1-4]|8081|8181)(?!\d)")
MESSAGE_LIMIT = re.compile(r"\b64\s*\*\s*MiB\b|\b64\s*<<\s*20\b|\b67108864\b|\b64\s*\*\s*1024\s*\*\s*1024\b")

# (file relative to the root, a piece of the line) -> why the literal is right there.
ALLOWED = {
    ("core/mqstore/config.py", "warm_ahead_bytes: int = 64 * MiB"):
        "page cache kept ahead of the log's write position, a tuning size, not the message limit",
    ("core/mqstore/log/recovery.py", "_PROGRESS_STEP = 64 << 20"): "bytes of log walked between progress calls",
    ("core/mqstore/timer/files.py", "UNITS_READ_BYTES = 64 << 20"):
        "the span of a slot's timer units read in one pread, a read size, not the message limit",
    ("core/mqstore/auth/secrets.py", "maxmem=64 << 20"): "scrypt's memory bound, not a message size",
    ("core/mqstore/tier/config.py", 'tier_cache_bytes: int = dataclasses.field(default=64 << 20, metadata={"help": ('):
        "the object storage tier's read cache budget, not a message size",
    ("core/mqstore/tier/config.py", "tier_upload_max_bytes_per_second: int = dataclasses.field(default=64 << 20"):
        "the object storage tier's upload quota, a byte rate, not a message size",
    ("bench/tier_upload.py", 'FULL = {"segment_bytes": 64 * MiB'):
        "the commit log segment size of the tier upload benchmark",
    ("core/mqstore/compaction/policy.py", "segment_size_bytes: int = 64 << 20"):
        "a compaction log segment's size",
    ("core/mqstore/compaction/policy.py", "offset_map_memory_bytes: int = 64 << 20"):
        "the memory budget of a compaction round's key map",
    ("core/mqstore/replication/config.py", "isr_max_lag_bytes: int = 64 << 20"):
        "how far behind a replica may be before it leaves the in-sync set",
    ("services/launcher/mqstore_launcher/launcher.py", "EMBEDDED_SEGMENT_BYTES = 64 * MiB"):
        "the commit log segment size of a data dir that make run creates",
    ("scripts/compose_ops_smoke.py", "port=8081"):
        "the gateway's port inside the compose network, which a RocketMQ client names in its QueryRoute",
}


def _prose_lines(source: str) -> set[int]:
    """Lines of docstrings (module, class, function)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(path: pathlib.Path) -> dict[int, str]:
    """line number -> the line's code, without comments and docstrings."""
    source = path.read_text(encoding="utf-8")
    prose = _prose_lines(source)
    out: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if token.start[0] in prose:
            continue
        for number, text in enumerate(token.string.splitlines() or [""], token.start[0]):
            out[number] = f"{out.get(number, '')} {text}"
    return out


def sources() -> list[pathlib.Path]:
    return sorted(p for top in SCANNED for p in (ROOT / top).rglob("*.py")
                  if "gen" not in p.relative_to(ROOT).parts and p != DEFAULTS_MODULE)


def literals(paths: list[pathlib.Path]) -> list[tuple[str, int, str]]:
    """(file, line, the line) for every default literal in the code of ``paths`` that ALLOWED does not name."""
    found = []
    for path in paths:
        relative = str(path.relative_to(ROOT))
        raw = path.read_text(encoding="utf-8").splitlines()
        for number, code in code_lines(path).items():
            if not (PORTS.search(code) or MESSAGE_LIMIT.search(code)):
                continue
            line = raw[number - 1]
            if not any(file == relative and piece in line for file, piece in ALLOWED):
                found.append((relative, number, line.strip()))
    return found


def test_no_default_port_address_or_message_limit_is_spelled_outside_the_defaults_module():
    found = literals(sources())
    assert found == [], ("take these from mqstore.defaults (or, for another quantity of the same value, add "
                         "the line to ALLOWED in tests/unit/test_defaults.py with the reason):\n"
                         + "\n".join(f"  {f}:{n}: {line}" for f, n, line in found))


def test_every_allowed_literal_is_still_there():
    """An entry of ALLOWED whose line is gone is dropped, so the list stays the list of exceptions."""
    stale = [(file, piece) for file, piece in ALLOWED
             if not (ROOT / file).exists() or piece not in (ROOT / file).read_text(encoding="utf-8")]
    assert stale == []


def test_the_scan_finds_a_literal_in_code_and_not_in_prose(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Serves on 127.0.0.1:50051 by default."""\n'
                      '# the limit: 64 * MiB\n'
                      'ADDRESS = "127.0.0.1:50053"\n'
                      'def f():\n'
                      '    """Port 8081."""\n'
                      '    return [("grpc.max_send_message_length", 64 << 20)]  # 50052\n'
                      'PORT = 150051\n')
    assert [(n, line) for _, n, line in literals_of(sample)] == [
        (3, 'ADDRESS = "127.0.0.1:50053"'), (6, 'return [("grpc.max_send_message_length", 64 << 20)]  # 50052')]


def literals_of(path: pathlib.Path) -> list[tuple[str, int, str]]:
    raw = path.read_text(encoding="utf-8").splitlines()
    return [(str(path), n, raw[n - 1].strip()) for n, code in code_lines(path).items()
            if PORTS.search(code) or MESSAGE_LIMIT.search(code)]


def test_the_defaults_are_what_the_flags_and_clients_say():
    from commitlog_service import main as commitlog_main
    from compactor_service import main as compactor_main
    from gateway_service import main as gateway_main
    from index_service import main as index_main
    from mqstore.config import StoreConfig
    from mqstore_cli import args as cli_args, compactor as cli_compactor, index as cli_index, top as cli_top
    from mqstore_cli import txn as cli_txn
    from mqstore_launcher import launcher
    from mqstore_rpc import settings
    from mqstore_rpc.server import ServerConfig
    from txn_service import main as txn_main

    assert (defaults.COMMITLOG_ADDRESS, defaults.INDEX_ADDRESS, defaults.TXN_ADDRESS, defaults.COMPACTOR_ADDRESS,
            defaults.GATEWAY_ADDRESS) == ("127.0.0.1:50051", "127.0.0.1:50052", "127.0.0.1:50053",
                                          "127.0.0.1:50054", "127.0.0.1:8081")
    assert defaults.MAX_MESSAGE_BYTES == 64 * 1024 * 1024 and defaults.METRICS_PORT_OFFSET == 100
    assert [commitlog_main.DEFAULT_PORT, index_main.DEFAULT_PORT, txn_main.DEFAULT_PORT, compactor_main.DEFAULT_PORT,
            gateway_main.DEFAULT_PORT] == [e.default_port for e in launcher.SERVICES]
    assert {index_main.DEFAULT_COMMITLOG, txn_main.DEFAULT_COMMITLOG, compactor_main.DEFAULT_COMMITLOG,
            gateway_main.DEFAULT_COMMITLOG, cli_args.DEFAULT_ADDRESS} == {defaults.COMMITLOG_ADDRESS}
    assert (cli_index.DEFAULT_INDEX_ADDRESS, cli_txn.DEFAULT_TXN_ADDRESS, cli_compactor.DEFAULT_ADDRESS,
            cli_top.DEFAULT_GATEWAY_ADDRESS, gateway_main.DEFAULT_TXN) == (
        defaults.INDEX_ADDRESS, defaults.TXN_ADDRESS, defaults.COMPACTOR_ADDRESS, defaults.GATEWAY_ADDRESS,
        defaults.TXN_ADDRESS)
    assert settings.METRICS_PORT_OFFSET == launcher.METRICS_PORT_OFFSET == cli_top.METRICS_PORT_OFFSET == 100
    assert ServerConfig().max_message_bytes == defaults.MAX_MESSAGE_BYTES and ServerConfig().host == defaults.HOST
    config = StoreConfig(data_dir=pathlib.Path("unused"))
    assert (config.store_host, config.store_port) == (defaults.HOST, defaults.COMMITLOG_PORT)
