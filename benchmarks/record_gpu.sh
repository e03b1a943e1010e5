#!/usr/bin/env bash
# The GPU side of the reference scenario, on a machine with CUDA and torchvision:
#   1. the CUDA tests of `advisor profile`;
#   2. the follow-the-advice walk on the published script (torchvision ResNet-18, Resize 224),
#      every round's log dir kept, so the first and last rounds can ship as sample logs.
#
#   benchmarks/record_gpu.sh OUT_DIR [extra follow_the_advice.py options]
#
# Writes OUT_DIR/{env.txt,cuda_tests.txt,walk.log,follow_the_advice_gpu.txt,follow_the_advice_gpu.json}
# and OUT_DIR/rounds/roundN/ (each an `advisor profile` log dir). PYTHON picks the interpreter.
set -uo pipefail
out=${1:?usage: benchmarks/record_gpu.sh OUT_DIR [follow_the_advice.py options]}
shift
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1

{
    "$py" -c "import torch, torchvision, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'torchvision', torchvision.__version__, 'python', platform.python_version()); print(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory >> 20, 'MiB')"
    nproc
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>/dev/null
} 2>&1 | tee "$out/env.txt"

"$py" -m pytest -q -p no:cacheprovider tests/test_profile.py -k cuda 2>&1 | tee "$out/cuda_tests.txt"

"$py" benchmarks/follow_the_advice.py --device cuda --keep "$out/rounds" \
    --table "$out/follow_the_advice_gpu.txt" --json "$out/follow_the_advice_gpu.json" "$@" 2>&1 | tee "$out/walk.log"
