#!/usr/bin/env bash
# The GPU checks of shardwise's pure-torch code, in one short run on a machine with one CUDA GPU.
#
# It needs torch with CUDA and shardwise's pure-Python needs (numpy, pandas, pyarrow, scipy, pydantic, tqdm,
# matplotlib); no fbgemm, TorchRec, MLflow or kfp (the kernels, the TorchRec comparisons and the registry are
# not what it checks). From the repository root:
#
#   benchmarks/gpu_check.sh COSTS MODEL OUT
#
# COSTS: a cost dataset (parquet file or folder) to pre-train on; MODEL: a cost-model directory to plan with;
# OUT: where the logs and the two result documents go. It runs, each under its own time limit:
#   1. tests/gpu: cost-model training and prediction on CUDA, a CUDA-trained model on the CPU, NeuroShard with
#      the model on CUDA, DreamShard / AutoShard training and planning on CUDA, the profiler's CUDA-event timer;
#   2. bench_subnormals.py: what subnormal weights cost the search on this node's CPU (subnormals.json);
#   3. bench_planning_time.py --devices cuda,cpu: planning with the model on the GPU, as `shardwise plan` does
#      there by default, and on the CPU (planning_time_cuda.json);
#   4. bench_pretrain_device.py --devices cpu,cuda (pretrain_device.json);
#   5. bench_rl_policies.py, small, with the policies on the CPU and then on CUDA (where `train-policy` trains
#      them by default): training and planning seconds of each, in policies_cpu.log and policies_cuda.log.
set -u
costs=${1:?COSTS: a cost dataset to pre-train on}
model=${2:?MODEL: a cost-model directory}
out=${3:?OUT: a folder for the logs and results}
mkdir -p "$out"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import os, torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '|', os.cpu_count(), 'CPU cores')" \
    | tee -a "$out/machine.txt"
lscpu 2>/dev/null | grep -m1 'Model name' | tee -a "$out/machine.txt"
status=0
step() {  # step LIMIT_S LOG RESULT COMMAND...: run under a time limit, keep its log and result document
    local limit=$1 log=$2 result=$3; shift 3
    timeout "$limit" "$@" 2>&1 | tr '\r' '\n' | grep -v 'it/s\]$' | tee "$out/$log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    [ -z "$result" ] || cp "benchmarks/results/$result.json" "$out"/ 2>/dev/null
}
step 240 tests.log "" python3 -m pytest tests/gpu -q -p no:cacheprovider
step 200 subnormals.log subnormals python3 benchmarks/bench_subnormals.py --model "$model" --record
step 240 planning.log planning_time_cuda python3 benchmarks/bench_planning_time.py --model "$model" \
    --devices cuda,cpu --torchrec-max-tables 0 --quality-max-tables 0 --record --record-name planning_time_cuda
step 300 pretrain.log pretrain_device python3 benchmarks/bench_pretrain_device.py --data "$costs" \
    --devices cpu,cuda --epochs 40 --record
for device in cpu cuda; do
    step 150 "policies_$device.log" "" python3 benchmarks/bench_rl_policies.py --model "$model" --num-tasks 8 \
        --test-tasks 3 --episodes 20 --samples 4 --device "$device"
done
exit $status
