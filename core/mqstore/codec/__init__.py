"""Which codec the hot paths use: the compiled one or the pure-Python reference.

The compiled codec is a set of Cython extension modules in this package (``_request``, ``_records``,
``_responses``, ``_scan``, ``_stamp``, ``_replay``; C helpers in ``_wire.pxd`` and ``_walk.pxd``, and the body
CRC in ``_crc.h``: zlib's values, folded with PCLMULQDQ where the CPU has it, record.body_crc its reference; and
CRC-64/NVME the same way, ``_records.crc64nvme``, mqstore.format.crc64 its reference), built
by the package's own build (setup.py): Append from the request's wire bytes to encoded records (and
CommitLogInternal's AppendBatches of NOT_TYPE messages, the gateway's delayed sends among them,
``_request.parse_internal_batches``: protobuf and convert.internal_messages_in are its reference; a delayed
batch's timer records too, ``_records.timer_batch`` (of WireMessages) and ``timer_copies`` (of MessageIn:
mqstore.timer.messages' timer_records is its reference), and the timer's delivered copies from the timer records'
bytes, ``_records.timer_copy`` (the properties) and ``timer_copy_run`` (a run's records checked and copied in one
pass; mqstore.timer.delivery.copy_run is its reference): mqstore.timer's; the enqueue's noted-record check and
unit bytes, ``_records.timer_noted_units``, ``timer_note_physicals`` and ``timer_units``: mqstore.timer.runs is their
reference), their placing and stamping under the append lock (the queue offset ranges, ``_stamp.queue_ranges``)
with the consume queue entries
(mqstore.log.stamp), and the AppendResponse bytes; the PullResponse and
StoredMessage bytes (Pull, GetMessage, GetMessages) from the
stored records' bytes; the record walk with its CRC check (recovery, the Index's Tail frames:
record_scan), the consume-queue rebuild's walk (record_scan.routing_records) and the rebuild itself,
records to packed consume queue runs (``_replay``, mqstore.queue.replay); the Java hashes of
``topic#key`` (index_file.key_hashes); the compaction round's key map, a flat open-addressing table
(``_offset_map``; mqstore.compaction.offset_map.PyOffsetMap is its reference) and a compaction
record's key, tombstone flag and body (``_scan.compaction_fields``; rounds.compaction_fields_python) and a
whole segment's keys as (MD5 digest, entry) pairs in the round's buckets (``_scan.segment_keys``, MD5 in C;
rounds.segment_keys_python);
the Compactor's Scan pages, LatestValue bytes straight from a chunk of compaction log records
(``_scan.scan_values``; reads.scan's Latest items serialized by the servicer are the reference).
The pure-Python path is what the code did before it and stays as the reference: protobuf's parser,
mqstore.timer.messages' timer_records and delivered_copy,
mqstore_rpc.convert, mqstore.log.encoder and stamp, the dispatcher's replay loop. tests/property/test_codec_*.py require
both to give the same bytes and the same errors.

The Index service's build has its own module, ``_index``: Tail frames to the hashes each record indexes
and those into its IndexFile (services/index's decode, records and writer, and index_file.put_hashes are
the reference; index_file checks its layout). The record check that its walk and ``_scan``'s share is
in ``_walk.pxd``. This package sits below mqstore.format and imports none of it: each compiled module
states the layout it was built for (``records_writes``, ``scan_layout``, ``stamp_layout``,
``replay_layout``, ``index_layout``) and the format modules check it against theirs at import
(mqstore.format.codec_layout, index_file).

Why Cython, and a ``.pyx`` beside the kept Python: it is what aiokafka, grpcio, uvloop and lxml use,
it needs only gcc and the Python headers (no second toolchain), and it reaches the buffers, str and
list objects of CPython directly, which is where the time went (a Python object per proto field and
per record field). Its pure-Python mode would have kept one source, but then the reference would be
the same code as the thing it checks; separate .pyx modules keep the reference independent, and the
property tests (tests/property/test_codec_*.py) compare the two on random valid and invalid input.

The choice is made once, here, at import: the compiled codec when it is built and importable, unless
the environment variable ``MQSTORE_PURE_PYTHON`` is set to anything but "" or "0" (for the CI run that
covers the Python path, and to compare the two). This is the one module of core/mqstore that reads
the environment (STYLE.md habit 14 keeps domain code from it): the choice has to be made before any
configuration object exists, and it is a property of the process, not of a store.

A process that runs on the Python path says so once, with the reason, as the warning
``codec.pure_python`` (:func:`announce`, called when a store is built); ``ACTIVE`` is what
GetStoreInfo and ``mqstore store-info`` report.
"""

