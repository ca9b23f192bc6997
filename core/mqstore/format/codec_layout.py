"""The compiled codec's record and consume queue layouts checked against mqstore.format's, at import.

The compiled modules (mqstore.codec) write and read records where they were built to; this module, run
at import by the modules that use them (mqstore.log.encoder for the log and its queues,
mqstore.compaction.rounds for compaction), refuses to go on when that differs from the one definition
here (record, cq_unit): the codec was built from older sources. mqstore.codec imports no module of
mqstore.format, nor do its compiled modules import any module that does (WireMessages.to_messages is
given mqstore.model's MessageIn: tests/test_layering_core.py); the index layout is checked by
format.index_file.

Thread-safety: runs once, at import.
"""

from __future__ import annotations

from mqstore import codec
from mqstore.errors import invariant
from mqstore.format import cq_unit, record


def check_layout(writes: dict, reads: dict, stamps: dict) -> None:
    """The compiled encoder writes records, the compiled walk reads them and the stamp fills them where
    mqstore.format.record and cq_unit (the one definition) say."""
    layout = record.IPV4
    expected = {name: getattr(layout, name, None) for name in writes}
    expected.update(magic=record.MAGIC_V1, fixed_overhead=record.FIXED_OVERHEAD, blank_size=record.BLANK_SIZE,
                    max_properties_bytes=record.MAX_PROPERTIES_BYTES)
    invariant(writes == expected, f"the compiled codec writes records at {writes}, mqstore.format.record says "
                                  f"{expected}: rebuild it (make setup) after changing the layout")
    expected = {"body_at": record.BODY_AT, "store_timestamp_at": record.STORE_TIMESTAMP_AT}
    invariant(reads == expected, f"the compiled record walk reads records at {reads}, mqstore.format.record says "
                                 f"{expected}: rebuild it (make setup) after changing the layout")
    expected = dict(queue_offset_at=record.QUEUE_OFFSET_AT, physical_offset_at=record.QUEUE_OFFSET_AT + 8,
                    sys_flag_host_byte_at=record.SYS_FLAG_HOST_BYTE_AT, hosts_v6=record.SYSFLAG_HOSTS_V6,
                    layout_shift=record.LAYOUT_SHIFT, blank_size=record.BLANK_SIZE, tx_mask=record.SYSFLAG_TX_MASK,
                    tx_prepared=record.SYSFLAG_TX_PREPARED, tx_rollback=record.SYSFLAG_TX_ROLLBACK,
                    cq_entry=cq_unit.ENTRY.size, store_timestamp_at=record.STORE_TIMESTAMP_AT)
    invariant(stamps == expected and record.OFFSETS.format == ">qq" and cq_unit.ENTRY.format == ">qiq",
              f"the compiled stamp writes at {stamps}, mqstore.format says {expected}: rebuild it (make setup) "
              f"after changing the layout")


def check_replay_layout(reads: dict) -> None:
    """The compiled consume-queue rebuild (_replay) reads records and writes entries where
    mqstore.format.record and cq_unit say."""
    expected = dict(body_at=record.BODY_AT, store_timestamp_at=record.STORE_TIMESTAMP_AT,
                    magic_blank=record.MAGIC_BLANK, fixed_overhead=record.FIXED_OVERHEAD,
                    queue_id_at=record.QUEUE_ID_AT, queue_offset_at=record.QUEUE_OFFSET_AT,
                    tx_mask=record.SYSFLAG_TX_MASK, tx_prepared=record.SYSFLAG_TX_PREPARED,
                    tx_rollback=record.SYSFLAG_TX_ROLLBACK, cq_entry=cq_unit.ENTRY.size)
    invariant(reads == expected and cq_unit.ENTRY.format == ">qiq",
              f"the compiled consume-queue rebuild reads records at {reads}, mqstore.format says {expected}: "
              f"rebuild it (make setup) after changing the layout")


def check_compiled() -> None:
    """Both checks on the compiled codec in use (none on the pure-Python one)."""
    if codec.compiled is not None:
        check_layout(codec.compiled.records_writes, codec.compiled.scan_layout, codec.compiled.stamp_layout)
        check_replay_layout(codec.compiled.replay_layout)


check_compiled()
