"""The Landmark task family measured before any comparison run: its floors, whether the 135M
actor can hold the rule, and whether the ``cpu`` extractor can write an entry that carries it.

    OMP_NUM_THREADS=1 python experiments/minihack_landmark.py --baselines --probe --extractor \\
        --set threads=1 --out results/experience_helps/task_family.json
    python experiments/minihack_landmark.py --baselines --probe --extractor --smoke   # seconds

``crl/MiniHack-Room-Landmark-5x5-v0`` (``crl_bench.envs.minihack.landmark``): the stairs are
hidden under one of eight rocks around the agent; the kind of the room's landmark says which
(the fountain always means southwest). One action per episode.

* ``--baselines``: on ``--levels`` held-out levels (seeds from 1,000,000, the runner's evaluation
  block), one episode per level and policy, on the real env: a uniform random admissible action
  (chance), each of the 8 constant moves (the best is the best constant policy), a move toward the
  landmark, and the rule itself (the ceiling: every layout must be solvable by it).
* ``--probe``: the supervised capacity check. The ``--preset`` actor (``cpu``: SmolLM2-135M with
  its LoRA) is trained by plain cross-entropy on ``--examples`` labelled first turns of training
  levels (seeds from 0; the exact prompt the rollout engine builds, target ``<answer>MOVE</answer>``
  with the rule's move), ``--batch`` examples per AdamW step; before and after, the real engine
  plays the first turn of the held-out levels ``--samples`` times at the preset's temperature and
  the env scores it. Not a training path of the suite: it says whether the model *can* hold the
  eight pairs, and how many labelled examples that takes.
* ``--extractor``: real trajectories (the untrained actor on ``--episodes`` training levels)
  rendered as the extractor sees them; the ``cpu`` preset's extractor (its answer template, its
  sampling) writes one answer each. Counted: well-formed answers (the strict parser accepts
  them) and *usable* entries — well-formed, from a solved episode, naming the landmark and the
  move that solved it (what an entry must say to carry the rule).

* ``--follow``: does the actor (untrained, or ``--run RUN_DIR``'s last checkpoint) send the
  move an experience entry names? The real engine plays the first turn of the held-out levels
  with and without the format line's example move (``rollout.example_pick`` random / none) and
  with no entry, a right success entry (the rule's move) or a wrong one (the next move
  clockwise), rendered as a bank entry of the ``action`` template. Counted: success, a valid
  move, the example's move, the claim's move. ``--follow-claims take_random avoid_random none
  --follow-examples placeholder --follow-asks`` measures the bar an actor that reads must pass
  (:data:`READER_BAR`); ``follow-table A.json B.json --out T.md`` tables such files side by side.

Wall and CPU time of each part are printed and written to ``--out`` (JSON).

``export RUN_DIR ...`` / ``analyse --summary-only`` / ``banks`` / ``bank-entries RUN_DIR ...``
(every bank entry at a run's end) / ``no-action RUN_DIR ...`` (the training episodes that sent
no action, and why): the comparison runs' compact evaluation
records and the analysis of ``results/experience_helps/PLAN.md`` from them
(``experiments/experience_records.py``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling experiments

from learning_minihack import wilson  # noqa: E402

ENV_ID = "crl/MiniHack-Room-Landmark-5x5-v0"
EVAL_FIRST_LEVEL = 1_000_000  # crl_bench.mixes: the evaluation block starts here


def share(k: int, n: int) -> dict[str, Any]:
    low, high = wilson(k, n)
    return {"k": k, "n": n, "share": k / n if n else float("nan"), "low": low, "high": high}


def landmark_seen(observation: str) -> tuple[str, str] | None:
    """(landmark kind, its direction word) as the observation lists it, or None."""
    from crl_bench.envs.minihack.landmark import LANDMARKS

    for line in observation.splitlines():
        for kind, _, name in LANDMARKS:
            prefix = f"- {name}"
            if line.startswith(prefix + ":") or line.startswith(prefix + " ("):
                return kind, line.rsplit(" ", 1)[-1]
    return None


def baselines(levels: list[int], seed: int, view: str) -> dict[str, Any]:
    """Success of the observation-blind and rule policies, one episode per level each."""
    import gymnasium

    from crl_bench.envs.minihack.landmark import LANDMARK_RULE
    from crl_bench.envs.minihack.language import DIRECTIONS

    env = gymnasium.make(ENV_ID, view=view)
    rng = random.Random(seed)
    wins: Counter[str] = Counter()
    for level in levels:
        obs, info = env.reset(seed=level)
        seen = landmark_seen(obs)
        if seen is None:
            raise RuntimeError(f"level {level}: no landmark in the observation:\n{obs}")
        policies = {"uniform random": rng.choice(info["admissible_actions"]),
                    "toward the landmark": seen[1], "the rule": LANDMARK_RULE[seen[0]],
                    **{f"always {d}": d for d in DIRECTIONS}}
        for name, move in policies.items():
            env.reset(seed=level)
            wins[name] += bool(env.step(move)[4]["success"])
    env.close()
    rows = {name: share(k, len(levels)) for name, k in wins.items()}
    constants = {n: r for n, r in rows.items() if n.startswith("always ")}
    best = max(constants, key=lambda n: constants[n]["k"])
    return {"levels": [levels[0], levels[-1]], "episodes_per_policy": len(levels),
            "policies": rows, "chance": rows["uniform random"],
            "best_constant": {"policy": best, **constants[best]}, "ceiling": rows["the rule"]}


def first_turns(ctx: Any, levels: list[int], samples: int, seed: int, view: str) -> dict[str, Any]:
    """The real engine plays the first (only) turn of each level ``samples`` times."""
    import gymnasium

    from crl_bench.llm.rollout import EpisodeSpec

    envs = [gymnasium.make(ENV_ID, view=view) for _ in range(len(levels) * samples)]
    engine = ctx.player.engine(None, seed)
    engine.prompt = replace(engine.prompt, max_turns=1)
    specs = [EpisodeSpec(env=envs[i * samples + j], seed=level, group_id=i)
             for i, level in enumerate(levels) for j in range(samples)]
    t0 = time.perf_counter()
    trajectories = engine.run(specs)
    wall = time.perf_counter() - t0
    for env in envs:
        env.close()
    actions = Counter(t.turns[0].action for t in trajectories if t.turns and t.turns[0].action)
    per_level = [sum(trajectories[i * samples + j].success for j in range(samples))
                 for i in range(len(levels))]
    return {"success": share(sum(per_level), len(trajectories)),
            "valid": share(sum(t.n_actions > 0 for t in trajectories), len(trajectories)),
            "top_actions": actions.most_common(3), "wall_s": wall,
            "trajectories": trajectories}


def labelled(ctx: Any, levels: range, seed: int, view: str) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids): the engine's first-turn prompt and the rule's answer."""
    import gymnasium

    from crl_bench.envs.minihack.landmark import landmark_layout
    from crl_bench.llm.rollout import EpisodeSpec

    engine = ctx.player.engine(None, seed)
    tok = ctx.backend.tokenizer
    a = engine.prompt.answer_tag
    start = engine.prompt.response_prefix or ""
    env = gymnasium.make(ENV_ID, view=view)
    out = []
    for i, level in enumerate(levels):
        prompt, _ = engine.first_prompt(EpisodeSpec(env=env, seed=level), i)
        full = f"<{a}>{landmark_layout(level)[2]}</{a}>"
        if prompt is None or not full.startswith(start):
            raise ValueError(f"the response prefix {start!r} does not start {full!r}")
        target = tok(full[len(start):], add_special_tokens=False)["input_ids"]
        out.append((prompt, target + ([tok.eos_token_id] if tok.eos_token_id is not None else [])))
    env.close()
    return out


