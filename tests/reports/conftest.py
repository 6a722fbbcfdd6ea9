"""Fixtures for report tests: crafted runs and headless chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def craft_run(
    parent: Path,
    run_id: str,
    items: dict[str, dict[str, Any]],
    created_at: str = "2025-01-01T00:00:00+0000",
) -> Path:
    """A finished run directory written by hand: ``items[item_id]`` has model, variant, seed,
    ``scores`` (one per example, or a list per example for rollouts) and optional metric/rows."""
    run_dir = parent / run_id
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "run_id": run_id,
        "run_name": "crafted",
        "created_at": created_at,
        "updated_at": created_at,
        "items": {},
    }
    for item_id, spec in items.items():
        directory = run_dir / item_id
        directory.mkdir(parents=True)
        metric = spec.get("metric", "accuracy")
        rows = spec.get("rows")
        if rows is None:
            rows = []
            for i, score in enumerate(spec["scores"]):
                for rollout, value in enumerate(score if isinstance(score, list) else [score]):
                    rows.append(
                        {
                            "v": 1,
                            "example_id": f"ex{i}",
                            "rollout": rollout,
                            "prompt": f"q{i}",
                            "completion": f"a{i}",
                            "gold": f"g{i}",
                            "extracted": f"a{i}",
                            "metrics": {metric: value},
                            "score": value,
                            "error": None,
                            "tokens": {"prompt": 10, "completion": 5},
                            "latency_s": 0.1,
                        }
                    )
        (directory / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        values = [r["metrics"].get(metric) for r in rows if not r.get("error")]
        mean = sum(values) / len(values) if values else None
        summary = {
            "schema_version": 1,
            "status": "finished",
            "primary_metric": metric,
            "fingerprint": f"fp-{item_id}",
            "errors": sum(1 for r in rows if r.get("error")),
            "metrics": {
                metric: {
                    "value": mean,
                    "n": len(values),
                    "stderr": 0.01,
                    "ci_low": None if mean is None else mean - 0.02,
                    "ci_high": None if mean is None else mean + 0.02,
                }
            },
            "tokens": {"prompt": 10 * len(rows), "completion": 5 * len(rows)},
            "duration_s": 1.5,
        }
        (directory / "summary.json").write_text(json.dumps(summary))
        (directory / "metadata.json").write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "item_id": item_id,
                    "seed": spec.get("seed", 0),
                    "model": {"name": spec["model"]},
                    "variant": {
                        "env": spec.get("env", spec["variant"]),
                        "id": spec["variant"],
                        "module": spec.get("module", "jsonl"),
                    },
                }
            )
        )
        manifest["items"][item_id] = {
            "path": item_id,
            "status": spec.get("status", "finished"),
            "model": spec["model"],
            "env": spec.get("env", spec["variant"]),
            "variant": spec["variant"],
            "seed": spec.get("seed", 0),
            "fingerprint": f"fp-{item_id}",
        }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run_manifest.json").write_text(json.dumps(manifest))
    return run_dir


# --------------------------------------------------------------------------- browser

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)


@dataclass(frozen=True)
class PageLoad:
    dom: str
    console: list[str]  # every console message the page produced (errors, warnings, logs)
    screenshot: Path


@dataclass(frozen=True)
class Browser:
    """Debian's ``chromium`` in headless mode."""

    executable: str
    profile: Path

    def _run(self, url: str, *action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", *action, url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def load(self, page: Path, screenshot: Path, size: str = "1400,1800") -> PageLoad:
        """Dump the DOM after scripts ran, then take a screenshot; collect both console logs."""
        url = page.resolve().as_uri()
        dumped = self._run(url, "--dump-dom")
        shot = self._run(url, f"--window-size={size}", f"--screenshot={screenshot}")
        console = [
            line
            for out in (dumped.stderr, shot.stderr)
            for line in out.splitlines()
            if ":CONSOLE" in line
        ]
        return PageLoad(dumped.stdout, console, screenshot)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Browser:
    executable = (
        os.environ.get("MODELBENCH_CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )
    if executable is None:
        pytest.skip(
            "headless browser check needs Debian's chromium: apt-get install -y chromium "
            "(or set MODELBENCH_CHROMIUM=/path/to/chromium)"
        )
    return Browser(executable, tmp_path_factory.mktemp("chromium-profile"))


@pytest.fixture
def screenshot_dir(tmp_path: Path) -> Path:
    """Where screenshots go: ``$MODELBENCH_SCREENSHOT_DIR`` (kept for people/CI) or a temp dir."""
    kept = os.environ.get("MODELBENCH_SCREENSHOT_DIR")
    directory = Path(kept) if kept else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory
