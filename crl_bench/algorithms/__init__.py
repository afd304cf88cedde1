"""The method's formulas as pure tensor functions, registered by name.

- :mod:`crl_bench.algorithms.advantages` — episode outcome -> advantage inside task groups, with
  the paper's with/without-experience split; broadcast to completion tokens.
- :mod:`crl_bench.algorithms.losses` — PPO clipped surrogate, CISPO, k3 KL, entropy, and the
  token aggregation modes.
- :mod:`crl_bench.algorithms.credit` — extractor reward from the trajectories that used its
  output, extractor advantage, count-aware reweighting.

The two registries below are what configs name (``advantage="mean"``, ``loss="cispo"``). Their
entries are lazy import strings, so listing or validating names never imports torch; the
function modules themselves import torch at their top.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from crl_bench.algorithms.ranges import Range
from crl_bench.registry import Registry

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
"""How token losses become one number (:func:`crl_bench.algorithms.losses.aggregate`)."""

ADVANTAGES: Registry[Callable[..., Any]] = Registry("advantage estimator", "crl_bench.advantages")
"""name -> ``fn(scores[B], keys[B], *, eps) -> advantages[B]`` (see ``group_advantages``).
A plugin adds one with an entry point ``[project.entry-points."crl_bench.advantages"]
NAME = "pkg.module:function"``: every agent's ``--set actor.advantage=NAME`` then finds it."""

LOSSES: Registry[Callable[..., Any]] = Registry("policy loss", "crl_bench.losses")
"""name -> ``fn(logprobs, old_logprobs, advantages, mask, **options) -> (loss, metrics)``
(plugins: the entry-point group ``crl_bench.losses``)."""

ADVANTAGES.register("mean", "crl_bench.algorithms.advantages:mean_advantages",
                    description="subtract the group mean (the official code's choice)")
ADVANTAGES.register("mean_std", "crl_bench.algorithms.advantages:mean_std_advantages",
                    description="subtract the group mean, divide by the group std (GRPO paper)")
# ``defaults``: the loss's settings (its keyword arguments) when a role's ``loss_args`` says nothing;
# ``ranges``: the allowed values of its numeric settings, checked by the loss itself at each call
# and by the run configuration before anything is built (a plugin loss may declare its own)
LOSSES.register("ppo_clip", "crl_bench.algorithms.losses:ppo_clip_loss",
                description="PPO clipped surrogate, optional asymmetric and dual clip",
                defaults={"clip_eps": 0.2, "clip_eps_high": None, "dual_clip": None},
                ranges={"clip_eps": Range(0, 1, lo_open=True, hi_open=True),
                        "clip_eps_high": Range(0, 10, lo_open=True),
                        "dual_clip": Range(1, 1e6, lo_open=True, note="a cap in units of |A|; None: off")})
LOSSES.register("cispo", "crl_bench.algorithms.losses:cispo_loss",
                description="clipped stop-gradient IS weight x advantage x log-prob",
                defaults={"eps_low": 0.1, "eps_high": 0.1, "one_sided": False},
                ranges={"eps_low": Range(0, 1, lo_open=True, hi_open=True,
                                         note="ignored with one_sided"),
                        "eps_high": Range(0, 100, lo_open=True)})

__all__ = ["ADVANTAGES", "LOSSES", "Aggregation", "loss_arg_ranges"]


def loss_arg_ranges(name: str) -> dict[str, Range]:
    """The declared ranges of loss ``name``'s numeric settings (empty when it declares none)."""
    return dict(LOSSES.entry(name).metadata.get("ranges", {}))
