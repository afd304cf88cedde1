"""Compact per-episode evaluation records of the "does experience help?" runs, and the analysis
of ``results/experience_helps/PLAN.md`` computed from them alone.

    python experiments/minihack_landmark.py export RUN_DIR [RUN_DIR ...]   # -> records/
    python experiments/minihack_landmark.py analyse --summary-only        # reads records/ only
    python experiments/minihack_landmark.py banks RUN_DIR [RUN_DIR ...] --out FOLDER

``export`` writes one ``<agent>__seed<S>.jsonl`` per run into ``--records`` (default
``results/experience_helps/records``): a first line ``{"run": {...}}`` (agent, run seed, tasks,
steps, the run's state and last step, the training level seeds it played, its time breakdown
and, per training step, how often each move was sent, what the with-experience episodes were
shown and did, and how often the first move was the prompt's format example) and one line per
evaluation episode::

    {"step": 5, "seed": 1000017, "task": "...", "exp": 1, "actions": ["southwest"],
     "success": 1, "score": 1.0}

``analyse`` reads only those files and prints / writes (``--out``, default
``results/experience_helps``) the plan's tables: per run start / end / AUC with and without
experience, the top move's share at the last training step and whether the seed collapsed; per
agent the mean over seeds with its percentile bootstrap interval; the primary and secondary
comparisons with the bootstrap interval of the difference, the two-sample permutation test
over all assignments, the paired sign-flip test and the exact sign test; the verdict by the
plan's rule; and the three agents' mean curves with bootstrap bands (``curves.png``). A planned
run without a file, or whose curve does not reach the last step, is listed as missing and left
out of the statistics with n saying so — never silently dropped.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from crl_bench.envs.minihack.language import DIRECTIONS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling experiments
RECORDS = REPO / "results" / "experience_helps" / "records"
OUT = REPO / "results" / "experience_helps"

AGENTS = ("grpo", "comp_rl", "exp_only")
SEEDS = (0, 1, 2, 3, 4)
STEPS = 20
BEST_CONSTANT = 0.125
COLLAPSE_TOP_SHARE = 0.9
COLLAPSE_END = BEST_CONSTANT + 0.05
"""PLAN.md: a seed collapsed when >= 90% of its last training step's action turns are one move
and its ``end`` success is <= 0.175 (the best constant policy + 0.05)."""

SERIES = {  # name -> (agent, with experience)
    "grpo": ("grpo", False),
    "comp_rl with exp": ("comp_rl", True), "comp_rl without exp": ("comp_rl", False),
    "exp_only with exp": ("exp_only", True), "exp_only without exp": ("exp_only", False),
}
PRIMARY = ("auc", "comp_rl with exp", "grpo")
SECONDARY = (("end", "comp_rl with exp", "grpo"), ("auc", "comp_rl without exp", "grpo"),
             ("auc", "exp_only with exp", "grpo"), ("auc", "exp_only with exp", "exp_only without exp"))
CURVES = ("grpo", "comp_rl with exp", "exp_only with exp")


# -- export ------------------------------------------------------------------------------------

ENDED_EARLY = "ended_early.txt"
"""In a records folder: why the plan was ended before all its runs (one line); its absence
means the plan is still being carried out."""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


HINT_KEYS = ("with_exp", "shown", "success_hint", "success_hint_rule", "followed",
             "followed_solved", "failure_hint", "failure_hint_rule", "avoided")


def _claim_re() -> Any:
    import re

    from crl_bench.extractor.extraction import ActionTemplate

    stems = ActionTemplate().content_stems
    return re.compile("(" + "|".join(re.escape(s) for s in stems) + r") ([^.\n]+)\.")


def text_claim(text: str) -> tuple[str, str] | None:
    """The first ``action``-template claim anywhere in a shown experience text (an entry is shown
    as ``title: content``), as :func:`entry_claim`; None when none is there."""
    found = _claim_re().search(text)
    return None if found is None else entry_claim(found.group(0))


def entry_claim(content: str) -> tuple[str, str] | None:
    """``("success" | "failure", move)`` of an entry written with the ``action`` template
    (``ActionTemplate.claim``, the move lower-cased); None for any other text."""
    from crl_bench.extractor.extraction import ActionTemplate

    claim = ActionTemplate().claim(content)
    return None if claim is None else (claim[0], claim[1].lower())


EXAMPLE_KEYS = ("episodes", "moved", "sent_example", "claim_not_example", "sent_claim",
                "sent_example_not_claim")
"""``train_examples`` per step: training episodes whose first prompt shows a format example
(``e.g. <answer>MOVE</answer>``); of them, those whose first action is one of the eight moves
(``moved``) and is the example's move (``sent_example``); with-experience episodes shown a
success claim naming another move than the example (``claim_not_example``), of which the actor
sent the claim's move (``sent_claim``) or the example's (``sent_example_not_claim``)."""

MOVES = frozenset(DIRECTIONS)
"""The eight moves of a Landmark level (its admissible actions)."""


def format_example(prompt: str) -> str | None:
    """The move a prompt's answer-format line shows as its example (``e.g. <tag>MOVE</tag>``,
    the last one in the prompt, lower-cased); None when it shows none."""
    import re

    found = re.findall(r"e\.g\. <(\w+)>([^<]*)</\1>", prompt)
    return " ".join(found[-1][1].lower().split()) if found else None


def train_step_stats(run: Path, decode: Any = None
                     ) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, int]],
                                dict[int, dict[str, int]]]:
    """One pass over the run's training trajectories, per training step:

    * the moves sent (the action turns, lower-cased as the env reads them): ``train_actions``;
    * what the with-experience episodes were shown and did (``train_hints``): shown an entry at
      all; shown a success claim (``success_hint``), naming the rule's move of the level
      (``success_hint_rule``), whose move the actor sent (``followed``) and then solved
      (``followed_solved``); shown a failure claim (``failure_hint``), naming a move that is not
      the rule's (``failure_hint_rule``: the claim is right), and not sent that move
      (``avoided``). Evaluation episodes keep only the entry ids, so this reads training;
    * with ``decode`` (token ids -> text, the actor's tokenizer), how often the first move was
      the one the prompt's format line shows as its example (``train_examples``,
      :data:`EXAMPLE_KEYS`); empty without it."""
    from crl_bench.envs.minihack.landmark import landmark_layout

    actions: dict[int, dict[str, int]] = {}
    hints: dict[int, dict[str, int]] = {}
    examples: dict[int, dict[str, int]] = {}
    for path in sorted((run / "trajectories").glob("train_step_*.jsonl.gz")):
        step = int(path.name.split("_")[2].split(".")[0])
        moves: Counter[str] = Counter()
        c: Counter[str] = Counter()
        ex: Counter[str] = Counter()
        with gzip.open(path, "rt") as fh:
            for line in fh:
                t = json.loads(line)
                sent = [" ".join(str(x["action"]).lower().split()) for x in t["turns"]
                        if x.get("kind") == "action" and x.get("action") is not None]
                moves.update(sent)
                text = str(t.get("experience_text") or "") if t.get("with_experience") else ""
                claim = text_claim(text)
                example = (format_example(decode(t["turns"][0]["prompt_ids"]))
                           if decode is not None and t["turns"] and
                           t["turns"][0].get("prompt_ids") else None)
                if example is not None:
                    first = sent[0] if sent else None
                    ex["episodes"] += 1
                    ex["moved"] += first in MOVES
                    ex["sent_example"] += first == example
                    if claim and claim[0] == "success" and claim[1] in MOVES \
                            and claim[1] != example:
                        ex["claim_not_example"] += 1
                        ex["sent_claim"] += first == claim[1]
                        ex["sent_example_not_claim"] += first == example
                if not t.get("with_experience"):
                    continue
                c["with_exp"] += 1
                c["shown"] += bool(text.strip())
                if claim is None:
                    continue
                rule = landmark_layout(int(t["seed"]))[2]
                outcome, move = claim
                if outcome == "success":
                    c["success_hint"] += 1
                    c["success_hint_rule"] += move == rule
                    c["followed"] += move in sent
                    c["followed_solved"] += move in sent and bool(t.get("success"))
                else:
                    c["failure_hint"] += 1
                    c["failure_hint_rule"] += move != rule
                    c["avoided"] += move not in sent
        actions[step] = dict(sorted(moves.items()))
        hints[step] = {k: c[k] for k in HINT_KEYS}
        if ex:
            examples[step] = {k: ex[k] for k in EXAMPLE_KEYS}
    return actions, hints, examples


def eval_shown(run: Path, decode: Any) -> dict[tuple[int, int, int], dict[str, Any]]:
    """What each evaluation episode was shown, from the run's evaluation trajectories, keyed by
    (step, level seed, with experience): the format line's example (``format_example`` of its
    first prompt; the placeholder word under ``example_pick=placeholder``) and the
    ``action``-template claim of its experience text (``[outcome, move]``, or None)."""
    shown: dict[tuple[int, int, int], dict[str, Any]] = {}
    for path in sorted((run / "trajectories").glob("eval_step_*.jsonl.gz")):
        step = int(path.name.split("_")[2].split(".")[0])
        with gzip.open(path, "rt") as fh:
            for line in fh:
                t = json.loads(line)
                turns = t.get("turns") or []
                example = (format_example(decode(turns[0]["prompt_ids"]))
                           if turns and turns[0].get("prompt_ids") else None)
                text = str(t.get("experience_text") or "") if t.get("with_experience") else ""
                claim = text_claim(text)
                shown[(step, int(t["seed"]), int(bool(t.get("with_experience"))))] = {
                    "example": example, "claim": list(claim) if claim else None}
    return shown


def run_time(run: Path) -> dict[str, Any]:
    """Where the run's wall time went, in minutes (``learning_minihack.time_breakdown``)."""
    from learning_minihack import time_breakdown

    return time_breakdown(run)


