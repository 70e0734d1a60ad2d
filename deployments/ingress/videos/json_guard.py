"""JSON from a capped body with a bounded cost: structure counted before anything is built.

`json.loads` builds a Python object for every value: 60 MiB of `0.1,` is 15 M floats, ~1 GB;
60 MiB of `[],` is 20 M lists, more; and a body nested 200 000 deep ends in a RecursionError.
`load_bounded` first walks the body's structural tokens (`[ ] { } , :` and whole strings,
matched in C by one regex; numbers and literals are skipped) counting them and the nesting
depth, and refuses at the first token past either bound, so a hostile body costs at most
`max_tokens` steps and no allocation. Only a body within both is handed to `json.loads`, which
then builds at most `max_tokens + 1` values (a value is the first of its body, or follows a
`[`, `,` or `:`): memory of the order of the body plus ~60 bytes a token.

Strings are matched whole (possessive, no backtracking; escapes stepped over), so brackets in
a prompt count as nothing and an image of 10 MiB of base64 is one token.
"""
from __future__ import annotations

import json
import re
from typing import Any

from protocol.errors import ErrorCode, ProtocolError

# A whole JSON string, or one structural character.
TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{},:]')
OPEN = frozenset(b"[{")
CLOSE = frozenset(b"]}")


def load_bounded(body: bytes | bytearray, max_tokens: int, max_depth: int, why: str = "") -> Any:
    """`json.loads(body)` when the body holds at most `max_tokens` structural tokens and nests
    at most `max_depth` deep; else `ProtocolError`: `too_large` for the tokens (its message
    ends with `why`), `bad_message` for the depth or for text that is not JSON."""
    check_structure(body, max_tokens, max_depth, why)
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: unreachable past the depth check, kept as a net
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "the body must be one JSON object") from None


def check_structure(body: bytes | bytearray, max_tokens: int, max_depth: int, why: str = "") -> None:
    """Refuse at the first structural token past `max_tokens` or the first bracket past
    `max_depth` (see the module docstring); nothing is built."""
    depth = 0
    for n, m in enumerate(TOKEN.finditer(body), 1):
        if n > max_tokens:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"the body holds more than {max_tokens} JSON tokens "
                                                     f"(brackets, commas, colons, strings){why}")
        c = body[m.start()]
        if c in OPEN:
            depth += 1
            if depth > max_depth:
                raise ProtocolError(ErrorCode.BAD_MESSAGE, f"the body is nested deeper than {max_depth} levels "
                                                           "(a pose is 4 deep)")
        elif c in CLOSE:
            depth -= 1
