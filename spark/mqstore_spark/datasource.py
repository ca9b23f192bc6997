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
partition per segment file.

The path may be a tier URL (mqstore.tier): ``s3://BUCKET[/PREFIX]`` or ``file:///DIR``. Every object under
it is listed once (on the planning side) and each segment object is a partition, read on an executor by range
GETs (mqstore.tier.objects.read_whole): compaction log segments ``.../<20 digits>.log``, commit log segments
``.../<20 digits>``, and the commit log tier's uploads ``.../commitlog/<20 digits>/<upload id>`` (one object
per segment: every upload of a segment holds the segment's same bytes, so the first by key is read).

  df = spark.read.format("mqstore").option("endpoint", "http://minio:9000").load("s3://bucket/mqstore")

For ``s3://``: options ``endpoint`` and ``region`` (else the executors' AWS_ENDPOINT_URL and AWS_REGION),
credentials from the executors' AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, or the
options ``access_key_id`` and ``secret_access_key`` (which the query plan shows: prefer the environment);
``timeout_ms`` bounds each call to the store (default 60000).

A segment ends at its blank record or at the zeros after its last record (a preallocated
commit log segment); any other bad record fails the read, naming the file and position.

Executors need pyarrow and the project's Python (set PYSPARK_PYTHON before the session starts).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from mqstore.format import compaction_segment as cseg, segment_name
from mqstore.format.record import PROPERTY_KEYS, PROPERTY_TAGS
from mqstore.format.record_reader import RecordError, check, is_blank, RecordView
from mqstore.compaction.rounds import key_and_tombstone
from mqstore.compaction.tier_round import open_round_store, with_credentials
from mqstore.tier.objects import read_whole

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


_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$|^[0-9a-f-]{36}$")


def tier_segments(keys: list[str]) -> list[tuple[str, int]]:
    """(key, base) of the segment objects among ``keys``, sorted by key: ``<20 digits>.log`` and ``<20
    digits>`` objects, and one upload per segment of the commit log tier's ``<20 digits>/<upload id>``."""
    found, uploads = [], set()
    for key in sorted(keys):
        parts = key.split("/")
        base = segment_base(pathlib.PurePosixPath(parts[-1]))
        if base is None and len(parts) >= 2 and _UPLOAD_ID.match(parts[-1]):
            base = segment_base(pathlib.PurePosixPath(parts[-2]))
            if base is None or (tuple(parts[:-2]), base) in uploads:
                continue
            uploads.add((tuple(parts[:-2]), base))
        if base is not None:
            found.append((key, base))
    return found


def tier_settings(url: str, options: dict, env) -> dict:
    """What a task needs to open the tier of ``url`` (its credentials included)."""
    tier = {"url": url, "endpoint": options.get("endpoint") or env.get("AWS_ENDPOINT_URL", ""),
            "region": options.get("region") or env.get("AWS_REGION", "") or env.get("AWS_DEFAULT_REGION", ""),
            "timeout_ms": int(options.get("timeout_ms", 60_000))}
    if options.get("access_key_id"):
        tier["credentials"] = {"access_key_id": options["access_key_id"],
                               "secret_access_key": options.get("secret_access_key", ""), "session_token": ""}
    return with_credentials(tier, env)


def read_segment(path: str, fields: tuple[str, ...] = FIELDS):
    """Rows of one segment file, in log order: the values of ``fields`` (SCHEMA's names)."""
    p = pathlib.Path(path)
    yield from read_records(path, segment_base(p), p.read_bytes(), fields)


def read_records(path: str, base: int, data: bytes, fields: tuple[str, ...] = FIELDS):
    """Rows of one segment's bytes (``path`` names it in errors and the file column)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"the mqstore data source has no column {sorted(unknown)[0]!r}; its columns: {SCHEMA}")
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


class ObjectPartition(InputPartition):
    def __init__(self, key: str, base: int):
        super().__init__(key)
        self.key, self.base = key, base


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
        self.fields, self.tier, self.objects = fields, None, []
        files = options.get("files")
        if "://" in options.get("path", ""):
            self.tier = tier_settings(options["path"], options, os.environ)
            with contextlib.closing(open_round_store(self.tier)) as store:
                self.objects = tier_segments([info.key for info in store.list("")])
        elif files:
            self.files = [f for f in files.split(",") if f]
        elif options.get("path"):
            self.files = segment_files(options["path"])
        else:
            raise ValueError('the mqstore data source needs a path (load("dir")) or option("files", "a,b")')

    def partitions(self):
        if self.tier is not None:
            return [ObjectPartition(key, base) for key, base in self.objects]
        return [SegmentPartition(path) for path in self.files]

    def read(self, partition):
        if isinstance(partition, ObjectPartition):
            with contextlib.closing(open_round_store(self.tier, workers=1)) as store:
                data = read_whole(store, partition.key)
            yield from read_records(f"{self.tier['url'].rstrip('/')}/{partition.key}", partition.base, data,
                                    self.fields)
            return
        yield from read_segment(partition.path, self.fields)
