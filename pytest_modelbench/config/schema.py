"""Schemas of the configuration files (validated with pydantic, unknown keys rejected)."""

from __future__ import annotations

import datetime
import re
import shlex
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pytest_modelbench.config.limits import MAX_CONCURRENT
from pytest_modelbench.config.modules import missing_name
from pytest_modelbench.errors import shown_value
from pytest_modelbench.secrets import masked_argv, masked_url

JSONDict = dict[str, Any]
Name = Annotated[str, StringConstraints(max_length=200)]
"""A name that ends up in item ids and messages (model, variant id, metric...)."""
TOO_CONCURRENT = (
    f"at most {MAX_CONCURRENT} requests in flight (no engine batches more; vLLM's "
    "max_num_seqs is 256-1024)"
)


TOKEN_BUDGET_KEYS = ("max_tokens", "max_completion_tokens")
"""Two names of one reply budget; a server sent both uses one of them (vLLM: ``max_tokens``)."""


def sampling_over(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top``'s sampling args over ``base``'s; a token budget in ``top``, under either name,
    replaces ``base``'s under both, so one budget is sent and it is ``top``'s."""
    kept = dict(base)
    if any(key in top for key in TOKEN_BUDGET_KEYS):
        for key in TOKEN_BUDGET_KEYS:
            kept.pop(key, None)
    return {**kept, **top}


class _Strict(BaseModel):
    # numbers must be finite: a timeout, margin or cost of .inf or .nan is a typo, not a setting
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


QUIET_ERROR = "modelbench_quiet"
"""The pydantic error type of a message that must not echo the value it refuses (a URL with a
password, a header that may hold a token): :func:`~.loading.format_validation_error` shows
the message alone."""


def check_url(value: str) -> str:
    """An endpoint URL must say its scheme (``http://host:port/v1``)."""
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise ValueError("expected an http:// or https:// URL like http://localhost:8000/v1")
    return value


def url_credentials_error(value: str, fix: str) -> str | None:
    """Why a URL that carries credentials (``http://user:KEY@host/v1``) is refused, showing it
    masked, or None for a URL without any. They would not be sent (the key goes in a
    ``Authorization: Bearer`` header) and the URL is written to the run store and printed."""
    masked = masked_url(value)
    if masked is None:
        return None
    return (
        f"credentials in the URL ({masked}) are not sent and would be written to the run "
        f"store; remove them and {fix}"
    )


_MODEL_KEY_FIX = (
    "put the key in an environment variable named by api_key_var (sent as "
    "'Authorization: Bearer <key>')"
)

REQUEST_EXTRAS = ("extra_body", "extra_headers")
"""Sampling-arg keys that are not request fields, read as the OpenAI SDK reads them."""
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def split_request_args(args: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the request body's fields, the HTTP headers) of sampling args, as the OpenAI SDK sends
    its ``extra_body`` (merged into the body, winning over the other fields) and
    ``extra_headers`` (sent as headers, never written to the run store). ValueError names what
    is malformed, never a header's value."""
    if "extra_body" not in args and "extra_headers" not in args:
        return dict(args), {}
    body = {k: v for k, v in args.items() if k not in REQUEST_EXTRAS}
    extra = args.get("extra_body")
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise ValueError(
                f"extra_body must be a mapping of request fields merged into the body, like "
                f"{{chat_template_kwargs: {{enable_thinking: false}}}}, got {shown_value(extra)}"
            )
        body.update(extra)
    return body, request_headers(args.get("extra_headers"))


def request_headers(value: Any) -> dict[str, str]:
    """``extra_headers`` checked: header names mapped to string values (None: no headers)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"extra_headers must be a mapping of header name to value, like "
            f"{{X-Title: my-eval}} (got {type(value).__name__})"
        )
    headers: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValueError(f"extra_headers: {name!r} is not an HTTP header name")
        if name.lower() in _FRAMING:
            raise ValueError(f"extra_headers: {name!r} is set by the HTTP client; remove it")
        if not isinstance(text, str) or any(c in text for c in "\r\n\x00"):
            raise ValueError(
                f"extra_headers: the value of {name!r} must be a string on one line "
                "(quote numbers and booleans)"
            )
        headers[name] = text
    return headers


def merge_headers(*layers: Mapping[str, str]) -> dict[str, str]:
    """Headers of later layers win over earlier ones, names compared without case."""
    merged: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.items():
            for old in [k for k in merged if k.lower() == name.lower()]:
                del merged[old]
            merged[name] = value
    return merged


def _quiet_request_extras(value: dict[str, Any]) -> dict[str, Any]:
    """``sampling_args`` whose ``extra_body``/``extra_headers`` are malformed are refused
    without echoing them (a header may hold a token)."""
    try:
        split_request_args(value)
    except ValueError as exc:
        raise PydanticCustomError(QUIET_ERROR, str(exc)) from None
    return value


class ServeSpec(_Strict):
    """How modelbench serves a model itself (when ``api_base_url`` is absent)."""

    engine: str = Field(
        default="vllm",
        description="vllm, sglang or command (checked against serving's engines at start-up)",
    )
    gpus: int = Field(default=1, ge=0, description="tensor-parallel size of one server")
    args: JSONDict = Field(default_factory=dict)
    startup_timeout: float = Field(default=900.0, gt=0)
    command: list[str] | None = Field(
        default=None,
        description="engine: command: the server's argv, with {model}, {port}, {host}, {gpus}",
    )
    health: str | None = Field(
        default=None, description="engine: command: the path that answers 200 once it serves"
    )

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_name(cls, value: object) -> object:
        if not isinstance(value, str):
            raise ValueError(
                "write an engine name: vllm, sglang or command (or leave serve.engine out for vllm)"
            )
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _argv_list(cls, value: object) -> object:
        if isinstance(value, str):  # a shell line: which words are one argument is unclear
            try:
                parts = shlex.split(value)
            except ValueError:  # an unclosed quote
                parts = value.split()
            parts = masked_argv(parts or ["server"])[:8] + (["…"] if len(parts) > 8 else [])
            shown = ", ".join(f'"{p}"' if any(c in p for c in "{}:*, ") else p for p in parts)
            raise PydanticCustomError(  # quiet: the hint shows the words, credentials masked
                QUIET_ERROR, f"write the command as a YAML list of its words, e.g. [{shown}]"
            )
        return value


class ModelSpec(_Strict):
    """One entry of ``models.yaml``."""

    model: str | None = None
    api_base_url: str | list[str] | None = None
    api_key_var: str | None = None
    api: Literal["chat", "completions"] = "chat"
    max_concurrent: int = Field(
        default=32,
        ge=1,
        description="requests in flight per item (per server of the model)",
    )
    timeout: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=6, ge=0)
    retry_backoff: float = Field(default=0.5, ge=0, description="first retry delay in seconds")
    sampling_args: JSONDict = Field(default_factory=dict)
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="token budget per reply that wins over the environments' max_tokens "
        "(a reasoning model's thinking counts against it); --sampling-args still wins",
    )
    serve: ServeSpec | None = None
    checkpoints: str | None = None
    solutions: str | list[str] | dict[str, str | list[str]] | None = Field(
        default=None,
        description="pre-generated completions (JSONL globs) scored instead of querying a server; "
        "a mapping gives globs per environment or variant id",
    )
    # sampling_args.extra_headers, kept apart: sent with every request, never dumped (so never
    # written to metadata.json, fingerprints or reports)
    _headers: dict[str, str] = PrivateAttr(default_factory=dict)

    @field_validator("max_concurrent")
    @classmethod
    def _servable(cls, value: int) -> int:
        if value > MAX_CONCURRENT:
            raise ValueError(TOO_CONCURRENT)
        return value

    @field_validator("api_base_url")
    @classmethod
    def _urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list):
            if not value:
                raise ValueError("api_base_url is an empty list; give at least one URL")
            urls = value
        else:
            urls = [] if value is None else [value]
        for url in urls:
            check_url(url)
            refused = url_credentials_error(url, _MODEL_KEY_FIX)
            if refused is not None:
                raise PydanticCustomError(QUIET_ERROR, refused)
        return value

    @field_validator("sampling_args")
    @classmethod
    def _request_extras(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _quiet_request_extras(value)

    def model_post_init(self, context: Any, /) -> None:  # noqa: ARG002 - pydantic passes it
        """``extra_body`` merged into the sampling args, ``extra_headers`` kept apart."""
        if any(key in self.sampling_args for key in REQUEST_EXTRAS):
            body, self._headers = split_request_args(self.sampling_args)
            self.__dict__["sampling_args"] = body  # frozen: set once, while being built

    @property
    def extra_headers(self) -> dict[str, str]:
        """The HTTP headers every request of this model carries (``sampling_args.extra_headers``)."""
        return dict(self._headers)

    def with_sampling_args(self, args: Mapping[str, Any]) -> ModelSpec:
        """A copy with ``args`` (``--sampling-args``) merged over its sampling args and headers;
        ValueError for a malformed ``extra_body``/``extra_headers``."""
        body, headers = split_request_args(args)
        copy = self.model_copy(update={"sampling_args": sampling_over(self.sampling_args, body)})
        copy._headers = merge_headers(self._headers, headers)
        return copy

    @field_validator("solutions")
    @classmethod
    def _solutions_not_empty(
        cls, value: str | list[str] | dict[str, str | list[str]] | None
    ) -> str | list[str] | dict[str, str | list[str]] | None:
        if value is not None and not value:
            raise ValueError("solutions is empty; give a glob like 'solutions/*.jsonl'")
        return value

    @field_validator("api_key_var")
    @classmethod
    def _looks_like_var_name(cls, value: str | None) -> str | None:
        if value is not None and (not value.replace("_", "").isalnum() or value[0].isdigit()):
            raise ValueError(
                "api_key_var must be the NAME of an environment variable (e.g. OPENAI_API_KEY), "
                "not the key itself"
            )
        return value


class ModelsFile(_Strict):
    models: dict[Name, ModelSpec] = Field(default_factory=dict)


class EnvVariantSpec(_Strict):
    """One variant in ``envs/<name>.yaml`` before matrix expansion."""

    id: Name
    module: Annotated[str, StringConstraints(max_length=4096)]
    num_examples: int = Field(default=-1, ge=-1)
    rollouts_per_example: int = Field(default=1, ge=1)
    env_args: JSONDict = Field(default_factory=dict)
    sampling_args: JSONDict = Field(default_factory=dict)
    matrix: dict[Name, list[Any]] | None = None
    matrix_id_format: Name | None = None
    seeds: list[int] | None = None
    metric: Name | None = None
    cost: float | None = Field(default=None, ge=0, description="relative cost hint")

    @field_validator("id")
    @classmethod
    def _id_is_simple(cls, value: str) -> str:
        if (
            not value
            or not value.isprintable()
            or any(ch.isspace() for ch in value)
            or "/" in value
            or "[" in value
        ):
            raise ValueError(f"id must be non-empty, with no spaces, '/' or '['; got {value!r}")
        return value

    @field_validator("module")
    @classmethod
    def _prefixed_module_names_something(cls, value: str) -> str:
        """``lm_eval:`` alone is refused here, where the message can name the file."""
        missing = missing_name(value)
        if missing is not None:
            raise ValueError(f"module {value!r}: {missing}")
        return value

    @field_validator("sampling_args")
    @classmethod
    def _request_extras(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _quiet_request_extras(value)

    @field_validator("num_examples")
    @classmethod
    def _some_examples(cls, value: int) -> int:
        if value == 0:
            raise ValueError("num_examples must be -1 (all) or at least 1, got 0")
        return value

    @model_validator(mode="after")
    def _matrix_pairs(self) -> EnvVariantSpec:
        if self.matrix_id_format is not None and not self.matrix:
            raise ValueError("matrix_id_format is set but matrix is missing")
        return self


class BaselineEntrySpec(_Strict):
    """One environment's baseline in ``baselines/<model>.yaml``."""

    metric: str | None = None
    value: float | None = Field(default=None, allow_inf_nan=False)
    min: float | None = Field(default=None, allow_inf_nan=False)
    margin: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    n: int | None = Field(default=None, ge=1)
    stderr: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    run: str | None = None
    source: str | None = None
    alpha: float | None = Field(default=None, gt=0, lt=1)
    # written by --update-baselines, informational
    run_id: str | None = None
    date: str | None = None
    revision: str | None = None
    setup: JSONDict | None = None  # what produced the value (store.setup.SetupRecord)

    @field_validator("date", mode="before")
    @classmethod
    def _date_as_text(cls, value: Any) -> Any:
        """``date: 2024-05-01`` unquoted is a YAML date; keep it as the text it was."""
        if isinstance(value, (datetime.date, datetime.datetime)):
            return value.isoformat()
        return value

    @field_validator("run")
    @classmethod
    def _a_run_id(cls, value: str | None) -> str | None:
        """A run id under the runs directory (``runs/<id>``), never a path out of it."""
        if value is not None and (
            not value.strip() or value in (".", "..") or "/" in value or "\\" in value
        ):
            raise ValueError(
                "expected a run id (a directory name under the runs directory, e.g. "
                "'run-20250101-120000'), not a path"
            )
        return value

    @model_validator(mode="after")
    def _has_a_rule(self) -> BaselineEntrySpec:
        if self.value is None and self.min is None and self.run is None:
            raise ValueError("needs one of 'value' (with optional 'margin'), 'min' or 'run'")
        if self.run is not None and (self.value is not None or self.min is not None):
            given = "value" if self.value is not None else "min"
            raise ValueError(
                f"'run' and '{given}' are two different gates (a paired test against that run, "
                f"a fixed number); keep one of them"
            )
        if self.value is not None and 0 < self.value <= 1 and self.margin >= self.value:
            # a fraction's baseline minus a margin at or past 0: the gate could never fail
            raise ValueError(
                f"margin {self.margin:g} is not below value {self.value:g}, so no score could "
                f"fail the gate; use a margin below {self.value:g} (the largest drop tolerated)"
            )
        return self


BaselineFile = dict[str, BaselineEntrySpec]
"""``baselines/<model>.yaml``: environment/variant id → entry (top-level mapping)."""


class JobSpec(_Strict):
    model: Name
    env: list[Name]


class JobFile(_Strict):
    """``job-<name>.yaml``: exactly which model × env pairs to run."""

    name: Name
    output_dir: str | None = None
    models: dict[Name, ModelSpec] = Field(default_factory=dict)
    jobs: list[JobSpec]
