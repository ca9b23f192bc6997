"""RocketMQ's SQL92 selector over a message's properties: parsed once into closures, evaluated per record.

Grammar (keywords in any case; precedence from loosest: OR, AND, NOT, then the predicates):

  expression := and (OR and)*
  and        := not (AND not)*
  not        := NOT not | predicate
  predicate  := operand [ (= | <> | != | < | <= | > | >=) operand
                        | [NOT] BETWEEN operand AND operand
                        | [NOT] IN ( 'string' [, 'string']* )
                        | IS [NOT] NULL
                        | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) 'string' ]
  operand    := (+ | -) operand | ( expression ) | property | 'string' | number | TRUE | FALSE | NULL

Semantics (three-valued: each condition is TRUE, FALSE or UNKNOWN; a message is selected only on TRUE):
- A property is its string value from the record's properties map (user properties and the system ones:
  TAGS, KEYS, UNIQ_KEY, ...); a property that is absent (or empty) is NULL, and any comparison with NULL
  is UNKNOWN. ``IS [NOT] NULL`` is never UNKNOWN.
- ``<``, ``<=``, ``>``, ``>=`` and BETWEEN compare numbers: each side is read as a long or a double
  ('10', '-2', '1.5e3'); a side that is not a number makes the comparison UNKNOWN, as RocketMQ's failed
  conversion matches nothing.
- ``=`` and ``<>``: with a number on one side, as numbers (a non-numeric side: UNKNOWN); with TRUE or
  FALSE on one side, the other must be 'true' or 'false' (any case; otherwise UNKNOWN); else as strings.
- IN, CONTAINS, STARTSWITH, ENDSWITH compare strings; their right side is string literals.
- NOT UNKNOWN is UNKNOWN; FALSE AND UNKNOWN is FALSE; TRUE OR UNKNOWN is TRUE (Kleene's logic).
- A bare property as a condition is TRUE for 'true', FALSE for 'false' (any case), otherwise UNKNOWN.

Limits: MAX_EXPRESSION_CHARS characters, MAX_TOKENS tokens, MAX_DEPTH nested operators, MAX_IN_VALUES values
in one IN list. A malformed expression raises InvalidArgument naming the 1-based column and what was
expected. :func:`compile_filter` caches the compiled expressions (LRU, CACHE_SIZE): thread-safe; a compiled
filter is immutable and thread-safe. The values, comparisons and Kleene connectives the closures are made
of: sql92_eval; the tokens: sql92_lexer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from mqstore.errors import InvalidArgument

from .sql92_eval import (STRING_TESTS, TAGS_ATTRIBUTE, Cond, Props, all_of, any_of, as_boolean, as_number,
                         between, comparison, in_values, literal, names, negated, requiring)
from .sql92_lexer import END, FLOAT, ID, INT, KEYWORD, LONG_MAX, OP, STRING, Token, syntax_error, tokenize

MAX_EXPRESSION_CHARS = 4096
MAX_TOKENS = 1024
MAX_DEPTH = 64
MAX_IN_VALUES = 256
CACHE_SIZE = 512

_VALUE, _COND = "value", "condition"
_COMPARISONS = ("=", "<>", "!=", "<", "<=", ">", ">=")
_STRING_TESTS = ("CONTAINS", "STARTSWITH", "ENDSWITH")


@dataclass(frozen=True, slots=True)
class Sql92Filter:
    """A compiled expression: :meth:`matches` a record's properties map. ``required_tags``: when the
    expression can be TRUE only for a message whose TAGS is one of these (``TAGS = 'a' AND ...``,
    ``TAGS IN ('a', 'b') AND ...``), them, so a read may skip other tags by their consume-queue tag code
    without reading the record; else None."""
    expression: str
    _test: Callable[[Props], Cond]
    required_tags: frozenset[str] | None = None

    def matches(self, properties: Props) -> bool:
        """Whether the expression is TRUE for ``properties`` (FALSE and UNKNOWN do not select)."""
        return self._test(properties) is True

    def evaluate(self, properties: Props) -> Cond:
        """The three-valued result: True, False or None (UNKNOWN)."""
        return self._test(properties)


@functools.lru_cache(maxsize=CACHE_SIZE)
def compile_filter(expression: str) -> Sql92Filter:
    """``expression`` compiled (cached; errors are not cached). Raises InvalidArgument when malformed."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise InvalidArgument(f"SQL92 filter_expression has {len(expression)} characters; the limit is "
                              f"{MAX_EXPRESSION_CHARS}")
    if not expression.strip():
        raise InvalidArgument("SQL92 filter_expression is empty: write a condition such as \"a > 5 AND TAGS IN "
                              "('x', 'y')\" (or send a TAG filter of '*' for every message)")
    parser = _Parser(expression, tokenize(expression, MAX_TOKENS))
    kind, fn = parser.expression(0)
    parser.expect_end()
    test = parser.as_condition(kind, fn, parser.tokens[0])
    return Sql92Filter(expression, test, getattr(test, TAGS_ATTRIBUTE, None))

