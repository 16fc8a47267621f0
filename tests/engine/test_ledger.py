"""The memory ledger and the presets: the book's per-request cache figures from the published
configs (binary units: KB = 1024 B, MB = 1024^2 B, GB = 1024^3 B), entries attended per decode
step, the CLI, and every shipped preset."""
from __future__ import annotations

import json

import pytest

from hwinfer.cache.spec import fp8_indexer_row_bytes, fp8_mla_row_bytes, fp8_v4_row_bytes
from hwinfer.cli import main
from hwinfer.engine.ledger import build_meta_model, compute, format_table, ledger, parse_context
from hwinfer.loader.config import ConfigError, load_config
from hwinfer.presets import SOURCE_KEY, load_preset, preset_names, resolve

KB, MB, GB = 1024, 1024 ** 2, 1024 ** 3
K128, M1 = 128 * 1024, 1024 * 1024

# name -> (KB per token, MB fixed per request) as the book prints them.
BOOK = {
    "deepseek-v3.2": (46.9, 0),
    "deepseek-v4-flash": (3.8, 15),
    "deepseek-v4-pro": (5.4, 22),
    "gemma-4-12b": (8.0, 320),
    "qwen3.5-0.8b": (12.0, 19),
}


@pytest.fixture(scope="module")
def ledgers() -> dict[str, object]:
    return {name: ledger(name, context=M1) for name in preset_names()}


def test_fp8_row_sizes_are_the_kernels_layouts():
    assert fp8_v4_row_bytes(512, 64) == 584      # 448 e4m3 + 64 bf16 RoPE + 7 UE8M0 scales + 1 pad
    assert fp8_mla_row_bytes(512, 64) == 656     # 512 e4m3 + 4 fp32 scales + 64 bf16 RoPE
    assert fp8_indexer_row_bytes(128) == 132     # 128 e4m3 + one fp32 scale


@pytest.mark.parametrize("name", sorted(BOOK))
def test_book_figures(ledgers, name):
    per_token_kb, fixed_mb = BOOK[name]
    led = ledgers[name]
    assert round(led.bytes_per_token / KB, 1) == per_token_kb
    assert round(led.fixed_bytes_per_request / MB) == fixed_mb


def test_deepseek_v4_flash_totals():
    assert round(ledger("deepseek-v4-flash", context=K128).total_bytes / GB, 2) == 0.48
    assert round(ledger("deepseek-v4-flash", context=M1).total_bytes / GB, 2) == 3.77


def test_kimi_k3_figures(ledgers):
    """27.0 KB per token (24 MLA layers, bf16 576-wide latent rows). The book's 414 MB fixed is
    the fp32 KDA recurrent state alone (69 layers x 96 heads x 128 x 128 x 4 B); hwinfer also
    counts the short-conv state (q, k, v: 3 x 12288 channels x 3 rows, bf16), 14.6 MB more,
    which the book's Qwen3.5 figure (19 MB = 18.0 state + 0.6 conv) does include."""
    led = ledgers["kimi-k3"]
    assert round(led.bytes_per_token / KB, 1) == 27.0
    (kda,) = [row for row in led.kinds if row.kind.startswith("KDA")]
    assert kda.count == 69
    assert kda.tensors["ssm"]["fixed_bytes_per_request"] == 414 * MB
    assert kda.tensors["conv"]["fixed_bytes_per_request"] == 69 * 3 * 12288 * 3 * 2
    assert led.fixed_bytes_per_request == 414 * MB + 69 * 3 * 12288 * 3 * 2


def test_qwen3_5_fixed_includes_conv_state(ledgers):
    (gdn,) = [row for row in ledgers["qwen3.5-0.8b"].kinds if row.kind.startswith("Gated DeltaNet")]
    assert gdn.tensors["ssm"]["fixed_bytes_per_request"] == 18 * MB
    assert gdn.tensors["conv"]["fixed_bytes_per_request"] == 18 * 6144 * 3 * 2


