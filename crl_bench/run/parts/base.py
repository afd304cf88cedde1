"""The run information every part reads and the part interface."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from crl_bench.mixes import MixTask
    from crl_bench.config.schema import RunConfig
    from crl_bench.records.files import RunDir


@dataclass
class RunInfo:
    """What every part of one run reads: the config, the run folder, the tasks, the step being
    played, the step's timings (``timing_s/...``, the loop writes and clears them) and the
    progress line."""

    cfg: "RunConfig"
    run: "RunDir"
    tasks: tuple["MixTask", ...]
    step: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    progress: Any = None


class Part:
    """One job of a run. Subclasses set :attr:`name` (the key of its checkpoint state)."""

    name = ""

    def before_checkpoint(self) -> None:
        """Bring what another process holds (a learner's or a worker's newest weights) into this
        process before any part's state is taken."""

    def state_dict(self, folder: Path) -> dict[str, Any]:
        """The part's checkpoint state; large state (adapters, the bank) goes to files in
        ``folder``, the checkpoint being written."""
        return {}

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        """Restore :meth:`state_dict`'s ``state`` (and its files in ``folder``)."""

    def close(self) -> None:
        """Release what the part holds (threads, envs, files)."""
