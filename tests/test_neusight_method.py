"""The NeuSight-method harness (benchmarks/neusight_method.py): its tiles and
waves, its bounded utilisation fit, and its file reading, without the data."""

import numpy as np
import pandas as pd

from benchmarks import neusight_method as N
from predictor import hardware


def _rows(gpu, bt, m, n, k):
    return pd.DataFrame({"gpu": [gpu] * len(m), "bt": bt, "m": m, "n": n, "k": k})


def test_waves_and_per_sm_roofline_follow_the_tile():
    sms = int(hardware.get("A100-PCIE-40GB").spec["sms"])  # 108
    rows = _rows("A100-PCIE-40GB", [1, 1, 4], [256, 128 * 109, 1024], [256, 128, 1024],
                 [512, 512, 64])
    x, waves, t_wave = N.features(rows, np.array([128, 128, 128]), np.array([128, 128, 128]))
    # 2 x 2 tiles; 109 tiles on 108 SMs take two waves; 4 x 8 x 8 = 256 tiles.
    assert waves.tolist() == [1, 2, -(-256 // sms)]
    spec = hardware.get("A100-PCIE-40GB").spec
    per_sm_flops = spec["fp32_tflops"] * 1e12 / sms
    assert np.isclose(t_wave[0], 2 * 128 * 128 * 512 / per_sm_flops * 1e3)
    assert x.shape == (3, len(N.INPUTS)) and np.all(np.isfinite(x))
    # A subset of the inputs, in the order asked for.
    x2, _, _ = N.features(rows, np.array([128] * 3), np.array([128] * 3), ("waves", "compute"))
    assert np.allclose(x2, x[:, [N.INPUTS.index("waves"), N.INPUTS.index("compute")]])


def test_unnamed_kernels_take_a_128_square_tile():
    rows = _rows("T4", [1], [300], [300], [64])
    _, named, _ = N.features(rows, np.array([128]), np.array([128]))
    _, unnamed, _ = N.features(rows, np.array([0]), np.array([0]))
    assert named.tolist() == unnamed.tolist() == [1]


def test_the_fit_learns_a_bounded_utilisation():
    """Times made from a known gamma - alpha / waves are recovered within a
    few percent, and every prediction is finite and positive."""
    rng = np.random.default_rng(0)
    n = 3000
    waves = rng.integers(1, 64, n).astype(np.float64)
    t_wave = rng.uniform(0.01, 1.0, n)
    x = np.stack([np.log2(t_wave), np.log2(waves)], axis=1)
    util = 0.8 - 0.4 / waves
    ms = waves * t_wave / util
    predict = N.fit(x, waves, t_wave, ms, epochs=15)
    pred = predict(x, waves, t_wave)
    assert np.all(np.isfinite(pred)) and np.all(pred > 0)
    assert N.mape(pred, ms) < 5.0


def test_gemm_files_are_read_as_the_datasets_read_them(tmp_path):
    head = "OPName,Latency,Device,Kernel Name,B,M,N,K\n"
    (tmp_path / "lin.csv").write_text(
        head + "linear,0.5,Tesla T4,turing_sgemm_128x64_tn,2,64,512,256\n"
        "bmm,0.1,Tesla T4,volta_sgemm_64x64_nn,2,64,512,256\n")
    lin = N.read_gemms([tmp_path / "lin.csv"], "linear")
    # x[B*M, N] @ W[K, N]^T: output (B*M) x K, reduction N.
    assert lin[["bt", "m", "n", "k"]].values.tolist() == [[1, 128, 256, 512]]
    assert lin["gpu"].tolist() == [hardware.get("T4").id]
    bmm = N.read_gemms([tmp_path / "lin.csv"], "bmm")
    assert bmm[["bt", "m", "n", "k"]].values.tolist() == [[2, 64, 256, 512]]
    assert (bmm[["tile_m", "tile_n"]].values > 0).all()


def test_missing_data_is_one_line(tmp_path, capsys):
    assert N.main(["--data", str(tmp_path)]) == 2
    assert "no NeuSight training data" in capsys.readouterr().out


def test_a_rule_without_the_gpus_architecture_falls_back_to_the_analytical_tile():
    from predictor.kernels.tiles import CANDIDATES, fallback_tile

    rows = _rows("A100-PCIE-40GB", [1, 8], [4096, 512], [4096, 64], [1024, 512])
    tm, tn = N.predicted_tiles(rows, "bmm", np.zeros(0))
    sms = int(hardware.get("A100-PCIE-40GB").spec["sms"])
    for i in range(len(rows)):
        c = fallback_tile(sms, int(rows["bt"][i]), int(rows["m"][i]), int(rows["n"][i]))
        assert (tm[i], tn[i]) == (CANDIDATES[c, 0], CANDIDATES[c, 1])


def test_per_sm_tile_columns_are_set_for_batched_gemms_only(data_dir):
    """feature_selection's smtilec / smtileb candidates (benchmarks/tiles.py)."""
    from benchmarks import tiles as tiles_bench
    from predictor.calibration import datasets as D

    tiles_bench.DATA[0] = data_dir
    s = D.load_train(data_dir, ops=("linear", "bmm", "add"))
    s = s.subset((s.gpu == "T4") & (np.arange(len(s)) % 97 == 0))
    comp, mem = tiles_bench.per_sm_tile_columns(s)
    batched = (s.op == "bmm") & (s.dims[:, 0] > 1)
    assert batched.any() and (~batched).any()
    assert np.all(comp[~batched] == 0) and np.all(mem[~batched] == 0)
    assert np.all(np.isfinite(comp[batched])) and np.all(np.isfinite(mem[batched]))
    # A tile of 32 x 32 or more over K >= 1 moves at least 4 KiB per SM.
    spec = hardware.get("T4").spec
    per_sm_bw = spec["memory_bw_gbs"] * 1e9 / spec["sms"]
    assert np.all(mem[batched] >= np.log2(4096 / per_sm_bw * 1e6) - 1e-9)
