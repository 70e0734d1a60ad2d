"""The configuration tables of README.md and docs/SERVING.md against `AppArgs`: every field they
name exists with the default they state, and docs/SERVING.md documents every field."""
from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import BaseModel

from deployments.config import AppArgs, ReplicaArgs
from support import REPO

MIB = 1024 * 1024
DOCS = {"README.md": "## Configuration", "docs/SERVING.md": "## Configuration (`AppArgs`"}


def table(doc: str) -> list[list[str]]:
    """The cells of the first table after the doc's configuration heading (header rows dropped)."""
    text = (REPO / doc).read_text(encoding="utf-8")
    lines = text[text.index(DOCS[doc]):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    assert rows, f"no configuration table in {doc}"
    return rows


def names(cell: str) -> list[str]:
    """Dotted field paths of a first cell; `a.b` / `c` means a.b and a.c."""
    out: list[str] = []
    for name in re.findall(r"`([a-z_][a-z0-9_.]*)`", cell):
        if "." not in name and out and "." in out[-1]:
            name = out[-1].rsplit(".", 1)[0] + "." + name
        out.append(name)
    return out


def lookup(path: str) -> tuple[bool, Any]:
    """(exists, default) of a dotted AppArgs field."""
    obj: Any = AppArgs()
    for part in path.split("."):
        if not isinstance(obj, BaseModel) or part not in type(obj).model_fields:
            return False, None
        obj = getattr(obj, part)
    return True, obj


def parse_default(text: str) -> Any:
    """A stated default as a value; `...` when it is prose (not checked)."""
    t = text.strip().strip("`")
    if t in ("null", "true", "false"):
        return {"null": None, "true": True, "false": False}[t]
    if t == "[]":
        return []
    if m := re.fullmatch(r"(\d+) MiB", t):
        return int(m[1]) * MIB
    if re.fullmatch(r"-?\d+(\.\d+)?", t):
        return float(t)
    if re.fullmatch(r"[\w*.-]+", t):
        return t
    return ...


@pytest.mark.parametrize("doc", list(DOCS))
def test_documented_fields_exist_with_their_defaults(doc):
    wrong = []
    for row in table(doc):
        fields = names(row[0])
        assert fields, f"{doc}: a row names no field: {row}"
        defaults = [parse_default(d) for d in row[1].split(" / ")] if row[1] else []
        if len(defaults) == 1:
            defaults *= len(fields)
        for i, path in enumerate(fields):
            exists, value = lookup(path)
            if not exists:
                wrong.append(f"{path}: not a field of AppArgs")
            elif isinstance(value, BaseModel) or len(defaults) != len(fields) or defaults[i] is ...:
                continue
            elif (value == defaults[i]) is not True:
                wrong.append(f"{path}: documented default {row[1]!r}, AppArgs has {value!r}")
    assert not wrong, f"{doc}:\n" + "\n".join(wrong)


def leaf_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel) and kind is not ReplicaArgs:
            out += leaf_fields(kind, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def test_serving_md_documents_every_field():
    rows = table("docs/SERVING.md")
    documented = {path for row in rows for path in names(row[0])}
    missing = [f for f in leaf_fields(AppArgs) if f not in documented]
    assert not missing, f"docs/SERVING.md's configuration table lacks {missing}"
    replica_row = next(row for row in rows if names(row[0])[:1] == ["dit"])  # the replica blocks' fields
    missing = [f for f in ReplicaArgs.model_fields if f"`{f}`" not in replica_row[2]]
    assert not missing, f"the replica blocks' row lacks {missing}"
