"""The batched-GEMM model group: NeuSight's per-SM inputs under the GEMM tile
rule the weights carry (``kernels.features.bmm_features``)."""

import math

import numpy as np
import pytest

from predictor import hardware, opmodel, reference
from predictor.calibration import train as T
from predictor.calibration.train import pack
from predictor.engine import model_params
from predictor.kernels import layout as L
from predictor.kernels.features import (G_BMM, G_MATMUL, N_FEATURES, bmm_features,
                                        serving_group)
from predictor.kernels.tiles import CANDIDATES, choose_tile, fallback_tile
from predictor.opmodel import predict_rows
from predictor.tiles import shipped_params
from random_nets import random_net


def _gemm(bt, m, n, k, layout=0):
    d = np.zeros(L.MAX_DIMS, dtype=np.int64)
    d[:4] = (bt, m, n, k)
    d[L.GEMM_LAYOUT] = layout
    return d


@pytest.mark.parametrize("gpu", ["T4", "A100-SXM4-80GB", "H100-SXM5-80GB", "MI300X"])
@pytest.mark.parametrize("shape", [(16, 512, 512, 64), (96, 128, 128, 4096), (2, 7, 3000, 9)])
def test_inputs_are_waves_of_the_rule_tile_per_sm(gpu, shape):
    feats = hardware.get(gpu).features
    params = model_params()
    rule = shipped_params()
    d = _gemm(*shape)
    x = np.zeros(N_FEATURES)
    ideal = bmm_features(L.F32, d, feats, params, rule, x)
    c = choose_tile(rule, int(feats[L.G_CC_MAJOR]), int(feats[L.G_SMS]), *shape, False, True)
    if feats[L.G_CC_MAJOR] == 0:  # no compute capability (AMD): the analytical choice
        assert c == fallback_tile(int(feats[L.G_SMS]), shape[0], shape[1], shape[2])
    tm, tn = CANDIDATES[c]
    bt, m, n, k = shape
    sms = feats[L.G_SMS]
    waves = math.ceil(bt * math.ceil(m / tm) * math.ceil(n / tn) / sms)
    assert x[5] == pytest.approx(math.log2(waves))
    peak_sm = feats[L.G_FP32_TFLOPS] * 1e12 * max(feats[L.G_FFMA_ISSUE], 0) / sms \
        if feats[L.G_FFMA_ISSUE] > 0 else feats[L.G_FP32_TFLOPS] * 1e12 / sms
    assert 2 ** x[0] == pytest.approx(waves * 2.0 * tm * tn * k / peak_sm * 1e6, rel=1e-9)
    bw_sm = feats[L.G_MEM_BW_GBS] * 1e9 / sms
    assert 2 ** x[1] == pytest.approx(waves * 4.0 * (tm * k + tn * k + tm * tn) / bw_sm * 1e6,
                                      rel=1e-9)
    assert x[2] == pytest.approx(min(x[0] - x[1], 0.0))
    assert ideal == pytest.approx(max(2 ** x[0], 2 ** x[1]), rel=1e-9)
    # Nothing else of the shape or the GPU.
    assert not np.any(np.delete(x, [0, 1, 2, 5]))
    ref_x, ref_ideal = reference.bmm_features(L.F32, d, feats, params, list(rule))
    assert np.allclose(ref_x, x, rtol=1e-12) and ref_ideal == pytest.approx(ideal, rel=1e-12)


def test_batched_gemms_go_to_their_own_network_and_others_do_not():
    rule = shipped_params()
    both = pack({G_MATMUL: random_net(G_MATMUL, 0), G_BMM: random_net(G_BMM, 1, rule)})
    matmul_only = pack({G_MATMUL: random_net(G_MATMUL, 0)})
    assert opmodel.layout_problem(both) is None
    batched, single = _gemm(8, 256, 256, 256), _gemm(1, 2048, 256, 256, L.GEMM_B_T)
    assert serving_group(L.MATMUL, batched, both) == G_BMM
    assert serving_group(L.MATMUL, single, both) == G_MATMUL
    # Weights without a batched-GEMM network price batched GEMMs with the matmul one.
    assert serving_group(L.MATMUL, batched, matmul_only) == G_MATMUL
    fam = np.full(2, L.MATMUL)
    dims = np.stack([batched, single])
    a = predict_rows(fam, dims, "V100-PCIE-32GB", mlp=both)
    b = predict_rows(fam, dims, "V100-PCIE-32GB", mlp=matmul_only)
    assert a[1] == b[1] and a[0] != b[0]
    assert np.isfinite(a).all() and (a > 0).all()


def test_the_weights_carry_their_tile_rule():
    """Two batched-GEMM networks alike but for their tile rule price a GEMM
    whose tile the rules choose differently differently."""
    rule = shipped_params()
    gpu = hardware.get("T4").features
    shape = (4, 1000, 1000, 512)
    learned = choose_tile(rule, int(gpu[L.G_CC_MAJOR]), int(gpu[L.G_SMS]), *shape, False, True)
    fallback = fallback_tile(int(gpu[L.G_SMS]), *shape[:3])
    if learned == fallback:
        pytest.skip("the shipped rule and the fallback agree on this shape")
    fam, dims = np.full(1, L.MATMUL), _gemm(*shape)[None]
    a = predict_rows(fam, dims, "T4", mlp=pack({G_BMM: random_net(G_BMM, 1, rule)}))
    b = predict_rows(fam, dims, "T4", mlp=pack({G_BMM: random_net(G_BMM, 1)}))
    assert a[0] != b[0]


