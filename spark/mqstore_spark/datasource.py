"""``spark.read.format("mqstore")``: a DataFrame of the messages in mqstore's log files (Spark 4's Python
Data Source API), decoded by the project's one record reader (mqstore.format.record_reader).

  spark.dataSource.register(MqstoreDataSource)
  df = spark.read.format("mqstore").load("data/compactor/logs")      # every compaction log under it
  df = spark.read.format("mqstore").load("data/commitlog")           # the commit log's segments
  df.groupBy("topic").count().show()

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


def read_segment(path: str):
    """Rows of one segment file, in log order."""
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
        view = RecordView(data, at)
        raw = memoryview(data)[at:at + size]
        key, tombstone = key_and_tombstone(raw)
        yield (path, base + at, view.topic, view.queue_id, view.queue_offset, key, view.property(PROPERTY_KEYS),
               view.property(PROPERTY_TAGS), view.body, tombstone, view.store_timestamp_ms, view.born_timestamp_ms,
               size)
        at += size


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
        return MqstoreReader(dict(self.options))


class MqstoreReader(DataSourceReader):
    def __init__(self, options: dict):
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
        yield from read_segment(partition.path)
