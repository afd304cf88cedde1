#!/usr/bin/env bash
# Mutation testing of the core with mutmut (issue 21): the algorithms, the trainer, the
# extractor's credit / count-aware weights, WebShop's reward and SWE's grading. Prints the score
# (killed / all mutants) per module and lists the survivors.
#
#   bash scripts/mutation.sh                 # every module below
#   bash scripts/mutation.sh credit losses   # only these (names from the MODULES table)
#
# Not in CI (tens of minutes on 2 cores). It never touches the checkout: the working tree
# (tracked and untracked, non-ignored files) is copied to $MUTATION_WORKDIR, where `envs/` and
# `baselines/` are moved under `crl_bench/` (their installed names, crl_bench.envs and
# crl_bench.baselines) so mutmut's mutants/ copy is what the tests import. Each module runs with
# only the fast test files that exercise it. Needs `pip install mutmut` (3.x) in .venv.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
MUTMUT="$(dirname "$PY")/mutmut"
WORK="${MUTATION_WORKDIR:-/tmp/crl-mutation}"
CHILDREN="${MUTATION_CHILDREN:-1}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

[ -x "$MUTMUT" ] || { echo "mutmut not found next to $PY: $(dirname "$PY")/pip install mutmut" >&2; exit 2; }

# name | file to mutate (path under the work copy) | test files (the fast ones: test_swe_hacks.py
# takes ~70 s a run, too slow to repeat per mutant; its hacks are graded by the same functions)
MODULES=(
  "advantages|crl_bench/algorithms/advantages.py|tests/test_algorithms_advantages.py"
  "losses|crl_bench/algorithms/losses.py|tests/test_algorithms_losses.py"
  "credit|crl_bench/algorithms/credit.py|tests/test_algorithms_credit.py"
  "trainer|crl_bench/training/role_trainer.py|tests/test_trainer.py tests/test_runner_microbatch.py"
  "webshop_reward|crl_bench/envs/webshop/reward.py|tests/test_webshop_reward.py tests/test_webshop_reward_parity.py"
  "swe_grading|crl_bench/envs/swe/grading.py|tests/test_swe_parts.py tests/test_swe_grading.py"
)

want=("$@")
summary=()
for row in "${MODULES[@]}"; do
  IFS='|' read -r name target tests <<<"$row"
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ " $name " ]]; then continue; fi
  dir="$WORK/$name"
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$ROOT" && git ls-files -co --exclude-standard -z | grep -zv '^results/' \
     | tar --null -cf - -T - 2>/dev/null) | tar -xf - -C "$dir"
  mv "$dir/envs" "$dir/crl_bench/envs"
  mv "$dir/baselines" "$dir/crl_bench/baselines"
  # setup.cfg of the work copy only (the checkout has none): mutmut reads its config from it;
  # list values are one per line
  {
    echo "[mutmut]"
    echo "source_paths=crl_bench"
    echo "only_mutate=$target"
    echo "pytest_add_cli_args_test_selection="
    for t in $tests; do echo "    $t"; done
    echo "pytest_add_cli_args="
    echo "    -p"
    echo "    no:cacheprovider"
  } >"$dir/setup.cfg"
  echo "== $name: mutating $target, tests: $tests"
  (cd "$dir" && nice -n 10 "$MUTMUT" run --max-children "$CHILDREN" >"$dir/run.log" 2>&1) || {
    echo "mutmut run failed for $name, see $dir/run.log" >&2; tail -20 "$dir/run.log" >&2; continue; }
  (cd "$dir" && "$MUTMUT" results --all true >"$dir/results.txt" 2>&1 || true)
  read -r killed total survived other < <(awk -F': ' '/: /{n++; if($2=="killed"||$2=="timeout")k++; else if($2=="survived")s++; else o++} END{print k+0, n+0, s+0, o+0}' "$dir/results.txt")
  pct=$(awk -v k="$killed" -v n="$total" 'BEGIN{printf "%.1f", n? 100*k/n : 0}')
  line="$name: $killed/$total killed ($pct%), $survived survived, $other other"
  echo "$line"; summary+=("$line")
  grep ': survived' "$dir/results.txt" | sed 's/^/   survived /' || true
done

echo
echo "== mutation scores (mutmut $("$PY" -c "import importlib.metadata as m; print(m.version('mutmut'))"))"
printf '%s\n' "${summary[@]}"
echo "details: mutmut show <name> in $WORK/<module>"
