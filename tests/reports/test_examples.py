"""Every example in report.html, ``modelbench compare --html`` and ``modelbench view``: the
pages opened in headless chromium with a filter in the URL fragment, the DOM checked."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.cli import main
from pytest_modelbench.reporting import examples
from pytest_modelbench.reporting.examples import gold_view, outcome_of
from pytest_modelbench.reporting.view import make_server
from tests.conftest import Project
from tests.reports.conftest import CHROMIUM_FLAGS, Browser, craft_run

OPTIONS = ["aspirin", "beta blocker", "calcium", "digoxin"]


def mc_rows(n: int = 30) -> list[dict[str, Any]]:
    """Multiple-choice rows as suites/multiple_choice.py writes them: gold B; every third
    right, q7 errored, q8 truncated, odd ones with reasoning."""
    rows = []
    for i in range(n):
        right = i % 3 == 0
        rows.append(
            {
                "v": 1,
                "example_id": f"q{i}",
                "rollout": 0,
                "prompt": f"Question {i}: which drug? <b>not bold</b>",
                "completion": f"Answer: {'B' if right else 'C'} </script><i>x</i>",
                "reasoning": f"thinking about {i} " * 10 if i % 2 else "",
                "reasoning_tokens": 30 if i % 2 else None,
                "gold": {"answer": "B", "options": OPTIONS},
                "extracted": "B" if right else "C",
                "metrics": {"accuracy": 1.0 if right else 0.0},
                "score": 1.0 if right else 0.0,
                "error": "HTTP 500 after 3 attempts" if i == 7 else None,
                "finish_reason": "length" if i == 8 else "stop",
                "tokens": {"prompt": 40, "completion": 9},
                "latency_s": 0.25,
            }
        )
    return rows


@pytest.fixture
def mc_run(tmp_path: Path) -> Path:
    return craft_run(
        tmp_path / "runs",
        "run-mc",
        {
            "m-medqa-seed0": {"model": "m", "variant": "medqa", "rows": mc_rows()},
            "m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1, 0, 1, 0]},
        },
    )


def dump(browser: Browser, url: str, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """The DOM once the page's promises settled (virtual time), and the console lines."""
    args = [browser.executable, *CHROMIUM_FLAGS, f"--user-data-dir={browser.profile}"]
    budget = "--virtual-time-budget=10000"
    out = subprocess.run(
        [*args, budget, "--dump-dom", url], capture_output=True, text=True, timeout=120
    )
    console = [line for line in out.stderr.splitlines() if ":CONSOLE" in line]
    if screenshot is not None:
        shot = [*args, budget, "--window-size=1400,1600", f"--screenshot={screenshot}", url]
        subprocess.run(shot, capture_output=True, timeout=120, check=True)
    return out.stdout, console


def cards(dom: str) -> list[tuple[str, str]]:
    """``(outcome, example id)`` of each rendered example, in order."""
    return re.findall(r'<article class="mb-ex mb-o-(\w+)[^"]*"[^>]*data-example="([^"]+)"', dom)


# --------------------------------------------------------------------------- report.html


def test_report_browses_every_example_filtered_by_the_url_fragment(
    mc_run: Path, browser: Browser, screenshot_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(mc_run)]) == 0
    page = mc_run / "report.html"
    url = page.resolve().as_uri()

    dom, console = dump(browser, url + "#examples?item=m-medqa-seed0&outcome=wrong")
    assert console == [], "\n".join(console)
    assert 'data-state="ready"' in dom and 'data-total="18"' in dom
    shown = cards(dom)
    assert len(shown) == 18 and {o for o, _ in shown} == {"wrong"}
    assert "q7" not in {e for _, e in shown} and "q8" not in {e for _, e in shown}

    dom, console = dump(browser, url + "#examples?outcome=truncated")
    assert console == [] and [e for _, e in cards(dom)] == ["q8"]
    dom, _ = dump(browser, url + "#examples?outcome=error")
    assert [e for _, e in cards(dom)] == ["q7"] and "error: HTTP 500 after 3 attempts" in dom

    # one example by link: its MC gold as options, gold and extracted letter marked
    dom, _ = dump(
        browser,
        url + "#examples?item=m-medqa-seed0&ex=q1",
        screenshot_dir / "report-examples.png",
    )
    (card,) = re.findall(r'<article class="mb-ex[^"]*".*?</article>', dom)
    assert "mb-target" in card
    assert '<li class="mb-gold">B) beta blocker ✓ gold</li>' in card
    assert '<li class="mb-picked">C) calcium ← extracted</li>' in card
    assert "<li>A) aspirin</li>" in card
    assert '{"answer"' not in card  # not a JSON blob
    assert re.search(r'<details class="mb-reasoning"><summary>reasoning \(\d+ characters\)', card)
    assert '<details class="mb-reasoning" open' not in card  # collapsed
    assert "score 0.000 · tokens 40 + 9 (reasoning 30) · 0.25 s · finish stop" in card
    # example text is text: neither markup nor a closing script tag got through
    assert "&lt;/script&gt;&lt;i&gt;x&lt;/i&gt;" in card and "<i>x</i>" not in card

    # free text, case-insensitive, over prompt, completion, reasoning and gold
    dom, _ = dump(browser, url + "#examples?q=THINKING%20ABOUT%2013%20")
    assert [e for _, e in cards(dom)] == ["q13"]
    dom, _ = dump(browser, url + "#examples?q=beta%20blocker&item=m-medqa-seed0")
    assert 'data-total="30"' in dom  # every MC gold has the option
    assert 'data-shown="30"' in dom


