"""``crl-bench eval``: evaluate a model without training it.

The model is one of

* a model name or path (a Hugging Face id, a local folder, or a built-in name such as
  ``smollm2-135m`` / ``tiny-sft``): its base weights, no adapter;
* a run directory: the run's stored configuration and its last checkpoint's adapters (or full
  weights);
* an OpenAI-compatible endpoint (``endpoint=URL, model_id=NAME``,
  :class:`~crl_bench.llm.openai_backend.OpenAIBackend`).

on any task set, with or without a given experience bank (copied first: retrieval counts uses in
the bank, and the given file must stay as it was), over seeds. Each seed is one folder laid out as
a run's (``config.json``, ``status.json``, ``eval.jsonl``, ``episodes.jsonl``, ``metrics.jsonl``,
``trajectories/``, ``tensorboard/``), written by the runner's own evaluation
(:meth:`crl_bench.run.loop.RunLoop.evaluate`: the same held-out plan, prompts, sampling and
records as a run's evaluation); the report over the seeds (success, steps, intervals over seeds)
is :func:`crl_bench.report.writer.write_report`'s.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_bench.agent import Agent, StepResult


@dataclass(frozen=True)
class EvalModel:
    """What is evaluated. ``source``: ``"model"``, ``"checkpoint"`` or ``"endpoint"``."""

    source: str
    name: str
    """Model name / path (``model``), the run directory (``checkpoint``) or the served name."""
    endpoint: str | None = None
    checkpoint: Path | None = None
    checkpoint_step: int = 0

    @property
    def label(self) -> str:
        """The row name in the report (``config.json``'s ``agent``)."""
        if self.source == "checkpoint":
            return f"{Path(self.name).name}@step{self.checkpoint_step}"
        if self.source == "endpoint":
            return f"endpoint:{self.name}"
        return Path(self.name).name if Path(self.name).exists() else self.name


class EvalAgent(Agent):
    """Builds what an evaluation needs (the actor, and the bank when one is given); it has no
    training step."""

    def __init__(self, model: EvalModel, bank: bool, concurrency: int = 8) -> None:
        super().__init__("eval", label="evaluation", description="evaluation only")
        self.model = model
        self.bank = bank
        self.concurrency = concurrency

    def build(self, ctx: Any) -> None:
        m = self.model
        if m.source == "endpoint":
            from crl_bench.llm.openai_backend import OpenAIBackend
            from crl_bench.llm.roles import LockedBackend
            from crl_bench.llm.types import SamplingParams

            backend = OpenAIBackend(str(m.endpoint), m.name, concurrency=self.concurrency)
            backend.check()
            models, r = ctx.models, ctx.cfg.rollout
            models.raw_backend = models.ext_raw = backend
            models.backend = models.ext_backend = LockedBackend(backend, models.lock)
            models.actor_sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p,
                                                   top_k=r.top_k, max_new_tokens=r.max_new_tokens)
        elif m.source == "checkpoint":
            assert m.checkpoint is not None
            roles = json.loads((m.checkpoint / "adapters" / "roles.json").read_text())
            routes = roles.get("routes", {})
            extractor = "extractor" in roles.get("roles", [])
            shared = extractor and routes.get("actor") == routes.get("extractor")
            ctx.build_models(extractor=extractor, shared_params=shared)
            ctx.models.raw_backend.load_adapters(m.checkpoint / "adapters")
        else:
            ctx.build_models(extractor=False)
        if self.bank:
            ctx.build_experience()

    def train_step(self, ctx: Any, step: int) -> StepResult:  # pragma: no cover - never called
        raise RuntimeError("an evaluation has no training step")


def _read_only_run(path: Path) -> Any:
    """A :class:`RunDir` view of an existing run for reading (no lock taken, nothing created)."""
    from crl_bench.records.files import RunDir

    run = RunDir.__new__(RunDir)
    run.path, run._lock_fh = path, None
    return run


