"""Reading safetensors checkpoints: one file or shards listed in ``model.safetensors.index.json``.

Only safetensors are read (no pickle, no remote code). Every failure names the file and the
problem: a missing file, a shard the index names that is not there, a truncated or corrupt file,
a tensor the index places in a shard that does not hold it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not match the model; the message says why."""


INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


class CheckpointReader:
    """Lazy access to every tensor of a checkpoint directory (or a single .safetensors file)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.files = self._find_files()
        self._handles: dict[str, object] = {}
        self.index: dict[str, TensorInfo] = {}
        for file in self.files:
            handle = self._open(file)
            for name in handle.keys():
                meta = handle.get_slice(name)
                shape = tuple(meta.get_shape())
                dtype = meta.get_dtype()
                if name in self.index:
                    raise CheckpointError(f"tensor {name!r} appears in both {self.index[name].file} and {file.name}")
                numel = 1
                for s in shape:
                    numel *= s
                self.index[name] = TensorInfo(name, file.name, dtype, shape, numel * _DTYPE_BYTES.get(dtype, 1))
        self._check_index_json()

    def _find_files(self) -> list[Path]:
        if self.path.is_file():
            if self.path.suffix != ".safetensors":
                raise CheckpointError(f"{self.path}: only .safetensors checkpoints are supported")
            return [self.path]
        if not self.path.is_dir():
            raise CheckpointError(f"checkpoint path {self.path} does not exist")
        index = self.path / INDEX_NAME
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
            files = sorted({self.path / f for f in weight_map.values()})
            missing = [f.name for f in files if not f.exists()]
            if missing:
                raise CheckpointError(f"{index} names shard(s) that are missing: {', '.join(missing)}")
            self._weight_map = weight_map
            return files
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"no .safetensors files in {self.path}")
        if len(files) > 1:
            raise CheckpointError(f"{self.path} holds {len(files)} .safetensors files but no {INDEX_NAME}")
        return files

    def _open(self, file: Path):
        try:
            handle = safe_open(str(file), framework="pt", device="cpu")
        except Exception as exc:
            raise CheckpointError(f"{file}: truncated or corrupt safetensors file ({exc})") from None
        self._handles[file.name] = handle
        return handle

    def _check_index_json(self) -> None:
        weight_map = getattr(self, "_weight_map", None)
        if weight_map is None:
            return
        for name, file in weight_map.items():
            info = self.index.get(name)
            if info is None or info.file != file:
                raise CheckpointError(f"{INDEX_NAME} places {name!r} in {file}, which does not hold it")

    def keys(self) -> list[str]:
        return list(self.index)

    def __contains__(self, name: str) -> bool:
        return name in self.index

    def get(self, name: str) -> torch.Tensor:
        info = self.index.get(name)
        if info is None:
            raise CheckpointError(f"checkpoint has no tensor {name!r}")
        try:
            return self._handles[info.file].get_tensor(name)
        except Exception as exc:
            raise CheckpointError(f"{info.file}: cannot read tensor {name!r} ({exc})") from None

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.index:
            yield name, self.get(name)

    @property
    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self.index.values())


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "U32": 4,
                "U64": 8, "F4": 1}
