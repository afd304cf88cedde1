"""The reader comparison's analysis (``results/experience_helps/reader/PLAN.md``), from its
committed records alone, for whatever subset of its 20 planned runs is committed.

    python experiments/minihack_landmark.py analyse --summary-only \\
        --records results/experience_helps/reader/records --out results/experience_helps/reader

(``analyse`` picks this plan for a records folder named ``reader/records``; ``--plan reader``
forces it.) Written beside the page: ``analysis.md`` (the tables below), ``analysis.json`` (the
same figures) and ``curves.png``.

* The plan's series: ``grpo``, and each agent with a bank (``static_exp``, ``comp_rl``,
  ``exp_only``) with and without experience. Per run and series ``start`` (step 0), ``end``
  (step 20) and ``AUC`` (trapezoid over the evaluated steps / 20) of held-out success; per
  series the mean over seeds with its 95% percentile bootstrap interval (10,000 resamples,
  ``numpy.random.default_rng(0)``), and the evaluation answers equal to the example shown.
* Per run: the action entropy (bits) of the last training step's action turns and the top
  move's share, the training episodes with no action turn per step (a step's episodes minus its
  action turns: one action per episode), collapsed seeds by the plan's rule (>= 90% of the last
  step's action turns on one move and ``end`` <= 0.175), kept in every statistic.
* The primary comparison and the seven secondary ones, each computed only when both sides have
  all five seeds (else "pending (k + m of 5 + 5 seeds)"): the difference of the means, its 95%
  percentile bootstrap interval (seeds resampled within each side), the exact permutation test
  over all C(10, 5) = 252 assignments (one-sided first − second > 0, and two-sided; assignments
  within 1e-12 of the observed value count against it), and the exact sign test paired by run
  seed (a seed with equal values dropped, n says so; none left: p = 1).
* The verdict by "What counts", and the paper's four 3-mix claims, each hit / miss / reverse /
  not testable here / pending with its interval and exact p.
* Bank entries: every entry of each run's ``banks/<agent>__seed<S>_entries.jsonl`` (written by
  ``minihack_landmark.py bank-entries RUN_DIR``) checked for a title that agrees with its
  content (``: what worked`` with "To succeed, take the action M.", ``: what went wrong`` with
  "To avoid this failure, do not take the action X.").
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling experiments
sys.path.insert(0, str(HERE.parent))

REPO = HERE.parent
FOLDER = REPO / "results" / "experience_helps" / "reader"
RECORDS = FOLDER / "records"

AGENTS = ("grpo", "static_exp", "comp_rl", "exp_only")
SEEDS = (0, 1, 2, 3, 4)
STEPS = 20
EPISODES_PER_STEP = 32
"""The plan's 4 groups x 8 episodes per training step (used where a record does not count them)."""

SERIES = {  # name -> (agent, with experience)
    "grpo": ("grpo", False),
    "static_exp with exp": ("static_exp", True), "static_exp without exp": ("static_exp", False),
    "comp_rl with exp": ("comp_rl", True), "comp_rl without exp": ("comp_rl", False),
    "exp_only with exp": ("exp_only", True), "exp_only without exp": ("exp_only", False),
}

PRIMARY = ("auc", "comp_rl with exp", "grpo")
SECONDARY = (
    ("auc", "comp_rl without exp", "grpo"),
    ("auc", "static_exp with exp", "comp_rl with exp"),
    ("auc", "static_exp with exp", "grpo"),
    ("auc", "exp_only with exp", "grpo"),
    ("auc", "exp_only with exp", "comp_rl with exp"),
    ("auc", "exp_only with exp", "static_exp with exp"),
    ("end", "comp_rl with exp", "grpo"),
)
"""PLAN.md, Statistics: reported, not used for the verdict, no correction."""

ALPHA = 0.05

PAPER = {  # DESIGN.md, "The paper's results": multi-task, 3 tasks, success rate
    "grpo": (0.68, 0.75), "static_exp with exp": (0.41, 0.59),
    "static_exp without exp": (0.39, 0.54), "exp_only with exp": (0.49, 0.33),
    "comp_rl with exp": (0.78, 0.82), "comp_rl without exp": (0.75, 0.78),
}
"""(MiniHack Room, the 3-task average) per series."""

CLAIMS = (
    {"claim": "Comp. RL above the baseline",
     "paper": "Comp. RL w/ exp 0.78 vs GRPO 0.68 on MiniHack Room (average 0.82 vs 0.75)",
     "direction": +1, "comparisons": (("auc", "comp_rl with exp", "grpo"),)},
    {"claim": "Comp. RL without experience above the baseline",
     "paper": "Comp. RL w/o exp 0.75 vs GRPO 0.68 on MiniHack Room (average 0.78 vs 0.75)",
     "direction": +1, "comparisons": (("auc", "comp_rl without exp", "grpo"),)},
    {"claim": "Static online experience below the baseline",
     "paper": "Static Online Exp. w/ exp 0.41 vs GRPO 0.68 on MiniHack Room (average 0.59 vs 0.75)",
     "direction": -1, "comparisons": (("auc", "static_exp with exp", "grpo"),)},
    {"claim": "Experience-only the lowest of the four",
     "paper": "Exp. Only's 3-task average 0.33 is the lowest (GRPO 0.75, Static Online Exp. "
              "w/ exp 0.59, Comp. RL w/ exp 0.82); on MiniHack Room alone its 0.49 is above "
              "Static Online Exp.'s 0.41",
     "direction": -1, "comparisons": (("auc", "exp_only with exp", "grpo"),
                                      ("auc", "exp_only with exp", "comp_rl with exp"),
                                      ("auc", "exp_only with exp", "static_exp with exp"))},
)
"""The paper's four 3-mix claims and the planned comparisons that test each (AUC, with
experience for the agents with a bank): ``direction`` +1 = the first above the second."""


# -- per run -----------------------------------------------------------------------------------

def action_entropy(counts: dict[str, int]) -> float:
    """Shannon entropy in bits of the action turns' distribution (each distinct action string a
    category); nan with no action turn."""
    total = sum(counts.values())
    if not total:
        return float("nan")
    return -sum(c / total * math.log2(c / total) for c in counts.values() if c)


