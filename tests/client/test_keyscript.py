"""Key scripts (`lwf-client drive w:3,j:2,none:1`, --branch-keys): parsing and its typed errors."""
from __future__ import annotations

import pytest

from client.cli import main
from client.keyscript import KeyState, chunk_keys, parse_keyscript


def test_a_script_gives_the_keys_held_per_chunk():
    states = parse_keyscript("w:3, J+w:2,none:1,:1,ArrowUp+d:1")
    assert states == [KeyState(("w",), 3), KeyState(("w", "j"), 2), KeyState((), 1), KeyState((), 1),
                      KeyState(("d", "arrowup"), 1)]  # canonical order (camera/keys.py), lower case
    assert chunk_keys(states) == [("w",)] * 3 + [("w", "j")] * 2 + [()] * 2 + [("d", "arrowup")]


@pytest.mark.parametrize("script, says", [
    ("", "empty"),
    ("w", "entry 1 ('w'): expected KEYS:CHUNKS"),
    ("w:2,x:1", "entry 2 ('x:1'): unknown key(s) x"),
    ("w:0", "CHUNKS >= 1"),
    ("w:-1", "CHUNKS >= 1"),
    ("w:two", "CHUNKS >= 1"),
])
def test_bad_scripts_are_refused_saying_where(script, says):
    with pytest.raises(ValueError, match="key script") as e:
        parse_keyscript(script)
    assert says in str(e.value)


def test_the_cli_refuses_a_bad_script_before_connecting(capsys):
    with pytest.raises(SystemExit) as e:  # argparse's usage error: exit 2, nothing sent
        main(["drive", "w:2,q+zz:1", "--url", "ws://127.0.0.1:9"])
    assert e.value.code == 2
    assert "unknown key(s) zz" in capsys.readouterr().err


def test_branch_options_need_a_branch_point_and_a_range(tmp_path, capsys):
    url = "ws://127.0.0.1:9"  # nothing listens: every case must fail before connecting
    assert main(["drive", "w:2", "--branch-prompt", "snow", "--url", url]) == 2
    assert "--branch-prompt needs --fork-at K or --rewind-to K" in capsys.readouterr().err
    assert main(["drive", "w:2", "--fork-at", "2", "--url", url]) == 2
    assert "--fork-at 2: must be in 1..1" in capsys.readouterr().err
    assert main(["drive", "w:3", "--rewind-to", "1", "--branch-keys", "j:3", "--url", url]) == 2
    assert "at most 2 from chunk 1" in capsys.readouterr().err
    assert main(["drive", "w:3", "--rewind-to", "0", "--branch-prompt", "snow", "--url", url]) == 2
    assert "a rewind to 0 starts over" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["drive", "w:2", "--fork-at", "1", "--rewind-to", "1", "--url", url])
    assert "not allowed with argument" in capsys.readouterr().err
