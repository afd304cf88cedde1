"""The experience extractor, in one package.

- :mod:`crl_bench.extractor.extraction` — the extraction prompt (goal, trajectory, outcome,
  retrieved entries) and the strict parser of its ``add`` / ``update`` / ``return`` operations;
- :mod:`crl_bench.extractor.search_ask` — Search-and-Ask: retrieval + the extractor's rewrite of
  the hits into guidance for the actor, mid-episode;
- :mod:`crl_bench.extractor.merge` — the periodic merge: prompt, parser and the walk that applies
  it to the bank;
- :mod:`crl_bench.extractor.track` — the track that runs all of it beside the actor loop, keeps
  the one usage ledger (which trajectories used which entries, with what outcome), credits the
  extractor's samples and trains it with CISPO (formulas in :mod:`crl_bench.algorithms.credit`).

Nothing is imported here: ``import crl_bench.extractor`` stays cheap.
"""
