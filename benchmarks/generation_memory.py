"""Peak memory and time of one batched generation call per ``model.max_batch_size``.

A ``comp_rl`` step on the Balanced one-action level plays 128 episodes in one call (half of them
with retrieved experience in the prompt) while the extractor generates from the step before; three
such runs on a 24 GB machine were killed by the kernel (stop 23). The HF backend generates in
chunks of ``max_batch_size`` rows, so the KV cache it holds is bounded by the chunk.

Each setting runs in a fresh process (so that peak RSS is its own): load the model, build
``--rows`` prompts of about ``--prompt-tokens`` tokens (no two alike, so nothing is shared),
generate ``--new-tokens`` greedily, report the peak resident size over the loaded model's and the
time, then the ratios against the first setting (the default, 64)::

    .venv/bin/python benchmarks/generation_memory.py --sizes 64 32 16 --rows 128 --prompt-tokens 500
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def child(size: int, rows: int, prompt_tokens: int, new_tokens: int, model: str) -> dict:
    import resource

    import torch

    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import SamplingParams

    torch.set_num_threads(1)
    backend = HFBackend(model, roles=("actor",), max_batch_size=size, share_prompt_prefix=False)
    filler = ("The room is dark. You see a staircase down next to you, and walls around you. "
              "Experience: move toward the stairs named in the observation. ")
    base = backend.tokenizer(filler * 40, add_special_tokens=False)["input_ids"]
    prompts = [[int(i) % 1000 + 10] + base[:prompt_tokens - 1] for i in range(rows)]
    loaded_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    gens = backend.generate(prompts, SamplingParams(temperature=0, max_new_tokens=new_tokens))
    seconds = time.perf_counter() - t
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"max_batch_size": size, "seconds": seconds, "loaded_gb": loaded_kb / 2**20,
            "peak_gb": peak_kb / 2**20, "generation_gb": (peak_kb - loaded_kb) / 2**20,
            "tokens": sum(len(g.completion_ids) for g in gens)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[64, 32, 16])
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=500)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child is not None:
        print(json.dumps(child(a.child, a.rows, a.prompt_tokens, a.new_tokens, a.model)))
        return
    results = []
    for size in a.sizes:
        out = subprocess.run([sys.executable, __file__, "--child", str(size), "--rows", str(a.rows),
                              "--prompt-tokens", str(a.prompt_tokens), "--new-tokens",
                              str(a.new_tokens), "--model", a.model],
                             check=True, capture_output=True, text=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"max_batch_size {size:>4}: peak {r['peak_gb']:.2f} GB (generation +{r['generation_gb']:.2f} GB "
              f"over the loaded model), {r['seconds']:.1f} s, {r['tokens']} tokens", flush=True)
    base = results[0]
    for r in results[1:]:
        print(f"{r['max_batch_size']} vs {base['max_batch_size']}: generation memory "
              f"{r['generation_gb'] / base['generation_gb']:.2f}x, time {r['seconds'] / base['seconds']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
