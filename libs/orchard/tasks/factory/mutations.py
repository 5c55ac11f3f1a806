"""Procedural bugs: small edits to one function's source, found from its AST and made on the text (the rest of
the file, its comments and layout, stay byte for byte), each checked to parse and to change the AST.

Strategies (each a name in `STRATEGIES`):
- compare: a comparison operator flipped (`<` and `<=`, `==` and `!=`, `in` and `not in`, `is` and `is not`)
- boolean: `and` and `or` swapped, a `not` dropped, `True` and `False` swapped
- arithmetic: `+` and `-`, `*` and `//`, `/` and `*`, `//` and `/`, `%` and `//` swapped (also in `+=` ...)
- constant: an integer constant moved by one (0 and 1 swapped)
- off_by_one: a slice bound, an index or `range()`'s stop moved by one
- swap_args: a call's first two positional arguments swapped
- remove_statement: a call, assignment or raise removed
- remove_branch: an `if` without `else` removed
- early_return: `return x` copied to just after the first assignment of `x`

and, through a model (synthesize.py asks it), model_rewrite: the function as the model rewrote it with a bug in it
(`rewrite_mutation` turns its reply into a Mutation, or says why it cannot be one).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

STRATEGIES = (
    "compare",
    "boolean",
    "arithmetic",
    "constant",
    "off_by_one",
    "swap_args",
    "remove_statement",
    "remove_branch",
    "early_return",
)
_COMPARE = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}
_ARITHMETIC = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "//"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"),
    ast.Mod: ("%", "//"),
}
# The operator's own text in the gap between two operands: a word operator as a word, a symbol not part of a longer
# one (`*` is not the first half of `**`, `/` not of `//`, `<` not of `<<`).
MODEL_STRATEGY = "model_rewrite"
_OPERATOR = {
    "<": r"(?<![<>=!])<(?![<=])",
    "<=": r"<=",
    ">": r"(?<![<>=-])>(?![>=])",
    ">=": r"(?<!>)>=",
    "==": r"==",
    "!=": r"!=",
    "in": r"(?<!not )\bin\b",
    "not in": r"\bnot\s+in\b",
    "is": r"\bis\b(?!\s+not\b)",
    "is not": r"\bis\s+not\b",
    "and": r"\band\b",
    "or": r"\bor\b",
    "+": r"(?<![+=])\+(?![+=])",
    "-": r"(?<![-=])-(?![-=>])",
    "*": r"(?<!\*)\*(?![*=])",
    "/": r"(?<!/)/(?![/=])",
    "//": r"//(?!=)",
    "%": r"%(?!=)",
}
_STATEMENTS = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise)


@dataclass(frozen=True)
class Mutation:
    """One bug in one function: the whole file with it, and where it is (never shown to an agent)."""

    strategy: str
    path: str
    """The file, relative to the repository."""
    function: str
    """The function's qualified name in its module ("Class.method" for a method)."""
    line: int
    """The first line the edit touches (1-based, in the original file)."""
    source: str
    """The whole file with the bug."""
    removed: tuple[str, ...]
    """The original lines the edit changed (stripped), and below the lines it left in their place: what a
    problem statement must never quote."""
    added: tuple[str, ...]

    @property
    def key(self) -> str:
        """A short content hash: the same bug in the same file has the same key."""
        return hashlib.sha256(f"{self.path}\0{self.source}".encode()).hexdigest()[:10]


class _Text:
    """A file's text addressed as the AST addresses it: 1-based lines, UTF-8 byte columns."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.data = source.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        end_line, end_col = node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]
        return self.offset(node.lineno, node.col_offset), self.offset(end_line, end_col)  # type: ignore[attr-defined]

    def text(self, start: int, end: int) -> str:
        return self.data[start:end].decode()

    def replaced(self, start: int, end: int, new: str) -> str:
        return (self.data[:start] + new.encode() + self.data[end:]).decode()

    def line_of(self, offset: int) -> int:
        return max(i for i, s in enumerate(self.starts) if s <= offset) + 1


@dataclass(frozen=True)
class _Edit:
    strategy: str
    start: int
    end: int
    new: str


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The module's functions and the methods of its classes (nested ones belong to the function they are in)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def mutations(path: str, source: str, strategies: tuple[str, ...] = STRATEGIES) -> list[Mutation]:
    """Every bug the strategies make in the file's functions, in source order; none when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    text = _Text(source)
    original = ast.dump(tree)
    found: list[Mutation] = []
    seen: set[str] = set()
    for name, function in functions(tree):
        for edit in _edits(function, text):
            if edit.strategy not in strategies:
                continue
            mutated = text.replaced(edit.start, edit.end, edit.new)
            try:
                changed = ast.dump(ast.parse(mutated)) != original
            except SyntaxError:
                continue
            if not changed or mutated in seen:
                continue
            seen.add(mutated)
            first, removed, added = _changed_lines(source, mutated)
            found.append(
                Mutation(
                    strategy=edit.strategy,
                    path=path,
                    function=name,
                    line=first,
                    source=mutated,
                    removed=removed,
                    added=added,
                )
            )
    return found


