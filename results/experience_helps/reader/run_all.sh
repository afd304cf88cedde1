#!/usr/bin/env bash
# The reader comparison's runs (PLAN.md), from a worktree frozen at the commit given. Each run's
# compact records (and bank) are exported into this folder as soon as it ends, with the frozen
# code (a record's format is its run's); then, with this checkout's code, the bank's full entry
# list, the training episodes that sent no action (and why) and the page's analysis are
# rewritten, the reader tests are run, and only if they pass is the lot committed together
# (records, banks, no-action files, launcher log, page). Resumable: a finished run is
# skipped, an interrupted one resumes from its last checkpoint. Several copies may run at once
# (each claims a run before starting it); AGENTS and SEEDS choose the order.
#
#   cp results/experience_helps/reader/run_all.sh /work/runs/ && \
#   nohup bash /work/runs/run_all.sh COMMIT /work/runs/landmark_reader /work/main \
#       >> /work/runs/landmark_reader.log 2>&1 &
set -u
COMMIT=${1:?usage: run_all.sh COMMIT OUT [REPO]}
OUT=${2:?usage: run_all.sh COMMIT OUT [REPO]}
REPO=${3:-$(cd "$(dirname "$0")/../../.." && pwd)}
PY=$REPO/.venv/bin/python
CODE=$OUT/code
HERE=results/experience_helps/reader
RECORDS=$HERE/records
BANKS=$HERE/banks
LAUNCHER_LOG=$HERE/launcher_log.txt
TASK=MiniHack-Room-Landmark-5x5-v0
AGENTS=${AGENTS:-grpo static_exp comp_rl exp_only}
SEEDS=${SEEDS:-0 1 2 3 4}
mkdir -p "$OUT/logs" "$OUT/claims"
# One lock for the worktree set-up, the launcher log and every commit. Each locked section opens
# the lock file itself (a subshell with its own descriptor), so the lock ends with the section and
# is never inherited by a run; a section already holding it (LOCKED=1) does not take it again.
LOCK=$OUT/.lock
say() {
  echo "$(date -u +%FT%TZ) $*"
  if [ "${LOCKED:-0}" = 1 ]; then echo "$(date -u +%FT%TZ) $*" >> "$REPO/$LAUNCHER_LOG"
  else (exec 8>>"$LOCK"; flock 8; echo "$(date -u +%FT%TZ) $*" >> "$REPO/$LAUNCHER_LOG"); fi
}

(exec 8>>"$LOCK"; flock 8
 if [ ! -d "$CODE" ]; then
   git -C "$REPO" worktree add --detach "$CODE" "$COMMIT"
   # the editable install maps crl_bench.envs / crl_bench.baselines to the live checkout: point
   # the frozen package at its own copies instead
   ln -s ../envs "$CODE/crl_bench/envs"
   ln -s ../baselines "$CODE/crl_bench/baselines"
 fi)
[ "$(git -C "$CODE" rev-parse HEAD)" = "$(git -C "$REPO" rev-parse "$COMMIT")" ] || {
  echo "the worktree $CODE is not at $COMMIT"; exit 2; }
# the run driver's folder in the frozen commit (experiments/ now; benchmarks/ in older commits)
for DIR in experiments benchmarks; do
  [ -f "$CODE/$DIR/learning_minihack.py" ] && { DRIVER=$DIR/learning_minihack.py; break; }
done
[ -n "${DRIVER:-}" ] || { echo "no learning_minihack.py in $CODE"; exit 2; }
ANALYSIS=$(dirname "$DRIVER")/minihack_landmark.py

OVR=(--preset cpu --set model.actor=smollm2-135m-reader --set model.extractor=smollm2-135m
  --set threads=1 --set rollout.history=0 --set rollout.example_pick=placeholder
  --set rollout.groups=4 --set rollout.group_size=8
  --set 'rollout.env_max_steps={"minihack": 1}'
  --set 'rollout.env_kwargs={"minihack": {"view": "compact"}}'
  --set actor.lr=3e-4 --set actor.max_samples_per_update=32
  --set experience.key=episode_start --set experience.merge_scope=key
  --set eval.every=5 --set eval.episodes_per_task=128 --set eval.temperature=0
  --set extractor.distill=with_experience --set extractor.wait_before_rollout=true
  --set extractor.answer_template=action --set extractor.temperature=0.3)

