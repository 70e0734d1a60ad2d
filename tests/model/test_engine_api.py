"""The DiT engine's interface (model/engine_api.py): every engine implements all of it and says
what it supports in `capabilities`; callers never probe with `hasattr`."""
from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

from model.engine_api import DiTEngineProtocol, EngineCapabilities
from model.engines import DiTEngine
from model.parallel import SPDiTEngine
from support import REPO


PROTOCOL = {n for n in vars(DiTEngineProtocol) if not n.startswith("_")} | set(
    DiTEngineProtocol.__annotations__)


def missing(cls: type) -> list[str]:
    """Protocol members `cls` lacks, or whose parameters differ from the protocol's."""
    out = []
    for name in sorted(PROTOCOL):
        if not hasattr(cls, name):  # an instance attribute: annotated on the class
            if not any(name in vars(k).get("__annotations__", {}) for k in cls.__mro__):
                out.append(name)
            continue
        want, got = getattr(DiTEngineProtocol, name, None), getattr(cls, name)
        if inspect.isfunction(want) and list(inspect.signature(want).parameters) != list(
                inspect.signature(got).parameters):
            out.append(f"{name}{inspect.signature(got)} != {name}{inspect.signature(want)}")
    return out


def test_the_protocol_names_what_a_server_calls():
    assert {"capabilities", "cfg", "dit", "open", "restore", "clone", "step", "finish_chunk", "update_prompt", "close",
            "footprint", "kv_frames", "session_cfg", "session_bytes"} <= PROTOCOL


@pytest.mark.parametrize("engine", [DiTEngine, SPDiTEngine])
def test_the_model_engines_implement_it_with_every_capability(engine):
    assert missing(engine) == []
    assert engine.capabilities == EngineCapabilities(restore=True, update_prompt=True, deferred_update=True,
                                                     clone=True)


def test_capabilities_are_a_frozen_value():
    caps = EngineCapabilities(update_prompt=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.update_prompt = True  # type: ignore[misc]
    assert caps != EngineCapabilities()


def test_the_sequence_parallel_replica_declares_the_protocol_and_its_capabilities():
    """SPReplicaEngine (deployments/replicas/sp_dit.py, read on the source: importing it needs Ray) derives
    from the protocol, defines every method of it, and declares no prompt steering, no
    deferred update and no clone (its sessions' shards live on every rank)."""
    tree = ast.parse((REPO / "deployments" / "replicas" / "sp_dit.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SPReplicaEngine")
    assert [ast.unparse(b) for b in cls.bases] == ["DiTEngineProtocol"]
    defined = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    methods = {n for n in PROTOCOL if inspect.isfunction(getattr(DiTEngineProtocol, n, None))
               or isinstance(getattr(DiTEngineProtocol, n, None), property)}
    assert methods <= defined, methods - defined
    caps = next(n.value for n in cls.body if isinstance(n, ast.Assign)
                and [ast.unparse(t) for t in n.targets] == ["capabilities"])
    assert ast.unparse(caps) == ("EngineCapabilities(restore=True, update_prompt=False, deferred_update=False, "
                                  "preempt=False, clone=False)")


def test_no_caller_probes_an_engine_with_hasattr():
    wrong = []
    for folder in ("deployments", "model"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and ast.unparse(node.func) == "hasattr"
                        and "engine" in ast.unparse(node.args[0])):
                    wrong.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)
