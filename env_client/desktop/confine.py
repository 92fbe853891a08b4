"""How a root server starts a desktop's processes confined (``DesktopConfig.desktop_user``).

    argv = confined(["xterm"], user=(999, 995), network=False)
    # ['unshare', '--net', '--', 'setpriv', '--reuid=999', '--regid=995', '--clear-groups',
    #  '--', 'xterm']

The process runs as the unprivileged user with no supplementary groups and, unless
``network``, in a network namespace of its own with nothing but a loopback that is down: it
reaches the X server through its socket file, but no TCP or UDP service of this machine (the
environment server, Ray's job API) and nothing outside it. Both tools come with util-linux and
exec the command in place (same pid, same process group, same environment). Without a user
(the server is not root) the command is returned unchanged.
"""

from __future__ import annotations

WRAPPERS = ("unshare", "setpriv")


def confined(argv: list[str], user: tuple[int, int] | None, network: bool) -> list[str]:
    """``argv`` wrapped to run as ``user`` (uid, gid), without network unless ``network``."""
    if user is None:
        return list(argv)
    uid, gid = user
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    return [*([] if network else ["unshare", "--net", "--"]), *drop, *argv]
