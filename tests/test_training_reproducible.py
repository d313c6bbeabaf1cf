"""The op models' training gives the same weights on another CPU.

torch picks its CPU kernels by instruction set, and their sums round
differently: in float32 a fit on an Intel AVX-512 machine and one held to
AVX2 differed in the last bits, which 60 epochs grew to 0.17 on a weight
(benchmarks/README.md, "Trained in float64"). Training runs in float64
(``calibration.train.TRAIN_DTYPE``), where they agree to rounding. (Whether
float32 differs at all depends on the CPU: on an AMD EPYC that torch reports
as AVX-512 the two float32 fits came out equal, its math libraries taking
one path either way; so only the float64 guarantee is tested.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

FIT = """
import sys
import numpy as np
from predictor.calibration import train as T
from predictor.kernels.features import N_FEATURES

if len(sys.argv) > 2:
    T.TRAIN_DTYPE = sys.argv[2]
rng = np.random.default_rng(0)
x = rng.normal(size=(4096, N_FEATURES))
ideal = np.exp(rng.normal(size=4096))
target = ideal * (1.5 + np.tanh(x[:, 2] * x[:, 3])) + 5.0
model = T.fit_group(0, x, ideal, target, seed=0, epochs=10)
np.save(sys.argv[1], np.concatenate([np.ravel(a) for layer in model.layers for a in layer]))
"""

# torch's (and oneDNN's, MKL's) switches for the instruction set of their CPU kernels.
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _fit(tmp_path: Path, name: str, env: dict, dtype: str | None = None) -> np.ndarray:
    script = tmp_path / "fit.py"
    script.write_text(FIT)
    out = tmp_path / f"{name}.npy"
    root = Path(__file__).resolve().parents[1]
    full = {**os.environ, **env,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, str(script), str(out), *([dtype] if dtype else [])],
                   check=True, env=full, cwd=tmp_path, timeout=300)
    return np.load(out)


def test_a_fit_is_the_same_with_torchs_avx2_kernels(tmp_path):
    base = _fit(tmp_path, "default", {})
    held = _fit(tmp_path, "avx2", AVX2)
    assert base.shape == held.shape and np.isfinite(base).all()
    assert np.abs(base - held).max() < 1e-12

