"""Authentication and permissions on every server, and credentials on every client.

Credentials are a bearer token in the call metadata, ``authorization: Bearer <user>:<secret>``. Why a
bearer token and not a signed request (RocketMQ 5 signs each request with HMAC-SHA1 of an AccessKey/
SecretKey): to verify a signature the server must hold the secret itself, while a bearer secret can be
kept only as a salted scrypt hash (a stolen auth database gives no one's secret). What a signature adds
is protection of the secret in transit and against replay; TLS (mqstore_rpc.tls) gives both to every
call, so with authentication on across a network, turn TLS on too. The RocketMQ gateway
(``signed_requests``) also takes the official SDKs' signed requests, ``authorization: MQv2-HMAC-SHA1
Credential=<access key>, ...`` with ``x-mq-date-time`` (mqstore.auth.signature), whose secret keys the
server keeps sealed under a key-encryption key (mqstore.auth.sealing); any other service refuses them.
Verification is cached (mqstore.auth.authority) by the whole metadata value (a signed request: by its
access key, plus one HMAC-SHA1 per call), and so is each permission decision per user, action and
resource: a call costs two dict lookups (bench/auth_call.py measures it).

:class:`AuthInterceptor` (the server side, inside the error interceptor so that its errors map to
status codes in one place): for each RPC of :data:`mqstore_rpc.permissions.PERMISSIONS`,

  no ``authorization`` metadata, or not ``Bearer <user>:<secret>``   UNAUTHENTICATED (says what to send)
  (gateway) a malformed signed request or no x-mq-date-time          UNAUTHENTICATED (no_credentials)
  (gateway) unknown or revoked access key, wrong signature, or a     UNAUTHENTICATED (bad_credentials)
  date-time more than 15 min from the server's clock
  unknown user or wrong secret                                       UNAUTHENTICATED (which of the two is
                                                                     not said; the secret never is)
  new credentials from a peer address or for a user with 10 failed   UNAUTHENTICATED (throttled: says how
  logins in a row (mqstore.auth.throttle; cached ones still pass)    long; no hash is made)
  the user lacks the action on a resource the request names          PERMISSION_DENIED (names the user,
                                                                     action, resource and how to grant it)

Each denial is one count of ``mqstore_auth_denied_total{reason}`` (no_credentials, bad_credentials,
throttled, permission) and, sampled by :class:`DenialLog`, one event ``auth.denied`` (method, user, reason,
peer; never a secret): the first 5 per reason, peer address and user (or access key) every 10 s, 200 in
all, the others summed up in one ``auth.denied_suppressed`` event per interval (a flood of failed logins
wrote ~330 bytes of log per call). An RPC missing from the table is refused (PERMISSION_DENIED naming the
method) rather than let through. Health and reflection are open.

The request is not read before the caller is authenticated. grpc runs ``intercept_service`` with the call's
metadata before it reads the request message, and reads a unary request only to hand it to the handler;
a request stream is read as the handler takes it. So a unary call whose credentials are not cached (one
dict read in ``intercept_service``: :meth:`AuthInterceptor.screens`) gets the *screened* handler, a request
stream of that one message, which authenticates (refusing without credentials, or checking new ones)
before it takes the message; cached credentials get the usual handler. Measured on a CommitLog process,
6 concurrent 60 MiB Appends without credentials took its peak RSS from 72 to 828 MiB when read first,
to 72-130 MiB screened, on the synchronous port and the grpc.aio one alike
(tests/integration/test_attack_auth_flood.py). What is received of a refused body is what grpc buffers
before the refusal: the stream's HTTP/2 flow-control window, which grpc's BDP probing grows to a few MiB
(with ``grpc.http2.bdp_probe`` off, 0 MiB grew; it stays on for the throughput of large messages). The
calls that stay longest before their answer are new credentials waiting for a place to be hashed: at most
16 wait (mqstore.auth.throttle.HashGate), the others are answered UNAVAILABLE at once.

:class:`BearerToken` (the client side) adds the metadata to every call of a channel
(mqstore_rpc.tls.open_channel's interceptors).

Every handler it wraps is async, answered on the server's loop (a synchronous servicer method was made so by
mqstore_rpc.aio, its body run in the handler pool, so the checks come before that body, on the loop). The
cached credentials are found on the loop, and so are the refusals that need no hash (malformed credentials, a
secret that failed lately, a throttled peer or user: a flood of them never queues on the executor); a call with
credentials not seen since the last change is checked on a thread of the loop's executor, so a user's first call
(or every user's, after a change of the users or rules) does not stop the loop for its scrypt hash.
mqstore_rpc.aio asks :meth:`screens` per call and caches the screened handler apart.

Thread-safety: the interceptor caches its wrapped handlers per method; the authority is thread-safe.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import copy
import functools
import inspect
import ipaddress
import threading
import time
from typing import Any, AsyncIterator, Callable, Mapping

import grpc
import structlog

from mqstore.auth import signature
from mqstore.auth.authority import Authority, Principal, Throttled
from mqstore.access import Resource, is_access_key
from mqstore.errors import InvalidArgument, PermissionDenied, Unauthenticated
from mqstore.metrics import Registry

from mqstore_rpc.handlers import PerMethod, as_request_stream, behavior_of, like
from mqstore_rpc.permissions import OPEN_PREFIXES, PERMISSIONS, Need

log = structlog.get_logger("mqstore_rpc.auth")

METADATA_KEY = "authorization"
SCHEME = "Bearer "
# The call being served: set by the interceptor around each authenticated handler (a unary-response
# handler's run, each step of a response stream), read by :func:`require` and :func:`current_caller`.
_current: contextvars.ContextVar["Caller | None"] = contextvars.ContextVar("mqstore_caller", default=None)
_DENIAL = "_mqstore_auth_denial"  # the attribute that marks an exception raised by this module's checks


def token(user: str, secret: str) -> str:
    """The metadata value for these credentials."""
    return f"{SCHEME}{user}:{secret}"


def parse_credentials(metadata) -> tuple[str, str]:
    """(user, secret) from the call's metadata; Unauthenticated when absent or malformed (the value is
    never quoted: it may be a secret)."""
    value = next((v for k, v in metadata or () if k == METADATA_KEY), None)
    if value is None:
        raise Unauthenticated(f"no credentials: authentication is on; send the metadata "
                              f"'{METADATA_KEY}: Bearer <user>:<secret>' (mqstore: --user and MQSTORE_SECRET)")
    if isinstance(value, bytes) or not value.startswith(SCHEME) or ":" not in value[len(SCHEME):]:
        raise Unauthenticated(f"the {METADATA_KEY} metadata is not 'Bearer <user>:<secret>'")
    user, _, secret = value[len(SCHEME):].partition(":")
    return user, secret


def require(action: str, resource: Resource) -> None:
    """For a servicer whose RPC's table entry is ``deferred`` (or any servicer that finds a resource the
    request does not name): check the authenticated caller once the resource is known (a denial is
    logged and counted like the interceptor's). A no-op when authentication is off."""
    caller = _current.get()
    if caller is not None:
        caller.interceptor._check(caller.principal, action, resource, caller.method, caller.context)


def current_caller() -> "Caller | None":
    """The authenticated caller of the call being served, None when authentication is off. Valid in the
    handler (a unary call's run, each step of a response stream, sync or grpc.aio); a servicer that goes
    on on another thread (a Telemetry stream's reader) takes it along."""
    return _current.get()


def caller_name() -> str | None:
    """The authenticated user (principal name) of the call being served, None when authentication is off."""
    caller = _current.get()
    return None if caller is None else caller.principal.name


def is_denial(exc: BaseException) -> bool:
    """Whether ``exc`` is this module's refusal of the caller (UNAUTHENTICATED, PERMISSION_DENIED), as
    opposed to an error of the same class from a service the servicer called (a handler that answers
    errors in its response, the gateway, lets these through to the error interceptor)."""
    return getattr(exc, _DENIAL, False)


class Caller:
    """The authenticated caller of one call (:func:`current_caller`). Thread-safe: immutable, and the
    authority it asks is thread-safe."""

    __slots__ = ("interceptor", "principal", "method", "context")

    def __init__(self, interceptor: "AuthInterceptor", principal: Principal, method: str, context):
        self.interceptor, self.principal, self.method, self.context = interceptor, principal, method, context

    @property
    def name(self) -> str:
        return self.principal.name

    def allowed(self, action: str, resource: Resource) -> bool:
        """Whether the caller may do ``action`` on ``resource`` (nothing logged: a question, not a check)."""
        return self.interceptor._authority.decide(self.principal, action, resource).allowed

    def require(self, action: str, resource: Resource) -> None:
        """PermissionDenied unless the caller may do ``action`` on ``resource``; logged and counted as the
        interceptor's denials."""
        self.interceptor._check(self.principal, action, resource, self.method, self.context)

    def refuse(self, exc: PermissionDenied) -> None:
        """Refuse the call with ``exc`` (a servicer's own reason: its message says what to do), logged and
        counted as the interceptor's denials."""
        self.interceptor._deny(exc, "permission", self.method, self.context, self.principal.name)


def peer_address(peer: str) -> str:
    """The key of a peer's failure backoff: its address without the port (``ipv4:10.0.0.7:5123`` ->
    ``10.0.0.7``), an IPv6 one as its /64 (one host holds a whole /64), anything else as it is."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = (rest.rpartition(":")[0] or rest).strip("[]").replace("%25", "%").partition("%")[0]
        try:
            return str(ipaddress.IPv6Network(f"{host}/64", strict=False))
        except ValueError:
            return host
    return peer


class DenialLog:
    """Which denials get their own ``auth.denied`` line: per (reason, peer address, user or access key),
    the first ``burst`` of each ``interval_s``, and no more than ``max_lines`` lines in all per interval; the
    others are counted, and one ``auth.denied_suppressed`` line per interval says how many (by reason and
    by peer, the ten busiest), written with the first denial after the interval or by :meth:`flush` (the
    server's stop). mqstore_auth_denied_total counts every denial, logged or not. Thread-safe (a lock)."""

    MAX_KEYS = 4096
    TOP_PEERS = 10

    def __init__(self, interval_s: float = 10.0, burst: int = 5, max_lines: int = 200,
                 clock: Callable[[], float] = time.monotonic):
        self._interval_s, self._burst, self._max_lines, self._clock = interval_s, burst, max_lines, clock
        self._lock = threading.Lock()
        self._start = clock()
        self._seen: dict[tuple[str, str, str], int] = {}
        self._lines = 0
        self._suppressed: collections.Counter = collections.Counter()  # (reason, peer) -> count

    def admit(self, reason: str, peer: str, subject: str) -> bool:
        """True: log this denial; False: it was counted for the summary."""
        with self._lock:
            summary = self._roll() if self._clock() - self._start >= self._interval_s else None
            key = (reason, peer, subject)
            seen = self._seen.get(key)
            if seen is None and len(self._seen) >= self.MAX_KEYS:
                key = (reason, peer, "*")
                seen = self._seen.get(key)
            seen = (seen or 0) + 1
            self._seen[key] = seen
            admitted = seen <= self._burst and self._lines < self._max_lines
            if admitted:
                self._lines += 1
            else:
                self._suppressed[reason, peer] += 1
        if summary:
            log.warning("auth.denied_suppressed", **summary)
        return admitted

    def flush(self) -> None:
        """Write the summary of the interval so far (if anything was suppressed) and start a new one."""
        with self._lock:
            summary = self._roll()
        if summary:
            log.warning("auth.denied_suppressed", **summary)

    def _roll(self) -> dict | None:
        suppressed, now = self._suppressed, self._clock()
        summary = None
        if suppressed:
            by_reason: collections.Counter = collections.Counter()
            by_peer: collections.Counter = collections.Counter()
            for (reason, peer), count in suppressed.items():
                by_reason[reason] += count
                by_peer[peer] += count
            summary = dict(suppressed=sum(suppressed.values()), interval_s=round(now - self._start, 3),
                           by_reason=dict(by_reason), by_peer=dict(by_peer.most_common(self.TOP_PEERS)),
                           peers=len(by_peer))
        self._start, self._seen, self._lines, self._suppressed = now, {}, 0, collections.Counter()
        return summary


class _Peer:
    """What a denial made off the loop logs of its call: the peer, read on the loop."""

    __slots__ = ("_peer",)

    def __init__(self, peer: str):
        self._peer = peer

    def peer(self) -> str:
        return self._peer


class AuthInterceptor(grpc.ServerInterceptor):
    def __init__(self, authority: Authority, registry: Registry, permissions: Mapping[str, Need | None] = PERMISSIONS,
                 *, signed_requests: bool = False, denial_log: DenialLog | None = None):
        self._authority = authority
        self._signed_requests = signed_requests
        self._permissions = permissions
        self._denied = registry.counter("mqstore_auth_denied_total", "calls refused by authentication or "
                                        "permissions, by reason", ("reason",))
        self.denial_log = denial_log or DenialLog()
        self._wrapped = PerMethod()
        self._screened = PerMethod()

    def taking_signed_requests(self) -> "AuthInterceptor":
        """The same authority, permissions, denial counter and denial log, also taking the SDKs' signed
        requests: for a gateway served by another service's process (the commit log's Local mode)."""
        other = copy.copy(self)
        other._signed_requests, other._wrapped, other._screened = True, PerMethod(), PerMethod()
        return other

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        screened = getattr(handler_call_details, "screened", None)  # decided by mqstore_rpc.aio, else here
        if screened is None:
            screened = self.screens(handler_call_details, handler)
        if screened:
            return self._screened.get(method, handler, lambda h: self._wrap_screened(h, method))
        return self._wrapped.get(method, handler, lambda h: self._wrap(h, method))

    def screens(self, handler_call_details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler | None) -> bool:
        """True when this call gets the screened handler: a unary request whose credentials are not cached.
        grpc runs intercept_service on its loop before it reads the request message, so this is one dict
        read, no more; the screened handler
        is a request stream of that one message, which authenticates the caller (refusing, or checking
        new credentials) before it takes the message: an unauthenticated caller's body is never read
        (tests/integration/test_attack_auth_flood.py measures the server's memory under 60 MiB ones)."""
        method = handler_call_details.method
        if handler is None or handler.request_streaming or method.startswith(OPEN_PREFIXES):
            return False  # a request stream is read only after the check anyway (the guard's enter)
        if method in self._permissions and self._permissions[method] is None:
            return False
        return self._cached(handler_call_details.invocation_metadata or ()) is None

    def flush(self) -> None:
        """Log the summary of the denials not logged one by one (the server's stop)."""
        self.denial_log.flush()

    # ---- checks ----------------------------------------------------------------------------------------
    def _deny(self, exc: Exception, reason: str, method: str, context: grpc.ServicerContext, user: str = "",
              **fields: str) -> None:
        self._denied.labels(reason).inc()
        peer = context.peer()
        if self.denial_log.admit(reason, peer_address(peer), user or fields.get("access_key", "")):
            log.warning("auth.denied", method=method, user=user, reason=reason, peer=peer, message=str(exc),
                        **fields)
        setattr(exc, _DENIAL, True)
        raise exc

    def _cached(self, metadata) -> Principal | None:
        """The caller's principal if its credentials were accepted before (one dict read: the hot path),
        else None (then :meth:`_authenticate_new`)."""
        value = next((v for k, v in metadata if k == METADATA_KEY), None)
        if not isinstance(value, str):
            return None
        principal = self._authority.cached(value)
        if principal is None and self._signed_requests and signature.is_signed(value):
            date_time = next((v for k, v in metadata if k == signature.DATE_HEADER), None)
            if isinstance(date_time, str):
                principal = self._authority.cached_signed(value, date_time)  # the same signature this second
        return principal

    async def _authenticate_async(self, method: str, context) -> Principal:
        """The caller of a call, on the server's loop: credentials seen before are found there (a dict
        read); new ones (a database read and a scrypt hash, tens of milliseconds) and
        refusals are checked on a thread of the loop's executor, so the loop answers other calls meanwhile."""
        metadata = context.invocation_metadata() or ()
        principal = self._cached(metadata)
        if principal is not None:
            return principal
        caller = _Peer(context.peer())
        self._refuse_cheaply(method, metadata, caller)  # on the loop: what needs no hash nor database
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self._authenticate_new, method, metadata, caller))

    def _refuse_cheaply(self, method: str, metadata, context) -> None:
        """The refusals of bearer credentials that cost no hash and no database read (malformed, a secret
        that failed lately, a peer or user in its failure backoff), made where the call is, so that a flood
        of them never queues on the executor's few threads; what remains is :meth:`_authenticate_new`'s."""
        value = next((v for k, v in metadata if k == METADATA_KEY), None)
        if isinstance(value, str) and signature.is_signed(value):
            return
        user, secret = self._bearer(metadata, method, context)
        try:
            self._authority.refuse_cheaply(user, secret, peer_address(context.peer()))
        except Unauthenticated as exc:
            self._refused_login(exc, user, method, context)

    def _authenticate_new(self, method: str, metadata, context) -> Principal:
        """Credentials :meth:`_cached` does not hold: checked (the database, a hash), or refused.
        ``context``: what a denial is logged with (its ``peer()``)."""
        value = next((v for k, v in metadata if k == METADATA_KEY), None)
        if isinstance(value, str) and signature.is_signed(value):
            return self._authenticate_signed(value, metadata, method, context)
        user, secret = self._bearer(metadata, method, context)
        try:
            return self._authority.authenticate(user, secret, value, peer_address(context.peer()))
        except Unauthenticated as exc:
            self._refused_login(exc, user, method, context)

    def _bearer(self, metadata, method: str, context) -> tuple[str, str]:
        """(user, secret) of the call's bearer credentials; refused (no_credentials) when absent or malformed."""
        try:
            return parse_credentials(metadata)
        except Unauthenticated as exc:
            self._deny(exc, "no_credentials", method, context)

    def _refused_login(self, exc: Unauthenticated, user: str, method: str, context) -> None:
        """Refuse the call for ``user``'s bearer credentials: throttled, or bad (which of user and secret is
        not said)."""
        self._deny(exc, "throttled" if isinstance(exc, Throttled) else "bad_credentials", method, context, user[:64])

    def _authenticate_signed(self, value: str, metadata, method: str, context: grpc.ServicerContext) -> Principal:
        if not self._signed_requests:
            self._deny(Unauthenticated(f"this service takes '{METADATA_KEY}: Bearer <user>:<secret>'; signed "
                                       f"requests ({signature.ALGORITHM}, the RocketMQ SDKs') are taken by the "
                                       f"RocketMQ gateway only"), "no_credentials", method, context)
        date_time = next((v for k, v in metadata if k == signature.DATE_HEADER), None)
        try:
            signed = signature.parse(value, date_time if isinstance(date_time, str) else None)
        except Unauthenticated as exc:
            self._deny(exc, "no_credentials", method, context)
        try:
            return self._authority.authenticate_signed(signed, value)
        except Unauthenticated as exc:
            shown = signed.access_key if is_access_key(signed.access_key) else "(not a valid access key)"
            self._deny(exc, "bad_credentials", method, context, access_key=shown)

    def _authorize(self, principal: Principal, need: Need, request, method: str, context) -> None:
        """The resources ``request`` names, checked for ``need``'s action. None of them when the servicer
        checks them itself (a ``deferred`` need has no resources: mqstore_rpc.permissions.Need)."""
        if need.resources is None:
            return
        decisions, action = principal.decisions, need.action
        for item in need.resources(request):
            if isinstance(item, Resource):  # the hot path: a decision made before, which allowed
                decision = decisions.get((action, item))
                if decision is not None and decision.allowed:
                    continue
            self._authorize_slowly(principal, need, item, method, context)

    def _authorize_slowly(self, principal: Principal, need: Need, item, method: str, context) -> None:
        for actions, resource in need.check(item):
            if len(actions) > 1 and any(self._authority.decide(principal, a, resource).allowed for a in actions[1:]):
                continue  # another action that suffices is allowed
            self._check(principal, actions[0], resource, method, context)

    def _check(self, principal: Principal, action: str, resource: Resource, method: str, context) -> None:
        try:
            self._authority.authorize(principal, action, resource)
        except PermissionDenied as exc:
            self._deny(exc, "permission", method, context, principal.name)

    # ---- wrapping --------------------------------------------------------------------------------------
    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        behavior = behavior_of(handler)
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            raise TypeError(f"{method}: authentication wraps async handlers only (mqstore_rpc.aio.on_loop makes "
                            f"them)")
        if method not in self._permissions:
            return like(handler, self._refuse(behavior, method, handler.response_streaming))
        return like(handler, self._guard(behavior, self._permissions[method], method, handler.request_streaming))

    def _wrap_screened(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The unary-request ``handler`` as a request stream (:meth:`screens`): the caller is authenticated
        before its one message is taken, then the message goes to the usual guarded behavior."""
        guarded = behavior_of(self._wrapped.get(method, handler, lambda h: self._wrap(h, method)))
        if method not in self._permissions:  # refused without a look at the request
            if handler.response_streaming:
                async def refuse_unread_stream(requests, context):
                    async for response in guarded(None, context):
                        yield response
                return as_request_stream(handler, _unary_request(refuse_unread_stream, guarded))

            async def refuse_unread(requests, context):
                return await guarded(None, context)
            return as_request_stream(handler, _unary_request(refuse_unread, guarded))

        async def first(requests):
            return _one_request(await anext(aiter(requests), None), method)

        if handler.response_streaming:
            async def screened_stream(requests, context):
                await self._authenticate_async(method, context)
                async for response in guarded(await first(requests), context):
                    yield response
            return as_request_stream(handler, _unary_request(screened_stream, guarded))

        async def screened(requests, context):
            await self._authenticate_async(method, context)
            return await guarded(await first(requests), context)
        return as_request_stream(handler, _unary_request(screened, guarded))

    def _refuse(self, behavior: Callable, method: str, response_streaming: bool) -> Callable:
        def deny(context) -> None:
            self._deny(PermissionDenied(f"{method} has no entry in the permission table "
                                        f"(mqstore_rpc.permissions): refused"), "permission", method, context)
        if response_streaming:
            @functools.wraps(behavior)
            async def refuse_stream(request, context):
                deny(context)
                yield  # never reached: an async generator, as the handler's kind says
            return refuse_stream

        @functools.wraps(behavior)
        async def refuse(request, context):
            deny(context)
        return refuse

    def _guard(self, behavior: Callable, need: Need | None, method: str, request_streaming: bool) -> Callable:
        """The checks in order: the caller (credentials seen before found on the loop, new ones checked on a
        thread: :meth:`_authenticate_async`), then the resources the request names (each item of a request
        stream); the servicer then learns who calls (current_caller) or finishes the check (deferred)."""
        if need is None:
            return behavior
        if inspect.isasyncgenfunction(behavior):
            return self._guard_stream(behavior, need, method, request_streaming)
        return self._guard_unary(behavior, need, method, request_streaming)

    async def _enter(self, request, need: Need, method: str, request_streaming: bool, context):
        principal = await self._authenticate_async(method, context)
        if request_streaming:
            request = await self._each_checked(request, principal, need, method, context)
        else:
            self._authorize(principal, need, request, method, context)
        return principal, request

    def _guard_stream(self, behavior: Callable, need: Need, method: str, request_streaming: bool) -> Callable:
        @functools.wraps(behavior)
        async def stream_guarded(request, context) -> AsyncIterator[Any]:
            principal, request = await self._enter(request, need, method, request_streaming, context)
            responses = behavior(request, context)
            # The caller (current_caller; deferred checks: Transact) is set for each step of the response
            # generator only (each step runs in the call's own task, so it is never seen by another call; a
            # synchronous stream's step on its pool thread sees a copy of it, mqstore_rpc.aio).
            caller = Caller(self, principal, method, context)
            while True:
                token = _current.set(caller)
                try:
                    response = await responses.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    _current.reset(token)
                yield response
        return stream_guarded

    def _guard_unary(self, behavior: Callable, need: Need, method: str, request_streaming: bool) -> Callable:
        @functools.wraps(behavior)
        async def guarded(request, context):
            principal, request = await self._enter(request, need, method, request_streaming, context)
            token = _current.set(Caller(self, principal, method, context))  # this call's own task
            try:
                return await behavior(request, context)
            finally:
                _current.reset(token)
        return guarded

    async def _each_checked(self, requests: AsyncIterator[Any], principal: Principal, need: Need, method: str,
                            context) -> AsyncIterator[Any]:
        """The request stream with each item checked. The first item is read and checked here, before the
        servicer runs (a CheckBack hello, a Telemetry client's settings, the first Append batch): a denial
        then ends the call with its status even where the servicer reads the stream on another thread.
        Later items are checked as the servicer takes them."""
        requests = aiter(requests)
        first = await anext(requests, None)
        if first is not None:
            self._authorize(principal, need, first, method, context)

        async def checked() -> AsyncIterator[Any]:
            if first is None:
                return
            yield first
            async for item in requests:
                self._authorize(principal, need, item, method, context)
                yield item
        return checked()


def _one_request(request, method: str):
    """A screened unary call's one request message (None: the client sent none, which is refused)."""
    if request is None:
        raise InvalidArgument(f"{method}: no request message came; send one")
    return request


def _unary_request(behavior: Callable, like_behavior: Callable) -> Callable:
    """``behavior`` with ``like_behavior``'s attributes (a wire parser: mqstore_rpc.errors.wire_codec), marked
    as the request stream of a unary call (per-RPC metrics label it unary)."""
    behavior = functools.wraps(like_behavior)(behavior)
    behavior.unary_request = True
    return behavior


# ---- the client side ----------------------------------------------------------------------------------

class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details: grpc.ClientCallDetails, metadata):
        self.method, self.timeout, self.credentials = details.method, details.timeout, details.credentials
        self.wait_for_ready, self.compression = details.wait_for_ready, details.compression
        self.metadata = metadata


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <user>:<secret>`` to every call of a channel."""

    def __init__(self, user: str, secret: str):
        self._item = (METADATA_KEY, token(user, secret))
        self.user = user

    def __repr__(self) -> str:
        return f"BearerToken(user={self.user!r})"  # never the secret

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(details, [*(details.metadata or ()), self._item])

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

