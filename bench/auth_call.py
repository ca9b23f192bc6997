"""The authentication interceptor alone, on a canned call: CPU microseconds per call.

``.venv/bin/python bench/auth_call.py [--calls N] [--profile]`` builds the server's interceptor chain
(per-RPC metrics, error mapping, mqstore_rpc.auth) around a handler that returns at once, with a real
Authority on a SQLite auth database holding one user and one rule (``topic bench*``: PUB), and calls
``/mqstore.v1.CommitLog/Append`` with the user's bearer credentials N times. It prints the CPU time per
call of: no interceptor, the auth interceptor alone, metrics + errors, and all three, so the cost of
authentication is the difference of the last two; then the auth interceptor alone (as the gateway
builds it) on a request signed as the RocketMQ SDKs sign (an SDK key of the same user,
mqstore.auth.signature), first with one signature (the calls a client makes within one second: cached),
then with a new signed date on every call (one HMAC-SHA1 each). ``--profile`` adds a cProfile of the auth interceptor
alone (the top functions by own time). CPU time (``time.process_time``), not wall time: the machine is
shared. Every handler is an ``async def`` awaited on an event loop, as a grpc.aio port (every port) runs it:
the interceptors have only their async adapters. The first call (scrypt, database reads) is made before
timing: what is timed is the cached path, what every call after the first costs (bench/security.py
measures the whole server with it).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pathlib
import pstats
import sys
import tempfile
import time

import grpc

from mqstore.auth import signature
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.authority import Authority
from mqstore.access import ALLOW, NORMAL, PUB, TOPIC
from mqstore.auth.sealing import Kek
from mqstore.clock import SystemClock
from mqstore.meta.auth import AuthStore
from mqstore.metrics import Registry
from mqstore_rpc.auth import AuthInterceptor, token
from mqstore_rpc.errors import ErrorInterceptor
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2
from mqstore_rpc.metrics import RpcMetrics

METHOD = "/mqstore.v1.CommitLog/Append"
USER, SECRET = "producer", "producer-secret-0123456789"


class _Details:
    """A call's details as grpc gives them to intercept_service: the method and the call's metadata (the
    authentication screens a call whose credentials it has not cached: mqstore_rpc.auth)."""

    def __init__(self, metadata):
        self.method, self.invocation_metadata = METHOD, metadata


class _Context:
    """What the interceptors read of a call: its metadata and peer."""

    def __init__(self, metadata):
        self._metadata = metadata

    def invocation_metadata(self):
        return self._metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def _resolve(interceptors, handler):
    """The handler a server would run for a call with ``context``'s metadata, through ``interceptors`` in order
    (as grpc chains them)."""
    def at(i: int, details):
        if i == len(interceptors):
            return handler
        return interceptors[i].intercept_service(lambda d: at(i + 1, d), details)
    return lambda context: at(0, _Details(context.invocation_metadata()))


async def _call(resolve, request, context):
    """One call as the server makes it: a unary request, or the screened handler's request stream of one
    message (credentials not cached yet)."""
    handler = resolve(context)
    if handler.unary_unary is not None:
        return await handler.unary_unary(request, context)
    return await handler.stream_unary(_one(request), context)


async def _timed(resolve, request, context, calls: int) -> float:
    await _call(resolve, request, context)  # the first call: the secret's check and the rules' read
    t0 = time.process_time()
    for _ in range(calls):
        await resolve(context).unary_unary(request, context)
    return (time.process_time() - t0) / calls * 1e6


def _us_per_call(resolve, request, context, calls: int) -> float:
    """CPU µs a call of an ``async def`` handler through ``resolve``'s interceptors, awaited on an event loop."""
    return asyncio.run(_timed(resolve, request, context, calls))


async def _one(request):
    yield request


async def _answer_at_once(_request, _context):
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mqstore-auth-call-") as work:
        store = AuthStore(f"sqlite:///{pathlib.Path(work) / 'auth.db'}", SystemClock())
        try:
            kek = Kek(pathlib.Path(work) / "auth.kek", create=True)
            authority = Authority(store, kek=kek)
            admin = AccessAdmin(store, authority.invalidate, kek)
            admin.create_user(USER, NORMAL, SECRET)
            admin.add_rule(USER, TOPIC, "bench*", frozenset({PUB}), ALLOW)
            sdk = admin.create_sdk_key(USER)
            request = commitlog_pb2.AppendRequest(topic="bench-security")
            context = _Context((("user-agent", "grpc-python"), ("authorization", token(USER, SECRET))))
            handler = grpc.unary_unary_rpc_method_handler(_answer_at_once)
            chains = {"none": [], "auth": [AuthInterceptor(authority, Registry())],
                      "metrics+errors": [RpcMetrics(Registry()), ErrorInterceptor()],
                      "metrics+errors+auth": [RpcMetrics(Registry()), ErrorInterceptor(),
                                              AuthInterceptor(authority, Registry())]}
            for name, chain in chains.items():
                print(f"{name:22} {_us_per_call(_resolve(chain, handler), request, context, args.calls):6.2f} "
                      f"CPU us/call", flush=True)
            date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            signed = (f"{signature.ALGORITHM} Credential={sdk.key.access_key}, SignedHeaders={signature.DATE_HEADER}, "
                      f"Signature={signature.sign(sdk.secret_key, date).hex()}")
            signed_context = _Context((("user-agent", "grpc-python"), (signature.DATE_HEADER, date),
                                       ("authorization", signed)))
            gateway_auth = [AuthInterceptor(authority, Registry(), signed_requests=True)]
            print(f"{'auth, SDK signature':22} "
                  f"{_us_per_call(_resolve(gateway_auth, handler), request, signed_context, args.calls):6.2f} "
                  f"CPU us/call (the same signature: the calls of one second)", flush=True)
            # A new signed date on every call (one per second of the skew window, each seen once): the HMAC.
            contexts = []
            for age_s in range(-signature.MAX_SKEW_MS // 1000 + 5, signature.MAX_SKEW_MS // 1000 - 5):
                date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + age_s))
                digest = signature.sign(sdk.secret_key, date).hex()
                value = (f"{signature.ALGORITHM} Credential={sdk.key.access_key}, "
                         f"SignedHeaders={signature.DATE_HEADER}, Signature={digest}")
                contexts.append(_Context((("user-agent", "grpc-python"), (signature.DATE_HEADER, date),
                                          ("authorization", value))))
            resolve = _resolve(gateway_auth, handler)

            async def each_new() -> None:
                for context_each in contexts:
                    await _call(resolve, request, context_each)
            t0 = time.process_time()
            asyncio.run(each_new())
            print(f"{'auth, SDK signature':22} {(time.process_time() - t0) / len(contexts) * 1e6:6.2f} CPU us/call "
                  f"(a new signature each call: {len(contexts)} calls)", flush=True)
            if args.profile:
                resolve = _resolve(chains["auth"], handler)
                profile = cProfile.Profile()
                profile.runcall(lambda: _us_per_call(resolve, request, context, args.calls))
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