def export_run(run: Path, records: Path = RECORDS) -> Path:
    """Write ``run``'s compact records (module docstring) to ``records``; returns the file."""
    config = json.loads((run / "config.json").read_text())
    status = json.loads((run / "status.json").read_text())
    episodes = _read_jsonl(run / "episodes.jsonl")
    evals = [e for e in episodes if e["phase"] == "eval"]
    if any("actions" not in e for e in evals):
        raise ValueError(f"{run}: its evaluation records hold no actions (written before "
                         "episode records carried them); re-run it to export it")
    from crl_bench.llm.models import load_tokenizer

    tokenizer = load_tokenizer(config["model"]["actor"])
    train_actions, train_hints, train_examples = train_step_stats(run, tokenizer.decode)
    header = {"agent": config["agent"], "run_seed": config["seed"], "tasks": config["tasks"],
              "preset": config["preset"], "steps": config["steps"], "state": status["state"],
              "last_step": status["step"], "eval": config["eval"],
              "train_levels": sorted({e["seed"] for e in episodes if e["phase"] == "train"}),
              "train_actions": train_actions, "time_min": run_time(run),
              "train_hints": train_hints, "train_examples": train_examples,
              "model": config["model"].get("actor"),
              "example_pick": config.get("rollout", {}).get("example_pick"),
              "provenance": status.get("provenance")}
    shown = eval_shown(run, tokenizer.decode)
    records.mkdir(parents=True, exist_ok=True)
    path = records / f"{config['agent']}__seed{config['seed']}.jsonl"
    lines = [json.dumps({"run": header}, separators=(",", ":"))]
    lines += [json.dumps({"step": e["step"], "seed": e["seed"], "task": e["task"],
                          "exp": int(bool(e["with_experience"])), "actions": e["actions"],
                          "success": int(bool(e["success"])), "score": e["score"],
                          **shown.get((int(e["step"]), int(e["seed"]),
                                       int(bool(e["with_experience"]))), {})},
                         separators=(",", ":")) for e in evals]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


