"""Under CI=true a missing prerequisite fails the run; locally it skips with its reason.

Each case runs the project's own conftest.py in an inner pytest (pytester) over a small file
that skips the ways the suite does: a fixture's skip (the data mirror), importorskip at module
level (an extra), a skipif mark (perl), and a platform skip CI accepts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

SKIPPING_TESTS = '''
import pytest

@pytest.fixture
def mirror():
    pytest.skip("data mirror not found at /nowhere")

def test_needs_the_mirror(mirror):
    pass

@pytest.mark.skipif(True, reason="perl is not installed")
def test_needs_perl():
    pass

def test_platform_feature():
    pytest.skip("platform: oneDNN's int8 linear is not in this torch build")

@pytest.mark.xfail(reason="a known failure is not a skip")
def test_expected_failure():
    assert False

def test_runs():
    pass
'''

MISSING_EXTRA = '''
import pytest
pytest.importorskip("a_package_that_is_not_installed_anywhere")

def test_never_collected():
    pass
'''


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_skips=SKIPPING_TESTS)
    return pytester


def test_locally_missing_prerequisites_skip_with_their_reason(inner: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = inner.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    result.stdout.fnmatch_lines(["*data mirror not found at /nowhere*", "*perl is not installed*"])


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_in_ci_they_fail_naming_what_is_missing(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                value: str) -> None:
    monkeypatch.setenv("CI", value)
    result = inner.runpytest("-p", "no:cacheprovider")
    # Both skips happen in setup (a fixture, a skipif mark), so both are errors.
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, errors=2)
    result.stdout.fnmatch_lines([
        "*CI=true and a prerequisite is missing (locally this skips): data mirror not found at /nowhere*",
        "*CI=true and a prerequisite is missing (locally this skips): perl is not installed*",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_in_ci_a_missing_extra_stops_collection(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_extra=MISSING_EXTRA)
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*CI=true and a prerequisite is missing*a_package_that_is_not_installed_anywhere*"])
    monkeypatch.setenv("CI", "false")
    assert pytester.runpytest("-p", "no:cacheprovider").ret == pytest.ExitCode.NO_TESTS_COLLECTED
