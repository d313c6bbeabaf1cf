#!/usr/bin/env bash
# Every GPU check and measurement in one short run on a lent CUDA machine,
# results under $OUT (default ./gpu-out):
#   1. per-kernel fp32 times, forward and backward, on the shapes of the
#      NeuSight training files and on the GEMMs of a few zoo transformers
#      (benchmarks/measure_kernels.py): another training GPU, to commit under
#      benchmarks/data/ and train on with `predictor train-models --extra`;
#   2. the matmul rate per math mode and AMP/TF32 training steps against the
#      prediction (benchmarks/amp_gpu.py);
#   3. calibrated and pure mode against real training steps
#      (benchmarks/calibration_gpu.py);
#   4. the peak-memory model against PyTorch's counters (benchmarks/memory_gpu.py);
#   5. the kernels of real training steps, per kernel kind, to read the model's
#      misses from (benchmarks/profile_gpu.py; about a minute);
#   6. Stable Diffusion v1.5's half-precision denoising step at batch 1, 4 and
#      16, timed and profiled (benchmarks/diffusion_published.py --measure;
#      under a minute): where the published datacenter-board figures and the
#      prediction part.
#
# The machine needs torch with CUDA, numba, numpy, pandas, rich, tqdm and
# transformers (the project's own dependencies); the project itself is put on
# PYTHONPATH as it installs, so nothing there is reinstalled. The shapes come
# from one training GPU's files, which do not travel with the repository:
# copy them into the ignored folder .neusight/ first and point NEUSIGHT at it:
#
#   for f in ../shared/data/neusight/train/*/Tesla_V100-PCIE-32GB.csv; do
#       op=$(basename "$(dirname "$f")"); mkdir -p .neusight/train/$op; cp "$f" .neusight/train/$op/
#   done
#   NEUSIGHT=.neusight KERNEL_SECONDS=280 bash benchmarks/gpu_session.sh   # carry .neusight
#
# Wall time on an H200 with KERNEL_SECONDS=220: 428 s (the three checks and the
# first compilations take about 200 s; that run had no model GEMMs, which now
# take a fifth of the kernel budget); give the run KERNEL_SECONDS + 300 s.
# The measurements of that run are in benchmarks/data/ (NVIDIA_H200.csv, h200/).
# Each step's log is in $OUT; a step that fails does not stop the next.
# DEVICE=cpu rehearses the whole script, small, on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-out}"
NEUSIGHT="${NEUSIGHT:-../shared/data/neusight}"
KERNEL_SECONDS="${KERNEL_SECONDS:-280}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

# The project as it installs (pyproject.toml's package-dir: kernels/, specs/ and
# calibration/ are predictor.kernels, .specs, .calibration), without pip.
# `python -m` puts the working directory first on sys.path, so the scripts run
# from that copy: from the repository root the bare predictor/ (no kernels)
# would shadow it.
SITE="$(mktemp -d)"
cp -r predictor benchmarks "$SITE/"
for sub in kernels specs calibration; do cp -r "$sub" "$SITE/predictor/$sub"; done
NEUSIGHT="$(cd "$NEUSIGHT" && pwd)" || exit 1
OUT="$(cd "$OUT" && pwd)"
cd "$SITE" || exit 1
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import predictor.kernels; print('predictor from', predictor.__file__)" || exit 1
if [ "${DEVICE:-cuda}" = cpu ]; then
    # A rehearsal of this script on a machine without a GPU: small and quick.
    kernel_args=(--device cpu --per-op 2 --models gpt2:1x32); calibration_args=(--device cpu --models tiny)
    amp_args=(--device cpu --models tiny --repeats 2 --iterations 2)
    profile_args=(--device cpu --smoke); sd_args=(--smoke)
else
    python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.__version__, torch.cuda.get_device_name())" || exit 1
    kernel_args=(); calibration_args=(); amp_args=(); profile_args=(); sd_args=()
fi

status=0
python3 -m benchmarks.measure_kernels --data "$NEUSIGHT" --seconds "$KERNEL_SECONDS" \
    --out "$OUT/kernels" "${kernel_args[@]}" 2>&1 | tee "$OUT/measure_kernels.log" || status=1
python3 -m benchmarks.amp_gpu --json "$OUT/amp_gpu.json" "${amp_args[@]}" 2>&1 \
    | tee "$OUT/amp_gpu.log" || status=1
python3 -m benchmarks.calibration_gpu --json "$OUT/calibration_gpu.json" \
    "${calibration_args[@]}" 2>&1 | tee "$OUT/calibration_gpu.log" || status=1
python3 -m benchmarks.memory_gpu 2>&1 | tee "$OUT/memory_gpu.log" || status=1
python3 -m benchmarks.profile_gpu --out "$OUT/profile" "${profile_args[@]}" 2>&1 \
    | tee "$OUT/profile_gpu.log" || status=1
python3 -m benchmarks.diffusion_published --measure "$OUT/diffusion" "${sd_args[@]}" 2>&1 \
    | tee "$OUT/diffusion.log" || status=1
exit $status
