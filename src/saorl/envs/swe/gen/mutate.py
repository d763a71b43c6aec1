"""Bug injection by AST mutation, applied as a minimal edit of the source text.

    sites = mutation_sites(source)            # deterministic order for a given source
    bug = mutate(source, sites[i])            # Mutation(kind, function, line, ...) or None

Kinds (each a single point in a function body; module-level code is never touched):
- `operator`: `+ <-> -`, `* -> +`, `// -> /`, `/ -> //`, `% -> //`, `** -> *`, `+= <-> -=`;
- `comparison`: `< <-> <=`, `> <-> >=`, `== <-> !=`, `in <-> not in`, `is <-> is not`, `< <-> >`;
- `boolean`: `and <-> or`;
- `off_by_one`: an integer literal n becomes n + 1 or n - 1;
- `wrong_branch`: an `if`/`while` condition negated, or a `not` dropped;
- `removed_line`: an assignment, call, `return` or `raise` statement deleted (`pass` if it was
  the only statement of its block).

The mutation is made on the AST (so it is exactly one of the above), then written back by
replacing only the source span of the mutated node with `ast.unparse` of it (comments and
formatting elsewhere survive, and the gold fix is a one-line diff). The edit is accepted only if
the new text parses back to the mutated AST; a span that needs parentheses gets them.
"""

from __future__ import annotations

import ast
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

# CPython 3.11's AST constructors keep a recursion-depth counter that is not thread-safe: two
# threads parsing at once can fail with "SystemError: AST constructor recursion depth
# mismatch" (seen here when the generator validated tasks on 2 threads). Every AST use of the
# generator goes through this lock; the slow part (running tests in the sandbox) does not.
AST_LOCK = threading.Lock()
_F = TypeVar("_F", bound=Callable[..., Any])


def _ast_locked(fn: _F) -> _F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with AST_LOCK:
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


_BINOP: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.FloorDiv: ast.Div,
    ast.Div: ast.FloorDiv,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
_CMP: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.Gt),
    ast.LtE: (ast.Lt,),
    ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt,),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
}
_BOOL: dict[type, type] = {ast.And: ast.Or, ast.Or: ast.And}
_AUG: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add}
_REMOVABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.Raise)


@dataclass(frozen=True)
class Site:
    """One mutation: `index` of the node in `_nodes(tree)` order, and what to do to it."""

    index: int
    kind: str
    change: str  # e.g. "Lt->LtE", "+1", "negate", "drop_not", "remove"


@dataclass(frozen=True)
class Mutation:
    kind: str
    function: str  # qualified name of the function holding the bug (Class.method)
    line: int  # 1-based line of the edit in the mutated source
    before: str  # the source span before ...
    after: str  # ... and after the mutation
    source: str  # the whole mutated module


def _functions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    out: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return out


def _nodes(tree: ast.Module) -> list[tuple[str, ast.AST, ast.AST, str, int | None]]:
    """(function, node, parent, field, index in field) of every node in a function body."""
    out = []
    for qualname, fn in _functions(tree):
        stack: list[tuple[ast.AST, ast.AST, str, int | None]] = []
        for stmt_i, stmt in enumerate(fn.body):  # type: ignore[attr-defined]
            stack.append((stmt, fn, "body", stmt_i))
        while stack:
            node, parent, fld, idx = stack.pop(0)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue  # nested definitions are visited as functions of their own
            out.append((qualname, node, parent, fld, idx))
            for name, value in ast.iter_fields(node):
                if isinstance(value, list):
                    stack += [
                        (v, node, name, i) for i, v in enumerate(value) if isinstance(v, ast.AST)
                    ]
                elif isinstance(value, ast.AST):
                    stack.append((value, node, name, None))
    return out