from __future__ import annotations

import os
import threading
import types

import structlog

ENV_PURE_PYTHON = "MQSTORE_PURE_PYTHON"
COMPILED = "compiled"
PYTHON = "python"

log = structlog.get_logger()


def _load() -> tuple[types.SimpleNamespace | None, str]:
    forced = os.environ.get(ENV_PURE_PYTHON, "")
    if forced not in ("", "0"):
        return None, f"{ENV_PURE_PYTHON}={forced} asks for the pure-Python codec"
    try:
        from mqstore.codec import _index, _offset_map, _records, _replay, _request, _responses, _scan, _stamp
    except ImportError as exc:
        return None, (f"the compiled codec is not built ({exc}): the package was installed without a C "
                      f"compiler, zlib.h or Cython, or its build failed (see the pip output); reinstall "
                      f"with them (make setup) for the compiled codec")
    return types.SimpleNamespace(parse_append_request=_request.parse_request, WireMessages=_request.WireMessages,
                                 parse_internal_batches=_request.parse_internal_batches,
                                 AppendEncoder=_records.AppendEncoder, crc64nvme=_records.crc64nvme,
                                 timer_batch=_records.timer_batch,
                                 timer_copies=_records.timer_copies, timer_copy=_records.timer_copy,
                                 timer_copy_run=_records.timer_copy_run,
                                 timer_noted_units=_records.timer_noted_units,
                                 timer_note_physicals=_records.timer_note_physicals,
                                 timer_units=_records.timer_units,
                                 append_response=_responses.append_response,
                                 pull_response=_responses.pull_response,
                                 stored_message=_responses.stored_message,
                                 receive_response=_responses.receive_response,
                                 scan=_scan.scan, key_hashes=_scan.key_hashes,
                                 compaction_fields=_scan.compaction_fields, segment_keys=_scan.segment_keys,
                                 scan_values=_scan.scan_values,
                                 routing_records=_scan.routing_records, place=_stamp.place,
                                 stamp=_stamp.stamp, queue_ranges=_stamp.queue_ranges, IndexColumns=_index.IndexColumns,
                                 index_layout=_index.LAYOUT, replay_runs=_replay.replay_runs,
                                 OffsetMap=_offset_map.OffsetMap, offset_map_layout=_offset_map.LAYOUT,
                                 records_writes=_records.WRITES, scan_layout=_scan.LAYOUT,
                                 stamp_layout=_stamp.LAYOUT, replay_layout=_replay.LAYOUT), ""


compiled, REASON = _load()
ACTIVE = COMPILED if compiled is not None else PYTHON

_announce_lock = threading.Lock()
_announced = False


def announce() -> None:
    """Log ``codec.pure_python`` once per process when the compiled codec is not in use. Thread-safe."""
    global _announced
    if compiled is None:
        with _announce_lock:
            if not _announced:
                _announced = True
                log.warning("codec.pure_python", reason=REASON)


def is_wire_messages(messages) -> bool:
    """True for the compiled codec's parsed messages (WireMessages), not for a list of MessageIn."""
    return compiled is not None and type(messages) is compiled.WireMessages


def is_index_columns(records) -> bool:
    """True for the compiled codec's index columns (IndexColumns), not for a sequence of IndexRecord."""
    return compiled is not None and type(records) is compiled.IndexColumns
