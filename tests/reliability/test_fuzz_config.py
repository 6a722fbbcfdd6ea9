"""Property tests: any config file or override is accepted, or refused with one clear line.

Hypothesis mutates valid ``models.yaml``, ``envs/*.yaml``, ``baselines/*.yaml`` and
job files (wrong types, unknown keys, bad and huge numbers, deleted keys) and their
bytes (non-UTF-8, YAML tags such as ``!!python/object``, deep nesting, self-referring
aliases, truncation), and draws command-line overrides. The loaders, the options
parser and the planner must either accept the input or raise
:class:`ModelbenchUsageError` with a one-line message naming the file or flag: never
any other exception. A few real pytest runs show what users see: exit status 4 and
one ``ERROR:`` line, no traceback.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from pytest_modelbench.backends.registry import resolve_builtin
from pytest_modelbench.config.loading import (
    load_baseline_file,
    load_config_set,
    load_env_file,
    load_job_file,
    load_models_file,
)
from pytest_modelbench.config.options import OPTIONS, RunOptions
from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.planning.item import Plan
from pytest_modelbench.planning.plan import build_plan
from tests.conftest import Project, one_usage_error, with_qa

EXAMPLES = int(os.environ.get("MODELBENCH_FUZZ_EXAMPLES", "300"))
"""Examples per property (raise it for a longer hunt: MODELBENCH_FUZZ_EXAMPLES=5000)."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

URL = "http://127.0.0.1:9/v1"
MODELS: dict[str, Any] = {
    "models": {
        "alpha": {
            "model": "sim-model",
            "api_base_url": URL,
            "api_key_var": "OPENAI_API_KEY",
            "max_concurrent": 4,
            "timeout": 30,
            "max_retries": 2,
            "sampling_args": {"temperature": 0.5, "max_tokens": 64},
        },
        "served": {
            "model": "org/model",
            "serve": {"engine": "vllm", "gpus": 1, "args": {"dtype": "bfloat16", "seed": 42}},
        },
    }
}
ENV: list[dict[str, Any]] = [
    {
        "id": "qa",
        "module": "jsonl",
        "num_examples": 5,
        "env_args": {"path": "qa.jsonl"},
        "seeds": [0, 1],
        "metric": "exact_match",
        "cost": 1.5,
    },
    {
        "id": "sweep",
        "module": "jsonl",
        "env_args": {"path": "qa.jsonl"},
        "matrix": {"sampling_args.temperature": [0.0, 0.7], "shots": [1, 2]},
        "matrix_id_format": "{base}-t{temperature}-s{shots}",
    },
]
BASELINE: dict[str, Any] = {
    "qa": {"metric": "exact_match", "value": 0.7, "margin": 0.02, "n": 100, "source": "run 7"},
    "sweep-t0.0-s1": {"min": 0.5, "date": "2024-05-01"},
    "sweep-t0.7-s2": {"run": "run-20240501-000000", "alpha": 0.05},
}
JOB: dict[str, Any] = {
    "name": "nightly",
    "output_dir": "runs/nightly",
    "models": {"beta": {"model": "sim-model", "api_base_url": [URL, URL]}},
    "jobs": [{"model": "alpha", "env": ["qa", "sweep"]}, {"model": "beta", "env": ["qa"]}],
}
KNOWN_KEYS = sorted(
    {
        "model", "api_base_url", "api_key_var", "api", "max_concurrent", "timeout",
        "max_retries", "retry_backoff", "sampling_args", "serve", "checkpoints", "solutions",
        "engine", "gpus", "args", "startup_timeout", "id", "module", "num_examples",
        "rollouts_per_example", "env_args", "matrix", "matrix_id_format", "seeds", "metric",
        "cost", "value", "min", "margin", "n", "stderr", "run", "source", "alpha", "run_id",
        "date", "revision", "name", "output_dir", "models", "jobs", "env",
    }
)  # fmt: skip

# -- values --------------------------------------------------------------------------------

