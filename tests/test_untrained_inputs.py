"""Inputs a network's data never varied must not move its prices.

The conv data holds only 3x3 stride-1 kernels, so the conv network's
kernel-size and stride inputs sat at their training mean in every row and
their first-layer weights never left their random start; a 1x1 or strided
convolution was priced through those random weights. `fit_group` zeroes
them, and the shipped weights carry that.
"""

from __future__ import annotations

import numpy as np
import pytest

from predictor import opmodel
from predictor.kernels import features as F
from predictor.kernels import layout as L
from predictor.kernels.mlp import HEADER, has_group, layer_offsets


def _first_layer(mlp, group):
    off, n_in, h1, h2 = (int(mlp[1 + HEADER * group + j]) for j in range(4))
    _, std, w1, *_ = layer_offsets(off, n_in, h1, h2)
    return np.asarray(mlp[std:std + n_in]), np.asarray(mlp[w1:w1 + h1 * n_in]).reshape(h1, n_in)


def test_fit_group_zeroes_the_weights_of_an_input_its_rows_never_varied():
    from predictor.calibration import train as T

    rng = np.random.default_rng(0)
    n = 600
    x = rng.normal(size=(n, F.N_FEATURES))
    ideal = np.exp(rng.uniform(np.log(2.0), np.log(2000.0), n))
    x[:, 0] = x[:, 1] = np.log2(ideal)
    x[:, 15] = np.log2(3.0)          # one value in every row, as the conv data's kernel size
    target = 20.0 + ideal / 0.5
    m = T.fit_group(0, x, ideal, target, epochs=3, batch=64)
    w1 = m.layers[0][0]
    assert not w1[:, 15].any()
    assert np.abs(w1[:, 14]).sum() > 0  # a varied input keeps its weights
    other = x.copy()
    other[:, 15] = 0.0                 # a 1x1 kernel
    np.testing.assert_array_equal(m.times_us(other, ideal), m.times_us(x, ideal))


@pytest.mark.skipif(not len(opmodel.weights()), reason="no shipped op-model weights")
def test_shipped_networks_ignore_inputs_constant_in_their_data():
    mlp = opmodel.weights()
    for g in range(F.N_GROUPS):
        if not has_group(mlp, g):
            continue
        std, w1 = _first_layer(mlp, g)
        # fit_group keeps a unit scale for an input with no spread.
        assert not w1[:, std == 1.0].any(), F.GROUP_NAMES[g]


@pytest.mark.skipif(not len(opmodel.weights()), reason="no shipped op-model weights")
def test_a_pointwise_convolution_is_priced_by_its_gemm_not_by_random_weights():
    """A 1x1 stride-2 convolution and the same implicit GEMM described with
    the data's 3x3 stride-1 kernel inputs get one efficiency."""
    from predictor import hardware
    from predictor import reference as R
    from predictor.kernels.roofline import default_params

    mlp = opmodel.weights()
    gpu = hardware.database().features([hardware.get("V100-SXM2-16GB")])[0]
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:11] = (64, 256, 56, 56, 512, 1, 1, 28, 28, 1, 2)  # N C H W K R S P Q groups stride
    x = np.array(R.row_features(L.CONV, L.F32, d, gpu, default_params()))
    assert x[15] == 0.0 and x[16] == 1.0
    as_data = x.copy()
    as_data[15], as_data[16] = np.log2(3.0), 0.0
    assert R.efficiency(mlp, F.G_CONV, x) == R.efficiency(mlp, F.G_CONV, as_data)
