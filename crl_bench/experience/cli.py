"""``crl-bench bank stats|show|search PATH``: read what a run has learned.

The bank is opened read-only: it never takes the writer lock, so this is safe while a run is
writing to it (and shows what the run has committed), it works on a folder this user cannot
write (e.g. a finished run shared read-only), and searching here does not count as a retrieval.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def configure(p: argparse.ArgumentParser) -> None:
    """Add the ``bank`` actions to the ``crl-bench bank`` subparser."""
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="bank_action", metavar="ACTION")

    s = sub.add_parser("stats", help="size, families, usage and outcome totals of a bank")
    s.add_argument("path", help="bank file (SQLite), e.g. runs/<run>/bank.sqlite")
    s.add_argument("--verify", action="store_true",
                   help="also rebuild the ANN index and check it against the table")
    s.add_argument("--json", action="store_true", help="print JSON")

    s = sub.add_parser("show", help="print entries")
    s.add_argument("path", help="bank file (SQLite)")
    s.add_argument("--id", dest="ids", type=int, action="append", default=[],
                   help="entry id (repeatable); default: a page of entries")
    s.add_argument("--family", help="only this env family")
    s.add_argument("--order", default="id", choices=["id", "recent", "retrieved", "outcome"],
                   help="page order (default: id, oldest first)")
    s.add_argument("--limit", type=int, default=20)
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--json", action="store_true", help="print JSON lines")

    s = sub.add_parser("search", help="entries nearest to a query text")
    s.add_argument("path", help="bank file (SQLite)")
    s.add_argument("query", help="query text (e.g. a task goal)")
    s.add_argument("-k", type=int, default=5, help="number of entries (default 5)")
    s.add_argument("--family", help="only this env family")
    s.add_argument("--embedder", help="embedder name or folder (default: the one that built the "
                                      "bank)")
    s.add_argument("--json", action="store_true", help="print JSON lines")

    p.set_defaults(func=_dispatch, _bank_parser=p)


def _dispatch(args: argparse.Namespace) -> int:
    action = getattr(args, "bank_action", None)
    if action is None:
        args._bank_parser.print_help()
        return 2
    return {"stats": _cmd_stats, "show": _cmd_show, "search": _cmd_search}[action](args)


def _open(path: str, build_index: bool) -> Any:
    from crl_bench.experience.bank import ExperienceBank

    return ExperienceBank.open(path, read_only=True, build_index=build_index)


def _cmd_stats(args: argparse.Namespace) -> int:
    from crl_bench.experience.bank_files import file_bytes

    with _open(args.path, build_index=args.verify) as bank:
        totals = bank.totals()
        info: dict[str, Any] = {
            "path": str(bank.path), "schema_version": int(bank.meta["schema_version"]),
            "embedder": bank.embedder_name, "dim": bank.dim,
            "created": _when(float(bank.meta.get("created_at", "nan"))),
            "file_bytes": file_bytes(bank.path),
            "entries": len(bank), "families": bank.family_counts(), **totals,
            "top_retrieved": [{"id": e.id, "family": e.family, "title": e.title,
                               "times_retrieved": e.times_retrieved}
                              for e in bank.list_entries(order="retrieved", limit=5)],
        }
        if args.verify:
            info["problems"] = bank.verify()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"bank          {info['path']}")
        print(f"schema        v{info['schema_version']}   embedder {info['embedder'] or '?'} "
              f"(dim {info['dim']})   created {info['created']}")
        print(f"entries       {info['entries']}   file {info['file_bytes'] / 1e6:.1f} MB")
        for fam, n in info["families"].items():
            print(f"  {fam:<12}{n}")
        mean = info["mean_outcome"]
        print(f"retrievals    {info['times_retrieved']}   uses with outcome {info['n_used']} "
              f"(entries used: {info['entries_used']})   mean outcome "
              f"{'n/a' if mean != mean else f'{mean:+.3f}'}   times trained "
              f"{info['times_trained']}")
        if info["top_retrieved"]:
            print("most retrieved:")
            for e in info["top_retrieved"]:
                print(f"  #{e['id']:<6} {e['times_retrieved']:>6}x  [{e['family']}] {e['title']}")
        if args.verify:
            problems = info["problems"]
            print("verify        " + ("ok: table and index agree" if not problems
                                      else "PROBLEMS:\n  " + "\n  ".join(problems)))
    return 1 if args.verify and info["problems"] else 0


def _cmd_show(args: argparse.Namespace) -> int:
    with _open(args.path, build_index=False) as bank:
        if args.ids:
            entries = bank.get(args.ids)
            missing = sorted(set(args.ids) - {e.id for e in entries})
            if missing:
                print(f"no entries with ids {missing}", file=sys.stderr)
        else:
            entries = bank.list_entries(family=args.family, order=args.order, limit=args.limit,
                                        offset=args.offset)
        created = float(bank.meta.get("created_at", "nan"))
    for e in entries:
        if args.json:
            print(json.dumps(e.to_dict()))
        else:
            print(_format_entry(e, created))
    if not entries and not args.ids:
        print("(no entries)")
    return 0


def _cmd_search(args: argparse.Namespace) -> int:
    from crl_bench.experience.bank import read_meta
    from crl_bench.experience.embedder import load_embedder

    if args.k < 1:
        raise ValueError("-k must be >= 1")
    meta = read_meta(args.path)
    name = args.embedder or meta.get("embedder") or ""
    if not name:
        raise ValueError(f"{args.path} does not record its embedder: pass --embedder NAME")
    embedder = load_embedder(name)
    with _open(args.path, build_index=True) as bank:
        if embedder.dim != bank.dim:
            raise ValueError(f"embedder {name!r} gives {embedder.dim}-dim vectors, the bank "
                             f"holds {bank.dim}-dim ones: pass the bank's embedder "
                             f"({bank.embedder_name})")
        hits = bank.search(embedder.encode([args.query]), args.k, family=args.family)[0]
        entries = {e.id: e for e in bank.get([i for i, _ in hits])}
        created = float(bank.meta.get("created_at", "nan"))
    for entry_id, sim in hits:
        e = entries.get(entry_id)
        if e is None:
            continue
        if args.json:
            print(json.dumps({"similarity": sim, **e.to_dict()}))
        else:
            print(f"similarity {sim:.3f}\n{_format_entry(e, created)}")
    if not hits:
        print("(no entries)")
    return 0


def retrieved_when(last: float | None, created_at: float, step_s: float | None = None) -> str:
    """When an entry was last retrieved, as the bank's clock recorded it. A run's bank runs on
    the run's logical clock (the bank's creation time + step x ``step_s`` seconds,
    ``crl_bench.experience.manager.step_clock``): such a time is shown as the step it stands for,
    never as a wall time; any other time (a bank used outside a run) as the date."""
    if last is None:
        return "never"
    if step_s is None:
        from crl_bench.experience.manager import RetrievalConfig

        step_s = RetrievalConfig().step_s
    if created_at == created_at:  # not NaN
        steps = (last - created_at) / step_s
        if steps >= 0 and abs(steps - round(steps)) < 1e-6:
            return f"at step {round(steps)}"
    return _when(last)


def _format_entry(e: Any, created_at: float = float("nan")) -> str:
    outcome = (f"mean outcome {e.mean_outcome:+.2f} over {e.n_used} uses" if e.n_used
               else "not used yet")
    last = retrieved_when(e.last_retrieved, created_at)
    lines = [f"#{e.id} [{e.family}] {e.title}",
             f"    {e.content}",
             f"    retrieved {e.times_retrieved}x (last {last}); {outcome}; trained "
             f"{e.times_trained}x; steps {e.created_step}->{e.updated_step} v{e.version}; "
             f"{e.origin}" + (f" of {e.parent_ids}" if e.parent_ids else ""),
             f"    tasks {', '.join(e.task_ids[:5])}{' ...' if len(e.task_ids) > 5 else ''}"
             f"{'; run ' + e.run if e.run else ''}", ""]
    return "\n".join(lines)


def _when(t: float | None) -> str:
    if t is None or t != t:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
