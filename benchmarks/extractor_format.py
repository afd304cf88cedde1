"""Can the embedded model write the extractor's answer? Valid-answer rate per answer format.

For a solved and a failed MiniHack-like episode, samples N extractor answers with the real
extractor prompt under four formats and counts how many pass the strict parser:

- ``free``: the model writes ``<answer>[...]</answer>`` itself;
- ``op``: the assistant turn is pre-filled with ``<answer>[{"op": "``;
- ``title``: pre-filled up to the title of an ``add`` (``<answer>[{"op": "add", "title": "``);
- ``content``: :class:`crl_bench.extractor.extraction.ContentTemplate` (op and title fixed, the
  model writes the content and closes it with a quote) — the ``cpu`` preset's format.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/extractor_format.py --samples 8
"""

from __future__ import annotations

import argparse
import json
import time

TRAJECTORY = """[step 1]
You are in a small room. The stairs down are 3 steps to the east and 1 step to the north.
> east
[step 2]
The stairs down are 2 steps to the east and 1 step to the north.
> north
[step 3]
The stairs down are 2 steps to the east.
> east
[step 4]
The stairs down are 1 step to the east.
> east"""
GOAL = "Reach the stairs down."


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--samples", type=int, default=8, help="samples per (format, outcome)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--show", type=int, default=2, help="answers printed per row")
    args = p.parse_args(argv)

    import torch

    from crl_bench.extractor.extraction import (ContentTemplate, build_extraction_messages,
                                                 parse_operations)
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import LoraSpec, SamplingParams

    torch.set_num_threads(args.threads)
    backend = HFBackend(args.model, roles=("extractor",), lora=LoraSpec(r=16, alpha=32),
                        device="cpu", seed=args.seed)
    template = ContentTemplate()
    print(f"# extractor answer formats: model={args.model} samples={args.samples} per row, "
          f"max_new_tokens={args.max_new_tokens}, temperature 0.99")
    print(f"{'format':<8} {'outcome':<8} {'valid':>7} {'seconds':>8}")
    totals: dict[str, list[int]] = {}
    for fmt in ("free", "op", "title", "content"):
        for success in (True, False):
            messages = build_extraction_messages(
                GOAL, TRAJECTORY, {"success": success, "score": float(success), "n_actions": 4}, [])
            prefill = {"free": "", "op": '<answer>[{"op": "',
                       "title": '<answer>[{"op": "add", "title": "',
                       "content": template.prefill(GOAL, success)}[fmt]
            ids = backend.chat_prompt_ids(messages)
            if prefill:
                ids += backend.tokenizer(prefill, add_special_tokens=False)["input_ids"]
            stop = template.stop if fmt == "content" else ("</answer>",)
            sampling = SamplingParams(temperature=0.99, top_p=0.99, max_new_tokens=args.max_new_tokens,
                                      stop=stop, seed=args.seed)
            t0 = time.perf_counter()
            gens = backend.generate([ids] * args.samples, sampling, adapter="extractor")
            seconds = time.perf_counter() - t0
            answers = [template.answer(prefill, g.text) if fmt == "content" else prefill + g.text
                       for g in gens]
            valid = sum(not parse_operations(a, set())[1] for a in answers)
            tot = totals.setdefault(fmt, [0, 0])
            tot[0] += valid
            tot[1] += len(answers)
            print(f"{fmt:<8} {'solved' if success else 'failed':<8} {valid:>3}/{len(answers):<3} "
                  f"{seconds:8.1f}")
            for a in answers[: args.show]:
                print("    " + json.dumps(a[:160]))
    print("total valid: " + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
