"""The task factory's procedural bugs: each strategy's edit, made on the text (the rest of the file byte for
byte), parsing, and changing the program; the lines it changed recorded for the statement's leak check."""

from __future__ import annotations

import ast
import textwrap

import pytest

from orchard.tasks.factory.mutations import STRATEGIES, Mutation, mutations, rewrite_mutation

SOURCE = '''"""A module."""

LIMIT = 10  # module level: never mutated


def window(xs, n):
    """The first n items that are small and not zero."""
    out = []
    for i in range(n):
        if xs[i] < 3 and not xs[i] == 0:  # a comment that stays
            out.append(xs[i:n] + [i * 2])
        n -= 1
    return out


class Box:
    def put(self, key, value):
        if key is None:
            raise ValueError("no key")
        self.items = dict(key, value)
        return True
'''


def by_strategy(source: str = SOURCE) -> dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]]:
    found: dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]] = {}
    for m in mutations("pkg/mod.py", source):
        found.setdefault(m.strategy, []).append((m.removed, m.added))
    return found


def test_every_strategy_makes_its_edit() -> None:
    found = by_strategy()
    assert set(found) == set(STRATEGIES)
    line = "if xs[i] < 3 and not xs[i] == 0:  # a comment that stays"
    assert ((line,), ("if xs[i] <= 3 and not xs[i] == 0:  # a comment that stays",)) in found["compare"]
    assert ((line,), ("if xs[i] < 3 and not xs[i] != 0:  # a comment that stays",)) in found["compare"]
    assert (("if key is None:",), ("if key is not None:",)) in found["compare"]
    assert ((line,), ("if xs[i] < 3 or not xs[i] == 0:  # a comment that stays",)) in found["boolean"]
    assert ((line,), ("if xs[i] < 3 and xs[i] == 0:  # a comment that stays",)) in found["boolean"]
    assert (("return True",), ("return False",)) in found["boolean"]
    assert (("n -= 1",), ("n += 1",)) in found["arithmetic"]
    assert (("out.append(xs[i:n] + [i * 2])",), ("out.append(xs[i:n] - [i * 2])",)) in found["arithmetic"]
    assert (("out.append(xs[i:n] + [i * 2])",), ("out.append(xs[i:n] + [i // 2])",)) in found["arithmetic"]
    assert (("n -= 1",), ("n -= 0",)) in found["constant"]
    assert (("for i in range(n):",), ("for i in range(n + 1):",)) in found["off_by_one"]
    assert (("out.append(xs[i:n] + [i * 2])",), ("out.append(xs[i:n - 1] + [i * 2])",)) in found["off_by_one"]
    assert (("out.append(xs[i:n] + [i * 2])",), ("out.append(xs[i + 1:n] + [i * 2])",)) in found["off_by_one"]
    assert (("self.items = dict(key, value)",), ("self.items = dict(value, key)",)) in found["swap_args"]
    assert (("n -= 1",), ()) in found["remove_statement"]
    assert (("self.items = dict(key, value)",), ()) in found["remove_statement"]
    assert (("if key is None:", 'raise ValueError("no key")'), ()) in found["remove_branch"]
    assert found["early_return"] == [((), ("return out",))]


def test_edits_keep_the_rest_of_the_file_and_change_the_program() -> None:
    original = ast.dump(ast.parse(SOURCE))
    found = mutations("pkg/mod.py", SOURCE)
    assert len({m.source for m in found}) == len(found)  # no two the same
    for m in found:
        assert ast.dump(ast.parse(m.source)) != original
        assert "LIMIT = 10  # module level" in m.source
        assert "# a comment that stays" in m.source or m.strategy == "remove_branch"  # the branch it is on went
        assert m.function in ("window", "Box.put")
        assert SOURCE.splitlines()[m.line - 1].strip() in m.removed or not m.removed
    # constants of the docstring, the module level and the `dict(...)` call's callee are never touched
    assert all('"""The first n items that are small and not zero."""' in m.source for m in found)
    assert {m.key for m in found} == {m.key for m in mutations("pkg/mod.py", SOURCE)}  # deterministic


def test_strategies_filter_and_bad_files_give_nothing() -> None:
    assert {m.strategy for m in mutations("m.py", SOURCE, ("compare",))} == {"compare"}
    assert mutations("m.py", "def broken(:\n") == []
    assert mutations("m.py", "X = 1 + 2\n") == []  # no function


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(a, b):\n    return a ** b\n", []),  # ** is not *
        ("def f(a, b):\n    return a // b\n", ["return a / b"]),
        ("def f(a):\n    return 'x' + a\n", []),  # string concatenation is left alone
        ("def f(a):\n    return a[-1]\n", ["return a[0]"]),
        ("def f(a):\n    return a <= 1 < 2\n", ["return a < 1 < 2", "return a <= 1 <= 2"]),
    ],
)
def test_operator_edits_find_the_right_token(source: str, expected: list[str]) -> None:
    got = [
        m.added[0]
        for m in mutations("m.py", source, ("arithmetic", "compare", "off_by_one", "constant"))
        if m.strategy != "constant"
    ]
    assert sorted(got) == sorted(expected)


def test_non_ascii_text_keeps_its_columns() -> None:
    source = 'def f(x):\n    s = "héllo wörld"\n    return s[x] == "ü"\n'
    found = {m.added: m.strategy for m in mutations("m.py", source)}
    assert found[('return s[x + 1] == "ü"',)] == "off_by_one"
    assert found[('return s[x] != "ü"',)] == "compare"


REPLY = """Here it is:
```python
    def put(self, key, value):
        if key is not None:
            raise ValueError("no key")
        self.items = dict(key, value)
        return True
```
"""


def test_a_models_rewrite_becomes_a_bug_in_place() -> None:
    """The reply's function replaces the method at the method's indentation; the rest of the file stays."""
    found = rewrite_mutation("pkg/mod.py", SOURCE, "Box.put", REPLY)
    assert isinstance(found, Mutation) and found.strategy == "model_rewrite" and found.function == "Box.put"
    assert found.removed == ("if key is None:",) and found.added == ("if key is not None:",)
    assert found.source == SOURCE.replace("if key is None:", "if key is not None:")


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("I would change the comparison.", "no code block in the reply"),
        ("```python\ndef put(self, key:\n```", "the rewrite does not parse"),
        ("```python\ndef take(self, key, value):\n    return 1\n```", "the reply is not one function named put"),
        (
            "```python\nclass Box:\n    def put(self, key, value):\n        return 1\n```",
            "the reply is not one function named put",
        ),
        ("```\n" + textwrap.dedent(SOURCE.split("class Box:\n")[1]) + "```", "the rewrite changes nothing"),
    ],
)
def test_replies_that_make_no_bug_say_why(reply: str, reason: str) -> None:
    assert rewrite_mutation("pkg/mod.py", SOURCE, "Box.put", reply) == reason
