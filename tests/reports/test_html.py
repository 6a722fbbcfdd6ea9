"""HTML reports: a real session's report.html and pytest-html report opened in headless chromium."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_modelbench.reporting import charts
from pytest_modelbench.reporting.htmlplugin import sort_key
from tests.conftest import Project, configure
from tests.reports.conftest import Browser

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_benchmarks(project: Project, sim: Any, *extra: str) -> tuple[pytest.RunResult, Path]:
    """alpha and beta on qa and math, plus a three-checkpoint sweep; alpha has baselines."""
    root = project.root
    for step in (300, 100, 200):
        (root / "ckpts" / f"step{step}").mkdir(parents=True)
    checkpoints = [f"ckpts/step{s}" for s in (100, 200, 300)]
    configure(project, "http://placeholder", ("alpha", "beta"), n=40, envs=("qa", "math"))
    server = sim(
        models=["sim-model", *checkpoints], accuracy=0.7, lookup=project.lookup("qa", "math")
    )
    configure(project, server.base_url, ("alpha", "beta"), n=40, envs=("qa", "math"))
    models = yaml.safe_load((root / "configs" / "models.yaml").read_text())
    models["models"]["ckpt"] = {
        "checkpoints": "ckpts/step*",
        "api_base_url": server.base_url,
        "max_concurrent": 8,
    }
    (root / "configs" / "models.yaml").write_text(yaml.safe_dump(models))
    (root / "configs" / "baselines" / "alpha.yaml").write_text(
        yaml.safe_dump(
            {
                "qa": {"value": 0.95, "margin": 0.01, "source": "crafted to fail"},
                "math": {"min": 0.3},
            }
        )
    )
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha,beta,ckpt", "-p", "no:cacheprovider", *extra
    )
    (run_dir,) = project.run_dirs()
    return result, run_dir


def test_run_directory_report_in_browser(
    project: Project, sim: Any, browser: Browser, screenshot_dir: Path
) -> None:
    result, run_dir = run_benchmarks(
        project, sim, "--html", "out/pytest-report.html", "--self-contained-html"
    )
    result.assert_outcomes(passed=9, failed=1)
    result.stdout.fnmatch_lines(
        [f"modelbench report: {run_dir / 'report.html'} (also leaderboard.csv*"]
    )

    page = browser.load(run_dir / "report.html", screenshot_dir / "run-report.png")
    assert page.console == [], "\n".join(page.console)
    assert page.dom.count('class="mb-chart"') == 2
    assert 'data-chart="scores"' in page.dom and 'data-chart="checkpoints"' in page.dom
    assert "ckpt: exact_match vs checkpoint step" in page.dom
    assert page.dom.count('class="mb-baseline"') == 2  # alpha on qa and math
    assert "alpha-qa-seed0" in page.dom and "regression of" in page.dom  # the gate paragraph
    assert "First 5 wrong or errored example(s)" in page.dom
    # every example of the session is embedded (tests/reports/test_examples.py browses them)
    assert 'id="mb-examples-data"' in page.dom and 'data-count="400"' in page.dom
    assert "Browse this item's" in page.dom
    shot = page.screenshot.read_bytes()
    assert shot.startswith(PNG_MAGIC) and len(shot) > 20_000


def test_pytest_html_self_contained_in_browser(
    project: Project, sim: Any, browser: Browser, screenshot_dir: Path
) -> None:
    result, _ = run_benchmarks(
        project,
        sim,
        "--html",
        "out/pytest-report.html",
        "--self-contained-html",
        "--mb-report-examples",
        "2",
    )
    result.assert_outcomes(passed=9, failed=1)
    html_path = project.root / "out" / "pytest-report.html"
    source = html_path.read_text()
    assert 'rel="stylesheet"' not in source  # self-contained: nothing to fetch
    page = browser.load(html_path, screenshot_dir / "pytest-html-report.png", size="1600,1400")
    assert page.console == [], "\n".join(page.console)
    # pytest-html's JavaScript renders the rows from its JSON blob: our cells prove it ran
    for column in (
        "mbmodel",
        "mbenv",
        "mbscore",
        "mbci",
        "mbbaseline",
        "mbdelta",
        "mbverdict",
        "mbtokens",
    ):
        assert f'data-column-type="{column}"' in page.dom
        assert page.dom.count(f'class="col-{column}') >= 10
    assert page.dom.count('class="mb-chart"') == 2
    assert "vs baseline 0.950 (margin 0.01): regression of" in page.dom
    assert "First 2 wrong or errored example(s)" in page.dom
    assert page.screenshot.read_bytes().startswith(PNG_MAGIC)


def test_reports_can_be_turned_off(project: Project, sim: Any) -> None:
    server = sim(accuracy=1.0, lookup={})
    configure(project, server.base_url, n=5)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-no-reports")
    result.assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    assert not (run_dir / "report.html").exists() and not (run_dir / "leaderboard.csv").exists()
    assert "modelbench report:" not in result.stdout.str()


# --------------------------------------------------------------------------- pure parts


def test_score_chart_is_valid_svg_with_whiskers_and_baselines() -> None:
    points = [
        charts.Point("qa", "alpha", 0.61, 0.58, 0.64, baseline=0.65),
        charts.Point("qa", "beta", 0.70, 0.67, 0.73),
        charts.Point("math <&>", "alpha", 0.40, 0.35, 0.45, baseline=0.30),
    ]
    svg = ET.fromstring(charts.score_chart(points, "accuracy"))
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.get("data-chart") == "scores"
    assert len(svg.findall(f".//{ns}g[@class='mb-bar']")) == 3
    assert len(svg.findall(f".//{ns}line[@class='mb-whisker']")) == 3
    assert len(svg.findall(f".//{ns}line[@class='mb-baseline']")) == 2
    assert "math <&>" in [t.text for t in svg.iter(f"{ns}text")]


def test_checkpoint_chart_orders_steps() -> None:
    points = [charts.Point("qa", "", v, step=s) for s, v in ((300, 0.7), (100, 0.5), (200, 0.6))]
    svg = ET.fromstring(charts.checkpoint_chart(points, "run7"))
    ns = "{http://www.w3.org/2000/svg}"
    (line,) = svg.findall(f".//{ns}polyline")
    xs = [float(pair.split(",")[0]) for pair in (line.get("points") or "").split()]
    ys = [float(pair.split(",")[1]) for pair in (line.get("points") or "").split()]
    assert xs == sorted(xs) and ys == sorted(ys, reverse=True)  # higher score = higher on screen


def test_sort_keys_order_numbers_as_pytest_html_compares_strings() -> None:
    values = [-0.25, -3.0, 0.0, 0.0625, 12.5, 1e6]
    assert sorted(values, key=sort_key) == sorted(values)
    assert sort_key(None) > sort_key(1e9)  # missing values sort last
