"""Command-line/ini options and their parsed, validated form (:class:`RunOptions`)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pytest

from pytest_modelbench.config.limits import MAX_CONCURRENT
from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean, is_text, shown_value

Kind = Literal["str", "int", "float", "flag"]


class Option(NamedTuple):
    """One option, declared once: the flag, its ``modelbench_<dest>`` ini name, kind and help.

    The records read at plugin load (this, :class:`Aliases`, :class:`ReportOptions`) are named
    tuples: a frozen dataclass writes and compiles its methods when its class is made, about
    0.7 ms each, in every pytest session of the environment."""

    flag: str
    dest: str  # argparse dest is mb_<dest>; the ini name is modelbench_<dest>
    help: str
    kind: Kind = "str"
    choices: tuple[str, ...] = ()  # checked when parsed (see _as_choice)
    metavar: str = ""  # default: DEST

    @property
    def ini(self) -> str:
        return f"modelbench_{self.dest}"

    @property
    def alias(self) -> str | None:
        """The short spelling (``--model`` for ``--mb-model``), added only while no one owns it."""
        return "--" + self.flag.removeprefix("--mb-") if self.dest in ALIASED else None


# options that also get a short alias (--model, --env, ...) when no other plugin or initial
# conftest has registered that name (see add_aliases)
ALIASED = frozenset(
    {
        "model",
        "api_base_url",
        "env",
        "gpus",
        "seeds",
        "force",
        "run_id",
        "run_dir",
        "run_name",
        "restart",
        "num_examples",
        "env_args",
        "sampling_args",
        "max_concurrent",
        "update_baselines",
        "baseline_run",
        "require_baseline",
        "no_auto_resume",
    }
)
PROGRESS_MODES = ("auto", "tty", "lines", "off")
DIST_MODES = ("modelbench", "off")
CORRECTIONS = ("none", "holm")
TRACKER_NAMES = ("wandb", "mlflow")

OPTIONS: tuple[Option, ...] = (
    Option("--mb-model", "model", "models to run: NAME[,NAME], 'all', an HF id/path, or 'smoke'"),
    Option(
        "--mb-api-base-url", "api_base_url", "OpenAI-compatible endpoint for the selected models"
    ),
    Option("--mb-env", "env", "restrict to these environments or variant ids (comma list)"),
    Option("--mb-seeds", "seeds", "override seeds, e.g. 0,1,2"),
    Option("--mb-num-examples", "num_examples", "cap examples per variant (quick runs)", "int"),
    Option(
        "--mb-config", "mb_config", "run exactly the jobs of this job file (configs/job-*.yaml)"
    ),
    Option(
        "--mb-run-dir",
        "run_dir",
        "parent directory of run directories, relative to the rootdir (default: runs)",
    ),
    Option("--mb-run-id", "run_id", "run directory name (default: <run name>-<timestamp>)"),
    Option(
        "--mb-run-name",
        "run_name",
        "run name recorded in the manifest (default: the job name or 'run')",
    ),
    Option(
        "--mb-force", "force", "recompute selected items even if finished results exist", "flag"
    ),
    Option(
        "--mb-no-auto-resume",
        "no_auto_resume",
        "start a new run directory instead of continuing the latest",
        "flag",
    ),
    Option("--mb-restart", "restart", "seed a new run from finished items of RUN_ID"),
    Option("--mb-env-args", "env_args", "JSON object merged into every variant's env_args"),
    Option(
        "--mb-sampling-args", "sampling_args", "JSON object merged into every item's sampling args"
    ),
    Option("--mb-max-concurrent", "max_concurrent", "requests in flight per item", "int"),
    Option("--mb-timeout", "request_timeout", "per-request timeout in seconds", "float"),
    Option(
        "--mb-update-baselines", "update_baselines", "write this run's scores as baselines", "flag"
    ),
    Option(
        "--mb-replace-baselines",
        "replace_baselines",
        "let --update-baselines replace a baseline measured on more examples",
        "flag",
    ),
    Option(
        "--mb-baseline-run",
        "baseline_run",
        "paired comparison against this run's per-example results",
    ),
    Option(
        "--mb-baseline-model",
        "baseline_model",
        "the model to pair with in the reference run (default: this item's model, or the "
        "reference run's only model)",
    ),
    Option(
        "--mb-allow-unfinished-baseline",
        "allow_unfinished_baseline",
        "pair with an unfinished reference item on the examples it has",
        "flag",
    ),
    Option(
        "--mb-require-same-setup",
        "require_same_setup",
        "fail an item whose baseline was measured under another setup (engine version, GPUs, "
        "dtype, token budget...)",
        "flag",
    ),
    Option(
        "--mb-update-failed-baselines",
        "update_failed_baselines",
        "let --update-baselines write the scores of items that failed their gate",
        "flag",
    ),
    Option(
        "--mb-stop-early",
        "stop_early",
        "stop a gated item once its verdict is certain (an anytime-valid rule; off by default: "
        "leaderboards want full runs)",
        "flag",
    ),
    Option(
        "--mb-require-baseline",
        "require_baseline",
        "items without a baseline, or whose gate cannot decide, fail",
        "flag",
    ),
    Option("--mb-gpus", "gpus", "GPUs to use, e.g. 0,1,3 (default: visible and free ones)"),
    Option(
        "--mb-error-budget",
        "error_budget",
        "fraction of examples allowed to error (default 0.05)",
        "float",
    ),
    Option(
        "--mb-correction",
        "correction",
        "multiple-comparison correction across gated items: none|holm",
        choices=CORRECTIONS,
    ),
    Option(
        "--mb-allow-weak-sandbox",
        "allow_weak_sandbox",
        "run humaneval/mbpp even where the Python audit hook is the only isolation for "
        "generated code (no bubblewrap, no user namespaces): not a security boundary, the code "
        "can read your files and the benchmark's answers, reach the network and keep state "
        "between runs",
        "flag",
    ),
    Option(
        "--mb-dist",
        "dist",
        "xdist scheduling of benchmark items: modelbench (keep each worker on its "
        "model, longest items first; default with --model) or off (xdist's --dist)",
        choices=DIST_MODES,
    ),
    Option(
        "--mb-progress",
        "progress",
        "live progress: auto (status line on a terminal, else periodic lines), tty, lines, off",
        choices=PROGRESS_MODES,
        metavar="PROGRESS",
    ),
    Option(
        "--mb-progress-interval",
        "progress_interval",
        "seconds between progress updates (default: 0.5 on a terminal, 15 otherwise)",
        "float",
        metavar="INTERVAL",
    ),
    Option(
        "--mb-report-examples",
        "report_examples",
        "wrong/errored examples shown per item in HTML reports (default 5)",
        "int",
        metavar="EXAMPLES",
    ),
    Option(
        "--mb-tracker",
        "trackers",
        "log each item's score to experiment trackers: wandb, mlflow (comma list)",
        metavar="TRACKER",
    ),
    Option(
        "--mb-tracker-project",
        "tracker_project",
        "W&B project / MLflow experiment for --mb-tracker (default: modelbench)",
        metavar="PROJECT",
    ),
    Option(
        "--mb-no-reports",
        "no_reports",
        "do not write report.html, leaderboard.* and results.parquet into the run directory",
        "flag",
    ),
)
_BY_DEST = {option.dest: option for option in OPTIONS}

INI_CONFIG_DIR = "modelbench_configs"


GROUP = "modelbench"
ALIASES_KEY = pytest.StashKey["Aliases"]()


class Aliases(NamedTuple):
    """Which short aliases this pytest process registered, and which others had taken."""

    added: frozenset[str]  # dests whose short alias is ours (--model)
    taken: tuple[str, ...]  # short aliases another plugin or conftest owns, e.g. ("--env",)

    def warning(self) -> str | None:
        """The one line a benchmark session prints when an alias is someone else's."""
        if not self.taken:
            return None
        spelled = ", ".join(
            f"{option.alias} (use {option.flag})"
            for option in OPTIONS
            if option.alias in self.taken
        )
        return f"modelbench: another plugin or conftest.py owns {spelled}"


