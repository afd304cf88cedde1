"""Where env data lives: an explicit path, an environment variable, the cache, or a download.

Resolution order for a family's data folder (``webshop``, ``alfworld``, ``swe``):

1. an explicit ``path`` argument (env constructor keyword ``data_dir=``);
2. the family's environment variable (``CRL_BENCH_WEBSHOP_DATA``, ...), or
   ``$CRL_BENCH_DATA/<family>``;
3. the cache, ``$CRL_BENCH_CACHE/data/<family>`` (default ``~/.cache/crl-bench/data/<family>``),
   filled by ``crl-bench`` downloads or by ``scripts/setup.sh``;
4. otherwise :class:`DataNotFoundError`, naming all three routes and the download command.
"""

from __future__ import annotations

import os
from pathlib import Path


class DataNotFoundError(FileNotFoundError):
    """The data folder of an env family could not be found; the message says how to get it."""


def cache_dir() -> Path:
    """Root of crl-bench's cache (converted models, unpacked games, search indexes)."""
    root = os.environ.get("CRL_BENCH_CACHE")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "crl-bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def env_var(family: str) -> str:
    return f"CRL_BENCH_{family.upper()}_DATA"


def resolve_data_dir(family: str, path: str | os.PathLike[str] | None = None, *,
                     required_files: tuple[str, ...] = (), download_hint: str = "") -> Path:
    """Return the data folder of ``family`` or raise :class:`DataNotFoundError`.

    Args:
        family: "webshop", "alfworld", "swe", ...
        path: an explicit folder (wins over everything else).
        required_files: names that must exist inside the folder for it to count.
        download_hint: the command that downloads the data (for users with the internet).
    """
    candidates: list[tuple[str, Path]] = []
    if path is not None:
        candidates.append(("argument data_dir", Path(path).expanduser()))
    if os.environ.get(env_var(family)):
        candidates.append((f"${env_var(family)}", Path(os.environ[env_var(family)]).expanduser()))
    if os.environ.get("CRL_BENCH_DATA"):
        candidates.append(("$CRL_BENCH_DATA", Path(os.environ["CRL_BENCH_DATA"]).expanduser() / family))
    candidates.append(("cache", cache_dir() / "data" / family))

    tried: list[str] = []
    for origin, folder in candidates:
        missing = [f for f in required_files if not (folder / f).exists()]
        if folder.is_dir() and not missing:
            return folder
        why = "does not exist" if not folder.is_dir() else f"lacks {', '.join(missing)}"
        tried.append(f"  - {origin}: {folder} ({why})")
        if origin == "argument data_dir":  # an explicit path that is wrong is an error, not a hint
            break
    hint = f"\n  3. download it: {download_hint}" if download_hint else ""
    raise DataNotFoundError(
        f"No {family} data found. Tried:\n" + "\n".join(tried) +
        f"\nGive it one of these ways:\n"
        f"  1. set {env_var(family)}=PATH (or CRL_BENCH_DATA=PARENT holding a '{family}' "
        f"folder) before `crl-bench run`; from Python, pass data_dir=PATH to the env;\n"
        f"  2. put or link the folder at {cache_dir() / 'data' / family}" + hint)
