"""``load_model(..., tensor_parallel=2)`` and ``hwinfer serve --tp 2`` on the CPU (gloo, 2 ranks):
the second process is hidden behind rank 0's model, and everything (full forward, generate, the
engine with concurrent requests and speculation, the server) gives one process's outputs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.parallel import RankFailed
from hwinfer.testing.checkpoints import write_checkpoint
from tests.server.conftest import free_port

PROMPTS = [[5, 17, 99, 3, 250], [7, 1, 300, 42, 42, 8, 19, 101, 64, 2, 77, 31, 12],
           list(range(40, 80)), [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133]]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint("qwen3_5", tmp_path_factory.mktemp("launch") / "dense")


@pytest.fixture(scope="module")
def ref(ckpt):
    return load_model(ckpt, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tp(ckpt):
    model = load_model(ckpt, device="cpu", dtype="float32", tensor_parallel=2)
    yield model
    model.close()


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 37), generator=torch.Generator().manual_seed(0))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _engine_tokens(model, **kwargs) -> list[list[int]]:
    engine = Engine(model, num_blocks=64, **kwargs)
    reqs = [engine.add_request(p, SamplingParams(max_tokens=10, temperature=0)) for p in PROMPTS]
    return [o.token_ids for o in engine.run(reqs)], engine


def test_logits_match_one_process(ref, tp):
    assert tp.parallel.world_size == 2 and tp.tensor_parallel == {"rank": 0, "world_size": 2}
    assert len(tp.parallel.pids) == 1 and not _gone(tp.parallel.pids[0])
    ids = _ids(ref.config["vocab_size"])
    want, got = ref(ids), tp(ids)
    assert ((got - want).abs().max() / want.abs().max()) <= 1e-5


def test_generate_greedy_identical(ref, tp):
    want = [o.token_ids for o in ref.generate(PROMPTS, max_new_tokens=12, temperature=0)]
    assert [o.token_ids for o in tp.generate(PROMPTS, max_new_tokens=12, temperature=0)] == want
    assert tp.generate("hello there", max_new_tokens=6, temperature=0).text == \
        ref.generate("hello there", max_new_tokens=6, temperature=0).text


def test_engine_concurrent_requests_identical(ref, tp):
    # Two slots for four requests (slots are reused: their state must be reset on every rank)
    # and 16-token steps (prompts are prefilled in chunks beside other requests' decodes).
    small = {"max_num_seqs": 2, "max_num_batched_tokens": 16}
    want, _ = _engine_tokens(ref, **small)
    assert _engine_tokens(tp, **small)[0] == want
    # MTP speculation: drafts verified in one forward; rejected drafts roll the GDN state back
    # (a replay every rank mirrors).
    got, engine = _engine_tokens(tp, max_num_seqs=4, num_speculative_tokens=2)
    assert got == want
    stats = engine.spec_stats()
    assert stats.drafted > stats.accepted  # some drafts were rejected: the rollback ran


def test_prefix_caching_mirrors_state_copies(tp, ckpt):
    """Prefix caching restores GDN state by copying slots outside the model calls; the copies
    reach the followers, so the tokens equal a single process with prefix caching."""
    shared = list(range(1, 300))
    prompts = [shared + [5], shared + [6], shared[:150] + [7]]
    params = SamplingParams(max_tokens=4, temperature=0)

    def run(model) -> tuple[list[list[int]], int]:
        engine = Engine(model, max_num_seqs=2, num_blocks=64, max_num_batched_tokens=512,
                        enable_prefix_caching=True)
        out = [o.token_ids for o in engine.run([engine.add_request(prompts[0], params)])]
        out += [o.token_ids for o in engine.run([engine.add_request(p, params) for p in prompts[1:]])]
        return out, engine.prefix.stats.hit_tokens

    want, _ = run(load_model(ckpt, device="cpu", dtype="float32"))
    got, hits = run(tp)
    assert got == want
    assert hits > 0  # the later prompts did reuse the cached prefix (state copied between slots)


def test_bad_arguments_raise_before_starting_anything(ckpt):
    before = {c.pid for c in psutil.Process().children()}
    with pytest.raises(ValueError, match="expert_parallel must be 1 or equal to tensor_parallel"):
        load_model(ckpt, device="cpu", tensor_parallel=2, expert_parallel=3)
    with pytest.raises(ValueError, match="tensor_parallel must be an integer >= 1, got 0"):
        load_model(ckpt, device="cpu", tensor_parallel=0)
    with pytest.raises(ValueError, match="expert_parallel must be 1 or equal"):
        load_model(ckpt, device="cpu", expert_parallel=2)
    assert {c.pid for c in psutil.Process().children()} == before


def test_more_ranks_than_devices_is_refused(monkeypatch):
    from hwinfer.parallel.driver import _check_devices
    from hwinfer.parallel.follower import Spec

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    spec = Spec("ckpt", "cuda", 2, None, {}, False, 4, 1, 60.0)  # cuda:2 .. cuda:5 of cuda:0..3
    with pytest.raises(ValueError, match="tensor_parallel=4 needs 6 cuda devices .* 4 visible"):
        _check_devices(spec, joining=False)
    _check_devices(Spec("ckpt", "cuda", 0, None, {}, False, 4, 1, 60.0), joining=False)


def test_one_parallel_model_per_process(ckpt, tp):
    with pytest.raises(ValueError, match="already open in this process"):
        load_model(ckpt, device="cpu", dtype="float32", tensor_parallel=2)


def test_close_leaves_no_child_processes(tp):
    pids = list(tp.parallel.pids)
    tp.close()
    assert all(_gone(p) for p in pids)
    assert not [c for c in psutil.Process().children() if c.pid in pids]
    with pytest.raises(RuntimeError, match="closed"):
        tp(_ids(tp.config["vocab_size"]))


def test_killed_follower_is_named(ckpt, tp):
    tp.close()  # one tensor-parallel model per process at a time
    with load_model(ckpt, device="cpu", dtype="float32", tensor_parallel=2) as model:
        ids = _ids(model.config["vocab_size"])
        model(ids)
        (pid,) = model.parallel.pids
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RankFailed) as info:
            model(ids)
        assert time.monotonic() - start < 10
        assert info.value.rank == 1 and "rank 1 of 2 failed" in str(info.value) and "SIGKILL" in str(info.value)
        with pytest.raises(RuntimeError, match="failed earlier"):
            model.generate([1, 2, 3], max_new_tokens=2)
    assert _gone(pid)


def test_expert_parallel_deepseek_v4(tmp_path, tp):
    """EP=2 on DeepSeek-V4: all-to-all expert dispatch, hash routing planned by a method the
    sharding wraps on the instance, sliding-window rings rewound by speculation."""
    tp.close()  # one tensor-parallel model per process at a time
    path = write_checkpoint("deepseek_v4", tmp_path / "dsv4")
    ref = load_model(path, device="cpu", dtype="float32")
    prompts = [PROMPTS[1]]  # the tiny DeepSeek-V4 runs ~0.3 s a step on this CPU: keep it short
    want = [o.token_ids for o in ref.generate(prompts, max_new_tokens=5, temperature=0)]
    ids = _ids(ref.config["vocab_size"])[:, :21]
    ref_logits = ref(ids)
    with load_model(path, device="cpu", dtype="float32", tensor_parallel=2, expert_parallel=2) as model:
        assert ((model(ids) - ref_logits).abs().max() / ref_logits.abs().max()) <= 1e-5
        assert [o.token_ids for o in model.generate(prompts, max_new_tokens=5, temperature=0)] == want
        engine = Engine(model, max_num_seqs=1, num_blocks=16, num_speculative_tokens=2)
        reqs = [engine.add_request(p, SamplingParams(max_tokens=5, temperature=0)) for p in prompts]
        assert [o.token_ids for o in engine.run(reqs)] == want


TORCHRUN_SCRIPT = """
import json, sys
from hwinfer import load_model
model = load_model(sys.argv[1], device="cpu", dtype="float32", tensor_parallel=2)
print("TOKENS", json.dumps([o.token_ids for o in model.generate(json.loads(sys.argv[2]), max_new_tokens=8,
                                                                temperature=0)]), flush=True)
