"""The pytest plugin, run inside pytest as a user's project would."""

import subprocess
import sys
import textwrap

pytest_plugins = ["pytester"]

CONFTEST_FREE_TESTS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from tests import doctor_modules as dm

    def test_healthy(attention_doctor):
        d = attention_doctor(dm.EinsumAttention(32, 4), mask="keep")
        assert d.healthy

    def test_leaky(attention_doctor):
        attention_doctor(dm.gpt_leaky(32, 4), causal=True)

    def test_wrong_axis(attention_doctor):
        attention_doctor(dm.einsum_wrong_axis(32, 4), mask="keep")
    """
)


def test_fixture_passes_healthy_and_fails_buggy_with_the_findings(pytester, request):
    pytester.makepyfile(CONFTEST_FREE_TESTS.format(root=str(request.config.rootpath)))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*AttentionDoctorFailure*",
            "*FAIL  causal_leak*at *doctor_modules.py:*",
            "*key t + 1 open to query t*",
            "*- causal no-leak:*depends on input*",
        ]
    )
    # the failure carries the change to write, proven on the module's own code
    result.stdout.fnmatch_lines(
        [
            "*FAIL  softmax_dim*at *doctor_modules.py:*",
            "*fix (softmax_dim) at *doctor_modules.py:*, proven: with this change every probe "
            "passes",
            "*- weights = scores.softmax(dim=self.softmax_axis)",
            "*+ weights = scores.softmax(dim=-1)",
        ]
    )


MARKED = textwrap.dedent(
    """
    import sys
    import pytest
    sys.path.insert(0, {root!r})
    from tests import doctor_modules as dm

    pytestmark = pytest.mark.attention_doctor(causal=True)

    def test_leaky_by_the_modules_marker(attention_doctor):
        attention_doctor(dm.gpt_leaky(32, 4))

    @pytest.mark.attention_doctor(mask="keep", causal=False)
    def test_healthy_by_its_own_marker(attention_doctor):
        assert attention_doctor(dm.EinsumAttention(32, 4)).config.mask == "keep"

    @pytest.mark.attention_doctor(mask="drop")
    def test_the_calls_keywords_outrank_the_marker(attention_doctor):
        assert attention_doctor(dm.EinsumAttention(32, 4), mask="keep", causal=False).healthy
    """
)


def test_options_declared_once_with_the_marker_reach_the_fixture(pytester, request):
    pytester.makepyfile(MARKED.format(root=str(request.config.rootpath)))
    result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_leaky_by_the_modules_marker*", "*FAIL  causal_leak*"])


BAD_CALLS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from tests import misbehaving_modules as mm

    def test_absent_device(attention_doctor):
        attention_doctor(mm.Plain(16), device="cuda:99")

    def test_unknown_option(attention_doctor):
        attention_doctor(mm.Plain(16), colour="blue")

    def test_hangs(attention_doctor):
        attention_doctor(mm.Hangs(16), timeout=1)
    """
)


def test_fixture_reports_bad_options_in_one_line_and_keeps_the_time_limit(pytester, request):
    pytester.makepyfile(BAD_CALLS.format(root=str(request.config.rootpath)))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*_ test_absent_device _*",
            "attention_doctor: device 'cuda:99' *",
            "*_ test_unknown_option _*",
            "attention_doctor: no option 'colour'; use mask, *, timeout",
            "*_ test_hangs _*",
            "*FAIL  calling the module*did not finish within 1 s*",
        ]
    )
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if " test_absent_device " in line)
    assert lines[start + 2].startswith("___")  # one line: no traceback, no probe ran


def test_strict_option_is_registered(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*attention doctor*", "*--attention-doctor-strict*"])


def test_loading_the_plugin_imports_nothing_heavy():
    """Every pytest run of an environment with the package installed loads the plugin: until a
    test asks for the fixture it must not import torch, pandas or the doctor's machinery (its
    options table, plain data, documents the fixture)."""
    heavy = ("torch", "pandas", "harness.doctor.examine", "harness.doctor.subject")
    code = f"import sys, harness.plugin; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
