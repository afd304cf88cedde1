"""The run's randomness: the run seed in every RNG, torch's thread count; the RNG state."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from crl_bench.run.parts.base import Part, RunInfo


def train_seed(run_seed: int, index: int, eval_seed_offset: int) -> int:
    """The env seed of a run's ``index``-th training group (``step * groups + group``).

    ``run_seed * 1_000_003 + index`` (runs of different seeds play disjoint level ranges for
    their first million groups), moved past the block of seeds reserved for evaluation,
    ``[eval_seed_offset, eval_seed_offset + EVAL_SEED_BLOCK)``, when it would land in or after
    it: no training episode of any run seed plays a held-out level. (Before, run seed 1 trained
    on seeds 1,000,003 and up, i.e. on the evaluation's own levels 3, 4, ....) The shift is the
    same for every seed past the offset, so the map stays one-to-one; run seed 0 is unchanged.
    """
    from crl_bench.mixes import EVAL_SEED_BLOCK

    raw = run_seed * 1_000_003 + index
    return raw + EVAL_SEED_BLOCK if raw >= eval_seed_offset else raw


def sampling_seed(run_seed: int, step: int, phase: str = "train") -> int:
    """The sampling seed of a step's episodes: ``run_seed * 7919 + step`` for training, and for
    the evaluation at ``step`` the same moved by 10,007. Each run seed samples its own actions
    (runs of different seeds are independent replicates, so a confidence interval over seeds
    means something) on the same held-out task instances, and an evaluation's seed never equals
    a training step's seed within 10,007 steps."""
    base = run_seed * 7919 + step
    return base if phase == "train" else 10_007 + base


class Seeds(Part):
    """Seeds Python's, NumPy's and torch's RNGs with the run seed and sets torch's thread count
    (``threads``); its checkpoint state is the three RNG states."""

    name = "rng"

    def __init__(self, info: RunInfo) -> None:
        self.info = info

    def seed_everything(self) -> None:
        import numpy as np
        import torch

        cfg = self.info.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

    def state_dict(self, folder: Path) -> dict[str, Any]:
        import numpy as np
        import torch

        return {"python": random.getstate(), "numpy": np.random.get_state(),
                "torch": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        import numpy as np
        import torch

        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
