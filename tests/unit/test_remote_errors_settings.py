"""mqstore_rpc.remote_errors (gRPC status -> mqstore exception) and mqstore_rpc.settings (flags and
MQSTORE_* variables -> config values)."""

from __future__ import annotations

import argparse
import dataclasses

import grpc
import pytest
from mqstore import errors
from mqstore.txn.config import TxnConfig
from mqstore_rpc import settings as S
from mqstore_rpc.errors import STATUS_BY_ERROR, _trailing_metadata, status_for
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2
from mqstore_rpc.remote_errors import from_batch_error, from_rpc_error


class FakeRpcError(grpc.RpcError):
    """What a failed call raises: code(), details() and trailing_metadata()."""

    def __init__(self, code: grpc.StatusCode, details: str = "detail", trailing=()):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


@pytest.mark.parametrize("cls", sorted(STATUS_BY_ERROR, key=lambda c: c.__name__))
def test_every_mapped_status_comes_back_as_its_exception(cls):
    error = from_rpc_error(FakeRpcError(STATUS_BY_ERROR[cls], "why"), "log:1")
    assert type(error) is cls and "log:1" in str(error) and "why" in str(error)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED,
                                  grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED])
def test_codes_without_an_exception_are_unavailable(code):
    error = from_rpc_error(FakeRpcError(code), "log:1")
    assert isinstance(error, errors.Unavailable) and code.name in str(error)


def test_out_of_range_keeps_its_range():
    trailing = (("mqstore-error", "OutOfRange"), ("mqstore-min-value", "100"), ("mqstore-max-value", "900"))
    error = from_rpc_error(FakeRpcError(grpc.StatusCode.OUT_OF_RANGE, "outside", trailing), "log:1")
    assert (error.min_value, error.max_value) == (100, 900)
    bare = from_rpc_error(FakeRpcError(grpc.StatusCode.OUT_OF_RANGE), "log:1")
    assert (bare.min_value, bare.max_value) == (None, None)


@pytest.mark.parametrize("details", [
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:5: Failed to connect to remote host: "
    "Connection refused",
    "errors resolving commitlog-3:50051: [field:hostname lookup error:address lookup failed for commitlog-3:50051: "
    "Domain name not found]",
    "DNS resolution failed for commitlog-3:50051: C-ares status is not ARES_SUCCESS",
    "empty address list: ",
])
def test_a_call_grpc_failed_before_sending_is_not_written(details):
    error = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, details), "log:1")
    assert type(error) is errors.NotWritten and "never sent" in str(error) and "log:1" in str(error)


@pytest.mark.parametrize("details, trailing", [
    ("Stream removed", ()),                                       # sent, then the connection went: maybe written
    ("Socket closed", ()),
    ("recvmsg:Connection reset by peer", ()),
    ("failed to connect to all addresses", (("mqstore-error", "Unavailable"),)),  # the store's own words
    ("records up to physical offset 9 were replicated, but ... lapsed", (("mqstore-error", "Unavailable"),)),
    ("a flush did not confirm in time", (("mqstore-error", "FlushTimeout"),)),
])
def test_a_failure_that_may_have_been_sent_stays_plain_unavailable(details, trailing):
    error = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, details, trailing), "log:1")
    assert type(error) is errors.Unavailable


@pytest.mark.parametrize("cls", [errors.NotWritten, errors.NotEnoughReplicas])
def test_a_leader_refusal_before_writing_comes_back_as_its_class(cls):
    """As the server's interceptor sends it (status and trailers) and the client reads it."""
    refusal = cls("this commit log (n1) may have lost its leadership lease of epoch 4: it takes no writes")
    trailing = _trailing_metadata(refusal)
    assert ("mqstore-error", cls.__name__) in trailing and status_for(refusal) is grpc.StatusCode.UNAVAILABLE
    error = from_rpc_error(FakeRpcError(status_for(refusal), str(refusal), trailing), "log:1")
    assert type(error) is cls and isinstance(error, errors.NotWritten) and "leadership lease" in str(error)


@dataclasses.dataclass(frozen=True)
class Sample:
    size_bytes: int = 10
    ratio: float = 0.5
    enabled: bool = False
    name: str = "x"


def _batch_error(exc: errors.MqStoreError) -> commitlog_pb2.BatchError:
    """As CommitLogInternal.AppendBatches reports a refused batch."""
    return commitlog_pb2.BatchError(code=status_for(exc).value[0], message=str(exc), error=type(exc).__name__,
                                    retriable=exc.retriable)


