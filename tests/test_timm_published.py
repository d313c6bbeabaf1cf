"""The timm benchmark table of benchmarks/timm_published.py: well-formed rows,
models that are timm's (by parameter count, which timm's files list), and one
row priced end to end."""

import math

import pytest
import torch

import predictor
from benchmarks import timm_published as tp

# timm's files give param_count in millions, two decimals.
TIMM_PARAMS_M = {"resnet50": 25.56, "resnet101": 44.55, "resnet152": 60.19,
                 "inception_v3": 23.83, "vit_small_patch16_224": 22.05,
                 "vit_base_patch16_224": 86.57, "vit_large_patch32_224": 306.54,
                 "convnext_tiny": 28.59, "mobilenetv2_100": 3.50, "efficientnet_b0": 5.29}


def test_every_row_names_a_known_gpu_a_mode_a_format_and_a_source():
    known = set(predictor.gpus()["id"])
    keys = set()
    for mode, model, gpu, fmt, batch, published, source in (tp.PUBLISHED + tp.VIT_PUBLISHED
                                                             + tp.DEPTHWISE_PUBLISHED):
        assert gpu in known, gpu
        assert mode in ("train", "inference") and fmt in ("nchw", "nhwc")
        assert model in TIMM_PARAMS_M
        assert isinstance(batch, int) and batch > 0
        assert math.isfinite(published) and published > 0
        assert source.startswith("https://github.com/huggingface/pytorch-image-models/blob/")
        assert f"-{'train' if mode == 'train' else 'infer'}-amp-{fmt}-" in source
        assert (mode, model, gpu, fmt) not in keys
        keys.add((mode, model, gpu, fmt))


@pytest.mark.parametrize("model", sorted(TIMM_PARAMS_M))
def test_the_traced_models_are_timms(model):
    from predictor.zoo import vision

    if model in tp.VIT_SHAPES or model in tp.DEPTHWISE_CONFIGS:
        from predictor.zoo import hf_config

        config = tp.vit_config(model) if model in tp.VIT_SHAPES else tp.depthwise_config(model)
        with torch.device("meta"):
            module = hf_config.entry(config).build()
    elif model in tp.RESNET_BLOCKS:
        module = vision.ResNet(tp.RESNET_BLOCKS[model])
    else:
        module = vision.Inception3(aux_logits=False)
    params = sum(p.numel() for p in module.parameters()) / 1e6
    assert params == pytest.approx(TIMM_PARAMS_M[model], abs=0.005)


def test_a_row_is_priced_and_the_format_ratio_reads_both_rows():
    rows = tp.run([r for r in tp.PUBLISHED if r[1] == "resnet50" and r[0] == "train"])
    assert len(rows) == 2
    for r in rows:
        assert math.isfinite(r["predicted"]) and r["predicted"] > 0
        assert r["error_pct"] == pytest.approx(
            100 * (r["predicted"] - r["published"]) / r["published"])
    (vit,) = tp.run(tp.VIT_PUBLISHED[:1])
    assert math.isfinite(vit["predicted"]) and vit["predicted"] > 0
    (ratio,) = tp.format_ratios(rows)
    assert ratio["published"] == pytest.approx(1218.01 / 826.06)
    # Channels-last skips cuDNN's layout transposes: predicted faster too.
    assert ratio["predicted"] > 1.0


def test_depthwise_networks_are_priced_near_timms_figures():
    """ConvNeXt-T, MobileNetV2 and EfficientNet-B0 training on the RTX 3090,
    NCHW and channels-last: 4.3 % mean |error| (benchmarks/README.md,
    "Depthwise convolutions"); 81 % when their depthwise convolutions were
    priced as GEMMs."""
    rows = tp.run(tp.DEPTHWISE_PUBLISHED)
    assert len(rows) == 6
    for r in rows:
        assert math.isfinite(r["predicted"]) and abs(r["error_pct"]) < 15, r
    assert sum(abs(r["error_pct"]) for r in rows) / len(rows) < 8
