"""Bad checkpoints and bad requests fail with a clear error naming the problem."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hwinfer import load_model
from hwinfer.backend import DeviceNotFound
from hwinfer.loader.checkpoint import CheckpointError
from hwinfer.loader.config import ConfigError
from hwinfer.testing.checkpoints import write_checkpoint


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return write_checkpoint("qwen3_5", tmp_path_factory.mktemp("good"))


def _copy(good: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(good, dst)
    return dst


def _edit_weights(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


def test_good_checkpoint_loads(good):
    model = load_model(good, device="cpu")
    assert model.load_report.loaded > 0 and model.tokenizer is not None


def test_missing_tensor_is_named(good, tmp_path):
    path = _copy(good, tmp_path)
    _edit_weights(path, lambda t: t.pop("model.language_model.layers.1.linear_attn.A_log"))
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint: model\.language_model\.layers\.1\.linear_attn\.A_log"):
        load_model(path, device="cpu")


def test_unexpected_tensor_is_named(good, tmp_path):
    path = _copy(good, tmp_path)
    _edit_weights(path, lambda t: t.__setitem__("model.language_model.layers.0.surprise.weight", torch.zeros(3)))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) in the checkpoint: model\.language_model\.layers\.0\.surprise\.weight"):
        load_model(path, device="cpu")


def test_shape_mismatch_is_named(good, tmp_path):
    path = _copy(good, tmp_path)
    key = "model.language_model.layers.3.self_attn.o_proj.weight"
    _edit_weights(path, lambda t: t.__setitem__(key, torch.zeros(64, 100)))
    with pytest.raises(CheckpointError, match=rf"{key}: shape \(64, 100\) in the checkpoint, the model expects \(64, 128\)"):
        load_model(path, device="cpu")


def test_unknown_model_type(good, tmp_path):
    path = _copy(good, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "llama_9000"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="unknown model_type 'llama_9000'; hwinfer supports: .*qwen3_5"):
        load_model(path, device="cpu")


def test_unsupported_quantization(good, tmp_path):
    path = _copy(good, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="unsupported quantization method 'gptq'"):
        load_model(path, device="cpu")


def test_truncated_safetensors(good, tmp_path):
    path = _copy(good, tmp_path)
    file = path / "model.safetensors"
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) - 100)
    with pytest.raises(CheckpointError, match="model.safetensors: truncated or corrupt safetensors file"):
        load_model(path, device="cpu")


def test_corrupt_header(good, tmp_path):
    path = _copy(good, tmp_path)
    file = path / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:40] = b"#" * 32
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(path, device="cpu")


def test_missing_shard_and_bad_index(good, tmp_path):
    path = tmp_path / "sharded"
    write_checkpoint("qwen3_5", path, shards=2)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="names shard\\(s\\) that are missing: model-00002-of-00002.safetensors"):
        load_model(path, device="cpu")


def test_no_weights_and_no_path(good, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nowhere", device="cpu")
    path = _copy(good, tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no .safetensors files"):
        load_model(path, device="cpu")


def test_absent_device_lists_what_is_there(good):
    # The listing names whatever this machine has (cpu alone in CI, cpu and cuda:N on a GPU host).
    with pytest.raises(DeviceNotFound, match=r"device 'cuda:99' is not available\.\nDevices found: cpu(, cuda:\d+)*\n"
                                             r"Backends installed: amd, cpu, npu, nvidia, xpu"):
        load_model(good, device="cuda:99")
    with pytest.raises(DeviceNotFound, match="unknown device 'tpu'"):
        load_model(good, device="tpu")


def test_bad_generation_requests(good):
    model = load_model(good, device="cpu")
    with pytest.raises(ValueError, match="empty prompt"):
        model.generate([], max_new_tokens=2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.generate([5, 100000], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        model.generate("hi", max_new_tokens=0)