def _is_docstring(node: ast.AST, parent: ast.AST, idx: int | None) -> bool:
    return (
        idx == 0
        and isinstance(parent, ast.FunctionDef)
        and isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


@_ast_locked
def mutation_sites(source: str) -> list[Site]:
    """Every mutation this module supports on `source`, in a deterministic order."""
    sites: list[Site] = []
    for i, (_, node, parent, fld, idx) in enumerate(_nodes(ast.parse(source))):
        if (isinstance(node, ast.BinOp) and type(node.op) in _BINOP) or (
            isinstance(node, ast.AugAssign) and type(node.op) in _AUG
        ):
            sites.append(Site(i, "operator", type(node.op).__name__))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
            for new in _CMP[type(node.ops[0])]:
                sites.append(Site(i, "comparison", new.__name__))
        elif isinstance(node, ast.BoolOp):
            sites.append(Site(i, "boolean", type(node.op).__name__))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites += [Site(i, "off_by_one", "+1"), Site(i, "off_by_one", "-1")]
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            sites.append(Site(i, "wrong_branch", "drop_not"))
        if isinstance(node, ast.If | ast.While) and not isinstance(
            node.test, ast.Constant | ast.UnaryOp
        ):
            sites.append(Site(i, "wrong_branch", "negate"))
        removable = isinstance(node, _REMOVABLE) and fld in ("body", "orelse")
        if removable and idx is not None and not _is_docstring(node, parent, idx):
            sites.append(Site(i, "removed_line", "remove"))
    return sites


def _offset(lines: list[str], line: int, col: int) -> int:
    """Character offset of (1-based line, UTF-8 byte column) in the joined source."""
    start = sum(len(x) for x in lines[: line - 1])
    return start + len(lines[line - 1].encode()[:col].decode())


def _span(lines: list[str], node: ast.AST) -> tuple[int, int]:
    return (
        _offset(lines, node.lineno, node.col_offset),  # type: ignore[attr-defined]
        _offset(lines, node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
    )


@_ast_locked
def mutate(source: str, site: Site) -> Mutation | None:
    """Apply `site` to `source`; None when the edit cannot be written back faithfully."""
    tree = ast.parse(source)
    qualname, node, parent, fld, idx = _nodes(tree)[site.index]
    lines = source.splitlines(keepends=True)
    target: ast.AST = node
    if site.kind == "removed_line":
        return _remove(source, lines, tree, qualname, node, parent, fld, idx)
    if site.kind == "operator" and isinstance(node, ast.BinOp):
        node.op = _BINOP[type(node.op)]()
    elif site.kind == "operator" and isinstance(node, ast.AugAssign):
        node.op = _AUG[type(node.op)]()
    elif site.kind == "comparison" and isinstance(node, ast.Compare):
        node.ops = [getattr(ast, site.change)()]
    elif site.kind == "boolean" and isinstance(node, ast.BoolOp):
        node.op = _BOOL[type(node.op)]()
    elif site.kind == "off_by_one" and isinstance(node, ast.Constant):
        node.value += 1 if site.change == "+1" else -1
    elif site.change == "negate" and isinstance(node, ast.If | ast.While):
        test = node.test
        node.test = ast.UnaryOp(ast.Not(), test)
        return _rewrite(source, lines, tree, qualname, site.kind, test, node.test)
    elif site.change == "drop_not" and isinstance(node, ast.UnaryOp):
        _set_child(parent, fld, idx, node.operand)
        return _rewrite(source, lines, tree, qualname, site.kind, node, node.operand)
    else:
        return None
    return _rewrite(source, lines, tree, qualname, site.kind, target, target)


def _set_child(parent: ast.AST, fld: str, idx: int | None, value: ast.AST) -> None:
    if idx is None:
        setattr(parent, fld, value)
    else:
        getattr(parent, fld)[idx] = value


def _rewrite(
    source: str,
    lines: list[str],
    tree: ast.Module,
    qualname: str,
    kind: str,
    old: ast.AST,
    new: ast.AST,
) -> Mutation | None:
    """Replace `old`'s span with `ast.unparse(new)`; keep it if it parses back to `tree`."""
    start, end = _span(lines, old)
    expected = ast.dump(tree)
    text = ast.unparse(new)
    for candidate in (text, f"({text})"):
        out = source[:start] + candidate + source[end:]
        try:
            if ast.dump(ast.parse(out)) == expected:
                line = source.count("\n", 0, start) + 1
                return Mutation(kind, qualname, line, source[start:end], candidate, out)
        except SyntaxError:
            continue
    return None


def _remove(
    source: str,
    lines: list[str],
    tree: ast.Module,
    qualname: str,
    node: ast.AST,
    parent: ast.AST,
    fld: str,
    idx: int | None,
) -> Mutation | None:
    first = node.lineno  # type: ignore[attr-defined]
    last = node.end_lineno
    assert idx is not None and last is not None
    end = _span(lines, node)[1]
    head = lines[first - 1][: node.col_offset]  # type: ignore[attr-defined]
    line_start = sum(len(x) for x in lines[: first - 1])
    line_end = sum(len(x) for x in lines[:last])
    if head.strip() or source[end:line_end].strip():
        return None  # shares its line with other code: not a whole-line removal
    body = getattr(parent, fld)
    if len(body) == 1:
        body[0] = ast.Pass()
        text = head + "pass\n"
    else:
        del body[idx]
        text = ""
    out = source[:line_start] + text + source[line_end:]
    try:
        if ast.dump(ast.parse(out)) != ast.dump(tree):
            return None
    except SyntaxError:
        return None
    return Mutation("removed_line", qualname, first, source[line_start:line_end], text, out)
