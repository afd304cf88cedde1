"""Checksums of a checkpoint's files: written when the checkpoint is saved, checked before a
resume loads (or copies) anything from it.

``CHECKSUMS`` (``checksums.json`` in the checkpoint folder) lists every file of the folder,
sub-folders included, with its size and SHA-256. :func:`verify_manifest` re-reads each file and
raises :class:`ChecksumError` naming the first one that is missing, changed or was not part of
the checkpoint as it was written. A flipped byte in an adapter's safetensors would otherwise load
without a word and the run would go on from weights it never had.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

CHECKSUMS = "checksums.json"
_CHUNK = 1 << 20


class ChecksumError(RuntimeError):
    """A checkpoint file disagrees with the checksums written with it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} {why}")
        self.path = path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` as a relative POSIX path, sorted; the manifest itself aside."""
    out = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel != CHECKSUMS:
                out.append(rel)
    return sorted(out)


def write_manifest(folder: Path) -> Path:
    """Write ``folder/checksums.json`` for the files now in ``folder`` (complete or absent)."""
    folder = Path(folder)
    files = {rel: {"bytes": (folder / rel).stat().st_size, "sha256": file_sha256(folder / rel)}
             for rel in _files(folder)}
    path = folder / CHECKSUMS
    tmp = folder / f".{CHECKSUMS}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"algorithm": "sha256", "files": files}, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


ALLOW_UNCHECKED_ENV = "CRL_ALLOW_UNCHECKED_CHECKPOINT"
"""``1``: load a checkpoint that has no ``checksums.json`` (its files checked for format only)."""


def verify_manifest(folder: Path, allow_missing: bool | None = None) -> bool:
    """Check every file of ``folder`` against its ``checksums.json``.

    Returns True when every file matches; False when the folder has no manifest and that is
    allowed (``allow_missing``, or ``CRL_ALLOW_UNCHECKED_CHECKPOINT=1`` when None: a checkpoint
    written before checksums were kept, loaded on the user's word).

    Raises:
        ChecksumError: the manifest is missing (and not allowed: a deleted manifest would
            otherwise turn every check off) or unreadable, or a file is missing, has another
            size or content, or is not listed (added after the checkpoint was written).
    """
    folder = Path(folder)
    path = folder / CHECKSUMS
    if not path.exists():
        if allow_missing is None:
            allow_missing = os.environ.get(ALLOW_UNCHECKED_ENV) == "1"
        if allow_missing:
            return False
        raise ChecksumError(path, f"is missing, so the checkpoint's files cannot be checked (it "
                                  "was deleted, or the checkpoint predates checksums). To load it "
                                  f"anyway, checked for format only, set {ALLOW_UNCHECKED_ENV}=1")
    try:
        data: Any = json.loads(path.read_text())
        listed = data["files"]
        if data.get("algorithm") != "sha256" or not isinstance(listed, dict):
            raise ValueError("not a sha256 manifest")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ChecksumError(path, f"cannot be read ({type(exc).__name__}: {exc}), so the "
                                  "checkpoint's files cannot be checked") from None
    for rel in sorted(listed):
        entry = listed[rel]
        file = folder / rel
        if not file.is_file():
            raise ChecksumError(file, "is missing (it was written with the checkpoint)")
        size = file.stat().st_size
        if size != entry.get("bytes"):
            raise ChecksumError(file, f"has {size} bytes, not the {entry.get('bytes')} written "
                                      "with the checkpoint: it was changed or truncated since")
        if file_sha256(file) != entry.get("sha256"):
            raise ChecksumError(file, "does not match the SHA-256 written with the checkpoint: "
                                      "its content changed after it was written")
    for rel in _files(folder):
        if rel not in listed:
            raise ChecksumError(folder / rel, "was not part of the checkpoint when it was written")
    return True


def write_file_checksum(path: Path) -> Path:
    """Write ``PATH.sha256`` (``<hex digest>  <name>``, as ``sha256sum`` writes it) for one file
    kept outside a checkpoint folder (the run's bank as it started)."""
    path = Path(path)
    side = path.with_name(path.name + ".sha256")
    tmp = path.with_name(f".{side.name}.tmp")
    tmp.write_text(f"{file_sha256(path)}  {path.name}\n")
    os.replace(tmp, side)
    return side


def verify_file_checksum(path: Path) -> bool:
    """Check ``path`` against its ``PATH.sha256``; False when there is none (an older run).

    Raises:
        ChecksumError: the file's content is not the one its checksum was written for.
    """
    path = Path(path)
    side = path.with_name(path.name + ".sha256")
    if not side.exists():
        return False
    want = side.read_text().split(maxsplit=1)[0] if side.read_text().strip() else ""
    if file_sha256(path) != want:
        raise ChecksumError(path, f"does not match the SHA-256 in {side.name}: its content "
                                  "changed after it was written")
    return True


# -- the run's fingerprint (its identity and training fields as it started) ---------------------

def fingerprint_fields(cfg: Any) -> dict[str, Any]:
    """``cfg`` flattened to dotted names (``actor.lr``, ``method.merge``), without ``steps``
    (``--steps`` may extend a run) and the settings a resume may change (``threads``, ...)."""
    from crl_bench.config.schema import RESUMABLE_OVERRIDES

    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key in sorted(value, key=str):
                walk(f"{prefix}.{key}" if prefix else str(key), value[key])
        else:
            flat[prefix] = value

    walk("", cfg.to_dict())
    for key in ("steps", *RESUMABLE_OVERRIDES):
        flat.pop(key, None)
    return json.loads(json.dumps(flat, sort_keys=True, default=str))


def fingerprint_digest(fields: dict[str, Any]) -> str:
    """The SHA-256 of the fingerprint's fields (canonical JSON)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def checkpoint_fingerprint(cfg: Any) -> dict[str, Any]:
    """What a checkpoint records of the run's fingerprint (in its ``loop_state.json``, covered
    by the checkpoint's ``checksums.json``): ``{"sha256", "fields"}``. A resume from the
    checkpoint compares ``config.json`` with it even when ``fingerprint.json`` is gone."""
    fields = fingerprint_fields(cfg)
    return {"sha256": fingerprint_digest(fields), "fields": fields}
