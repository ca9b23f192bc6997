"""mqstore.codec's choice at import: compiled when built, else the pure-Python path with one warning."""

from __future__ import annotations

import sys

import pytest
from structlog.testing import capture_logs

from mqstore import codec
from mqstore.format import codec_layout
from tests.support import compiled as support_compiled

pytestmark = pytest.mark.codec


def test_an_unbuilt_extension_gives_the_python_path_with_the_reason(monkeypatch):
    monkeypatch.delenv(codec.ENV_PURE_PYTHON, raising=False)
    # The import fails as if the extension had never been built.
    monkeypatch.setitem(sys.modules, "mqstore.codec._records", None)
    monkeypatch.delattr(codec, "_records", raising=False)
    compiled, reason = codec._load()
    assert compiled is None
    assert "not built" in reason and "make setup" in reason


def test_the_environment_forces_the_python_path(monkeypatch):
    monkeypatch.setenv(codec.ENV_PURE_PYTHON, "1")
    assert codec._load() == (None, f"{codec.ENV_PURE_PYTHON}=1 asks for the pure-Python codec")
    monkeypatch.setenv(codec.ENV_PURE_PYTHON, "0")
    compiled, reason = codec._load()
    assert reason == "" or "not built" in reason  # "0" does not force it


def test_the_python_path_is_announced_once_per_process(monkeypatch):
    monkeypatch.setattr(codec, "compiled", None)
    monkeypatch.setattr(codec, "REASON", "because")
    monkeypatch.setattr(codec, "_announced", False)
    with capture_logs() as logs:
        for _ in range(3):
            codec.announce()
    assert logs == [{"event": "codec.pure_python", "reason": "because", "log_level": "warning"}]


def test_the_compiled_code_writes_and_reads_where_the_record_module_says():
    # The modules themselves, not codec.compiled: so this also runs under MQSTORE_PURE_PYTHON=1.
    _records, _scan, _stamp = (support_compiled.module(name) for name in ("_records", "_scan", "_stamp"))
    codec_layout.check_layout(_records.WRITES, _scan.LAYOUT, _stamp.LAYOUT)
    from mqstore.errors import InvariantViolation
    with pytest.raises(InvariantViolation, match="writes records at"):
        codec_layout.check_layout({**_records.WRITES, "body_at": 87}, _scan.LAYOUT, _stamp.LAYOUT)
    with pytest.raises(InvariantViolation, match="reads records at"):
        codec_layout.check_layout(_records.WRITES, {**_scan.LAYOUT, "body_at": (88, 100, 100, 100)}, _stamp.LAYOUT)
    with pytest.raises(InvariantViolation, match="stamp writes at"):
        codec_layout.check_layout(_records.WRITES, _scan.LAYOUT, {**_stamp.LAYOUT, "queue_offset_at": 24})


@pytest.mark.parametrize("first", ["mqstore.codec", "mqstore.compaction.rounds", "mqstore.model", "mqstore.format"])
def test_any_first_import_of_the_codec_or_the_formats_loads(first):
    # A Spark worker's first import is the compaction round (and so the codec, whose compiled modules import
    # mqstore.model and so format.record): when format's __init__ checked the codec, that process met the
    # codec half made ("partially initialized module 'mqstore.codec'") and every Spark round failed.
    import subprocess
    program = f"import {first}; import mqstore.log.encoder, mqstore.compaction.rounds"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
