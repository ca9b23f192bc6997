"""mqstore_rpc.endpoints (issue 34): a call goes to the instance that answered last, moves on only for
UNAVAILABLE and DEADLINE_EXCEEDED, tries each instance once, and ``elsewhere`` rewrites what the others get.
Real gRPC servers on 127.0.0.1 (the generic handler of one unary method), one of them answering a status."""

from __future__ import annotations

import contextlib
from concurrent import futures

import grpc
import pytest

from mqstore_rpc.endpoints import Failover, split

METHOD = "/test.Echo/Say"


class _Stub:
    def __init__(self, channel: grpc.Channel):
        self.Say = channel.unary_unary(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)


@contextlib.contextmanager
def server(name: str, status: grpc.StatusCode | None, seen: list, error: str = ""):
    """``error``: the mqstore-error trailer of its refusal (as mqstore_rpc.errors sends it)."""
    def say(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append((name, request))
        if status is not None:
            if error:
                context.set_trailing_metadata((("mqstore-error", error),))
            context.abort(status, f"{name} says {status.name}")
        return name.encode()

    handler = grpc.method_handlers_generic_handler("test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(
        say, request_deserializer=lambda b: b, response_serializer=lambda b: b)})
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        srv.stop(None)


def test_split_takes_a_comma_separated_list_and_refuses_an_empty_one():
    assert split(" a:1, b:2,,") == ["a:1", "b:2"]
    with pytest.raises(ValueError, match="no address"):
        split(" , ")


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_call_the_first_cannot_answer_goes_to_the_next_which_is_then_asked_first(code):
    seen: list = []
    with server("a", code, seen) as a, server("b", None, seen) as b, \
            Failover(f"{a},{b}", grpc.insecure_channel, _Stub) as instances:
        assert instances.call("Say", b"1", lambda r: r + b"-moved", timeout=10) == b"b"
        assert instances.call("Say", b"2", lambda r: r + b"-moved", timeout=10) == b"b"
    assert seen == [("a", b"1"), ("b", b"1-moved"), ("b", b"2")]


def test_another_status_is_the_answer_and_every_instance_down_raises_the_first_that_may_have_done_something():
    seen: list = []
    with server("a", grpc.StatusCode.NOT_FOUND, seen) as a, server("b", None, seen) as b, \
            Failover([a, b], grpc.insecure_channel, _Stub) as instances:
        with pytest.raises(grpc.RpcError) as refused:
            instances.call("Say", b"x", timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND and seen == [("a", b"x")]
    seen.clear()
    with server("a", grpc.StatusCode.UNAVAILABLE, seen) as a, server("b", grpc.StatusCode.UNAVAILABLE, seen) as b, \
            Failover([a, b], grpc.insecure_channel, _Stub) as instances:
        with pytest.raises(grpc.RpcError) as down:
            instances.call("Say", b"y", timeout=10)
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE and "a says" in down.value.details()
    assert seen == [("a", b"y"), ("b", b"y")]


@pytest.mark.parametrize("a_error, b_error, raised", [
    ("OutcomeUnknown", "NotWritten", "a"),   # the active one's outcome unknown, its standby's refusal after it
    ("NotWritten", "OutcomeUnknown", "b"),   # a standby first: the other's outcome is what the caller must see
    ("NotWritten", "NotWritten", "b"),       # nothing done anywhere: the last, as before
])
def test_an_outcome_unknown_is_never_hidden_behind_a_refusal_that_did_nothing(a_error, b_error, raised):
    """An active/standby pair (the Transaction service): a caller that sends a refused-unwritten write again must
    not take an active instance's maybe-done failure for its standby's refusal (mqstore_rpc.endpoints)."""
    seen: list = []
    with server("a", grpc.StatusCode.UNAVAILABLE, seen, a_error) as a, \
            server("b", grpc.StatusCode.UNAVAILABLE, seen, b_error) as b, \
            Failover([a, b], grpc.insecure_channel, _Stub, retried=frozenset({grpc.StatusCode.UNAVAILABLE})) as pair:
        with pytest.raises(grpc.RpcError) as down:
            pair.call("Say", b"z", timeout=10)
    assert down.value.details() == f"{raised} says UNAVAILABLE" and len(seen) == 2