ODD_TEXT = [
    "", " ", "all", "-1", "1e400", "0x10", "yes", "~", "null", "2024-01-01", "a b", "x/y",
    "q[1]", "{base}", "{base:d}", "{}", "{base!z}", "{0}", "é", "\u0000", "\t", "a" * 300,
    "sampling_args.", "lm_eval:", "verifiers:x", "OPENAI_API_KEY", "sk-secret", "http://",
    "https://h/v1", "localhost:8000",
]  # fmt: skip
ODD_NUMBERS = [
    0, -1, -2, 1, 2**31, 2**63, -(2**63), 2**64, 10**30, 2**300, 0.0, -0.0, 0.5, 1e-300, 1e308,
    float("inf"), float("-inf"), float("nan"), True, False,
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(ODD_TEXT),
    st.sampled_from(ODD_NUMBERS),
)
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=10), st.integers(-3, 3))
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=10,
)


def _slots(
    doc: Any, path: tuple[Any, ...] = (), seen: frozenset[int] = frozenset()
) -> Iterator[tuple[Any, ...]]:
    """Every place in a document: the root, each mapping value and each list item."""
    yield path
    if id(doc) in seen:  # a shared subtree that contains itself: stop here
        return
    seen = seen | {id(doc)}
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _slots(value, (*path, key), seen)
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _slots(value, (*path, index), seen)


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


@st.composite
def mutated(draw: st.DrawFn, valid: Any) -> Any:
    """A valid document with one to three changes: replaced values, unknown or lost keys..."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_slots(doc))))
        target = _get(doc, path)
        change = draw(
            st.sampled_from(["value", "number", "text", "add_key", "drop_key", "wrap", "alias"])
        )
        if change == "value":
            doc = _set(doc, path, draw(values))
        elif change == "number":
            doc = _set(doc, path, draw(st.sampled_from(ODD_NUMBERS) | st.integers() | st.floats()))
        elif change == "text":
            doc = _set(doc, path, draw(st.sampled_from(ODD_TEXT) | st.text(max_size=20)))
        elif change == "add_key" and isinstance(target, dict):
            # a misspelling of a real key, or anything else
            key = draw(keys)
            if isinstance(key, str) and key and draw(st.booleans()):
                key = key[:-1] + key[-1] * 2
            target[key] = draw(values)
        elif change == "drop_key" and isinstance(target, dict) and target:
            del target[draw(st.sampled_from(sorted(target, key=str)))]
        elif change == "wrap":
            doc = _set(doc, path, draw(st.sampled_from([[target], {"x": target}])))
        elif change == "alias" and path:
            # the same object in two places: a YAML alias (a loop, when it is an ancestor)
            other = draw(st.sampled_from(list(_slots(doc))))
            doc = _set(doc, path, _get(doc, other))
    return doc


TEXT_INSERTS = [
    b"!!python/object:os.system\n",
    b" !!python/object/apply:os.system ['true']",
    b"!!python/name:os.system",
    b" !!binary AAAA",
    b" !custom x",
    b" !!set {a, b}",
    b" !!timestamp 2024-01-01",
    b"\xff\xfe",
    b"\xe9t\xe9",
    b"\x00",
    b"\t",
    b"&a [*a]",
    b"*nowhere",
    b"---\n",
    b"...\n",
    b": :",
    b"- ",
    b"? [a, b]\n: 1\n",
    b"%YAML 1.1\n",
    b"\xef\xbb\xbf",
    b"9" * 5000,
    b"0x" + b"f" * 2000,
    b"1.0e+999",
    b".nan",
    b"-.inf",
]


def _nested(depth: int) -> bytes:
    return b"x: " + b"[" * depth + b"]" * depth + b"\n"


LAUGHS = b"".join(
    [b'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]\n']
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n".encode()
        for i in range(8)
    ]
)
"""Nine levels of ten aliases each: a billion strings once expanded."""


@st.composite
def file_bytes(draw: st.DrawFn, valid: Any) -> bytes:
    """The YAML of a valid or mutated document, sometimes damaged at the byte level."""
    doc = draw(st.one_of(st.just(valid), mutated(valid)))
    try:
        data = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()
    except yaml.YAMLError:
        data = b"{}"
    damage = draw(
        st.sampled_from(["none", "insert", "replace", "truncate", "latin1", "deep", "laughs"])
    )
    at = draw(st.integers(0, len(data)))
    if damage == "insert":
        data = data[:at] + draw(st.sampled_from(TEXT_INSERTS) | st.binary(max_size=8)) + data[at:]
    elif damage == "replace":
        data = data[:at] + draw(st.sampled_from(TEXT_INSERTS)) + data[at + 4 :]
    elif damage == "truncate":
        data = data[:at]
    elif damage == "latin1":
        data = data.decode("utf-8").replace("a", "é").encode("latin-1", "replace")
    elif damage == "deep":
        data += _nested(draw(st.sampled_from([40, 60, 200])))
    elif damage == "laughs":
        data = LAUGHS + data
    if damage != "none":
        event(f"bytes: {damage}")
    return data


# -- the property ----------------------------------------------------------------------------


def accepted_or_refused(call: Callable[[], object], *names: str) -> object:
    """Run ``call``: its result, or None after a one-line usage error naming one of ``names``."""
    try:
        result = call()
    except ModelbenchUsageError as exc:
        message = str(exc)
        assert message and "\n" not in message and len(message) < 1500, message
        assert any(name in message for name in names), (names, message)
        event("refused")
        return None
    event("accepted")
    return result


def check_module(module: str, where: str) -> None:
    """What the plugin does with a module name: resolve it, or a usage error naming ``where``."""
    if resolve_builtin(module) is None:
        raise ModelbenchUsageError(f"{where}: unknown module {module!r}")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config directory whose files each example overwrites."""
    base = tmp_path_factory.mktemp("fuzz")
    for sub in ("configs/envs", "configs/baselines"):
        (base / sub).mkdir(parents=True)
    return base


