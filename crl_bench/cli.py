"""The ``crl-bench`` command line.

Every subcommand lives in a module whose top level imports nothing heavy; the work (torch, NLE,
TextWorld, ...) is imported inside the function that runs it, so ``crl-bench --help`` and
``crl-bench list`` answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Sequence

from crl_bench.config.overrides import parse_overrides

# name -> "module:configure"; configure(subparser) adds arguments and sets ``func``.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "list": ("crl_bench.cli:_configure_list", "list registered envs, agents, task mixes or presets"),
    "check-env": ("crl_bench.cli:_configure_check_env", "check a text env against the contract"),
    "play": ("crl_bench.cli:_configure_play", "play a text env yourself in the terminal"),
    "run": ("crl_bench.runner.cli:configure", "train and evaluate an agent on a task set"),
    "report": ("crl_bench.report.cli:configure_report", "write tables and plots from run directories"),
    "reproduce": ("crl_bench.runner.reproduce:configure",
                  "run a whole suite (agents x tasks x seeds), then the report"),
    "eval": ("crl_bench.runner.cli:configure_eval", "evaluate a model, a run's checkpoint or an "
                                                    "OpenAI-compatible endpoint on a task set"),
    "show": ("crl_bench.runner.cli:configure_show", "print one episode of a run as the model saw it"),
    "bank": ("crl_bench.experience.cli:configure", "inspect an experience bank"),
    "build-model": ("crl_bench.cli:_configure_build_model",
                    "build a named model into the cache (e.g. smollm2-135m-reader) and print "
                    "its folder"),
    "plan": ("crl_bench.cli:_configure_plan", "memory and time per GPU of a GPU run; refuses one "
                                              "that does not fit"),
}


def _load(target: str) -> Callable[..., object]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crl-bench",
        description="Complementary RL for LLM agents: text envs, agents, training and reports.",
        epilog="Main job: crl-bench run --agent comp_rl --tasks 3mix")
    from crl_bench import __version__

    parser.add_argument("--version", action="version", version=f"crl-bench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (target, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            _load(target)(p)
        except ModuleNotFoundError as exc:  # a part of the suite that is not installed / built yet
            p.set_defaults(func=_unavailable(name, exc))
    return parser


def _unavailable(name: str, exc: Exception) -> Callable[[argparse.Namespace], int]:
    def run(_args: argparse.Namespace) -> int:
        print(f"crl-bench {name}: not available in this installation ({exc}).", file=sys.stderr)
        return 2
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure is one `error:` line; --debug shows the traceback
        if getattr(args, "debug", False):
            raise
        print(f"crl-bench {args.command}: error: {_describe(exc)}", file=sys.stderr)
        return 2


# errors whose message is written for the user: shown as they are; others get their type and a
# pointer to --debug (a bug, or a failure inside a library, is still one line, not a traceback)
_USER_ERRORS = (KeyError, ValueError, FileNotFoundError, FileExistsError, RuntimeError)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, _USER_ERRORS) or type(exc) in (RuntimeError, KeyError, ValueError) \
            and not str(exc):
        text = f"{type(exc).__name__}: {text} (run again with --debug for the traceback)"
    cause = exc.__cause__
    if cause is not None and str(cause) not in text:
        text += f" [cause: {type(cause).__name__}: {cause}]"
    for note in getattr(exc, "__notes__", ()):
        text += f" {note}"
    return text


# ---------------------------------------------------------------------------------------------
# build-model
# ---------------------------------------------------------------------------------------------

def _configure_build_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a known short model name (crl_bench.llm.models.KNOWN_MODELS), "
                                "e.g. smollm2-135m-reader")
    p.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    p.set_defaults(func=_cmd_build_model)


def _cmd_build_model(args: argparse.Namespace) -> int:
    from crl_bench.llm.models import KNOWN_MODELS, resolve_model

    if args.name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {args.name!r}; known: {', '.join(KNOWN_MODELS)}")
    print(resolve_model(args.name))  # built once into the cache, then found there
    return 0


# ---------------------------------------------------------------------------------------------
# list / check-env / play
# ---------------------------------------------------------------------------------------------

def _configure_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=["envs", "agents", "mixes", "presets"], help="what to list")
    p.add_argument("--family", help="only envs of this family (minihack, webshop, ...)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="agents: also each agent's options (--set method.NAME=VALUE) with their "
                        "defaults and what they do (imports every agent)")
    p.set_defaults(func=_cmd_list)


def _cmd_list(args: argparse.Namespace) -> int:
    from crl_bench.registry import AGENTS, ENVS, MIXES

    if args.what == "envs":
        rows = [(e.name, e.load().family, e.source, e.load().description)
                for e in ENVS.entries() if not args.family or e.load().family == args.family]
        width = max((len(r[0]) for r in rows), default=10)
        for name, family, source, desc in rows:
            src = "" if source == "builtin" else f" [{source}]"
            print(f"{name:<{width}}  {family:<9} {desc}{src}")
    elif args.what == "agents":
        from crl_bench.agent import agent_description

        for e in AGENTS.entries():  # plugins are listed without importing them
            src = "" if e.source == "builtin" else f" [{e.source}]"
            desc = (agent_description(e.name) if e.source == "builtin"  # the agent object's own
                    else "(plugin; `crl-bench run --agent NAME` loads it)")
            if getattr(args, "verbose", False):
                import json

                from crl_bench.agent import load_agent

                agent = load_agent(e.name)  # a broken plugin is reported by name here
                desc = agent.description or desc
                print(f"{e.name:<22} {desc}{src}")
                for name, value, doc in agent.option_docs():
                    print(f"    method.{name}={json.dumps(value, default=str)}"
                          + (f"  {doc}" if doc else ""))
                continue
            print(f"{e.name:<22} {desc}{src}")
    elif args.what == "mixes":
        for e in MIXES.entries():
            tasks = e.load()
            print(f"{e.name:<10} " + ", ".join(f"{t.name} ({t.env_id})" for t in tasks))
    else:
        print("\n".join(preset_lines()))
    return 0


def preset_lines() -> list[str]:
    """Each preset: its name, what it is for, and its settings that differ from the base
    ``RunConfig()`` (``crl-bench list presets``; docs/usage.md shows the same)."""
    import json

    from crl_bench.config.schema import PRESETS, default_preset

    lines = [f"the base is RunConfig(); default preset here: {default_preset()}"]
    for preset in PRESETS.values():
        lines += ["", f"{preset.name}: {preset.summary}"]
        lines += [f"  {key}={json.dumps(value)}" for key, value in preset.changes.items()]
    return lines


def _configure_check_env(p: argparse.ArgumentParser) -> None:
    p.add_argument("env_id", help="registered env id, e.g. crl/MiniHack-Room-5x5-v0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="env constructor keyword (repeatable), e.g. --set max_steps=50")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_check_env)


def _cmd_check_env(args: argparse.Namespace) -> int:
    from crl_bench.env_check import TextEnvCheckError, check_text_env

    try:
        report = check_text_env(args.env_id, seed=args.seed,
                                make_kwargs=parse_overrides(args.overrides),
                                progress=lambda m: print(f"  checking: {m}", flush=True))
    except TextEnvCheckError as exc:
        print(f"FAIL {args.env_id}: {exc}", file=sys.stderr)
        return 1
    for line in report.checks:
        print(f"  ok  {line}")
    print(f"PASS {args.env_id}")
    return 0


def _configure_play(p: argparse.ArgumentParser) -> None:
    p.add_argument("env_id", help="registered env id, e.g. crl/MiniHack-Room-5x5-v0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task-id", help="a specific task instance (options={'task_id': ...})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="env constructor keyword (repeatable)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_play)


def _cmd_play(args: argparse.Namespace) -> int:
    import gymnasium

    from crl_bench.registry import ENVS

    ENVS.entry(args.env_id)
    env = gymnasium.make(args.env_id, **parse_overrides(args.overrides))
    options = {"task_id": args.task_id} if args.task_id else None
    obs, info = env.reset(seed=args.seed, options=options)
    total = 0.0
    print(f"GOAL: {info['goal']}\n")
    print("(type an action; ':q' quits; '<<' starts a multi-line action that a '>>' line ends)\n")
    steps = 0
    while True:
        print(obs)
        if info["admissible_actions"] is not None:
            print("\nactions: " + " | ".join(info["admissible_actions"]))
        try:
            action = input("\n> ")
        except EOFError:
            print()
            break
        if action.strip() in {":q", ":quit"}:
            break
        if action.strip() == "<<":  # multi-line action (SWE's create/replace): end with a '>>' line
            lines = []
            while True:
                try:
                    line = input("... ")
                except EOFError:
                    break
                if line.strip() == ">>":
                    break
                lines.append(line)
            action = "\n".join(lines)
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        total += reward
        valid = "" if info["action_valid"] else "  (invalid action)"
        print(f"\nreward {reward:+.2f}  total {total:+.2f}  score {info['score']:.2f}  "
              f"step {steps}{valid}\n")
        if terminated or truncated:
            print(obs)
            why = "solved" if info["success"] else ("time limit" if truncated else "episode over")
            print(f"\n=== {why}: success={info['success']} score={info['score']:.2f} "
                  f"return={total:+.2f} steps={steps}")
            break
    env.close()
    return 0


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------

def _configure_plan(p: argparse.ArgumentParser) -> None:
    from crl_bench.config.schema import PRESETS

    p.add_argument("--preset", default="paper", choices=list(PRESETS),
                   help="configuration preset (default paper)")
    p.add_argument("--gpus", type=int, default=16,
                   help="GPUs in all, any count >= 1 (paper: 16): half per role; a role's GPUs "
                        "split into vLLM engines and learner ranks, one GPU shared by both")
    p.add_argument("--lora", nargs="?", type=int, const=16, default=None, metavar="R",
                   help="train LoRA adapters of rank R (default 16) on frozen bases instead of "
                        "full fine-tuning (the same as --set model.lora_r=R)")
    p.add_argument("--gpu-memory", type=float, default=80.0, metavar="GB",
                   help="memory of one GPU in GB (default 80)")
    p.add_argument("--checkpointing", choices=["on", "off"], default="on",
                   help="activation checkpointing per decoder layer in the verdict (default on; "
                        "the table shows both)")
    p.add_argument("--precision", choices=["fsdp2", "bf16-masters", "trainer", "fp32"],
                   default="fsdp2", help="bytes per parameter of the learner's states: fsdp2 "
                   "(fp32 sharded params, grads, AdamW: 16), bf16-masters (2+2+4+8), trainer "
                   "(one process, fp32 masters: 18), fp32 (16)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, as for `crl-bench run` (repeatable)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="dense bf16 TFLOP/s of one GPU for the time estimate (H100/H200: 989)")
    p.add_argument("--mfu", type=float, default=0.4,
                   help="assumed MFU of compute-bound parts for the time estimate (default 0.4)")
    p.add_argument("--hbm-tbps", type=float, default=3.35,
                   help="HBM TB/s of one GPU: decoding is bound by it (H100 SXM 3.35, H200 4.8)")
    p.add_argument("--sync-gbps", type=float, default=50.0,
                   help="GB/s at which updated weights reach the engines (default 50)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    import json

    from crl_bench.distributed.memory_plan import build_plan, format_plan, refusal, to_dict
    from crl_bench.config.schema import PRESETS, apply_overrides

    overrides = parse_overrides(args.overrides)
    if args.lora is not None:
        if args.lora < 1:
            raise ValueError(f"--lora {args.lora}: the adapters' rank must be >= 1 (leave --lora "
                             "out for full fine-tuning)")
        overrides = {"model.lora_r": args.lora, **overrides}
    cfg = apply_overrides(PRESETS[args.preset](), overrides)
    plan = build_plan(cfg, args.gpus, args.gpu_memory, checkpointing=args.checkpointing == "on",
                      precision=args.precision, peak_tflops=args.peak_tflops, mfu=args.mfu,
                      hbm_tbps=args.hbm_tbps, sync_gbps=args.sync_gbps)
    topology = _plan_topology(cfg, args.gpus)
    if args.json:
        print(json.dumps(to_dict(plan) | {"topology": topology}, indent=1))
    else:
        print(format_plan(plan))
        if topology is not None:
            from crl_bench.distributed.plan import format_topology

            print("\n" + "\n".join(format_topology(topology)))
    if not plan.fits:
        print(f"crl-bench plan: refused: {refusal(plan)}", file=sys.stderr)
        return 1
    return 0


def _plan_topology(cfg: object, gpus: int) -> dict | None:
    """The Ray topology a run of ``cfg`` on ``gpus`` GPUs builds (None where no Ray plan has
    that layout: a role with one GPU)."""
    from crl_bench.distributed.plan import built_topology, layout_plan

    try:
        return built_topology(cfg, layout_plan(cfg, gpus))
    except ValueError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
