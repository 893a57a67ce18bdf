"""Starts one container's process in a mount namespace of its own (and the pod's network namespace, and a UTS
namespace carrying the pod's hostname), then execs it: the process is the container, with the volumes bound at
their absolute paths. Run by the node agent as `python launch.py SPEC.json`; standard library only, as it runs
before anything else in the container.

SPEC: {"argv": [...], "env": {...}, "cwd": "/", "hostname": "pod", "netns": "/run/netns/x" or null,
       "mounts": [{"source": "/host/dir", "target": "/abs/path", "read_only": false}, ...],
       "keep": ["/host/program/dir", ...]}    bound back read-only where a volume would hide them

The mounts are private to the container (propagation private): nothing it binds reaches the host. A target that
does not exist is made first (an empty directory, or an empty file when the source is a file) on the file system
it lands on, which for a path outside any volume is the host's, as a container runtime makes mount points in
its image. Sources are opened before anything is bound, so a mount over /tmp does not hide a volume's directory
that lives under /tmp. Needs root (CAP_SYS_ADMIN): the agent checks that before it starts any pod."""

import ctypes
import json
import os
import socket
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
EXIT_LAUNCH_FAILED = 128

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, flags: int) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), None, flags, None),
           f"mount {source} on {target}")


def _make_target(target: str, is_dir: bool) -> None:
    if os.path.lexists(target):
        return
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("netns"):
        fd = os.open(spec["netns"], os.O_RDONLY)
        _check(_libc.setns(fd, CLONE_NEWNET), f"join network namespace {spec['netns']}")
        os.close(fd)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare the mount and UTS namespaces")
    _mount(None, "/", MS_REC | MS_PRIVATE)
    if spec.get("hostname"):
        socket.sethostname(spec["hostname"])
    opened = [(os.open(m["source"], os.O_PATH), m) for m in spec["mounts"]]
    targets = [m["target"].rstrip("/") or "/" for m in spec["mounts"]]
    # The host's programs a volume would hide (the checkout and its virtual environment under a /tmp that an
    # emptyDir covers): opened now, bound back at their own paths after the volumes.
    hidden = [p for p in spec.get("keep", []) if any(p == t or p.startswith(t + "/") for t in targets)]
    kept = [(os.open(p, os.O_PATH), {"source": p, "target": p, "read_only": True}) for p in hidden
            if os.path.isdir(p)]
    for fd, m in opened + kept:
        _make_target(m["target"], os.path.isdir(f"/proc/self/fd/{fd}"))
        _mount(f"/proc/self/fd/{fd}", m["target"], MS_BIND | MS_REC)
        if m.get("read_only"):
            _mount(None, m["target"], MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC)
        os.close(fd)
    cwd = spec.get("cwd") or "/"
    os.chdir(cwd if os.path.isdir(cwd) else "/")  # an image's WORKDIR that no volume provides
    argv, env = spec["argv"], spec["env"]
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except OSError as e:
        print(f"octavo node agent: the container could not start: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_LAUNCH_FAILED)
