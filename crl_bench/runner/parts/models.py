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
from crl_bench.runner.parts.base import Part, RunInfo

__all__ = ["LockedBackend", "Models", "WaitTimingLock", "extractor_generate"]


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
        from crl_bench.llm.types import LoraSpec, SamplingParams

        cfg = self.info.cfg
        m = cfg.model
        backend_cls = backend_class(m.backend)
        # lora_r=0: full fine-tuning (the official runs train every parameter of both models)
        lora = LoraSpec(r=m.lora_r, alpha=m.lora_alpha) if m.lora_r > 0 else None
        common: dict[str, Any] = dict(lora=lora, dtype=m.dtype, device=m.device, seed=cfg.seed)
        if m.backend == "hf":
            common["max_batch_size"] = m.max_batch_size
        roles = ("actor", "extractor") if extractor else ("actor",)
        if extractor and m.extractor and m.extractor != m.actor and not shared_params:
            self.raw_backend = backend_cls(m.actor, roles=("actor",), **common)
            self.ext_raw = backend_cls(m.extractor, roles=("extractor",), **common)
        else:
            self.raw_backend = backend_cls(m.actor, roles=roles, shared_adapter=shared_params, **common)
            self.ext_raw = self.raw_backend
        self.backend = LockedBackend(self.raw_backend, self.lock)
        self.ext_backend = (self.backend if self.ext_raw is self.raw_backend
                            else LockedBackend(self.ext_raw, self.lock))
        r, e = cfg.rollout, cfg.extractor
        self.actor_sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p,
                                             top_k=r.top_k, max_new_tokens=r.max_new_tokens)
        self.extractor_sampling = SamplingParams(temperature=e.temperature, top_p=e.top_p,
                                                 top_k=e.top_k, max_new_tokens=e.max_new_tokens,
                                                 stop=("</answer>",))

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
