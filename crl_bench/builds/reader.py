"""``smollm2-135m-reader``: SmolLM2-135M-Instruct taught to act on the experience block of its prompt,
and nothing about any task's rule.

    crl-bench build-model smollm2-135m-reader        # one command; cached like the other models

Why: the embedded 135M actor does not read. Given a success entry naming a move it sends that move
no more often than any other (results/experience_helps, "Does the actor act on an entry?"); the
paper's actor, an instruction-tuned 7B model, acts on what its prompt says. A testbed that asks
whether experience helps needs an actor that acts on its experience — without being given the task.

The warm start (:func:`build_reader`): supervised LoRA fine-tuning of the base model on first-turn
prompts in exactly the testbed's format (:data:`PROMPT_SETTINGS` on the ``cpu`` preset: the rollout
engine's system prompt, goal, experience block, observation, admissible actions and answer format
with the placeholder example, the ``<answer>`` pre-fill), rendered from real
``crl/MiniHack-Room-Landmark-5x5-v0`` resets of levels :data:`FIRST_LEVEL` on (past every run's
training seeds and the evaluation block). Each prompt is one of three conditions, in equal shares:

* ``success``: the experience block holds one entry as the bank's ``action`` template writes it
  (``<goal>: what worked: To succeed, take the action M.``) with M drawn uniformly from the eight
  moves; the target is M.
* ``failure``: ``<goal>: what went wrong: To avoid this failure, do not take the action X.`` with X
  drawn uniformly (one in ten a non-move, as an entry naming an invalid answer of the actor's
  does); the target is drawn uniformly from the moves other than X.
* ``none``: no experience; the target is drawn uniformly from the eight moves.

No information about the test rule: every move (M, X and every target) is drawn from a generator
seeded by the recipe's seed alone — never from the level, its landmark or its observation — so the
targets are independent of the rule by construction. :func:`data_check` measures it on the data
itself (the rule's move as target at chance; no observation feature, cross-validated, predicting the
target better than chance; written to the model folder and tested, tests/test_reader_data.py).

Why LoRA merged into the weights rather than full fine-tuning: on 2 shared CPU cores the LoRA
backward skips the base weights' gradients and its optimiser state is ~1% of the model's, and the
small rank keeps the base model's instruction following close to where it was; the merged weights
are an ordinary checkpoint (fp32 safetensors: a bf16 copy would round away part of the small delta),
on which every agent's run adds its own LoRA as on the base model.

Seeded and deterministic (``threads`` torch threads during the build, 2; the data, its order and the LoRA init
come from the recipe's seed). ``crl_bench_reader.json`` in the model folder holds the recipe, the data
check, the loss per step and the build's wall and CPU time.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crl_bench.llm.models import READER_VERSION

READER_MODEL = "smollm2-135m-reader"
ENV_ID = "crl/MiniHack-Room-Landmark-5x5-v0"
FIRST_LEVEL = 9_000_000
"""The warm start's level seeds start here: past every run's training seeds
(``run_seed * 1_000_003 + index`` for run seeds up to 8) and the evaluation block (1,000,000 on)."""
CONDITIONS = ("none", "success", "failure")
NON_MOVES = ("wait", "search", "look", "go north", "up", "pick up", "north north", "rock")
"""Failure claims that name no move (an entry that copied an invalid answer of the actor's)."""

PROMPT_SETTINGS: dict[str, Any] = {
    "rollout.history": 0, "rollout.example_pick": "placeholder",
    "rollout.env_max_steps": {"minihack": 1},
    "rollout.env_kwargs": {"minihack": {"view": "compact"}},
}
"""The prompt settings (on the ``cpu`` preset) the reader is trained on and the reader comparison
runs with: no history (one action per episode), the placeholder answer example, the compact view."""

READER_FILE = "crl_bench_reader.json"


@dataclass(frozen=True)
class ReaderRecipe:
    """Everything the warm start depends on; the model folder's name carries its version."""

    base: str = "smollm2-135m"
    examples: int = 1024
    epochs: int = 1
    batch: int = 8
    lr: float = 1e-3
    warmup_steps: int = 4
    lora_r: int = 16
    lora_alpha: int = 32
    lora_layers: int = 14
    """LoRA on the last this many decoder layers only (0: all): the backward pass then stops at the
    first adapted layer, which halves a step's cost on CPU."""
    autocast_bf16: bool = True
    """Forward and backward under CPU bf16 autocast (the weights, the adapters and the optimiser
    stay fp32): ~3x faster matmuls on this CPU (AMX), deterministic, and the targets are one to
    four tokens whose loss does not need fp32 precision."""
    seed: int = 0
    paired: bool = True
    """Entries come in twins: a success prompt ("take Y", target Y) and, on the same level, a
    failure prompt naming the same Y ("do not take Y", target a move other than Y), so that the
    entry's stem is all that tells them apart. Without twins (the first recipe) the model learnt
    to copy the named move but not to avoid it: "do not take X" made it send X in 78% of the
    held-out probe's episodes."""
    none_share: float = 0.2
    """Share of draws that are a prompt without experience (the rest: twins, or single entries
    when ``paired`` is off)."""
    ask_share: float = 0.5
    """Share of prompts whose format line offers Search-and-Ask (the runs offer it to
    with-experience episodes)."""
    non_move_share: float = 0.1
    capital_share: float = 0.2
    """Share of claims whose move is written capitalised (entries copy the actor's spelling)."""
    avoid_unlikelihood: float = 1.0
    """Weight of an unlikelihood term on failure prompts whose claim is a move X:
    ``-log(1 - p)``, p the probability of X's first token (lower-case and capitalised) where the
    answer starts. The cross-entropy on a random move other than X pushes X down only through
    that draw's noise; this term pushes it down directly (version 3, without it, still sent X in
    13% of the held-out probe's "do not take X" episodes)."""
    threads: int = 2
    save_dtype: str = "float32"


RECIPE = ReaderRecipe()
VERSION = READER_VERSION
"""The recipe's version: the model folder's name (``crl_bench.llm.models``) carries it."""


@dataclass
class ReaderExample:
    level: int
    condition: str
    claim: str | None
    """The move the entry names (as written), None without an entry."""
    target: str
    landmark: str
    ring: int
    rule: str
    observation: str
    experience_text: str
    asks_left: int


def prompt_config(cfg: Any = None) -> Any:
    """The actor's :class:`~crl_bench.llm.prompting.PromptConfig` under ``cfg`` (default: the
    ``cpu`` preset with :data:`PROMPT_SETTINGS`), as the runner's player builds it."""
    from crl_bench.llm.prompting import PromptConfig

    if cfg is None:
        cfg = reader_config()
    r, x = cfg.rollout, cfg.experience
    kwargs = dict(history=r.history, think=r.think, max_episode_tokens=r.max_episode_tokens,
                  sequence_length=r.sequence_length or None, ask_style=x.ask_style,
                  format_penalty=r.format_penalty, max_asks=x.max_asks,
                  conversation=r.conversation, observation_last=r.observation_last,
                  experience_last=r.experience_last)
    if r.small_model_prompt:
        kwargs.pop("think")
        return PromptConfig.for_small_model(example_pick=r.example_pick, **kwargs)
    return PromptConfig(**kwargs)


def reader_config(model: str | None = None) -> Any:
    from crl_bench.config.schema import build_config

    overrides = dict(PROMPT_SETTINGS)
    if model is not None:
        overrides["model.actor"] = model
    return build_config(agent="comp_rl", tasks=ENV_ID, preset="cpu", overrides=overrides)


def examples(recipe: ReaderRecipe = RECIPE, n: int | None = None,
             first_level: int = FIRST_LEVEL) -> list[ReaderExample]:
    """The warm start's prompts and targets (module docstring), from real resets of ``n``
    (default ``recipe.examples``) levels from ``first_level`` on. The conditions, claims and
    targets are drawn from the recipe's seed alone: other levels give the same sequence."""
    import gymnasium

    import crl_bench  # noqa: F401  (registers the envs)
    from crl_bench.envs.minihack.landmark import landmark_layout
    from crl_bench.envs.minihack.language import DIRECTIONS
    from crl_bench.experience.bank_schema import render_entry_text
    from crl_bench.extractor.extraction import ActionTemplate

    template = ActionTemplate()
    success_stem, failure_stem = template.content_stems
    rng = random.Random(f"reader-data:{recipe.seed}")
    env = gymnasium.make(ENV_ID, view="compact", max_steps=1)
    out = []
    total = recipe.examples if n is None else n
    level = first_level - 1
    try:
        while len(out) < total:
            level += 1
            observation, info = env.reset(seed=level)
            kind, _, rule = landmark_layout(level)
            ring = (level // 8) % 16  # the landmark's ring square (landmark_layout's square)
            goal = info["goal"]

            def add(condition: str, claim: str | None, target: str, text: str) -> None:
                asks = 2 if rng.random() < recipe.ask_share else 0
                out.append(ReaderExample(level=level, condition=condition, claim=claim,
                                         target=target, landmark=kind, ring=ring, rule=rule,
                                         observation=observation, experience_text=text,
                                         asks_left=asks))

            def failure(named: str, claim: str) -> None:
                add("failure", claim, rng.choice([d for d in DIRECTIONS if d != named]),
                    render_entry_text(template.title(goal, False), f"{failure_stem} {claim}."))

            if recipe.paired:
                draw = rng.random()
                if draw < recipe.none_share:
                    add("none", None, rng.choice(DIRECTIONS), "")
                elif rng.random() < recipe.non_move_share:
                    named = rng.choice(NON_MOVES)
                    failure(named, named)
                else:  # twins: the same move, taken or avoided
                    move = rng.choice(DIRECTIONS)
                    claim = _spell(move, rng, recipe)
                    add("success", claim, move, render_entry_text(template.title(goal, True),
                                                                  f"{success_stem} {claim}."))
                    failure(move, _spell(move, rng, recipe))
                continue
            condition = rng.choice(CONDITIONS)
            if condition == "none":
                add("none", None, rng.choice(DIRECTIONS), "")
            elif condition == "success":
                target = rng.choice(DIRECTIONS)
                claim = _spell(target, rng, recipe)
                add("success", claim, target, render_entry_text(template.title(goal, True),
                                                                f"{success_stem} {claim}."))
            elif rng.random() < recipe.non_move_share:
                named = rng.choice(NON_MOVES)
                failure(named, named)
            else:
                named = rng.choice(DIRECTIONS)
                failure(named, _spell(named, rng, recipe))
        del out[total:]
    finally:
        env.close()
    return out


def _spell(move: str, rng: random.Random, recipe: ReaderRecipe) -> str:
    return move.capitalize() if rng.random() < recipe.capital_share else move


def messages(example: ReaderExample, prompt: Any, goal: str, family: str = "minihack"
             ) -> list[dict[str, str]]:
    """The chat messages of the example's first turn, as the rollout engine builds them."""
    from crl_bench.envs.minihack.language import DIRECTIONS
    from crl_bench.llm.prompting import build_messages

    return build_messages(prompt, family=family, goal=goal, observation=example.observation,
                          history=[], admissible_actions=list(DIRECTIONS),
                          experience_text=example.experience_text,
                          asks_left=min(example.asks_left, prompt.max_asks), turn_index=0)


def tokenized(data: list[ReaderExample], tokenizer: Any, prompt: Any, goal: str
              ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids): the engine's prompt ids (chat template, assistant header, the
    ``<answer>`` pre-fill) and ``MOVE</answer>`` plus the end-of-turn token."""
    a = prompt.answer_tag
    prefix = prompt.response_prefix
    if prefix and not f"<{a}>".startswith(prefix):
        raise ValueError(f"the response prefix {prefix!r} does not start an answer <{a}>")
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
    out = []
    for ex in data:
        ids = tokenizer.apply_chat_template(messages(ex, prompt, goal), add_generation_prompt=True,
                                            tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        target = tokenizer(f"<{a}>{ex.target}</{a}>"[len(prefix):],
                           add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            target = target + [tokenizer.eos_token_id]
        out.append(([int(t) for t in ids] + list(prefix_ids), [int(t) for t in target]))
    return out


# -- the data check ------------------------------------------------------------------------------

FEATURES = ("landmark", "ring", "layout", "observation")
"""Observation features a predictor of the target may use: the landmark's kind, its ring square,
the layout (both), and the whole observation text."""


def binomial_upper_p(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exactly."""
    if k <= 0:
        return 1.0
    return float(sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def data_check(data: list[ReaderExample]) -> dict[str, Any]:
    """Does the warm-start data carry the test rule? Per condition and overall:

    * ``rule_target``: examples whose target is the level's rule move (chance 1/8; for
      ``failure`` 1/7 of those whose claim is a move other than the rule's, 1/8 overall is
      reported as measured);
    * ``features``: for each observation feature (:data:`FEATURES`), a two-fold cross-validated
      majority-vote predictor (each feature value -> its most frequent target in the other half;
      unseen values predict nothing; the halves a seeded random split) and its accuracy on the
      held-out halves, with the exact
      one-sided binomial p against chance 1/8 (``p_above_chance``);
    * ``target_counts``: how often each move is the target.

    Returns the figures; :func:`data_check_passes` applies the bar."""
    from crl_bench.envs.minihack.language import DIRECTIONS

    def feature(ex: ReaderExample, name: str) -> str:
        return {"landmark": ex.landmark, "ring": str(ex.ring),
                "layout": f"{ex.landmark}:{ex.ring}", "observation":
                "\n".join(line for line in ex.observation.splitlines()
                          if not line.startswith("Message:"))}[name]

    out: dict[str, Any] = {}
    for condition in ("all", *CONDITIONS):
        rows = [e for e in data if condition in ("all", e.condition)]
        n = len(rows)
        rule = sum(e.target == e.rule for e in rows)
        feats = {}
        for name in FEATURES:
            # two halves drawn at random (a fixed seed), not by position: consecutive levels
            # cycle through the landmark kinds, so even / odd positions would hold disjoint kinds
            order = random.Random(f"data-check:{condition}").sample(range(n), n)
            halves = ([rows[j] for j in order[0::2]], [rows[j] for j in order[1::2]])
            hits = 0
            for train, test in ((halves[0], halves[1]), (halves[1], halves[0])):
                votes: dict[str, Counter[str]] = {}
                for e in train:
                    votes.setdefault(feature(e, name), Counter())[e.target] += 1
                for e in test:
                    v = votes.get(feature(e, name))
                    if v:
                        best = max(v.values())
                        # ties: the alphabetically first of the most frequent (deterministic)
                        guess = min(m for m, c in v.items() if c == best)
                        hits += guess == e.target
            feats[name] = {"hits": hits, "n": n, "accuracy": hits / n if n else float("nan"),
                           "p_above_chance": binomial_upper_p(hits, n, 1 / 8)}
        counts = Counter(e.target for e in rows)
        out[condition] = {"n": n, "rule_target": {"k": rule, "n": n, "share": rule / n if n else
                                                  float("nan"),
                                                  "p_above_chance": binomial_upper_p(rule, n, 1 / 8)},
                          "features": feats,
                          "target_counts": {d: counts[d] for d in DIRECTIONS}}
    return out


CHECK_ALPHA = 0.01


def data_check_passes(check: dict[str, Any], alpha: float = CHECK_ALPHA) -> list[str]:
    """What fails the bar (empty: passes): the rule's move, or any feature's predictor, above
    chance at one-sided exact p below ``alpha`` over the number of tests (Bonferroni: a family-wise
    ``alpha`` over the 4 x 5 tests) in any condition."""
    tests = sum(1 + len(c["features"]) for c in check.values())
    alpha = alpha / max(1, tests)
    bad = []
    for condition, c in check.items():
        if c["n"] and c["rule_target"]["p_above_chance"] < alpha:
            bad.append(f"{condition}: the rule's move is the target {c['rule_target']['k']}/"
                       f"{c['n']} (p {c['rule_target']['p_above_chance']:.2g})")
        for name, f in c["features"].items():
            if f["n"] and f["p_above_chance"] < alpha:
                bad.append(f"{condition}: the {name} predicts the target {f['hits']}/{f['n']} "
                           f"(p {f['p_above_chance']:.2g})")
    return bad


# -- the build ------------------------------------------------------------------------------------

def build_reader(out: Path, recipe: ReaderRecipe = RECIPE, log: Any = print) -> dict[str, Any]:
    """Train the reader (module docstring) and write the merged checkpoint, its tokenizer and
    :data:`READER_FILE` into ``out``. Returns what :data:`READER_FILE` holds."""
    import gymnasium
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import crl_bench  # noqa: F401
    from crl_bench.envs.minihack.language import DIRECTIONS
    from crl_bench.llm.batching import collate_sequences
    from crl_bench.llm.models import load_tokenizer, resolve_model

    t0, c0 = time.perf_counter(), time.process_time()
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        data = examples(recipe)
        check = data_check(data)
        failing = data_check_passes(check)
        if failing:
            raise RuntimeError("the reader's warm-start data predicts its targets: "
                               + "; ".join(failing))
        env = gymnasium.make(ENV_ID, view="compact", max_steps=1)
        goal = env.reset(seed=FIRST_LEVEL)[1]["goal"]
        env.close()
        prompt = prompt_config()
        tokenizer = load_tokenizer(recipe.base)
        pairs = tokenized(data, tokenizer, prompt, goal)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.seed)
            model = AutoModelForCausalLM.from_pretrained(resolve_model(recipe.base),
                                                         dtype=torch.float32)
            model.config.use_cache = False
            layers = model.config.num_hidden_layers
            chosen = (list(range(layers - recipe.lora_layers, layers)) if recipe.lora_layers
                      else None)
            lora = LoraConfig(r=recipe.lora_r, lora_alpha=recipe.lora_alpha, lora_dropout=0.0,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                              "up_proj", "down_proj"], task_type="CAUSAL_LM",
                              layers_to_transform=chosen)
            model = get_peft_model(model, lora)
            model.train()
            inner, head = model.base_model.model.model, model.base_model.model.lm_head
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
            total = math.ceil(len(pairs) / recipe.batch) * recipe.epochs
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(
                1.0, (s + 1) / max(1, recipe.warmup_steps)) * max(0.0, 1 - s / max(1, total)))
            losses, tokens, step = [], 0, 0
            # each move's first answer token, lower-case and capitalised (the unlikelihood term)
            first_ids = {m: sorted({tokenizer(w, add_special_tokens=False)["input_ids"][0]
                                    for w in (m, m.capitalize())}) for m in DIRECTIONS}
            by_condition: dict[str, list[float]] = {}
            pad = tokenizer.pad_token_id or 0
            for epoch in range(recipe.epochs):
                order = random.Random(f"reader-order:{recipe.seed}:{epoch}").sample(
                    range(len(pairs)), len(pairs))
                for start in range(0, len(order), recipe.batch):
                    batch = [pairs[j] for j in order[start:start + recipe.batch]]
                    b = collate_sequences([p for p, _ in batch], [t for _, t in batch], pad)
                    # the LM head only where a target token is predicted (its full-vocabulary
                    # logits at every prompt position would cost ~10% more and 0.6 GB)
                    with torch.autocast("cpu", dtype=torch.bfloat16,
                                        enabled=recipe.autocast_bf16):
                        hidden = inner(input_ids=b.input_ids,
                                       attention_mask=b.attention_mask).last_hidden_state
                        where = b.loss_mask.bool()
                        logits = head(hidden[:, :-1][where]).float()
                    per_token = torch.nn.functional.cross_entropy(
                        logits, b.input_ids[:, 1:][where], reduction="none")
                    loss = per_token.mean()
                    rows = where.nonzero()[:, 0]
                    avoid = []
                    for j in range(len(batch)):
                        ex = data[order[start + j]]
                        sel = per_token[rows == j].detach()
                        by_condition.setdefault(ex.condition, []).append(round(float(sel.mean()), 4))
                        if recipe.avoid_unlikelihood and ex.condition == "failure" \
                                and ex.claim is not None and ex.claim.lower() in first_ids:
                            first = int((rows == j).nonzero()[0, 0])  # where the answer starts
                            p = torch.softmax(logits[first], -1)[first_ids[ex.claim.lower()]].sum()
                            avoid.append(-torch.log1p(-p.clamp(max=1 - 1e-6)))
                    if avoid:
                        loss = loss + recipe.avoid_unlikelihood * torch.stack(avoid).sum() / len(batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    schedule.step()
                    step += 1
                    tokens += int(b.attention_mask.sum())
                    losses.append(round(float(loss.detach()), 5))
                    if step == 1 or step % 10 == 0 or step == total:
                        wall = time.perf_counter() - t0
                        recent = {c: sum(v[-32:]) / len(v[-32:]) for c, v in by_condition.items()}
                        per = ", ".join(f"{c} {x:.2f}" for c, x in sorted(recent.items()))
                        log(f"reader: step {step}/{total}  loss {losses[-1]:.3f}  (last 32 per "
                            f"condition: {per})  "
                            f"{tokens / max(wall, 1e-9):.0f} tok/s overall ({wall:.0f} s)")
            model = model.merge_and_unload()
        model.eval()
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[recipe.save_dtype]
        model = model.to(dtype)
        model.config.dtype = recipe.save_dtype
        model.config.use_cache = True
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(str(out), safe_serialization=True)
        AutoTokenizer.from_pretrained(resolve_model(recipe.base)).save_pretrained(str(out))
        info = {"name": READER_MODEL, "version": VERSION, "recipe": asdict(recipe),
                "prompt_settings": PROMPT_SETTINGS, "first_level": FIRST_LEVEL,
                "examples": len(data), "conditions": dict(Counter(e.condition for e in data)),
                "data_check": check, "losses": losses,
                "losses_by_condition": by_condition, "steps": step, "tokens": tokens,
                "example_prompt": tokenizer.decode(pairs[0][0]) if pairs else "",
                "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
        (out / READER_FILE).write_text(json.dumps(info, indent=1) + "\n")
        return info
    finally:
        torch.set_num_threads(threads)


def build_known_reader(out: Path) -> None:
    """:data:`crl_bench.llm.models.KNOWN_MODELS`' builder of ``smollm2-135m-reader``."""
    build_reader(out, RECIPE)
