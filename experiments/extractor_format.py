"""Can the embedded model write the extractor's answers? Share of malformed outputs per answer
format, for the three extractor calls: extraction, merge and Search-and-Ask.

Well-formed (extraction and merge): the parser accepts the answer AND every text it adds is a
complete sentence (:func:`crl_bench.extractor.extraction.is_complete_sentence`: at least three
words, ending with ``.``/``!``/``?`` right after a word, so not empty and not cut by the token
cap). ``malformed`` counts the rest; ``unparsed`` counts what the parser alone rejects.

One run measures every format side by side on the same prompts (N samples per row, the ``cpu``
preset's 48 new tokens by default):

- extraction (a solved and a failed MiniHack-like episode):
  ``free`` (the model writes ``<answer>[...]</answer>`` itself), ``op`` (pre-filled
  ``<answer>[{"op": "``), ``title`` (pre-filled up to an ``add``'s title) and ``content``
  (:class:`crl_bench.extractor.extraction.ContentTemplate`: the model writes the content up to
  its closing quote) and ``sentence`` (:class:`~crl_bench.extractor.extraction.SentenceTemplate`,
  the ``cpu`` preset's format: one sentence of content, ended by its first sentence end);
- merge (one window of 5 entries): ``ops`` (the JSON decisions, ``extractor.merge_format=ops``,
  the ``cpu`` preset's format before the official one), ``items`` (the official
  ``<<<KNOWLEDGE_ITEM>>>`` answer, written freely), ``items+template``
  (``ItemTemplate(one_sentence=False)``: pre-filled up to one item, the model writes it) and
  ``items+sentence`` (:class:`crl_bench.extractor.merge.ItemTemplate`, the ``cpu`` preset's merge
  format: the title fixed from the window, the model writes one sentence of content);
- Search-and-Ask: ``short`` (our short prompt: an answer without ``<answer>`` is malformed) and
  ``official`` (``experience.ask_style=official``: such an answer is handed on whole).

Measured (SmolLM2-135M, 48 new tokens, seed 1, threads=1, the second command below), malformed
of 32 extraction answers (16 solved, 16 failed episodes) and 16 merge answers, parser-only in
brackets: extraction ``content`` 21/32 (3), ``sentence`` 2/32 (2) = 94% well-formed; merge
``items+template`` 11/16 (8), ``items+sentence`` 1/16 (1) = 94% well-formed. The remaining
failures are run-on sentences that reach the token cap. Generation time (stop strings end the
one-sentence fields early): extraction 28 s vs 87 s, merge 25 s vs 30 s for the same samples.

    OMP_NUM_THREADS=1 .venv/bin/python experiments/extractor_format.py --samples 4
    OMP_NUM_THREADS=1 .venv/bin/python experiments/extractor_format.py --samples 16 \
        --calls extraction,merge --formats content,sentence,items+template,items+sentence
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

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
ENTRIES = [
    ("Reach the stairs down: what worked", "Move toward the stairs down one step at a time, "
     "reducing the larger distance first."),
    ("Stairs to the east", "When the stairs are to the east, walk east until they are adjacent, "
     "then step onto them."),
    ("Reach the stairs down: what went wrong", "Walking into walls wastes turns; read the "
     "observation before moving."),
    ("Blocked path", "If a wall blocks the direct way to the stairs, go around it along the wall."),
    ("Diagonal moves", "When the stairs are both north and east, a northeast move covers both."),
]


def _entries():
    return [SimpleNamespace(id=i + 1, title=t, content=c, times_retrieved=1, n_used=0,
                            mean_outcome=None, render=lambda t=t, c=c: f"{t}: {c}")
            for i, (t, c) in enumerate(ENTRIES)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--samples", type=int, default=4, help="samples per row")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--show", type=int, default=1,
                   help="answers printed per row (malformed ones first)")
    p.add_argument("--calls", default="extraction,merge,ask",
                   help="comma-separated subset of extraction, merge, ask")
    p.add_argument("--formats", default="",
                   help="comma-separated subset of the formats (default: all)")
    args = p.parse_args(argv)

    import torch

    from crl_bench.extractor.extraction import (ContentTemplate, SentenceTemplate,
                                                 build_extraction_messages, extract_answer,
                                                 is_complete_sentence, parse_operations)
    from crl_bench.extractor.merge import (ItemTemplate, build_item_merge_messages,
                                           build_merge_messages, parse_merge_decisions,
                                           parse_merge_items)
    from crl_bench.extractor.search_ask import (EpisodeContext, build_official_ask_messages,
                                                build_search_ask_messages)
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import LoraSpec, SamplingParams

    torch.set_num_threads(args.threads)
    backend = HFBackend(args.model, roles=("extractor",), lora=LoraSpec(r=16, alpha=32),
                        device="cpu", seed=args.seed)
    templates = {"content": ContentTemplate(), "sentence": SentenceTemplate()}
    items = {"items+template": ItemTemplate(one_sentence=False), "items+sentence": ItemTemplate()}
    entries = _entries()
    ids = [e.id for e in entries]
    ctx = EpisodeContext(goal=GOAL, observation="The stairs down are 2 steps to the east.",
                         family="minihack")
    query = "Where are the stairs and how do I get there?"

    def extraction_row(fmt, success):
        messages = build_extraction_messages(
            GOAL, TRAJECTORY, {"success": success, "score": float(success), "n_actions": 4}, [])
        template = templates.get(fmt)
        prefill = template.prefill(GOAL, success) if template else {
            "free": "", "op": '<answer>[{"op": "', "title": '<answer>[{"op": "add", "title": "'}[fmt]
        stop = template.stop if template else ("</answer>",)

        def judge(g):
            a = template.answer(prefill, g.text) if template else prefill + g.text
            ops, unparsed = parse_operations(a, set())
            texts = [o.content for o in ops if o.kind in ("add", "update")]
            return unparsed, not all(map(is_complete_sentence, texts)), a
        return messages, prefill, stop, judge

    def merge_row(fmt):
        def ops(g):
            decisions, unparsed = parse_merge_decisions(g.text, ids)
            texts = [d.content for d in decisions if d.kind in ("merge", "rewrite")]
            return unparsed, not all(map(is_complete_sentence, texts)), g.text

        def item_answer(a):
            parsed = parse_merge_items(a)
            texts = [c for _, c in parsed or []]
            return parsed is None, not all(map(is_complete_sentence, texts)), a
        if fmt == "ops":
            return build_merge_messages(entries, "minihack"), "", ("</answer>",), ops
        if fmt == "items":
            return (build_item_merge_messages(entries), "", ("</answer>",),
                    lambda g: item_answer(g.text))
        item = items[fmt]
        prefill = item.prefill(entries)
        return (build_item_merge_messages(entries), prefill, item.stop,
                lambda g: item_answer(item.answer(g.text, g.finish_reason, prefill)))

    def ask_row(style):
        if style == "short":
            return (build_search_ask_messages(query, ctx, entries[:1]), "", ("</answer>",),
                    lambda g: (not extract_answer(g.text), False, g.text))
        return (build_official_ask_messages(query, entries[:1]), "", ("</answer>",),
                lambda g: (not (extract_answer(g.text) or g.text.strip()), False, g.text))

    rows = [("extraction", f, o, lambda f=f, o=o: extraction_row(f, o))
            for f in ("free", "op", "title", "content", "sentence") for o in (True, False)]
    rows += [("merge", f, None, lambda f=f: merge_row(f))
             for f in ("ops", "items", "items+template", "items+sentence")]
    rows += [("ask", s, None, lambda s=s: ask_row(s)) for s in ("short", "official")]

    calls = set(args.calls.split(","))
    formats = set(filter(None, args.formats.split(",")))
    rows = [r for r in rows if r[0] in calls and (not formats or r[1] in formats)]
    print(f"# extractor answer formats: model={args.model} samples={args.samples} per row, "
          f"max_new_tokens={args.max_new_tokens}, temperature 0.99, threads={args.threads}")
    print(f"{'call':<11} {'format':<15} {'outcome':<8} {'unparsed':>8} {'malformed':>9} "
          f"{'seconds':>8} {'tokens':>6}")
    totals: dict[tuple[str, str], list[int]] = {}
    for call, fmt, outcome, build in rows:
        messages, prefill, stop, judge = build()
        prompt = backend.chat_prompt_ids(messages)
        if prefill:
            prompt += backend.tokenizer(prefill, add_special_tokens=False)["input_ids"]
        sampling = SamplingParams(temperature=0.99, top_p=0.99, max_new_tokens=args.max_new_tokens,
                                  stop=stop, seed=args.seed)
        t0 = time.perf_counter()
        gens = backend.generate([prompt] * args.samples, sampling, adapter="extractor")
        seconds = time.perf_counter() - t0
        judged = [judge(g) for g in gens]
        unparsed = sum(u for u, _, _ in judged)
        bad = sum(u or s for u, s, _ in judged)
        tokens = sum(len(g.completion_ids) for g in gens) / max(len(gens), 1)
        tot = totals.setdefault((call, fmt), [0, 0, 0])
        tot[0] += bad
        tot[1] += len(judged)
        tot[2] += unparsed
        label = "-" if outcome is None else ("solved" if outcome else "failed")
        print(f"{call:<11} {fmt:<15} {label:<8} {unparsed:>4}/{len(judged):<3} {bad:>5}/"
              f"{len(judged):<3} {seconds:8.1f} {tokens:6.1f}")
        for _, _, a in sorted(judged, key=lambda j: not (j[0] or j[1]))[: args.show]:
            print("    " + json.dumps(a[-200:]))
    print("malformed share (parsed and complete sentences = well-formed): " + ", ".join(
        f"{c}/{f} {v[0]}/{v[1]} (unparsed {v[2]})" for (c, f), v in totals.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