def _changed_lines(old: str, new: str) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """The first changed line (1-based, in `old`), and the lines only `old` has and only `new` has, stripped."""
    a, b = old.splitlines(), new.splitlines()
    first, removed, added = 0, [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            first = first or i1 + 1
            removed += [s for line in a[i1:i2] if (s := line.strip())]
            added += [s for line in b[j1:j2] if (s := line.strip())]
    return first, tuple(removed), tuple(added)


def _body(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """Every node of the function's body (not its decorators, defaults or annotations)."""
    for statement in function.body:
        yield from ast.walk(statement)


def _docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _operator(text: _Text, left: ast.AST, right: ast.AST, symbol: str) -> tuple[int, int] | None:
    """Where the operator `symbol` stands between two operands."""
    gap_start, gap_end = text.span(left)[1], text.span(right)[0]
    gap = text.text(gap_start, gap_end)
    match = re.search(_OPERATOR[symbol], gap)
    if match is None or "#" in gap[: match.start()]:
        return None
    return gap_start + len(gap[: match.start()].encode()), gap_start + len(gap[: match.end()].encode())


def _plus_one(text: _Text, node: ast.expr, delta: int) -> str:
    """The expression moved by `delta` (an integer constant changed in place, anything else with `+ 1`)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return str(node.value + delta)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        if type(value) is int:
            return str(-value + delta)
    inner = text.text(*text.span(node))
    atomic = isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant))
    return f"{inner if atomic else f'({inner})'} {'+' if delta > 0 else '-'} {abs(delta)}"


def _whole_lines(text: _Text, node: ast.stmt) -> tuple[int, int] | None:
    """The statement's lines, newline included, when nothing else shares them (no `a; b`, no `if x: y`)."""
    start, end = text.span(node)
    line_start = text.starts[node.lineno - 1]
    line_end = text.starts[min(node.end_lineno or node.lineno, len(text.starts) - 1)]
    before, after = text.text(line_start, start), text.text(end, line_end)
    if before.strip() or (after.strip() and not after.strip().startswith("#")):
        return None
    return line_start, line_end


def _edits(function: ast.FunctionDef | ast.AsyncFunctionDef, text: _Text) -> Iterator[_Edit]:
    slices: set[int] = set()  # constants inside subscripts: off_by_one's, not constant's
    for node in _body(function):
        if isinstance(node, ast.Subscript):
            slices.update(id(n) for n in ast.walk(node.slice))
    for node in _body(function):
        yield from _expression_edits(node, text, slices)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not isinstance(node, ast.stmt):
            continue
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                yield from _block_edits(block, text)
    yield from _block_edits(function.body, text)
    yield from _early_returns(function, text)


def _expression_edits(node: ast.AST, text: _Text, slices: set[int]) -> Iterator[_Edit]:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            old, new = _COMPARE[type(op)]
            if (where := _operator(text, operands[i], operands[i + 1], old)) is not None:
                yield _Edit("compare", *where, new)
    elif isinstance(node, ast.BoolOp):
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        if (where := _operator(text, node.values[0], node.values[1], old)) is not None:
            yield _Edit("boolean", *where, new)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = text.text(*text.span(node.operand))
        loose = isinstance(node.operand, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr))
        yield _Edit("boolean", *text.span(node), f"({inner})" if loose else inner)
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield _Edit("boolean", *text.span(node), str(not node.value))
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        if not any(
            isinstance(side, (ast.JoinedStr, ast.Constant)) and _stringy(side) for side in (node.left, node.right)
        ):
            old, new = _ARITHMETIC[type(node.op)]
            if (where := _operator(text, node.left, node.right, old)) is not None:
                yield _Edit("arithmetic", *where, new)
    elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITHMETIC:
        old, new = _ARITHMETIC[type(node.op)]
        gap_start, gap_end = text.span(node.target)[1], text.span(node.value)[0]
        gap = text.text(gap_start, gap_end)
        at = gap.find(f"{old}=")
        if at >= 0 and not _stringy(node.value):
            start = gap_start + len(gap[:at].encode())
            yield _Edit("arithmetic", start, start + len(old) + 1, f"{new}=")
    elif isinstance(node, ast.Constant) and type(node.value) is int and id(node) not in slices:
        yield _Edit(
            "constant", *text.span(node), "1" if node.value == 0 else "0" if node.value == 1 else str(node.value + 1)
        )
    elif isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Slice):
            for bound, delta in ((node.slice.lower, 1), (node.slice.upper, -1)):
                if bound is not None:
                    yield _Edit("off_by_one", *text.span(bound), _plus_one(text, bound, delta))
        elif isinstance(node.slice, (ast.Name, ast.BinOp)) or _integer(node.slice):
            yield _Edit("off_by_one", *text.span(node.slice), _plus_one(text, node.slice, 1))
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == "range" and node.args and not node.keywords:
            stop = node.args[0] if len(node.args) == 1 else node.args[1]
            yield _Edit("off_by_one", *text.span(stop), _plus_one(text, stop, 1))
        positional = node.args[:2]
        if len(positional) == 2 and not any(isinstance(a, ast.Starred) for a in positional):
            first, second = (text.text(*text.span(a)) for a in positional)
            if first != second:
                start, end = text.span(positional[0])[0], text.span(positional[1])[1]
                middle = text.text(text.span(positional[0])[1], text.span(positional[1])[0])
                yield _Edit("swap_args", start, end, f"{second}{middle}{first}")


