"""Options declared once, in pyproject.toml's [tool.attention-doctor] table: the command line
outranks a target's table, which outranks the table for every target."""

import json
import os

import pytest

from harness import cli
from harness.doctor.settings import declared

MODULES = os.path.abspath("tests/doctor_modules.py")


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with a pyproject.toml (written by the test), the working folder."""
    monkeypatch.chdir(tmp_path)

    def write(text):
        (tmp_path / "pyproject.toml").write_text(text)

    return write


def test_a_target_table_outranks_the_table_for_every_target(project, tmp_path):
    project(
        '[tool.attention-doctor]\nmask = "drop"\nseq-len = 6\n\n'
        '[tool.attention-doctor.targets."m.py:A"]\nmask = "keep"\ncausal = true\n'
    )
    found = declared("m.py:A", tmp_path / "sub")
    assert found is not None and found.values == {"mask": "keep", "seq_len": 6, "causal": True}
    assert 'targets."m.py:A"' in found.where
    assert declared("m.py:B", tmp_path).values == {"mask": "drop", "seq_len": 6}


def test_no_table_declares_nothing(project, tmp_path):
    project("[project]\nname = 'x'\n")
    assert declared("m.py:A", tmp_path) is None


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('maks = "keep"', "no option 'maks'"),
        ('mask = "sideways"', "mask must be one of auto, keep, drop, additive, none"),
        ('causal = "yes"', "causal must be true or false"),
        ("seq_len = 2.5", "seq_len must be an integer"),
        ("json = true", "no option 'json'"),
    ],
)
def test_a_wrong_key_or_value_is_one_line_naming_the_file(project, capsys, table, words):
    project(f"[tool.attention-doctor]\n{table}\n")
    code, out, err = run(capsys, "doctor", f"{MODULES}:gpt_ok")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "pyproject.toml [tool.attention-doctor]" in err and words in err, err


def test_the_doctor_takes_the_declared_options_and_says_where_from(project, capsys):
    project(f'[tool.attention-doctor.targets."{MODULES}:gpt_leaky"]\ncausal = true\n')
    code, out, _ = run(capsys, "doctor", f"{MODULES}:gpt_leaky")
    assert code == 1 and "FAIL  causal_leak" in out
    assert "causal: True (declared in " in out and "pyproject.toml" in out


def test_the_command_line_outranks_the_table(project, capsys):
    project('[tool.attention-doctor]\nmask = "drop"\n')
    code, out, _ = run(capsys, "doctor", f"{MODULES}:einsum_ok", "--mask", "keep", "--json")
    config = json.loads(out)["config"]
    assert code == 0 and config["mask"] == "keep"
    code, out, _ = run(capsys, "doctor", f"{MODULES}:einsum_ok", "--json")
    assert json.loads(out)["config"]["mask"] == "drop"  # the table's, and so it is not healthy
