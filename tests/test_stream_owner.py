"""One owner for each piece of a session's state (issue 45): `Stream` keeps its identity, its
options, its lifecycle, `next_chunk` and its journal; every other part keeps its own record.
Checked on the source with `ast`, as tests/test_imports.py holds the layering:

* `Stream` (deployments/ingress/stream.py) has at most `MAX_FIELDS` fields;
* no module but stream.py assigns one of them (`<stream>.<field> = ...`, augmented and
  tuple targets included) on an expression that is a Stream: a name annotated `Stream` (a
  parameter, a variable), bound from `Stream(...)` / `Stream.<constructor>(...)`, a loop
  variable over such values, or by convention a name (or attribute) called `stream`, `_stream`,
  `source`, `parked`, `cur` or `current`. Stream's methods (its transitions) do the writing.
"""
from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

STREAM = REPO / "deployments" / "ingress" / "stream.py"
MAX_FIELDS = 12
SCANNED = ("deployments", "benchmarks")
STREAM_NAMES = {"stream", "_stream", "source", "parked", "cur", "current"}  # what the code calls a Stream


def stream_fields(tree: ast.Module) -> list[str]:
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Stream")
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def _is_stream_type(annotation: ast.AST | None) -> bool:
    """`Stream`, `Optional[Stream]`, `"Stream"`, `Stream | None` (not StreamState and the like)."""
    if annotation is None:
        return False
    text = ast.unparse(annotation).replace('"', "").replace("'", "")
    return any(part == "Stream" for part in text.replace("[", " ").replace("]", " ").replace("|", " ")
               .replace(",", " ").split())


def _makes_stream(value: ast.AST | None) -> bool:
    """`Stream(...)` or `Stream.<classmethod>(...)`."""
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    return (isinstance(f, ast.Name) and f.id == "Stream") or (
        isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "Stream")


def _stream_names(fn: ast.AST) -> set[str]:
    """The names that hold a Stream in `fn` (a function, or the module)."""
    names: set[str] = set()
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = fn.args
        names |= {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs] if _is_stream_type(p.annotation)}
    for node in ast.walk(fn):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _is_stream_type(node.annotation):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign) and _makes_stream(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.NamedExpr) and _makes_stream(node.value):
            names.add(node.target.id)
    return names


def _holds_stream(expr: ast.AST, names: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in names or expr.id in STREAM_NAMES
    if isinstance(expr, ast.Attribute):  # self._stream, self._driver.stream, ...
        return expr.attr in STREAM_NAMES
    return False


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        out = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        out = [node.target]
    else:
        return []
    flat = []
    while out:
        t = out.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            out += t.elts
        elif isinstance(t, ast.Starred):
            out.append(t.value)
        else:
            flat.append(t)
    return flat


def assignments(tree: ast.Module, fields: set[str]) -> list[tuple[int, str]]:
    """(line, source) of every assignment of a Stream field on a Stream in `tree`."""
    found = []
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    for scope in scopes:
        names = _stream_names(scope) if scope is not tree else set()
        for node in ast.walk(scope):
            if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(node.target, ast.Name):
                if _holds_stream(node.iter, names) or "stream" in ast.unparse(node.iter).lower():
                    names.add(node.target.id)
            for t in _targets(node):
                if isinstance(t, ast.Attribute) and t.attr in fields and _holds_stream(t.value, names):
                    found.append((node.lineno, ast.unparse(t)))
    return sorted(set(found))


def _sources() -> list[Path]:
    return [p for package in SCANNED for p in sorted((REPO / package).rglob("*.py")) if p != STREAM]


def test_stream_has_at_most_12_fields():
    fields = stream_fields(ast.parse(STREAM.read_text(encoding="utf-8")))
    assert "journal" in fields and "spec" in fields and "next_chunk" in fields
    assert len(fields) <= MAX_FIELDS, f"Stream has {len(fields)} fields (at most {MAX_FIELDS}): {fields}"


def test_no_module_but_stream_py_assigns_a_stream_field():
    fields = set(stream_fields(ast.parse(STREAM.read_text(encoding="utf-8"))))
    wrong = [f"{path.relative_to(REPO)}:{line}: {target}"
             for path in _sources()
             for line, target in assignments(ast.parse(path.read_text(encoding="utf-8"), str(path)), fields)]
    assert not wrong, "Stream's fields are assigned by stream.py only (its methods):\n" + "\n".join(wrong)


def test_the_checker_sees_what_it_must_and_nothing_else():
    fields = {"next_chunk", "prompt", "dit_key", "state", "journal"}
    code = '''
def f(s: Stream, other: Optional["Stream"], entry):
    s.next_chunk = 1
    other.prompt += "x"
    a, s.dit_key = 1, "k"
    entry.state = 2            # not a Stream
    s.journal.decoded += 1     # the journal's own field
    made = Stream(spec, j, image)
    made.state = 3
    for held in self._streams:
        held.prompt = "p"
def g(self):
    self._stream.next_chunk = 0
    stream.dit_key = "x"
    self.state = 1             # not a Stream
    rec.prompt = "q"           # not a Stream
'''
    lines = [line for line, _ in assignments(ast.parse(code), fields)]
    assert lines == [3, 4, 5, 9, 11, 13, 14]