claim() {  # under the lock: take the run unless a live copy has it (a dead copy's claim is taken over)
  local c=$OUT/claims/$1 pid
  if ! mkdir "$c" 2>/dev/null; then
    pid=$(cat "$c/pid" 2>/dev/null)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && return 1
  fi
  echo $$ > "$c/pid"
}

publish() {  # under the lock: entries and analysis with this checkout's code, tests, one commit
  local agent=$1 seed=$2 run=$3
  local paths=("$RECORDS/${agent}__seed${seed}.jsonl" "$LAUNCHER_LOG")
  if [ -f "$run/bank.sqlite" ]; then
    (cd "$CODE" && PYTHONPATH="$CODE" "$PY" "$ANALYSIS" banks "$run" --out "$REPO/$BANKS")
    (cd "$REPO" && "$PY" experiments/minihack_landmark.py bank-entries "$run" --out "$BANKS") \
      || echo "bank-entries failed (or not built yet)"
    paths+=("$BANKS")
  fi
  (cd "$REPO" && "$PY" experiments/minihack_landmark.py no-action "$run" --out "$HERE/no_action") \
    && paths+=("$HERE/no_action") || echo "no-action failed"
  (cd "$REPO" && "$PY" experiments/minihack_landmark.py analyse --summary-only \
    --records "$RECORDS" --out "$HERE") || echo "analysis failed"
  paths+=("$HERE/analysis.json" "$HERE/analysis.md" "$HERE/curves.png")  # what the analysis writes
  if (cd "$REPO" && timeout 1200 "$PY" -m pytest -q -p no:cacheprovider -x tests/test_reader_*.py \
        tests/test_results_recompute.py > "$OUT/logs/gate_${agent}__${seed}.log" 2>&1); then
    say "committing $agent seed $seed"  # before the commit, so the log's line is in it
    git -C "$REPO" add -- "${paths[@]}" && git -C "$REPO" commit -q \
      -m "Reader comparison: $agent seed $seed's records$([ -f "$run/bank.sqlite" ] && echo ' and bank'), the page rerun (code $COMMIT)" \
      -- "${paths[@]}" || say "the commit of $agent seed $seed failed"
  else
    say "NOT committed $agent seed $seed: the reader tests failed (see $OUT/logs/gate_${agent}__${seed}.log)"
  fi
}

for AGENT in $AGENTS; do
  for SEED in $SEEDS; do
    RUN=$OUT/runs/${TASK}__${AGENT}__${SEED}
    [ -f "$REPO/$RECORDS/${AGENT}__seed${SEED}.jsonl" ] && continue   # recorded already
    (exec 8>>"$LOCK"; flock 8; claim "${AGENT}__${SEED}") || continue  # a live copy has it
    [ -f "$OUT/stop" ] && { echo "stop file: not starting $AGENT seed $SEED"; rm -rf "$OUT/claims/${AGENT}__${SEED}"; exit 0; }
    say "start $AGENT seed $SEED"
    (cd "$CODE" && OMP_NUM_THREADS=1 PYTHONPATH="$CODE" "$PY" "$DRIVER" \
      --tasks crl/$TASK --steps 20 --seeds "$SEED" --agents "$AGENT" --jobs 1 "${OVR[@]}" \
      --out "$OUT" --no-progress) >> "$OUT/logs/${AGENT}__${SEED}.log" 2>&1
    STATE=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['state'])" \
      "$RUN/status.json" 2>/dev/null || echo missing)
    say "end $AGENT seed $SEED: $STATE"
    if [ "$STATE" = done ]; then
      (cd "$CODE" && PYTHONPATH="$CODE" "$PY" "$ANALYSIS" export "$RUN" --records "$REPO/$RECORDS")
      (exec 8>>"$LOCK"; flock 8; LOCKED=1; publish "$AGENT" "$SEED" "$RUN")
    fi
    rm -rf "$OUT/claims/${AGENT}__${SEED}"
  done
done
echo "$(date -u +%FT%TZ) no run left to start"
