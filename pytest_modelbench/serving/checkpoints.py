"""Serve a checkpoint whose weight file is not named as its index says, without changing it.

Some training code saves ``model.safetensors`` next to a ``model.safetensors.index.json``
that maps every weight to ``model-00001-of-00001.safetensors``. vLLM loads only the files
the index names, finds none, and fails. When the fix is unambiguous (the index names one
missing file, exactly one unlisted ``*.safetensors`` file exists, and its header holds the
weights the index puts in the missing file) :func:`servable_checkpoint` returns a shadow
directory of symlinks, with the missing name linked to the real file, and says what it did.
Otherwise it raises :class:`CheckpointNamingError` naming the files and the ``mv`` to run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_modelbench.serving.base import ServingError

__all__ = [
    "INDEX_NAME",
    "CheckpointNamingError",
    "CheckpointWarning",
    "ShardRename",
    "check_shard_names",
    "servable_checkpoint",
    "shadow_directory",
]

INDEX_NAME = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit


class CheckpointWarning(UserWarning):
    """A checkpoint was served through a shadow directory; the message says why."""


class CheckpointNamingError(ServingError):
    """The index names weight files that are missing, and no single file can stand in."""


@dataclass(frozen=True)
class ShardRename:
    """In ``directory`` the index's ``missing`` file is really ``actual``."""

    directory: Path
    missing: str
    actual: str

    @property
    def mv_command(self) -> str:
        return f"mv {shlex.quote(str(self.directory / self.actual))} {shlex.quote(str(self.directory / self.missing))}"


def _mv_hint(directory: Path, candidates: list[str], missing: str) -> str:
    target = shlex.quote(str(directory / missing))
    if len(candidates) == 1:
        return f"mv {shlex.quote(str(directory / candidates[0]))} {target}"
    return f"mv {shlex.quote(str(directory))}/<the right one> {target}"


def _index(directory: Path) -> dict[str, str] | None:
    """The index's weight map (tensor → file), or None when there is no index."""
    path = directory / INDEX_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointNamingError(
            f"{path}: cannot read the weight index ({exc}); re-save the checkpoint, or delete "
            f"the index if the *.safetensors files in {directory} hold every weight"
        ) from None
    return {str(k): str(v) for k, v in weight_map.items()}


def _tensor_names(path: Path) -> set[str] | None:
    """Tensor names in a safetensors file's header, or None when it is not one."""
    try:
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > _MAX_HEADER_BYTES:
                return None
            header = json.loads(handle.read(size))
    except (OSError, ValueError, struct.error):
        return None
    if not isinstance(header, dict):
        return None
    return {name for name in header if name != "__metadata__"}


def check_shard_names(directory: Path) -> ShardRename | None:
    """None when every file the index names exists (or there is no index); the rename
    that makes it servable when unambiguous; else :class:`CheckpointNamingError`."""
    directory = Path(directory)
    weight_map = _index(directory)
    if weight_map is None:
        return None
    listed = sorted(set(weight_map.values()))
    missing = [name for name in listed if not (directory / name).is_file()]
    if not missing:
        return None
    candidates = sorted(
        p.name for p in directory.glob("*.safetensors") if p.is_file() and p.name not in listed
    )
    names = ", ".join(missing)
    where = f"{directory}: {INDEX_NAME} names {names}, which {'is' if len(missing) == 1 else 'are'} missing"
    if not candidates:
        raise CheckpointNamingError(
            f"{where}, and no other *.safetensors file is there to use; the checkpoint is "
            "incomplete: copy the missing file(s) or save the checkpoint again"
        )
    if len(missing) > 1:
        raise CheckpointNamingError(
            f"{where}, while the directory has {', '.join(candidates)}; modelbench cannot tell "
            "which file is which shard: rename each file to the name the index gives its "
            f"weights (e.g. {_mv_hint(directory, candidates[:1], missing[0])}) or save the "
            "checkpoint again"
        )
    (expected,) = missing
    if len(candidates) > 1:
        raise CheckpointNamingError(
            f"{where}, and several unlisted files could be it ({', '.join(candidates)}); "
            f"rename the right one: {_mv_hint(directory, candidates, expected)}"
        )
    (actual,) = candidates
    wanted = {tensor for tensor, file in weight_map.items() if file == expected}
    held = _tensor_names(directory / actual)
    if held is None or not wanted <= held:
        what = (
            "is not a readable safetensors file"
            if held is None
            else (
                f"lacks {len(wanted - held)} of the {len(wanted)} tensors the index puts in {expected}"
            )
        )
        raise CheckpointNamingError(
            f"{where}; the only unlisted file, {actual}, {what}, so it cannot stand in for it; "
            "save the checkpoint again"
        )
    return ShardRename(directory, expected, actual)


def _shadow_name(rename: ShardRename) -> str:
    directory = rename.directory.absolute()
    parts = [str(directory), rename.missing, rename.actual]
    for entry in sorted(directory.iterdir()):  # a retrained checkpoint gets a new shadow
        with contextlib.suppress(OSError):
            stat = entry.stat()
            parts.append(f"{entry.name}:{stat.st_size}:{stat.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return f"{directory.name}-{digest}"


def shadow_directory(rename: ShardRename, root: Path) -> Path:
    """``root/<name>-<digest>/``: a symlink to every entry of the checkpoint, plus the
    missing shard name linked to the real file. Built once; concurrent builders agree."""
    directory = rename.directory.absolute()
    target = Path(root) / _shadow_name(rename)
    if (target / rename.missing).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for entry in directory.iterdir():
            (building / entry.name).symlink_to(directory / entry.name)
        (building / rename.missing).symlink_to(directory / rename.actual)
        try:
            os.rename(building, target)
        except OSError:  # another worker finished first: use its (identical) directory
            if not (target / rename.missing).is_file():
                raise
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)
    return target


def servable_checkpoint(model: str | Path, shadow_root: Path) -> tuple[Path, str | None]:
    """The directory to give the engine for local checkpoint ``model``, and a one-line
    warning when it is a shadow directory (None when the checkpoint is fine as it is)."""
    directory = Path(model)
    rename = check_shard_names(directory)
    if rename is None:
        return directory, None
    try:
        shadow = shadow_directory(rename, shadow_root)
    except OSError as exc:
        raise CheckpointNamingError(
            f"{directory}: {INDEX_NAME} names {rename.missing} but the weights are in "
            f"{rename.actual}, and a shadow directory could not be made in {shadow_root} "
            f"({exc.strerror or exc}); fix the checkpoint: {rename.mv_command}"
        ) from None
    return shadow, (
        f"checkpoint {directory}: {INDEX_NAME} names {rename.missing} but the weights are in "
        f"{rename.actual}; serving it from {shadow}, where {rename.missing} links to "
        f"{rename.actual} (the checkpoint is unchanged; to fix it: {rename.mv_command})"
    )