def test_a_damaged_tile_rule_is_refused(tmp_path):
    w = pack({G_BMM: random_net(G_BMM, 1, shipped_params()[:-3])})
    assert "GEMM tile rule" in opmodel.layout_problem(w)
    w = pack({G_BMM: random_net(G_BMM, 1, shipped_params())})
    w[1 + T.HEADER * G_BMM + 9] += 1000  # more numbers claimed than stored
    assert "past the end" in opmodel.layout_problem(w)


def test_training_fits_the_rule_on_its_own_samples(data_dir):
    """The batched-GEMM group's tile rule comes from the kernels of the very
    samples it is trained on: a model trained without a GPU never saw that
    GPU's tile choices either."""
    from predictor.calibration import datasets as D
    from predictor.calibration import tiles as C

    s = D.load_train(data_dir, ops=("linear", "bmm"))
    s = s.subset((np.arange(len(s)) % 20 == 0) & (s.gpu != "T4"))
    mlp = T.train(s, seed=0, epochs=1, ensemble=1, groups=(G_MATMUL, G_BMM))
    assert opmodel.layout_problem(mlp) is None
    h = 1 + T.HEADER * G_BMM
    aux = mlp[int(mlp[h + 8]):int(mlp[h + 8]) + int(mlp[h + 9])]
    assert np.array_equal(aux, C.fit(C.from_samples(s)))
    assert "T4" not in set(C.from_samples(s).gpu)
    ev = s.subset(s.dims[:, 0] > 1)
    t = predict_rows(ev.family, ev.dims, "T4", mlp=mlp, params=T.training_params())
    assert np.isfinite(t).all() and (t > 0).all()


def test_the_matmul_networks_offsets_are_over_every_gemm_it_was_fitted_on(data_dir):
    """The matmul network prices both operand layouts (unbatched `x @ W` from
    the batched rows), so its per-chip offset is measured over every GEMM,
    as if there were no batched-GEMM network; the batched-GEMM network's
    over the batched rows it prices."""
    from predictor.calibration import datasets as D
    from predictor.kernels.mlp import has_group

    mlp = opmodel.weights().copy()
    if not has_group(mlp, G_BMM):
        pytest.skip("the shipped weights have no batched-GEMM network")
    for g in range(int(mlp[0])):
        mlp[1 + T.HEADER * g + 6:1 + T.HEADER * g + 8] = 0  # no corrections
    s = D.load_train(data_dir, ops=("linear", "bmm"))
    s = s.subset(np.arange(len(s)) % 3 == 0)
    no_bmm = mlp.copy()
    no_bmm[1 + T.HEADER * G_BMM] = 0
    with_bmm, without = T.chip_corrections(s, mlp), T.chip_corrections(s, no_bmm)
    assert with_bmm[G_MATMUL] == without[G_MATMUL]
    assert G_BMM not in without and len(with_bmm[G_BMM]) == len(set(s.gpu))


def test_the_accuracy_harness_trains_the_groups_that_price_the_scored_rows():
    from benchmarks.accuracy import serving_groups
    from predictor.calibration import datasets as D
    from predictor.kernels.features import G_CONV, G_SOFTMAX

    def rows(family, bt):
        d = np.stack([_gemm(bt, 64, 64, 64)] * 2)
        return D.OpSamples(np.array(["x", "x"], dtype=object), np.full(2, family, np.int64), d,
                           np.array(["T4", "T4"], dtype=object), np.ones(2))

    assert serving_groups(rows(L.CONV, 1)) == (G_CONV,)
    assert serving_groups(rows(L.MATMUL, 1)) == (G_MATMUL,)
    assert serving_groups(rows(L.MATMUL, 8)) == (G_MATMUL, G_BMM)
    both = D.OpSamples.concat([rows(L.SOFTMAX, 1), rows(L.LSTM, 1)])
    assert serving_groups(both) == (G_SOFTMAX,)  # LSTM: analytical only


def test_a_batch_of_two_is_never_faster_than_one_gemm_alone():
    """The two networks meet at batch 1 -> 2: a batched GEMM is floored at one
    of its GEMMs as the matmul network prices it (optime.learned_row_us)."""
    rule = shipped_params()
    mlp = pack({G_MATMUL: random_net(G_MATMUL, 0), G_BMM: random_net(G_BMM, 1, rule)})
    fam = np.full(2, L.MATMUL)
    for gpu in ("H100-SXM5-80GB", "T4", "P100-PCIE-16GB"):
        for shape in ((28, 308, 419), (512, 64, 64), (7, 4096, 33)):
            one, two = predict_rows(fam, np.stack([_gemm(1, *shape), _gemm(2, *shape)]), gpu,
                                    mlp=mlp)
            assert two >= one
    if opmodel.weights().size:  # the shipped networks, on the case that showed it
        one, two = predict_rows(fam, np.stack([_gemm(1, 28, 308, 419), _gemm(2, 28, 308, 419)]),
                                "H100-SXM5-80GB")
        assert two >= one
