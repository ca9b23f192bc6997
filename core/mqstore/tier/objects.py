"""ObjectStore: the one interface of the object storage tier, over a backend (``file://``: mqstore.tier.local;
``s3://``: mqstore.tier.s3). Objects are immutable: written once, whole, never appended to or replaced.

  operation                  meaning                                         when it fails
  -------------------------- ----------------------------------------------- ---------------------------------
  put_if_absent(key, data)   create the object; never replaces one (S3:      AlreadyExists: the key exists
                             If-None-Match: *; file: a link that fails on    (a second put of one key)
                             an existing name)
  put_file(key, path, size,  the same from the first ``size`` bytes of a     AlreadyExists, as above
           pace)             local file, streamed (never whole in memory);
                             S3: above the multipart size, a multipart
                             upload (mqstore.tier.s3 says how it stays
                             create-only); ``pace.take(n)`` before each
                             chunk sent (the upload quota,
                             mqstore.tier.quota), whose longest wait the
                             call's deadline adds
  get_range(key, start, n)   n bytes from byte ``start`` (fewer at the end)  NotFound: no such object
  open_object(key)           a file:// object kept open for ranged reads     NotFound: no such object
                             (``get_range(start, n)``, ``close()``); None
                             for a backend without (S3: use get_range)
  size(key)                  the object's size (HEAD), None when absent
  list(prefix)               the objects under the "directory" ``prefix``
                             (whole path segments; "" = every object),
                             sorted by key
  delete(key)                remove it (absent is no error)
  every operation            runs on the tier's own executor (``workers``    Unavailable naming the tier URL:
                             threads; a caller waits at most the deadline,   the deadline passed, every worker
                             so a slow store never blocks local work), but   is busy, or the store failed
                             a ``file://`` tier's get_range (below)

**A file:// tier's reads run on the caller's thread** (a backend with ``reads_inline``): the tier is a directory
of this machine, read as the local files are. The hop to the executor and back cost 5-10x such a read (190-250
against 30-40 us wall for 64 bytes, on 2 busy cores; the read itself now 6-9 us, mqstore.tier.local's pread) and
an index query on tier files makes 2-8 of them, which made those queries 10-20x slower than before the tier had
an executor (bench/README.md, *Issue 33's reshaping against the rest of make bench*). Writes, lists and deletes
keep the executor and its deadline; an S3 tier's reads too (a network call, where the hop is small and the
deadline is what protects the caller).

A key is path segments of ``[A-Za-z0-9._-]`` joined by ``/`` (no empty segment, no ``.`` or ``..``).

Thread-safety: every method may be called from any thread; calls run on the executor's threads (named ``tier_N``, their
OS names too: mqstore.profiling.name_os_thread).
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar

from mqstore import profiling
from mqstore.errors import AlreadyExists, InvalidArgument, MqStoreError, NotFound, Unavailable

T = TypeVar("T")
DEFAULT_WORKERS = 4
_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int


class Pace(Protocol):
    """The upload quota as a put sees it (mqstore.tier.quota.UploadQuota)."""

    def take(self, size: int) -> None: ...
    def longest_s(self, size: int) -> float: ...


class Backend(Protocol):
    """Blocking calls of one store; they raise AlreadyExists and NotFound as the table says, anything else
    for a failure (ObjectStore turns it into Unavailable)."""

    def put_if_absent(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, path: pathlib.Path, size: int, pace: Pace | None = None) -> None: ...
    def get_range(self, key: str, start: int, length: int) -> bytes: ...
    def size(self, key: str) -> int | None: ...
    def list(self, prefix: str) -> list[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...
    def close(self) -> None: ...


def check_key(key: str, what: str = "key") -> str:
    parts = key.split("/")
    if not key or any(not _SEGMENT.match(part) or part in (".", "..") for part in parts):
        raise InvalidArgument(f"an object {what} is path segments of [A-Za-z0-9._-] joined by '/', not {key!r}")
    return key


class ObjectStore:
    def __init__(self, url: str, backend: Backend, *, timeout_ms: int, workers: int = DEFAULT_WORKERS):
        self.url = url
        self.timeout_ms = timeout_ms
        self._backend = backend
        self._executor = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="tier", initializer=profiling.name_os_thread
        )
        self._slots = threading.BoundedSemaphore(workers)  # calls running or queued: bounded by the workers
        self._reads_inline = bool(getattr(backend, "reads_inline", False))
        self._closed = False

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._call("PUT", check_key(key), lambda: self._backend.put_if_absent(key, bytes(data)))

    def put_file(self, key: str, path: pathlib.Path, size: int, pace: Pace | None = None) -> None:
        """``pace``: the upload quota (None: none); the deadline is the store's plus its longest wait."""
        self._call("PUT", check_key(key), lambda: self._backend.put_file(key, pathlib.Path(path), size, pace),
                   pace.longest_s(size) if pace is not None else 0.0)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise InvalidArgument(f"a range read needs start >= 0 and length >= 0, not {start}, {length}")
        if length == 0:
            return b""
        return self._call("GET", check_key(key), lambda: self._backend.get_range(key, start, length),
                          inline=self._reads_inline)  # a file:// tier's: on this thread (the module docstring)

    def open_object(self, key: str) -> OpenObject | None:
        """The object kept open for ranged reads on the caller's thread, when the backend reads inline and can
        (file://: its file, so that each read is a pread, not an open, a pread and a close); None otherwise (S3,
        where a read is a ranged GET whatever is kept). Its reads fail as get_range's do, and once the store is
        closed; it reads the object it opened even if the object is deleted meanwhile (objects never change)."""
        opener = getattr(self._backend, "open_object", None)
        if opener is None or not self._reads_inline:
            return None
        return OpenObject(self, check_key(key), self._call("GET", key, lambda: opener(key), inline=True))

    def size(self, key: str) -> int | None:
        return self._call("HEAD", check_key(key), lambda: self._backend.size(key))

    def list(self, prefix: str) -> list[ObjectInfo]:
        if prefix:
            check_key(prefix, "prefix")
        return self._call("LIST", prefix or "(all)", lambda: self._backend.list(prefix))

    def delete(self, key: str) -> None:
        self._call("DELETE", check_key(key), lambda: self._backend.delete(key))

    def close(self) -> None:
        """Stop taking calls; a call still running ends by the backend's own timeout."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._backend.close()

    def _call(self, op: str, key: str, run: Callable[[], T], paced_s: float = 0.0, *, inline: bool = False) -> T:
        """``run()`` on the executor within the deadline, or on this thread when ``inline``; its failures as the
        module docstring's table says."""
        if inline:
            if self._closed:  # as the executor refuses a call once shut down
                raise Unavailable(f"object storage tier {self.url}: closed")
            outcome = run
        else:
            deadline = time.monotonic() + self.timeout_ms / 1000 + paced_s
            future = self._submit(op, key, run)
            outcome = lambda: future.result(timeout=max(deadline - time.monotonic(), 0))  # noqa: E731
        try:
            return outcome()
        except concurrent.futures.TimeoutError:
            raise Unavailable(f"object storage tier {self.url}: {op} {key} did not answer within "
                              f"{self.timeout_ms} ms (tier_call_timeout_ms)"
                              + (f" plus {paced_s:.1f} s of the upload quota's pacing" if paced_s else "")) from None
        except (AlreadyExists, NotFound):
            raise
        except MqStoreError as exc:
            raise Unavailable(f"object storage tier {self.url}: {op} {key}: {exc}") from exc
        except Exception as exc:  # any failure of the store or its client: the tier is unavailable
            raise Unavailable(f"object storage tier {self.url}: {op} {key} failed: {type(exc).__name__}: "
                              f"{_short(exc)}") from exc

    def _submit(self, op: str, key: str, run: Callable[[], T]) -> concurrent.futures.Future:
        if not self._slots.acquire(timeout=self.timeout_ms / 1000):
            raise Unavailable(f"object storage tier {self.url}: {op} {key}: every worker was busy for "
                              f"{self.timeout_ms} ms (a slow store); retry")

        def task() -> T:
            try:
                return run()
            finally:
                self._slots.release()
        try:
            return self._executor.submit(task)
        except RuntimeError as exc:  # shut down
            self._slots.release()
            raise Unavailable(f"object storage tier {self.url}: closed") from exc


