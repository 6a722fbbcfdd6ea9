"""Flags of the simulated server's command line (``python -m pytest_modelbench.testing.simserver``).

The first line on stdout is the OpenAI base URL (``http://127.0.0.1:PORT/v1``),
so a parent process can read it and point a client there; SIGINT or SIGTERM
stops the server and prints the outcome counts on stderr.
"""

from __future__ import annotations

import argparse

from pytest_modelbench.testing.faults import Faults, Latency
from pytest_modelbench.testing.policy import FALLBACK_TEXT, load_lookup
from pytest_modelbench.testing.simconfig import SimConfig


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (every flag maps onto a :class:`SimConfig` field)."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_modelbench.testing.simserver",
        description="Simulated OpenAI-compatible server for load, latency and fault tests.",
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    add("--port", type=int, default=0, help="port; 0 picks a free one (default)")
    add("--models", default="sim-model", help="comma-separated model names to serve")
    add("--slots", type=int, default=64, help="requests served at once (batch width)")
    add("--latency", type=float, default=0.0, help="mean seconds a request holds its slot")
    add(
        "--latency-dist",
        default="fixed",
        choices=["fixed", "uniform", "lognormal", "exponential"],
        help="latency distribution around the mean",
    )
    add("--latency-spread", type=float, default=0.5, help="uniform ±fraction / lognormal sigma")
    add("--latency-per-token", type=float, default=0.0, help="extra seconds per output token")
    add("--accuracy", type=float, default=1.0, help="probability a lookup key is answered right")
    add(
        "--lookup", metavar="FILE", help="JSON {key: [correct, wrong]} or key/correct/wrong records"
    )
    add("--fallback", default=FALLBACK_TEXT, help="answer for keys missing from the lookup")
    add("--seed", type=int, default=0, help="seed of the fault and latency draws")
    add("--log", metavar="FILE.jsonl", help="append every request to this JSONL file")
    add("--max-model-len", type=int, default=4096, help="reported by /v1/models")
    add("--fault-5xx", type=float, default=0.0, help="rate of 500/502/503 answers")
    add("--fault-429", type=float, default=0.0, help="rate of 429 answers with Retry-After")
    add("--retry-after", type=float, default=1.0, help="seconds in Retry-After (default 1)")
    add("--fault-timeout", type=float, default=0.0, help="rate of requests held --hang-s seconds")
    add("--hang-s", type=float, default=30.0, help="how long a timed-out request is held")
    add("--after-hang", choices=["close", "respond"], default="close", help="then close or answer")
    add("--fault-reset", type=float, default=0.0, help="rate of connection resets (RST)")
    add("--fault-malformed", type=float, default=0.0, help="rate of 200s with truncated JSON")
    add("--fault-missing-choices", type=float, default=0.0, help="rate of 200s without choices")
    add("--hang-forever", action="store_true", help="accept every request and never answer")
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The :class:`SimConfig` the parsed flags describe."""
    faults = Faults(
        error_5xx=args.fault_5xx,
        rate_limit=args.fault_429,
        timeout=args.fault_timeout,
        reset=args.fault_reset,
        malformed=args.fault_malformed,
        missing_choices=args.fault_missing_choices,
        retry_after=args.retry_after,
        hang_s=args.hang_s,
        after_hang=args.after_hang,
        hang_forever=args.hang_forever,
    )
    latency = Latency(args.latency, args.latency_dist, args.latency_spread, args.latency_per_token)
    return SimConfig(
        models=tuple(name.strip() for name in args.models.split(",") if name.strip()),
        slots=args.slots,
        latency=latency,
        accuracy=args.accuracy,
        lookup=load_lookup(args.lookup) if args.lookup else {},
        fallback=args.fallback,
        faults=faults,
        seed=args.seed,
        log_path=args.log,
        host=args.host,
        port=args.port,
        max_model_len=args.max_model_len,
    )
