"""The compiled index build against the pure-Python reference (mqstore.codec._index).

The same random Tail frames go to two IndexStores of tiny files: one through the reference
(decode.decode_frame, IndexStore.apply of IndexRecords: records.index_keys, Writer.put, put_hashes), one
through the compiled path (columns.decode_columns, IndexStore.apply of IndexColumns: Writer.put_columns,
IndexFile.put_columns). Records have keys, UNIQ_KEYs, duplicates, more keys than max_keys (and more than
the C rules take), empty and rolled-back topics, text that is not valid UTF-8, several topics and host
layouts; frames may be damaged and are sometimes fed twice (the follower's re-feed), also after a
simulated crash between the header and the slots of the last put. Every apply must
give the same outcome (applied, skipped, dropped keys) and damaged ranges, and at the end both index
directories must hold the same files, byte for byte. The compiled module is imported directly, so
these run under MQSTORE_PURE_PYTHON=1 too (the codec's choice is then replaced for the test's duration).
"""

from __future__ import annotations

import contextlib
import pathlib
import tempfile
import types
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.index import columns
from mqstore.index.config import IndexConfig
from mqstore.index.decode import decode_frame
from mqstore.index.store import IndexStore
from mqstore import codec
from mqstore.clock import FakeClock
from mqstore.format.index_file import CorruptIndexFile, key_hash
from tests.support import compiled as support_compiled
from tests.support import records

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_index")

SETTINGS = support_compiled.examples(300)
BASE = 1 << 20
BASE_MS = 1_700_000_000_000
HOSTS = (records.LOOPBACK_V4, records.LOOPBACK_V6)

text = st.text(st.sampled_from(["a", "b", "Z", " ", " ", "é", "中", "😀", "#", "\x00"]), max_size=10)
value = st.one_of(text.map(lambda s: s.encode()), st.sampled_from([b"", b"\xff", b"a\xc3", b"k\xed\xa0\x80"]))
many_keys = st.builds(lambda n, distinct: " ".join(f"k{i % distinct}" for i in range(n)).encode(),
                      st.integers(1, 90), st.integers(1, 90))
few_keys = st.lists(st.sampled_from(["a", "b", "k1", "é", "", "0A0B0C0D0001"]), min_size=1, max_size=6).map(
    lambda keys: " ".join(keys).encode())  # duplicates, a UNIQ_KEY among the KEYS, double spaces
entry = st.tuples(st.sampled_from([b"KEYS", b"KEYS", b"UNIQ_KEY", b"UNIQ_KEY", b"TAGS", b"MYKEYS", b"a"]),
                  st.one_of(value, many_keys, few_keys, st.sampled_from([b"0A0B0C0D0001", b"0A0B0C0D0002", b"a"])))


@st.composite
def properties(draw) -> bytes:
    entries = draw(st.lists(entry, max_size=4))
    raw = b"\x02".join(name + b"\x01" + v for name, v in entries)
    return raw + b"\x02" if entries and draw(st.booleans()) else raw


one_record = st.fixed_dictionaries({
    "topic": st.sampled_from([b"T", b"T", b"orders", "é".encode(), "😀".encode(), b"", b"\xff\xfe"]),
    "properties": properties(), "body": st.binary(max_size=20), "sys_flag": st.sampled_from([0, 0x4, 0x8, 0xC]),
    "born_host": st.sampled_from(HOSTS), "store_host": st.sampled_from(HOSTS),
    "store_timestamp_ms": st.one_of(st.integers(BASE_MS - 3_000, BASE_MS + 600_000),
                                    st.sampled_from([0, -1, 1 << 62, -(1 << 62)])),
})


@st.composite
def frames(draw) -> list[tuple[bytes, int]]:
    """Consecutive Tail frames (bytes, next physical offset), whole records, some damaged."""
    specs = draw(st.lists(one_record, max_size=14))
    encoded = []
    position = BASE
    for spec in specs:
        encoded.append(records.encode(physical_offset=position, **spec))
        position += len(encoded[-1])
    cuts = sorted(draw(st.lists(st.integers(0, len(encoded)), max_size=3)))
    out = []
    for start, end in zip([0, *cuts], [*cuts, len(encoded)], strict=True):
        data = bytearray(b"".join(encoded[start:end]))
        next_offset = BASE + sum(len(r) for r in encoded[:end])
        if data and draw(st.integers(0, 3)) == 0:
            at = draw(st.integers(0, len(data) - 1))
            how = draw(st.sampled_from(["flip", "cut", "int32"]))
            if how == "flip":
                data[at] ^= draw(st.integers(1, 255))
            elif how == "cut":
                del data[at:]
            elif at + 4 <= len(data):  # e.g. a TOTALSIZE or CRC
                data[at:at + 4] = draw(st.sampled_from([0, 91, 0x7FFFFFFF, 0xDAA320A7])).to_bytes(4, "big")
        out.append((bytes(data), next_offset))
    return out


@contextlib.contextmanager
def compiled_codec():
    """The compiled IndexColumns as the codec's choice, also when MQSTORE_PURE_PYTHON=1 made none."""
    if codec.compiled is not None:
        yield
        return
    with mock.patch.object(codec, "compiled", types.SimpleNamespace(IndexColumns=compiled.IndexColumns)):
        yield


def open_store(root: pathlib.Path, config: dict) -> IndexStore:
    store = IndexStore(IndexConfig(root, checkpoint_interval_ms=1 << 40, **config), clock=FakeClock(BASE_MS))
    store.start()
    return store


def apply_reference(store: IndexStore, data: bytes, next_offset: int):
    decoded = decode_frame(data, next_offset)
    return store.apply(decoded.records, next_offset), decoded.damaged


