#!/usr/bin/env bash
# Every GPU check in one command, for a machine with an NVIDIA GPU (issue 18's GPU part):
#   1. the tests marked gpu (hf engine on CUDA, a DeepSpeed rank over NCCL in fp32 and bf16,
#      the packed attention's varlen call in bf16 against SDPA per span);
#   2. tests/bench/bench_gpu_attention.py (which packed attention is fastest on the GPU);
#   3. tests/bench/bench_gpu.py (a SmolLM2-shaped training step, generation, weight sync).
# Each part has its own time limit and log, and a failing part does not stop the next one;
# the exit status is the first failure's. Logs go to $OUT (default outputs/gpu-checks).
#
#   bash tests/gpu/run_gpu_checks.sh            from the repo root, with skyrl installed, or
#   with .whl/ from offline_wheels.sh beside it on a machine whose Python has a CUDA torch and
#   transformers but no index: the wheels are installed into /tmp/skyrl-site first.
set -uo pipefail
out=${OUT:-outputs/gpu-checks}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/skyrl-site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/skyrl-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi -L 2>&1 | tee "$out/device.log"
"$python" -c "import torch, transformers, deepspeed; print('torch', torch.__version__, '| transformers', transformers.__version__, '| deepspeed', deepspeed.__version__, '| cuda', torch.cuda.is_available())" 2>&1 | tail -1 | tee -a "$out/device.log"
status=0
part() {  # part NAME SECONDS COMMAND...
    local name=$1 seconds=$2
    shift 2
    echo "== $name (limit ${seconds}s)"
    local start=$SECONDS
    timeout "$seconds" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - start))s"
    [ "$status" -ne 0 ] || status=$rc
}
part test-gpu "${TEST_GPU_S:-200}" "$python" -m pytest -m gpu tests/gpu -p no:cacheprovider -q
part attention "${ATTENTION_S:-180}" "$python" tests/bench/bench_gpu_attention.py
part bench-gpu "${BENCH_GPU_S:-180}" "$python" tests/bench/bench_gpu.py
exit "$status"
