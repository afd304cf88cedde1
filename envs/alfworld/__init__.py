"""The alfworld text-env family: ALFWorld's household games (Shridhar et al., 2021) in TextWorld.

Envs (registered by :mod:`.registration`, made with ``gymnasium.make``):

* ``crl/ALFWorld-v0`` - all six task types; ``split="train"`` (3,553 games), ``"valid_seen"``
  (140), ``"valid_unseen"`` (134, the evaluation set) or ``"valid_train"`` (200);
  ``task_types=`` filter; ``max_steps=50``; ``timeout_penalty=0.0``;
* ``crl/ALFWorld-ValidSeen-v0`` / ``-ValidUnseen-v0`` / ``-ValidTrain-v0`` - the other splits;
* ``crl/ALFWorld-Pick-v0`` / ``-Look-v0`` / ``-Clean-v0`` / ``-Heat-v0`` / ``-Cool-v0`` /
  ``-PickTwo-v0`` - one task type each.

Data: ``$CRL_BENCH_ALFWORLD_DATA`` (or ``data_dir=``) pointing at the split archives or at an
extracted ``json_2.1.1`` tree; with the internet, ``alfworld-download`` (ALFWorld's own command)
fills ``$ALFWORLD_DATA``, which is found without further setup. Needs the ``alfworld`` extra
(``textworld[pddl]``, whose Fast Downward planner compiles from source, and ``alfworld``).

Modules:

* :mod:`.env` - ``ALFWorldTextEnv`` (the gymnasium contract, reward, task ids, prefetching);
* :mod:`.games` - locating and unpacking the data, the game index, task types;
* :mod:`.engine` - TextWorld's PDDL engine with games prepared once and shared (LRU + background
  thread), resets without re-translation, memoized grammar parses;
* :mod:`.expert` - the stored walkthroughs (and TextWorld's planner) replayed through the env.

Only :mod:`.registration` is imported by ``import crl_bench``.
"""