def probe(ctx: Any, args: argparse.Namespace, held_out: list[int]) -> dict[str, Any]:
    import torch

    from minihack_reading_sft import sft_step

    rows = []
    t0, c0 = time.perf_counter(), time.process_time()

    def measure(seen: int, loss: float | None) -> None:
        r = first_turns(ctx, held_out, args.samples, args.seed, args.view)
        r.pop("trajectories")
        r.update(examples_seen=seen, train_loss=loss, elapsed_s=time.perf_counter() - t0)
        rows.append(r)
        print(f"  probe: {seen:4d} labelled  loss {'-' if loss is None else f'{loss:.3f}':>6}  "
              f"held-out success {r['success']['share']:.1%} [{r['success']['low']:.1%}, "
              f"{r['success']['high']:.1%}]  valid {r['valid']['share']:.0%}  top "
              f"{r['top_actions'][:2]}  ({r['elapsed_s']:.0f} s)", flush=True)

    data = labelled(ctx, range(args.examples), args.seed, args.view)
    optimizer = torch.optim.AdamW(ctx.raw_backend.trainable_parameters("actor"), lr=args.lr,
                                  weight_decay=0.0)
    measure(0, None)
    seen, losses = 0, []
    for epoch in range(args.epochs):
        order = random.Random(args.seed + epoch).sample(data, len(data))
        for start in range(0, len(order), args.batch):
            losses.append(sft_step(ctx, optimizer, order[start:start + args.batch]))
            seen += len(order[start:start + args.batch])
            if seen % args.probe_every == 0 or seen == len(data) * args.epochs:
                measure(seen, sum(losses) / len(losses))
                losses = []
    return {"labelled_levels": [0, args.examples - 1], "epochs": args.epochs,
            "batch": args.batch, "lr": args.lr, "samples": args.samples, "rows": rows,
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def extractor(ctx: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One extractor answer per real trajectory, built as the runner's extractor track builds it
    (``crl_bench.extractor.track``: each action after the observation it answered and the last
    observation after it, the preset's answer template as an assistant pre-fill, the extractor's
    sampling)."""
    from crl_bench.extractor.extraction import (ANSWER_TEMPLATES, build_extraction_messages,
                                                 episode_actions, parse_operations,
                                                 trajectory_pairs, trajectory_to_text)

    t0, c0 = time.perf_counter(), time.process_time()
    levels = list(range(10_000, 10_000 + args.episodes))
    played = first_turns(ctx, levels, 1, args.seed, args.view)["trajectories"]
    xc = ctx.cfg.extractor
    template = ANSWER_TEMPLATES[xc.answer_template]
    message_lists, prefills = [], []
    for traj in played:
        pairs, final = trajectory_pairs(traj)
        text = trajectory_to_text(pairs, max_chars=xc.max_trajectory_chars, final_observation=final)
        msgs = build_extraction_messages(traj.goal, text, {
            "success": traj.success, "score": traj.score, "n_actions": traj.n_actions}, [],
            max_ops=xc.max_ops)
        prefill = (template.prefill(traj.goal, bool(traj.success), episode_actions(traj))
                   if template else "")
        if prefill:
            msgs.append({"role": "assistant", "content": prefill})
        message_lists.append(msgs)
        prefills.append(prefill)
    gens = ctx.extractor_generate(message_lists, stop=template.stop if template else ())
    well = usable = solved = acted = well_acted = 0
    shown = []
    for traj, prefill, gen in zip(played, prefills, gens):
        answer = template.answer(prefill, gen.text, episode_actions(traj)) if template else gen.text
        ops, malformed = parse_operations(answer, valid_target_ids=set(), max_ops=xc.max_ops)
        ok = not malformed and bool(ops)
        well += ok
        solved += traj.success
        action = traj.turns[0].action if traj.turns else None
        acted += action is not None  # an episode without a move: no move for an entry to name
        well_acted += ok and action is not None
        content = " ".join(str(getattr(op, "content", "") or "") for op in ops).lower()
        # under experience.key=episode_start the entry is keyed by the room's first observation
        # (the landmark); its content must still say which move solved it
        if ok and traj.success and action and action.lower() in content:
            usable += 1
        if len(shown) < 8:
            shown.append({"success": traj.success, "action": action, "well_formed": ok,
                          "answer": answer[-400:]})
    n = len(played)
    return {"episodes": n, "solved": solved, "well_formed": share(well, n),
            "usable_of_solved": share(usable, solved), "examples": shown,
            "well_formed_of_acted": share(well_acted, acted),
            "template": xc.answer_template, "extractor_text_of_episode_1": _episode_text(played[0]),
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


FOLLOW_CONDITIONS = (("random", None), ("random", "right"), ("random", "wrong"), ("none", None),
                     ("none", "right"))
"""``--follow``: (the format line's example pick, the success claim shown: none, the level's
rule, or the next move clockwise from it)."""
FOLLOW_CLAIMS = ("none", "right", "wrong", "take_random", "avoid_random")
"""``--follow-claims``: the entry shown. "right" / "wrong": a success entry naming the rule's move /
the next move clockwise; "take_random": a success entry naming a move M drawn per level from the
probe's seed (independent of the rule); "avoid_random": a failure entry (``To avoid this failure,
do not take the action X.``) with X drawn the same way; "none": no entry."""
READER_BAR = {"take_random": 0.70, "avoid_random": 0.05, "none_top_move": 0.40}
"""The follow probe's bar for an actor that reads: with a success entry naming a random move M it
sends M in >= 70% of the episodes; with "do not take X" it sends X in <= 5%; with no entry no move
takes > 40% of the answers and success stays at the floor (its 95% Wilson interval reaches down
to 1/8: not above what a move chosen without the rule scores)."""


def claimed_move(claim: str | None, level: int, seed: int) -> str | None:
    """The move a ``--follow`` entry names on ``level`` (None: no entry)."""
    from crl_bench.envs.minihack.landmark import landmark_layout
    from crl_bench.envs.minihack.language import DIRECTIONS

    if claim in (None, "none"):
        return None
    rule = landmark_layout(level)[2]
    if claim == "right":
        return rule
    if claim == "wrong":
        return DIRECTIONS[(DIRECTIONS.index(rule) + 1) % len(DIRECTIONS)]
    # drawn from the seed and the level only: independent of the level's rule
    return random.Random(f"follow:{claim}:{seed}:{level}").choice(DIRECTIONS)


def reader_bar(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """:data:`READER_BAR` applied to ``--follow`` rows (one example pick): each criterion's figure
    and whether it holds; ``passes`` when all measured hold (a criterion whose row was not played
    is None and fails the whole)."""
    by = {r["claim"]: r for r in rows}
    out: dict[str, Any] = {}
    take, avoid, none = by.get("take_random"), by.get("avoid_random"), by.get("none")
    out["take_random_sent_M"] = (None if take is None else
                                 {**take["sent_claim"], "bar": f">= {READER_BAR['take_random']}",
                                  "holds": take["sent_claim"]["share"] >= READER_BAR["take_random"]})
    out["avoid_random_sent_X"] = (None if avoid is None else
                                  {**avoid["sent_claim"], "bar": f"<= {READER_BAR['avoid_random']}",
                                   "holds": avoid["sent_claim"]["share"]
                                   <= READER_BAR["avoid_random"]})
    if none is None:
        out["none_top_move"] = out["none_success_at_floor"] = None
    else:
        out["none_top_move"] = {**none["top_move"], "bar": f"<= {READER_BAR['none_top_move']}",
                                "holds": none["top_move"]["share"] <= READER_BAR["none_top_move"]}
        out["none_success_at_floor"] = {**none["success"], "bar": "Wilson low <= 1/8",
                                        "holds": none["success"]["low"] <= 1 / 8}
    out["passes"] = all(v is not None and v["holds"] for v in out.values())
    return out


def follow(ctx: Any, args: argparse.Namespace, held_out: list[int]) -> dict[str, Any]:
    """Does the actor send the move an experience entry tells it to? The real engine plays the
    first turn of each held-out level ``--samples`` times under each of
    :data:`FOLLOW_CONDITIONS` (or each of ``--follow-claims`` under each ``--follow-examples``
    pick). The claim is shown as the actor's prompt shows an entry the ``action`` template wrote
    (``title: To succeed, take the action MOVE.``, or ``To avoid this failure, do not take the
    action MOVE.`` under a "what went wrong" title). Counted: success, a valid move, the format
    example shown (read back from the prompt ids) sent, the claim's move sent, the most frequent
    move's share; and :func:`reader_bar` per example pick."""
    import gymnasium

    from crl_bench.envs.minihack.language import DIRECTIONS
    from crl_bench.experience.bank_schema import render_entry_text
    from crl_bench.extractor.extraction import ANSWER_TEMPLATES
    from crl_bench.llm.rollout import EpisodeSpec
    from experience_records import format_example

    t0, c0 = time.perf_counter(), time.process_time()
    template = ANSWER_TEMPLATES["action"]
    success_stem, failure_stem = template.content_stems
    env = gymnasium.make(ENV_ID, view=args.view)
    goal = env.reset(seed=held_out[0])[1]["goal"]
    env.close()
    rows = []
    conditions = ([(p, None if c == "none" else c) for p in args.follow_examples
                   for c in args.follow_claims] if args.follow_claims else
                  [(p, c) for p, c in FOLLOW_CONDITIONS if p in args.follow_examples])

    def ask(query: str, spec: Any, meta: dict) -> str:  # the bank would hand back the same entry
        return spec.experience_text

    for pick, claim in conditions:
        engine = ctx.player.engine(ask if args.follow_asks else None, args.seed,
                                   temperature=args.temperature)
        engine.prompt = replace(engine.prompt, max_turns=1, example_pick=pick)
        envs, specs, claimed = [], [], []
        for i, level in enumerate(held_out):
            move = claimed_move(claim, level, args.seed)
            avoid = claim == "avoid_random"
            text = ("" if move is None else render_entry_text(
                template.title(goal, not avoid),
                f"{failure_stem if avoid else success_stem} {move}."))
            for _ in range(args.samples):
                envs.append(gymnasium.make(ENV_ID, view=args.view))
                specs.append(EpisodeSpec(env=envs[-1], seed=level, group_id=i,
                                         with_experience=bool(text), experience_text=text))
                claimed.append(move)
        trajectories = engine.run(specs)
        for e in envs:
            e.close()
        n = len(trajectories)
        firsts = [t.turns[0].action.strip().lower() if t.turns and t.turns[0].action else None
                  for t in trajectories]
        examples = [format_example(ctx.backend.tokenizer.decode(t.turns[0].prompt_ids))
                    if t.turns else None for t in trajectories]
        row = {"example": pick, "claim": claim or "none",
               "success": share(sum(bool(t.success) for t in trajectories), n),
               "valid_move": share(sum(f in DIRECTIONS for f in firsts), n),
               "sent_example": share(sum(f is not None and f == x
                                         for f, x in zip(firsts, examples)), n),
               "sent_claim": (share(sum(f == m for f, m in zip(firsts, claimed)), n)
                              if claim else None),
               "top_moves": Counter(f for f in firsts if f).most_common(3),
               "top_move": share(max((c for f, c in Counter(firsts).items() if f in DIRECTIONS),
                                     default=0), n),
               "moves": dict(Counter(f if f in DIRECTIONS else "(other)" for f in firsts)),
               "completions": [t.turns[0].completion_text[:80] for t in trajectories[:4]
                               if t.turns]}
        rows.append(row)
        print(f"  follow: example {pick:<6} claim {row['claim']:<5}  success "
              f"{row['success']['k']:3d}/{n}  valid {row['valid_move']['share']:.0%}  "
              f"sent the example {row['sent_example']['share']:.0%}  sent the claim "
              f"{'-' if row['sent_claim'] is None else format(row['sent_claim']['share'], '.0%')}"
              f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    bar = {pick: reader_bar([r for r in rows if r["example"] == pick])
           for pick in dict.fromkeys(r["example"] for r in rows)}
    return {"levels": [held_out[0], held_out[-1]], "samples": args.samples,
            "temperature": engine.sampling.temperature, "asks_offered": bool(args.follow_asks),
            "rows": rows, "reader_bar": bar,
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


CLAIM_WORDS = {"none": "no entry", "take_random": "take M (M random)",
               "avoid_random": "do not take X (X random)", "right": "take the rule's move",
               "wrong": "take the next move clockwise"}


def follow_table(paths: list[Path]) -> str:
    """The ``--follow`` files side by side (one per actor and temperature): per entry shown,
    success, valid moves, the entry's move sent and the most frequent move's share, each with its
    95% Wilson interval; then :func:`reader_bar` per file."""
    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "—"
        return f"{r['k']}/{r['n']} = {r['share']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"

    lines = ["| actor | temperature | example | entry | success | a valid move | the example "
             "sent | the entry's move sent | the most frequent move |",
             "|---|---|---|---|---|---|---|---|---|"]
    bars = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        f = data["follow"]
        actor = data.get("model", "?") + (f" ({data['checkpoint']['run']})"
                                          if data.get("checkpoint") else "")
        actor += f" [{data.get('model_folder') or Path(path).name}]"
        for r in f["rows"]:
            top = r.get("top_move")
            moves = {m: c for m, c in (r.get("moves") or {}).items() if m != "(other)"}
            top_name = max(moves, key=moves.get) if moves else "no move"
            lines.append(f"| {actor} | {f['temperature']:g} | {r['example']} | "
                         f"{CLAIM_WORDS.get(r['claim'], r['claim'])} | {cell(r['success'])} | "
                         f"{cell(r['valid_move'])} | {cell(r.get('sent_example'))} | "
                         f"{cell(r.get('sent_claim'))} | {top_name}: {cell(top)} |")
        for pick, bar in f.get("reader_bar", {}).items():
            held = {k: v for k, v in bar.items() if k != "passes"}
            bars.append(f"- {actor}, temperature {f['temperature']:g}, example {pick}: "
                        + ("**passes**" if bar["passes"] else "**fails**") + " — "
                        + "; ".join(f"{k} {'—' if v is None else format(v['share'], '.3f')} "
                                    f"({'—' if v is None else v['bar']}: "
                                    f"{'not measured' if v is None else 'holds' if v['holds'] else 'fails'})"
                                    for k, v in held.items()))
    return "\n".join(lines + ["", "The bar (an actor that reads, READER_BAR):", ""] + bars) + "\n"


def _episode_text(traj: Any) -> str:
    """The trajectory text the extractor is shown (``crl_bench.extractor.track``'s rendering)."""
    from crl_bench.extractor.extraction import trajectory_pairs, trajectory_to_text

    pairs, final = trajectory_pairs(traj)
    return trajectory_to_text(pairs, final_observation=final)


def retrieval(cfg: Any, held_out: list[int], per_kind: int, view: str) -> dict[str, Any]:
    """Would an entry keyed by its episode's start (``experience.key=episode_start``) be found by
    a new episode in a room with the same landmark? Keys: the runner's starting query (goal and
    first observation) of ``per_kind`` training levels per landmark kind; queries: the held-out
    levels'. Counted: the top-1 key by cosine has the query's landmark kind."""
    import gymnasium
    import numpy as np

    from crl_bench.envs.minihack.landmark import landmark_layout
    from crl_bench.experience.embedder import load_embedder

    t0, c0 = time.perf_counter(), time.process_time()
    env = gymnasium.make(ENV_ID, view=view)

    def start(level: int) -> str:
        obs, info = env.reset(seed=level)
        return f"{info['goal']}\n{obs}"[:2000]  # crl_bench.run.context: the query

    key_levels = list(range(8 * per_kind))
    embedder = load_embedder(cfg.experience.embedder)
    keys = embedder.encode([start(s) for s in key_levels])
    queries = embedder.encode([start(s) for s in held_out])
    env.close()
    sims = np.asarray(queries) @ np.asarray(keys).T
    top = sims.argmax(axis=1)
    hits = sum(landmark_layout(key_levels[t])[0] == landmark_layout(q)[0]
               for t, q in zip(top, held_out))
    return {"keys": len(key_levels), "queries": len(held_out), "embedder": cfg.experience.embedder,
            "top1_same_landmark": share(int(hits), len(held_out)),
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    # the comparison runs' records, banks and analysis
    if args_in[:1] in (["export"], ["analyse"], ["banks"], ["bank-entries"], ["no-action"]):
        import experience_records

        return experience_records.main(args_in)
    if args_in[:1] == ["follow-table"]:
        tp = argparse.ArgumentParser(prog="minihack_landmark.py follow-table",
                                     description=follow_table.__doc__.split("\n\n")[0])
        tp.add_argument("files", nargs="+", type=Path)
        tp.add_argument("--out", type=Path, default=None)
        targs = tp.parse_args(args_in[1:])
        text = follow_table(targs.files)
        print(text, end="")
        if targs.out is not None:
            targs.out.parent.mkdir(parents=True, exist_ok=True)
            targs.out.write_text(text)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baselines", action="store_true")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--extractor", action="store_true")
    ap.add_argument("--retrieval", action="store_true")
    ap.add_argument("--follow", action="store_true",
                    help="does the untrained actor send the move a success claim names?")
    ap.add_argument("--follow-examples", nargs="+", default=["random", "none"],
                    choices=["random", "none", "placeholder"],
                    help="--follow: the example picks to play")
    ap.add_argument("--follow-claims", nargs="+", default=None, choices=FOLLOW_CLAIMS,
                    help="--follow: the entries to show, each under every example pick "
                         "(default: FOLLOW_CONDITIONS)")
    ap.add_argument("--follow-asks", action="store_true",
                    help="--follow: offer Search-and-Ask to episodes with an entry, as the runs "
                         "do (an ask is answered with the same entry)")
    ap.add_argument("--run", type=Path, default=None, metavar="RUN_DIR",
                    help="--follow: play this run's actor (its config and last checkpoint's "
                         "adapters) instead of the untrained one")
    ap.add_argument("--temperature", type=float, default=None,
                    help="--follow: the actor's sampling temperature (default: the preset's)")
    ap.add_argument("--keys-per-kind", type=int, default=1,
                    help="--retrieval: stored entries per landmark kind")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a few seconds per part)")
    ap.add_argument("--levels", type=int, default=256, help="held-out levels (>= 200 for a claim)")
    ap.add_argument("--view", default="compact")
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--examples", type=int, default=256, help="labelled training levels")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--probe-every", type=int, default=128)
    ap.add_argument("--probe-levels", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=32, help="trajectories for --extractor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not (args.baselines or args.probe or args.extractor or args.retrieval or args.follow):
        ap.error("choose at least one of --baselines, --probe, --extractor, --retrieval, "
                 "--follow")
    if args.run is not None and (args.probe or args.extractor or args.retrieval
                                 or not args.follow):
        ap.error("--run is read by --follow only: run the other parts without it")
    if args.smoke:
        args.levels, args.examples, args.probe_every = 16, 16, 16
        args.probe_levels, args.samples, args.episodes, args.batch = 8, 1, 4, 8
    result: dict[str, Any] = {"env": ENV_ID, "view": args.view, "command": "python "
                              "experiments/minihack_landmark.py " + " ".join(
                                  sys.argv[1:] if argv is None else argv)}
    held_out = list(range(EVAL_FIRST_LEVEL, EVAL_FIRST_LEVEL + args.levels))
    if args.baselines:
        t0, c0 = time.perf_counter(), time.process_time()
        b = baselines(held_out, args.seed, args.view)
        b.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)
        result["baselines"] = b
        for name, r in b["policies"].items():
            print(f"{name:<22} {r['k']:4d}/{r['n']:<4d} {r['share']:6.1%}  "
                  f"[{r['low']:.1%}, {r['high']:.1%}]")
        print(f"baselines: {b['wall_s']:.1f} s wall, {b['cpu_s']:.1f} s CPU", flush=True)
    if args.probe or args.extractor or args.retrieval or args.follow:
        from crl_bench.config.overrides import parse_overrides
        from crl_bench.config.schema import build_config
        from minihack_reading import context

        from crl_bench.config.schema import ConfigError
        from minihack_reading import run_config

        agent = "comp_rl" if args.extractor or args.retrieval else "grpo"
        checkpoint = None
        if args.run is not None:
            try:
                cfg, checkpoint = run_config(args.run, parse_overrides(args.set),
                                             sys.argv[1:] if argv is None else list(argv))
            except ConfigError as exc:
                ap.error(str(exc))
            result["checkpoint"] = {"run": str(args.run), "step": checkpoint["step"]}
        else:
            cfg = build_config(agent=agent, tasks="minihack", preset=args.preset,
                               overrides=parse_overrides(args.set), seed=args.seed)
        cfg.validate()
        result["model"] = cfg.model.actor
        from crl_bench.llm.models import KNOWN_MODELS
        known = KNOWN_MODELS.get(cfg.model.actor)
        if known is not None:  # the cache folder names the version (a reader's recipe)
            result["model_folder"] = known.folder
    if args.retrieval:
        r = retrieval(cfg, held_out, args.keys_per_kind, args.view)
        result["retrieval"] = r
        t = r["top1_same_landmark"]
        print(f"retrieval: top-1 entry from a room with the same landmark {t['k']}/{t['n']} "
              f"({t['share']:.1%} [{t['low']:.1%}, {t['high']:.1%}]; chance 12.5%), "
              f"{r['keys']} keys; {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU", flush=True)
    if args.probe or args.extractor or args.follow:
        with tempfile.TemporaryDirectory() as tmp:
            from crl_bench.run.context import RunContext
            from crl_bench.records.files import RunDir

            if args.extractor:  # a fresh context per part: the probe's training must not leak
                ctx = RunContext(cfg, RunDir(Path(tmp) / "x"))
                ctx.seed_everything()
                ctx.build_models(extractor=True)
                x = extractor(ctx, args)
                result["extractor"] = x
                print(f"extractor ({x['template']}): well-formed {x['well_formed']['k']}/"
                      f"{x['episodes']} ({x['well_formed_of_acted']['k']}/"
                      f"{x['well_formed_of_acted']['n']} of the episodes with a move), "
                      f"usable {x['usable_of_solved']['k']}/{x['solved']} of "
                      f"the solved; {x['wall_s']:.0f} s wall, {x['cpu_s']:.0f} s CPU", flush=True)
                print("  the extractor's view of episode 1: "
                      + json.dumps(x["extractor_text_of_episode_1"]))
                for e in x["examples"][:4]:
                    print(f"    {e['success']!s:<5} {e['action']}: " + json.dumps(e["answer"][-200:]))
                del ctx
            if args.follow:
                ctx = context(cfg, checkpoint, Path(tmp) / "f")
                result["follow"] = follow(ctx, args, held_out)
                f = result["follow"]
                print(f"follow: {f['wall_s']:.0f} s wall, {f['cpu_s']:.0f} s CPU", flush=True)
                del ctx
            if args.probe:
                ctx = context(cfg, None, Path(tmp) / "p")
                result["probe"] = probe(ctx, args, held_out[:args.probe_levels])
                p = result["probe"]
                print(f"probe: {p['wall_s']:.0f} s wall, {p['cpu_s']:.0f} s CPU", flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
