"""The webshop text-env family: WebShop (Yao et al., 2022) in-process, on its 1,000-product set.

Envs (registered by :mod:`.registration`, made with ``gymnasium.make``):

* ``crl/WebShop-v0`` - WebShop's synthetic goals; ``split="train"`` (goals 1500+), ``"dev"``
  (500-1499), ``"test"`` (0-499) or ``"all"``; ``max_steps=15``;
* ``crl/WebShop-Human-v0`` - the 13 human-written goals of these products (``split="all"``).

Modules:

* :mod:`.env` - ``WebShopTextEnv`` (the gymnasium contract, observations, admissible actions);
* :mod:`.engine` - the site as a state machine (pages, clickables, purchase);
* :mod:`.search` - BM25 over WebShop's index documents with ``bm25s`` (Lucene's scoring);
* :mod:`.goals` - WebShop's goal generation (seed 233) and split;
* :mod:`.reward` - WebShop's ``get_reward``, one function per component;
* :mod:`.data` - the data folder (``CRL_BENCH_WEBSHOP_DATA``) and in-process loading;
* :mod:`.download` - WebShop's own download route (``python -m crl_bench.envs.webshop.download``);
* :mod:`.oracle` - a policy that knows the goal product and acts through text actions.

Only :mod:`.registration` is imported by ``import crl_bench``.
"""
