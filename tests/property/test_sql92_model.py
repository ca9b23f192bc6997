"""The SQL92 selector (mqstore.filters.sql92) against a straightforward reference: random expression trees
are rendered as text (keywords in random case, random spacing and parentheses), compiled, and evaluated
over random property maps; the three-valued result must equal a tree-walking evaluator written here from
the rules alone (truth tables for AND/OR/NOT, a value table for each comparison); and an expression's
required_tags (what a read skips by tag code) never excludes a message it selects. The seed is printed;
rerun with MQSTORE_SEED=<n>, more cases with MQSTORE_SQL92_CASES=<n> (default 3,000)."""

from __future__ import annotations

import os
import random
import re

from mqstore.filters.sql92 import compile_filter

NAMES = ("a", "b", "price", "TAGS", "KEYS", "$x", "under_score")
VALUES = ("0", "1", "7", "-3", "10", "2.5", "1e1", "eu", "us", "hello world", "true", "FALSE", "x'y", "", "007",
          "tagA")
STRINGS = ("eu", "us", "hello", "world", "7", "true", "x'y", "", "l", "tagA")
NUMBERS = (0, 1, 7, -3, 10, 2.5, -0.5, 100)
T, F, U = "T", "F", "U"


# ---- the reference ------------------------------------------------------------------------------------

