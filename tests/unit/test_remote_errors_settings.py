"""mqstore_rpc.remote_errors (gRPC status -> mqstore exception) and mqstore_rpc.settings (flags and
MQSTORE_* variables -> config values)."""

from __future__ import annotations

import argparse
import dataclasses

import grpc
import pytest
from mqstore import errors
from mqstore_rpc import settings as S
from mqstore_rpc.errors import STATUS_BY_ERROR
from mqstore_rpc.remote_errors import from_rpc_error


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


@dataclasses.dataclass(frozen=True)
class Sample:
    size_bytes: int = 10
    ratio: float = 0.5
    enabled: bool = False
    name: str = "x"


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
