"""The player: the step's task groups, the envs, retrieval at the episode start, the gate, and
playing the episodes (one batched model call per turn)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_bench.mixes import MixTask
from crl_bench.run.parts.base import Part, RunInfo
from crl_bench.run.parts.experience import ExperienceSide
from crl_bench.run.parts.models import Models
from crl_bench.run.parts.seeds import sampling_seed as phase_sampling_seed
from crl_bench.run.parts.seeds import train_seed


@dataclass(frozen=True)
class GroupPlan:
    """One task group of a step: ``size`` episodes of one task instance (``seed``), the first
    ``with_experience`` of them with retrieved experience."""

    task: MixTask
    seed: int
    group_id: int
    with_experience: int
    size: int


def check_family_available(task: MixTask, make_kwargs: dict[str, Any]) -> None:
    """Make one env of ``task``; on failure say which family is missing and how to get it."""
    import gymnasium

    from crl_bench.registry import ENVS
    from crl_bench.config.schema import ConfigError

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


class Player(Part):
    """Plans and plays episodes. Its checkpoint state is the training score per task (the
    gate's historical performance); the envs are rebuilt, not saved."""

    name = "player"

    def __init__(self, info: RunInfo, models: Models, experience: ExperienceSide) -> None:
        self.info = info
        self.models = models
        self.experience = experience
        self._envs: dict[tuple[str, str], list[Any]] = {}
        self.task_scores: dict[str, list[float]] = {}
        """Per task: [score sum, episodes] of training episodes (the gate's historical performance)."""

    # -- envs ----------------------------------------------------------------------------------
    def check_tasks(self) -> None:
        """Make one env of every task: a missing family is named before any model loads."""
        for task in self.info.tasks:
            check_family_available(task, self.env_kwargs(task, "train"))

    def env_kwargs(self, task: MixTask, phase: str) -> dict[str, Any]:
        cfg = self.info.cfg
        kwargs = dict(task.train_kwargs if phase == "train" else task.eval_kwargs)
        if cfg.eval.swe_verified and task.family == "swe" and phase != "train":
            # SWE-bench Verified (the paper's evaluation), used where its data exists
            from crl_bench.envs.swe.verified import verified_eval_kwargs

            kwargs.update(verified_eval_kwargs())
        kwargs.update(cfg.rollout.env_kwargs.get(task.family, {}))
        cap = cfg.rollout.env_max_steps.get(task.family)
        if cap:
            kwargs.setdefault("max_steps", cap)
        return kwargs

    def envs_for(self, task: MixTask, phase: str, n: int) -> list[Any]:
        import gymnasium

        pool = self._envs.setdefault((task.env_id, phase), [])
        while len(pool) < n:
            pool.append(gymnasium.make(task.env_id, **self.env_kwargs(task, phase)))
        return pool[:n]

    # -- plans ---------------------------------------------------------------------------------
    def plan(self, step: int, *, with_experience: int = 0) -> list[GroupPlan]:
        """The step's G task groups (tasks of the mix in turn, a fresh seed each), K episodes
        each, the first ``with_experience`` of every group with retrieved experience."""
        cfg = self.info.cfg
        r, tasks = cfg.rollout, self.info.tasks
        plan = []
        for g in range(r.groups):
            task = tasks[(step * r.groups + g) % len(tasks)]
            seed = train_seed(cfg.seed, step * r.groups + g, task.eval_seed_offset)
            plan.append(GroupPlan(task, seed, g, with_experience, r.group_size))
        return plan

    def eval_plan(self, with_experience: bool) -> list[GroupPlan]:
        n = self.info.cfg.eval.episodes_per_task
        return [GroupPlan(task, task.eval_seed_offset + i, ti * n + i, int(with_experience), 1)
                for ti, task in enumerate(self.info.tasks) for i in range(n)]

    def episode_specs(self, phase: str, step: int, plan: list[GroupPlan]) -> list[Any]:
        """The episodes of ``plan``, with their retrieved experience; all K episodes of a group
        share the seed, i.e. the same task instance."""
        from crl_bench.experience.manager import retrieval_query
        from crl_bench.llm.rollout import EpisodeSpec

        x = self.info.cfg.experience
        manager = self.experience.manager
        specs = []
        gates: list[tuple[Any, str]] = []
        by_task: dict[str, int] = {}
        for g in plan:
            used = by_task.get(g.task.env_id, 0)
            envs = self.envs_for(g.task, phase, used + g.size)[used:used + g.size]
            by_task[g.task.env_id] = used + g.size
            retrieved: list[list[Any]] = [[] for _ in range(g.size)]
            query = goal = first_obs = official = None
            # the episode's starting query (goal + first observation): the retrieval query, and
            # with experience.key="episode_start" the key its distilled entries are stored under
            if manager is not None and (g.with_experience or x.key == "episode_start"):
                try:
                    obs, info = envs[0].reset(seed=g.seed)
                except Exception:  # noqa: BLE001 - the engine's own reset records the env error
                    obs, info = None, None
                if info is not None:
                    goal, first_obs = str(info.get("goal", "")), str(obs)
                    official = info.get("official_prompt")
                    query = retrieval_query(g.task.family, goal, first_obs, x.query,
                                            raw_obs=info.get("raw_obs"))
                    if g.with_experience and self.memory_ready(phase, step):
                        retrieved[:g.with_experience] = manager.retrieve(
                            [query] * g.with_experience, family=g.task.family)
            for i, env in enumerate(envs):
                entries = retrieved[i]
                meta = {"family": g.task.family, "env_id": g.task.env_id, "phase": phase, "step": step}
                if query is not None:
                    meta["query"] = query
                specs.append(EpisodeSpec(
                    env=env, seed=g.seed, options=None, group_id=g.group_id, task_name=g.task.name,
                    with_experience=i < g.with_experience, experience_ids=[e.id for e in entries],
                    experience_text="\n".join(e.render() for e in entries),
                    meta=meta))
                if self.experience.gate and entries:
                    gates.append((specs[-1], self.task_prompt(goal, first_obs, official)))
        if gates:
            self.run_gate(gates)
        return specs

    def task_prompt(self, goal: Any, first_obs: Any, official: dict | None) -> str:
        """The gate's "initial task prompt". Under ``rollout.prompt_layout=official``, for an env
        that gives its official prompt pieces, the official actor-critic's (``mixin.py:576-592``):
        the system template, the env instruction and the turn template around the first
        observation with the tool text when Search-and-Ask is offered (the official tool wrapper
        adds it at reset, ``tool_env_wrapper.py:23-28``); else ``Goal: ...\nObservation: ...``."""
        from crl_bench.llm.prompting import official_task_prompt, official_tool_text

        prompt = self.prompt_config()
        if prompt.layout == "official" and official:
            asks = self.experience.search_ask and prompt.max_asks > 0
            tool = official_tool_text(prompt.ask_tag, prompt.max_asks) if asks else ""
            return official_task_prompt(official, f"{first_obs}{tool}")
        return f"Goal: {goal}\nObservation: {first_obs}"

    def memory_ready(self, phase: str, step: int) -> bool:
        """Whether the memory warm-up is over: ``experience.memory_warmup`` training steps have
        ended (official: retrieval, for training and evaluation, only once the manager was
        notified ``memory_warmup_interval`` times, once at the end of each warm-up step,
        ``mgr.py:3168-3174``, ``pipeline.py:1499-1502``, read by ``mixin.py:740-747``). A
        training play at step s follows s - 1 ended steps, the step's evaluation s. Before: the
        with-experience episodes play without entries (they are still distilled)."""
        ended = step - 1 if phase == "train" else step
        return ended >= self.info.cfg.experience.memory_warmup

    def run_gate(self, gates: list[tuple[Any, str]]) -> None:
        """The accept / refine / reject gate (:mod:`crl_bench.extractor.gate`): one batched actor
        call judges the entry each with-experience episode was given; the verdict sets what the
        episode is shown (``experience_text``) and, through ``meta["gate"]``, the credit it gives
        (:func:`~crl_bench.algorithms.credit.gate_credit`). Unparseable: nothing shown, no credit."""
        from crl_bench.extractor.gate import gate_messages, parse_gate
        from crl_bench.training.role_trainer import timed

        backend = self.models.backend
        prompts = []
        for spec, task_prompt in gates:
            total, n = self.task_scores.get(spec.task_name, (0.0, 0))
            prompts.append(backend.chat_prompt_ids(gate_messages(
                task_prompt, spec.experience_text, total / max(n, 1), int(n))))
        with timed(self.info.timings, "timing_s/gate"):
            generations = backend.generate(prompts, self.models.actor_sampling, adapter="actor")
        for (spec, _), gen in zip(gates, generations):
            decision = parse_gate(gen.text, spec.experience_text)
            self.experience.count(f"gate_{decision.verdict or 'invalid'}")  # run totals
            spec.meta["gate"] = decision.verdict
            spec.experience_text = decision.knowledge
            if decision.verdict is None:  # official: memory_uids = [] (nothing shown)
                if self.info.cfg.experience.gate_invalid_credit:  # writers still credited (score)
                    spec.meta["credit_ids"] = list(spec.experience_ids)
                spec.experience_ids = []

    # -- playing -------------------------------------------------------------------------------
    def engine(self, ask: Any, seed: int, temperature: float | None = None) -> Any:
        """The rollout engine of one play call, sampling with ``seed`` (and ``temperature``
        instead of the rollout's when given)."""
        from crl_bench.llm.rollout import RolloutEngine

        cfg = self.info.cfg
        x = cfg.experience
        sampling = dataclasses.replace(self.models.actor_sampling, seed=seed)
        if temperature is not None:
            sampling = dataclasses.replace(sampling, temperature=temperature)
        prompt = self.prompt_config()
        # experience.ask_offer="with_experience": Search-and-Ask is not even offered to
        # without-experience episodes; "all": offered to every episode (official tool wrapper)
        return RolloutEngine(self.models.backend, sampling, prompt, adapter="actor",
                             ask_callback=ask, progress=False,
                             on_progress=self.info.progress.on_play_progress,
                             ask_requires_experience=x.ask_offer != "all",
                             ask_on_last_turn=x.ask_on_last_turn,
                             action_patterns=cfg.rollout.action_patterns)

    def prompt_config(self) -> Any:
        """The actor's :class:`~crl_bench.llm.prompting.PromptConfig` from the run's settings."""
        from crl_bench.llm.rollout import PromptConfig

        r, x = self.info.cfg.rollout, self.info.cfg.experience
        kwargs = dict(history=r.history, think=r.think, max_episode_tokens=r.max_episode_tokens,
                      sequence_length=r.sequence_length or None, ask_style=x.ask_style,
                      format_penalty=r.format_penalty, max_asks=x.max_asks,
                      conversation=r.conversation, observation_last=r.observation_last,
                      experience_last=r.experience_last, layout=r.prompt_layout,
                      experience_place=r.experience_place,
                      max_observation_chars=r.max_observation_chars or None,
                      ask_tag=x.ask_tag, ask_wins=x.ask_wins, stop_at_answer=r.stop_at_answer,
                      ask_answer_role=x.ask_answer_role)
        if r.small_model_prompt:
            kwargs.pop("think")
            prompt = PromptConfig.for_small_model(example_pick=r.example_pick, **kwargs)
        else:
            prompt = PromptConfig(**kwargs)
        return prompt

    def play(self, phase: str, step: int, plan: list[GroupPlan], *,
             sampling_seed: int | None = None) -> list[Any]:
        """Play every episode of ``plan`` concurrently (one batched model call per turn), with
        the phase's sampling seed (:func:`~crl_bench.run.parts.seeds.sampling_seed`) unless
        ``sampling_seed`` is given.

        With Search-and-Ask on the with-experience episodes may query the bank; on training
        episodes of a trained extractor the asks become extractor samples credited with the
        asking episode's score."""
        from crl_bench.training.role_trainer import timed

        info, exp = self.info, self.experience
        exp.wait_for_bank(merge=phase == "train")  # evaluation never merges (at most once a step)
        if phase == "train" and exp.extractor is not None:  # how old the bank this rollout reads is
            info.timings["extractor/bank_lag_steps"] = exp.extractor.bank_lag(step)
        specs = self.episode_specs(phase, step, plan)
        callback, ask_samples = self.ask_callback(
            exp.search_ask, record=(phase == "train" and exp.trainer is not None))
        info.progress.begin_play("playing" if phase == "train" else "evaluating", len(specs))
        with timed(info.timings, f"timing_s/{'rollout' if phase == 'train' else 'eval_rollout'}"):
            seed = (phase_sampling_seed(info.cfg.seed, step, phase) if sampling_seed is None
                    else sampling_seed)
            temperature = None if phase == "train" else info.cfg.eval.temperature
            trajectories = self.engine(callback, seed, temperature).run(specs)
        info.progress.end_play()
        for spec, traj in zip(specs, trajectories):
            traj.meta.update(spec.meta)
            if phase == "train":  # the gate's historical performance per task
                acc = self.task_scores.setdefault(traj.task_name, [0.0, 0])
                acc[0] += float(traj.score)
                acc[1] += 1
            samples = ask_samples.get(id(spec), [])
            if samples and exp.extractor is not None:
                exp.extractor.add_ask_samples(samples, traj.score)
        return trajectories

    def ask_callback(self, enabled: bool, record: bool) -> tuple[Any, dict[int, list[Any]]]:
        """Search-and-Ask for one play call (None when off) and, per episode, the extractor
        samples its asks made (``record``: kept for training)."""
        exp = self.experience
        if not enabled or exp.manager is None:
            return None, {}
        from crl_bench.extractor.search_ask import SearchAndAsk
        from crl_bench.extractor.track import ExtractorSample
        from crl_bench.training.role_trainer import timed

        x = self.info.cfg.experience
        saa = SearchAndAsk(exp.manager, exp.generate, k=x.ask_k, style=x.ask_style)
        by_episode: dict[int, list[ExtractorSample]] = {}

        def ask(query: str, spec: Any, context: dict[str, Any]) -> str:
            if not spec.with_experience and x.ask_offer != "all":
                return "Searching the experience library is not available in this episode."
            before = len(saa.samples)
            with timed(self.info.timings, "timing_s/ask"):  # the actor's time in Search-and-Ask
                answer = saa(query, {"goal": context.get("goal", ""),
                                     "observation": context.get("observation", ""),
                                     "family": spec.meta.get("family"), "task_id": str(spec.seed)})
            if record and spec.with_experience:  # only with-memory asks are trained (official)
                for rec in saa.samples[before:]:
                    gen = rec.generation
                    by_episode.setdefault(id(spec), []).append(ExtractorSample(
                        list(gen.prompt_ids), list(gen.completion_ids), list(gen.logprobs),
                        kind="ask", created_step=self.info.step, malformed=bool(rec.malformed)))
            return answer
        return ask, by_episode

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self, folder: Path) -> dict[str, Any]:
        return {"task_scores": {k: list(v) for k, v in self.task_scores.items()}}

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        if isinstance(state.get("task_scores"), dict):
            self.task_scores = {k: list(v) for k, v in state["task_scores"].items()}

    def close(self) -> None:
        for envs in self._envs.values():
            for env in envs:
                env.close()
