"""Size of ``report.html`` and its load time in headless Chromium, for 1k / 20k / 100k examples.

Each size is a crafted run of one multiple-choice item (``medqa``-shaped rows: a prompt
of about 900 characters, a 4-option gold, a completion of about 350 characters, and a
reasoning of about 1,200 characters on every other example), its text drawn at random
from a 3,000-word vocabulary (deflate compresses it about as well as English: 3-4x).

For each size it prints: examples, report size, build time (``render_report``), whether the
examples were embedded, and Chromium's time to show the first page of examples (wall time
of ``chromium --headless --dump-dom`` until the page says it is ready, minus the same for an
see chromium_ready). Past the embedding limit the report keeps the summary
and ``modelbench view`` is timed instead (first query: reading the store; a filtered one).

    python perf/report_size.py [--sizes 1000,20000,100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from pytest_modelbench.reporting.html import render_report
from pytest_modelbench.reporting.model import load_run
from pytest_modelbench.reporting.view import make_server

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run")


def words(rng: random.Random, vocabulary: list[str], chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(vocabulary)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def craft(parent: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice("etaoinshrdlucmfwypvbgkq") for _ in range(rng.randint(2, 9)))
        for _ in range(3000)
    ]
    run = parent / f"run-{n}"
    item = run / "m-medqa-seed0"
    item.mkdir(parents=True)
    instruction = (
        "The following is a multiple choice question about medicine. Think step by "
        "step, then answer with 'Answer: X' where X is the letter of the best option."
    )
    right = 0
    with (item / "results.jsonl").open("w") as handle:
        for i in range(n):
            options = [words(rng, vocabulary, 40) for _ in range(4)]
            gold, picked = rng.choice("ABCD"), rng.choice("ABCD")
            right += gold == picked
            row = {
                "v": 1,
                "example_id": f"q{i}",
                "rollout": 0,
                "prompt": f"{instruction}\n\n{words(rng, vocabulary, 700)}\n\n"
                + "\n".join(f"{'ABCD'[k]}) {o}" for k, o in enumerate(options)),
                "completion": words(rng, vocabulary, 330) + f"\nAnswer: {picked}",
                "reasoning": words(rng, vocabulary, 1200) if i % 2 else "",
                "gold": {"answer": gold, "options": options},
                "extracted": picked,
                "metrics": {"accuracy": float(gold == picked)},
                "score": float(gold == picked),
                "error": None,
                "finish_reason": "stop",
                "tokens": {"prompt": 220, "completion": 380},
                "latency_s": round(rng.uniform(0.2, 4.0), 3),
            }
            handle.write(json.dumps(row) + "\n")
    value = right / n
    (item / "summary.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "status": "finished",
                "primary_metric": "accuracy",
                "fingerprint": "fp",
                "errors": 0,
                "duration_s": 60.0,
                "metrics": {
                    "accuracy": {
                        "value": value,
                        "n": n,
                        "stderr": 0.01,
                        "ci_low": value - 0.01,
                        "ci_high": value + 0.01,
                    }
                },
                "tokens": {"prompt": 220 * n, "completion": 380 * n},
            }
        )
    )
    (item / "metadata.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "item_id": "m-medqa-seed0",
                "seed": 0,
                "model": {"name": "m"},
                "variant": {"env": "medqa", "id": "medqa", "module": "medqa"},
            }
        )
    )
    (run / "run_manifest.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "run_id": run.name,
                "created_at": "2026-01-01T00:00:00+0000",
                "updated_at": "2026-01-01T00:00:00+0000",
                "items": {
                    "m-medqa-seed0": {
                        "path": "m-medqa-seed0",
                        "status": "finished",
                        "model": "m",
                        "env": "medqa",
                        "variant": "medqa",
                        "seed": 0,
                        "fingerprint": "fp",
                    }
                },
            }
        )
    )
    return run


def chromium_ready(chromium: str, url: str, profile: Path) -> tuple[float, str]:
    """``(seconds from navigation start until the first page of examples is shown, state)``:
    Chromium opens the page with a DevTools port; we poll the page's ``data-ready-ms``
    (``performance.now()`` when it finished rendering) over the DevTools protocol."""
    shutil.rmtree(profile, ignore_errors=True)
    process = subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return asyncio.run(_poll_ready(profile / "DevToolsActivePort"))
    finally:
        process.terminate()
        process.wait(timeout=30)


async def _poll_ready(port_file: Path) -> tuple[float, str]:
    import aiohttp  # the project's HTTP client; it speaks WebSocket too

    deadline = time.monotonic() + 300
    while not port_file.exists() or not port_file.read_text().strip():
        await asyncio.sleep(0.05)
    port = port_file.read_text().split()[0]
    expression = """(function () {
      if (location.protocol !== 'file:' || document.readyState !== 'complete') { return null; }
      var r = document.getElementById('mb-examples');
      if (!r || r.getAttribute('data-source') === 'none') {
        return ['summary', performance.getEntriesByType('navigation')[0].loadEventEnd];
      }
      var ready = r.getAttribute('data-ready-ms');
      return ready === null ? null : [r.getAttribute('data-state'), Number(ready)];
    })()"""
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                pages = [
                    t
                    for t in await response.json()
                    if t.get("type") == "page" and str(t.get("url")).startswith("file:")
                ]
            if pages:
                break
            await asyncio.sleep(0.05)
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                await ws.send_json(
                    {
                        "id": n,
                        "method": "Runtime.evaluate",
                        "params": {"expression": expression, "returnByValue": True},
                    }
                )
                while True:
                    message = await ws.receive_json()
                    if message.get("id") == n:
                        break
                value = message.get("result", {}).get("result", {}).get("value")
                if value:
                    return float(value[1]) / 1000, str(value[0])
                await asyncio.sleep(0.05)
    raise TimeoutError("the page did not get ready in 300 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,20000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    chromium = os.environ.get("MODELBENCH_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        sys.exit("needs chromium: apt-get install -y chromium (or MODELBENCH_CHROMIUM=PATH)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        profile = root / "profile"
        print("| examples | journal MB | report.html MB | build s | examples | Chromium load s |")
        print("|---:|---:|---:|---:|---|---:|")
        for n in (int(s) for s in args.sizes.split(",")):
            run_dir = craft(root, n)
            journal = (run_dir / "m-medqa-seed0" / "results.jsonl").stat().st_size
            start = time.perf_counter()
            page = render_report(load_run(run_dir))
            build = time.perf_counter() - start
            path = run_dir / "report.html"
            path.write_text(page)
            embedded = 'id="mb-examples-data"' in page
            loads = [chromium_ready(chromium, path.as_uri(), profile) for _ in range(args.repeat)]
            seconds = statistics.median(s for s, _ in loads)
            states = {state for _, state in loads}
            shown = f"{seconds:.2f}" + ("" if states <= {"ready", "summary"} else f" {states}")
            how = "embedded" if embedded else "summary + `modelbench view`"
            print(
                f"| {n:,} | {journal / 1e6:.1f} | {len(page.encode()) / 1e6:.2f} | "
                f"{build:.1f} | {how} | {shown} |"
            )
            if not embedded:
                print(view_timing(run_dir))
    return 0


def view_timing(run_dir: Path) -> str:
    server = make_server(run_dir, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        times = []
        for query in ("api/examples?limit=50", "api/examples?outcome=wrong&q=answer%3A+b&limit=50"):
            start = time.perf_counter()
            with urllib.request.urlopen(base + query, timeout=600) as response:
                response.read()
            times.append(time.perf_counter() - start)
    finally:
        server.shutdown()
        server.server_close()
    return (
        f"  modelbench view: first query (reads the store) {times[0]:.1f} s, "
        f"then a filtered text search {times[1]:.2f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