def _argument(option: Option) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dest": f"mb_{option.dest}", "help": option.help}
    if option.kind == "flag":
        kwargs.update(action="store_true", default=None)
    else:
        metavar = option.metavar or (
            option.dest.split("_")[-1]
            if option.dest.startswith(("progress", "report"))
            else option.dest
        )
        kwargs.update(action="store", default=None, metavar=metavar.upper())
    return kwargs


def add_options(parser: pytest.Parser) -> None:
    """Register options in a 'modelbench' group, each also settable as ``modelbench_<dest>`` ini.

    Every option is ``--mb-<name>``: no other plugin owns those. The short aliases users type
    (``--model``) come later, from :func:`add_aliases`, only where they are still free:
    argparse refuses a second registration, which would stop every pytest session.
    """
    group = parser.getgroup(GROUP, "LLM benchmarks as tests")
    for option in OPTIONS:
        group.addoption(option.flag, **_argument(option))
        ini_type: Literal["bool", "string"] = "bool" if option.kind == "flag" else "string"
        parser.addini(option.ini, f"default for {option.flag}", type=ini_type, default=None)
    parser.addini(INI_CONFIG_DIR, "configuration directory (default: configs)", default="configs")


def _registered_names(parser: pytest.Parser) -> set[str]:
    """Every option string registered so far (pytest's Parser has no public listing)."""
    # private attributes: pytest has no public API that lists the registered options
    groups = [parser._anonymous, *parser._groups]
    return {name for group in groups for argument in group.options for name in argument.names()}


