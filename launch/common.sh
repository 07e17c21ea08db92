# Sourced by launch/<recipe>.sh with RECIPE set. Starts one recipe on this node, or with RAY_ADDRESS set on that
# Ray cluster; never touches processes it did not start (`clawr1 run` stops its own children by process group, and
# on Ray its own actors and placement groups, on exit, Ctrl-C or SIGTERM).
#
# Environment (all optional but MODEL_PATH on GPUs):
#   RAY_ADDRESS   a running Ray cluster (e.g. head-node:6379): place the loops there; the GPU counts may span nodes
#   NUM_GPUS      GPUs this run may use (default: all that nvidia-smi lists; not used on Ray)
#   ACTOR_GPUS    trainer GPUs      (default 4)    devices 0 .. ACTOR_GPUS-1
#   ROLLOUT_GPUS  policy engines    (default 2)    the next ROLLOUT_GPUS devices
#   PRM_GPUS      PRM judge engine  (default 2)    the next PRM_GPUS devices
#   MODEL_PATH    local HF directory of the policy (e.g. Qwen3-4B); also the PRM's unless PRM_MODEL_PATH is set
#   RUN_DIR       where the run writes everything (default runs/<recipe>-<time>)
# Extra arguments go to `clawr1 run` as they are: overrides (trainer.lr=2e-6), --resume, --dry-run.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="${RUN_DIR:-runs/${RECIPE}-$(date +%Y%m%d-%H%M%S)}"

fail() { echo "launch/${RECIPE}.sh: $*" >&2; exit 2; }

is_count() { [[ "$1" =~ ^[0-9]+$ ]]; }

visible_gpus() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

# "first count" -> "[first,first+1,...]"
device_list() {
  local first=$1 count=$2 out="" i
  for ((i = first; i < first + count; i++)); do out+="${out:+,}$i"; done
  echo "[$out]"
}

# A Ray cluster: per-role GPU counts, checked by `clawr1 run` against the resources the cluster's nodes declare
# (--dry-run prints the placement plan: bundles, roles and nodes).
if [[ -n "${RAY_ADDRESS:-}" ]]; then
  ACTOR_GPUS="${ACTOR_GPUS:-4}"
  ROLLOUT_GPUS="${ROLLOUT_GPUS:-2}"
  PRM_GPUS="${PRM_GPUS:-2}"
  for name in ACTOR_GPUS ROLLOUT_GPUS PRM_GPUS; do
    is_count "${!name}" || fail "$name must be a whole number, got '${!name}'"
  done
  (( ACTOR_GPUS > 0 && ROLLOUT_GPUS > 0 )) || fail "ACTOR_GPUS and ROLLOUT_GPUS must be at least 1"
  [[ -n "${MODEL_PATH:-}" ]] || fail "set MODEL_PATH to an HF model directory present on every node; nothing is downloaded"
  PRM_ARGS=()
  if (( PRM_GPUS > 0 )); then
    PRM_ARGS=("cluster.ray.prm_gpus=$PRM_GPUS" "judge.prm_model_path=${PRM_MODEL_PATH:-$MODEL_PATH}")
  fi
  echo "launch/${RECIPE}.sh: Ray cluster at ${RAY_ADDRESS}: actor GPUs ${ACTOR_GPUS}, rollout GPUs ${ROLLOUT_GPUS}, PRM GPUs ${PRM_GPUS} -> ${RUN_DIR}" >&2
  # Weights reach engines on other nodes by NCCL (trainer rank 0 and every engine in one group); with RUN_DIR on a
  # filesystem every node shares, trainer.weight_sync=disk (given after the script) works too.
  exec clawr1 run "$REPO/recipes/${RECIPE}/cluster.yaml" \
    "run.dir=${RUN_DIR}" "model.path=${MODEL_PATH}" cluster.backend=ray trainer.weight_sync=nccl \
    "cluster.ray.actor_gpus=${ACTOR_GPUS}" "cluster.ray.rollout_gpus=${ROLLOUT_GPUS}" \
    "${PRM_ARGS[@]}" "$@"
fi

AVAILABLE="$(visible_gpus)"
if [[ "$AVAILABLE" -eq 0 ]]; then
  echo "launch/${RECIPE}.sh: no GPU on this machine; running recipes/${RECIPE}/cpu.yaml" >&2
  exec clawr1 run "$REPO/recipes/${RECIPE}/cpu.yaml" "run.dir=${RUN_DIR}" ${MODEL_PATH:+"model.path=${MODEL_PATH}"} "$@"
fi

NUM_GPUS="${NUM_GPUS:-$AVAILABLE}"
ACTOR_GPUS="${ACTOR_GPUS:-4}"
ROLLOUT_GPUS="${ROLLOUT_GPUS:-2}"
PRM_GPUS="${PRM_GPUS:-2}"
for name in NUM_GPUS ACTOR_GPUS ROLLOUT_GPUS PRM_GPUS; do
  is_count "${!name}" || fail "$name must be a whole number, got '${!name}'"
done
(( ACTOR_GPUS > 0 && ROLLOUT_GPUS > 0 )) || fail "ACTOR_GPUS and ROLLOUT_GPUS must be at least 1"
(( ACTOR_GPUS + ROLLOUT_GPUS + PRM_GPUS == NUM_GPUS )) ||
  fail "the partition does not add up: ACTOR_GPUS=$ACTOR_GPUS + ROLLOUT_GPUS=$ROLLOUT_GPUS + PRM_GPUS=$PRM_GPUS != NUM_GPUS=$NUM_GPUS"
(( NUM_GPUS <= AVAILABLE )) || fail "NUM_GPUS=$NUM_GPUS but this machine shows $AVAILABLE GPU(s)"
[[ -n "${MODEL_PATH:-}" ]] || fail "set MODEL_PATH to a local HF model directory (e.g. Qwen3-4B); nothing is downloaded"

PRM_ARGS=()
if (( PRM_GPUS > 0 )); then
  PRM_ARGS=("cluster.prm_gpus=$(device_list $((ACTOR_GPUS + ROLLOUT_GPUS)) "$PRM_GPUS")"
            "judge.prm_model_path=${PRM_MODEL_PATH:-$MODEL_PATH}")
fi

echo "launch/${RECIPE}.sh: actor GPUs $(device_list 0 "$ACTOR_GPUS"), rollout GPUs $(device_list "$ACTOR_GPUS" "$ROLLOUT_GPUS"), PRM GPUs $( (( PRM_GPUS > 0 )) && device_list $((ACTOR_GPUS + ROLLOUT_GPUS)) "$PRM_GPUS" || echo none) -> ${RUN_DIR}" >&2
exec clawr1 run "$REPO/recipes/${RECIPE}/cluster.yaml" \
  "run.dir=${RUN_DIR}" "model.path=${MODEL_PATH}" \
  "cluster.actor_gpus=$(device_list 0 "$ACTOR_GPUS")" \
  "cluster.rollout_gpus=$(device_list "$ACTOR_GPUS" "$ROLLOUT_GPUS")" \
  "${PRM_ARGS[@]}" "$@"
