#!/usr/bin/env bash
# The reader comparison's runs (PLAN.md), one at a time, shortest first, from a worktree frozen at
# the commit given; each run's compact records (and bank) are exported into this folder and
# committed as soon as it ends. Resumable: a finished run is skipped, an interrupted one resumes
# from its last checkpoint.
#
#   nohup bash results/experience_helps/reader/run_all.sh COMMIT /work/runs/landmark_reader \
#       > /work/runs/landmark_reader.log 2>&1 &
set -u
COMMIT=${1:?usage: run_all.sh COMMIT OUT}
OUT=${2:?usage: run_all.sh COMMIT OUT}
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
PY=$REPO/.venv/bin/python
CODE=$OUT/code
RECORDS=results/experience_helps/reader/records
BANKS=results/experience_helps/reader/banks
TASK=MiniHack-Room-Landmark-5x5-v0
mkdir -p "$OUT/logs"
if [ ! -d "$CODE" ]; then
  git -C "$REPO" worktree add --detach "$CODE" "$COMMIT"
  # the editable install maps crl_bench.envs / crl_bench.baselines to the live checkout: point
  # the frozen package at its own copies instead
  ln -s ../envs "$CODE/crl_bench/envs"
  ln -s ../baselines "$CODE/crl_bench/baselines"
fi
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

commit_paths() {  # git commit of our own paths only, retried while another commit holds the lock
  local msg=$1; shift
  for _ in $(seq 1 60); do
    git -C "$REPO" add -- "$@" && git -C "$REPO" commit -q -m "$msg" -- "$@" && return 0
    sleep 10
  done
  echo "could not commit $*"
}

for AGENT in grpo static_exp comp_rl exp_only; do
  for SEED in 0 1 2 3 4; do
    RUN=$OUT/runs/${TASK}__${AGENT}__${SEED}
    echo "$(date -u +%FT%TZ) start $AGENT seed $SEED"
    (cd "$CODE" && OMP_NUM_THREADS=1 PYTHONPATH="$CODE" "$PY" "$DRIVER" \
      --tasks crl/$TASK --steps 20 --seeds "$SEED" --agents "$AGENT" --jobs 1 "${OVR[@]}" \
      --out "$OUT" --no-progress) >> "$OUT/logs/${AGENT}__${SEED}.log" 2>&1
    STATE=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['state'])" \
      "$RUN/status.json" 2>/dev/null || echo missing)
    echo "$(date -u +%FT%TZ) end $AGENT seed $SEED: $STATE"
    [ "$STATE" = done ] || continue
    # exported and summarised by the frozen code too, so a record's format is its run's
    (cd "$CODE" && PYTHONPATH="$CODE" "$PY" "$ANALYSIS" export "$RUN" --records "$REPO/$RECORDS")
    PATHS=("$RECORDS/${AGENT}__seed${SEED}.jsonl")
    if [ -f "$RUN/bank.sqlite" ]; then
      (cd "$CODE" && PYTHONPATH="$CODE" "$PY" "$ANALYSIS" banks "$RUN" --out "$REPO/$BANKS")
      PATHS+=("$BANKS")
    fi
    commit_paths "Reader comparison: $AGENT seed $SEED's records$([ -f "$RUN/bank.sqlite" ] && echo ' and bank') (code $COMMIT)" "${PATHS[@]}"
  done
done
echo "$(date -u +%FT%TZ) all runs ended"