def top_move(counts: dict[str, int]) -> tuple[str | None, float]:
    """The most frequent action and its share of the action turns (ties: the first in name
    order); (None, nan) with no action turn."""
    total = sum(counts.values())
    if not total:
        return None, float("nan")
    move = max(sorted(counts), key=lambda m: counts[m])
    return move, counts[move] / total


def no_action_turns(header: dict[str, Any]) -> dict[int, int]:
    """Per training step, the episodes with no action turn: the step's episodes (its
    ``train_examples`` count, else the plan's 32) minus its action turns (one action per
    episode)."""
    examples = header.get("train_examples") or {}
    out = {}
    actions = header.get("train_actions") or {}
    for step, counts in sorted((int(s), c) for s, c in actions.items()):
        episodes = (examples.get(str(step)) or {}).get("episodes", EPISODES_PER_STEP)
        out[step] = episodes - sum(counts.values())
    return out


def run_figures(header: dict[str, Any], episodes: list[dict[str, Any]], with_exp: bool,
                steps: int) -> dict[str, Any] | None:
    """start / end / AUC and the curve of one series of one run, its last training step's
    entropy and top move, and whether the seed collapsed; None without evaluations at step 0
    and ``steps``."""
    import experience_records as er

    m = er.run_metrics(header, episodes, with_exp, steps)
    if m is None:
        return None
    last = header.get("train_actions", {}).get(str(steps)) or {}
    move, share = top_move(last)
    return {"start": m["start"], "end": m["end"], "auc": m["auc"], "curve": m["curve"],
            "entropy_bits": action_entropy(last), "top_move": move, "top_move_share": share,
            "action_turns": sum(last.values()),
            "collapsed": bool(share >= er.COLLAPSE_TOP_SHARE and m["end"] <= er.COLLAPSE_END)}


EVAL_CLAIM_KEYS = ("episodes", "shown", "success", "success_rule", "sent_success",
                   "sent_success_solved", "failure", "failure_right", "avoided")


def _move(text: Any) -> str:
    """A move as the records compare them: lower case, whitespace collapsed."""
    return " ".join(str(text).lower().split())


def eval_claims(episodes: list[dict[str, Any]]) -> dict[str, int]:
    """What held-out episodes were shown and did (records with the ``claim`` field): episodes;
    those shown an ``action``-template claim; success claims, those naming the level's rule move
    (the entry retrieved carries the rule for this landmark), those whose move was the answer
    (and then solved); failure claims, those naming a move that is not the rule's (right), and
    those whose move the answer avoided."""
    from crl_bench.envs.minihack.landmark import landmark_layout

    c: Counter[str] = Counter()
    for e in episodes:
        c["episodes"] += 1
        claim = e.get("claim")
        if not claim:
            continue
        c["shown"] += 1
        outcome, move = claim[0], _move(claim[1])
        first = _move(e["actions"][0]) if e.get("actions") else None
        rule = landmark_layout(int(e["seed"]))[2]
        if outcome == "success":
            c["success"] += 1
            c["success_rule"] += move == rule
            c["sent_success"] += first == move
            c["sent_success_solved"] += first == move and bool(e["success"])
        else:
            c["failure"] += 1
            c["failure_right"] += move != rule
            c["avoided"] += first != move
    return {k: c[k] for k in EVAL_CLAIM_KEYS}


LAYOUT_KEYS = ("episodes", "solved", "success_claims", "success_claims_right")


def layout_split(header: dict[str, Any], episodes: list[dict[str, Any]]
                 ) -> dict[str, dict[str, int]]:
    """Held-out episodes after step 0 (already given the mode's episodes), split by whether
    their layout — the landmark kind and its square, ``landmark_layout``'s first two — is one a
    training level of the run had (``header["train_levels"]``, every level the run trained on)
    or one it never had: episodes, those solved, and those shown a success claim (naming the
    level's rule move: right)."""
    from crl_bench.envs.minihack.landmark import landmark_layout

    seen = {landmark_layout(int(s))[:2] for s in header.get("train_levels") or ()}
    out = {side: Counter() for side in ("trained", "never")}
    for e in episodes:
        if int(e["step"]) == 0:
            continue
        kind, square, rule = landmark_layout(int(e["seed"]))
        c = out["trained" if (kind, square) in seen else "never"]
        c["episodes"] += 1
        c["solved"] += bool(e["success"])
        claim = e.get("claim")
        if claim and claim[0] == "success":
            c["success_claims"] += 1
            c["success_claims_right"] += _move(claim[1]) == rule
    return {side: {k: c[k] for k in LAYOUT_KEYS} for side, c in out.items()}


# -- statistics --------------------------------------------------------------------------------

def compare(a: dict[int, float], b: dict[int, float], seeds=SEEDS) -> dict[str, Any]:
    """The plan's statistics for per-seed values ``a`` − ``b`` (dicts run seed -> value); only
    when both hold every seed of ``seeds``, else ``{"pending": ...}``."""
    from crl_bench.report.seed_tests import bootstrap_diff, permutation_test, sign_test

    if any(s not in a for s in seeds) or any(s not in b for s in seeds):
        have_a, have_b = sum(s in a for s in seeds), sum(s in b for s in seeds)
        return {"pending": f"pending ({have_a} + {have_b} of {len(seeds)} + {len(seeds)} seeds)",
                "n_a": have_a, "n_b": have_b}
    xa, xb = [a[s] for s in seeds], [b[s] for s in seeds]
    diff, low, high = bootstrap_diff(xa, xb)
    perm = permutation_test(xa, xb)
    d = [a[s] - b[s] for s in seeds]
    sign = sign_test(d)
    return {"diff": diff, "low": low, "high": high, "n_a": len(xa), "n_b": len(xb),
            "perm_p_greater": perm.p_greater, "perm_p_less": permutation_test(xb, xa).p_greater,
            "perm_p_two_sided": perm.p_two_sided, "perm_assignments": perm.n,
            "perm_p_min": permutation_test(*extreme_split(xa + xb, len(xa))).p_greater,
            "sign_test_positive": int(sign.statistic), "sign_test_n": sign.n,
            "sign_test_zeros": len(seeds) - sign.n,
            "sign_test_p_greater": sign.p_greater, "sign_test_p_two_sided": sign.p_two_sided}