# -- banks -------------------------------------------------------------------------------------

BANK_STEP_KEYS = ("bank/size", "bank/merges", "bank/merge_windows", "bank/merge_malformed",
                  "bank/merge_scopes", "bank/merge_size_after", "extractor/extractions",
                  "extractor/malformed")
"""What ``banks`` keeps of each step's ``metrics.jsonl`` record (absent keys are null)."""


def run_name(run: Path) -> str:
    """``<agent>__seed<S>`` of a run directory (from its config)."""
    config = json.loads((run / "config.json").read_text())
    return f"{config['agent']}__seed{config['seed']}"


def bank_size_by_step(run: Path) -> dict[str, dict[str, Any]]:
    """Per actor step, the bank's size and the merge and extraction counters (``metrics.jsonl``)."""
    out = {}
    for m in _read_jsonl(run / "metrics.jsonl"):
        if m.get("step"):
            out[str(m["step"])] = {k: m.get(k) for k in BANK_STEP_KEYS}
    return out


def bank_content(bank_path: Path) -> dict[str, Any]:
    """What a Landmark run's bank holds at the end, judged against the level rule: entries,
    distinct retrieval keys, entries in the ``action`` template's form, success entries that
    name the rule's move of their levels, failure entries that name another move, keys whose
    entries include a success naming the rule's move (what retrieval by that start can hand the
    actor), and the landmark kinds (of 8) such a success entry covers. An entry's levels are its
    task ids (training level seeds); the rule's move is the one of their landmark kind (they
    agree for entries keyed by one start)."""
    import numpy as np

    from crl_bench.envs.minihack.landmark import landmark_layout
    from crl_bench.experience.bank import ExperienceBank
    from crl_bench.extractor.merge import key_groups

    bank = ExperienceBank.open(bank_path, read_only=True, build_index=False)
    try:
        ids = bank.all_ids()
        entries = bank.get(ids)
        vecs = bank.get_embeddings(ids) if ids else np.zeros((0, bank.dim), np.float32)
    finally:
        bank.close()
    counts: Counter[str] = Counter()
    good_keys = 0
    good_kinds: set[str] = set()
    groups = key_groups(vecs)
    for rows in groups:
        key_good = False
        for r in rows:
            e = entries[r]
            claim = entry_claim(e.content)
            layouts = [landmark_layout(int(t)) for t in e.task_ids if str(t).isdigit()]
            rules = {rule for _, _, rule in layouts}
            counts["merged"] += e.origin == "merge"
            if claim is None:
                counts["other_text"] += 1
                continue
            outcome, move = claim
            counts[outcome] += 1
            if len(rules) == 1:
                rule = next(iter(rules))
                if outcome == "success" and move == rule:
                    counts["success_naming_the_rule"] += 1
                    key_good = True
                    good_kinds.update(kind for kind, _, _ in layouts)
                elif outcome == "failure" and move != rule:
                    counts["failure_naming_another_move"] += 1
            else:
                counts["levels_of_several_kinds"] += 1
        good_keys += key_good
    return {"entries": len(entries), "keys": len(groups),
            "keys_with_a_success_naming_the_rule": good_keys,
            "kinds_with_a_success_naming_the_rule": len(good_kinds),
            **{k: counts[k] for k in ("merged", "success", "success_naming_the_rule", "failure",
                                      "failure_naming_another_move", "other_text",
                                      "levels_of_several_kinds")}}


