"""A fake ``vllm`` package: vLLM's launch path, serving the simulated server.

:func:`write_fake_vllm` writes a ``vllm.entrypoints.openai.api_server`` module under a directory;
with that directory first on ``PYTHONPATH``, pytest-modelbench's server pool starts it exactly as
it starts vLLM (GPU claim, command line, environment, health wait, reuse, stop) and it serves a
:class:`~pytest_modelbench.testing.SimServer`. It appends one JSON line per start to
``$FAKE_VLLM_LOG`` (served name, ``--model`` path, ``CUDA_VISIBLE_DEVICES``, worker,
``FAKE_HOST``, working directory), and every request to ``$FAKE_VLLM_REQUESTS`` (one file per
server, ``requests-gpu<N>.jsonl``, with ``FAKE_VLLM_LOG_PER_SERVER``). ``FAKE_VLLM_LATENCY`` and
``FAKE_VLLM_SLOTS`` make it an engine with fixed batch slots and latency; ``FAKE_VLLM_START_S``
is how long it takes to start (and ``FAKE_VLLM_FAIL_START`` makes it fail then);
``FAKE_VLLM_CRASH_AFTER`` makes its engine die after that many answers, printing
``$FAKE_VLLM_CRASH_LOG``; ``FAKE_VLLM_VERSION`` is the build its ``GET /version`` reports.
vLLM's ``--ssl-keyfile``/``--ssl-certfile``/``--ssl-ca-certs``/``--ssl-cert-reqs`` are
honoured as vLLM's uvicorn does: it serves TLS, and requires client certificates from those
CAs with ``--ssl-cert-reqs 2``.
Used by the test suite's serving tests and the ``perf/`` scripts that measure the serving path
without a GPU.
"""

from __future__ import annotations

from pathlib import Path

FAKE_SERVER = """
import argparse, json, os, ssl, sys, time
from pytest_modelbench.testing import SimConfig, SimServer

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--served-model-name")
parser.add_argument("--port", type=int)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--ssl-keyfile")
parser.add_argument("--ssl-certfile")
parser.add_argument("--ssl-ca-certs")
parser.add_argument("--ssl-cert-reqs", type=int, default=int(ssl.CERT_NONE))
args, rest = parser.parse_known_args()
tls = None
if args.ssl_keyfile and args.ssl_certfile:  # as uvicorn.config.create_ssl_context
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    tls.verify_mode = ssl.VerifyMode(args.ssl_cert_reqs)
    if args.ssl_ca_certs:
        tls.load_verify_locations(args.ssl_ca_certs)
record = {
    "t": time.time(),  # when the process began (FAKE_VLLM_START_S later it serves)
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "worker": os.environ.get("PYTEST_XDIST_WORKER"),
    "host": os.environ.get("FAKE_HOST"),
    "cwd": os.getcwd(),
    "model": args.served_model_name,
    "path": args.model,
    "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "bind": args.host,
    "tls": tls is not None,
    "client_certs": tls is not None and tls.verify_mode == ssl.CERT_REQUIRED,
    "keyed": bool(os.environ.get("VLLM_API_KEY")),
    "key": os.environ.get("VLLM_API_KEY"),  # for the tests that look for it elsewhere
    "flags": rest,
}
with open(os.environ["FAKE_VLLM_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
time.sleep(float(os.environ.get("FAKE_VLLM_START_S") or 0))  # an engine's start
if os.environ.get("FAKE_VLLM_FAIL_START"):
    print("torch.OutOfMemoryError: CUDA out of memory", file=sys.stderr, flush=True)
    sys.exit(1)
crash_after = int(os.environ.get("FAKE_VLLM_CRASH_AFTER") or 0)
requests_log = os.environ.get("FAKE_VLLM_REQUESTS")
if requests_log and os.environ.get("FAKE_VLLM_LOG_PER_SERVER"):  # requests-gpu<N>.jsonl
    gpus = (os.environ.get("CUDA_VISIBLE_DEVICES") or "cpu").replace(",", "_")
    requests_log = requests_log.replace(".jsonl", f"-gpu{gpus}.jsonl")
config = SimConfig(
    models=(args.served_model_name,),
    # FAKE_VLLM_LATENCY / FAKE_VLLM_SLOTS: an engine with fixed batch slots and latency
    latency=float(os.environ.get("FAKE_VLLM_LATENCY") or (0.3 if crash_after else 0.0)),
    slots=int(os.environ.get("FAKE_VLLM_SLOTS") or 64),
    port=args.port,
    host=args.host,
    log_path=requests_log,
    api_key=os.environ.get("VLLM_API_KEY") or None,  # as vLLM: /v1 needs the bearer
    version=os.environ.get("FAKE_VLLM_VERSION") or None,  # what GET /version answers
)
with SimServer(config, ssl_context=tls) as server:
    while True:  # FAKE_VLLM_CRASH_AFTER=N: the engine dies after N answers, as vLLM's does
        time.sleep(0.02 if crash_after else 3600)
        if crash_after and sum(server.answers_per_key().values()) >= crash_after:
            sys.stderr.write(open(os.environ["FAKE_VLLM_CRASH_LOG"]).read())
            sys.stderr.flush()
            os._exit(1)
"""

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"  # one test per item


def write_fake_vllm(directory: Path) -> Path:
    """The fake ``vllm`` package under ``directory / "fakevllm"``; returns that folder, the entry
    to put first on the ``PYTHONPATH`` of the pytest run under test."""
    root = directory / "fakevllm"
    package = root / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package.parents[1], package.parents[0], package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_SERVER)
    return root
