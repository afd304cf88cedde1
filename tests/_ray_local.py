"""One way to start the small local Ray cluster of a test module (no dashboard, one torch
thread per worker)."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def local_ray(num_cpus: int) -> Iterator[None]:
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        yield
    finally:
        ray.shutdown()