def test_report_is_offline_and_the_browser_check_would_see_a_fetch(
    mc_run: Path, browser: Browser, tmp_path: Path
) -> None:
    assert main(["report", str(mc_run)]) == 0
    source = (mc_run / "report.html").read_text()
    assert "default-src 'none'" in source and "connect-src" not in source
    assert not re.search(r'(src|href)="(https?:)?//', source)
    dom, console = dump(browser, (mc_run / "report.html").as_uri() + "#examples")
    assert console == [] and 'data-state="ready"' in dom and 'data-total="34"' in dom
    # the same page with one network request added: chromium blocks and reports it
    leaky = tmp_path / "leaky.html"
    leaky.write_text(source.replace("</body>", '<img src="http://example.invalid/x.png"></body>'))
    _, console = dump(browser, leaky.as_uri())
    assert any("Content Security Policy" in line for line in console), console


def test_examples_past_the_limit_point_at_the_viewer(
    mc_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(examples, "EMBED_LIMIT_BYTES", 500)
    assert main(["report", str(mc_run)]) == 0
    source = (mc_run / "report.html").read_text()
    assert 'id="mb-examples-data"' not in source and 'data-source="none"' in source
    assert "Browse them with <code>modelbench view" in source
    assert "First 5 wrong or errored example(s)" in source  # the summary stays


def test_pages_read_journals_of_every_row_shape(tmp_path: Path) -> None:
    """Rows without the optional fields (older journals, lm-eval loglikelihood) still render."""
    rows = [{"v": 1, "example_id": 3, "metrics": {"acc": 1}, "gold": [1, 2]}]
    run = craft_run(
        tmp_path,
        "old",
        {"m-x-seed0": {"model": "m", "variant": "x", "metric": "acc", "rows": rows}},
    )
    assert main(["report", str(run)]) == 0
    assert 'data-count="1"' in (run / "report.html").read_text()


# --------------------------------------------------------------------------- compare --html


def test_compare_html_shows_changed_examples_worse_first(
    tmp_path: Path, browser: Browser, screenshot_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows_a = mc_rows(12)
    rows_b = json.loads(json.dumps(rows_a))
    for row in rows_b:
        i = int(row["example_id"][1:])
        right = i % 3 == 0
        if i in (0, 3):  # right -> wrong
            right = False
        if i in (1, 5, 10):  # wrong -> right
            right = True
        row.update(
            score=float(right),
            metrics={"accuracy": float(right)},
            extracted="B" if right else "D",
            completion=f"run B says {'B' if right else 'D'}",
        )
    for name, rows in (("run-a", rows_a), ("run-b", rows_b)):
        craft_run(
            tmp_path, name, {"m-medqa-seed0": {"model": "m", "variant": "medqa", "rows": rows}}
        )
    out = tmp_path / "cmp.html"
    assert main(["compare", "run-a", "run-b", "--run-dir", str(tmp_path), "--html", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out} (5 changed examples)" in captured.err
    assert "exact McNemar" in captured.out  # the text table is still printed

    dom, console = dump(browser, out.as_uri() + "#change-0", screenshot_dir / "compare.png")
    assert console == [], "\n".join(console)
    assert "default-src 'none'" in out.read_text()
    assert "5 example(s) changed score: 2 worse, 3 better." in dom
    changed = re.findall(r'data-example="(q\d+)" data-delta="([-\d.]+)"', dom)
    assert changed == [("q0", "-1"), ("q3", "-1"), ("q1", "1"), ("q5", "1"), ("q10", "1")]
    assert "exact McNemar" in dom and 'class="mb-table mb-sortable mb-paired"' in dom
    first = re.search(r'<article class="mb-ex mb-change mb-worse".*?</article>', dom)
    assert first is not None
    card = first.group(0)
    assert "Answer: B </script>" not in card and "Answer: B &lt;/script&gt;" in card  # A's text
    assert "run B says D" in card  # both completions side by side
    assert '<li class="mb-gold">B) beta blocker ✓ gold ← A</li>' in card
    assert '<li class="mb-picked">D) digoxin ← B</li>' in card


# --------------------------------------------------------------------------- --baseline-run


def test_report_of_a_run_gated_against_a_reference_shows_what_changed(
    project: Project, sim: Any, browser: Browser
) -> None:
    project.qa("qa", 60)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 16}}
    )
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (reference,) = project.run_dirs()
    server.reconfigure(accuracy=0.4)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--baseline-run", reference.name
    )
    result.assert_outcomes(failed=1)
    (run,) = [r for r in project.run_dirs() if r != reference]

    dom, console = dump(browser, (run / "report.html").as_uri())
    assert console == [], "\n".join(console)
    assert f"What changed since run {reference.name}" in dom
    deltas = re.findall(r'class="mb-ex mb-change mb-(\w+)"', dom)
    worse = re.search(r"(\d+) example\(s\) changed score: (\d+) worse, 0 better", dom)
    assert worse is not None and int(worse.group(1)) == int(worse.group(2)) == len(deltas) > 10
    assert set(deltas) == {"worse"}


