"""The co-training loop (DESIGN §1): actor loop in front, extractor track behind.

Per actor step:

1. pick G task groups (tasks of the mix in turn, a fresh seed each) and play each K times:
   the first ``K * with_experience_fraction`` rollouts get experience retrieved at episode
   start, the others none — all G*K episodes run concurrently, one batched model call per turn;
2. record the episodes; credit the bank entries (and the extractor samples that wrote them)
   with the outcomes;
3. advantages inside (group, with/without) subgroups (split GRPO) -> actor update
   (skipped during bank warm-up, and for agents whose actor is frozen);
4. hand the trajectories to the extractor track (background thread) and go on without waiting;
5. evaluate every ``eval.every`` steps on held-out tasks, with and without experience;
6. checkpoint (adapters, optimisers, RNG, loop and extractor-track state).

The generation backend is shared by both tracks; a lock serialises model calls, and the time the
actor loop spent waiting for that lock while the extractor track held it is logged as
``timing_s/extractor_wait``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from crl_bench.agent_spec import AgentSpec
from crl_bench.mixes import MixTask, resolve_tasks
from crl_bench.runner.config import ConfigError, RunConfig
from crl_bench.runner.extractor_track import ExtractorSample, ExtractorTrack
from crl_bench.runner.memory import limit_malloc_arenas, peak_rss_gb, release_free_memory, rss_gb
from crl_bench.runner.records import RunDir, write_json_atomic
from crl_bench.runner.trainer import RoleTrainer, TrainSample, timed


class WaitTimingLock:
    """An RLock that adds the time each thread spent blocked on it to ``waits[thread name]``."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.waits: dict[str, float] = {}
        self._meta = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        start = time.perf_counter()
        ok = self._lock.acquire(blocking, timeout)
        waited = time.perf_counter() - start
        name = threading.current_thread().name
        with self._meta:
            self.waits[name] = self.waits.get(name, 0.0) + waited
        return ok

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "WaitTimingLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def take_wait(self, name: str) -> float:
        with self._meta:
            return self.waits.pop(name, 0.0)


class LockedBackend:
    """Proxy that holds the model lock around every call into the backend."""

    def __init__(self, backend: Any, lock: WaitTimingLock) -> None:
        self._backend = backend
        self._lock = lock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)
        return call


def check_family_available(task: MixTask, make_kwargs: dict[str, Any]) -> None:
    """Make one env of ``task``; on failure say which family is missing and how to get it."""
    import gymnasium

    from crl_bench.registry import ENVS

    if task.env_id not in ENVS:
        raise ConfigError(
            f"Task {task.name!r} needs env {task.env_id!r} (family {task.family!r}), which is not "
            f"registered in this installation. Install the family's extra "
            f"(pip install -e '.[{task.family}]') or pick another task set; `crl-bench list envs` "
            "shows what is available.")
    try:
        env = gymnasium.make(task.env_id, **make_kwargs)
        env.close()
    except Exception as exc:
        raise ConfigError(f"Task {task.name!r} ({task.env_id}) cannot start: {type(exc).__name__}: "
                          f"{exc}") from exc