def apply_compiled(store: IndexStore, data: bytes, next_offset: int):
    decoded = columns.decode_columns(data, next_offset, store.config.max_keys_per_message)
    return store.apply(decoded.columns, next_offset), decoded.damaged


def index_files(root: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "index").iterdir()) if p.suffix == ".idx"}


configs = st.integers(1, 4).flatmap(lambda max_keys: st.fixed_dictionaries({
    "slot_count": st.integers(1, 5), "max_keys_per_message": st.just(max_keys),
    "entry_count": st.integers(max_keys + 1, max_keys + 9)}))


def tear_last_message(store: IndexStore) -> None:
    """What a crash between the header and the slots of the last put leaves: its entries and the header
    are written, its slots still point where they did before (the writer finishes it when fed again)."""
    current = store._writer.current
    if current is None or current.file.header.entries == 0:
        return
    file = current.file
    number = file.header.index_count - 1
    while number > 1 and file.entry(number - 1).phy_offset == file.header.end_phy_offset:
        number -= 1
    restored: set[int] = set()
    for n in range(number, file.header.index_count):
        entry = file.entry(n)
        slot = entry.key_hash % file.slot_count
        if slot not in restored:
            restored.add(slot)
            file._mm[40 + 4 * slot:44 + 4 * slot] = entry.prev_index.to_bytes(4, "big")


@SETTINGS
@given(configs, frames(), st.lists(st.sampled_from(["next", "next", "again", "previous", "tear"]), max_size=8))
def test_the_compiled_build_writes_the_reference_files(config, frame_list, steps):
    with tempfile.TemporaryDirectory() as tmp, compiled_codec():
        reference, built = open_store(pathlib.Path(tmp) / "ref", config), open_store(pathlib.Path(tmp) / "c", config)
        try:
            fed = 0
            for step in ["next"] * len(frame_list) + steps:
                if step == "next" and fed < len(frame_list):
                    fed += 1
                if step == "tear":  # then the frame is fed again
                    tear_last_message(reference)
                    tear_last_message(built)
                index = fed - 1 if step != "previous" else fed - 2
                if index < 0:
                    continue
                data, next_offset = frame_list[index]
                expected_outcome, expected_damaged = apply_reference(reference, data, next_offset)
                outcome, damaged = apply_compiled(built, data, next_offset)
                assert (outcome, damaged) == (expected_outcome, expected_damaged)
                assert built.stats() == reference.stats()
            assert index_files(pathlib.Path(tmp) / "c") == index_files(pathlib.Path(tmp) / "ref")
        finally:
            reference.close()
            built.close()


def test_a_bad_slot_stops_both_paths_with_the_same_error_and_bytes(tmp_path):
    """A slot that points past indexCount (a damaged file), met by the second message of a frame: both
    raise CorruptIndexFile, with the first message indexed, the same bytes and the same end offset."""
    first = records.encode(topic=b"T", body=b"x", properties=b"KEYS\x01a", physical_offset=BASE,
                           store_timestamp_ms=BASE_MS)
    second = records.encode(topic=b"T", body=b"x", properties=b"KEYS\x01b c", physical_offset=BASE + len(first),
                            store_timestamp_ms=BASE_MS + 5_000)
    third = records.encode(topic=b"T", body=b"x", properties=b"KEYS\x01d", physical_offset=BASE + len(first)
                           + len(second), store_timestamp_ms=BASE_MS + 9_000)
    frame = second + third
    config = {"slot_count": 1000, "entry_count": 20, "max_keys_per_message": 4}
    bad_slot = key_hash("T#d") % 1000
    assert bad_slot not in {key_hash(f"T#{k}") % 1000 for k in "abc"}
    errors, files, ends = [], [], []
    with compiled_codec():
        for name, apply in (("ref", apply_reference), ("c", apply_compiled)):
            store = open_store(tmp_path / name, config)
            try:
                apply(store, first, BASE + len(first))
                current = store._writer.current.file
                current._mm[40 + 4 * bad_slot:44 + 4 * bad_slot] = (7).to_bytes(4, "big")  # entry 7 of 1
                with pytest.raises(CorruptIndexFile) as raised:
                    apply(store, frame, BASE + len(first) + len(frame))
                errors.append(raised.value.reason)
                ends.append(store.stats().indexed_end_physical_offset)
            finally:
                store.close()
            files.append(index_files(tmp_path / name))
    assert errors[0] == errors[1] == f"slot {bad_slot} points at 7, indexCount is 4"
    assert ends[0] == ends[1] == BASE + len(first)
    assert files[0] == files[1]


@SETTINGS
@given(properties(), st.sampled_from([b"T", "é".encode(), b"\xff"]), st.sampled_from([0, 0xC]), st.integers(1, 300))
def test_the_compiled_keys_are_the_reference_keys(raw, topic, sys_flag, max_keys):
    """One record's hashes, dropped count and topic, straight from the columns, against the reference."""
    data = records.encode(topic=topic, body=b"x", properties=raw, sys_flag=sys_flag, physical_offset=BASE,
                          store_timestamp_ms=BASE_MS)
    reference = columns._Reference(max_keys)
    built = compiled.IndexColumns(max_keys, reference)
    assert built.add(data, 0, BASE) == len(data)
    hashes, dropped, name = reference(BASE, sys_flag, BASE_MS, topic, raw)
    assert built.hashes_of(0) == hashes
    assert built.dropped == ({0: (dropped, name)} if dropped else {})
    assert (len(built), built.physical_offset(0), built.store_timestamp_ms(0)) == (1, BASE, BASE_MS)
