"""The SQL92 selector (mqstore.filters.sql92): RocketMQ's grammar and three-valued semantics on examples,
the golden error messages with their 1-based columns, the limits and the cache. The random comparison
with a reference evaluator is tests/property/test_sql92_model.py."""

from __future__ import annotations

import pytest

from mqstore.errors import InvalidArgument
from mqstore.filters import SQL92, TAG, selection
from mqstore.filters import sql92
from mqstore.filters.sql92 import compile_filter
from mqstore.format import record_reader
from mqstore.model import MessageIn
from mqstore.store_parts import build_store

PROPS = {"TAGS": "tagA", "KEYS": "k1 k2", "UNIQ_KEY": "AC1100", "region": "eu", "price": "15", "ratio": "0.25",
         "flag": "TRUE", "name": "it's", "big": "9223372036854775807"}


@pytest.mark.parametrize("expression, expected", [
    ("region = 'eu'", True),
    ("region <> 'eu'", False),
    ("region != 'us'", True),
    ("price > 10 AND price <= 15", True),
    ("price BETWEEN 10 AND 20", True),
    ("price NOT BETWEEN 10 AND 20", False),
    ("ratio < 0.5 and ratio >= .25", True),
    ("price = 15.0", True),
    ("price = '15'", True),
    ("price = '15.0'", False),               # two strings compare as strings
    ("TAGS IN ('tagA', 'tagB')", True),
    ("TAGS NOT IN ('tagA')", False),
    ("KEYS CONTAINS 'k2'", True),
    ("KEYS NOT CONTAINS 'k2'", False),
    ("UNIQ_KEY STARTSWITH 'AC'", True),
    ("region ENDSWITH 'u'", True),
    ("missing IS NULL", True),
    ("region IS NOT NULL", True),
    ("missing = 'x'", None),                 # NULL compares to UNKNOWN
    ("NOT missing = 'x'", None),             # NOT UNKNOWN is UNKNOWN
    ("missing = 'x' OR region = 'eu'", True),
    ("missing = 'x' AND region = 'us'", False),
    ("missing = 'x' AND region = 'eu'", None),
    ("region > 3", None),                    # not a number: no match either way
    ("NOT (region > 3)", None),
    ("flag", True),
    ("flag = TRUE AND NOT FALSE", True),
    ("region = 'eu' OR price > 100 AND missing IS NOT NULL", True),   # AND binds tighter than OR
    ("(region = 'eu' OR price > 100) AND missing IS NOT NULL", False),
    ("NOT region = 'us' AND price > 1", True),                         # NOT binds looser than =
    ("name = 'it''s'", True),
    ("-price < -14", True),
    ("price > -5L", True),
    ("big = 9223372036854775807", True),
    ("price > 1e1", True),
    ("reGion = 'eu' ", None),               # property names are case-sensitive, keywords are not
    ("region = 'eu' aNd TAGS iN ('tagA')", True),
    ("TaGs IN ('tagA')", None),
])
def test_examples(expression, expected):
    assert compile_filter(expression).evaluate(PROPS) is expected
    assert compile_filter(expression).matches(PROPS) is (expected is True)


@pytest.mark.parametrize("expression, message", [
    ("a >", "column 4: expected a property name, a 'string', a number, TRUE, FALSE, NULL or '(', found the end "
            "of the expression"),
    ("a = = 1", "column 5: expected a property name, a 'string', a number, TRUE, FALSE, NULL or '(', found '='"),
    ("a IN (1)", "column 7: expected a 'string' in the IN list (IN takes string literals), found int 1"),
    ("a IN ('x' 'y')", "column 11: expected ',' or ')' in the IN list, found the string 'y'"),
    ("a IN 'x'", "column 6: expected '(' after IN, found the string 'x'"),
    ("(a > 1", "column 7: expected ')' to close the '(' at column 1, found the end of the expression"),
    ("a > 1)", "column 6: expected AND, OR or the end of the expression, found ')'"),
    ("'abc", "column 1: a string is not closed: expected a closing '"),
    ("a > 1 b", "column 7: expected AND, OR or the end of the expression, found property b"),
    ("5", "column 1: expected a condition (a comparison, IN, BETWEEN, IS NULL, ...), found int 5"),
    ("a IS 1", "column 6: expected NOT NULL or NULL after IS, found int 1"),
    ("a IS NOT 1", "column 10: expected NULL after IS NOT, found int 1"),
    ("a > 99x", "column 5: a malformed number (it runs into 'x' at column 7)"),
    ("a BETWEEN 1 OR 2", "column 13: expected AND between BETWEEN's two bounds, found keyword OR"),
    ("a NOT LIKE 'x'", "column 7: expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT, found "
                       "property LIKE"),
    ("a CONTAINS 1", "column 12: expected a 'string' after CONTAINS, found int 1"),
    ("a # 1", "column 3: unexpected character '#'"),
    ("a = 1 AND", "column 10: expected a property name"),
    ("a > 9223372036854775808", "column 5: the number 9223372036854775808 is beyond a 64-bit long"),
    ("(a = 1) = 2", "column 1: expected a value (a property, 'string', number, TRUE, FALSE or NULL) where a "
                    "condition was written"),
    ("a = - 'x'", "column 5: expected a number after the sign, found '-'"),
])
def test_golden_errors_name_the_column_and_what_was_expected(expression, message):
    with pytest.raises(InvalidArgument) as caught:
        compile_filter(expression)
    assert f"SQL92 filter_expression {expression!r}: {message}" in str(caught.value)


