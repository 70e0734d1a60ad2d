"""docs/PROTOCOL.md, the wire contract, names everything docs/protocol.schema.json and the code define;
no source cites the contract outside the repository."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from protocol.errors import ErrorCode
from protocol.messages import REQUEST_TYPES

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "PROTOCOL.md").read_text()
SCHEMA = json.loads((ROOT / "docs" / "protocol.schema.json").read_text())
MESSAGES = [d for name, d in SCHEMA["$defs"].items() if "properties" in d]


def named(word: str) -> bool:
    return f"`{word}`" in DOC or f'"{word}"' in DOC


def test_every_field_of_every_message_in_the_schema_is_named():
    missing = sorted({f"{d['title']}.{field}" for d in MESSAGES for field in d["properties"] if not named(field)})
    assert missing == []


def test_every_endpoint_and_reply_type_is_named():
    tags = [d["properties"][tag]["const"] for d in MESSAGES for tag in ("endpoint", "type") if tag in d["properties"]]
    assert sorted(tags) == sorted([*REQUEST_TYPES, "config", "frame", "reset_ok", "resumed", "forked", "rewound",
                                   "paused", "saved", "opened", "reopened", "error", "shared", "unshared", "watch",
                                   "watching", "world", "players"])
    assert [t for t in tags if not named(t)] == []


def test_every_error_code_has_a_row_in_the_error_table():
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", DOC, flags=re.M))
    assert {c.value for c in ErrorCode} <= rows
    assert set(SCHEMA["$defs"]["ErrorCode"]["enum"]) == {c.value for c in ErrorCode}


NOT_YET_CHECKED = {"tests/test_protocol_doc.py"}  # this file names what it looks for


def test_no_tracked_file_cites_the_contract_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.js", "*.html", "*.sh", "*.yaml", "*.toml"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    citing = [f for f in files if f not in NOT_YET_CHECKED
              and "shared/docs/PROTOCOL.md" in (ROOT / f).read_text(errors="replace")]
    assert citing == []


def test_no_source_file_cites_the_shared_docs():
    """Source (code, scripts, configs) cites the repository's docs, never ../shared/docs (a
    folder beside the checkout that users of the project do not have)."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.js", "*.html", "*.sh", "*.yaml", "*.toml"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    citing = [f for f in files if f != "tests/test_protocol_doc.py"
              and "shared/docs" in (ROOT / f).read_text(errors="replace")]
    assert citing == []
