"""One way to start the small local Ray cluster of a test module (no dashboard, one torch
thread per worker).

The cluster is private: ``address="local"`` always starts a new one and never joins another
(``ray.init()`` without an address would join the cluster named in RAY_ADDRESS or in
``/tmp/ray/ray_current_cluster``, which ``ray start`` and ``ray.cluster_utils.Cluster`` write and
a killed run leaves behind)."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def local_ray(num_cpus: int) -> Iterator[None]:
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        yield
    finally:
        ray.shutdown()