def export_banks(runs: list[Path], out: Path) -> list[Path]:
    """``bank_size_by_step.json`` and ``bank_content.json`` (one key per run) and each run's
    ``<agent>__seed<S>_end.txt`` (``crl-bench bank show``) into ``out``; runs without a bank
    (``grpo``) are skipped."""
    import contextlib
    import io

    from crl_bench.cli import main as cli_main

    out.mkdir(parents=True, exist_ok=True)
    written = []
    sizes_path, content_path = out / "bank_size_by_step.json", out / "bank_content.json"
    sizes = json.loads(sizes_path.read_text()) if sizes_path.exists() else {}
    content = json.loads(content_path.read_text()) if content_path.exists() else {}
    for run in runs:
        if not (run / "bank.sqlite").exists():
            continue
        name = run_name(run)
        sizes[name] = bank_size_by_step(run)
        content[name] = bank_content(run / "bank.sqlite")
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            cli_main(["bank", "show", str(run / "bank.sqlite")])
        path = out / f"{name}_end.txt"
        path.write_text(text.getvalue())
        written.append(path)
    for path, data in ((sizes_path, sizes), (content_path, content)):
        path.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
        written.append(path)
    return written


# -- analysis ----------------------------------------------------------------------------------

def load_records(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows = _read_jsonl(path)
    if not rows or "run" not in rows[0]:
        raise ValueError(f"{path}: the first line must be the run header {{\"run\": ...}}")
    return rows[0]["run"], rows[1:]


def curve(episodes: list[dict[str, Any]], with_exp: bool) -> dict[int, float]:
    """Evaluation success per evaluated step, over the episodes of one mode."""
    by_step: dict[int, list[int]] = {}
    for e in episodes:
        if bool(e["exp"]) == with_exp:
            by_step.setdefault(int(e["step"]), []).append(int(e["success"]))
    return {s: sum(v) / len(v) for s, v in sorted(by_step.items())}


def run_metrics(header: dict[str, Any], episodes: list[dict[str, Any]], with_exp: bool,
                steps: int) -> dict[str, Any] | None:
    """start / end / AUC of one mode of one run, the top move's share at the last training step
    and whether the seed collapsed; None when the run has no evaluation from 0 to ``steps``."""
    from crl_bench.report.seed_tests import curve_auc

    c = curve(episodes, with_exp)
    if 0 not in c or steps not in c:
        return None
    last = header.get("train_actions", {}).get(str(steps)) or {}
    top = max(last.values()) / sum(last.values()) if last else float("nan")
    end = c[steps]
    return {"start": c[0], "end": end, "auc": curve_auc(list(c), list(c.values()), steps),
            "curve": c, "top_move_share": top,
            "collapsed": bool(top >= COLLAPSE_TOP_SHARE and end <= COLLAPSE_END)}


def held_out_check(header: dict[str, Any], episodes: list[dict[str, Any]]) -> list[int]:
    """The evaluation level seeds this run also trained on (empty: held out)."""
    return sorted(set(header["train_levels"]) & {int(e["seed"]) for e in episodes})


def compare(a: dict[int, float], b: dict[int, float]) -> dict[str, Any]:
    """The plan's statistics for per-seed values ``a`` - ``b`` (dicts seed -> value)."""
    from crl_bench.report.seed_tests import (bootstrap_diff, permutation_test, sign_flip_test,
                                             sign_test)

    xa, xb = [a[s] for s in sorted(a)], [b[s] for s in sorted(b)]
    diff, low, high = bootstrap_diff(xa, xb)
    perm = permutation_test(xa, xb)
    paired = sorted(set(a) & set(b))
    d = [a[s] - b[s] for s in paired]
    flip, sign = (sign_flip_test(d), sign_test(d)) if d else (None, None)
    return {"diff": diff, "low": low, "high": high, "n_a": len(xa), "n_b": len(xb),
            "perm_p_greater": perm.p_greater, "perm_p_two_sided": perm.p_two_sided,
            "perm_assignments": perm.n, "paired_seeds": paired,
            "sign_flip_p_greater": flip.p_greater if flip else None,
            "sign_flip_p_two_sided": flip.p_two_sided if flip else None,
            "sign_test_positive": int(sign.statistic) if sign else None,
            "sign_test_n": sign.n if sign else None,
            "sign_test_p_greater": sign.p_greater if sign else None,
            "sign_test_p_two_sided": sign.p_two_sided if sign else None}


def verdict(primary: dict[str, Any]) -> str:
    """PLAN.md "What counts": hit, reverse or miss."""
    if primary["perm_p_greater"] <= 0.05 and primary["low"] > 0:
        return "hit"
    if primary["diff"] < 0 and primary["perm_p_two_sided"] <= 0.05:
        return "reverse"
    return "miss"


def no_evaluation(agent: str, seed: int, series: str, header: dict[str, Any], steps: int
                  ) -> dict[str, Any]:
    """The missing-series entry of a run without an evaluation at both step 0 and ``steps``."""
    return {"agent": agent, "seed": seed, "series": series,
            "why": f"no evaluation at both step 0 and step {steps} (state {header['state']}, "
                   f"last step {header['last_step']})"}


def analyse(records: Path = RECORDS, agents=AGENTS, seeds=SEEDS, steps: int = STEPS
            ) -> dict[str, Any]:
    """The plan's analysis from the files in ``records`` (module docstring)."""
    from crl_bench.report.seed_tests import bootstrap_mean

    runs: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in SERIES}
    missing, leaks, per_run, recorded, hints, examples = [], {}, [], 0, [], []
    eval_examples: list[dict[str, Any]] = []
    for agent in agents:
        for seed in seeds:
            path = records / f"{agent}__seed{seed}.jsonl"
            if not path.is_file():
                missing.append({"agent": agent, "seed": seed, "why": "no records file"})
                continue
            recorded += 1
            header, episodes = load_records(path)
            if header["agent"] != agent or int(header["run_seed"]) != seed:
                raise ValueError(f"{path}: holds {header['agent']} seed {header['run_seed']}")
            if header.get("train_hints"):
                total: Counter[str] = Counter()
                for counts in header["train_hints"].values():
                    total.update(counts)
                if total["with_exp"]:
                    hints.append({"agent": agent, "seed": seed,
                                  **{k: total[k] for k in HINT_KEYS}})
            if header.get("train_examples"):
                ex = header["train_examples"]
                firsts = [str(s) for s in sorted(map(int, ex))[:5]]
                examples.append({"agent": agent, "seed": seed, **_sum(ex.values(), EXAMPLE_KEYS),
                                 "first_steps": _sum((ex[s] for s in firsts), EXAMPLE_KEYS),
                                 "last_steps": _sum((ex[s] for s in sorted(ex, key=int)[-5:]),
                                                    EXAMPLE_KEYS)})
            leaked = held_out_check(header, episodes)
            if leaked:
                leaks[f"{agent} seed {seed}"] = leaked
            for name, (a, with_exp) in SERIES.items():
                if a != agent:
                    continue
                m = run_metrics(header, episodes, with_exp, steps)
                if m is None:
                    missing.append(no_evaluation(agent, seed, name, header, steps))
                    continue
                runs[name][seed] = m
                shown = [e for e in episodes if bool(e["exp"]) == with_exp and "example" in e]
                if shown:
                    eval_examples.append({"series": name, "seed": seed, **example_counts(shown)})
                per_run.append({"series": name, "seed": seed, "state": header["state"],
                                **{k: v for k, v in m.items() if k != "curve"},
                                "wall_min": header.get("time_min", {}).get("run")})
    means = {}
    for name, by_seed in runs.items():
        if by_seed:
            means[name] = {"n": len(by_seed), **{
                metric: dict(zip(("mean", "low", "high"),
                                 bootstrap_mean([by_seed[s][metric] for s in sorted(by_seed)])))
                for metric in ("start", "end", "auc")}}
    comparisons = []
    for metric, a, b in (PRIMARY,) + SECONDARY:
        if runs[a] and runs[b]:
            comparisons.append({"metric": metric, "a": a, "b": b, **compare(
                {s: m[metric] for s, m in runs[a].items()},
                {s: m[metric] for s, m in runs[b].items()})})
    primary = comparisons[0] if comparisons and comparisons[0]["a"] == PRIMARY[1] \
        and comparisons[0]["metric"] == "auc" and comparisons[0]["b"] == PRIMARY[2] else None
    return {"agents": list(agents), "seeds": list(seeds), "steps": steps, "runs": per_run,
            "recorded": recorded, "hints": hints, "examples": examples,
            **({"eval_examples": eval_examples} if eval_examples else {}),
            "ended_early": ((records / ENDED_EARLY).read_text().strip()
                            if (records / ENDED_EARLY).is_file() else None),
            "missing": missing, "held_out_violations": leaks, "means": means,
            "comparisons": comparisons, "verdict": verdict(primary) if primary else "no data",
            "curves": {name: {s: m["curve"] for s, m in by_seed.items()}
                       for name, by_seed in runs.items() if by_seed}}


