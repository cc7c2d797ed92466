#!/usr/bin/env bash
# GPU device check for localrt's CUDA offload, meant for ONE call of the device tool on a machine with an
# NVIDIA GPU (it has no internet: bring the CuPy wheel along).
#
#   Before the call, on the session machine (which has the network):
#       mkdir -p shared/wheels && pip download --only-binary=:all: -d shared/wheels 'cupy-cuda12x[ctk]>=14'
#   ([ctk] brings NVRTC, cuBLAS and the CUDA runtime as nvidia-* wheels: the GPU machine need not have a toolkit.)
#   Then, with the device tool (shared/ travels with the working tree):
#       run(command="bash bench/gpu_check.sh", timeout_s=540)
#
# What it does, writing everything under $OUT (or ./gpu_check_out when $OUT is unset):
#   1. installs cupy-cuda12x[ctk] from shared/wheels without the network, unless CuPy already imports;
#   2. prints the GPU CuPy sees (nvidia-smi and localrt.engine.backends.devices.probe);
#   3. runs tests/engine/backends/test_gpu_backend.py (per-format kernels, layer ops, whole-model logits with 0/half/all
#      layers on the GPU vs all-CPU, greedy decode) and the always-on CPU seam tests -> $OUT/pytest_gpu.txt;
#   4. runs bench/gpu.py (prefill/decode tok/s at 0, half, all layers; llama.cpp CPU beside) -> $OUT/gpu.jsonl
#      (one record, as bench/results/gpu.jsonl holds them: append it there to keep it).
# Exit status: that of the GPU tests (the bench's failure is recorded in its own log, not fatal).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1

echo "== $(date -u +%FT%TZ) localrt GPU check at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || echo "nvidia-smi not available"

if ! python3 -c "import cupy" 2>/dev/null; then
    if ls shared/wheels/cupy_cuda12x-*.whl >/dev/null 2>&1; then
        python3 -m pip install --no-index --find-links shared/wheels 'cupy-cuda12x[ctk]' 2>&1 | tail -2
    else
        python3 -m pip install 'cupy-cuda12x[ctk]>=14' 2>&1 | tail -2  # only works where the network is reachable
    fi
fi
python3 - <<'EOF'
from localrt.engine.backends import devices
r = devices.probe(0)
print("probe:", r.gpu if r.gpu is not None else "no GPU: " + r.reason)
EOF

# The real models' packages must be importable (the project's own install provides them).
B=tests/engine/backends
python3 -m pytest -q -rs $B/test_gpu_backend.py $B/test_backend_seam.py $B/test_placement.py \
    $B/test_devices.py $B/test_cuda_source.py $B/test_cuda_glue.py 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -40
status=${PIPESTATUS[0]}

timeout 300 python3 bench/gpu.py --out "$OUT/gpu.jsonl" > "$OUT/bench_gpu.log" 2>&1 || echo "bench/gpu.py failed: see bench_gpu.log"
tail -5 "$OUT/bench_gpu.log"
echo "== pytest exit status $status"
exit "$status"