def add_aliases(parser: pytest.Parser) -> Aliases:
    """Add each short alias (``--model`` for ``--mb-model``) that no one registered before.

    Called once every plugin and initial conftest has added its options, just before pytest
    parses the command line, so a neighbour's ``--model`` or ``--env`` stays theirs.
    """
    taken_names = _registered_names(parser)
    group = parser.getgroup(GROUP)
    added: set[str] = set()
    taken: list[str] = []
    for option in OPTIONS:
        if option.alias is None:
            continue
        if option.alias in taken_names:
            taken.append(option.alias)
            continue
        kwargs = _argument(option)
        kwargs["help"] = f"short for {option.flag}"
        group.addoption(option.alias, **kwargs)
        added.add(option.dest)
    return Aliases(frozenset(added), tuple(taken))


def without_free_aliases(parser: pytest.Parser, args: list[str]) -> list[str]:
    """``args`` less the short aliases no one has registered yet, with their values: what
    pytest's early parse should see, before :func:`add_aliases` registers them (else the
    value of ``--run-id ..`` would be taken for a directory to load conftests from)."""
    registered = _registered_names(parser)
    takes_value = {
        option.alias: option.kind != "flag"
        for option in OPTIONS
        if option.alias is not None and option.alias not in registered
    }
    kept: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--":
            kept.extend(args[i:])
            break
        elif arg in takes_value:
            skip = takes_value[arg]
        elif arg.split("=", 1)[0] not in takes_value:
            kept.append(arg)
    return kept


def flag_name(config: pytest.Config, dest: str) -> str:
    """The spelling of an option to show the user: its short alias where it is ours."""
    option = _BY_DEST[dest]
    stash = getattr(config, "stash", None)  # a stand-in config without one: the --mb- name
    aliases = stash.get(ALIASES_KEY, None) if stash is not None else None
    if option.alias is not None and aliases is not None and dest in aliases.added:
        return option.alias
    return option.flag


def _raw(config: pytest.Config, dest: str) -> Any:
    value = config.getoption(f"mb_{dest}", default=None)
    if value is None:
        try:
            value = config.getini(f"modelbench_{dest}")
        except ValueError as exc:  # a bool ini that is not one
            raise ModelbenchUsageError(
                f"modelbench_{dest} (ini): {exc}; use true or false"
            ) from None
        if value in ("", []):
            value = None
    if isinstance(value, str) and not is_text(value):
        raise ModelbenchUsageError(
            f"{flag_name(config, dest)}: {shown_value(value)} contains a NUL or a byte that is not UTF-8"
        )
    return value


