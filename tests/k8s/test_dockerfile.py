"""k8s/Dockerfile and .dockerignore: a Ray 2.60 base image, and the package installed from a
build context that holds everything `pip install .` needs."""
from __future__ import annotations

import fnmatch
import re
import tomllib

import ray

from support import REPO

BASE_IMAGE = re.compile(
    r"rayproject/ray:(?P<ray>\d+\.\d+\.\d+)(?:-py(?P<py>3\d+))?(?P<platform>-cu\d+|-gpu|-cpu)?"
)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of k8s/Dockerfile, continuation lines joined, comments dropped."""
    text = (REPO / "k8s" / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [p.strip().lstrip("/") for p in lines if p.strip() and not p.startswith("#")]
    # The matcher below knows plain names, globs and a leading **/; nothing else is used.
    assert not any(p.startswith("!") for p in patterns), "exceptions are not supported here"
    return patterns


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` (relative to the context) out of the build context."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts):
                return True
        elif any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            return True
    return False


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_base_image_is_ray_2_60_with_cuda(rayservice):
    froms = [args for word, args in instructions() if word == "FROM"]
    assert len(froms) == 1, froms
    match = BASE_IMAGE.fullmatch(froms[0])
    assert match, f"not a rayproject/ray image: {froms[0]}"
    assert match["ray"].split(".")[:2] == ray.__version__.split(".")[:2] == ["2", "60"]
    assert match["platform"] in ("-gpu",) or str(match["platform"]).startswith("-cu"), "a CUDA image"
    assert rayservice["spec"]["rayClusterConfig"]["rayVersion"] == match["ray"]
    required = pyproject()["project"]["requires-python"]
    minimum = re.fullmatch(r">=\s*3\.(\d+)", required)
    assert minimum and match["py"] and int(match["py"][1:]) >= int(minimum[1])


def test_image_installs_the_package_after_copying_it():
    steps = instructions()
    copies = [
        i for i, (word, args) in enumerate(steps)
        if word == "COPY" and re.search(r"(^|\s)\.\s", args)
    ]
    assert copies, "the build context (.) must be copied into the image"
    installs = [
        i for i, (word, args) in enumerate(steps)
        if word == "RUN" and re.search(r"pip install [^&]*\s(\.|\"\.\[\$\{EXTRAS\}\]\")(\s|$)", args)
    ]
    assert installs and installs[-1] > copies[0], "pip install . (or .[${EXTRAS}]) must follow the COPY"
    args = dict(a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a)
    extras = pyproject()["project"]["optional-dependencies"]
    assert args["EXTRAS"] == "gpu,s3", \
        "the image takes the gpu extra (model.fp8_attention's frontend) and s3 (the world store's obstore) by default"
    assert any(d.startswith("obstore") for d in extras["s3"])
    s3_check = [a for word, a in steps if word == "RUN" and 'import obstore"' in a]
    assert s3_check and "*,s3,*" in s3_check[0], "an s3 build checks that the S3 client imports"
    assert "fa4" in extras and any(d.startswith("flash-attn-4[cu13]") for d in extras["fa4"]), \
        "EXTRAS=gpu,fa4 (model.attention: fa4) installs FA4 with its CUDA 13 libraries"
    fa4_check = [a for word, a in steps if word == "RUN" and "import flash_attn.cute" in a]
    assert fa4_check and "*,fa4,*" in fa4_check[0], "an fa4 build checks that the kernels import"
    assert any(d.startswith("fa3-fwd==") and "x86_64" in d for d in extras["fa3"]), \
        "EXTRAS=gpu,fa3 (model.attention: fa3 / auto) installs FlashAttention-3's forward kernels"
    fa3_check = [a for word, a in steps if word == "RUN" and "import torch, fa3_fwd_interface" in a]
    assert fa3_check and "*,fa3,*" in fa3_check[0], "an fa3 build checks that the kernels import"
    torch = [i for i, (word, args) in enumerate(steps) if word == "RUN" and "torch" in args]
    assert torch and torch[0] < installs[-1], "torch (CUDA build) goes in before the package"


def test_build_context_holds_what_pip_install_needs():
    patterns = dockerignore_patterns()
    project = pyproject()
    needed = ["pyproject.toml", project["project"]["readme"]]
    includes = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = [
        p.name for p in REPO.iterdir()
        if p.is_dir() and (p / "__init__.py").is_file()
        and any(fnmatch.fnmatchcase(p.name, inc) for inc in includes)
    ]
    assert {"deployments", "model", "protocol"} <= set(packages)
    for path in needed + packages + ["deployments/app.py", "deployments/config.py"]:
        assert (REPO / path).exists(), f"{path} is missing"
        assert not ignored(path, patterns), f".dockerignore leaves {path} out"
    for heavy in (".git", ".venv", "tests", "model/__pycache__/x.pyc"):
        assert ignored(heavy, patterns), f".dockerignore should leave {heavy} out"
