#!/usr/bin/env bash
# TorchRec's own planner unit tests against ShardwisePlanner: each test's EmbeddingShardingPlanner(...) becomes
# ShardwisePlanner(..., cost_model=MODEL), nothing else changes; then the same on CPU topologies.
#   scripts/torchrec_planner_tests.sh TORCHREC_CHECKOUT MODEL [PYTHON]
# TORCHREC_CHECKOUT: a clone of github.com/pytorch/torchrec (or a git dir: its HEAD is read); MODEL: a cost model
# directory or models:/ URI. The tests are copied to a temporary folder, never into this repository.
set -euo pipefail
checkout=${1:?TorchRec checkout (a clone or git dir of pytorch/torchrec)}
model=${2:?cost model directory or models:/ URI}
[ -d "$model" ] && model=$(cd "$model" && pwd)  # the tests run in a temporary folder
python=${3:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
tests=(test_planners test_embedding_utils test_embeddingbag_utils test_stats)
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
mkdir -p "$work/cuda" "$work/cpu"
for name in "${tests[@]}"; do
  path=torchrec/distributed/planner/tests/$name.py
  if [ -d "$checkout/$path" ] || [ -f "$checkout/$path" ]; then cp "$checkout/$path" "$work/$name.py"
  else git --git-dir "$checkout" show "HEAD:$path" > "$work/$name.py"; fi
  # the module's name rebound at its end: the tests call it at run time, everything else is TorchRec's test as it is
  { cat "$work/$name.py"; printf '\nfrom swap import EmbeddingShardingPlanner  # noqa: E402,F811\n'; } > "$work/cuda/$name.py"
  sed -e 's/compute_device = "cuda"/compute_device = "cpu"/; s/compute_device="cuda"/compute_device="cpu"/' \
      "$work/cuda/$name.py" > "$work/cpu/$name.py"
done
cat > "$work/cuda/swap.py" <<PY
from shardwise.integrations.torchrec import ShardwisePlanner


class EmbeddingShardingPlanner(ShardwisePlanner):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs, cost_model="$model")
PY
cp "$work/cuda/swap.py" "$work/cpu/swap.py"
# TorchRec's own planner on the same tests, for its failures on CPU topologies and its time beside shardwise's
mkdir -p "$work/cuda-torchrec" "$work/cpu-torchrec"
for name in "${tests[@]}"; do
  cp "$work/$name.py" "$work/cuda-torchrec/"
  sed -e 's/compute_device = "cuda"/compute_device = "cpu"/; s/compute_device="cuda"/compute_device="cpu"/' \
      "$work/$name.py" > "$work/cpu-torchrec/$name.py"
done
for topology in cuda cpu; do
  echo "== TorchRec's planner tests on $topology topologies, TorchRec's EmbeddingShardingPlanner"
  (cd "$work/$topology-torchrec" && "$python" -m pytest -q -p no:cacheprovider -W ignore . || true) \
    | grep -E "^(FAILED|[0-9]+ (passed|failed))"
  echo "== the same, ShardwisePlanner"
  (cd "$work/$topology" && "$python" -m pytest -q -p no:cacheprovider -W ignore . || true) \
    | grep -E "^(FAILED|[0-9]+ (passed|failed))"
done
