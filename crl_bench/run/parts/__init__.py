"""The parts of a run: each one job, its own checkpoint state, built once per run.

=================  ===========================================================================
part               job
=================  ===========================================================================
:class:`Seeds`     the run seed in every RNG, torch's thread count; the RNG state
:class:`Models`    the generation/training backend(s) of the roles, their sampling settings
:class:`Player`    the step's task groups, the envs, retrieval at the episode start, the gate,
                   playing the episodes
:class:`ActorSide` returns, advantages and the actor's update (its optimiser)
:class:`ExperienceSide` the bank and its manager, the extractor track and its trainer
=================  ===========================================================================

A part's checkpoint state is :meth:`Part.state_dict` (small values, tensors allowed) plus the
files it writes into the checkpoint folder (adapters, the bank); the loop saves and restores a
run by looping over :attr:`RunContext.parts <crl_bench.run.context.RunContext.parts>`. A
distributed run swaps in remote implementations of the same parts
(:func:`crl_bench.distributed.context.ray_context`).
"""

from __future__ import annotations

from crl_bench.run.parts.base import Part, RunInfo
from crl_bench.run.parts.seeds import Seeds
from crl_bench.run.parts.models import Models, WaitTimingLock, LockedBackend
from crl_bench.run.parts.experience import ExperienceSide
from crl_bench.run.parts.player import GroupPlan, Player
from crl_bench.run.parts.actor import ActorSide

__all__ = ["ActorSide", "ExperienceSide", "GroupPlan", "LockedBackend", "Models", "Part",
           "Player", "RunInfo", "Seeds", "WaitTimingLock"]