"""


def test_torchrun_joins_the_rendezvous(ckpt, ref, tmp_path):
    """Under torchrun every rank runs the script: rank 0 gets the model, rank 1 serves it inside
    load_model and exits 0 when rank 0's interpreter ends."""
    script = tmp_path / "tp_script.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script), str(ckpt), json.dumps(PROMPTS[:2])],
                         env=env, capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("TOKENS ")]
    assert len(lines) == 1  # rank 0 only: the follower never returned from load_model
    want = [o.token_ids for o in ref.generate(PROMPTS[:2], max_new_tokens=8, temperature=0)]
    assert json.loads(lines[0][len("TOKENS "):]) == want


def _start_server(ckpt, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hwinfer.cli", "serve", str(ckpt), "--device", "cpu",
                             "--port", str(port), "--log-level", "warning", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, port


def _wait_healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not become healthy"
        time.sleep(0.1)


def _chat(port: int) -> tuple[str, int]:
    import openai

    with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60) as c:
        r = c.chat.completions.create(model="dense", temperature=0, max_tokens=12,
                                      messages=[{"role": "user", "content": "Tell me about parallel ranks."}])
        return r.choices[0].message.content, r.usage.completion_tokens


def test_serve_tp2_answers_like_one_process(ckpt):
    pytest.importorskip("openai")
    single, single_port = _start_server(ckpt)
    parallel, parallel_port = _start_server(ckpt, "--tp", "2")
    try:
        _wait_healthy(single, single_port)
        _wait_healthy(parallel, parallel_port)
        followers = [c.pid for c in psutil.Process(parallel.pid).children()]
        assert len(followers) == 1
        want = _chat(single_port)
        assert want[1] > 0 and _chat(parallel_port) == want
        parallel.send_signal(signal.SIGINT)  # what Ctrl-C does: uvicorn shuts down, the followers stop
        assert parallel.wait(timeout=30) == 0, parallel.stdout.read().decode()
        assert all(_gone(p) for p in followers)
    finally:
        for proc in (single, parallel):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=20)