def test_the_smallest_long_is_a_literal():
    assert compile_filter("x = -9223372036854775808").matches({"x": "-9223372036854775808"})


def test_limits_bound_the_text_the_tokens_the_nesting_and_in_lists():
    with pytest.raises(InvalidArgument, match="4097 characters; the limit is 4096"):
        compile_filter("a = 'x'" + " " * 4090)
    with pytest.raises(InvalidArgument, match="more than 1024 tokens"):
        compile_filter(" OR ".join(["a = 1"] * 400))
    with pytest.raises(InvalidArgument, match="nests deeper than 64"):
        compile_filter("(" * 70 + "a = 1" + ")" * 70)
    with pytest.raises(InvalidArgument, match="nests deeper than 64"):
        compile_filter("NOT " * 70 + "a = 1")
    with pytest.raises(InvalidArgument, match="more than 256 values"):
        compile_filter("a IN (" + ", ".join(f"'{i}'" for i in range(300)) + ")")
    with pytest.raises(InvalidArgument, match="empty"):
        compile_filter("  ")
    assert compile_filter("(" * 30 + "a = 1" + ")" * 30).matches({"a": "1"})


def test_compiled_expressions_are_cached_and_errors_are_not():
    sql92.compile_filter.cache_clear()
    first = compile_filter("price > 10")
    assert compile_filter("price > 10") is first
    for _ in range(2):
        with pytest.raises(InvalidArgument):
            compile_filter("price >")
    info = sql92.compile_filter.cache_info()
    assert (info.hits, info.currsize, info.maxsize) == (1, 1, sql92.CACHE_SIZE)


@pytest.mark.parametrize("expression, required", [
    ("TAGS = 'a'", {"a"}),
    ("'a' = TAGS AND price > 1", {"a"}),
    ("TAGS IN ('a', 'b') AND (TAGS = 'b' OR TAGS = 'c')", {"b"}),
    ("(TAGS = 'a' OR TAGS IN ('c')) AND x IS NULL", {"a", "c"}),
    ("TAGS = 'a' OR x = 1", None),
    ("NOT TAGS = 'a'", None),
    ("TAGS NOT IN ('a')", None),
    ("TAGS <> 'a'", None),
    ("TAGS = 5", None),
    ("tags = 'a'", None),
])
def test_required_tags_are_what_a_selected_message_must_have(expression, required):
    got = compile_filter(expression).required_tags
    assert got == (None if required is None else frozenset(required))


def test_selection_reads_the_filter_type():
    assert selection(TAG, "a || b") == (("a", "b"), None)
    assert selection(TAG, "", ["x"]) == (("x",), None)
    tags, sql = selection(SQL92, "price > 10", ["x"])
    assert tags == ("x",) and sql.matches({"price": "11"})
    with pytest.raises(InvalidArgument, match="not both"):
        selection(TAG, "a", ["b"])
    with pytest.raises(InvalidArgument, match="filter_type 'XPATH'"):
        selection("XPATH", "a")


def test_a_pull_selects_on_the_records_properties_without_reading_their_bodies(small_config, monkeypatch):
    """Both read paths (decoded and raw) select the same messages; the raw one (the compiled codec's Pull)
    reads only the properties of a record it passes over or takes: RecordView.body is never asked."""
    store = build_store(small_config(), None)
    store.start()
    try:
        store.topic_admin.create("t", 1)
        store.append("t", [MessageIn(body=b"%d" % i, tags="even" if i % 2 == 0 else "odd",
                                     properties={"price": str(i), "region": "eu" if i % 3 == 0 else "us"})
                           for i in range(30)])
        wanted = compile_filter("region = 'eu' AND price BETWEEN 5 AND 25")
        decoded = store.pull("t", 0, 0, 100, selector=wanted)
        assert [m.record.body for m in decoded.messages] == [b"6", b"9", b"12", b"15", b"18", b"21", b"24"]
        assert decoded.next_offset == 30
        both = store.pull("t", 0, 0, 100, tags=["odd"], selector=wanted)
        assert [m.record.body for m in both.messages] == [b"9", b"15", b"21"]

        def no_body(view):
            raise AssertionError("the body of a record was read to filter it")
        monkeypatch.setattr(record_reader.RecordView, "body", property(no_body))
        raw = store.pull_raw("t", 0, 0, 100, selector=wanted)
        assert [record_reader.decode(data).properties["price"] for data in raw.records] == [
            "6", "9", "12", "15", "18", "21", "24"]

        read = []
        checked_at = store.commitlog.checked_at
        monkeypatch.setattr(store.commitlog, "checked_at", lambda *a: read.append(a[0]) or checked_at(*a))
        by_tag = store.pull_raw("t", 0, 0, 100, selector=compile_filter("TAGS = 'odd' AND price > 20"))
        assert [record_reader.decode(data).body for data in by_tag.records] == [b"21", b"23", b"25", b"27", b"29"]
        assert len(read) == 15  # the odd ones: the even ones were passed over by their tag code, never read
    finally:
        store.stop()
