"""Registration of the alfworld envs (cheap: nothing heavy is imported here).

* ``crl/ALFWorld-v0`` - all six task types, ``split="train"`` by default (``crl_bench.mixes``
  trains on it and evaluates with ``split="valid_unseen"``);
* ``crl/ALFWorld-ValidSeen-v0``, ``crl/ALFWorld-ValidUnseen-v0`` (the 134 evaluation games),
  ``crl/ALFWorld-ValidTrain-v0`` - the other splits;
* ``crl/ALFWorld-Pick-v0``, ``-Look-v0``, ``-Clean-v0``, ``-Heat-v0``, ``-Cool-v0``,
  ``-PickTwo-v0`` - one task type each (``split="train"`` unless overridden).
"""

from __future__ import annotations

ENTRY_POINT = "crl_bench.envs.alfworld.env:ALFWorldTextEnv"

SYSTEM_PROMPT = (
    'You are a household robot in a text-based home. Each turn you read what you observe and '
    'choose one command (go to, take, put, open, close, clean, heat, cool, use, examine...). '
    'Complete the task in as few steps as possible.')
"""The actor's system prompt for this family (``crl_bench.llm.prompting``)."""

_SPLIT_IDS = (
    ("crl/ALFWorld-v0", "train",
     ("ALFWorld text games, all 6 task types (split=train: 3,553 games; "
      "valid_seen/valid_unseen/valid_train), 50 steps, +1 on success")),
    ("crl/ALFWorld-ValidSeen-v0", "valid_seen",
     "ALFWorld valid_seen (140 games, seen rooms), 50 steps"),
    ("crl/ALFWorld-ValidUnseen-v0", "valid_unseen",
     "ALFWorld valid_unseen (134 games in unseen rooms: the usual evaluation set), 50 steps"),
    ("crl/ALFWorld-ValidTrain-v0", "valid_train",
     "ALFWorld valid_train (200 train-room games), 50 steps"),
)
_TASK_TYPE_IDS = (
    ("crl/ALFWorld-Pick-v0", "pick", "pick_and_place_simple"),
    ("crl/ALFWorld-Look-v0", "look", "look_at_obj_in_light"),
    ("crl/ALFWorld-Clean-v0", "clean", "pick_clean_then_place_in_recep"),
    ("crl/ALFWorld-Heat-v0", "heat", "pick_heat_then_place_in_recep"),
    ("crl/ALFWorld-Cool-v0", "cool", "pick_cool_then_place_in_recep"),
    ("crl/ALFWorld-PickTwo-v0", "pick_two", "pick_two_obj_and_place"),
)


def register() -> None:
    """Register this family's envs with crl-bench and gymnasium."""
    from crl_bench.registry import ENVS, goal_observation_query, register_env

    specs = [(env_id, {"split": split}, description) for env_id, split, description in _SPLIT_IDS]
    specs += [(env_id, {"split": "train", "task_types": [alias]},
               f"ALFWorld {name} games only (split=train by default), 50 steps")
              for env_id, alias, name in _TASK_TYPE_IDS]
    for env_id, kwargs, description in specs:
        if not ENVS.has_builtin(env_id):  # registering twice (re-import) is a no-op
            register_env(env_id, ENTRY_POINT, family="alfworld", system_prompt=SYSTEM_PROMPT, kwargs=kwargs,
                         # the official ALFWorld env manager's query (traj_env_manager_alfworld.py:
                         # 207-229): "Goal: {goal}\nObservation: {obs}"
                         retrieval_query=goal_observation_query,
                         description=description, extra="alfworld")
