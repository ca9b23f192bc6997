"""``spark.read.format("mqstore")``: a DataFrame of the messages in mqstore's log files (Spark 4's Python
Data Source API), decoded by the project's one record reader (mqstore.format.record_reader).

  spark.dataSource.register(MqstoreDataSource)
  df = spark.read.format("mqstore").load("data/compactor/logs")      # every compaction log under it
  df = spark.read.format("mqstore").load("data/commitlog")           # the commit log's segments
  df.groupBy("topic").count().show()

A narrower schema (``.schema("file string, position long, key string")``, any of SCHEMA's columns by
name) makes the reader decode and ship only those columns (the compactor's round needs no bodies).

Options: the path (a directory, searched recursively for compaction log segments ``<20 digits>.log`` and
commit log segments ``<20 digits>``), or ``files`` (a comma-separated list of segment files). One
partition per segment file. A segment ends at its blank record or at the zeros after its last record
(a preallocated commit log segment); any other bad record fails the read, naming the file and position.

Executors need pyarrow and the project's Python (set PYSPARK_PYTHON before the session starts).
"""

from __future__ import annotations

import pathlib

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from mqstore.format import compaction_segment as cseg, segment_name
from mqstore.format.record import PROPERTY_KEYS, PROPERTY_TAGS
from mqstore.format.record_reader import RecordError, check, is_blank, RecordView
from mqstore.compaction.rounds import key_and_tombstone

SCHEMA = ("file string, position long, topic string, queue_id int, queue_offset long, key string, keys string, "
          "tags string, body binary, tombstone boolean, store_timestamp_ms long, born_timestamp_ms long, size int")


def segment_base(path: pathlib.Path) -> int | None:
    """The base position of a segment file (compaction log or commit log), None for any other file."""
    base = cseg.parse_log_name(path.name)
    if base is not None:
        return base
    try:
        return segment_name.parse(path.name)
    except ValueError:
        return None


def segment_files(root: str) -> list[str]:
    top = pathlib.Path(root)
    if top.is_file():
        return [str(top)]
    return sorted(str(p) for p in top.rglob("*") if p.is_file() and segment_base(p) is not None)


FIELDS = tuple(part.split()[0] for part in SCHEMA.split(", "))


def read_segment(path: str, fields: tuple[str, ...] = FIELDS):
    """Rows of one segment file, in log order: the values of ``fields`` (SCHEMA's names)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"the mqstore data source has no column {sorted(unknown)[0]!r}; its columns: {SCHEMA}")
    p = pathlib.Path(path)
    base = segment_base(p)
    data = p.read_bytes()
    at = 0
    while at + 8 <= len(data):
        if data[at:at + 8] == bytes(8):
            return  # the zeros after the last record
        try:
            size = check(data, at, len(data), physical_offset=base + at)
        except RecordError as exc:
            raise RecordError(exc.reason, f"{path}: {exc}", at) from None
        if is_blank(data, at):
            return
        yield tuple(_column(name, path, base, data, at, size) for name in fields)
        at += size


def _column(name: str, path: str, base: int, data: bytes, at: int, size: int):
    if name == "file":
        return path
    if name == "position":
        return base + at
    if name == "size":
        return size
    if name in ("key", "tombstone"):
        return key_and_tombstone(memoryview(data)[at:at + size])[name == "tombstone"]
    view = RecordView(data, at)
    if name == "keys":
        return view.property(PROPERTY_KEYS)
    if name == "tags":
        return view.property(PROPERTY_TAGS)
    return getattr(view, name)  # topic, queue_id, queue_offset, body, store/born_timestamp_ms


class SegmentPartition(InputPartition):
    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


class MqstoreDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "mqstore"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return MqstoreReader(dict(self.options), tuple(schema.fieldNames()))


class MqstoreReader(DataSourceReader):
    def __init__(self, options: dict, fields: tuple[str, ...] = FIELDS):
        self.fields = fields
        files = options.get("files")
        if files:
            self.files = [f for f in files.split(",") if f]
        elif options.get("path"):
            self.files = segment_files(options["path"])
        else:
            raise ValueError('the mqstore data source needs a path (load("dir")) or option("files", "a,b")')

    def partitions(self):
        return [SegmentPartition(path) for path in self.files]

    def read(self, partition):
        yield from read_segment(partition.path, self.fields)
