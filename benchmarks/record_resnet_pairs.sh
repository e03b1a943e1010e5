#!/usr/bin/env bash
# Held-out promise pairs on the sample script: two baselines, each fix alone on top of one,
# every run with `advisor profile --full`, so each log's facts file holds the steps after the
# window (no profiler) to measure the fix by. benchmarks/promise_accuracy.py reads them.
#
#   benchmarks/record_resnet_pairs.sh OUT_DIR [DEADLINE_SECONDS]
#
# Baselines (torchvision ResNet-18 at 224x224 on a CUDA device):
#   fed:     --workers 8 --pin-memory --batch-size 128   (the input keeps up: device-bound)
#   starved: the script's defaults (batch 32, no workers) (the input pipeline is the step)
# Runs are made in order of what they check and stop starting once DEADLINE_SECONDS (default
# 3600) have passed; OUT_DIR/pairs.tsv lists each run's name, exit code, switches and seconds.
set -u
out=${1:?usage: record_resnet_pairs.sh OUT_DIR [DEADLINE_SECONDS]}
deadline=${2:-3600}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
script="$here/sample_runs/resnet18_cifar/train.py"
adv=${ADVISOR:-advisor}
start=$SECONDS
fed=(--workers 8 --pin-memory --batch-size 128)
run() {  # name, then the script's switches
  local name=$1; shift
  if (( SECONDS - start > deadline )); then echo "$name skipped: past the deadline"; return; fi
  local t0=$SECONDS
  $adv profile --full --device cuda --out "$out/$name" "$script" -- --steps 60 "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$*" "$((SECONDS - t0))" >> "$out/pairs.tsv"
  echo "$name rc=$rc $((SECONDS - t0))s $*"
}
run fed "${fed[@]}"
run fed_amp "${fed[@]}" --amp
run fed_set_to_none "${fed[@]}" --set-to-none
run fed_uint8 "${fed[@]}" --uint8-to-device
run fed_batch512 --workers 8 --pin-memory --batch-size 512
run starved
run starved_workers --workers 8
run starved_pin --pin-memory
run starved_batch128 --batch-size 128
run fed_compile "${fed[@]}" --compile
run fed_reduce_overhead "${fed[@]}" --compile reduce-overhead --set-to-none