class CoTrainer:
    """Builds the parts an agent needs and runs the loop. See the module docstring."""

    def __init__(self, cfg: RunConfig, spec: AgentSpec, run_dir: RunDir, *, progress: bool = True) -> None:
        cfg.validate(split=spec.needs_split)
        self.cfg = cfg
        self.spec = spec
        self.run = run_dir
        self.progress = progress
        self.tasks = resolve_tasks(cfg.tasks)
        self._envs: dict[tuple[str, str], list[Any]] = {}
        self.step = 0
        self.tb = None
        self.track = None  # set by setup(); close() must work when setup() failed half way
        self.manager = None

    # -- construction --------------------------------------------------------------------------
    def _env_kwargs(self, task: MixTask, phase: str) -> dict[str, Any]:
        kwargs = dict(task.train_kwargs if phase == "train" else task.eval_kwargs)
        cap = self.cfg.rollout.env_max_steps.get(task.family)
        if cap:
            kwargs.setdefault("max_steps", cap)
        return kwargs

    def envs_for(self, task: MixTask, phase: str, n: int) -> list[Any]:
        import gymnasium

        pool = self._envs.setdefault((task.env_id, phase), [])
        while len(pool) < n:
            pool.append(gymnasium.make(task.env_id, **self._env_kwargs(task, phase)))
        return pool[:n]

    def setup(self) -> None:
        cfg, spec = self.cfg, self.spec
        import numpy as np
        import torch

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        limit_malloc_arenas(2)
        for task in self.tasks:
            check_family_available(task, self._env_kwargs(task, "train"))

        from crl_bench.llm.hf_backend import HFBackend
        from crl_bench.llm.types import SamplingParams

        self.ext_raw: Any = None
        self.lock = WaitTimingLock()
        raw = self._make_backend(HFBackend)
        self.raw_backend = raw
        self.backend = LockedBackend(raw, self.lock)
        self.ext_backend = self.backend if self.ext_raw is raw else LockedBackend(self.ext_raw, self.lock)
        r = cfg.rollout
        self.actor_sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p,
                                             max_new_tokens=r.max_new_tokens)
        e = cfg.extractor
        self.extractor_sampling = SamplingParams(temperature=e.temperature, top_p=e.top_p,
                                                 max_new_tokens=e.max_new_tokens, stop=("</answer>",))
        self.actor_trainer = (RoleTrainer(raw, "actor", cfg.actor, total_steps=cfg.steps, lock=self.lock,
                                          seed=cfg.seed) if spec.train_actor else None)
        self.manager = None
        self.track = None
        if spec.use_bank:
            from crl_bench.experience.bank import ExperienceBank
            from crl_bench.experience.embedder import load_embedder
            from crl_bench.experience.manager import ExperienceManager, RetrievalConfig

            x = cfg.experience
            embedder = load_embedder(x.embedder)
            bank = ExperienceBank(self.run.bank_path, dim=embedder.dim, capacity=x.capacity,
                                  embedder_name=embedder.name)
            retrieval = RetrievalConfig(k=x.k, oversample=x.oversample, diversify=spec.diversify, lam=x.lam,
                                        recent_s=x.recent_s, drop_recent_top1_p=x.drop_recent_top1_p,
                                        seed=cfg.seed)
            self.manager = ExperienceManager(bank, embedder, retrieval)
            if spec.train_extractor:
                ext_trainer = (self.actor_trainer if spec.shared_params and self.actor_trainer is not None
                               else RoleTrainer(self.ext_raw, "extractor", cfg.extractor, total_steps=cfg.steps,
                                                lock=self.lock, seed=cfg.seed + 1))
            else:
                ext_trainer = None
            self.track = ExtractorTrack(self.manager, self.extractor_generate, ext_trainer, cfg.extractor,
                                        temperature=self.extractor_sampling.logprob_temperature,
                                        merge_every=x.merge_every if spec.merge else 0,
                                        merge_chunk=x.merge_chunk, count_reweight=spec.count_reweight,
                                        asynchronous=cfg.extractor.asynchronous, log=self._log_track,
                                        run_name=self.run.path.name)
        self._bank_counters = (0.0, 0.0)  # (queries, empty results) at the last step
        self._track_metrics: list[dict[str, Any]] = []
        self._track_metrics_lock = threading.Lock()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run.path / "tensorboard"))
        except Exception:  # tensorboard is optional
            self.tb = None

    def _make_backend(self, backend_cls: Any) -> Any:
        """One backend holding both roles as adapters on one base model; or, when the config names
        a different extractor model (the paper: Qwen3-4B beside a Qwen2.5-7B actor), one backend
        per role (``self.ext_raw`` is then the extractor's)."""
        m = self.cfg.model
        if m.backend == "vllm":
            from crl_bench.llm.vllm_backend import VLLMBackend

            backend_cls = VLLMBackend
        from crl_bench.llm.types import LoraSpec

        common: dict[str, Any] = dict(lora=LoraSpec(r=m.lora_r, alpha=m.lora_alpha), dtype=m.dtype,
                                      device=m.device, seed=self.cfg.seed)
        if m.extractor and m.extractor != m.actor and self.spec.use_bank:
            if self.spec.shared_params:
                raise ConfigError("the shared-parameters ablation needs one model for both roles; "
                                  "unset model.extractor (--set model.extractor=null).")
            actor = backend_cls(m.actor, roles=("actor",), **common)
            self.ext_raw = backend_cls(m.extractor, roles=("extractor",), **common)
            return actor
        backend = backend_cls(m.actor, roles=("actor", "extractor"), shared_adapter=self.spec.shared_params,
                              **common)
        self.ext_raw = backend
        return backend

    # -- model calls ---------------------------------------------------------------------------
    def extractor_generate(self, message_lists: list[list[dict]], stop: tuple[str, ...] = ()
                           ) -> list[Any]:
        """The extractor role. A message list ending with an assistant message is a pre-fill:
        the assistant turn starts with that text (prompt tokens) and the model continues it.
        ``stop`` replaces the default stop strings."""
        prompts = []
        for m in message_lists:
            if m and m[-1].get("role") == "assistant":
                ids = self.ext_backend.chat_prompt_ids(m[:-1])
                ids += self.ext_backend.tokenizer(m[-1]["content"], add_special_tokens=False)["input_ids"]
            else:
                ids = self.ext_backend.chat_prompt_ids(m)
            prompts.append(ids)
        sampling = dataclasses.replace(self.extractor_sampling, stop=tuple(stop)) if stop else self.extractor_sampling
        return self.ext_backend.generate(prompts, sampling, adapter="extractor")

    def _log_track(self, metrics: dict[str, Any]) -> None:
        with self._track_metrics_lock:
            self._track_metrics.append(metrics)

    # -- episodes ------------------------------------------------------------------------------
    def _episodes(self, phase: str, step: int, plan: list[tuple[MixTask, int, int, int, int]]) -> list[Any]:
        """plan rows (task, seed, group id, n with experience, K) -> EpisodeSpecs.

        The first ``n`` of a group's K episodes get entries retrieved for the task's first
        observation; all K share the seed, i.e. the same task instance."""
        from crl_bench.llm.rollout import EpisodeSpec

        specs = []
        by_task: dict[str, int] = {}
        for task, seed, group, n_with, k in plan:
            envs_needed = by_task.get(task.env_id, 0)
            envs = self.envs_for(task, phase, envs_needed + k)[envs_needed:envs_needed + k]
            by_task[task.env_id] = envs_needed + k
            retrieved: list[list[Any]] = [[] for _ in range(k)]
            if n_with and self.manager is not None:
                obs, info = envs[0].reset(seed=seed)
                query = f"{info.get('goal', '')}\n{obs}"[:2000]
                retrieved[:n_with] = self.manager.retrieve([query] * n_with, family=task.family)
            for i, env in enumerate(envs):
                entries = retrieved[i]
                specs.append(EpisodeSpec(
                    env=env, seed=seed, options=None, group_id=group, task_name=task.name,
                    with_experience=i < n_with, experience_ids=[e.id for e in entries],
                    experience_text="\n".join(e.render() for e in entries),
                    meta={"family": task.family, "env_id": task.env_id, "phase": phase, "step": step}))
        return specs

    def _engine(self, ask: Any, seed: int) -> Any:
        from crl_bench.llm.rollout import PromptConfig, RolloutEngine
        from crl_bench.llm.types import SamplingParams

        r = self.cfg.rollout
        sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                                  seed=seed)
        kwargs = dict(history=r.history, think=r.think, max_episode_tokens=r.max_episode_tokens,
                      format_penalty=r.format_penalty, max_asks=self.cfg.experience.max_asks)
        if r.small_model_prompt:
            kwargs.pop("think")
            prompt = PromptConfig.for_small_model(**kwargs)
        else:
            prompt = PromptConfig(**kwargs)
        return RolloutEngine(self.backend, sampling, prompt, adapter="actor", ask_callback=ask,
                             progress=False)

    def _ask_callback(self, record: bool) -> tuple[Any, dict[int, list[ExtractorSample]]]:
        """Search-and-Ask hook for experience episodes; returns (callback, samples by episode)."""
        if self.manager is None or not self.spec.search_ask:
            return None, {}
        from crl_bench.experience.search_ask import SearchAndAsk

        saa = SearchAndAsk(self.manager, self.extractor_generate)
        by_episode: dict[int, list[ExtractorSample]] = {}

        def ask(query: str, spec: Any, context: dict[str, Any]) -> str:
            if not spec.with_experience:  # "without experience" must stay without it
                return "Searching the experience library is not available in this episode."
            before = len(saa.samples)
            answer = saa(query, {"goal": context.get("goal", ""), "observation": context.get("observation", ""),
                                 "family": spec.meta.get("family"), "task_id": str(spec.seed)})
            if record:
                for rec in saa.samples[before:]:
                    gen = rec.generation
                    by_episode.setdefault(id(spec), []).append(ExtractorSample(
                        list(gen.prompt_ids), list(gen.completion_ids), list(gen.logprobs), kind="ask",
                        created_step=self.step, malformed=bool(rec.malformed)))
            return answer
        return ask, by_episode

    def play(self, phase: str, step: int, plan: list[Any], sampling_seed: int) -> list[Any]:
        specs = self._episodes(phase, step, plan)
        ask, ask_samples = self._ask_callback(record=(phase == "train" and self.spec.train_extractor))
        trajectories = self._engine(ask, sampling_seed).run(specs)
        for spec, traj in zip(specs, trajectories):
            traj.meta.update(spec.meta)
            if phase == "train" and self.track is not None:
                samples = ask_samples.get(id(spec), [])
                for s in samples:
                    s.usage.append(traj.score)
                if samples:
                    self.track.add_ask_samples(samples)
        return trajectories

    # -- records -------------------------------------------------------------------------------
    @staticmethod
    def episode_record(traj: Any, phase: str, step: int) -> dict[str, Any]:
        return {"phase": phase, "step": step, "task": traj.task_name, "env_id": traj.env_id,
                "seed": traj.seed, "task_id": traj.task_id, "group": traj.group_id,
                "with_experience": traj.with_experience, "success": bool(traj.success),
                "score": float(traj.score), "reward": float(traj.reward), "n_actions": traj.n_actions,
                "n_turns": len(traj.turns), "n_invalid_format": traj.n_invalid_format,
                "n_tool_calls": traj.n_tool_calls, "tokens": traj.tokens,
                "experience_ids": list(traj.experience_ids), "wall_s": round(traj.wall_s, 3),
                "error": getattr(traj, "error", None)}  # the env failed this episode (rollout.py)

    # -- the loop ------------------------------------------------------------------------------
    def train_plan(self, step: int) -> list[Any]:
        r = self.cfg.rollout
        k = r.group_size
        n_with = round(k * self.spec.with_experience_fraction) if self.spec.use_bank else 0
        plan = []
        for g in range(r.groups):
            task = self.tasks[(step * r.groups + g) % len(self.tasks)]
            seed = self.cfg.seed * 1_000_003 + step * r.groups + g  # < eval offset for any sane run
            plan.append((task, seed, g, n_with, k))
        return plan

    def eval_plan(self, with_experience: bool) -> list[Any]:
        n = self.cfg.eval.episodes_per_task
        plan = []
        for ti, task in enumerate(self.tasks):
            for i in range(n):
                plan.append((task, task.eval_seed_offset + i, ti * n + i, 1 if with_experience else 0, 1))
        return plan

    def evaluate(self, step: int) -> dict[str, Any]:
        modes = [False] + ([True] if self.manager is not None else [])
        records, summaries = [], []
        out: dict[str, Any] = {}
        for with_exp in modes:
            trajs = self.play("eval", step, self.eval_plan(with_exp), sampling_seed=10_007 + step)
            records.extend(self.episode_record(t, "eval", step) for t in trajs)
            for task in self.tasks:
                mine = [t for t in trajs if t.task_name == task.name]
                n = len(mine)
                summ = {"step": step, "task": task.name, "with_experience": with_exp, "n": n,
                        "success_rate": sum(t.success for t in mine) / max(1, n),
                        "score": sum(t.score for t in mine) / max(1, n),
                        "avg_actions": sum(t.n_actions for t in mine) / max(1, n)}
                summaries.append(summ)
            tag = "with_exp" if with_exp else "without_exp"
            out[f"eval/success_rate_{tag}"] = sum(t.success for t in trajs) / max(1, len(trajs))
            out[f"eval/avg_actions_{tag}"] = sum(t.n_actions for t in trajs) / max(1, len(trajs))
        self.run.append("episodes.jsonl", records)
        self.run.append("eval.jsonl", summaries)
        return out

    def actor_update(self, trajectories: list[Any], metrics: dict[str, Any], step: int) -> None:
        import torch

        from crl_bench.algorithms.advantages import group_advantages, group_keys

        # outcome reward: the task score (1/0 for success tasks, WebShop's reward in [0, 1]) minus
        # the format penalty of the episode's malformed turns
        pen = self.cfg.rollout.format_penalty
        scores = torch.tensor([t.score - pen * t.n_invalid_format for t in trajectories], dtype=torch.float32)
        groups = torch.tensor([t.group_id for t in trajectories], dtype=torch.long)
        with_exp = torch.tensor([t.with_experience for t in trajectories], dtype=torch.bool)
        keys = group_keys(groups, with_exp, split=self.spec.split_advantages)
        adv = group_advantages(scores, keys, method=self.cfg.actor.advantage)
        metrics["charts/adv_abs_mean"] = float(adv.abs().mean())
        # warm-up: steps 1..warmup_steps only fill the bank (agents with one)
        if self.actor_trainer is None or step <= self.cfg.experience.warmup_steps and self.spec.use_bank:
            metrics["losses/actor_skipped"] = 1.0
            return
        samples = [TrainSample(turn.prompt_ids, turn.completion_ids, turn.logprobs, float(a))
                   for traj, a in zip(trajectories, adv.tolist()) for turn in traj.turns]
        a = self.cfg.actor
        kwargs: dict[str, Any] = {"clip_eps": a.clip_eps} if a.loss == "ppo_clip" else {}
        m = self.actor_trainer.update(samples, loss=a.loss, loss_kwargs=kwargs, agg=a.agg,
                                      temperature=self.actor_sampling.logprob_temperature)
        metrics.update({f"losses/actor_{k}": v for k, v in m.items()})

    def run_steps(self, start_step: int) -> None:
        from tqdm.auto import tqdm

        cfg = self.cfg
        if start_step == 0 and cfg.eval.at_start:
            m: dict[str, Any] = {}
            with self._phase("evaluating at step 0"), timed(m, "timing_s/eval"):
                m.update(self.evaluate(0))
            self._write_metrics(0, m)
        bar = tqdm(range(start_step + 1, cfg.steps + 1), desc=f"{self.spec.name} {cfg.tasks}",
                   unit="step", disable=not self.progress, initial=start_step, total=cfg.steps)
        for step in bar:
            self.step = step
            t_step = time.perf_counter()
            metrics: dict[str, Any] = {}
            self.lock.take_wait("MainThread")
            with timed(metrics, "timing_s/rollout"):
                trajs = self.play("train", step, self.train_plan(step), sampling_seed=cfg.seed * 7919 + step)
            self.run.append("episodes.jsonl", [self.episode_record(t, "train", step) for t in trajs])
            self.run.write_trajectories(step, "train", [t.to_json() for t in trajs])
            if self.track is not None:
                for t in trajs:
                    if t.with_experience and t.experience_ids:
                        self.track.record_usage(t.experience_ids, t.score)
                        self.manager.record_outcomes(t.experience_ids, t.score)
            with timed(metrics, "timing_s/actor_update"):
                self.actor_update(trajs, metrics, step)
            if self.track is not None:
                self.track.submit(step, trajs)
                if step == cfg.steps:  # the last batches (and a due merge) land in this record
                    with timed(metrics, "timing_s/final_drain"):
                        self.track.wait_idle()
            self._step_metrics(trajs, metrics)
            if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.steps:
                with timed(metrics, "timing_s/eval"):
                    metrics.update(self.evaluate(step))
            if step == cfg.steps:
                with timed(metrics, "timing_s/eval"):
                    metrics.update(self.evaluate(step))
            release_free_memory()
            metrics["memory/rss_gb"] = rss_gb()
            metrics["memory/peak_rss_gb"] = peak_rss_gb()  # since the process started
            metrics["timing_s/extractor_wait"] = self.lock.take_wait("MainThread")
            metrics["timing_s/step"] = time.perf_counter() - t_step
            metrics["timing_s/extractor_wait_frac"] = metrics["timing_s/extractor_wait"] / metrics["timing_s/step"]
            self._write_metrics(step, metrics)
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                self.save_checkpoint(step)
            self.run.set_status("running" if step < cfg.steps else "done", step)
            bar.set_postfix(success=f"{metrics.get('charts/success_rate', 0):.2f}",
                            bank=metrics.get("bank/size", "-"))

    def _step_metrics(self, trajs: list[Any], metrics: dict[str, Any]) -> None:
        n = max(1, len(trajs))
        metrics["charts/success_rate"] = sum(t.success for t in trajs) / n
        metrics["charts/score"] = sum(t.score for t in trajs) / n
        metrics["charts/avg_actions"] = sum(t.n_actions for t in trajs) / n
        metrics["charts/invalid_format_frac"] = (sum(t.n_invalid_format for t in trajs)
                                                 / max(1, sum(len(t.turns) for t in trajs)))
        metrics["charts/tokens"] = sum(t.tokens for t in trajs)
        metrics["charts/env_errors"] = sum(1 for t in trajs if getattr(t, "error", None))  # env raised: episode ended
        for flag, tag in ((True, "with_exp"), (False, "without_exp")):
            sub = [t for t in trajs if t.with_experience == flag]
            if sub:
                metrics[f"charts/success_rate_{tag}"] = sum(t.success for t in sub) / len(sub)
        for task in {t.task_name for t in trajs}:
            sub = [t for t in trajs if t.task_name == task]
            metrics[f"charts/success_rate/{task}"] = sum(t.success for t in sub) / len(sub)
        if self.manager is not None:
            stats = self.manager.stats()
            metrics.update({(k if k.startswith("bank/") else f"bank/{k}"): v
                            for k, v in stats.items() if isinstance(v, (int, float))})
            # per-step figures from the manager's running counters (they restart with the process)
            queries, empty = stats["bank/queries"], stats["bank/empty_results"]
            prev_q, prev_e = self._bank_counters
            metrics["bank/retrievals"] = queries - prev_q
            if queries > prev_q:
                metrics["bank/hit_rate"] = 1.0 - (empty - prev_e) / (queries - prev_q)
            self._bank_counters = (queries, empty)
        if self.track is not None:
            metrics["extractor/backlog"] = self.track.backlog
            metrics.update({f"extractor/{k}": v for k, v in self.track.stats.items()})
            with self._track_metrics_lock:
                done, self._track_metrics = self._track_metrics, []
            for m in done:  # extractor-track metrics from batches finished since the last step
                for k, v in m.items():
                    if k != "step":
                        metrics[k] = v

    def _write_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": time.time(), **metrics}
        self.run.append("metrics.jsonl", [record])
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)

    class _phase:
        def __init__(self, what: str) -> None:
            self.what = what

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> None:
            return None

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        import numpy as np
        import torch

        tmp = self.run.new_checkpoint_tmp()
        with self.lock:
            self.raw_backend.save_adapters(tmp / "adapters")
            if self.ext_raw is not self.raw_backend:
                self.ext_raw.save_adapters(tmp / "extractor_adapters")
            trainers = {}
            if self.actor_trainer is not None:
                trainers["actor"] = self.actor_trainer.state_dict()
            if self.track is not None and self.track.trainer is not None and self.track.trainer is not self.actor_trainer:
                trainers["extractor"] = self.track.trainer.state_dict()
            torch.save(trainers, tmp / "trainers.pt")
        torch.save({"python": random.getstate(), "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state()}, tmp / "rng.pt")
        # the bank as of this checkpoint, copied under the track's lock so that it agrees with
        # the track's list of unprocessed batches (a resumed run re-extracts exactly those)
        backup = (lambda: self.manager.bank.backup(tmp / "bank.sqlite")) if self.manager is not None else None
        if self.track is not None:
            track_state = self.track.state(also=backup)
        else:
            track_state = None
            if backup is not None:
                backup()
        with self._track_metrics_lock:  # finished extractor batches not yet in a metrics record
            pending_metrics = list(self._track_metrics)
        state = {"step": step, "track": track_state, "track_metrics": pending_metrics}
        (tmp / "loop_state.json").write_text(json.dumps(state))
        self.run.commit_checkpoint(tmp)

    def load_checkpoint(self, path: Path) -> int:
        import numpy as np
        import torch

        self.raw_backend.load_adapters(path / "adapters")
        if self.ext_raw is not self.raw_backend:
            self.ext_raw.load_adapters(path / "extractor_adapters")
        trainers = torch.load(path / "trainers.pt", weights_only=False)
        if "actor" in trainers and self.actor_trainer is not None:
            self.actor_trainer.load_state_dict(trainers["actor"])
        if "extractor" in trainers and self.track is not None and self.track.trainer is not None:
            self.track.trainer.load_state_dict(trainers["extractor"])
        rng = torch.load(path / "rng.pt", weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        state = json.loads((path / "loop_state.json").read_text())
        with self._track_metrics_lock:
            self._track_metrics = list(state.get("track_metrics", [])) + self._track_metrics
        if self.track is not None and state.get("track"):
            from crl_bench.llm.rollout import Trajectory

            for step, trajs in self.track.load_state(state["track"], Trajectory):
                self.track.submit(step, trajs)
        return int(state["step"])

    def close(self) -> None:
        if self.track is not None:
            self.track.close()
        if self.manager is not None:
            self.manager.bank.close()
        for envs in self._envs.values():
            for env in envs:
                env.close()
        if self.tb is not None:
            self.tb.close()


def spec_to_dict(spec: AgentSpec) -> dict[str, Any]:
    return asdict(spec)


def write_config(run: RunDir, cfg: RunConfig, spec: AgentSpec, tasks: tuple[MixTask, ...]) -> None:
    import platform

    data = cfg.to_dict()
    data["agent_spec"] = spec_to_dict(spec)
    data["task_names"] = [t.name for t in tasks]
    data["env_ids"] = [t.env_id for t in tasks]
    data["host"] = {"python": platform.python_version(), "machine": platform.machine()}
    write_json_atomic(run.config_path, data)