def _write(root: Path, models: Any = MODELS, env: Any = ENV, job: Any = JOB) -> None:
    configs = root / "configs"
    (configs / "models.yaml").write_bytes(
        models if isinstance(models, bytes) else yaml.safe_dump(models).encode()
    )
    (configs / "envs" / "qa.yaml").write_bytes(
        env if isinstance(env, bytes) else yaml.safe_dump(env).encode()
    )
    (configs / "job-x.yaml").write_bytes(
        job if isinstance(job, bytes) else yaml.safe_dump(job).encode()
    )


class FakeConfig:
    """What ``RunOptions.from_config`` reads of a pytest config: options, ini values, rootdir."""

    def __init__(self, root: Path, options: Mapping[str, Any], ini: Mapping[str, str]) -> None:
        self.rootpath = root
        self._options = options
        self._ini = ini

    def getoption(self, name: str, default: Any = None) -> Any:
        return self._options.get(name, default)

    def getini(self, name: str) -> Any:
        value = self._ini.get(name)
        if name == "modelbench_configs":
            return value or "configs"
        if value is not None and name.removeprefix("modelbench_") in FLAGS:
            if value.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"invalid truth value {value!r}")  # as pytest's bool ini
            return value.strip().lower() in ("true", "1", "yes")
        return value


FLAGS = {option.dest for option in OPTIONS if option.kind == "flag"}
PLAN_NAMES = ("--", "models.yaml", "qa.yaml", "job-x.yaml", "configs", "nothing to run")


def _plan(root: Path, options: RunOptions) -> Plan:
    return build_plan(load_config_set(root / "configs"), options, check_module)


def test_valid_files_are_accepted(root: Path) -> None:
    """The property's baseline: the unmutated documents load and plan."""
    _write(root)
    (root / "configs" / "baselines" / "alpha.yaml").write_text(yaml.safe_dump(BASELINE))
    assert len(load_baseline_file(root / "configs" / "baselines" / "alpha.yaml")) == 3
    options = RunOptions.from_config(FakeConfig(root, {"mb_model": "alpha"}, {}))  # type: ignore[arg-type]
    assert len(_plan(root, options).items) == 2 + 4  # qa × 2 seeds, sweep × 4 variants


