"""The memory plan against a measured peak: one update of a random-init Qwen2-shaped model on CPU.

    python benchmarks/plan_memory.py            # ~100M parameters, fp32 and bf16 + fp32 masters
    python benchmarks/plan_memory.py --smoke    # a few M parameters (the test runs this)
    python benchmarks/plan_memory.py --precision chunks   # fp32, log-probs at once vs in chunks

For each precision, one process per measurement (a fresh heap): the model is built, a first update
(two micro-batches of gradient accumulation, then AdamW) creates the optimizer state, the peak RSS
is reset (``/proc/self/clear_refs``), and a second update runs. Its peak RSS above the RSS before
the model was built is compared with :func:`crl_bench.distributed.memory_plan.learner_rank` at one
rank, without checkpointing: weights + gradients (accumulated from the first micro-batch) +
masters + AdamW moments + the second micro-batch's activations + its logits. The loss is the
trainer's: ``logits.float() / temperature``, ``logsumexp``, the sampled token's log-prob.

``fp32-chunked``: fp32, the log-probs computed over chunks of ``CHUNK`` tokens with each chunk's
logits recomputed in the backward (``crl_bench.llm.chunked_logprobs``, the trainer's
``logprob_chunk_tokens``); the plan counts one chunk's logits.

``bf16``: the model in bf16, fp32 master copies that AdamW steps, the bf16 weights copied from the
masters after the step (the mixed-precision accounting of the plan: 2 + 2 + 4 + 8 B/param).

Large allocations are served by mmap (``MALLOC_MMAP_THRESHOLD_``) so that freed tensors leave the
RSS and the peak is the peak of live tensors plus the interpreter.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHAPES = {
    "default": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                    num_attention_heads=12, num_key_value_heads=4, vocab_size=32000),
    "smoke": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, vocab_size=8192),
}
BATCH = {"default": (2, 512), "smoke": (2, 256)}
CHUNK = 128


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(size: str, precision: str) -> dict[str, Any]:
    """One measurement in this process (run it in a fresh one)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from crl_bench.distributed.memory_plan import (BF16_FP32_MASTERS, FP32, learner_rank,
                                                   shape_from_hf_config)
    from crl_bench.llm.chunked_logprobs import token_logprobs

    torch.manual_seed(0)
    cfg = Qwen2Config(**SHAPES[size], tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    batch, seq = BATCH[size]
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    chunk = CHUNK if precision == "fp32-chunked" else 0
    ids = [torch.randint(0, cfg.vocab_size, (batch, seq)) for _ in range(2)]
    # warm-up on a one-layer, narrow model of the same class: the modelling code is imported and
    # the kernels' one-time buffers exist before the baseline is read
    small = Qwen2Config(**{**SHAPES["smoke"], "num_hidden_layers": 1, "vocab_size": 256,
                           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                           "num_key_value_heads": 2}, tie_word_embeddings=False)
    small._attn_implementation = "sdpa"
    warm = AutoModelForCausalLM.from_config(small, dtype=dtype)
    warm(input_ids=torch.randint(0, 256, (1, 8)), use_cache=False).logits.float().sum().backward()
    del warm
    gc.collect()
    before = rss_kb("VmRSS") * 1024
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.train()
    params = list(model.parameters())
    masters = [p.detach().float().clone() for p in params] if precision == "bf16" else params
    opt = torch.optim.AdamW(masters, lr=1e-6, foreach=False)

    def update() -> None:
        for x in ids:  # two micro-batches: the gradient of the first is held during the second
            if chunk:
                hidden = model.model(input_ids=x, use_cache=False).last_hidden_state[:, :-1]
                picked = token_logprobs(model.lm_head, hidden.reshape(-1, cfg.hidden_size),
                                        x[:, 1:].reshape(-1), temperature=0.99,
                                        chunk_tokens=chunk)
                del hidden
            else:
                logits = model(input_ids=x, use_cache=False).logits[:, :-1].float() / 0.99
                picked = (logits.gather(-1, x[:, 1:, None]).squeeze(-1)
                          - torch.logsumexp(logits, -1))
                del logits
            (-picked.mean() / len(ids)).backward()
            del picked
        if precision == "bf16":
            for m, p in zip(masters, params):
                m.grad = p.grad.float()
                p.grad = None
        opt.step()
        opt.zero_grad(set_to_none=True)
        if precision == "bf16":
            with torch.no_grad():
                for m, p in zip(masters, params):
                    p.copy_(m)

    update()
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS restarts from here
    update()
    peak = rss_kb("VmHWM") * 1024 - before
    shape = shape_from_hf_config(cfg)
    plan = learner_rank(shape, 1, batch * seq, batch * (seq - 1), checkpointing=False,
                        precision=BF16_FP32_MASTERS if precision == "bf16" else FP32,
                        logprob_chunk=chunk)
    return {"precision": precision, "params_m": round(shape.params() / 1e6, 2),
            "tokens": batch * seq,
            "measured_mb": round(peak / 1e6, 1), "plan_mb": round(plan["total"] / 1e6, 1),
            "ratio": round(peak / plan["total"], 3),
            "plan_lines_mb": {k: round(v / 1e6, 1) for k, v in plan.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a few M parameters (seconds)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp32-chunked", "both", "chunks"],
                    default="both", help="both: fp32 and bf16; chunks: fp32 and fp32-chunked")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    size = "smoke" if args.smoke else "default"
    if args._child:
        print(json.dumps(measure(size, args._child)))
        return 0
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS":
           os.environ.get("OMP_NUM_THREADS", "1")}
    results = []
    runs = {"both": ["fp32", "bf16"], "chunks": ["fp32", "fp32-chunked"]}
    for precision in runs.get(args.precision, [args.precision]):
        cmd = [sys.executable, __file__, "--_child", precision]
        cmd += ["--smoke"] if args.smoke else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"measurement {precision} failed: {proc.stderr[-2000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{'precision':<14}{'params (M)':>11}{'tokens':>8}{'plan (MB)':>11}{'measured (MB)':>15}"
          f"{'measured/plan':>15}")
    for r in results:
        print(f"{r['precision']:<14}{r['params_m']:>11}{r['tokens']:>8}{r['plan_mb']:>11}"
              f"{r['measured_mb']:>15}{r['ratio']:>15}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
