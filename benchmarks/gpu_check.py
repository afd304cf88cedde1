"""One-command GPU check (< 8 min on one H100/H200), one summary at the end.

    python benchmarks/gpu_check.py                 # on a GPU machine
    python benchmarks/gpu_check.py --small         # CPU, a small shape (the test runs this)

Sections (each timed; a failing section is reported and the others still run):

1. ``tiny_run``: ``crl-bench run --preset tiny`` for one step on the device (``--tasks``,
   default ``swe``: it needs only git, so it runs where NLE / ALFWorld are not installed), i.e.
   the real trainer and HF generation on CUDA; reports the run's metrics record.
2. ``logprob_agreement``: the ``tiny-sft`` model through the HF backend in bf16: sampling
   log-probs recorded by generation vs the same tokens' log-probs recomputed by the training
   forward (``HFBackend.logprobs``), and both vs an fp32 recompute.
3. ``update``: a model with Qwen2.5-7B's shape (``Qwen2Config``: 28 layers, hidden 3584, FFN
   18944, 28 heads / 4 KV heads, vocab 152064) built from the config with random weights (no
   download), bf16, full-parameter AdamW: forward + backward + optimiser step on B x T tokens;
   tokens/s and MFU = 6 N tokens/s / peak bf16 FLOP/s (peak from the device name; attention
   FLOPs left out, so MFU is slightly understated).
4. ``generation``: the same model, ``model.generate`` with KV cache, B prompts of P tokens,
   exactly G new tokens each (sampling): generated tokens/s.

``--small`` shrinks the shape (2 layers, hidden 64) and the batch so that everything runs on a
CPU in well under a minute (the tiny run still takes its ~20-60 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                 max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=False)
SMALL = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=4096, max_position_embeddings=2048,
             tie_word_embeddings=False)
# dense bf16 peak FLOP/s (no sparsity) by device-name substring
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
             "L40S": 362e12, "A10G": 70e12, "L4": 121e12, "4090": 165e12}


def device_info(device: str) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
        return {"device": name, "peak_bf16_flops": peak,
                "memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
    return {"device": "cpu", "peak_bf16_flops": None, "threads": torch.get_num_threads()}


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- 1. tiny run -------------------------------------------------------------------------------
def tiny_run(device: str, tasks: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "crl_bench.cli", "run", "--agent", "grpo", "--tasks", tasks,
           "--preset", "tiny", "--steps", "1", "--out", str(out), "--no-progress",
           "--set", f"model.device={device}", "--set", "eval.episodes_per_task=1"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"crl-bench run failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout)[-1500:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    keep = {k: v for k, v in last.items() if k.startswith(("charts/success_rate", "losses/actor_loss",
                                                           "losses/actor_grad_norm",
                                                           "timing_s/step", "timing_s/rollout",
                                                           "timing_s/actor_update"))}
    return {"wall_s": round(wall, 1), "steps": last.get("step"), **keep}


# -- 2. log-prob agreement ---------------------------------------------------------------------
def logprob_agreement(device: str, n: int = 8, new_tokens: int = 32) -> dict[str, Any]:
    import torch

    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import SamplingParams

    questions = ["You are in a room with a door to the east. What do you do?",
                 "Find the bug in: def add(a, b): return a - b", "Buy a red shirt under $20.",
                 "Put a clean mug in the coffee machine.", "Which way is north?",
                 "Say hi.", "Describe the room.", "Open the drawer."]
    out: dict[str, Any] = {}
    temp = 0.99
    bf16 = HFBackend("tiny-sft", roles=("actor",), dtype="bfloat16", device=device, seed=0)
    prompts = [bf16.chat_prompt_ids([{"role": "user", "content": questions[i % len(questions)]}])
               for i in range(n)]
    gens = bf16.generate(prompts, SamplingParams(temperature=temp, top_p=0.99,
                                                 max_new_tokens=new_tokens, seed=1))
    sampled = [list(g.logprobs) for g in gens]
    train_bf16 = bf16.logprobs([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                               "actor", temperature=temp)
    fp32 = HFBackend("tiny-sft", roles=("actor",), dtype="float32", device=device, seed=0)
    # the same LoRA weights in fp32 (the adapters were initialised from the same seed)
    from crl_bench.distributed.learner import load_role_weights, role_weights

    load_role_weights(fp32, "actor", [w.float() for w in role_weights(bf16, "actor")])
    train_fp32 = fp32.logprobs([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                               "actor", temperature=temp)

    def diffs(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
        x = torch.tensor([v for row in a for v in row])
        y = torch.tensor([v for row in b for v in row])
        d = (x - y).abs()
        return {"max_abs": round(float(d.max()), 5), "mean_abs": round(float(d.mean()), 5),
                "ratio_max": round(float((x - y).exp().max()), 4)}

    out["tokens"] = sum(len(s) for s in sampled)
    out["gen_bf16_vs_train_bf16"] = diffs(sampled, train_bf16)
    out["gen_bf16_vs_train_fp32"] = diffs(sampled, train_fp32)
    out["train_bf16_vs_train_fp32"] = diffs(train_bf16, train_fp32)
    return out


# -- 3./4. the 7B shape ------------------------------------------------------------------------
def build_model(shape: dict[str, Any], device: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**shape)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    return model


def update_throughput(model: Any, device: str, batch: int, seq: int, steps: int,
                      peak: float | None) -> dict[str, Any]:
    import torch

    n_params = sum(p.numel() for p in model.parameters())
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)

    def one() -> float:
        out = model(input_ids=ids, use_cache=False)
        logits = out.logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    one()  # warm-up (allocations, kernels, optimiser state)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        one()
    sync(device)
    dt = (time.perf_counter() - t) / steps
    tps = batch * seq / dt
    res = {"params_b": round(n_params / 1e9, 3), "batch": batch, "seq": seq,
           "step_s": round(dt, 3), "tokens_per_s": round(tps, 1),
           "model_tflops": round(6 * n_params * tps / 1e12, 2)}
    res["mfu"] = round(6 * n_params * tps / peak, 3) if peak else None
    if device.startswith("cuda"):
        res["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    del opt
    return res


def generation_throughput(model: Any, device: str, batch: int, prompt: int, new: int) -> dict[str, Any]:
    import torch

    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, vocab, (batch, prompt), generator=g).to(device)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=0.99, top_p=0.99,
              use_cache=True, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids[:, :8], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        sync(device)
        t = time.perf_counter()
        out = model.generate(ids, **kw)
        sync(device)
    dt = time.perf_counter() - t
    generated = (out.shape[1] - prompt) * batch
    return {"batch": batch, "prompt": prompt, "new_tokens": new, "wall_s": round(dt, 2),
            "tokens_per_s": round(generated / dt, 1)}


def section(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    t = time.perf_counter()
    try:
        results[name] = {"ok": True, **fn()}
    except Exception as exc:  # one failing part must not hide the others
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                         "trace": traceback.format_exc()[-1500:]}
    results[name]["section_s"] = round(time.perf_counter() - t, 1)
    print(f"[gpu_check] {name}: {'ok' if results[name]['ok'] else 'FAILED'} "
          f"({results[name]['section_s']} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="a small shape, on CPU (tests)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--tasks", default="swe", help="task set of the tiny run (default swe)")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    ap.add_argument("--json", default=None, help="also write the summary to this file")
    args = ap.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and not args.small:
        print("[gpu_check] no GPU: running the small shape on CPU", flush=True)
        args.small = True
    if device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    skip = {s for s in args.skip.split(",") if s}
    info = device_info(device)
    results: dict[str, Any] = {"device": info, "small": args.small}
    t0 = time.perf_counter()
    if "tiny_run" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            section(results, "tiny_run", lambda: tiny_run(device, args.tasks, Path(tmp) / "run"))
    if "logprob_agreement" not in skip:
        section(results, "logprob_agreement", lambda: logprob_agreement(device))
    shape = SMALL if args.small else QWEN25_7B
    dtype = torch.bfloat16
    model_box: dict[str, Any] = {}
    if not {"update", "generation"} <= skip:
        section(results, "build_model", lambda: (model_box.setdefault(
            "m", build_model(shape, device, dtype)), {"shape": "small" if args.small
                                                      else "Qwen2.5-7B"})[1])
    if "m" in model_box:
        if "update" not in skip:
            b, s, n = (2, 64, 2) if args.small else (4, 1024, 5)
            section(results, "update", lambda: update_throughput(
                model_box["m"], device, b, s, n, info.get("peak_bf16_flops")))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        if "generation" not in skip:
            b, p, g = (4, 16, 8) if args.small else (32, 512, 128)
            section(results, "generation", lambda: generation_throughput(
                model_box["m"], device, b, p, g))
    results["total_s"] = round(time.perf_counter() - t0, 1)
    results["ok"] = all(v.get("ok", True) for v in results.values() if isinstance(v, dict))
    for v in results.values():
        if isinstance(v, dict):
            v.pop("trace", None) if v.get("ok", True) else None
    print("=" * 30 + " gpu_check summary " + "=" * 30)
    print(json.dumps(results, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