_MAX_INT = 2**63 - 1


def _as_number(
    flag: str,
    value: Any,
    kind: type[int] | type[float],
    minimum: float,
    maximum: float | None = None,
) -> Any:
    if value is None:
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ModelbenchUsageError(
            f"{flag}: expected {'an integer' if kind is int else 'a number'}, "
            f"got {shown_value(value)}"
        ) from None
    if kind is float and not math.isfinite(number):
        raise ModelbenchUsageError(f"{flag}: expected a finite number, got {shown_value(value)}")
    if number < minimum:
        raise ModelbenchUsageError(f"{flag}: must be >= {minimum}, got {shown_value(value)}")
    if maximum is not None and number > maximum:
        raise ModelbenchUsageError(f"{flag}: must be at most {maximum:g}, got {shown_value(value)}")
    if kind is int and number > _MAX_INT:
        raise ModelbenchUsageError(f"{flag}: must be < 2**63, got {shown_value(value)}")
    return number


def _as_json_object(flag: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ModelbenchUsageError(
            f"{flag}: invalid JSON {shown_value(value)}: {exc.msg} at column {exc.colno} "
            f"(expected an object, e.g. '{{\"temperature\": 0.5}}'; quote keys with double quotes)"
        ) from None
    except (ValueError, RecursionError) as exc:  # digits past Python's limit, deep nesting
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ModelbenchUsageError(
            f"{flag}: unusable JSON {shown_value(value)}: {reason}"
        ) from None
    # lazily: the pydantic schema loads only when this option is given (pytest start-up)
    from pytest_modelbench.config.loading import check_shape

    check_shape(parsed, flag)
    if not isinstance(parsed, dict):
        raise ModelbenchUsageError(
            f"{flag}: expected a JSON object like '{{\"key\": 1}}', got {shown_value(value)}"
        )
    return parsed


def _as_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return tuple(part.strip() for part in str(value).split(",") if part.strip())


def _as_seeds(flag: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    wrong = f"{flag}: expected comma-separated integers like 0,1,2, got {shown_value(value)}"
    try:
        seeds = tuple(int(part) for part in _as_list(value))
    except ValueError:
        raise ModelbenchUsageError(wrong) from None
    if not seeds or any(abs(seed) > _MAX_INT for seed in seeds):
        raise ModelbenchUsageError(wrong)
    return seeds


_EMPTY_HINT = {
    "model": "give a model name ({flag} NAME[,NAME]), {flag} all or {flag} smoke",
    "env": "give environment names ({flag} gsm8k,medqa), or leave {flag} out to run every environment",
}


def _as_names(flag: str, dest: str, value: Any) -> tuple[str, ...]:
    """A comma list of names (``--model``, ``--env``): printable, each a usable path too.

    An empty list given explicitly (``--env "$UNSET_VARIABLE"``) is a mistake, not "no filter".
    """
    names = _as_list(value)
    if value is not None and not names:
        raise ModelbenchUsageError(
            f"{flag}: empty value {shown_value(value)}; {_EMPTY_HINT[dest].format(flag=flag)}"
        )
    for name in names:
        if not name.isprintable():
            raise ModelbenchUsageError(f"{flag}: {shown_value(name)} contains a control character")
        if any(len(part.encode()) > 255 for part in name.split("/")):
            raise ModelbenchUsageError(
                f"{flag}: {shown_value(name)} is not a name, HF id or path "
                "(a path component is longer than 255 bytes)"
            )
    return names


# what the run store keeps unchanged as one path component (store.runstore.safe_component)
_RUN_ID = re.compile(r"[A-Za-z0-9_+=-]([A-Za-z0-9._+=-]{0,118}[A-Za-z0-9_+=-])?")


def _as_run_id(flag: str, value: Any) -> str | None:
    """``--run-id``: one directory name under the run directory, never a path out of it."""
    if value is None:
        return None
    if not _RUN_ID.fullmatch(str(value)):
        raise ModelbenchUsageError(
            f"{flag}: {shown_value(value)} is not a run directory name; use letters, digits "
            "and ._+=- (one path component, not starting or ending with '.', at most 120 "
            f"characters), e.g. {flag} nightly-2026-01-20"
        )
    return str(value)


def _as_url(flag: str, value: Any) -> str | None:
    if value is None:
        return None
    # lazily: the pydantic schema loads only when this option is given (pytest start-up)
    from pytest_modelbench.config.schema import check_url

    try:
        return check_url(str(value))
    except ValueError as exc:
        raise ModelbenchUsageError(f"{flag}: {exc}, got {shown_value(value)}") from None


def _as_gpus(flag: str, value: Any) -> str | None:
    """``--gpus`` checked now (it is used only when a worker starts a server)."""
    if value is None:
        return None
    # lazily: the pydantic schema loads only when this option is given (pytest start-up)
    from pytest_modelbench.config.gpulist import GpuSpecError, parse_gpu_list

    try:
        parse_gpu_list(str(value), flag)
    except GpuSpecError as exc:
        raise ModelbenchUsageError(str(exc)) from None
    return str(value)


@dataclass(frozen=True)
class RunOptions:
    """The user's modelbench options, parsed once in ``pytest_configure``."""

    config_dir: Path
    models: tuple[str, ...]
    api_base_url: str | None
    envs: tuple[str, ...]
    seeds: tuple[int, ...] | None
    num_examples: int | None
    job_file: Path | None
    run_dir: Path
    run_id: str | None
    run_name: str | None
    force: bool
    auto_resume: bool
    restart: str | None
    env_args: dict[str, Any]
    sampling_args: dict[str, Any]
    max_concurrent: int | None
    request_timeout: float | None
    update_baselines: bool
    replace_baselines: bool  # --mb-replace-baselines: --update-baselines may replace a larger-n one
    baseline_run: str | None
    require_baseline: bool
    gpus: str | None
    error_budget: float
    correction: str
    dist: str | None  # --mb-dist: None decides by the run (see pytest_modelbench.scheduling)
    allow_weak_sandbox: bool = False  # --mb-allow-weak-sandbox
    baseline_model: str | None = None  # --mb-baseline-model
    allow_unfinished_baseline: bool = False  # --mb-allow-unfinished-baseline
    update_failed_baselines: bool = False  # --mb-update-failed-baselines
    stop_early: bool = False  # --mb-stop-early
    model_flag: str = "--model"  # how messages spell it: --mb-model where --model is not ours
    require_same_setup: bool = False  # --mb-require-same-setup

    @property
    def selects_items(self) -> bool:
        """Whether these options ask for benchmark items (``--model`` or ``--mb-config``)."""
        return bool(self.models or self.job_file)

    @classmethod
    def from_config(cls, config: pytest.Config) -> RunOptions:
        root = config.rootpath

        def flag(dest: str) -> str:
            return flag_name(config, dest)

        config_dir = Path(str(config.getini(INI_CONFIG_DIR) or "configs"))
        job = _raw(config, "mb_config")
        correction = str(_raw(config, "correction") or "none")
        if correction not in CORRECTIONS:
            raise ModelbenchUsageError(
                f"--mb-correction: expected 'none' or 'holm', got {shown_value(correction)}"
            )
        budget = _as_number("--mb-error-budget", _raw(config, "error_budget"), float, 0.0)
        if budget is not None and budget > 1:
            raise ModelbenchUsageError(
                f"--mb-error-budget: expected a fraction in [0, 1], got {budget:g}"
            )
        return cls(
            config_dir=config_dir if config_dir.is_absolute() else root / config_dir,
            model_flag=flag("model"),
            models=_as_names(flag("model"), "model", _raw(config, "model")),
            api_base_url=_as_url(flag("api_base_url"), _raw(config, "api_base_url")),
            envs=_as_names(flag("env"), "env", _raw(config, "env")),
            seeds=_as_seeds(flag("seeds"), _raw(config, "seeds")),
            num_examples=_as_number(flag("num_examples"), _raw(config, "num_examples"), int, 1),
            job_file=Path(job) if job else None,
            run_dir=Path(str(_raw(config, "run_dir") or "runs")),
            run_id=_as_run_id(flag("run_id"), _raw(config, "run_id")),
            run_name=_raw(config, "run_name"),
            force=bool(_raw(config, "force")),
            auto_resume=not bool(_raw(config, "no_auto_resume")),
            restart=_raw(config, "restart"),
            env_args=_as_json_object(flag("env_args"), _raw(config, "env_args")),
            sampling_args=_as_json_object(flag("sampling_args"), _raw(config, "sampling_args")),
            max_concurrent=_as_number(
                flag("max_concurrent"), _raw(config, "max_concurrent"), int, 1, MAX_CONCURRENT
            ),
            request_timeout=_as_number(
                flag("request_timeout"), _raw(config, "request_timeout"), float, 0.001
            ),
            update_baselines=bool(_raw(config, "update_baselines")),
            replace_baselines=bool(_raw(config, "replace_baselines")),
            baseline_run=_raw(config, "baseline_run"),
            require_baseline=bool(_raw(config, "require_baseline")),
            gpus=_as_gpus(flag("gpus"), _raw(config, "gpus")),
            error_budget=0.05 if budget is None else budget,
            correction=correction,
            dist=_as_dist(_raw(config, "dist")),
            allow_weak_sandbox=bool(_raw(config, "allow_weak_sandbox")),
            baseline_model=_raw(config, "baseline_model"),
            allow_unfinished_baseline=bool(_raw(config, "allow_unfinished_baseline")),
            update_failed_baselines=bool(_raw(config, "update_failed_baselines")),
            stop_early=bool(_raw(config, "stop_early")),
            require_same_setup=bool(_raw(config, "require_same_setup")),
        )


def _as_dist(value: Any) -> str | None:
    if value is None:
        return None
    mode = str(value).strip().lower()
    if mode not in DIST_MODES:
        raise ModelbenchUsageError(
            f"--mb-dist: expected 'modelbench' (keep each xdist worker on its model) or 'off' "
            f"(use xdist's --dist), got {value!r}"
        )
    return mode


class ReportOptions(NamedTuple):
    """Live progress and run-directory report options, parsed once in ``pytest_configure``."""

    progress: str
    progress_interval: float | None
    report_examples: int
    write_reports: bool
    trackers: tuple[str, ...] = ()  # --mb-tracker, known names
    tracker_project: str = "modelbench"

    @classmethod
    def from_config(cls, config: pytest.Config) -> ReportOptions:
        progress = str(_raw(config, "progress") or "auto").strip().lower()
        if progress not in PROGRESS_MODES:
            raise ModelbenchUsageError(
                f"--mb-progress: unknown mode {progress!r}; use one of {', '.join(PROGRESS_MODES)}"
            )
        interval_raw = _raw(config, "progress_interval")
        interval: float | None = None
        if interval_raw is not None:
            try:
                interval = float(interval_raw)
            except ValueError:
                interval = -1.0
            if not interval > 0:
                raise ModelbenchUsageError(
                    "--mb-progress-interval: expected a positive number of seconds, "
                    f"got {interval_raw!r}"
                )
        examples_raw = _raw(config, "report_examples")
        try:
            examples = 5 if examples_raw is None else int(examples_raw)
        except ValueError:
            examples = -1
        if examples < 0:
            raise ModelbenchUsageError(
                f"--mb-report-examples: expected a whole number >= 0, got {examples_raw!r}"
            )
        trackers = tuple(name.lower() for name in _as_list(_raw(config, "trackers")))
        for name in trackers:
            if name not in TRACKER_NAMES:
                raise ModelbenchUsageError(
                    f"--mb-tracker: unknown tracker {name!r}{did_you_mean(name, TRACKER_NAMES)}; "
                    f"use {' or '.join(TRACKER_NAMES)} (comma-separated for both)"
                )
        project = str(_raw(config, "tracker_project") or "modelbench").strip() or "modelbench"
        return cls(
            progress,
            interval,
            examples,
            not bool(_raw(config, "no_reports")),
            tuple(dict.fromkeys(trackers)),
            project,
        )