def ref_number(v):
    """A value as a number for the reference: ints and floats, and strings that are written as one."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    s = v.strip()
    if re.fullmatch(r"[+-]?[0-9]+", s):
        return int(s)
    if re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", s):
        return float(s)
    return None


def truth(b):
    return T if b else F


def ref_equal(x, y):
    if x is None or y is None:
        return U
    if isinstance(x, bool) or isinstance(y, bool):
        bools = []
        for v in (x, y):
            if isinstance(v, bool):
                bools.append(v)
            elif isinstance(v, str) and v.lower() in ("true", "false"):
                bools.append(v.lower() == "true")
            else:
                return U
        return truth(bools[0] == bools[1])
    if isinstance(x, (int, float)) or isinstance(y, (int, float)):
        nx, ny = ref_number(x), ref_number(y)
        return U if nx is None or ny is None else truth(nx == ny)
    return truth(x == y)


def ref_not(t):
    return {T: F, F: T, U: U}[t]


def ref_and(ts):
    return F if F in ts else U if U in ts else T


def ref_or(ts):
    return T if T in ts else U if U in ts else F


def ref_value(node, props):
    kind = node[0]
    if kind == "prop":
        return props.get(node[1]) or None
    if kind == "neg":
        n = ref_value(node[1], props)
        n = ref_number(n)
        return None if n is None else -n
    return node[1]  # lit


def ref_cond(node, props):
    kind = node[0]
    if kind == "and":
        return ref_and([ref_cond(n, props) for n in node[1]])
    if kind == "or":
        return ref_or([ref_cond(n, props) for n in node[1]])
    if kind == "not":
        return ref_not(ref_cond(node[1], props))
    if kind == "bool":
        return truth(node[1])
    if kind == "cmp":
        op, x, y = node[1], ref_value(node[2], props), ref_value(node[3], props)
        if op == "=":
            return ref_equal(x, y)
        if op in ("<>", "!="):
            return ref_not(ref_equal(x, y))
        nx, ny = ref_number(x), ref_number(y)
        if nx is None or ny is None:
            return U
        return truth({"<": nx < ny, "<=": nx <= ny, ">": nx > ny, ">=": nx >= ny}[op])
    if kind == "between":
        x, lo, hi = (ref_number(ref_value(n, props)) for n in node[2:5])
        low_ok = U if x is None or lo is None else truth(x >= lo)
        high_ok = U if x is None or hi is None else truth(x <= hi)
        result = ref_and([low_ok, high_ok])
        return ref_not(result) if node[1] else result
    if kind == "in":
        x = ref_value(node[2], props)
        result = U if x is None else truth(str(x) in node[3])
        return ref_not(result) if node[1] else result
    if kind == "isnull":
        is_null = ref_value(node[2], props) is None
        return truth(not is_null if node[1] else is_null)
    if kind == "strtest":
        x = ref_value(node[3], props)
        if x is None:
            return U
        s = str(x)
        hit = {"CONTAINS": node[4] in s, "STARTSWITH": s.startswith(node[4]), "ENDSWITH": s.endswith(node[4])}[node[2]]
        return ref_not(truth(hit)) if node[1] else truth(hit)
    raise AssertionError(kind)


# ---- random trees and their text --------------------------------------------------------------------------

def kw(rng, word):
    return "".join(c.lower() if rng.random() < 0.3 else c for c in word)


def quoted(s):
    return "'" + s.replace("'", "''") + "'"


def gen_value(rng, numeric_only=False):
    r = rng.random()
    if r < 0.5:
        return ("prop", rng.choice(NAMES))
    if r < 0.55 and not numeric_only:
        return ("lit", rng.choice((True, False)))
    if r < 0.65:
        return ("neg", ("prop", rng.choice(NAMES)))
    if r < 0.85 or numeric_only:
        return ("lit", rng.choice(NUMBERS))
    return ("lit", rng.choice(STRINGS))


def gen_cond(rng, depth):
    r = rng.random()
    if depth > 0 and r < 0.3:
        return (rng.choice(("and", "or")), [gen_cond(rng, depth - 1) for _ in range(rng.randint(2, 3))])
    if depth > 0 and r < 0.4:
        return ("not", gen_cond(rng, depth - 1))
    r = rng.random()
    if r < 0.4:
        return ("cmp", rng.choice(("=", "<>", "!=", "<", "<=", ">", ">=")), gen_value(rng), gen_value(rng))
    if r < 0.55:
        return ("between", rng.random() < 0.3, ("prop", rng.choice(NAMES)), gen_value(rng, True),
                gen_value(rng, True))
    if r < 0.7:
        return ("in", rng.random() < 0.3, ("prop", rng.choice(NAMES)),
                frozenset(rng.sample(STRINGS, rng.randint(1, 3))))
    if r < 0.8:
        return ("isnull", rng.random() < 0.5, ("prop", rng.choice(NAMES)))
    if r < 0.95:
        return ("strtest", rng.random() < 0.3, rng.choice(("CONTAINS", "STARTSWITH", "ENDSWITH")),
                ("prop", rng.choice(NAMES)), rng.choice(STRINGS))
    return ("bool", rng.random() < 0.5)


def render_value(rng, node):
    if node[0] == "prop":
        return node[1]
    if node[0] == "neg":
        return "-" + render_value(rng, node[1])
    v = node[1]
    if isinstance(v, bool):
        return kw(rng, "TRUE" if v else "FALSE")
    if isinstance(v, str):
        return quoted(v)
    if isinstance(v, int) and v < 0 and rng.random() < 0.5:
        return f"- {-v}"
    return repr(v)


def render(rng, node):
    """Every compound is parenthesised, so the text's grouping is the tree's whatever the precedence."""
    sp = " " * rng.randint(1, 2)
    kind = node[0]
    if kind in ("and", "or"):
        return "(" + f"{sp}{kw(rng, kind.upper())}{sp}".join(render(rng, n) for n in node[1]) + ")"
    if kind == "not":
        return f"({kw(rng, 'NOT')} {render(rng, node[1])})"
    if kind == "bool":
        return kw(rng, "TRUE" if node[1] else "FALSE")
    if kind == "cmp":
        return f"{render_value(rng, node[2])}{sp}{node[1]}{sp}{render_value(rng, node[3])}"
    neg = kw(rng, "NOT") + " " if node[1] else ""
    if kind == "between":
        return (f"({render_value(rng, node[2])} {neg}{kw(rng, 'BETWEEN')} {render_value(rng, node[3])} "
                f"{kw(rng, 'AND')} {render_value(rng, node[4])})")
    if kind == "in":
        values = f",{sp}".join(quoted(s) for s in sorted(node[3]))
        return f"{render_value(rng, node[2])} {neg}{kw(rng, 'IN')}{sp}({values})"
    if kind == "isnull":
        return f"{render_value(rng, node[2])} {kw(rng, 'IS')} {neg}{kw(rng, 'NULL')}"
    return f"{render_value(rng, node[3])} {neg}{kw(rng, node[2])} {quoted(node[4])}"


def test_the_selector_agrees_with_the_reference_on_random_expressions_and_properties():
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    cases = int(os.environ.get("MQSTORE_SQL92_CASES", 3000))
    print(f"MQSTORE_SEED={seed}")
    rng = random.Random(seed)
    outcomes = {T: 0, F: 0, U: 0}
    skipped = 0  # property maps a read would pass over by their tag code (required_tags)
    for case in range(cases):
        tree = gen_cond(rng, rng.randint(0, 3))
        text = render(rng, tree)
        compiled = compile_filter(text)
        for _ in range(4):
            props = {n: rng.choice(VALUES) for n in NAMES if rng.random() < 0.6}
            expected = ref_cond(tree, props)
            got = {True: T, False: F, None: U}[compiled.evaluate(props)]
            assert got == expected, f"case {case} (seed {seed}): {text!r} over {props}: {got}, the reference {expected}"
            assert compiled.matches(props) == (expected == T)
            if compiled.required_tags is not None and props.get("TAGS") not in compiled.required_tags:
                assert expected != T, f"{text!r} requires TAGS in {compiled.required_tags} yet selects {props}"
                skipped += 1
            outcomes[expected] += 1
    assert min(outcomes.values()) > cases // 20, outcomes  # each truth value is exercised
    assert skipped > cases // 100, skipped
