"""Entry script of the sandbox launcher: ``python -I -B boot.py CONFIG_FD`` (a pipe's read end
holding the configuration as JSON).

Kept tiny because a script is compiled on every run, while imported modules
come from cached bytecode. It makes ``pytest_modelbench.sandbox.*`` importable
without running the packages' ``__init__`` (they import the plugin: about
80 ms per run) and hands over to :func:`pytest_modelbench.sandbox.launcher.main`.
"""

from __future__ import annotations

import os
import sys
import types


def bind_package() -> None:
    """Register bare ``pytest_modelbench`` and ``pytest_modelbench.sandbox`` packages."""
    here = os.path.dirname(os.path.abspath(__file__))
    for name, path in (
        ("pytest_modelbench", os.path.dirname(here)),
        ("pytest_modelbench.sandbox", here),
    ):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules.setdefault(name, package)


def main() -> None:
    bind_package()
    from pytest_modelbench.sandbox import launcher  # function-level: only after bind_package

    launcher.main()


if __name__ == "__main__":
    main()
