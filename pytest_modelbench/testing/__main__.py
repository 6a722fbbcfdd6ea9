"""``python -m pytest_modelbench.testing``: the simulated server's command line."""

from __future__ import annotations

from pytest_modelbench.testing.simserver import main

raise SystemExit(main())
