"""A real S3-compatible server for tests: moto's server mode (ThreadedMotoServer) on 127.0.0.1, a free port,
its state in memory; a stalled "server" (a socket that accepts and never answers) for deadlines; and a proxy in
front of moto that records what a client sent (:func:`recording_proxy`).

Use :func:`moto_s3` from a module- or session-scoped fixture (it stops the server at the end); each test
takes a bucket of its own (:meth:`MotoS3.bucket`), so tests sharing one server never see each other's
objects (moto's state is the process's, shared by every server it starts: buckets get unique names).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import http.server
import itertools
import logging
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Iterator

import boto3
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"


class MotoS3:
    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY_ID,
                                   aws_secret_access_key=SECRET_ACCESS_KEY)
        self._names = itertools.count()

    def bucket(self) -> str:
        # moto keeps its state per process, shared by every server of the process: a name never used before
        name = f"mqstore-test-{next(self._names)}-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        """The standard variables a commit log reads its S3 settings from."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
                "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY}

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object of ``bucket`` under ``prefix``: key -> bytes (read with boto3, not the code tested)."""
        found = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                found[item["Key"]] = self.client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return found


@contextlib.contextmanager
def moto_s3() -> Iterator[MotoS3]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield MotoS3(f"http://{host}:{port}")
    finally:
        server.stop()


@contextlib.contextmanager
def stalled_server() -> Iterator[str]:
    """http://127.0.0.1:PORT of a listener that accepts connections and never answers; closed at the end."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return
    thread = threading.Thread(target=accept, name="stalled-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        listener.close()
        for conn in accepted:
            conn.close()


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request a :func:`recording_proxy` forwarded: its method, path (with the query), headers (lower-case
    names) and body."""
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@contextlib.contextmanager
def recording_proxy(endpoint: str) -> Iterator[tuple[str, list[Seen]]]:
    """(http://127.0.0.1:PORT, the requests seen) of a proxy on 127.0.0.1 that forwards every request to
    ``endpoint`` (moto's) as it came (its Host header kept, so signatures stay as signed) and its answer back, and
    records each request (what a client sends, which moto's own state does not show); closed at the end."""
    seen: list[Seen] = []
    target = urllib.parse.urlparse(endpoint)

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {name.lower(): value for name, value in self.headers.items()}
            seen.append(Seen(self.command, self.path, headers, body))
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in ("connection", "content-length"):
                        conn.putheader(name, value)
                conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in ("connection", "content-length", "transfer-encoding", "server", "date"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        def log_message(self, format, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="recording-proxy",
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