def resolve_model(model: str | None, endpoint: str | None, model_id: str | None) -> EvalModel | None:
    """The :class:`EvalModel` of the command's arguments (None: the preset's own actor)."""
    if endpoint:
        if model:
            raise ValueError(f"give either MODEL ({model}) or --endpoint URL --model-id NAME, not "
                             "both")
        if not model_id:
            raise ValueError("--endpoint needs --model-id NAME (the served model's name; "
                             f"GET {endpoint.rstrip('/')}/models lists them)")
        return EvalModel("endpoint", model_id, endpoint=endpoint)
    if model_id:
        raise ValueError("--model-id names a model served at --endpoint URL; without an endpoint "
                         "give the model as MODEL (a Hugging Face id, a path or a run directory)")
    if model is None:
        return None
    path = Path(model).expanduser()
    if (path / "config.json").is_file() and (path / "status.json").is_file():
        ckpt = _read_only_run(path)
        last = ckpt.last_checkpoint()
        try:
            stored = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            stored = {}
        if isinstance(stored, dict) and stored.get("evaluated"):
            raise ValueError(f"{path} is an evaluation's folder, not a run: evaluate what it "
                             f"evaluated ({stored['evaluated'].get('model')}) instead")
        if last is None:
            raise ValueError(f"{path} is a run without a checkpoint yet (it writes one every "
                             "checkpoint_every steps and at its end); evaluate it once one exists, "
                             "or give a model name or path")
        step = ckpt.verify_checkpoint(last)  # files against their checksums, named if damaged
        if not (last / "adapters" / "roles.json").is_file():
            raise ValueError(f"{last} holds no adapters/roles.json: it is not a checkpoint this "
                             "version can load")
        return EvalModel("checkpoint", str(path), checkpoint=last, checkpoint_step=int(step))
    return EvalModel("model", model)


def eval_config(model: EvalModel | None, *, tasks: str | None, preset: str | None, seed: int,
                episodes: int | None, overrides: dict[str, Any]) -> Any:
    """The evaluation's :class:`RunConfig`: a run's stored one for a checkpoint, else the
    preset's, with the model, tasks, seed, episodes and ``--set`` overrides applied."""
    from crl_bench.config.schema import ConfigError, apply_overrides, build_config

    overrides = dict(overrides)
    if episodes is not None:
        if episodes < 1:
            raise ConfigError(f"--episodes {episodes}: give 1 or more held-out episodes per task")
        overrides["eval.episodes_per_task"] = episodes
    if model is not None and model.source == "checkpoint":
        from crl_bench.runner.api import _stored_config

        cfg = _stored_config(_read_only_run(Path(model.name)))
        if preset is not None and preset != cfg.preset:
            raise ConfigError(f"--preset {preset}: a run's checkpoint is evaluated with the run's "
                              f"own configuration (preset {cfg.preset}); change single settings "
                              "with --set")
        if tasks is not None:
            cfg.tasks = tasks
        cfg.seed = seed
        apply_overrides(cfg, overrides)
        cfg.validate()
        return cfg
    if model is not None and model.source == "model":
        key = "model.actor"
        if key in overrides and overrides[key] != model.name:
            raise ConfigError(f"--set model.actor={overrides[key]} conflicts with MODEL "
                              f"{model.name}; give the model once")
        overrides[key] = model.name
    if model is not None and model.source == "endpoint":
        # nothing is loaded here: the served model stands in config.json's model.actor
        overrides.setdefault("model.device", "cpu")
        overrides.setdefault("model.backend", "hf")
    return build_config(agent="grpo", tasks=tasks, preset=preset, seed=seed, overrides=overrides)


def default_eval_dir(label: str, tasks: str, root: str | Path = "evals") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in label)
    return Path(root) / f"{tasks}__{safe}__{stamp}"


