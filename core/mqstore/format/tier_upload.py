"""The body of a tier upload record: a record of the system topic ``RMQ_SYS_TIER_UPLOADS`` that the commit
log's leader appends itself while it uploads a sealed commit log segment to the object storage tier
(mqstore.tier.uploader), so that the uploads' state lives in the log and is replicated with it: a new leader
reads what its predecessor started from its own log (mqstore.tier.ledger), never from a local file.

An upload attempt is two records, Kafka's segment states: STARTED before the object is written, then
FINISHED once the object was read back and matched, or DISCARDED when it did not (or was never written) and
the object is gone. A FINISHED upload ends DELETED once the tier's own retention deleted its object (its segment
is past the total retention, mqstore.tier.uploader); the object goes first, so a crash between leaves a FINISHED
whose object is absent, and the next pass deletes again (absent is no error) and records DELETED.
Every record carries the whole description, so any one alone says which object it is. The record is an
ordinary commit log record (mqstore.format.record) of that topic, queue 0. Big-endian:

  offset size field            meaning
  ------ ---- ---------------- ---------------------------------------------------------------------------
       0    4 magic            0x4D515455 ("MQTU")
       4    1 version          1
       5    1 state            1 STARTED, 2 FINISHED, 3 DISCARDED, 4 DELETED (added in version 1: a node
                                   that predates it skips the record as one that does not decode)
       6   16 upload id        a fresh UUID per attempt (raw bytes); the object key holds it too
      22    8 segment base     the segment's first physical offset, >= 0
      30    8 segment size     its length in bytes (the whole file), > 0
      38   32 digest           SHA-256 of those bytes
      70    8 leader epoch     the epoch of the leader that started the attempt (0: a single node)
      78    2 key length k     1..MAX_KEY_BYTES
      80    k key              UTF-8: the object's key inside the tier URL

Version 2 (issue 36: a second kind of file) is version 1's bytes with ``version`` 2 and, after the key:

  offset size field            meaning
  ------ ---- ---------------- ---------------------------------------------------------------------------
   80+k    1 kind             1 COMMITLOG (a commit log segment), 2 CONSUME_QUEUE (a sealed consume queue file:
                                   "segment base" is the file's first byte in the queue's address space, its name)
   81+k    4 queue id         >= 0 (0 for a commit log segment)
   85+k    2 topic length t   0..MAX_TOPIC_BYTES (0 for a commit log segment)
   87+k    t topic            UTF-8

Version 3 (a topic deleted and created again under the same name) is version 2's bytes with ``version`` 3 and,
after the topic:

  offset size field            meaning
  ------ ---- ---------------- ---------------------------------------------------------------------------
 87+k+t    8 incarnation      >= 0: the topic's start_physical_offset (TopicRecord) when its file was listed,
                                   so an upload of a deleted topic's file never stands for a file of the
                                   topic created again under its name (mqstore.tier.ledger)

Version 4 (issue 36: the uploader's CPU) is version 3's bytes with ``version`` 4, the incarnation -1 allowed (a
commit log segment's, or a consume queue file's unknown one), and after the incarnation:

  offset size field            meaning
  ------ ---- ---------------- ---------------------------------------------------------------------------
 95+k+t    1 digest kind      1 SHA-256 (``digest`` as in version 1), 2 CRC-64/NVME (mqstore.format.crc64):
                                   ``digest`` is the CRC's 8 bytes big-endian, then 24 zero bytes

A record whose digest is a SHA-256 is written as before: a commit log segment's as version 1 (byte-identical to
what older nodes wrote and read); a consume queue file's as version 3 (version 2 when its incarnation is unknown,
-1: as written before it), which a node that predates it skips as one that does not decode (it never reads
consume queue files from the tier). A record whose digest is a CRC-64/NVME (what the uploader writes when the
compiled codec computes it: a sixth of a SHA-256's CPU, mqstore.tier.uploader) is always version 4; a node that
predates it skips it as one that does not decode: to it that upload never happened (it uploads the file again
if it leads, and its retention keeps the file meanwhile). A version 1 record decodes as kind COMMITLOG, a version
2 record with incarnation -1 (unknown), and every record below version 4 with digest kind SHA-256.

Source of truth: the commit log (the record's body CRC covers these bytes). A body that does not decode
(another magic or version, a short or long body, an unknown state, kind or digest kind, a CRC's padding not
zero) is ValueError.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import uuid
from dataclasses import dataclass

from mqstore.format import crc64

TOPIC = "RMQ_SYS_TIER_UPLOADS"
MAGIC = 0x4D515455
VERSION = 1
VERSION_KINDS = 2  # a record with a kind, a queue id and a topic after its key (a consume queue file's)
VERSION_INCARNATION = 3  # version 2's and the topic's incarnation after the topic
VERSION_DIGEST_KIND = 4  # version 3's (any incarnation) and the digest's kind after it
COMMITLOG, CONSUME_QUEUE = 1, 2
KIND_NAMES = {COMMITLOG: "COMMITLOG", CONSUME_QUEUE: "CONSUME_QUEUE"}
MAX_TOPIC_BYTES = 1024
STARTED, FINISHED, DISCARDED, DELETED = 1, 2, 3, 4
STATE_NAMES = {STARTED: "STARTED", FINISHED: "FINISHED", DISCARDED: "DISCARDED", DELETED: "DELETED"}
DIGEST_BYTES = 32
SHA256, CRC64NVME = 1, 2  # the digest's kind
DIGEST_NAMES = {SHA256: "SHA-256", CRC64NVME: "CRC-64/NVME"}
DIGEST_SIZES = {SHA256: 32, CRC64NVME: 8}  # an Upload's digest: the kind's own bytes (the record pads to 32)
MAX_KEY_BYTES = 1024
FIXED = struct.Struct(
    ">"
    "I"    # 0 magic
    "B"    # 4 version
    "B"    # 5 state
    "16s"  # 6 upload id
    "q"    # 22 segment base
    "q"    # 30 segment size
    "32s"  # 38 digest
    "q"    # 70 leader epoch
    "H"    # 78 key length
)
KIND = struct.Struct(">BiH")  # version 2, after the key: kind, queue id, topic length
INCARNATION = struct.Struct(">q")  # version 3, after the topic
DIGEST_KIND = struct.Struct(">B")  # version 4, after the incarnation


@dataclass(frozen=True, slots=True)
class Upload:
    state: int
    upload_id: uuid.UUID
    segment_base: int
    segment_size: int
    digest: bytes
    epoch: int
    key: str
    kind: int = COMMITLOG
    topic: str = ""  # a consume queue file's topic and queue id ("" and 0 for a commit log segment)
    queue_id: int = 0
    incarnation: int = -1  # a consume queue file's topic's start_physical_offset (-1: unknown, version 2)
    digest_kind: int = SHA256  # SHA256 (32 bytes) or CRC64NVME (8 bytes, big-endian): ``digest``'s

    def but(self, state: int) -> Upload:
        return dataclasses.replace(self, state=state)


def encode(upload: Upload) -> bytes:
    key = upload.key.encode("utf-8")
    topic = upload.topic.encode("utf-8")
    if (upload.state not in STATE_NAMES or upload.segment_base < 0 or upload.segment_size <= 0
            or len(upload.digest) != DIGEST_SIZES.get(upload.digest_kind, -1) or upload.epoch < 0
            or not 0 < len(key) <= MAX_KEY_BYTES
            or upload.kind not in KIND_NAMES or upload.queue_id < 0 or len(topic) > MAX_TOPIC_BYTES
            or (upload.kind == COMMITLOG and (topic or upload.queue_id or upload.incarnation != -1))
            or (upload.kind == CONSUME_QUEUE and not topic) or upload.incarnation < -1):
        raise ValueError(f"not a tier upload record: {upload}")
    if upload.digest_kind != SHA256:
        version = VERSION_DIGEST_KIND
    elif upload.kind == COMMITLOG:
        version = VERSION
    else:
        version = VERSION_KINDS if upload.incarnation == -1 else VERSION_INCARNATION
    fixed = FIXED.pack(MAGIC, version, upload.state, upload.upload_id.bytes, upload.segment_base,
                       upload.segment_size, upload.digest.ljust(DIGEST_BYTES, b"\0"), upload.epoch, len(key)) + key
    if version == VERSION:
        return fixed
    kinds = fixed + KIND.pack(upload.kind, upload.queue_id, len(topic)) + topic
    if version == VERSION_KINDS:
        return kinds
    incarnation = kinds + INCARNATION.pack(upload.incarnation)
    return incarnation if version == VERSION_INCARNATION else incarnation + DIGEST_KIND.pack(upload.digest_kind)


def decode(body: bytes) -> Upload:
    body = bytes(body)
    if len(body) < FIXED.size:
        raise ValueError(f"a tier upload record is at least {FIXED.size} bytes, this body {len(body)}")
    magic, version, state, upload_id, base, size, digest, epoch, key_length = FIXED.unpack_from(body, 0)
    if magic != MAGIC or version not in (VERSION, VERSION_KINDS, VERSION_INCARNATION, VERSION_DIGEST_KIND):
        raise ValueError(f"not a tier upload record of version {VERSION} to {VERSION_DIGEST_KIND}: magic "
                         f"{magic:#x}, version {version}")
    if state not in STATE_NAMES or base < 0 or size <= 0 or epoch < 0 or not 0 < key_length <= MAX_KEY_BYTES:
        raise ValueError(f"a damaged tier upload record: state {state}, base {base}, size {size}, epoch {epoch}, "
                         f"key of {key_length} bytes")
    key_end = FIXED.size + key_length
    kind, queue_id, topic, incarnation, digest_kind = COMMITLOG, 0, "", -1, SHA256
    if version in (VERSION_KINDS, VERSION_INCARNATION, VERSION_DIGEST_KIND):
        if len(body) < key_end + KIND.size:
            raise ValueError(f"a tier upload record of version {version} is at least {key_end + KIND.size} "
                             f"bytes, this body {len(body)}")
        kind, queue_id, topic_length = KIND.unpack_from(body, key_end)
        if kind not in KIND_NAMES or queue_id < 0 or topic_length > MAX_TOPIC_BYTES:
            raise ValueError(f"a damaged tier upload record: kind {kind}, queue id {queue_id}, topic of "
                             f"{topic_length} bytes")
        topic_end = key_end + KIND.size + topic_length
        expected = topic_end + {VERSION_KINDS: 0, VERSION_INCARNATION: INCARNATION.size,
                                VERSION_DIGEST_KIND: INCARNATION.size + DIGEST_KIND.size}[version]
        if expected != len(body):
            raise ValueError(f"a tier upload record of version {version} with a topic of {topic_length} bytes is "
                             f"{expected} bytes, this body {len(body)}")
        topic = _text(body[key_end + KIND.size:topic_end], "topic")
        if version in (VERSION_INCARNATION, VERSION_DIGEST_KIND):
            (incarnation,) = INCARNATION.unpack_from(body, topic_end)
        if version == VERSION_DIGEST_KIND:
            (digest_kind,) = DIGEST_KIND.unpack_from(body, topic_end + INCARNATION.size)
            if digest_kind not in DIGEST_NAMES or any(digest[DIGEST_SIZES[digest_kind]:]):
                raise ValueError(f"a damaged tier upload record: digest kind {digest_kind}, digest {digest.hex()}")
            digest = digest[:DIGEST_SIZES[digest_kind]]
        if ((kind == COMMITLOG and (topic or queue_id or version == VERSION_INCARNATION or incarnation != -1))
                or (kind == CONSUME_QUEUE and not topic) or (version == VERSION_INCARNATION and incarnation < 0)
                or incarnation < -1):
            raise ValueError(f"a damaged tier upload record: kind {kind} with topic {topic!r}, queue id {queue_id}, "
                             f"incarnation {incarnation}")
    elif key_end != len(body):
        raise ValueError(f"a tier upload record with a key of {key_length} bytes is {key_end} "
                         f"bytes, this body {len(body)}")
    key = _text(body[FIXED.size:key_end], "key")
    return Upload(state, uuid.UUID(bytes=upload_id), base, size, digest, epoch, key, kind, topic, queue_id,
                  incarnation, digest_kind)


class Digest:
    """The digest of ``kind`` (SHA256 or CRC64NVME) of bytes given in pieces: ``update`` each, then ``value()`` (what
    an Upload's ``digest`` holds). Both release the GIL on large pieces (hashlib; the compiled CRC)."""

    def __init__(self, kind: int):
        if kind not in DIGEST_NAMES:
            raise ValueError(f"not a digest kind: {kind}")
        self.kind = kind
        self._sha = hashlib.sha256() if kind == SHA256 else None
        self._crc = 0

    def update(self, data) -> None:
        if self._sha is not None:
            self._sha.update(data)
        else:
            self._crc = crc64.crc64nvme(data, self._crc)

    def value(self) -> bytes:
        return self._sha.digest() if self._sha is not None else self._crc.to_bytes(8, "big")


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"a tier upload record's {what} is not UTF-8: {exc}") from exc
