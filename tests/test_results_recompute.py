"""Every headline number in results/ and README.md, recomputed from the committed records.

Each check recomputes a number from the files committed beside a results page (per-seed
``eval_seed<N>.jsonl`` through ``experiments/learning_minihack.py``'s ``--records`` path, the
experiments' ``summary.json``, ``crl-bench report``'s ``report.json``, the measurement scripts'
JSON) and asserts that the page quotes exactly that text (whitespace and line breaks aside). A
page that changes a number, or a record that changes under a page, fails here. Numbers whose
records were never committed are not checked: their pages say so (``test_uncommitted_figures_are_marked``).
"""

from __future__ import annotations

import importlib.util
import json
from math import comb, sqrt
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
LM = RESULTS / "learning_minihack"
FIVE = LM / "adjacent_3x3_balanced_16groups" / "five_seeds"
DISTILL = LM / "adjacent_3x3_balanced_16groups" / "comp_rl_partial_official_distill"

SPEC = importlib.util.spec_from_file_location(
    "learning_minihack", REPO / "experiments" / "learning_minihack.py"
)
lm = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(lm)


# --- reading and formatting -------------------------------------------------------------------


def flat(text: str) -> str:
    return " ".join(text.split())


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def signed(x: float, digits: int = 3) -> str:
    """``+0.759`` / ``−0.360`` as the pages write them (a real minus sign)."""
    return f"{x:+.{digits}f}".replace("-", "−")


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}"


