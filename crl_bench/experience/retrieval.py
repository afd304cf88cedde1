"""How entries are retrieved: the one home of the retrieval settings, their defaults, their
ranges and their checks (torch-free, cheap to import). The run configuration holds a
:class:`RetrievalSettings` as its ``retrieval`` section (``--set retrieval.k=2``); the manager's
:class:`~crl_bench.experience.manager.RetrievalConfig` is these settings plus what the run decides
itself (the agent's diversification switch, the run's seed). The official defaults are cited in
the field docstrings (docs/fidelity.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from crl_bench.algorithms.ranges import Range

UsagePer = Literal["pick", "batch"]


def _ranged(default: Any, rng: Range) -> Any:
    """A field with its allowed range (read by :meth:`RetrievalSettings.check` and by the run
    configuration's validation)."""
    return field(default=default, metadata={"range": rng})


@dataclass
class RetrievalSettings:
    """The retrieval settings of a run (``retrieval.*``)."""

    k: int = _ranged(1, Range(1, 64))
    """Entries returned per query."""
    oversample: int = _ranged(16, Range(1, 1024, note="1: no extra candidates"))
    """Candidates fetched per returned entry, for diversification (k * oversample)."""
    lam: float = _ranged(0.4, Range(0, 1))
    """Weight of log(1 + times retrieved) in the diversification score."""
    recent_s: float = _ranged(300.0, Range(0, 1e9))
    """An entry retrieved less than this many seconds ago counts as recently retrieved. Seconds
    of the manager's clock: in a run that is the logical :func:`step_clock` (``step_s`` per actor
    step), so that a resumed run takes the same decisions as an uninterrupted one."""
    step_s: float = _ranged(300.0, Range(0, 1e9, lo_open=True))
    """Seconds one actor step stands for on the run's logical clock (:func:`step_clock`). An
    official step (16 groups x 8 multi-turn episodes of a 7B actor, then the update) takes longer
    than the official ``recent_s`` = 300 s, so with ``step_s = recent_s`` "retrieved recently"
    means "already retrieved in this step" (the K rollouts of a group and the step's other
    groups); an entry last retrieved ``d`` steps ago is recent iff ``d * step_s < recent_s``."""
    drop_recent_top1_p: float = _ranged(0.5, Range(0, 1, note="a probability"))
    """Probability of moving a recently retrieved top-1 to the end of the order."""
    batch_size: int = _ranged(32, Range(1, 1 << 16))
    """Most queries embedded and searched together."""
    batch_wait_ms: float = _ranged(5.0, Range(0, 60_000))
    """Longest a batch waits for more queries before it runs (milliseconds)."""
    query_cache: int = _ranged(4096, Range(0, 1 << 24, note="0: no cache"))
    """Query texts whose embeddings are kept (LRU): the K rollouts of a GRPO group, and every
    epoch over the same tasks, ask with the same goal text. 0 = no cache."""
    usage_per: UsagePer = "pick"
    """When retrieval usage counts are updated inside one retrieval batch: "pick" (each pick is
    seen by the next query of the batch: a group's rollouts spread over entries) or "batch"
    (official, ``async_memory_manager.py:907``: after the whole batch, every query of the batch
    ranks with the counts from before it, so a group's with-experience rollouts usually share
    one entry)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` naming the first setting outside its range or choices."""
        for f in dataclasses.fields(RetrievalSettings):
            value = getattr(self, f.name)
            rng = f.metadata.get("range")
            if rng is not None and value not in rng:
                raise ValueError(f"{f.name} must be {rng.describe(f.type == 'int')}, got "
                                 f"{value!r}")
        if self.usage_per not in ("pick", "batch"):
            raise ValueError(f"usage_per must be 'pick' or 'batch', got {self.usage_per!r}")


def setting_ranges(cls: type = RetrievalSettings) -> dict[str, Range]:
    """Each ranged field of ``cls`` -> its :class:`Range`."""
    return {f.name: f.metadata["range"] for f in dataclasses.fields(cls) if "range" in f.metadata}
