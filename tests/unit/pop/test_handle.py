"""Receipt handles (mqstore.pop.handle): self-describing, one shell word, and checked against the group and
topic so that garbage or another group's handle is told apart from one that merely expired."""

from __future__ import annotations

import pytest

from mqstore.errors import InvalidArgument
from mqstore.pop import handle
from mqstore.pop.handle import ReceiptHandle

H = ReceiptHandle(source=1, queue_id=3, queue_offset=1234, ck_id=987_654, visible_at_ms=1_700_000_060_000, attempt=2)


def test_round_trip_and_shape():
    text = handle.encode("g", "orders", H)
    assert text.startswith("v1:1:3:1234:987654:1700000060000:2:") and len(text.rsplit(":", 1)[1]) == 8
    assert " " not in text and handle.decode("g", "orders", text) == H


@pytest.mark.parametrize("group, topic", [("g2", "orders"), ("g", "orders2"), ("", "orders")])
def test_a_handle_of_another_group_or_topic_is_refused(group, topic):
    text = handle.encode("g", "orders", H)
    with pytest.raises(InvalidArgument, match="not issued for group"):
        handle.decode(group, topic, text)


def test_an_altered_field_fails_the_checksum():
    text = handle.encode("g", "orders", H)
    altered = text.replace(":1234:", ":1235:")
    with pytest.raises(InvalidArgument, match="altered"):
        handle.decode("g", "orders", altered)


@pytest.mark.parametrize("text", ["", "junk", "v2:1:3:1234:9:9:2:00000000", "v1:1:3", "v1:a:b:c:d:e:f:" + "0" * 8])
def test_garbage_is_refused(text):
    with pytest.raises(InvalidArgument, match="receipt handle"):
        handle.decode("g", "orders", text)


def test_a_field_that_is_no_number_passes_no_checksum_and_says_so():
    fields = "v1:x:3:1234:987654:1:2"
    import zlib
    checksum = format(zlib.crc32("\x00".join(("g", "t", fields)).encode()), "08x")
    with pytest.raises(InvalidArgument, match="not a number"):
        handle.decode("g", "t", f"{fields}:{checksum}")


def test_a_huge_handle_is_refused_without_echoing_it():
    with pytest.raises(InvalidArgument) as info:
        handle.decode("g", "t", "x" * 100_000)
    assert len(str(info.value)) < 400