class OpenObject:
    """An object kept open by :meth:`ObjectStore.open_object`. Thread-safe; ``close`` once no read runs."""

    def __init__(self, store: ObjectStore, key: str, handle):
        self._store, self.key, self._handle = store, key, handle

    def get_range(self, start: int, length: int) -> bytes:
        # An index query makes 2-8 of these: the closed check and the one way such a read fails (OSError) here,
        # as ObjectStore._call maps them, rather than a closure through it (0.6 of ~2 us a read)
        if start < 0 or length < 0:
            raise InvalidArgument(f"a range read needs start >= 0 and length >= 0, not {start}, {length}")
        if self._store._closed:
            raise Unavailable(f"object storage tier {self._store.url}: closed")
        try:
            return self._handle.get_range(start, length)
        except OSError as exc:
            raise Unavailable(f"object storage tier {self._store.url}: GET {self.key} failed: {type(exc).__name__}: "
                              f"{_short(exc)}") from exc

    def close(self) -> None:
        self._handle.close()


READ_CHUNK_BYTES = 8 << 20  # one range GET of read_whole: a call's deadline covers a bounded transfer


def read_whole(store: ObjectStore, key: str, chunk_bytes: int = READ_CHUNK_BYTES) -> bytes:
    """The whole object ``key``, by range GETs of at most ``chunk_bytes``; NotFound when absent."""
    size = store.size(key)
    if size is None:
        raise NotFound(f"object {key} does not exist in {store.url}")
    chunks = [store.get_range(key, start, min(chunk_bytes, size - start)) for start in range(0, size, chunk_bytes)]
    data = b"".join(chunks)
    if len(data) != size:
        raise Unavailable(f"object storage tier {store.url}: {key} gave {len(data)} bytes, its size is {size}")
    return data


def delete_under(store: ObjectStore, prefix: str) -> int:
    """Delete every object under ``prefix`` (a "directory"); the number deleted."""
    found = store.list(prefix)
    for info in found:
        store.delete(info.key)
    return len(found)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