def example_counts(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Evaluation answers equal to the example their prompt showed (records exported with the
    ``example`` field): episodes, those whose prompt showed an example, and those whose first
    action (lower-cased, spaces collapsed) is that example; and the examples shown."""
    shown = [e for e in episodes if e.get("example") is not None]
    first = [" ".join(str(e["actions"][0]).lower().split()) if e.get("actions") else None
             for e in shown]
    return {"episodes": len(episodes), "shown": len(shown),
            "sent_example": sum(f == e["example"] for f, e in zip(first, shown)),
            "examples": sorted({e["example"] for e in shown})[:8]}


def _sum(rows: Any, keys: tuple[str, ...]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for r in rows:
        total.update(r)
    return {k: total[k] for k in keys}


def _p(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def hints_table(hints: list[dict[str, Any]]) -> list[str]:
    """The table of what the with-experience training episodes were shown and did, one row per
    run (``train_hints``' figures)."""
    lines = ["| agent | seed | with experience | shown an entry | success claims (right) | "
             "followed (then solved) | failure claims (right) | avoided |",
             "|---|---|---|---|---|---|---|---|"]
    for h in hints:
        lines.append(f"| {h['agent']} | {h['seed']} | {h['with_exp']} | {h['shown']} | "
                     f"{h['success_hint']} ({h['success_hint_rule']}) | {h['followed']} "
                     f"({h['followed_solved']}) | {h['failure_hint']} "
                     f"({h['failure_hint_rule']}) | {h['avoided']} |")
    return lines


def summary_markdown(result: dict[str, Any]) -> str:
    lines = [f"# Analysis from the committed records ({len(result['agents'])} agents x seeds "
             f"{result['seeds']}, {result['steps']} steps)", ""]
    lines += ["## Missing runs", ""] + ([f"- {m['agent']} seed {m['seed']}"
                                         + (f" ({m['series']})" if "series" in m else "")
                                         + f": {m['why']}" for m in result["missing"]] or ["none"])
    lines += ["", "## Held out", "", "no records" if not result["runs"] else
              "no run trained on a level it was evaluated on"
              if not result["held_out_violations"] else
              "VIOLATED: " + "; ".join(f"{k}: levels {v[:8]}" for k, v in
                                       result["held_out_violations"].items())]
    lines += ["", "## Per run", "", "| series | seed | start | end | AUC | top move (last step) "
              "| collapsed | run wall (min) |", "|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        wall = r.get("wall_min")
        lines.append(f"| {r['series']} | {r['seed']} | {r['start']:.3f} | {r['end']:.3f} | "
                     f"{r['auc']:.3f} | {r['top_move_share']:.0%} | "
                     f"{'yes' if r['collapsed'] else 'no'} | "
                     f"{'—' if wall is None else f'{wall:.1f}'} |")
    lines += ["", "## Per agent (mean over seeds, 95% percentile bootstrap, 10,000 resamples)",
              "", "| series | n | start | end | AUC |", "|---|---|---|---|---|"]
    for name, m in result["means"].items():
        cells = [f"{m[k]['mean']:.3f} [{m[k]['low']:.3f}, {m[k]['high']:.3f}]"
                 for k in ("start", "end", "auc")]
        lines.append(f"| {name} | {m['n']} | " + " | ".join(cells) + " |")
    lines += ["", "## Comparisons (the first is the primary)", "",
              "| metric | a − b | diff [95% bootstrap] | n | permutation p (one / two-sided) | "
              "sign-flip p (one / two) | sign test (positive/n, p one / two) |",
              "|---|---|---|---|---|---|---|"]
    for c in result["comparisons"]:
        lines.append(
            f"| {c['metric']} | {c['a']} − {c['b']} | {c['diff']:+.3f} [{c['low']:+.3f}, "
            f"{c['high']:+.3f}] | {c['n_a']}+{c['n_b']} | {_p(c['perm_p_greater'])} / "
            f"{_p(c['perm_p_two_sided'])} ({c['perm_assignments']} assignments) | "
            f"{_p(c['sign_flip_p_greater'])} / {_p(c['sign_flip_p_two_sided'])} | "
            f"{c['sign_test_positive']}/{c['sign_test_n']}, {_p(c['sign_test_p_greater'])} / "
            f"{_p(c['sign_test_p_two_sided'])} |")
    if result.get("hints"):
        lines += ["", "## What the training episodes with experience were shown, and did", "",
                  "Summed over the run's training steps (``train_hints``): an `action`-template "
                  "entry shown says *take* a move (a success claim) or *do not take* one (a "
                  "failure claim); the claim is right when it names the rule's move of the level, "
                  "or for a failure claim anything else (text that names no move included).", "",
                  ] + hints_table(result["hints"])
    if result.get("examples"):
        lines += ["", "## The format line's example move against a success claim", "",
                  "Each training prompt ends with the answer format and one example answer, a "
                  "move drawn at random per episode (`rollout.example_pick=random`); summed over "
                  "the run's training steps (``train_examples``), and over its first and last "
                  "five steps. A first move independent of the example would be the example's "
                  "in about 1/8 of the episodes that sent a move.", "",
                  "| agent | seed | episodes | sent a move | the example's move (steps 1–5 / "
                  "last 5) | success claim ≠ example | sent the claim's move | sent the "
                  "example's |", "|---|---|---|---|---|---|---|---|"]

        def share(k: int, n: int) -> str:
            return f"{k}/{n}" + (f" = {k / n:.2f}" if n else "")

        for e in result["examples"]:
            a, z = e["first_steps"], e["last_steps"]
            lines.append(f"| {e['agent']} | {e['seed']} | {e['episodes']} | {e['moved']} | "
                         f"{share(e['sent_example'], e['moved'])} ({share(a['sent_example'], a['moved'])}"
                         f" / {share(z['sent_example'], z['moved'])}) | {e['claim_not_example']} | "
                         f"{e['sent_claim']} | {e['sent_example_not_claim']} |")
    if result.get("eval_examples"):
        lines += ["", "## Evaluation answers equal to the example shown", "",
                  "Per series, summed over the run's evaluations: the held-out episodes, those "
                  "whose prompt's format line showed an example, and those whose answer was that "
                  "example (under `rollout.example_pick=placeholder` the example is the "
                  "placeholder word, which is no move).", "",
                  "| series | seed | episodes | an example shown | answer = example | examples |",
                  "|---|---|---|---|---|---|"]
        for e in result["eval_examples"]:
            lines.append(f"| {e['series']} | {e['seed']} | {e['episodes']} | {e['shown']} | "
                         f"{e['sent_example']}/{e['shown']}"
                         + (f" = {e['sent_example'] / e['shown']:.2f}" if e["shown"] else "")
                         + f" | {', '.join(e['examples'])} |")
    planned, recorded = len(result["agents"]) * len(result["seeds"]), result["recorded"]
    if recorded < planned and result.get("ended_early"):
        lines += ["", f"**The plan was ended after {recorded} of its {planned} planned runs: "
                      f"{result['ended_early']}** The plan's rule applied to them gives "
                      f"\"{result['verdict']}\"; that is not a result of the plan.", ""]
    elif recorded < planned:
        lines += ["", f"**Provisional verdict (PLAN.md rule on the {recorded} of {planned} "
                      f"planned runs recorded so far): {result['verdict']}** — the plan's verdict "
                      f"is read once every planned run has ended.", ""]
    else:
        lines += ["", f"**Verdict (PLAN.md rule): {result['verdict']}**", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """The three agents' mean evaluation curves with their bootstrap bands over seeds."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from crl_bench.report.seed_tests import bootstrap_mean

    series = {}  # name -> (steps, [(mean, low, high)] per step), drawn on both panels
    for name in CURVES:
        by_seed = result["curves"].get(name)
        if by_seed:
            xs = sorted({s for c in by_seed.values() for s in c})
            series[f"{name} (n={len(by_seed)})"] = (
                xs, [bootstrap_mean([c[x] for c in by_seed.values() if x in c]) for x in xs])
    zoom_top = max([0.3] + [1.2 * b[2] for _, bands in series.values() for b in bands])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, top, title in zip(axes, (1.05, zoom_top), ("", " (zoomed)")):
        for label, (xs, bands) in series.items():
            ax.plot(xs, [b[0] for b in bands], marker="o", label=label)
            ax.fill_between(xs, [b[1] for b in bands], [b[2] for b in bands], alpha=0.2)
        ax.axhline(BEST_CONSTANT, color="grey", ls=":", label="best constant move (1/8)")
        if top > 1:
            ax.axhline(1.0, color="black", ls="--", lw=0.8, label="the rule (ceiling)")
        ax.set(xlabel="actor step", ylabel="held-out success", ylim=(0, top),
               title="mean over seeds, 95% bootstrap band" + title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def reader_plan(plan: str, records: Path) -> bool:
    """Whether ``analyse`` follows the reader comparison's plan (``reader_analysis``): asked
    for, or (``auto``) a records folder ``.../reader/records``."""
    if plan != "auto":
        return plan == "reader"
    parts = records.resolve().parts
    return parts[-2:] == ("reader", "records")


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="minihack_landmark.py export|analyse|banks|bank-entries|no-action",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write the compact records of finished runs")
    ex.add_argument("runs", nargs="+", type=Path, help="run directories")
    ex.add_argument("--records", type=Path, default=RECORDS)
    bk = sub.add_parser("banks", help="bank size by step, content at the end, bank show")
    bk.add_argument("runs", nargs="+", type=Path, help="run directories")
    bk.add_argument("--out", type=Path, required=True, help="folder, e.g. .../keyed_merge/banks")
    be = sub.add_parser("bank-entries", help="every bank entry at the end (id, kind, title, "
                        "content, ...) to <agent>__seed<S>_entries.jsonl")
    be.add_argument("runs", nargs="+", type=Path, help="run directories")
    be.add_argument("--out", type=Path, required=True, help="folder, e.g. .../reader/banks")
    na = sub.add_parser("no-action", help="the training episodes that sent no action, with "
                        "why (from trajectories/) to <agent>__seed<S>_no_action.jsonl")
    na.add_argument("runs", nargs="+", type=Path, help="run directories")
    na.add_argument("--out", type=Path, required=True, help="folder, e.g. .../reader/no_action")
    an = sub.add_parser("analyse", help="the plan's analysis from the committed records only")
    an.add_argument("--summary-only", action="store_true",
                    help="run nothing, read the records (the only mode; kept for the plan's wording)")
    an.add_argument("--records", type=Path, default=RECORDS)
    an.add_argument("--out", type=Path, default=OUT)
    an.add_argument("--agents", nargs="+", default=list(AGENTS))
    an.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    an.add_argument("--steps", type=int, default=STEPS)
    an.add_argument("--plan", choices=("auto", "earlier", "reader"), default="auto",
                    help="reader: results/experience_helps/reader/PLAN.md (experiments/"
                         "reader_analysis.py); earlier: the first and keyed-merge plans; auto "
                         "(default): reader for a records folder named reader/records")
    an.add_argument("--banks", type=Path, default=None,
                    help="--plan reader: the bank files (default: banks/ beside --records)")
    args = ap.parse_args(argv)
    try:
        if args.command == "export":
            for run in args.runs:
                path = export_run(run, args.records)
                print(f"{path} ({path.stat().st_size / 1024:.0f} KB)")
            return 0
        if args.command == "banks":
            for path in export_banks(args.runs, args.out):
                print(path)
            return 0
        if args.command == "bank-entries":
            import reader_analysis

            for path in reader_analysis.export_entries(args.runs, args.out):
                print(path)
            return 0
        if args.command == "no-action":
            import reader_analysis

            for path in reader_analysis.export_no_action(args.runs, args.out):
                print(path)
            return 0
        if reader_plan(args.plan, args.records):
            import reader_analysis

            result = reader_analysis.analyse(args.records, args.banks, args.seeds, args.steps)
            print(reader_analysis.summary_markdown(result))
            print("written: " + ", ".join(map(str, reader_analysis.write(result, args.out))))
            return 0
        result = analyse(args.records, args.agents, args.seeds, args.steps)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None
    text = summary_markdown(result)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "analysis.md").write_text(text)
    png = plot(result, args.out / "curves.png")
    print(f"written: {args.out / 'analysis.json'}, {args.out / 'analysis.md'}"
          + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
