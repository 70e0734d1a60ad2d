"""The folder tree is the architecture: which package may import which, checked on the source.

Every `import` / `from ... import` statement of every module (function bodies included) is
read with `ast`; relative imports are not used in this project and are refused. What
`import protocol` and `import camera` load is checked in a fresh interpreter.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

PACKAGES = ("camera", "protocol", "media", "model", "deployments", "client", "web", "benchmarks")
# package -> first-party packages it may import (itself always)
ALLOWED = {
    "camera": set(),
    "protocol": {"camera"},
    "media": set(),
    "model": {"camera"},
    "deployments": {"camera", "protocol", "media", "model", "web"},
    "client": {"camera", "protocol", "media"},
    "web": set(),
    # serve_load drives the server as a client; capacity sizes budgets as the replicas do (deployments.replicas.memory)
    "benchmarks": {"camera", "protocol", "media", "model", "client", "deployments"},
}
HEAVY = ("torch", "ray", "av", "scipy")
# third-party modules a package must not import at all / at module level
# client/ with protocol/, camera/ and media/ is the client distribution (clients/python): none of them
# may need what it does not install (torch, ray, transformers, scipy: camera's is optional)
NEVER = {"camera": {"torch", "ray", "av"}, "protocol": set(HEAVY), "media": {"torch", "ray", "scipy"},
         "client": {"torch", "ray", "scipy", "transformers"}}
# PyAV is the client distribution's `video` extra: the client imports it only where it decodes
NOT_AT_MODULE_LEVEL = {"camera": {"scipy"}, "client": {"av"}}


def imports(tree: ast.Module) -> list[tuple[str, int, bool]]:
    """(top-level module name, line, at module level) of every import in `tree`."""
    top_level = {id(n) for n in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` / try blocks at module level count as module level
        if isinstance(node, (ast.If, ast.Try)):
            top_level |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], node.lineno, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import at line {node.lineno}"
            out.append((node.module.split(".")[0], node.lineno, id(node) in top_level))
    return out


def sources(package: str) -> list[Path]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no sources found for {package}/"
    return files


@pytest.mark.parametrize("package", PACKAGES)
def test_import_rules(package):
    allowed = ALLOWED[package] | {package}
    wrong = []
    for path in sources(package):
        for module, line, module_level in imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            where = f"{path.relative_to(REPO)}:{line} imports {module}"
            if module in PACKAGES and module not in allowed:
                wrong.append(where)
            if module in NEVER.get(package, ()):
                wrong.append(where)
            if module_level and module in NOT_AT_MODULE_LEVEL.get(package, ()):
                wrong.append(where + " at module level")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_nested_and_module_level_imports():
    tree = ast.parse("import torch\nif True:\n    from scipy import x\ndef f():\n    import av\n")
    assert imports(tree) == [("torch", 1, True), ("scipy", 3, True), ("av", 5, False)]


def loaded_by(statement: str) -> list[str]:
    code = f"import sys; {statement}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return eval(out.stdout.strip())


def test_protocol_and_camera_load_no_heavy_module():
    assert loaded_by("import protocol, protocol.codec, protocol.image, protocol.schema") == []
    assert loaded_by("import camera") == []
    assert loaded_by("import camera; camera.interpolate_poses(camera.check_poses([[[1.0, 0, 0, 0], [0, 1, 0, 0], "
                     "[0, 0, 1, 0], [0, 0, 0, 1]]] * 2), [0.5])") == ["scipy"]  # where it is needed


def test_the_app_imports_without_transformers_or_dynamo():
    """Serve's app build and every replica's start import `deployments.app`'s modules: what only a
    text encoder's constructor (transformers, 2-4 s) or a compile (dynamo, 1-3 s) needs waits until
    then (issue 35: ready sooner; the build took 13.4 s of a 76.8 s warm start on the H100)."""
    code = ("import sys, deployments.app; "
            "print(sorted(m for m in ('transformers', 'torch._dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert eval(out.stdout.strip().splitlines()[-1]) == []


# ---- the module graph: no circle between project files; the model's core never imports accel ----

GRAPH_PACKAGES = ("camera", "protocol", "media", "model", "deployments", "client", "benchmarks")
# model modules that model/accel's transforms are applied to from outside: they never import accel
CORE = ("model.dit", "model.vae", "model.config", "model.checkpoint", "model.conditioning", "model.session",
        "model.engines", "model.engine_api", "model.t5", "model.tiny")


def module_names() -> dict[str, Path]:
    names = {}
    for package in GRAPH_PACKAGES:
        for path in sources(package):
            parts = path.relative_to(REPO).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _resolved(name: str, known: dict[str, Path]) -> str | None:
    """The project module an imported name lives in (a module, or the package that defines it)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_imports(tree: ast.Module, known: dict[str, Path], everywhere: bool) -> set[str]:
    """The project modules `tree` imports: at module level (what runs when it is imported; not
    `if TYPE_CHECKING:`), or `everywhere` (function bodies too). `from package import module`
    imports that module (the package is loaded already, not a new arrow)."""
    if everywhere:
        nodes = list(ast.walk(tree))
    else:
        nodes = []
        for top in tree.body:
            if isinstance(top, ast.If) and _type_checking(top):
                continue
            nodes += list(ast.walk(top)) if isinstance(top, (ast.If, ast.Try)) else [top]
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {_resolved(a.name, known) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & known.keys()
            out |= submodules or {_resolved(node.module, known)}
    return out - {None}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def graph_of(names: dict[str, Path], everywhere: bool, within: str = "") -> dict[str, set[str]]:
    return {m: {d for d in module_imports(ast.parse(p.read_text(encoding="utf-8"), str(p)), names, everywhere)
                if d != m and d.startswith(within)}
            for m, p in names.items() if m.startswith(within)}


def test_no_import_circle_between_project_files():
    assert circles(graph_of(module_names(), everywhere=False)) == []


def test_no_import_circle_in_the_model_even_through_function_bodies():
    """A deferred import hides a circle from Python, not from a reader (the FP8 code cache once
    imported its Triton kernel, which imported the block, which imported the cache)."""
    assert circles(graph_of(module_names(), everywhere=True, within="model")) == []


def test_the_core_model_never_imports_accel():
    names = module_names()
    core = [m for m in names if any(m == c or m.startswith(c + ".") for c in CORE)]
    assert "model.dit.kv_codes" in core and "model.vae.fast" in core
    wrong = [f"{m} imports {d}" for m in core
             for d in module_imports(ast.parse(names[m].read_text(encoding="utf-8")), names, everywhere=True)
             if d == "model.accel" or d.startswith("model.accel.")]
    assert not wrong, "\n".join(wrong)


def test_no_project_folder_holds_more_than_20_modules():
    folders: dict[Path, int] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            folders[path.parent] = folders.get(path.parent, 0) + (path.name != "__init__.py")
    assert {str(f.relative_to(REPO)): n for f, n in folders.items() if n > 20} == {}


def test_the_circle_finder_sees_a_circle_and_the_import_reader_its_arrows():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    known = {"p": Path("p"), "p.x": Path("p/x.py"), "p.y": Path("p/y.py")}
    tree = ast.parse("from p import x\nfrom p.y import f\nif TYPE_CHECKING:\n    import p\n"
                     "def g():\n    import p.x\n")
    assert module_imports(tree, known, everywhere=False) == {"p.x", "p.y"}
    assert module_imports(tree, known, everywhere=True) == {"p", "p.x", "p.y"}


# ---- deployments/ in floors: an import goes down or stays on its floor, never up ----

# module (or package: every module under it) -> floor; the longest matching name decides
FLOORS = {
    # 0: what the replicas and the ingress share, and the replicas
    "deployments": 0, "deployments.replicas": 0,
    # the world store (issue 55): a leaf of floor 0 (the replicas may keep compile artifacts in it);
    # only its bridge to the ingress's journal stands on the journal's floor
    "deployments.worlds": 0, "deployments.worlds.journal_parts": 1,
    # 1: the ingress's leaves: guards, the socket, the journal, the parking, small helpers
    "deployments.proxy_guard": 1, "deployments.ingress": 1,
    # 2: a session as a connection holds it, and the calls it makes on the lanes
    **{f"deployments.ingress.{m}": 2 for m in ("stream", "lanes", "lane_jobs", "outbox", "controls", "replies",
                                              "releases", "line.seat", "sharing.owner", "sharing.fork_source")},
    # 3: the parts that keep their own per-session records: recovery and branching, prefix reuse,
    # driving, resume
    **{f"deployments.ingress.{m}": 3 for m in ("history", "prefix", "drive", "resume", "resuming", "sharing.fork")},
    # the sessions kept in the world store (issue 55): a session's world, written behind it; revived by a resume
    "deployments.ingress.worlds": 3,
    # 4: what composes them: the connection, the peers' and the videos' modes, the server
    **{f"deployments.ingress.{m}": 4 for m in ("connection", "peers", "videos", "signposts", "server")},
    "deployments.app": 5,
}


def floor_of(module: str) -> int:
    name = module
    while name not in FLOORS:
        name = name.rpartition(".")[0]
    return FLOORS[name]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} (floor {floor_of(m)}) imports {d} (floor {floor_of(d)})"
                  for m, deps in graph.items() for d in deps if floor_of(d) > floor_of(m))


def test_no_import_in_deployments_runs_up_a_floor():
    """Function bodies included: a deferred import is an arrow for a reader too (issue 45:
    stream.py imported history/journal and prefix/keys, lane_jobs.py history/recovery)."""
    graph = graph_of(module_names(), everywhere=True, within="deployments")
    assert upward_imports(graph) == []
    assert floor_of("deployments.ingress.stream") == 2 and floor_of("deployments.ingress.history.journal") == 3
    assert floor_of("deployments.ingress.journal") == 1 and floor_of("deployments.ingress.prefix.keys") == 3


def test_no_import_circle_in_deployments_even_through_function_bodies():
    assert circles(graph_of(module_names(), everywhere=True, within="deployments")) == []


def test_the_floor_checker_sees_an_arrow_up():
    assert upward_imports({"deployments.ingress.stream": {"deployments.ingress.prefix.keys"},
                           "deployments.ingress.lane_jobs": {"deployments.ingress.lanes"}}) == [
        "deployments.ingress.stream (floor 2) imports deployments.ingress.prefix.keys (floor 3)"]
