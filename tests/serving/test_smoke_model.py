"""The built-in smoke model: deterministic, cached, safe under concurrency, loadable."""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.serving.smoke import SmokeConfig, build_smoke_model, smoke_model_key

pytest.importorskip("tokenizers", reason="the smoke tokenizer is trained with 'tokenizers'")

BUILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pytest_modelbench.serving.smoke import build_smoke_model
    print(build_smoke_model(Path(sys.argv[1])))
    """
)


def _digests(model: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model.iterdir())}


def _build_in_subprocess(cache: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", BUILD, str(cache)], stdout=subprocess.PIPE, text=True
    )


def test_two_builds_in_separate_processes_are_byte_identical(tmp_path: Path) -> None:
    """Separate interpreters (hash seeds, Rust HashMap seeds) must still agree to the byte."""
    procs = [_build_in_subprocess(tmp_path / name) for name in ("a", "b")]
    paths = [Path(p.communicate()[0].strip()) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert paths[0].name == paths[1].name == f"smoke-llama-{smoke_model_key()}"
    a, b = _digests(paths[0]), _digests(paths[1])
    assert set(a) == {
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert a == b


def test_cached_build_is_reused(tmp_path: Path) -> None:
    first = build_smoke_model(tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    again = build_smoke_model(tmp_path)
    assert again == first
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    assert time.perf_counter() - started < 1.0


def test_concurrent_builders_share_one_directory(tmp_path: Path) -> None:
    procs = [_build_in_subprocess(tmp_path) for _ in range(3)]
    paths = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    assert [p.name for p in tmp_path.iterdir()] == [Path(paths.pop()).name]  # no temp leftovers


def test_other_config_other_directory(tmp_path: Path) -> None:
    small = SmokeConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, seed=7)
    assert build_smoke_model(tmp_path, small) != build_smoke_model(tmp_path)
    with pytest.raises(ValueError, match="head_dim 16 < 32"):
        SmokeConfig(hidden_size=64, num_attention_heads=4).validate()


def _safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header: dict[str, Any] = json.loads(fh.read(size))
        fh.seek(0, 2)
        data_size = fh.tell() - 8 - size
    assert size % 8 == 0
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == data_size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous, no overlap
    return header


def test_files_describe_a_consistent_llama(tmp_path: Path) -> None:
    model = build_smoke_model(tmp_path)
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"] >= 32
    assert config["max_position_embeddings"] == 2048
    header = _safetensors_header(model / "model.safetensors")
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    assert header["model.embed_tokens.weight"] == {
        "dtype": "BF16",
        "shape": [vocab, hidden],
        "data_offsets": header["model.embed_tokens.weight"]["data_offsets"],
    }
    assert header["lm_head.weight"]["shape"] == [vocab, hidden]
    assert header["model.layers.1.self_attn.k_proj.weight"]["shape"] == [
        config["num_key_value_heads"] * config["head_dim"],
        hidden,
    ]
    assert len(header) - 1 == 2 + 1 + 9 * config["num_hidden_layers"]

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == vocab
    text = "Question: what is 12 + 7? Ünïcödé ✓ — answer: 19."
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte-level: any input works
    assert tokenizer.encode("2024").tokens == ["2", "0", "2", "4"]  # digits stay single
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    assert "add_generation_prompt" in tok_config["chat_template"]
    assert tok_config["eos_token"] in tokenizer.get_vocab()


def test_loads_in_transformers_and_chat_template_renders(tmp_path: Path) -> None:
    """Where transformers and torch are installed (the vLLM venv), the files load for real."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    model_dir = build_smoke_model(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<s><|user|>\nWhat is 2 + 2?<|end|>\n<|assistant|>\n"
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir)
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
