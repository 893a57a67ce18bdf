"""The rule of the root conftest.py, run in a pytest of its own (pytester) on a copy of that file: under CI=true
every skip fails the run (in the body, in a fixture, from a marker, while collecting a file, an xfail) except a
test marked `kind` in e2e/kind or `docker` in e2e/image that gives its reason; without CI=true skips stay skips."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

SKIPS = '''
import pytest

@pytest.fixture
def missing_tool():
    pytest.skip("no frobnicate command")

def test_runs():
    pass

def test_skip_in_body():
    pytest.skip("no nft command")

def test_skip_in_fixture(missing_tool):
    pass

@pytest.mark.skipif(True, reason="no helm binary")
def test_skipif():
    pass

@pytest.mark.skip
def test_skip_without_reason():
    pass

@pytest.mark.xfail(reason="flaky here")
def test_xfail():
    assert False
'''
ARGS = ("-p", "no:cacheprovider", "-o", "asyncio_default_fixture_loop_scope=function")
MARKED = '''
import pytest

pytestmark = pytest.mark.{marker}

def test_with_reason():
    pytest.skip("no Docker engine answers")

def test_without_reason():
    pytest.skip()
'''


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makepyfile(test_skips=SKIPS)
    for folder, marker in (("e2e/kind", "kind"), ("e2e/image", "docker"), ("e2e/local", "kind")):
        (pytester.path / folder).mkdir(parents=True)
        (pytester.path / folder / f"test_{marker}_in_{Path(folder).name}.py").write_text(MARKED.format(marker=marker))
    return pytester


def outcomes(recorder: pytest.HookRecorder) -> dict[str, str]:
    """Each test's outcome: the first phase that did not pass, else passed."""
    seen: dict[str, str] = {}
    for report in recorder.getreports("pytest_runtest_logreport"):
        if seen.get(report.nodeid, "passed") == "passed":
            seen[report.nodeid] = report.outcome
    return seen


def longrepr(recorder: pytest.HookRecorder, nodeid: str) -> str:
    return "".join(str(r.longrepr) for r in recorder.getreports("pytest_runtest_logreport") if r.nodeid == nodeid)


def test_without_ci_a_skip_stays_a_skip(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest(*ARGS)
    result.assert_outcomes(passed=1, skipped=10, xfailed=1)


@pytest.mark.parametrize("value", ["true", "1"])
def test_under_ci_only_kind_and_docker_in_their_folders_skip_with_a_reason(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    recorder = suite.inline_run(*ARGS)
    assert outcomes(recorder) == {
        "test_skips.py::test_runs": "passed",
        "test_skips.py::test_skip_in_body": "failed",
        "test_skips.py::test_skip_in_fixture": "failed",  # an error of its setup
        "test_skips.py::test_skipif": "failed",
        "test_skips.py::test_skip_without_reason": "failed",
        "test_skips.py::test_xfail": "failed",
        "e2e/kind/test_kind_in_kind.py::test_with_reason": "skipped",
        "e2e/kind/test_kind_in_kind.py::test_without_reason": "failed",  # an allowed skip still says why
        "e2e/image/test_docker_in_image.py::test_with_reason": "skipped",
        "e2e/image/test_docker_in_image.py::test_without_reason": "failed",
        "e2e/local/test_kind_in_local.py::test_with_reason": "failed",  # the kind marker, outside e2e/kind
        "e2e/local/test_kind_in_local.py::test_without_reason": "failed",
    }
    assert "CI=true: this test may not skip here (Skipped: no nft command)" in longrepr(
        recorder, "test_skips.py::test_skip_in_body")
    assert "(Skipped: no helm binary)" in longrepr(recorder, "test_skips.py::test_skipif")
    assert "(xfail: flaky here)" in longrepr(recorder, "test_skips.py::test_xfail")
    assert recorder.ret == pytest.ExitCode.TESTS_FAILED


def test_under_ci_a_file_skipped_while_collecting_fails(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makepyfile(test_spark='import pytest\n\npytest.importorskip("no_such_module_for_octavo")\n\n'
                                   'def test_x():\n    pass\n')
    monkeypatch.delenv("CI", raising=False)
    pytester.runpytest(*ARGS).assert_outcomes(skipped=1)
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*CI=true: test_spark.py (skipped while collecting) may not skip here*"])
    assert result.ret != pytest.ExitCode.OK