@FUZZ
@given(data=file_bytes(MODELS))
def test_models_file(root: Path, data: bytes) -> None:
    path = root / "configs" / "models.yaml"
    _write(root, models=data)
    models = accepted_or_refused(lambda: load_models_file(path), "models.yaml")
    if models is not None:
        options = RunOptions.from_config(FakeConfig(root, {"mb_model": "all"}, {}))  # type: ignore[arg-type]
        accepted_or_refused(lambda: _plan(root, options), *PLAN_NAMES)


@FUZZ
@given(data=file_bytes(ENV))
def test_env_file(root: Path, data: bytes) -> None:
    path = root / "configs" / "envs" / "qa.yaml"
    _write(root, env=data)
    env = accepted_or_refused(lambda: load_env_file(path), "qa.yaml")
    if env is not None:
        options = RunOptions.from_config(FakeConfig(root, {"mb_model": "alpha"}, {}))  # type: ignore[arg-type]
        accepted_or_refused(lambda: _plan(root, options), *PLAN_NAMES)


@FUZZ
@given(data=file_bytes(BASELINE))
def test_baseline_file(root: Path, data: bytes) -> None:
    path = root / "configs" / "baselines" / "alpha.yaml"
    path.write_bytes(data)
    accepted_or_refused(lambda: load_baseline_file(path), "alpha.yaml")


@FUZZ
@given(data=file_bytes(JOB))
def test_job_file(root: Path, data: bytes) -> None:
    path = root / "configs" / "job-x.yaml"
    _write(root, job=data)
    job = accepted_or_refused(lambda: load_job_file(path), "job-x.yaml", "--mb-config")
    if job is not None:
        options = RunOptions.from_config(FakeConfig(root, {"mb_mb_config": str(path)}, {}))  # type: ignore[arg-type]
        accepted_or_refused(lambda: _plan(root, options), *PLAN_NAMES)


# -- command-line overrides ------------------------------------------------------------------

json_text = st.one_of(
    values.map(lambda v: json.dumps(v)),
    st.dictionaries(st.text(max_size=8), values, max_size=4).map(json.dumps),
    st.text(max_size=30),
    st.sampled_from(
        [
            "{temperature: 0.5}",
            "[1, 2]",
            "{}",
            '{"a": NaN}',
            '{"a": 1e999}',
            '{"a": ' + "1" * 5000 + "}",
            '{"a": ' + "1" * 400 + "}",
            "[" * 100_000 + "]" * 100_000,
            '{"a": ' * 60 + "1" + "}" * 60,
            '{"a": ' * 2000 + "1" + "}" * 2000,
            '{"a": 1}garbage',
            '{"a": "\\ud800"}',
        ]
    ),
)
numberish = st.one_of(
    st.integers().map(str),
    st.floats().map(str),
    st.text(max_size=10),
    st.sampled_from(
        [
            "0",
            "-1",
            "1",
            "nan",
            "inf",
            "-inf",
            "1e-400",
            "1e400",
            "0x10",
            "1_000",
            "٣",
            " 7 ",
            "9" * 5000,
        ]
    ),
)
names = st.one_of(
    st.sampled_from(["alpha", "served", "all", "smoke", "org/model", "alpha,served", "", ","]),
    st.text(max_size=20),
    st.sampled_from(["a" * 300, "org/" + "b" * 256, "x\udcff", "nul\x00", "lm_eval:a/b", "jsonl"]),
)
OVERRIDES = {
    "mb_env_args": json_text,
    "mb_sampling_args": json_text,
    "mb_seeds": st.one_of(
        st.lists(st.integers(), max_size=4).map(lambda s: ",".join(map(str, s))),
        numberish,
        st.sampled_from(["1,two", " 1 , 2", ",", "0," * 50, str(2**64)]),
    ),
    "mb_num_examples": numberish,
    "mb_max_concurrent": numberish,
    "mb_request_timeout": numberish,
    "mb_request_timeout_alias": numberish,
    "mb_error_budget": numberish,
    "mb_gpus": st.one_of(
        st.sampled_from(["0", "0,1,3", "none", "", "GPU-abc", "0,", "a", "-1", "0,0", "GPU-"]),
        st.text(max_size=10),
    ),
    "mb_model": names,
    "mb_env": names,
    "mb_api_base_url": st.one_of(st.sampled_from([URL, "localhost:8000", "http://"]), st.text()),
    "mb_correction": st.sampled_from(["none", "holm", "bonferroni", ""]),
}
INI = st.dictionaries(
    st.sampled_from(
        [
            "modelbench_force",
            "modelbench_require_baseline",
            "modelbench_seeds",
            "modelbench_num_examples",
            "modelbench_sampling_args",
        ]
    ),
    st.sampled_from(["true", "false", "maybe", "1", "0,1", "{}", "x"]),
    max_size=2,
)


