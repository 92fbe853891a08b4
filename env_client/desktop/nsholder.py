"""Hold one desktop's private mount namespace (run by ``LocalDesktop`` as root, inside
``unshare --mount --propagation=private [--net]``; standard library only, run by path)::

    python -I -S nsholder.py --keep=/tmp/csd-desktops/desk-d0-ab12 --keep=/tmp/.X11-unix/X3

It opens every kept path first (``O_PATH``: the original stays reachable through the
descriptor once hidden), mounts an empty tmpfs of the desktop's own over each shared writable
folder (:data:`PRIVATE`), puts each kept path back at its own place as a bind mount of the
original, prints ``ready`` and sleeps until it is killed with the desktop. The desktop's
processes join this namespace with ``nsenter --target=<pid> --mount``: they see their session
folder and their X socket, and nothing that another desktop or the machine keeps in ``/tmp``.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

PRIVATE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# Per folder; tmpfs takes memory only for what is written. Big enough for an app's caches and
# a task's downloads, small enough that a runaway writer cannot fill the machine's memory.
TMPFS_OPTIONS = "mode=1777,nosuid,nodev,size=256m,nr_inodes=65536"


def _mount(*args: str) -> None:
    # --no-canonicalize: mount must not resolve /proc/<pid>/fd/<n> to a path string, which
    # would name the new, empty place instead of the original behind the descriptor.
    done = subprocess.run(["mount", "--no-canonicalize", *args], capture_output=True, check=False)
    if done.returncode != 0:
        raise OSError(f"mount {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")


def _place(path: str, is_dir: bool) -> None:
    """An empty mount point at ``path`` in the new tmpfs (root's, parents enterable)."""
    parent = path if is_dir else os.path.dirname(path)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    if not is_dir and not os.path.exists(path):
        with open(path, "w"):
            pass


def hold(keep: list[str]) -> None:
    fds = {path: os.open(path, os.O_PATH) for path in keep}
    is_dir = {path: stat.S_ISDIR(os.fstat(fd).st_mode) for path, fd in fds.items()}
    for folder in PRIVATE:
        if os.path.isdir(folder) and not os.path.islink(folder):
            _mount("-t", "tmpfs", "-o", TMPFS_OPTIONS, "csd-desktop-private", folder)
    for path, fd in fds.items():
        if any(path == p or path.startswith(p + "/") for p in PRIVATE):
            _place(path, is_dir[path])
            _mount("--bind", f"/proc/{os.getpid()}/fd/{fd}", path)
        os.close(fd)


def main(argv: list[str]) -> int:
    keep = [a.split("=", 1)[1] for a in argv if a.startswith("--keep=")]
    if len(keep) != len(argv):
        print(f"usage: nsholder.py --keep=PATH ...; got {argv!r}", file=sys.stderr, flush=True)
        return 2
    try:
        hold(keep)
    except OSError as exc:
        print(f"namespace set-up failed: {exc}", file=sys.stderr, flush=True)
        return 1
    print("ready", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
