#!/usr/bin/env bash
# The whole method on one CUDA GPU in at most 8 minutes, each step under its own time limit. From the repository
# root on the GPU machine, after `.gpu/on-device.sh` (../shared/gpu/prepare.sh: fbgemm-gpu, TorchRec; no MLflow or
# kfp needed):
#
#   source .gpu/on-device.sh && bash benchmarks/gpu_check.sh OUT
#
# OUT gets summary.txt (the machine, each step's exit and time), each step's log, the result documents (also under
# benchmarks/results/) and datasets.tar.gz (the profiles); the method's model stays in /tmp/gpu_check_method.
# The steps, most telling first:
#   1. the gpu suite (python -m benchmarks --suite gpu --record; 320 s): the gpu_method experiment with --preset
#      gpu-check --cuda-timer queued --profile-budget-s 120: the timers compared (held, queued, graph,
#      events, and queued with the 3 warm-up calls used before the GPU's 1: agreement, noise, and each one's wall
#      time a shard), profile with the queued timer (the next shard built while the device runs this one; training and
#      held-out tables apart, repeats for the noise floor; as many of the preset's 600 + 100 shards as a pilot's
#      speed fits in 120 s) at batch 65536 and a probe at 2048, pre-train, plan (neuroshard,
#      measured_greedy, size_lookup_greedy, torchrec, torchrec_cw; and neuroshard refined on the kernels, as `plan
#      --refine` does) two tasks of held-out tables (16 on 4 devices, 32 on 8) and measure the plans' kernels
#      (compute alone: one GPU holds no NCCL group of several ranks);
#      its record (benchmarks/results/gpu_method_queued/), and gpu_method_steps.json written after every step, so a
#      step cut short keeps the rest;
#   2. tests/gpu (120 s): the cost model, NeuroShard and the RL policies on CUDA; the CUDA timers on a torch
#      EmbeddingBag; fbgemm shards whose cost grows with their tables and whose repeats agree, at batch 2048 and
#      65536; the three timers agreeing where the kernels dominate, and the hold covering every TBE call; shards
#      timed while the next is built, and with 1 warm-up call, as when timed alone with 3.
set -u
out=${1:?OUT: a folder for the logs and results}
mkdir -p "$out"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/summary.txt"
python3 -c "import os, torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '|', os.cpu_count(), 'CPU cores',
'| torch.cuda._sleep:', callable(getattr(torch.cuda, '_sleep', None)))" | tee -a "$out/summary.txt"
python3 -c "import fbgemm_gpu, torchrec; print('fbgemm_gpu', fbgemm_gpu.__version__, '| torchrec', torchrec.__version__)" \
    2>&1 | grep -v -E '^(INFO|WARNING)' | tail -1 | tee -a "$out/summary.txt"
date -u +%FT%TZ | tee -a "$out/summary.txt"
status=0
step() {  # step LIMIT_S LOG RESULT COMMAND...: run under a time limit, keep its log and result document
    local limit=$1 log=$2 result=$3 began=$SECONDS marker; shift 3
    marker=$(mktemp)  # a result document older than the step is an earlier run's: not copied
    timeout "$limit" "$@" 2>&1 | tr '\r' '\n' | grep -v -E 'it/s\]$|^(INFO|WARNING):' | tee "$out/$log"
    local rc=${PIPESTATUS[0]}
    echo "[$log: exit $rc after $((SECONDS - began)) s of $limit]" | tee -a "$out/summary.txt"
    [ "$rc" = 0 ] || status=1
    if [ -n "$result" ] && [ -d "benchmarks/results/$result" ]; then
        find "benchmarks/results/$result" -name '2*.json' -newer "$marker" -exec cp {} "$out"/ \;
    fi
    rm -f "$marker"
}
work=/tmp/gpu_check_method
rm -rf "$work"
# the gpu suite's run of gpu_method (benchmarks/experiments/gpu_method.py: the queued timer, its out $work)
step 320 method.log gpu_method_queued python3 -m benchmarks --suite gpu --record
cp "$work/gpu_method.json" "$out/gpu_method_steps.json" 2>/dev/null
# the profiles themselves (shardwise.costs datasets, a few MB, one archive): the ground truth the figures were read from
(cd "$work" && tar czf "$out/datasets.tar.gz" ./*costs 2>/dev/null)
step 120 tests.log "" python3 -m pytest tests/gpu -q -p no:cacheprovider
exit $status
