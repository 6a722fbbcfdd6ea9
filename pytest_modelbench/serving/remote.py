"""Start an xdist worker on another host over ssh, in the same directory: a ``--tx`` python.

    pytest benchmarks/ --model all --dist load \\
      --tx "4*popen//python=.venv/bin/python -m pytest_modelbench.serving.remote node1" \\
      --tx "4*popen//python=.venv/bin/python -m pytest_modelbench.serving.remote node2"

execnet starts ``<python> -u -c <bootstrap>`` for a popen worker; this module replaces
itself with ``ssh node1 'cd <this directory> && exec <this python> -u -c <bootstrap>'``.
With the project and its virtualenv on a shared filesystem at the same path on every host,
the remote worker sees exactly what a local one sees: the same working directory (relative
``configs/``, data and checkpoint paths resolve identically), the same interpreter, and
the command line as given. Unlike xdist's ``ssh=`` gateway, nothing is rsynced and path
arguments are not rewritten. ``//env:NAME=value`` in the spec still sets variables on the
remote side; the caller's environment is not forwarded (GPUs are discovered on each host).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

__all__ = ["SSH_ENV", "main", "remote_argv"]

SSH_ENV = "MODELBENCH_SSH"  # the ssh command, e.g. "ssh -J bastion"; tests put a fake here
DEFAULT_SSH = "ssh -T -o BatchMode=yes"  # no tty (a clean byte pipe), never prompt


def remote_argv(
    host: str,
    worker_args: Sequence[str],
    *,
    python: str | None = None,
    cwd: str | None = None,
    ssh: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """The ssh command that runs ``python worker_args...`` in ``cwd`` on ``host``."""
    environ = os.environ if environ is None else environ
    command = shlex.split(ssh or environ.get(SSH_ENV) or DEFAULT_SSH)
    remote = " ".join(
        [
            "cd",
            shlex.quote(cwd or os.getcwd()),
            "&&",
            "exec",
            shlex.quote(python or sys.executable),
            *(shlex.quote(a) for a in worker_args),
        ]
    )
    return [*command, host, remote]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_modelbench.serving.remote",
        description="Run an xdist worker on HOST over ssh, in this directory "
        "(use as: --tx 'popen//python=PYTHON -m pytest_modelbench.serving.remote HOST').",
    )
    parser.add_argument("--python", help="interpreter on HOST (default: this one, same path)")
    parser.add_argument("--cwd", help="directory on HOST (default: this one, same path)")
    parser.add_argument("--ssh", help=f"ssh command (default: ${SSH_ENV} or {DEFAULT_SSH!r})")
    parser.add_argument("host")
    parser.add_argument("worker_args", nargs=argparse.REMAINDER, help="what execnet passes")
    return parser


def host_of(python: str | None) -> str | None:
    """The node an xdist ``popen//python=...`` spec reaches through this module, else None."""
    args = shlex.split(python or "")
    if __name__ not in args and "pytest_modelbench.serving.remote" not in args:
        return None
    at = args.index("pytest_modelbench.serving.remote") + 1
    known, _ = _parser().parse_known_args(args[at:])
    return str(known.host)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.worker_args:
        print(
            f"{_parser().prog}: no worker arguments; use it as the python of an xdist "
            f"popen spec: --tx 'popen//python={sys.executable} -m pytest_modelbench.serving."
            f"remote {args.host}'",
            file=sys.stderr,
        )
        return 2
    command = remote_argv(
        args.host, args.worker_args, python=args.python, cwd=args.cwd, ssh=args.ssh
    )
    try:
        os.execvp(command[0], command)  # stdin/stdout are execnet's pipe: hand them over
    except OSError as exc:
        print(f"cannot run {command[0]!r} ({exc.strerror}); set {SSH_ENV}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