def _integer(node: ast.AST) -> bool:
    """An integer literal, negative ones included (`-1` is a minus applied to 1)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _stringy(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))


def _block_edits(block: list[ast.stmt], text: _Text) -> Iterator[_Edit]:
    """Statements removed from a block that keeps at least one other (never its docstring)."""
    real = [s for s in block if not _docstring(s)]
    if len(real) < 2:
        return
    for statement in real:
        lines = _whole_lines(text, statement)
        if lines is None:
            continue
        if isinstance(statement, _STATEMENTS) and not (
            isinstance(statement, ast.Expr) and not isinstance(statement.value, ast.Call)
        ):
            yield _Edit("remove_statement", *lines, "")
        elif isinstance(statement, ast.If) and not statement.orelse:
            yield _Edit("remove_branch", *lines, "")


def _early_returns(function: ast.FunctionDef | ast.AsyncFunctionDef, text: _Text) -> Iterator[_Edit]:
    """`return x` right after the first top-level assignment of x, when the function ends by returning x."""
    body = function.body
    last = body[-1] if body else None
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Name)) or len(body) < 3:
        return
    name = last.value.id
    for statement in body[:-2]:
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            lines = _whole_lines(text, statement)
            if lines is not None:
                indent = text.text(text.starts[statement.lineno - 1], text.span(statement)[0])
                yield _Edit("early_return", lines[1], lines[1], f"{indent}return {name}\n")
            return


_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def rewrite_mutation(path: str, source: str, function: str, reply: str) -> Mutation | str:
    """A model's rewrite of one function (its reply: the function in a ```python block) as a bug in the file, or why
    it cannot be one: no code, not the same function, a file that no longer parses, or no change to the program."""
    found = _CODE_BLOCK.search(reply)
    if found is None:
        return "no code block in the reply"
    try:
        tree = ast.parse(source)
        code = textwrap.dedent(found.group(1)).strip("\n") + "\n"
        rewritten = ast.parse(code)
    except SyntaxError:
        return "the rewrite does not parse"
    target = dict(functions(tree)).get(function)
    name = function.split(".")[-1]
    defs = [n for n in rewritten.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if target is None or len(defs) != 1:
        return f"the reply is not one function named {name}"
    lines = source.splitlines(keepends=True)
    indent = lines[target.lineno - 1][: target.col_offset]
    new_def = code.splitlines(keepends=True)[defs[0].lineno - 1 : defs[0].end_lineno]
    body = "".join(indent + line if line.strip() else line for line in new_def)
    mutated = "".join(lines[: target.lineno - 1]) + body + "".join(lines[target.end_lineno or target.lineno :])
    try:
        changed = ast.dump(ast.parse(mutated)) != ast.dump(tree)
    except SyntaxError:
        return "the file does not parse with the rewrite in it"
    if not changed:
        return "the rewrite changes nothing"
    first, removed, added = _changed_lines(source, mutated)
    return Mutation("model_rewrite", path, function, first, mutated, removed, added)