def sci(x: float) -> str:
    """``5.6e-8`` as the pages write it (no zero-padded exponent)."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def wilson_pct(r: dict[str, Any]) -> str:
    """``92.7% [88.1, 95.6] (177/191)`` from a ``{"k", "n", "share", "low", "high"}`` record."""
    return f"{pct(r['share'])}% [{pct(r['low'])}, {pct(r['high'])}] ({r['k']}/{r['n']})"


def share3(r: dict[str, Any]) -> str:
    """``42/256 = 0.164 | [0.124, 0.214]`` (the task family's table cells)."""
    return f"{r['k']}/{r['n']} = {r['share']:.3f} | [{r['low']:.3f}, {r['high']:.3f}]"


def mean_of(values: list[float]) -> float:
    return sum(values) / len(values)


def agent(path: Path, key: str = "grpo") -> dict[str, Any]:
    return load(path / "summary.json")["agents"][key]


def turns_pair(t: dict[str, Any], name: str) -> str:
    return f"{t[name + '_first']:.0%} → {t[name + '_last']:.0%}"


def row_of(path: str) -> dict[str, Any]:
    """The one row of a ``experiments/minihack_reading*.py`` JSON."""
    rows = load(LM / path)["rows"]
    assert len(rows) == 1, path
    return rows[0]


# --- the quoted texts, page by page -----------------------------------------------------------


def one_action() -> list[str]:
    five = lm.summarise_records(FIVE)
    first3 = lm.summarise_records(FIVE, seeds=[0, 1, 2])
    d, sign = five["delta_over_seeds"], five["sign_test"]
    top = agent(FIVE)["turns_first_last_step"]["top_action_last"]
    solved = sum(r["end"] >= 0.98 for r in five["seeds"].values())
    out = [
        f"| {seed} | "
        + " / ".join(
            (f"**{v:.3f}**" if step == 30 and v >= 0.98 else f"{v:.3f}")
            for step, v in sorted(r["curve"].items())
        )
        + f" | {signed(r['delta'])} | `{top[seed].split()[0]}` {top[seed].split()[1]}"
        for seed, r in five["seeds"].items()
    ]
    out += [
        f"end − start over the {d['n']} seeds: **{signed(d['mean'])}, 95% t interval over seeds "
        f"[{signed(d['low'])}, {signed(d['high'])}]** (df = {d['n'] - 1})",
        f"all {sign['positive']} seeds improve (sign test, two-sided p = {sign['p_two_sided']:.4f}",
        f"solving it (held-out success ≥ 0.98 at step 30) in {solved} of 5 seeds",
        "python experiments/learning_minihack.py --records "
        "results/learning_minihack/adjacent_3x3_balanced_16groups/five_seeds",
    ]
    t3 = first3["delta_over_seeds"]
    quoted3 = f"{signed(t3['mean'])} [{signed(t3['low'])}, {signed(t3['high'])}]"
    # the three-seed figure: re-derived from the five seeds' records and equal to the summary of
    # the three-seed call committed before seeds 3 and 4 ran
    old = agent(LM / "adjacent_3x3_balanced_16groups")["delta_over_seeds"]
    assert quoted3 == f"{signed(old['mean'])} [{signed(old['low'])}, {signed(old['high'])}]"
    out.append(f"first seeds had given {quoted3}")
    chance = load(FIVE / "summary.json")["chance"]
    lo, hi = chance["wilson95"]
    out.append(
        f"a uniform random walker {chance['success']:.3f} [{lo:.3f}, {hi:.3f}] ({chance['episodes']} levels)"
    )
    out.append(
        f"the best single move on these {chance['best_constant_move']['levels']} levels "
        f"{chance['best_constant_move']['success']:.3f}"
    )
    t = agent(FIVE)["turns_first_last_step"]
    out.append(
        f"valid answers {turns_pair(t, 'valid')}, moves toward the stairs {turns_pair(t, 'toward_goal')}, "
        f"copies of the prompt's example {turns_pair(t, 'copies_example')}, flat groups (every "
        f"episode the same reward, so no gradient) {turns_pair(t, 'flat_groups')}"
    )
    wall = agent(FIVE)["wall_min_per_run"]
    out.append(f"{min(wall):.0f}–{max(wall):.0f} min per seed")
    # transfer to Room-Random-5x5, one actor
    trained, base = (
        row_of("adjacent_3x3/seed0_step30_random5x5.json"),
        row_of("adjacent_3x3/base_random5x5.json"),
    )
    whole_t = row_of("adjacent_3x3/whole_episodes_random5x5_seed0_step30.json")
    whole_b = row_of("adjacent_3x3/whole_episodes_random5x5_base.json")
    assert whole_t["walker_success"] == whole_b["walker_success"]  # same levels and cap
    out += [
        f"| trained on Adjacent-3x3 (seed 0, step 30) | {wilson_pct(trained['toward_stairs'])} | "
        f"{wilson_pct(whole_t['success'])}, {whole_t['mean_actions']:.1f} actions |",
        f"| same configuration, no adapters (`--base`) | {wilson_pct(base['toward_stairs'])} | "
        f"{wilson_pct(whole_b['success'])}, {whole_b['mean_actions']:.1f} actions |",
        f"| uniform random walker, same levels and cap | {pct(load(LM / 'adjacent_3x3/base_random5x5.json')['chance_toward'])}% | "
        f"{wilson_pct(whole_t['walker_success'])} |",
        f"its first moves go toward the stairs {pct(trained['toward_stairs']['share'])}% of the time and it "
        f"wins {pct(whole_t['success']['share'])}% of whole episodes, against "
        f"{pct(whole_t['walker_success']['share'])}% for a random walker",
        "moves toward the stairs on "
        + wilson_pct(row_of("adjacent_3x3/seed0_step30_adjacent.json")["toward_stairs"]).rsplit(
            " (", 1
        )[0]
        + " of first turns",
    ]
    # variants: each folder's summary.json (per-seed records not committed)
    for folder, top_seed in (
        ("adjacent_3x3", 1),
        ("adjacent_3x3_balanced", None),
        ("adjacent_3x3_balanced_16groups", 1),
    ):
        v = agent(LM / folder)["delta_over_seeds"]
        out.append(f"| {signed(v['mean'])} [{signed(v['low'])}, {signed(v['high'])}] |")
        if top_seed is not None:
            move, share = agent(LM / folder)["turns_first_last_step"]["top_action_last"][
                top_seed
            ].split()
            out.append(
                f"seed {top_seed} collapses onto `{move}`"
                + (f" ({share} of its moves at step 30)" if folder == "adjacent_3x3" else "")
            )

    # the collapse derivation's values, by the formula the page prints
    def g(p: float) -> float:
        return sum(
            comb(8, k) * p**k * (1 - p) ** (8 - k) * 8 * sqrt(k / 8 * (1 - k / 8)) for k in range(9)
        )

    def update(top: float) -> list[float]:
        ps = [top] + [(1 - top) / 7] * 7
        return [
            g(pa) - pa * sum(g(pd) / (1 - pd) for d_, pd in enumerate(ps) if d_ != a)
            for a, pa in enumerate(ps)
        ]

    half, most = update(0.5), update(0.8)
    assert abs(update(1 / 8)[0]) < 1e-12
    out.append(
        f"(π = 0.5: {signed(half[0], 2)} on its logit, {signed(half[1], 2)} on each other; 0.8: {signed(most[0], 2)})"
    )
    return out


def room_random() -> list[str]:
    top, compact, first = (
        load(p / "summary.json") for p in (LM, LM / "compact_20_steps", LM / "first_example")
    )

    def counts(r: dict[str, Any]) -> str:
        return f"{r['start_pooled']['k']}/{r['start_pooled']['n']} → {r['end_pooled']['k']}/{r['end_pooled']['n']}"

    def minutes(r: dict[str, Any]) -> str:
        return ", ".join(f"{m:.0f}" for m in r["wall_min_per_run"])

    g, cw, cx = (
        top["agents"]["grpo"],
        top["agents"]["comp_rl without exp"],
        top["agents"]["comp_rl with exp"],
    )
    c20 = compact["agents"]["grpo"]
    out = [
        f"| `grpo`, 10 steps, seeds 0–2 | {counts(g)} | {turns_pair(g['turns_first_last_step'], 'valid')} | "
        f"{turns_pair(g['turns_first_last_step'], 'toward_goal')} | {minutes(g)} |",
        f"without / with experience | {counts(cw)} / {counts(cx)} | {turns_pair(cw['turns_first_last_step'], 'valid')} | "
        f"{turns_pair(cw['turns_first_last_step'], 'toward_goal')} | {minutes(cw)} |",
        f"| {counts(c20)} | {turns_pair(c20['turns_first_last_step'], 'valid')} | "
        f"{turns_pair(c20['turns_first_last_step'], 'toward_goal')} | {minutes(c20)} |",
        "| uniform random walker over the 8 moves | {:.3f} [{:.3f}, {:.3f}] ({} levels) |".format(
            top["chance"]["success"], *top["chance"]["wilson95"], top["chance"]["episodes"]
        ),
        f"(`learning_minihack/first_example/`: {counts(first['agents']['grpo'])})",
    ]
    probe = load(LM / "reading_probe/views_and_examples.json")["rows"]
    for r in sorted(
        probe, key=lambda r: (r["view"] != "full", ["first", "random", "none"].index(r["example"]))
    ):
        t = r["toward_stairs"]
        toward = f"{t['k']}/{t['n']}" + (f" ({pct(t['share'])}%)" if t["k"] else "")
        out.append(f"| {r['view']} | {r['example']} | {r['valid']['share']:.0%} | {toward} |")
    others = [
        r
        for f in ("no_admissible_list", "observation_last", "demonstration_in_system_prompt")
        for r in load(LM / f"reading_probe/{f}.json")["rows"]
    ]
    shares = [r["toward_stairs"]["share"] for r in others]
    assert all(r["toward_stairs"]["low"] <= 1 / 8 <= r["toward_stairs"]["high"] for r in others)
    out.append(
        f"give {pct(min(shares)).removesuffix('.0')}–{pct(max(shares))}% of first moves toward the stairs"
    )
    copies = [r["copies_example"]["share"] for r in probe + others if r["example"] != "none"]
    out.append(
        f"it copies the example answer ({min(copies):.0%}–{max(copies):.0%} of answers)".replace(
            "%–", "–"
        )
    )
    for name, label in (
        ("trained_grpo_step0_base", "untrained (`--base`)"),
        ("trained_grpo_step20_seed0", "`grpo` seed 0, step 20"),
        ("trained_grpo_step20_seed1", "`grpo` seed 1, step 20"),
    ):
        r = load(LM / f"reading_probe/{name}.json")["rows"][0]
        out.append(
            f"| {label} | {r['valid']['share']:.0%} | {wilson_pct(r['toward_stairs'])} | "
            f"`{r['top_action']['action']}` {r['top_action']['share']:.0%} |"
        )
    sft = {
        r["examples_seen"]: r for r in load(LM / "reading_probe/labelled_examples_sft.json")["rows"]
    }
    cells = []
    for n in (0, 64, 128, 192, 256, 448):
        t = sft[n]["toward_stairs"]
        s = f"{100 * t['share']:.1f}".removesuffix(".0") + "%"
        if n >= 192:
            s += f" [{pct(t['low'])}, {pct(t['high'])}]".replace(".0]", "]").replace(
                "[100.0", "[100"
            )
        cells.append(s)
    out.append("| first moves toward the stairs | " + " | ".join(cells) + " |")
    out.append(
        "| valid answers | "
        + " | ".join(f"{sft[n]['valid']['share']:.0%}" for n in (0, 64, 128, 192, 256, 448))
        + " |"
    )
    return out


def comp_rl() -> list[str]:
    grpo = lm.summarise_records(FIVE)["seeds"]
    out = []
    for folder, label, seeds, steps in (
        (
            LM / "adjacent_3x3_balanced_16groups/comp_rl_partial",
            "16 groups",
            (0, 2),
            (0, 5, 10, 15),
        ),
        (DISTILL, "16 groups, official distillation", (0, 1), (0, 5, 10)),
    ):
        without, with_ = (lm.summarise_records(folder, mode)["seeds"] for mode in (False, True))
        for s in seeds:
            cells = [
                " / ".join(f"{c[t]:.3f}" for t in steps)
                for c in (grpo[s]["curve"], without[s]["curve"], with_[s]["curve"])
            ]
            out.append(f"| {label}, seed {s} | " + " | ".join(cells) + " |")
    eight = LM / "adjacent_3x3_balanced/comp_rl_partial"
    for mode in (False, True):
        seeds = lm.summarise_records(eight, mode)["seeds"]
        out.append(
            ", ".join(f"{seeds[s]['curve'][0]:.3f} / {seeds[s]['curve'][5]:.3f}" for s in (0, 1, 2))
        )
    # the chunk-size check's 3/64 is the official-distillation run's seed 1 step-0 evaluation
    assert round(lm.summarise_records(DISTILL)["seeds"][1]["curve"][0] * 64) == 3
    assert round(grpo[1]["curve"][0] * 64) == 4
    times = agent(DISTILL, "comp_rl without exp")["time_min_per_run"]

    def m(name: str) -> str:
        return f"{mean_of([t[name] for t in times]):.1f}"

    out.append(
        f"whole run {m('run')} = evaluating {m('evaluation')} + playing {m('playing')} + updating "
        f"the actor {m('actor_update')}; of these, **{m('waiting')} waiting for the model"
    )
    out.append(
        f"distilling {m('distilling')}, merging {m('merging')}, training {m('extractor_training')}"
    )
    t = agent(DISTILL, "comp_rl without exp")["turns_first_last_step"]
    out.append(
        f"valid {turns_pair(t, 'valid')}, moves toward the stairs {turns_pair(t, 'toward_goal')}, "
        f"flat groups {turns_pair(t, 'flat_groups')}"
    )
    run = mean_of([t["run"] for t in times])
    out.append(f"30 steps of one seed take about {run * 30 / 12 / 60:.0f} h")
    return out


def cpu_scale() -> list[str]:
    report = load(RESULTS / "cpu/report.json")
    table = next(t for t in report["tables"] if t["name"] == "single_success")
    cols = ["ALFWorld", "MiniHack Room", "SWE", "WebShop"]
    assert table["columns"] == cols
    out = []
    for label, row in (
        ("Baseline (`grpo`)", "Baseline"),
        ("Comp. RL, with experience", "Comp. RL w/ exp"),
        ("Comp. RL, without experience", "Comp. RL w/o exp"),
    ):
        cells = {
            c["column"]: c for c in next(r for r in table["rows"] if r["label"] == row)["cells"]
        }
        assert all(cells[c]["n"] == 1 for c in cols)
        out.append(f"| {label} | " + " | ".join(f"{cells[c]['mean']:.2f}" for c in cols) + " |")
    runs = {(r["tasks"], r["agent"]): r for r in report["runs"]}
    for tasks, name in (
        ("minihack", "MiniHack"),
        ("webshop", "WebShop"),
        ("alfworld", "ALFWorld"),
        ("swe", "SWE"),
    ):
        g, c = runs[(tasks, "grpo")], runs[(tasks, "comp_rl")]
        assert (
            g["steps"] == c["steps"]
            and g["train_episodes"] == c["train_episodes"]
            and g["bank_size"] is None
        )
        out.append(
            f"| {name} `grpo` / `comp_rl` | {g['steps']} | {g['train_episodes']} | "
            f"{g['time_min']:.0f} / {c['time_min']:.0f} | — / {c['bank_size']} |"
        )
    total = sum(r["time_min"] for r in report["runs"])
    out.append(f"{total:.0f} run-minutes in all")
    mh = runs[("minihack", "grpo")]
    out.append(f"only MiniHack has a success (1 of {mh['eval_episodes']} episodes")
    return out


def fresh_clone() -> dict[str, str]:
    """The first command's timing on a fresh clone, as the pages write it, from
    ``quick_start/fresh_clone.txt`` (setup time, ``/usr/bin/time -v``, summed RSS)."""
    import re

    text = (RESULTS / "quick_start/fresh_clone.txt").read_text()

    def grab(pattern: str) -> str:
        found = re.search(pattern, text)
        assert found, pattern
        return found.group(1)
    minutes, seconds = grab(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\d+:\d+\.\d+)").split(":")
    user, system = float(grab(r"User time \(seconds\): ([\d.]+)")), float(grab(r"System time \(seconds\): ([\d.]+)"))
    main_gb = int(grab(r"Maximum resident set size \(kbytes\): (\d+)")) / 1e6  # as the summed RSS
    assert grab(r"Exit status: (\d+)") == "0" and grab(r"run rc=(\d+)") == "0"
    return {"wall": f"{int(minutes)} min {round(float(seconds)):d} s",
            "cpu": f"{round(user + system):d}", "user": f"{round(user):d}", "system": f"{round(system):d}",
            "main_gb": f"{main_gb:.2f}", "all_gb": grab(r"peak summed RSS of processes running .*?: ([\d.]+) GB"),
            "setup": grab(r"setup rc=0 (\d+) s")}


def quick_start() -> list[str]:
    fc = fresh_clone()
    cost = load(RESULTS / "quick_start/cost.json")
    split = cost["generation_split"]
    first = split[0]
    rate = first["rows"] * first["prompt_tokens"] / first["cpu_s_new1"]
    out = [
        f"{fc['setup']} s with a warm pip cache",
        f"{fc['wall']} wall, {fc['cpu']} CPU-seconds ({fc['user']} user + {fc['system']} system), "
        f"peak resident memory {fc['main_gb']} GB for the run's own process and {fc['all_gb']} GB "
        "for the run and its extractor worker together, exit 0",
        f"prefills about {round(rate, -1):.0f} prompt tokens per CPU-second",
        f"spends {first['cpu_s_new1'] / first['cpu_s_new16']:.0%} of its CPU time in the prefill",
    ]
    for r in split:
        out.append(
            f"| {r['rows']} rows × {r['prompt_tokens']} prompt tokens | {r['cpu_s_new1']:.1f} | "
            f"{r['cpu_s_new16']:.1f} | {r['cpu_s_new1'] / r['cpu_s_new16']:.0%} |"
        )
    tok = cost["prompt_tokens"]
    for fam, label in (
        ("minihack", "MiniHack Room Ultimate 5x5"),
        ("webshop", "WebShop"),
        ("alfworld", "ALFWorld"),
    ):
        a, b = tok[f"history=1/{fam}"], tok[f"history=0/{fam}"]
        out.append(
            f"| {label} | {a['mean']:.0f} (max {a['max']}) | {b['mean']:.0f} (max {b['max']}) |"
        )
    fewer = 1 - mean_of(
        [
            tok[f"history=0/{f}"]["mean"] / tok[f"history=1/{f}"]["mean"]
            for f in ("minihack", "webshop", "alfworld")
        ]
    )
    out.append(f"~{round(fewer, 1):.0%} fewer prompt tokens per turn")
    ev = cost["evaluation"]
    for key, label in (
        ("earlier", "earlier (history 1, ≤ 8 / 6 / 10 actions)"),
        ("now", "now (history 0, ≤ 6 / 5 / 6 actions)"),
    ):
        e = ev[key]
        out.append(
            f"| {label} | {e['episodes']} | {e['actions']} | {e['eval_cpu_s']:.0f} | {e['eval_cpu_s'] / e['episodes']:.1f} |"
        )
    assert cost["ratio_earlier_vs_now"] == pytest.approx(
        ev["earlier"]["eval_cpu_s"] / ev["now"]["eval_cpu_s"]
    )
    out.append(f"Earlier / now: **{cost['ratio_earlier_vs_now']:.2f}x** CPU seconds")
    return out


def speed_memory() -> list[str]:
    q = load(LM / "adjacent_3x3_balanced/shared_prefix_update_quiet.json")
    r, play, pre = q["results"], q["play_s"], q["prefilled_tokens"]
    out = [
        f"| actor update, every row in full | {r['full']['encoded_tokens']:,.0f} | {r['full']['seconds']:.1f} | |",
        f"| actor update, group prefix once | {r['shared']['encoded_tokens']:,.0f} | {r['shared']['seconds']:.1f} | "
        f"**{q['ratio_full_vs_shared']:.2f}x** |",
        f"| play, nothing shared | {pre['none']:,} prefilled | {play['none']:.1f} | |",
        f"| play, batch-wide prefix | {pre['batch']:,} prefilled | {play['batch']:.1f} | {play['none'] / play['batch']:.2f}x |",
        f"| play, each group's prefix once (kept) | {pre['group']:,} prefilled | {play['group']:.1f} | "
        f"**{play['none'] / play['group']:.2f}x** ({play['batch'] / play['group']:.2f}x over batch-wide) |",
        f"differ by at most {sci(q['max_grad_diff'])} (largest entry {sci(q['max_grad'])})",
    ]
    assert q["ratio_full_vs_shared"] == pytest.approx(r["full"]["seconds"] / r["shared"]["seconds"])
    loaded = load(LM / "adjacent_3x3_balanced/shared_prefix_update_loaded.json")
    lr, lp = loaded["results"], loaded["play_s"]
    out.append(
        f"gives update {lr['full']['seconds']:.1f} s vs {lr['shared']['seconds']:.1f} s "
        f"({lr['full']['seconds'] / lr['shared']['seconds']:.2f}x) and play "
        f"{lp['none']:.1f} / {lp['batch']:.1f} / {lp['group']:.1f} s"
    )
    mem = {
        m["max_batch_size"]: m
        for m in load(LM / "adjacent_3x3_balanced_16groups/generation_memory.json")["results"]
    }
    for size, label in ((64, "64 (default)"), (32, "32"), (16, "16")):
        m = mem[size]
        out.append(
            f"| {label} | {m['generation_gb']:.2f} | {m['peak_gb']:.2f} | {m['seconds']:.0f} |"
        )
    out.append(
        f"({mem[32]['seconds'] / mem[64]['seconds']:.2f}x / {mem[16]['seconds'] / mem[64]['seconds']:.2f}x the time"
    )
    return out


def experience_records() -> Any:
    """``experiments/experience_records.py``, the tool that wrote the comparisons' files."""
    spec = importlib.util.spec_from_file_location(
        "experience_records", REPO / "experiments" / "experience_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def follow_rows(tf: Path) -> list[str]:
    """The "does the actor act on an entry?" table: one row per condition of each
    ``follow*.json`` (``experiments/minihack_landmark.py --follow``)."""
    def frac(r: dict[str, Any] | None) -> str:
        return "—" if r is None else f"{r['k']}/{r['n']} = {r['share']:.2f}"

    out = []
    for path in sorted(tf.glob("follow*.json")):
        data = load(path)
        f = data["follow"]
        actor = ("untrained" + (", entry last" if "experience_last=true" in data["command"] else "")
                 if "checkpoint" not in data else
                 f"{Path(data['checkpoint']['run']).name.split('v0__')[-1].replace('__', ' seed ')}"
                 f", step {data['checkpoint']['step']}")
        for r in f["rows"]:
            out.append(f"| {actor} | {f['temperature']:g} | {r['example']} | {r['claim']} | "
                       f"{frac(r['success'])} | {frac(r['valid_move'])} | "
                       f"{frac(r['sent_example'])} | {frac(r['sent_claim'])} |")
        out.append(f"`{path.name}`: {f['wall_s']:.0f} s wall, {f['cpu_s']:.0f} s CPU")
    assert out, "no follow*.json in the task family's folder"
    # "sends the entry's move no more often than any other move ... (about one valid move in
    # eight)": 1/8 is the level's chance by construction (8 moves, one solves it; the floors
    # table above); "66-72% of its valid answers"; "75% without an entry and 89-91% with one"
    sampled, greedy = (load(tf / f"{n}.json")["follow"]["rows"] for n in ("follow", "follow_greedy"))
    for r in sampled + greedy:
        if r["claim"] != "none" and r["example"] == "random":
            assert 0.10 <= r["sent_claim"]["k"] / r["valid_move"]["k"] <= 0.17
    ex = [r["sent_example"]["k"] / r["valid_move"]["k"] for r in sampled if r["example"] == "random"]
    out.append(f"in {100 * min(ex):.0f}–{max(ex):.0%} of its valid answers")
    g = {r["claim"]: r["sent_example"]["share"] for r in greedy}
    out.append(f"in {g['none']:.0%} without an entry and\n{100 * min(g['right'], g['wrong']):.0f}–"
               f"{max(g['right'], g['wrong']):.0%} with one")
    trained = load(tf / "follow_greedy_comp_rl_seed2_step20.json")["follow"]["rows"]
    shares = [r["sent_example"]["share"] for r in trained]
    out.append(f"copies the example less ({100 * min(shares):.0f}–{max(shares):.0%} greedy)")
    for r in trained:  # "still sends the entry's move no more often than any other"
        assert r["claim"] == "none" or r["sent_claim"]["k"] / r["valid_move"]["k"] <= 0.17
    last = {r["claim"]: r for r in load(tf / "follow_greedy_experience_last.json")["follow"]["rows"]}
    right, wrong = last["right"]["sent_claim"], last["wrong"]["sent_claim"]
    out.append(f"sends its move {right['k']}/{right['n']}\ntimes, a wrong one's "
               f"{wrong['k']}/{wrong['n']}")
    none = [r for r in sampled if r["example"] == "none" and r["claim"] == "none"][0]
    out.append(f"writes no valid move at all ({none['valid_move']['k']} of {none['valid_move']['n']})")
    return out


def keyed_result(er: Any) -> list[str]:
    """The second comparison's result on the page, recomputed from its committed records (the
    verdict, per-agent table, primary difference and tests, collapsed seeds, what the actors
    were shown and did, the banks at the end, the wall times)."""
    folder = RESULTS / "experience_helps/keyed_merge"
    result = er.analyse(folder / "records")
    assert not result["missing"]
    table = er.summary_markdown(result).split("## Per agent")[1].split("## Comparisons")[0]
    out = [line for line in table.splitlines() if line.startswith("| ") and "[" in line]
    assert len(out) == 5
    c, *secondary = result["comparisons"]
    assert (c["metric"], c["a"], c["b"]) == er.PRIMARY
    assert all(x["low"] <= 0 <= x["high"] for x in secondary)  # "... intervals all include 0"
    interval = f"{signed(c['diff'])} [{signed(c['low'])}, {signed(c['high'])}]"
    out += [
        f"AUC difference {interval}, one-sided permutation p {c['perm_p_greater']:.2f}",
        f"**Verdict (the plan's rule): {result['verdict']}.**",
        interval,
        f"permutation p {c['perm_p_greater']:.4f} one-sided, {c['perm_p_two_sided']:.4f} "
        f"two-sided ({c['perm_assignments']} assignments)",
        f"higher in {c['sign_test_positive']} of {c['sign_test_n']} seeds (sign test p "
        f"{c['sign_test_p_greater']:.4f} one-sided)",
        "the secondary comparisons' intervals all include 0",
        "collapsed by the plan's rule: " + ", ".join(
            f"`{r['series']}` seed {r['seed']}" for r in result["runs"] if r["collapsed"]),
    ]
    for name in ("comp_rl", "exp_only"):
        h = {k: sum(x[k] for x in result["hints"] if x["agent"] == name) for k in er.HINT_KEYS}
        out.append(f"`{name}`: {h['success_hint_rule']} of the {h['success_hint']} success "
                   f"claims shown")
        out.append(f"sent the claimed move {h['followed']} times ({h['followed_solved']} solved), "
                   f"{h['followed']}/{h['success_hint']} = {h['followed'] / h['success_hint']:.2f} of "
                   f"the success claims it was shown")
        assert h["followed"] <= 0.2 * h["success_hint"], name  # "about one in eight, or less"
        assert h["failure_hint"] > 2 * h["success_hint"], name  # "most entries shown were failure claims"
    banks = load(folder / "banks/bank_content.json")
    for name in ("comp_rl", "exp_only"):
        rows = [v for k, v in banks.items() if k.startswith(name + "__")]
        good = [v["keys_with_a_success_naming_the_rule"] for v in rows]
        keys = [v["keys"] for v in rows]
        out.append(f"`{name}` {min(good)}–{max(good)} of {min(keys)}–{max(keys)}")
    kinds = {k: v["kinds_with_a_success_naming_the_rule"] for k, v in banks.items()
             if "kinds_with_a_success_naming_the_rule" in v}
    out.append(", ".join(f"`{run.split('__seed')[0]}` seed {run.split('__seed')[1]}: {n}"
                         for run, n in sorted(kinds.items())) + " of the 8 kinds")
    walls: dict[str, list[float]] = {}
    for r in result["runs"]:
        if "without" not in r["series"]:
            walls.setdefault(r["series"].split()[0], []).append(r["wall_min"])
    out.append(", ".join(f"`{a}` {min(w):.1f}–{max(w):.1f} min" for a, w in walls.items()))
    return out


def experience_helps() -> list[str]:
    er = experience_records()
    tf = RESULTS / "experience_helps/task_family"
    b = load(tf / "baselines_retrieval_extractor.json")
    base = b["baselines"]
    sizes = load(RESULTS / "experience_helps/banks/bank_size_by_step.json")
    comp, exp = sizes["comp_rl__seed0"], sizes["exp_only__seed0"]
    for run in (comp, exp):  # "every fifth step the merge rewrites the whole bank as one entry"
        assert [s for s, m in run.items() if m["bank/size"] == 1] == ["6", "11", "16", "20"]
        assert [run[s]["bank/merges"] for s in ("5", "6", "11", "16", "20")] == [0, 1, 2, 3, 4]
    hints = {(h["agent"], h["seed"]): h for h in load(RESULTS / "experience_helps/analysis.json")["hints"]}
    c0, e0 = hints[("comp_rl", 0)], hints[("exp_only", 0)]
    assert c0["failure_hint"] > 10 * c0["success_hint"]  # "almost only failure claims"
    hint_quotes = [
        f"a success claim reached `comp_rl` seed 0's actor {c0['success_hint']} times in "
        f"{c0['with_exp']} episodes, and named the level's stairs only {c0['success_hint_rule']} times",
        f"`exp_only` seed 0 sent the claimed move {e0['followed']} time in {e0['success_hint']}",
    ]
    # the second comparison: "7 of its 15 runs are recorded", "about one entry per episode
    # start", "every action-template claim in it is right", "a right success claim reaches the
    # actor far more often than in the first comparison"
    keyed = load(RESULTS / "experience_helps/keyed_merge/analysis.json")
    banks = load(RESULTS / "experience_helps/keyed_merge/banks/bank_content.json")
    per_start = [bk["entries"] / bk["keys"] for bk in banks.values()]
    for name, bk in banks.items():
        assert (bk["success"], bk["failure"], bk["other_text"]) == (
            bk["success_naming_the_rule"], bk["failure_naming_another_move"], 0), name
    first = load(RESULTS / "experience_helps/analysis.json")

    def right_success(result: dict) -> int:
        return sum(h["success_hint_rule"] for h in result["hints"] if h["agent"] == "comp_rl")

    assert right_success(keyed) > 3 * right_success(first)
    hint_quotes_keyed = [f"All {keyed['recorded']} of its "
                         f"{len(keyed['agents']) * len(keyed['seeds'])} runs are recorded"]
    hint_quotes_keyed += keyed_result(er)
    hint_quotes_keyed.append(f"({min(per_start):.2f}–{max(per_start):.2f} entries per start over "
                             f"the {len(banks)} banks)")
    # "a collapse onto the example": the runs of the last five steps' example shares quoted
    last5 = {(e["agent"], e["seed"]): e["last_steps"] for e in keyed["examples"]}
    g3, c3 = last5[("grpo", 3)], last5[("comp_rl", 3)]
    assert min(g3["sent_example"] / g3["moved"], c3["sent_example"] / c3["moved"]) >= 0.95
    hint_quotes_keyed.append(f"`grpo` seed\n3 sent the example's move in {g3['sent_example']}/"
                             f"{g3['moved']} and `comp_rl` seed 3 in {c3['sent_example']}/{c3['moved']}")
    # the bank sample on the page is `bank show`'s text, and its claims are right for its levels
    from crl_bench.envs.minihack.landmark import landmark_layout

    page = (RESULTS / "experience_helps/README.md").read_text()
    shown = (RESULTS / "experience_helps/keyed_merge/banks/comp_rl__seed4_end.txt").read_text()
    for block, level in (("#3 ", 5_000_017), ("#54 ", 5_000_016)):
        entry = next(b for b in shown.split("\n\n") if b.startswith(block)).strip("\n")
        assert entry in page and f"tasks {level};" in entry, block
        assert er.text_claim(entry) == ("success", landmark_layout(level)[2]), block
    # "some failure claims name no move at all": counted over what `bank show` lists
    ends = sorted((RESULTS / "experience_helps/keyed_merge/banks").glob("*_end.txt"))
    listed = [er.entry_claim(m.group(0)) for f in ends for m in er._claim_re().finditer(f.read_text())]
    no_move = sum(c is not None and c[0] == "failure" and c[1] not in er.MOVES for c in listed)
    hint_quotes_keyed.append(f"({no_move} of the {len(listed)} entries `bank show` lists for the "
                             f"{len(ends)} banks")
    walls: dict[str, list[float]] = {}
    for path in sorted((RESULTS / "experience_helps/records").glob("*.jsonl")):
        head = json.loads(path.read_text().splitlines()[0])["run"]
        walls.setdefault(head["agent"], []).append(head["time_min"]["run"])
        if head["agent"] == "comp_rl" and head["run_seed"] == 0:
            t = head["time_min"]
            parts = f"{t['distilling']}, {t['merging']} and {t['extractor_training']} min"
    walls = {a: " and ".join(f"{w:.1f}" for w in sorted(v)) for a, v in walls.items()}
    out = hint_quotes + hint_quotes_keyed + [
        f"`grpo` {walls['grpo']} min, `comp_rl` {walls['comp_rl']} min, `exp_only` "
        f"{walls['exp_only']} min",
        f"(`comp_rl` seed 0: {parts})",
        f"`comp_rl` seed 0 went from {comp['5']['bank/size']:.0f} entries to {comp['6']['bank/size']:.0f}",
        f"`exp_only` seed 0 from {exp['5']['bank/size']:.0f} to {exp['6']['bank/size']:.0f}",
        f"| uniform random move (chance) | {share3(base['chance'])} |",
        f"| best constant move (each of the 8 scores the same) | {share3(base['best_constant'])} |",
        f"| move toward the landmark | {share3(base['policies']['toward the landmark'])} |",
        f"| the rule (ceiling) | {share3(base['ceiling'])} |",
    ]
    consts = {v["k"] for k, v in base["policies"].items() if k.startswith("always ")}
    assert consts == {base["best_constant"]["k"]}  # "each of the 8 scores the same"
    for key, r in (
        ("retrieval", b["retrieval"]),
        ("4 keys", load(tf / "retrieval_4_keys_per_kind.json")["retrieval"]),
    ):
        t = r["top1_same_landmark"]
        out.append(f"**{t['k']}/{t['n']} = {t['share']:.3f} [{t['low']:.3f}, {t['high']:.3f}]")
    e = b["extractor"]
    w, u = e["well_formed"], e["usable_of_solved"]
    out.append(f"| {w['k']}/{w['n']} = {w['share']:.2f} | [{w['low']:.2f}, {w['high']:.2f}] |")
    out.append(f"| {u['k']}/{u['n']} | [{u['low']:.2f}, {u['high']:.2f}] |")
    out.append(f"played {e['episodes']} training levels")
    for name in ("extractor_action", "extractor_action_temperature_0.3"):
        a = load(tf / f"{name}.json")["extractor"]
        for key in ("well_formed", "well_formed_of_acted"):
            w = a[key]
            out.append(f"| {w['k']}/{w['n']} = {w['share']:.2f} | [{w['low']:.2f}, {w['high']:.2f}] |")
        u = a["usable_of_solved"]
        out.append(f"| {u['k']}/{u['n']} | [{u['low']:.2f}, {u['high']:.2f}] |")
        out.append(f"of the {a['well_formed_of_acted']['n']} episodes that sent a move")
        out.append(f"{a['wall_s']:.0f} s wall, {a['cpu_s']:.0f} s CPU")
    out += follow_rows(tf)
    out.append(f"the other {a['episodes'] - a['well_formed_of_acted']['n']} of the {a['episodes']} "
               f"episodes sent no valid move")
    out.append(f"{e['solved']} solved)")
    for name in ("probe_64x2", "probe_256x1"):
        rows = load(tf / f"{name}.json")["probe"]["rows"]
        for r in rows if name == "probe_64x2" else rows[1:]:
            s = r["success"]
            out.append(
                f"{s['k']}/{s['n']} = {s['share']:.3f} | [{s['low']:.3f}, {s['high']:.3f}] | "
                f"{r['valid']['share']:.0%} | "
                + ", ".join(f"{move} {n}" for move, n in r["top_actions"][:2])
                + " |"
            )
    p64, p256 = (load(tf / f"{n}.json")["probe"] for n in ("probe_64x2", "probe_256x1"))
    out.append(
        f"Training loss (mean over the steps) {p64['rows'][-1]['train_loss']:.3f} and "
        f"{p256['rows'][-1]['train_loss']:.3f}. {p64['wall_s']:.0f} s wall, {p64['cpu_s']:.0f} s CPU; "
        f"{p256['wall_s']:.0f} s wall, {p256['cpu_s']:.0f} s CPU."
    )
    out.append(
        f"{base['wall_s']:.1f} s wall, {base['cpu_s']:.1f} s CPU on the shared 2-core machine"
    )
    r1, r4 = b["retrieval"], load(tf / "retrieval_4_keys_per_kind.json")["retrieval"]
    out.append(f"{r1['wall_s']:.0f} s wall, {r1['cpu_s']:.0f} s CPU")
    out.append(f"({r4['wall_s']:.0f} s wall, {r4['cpu_s']:.0f} s CPU)")
    out.append(f"{e['wall_s']:.0f} s wall, {e['cpu_s']:.0f} s CPU")
    return out


def reader_result() -> list[str]:
    """The reader comparison's answer and its table, recomputed from analysis.json (itself the
    analysis of the committed records: tests/test_reader_analysis.py, and recomputed without
    that code by tests/test_reader_recompute.py): the primary and the internalisation
    comparison, the per-series figures, and what the with-experience evaluations were shown."""
    a = load(RESULTS / "experience_helps/reader/analysis.json")
    by = {(c["metric"], c["a"], c["b"]): c for c in a["comparisons"]}
    c, w = by["auc", "comp_rl with exp", "grpo"], by["auc", "comp_rl without exp", "grpo"]
    assert a["verdict"] == "hit"  # "a **hit**"
    auc = {r["series"]: [] for r in a["runs"]}
    for r in a["runs"]:
        auc[r["series"]].append(r["auc"])
    # p = 1/252: "every comp_rl seed above every grpo seed"
    assert min(auc["comp_rl with exp"]) > max(auc["grpo"]) and c["perm_p_greater"] == 1 / 252
    claimed = {k["claim"]: k["outcome"] for k in a["claims"]}
    assert claimed["Comp. RL without experience above the baseline"] == "miss"
    assert claimed["Static online experience below the baseline"] == "reverse"  # "**reversed**"
    sc, sg = by["auc", "static_exp with exp", "comp_rl with exp"], by["auc", "static_exp with exp", "grpo"]
    assert sc["perm_p_greater"] > 0.05 and sc["perm_p_less"] > 0.05  # "the two are level"
    m = a["means"]

    def cell(name: str, metric: str) -> str:
        x = m[name][metric]
        return f"{x['mean']:.3f} [{x['low']:.3f}, {x['high']:.3f}]"

    shown = [h for h in a["eval_claims"] if h["series"] == "comp_rl with exp"]
    solved = sum(round(v * 128) for curve in a["curves"]["comp_rl with exp"].values()
                 for step, v in curve.items() if step != "0")
    gap = a["layout_gap"]["comp_rl with exp"]
    layouts = [r for r in a["layouts"] if r["series"] == "comp_rl with exp"]
    evals = len(a["curves"]["comp_rl with exp"]["0"]) - 1  # evaluations after step 0
    # every run: the same numbers of trained and new layouts, 128 in all
    (trained,) = {r["trained"]["episodes"] // evals for r in a["layouts"]}
    (never,) = {r["never"]["episodes"] // evals for r in a["layouts"]}
    assert trained + never == 128
    kinds = [b["kinds_with_a_success_naming_the_rule"] for run, b in a["bank_content"].items()
             if run.startswith("comp_rl__")]
    assert len(kinds) == 5
    rows = []
    for name, label in (("grpo", "`grpo`"), ("comp_rl with exp", "`comp_rl` with experience"),
                        ("comp_rl without exp", "`comp_rl` without experience"),
                        ("static_exp with exp", "`static_exp` with experience"),
                        ("static_exp without exp", "`static_exp` without experience")):
        assert m[name]["n"] == 5 and m[name]["start"]["high"] == 0.125
        rows.append(f"| {label} | {m[name]['start']['mean']:.3f} | {cell(name, 'end')} | "
                    f"{cell(name, 'auc')} |")
    return rows + [
        f"AUC difference {signed(c['diff'])} [{signed(c['low'])}, "
        f"{signed(c['high'])}], one-sided permutation p {c['perm_p_greater']:.4f}",
        f"({signed(w['diff'])} [{signed(w['low'])}, {signed(w['high'])}], p "
        f"{w['perm_p_greater']:.4f})",
        f"of `comp_rl`'s {solved:,} held-out successes after step 0, "
        f"{sum(h['sent_success_solved'] for h in shown):,} were",
        f"{sum(h['success_rule'] for h in shown):,} of the {sum(h['success'] for h in shown):,} "
        "success claims shown",
        f"{sum(h['sent_success_solved'] for h in shown):,} of the {solved:,} with-experience "
        "successes after step 0",
        f"({m['grpo']['start']['mean']:.3f} → {m['grpo']['end']['mean']:.3f})",
        f"(`static_exp` − `comp_rl` {signed(sc['diff'])} [{signed(sc['low'])}, {signed(sc['high'])}], "
        f"one-sided p {sc['perm_p_greater']:.4f})",
        f"(`static_exp` − `grpo` {signed(sg['diff'])} [{signed(sg['low'])}, {signed(sg['high'])}], "
        f"two-sided p {sg['perm_p_two_sided']:.4f})",
        "(new − trained layouts {} [{}, {}] over the seeds), and {:,} of the {:,} success "
        "claims".format(*(signed(gap[k]) for k in ("mean", "low", "high")),
                        sum(r["never"]["success_claims_right"] for r in layouts),
                        sum(r["never"]["success_claims"] for r in layouts)),
        f"and a run's {trained} training levels",
        f"on the other {never}, `comp_rl`",
        "hold one for {} to {} of the 8 kinds".format(min(kinds), max(kinds)),
    ]


def reader_headline(plain: bool) -> list[str]:
    """The reader comparison's primary (and, for the index, its internalisation comparison), as
    README.md (``plain``) and results/README.md quote them."""
    a = load(RESULTS / "experience_helps/reader/analysis.json")
    by = {(c["metric"], c["a"], c["b"]): c for c in a["comparisons"]}
    c, w = by["auc", "comp_rl with exp", "grpo"], by["auc", "comp_rl without exp", "grpo"]
    assert a["verdict"] == "hit" and (w["perm_p_greater"] > 0.05 or w["low"] <= 0)  # "...not"
    primary = f"AUC {signed(c['diff'])} [{signed(c['low'])}, {signed(c['high'])}]"
    if plain:
        return [f"({primary}, p {c['perm_p_greater']:.4f} over {c['n_a']} + {c['n_b']} seeds), "
                "without it not"]
    sg = by["auc", "static_exp with exp", "grpo"]
    assert [k["outcome"] for k in a["claims"]][2] == "reverse"  # "the paper's third claim reversed"
    return [f"{primary}, one-sided permutation p {c['perm_p_greater']:.4f} (the plan's "
            "primary, a hit)",
            f"({signed(w['diff'])} [{signed(w['low'])}, {signed(w['high'])}])",
            f"(`static_exp` − `grpo` {signed(sg['diff'])} [{signed(sg['low'])}, "
            f"{signed(sg['high'])}])"]


def index() -> list[str]:
    five = lm.summarise_records(FIVE)
    d = five["delta_over_seeds"]
    solved = sum(r["end"] >= 0.98 for r in five["seeds"].values())
    whole = row_of("adjacent_3x3/whole_episodes_random5x5_seed0_step30.json")
    sft = {
        r["examples_seen"]: r for r in load(LM / "reading_probe/labelled_examples_sft.json")["rows"]
    }
    times = agent(DISTILL, "comp_rl without exp")["time_min_per_run"]
    waiting = mean_of([t["waiting"] for t in times]) / mean_of([t["run"] for t in times])
    base = load(RESULTS / "experience_helps/task_family/baselines_retrieval_extractor.json")[
        "baselines"
    ]
    q = load(LM / "adjacent_3x3_balanced/shared_prefix_update_quiet.json")
    mem = {
        m["max_batch_size"]: m
        for m in load(LM / "adjacent_3x3_balanced_16groups/generation_memory.json")["results"]
    }
    cost = load(RESULTS / "quick_start/cost.json")["generation_split"][0]
    report = load(RESULTS / "cpu/report.json")
    mh = next(r for r in report["runs"] if r["tasks"] == "minihack" and r["agent"] == "grpo")
    success = {
        c["column"]: c["mean"]
        for t in report["tables"]
        if t["name"] == "single_success"
        for r in t["rows"]
        for c in r["cells"]
        if c["mean"] > 0
    }
    assert set(success) == {"MiniHack Room"} and success["MiniHack Room"] * mh["eval_episodes"] == 1
    example_shares = [r["sent_example"]["k"] / r["valid_move"]["k"]
                      for n in ("follow", "follow_greedy")
                      for r in load(RESULTS / f"experience_helps/task_family/{n}.json")["follow"]["rows"]
                      if r["example"] == "random"]
    keyed = load(RESULTS / "experience_helps/keyed_merge/analysis.json")
    c = keyed["comparisons"][0]
    reader = {r["claim"]: r for r in
              load(RESULTS / "experience_helps/reader/follow_reader_v4_greedy.json")["follow"]["rows"]}
    take, avoid, none = reader["take_random"], reader["avoid_random"], reader["none"]
    assert keyed["verdict"] == "miss" and keyed["recorded"] == 15  # "a miss"
    return reader_headline(plain=False) + [
        f"AUC `comp_rl` − `grpo` {signed(c['diff'])} [{signed(c['low'])}, {signed(c['high'])}], "
        f"permutation p {c['perm_p_greater']:.2f} ({c['n_a']} + {c['n_b']} seeds)",
        f"{solved} of 5 seeds solve it in 30 steps, end − start {signed(d['mean'])} [{signed(d['low'])}, "
        f"{signed(d['high'])}], 95% t interval over 5 seeds",
        f"({pct(whole['success']['share'])}% of episodes vs a walker's {pct(whole['walker_success']['share'])}%)",
        f"({sft[256]['toward_stairs']['share']:.0%} after 256 examples)",
        f"{waiting:.0%} of a run's time waiting for the shared model",
        f"chance {base['chance']['share']:.3f}, best constant move {base['best_constant']['share']:.3f}, "
        f"the rule {base['ceiling']['share']:.1f}",
        f"Update {q['ratio_full_vs_shared']:.2f}x and play {q['play_s']['none'] / q['play_s']['group']:.2f}x faster",
        f"16-row generation chunks hold {mem[16]['generation_gb']:.2f} GB instead of {mem[64]['generation_gb']:.2f} GB",
        f"~{round(cost['rows'] * cost['prompt_tokens'] / cost['cpu_s_new1'], -1):.0f} per CPU-second",
        "the first command took {wall} ({cpu} CPU-s, {all_gb} GB) on a fresh clone".format(**fresh_clone()),
        f"only MiniHack sees a success (1/{mh['eval_episodes']}, both agents)",
        f"takes a named random move {take['sent_claim']['k']}/{take['sent_claim']['n']}, sends a "
        f"move it is told to avoid {avoid['sent_claim']['k']}/{avoid['sent_claim']['n']}, and "
        f"without an entry plays one move, success {none['success']['k']}/{none['success']['n']}",
        f"the answer format's example move in {100 * min(example_shares):.0f}–"
        f"{max(example_shares):.0%} of its valid answers",
    ]


PAGES: dict[str, Callable[[], list[str]]] = {
    "results/minihack_one_action.md": one_action,
    "results/minihack_room_random.md": room_random,
    "results/comp_rl_one_action.md": comp_rl,
    "results/cpu_scale.md": cpu_scale,
    "results/quick_start.md": quick_start,
    "results/speed_memory.md": speed_memory,
    "results/experience_helps/README.md": experience_helps,
    "results/README.md": index,
    "results/experience_helps/reader/README.md": reader_result,
    "README.md": lambda: [
        "setup {setup} s (warm pip cache), the run **{wall} wall, {cpu} CPU-seconds, {all_gb} GB "
        "peak memory**".format(**fresh_clone()),
        "a {} at CPU scale".format(load(RESULTS / "experience_helps/keyed_merge/analysis.json")["verdict"]),
        *reader_headline(plain=True)],
}


def missing(page_text: str, quoted: list[str]) -> list[str]:
    """The recomputed texts ``page_text`` does not say."""
    text = flat(page_text)
    return [q for q in quoted if flat(q) not in text]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_quotes_what_the_committed_records_give(page: str) -> None:
    absent = missing((REPO / page).read_text(), PAGES[page]())
    assert not absent, (
        f"{page} does not say what its committed records give; recomputed and "
        "not found:\n" + "\n".join(absent)
    )


def test_a_changed_number_fails(tmp_path: Path) -> None:
    """The check can fail: the five-seed headline with one digit changed is reported missing."""
    text = (REPO / "results/minihack_one_action.md").read_text()
    assert "[+0.360, +1.159]" in text
    assert missing(text.replace("[+0.360, +1.159]", "[+0.360, +1.160]"), one_action())


# figures whose records were never committed: the page must say so where it quotes them
UNCOMMITTED = {
    "README.md": [
        "1,564 s, `.ci/run`'s total: a figure not recorded in the repository",
    ],
    "results/quick_start.md": [
        "8 min 19 s (808 CPU-s, 7.2 GB; output not committed)",
        "39 min wall and 2,580 CPU-seconds",
        "records were not committed",
    ],
    "results/minihack_room_random.md": [
        "trained on 9 of its own 16 evaluation levels",
        "records were not committed",
    ],
    "results/minihack_one_action.md": ["per-seed records were not committed"],
    "results/comp_rl_one_action.md": ["3/64 at 16", "run records were not committed"],
    "results/speed_memory.md": ["1.8x fewer tokens", "records were not committed"],
    "results/experience_helps/README.md": [
        "trials whose output was not committed",
    ],
}


@pytest.mark.parametrize("page", sorted(UNCOMMITTED))
def test_uncommitted_figures_are_marked(page: str) -> None:
    text = flat((REPO / page).read_text())
    absent = [q for q in UNCOMMITTED[page] if flat(q) not in text]
    assert not absent, f"{page}: {absent}"


FORM = ("**Question.**", "## Result", "## What this shows, and what it does not")
"""One page per experiment: the question, the command, the result (table), what it shows and not."""


@pytest.mark.parametrize(
    "page",
    [
        "results/minihack_one_action.md",
        "results/minihack_room_random.md",
        "results/comp_rl_one_action.md",
        "results/cpu_scale.md",
        "results/experience_helps/README.md",
    ],
)
def test_experiment_pages_have_the_form(page: str) -> None:
    text = (REPO / page).read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert any("ommand" in h for h in headings), headings
    assert all(part in text for part in FORM), [p for p in FORM if p not in text]
    assert "![" in text  # a plot


WORDS = ("session", "helper", "issue", "stopped")
"""The pages speak of the experiments, not of how the work on them was organised."""


@pytest.mark.parametrize(
    "page",
    sorted(
        str(p.relative_to(REPO))
        for p in RESULTS.rglob("*.md")
        if "experience_helps/records" not in p.as_posix()
    ),
)
def test_pages_speak_of_the_experiments_only(page: str) -> None:
    text = (REPO / page).read_text().lower()
    assert not [w for w in WORDS if w in text], [w for w in WORDS if w in text]


# --- the re-derivation path itself, on records written here -----------------------------------


def test_records_path_recomputes_table_interval_and_sign_test(tmp_path: Path) -> None:
    curves = {0: [0.1, 0.5], 1: [0.2, 0.3], 2: [0.0, 0.6]}
    for seed, (start, end) in curves.items():
        lines = [
            {"step": step, "with_experience": False, "n": 10, "success_rate": v}
            for step, v in ((0, start), (10, end))
        ]
        lines.append({"step": 0, "with_experience": True, "n": 10, "success_rate": 0.9})
        (tmp_path / f"eval_seed{seed}.jsonl").write_text(
            "\n".join(json.dumps(x) for x in lines) + "\n"
        )
    s = lm.summarise_records(tmp_path)
    deltas = [0.4, 0.1, 0.6]
    assert [r["delta"] for r in s["seeds"].values()] == pytest.approx(deltas)
    mean = sum(deltas) / 3
    sd = sqrt(sum((x - mean) ** 2 for x in deltas) / 2)
    # Student-t, df = 2: t(0.975, 2) = 4.302653
    assert s["delta_over_seeds"]["high"] - mean == pytest.approx(4.302653 * sd / sqrt(3), rel=1e-6)
    assert s["sign_test"] == {"positive": 3, "negative": 0, "p_two_sided": 0.25}
    assert lm.summarise_records(tmp_path, seeds=[0, 2])["delta_over_seeds"]["n"] == 2
    assert lm.summarise_records(tmp_path, with_experience=True)["seeds"][0]["curve"] == {0: 0.9}
    table = lm.records_markdown(s)
    assert "| 1 | 0.200 / 0.300 | +0.100 |" in table and "two-sided p = 0.2500" in table
    with pytest.raises(SystemExit, match="eval_seed"):
        lm.summarise_records(tmp_path / "nothing")


def test_sign_test_exact_values() -> None:
    assert lm.sign_test([1, 1, 1, 1, 1])["p_two_sided"] == pytest.approx(0.0625)  # 2 / 2^5
    assert lm.sign_test([1, -1, 1, 1, 1])["p_two_sided"] == pytest.approx(0.375)  # 2 * 6 / 32
    assert lm.sign_test([0.0, 0.0])["p_two_sided"] == 1.0


def test_markdown_headline_has_no_pooled_interval(tmp_path: Path) -> None:
    """summary.md re-rendered from a committed summary.json: intervals over seeds only; pooled
    counts bare; a zero-width interval (every seed equal) is not printed as an interval."""
    (tmp_path / "summary.json").write_text((LM / "summary.json").read_text())
    assert lm.main(["--markdown-only", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "paired episodes" not in md and "Wilson" not in md.split("Target:")[0]
    assert "| 4/48 | 7/48 |" in md
    assert "0.062 (n=3, every seed equal: no interval)" in md and "[0.062, 0.062]" not in md
    committed = [
        p
        for p in LM.rglob("summary.md")
        if "Wilson 95%]" in p.read_text() or "paired episodes" in p.read_text()
    ]
    assert not committed, committed


@pytest.mark.parametrize(
    "folder", sorted(str(p.parent.relative_to(REPO)) for p in LM.rglob("summary.json"))
)
def test_committed_summary_md_is_its_summary_json_rendered(folder: str, tmp_path: Path) -> None:
    """Each committed ``summary.md`` is what ``--markdown-only`` renders from the ``summary.json``
    beside it, so its table says nothing the JSON does not."""
    (tmp_path / "summary.json").write_text((REPO / folder / "summary.json").read_text())
    assert lm.main(["--markdown-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "summary.md").read_text() == (REPO / folder / "summary.md").read_text()


@pytest.mark.parametrize(
    ("folder", "key", "with_experience"),
    [
        (FIVE, "grpo", False),
        (DISTILL, "comp_rl without exp", False),
        (DISTILL, "comp_rl with exp", True),
    ],
)
def test_summary_json_agrees_with_the_committed_records(
    folder: Path, key: str, with_experience: bool
) -> None:
    """Where both are committed, the per-seed records and the run summary give the same start,
    end and end - start (mean and interval over seeds)."""
    records = lm.summarise_records(folder, with_experience)
    summary = agent(folder, key)
    for name in ("start", "end", "delta_over_seeds"):
        for part in ("mean", "low", "high", "n"):
            assert records[name][part] == pytest.approx(summary[name][part], abs=1e-9), (name, part)
    assert [list(r["first_last_step"]) for r in records["seeds"].values()] == [
        list(x) for x in summary["first_last_step"]
    ]


# --- the experience comparison: its committed analysis is what its committed records give --------

EH = RESULTS / "experience_helps"


@pytest.mark.parametrize("folder", [EH, EH / "keyed_merge"], ids=["first", "keyed_merge"])
def test_experience_comparison_analysis_rederives_from_its_records(folder: Path) -> None:
    """Each comparison's committed analysis is what its committed records give; a comparison
    with no records yet claims nothing."""
    assert (folder / "PLAN.md").exists()
    recorded = sorted((folder / "records").glob("*.jsonl"))
    if not recorded:
        assert not [p.name for p in folder.glob("analysis.*")]
        return
    er = experience_records()
    result = er.analyse(folder / "records")
    assert json.loads(json.dumps(result)) == json.loads((folder / "analysis.json").read_text())
    assert er.summary_markdown(result) == (folder / "analysis.md").read_text()
    assert result["recorded"] == len(recorded)
