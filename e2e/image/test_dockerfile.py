"""The Dockerfile, read as text (no Docker engine runs here: `make image` builds it where one does): the stages
the Makefile and the chart name, a non-root user whose uid the pods run as, `octavo` as the entry point with
`node` by default, a data volume, no build tools in the final stages, and every file it copies present in the
checkout and let through by .dockerignore."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from octavo.cli.main import build_parser
from octavo.operator import builders, resources

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make ", "python3-dev", "git ")


def stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (keyword, rest), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert match
            current = out.setdefault(match.group(2) or match.group(1), [("FROM", match.group(1))])
            continue
        current.append((keyword, rest))
    return out


def last(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [rest for k, rest in stage if k == keyword]
    assert values, f"no {keyword}"
    return values[-1]


def test_the_stages_the_makefile_and_the_kind_tests_build() -> None:
    found = stages()
    assert {"build", "octavo", "spark"} <= set(found)
    makefile = (ROOT / "Makefile").read_text()
    for target in ("octavo", "spark"):
        assert f"--target {target}" in makefile


def test_the_image_runs_octavo_as_a_non_root_user_with_a_data_volume() -> None:
    final = stages()["octavo"]
    assert json.loads(last(final, "ENTRYPOINT")) == ["octavo"]
    command = json.loads(last(final, "CMD"))
    args = build_parser().parse_args(command)
    assert args.command == "node" and args.data_dir == "/data" and args.host == "0.0.0.0"
    user = last(final, "USER")
    uid = int(user.split(":")[0])
    assert uid != 0
    assert json.loads(last(final, "VOLUME")) == ["/data"]
    assert "chown 1000:1000 /data" in last(final, "RUN")
    # The pods run as that uid, with the volume's group.
    sts = builders.stateful_set("b", "ns", resources.parse_cluster("b", {
        "image": "x", "storage": {"size": "1Gi"}, "etcd": {"endpoints": "e:2379"}}), "h", replicas=3, generation=1)
    assert sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid
    assert sts["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 1000
    assert builders.DATA_DIR == "/data"
    # The bookie container's arguments are a valid `octavo` command line.
    container_args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert build_parser().parse_args(container_args).command == "node"
    # The console script the entry point names.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "octavo" in scripts
    # The chart's pods run as the same uid.
    for template in (ROOT / "charts" / "octavo" / "templates").rglob("*.yaml"):
        for match in re.findall(r"runAsUser: (\d+)", template.read_text()):
            assert int(match) == uid, template.name


def test_no_build_tools_in_the_final_stages() -> None:
    found = stages()
    for name in ("octavo", "spark"):
        for keyword, rest in found[name]:
            if keyword == "RUN":
                assert not any(tool in rest + " " for tool in BUILD_TOOLS), (name, rest)
                assert "pip install" not in rest, f"{name} installs with pip; the build stage should"
            if keyword == "COPY" and "--from=" in rest:
                assert re.search(r"--from=(build|build-spark) /opt/octavo /opt/octavo", rest), rest
    assert last(found["spark"], "FROM") == "octavo"


def test_every_copied_file_exists_and_passes_the_dockerignore() -> None:
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", ".dockerignore should let through only what the Dockerfile copies"
    allowed = [p[1:].rstrip("/") for p in ignore if p.startswith("!")]
    copied = []
    for stage in stages().values():
        for keyword, rest in stage:
            if keyword == "COPY" and "--from=" not in rest:
                *sources, _ = rest.split()
                copied += sources
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the checkout"
        assert any(source.rstrip("/") == a or source.startswith(a + "/") or fnmatch.fnmatch(source, a)
                   for a in allowed), f"{source} is excluded by .dockerignore"
    # Every package pyproject maps is copied (a package left out would be missing from the image).
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in package_dirs.items():
        assert any(folder == c.rstrip("/") or folder.startswith(c.rstrip("/") + "/") for c in copied), package


def test_the_chart_default_image_is_this_one() -> None:
    values = yaml.safe_load((ROOT / "charts" / "octavo" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "charts" / "octavo" / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version  # the default tag is the appVersion
    assert values["image"]["repository"].endswith("/octavo")


def _image_missing() -> str | None:
    import shutil
    import subprocess

    if shutil.which("docker") is None:
        return "no docker command"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "no Docker engine answers (docker info failed): `make image image-smoke` where one does"
    if subprocess.run(["docker", "image", "inspect", "octavo:dev"], capture_output=True, timeout=60).returncode:
        return "the image octavo:dev is not built here: `make image` first"
    return None


@pytest.mark.docker
def test_the_built_image_serves_a_cluster() -> None:
    """Three bookies in containers of the built image and `octavo cluster check` from a fourth (e2e/image/smoke.py),
    where a Docker engine and the image are."""
    import subprocess
    import sys

    reason = _image_missing()
    if reason:
        pytest.skip(reason)
    done = subprocess.run([sys.executable, str(ROOT / "e2e" / "image" / "smoke.py")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "read them back identical" in done.stdout