@FUZZ
@given(
    chosen=st.fixed_dictionaries({}, optional=OVERRIDES),
    ini=INI,
)
def test_command_line_overrides(root: Path, chosen: dict[str, Any], ini: dict[str, str]) -> None:
    _write(root)
    chosen.setdefault("mb_model", "alpha")
    flags = ("--", "modelbench_")
    options = accepted_or_refused(
        lambda: RunOptions.from_config(FakeConfig(root, chosen, ini)),  # type: ignore[arg-type]
        *flags,
    )
    if isinstance(options, RunOptions):
        # --env lm_eval:<a task YAML path>: see test_env_option_with_a_task_path
        assume(not any(":" in env and "/" in env for env in options.envs))
        # the planner may name the option by the value the user gave it
        given_values = [str(value) for value in chosen.values() if str(value)]
        accepted_or_refused(lambda: _plan(root, options), *PLAN_NAMES, *given_values)


# -- what users see: real runs -------------------------------------------------------------


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return with_qa(Project(pytester))


def one_error_line(project: Project, *args: str) -> str:
    return one_usage_error(project, "--collect-only", *args)


@pytest.mark.parametrize(
    ("where", "content", "expected"),
    [
        ("envs/qa.yaml", b"- id: qa\n  module: jsonl\n  metric: \xe9\n", "line 3: not UTF-8"),
        ("models.yaml", b"models: !!python/object/apply:os.system ['true']\n", "not allowed"),
        ("models.yaml", b"models:\n  alpha: " + b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        ("envs/qa.yaml", LAUGHS + b"id: qa\nmodule: jsonl\n", "expands to more than"),
        ("envs/qa.yaml", b"- &v {id: qa, module: jsonl, env_args: {v: *v}}\n", "alias"),
    ],
    ids=["non-utf8", "python-tag", "deep", "billion-laughs", "recursive-alias"],
)
def test_broken_file_is_one_error_line(
    project: Project, where: str, content: bytes, expected: str
) -> None:
    (project.root / "configs" / where).write_bytes(content)
    line = one_error_line(project, "--model", "alpha")
    assert line.startswith(f"ERROR: configs/{where}:"), line
    assert expected in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--env-args", '{"a": ' * 3000 + "1" + "}" * 3000), "ERROR: --env-args: "),
        (("--sampling-args", '{"seed": ' + "9" * 5000 + "}"), "ERROR: --sampling-args: "),
        (("--mb-timeout", "nan"), "ERROR: --mb-timeout: expected a finite number, got 'nan'"),
        (("--gpus", "0,x"), "ERROR: --gpus='0,x': 'x' is not a GPU index"),
        (("--api-base-url", "localhost:8000/v1"), "ERROR: --api-base-url: expected an http://"),
        (("--env", "lm_eval:"), "ERROR: --env 'lm_eval:': no name after 'lm_eval:'"),
    ],
    ids=[
        "deep-json",
        "huge-int-json",
        "nan-timeout",
        "bad-gpus",
        "url-without-scheme",
        "empty-task",
    ],
)
def test_bad_override_is_one_error_line(
    project: Project, args: tuple[str, ...], expected: str
) -> None:
    line = one_error_line(project, "--model", "alpha", *args)
    assert line.startswith(expected), line


def test_env_option_with_a_task_path_names_the_item_after_the_file(project: Project) -> None:
    (project.root / "task.yaml").write_text("task: mine\n")
    result = project.pytester.runpytest(
        "benchmarks/", "--collect-only", "--model", "alpha", "--env", "lm_eval:./task.yaml"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*test_benchmark?alpha-lm_eval-task-seed0?*"])