def evaluate_one(cfg: Any, model: EvalModel | None, out: Path, *, bank: Path | None = None,
                 progress: bool = True, concurrency: int = 8) -> Path:
    """One seed's evaluation into the run-like folder ``out``; returns it."""
    from crl_bench.run.context import RunContext
    from crl_bench.run.loop import RunLoop, write_config
    from crl_bench.records.files import RunDir, write_json_atomic

    model = model or EvalModel("model", cfg.model.actor)
    if out.exists() and (out / "config.json").exists():
        raise FileExistsError(f"{out} already holds an evaluation or a run; choose another --out")
    run = RunDir(out)
    run.acquire()
    try:
        if bank is not None:
            from crl_bench.experience.bank_files import snapshot_bank

            snapshot_bank(bank, run.bank_path)
        agent = EvalAgent(model, bank is not None, concurrency=concurrency)
        trainer = RunLoop(cfg, agent, run, progress=progress, context=RunContext)
        write_config(run, cfg, agent, trainer.tasks)
        data = json.loads(run.config_path.read_text())
        data["agent"] = model.label
        data["steps"] = model.checkpoint_step  # steps the evaluated model was trained here
        data["evaluated"] = {"source": model.source, "model": model.name, "endpoint": model.endpoint,
                        "checkpoint": None if model.checkpoint is None else str(model.checkpoint),
                        "checkpoint_step": model.checkpoint_step,
                        "bank": None if bank is None else str(bank)}
        if model.source == "endpoint":
            data["model"]["backend"] = "openai-endpoint"
            data["model"]["actor"] = model.name
        write_json_atomic(run.config_path, data)
        step = model.checkpoint_step
        run.set_status("running", step)
        try:
            trainer.setup()
            ctx = trainer.ctx
            ctx.step = step
            modes = 2 if ctx.manager is not None else 1
            ctx.progress.plan_run(total_steps=step, start_step=step, train_episodes_per_step=0,
                                  eval_episodes=modes * cfg.eval.episodes_per_task * len(trainer.tasks),
                                  eval_steps=[step])
            ctx.progress.set_phase("evaluating", step)
            started = time.perf_counter()
            metrics = trainer.evaluate(step)
            metrics["timing_s/eval"] = time.perf_counter() - started
            ctx.timings.clear()
            trainer._write_metrics(step, metrics)
            ctx.progress.set_phase("done")
        except BaseException as exc:
            run.set_status("failed", step, error=f"{type(exc).__name__}: {exc}")
            try:
                trainer.close()
            except Exception as close_exc:  # noqa: BLE001 - the cause is what matters
                exc.add_note(f"(while cleaning up: {type(close_exc).__name__}: {close_exc})")
            raise
        trainer.close()
        run.set_status("done", step)
    finally:
        run.release()
    return run.path


def run_eval(model: EvalModel | None, *, tasks: str | None, preset: str | None, seeds: list[int],
             out: Path | None, bank: Path | None = None, episodes: int | None = None,
             overrides: dict[str, Any] | None = None, progress: bool = True,
             report: bool = True, concurrency: int = 8) -> tuple[Path, list[Path], Any]:
    """Evaluate over ``seeds`` (one folder each under ``out``) and write the report in
    ``out/report``. Returns ``(out, seed folders, report result or None)``."""
    if bank is not None:
        bank = Path(bank).expanduser()
        if not bank.is_file():
            raise FileNotFoundError(f"--bank {bank}: no such file; give an experience bank, e.g. "
                                    "RUN_DIR/bank.sqlite")
        from crl_bench.experience.bank_files import bank_file_problem

        problem = bank_file_problem(bank)
        if problem is not None:
            raise ValueError(f"--bank {bank} {problem}")
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ValueError(f"--seed {' '.join(map(str, seeds))}: give distinct seeds >= 0")
    cfgs = [eval_config(model, tasks=tasks, preset=preset, seed=s, episodes=episodes,
                        overrides=overrides or {}) for s in seeds]  # all checked before any runs
    if model is not None and model.source == "endpoint":  # a dead server: before any folder
        from crl_bench.llm.openai_backend import OpenAIBackend

        OpenAIBackend(str(model.endpoint), model.name, retries=0).check()
    label = (model or EvalModel("model", cfgs[0].model.actor)).label
    out = Path(out) if out is not None else default_eval_dir(label, cfgs[0].tasks)
    dirs = [evaluate_one(cfg, model, out / f"seed_{cfg.seed}", bank=bank, progress=progress,
                         concurrency=concurrency) for cfg in cfgs]
    result = None
    if report:
        try:
            from crl_bench.report.writer import write_report

            result = write_report(dirs, out / "report", title=f"crl-bench eval {label}")
        except Exception as exc:  # noqa: BLE001 - the evaluation itself is done and recorded
            print(f"report: not written ({type(exc).__name__}: {exc}); try `crl-bench report "
                  f"{out} --out {out / 'report'}`")
    return out, dirs, result
