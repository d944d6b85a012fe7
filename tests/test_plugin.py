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
    """
)


def test_fixture_passes_healthy_and_fails_buggy_with_the_findings(pytester, request):
    pytester.makepyfile(CONFTEST_FREE_TESTS.format(root=str(request.config.rootpath)))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*AttentionDoctorFailure*", "*FAIL  causal no-leak*depends on input*"]
    )


def test_strict_option_is_registered(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*attention doctor*", "*--attention-doctor-strict*"])


def test_loading_the_plugin_imports_nothing_heavy():
    """Every pytest run of an environment with the package installed loads the plugin: until a
    test asks for the fixture it must not import torch, pandas or the doctor."""
    code = (
        "import sys, harness.plugin; "
        "print(sorted(m for m in ('torch', 'pandas', 'harness.doctor') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
