"""The test tiers: tests/conftest.py marks a test by the fixtures it uses (and its folder or module),
so `bash scripts/test.sh --fast` leaves out whatever starts Ray, a browser or needs a GPU."""
from __future__ import annotations

import tomllib

import pytest

from support import REPO

CONFTEST = REPO / "tests" / "conftest.py"


class FakeItem:
    def __init__(self, path: str, fixtures: tuple[str, ...] = ()) -> None:
        path, _, self.name = path.partition("::")
        self.originalname = self.name or "test_x"
        self.path = REPO / path
        self.fixturenames = list(fixtures)
        self.marks: list[str] = []

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark.name)


def root_conftest():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tests_root_conftest", CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def marked(*items: FakeItem) -> list[list[str]]:
    root_conftest().pytest_collection_modifyitems(None, list(items))
    return [sorted(i.marks) for i in items]


def test_tests_are_marked_by_the_fixtures_they_use():
    assert marked(
        FakeItem("tests/deployments/test_app.py", ("connect", "server", "ray_port")),  # the app fixtures' closure
        FakeItem("tests/client/test_streaming.py", ("served",)),
        FakeItem("tests/client/test_web.py", ("browser", "served")),
        FakeItem("tests/deployments/test_multinode.py", ("cluster", "traj")),
        FakeItem("tests/deployments/test_sp_dit.py", ("serve_instance",)),
        FakeItem("tests/gpu/test_kernels.py"),
        FakeItem("tests/model/test_ulysses.py", ("tmp_path",)),
        FakeItem("tests/model/test_vae.py::test_decode_matches_golden"),
        FakeItem("tests/media/test_fmp4.py::test_plays_in_a_browser_through_media_source_extensions"),
        FakeItem("tests/deployments/test_prompt_steering.py", ("tmp_path",)),  # model/'s namesake is slow
        FakeItem("tests/deployments/test_lanes.py", ("tmp_path",)),
        FakeItem("tests/protocol/test_codec.py"),
    ) == [["ray"], ["ray"], ["browser", "ray"], ["ray"], ["ray"], ["gpu"], ["slow"], ["slow"], ["browser"], [], [], []]


def test_the_slow_lists_name_tests_that_exist():
    """A renamed test would silently join the fast tier again."""
    conftest = root_conftest()
    for module in conftest.SLOW_MODULES:
        assert (REPO / "tests" / module).is_file(), module
    for test in conftest.SLOW_TESTS | conftest.BROWSER_TESTS:
        module, name = test.split("::")
        assert f"def {name}(" in (REPO / "tests" / module).read_text(), test


def test_the_markers_are_registered_and_the_fast_tier_deselects_them():
    pytest_ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    names = {m.split(":")[0] for m in pytest_ini["markers"]}
    assert names == {"ray", "browser", "gpu", "slow"}
    script = (REPO / "scripts" / "test.sh").read_text()
    assert '-m "not ray and not browser and not gpu and not slow"' in script