def test_entries_attended_at_1m(ledgers):
    entries = {row.kind: row.decode_entries for row in ledgers["deepseek-v4-flash"].kinds}
    assert entries == {"sliding window": 128, "C4 (CSA)": 128 + 512, "C128 (HCA)": 128 + M1 // 128}
    assert entries["C4 (CSA)"] == 640 and entries["C128 (HCA)"] == 8320
    gemma = {row.kind: row.decode_entries for row in ledgers["gemma-4-12b"].kinds}
    assert gemma == {"sliding window": 1024, "global": M1}
    assert {row.decode_entries for row in ledgers["deepseek-v3.2"].kinds} == {2048}
    assert {row.kind: row.decode_entries for row in ledgers["kimi-k3"].kinds} == {"KDA (linear)": 0, "MLA (full)": M1}


def test_entries_at_short_context():
    led = ledger("deepseek-v4-flash", context=100)
    assert {row.kind: row.decode_entries for row in led.kinds} == {
        "sliding window": 100, "C4 (CSA)": 100 + 25, "C128 (HCA)": 100}


def test_kv_formats():
    deployed = ledger("deepseek-v4-flash", context=M1)
    bf16 = ledger("deepseek-v4-flash", context=M1, kv_format="bf16")
    assert deployed.kv_format == "deployed"
    # bf16 rows: 1024 B per 512-wide entry, 256 B per indexer key; fp32 compressor state unchanged.
    assert bf16.bytes_per_token == 21 * (1024 / 4 + 256 / 4) + 20 * 1024 / 128
    assert bf16.fixed_bytes_per_request - deployed.fixed_bytes_per_request == 43 * 128 * (1024 - 584)
    # "auto" means what load_model allocates by default, as everywhere: the model dtype's rows
    auto = ledger("deepseek-v4-flash", context=M1, kv_format="auto")
    assert (auto.bytes_per_token, auto.fixed_bytes_per_request) == (
        bf16.bytes_per_token, bf16.fixed_bytes_per_request)
    qwen = ledger("qwen3.5-0.8b", context=M1, kv_format="fp8")
    assert qwen.bytes_per_token == 6 * 2 * 2 * 256          # one byte per K / V value
    assert qwen.fixed_bytes_per_request == ledger("qwen3.5-0.8b", context=M1).fixed_bytes_per_request
    with pytest.raises(ValueError, match="kv_format"):
        ledger("qwen3.5-0.8b", context=M1, kv_format="int4")


def test_gemma_sliding_window_and_k_eq_v(ledgers):
    """Sliding layers keep only their 1024-row window (a ring per request, in the pool too);
    global k_eq_v layers need one row for K and V, while the pool still stores V apart."""
    led = ledgers["gemma-4-12b"]
    assert led.fixed_bytes_per_request == 40 * 1024 * 8 * 256 * 2 * 2
    assert led.bytes_per_token == 8 * 512 * 2
    assert led.pool_bytes_per_token == 8 * 512 * 2 * 2
    assert led.pool_fixed_bytes_per_request == 40 * 1024 * 8 * 256 * 2 * 2


def test_pool_figures_match_the_engine_pool(ledgers):
    from hwinfer.engine.pool import CacheBytes

    model = build_meta_model(load_config("deepseek-v4-flash"))
    cost = CacheBytes.of(model)
    led = ledgers["deepseek-v4-flash"]
    assert (led.pool_bytes_per_token, led.pool_fixed_bytes_per_request) == (cost.per_token, cost.per_request)


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds_with_a_positive_ledger(ledgers, name):
    raw = load_preset(name)
    assert raw["model_type"]
    led = ledgers[name]
    assert led.bytes_per_token > 0 and led.total_bytes > led.fixed_bytes_per_request >= 0
    assert led.kinds and all(row.count > 0 for row in led.kinds)
    assert sum(row.count for row in led.kinds) <= load_config(name)["num_hidden_layers"]


def test_presets_shipped():
    names = set(preset_names())
    assert {"deepseek-v3.2", "deepseek-v4-flash", "deepseek-v4-pro", "kimi-k3", "gemma-4-12b",
            "qwen3.5-0.8b", "kimi-linear-48b-a3b", "glm-5", "hy4-preview", "minimax-m3"} <= names
    # verbatim releases carry no note; reconstructed ones say where their fields come from
    for name in ("deepseek-v3.2", "deepseek-v4-flash", "deepseek-v4-pro", "kimi-k3"):
        assert SOURCE_KEY not in load_preset(name)
    for name in names - {"deepseek-v3.2", "deepseek-v4-flash", "deepseek-v4-pro", "kimi-k3"}:
        assert "Reconstructed" in load_preset(name)[SOURCE_KEY]


def test_preset_name_works_in_load_config(tmp_path):
    config = load_config("deepseek-v4-flash")
    assert config["model_type"] == "deepseek_v4" and config["num_hidden_layers"] == 43
    assert load_config("Qwen3.5-0.8B")["hidden_size"] == 1024       # text_config merged; any case
    assert resolve("kimi-k3").name == "kimi-k3.json"
    # an existing path wins over a preset of the same name
    (tmp_path / "deepseek-v4-flash").mkdir()
    (tmp_path / "deepseek-v4-flash" / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text"}))
    assert load_config(tmp_path / "deepseek-v4-flash")["model_type"] == "qwen3_5_text"
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "no-such-model")
    with pytest.raises(ConfigError, match="neither an existing path nor a preset"):
        ledger("no-such-model", context=8)


def test_cli_json(capsys):
    assert main(["ledger", "deepseek-v4-flash", "--context", "1M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"bytes_per_token", "fixed_bytes_per_request", "total_bytes"} <= set(out)
    assert out["context"] == M1 and out["kv_format"] == "deployed"
    assert out["total_bytes"] == round(out["bytes_per_token"] * M1) + out["fixed_bytes_per_request"]
    assert [k["decode_entries"] for k in out["kinds"]] == [128, 640, 8320]


def test_cli_table(capsys):
    assert main(["ledger", "qwen3.5-0.8b", "--context", "128K", "--kv-format", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "KB = 1024 B" in out and "Gated DeltaNet (linear)" in out and "12.00" in out
    assert main(["ledger", "no-such-model", "--context", "8"]) == 2


def test_compute_on_a_tiny_model_and_table():
    from hwinfer.testing.tiny import deepseek_v4

    model = build_meta_model(deepseek_v4.config("tiny"))
    led = compute(model, context=64, name="tiny")
    assert led.total_bytes == round(led.bytes_per_token * 64) + led.fixed_bytes_per_request
    assert "tiny (deepseek_v4)" in format_table(led)


def test_parse_context():
    assert parse_context("8192") == 8192
    assert parse_context("128K") == parse_context("128k") == 131072
    assert parse_context("1M") == 1048576
    with pytest.raises(ValueError):
        parse_context("lots")


def test_docs_table_is_current():
    from pathlib import Path

    from hwinfer.engine.ledger import presets_markdown

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ledger.md").read_text()
    table = doc.split("<!-- ledger-table: begin -->\n", 1)[1].split("<!-- ledger-table: end -->", 1)[0]
    assert table == presets_markdown(), "regenerate with: python scripts/ledger_table.py --write"
