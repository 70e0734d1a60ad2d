"""World store benchmarks (issue 55): the store itself, opening a world against replaying it, the restart drill."""
