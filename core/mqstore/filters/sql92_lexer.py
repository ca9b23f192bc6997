"""The tokens of RocketMQ's SQL92 selector (the ActiveMQ selector language without LIKE and arithmetic).

  token       written as                                          value
  ----------  --------------------------------------------------  -----------------------------------
  ID          [A-Za-z_$][A-Za-z0-9_$]* that is not a keyword      the name, case kept (properties are
                                                                  case-sensitive)
  KEYWORD     AND OR NOT BETWEEN IN IS NULL TRUE FALSE CONTAINS   the keyword in upper case (keywords
              STARTSWITH ENDSWITH, any case                       are case-insensitive)
  STRING      '...' with '' for a quote inside                    the text between the quotes
  INT         digits, an optional L suffix, within a Java long    int
  FLOAT       digits.digits, .digits, digits. with an optional    float
              exponent (1.5, .5, 2e3, 1.5E-2), an optional D/F
  OP          = <> != < <= > >= ( ) , + -                          the operator
  END         the end of the text

Every token carries its 1-based column. Pure functions; errors are mqstore.errors.InvalidArgument naming
the column and what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mqstore.errors import InvalidArgument, shown

KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE", "CONTAINS",
                      "STARTSWITH", "ENDSWITH"})
ID, KEYWORD, STRING, INT, FLOAT, OP, END = "ID", "KEYWORD", "STRING", "INT", "FLOAT", "OP", "END"
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1

_SPACE = re.compile(r"\s+")
_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_FLOAT = re.compile(r"(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[dDfF]?|\d+[eE][+-]?\d+[dDfF]?|\d+[dDfF]")
_INT = re.compile(r"\d+[lL]?")
_OPS = ("<>", "!=", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    value: object
    column: int      # 1-based

    def describe(self) -> str:
        """The token as an error message shows it."""
        if self.kind == END:
            return "the end of the expression"
        if self.kind == STRING:
            return f"the string {shown(self.value, 40)}"
        if self.kind == OP:
            return f"'{self.value}'"
        return f"{self.kind.lower() if self.kind != ID else 'property'} {self.value}"


def syntax_error(text: str, column: int, message: str) -> InvalidArgument:
    return InvalidArgument(f"SQL92 filter_expression {shown(text)}: column {column}: {message}")


def tokenize(text: str, max_tokens: int) -> list[Token]:
    """The tokens of ``text``, END last; at most ``max_tokens`` before END."""
    tokens: list[Token] = []
    at = 0
    while True:
        space = _SPACE.match(text, at)
        if space:
            at = space.end()
        if at >= len(text):
            tokens.append(Token(END, None, at + 1))
            return tokens
        if len(tokens) >= max_tokens:
            raise syntax_error(text, at + 1, f"the expression has more than {max_tokens} tokens, the limit")
        token, at = _next(text, at)
        tokens.append(token)


def _next(text: str, at: int) -> tuple[Token, int]:
    char, column = text[at], at + 1
    if char == "'":
        return _string(text, at)
    name = _NAME.match(text, at)
    if name:
        word = name.group()
        if word.upper() in KEYWORDS:
            return Token(KEYWORD, word.upper(), column), name.end()
        return Token(ID, word, column), name.end()
    number = _FLOAT.match(text, at)
    if number:
        literal = number.group().rstrip("dDfF")
        return Token(FLOAT, float(literal), column), _after_number(text, number.end(), column)
    number = _INT.match(text, at)
    if number:
        value = int(number.group().rstrip("lL"))
        if value > LONG_MAX + 1:  # LONG_MAX + 1 is allowed for -9223372036854775808; the parser checks the sign
            raise syntax_error(text, column, f"the number {number.group()} is beyond a 64-bit long")
        return Token(INT, value, column), _after_number(text, number.end(), column)
    for op in _OPS:
        if text.startswith(op, at):
            return Token(OP, op, column), at + len(op)
    raise syntax_error(text, column, f"unexpected character {char!r}; expected a property name, a 'string', "
                                     f"a number, a keyword or one of = <> != < <= > >= ( ) ,")


def _after_number(text: str, end: int, column: int) -> int:
    if end < len(text) and (text[end].isalnum() or text[end] in "_$."):
        raise syntax_error(text, column, f"a malformed number (it runs into {text[end]!r} at column {end + 1})")
    return end


def _string(text: str, at: int) -> tuple[Token, int]:
    parts, start = [], at + 1
    while True:
        close = text.find("'", start)
        if close < 0:
            raise syntax_error(text, at + 1, "a string is not closed: expected a closing ' (write '' for a quote "
                                             "inside a string)")
        parts.append(text[start:close])
        if text.startswith("''", close):
            parts.append("'")
            start = close + 2
            continue
        return Token(STRING, "".join(parts), at + 1), close + 1
