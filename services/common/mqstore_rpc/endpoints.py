"""Several instances of a read-only service behind one address list: ``host:port,host:port``.

A service that runs twice or more, each instance answering the same reads from its own copy (the Index:
each instance follows the commit log into its own data dir), is given to its clients as a comma-separated
list. :class:`Failover` keeps a channel per endpoint and sends a call to the one that answered last (the
first at the start); a call that ends UNAVAILABLE or DEADLINE_EXCEEDED is sent again, as it was, to the
next endpoint, each endpoint at most once per call, and when none answered the first error that may have done
something is raised (mqstore_rpc.remote_errors.never_done: not a refusal before anything was done, such as a
standby's), else the last: an active instance's "outcome unknown" is never hidden behind its standby's refusal. Any
other status (NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED, ...) is that call's answer and is raised at
once: another instance would answer the same.

Only for reads: a call retried on another instance may have run on the first (a DEADLINE_EXCEEDED says
nothing about whether it ran), which is harmless only for a call that changes nothing. Each attempt gets
the whole ``timeout``, so a call may take up to ``len(endpoints) * timeout`` when every instance hangs.

A call may carry what the preferred instance issued (the Index's page token names its own files): the
caller then gives ``elsewhere``, the request as another instance must get it.

Writes to an active/standby pair (the Transaction service, issue 34) give ``retried={UNAVAILABLE}``: the
standby refuses every write with UNAVAILABLE before doing anything, so the call goes on to the next one;
a DEADLINE_EXCEEDED is raised (the call may have run). A stream is opened on the preferred endpoint
(:meth:`open`); its owner reports an UNAVAILABLE end with :meth:`failed`, and the next open tries the next.

Thread-safe: the channels never change after construction and the preferred endpoint is one int.
"""

from __future__ import annotations

from typing import Callable, Sequence

import grpc

from mqstore_rpc.remote_errors import never_done

RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def split(addresses: str) -> list[str]:
    """``"a:1, b:2,,"`` -> ``["a:1", "b:2"]``; ValueError when it names no address."""
    parts = [part.strip() for part in addresses.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"no address in {addresses!r} (expected host:port or host:port,host:port)")
    return parts


class Failover:
    """Stubs of one gRPC service on every endpoint of ``addresses`` (see the module docstring).
    ``make_channel(address)`` opens a channel (TLS and options are the caller's); ``make_stub(channel)`` is
    the service's generated stub class."""

    def __init__(self, addresses: str | Sequence[str], make_channel: Callable[[str], grpc.Channel],
                 make_stub: Callable[[grpc.Channel], object], retried: frozenset = RETRIED):
        self.addresses = split(addresses) if isinstance(addresses, str) else list(addresses)
        self._channels = [make_channel(address) for address in self.addresses]
        self._stubs = [make_stub(channel) for channel in self._channels]
        self._preferred = 0
        self._retried = retried

    def open(self, method: str, *args, **kwargs):
        """``stub.<method>(*args, **kwargs)`` on the preferred endpoint (a stream): (the call, its endpoint's
        index, for :meth:`failed`)."""
        i = self._preferred
        return getattr(self._stubs[i], method)(*args, **kwargs), i

    def failed(self, index: int) -> None:
        """The endpoint ``index`` ended a stream UNAVAILABLE: prefer the next one (unless another call has
        moved on already)."""
        if self._preferred == index:
            self._preferred = (index + 1) % len(self._stubs)

    def call(self, method: str, request, elsewhere: Callable[[object], object] | None = None, **kwargs):
        """``stub.<method>(request, **kwargs)`` on the preferred endpoint, then on the next ones while the
        call ends UNAVAILABLE or DEADLINE_EXCEEDED; the answering endpoint becomes the preferred one.
        ``elsewhere(request)``: the request to send to an endpoint other than the preferred one (what the
        preferred one issued, a page token, may mean something else on another instance)."""
        first = self._preferred
        failures: list[grpc.RpcError] = []
        for step in range(len(self._stubs)):
            i = (first + step) % len(self._stubs)
            sent = request if step == 0 or elsewhere is None else elsewhere(request)
            try:
                response = getattr(self._stubs[i], method)(sent, **kwargs)
            except grpc.RpcError as exc:
                if exc.code() not in self._retried:
                    raise
                failures.append(exc)
                continue
            self._preferred = i
            return response
        # the first that may have done something (the active one's outcome unknown), else the last
        raise next((exc for exc in failures if not never_done(exc)), failures[-1])

    def in_turn(self) -> list:
        """The stubs, the preferred one first (a server stream, whose errors come while it is read, is tried
        on each in turn by its caller: the CLI's kv scan)."""
        first = self._preferred
        return [self._stubs[(first + step) % len(self._stubs)] for step in range(len(self._stubs))]

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> Failover:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
