"""The command line: `hwinfer serve` with no path (the embedded default) in a subprocess,
`hwinfer generate` and `hwinfer chat`."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import httpx
import openai

from hwinfer.cli import main
from hwinfer.interactive import chat_main
from hwinfer.server.default_model import DEFAULT_MODEL_NAME
from tests.server.conftest import free_port


def test_serve_without_path_answers(tmp_path):
    port = free_port()
    env = {**os.environ, "HWINFER_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hwinfer.cli", "serve", "--device", "cpu", "--port", str(port),
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.1)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0) as client:
            assert client.models.list().data[0].id == DEFAULT_MODEL_NAME
            r = client.chat.completions.create(model=DEFAULT_MODEL_NAME, max_tokens=3,
                                               messages=[{"role": "user", "content": "hi"}])
            assert r.usage.completion_tokens <= 3
        assert (tmp_path / "default-qwen3_5-tiny-v1" / "config.json").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_generate_streams_to_stdout(checkpoint, capsys):
    assert main(["generate", str(checkpoint), "Hello", "--device", "cpu", "--max-tokens", "4", "--seed", "1"]) == 0
    first = capsys.readouterr().out
    assert main(["generate", str(checkpoint), "Hello", "--device", "cpu", "--max-tokens", "4", "--seed", "1"]) == 0
    assert capsys.readouterr().out == first and first.endswith("\n")


def test_chat_reads_turns_from_stdin(checkpoint):
    out = io.StringIO()
    assert chat_main(str(checkpoint), "cpu", 3, 0.0, None, inp=io.StringIO("hi\n\nagain\n/exit\nignored\n"),
                     out=out) == 0
    assert out.getvalue().count("\n") == 2


def test_generate_path_does_not_import_the_web_stack(checkpoint):
    # `hwinfer generate` / `chat` read the embedded default from hwinfer.server.default_model;
    # importing it must not pull in pydantic / FastAPI (a machine without them, such as the
    # device, failed tests/models/test_deepseek_v4_fp8_cache.py::test_option_validation on it).
    # The subprocess refuses those imports, as such a machine would, and opens a model through
    # the generate path (referring to `_open` without calling it missed an import inside it).
    code = ("import sys\n"
            "class NoWeb:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('pydantic', 'fastapi', 'uvicorn'):\n"
            "            raise ImportError(name + ' refused')\n"
            "sys.meta_path.insert(0, NoWeb())\n"
            "import hwinfer.interactive\n"
            f"model, engine = hwinfer.interactive._open({str(checkpoint)!r}, 'cpu')\n"
            "assert engine.pool.num_blocks > 0\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
