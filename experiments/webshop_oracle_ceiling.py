"""WebShop's true ceiling: per split, how many goals reach reward 1.0 when the goal's own product
is bought with exactly the goal's options at its price (WebShop's own reward semantics).

    .venv/bin/python experiments/webshop_oracle_ceiling.py [--data-dir DIR] [--goal-source synthetic]

Real WebShop (issue 17): 458 of the 6,910 synthetic goals stay below 1.0 (20 test, 72 eval,
366 train).
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--goal-source", default="synthetic", choices=("synthetic", "human"))
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)

    from crl_bench.envs.webshop.data import load_webshop_data
    from crl_bench.envs.webshop.oracle import exact_purchase_ceiling

    data = load_webshop_data(args.data_dir, goal_source=args.goal_source)
    start = time.perf_counter()
    table = exact_purchase_ceiling(data, args.goal_source)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    print(f"{'split':6} {'goals':>6} {'reach 1.0':>10} {'below 1.0':>10} {'mean reward':>12}")
    for split, row in table.items():
        print(f"{split:6} {row['goals']:6d} {row['reach_1']:10d} {row['below_1']:10d} "
              f"{row['mean_reward']:12.4f}")
    print(f"({seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
