"""report.html's embedded examples, compressed in threads chunk by chunk: the same bytes as one
compression of the whole JSON, and every failure still reaches the caller."""

from __future__ import annotations

import base64
import json
import random
import zlib
from typing import Any

import pytest

from pytest_modelbench.reporting import examples
from pytest_modelbench.reporting.examples import TooLarge, encode_records


def _records(count: int, seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = ["warfarin", "aspirin", "é", "数", "</script>", "\n", "answer", "B", "0.25"]
    return [
        {
            "i": 0,
            "id": f"q{n}",
            "p": " ".join(rng.choice(words) for _ in range(rng.randint(5, 400))),
            "s": rng.random(),
        }
        for n in range(count)
    ]


def _whole(records: list[dict[str, Any]]) -> bytes:
    """One compressor fed the whole JSON array at once, as the report was written before."""
    text = json.dumps(records, ensure_ascii=False, separators=(",", ":"))
    compressor = zlib.compressobj(examples.COMPRESS_LEVEL)
    return compressor.compress(text.encode()) + compressor.flush()


@pytest.mark.parametrize("count", [0, 1, 40, 3000])
def test_chunks_compressed_in_threads_give_the_bytes_of_one_pass(count: int) -> None:
    records = _records(count)
    encoded, packed = encode_records(records, examples.EMBED_LIMIT_BYTES)
    data = base64.b64decode(encoded)
    assert packed == count
    assert data == _whole(records)
    assert json.loads(zlib.decompress(data)) == records


def test_small_chunks_keep_the_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(examples, "CHUNK_CHARS", 1000)  # hundreds of chunks, four in flight
    records = _records(600)
    encoded, _ = encode_records(records, examples.EMBED_LIMIT_BYTES)
    assert base64.b64decode(encoded) == _whole(records)


def test_past_the_limit_it_stops_as_it_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(examples, "CHUNK_CHARS", 1000)
    records = _records(5000)
    seen = 0

    def counted() -> Any:
        nonlocal seen
        for record in records:
            seen += 1
            yield record

    with pytest.raises(TooLarge, match="more than 2,000 compressed bytes after"):
        encode_records(counted(), 2000)
    assert seen < len(records)  # not compressed to the end first
    with pytest.raises(TooLarge, match="compressed bytes for 3 examples"):
        encode_records(records[:3], 10)


def test_a_failed_compression_is_raised_by_done(monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing:
        def __init__(self) -> None:
            self.calls = 0

        def compress(self, data: bytes) -> bytes:
            self.calls += 1 if data else 0
            if self.calls == 2:
                raise MemoryError("no room")
            return b""

        def flush(self) -> bytes:
            return b""

    def failing(level: int) -> Failing:
        assert level == examples.COMPRESS_LEVEL
        return Failing()

    monkeypatch.setattr(examples.zlib, "compressobj", failing)
    monkeypatch.setattr(examples, "CHUNK_CHARS", 1000)
    with pytest.raises(MemoryError, match="no room"):
        encode_records(_records(200), examples.EMBED_LIMIT_BYTES)