# ---- the parser: recursive descent, each rule returning (kind, closure) ----------------------------------

class _Parser:
    def __init__(self, text: str, tokens: list[Token]):
        self.text, self.tokens, self.at = text, tokens, 0

    @property
    def token(self) -> Token:
        return self.tokens[self.at]

    def _take(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def _is(self, kind: str, *values: str) -> bool:
        return self.token.kind == kind and (not values or self.token.value in values)

    def fail(self, token: Token, expected: str) -> InvalidArgument:
        return syntax_error(self.text, token.column, f"expected {expected}, found {token.describe()}")

    def _deeper(self, depth: int) -> int:
        if depth >= MAX_DEPTH:
            raise syntax_error(self.text, self.token.column, f"the expression nests deeper than {MAX_DEPTH} levels, "
                                                             f"the limit")
        return depth + 1

    def expect_end(self) -> None:
        if not self._is(END):
            raise self.fail(self.token, "AND, OR or the end of the expression")

    def as_condition(self, kind: str, fn, token: Token) -> Callable[[Props], Cond]:
        if kind == _COND:
            return fn
        if getattr(fn, "literal", False) and not isinstance(fn(None), bool):
            raise self.fail(token, "a condition (a comparison, IN, BETWEEN, IS NULL, ...)")
        return lambda p: as_boolean(fn(p))

    def _value(self, kind: str, fn, token: Token):
        if kind != _VALUE:
            raise syntax_error(self.text, token.column, "expected a value (a property, 'string', number, TRUE, "
                                                        "FALSE or NULL) where a condition was written")
        return fn

    def expression(self, depth: int):
        depth = self._deeper(depth)
        first = self.token
        kind, fn = self._and(depth)
        if not self._is(KEYWORD, "OR"):
            return kind, fn
        parts = [self.as_condition(kind, fn, first)]
        while self._is(KEYWORD, "OR"):
            self._take()
            start = self.token
            parts.append(self.as_condition(*self._and(depth), start))
        return _COND, any_of(parts)

    def _and(self, depth: int):
        first = self.token
        kind, fn = self._not(depth)
        if not self._is(KEYWORD, "AND"):
            return kind, fn
        parts = [self.as_condition(kind, fn, first)]
        while self._is(KEYWORD, "AND"):
            self._take()
            start = self.token
            parts.append(self.as_condition(*self._not(depth), start))
        return _COND, all_of(parts)

    def _not(self, depth: int):
        if self._is(KEYWORD, "NOT"):
            self._take()
            start = self.token
            inner = self.as_condition(*self._not(self._deeper(depth)), start)
            return _COND, lambda p: negated(inner(p))
        return self._predicate(depth)

    def _predicate(self, depth: int):
        start = self.token
        kind, fn = self._operand(depth)
        token = self.token
        if token.kind == OP and token.value in _COMPARISONS:
            self._take()
            left = self._value(kind, fn, start)
            right_token = self.token
            right = self._value(*self._operand(depth), right_token)
            return _COND, comparison(token.value, left, right)
        if token.kind != KEYWORD:
            return kind, fn
        left = fn
        if token.value == "IS":
            self._value(kind, fn, start)
            return _COND, self._is_null(left)
        negate = token.value == "NOT"
        if negate:
            self._take()
            if not self._is(KEYWORD, "BETWEEN", "IN", *_STRING_TESTS):
                raise self.fail(self.token, "BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT")
        if not self._is(KEYWORD, "BETWEEN", "IN", *_STRING_TESTS):
            return kind, fn
        self._value(kind, fn, start)
        test = self._keyword_predicate(left, depth)
        return _COND, (lambda p: negated(test(p))) if negate else test

    def _keyword_predicate(self, left, depth: int):
        word = self._take().value
        if word == "BETWEEN":
            low = self._value(*self._operand(depth), self.tokens[self.at])
            if not self._is(KEYWORD, "AND"):
                raise self.fail(self.token, "AND between BETWEEN's two bounds")
            self._take()
            high = self._value(*self._operand(depth), self.tokens[self.at])
            return lambda p: between(left(p), low(p), high(p))
        if word == "IN":
            values = self._in_list()
            return requiring(lambda p: in_values(left(p), values), values if names(left) == "TAGS" else None)
        text = self._string_literal(f"a 'string' after {word}")
        return STRING_TESTS[word](left, text)

    def _is_null(self, left):
        self._take()
        negate = self._is(KEYWORD, "NOT")
        if negate:
            self._take()
        if not self._is(KEYWORD, "NULL"):
            raise self.fail(self.token, "NULL after IS NOT" if negate else "NOT NULL or NULL after IS")
        self._take()
        if negate:
            return lambda p: left(p) is not None
        return lambda p: left(p) is None

    def _in_list(self) -> frozenset[str]:
        if not self._is(OP, "("):
            raise self.fail(self.token, "'(' after IN")
        self._take()
        values = [self._string_literal("a 'string' in the IN list (IN takes string literals)")]
        while self._is(OP, ","):
            self._take()
            values.append(self._string_literal("a 'string' after ',' in the IN list"))
            if len(values) > MAX_IN_VALUES:
                raise syntax_error(self.text, self.token.column, f"the IN list has more than {MAX_IN_VALUES} "
                                                                 f"values, the limit")
        if not self._is(OP, ")"):
            raise self.fail(self.token, "',' or ')' in the IN list")
        self._take()
        return frozenset(values)

    def _string_literal(self, expected: str) -> str:
        if not self._is(STRING):
            raise self.fail(self.token, expected)
        return self._take().value

    def _operand(self, depth: int, minus: bool = False):
        token = self.token
        if token.kind == OP and token.value in ("+", "-"):
            self._take()
            sign_depth = self._deeper(depth)
            operand_token = self.token
            inner = self._value(*self._operand(sign_depth, token.value == "-"), operand_token)
            return _VALUE, _signed(token.value, inner, self, token)
        if token.kind == OP and token.value == "(":
            self._take()
            kind, fn = self.expression(depth)
            if not self._is(OP, ")"):
                raise self.fail(self.token, "')' to close the '(' at column " + str(token.column))
            self._take()
            return kind, fn
        self._take()
        if token.kind == ID:
            name = token.value

            def read(p):
                return p.get(name) or None
            read.property = name
            return _VALUE, read
        if token.kind in (STRING, INT, FLOAT) or (token.kind == KEYWORD and token.value in ("TRUE", "FALSE", "NULL")):
            if token.kind == INT and token.value > LONG_MAX and not minus:  # -9223372036854775808 is a long
                raise syntax_error(self.text, token.column, f"the number {token.value} is beyond a 64-bit long")
            return _VALUE, literal({"TRUE": True, "FALSE": False, "NULL": None}.get(token.value, token.value)
                                    if token.kind == KEYWORD else token.value)
        raise self.fail(token, "a property name, a 'string', a number, TRUE, FALSE, NULL or '('")

def _signed(sign: str, inner, parser: _Parser, token: Token):
    if getattr(inner, "literal", False):
        number = inner(None)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise parser.fail(token, "a number after the sign")
        value = -number if sign == "-" else number
        if isinstance(value, int) and value > LONG_MAX:
            raise syntax_error(parser.text, token.column, f"the number {value} is beyond a 64-bit long")
        return literal(value)
    if sign == "+":
        return lambda p: as_number(inner(p))

    def minus(p):
        n = as_number(inner(p))
        return None if n is None else -n
    return minus
