"""The ``modelbench`` console command: rebuild reports, compare runs, export data, list runs/models.

    modelbench report [RUN]               rebuild report.html, leaderboard.*, results.parquet
    modelbench compare RUN_A RUN_B        paired per-variant deltas (B - A) with p-values, win rates
    modelbench view RUN                   browse every example in a local read-only viewer
    modelbench export RUN --format csv    one normalised row per example (parquet or csv)
    modelbench runs                       run directories with their status
    modelbench models --api-base-url URL  the models an OpenAI-compatible endpoint serves
    modelbench gpus                       this node's GPUs: memory, utilisation, holders, claims

RUN is a run directory, a run id under ``--run-dir``, or ``latest`` (``report`` without
RUN: the latest). ``--run-dir`` defaults to the project's ``runs/``, found from the working
directory up as pytest finds its rootdir (``pytest.ini``, ``pyproject.toml``, ``setup.cfg``,
``tox.ini``, or ``configs/``), so the command works from any directory of the project. Bad
input prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_modelbench.reporting.model import load_run
from pytest_modelbench.running import blocking
from pytest_modelbench.secrets import masked_url
from pytest_modelbench.store.records import ItemStatus
from pytest_modelbench.store.runlog import (
    LATEST,
    PROJECT_DIRS,
    PROJECT_FILES,
    RUNS,
    RunNotFound,
    list_runs,
    project_runs_dir,
    read_run,
    resolve_run,
)

USAGE_ERROR = 2


class CliError(Exception):
    """A user mistake or unreachable resource: printed as one line, exit status 2."""


def _run_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="parent directory of run directories (default: the project's runs/, the project "
        "being the nearest directory up from here with pytest.ini, pyproject.toml, setup.cfg, "
        "tox.ini or configs/)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelbench", description="Reports, comparisons and exports of pytest-modelbench runs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    report = sub.add_parser("report", help="rebuild report.html, leaderboard.* and results.parquet")
    report.add_argument(
        "run",
        metavar="RUN",
        nargs="?",
        default=None,
        help="run directory, run id, or 'latest' (default: the latest)",
    )
    report.add_argument(
        "--examples",
        type=int,
        default=5,
        metavar="N",
        help="wrong/errored examples shown per item (default 5)",
    )
    report.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the files here instead of the run directory",
    )
    _run_dir_arg(report)

    compare = sub.add_parser("compare", help="paired per-variant deltas and win rates of two runs")
    compare.add_argument("run_a", metavar="RUN_A")
    compare.add_argument("run_b", metavar="RUN_B")
    compare.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    compare.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write a page with the table and the examples whose score changed",
    )
    _run_dir_arg(compare)

    view = sub.add_parser("view", help="browse every example of a run (read-only, on 127.0.0.1)")
    view.add_argument("run", metavar="RUN", help="run directory, run id, or 'latest'")
    view.add_argument(
        "--port",
        type=int,
        default=8765,
        metavar="N",
        help="port on 127.0.0.1 (default 8765; 0: any free port)",
    )
    _run_dir_arg(view)

    export = sub.add_parser("export", help="one normalised row per example as parquet or csv")
    export.add_argument("run", metavar="RUN")
    export.add_argument("--format", choices=("parquet", "csv"), required=True)
    export.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="PATH",
        help="output file (default: results.<format> in the run directory)",
    )
    _run_dir_arg(export)

    runs = sub.add_parser("runs", help="list run directories with their status")
    runs.add_argument("--format", choices=("text", "json"), default="text")
    _run_dir_arg(runs)

    models = sub.add_parser("models", help="list the models an OpenAI-compatible endpoint serves")
    models.add_argument(
        "--api-base-url", required=True, metavar="URL", help="e.g. http://localhost:8000/v1"
    )
    models.add_argument(
        "--api-key-var",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="environment variable holding the API key (default OPENAI_API_KEY)",
    )
    models.add_argument("--timeout", type=float, default=10.0, metavar="SEC")
    _gpus_parser(sub)
    return parser


# --------------------------------------------------------------------------- commands


def _gpus_parser(sub: Any) -> None:
    gpus = sub.add_parser(
        "gpus", help="this node's GPUs: memory, utilisation, who holds them, modelbench's claims"
    )
    gpus.add_argument(
        "--gpus",
        default=None,
        metavar="LIST",
        help="only these GPUs (as pytest's --gpus takes them: 0,1 or GPU-<uuid>)",
    )


def _runs_dir(args: argparse.Namespace) -> Path | None:
    """``--run-dir`` as given, else the project's ``runs/`` (the project found from the working
    directory up, as pytest finds its rootdir), else None: no project here."""
    if args.run_dir is not None:
        return Path(args.run_dir)
    return project_runs_dir(Path.cwd())


def _no_project() -> CliError:
    markers = ", ".join([*PROJECT_FILES, *(f"{name}/" for name in PROJECT_DIRS)])
    return CliError(
        f"no project in {Path.cwd()} or above (no directory with any of {markers}), so no "
        f"{RUNS}/ to read: run this inside the project you run pytest in"
    )


def _run(name: str, args: argparse.Namespace) -> Path:
    parent = _runs_dir(args)
    if parent is None:
        if name == LATEST:
            raise _no_project()
        parent = Path.cwd() / RUNS  # a path names the run on its own
    try:
        return resolve_run(name, parent)
    except RunNotFound as exc:
        raise CliError(str(exc)) from None


def cmd_report(args: argparse.Namespace) -> int:
    # lazily: each command loads only what it needs (CLI start-up)
    from pytest_modelbench.reporting.html import write_report
    from pytest_modelbench.reporting.leaderboard import write_leaderboards
    from pytest_modelbench.reporting.rows import PARQUET_NAME, ParquetUnavailable, write_parquet

    if args.examples < 0:
        raise CliError(f"--examples: expected a whole number >= 0, got {args.examples}")
    directory = _run(args.run or LATEST, args)
    if args.run is None:
        print(f"no RUN given: reporting the latest run, {directory.name} ({directory})")
    run = load_run(directory)
    out = args.output or run.directory
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        write_report(run, out / "report.html", examples=args.examples),
        *write_leaderboards(run, out),
    ]
    try:
        write_parquet(run, out / PARQUET_NAME)
        paths.append(out / PARQUET_NAME)
    except ParquetUnavailable as exc:
        print(f"modelbench: {PARQUET_NAME} skipped: {exc}", file=sys.stderr)
    print(f"{run.run_id}: {len(run.items)} items, status {run.status()}")
    for path in paths:
        print(f"  wrote {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    # lazily: each command loads only what it needs (CLI start-up)
    from pytest_modelbench.reporting.compare import compare_runs, render_text

    run_a = load_run(_run(args.run_a, args))
    run_b = load_run(_run(args.run_b, args))
    for run in (run_a, run_b):
        if not run.items:
            raise CliError(f"{run.directory}: the run has no items yet (nothing to compare)")
    comparison = compare_runs(run_a, run_b)
    if args.html is not None:
        # lazily: only --html needs the page builders
        from pytest_modelbench.reporting.changes import compare_changes
        from pytest_modelbench.reporting.compare import model_pairs
        from pytest_modelbench.reporting.html import render_compare_page
        from pytest_modelbench.store.files import atomic_write_text

        changes = compare_changes(run_a, run_b, model_pairs(run_a, run_b)[0])
        try:
            atomic_write_text(args.html, render_compare_page(comparison, changes))
        except OSError as exc:
            raise CliError(f"--html {args.html}: cannot write: {exc.strerror or exc}") from None
        print(f"wrote {args.html} ({len(changes)} changed examples)", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(comparison.as_dict(), indent=2))
    else:
        sys.stdout.write(render_text(comparison, markdown=args.format == "markdown"))
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    # lazily: each command loads only what it needs (CLI start-up)
    from pytest_modelbench.reporting.view import make_server

    if not 0 <= args.port <= 65535:
        raise CliError(f"--port: expected 0-65535, got {args.port}")
    directory = _run(args.run, args)
    try:
        server = make_server(directory, args.port, hint=args.run)
    except OSError as exc:
        raise CliError(
            f"--port {args.port}: cannot listen on 127.0.0.1: {exc.strerror or exc} "
            "(pick another with --port N, or --port 0 for any free one)"
        ) from None
    port = server.server_address[1]
    print(f"modelbench view: {directory} at http://127.0.0.1:{port}/ (read-only; Ctrl-C stops)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    # lazily: each command loads only what it needs (CLI start-up)
    from pytest_modelbench.reporting.rows import ParquetUnavailable, write_csv, write_parquet

    run = load_run(_run(args.run, args))
    path = args.output or run.directory / f"results.{args.format}"
    try:
        count = write_parquet(run, path) if args.format == "parquet" else write_csv(run, path)
    except ParquetUnavailable as exc:
        raise CliError(f"export --format parquet: {exc} (or use --format csv)") from None
    except OSError as exc:
        raise CliError(f"--output {path}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {count} rows to {path}")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    parent = _runs_dir(args)
    if parent is None:
        raise _no_project()
    if args.run_dir is not None and not parent.is_dir():
        raise CliError(
            f"--run-dir {args.run_dir}: no such directory (run pytest first, or pass --run-dir DIR)"
        )
    rows = []
    for path in list_runs(parent):
        run = read_run(path, metadata=False)
        manifest = run.manifest
        rows.append(
            {
                "run_id": path.name,
                "run_name": manifest.get("run_name", ""),
                "created_at": manifest.get("created_at", ""),
                "updated_at": manifest.get("updated_at", ""),
                "items": len(run.items),
                "finished": run.count(ItemStatus.FINISHED),
                "errors": run.count(ItemStatus.ERROR),
                "gate_failures": run.gate_failures(),
                "status": run.status().value,
                "path": str(path),
            }
        )
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no runs in {parent} yet (pytest writes them there)")
        return 0
    table = [["run", "name", "created", "items", "finished", "errors", "gate fails", "status"]]
    table += [
        [
            r["run_id"],
            str(r["run_name"]),
            str(r["created_at"]),
            str(r["items"]),
            str(r["finished"]),
            str(r["errors"]),
            str(r["gate_failures"]),
            r["status"],
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for n, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    return 0


def fetch_models(base_url: str, api_key: str | None, timeout: float) -> list[dict[str, Any]]:
    """``GET <base_url>/models`` of an OpenAI-compatible server; CliError naming the fix."""
    if not base_url.startswith(("http://", "https://")):
        raise CliError(f"--api-base-url: expected http(s)://host:port/v1, got {base_url!r}")
    masked = masked_url(base_url)
    if masked is not None:  # never sent, never echoed: the same rule as the plugin's
        raise CliError(
            f"--api-base-url {masked} carries credentials, which are not sent; put the key "
            "in an environment variable and name it with --api-key-var"
        )
    url = base_url.rstrip("/") + "/models"
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:  # through HTTP(S)_PROXY when set: the user's server may sit behind one
        reply = blocking.request(url, headers=headers, timeout_s=timeout, direct=False)
    except blocking.Unreachable as exc:
        raise CliError(
            f"cannot reach {url}: {exc.reason} (is the server running? check --api-base-url)"
        ) from None
    if reply.status >= 400:
        hint = {
            401: "set the key's variable with --api-key-var VAR",
            403: "the key is not allowed to list models",
            404: "is the path right? OpenAI-compatible servers serve /v1/models "
            f"(try --api-base-url {base_url.rstrip('/')}/v1)",
        }.get(reply.status, "check the server log")
        raise CliError(f"GET {url}: HTTP {reply.status} {reply.reason}; {hint}")
    body = reply.body
    try:
        data = json.loads(body)
        models = data["data"]
        if not isinstance(models, list):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise CliError(
            f'GET {url}: not an OpenAI-compatible models list (expected {{"data": [...]}})'
        ) from None
    return [m for m in models if isinstance(m, dict)]


def cmd_models(args: argparse.Namespace) -> int:
    models = fetch_models(args.api_base_url, os.environ.get(args.api_key_var), args.timeout)
    if not models:
        print(f"{args.api_base_url}: serves no models")
        return 0
    for model in models:
        extra = f"  (max_model_len {model['max_model_len']})" if model.get("max_model_len") else ""
        print(f"{model.get('id')}{extra}")
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    """One row per GPU; then a line for each whose memory looks left over. Reads only: it
    never stops a process."""
    # lazily: GPU discovery loads only for this command
    import warnings

    from pytest_modelbench.serving.base import ServingError
    from pytest_modelbench.serving.gpu_claims import lock_notes
    from pytest_modelbench.serving.gpu_discovery import discover_gpus
    from pytest_modelbench.serving.gpus import GpuSpecError
    from pytest_modelbench.serving.holders import gib

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            inventory = discover_gpus(args.gpus)
    except GpuSpecError as exc:
        raise CliError(str(exc)) from None
    except ServingError as exc:
        raise CliError(str(exc)) from None
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    if not inventory.gpus:
        print(f"no GPUs (from {inventory.source})")
        return 0
    notes = lock_notes()
    rows = [("GPU", "memory used / total", "util", "held by", "modelbench")]
    leftovers: list[str] = []
    for gpu in inventory.gpus:
        used = gib(gpu.memory_used_mib) if gpu.memory_used_mib is not None else "?"
        total = gib(gpu.memory_total_mib) if gpu.memory_total_mib is not None else "?"
        util = f"{gpu.utilisation}%" if gpu.utilisation is not None else "?"
        holders = "; ".join(p.describe(memory=True) for p in gpu.processes) or "-"
        note = notes.get(gpu.id) or (notes.get(gpu.uuid) if gpu.uuid else None)
        rows.append((gpu.id, f"{used} / {total}", util, holders, note.describe() if note else "-"))
        leftover = gpu.leftover()
        if leftover:
            leftovers.append(f"GPU {gpu.id}: {leftover}")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]))
    print(f"(from {inventory.source})")
    for line in leftovers:
        print(line)
    return 0


COMMANDS = {
    "report": cmd_report,
    "compare": cmd_compare,
    "view": cmd_view,
    "export": cmd_export,
    "runs": cmd_runs,
    "models": cmd_models,
    "gpus": cmd_gpus,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        print(f"modelbench {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