def extreme_split(pooled: list[float], na: int) -> tuple[list[float], list[float]]:
    """The assignment with the largest first-minus-second difference: the ``na`` largest values
    first. Its one-sided permutation p is the smallest any labelling of these values can give
    (ties included; by symmetry, also the smallest in the other direction)."""
    ordered = sorted(pooled, reverse=True)
    return ordered[:na], ordered[na:]


def verdict(primary: dict[str, Any]) -> str:
    """PLAN.md, What counts: hit, reverse or miss (pending while a side lacks a seed)."""
    if "pending" in primary:
        return "pending"
    if primary["perm_p_greater"] <= ALPHA and primary["low"] > 0:
        return "hit"
    if primary["diff"] < 0 and primary["perm_p_two_sided"] <= ALPHA:
        return "reverse"
    return "miss"


def _fmt(v: float) -> str:
    return f"{v:+.3f}"


def judge(c: dict[str, Any], direction: int) -> tuple[str, str]:
    """(outcome, why) of one comparison read in a claim's direction (+1: the first above the
    second), by the plan's rule for the primary turned to that direction: hit = one-sided p in
    that direction <= 0.05 and the bootstrap interval wholly on that side of 0 (a bound at 0 is
    not); reverse = the difference on the other side with two-sided p <= 0.05; not testable
    here = no labelling of these values could give p <= 0.05; else miss."""
    if "pending" in c:
        return "pending", c["pending"]
    p = c["perm_p_greater"] if direction > 0 else c["perm_p_less"]
    side = "above" if direction > 0 else "below"
    interval = f"[{_fmt(c['low'])}, {_fmt(c['high'])}]"
    if c["perm_p_min"] > ALPHA:
        return "not testable here", (f"with these tied values no assignment of the 252 gives a "
                                     f"one-sided p below {c['perm_p_min']:.4f}")
    inside = c["low"] > 0 if direction > 0 else c["high"] < 0
    if p <= ALPHA and inside:
        return "hit", f"one-sided p {p:.4f} <= 0.05 and the interval {interval} lies {side} 0"
    if direction * c["diff"] < 0 and c["perm_p_two_sided"] <= ALPHA:
        return "reverse", (f"the difference {_fmt(c['diff'])} is on the other side, two-sided p "
                           f"{c['perm_p_two_sided']:.4f} <= 0.05")
    why = [f"one-sided p {p:.4f} > 0.05"] if p > ALPHA else []
    if not inside:
        why.append(f"the interval {interval} does not lie {side} 0")
    return "miss", " and ".join(why)


