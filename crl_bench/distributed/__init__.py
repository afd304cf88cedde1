"""Scale-out on Ray (optional extra ``ray``): env workers, generation engines, data-parallel
learner ranks and the experience service as Ray actors.

The single-process runner stays the default and the reference; everything here is built so that
a synchronous Ray run plays and trains exactly what the single-process run does. Only Ray's own
mechanisms are used (actors, placement groups, the object store, actor restarts); there is no
scheduler, RPC layer or launcher of our own. See ``docs/scaling.md``.

Modules (import them directly; this package imports nothing heavy):

* :mod:`~crl_bench.distributed.plan`: resource plans and the start-up check against the cluster;
* :mod:`~crl_bench.distributed.env_workers`: env worker actors, the driver-side env proxies and
  replay of a dead worker's episodes;
* :mod:`~crl_bench.distributed.learner`: the learner as data-parallel ranks (gloo / NCCL);
* :mod:`~crl_bench.distributed.generation`: the generation engine actor and its driver proxy;
* :mod:`~crl_bench.distributed.experience`: the experience service and the extractor track actors.
"""

from __future__ import annotations

import functools
from typing import Any


def require_ray():
    """``import ray``, or a clear error saying how to get it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("Ray is not installed: pip install 'crl-bench[ray]' "
                          "(or pip install 'ray==2.60.0').") from exc
    return ray


@functools.cache
def remote_class(impl: type) -> Any:
    """``ray.remote(impl)``, made once per class (after ``import ray``, so importing a module of
    this package never imports Ray)."""
    return require_ray().remote(impl)
