"""JSON Schema of the wire messages, for documentation.

`python -m protocol.schema [PATH]` writes it to docs/protocol.schema.json (or PATH). The wire
itself is msgpack: `binary` strings are msgpack bin, arrays may be msgpack-numpy maps.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic.json_schema import models_json_schema

from protocol.messages import (AckRequest, CameraServerConfig, ControlRequest, DriveRequest, ErrorReply, Forked,
                               ForkRequest, FrameReply, InferRequest, Opened, OpenRequest, Paused, ResetOk, ResetRequest,
                               Reopened, ReopenRequest, ResumeOk, ResumeRequest, Rewound, RewindRequest, Saved,
                               SaveRequest, ShareRequest, UnshareRequest)
from protocol.messages import (AskControlsRequest, GrantRequest, KickRequest, PassControlsRequest, PromptRequest,
                               RevokeRequest)
from protocol.sharing import Players, Shared, Unshared, WatchRequest, Watching, WorldNotice

REQUESTS = (InferRequest, ResetRequest, ResumeRequest, ForkRequest, RewindRequest, ControlRequest, DriveRequest,
            AckRequest, ShareRequest, UnshareRequest, SaveRequest, OpenRequest, WatchRequest, ReopenRequest,
            AskControlsRequest, PassControlsRequest, GrantRequest, RevokeRequest, KickRequest, PromptRequest)
REPLIES = (CameraServerConfig, FrameReply, ResetOk, ResumeOk, Forked, Rewound, Paused, Saved, Opened, ErrorReply,
           Shared, Unshared, Watching, WorldNotice, Players, Reopened)
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "docs" / "protocol.schema.json"
DESCRIPTION = ("Messages of /v1/realtime/world/camera (see PROTOCOL.md). Each WebSocket binary frame is one "
               "msgpack map; `binary` strings are msgpack bin; arrays may also be msgpack-numpy or openpi "
               "`__ndarray__` maps; fields that are null are left out of replies.")


def json_schema() -> dict:
    """One schema: `anyOf` client->server requests (validation) and server->client replies."""
    _, top = models_json_schema([(m, "validation") for m in REQUESTS] + [(m, "serialization") for m in REPLIES],
                                ref_template="#/$defs/{model}")

    defs = top["$defs"]
    # The tag is always on the wire (defaults make pydantic call it optional), except for
    # infer, whose `endpoint` vllm-omni clients leave out.
    for model, tag in [*((m, "endpoint") for m in REQUESTS[1:]), *((m, "type") for m in REPLIES)]:
        schema = defs[model.__name__]
        schema["required"] = [tag, *(f for f in schema.get("required", []) if f != tag)]

    def refs(models: tuple) -> list[dict]:
        return [{"$ref": f"#/$defs/{m.__name__}"} for m in models]

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "lingbot-world-serve realtime camera protocol, version 1",
        "description": DESCRIPTION,
        "anyOf": [{"title": "client to server", "anyOf": refs(REQUESTS)},
                  {"title": "server to client", "anyOf": refs(REPLIES)}],
        "$defs": defs,
    }


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