def claims(comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper's four claims (:data:`CLAIMS`) judged on the computed comparisons; a claim with
    several comparisons (experience-only lowest) is a hit when each is, a reverse when any is,
    pending while any is, not testable when any is, else a miss."""
    by_key = {(c["metric"], c["a"], c["b"]): c for c in comparisons}
    out = []
    for claim in CLAIMS:
        parts = []
        for key in claim["comparisons"]:
            outcome, why = judge(by_key[key], claim["direction"])
            parts.append({"metric": key[0], "a": key[1], "b": key[2], "outcome": outcome,
                          "why": why})
        outcomes = [p["outcome"] for p in parts]
        for rule in ("pending", "reverse", "not testable here"):
            if rule in outcomes:
                overall = rule
                break
        else:
            overall = "hit" if set(outcomes) == {"hit"} else "miss"
        out.append({"claim": claim["claim"], "paper": claim["paper"],
                    "direction": claim["direction"], "outcome": overall, "parts": parts})
    return out


# -- bank entries ------------------------------------------------------------------------------

TITLE_OUTCOMES = ((": what worked", "success"), (": what went wrong", "failure"))


def title_outcome(title: str) -> str | None:
    """The outcome an ``action``-template title states (its suffix), None for another title."""
    for suffix, outcome in TITLE_OUTCOMES:
        if title.rstrip().endswith(suffix):
            return outcome
    return None


def entry_agreement(entry: dict[str, Any]) -> str:
    """``agrees`` / ``disagrees``: the title's outcome against the content's claim;
    ``no claim`` for a content that is no ``action``-template claim, ``no outcome title`` for a
    title without one of the template's suffixes."""
    import experience_records as er

    claim = er.entry_claim(str(entry.get("content", "")))
    if claim is None:
        return "no claim"
    stated = title_outcome(str(entry.get("title", "")))
    if stated is None:
        return "no outcome title"
    return "agrees" if stated == claim[0] else "disagrees"


AGREEMENT = ("agrees", "disagrees", "no claim", "no outcome title")


def bank_agreement(banks: Path) -> dict[str, Any]:
    """Per run with a ``<run>_entries.jsonl`` in ``banks``: every entry's title against its
    content (:func:`entry_agreement`), counted for merged and for added entries, with the
    disagreeing entries' ids."""
    runs = {}
    for path in sorted(banks.glob("*_entries.jsonl")) if banks.is_dir() else []:
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        counts: dict[str, Counter[str]] = {"merge": Counter(), "add": Counter()}
        bad = []
        for r in rows:
            kind = "merge" if r.get("kind") == "merge" else "add"
            verdict_ = entry_agreement(r)
            counts[kind][verdict_] += 1
            if verdict_ == "disagrees":
                bad.append(r.get("id"))
        runs[path.name[:-len("_entries.jsonl")]] = {
            "entries": len(rows), "disagreeing_ids": bad,
            **{kind: {k: c[k] for k in AGREEMENT} for kind, c in counts.items()},
            "samples": bank_samples(rows)}
    return runs


def bank_samples(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per outcome title (``what worked``, then ``what went wrong``) as the actor is
    shown it: the lowest-id merged entry with that title, else the lowest-id entry, with its
    :func:`entry_agreement` verdict. A fixed pick (no draw), so the page's samples are the same
    on every rerun of the same files."""
    picks = []
    for _suffix, outcome in TITLE_OUTCOMES:
        titled = sorted((r for r in rows if title_outcome(str(r.get("title", ""))) == outcome),
                        key=lambda r: (r.get("kind") != "merge", r.get("id", 0)))
        if titled:
            r = titled[0]
            picks.append({"id": r.get("id"), "kind": r.get("kind"), "title": r.get("title"),
                          "content": r.get("content"), "verdict": entry_agreement(r)})
    return picks


def export_entries(runs: list[Path], out: Path) -> list[Path]:
    """``<agent>__seed<S>_entries.jsonl`` in ``out`` for each run with a bank: every entry at
    the end of the run, one line each (id, kind = how it was made, ``add`` or ``merge``, its
    parents, title, content, task ids, created and updated step). Runs without a bank are
    skipped."""
    import experience_records as er
    from crl_bench.experience.bank import ExperienceBank

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for run in runs:
        if not (run / "bank.sqlite").exists():
            continue
        bank = ExperienceBank.open(run / "bank.sqlite", read_only=True, build_index=False)
        try:
            entries = bank.get(bank.all_ids())
        finally:
            bank.close()
        path = out / f"{er.run_name(run)}_entries.jsonl"
        lines = [json.dumps({"id": e.id, "kind": e.origin, "parents": list(e.parent_ids),
                             "title": e.title, "content": e.content,
                             "task_ids": list(e.task_ids), "created_step": e.created_step,
                             "updated_step": e.updated_step}, ensure_ascii=False)
                 for e in sorted(entries, key=lambda e: e.id)]
        path.write_text("".join(line + "\n" for line in lines))
        written.append(path)
    return written


NO_ACTION_KEYS = ("step", "level", "with_experience", "kind", "reason", "finish_reason",
                  "tokens", "text")


def no_action_reason(turn: dict[str, Any]) -> str:
    """Why a training episode's only turn sent no action, from its trajectory turn: the parser's
    message for an invalid reply (``Invalid format (the answer block is not closed)`` -> "the
    answer block is not closed"), with ", at the token cap" where generation stopped on length;
    "asked (Search-and-Ask), no action" for an ask; else the turn's kind."""
    kind = turn.get("kind")
    if kind == "invalid":
        m = re.search(r"\(([^)]*)\)", turn.get("observation") or "")
        why = m[1] if m else "invalid format"
        return why + (", at the token cap" if turn.get("finish_reason") == "length" else "")
    if kind == "ask":
        return "asked (Search-and-Ask), no action"
    return str(kind)


def export_no_action(runs: list[Path], out: Path) -> list[Path]:
    """``<agent>__seed<S>_no_action.jsonl`` in ``out`` for each run: one line per training
    episode that sent no action (from ``trajectories/train_step_*.jsonl.gz``): its step, level,
    whether it was shown experience, its last turn's kind, the reason (``no_action_reason``),
    the finish reason, the completion's token count and its first 80 characters. A run without
    trajectories is skipped."""
    import gzip

    import experience_records as er

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for run in runs:
        files = sorted((run / "trajectories").glob("train_step_*.jsonl.gz"))
        if not files:
            continue
        rows = []
        for f in files:
            step = int(f.name[len("train_step_"):-len(".jsonl.gz")])
            with gzip.open(f, "rt") as fh:
                for line in fh:
                    t = json.loads(line)
                    if t.get("n_actions") or not t.get("turns"):
                        continue
                    last = t["turns"][-1]
                    rows.append(dict(zip(NO_ACTION_KEYS, (
                        step, t.get("seed"), bool(t.get("with_experience")), last.get("kind"),
                        no_action_reason(last), last.get("finish_reason"),
                        len(last.get("completion_ids") or ()),
                        (last.get("completion_text") or "")[:80]))))
        path = out / f"{er.run_name(run)}_no_action.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        written.append(path)
    return written


def no_action_reasons(folder: Path) -> dict[str, dict[str, Any]]:
    """``run -> {"episodes": n, "reasons": {reason: count}, "with_experience": n shown experience,
    "tokens": [min, max]}`` from the
    committed ``<run>_no_action.jsonl`` files in ``folder``; {} without the folder."""
    out = {}
    for path in sorted(folder.glob("*_no_action.jsonl")) if folder.is_dir() else []:
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        tokens = [r["tokens"] for r in rows]
        out[path.name[:-len("_no_action.jsonl")]] = {
            "episodes": len(rows), "reasons": dict(Counter(r["reason"] for r in rows)),
            "with_experience": sum(bool(r["with_experience"]) for r in rows),
            "tokens": [min(tokens), max(tokens)] if tokens else None}
    return out


# -- the analysis ------------------------------------------------------------------------------

LAUNCH_RE = re.compile(r"^(\S+Z) start (\w+) seed (\d+)$")


def launches(log: Path) -> dict[str, list[str]]:
    """``run -> [start times]`` from the run driver's launcher log (``run_all.sh`` appends a
    ``<time> start <agent> seed <n>`` line each time it starts or resumes a run); {} without it."""
    out: dict[str, list[str]] = {}
    if log.is_file():
        for line in log.read_text().splitlines():
            m = LAUNCH_RE.match(line.strip())
            if m:
                out.setdefault(f"{m[2]}__seed{m[3]}", []).append(m[1])
    return out


def analyse(records: Path = RECORDS, banks: Path | None = None, seeds=SEEDS,
            steps: int = STEPS) -> dict[str, Any]:
    """The plan's analysis from the files in ``records`` (module docstring); ``banks``
    (default: ``banks`` beside ``records``) for the bank tables."""
    import experience_records as er
    from crl_bench.report.seed_tests import bootstrap_mean

    seeds = tuple(seeds)
    banks = records.parent / "banks" if banks is None else banks
    why = no_action_reasons(records.parent / "no_action")
    runs: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in SERIES}
    per_run, missing, leaks, hints, no_action, provenance = [], [], {}, [], [], []
    shown_claims: list[dict[str, Any]] = []
    layouts: list[dict[str, Any]] = []
    shown: dict[str, Counter[str]] = {name: Counter() for name in SERIES}
    recorded = []
    for agent in AGENTS:
        for seed in seeds:
            path = records / f"{agent}__seed{seed}.jsonl"
            if not path.is_file():
                missing.append({"agent": agent, "seed": seed, "why": "no records file yet"})
                continue
            recorded.append(f"{agent}__seed{seed}")
            header, episodes = er.load_records(path)
            if header["agent"] != agent or int(header["run_seed"]) != seed:
                raise ValueError(f"{path}: holds {header['agent']} seed {header['run_seed']}")
            leaked = er.held_out_check(header, episodes)
            if leaked:
                leaks[f"{agent} seed {seed}"] = leaked
            prov = header.get("provenance") or {}
            provenance.append({"agent": agent, "seed": seed, "state": header.get("state"),
                               "commit": prov.get("commit"), "started": prov.get("started_utc"),
                               "ended": prov.get("ended_utc"), "model": header.get("model"),
                               "example_pick": header.get("example_pick"),
                               "wall_min": (header.get("time_min") or {}).get("run")})
            gaps = no_action_turns(header)
            no_action.append({"agent": agent, "seed": seed, "total": sum(gaps.values()),
                              "steps": len(gaps), "per_step": {str(s): n for s, n in gaps.items()},
                              "why": why.get(f"{agent}__seed{seed}")})
            if header.get("train_hints"):
                total: Counter[str] = Counter()
                for counts in header["train_hints"].values():
                    total.update(counts)
                if total["with_exp"]:
                    hints.append({"agent": agent, "seed": seed,
                                  **{k: total[k] for k in er.HINT_KEYS}})
            for name, (a, with_exp) in SERIES.items():
                if a != agent:
                    continue
                m = run_figures(header, episodes, with_exp, steps)
                if m is None:
                    missing.append(er.no_evaluation(agent, seed, name, header, steps))
                    continue
                runs[name][seed] = m
                mode = [e for e in episodes if bool(e["exp"]) == with_exp]
                ex = er.example_counts(mode)
                if with_exp and any("claim" in e for e in mode):
                    shown_claims.append({"series": name, "seed": seed, **eval_claims(mode)})
                if header.get("train_levels"):
                    layouts.append({"series": name, "seed": seed, **layout_split(header, mode)})
                shown[name].update({k: ex[k] for k in ("episodes", "shown", "sent_example")})
                per_run.append({"series": name, "seed": seed,
                                **{k: v for k, v in m.items() if k != "curve"},
                                "answers": ex["episodes"], "example_shown": ex["shown"],
                                "sent_example": ex["sent_example"], "examples": ex["examples"]})
    means = {}
    for name, by_seed in runs.items():
        if by_seed:
            means[name] = {"n": len(by_seed), "seeds": sorted(by_seed), **{
                metric: dict(zip(("mean", "low", "high"),
                                 bootstrap_mean([by_seed[s][metric] for s in sorted(by_seed)])))
                for metric in ("start", "end", "auc")},
                "answers": shown[name]["episodes"], "example_shown": shown[name]["shown"],
                "sent_example": shown[name]["sent_example"]}
    comparisons = []
    for role, (metric, a, b) in [("primary", PRIMARY)] + [("secondary", s) for s in SECONDARY]:
        comparisons.append({"role": role, "metric": metric, "a": a, "b": b, **compare(
            {s: m[metric] for s, m in runs[a].items()},
            {s: m[metric] for s, m in runs[b].items()}, seeds)})
    layout_gap = {}
    for name in SERIES:
        rows = [r for r in layouts if r["series"] == name]
        if len(rows) == len(seeds) and all(r[s]["episodes"] for r in rows
                                           for s in ("trained", "never")):
            gaps = [r["never"]["solved"] / r["never"]["episodes"]
                    - r["trained"]["solved"] / r["trained"]["episodes"] for r in rows]
            layout_gap[name] = dict(zip(("mean", "low", "high"), bootstrap_mean(gaps)))
    collapsed = [{"series": r["series"], "seed": r["seed"], "top_move": r["top_move"],
                  "top_move_share": r["top_move_share"], "end": r["end"]}
                 for r in per_run if r["collapsed"]]
    return {"plan": "results/experience_helps/reader/PLAN.md", "agents": list(AGENTS),
            "seeds": list(seeds), "steps": steps, "planned": len(AGENTS) * len(seeds),
            "recorded": recorded, "missing": missing, "held_out_violations": leaks,
            "provenance": provenance, "runs": per_run, "means": means,
            "launches": {run: times for run, times in
                         launches(records.parent / "launcher_log.txt").items() if run in recorded},
            "eval_claims": shown_claims,
            "layouts": layouts, "layout_gap": layout_gap,
            "collapsed": collapsed, "no_action_turns": no_action, "hints": hints,
            "comparisons": comparisons, "verdict": verdict(comparisons[0]),
            "claims": claims(comparisons),
            "bank_agreement": bank_agreement(banks),
            "bank_content": (json.loads((banks / "bank_content.json").read_text())
                             if (banks / "bank_content.json").is_file() else {}),
            "curves": {name: {str(s): {str(k): v for k, v in m["curve"].items()}
                              for s, m in by_seed.items()}
                       for name, by_seed in runs.items() if by_seed}}


# -- the page ----------------------------------------------------------------------------------

def _why(g: dict[str, Any]) -> str:
    """The no-action table's reasons cell: each reason's count and the replies' token counts,
    and a warning where the exported episodes do not number the records' total."""
    w = g.get("why")
    if w is None:
        return "—"
    if not w["episodes"]:
        return "none" if not g["total"] else f"none exported (the records count {g['total']})"
    lo, hi = w["tokens"]
    text = "; ".join(f"{n}: {r}" for r, n in sorted(w["reasons"].items(), key=lambda x: -x[1]))
    text += f" ({lo} token{'s' * (lo != 1)})" if lo == hi else f" ({lo}–{hi} tokens)"
    text += f"; {w['with_experience']} of {w['episodes']} shown experience"
    if w["episodes"] != g["total"]:
        text += f" — {w['episodes']} exported, the records count {g['total']}"
    return text


def _share(k: int, n: int) -> str:
    return f"{k}/{n}" + (f" = {k / n:.2f}" if n else "")


def _cmp_name(c: dict[str, Any]) -> str:
    unit = "AUC" if c["metric"] == "auc" else c["metric"]
    return f"{unit}({c['a']}) − {unit}({c['b']})"


def summary_markdown(result: dict[str, Any]) -> str:
    import experience_records as er

    n_rec, planned = len(result["recorded"]), result["planned"]
    lines = ["# The reader comparison: analysis from the committed records", "",
             f"Generated by `python experiments/minihack_landmark.py analyse --summary-only "
             f"--records results/experience_helps/reader/records --out "
             f"results/experience_helps/reader` from the committed records alone, by "
             f"[`PLAN.md`](PLAN.md): {len(result['agents'])} agents x run seeds "
             f"{', '.join(map(str, result['seeds']))}, {result['steps']} actor steps; "
             f"**{n_rec} of the {planned} planned runs recorded**. A comparison is computed once "
             f"both its sides have all {len(result['seeds'])} seeds, and shows *pending* until "
             f"then.", ""]
    lines += ["## Runs", "", "| agent | " + " | ".join(f"seed {s}" for s in result["seeds"])
              + " |", "|---|" + "---|" * len(result["seeds"])]
    have = set(result["recorded"])
    for agent in result["agents"]:
        lines.append(f"| {agent} | " + " | ".join(
            "recorded" if f"{agent}__seed{s}" in have else "—" for s in result["seeds"]) + " |")
    odd = [m for m in result["missing"] if "series" in m]
    if odd:
        lines += [""] + [f"- {m['agent']} seed {m['seed']} ({m['series']}): {m['why']}"
                         for m in odd]
    lines += ["", "Provenance (each record's header: the code's commit, the run's start and end, "
              "the actor, the example pick):", "",
              "| run | state | commit | started (UTC) | ended (UTC) | actor | example "
              "| wall (min) |",
              "|---|---|---|---|---|---|---|---|"]
    for p in result["provenance"]:
        wall = p.get("wall_min")
        lines.append(f"| {p['agent']} seed {p['seed']} | {p['state']} | "
                     f"{(p['commit'] or '—')[:10]} | {p['started'] or '—'} | "
                     f"{p['ended'] or '—'} | "
                     f"{p['model'] or '—'} | {p['example_pick'] or '—'} | "
                     f"{'—' if wall is None else f'{wall:.1f}'} |")
    started = result.get("launches", {})
    again = {run: times for run, times in started.items() if len(times) > 1}
    if started:
        lines += ["", f"Starts in the run driver's log ([`launcher_log.txt`](launcher_log.txt); "
                  f"it covers {len(started)} of the recorded runs, the others' times are their "
                  f"headers'): " + ("every run started once." if not again else
                  "started more than once (interrupted, then resumed from its last checkpoint "
                  "or, before the first, from the start): " + "; ".join(
                      f"{run.replace('__seed', ' seed ')} at {', '.join(t)}"
                      for run, t in sorted(again.items())) + ".")]
    lines += ["", "## Held out", "", "no records" if not result["recorded"] else
              "no run trained on a level it was evaluated on (every record checked)"
              if not result["held_out_violations"] else
              "VIOLATED: " + "; ".join(f"{k}: levels {v[:8]}" for k, v in
                                       result["held_out_violations"].items())]
    lines += ["", "## Per series (mean over seeds, 95% percentile bootstrap, 10,000 resamples)",
              "", "Held-out success on the 128 evaluation levels, greedy. Answers = example: the "
              "evaluation answers equal to the example their prompt showed (the placeholder "
              "word; a move cannot equal it), over the series' evaluations.", "",
              "| series | seeds | start | end | AUC | answers = example |",
              "|---|---|---|---|---|---|"]
    for name in SERIES:
        m = result["means"].get(name)
        if m is None:
            lines.append(f"| {name} | 0 | — | — | — | — |")
            continue
        cells = [f"{m[k]['mean']:.3f} [{m[k]['low']:.3f}, {m[k]['high']:.3f}]"
                 for k in ("start", "end", "auc")]
        lines.append(f"| {name} | {m['n']} | " + " | ".join(cells)
                     + f" | {_share(m['sent_example'], m['example_shown'])} |")
    lines += ["", "## Per run", "",
              "Last training step (step " + str(result["steps"]) + "): the entropy (bits; 3 = "
              "all eight moves equally often) of its action turns and the top move's share. "
              "Collapsed (the plan's rule): >= 90% of those turns on one move and `end` <= "
              "0.175.", "",
              "| series | seed | start | end | AUC | entropy (bits) | top move | collapsed | "
              "answers = example |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        lines.append(f"| {r['series']} | {r['seed']} | {r['start']:.3f} | {r['end']:.3f} | "
                     f"{r['auc']:.3f} | {r['entropy_bits']:.2f} | {r['top_move']} "
                     f"{r['top_move_share']:.0%} of {r['action_turns']} | "
                     f"{'yes' if r['collapsed'] else 'no'} | "
                     f"{_share(r['sent_example'], r['example_shown'])} |")
    lines += ["", "Collapsed seeds: " + ("none" if not result["collapsed"] else "; ".join(
        f"{c['series']} seed {c['seed']} ({c['top_move']} {c['top_move_share']:.0%}, end "
        f"{c['end']:.3f})" for c in result["collapsed"])) + " (kept in every statistic)."]
    lines += ["", "## Training episodes with no action turn", "",
              "Per run and training step: the step's episodes minus its action turns (one action "
              "per episode). Why: each such episode's reply, from the run's trajectories "
              "(`no_action/<run>_no_action.jsonl`, written by `python experiments/"
              "minihack_landmark.py no-action RUN_DIR --out results/experience_helps/reader/"
              "no_action`; the runs whose trajectories were not kept show a dash).", "",
              "| run | steps | total | per step (step: episodes), where not 0 | why |",
              "|---|---|---|---|---|"]
    for g in result["no_action_turns"]:
        nz = [f"{s}: {n}" for s, n in g["per_step"].items() if n]
        lines.append(f"| {g['agent']} seed {g['seed']} | {g['steps']} | {g['total']} | "
                     + (", ".join(nz) or "none") + f" | {_why(g)} |")
    n_sec = sum(c["role"] == "secondary" for c in result["comparisons"])
    lines += ["", "## Comparisons", "",
              f"The primary and the plan's {n_sec} secondary comparisons (reported, not used for "
              f"the verdict; no correction for their number). Difference of the means over "
              f"seeds [95% percentile bootstrap, seeds resampled within each side, 10,000 "
              f"resamples, `numpy.random.default_rng(0)`]; exact permutation test over all "
              f"C(10, 5) = 252 assignments, one-sided (first − second > 0) and two-sided, "
              f"assignments within 1e-12 of the observed value counted against it; exact sign "
              f"test paired by run seed (a seed with equal values dropped; n says so).", "",
              "| role | comparison | seeds | difference [95% bootstrap] | permutation p "
              "(one-sided / two-sided) | sign test: positive / n, p (one-sided / two-sided) |",
              "|---|---|---|---|---|---|"]
    for c in result["comparisons"]:
        if "pending" in c:
            lines.append(f"| {c['role']} | {_cmp_name(c)} | {c['n_a']} + {c['n_b']} | "
                         f"{c['pending']} | — | — |")
            continue
        lines.append(f"| {c['role']} | {_cmp_name(c)} | {c['n_a']} + {c['n_b']} | "
                     f"{_fmt(c['diff'])} [{_fmt(c['low'])}, {_fmt(c['high'])}] | "
                     f"{c['perm_p_greater']:.4f} / {c['perm_p_two_sided']:.4f} | "
                     f"{c['sign_test_positive']}/{c['sign_test_n']}"
                     + (f" ({c['sign_test_zeros']} equal, dropped)" if c["sign_test_zeros"] else "")
                     + f", {c['sign_test_p_greater']:.4f} / {c['sign_test_p_two_sided']:.4f} |")
    primary = result["comparisons"][0]
    lines += ["", "## Verdict (PLAN.md, What counts)", ""]
    if result["verdict"] == "pending":
        lines.append(f"**Pending**: the primary comparison, {_cmp_name(primary)}, is "
                     f"{primary['pending']}. Hit: one-sided permutation p <= 0.05 and the "
                     f"bootstrap interval above 0; reverse: the difference below 0 with two-sided "
                     f"p <= 0.05; miss: anything else.")
    else:
        outcome, why = judge(primary, +1)
        lines.append(f"**{result['verdict'].capitalize()}**: {_cmp_name(primary)} "
                     f"{_fmt(primary['diff'])} [{_fmt(primary['low'])}, {_fmt(primary['high'])}], "
                     f"permutation p {primary['perm_p_greater']:.4f} one-sided, "
                     f"{primary['perm_p_two_sided']:.4f} two-sided ({why}).")
        if result["verdict"] == "miss":
            lines.append("")
            lines.append("What limits it: the claims the with-experience episodes were shown "
                         "(training and held-out) and what the actor did with them, and each "
                         "bank's content per key, in the tables below.")
    lines += ["", "## The paper's four 3-mix claims, at this scale", "",
              "Each read on the planned AUC comparisons (with experience for the agents with a "
              "bank) in the claim's direction, by the primary's rule turned to that direction: "
              "hit = one-sided permutation p <= 0.05 in that direction and the bootstrap interval "
              "wholly on that side of 0; reverse = the difference on the other side with "
              "two-sided p <= 0.05; not testable here = no labelling of the values could give "
              "p <= 0.05; pending = a side lacks a seed; else miss. The one-sided p below 0 is "
              "the share of the 252 assignments whose difference is <= the observed one (the "
              "one-sided p of the reversed comparison). The paper's figures: DESIGN.md, 3-task "
              "mix, success rate.", "",
              "| claim | the paper | comparison | difference [95% bootstrap] | p (claim's "
              "direction / two-sided) | outcome | why |", "|---|---|---|---|---|---|---|"]
    by_key = {(c["metric"], c["a"], c["b"]): c for c in result["comparisons"]}
    for cl in result["claims"]:
        for i, part in enumerate(cl["parts"]):
            c = by_key[(part["metric"], part["a"], part["b"])]
            first = i == 0
            if "pending" in c:
                figs, ps = "—", "—"
            else:
                p = c["perm_p_greater"] if cl["direction"] > 0 else c["perm_p_less"]
                figs = f"{_fmt(c['diff'])} [{_fmt(c['low'])}, {_fmt(c['high'])}]"
                ps = f"{p:.4f} / {c['perm_p_two_sided']:.4f}"
            lines.append(f"| {cl['claim'] + (' — **' + cl['outcome'] + '**') if first else ''} "
                         f"| {cl['paper'] if first else ''} | {_cmp_name(c)} "
                         f"{'> 0' if cl['direction'] > 0 else '< 0'} | {figs} | {ps} | "
                         f"{part['outcome']} | {part['why']} |")
    if result["hints"]:
        lines += ["", "## What the with-experience training episodes were shown, and did", "",
                  "Summed over each run's training steps: a success claim says *take* a move, a "
                  "failure claim *do not take* one; a claim is right when a success names the "
                  "rule's move of the level, or a failure anything else.", "",
                  ] + er.hints_table(result["hints"])
    if result.get("eval_claims"):
        lines += ["", "## What the with-experience evaluation episodes were shown, and did", "",
                  "Summed over each run's evaluations (held-out levels, greedy): episodes shown an "
                  "`action`-template claim; a success claim is right when it names the level's "
                  "rule move (an entry for this landmark), a failure claim when it names another "
                  "move.", "",
                  "| series | seed | episodes | shown a claim | success claims (right) | answer = "
                  "the claim's move (then solved) | failure claims (right) | avoided |",
                  "|---|---|---|---|---|---|---|---|"]
        for h in result["eval_claims"]:
            lines.append(f"| {h['series']} | {h['seed']} | {h['episodes']} | {h['shown']} | "
                         f"{h['success']} ({h['success_rule']}) | {h['sent_success']} "
                         f"({h['sent_success_solved']}) | {h['failure']} ({h['failure_right']}) "
                         f"| {h['avoided']} |")
    if result.get("layouts"):
        lines += ["", "## Layouts no training level had", "",
                  "The 128 evaluation levels have each of the 128 layouts (landmark kind x its "
                  "square) once; a run's training levels had some of them. Held-out success after "
                  "step 0, summed over the run's evaluations, on the levels whose layout a "
                  "training level had and on the others, with the success claims shown there "
                  "(right: naming the level's rule move). Per series with all five seeds: the "
                  "mean over seeds of the success rate on new layouts minus that on trained ones "
                  "[95% seed bootstrap].", "",
                  "| series | seed | trained layouts: solved / episodes | success claims "
                  "(right) | new layouts: solved / episodes | success claims (right) |",
                  "|---|---|---|---|---|---|"]
        for r in result["layouts"]:
            t, n = r["trained"], r["never"]
            shown = SERIES[r["series"]][1]  # claims: only a series shown experience has them
            claims_t, claims_n = ((f"{x['success_claims']} ({x['success_claims_right']})"
                                   if shown else "—") for x in (t, n))
            lines.append(f"| {r['series']} | {r['seed']} | {_share(t['solved'], t['episodes'])} "
                         f"| {claims_t} | {_share(n['solved'], n['episodes'])} | {claims_n} |")
        if result.get("layout_gap"):
            lines += ["", "| series | new − trained layouts, success [95% bootstrap] |",
                      "|---|---|"]
            for name, g in result["layout_gap"].items():
                lines.append(f"| {name} | {_fmt(g['mean'])} [{_fmt(g['low'])}, "
                             f"{_fmt(g['high'])}] |")
    lines += ["", "## Bank entries: does each title agree with its content?", "",
              "Every entry of each run's bank at its end (`banks/<run>_entries.jsonl`, written "
              "by `python experiments/minihack_landmark.py bank-entries RUN_DIR --out "
              "results/experience_helps/reader/banks`): a title ending `: what worked` must "
              "head a success claim (\"To succeed, take the action M.\"), one ending `: what "
              "went wrong` a failure claim (\"To avoid this failure, do not take the action "
              "X.\").", ""]
    agree = result["bank_agreement"]
    if not agree:
        lines.append("No entry file committed yet: no bank has been checked entry by entry.")
    else:
        lines += ["| run | entries | merged: agree / disagree / no claim / no outcome title | "
                  "added: agree / disagree / no claim / no outcome title | disagreeing ids |",
                  "|---|---|---|---|---|"]
        for run, a in agree.items():
            cells = [" / ".join(str(a[kind][k]) for k in AGREEMENT) for kind in ("merge", "add")]
            ids = ", ".join(map(str, a["disagreeing_ids"][:12])) or "none"
            if len(a["disagreeing_ids"]) > 12:
                ids += f" (+{len(a['disagreeing_ids']) - 12})"
            lines.append(f"| {run} | {a['entries']} | {cells[0]} | {cells[1]} | {ids} |")
        samples = [(run, x) for run, a in agree.items() for x in a.get("samples", [])]
        if samples:
            lines += ["", "Samples, as the actor is shown them (`title: content`): per run the "
                      "lowest-id merged entry under each outcome title.", "",
                      "| run | id | kind | title: content | title agrees with content |",
                      "|---|---|---|---|---|"]
            for run, x in samples:
                text = f"{x['title']}: {x['content']}".replace("|", "\\|")
                lines.append(f"| {run} | {x['id']} | {x['kind']} | {text} | {x['verdict']} |")
    if result["bank_content"]:
        lines += ["", "## Bank content at the end (`banks/bank_content.json`)", "",
                  "| run | entries | keys | keys with a success naming the rule | landmark kinds "
                  "covered | merged | success (naming the rule) | failure (naming another "
                  "move) | other text |", "|---|---|---|---|---|---|---|---|---|"]
        for run, b in sorted(result["bank_content"].items()):
            b = {k: b.get(k, "—") for k in (
                "entries", "keys", "keys_with_a_success_naming_the_rule",
                "kinds_with_a_success_naming_the_rule", "merged", "success",
                "success_naming_the_rule", "failure", "failure_naming_another_move",
                "other_text")}  # a field an older bank_content.json lacks: a dash
            lines.append(f"| {run} | {b['entries']} | {b['keys']} | "
                         f"{b['keys_with_a_success_naming_the_rule']} | "
                         f"{b['kinds_with_a_success_naming_the_rule']}/8 | {b['merged']} | "
                         f"{b['success']} ({b['success_naming_the_rule']}) | {b['failure']} "
                         f"({b['failure_naming_another_move']}) | {b['other_text']} |")
    lines += ["", "## Curves", "", "![held-out success per step, mean over seeds with a 95% "
              "bootstrap band](curves.png)", ""]
    return "\n".join(lines)


STYLE = {"grpo": "black", "static_exp": "tab:orange", "comp_rl": "tab:blue",
         "exp_only": "tab:green"}


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Held-out success per evaluated step, each series' mean over seeds with its 95% bootstrap
    band: with experience (left) and without (right), ``grpo`` on both."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import experience_records as er
    from crl_bench.report.seed_tests import bootstrap_mean

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, with_exp in zip(axes, (True, False)):
        for name, (agent, exp) in SERIES.items():
            by_seed = result["curves"].get(name)
            if not by_seed or (agent != "grpo" and exp != with_exp):
                continue
            xs = sorted({int(s) for c in by_seed.values() for s in c})
            bands = [bootstrap_mean([c[str(x)] for c in by_seed.values() if str(x) in c])
                     for x in xs]
            ax.plot(xs, [b[0] for b in bands], marker="o", color=STYLE[agent],
                    label=f"{name} (n={len(by_seed)})")
            ax.fill_between(xs, [b[1] for b in bands], [b[2] for b in bands], alpha=0.15,
                            color=STYLE[agent])
        ax.axhline(er.BEST_CONSTANT, color="grey", ls=":", label="best constant move (1/8)")
        ax.set(xlabel="actor step", ylabel="held-out success", ylim=(0, 1.02),
               xticks=list(range(0, result["steps"] + 1, 5)),
               title=("with experience" if with_exp else "without experience")
               + ": mean over seeds, 95% bootstrap band")
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(result: dict[str, Any], out: Path) -> list[Path]:
    """``analysis.json``, ``analysis.md`` and ``curves.png`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    text = summary_markdown(result)
    (out / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "analysis.md").write_text(text)
    paths = [out / "analysis.json", out / "analysis.md"]
    png = plot(result, out / "curves.png")
    return paths + ([png] if png else [])


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=Path, default=RECORDS)
    ap.add_argument("--banks", type=Path, default=None, help="default: banks/ beside --records")
    ap.add_argument("--out", type=Path, default=FOLDER)
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args(argv)
    try:
        result = analyse(args.records, args.banks, args.seeds, args.steps)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None
    paths = write(result, args.out)
    print(summary_markdown(result))
    print("written: " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
