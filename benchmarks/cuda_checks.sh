#!/usr/bin/env bash
# What a CUDA GPU host runs for the Triton kernels (docs/triton.md), one stage per call so that each
# fits a 10-minute slot; results land in $OUT (default benchmarks/results/), named for the GPU.
#
#   bash benchmarks/cuda_checks.sh tests     # pytest -m cuda: kernels vs native, compiled, captured,
#                                            # and the Inductor-launched triton_op path
#   bash benchmarks/cuda_checks.sh kernels   # diffusers-ascend bench kernels: device/host time, % of copy BW
#   bash benchmarks/cuda_checks.sh blocks    # diffusers-ascend bench blocks: full-width Flux blocks
#   bash benchmarks/cuda_checks.sh e2e --model flux [bench e2e options]   # real depth and width,
#                                            # the pipeline's denoising loop, every variant
#
# Needs torch with CUDA, triton and diffusers importable (PYTHONPATH=$PWD from the repository root).
# Refuses without a GPU rather than writing numbers of another device.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
python - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("cuda_checks.sh: no CUDA GPU visible to torch; these checks measure a GPU")
print(torch.cuda.get_device_name(0), "| torch", torch.__version__, end=" | ")
import triton; print("triton", triton.__version__)
EOF
tag="$(python -c 'import torch; print(torch.cuda.get_device_name(0).split()[1].lower())')"  # e.g. h100
case "${1:-}" in
  tests)
    # 4 workers: the time is Triton's JIT compiles on the host, and the tests time nothing, so
    # they may share the GPU.
    python -m pytest -q -n 4 -m cuda tests/triton tests/compilation 2>&1 | tee "$OUT/cuda-tests-$tag.txt"
    ;;
  kernels|blocks)
    # A path or variant that fails is reported in the JSON and the script exits 1: keep both.
    rc=0
    python -m diffusers_ascend.cli bench "$1" --out "$OUT" || rc=$?
    [ -f "$OUT/$1.json" ] && mv "$OUT/$1.json" "$OUT/$1-$tag.json"
    exit "$rc"
    ;;
  e2e)
    # Files are renamed for the GPU (e2e-flux-cuda.json -> e2e-flux-h200.json); a failed variant is
    # a row of the JSON and exits 1, as above.
    shift
    rc=0
    python -m diffusers_ascend.cli bench e2e --device cuda --out "$OUT" "$@" || rc=$?
    for f in "$OUT"/e2e-*-cuda*.*; do
      [ -e "$f" ] && mv "$f" "${f/-cuda/-$tag}"
    done
    exit "$rc"
    ;;
  *)
    echo "usage: $0 tests|kernels|blocks|e2e" >&2
    exit 2
    ;;
esac
