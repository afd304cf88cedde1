"""The models of a run: the generation/training backend(s) of the actor and extractor roles and
their sampling settings.

One base model with an ``actor`` adapter (and an ``extractor`` adapter, or one adapter both roles
share), or, when ``model.extractor`` names another model (the paper: Qwen3-4B beside a
Qwen2.5-7B actor), one backend per role. Roles that share a backend take turns behind one lock;
the time the actor loop waited for it while the extractor held it is logged as
``timing_s/extractor_wait``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crl_bench.llm.roles import LockedBackend, WaitTimingLock, extractor_generate
from crl_bench.run.parts.base import Part, RunInfo

__all__ = ["LockedBackend", "Models", "WaitTimingLock", "engine_settings", "extractor_generate"]


def engine_settings(cfg: Any, role: str) -> dict[str, Any]:
    """The generation engine settings of ``role`` ("actor" / "extractor") from a ``RunConfig``:
    ``max_model_len`` (``model.<role>_max_model_len``; 0: the actor's longest episode,
    ``rollout.max_episode_tokens``, and for the extractor that plus its answer,
    ``extractor.max_new_tokens``), ``gpu_memory_utilization`` and ``tensor_parallel_size``
    (``model.<role>_gpu_memory_utilization`` / ``_tensor_parallel``). The ``vllm`` backend is
    built with them (in one process and on Ray's engine actors); an engine shorter than the
    role's longest sequence is refused here, before anything loads (vLLM would refuse the first
    long prompt mid-run)."""
    from crl_bench.config.schema import ConfigError

    if role not in ("actor", "extractor"):
        raise ValueError(f"role must be 'actor' or 'extractor', got {role!r}")
    m, r = cfg.model, cfg.rollout
    longest = r.max_episode_tokens + (cfg.extractor.max_new_tokens if role == "extractor" else 0)
    max_len = int(getattr(m, f"{role}_max_model_len")) or longest
    if role == "actor" and max_len < r.max_episode_tokens:
        raise ConfigError(f"model.actor_max_model_len={max_len} is shorter than an episode "
                          f"(rollout.max_episode_tokens={r.max_episode_tokens}): the engine "
                          f"would refuse the episode's last prompts. Use --set "
                          f"model.actor_max_model_len={r.max_episode_tokens} (or 0).")
    return {"max_model_len": max_len,
            "gpu_memory_utilization": float(getattr(m, f"{role}_gpu_memory_utilization")),
            "tensor_parallel_size": int(getattr(m, f"{role}_tensor_parallel"))}



def role_sampling(cfg: Any) -> tuple[Any, Any]:
    """The actor's and the extractor's sampling settings from the run's configuration (the
    extractor stops at its answer's close); one source for every form of the models part."""
    from crl_bench.llm.types import SamplingParams

    r, e = cfg.rollout, cfg.extractor
    actor = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                           max_new_tokens=r.max_new_tokens)
    extractor = SamplingParams(temperature=e.temperature, top_p=e.top_p, top_k=e.top_k,
                               max_new_tokens=e.max_new_tokens, stop=("</answer>",))
    return actor, extractor

class Models(Part):
    """The roles' backends. ``raw_backend`` / ``ext_raw``: the actor's and the extractor's
    backend (the same object when one model serves both); ``backend`` / ``ext_backend``: the
    same behind :attr:`lock`; ``actor_sampling`` / ``extractor_sampling``: the roles' sampling
    settings. Its checkpoint files: the adapters (``adapters/``, and ``extractor_adapters/`` for
    a separate extractor model)."""

    name = "models"

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self.lock = WaitTimingLock()
        self.raw_backend: Any = None
        self.ext_raw: Any = None
        self.backend: Any = None
        self.ext_backend: Any = None
        self.actor_sampling: Any = None
        self.extractor_sampling: Any = None

    def build(self, *, extractor: bool, shared_params: bool = False) -> None:
        """Load the model(s); ``extractor``: the extractor role too; ``shared_params``: one
        adapter both roles train (the shared-parameters ablation; ``model.extractor`` unused)."""
        from crl_bench.llm.backend import backend_class
        from crl_bench.llm.types import LoraSpec

        cfg = self.info.cfg
        m = cfg.model
        backend_cls = backend_class(m.backend)
        # lora_r=0: full fine-tuning (the official runs train every parameter of both models)
        lora = LoraSpec(r=m.lora_r, alpha=m.lora_alpha) if m.lora_r > 0 else None
        common: dict[str, Any] = dict(lora=lora, dtype=m.dtype, device=m.device, seed=cfg.seed)
        if m.backend == "hf":
            common["max_batch_size"] = m.max_batch_size
        roles = ("actor", "extractor") if extractor else ("actor",)
        actor_kw, ext_kw = dict(common), dict(common)
        if m.backend == "vllm":  # the engines' settings come from the config
            actor_kw.update(engine_settings(cfg, "actor"))
            ext_kw.update(engine_settings(cfg, "extractor"))
        if extractor and m.extractor and m.extractor != m.actor and not shared_params:
            self.raw_backend = backend_cls(m.actor, roles=("actor",), **actor_kw)
            self.ext_raw = backend_cls(m.extractor, roles=("extractor",), **ext_kw)
        else:
            self.raw_backend = backend_cls(m.actor, roles=roles, shared_adapter=shared_params,
                                           **actor_kw)
            self.ext_raw = self.raw_backend
        self.backend = LockedBackend(self.raw_backend, self.lock)
        self.ext_backend = (self.backend if self.ext_raw is self.raw_backend
                            else LockedBackend(self.ext_raw, self.lock))
        self.actor_sampling, self.extractor_sampling = role_sampling(cfg)

    def extractor_generate(self, message_lists: list[list[dict]], stop: tuple[str, ...] = ()
                           ) -> list[Any]:
        """The extractor role (see :func:`extractor_generate`)."""
        return extractor_generate(self.ext_backend, self.extractor_sampling, message_lists, stop)

    def state_dict(self, folder: Path) -> dict[str, Any]:
        with self.lock:
            self.raw_backend.save_adapters(folder / "adapters")
            if self.ext_raw is not self.raw_backend:
                self.ext_raw.save_adapters(folder / "extractor_adapters")
        return {}

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        self.raw_backend.load_adapters(folder / "adapters")
        if self.ext_raw is not self.raw_backend:
            self.ext_raw.load_adapters(folder / "extractor_adapters")