# --------------------------------------------------------------------------- modelbench view


@pytest.fixture
def viewer(mc_run: Path) -> Iterator[str]:
    server = make_server(mc_run, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str, **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_view_serves_examples_read_only_on_loopback(viewer: str) -> None:
    status, body = get(viewer + "api/examples?outcome=wrong&item=m-medqa-seed0&limit=5")
    data = json.loads(body)
    assert status == 200 and data["total"] == 18 and len(data["rows"]) == 5
    _, body = get(viewer + "api/examples?q=thinking+about+13+")
    assert [r["id"] for r in json.loads(body)["rows"]] == ["q13"]
    status, _ = get(viewer + "api/examples", Host="attacker.example:80")
    assert status == 403  # a rebound name: refused
    post = urllib.request.Request(viewer + "api/examples", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(post, timeout=10)
    assert info.value.code == 501
    assert get(viewer + "../run_manifest.json")[0] == 404


def test_view_page_in_browser(viewer: str, browser: Browser) -> None:
    dom, console = dump(browser, viewer + "#examples?outcome=wrong&q=question%201")
    assert console == [], "\n".join(console)
    assert 'data-source="api"' in dom and 'data-total="8"' in dom
    assert {o for o, _ in cards(dom)} == {"wrong"}


def test_view_refuses_a_busy_port(mc_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = make_server(mc_run, 0)
    try:
        port = server.server_address[1]
        assert main(["view", str(mc_run), "--port", str(port)]) == 2
    finally:
        server.server_close()
    assert f"--port {port}: cannot listen on 127.0.0.1" in capsys.readouterr().err


# --------------------------------------------------------------------------- pure parts


def test_gold_view_reads_as_people_read_it() -> None:
    assert gold_view({"answer": "C", "options": ["x", "y", "z"]}) == {
        "options": [["A", "x"], ["B", "y"], ["C", "z"]],
        "answer": "C",
    }
    assert gold_view("42") == {"text": "42"}
    assert gold_view(None) == {"text": ""}
    assert gold_view({"tests": [1]}) == {"text": '{\n  "tests": [\n    1\n  ]\n}'}


@pytest.mark.parametrize(
    "row, score, expected",
    [
        ({"error": "timeout"}, None, "error"),
        ({"finish_reason": "length"}, 0.0, "truncated"),
        ({"finish_reason": "stop"}, 1.0, "right"),
        ({}, 0.5, "wrong"),  # partial credit is not full marks
        ({}, None, "wrong"),
    ],
)
def test_outcomes(row: dict[str, Any], score: float | None, expected: str) -> None:
    assert outcome_of(row, score) == expected