REFUSED = [errors.InvalidArgument("bad"), errors.NotFound("no topic"), errors.FlushTimeout("slow"),
           errors.NotLeader("replica", leader_address="h:1"), errors.OutOfRange("past"),
           errors.NotEnoughReplicas("1 of 2"), errors.TopicNotFound("no such topic")]


@pytest.mark.parametrize("exc", REFUSED, ids=lambda exc: type(exc).__name__)
def test_a_refused_batch_comes_back_as_the_exception_it_was(exc):
    error = from_batch_error(_batch_error(exc), "log:1")
    assert type(error) is type(exc) and "log:1" in str(error) and str(exc) in str(error)


def test_a_batch_error_of_an_unknown_name_falls_back_to_its_code():
    error = from_batch_error(commitlog_pb2.BatchError(code=grpc.StatusCode.NOT_FOUND.value[0], message="m",
                                                      error="SomethingNewer"), "log:1")
    assert type(error) is errors.NotFound
    error = from_batch_error(commitlog_pb2.BatchError(code=99, message="m", error="object"), "log:1")
    assert type(error) is errors.Unavailable  # never a non-mqstore class named by the peer


def test_flags_win_over_the_environment_which_wins_over_defaults():
    parser = argparse.ArgumentParser()
    S.add_flags(parser, Sample)
    args = parser.parse_args(["--size-bytes", "4KiB", "--enabled", "yes"])
    env = {"MQSTORE_SIZE_BYTES": "1", "MQSTORE_RATIO": "0.25", "MQSTORE_NAME": "from-env"}
    assert Sample(**S.values_for(args, env, Sample)) == Sample(4096, 0.25, True, "from-env")
    assert S.values_for(parser.parse_args([]), {}, Sample) == {}
    with pytest.raises(errors.InvalidArgument, match="--enabled / MQSTORE_ENABLED"):
        S.values_for(parser.parse_args(["--enabled", "maybe"]), {}, Sample)
    assert S.parse_int("1_000") == 1000 and S.parse_int("2MiB") == 2 << 20


def test_a_hosted_part_names_its_flags_and_variables_with_its_prefix():
    """Local mode's parts (gateway_service.local, txn_service.local) share this: --<prefix><field>."""
    parser = argparse.ArgumentParser()
    S.add_texts(parser, {"part_port": "serve the part on this port"})
    S.add_flags(parser, Sample, skip={"name"}, prefix="part_", about="Local-mode part: {field} (README)")
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["part_port"] == "serve the part on this port; env MQSTORE_PART_PORT"
    assert helps["part_size_bytes"] == "Local-mode part: size_bytes (README); env MQSTORE_PART_SIZE_BYTES, default 10"
    assert "part_name" not in helps and "size_bytes" not in helps
    args = parser.parse_args(["--part-size-bytes", "2KiB", "--part-port", "7"])
    env = {"MQSTORE_PART_RATIO": "0.25", "MQSTORE_RATIO": "0.75", "MQSTORE_PART_NAME": "skipped"}
    assert S.values_for(args, env, Sample, skip={"name"}, prefix="part_") == {"size_bytes": 2048, "ratio": 0.25}
    assert S.typed(args, env, "part_port", S.parse_int, None) == 7
    with pytest.raises(errors.InvalidArgument, match="--part-enabled / MQSTORE_PART_ENABLED"):
        S.values_for(parser.parse_args(["--part-enabled", "maybe"]), {}, Sample, prefix="part_")


def test_a_fields_help_metadata_says_what_it_means_in_its_flags_help():
    """op_batch_interval_ms (issue 37) is an upper bound for OP entries nobody waits for, not a Rollback's
    wait: its help says so, on the Transaction service's command line and on Local mode's."""
    @dataclasses.dataclass(frozen=True)
    class Explained:
        wait_ms: int = dataclasses.field(default=5, metadata={"help": "how long at most"})

    parser = argparse.ArgumentParser()
    S.add_flags(parser, Explained, prefix="part_", about="Local-mode part: {field}")
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["part_wait_ms"] == "Local-mode part: wait_ms; how long at most; env MQSTORE_PART_WAIT_MS, default 5"
    parser = argparse.ArgumentParser()
    S.add_flags(parser, TxnConfig, skip={"data_dir"})
    text = {a.dest: a.help for a in parser._actions}["op_batch_interval_ms"]
    assert "upper bound" in text and "Nagle" in text and text.endswith("default 3000")
