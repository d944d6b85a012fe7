"""The doctor's one table of options: the parser, Config, the fixture's documentation, the
README and the mask vocabulary all agree with it."""

import re
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

import harness.doctor as doctor
from harness import cli, masks, plugin
from harness.doctor import OPTIONS, Config
from harness.doctor.options import BY_NAME

README = Path(__file__).resolve().parents[1] / "README.md"


def doctor_parser():
    sub = cli.build_parser()._subparsers._group_actions[0]
    return sub.choices["doctor"]


def test_every_config_field_is_an_option_with_the_tables_default():
    for f in fields(Config):
        option = f.metadata.get("option")
        assert option is BY_NAME[f.name], f.name
        if f.name not in ("d_model", "call"):  # None in Python: read off the module / no adapter
            assert f.default == option.default, f.name
    assert {o.name for o in OPTIONS if o.config} == {f.name for f in fields(Config)}
    assert all(f.default is not MISSING for f in fields(Config))


def test_the_parser_has_every_option_with_its_help_and_choices():
    actions = {a.dest: a for a in doctor_parser()._actions}
    for option in OPTIONS:
        action = actions[option.name]
        assert action.option_strings == [option.flag]
        assert action.help.replace("%%", "%") == option.help
        assert tuple(action.choices or ()) == option.choices


def test_help_says_what_each_value_of_a_choice_means():
    for option in OPTIONS:
        for value in option.choices:
            if value != "auto" or "auto" in option.help:
                assert re.search(rf"\b{value}\b", option.help), (option.name, value)


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_the_fixture_documents_every_keyword_option(option):
    doc = plugin.attention_doctor.__doc__ or ""
    if option.config:
        assert f"``{option.name}``: {option.help}" in doc
    assert "``timeout``" in doc


def test_the_readme_names_every_flag():
    text = README.read_text(encoding="utf-8")
    missing = [o.flag for o in OPTIONS if f"`{o.flag}" not in text]
    assert not missing, f"the README does not mention {missing}"


def test_a_choice_outside_the_table_is_one_usage_line():
    with pytest.raises(
        Exception, match=r"^--mask-shape must be one of bqk, b1qk, bk, b11k, qk, not 'x'$"
    ):
        Config(mask="keep", mask_shape="x")


def test_the_mask_shapes_are_the_cores_layouts():
    assert BY_NAME["mask_shape"].choices == masks.LAYOUTS
    assert BY_NAME["mask_dtype"].choices == masks.MASK_DTYPES
    assert BY_NAME["mask"].choices == ("auto", *masks.MEANINGS, "none")


def test_the_package_exports_each_lazy_name_once():
    assert sorted(doctor.__all__) == sorted(doctor._HOMES)
    assert all(getattr(doctor, name) is not None for name in doctor.__all__)


def test_reading_the_table_imports_no_torch():
    code = "import sys, harness.doctor.options, harness.plugin; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
