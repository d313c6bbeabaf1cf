"""Predicted against the throughput timm publishes for its own benchmark runs
on GeForce boards, in NCHW and channels-last, under PyTorch's autocast.

    python -m benchmarks.timm_published

A reported check, not a fit: nothing in the predictor is tuned to these
figures. They are a third publisher beside NVIDIA and Lambda
(`benchmarks.amp_published`), and the only one here that runs the same models
in both memory formats on the same board, so the price of cuDNN's layout
transposes around NCHW half-precision convolutions can be read off directly.

What timm's `benchmark.py` times (huggingface/pytorch-image-models, at the
commits below): a model from `timm.create_model` with synthetic inputs of its
default size; `--amp`, `torch.cuda.amp.autocast` (fp16) around the forward
and the loss, no GradScaler; `--channels-last` for the NHWC files.

- *Training*: `optimizer.zero_grad()`, forward, `nn.CrossEntropyLoss` on
  random labels, `backward()`, and timm's default optimizer, SGD with
  Nesterov momentum (torch 1.12's SGD updates one parameter at a time);
  samples over the wall time of 40 steps after 10 warm-ups. Traced here as
  the same step with `amp="fp16"`, which adds a GradScaler's few kernels
  (well under 1 % of these steps), and PyTorch's per-parameter SGD
  (`sgd-loop`; without momentum: one kernel a parameter fewer).
- *Inference*: `model.eval()`, forward under autocast and `no_grad`.

The vision transformers (``VIT_PUBLISHED``, their own table) are traced
from Hugging Face ViT configs of timm's shapes, the path a user's
``config.json`` takes; their parameter counts equal timm's.

timm's ResNets are torchvision's layer for layer (Bottleneck v1.5, a 3 x 3
stride-2 max pool; its global pool is a mean, torchvision's an adaptive
average pool: the same kernel work), traced from the zoo's ResNet with 3-4-6-3,
3-4-23-3 and 3-8-36-3 blocks; its Inception v3 is torchvision's without the
auxiliary head (timm's default), traced from the zoo's.
"""

from __future__ import annotations

import argparse

import numpy as np

_TIMM = "https://github.com/huggingface/pytorch-image-models/blob/{}/results/{}"
TRAIN_NCHW = _TIMM.format("5e7d47ca105a59a39778102d3276291d6db5dd32",
                          "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv")
TRAIN_NHWC = _TIMM.format("5e7d47ca105a59a39778102d3276291d6db5dd32",
                          "benchmark-train-amp-nhwc-pt112-cu113-rtx3090.csv")
INFER_NCHW = _TIMM.format("5c33776aa59f0f05bfb8008ff546ed4c09083f1a",
                          "benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv")
INFER_NHWC = _TIMM.format("7479d451a6dfd8af27f941b8e82a7402461fae80",
                          "benchmark-infer-amp-nhwc-pt240-cu124-rtx4090.csv")

# (mode, model, GPU, memory format, batch, published samples/s, source):
# training on an RTX 3090 with torch 1.12 / CUDA 11.3, inference on an RTX
# 4090 with torch 2.4 / CUDA 12.4 (each file's own batch size).
PUBLISHED = [
    ("train", "resnet50", "RTX-3090", "nchw", 512, 826.06, TRAIN_NCHW),
    ("train", "resnet50", "RTX-3090", "nhwc", 512, 1218.01, TRAIN_NHWC),
    ("train", "resnet101", "RTX-3090", "nchw", 256, 568.98, TRAIN_NCHW),
    ("train", "resnet101", "RTX-3090", "nhwc", 256, 747.89, TRAIN_NHWC),
    ("train", "resnet152", "RTX-3090", "nchw", 192, 370.08, TRAIN_NCHW),
    ("train", "resnet152", "RTX-3090", "nhwc", 192, 501.44, TRAIN_NHWC),
    ("train", "inception_v3", "RTX-3090", "nchw", 384, 602.27, TRAIN_NCHW),
    ("train", "inception_v3", "RTX-3090", "nhwc", 384, 782.35, TRAIN_NHWC),
    ("inference", "resnet50", "RTX-4090", "nchw", 1024, 4217.6, INFER_NCHW),
    ("inference", "resnet50", "RTX-4090", "nhwc", 512, 5088.39, INFER_NHWC),
    ("inference", "resnet101", "RTX-4090", "nchw", 1024, 2736.75, INFER_NCHW),
    ("inference", "resnet101", "RTX-4090", "nhwc", 512, 3320.94, INFER_NHWC),
    ("inference", "resnet152", "RTX-4090", "nchw", 1024, 1941.85, INFER_NCHW),
    ("inference", "inception_v3", "RTX-4090", "nchw", 1024, 3663.18, INFER_NCHW),
    ("inference", "inception_v3", "RTX-4090", "nhwc", 512, 4356.9, INFER_NHWC),
]

RESNET_BLOCKS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3),
                 "resnet152": (3, 8, 36, 3)}

# Vision transformers, a table of their own: traced from Hugging Face ViT
# configs of timm's shapes (predictor.zoo.hf_config; a 1,000-class head and
# qkv biases, as timm's), with attention as timm ran it under torch 1.12 (no
# fused SDPA then): q k^T, softmax and @ v, each a kernel ("eager").
# name: (hidden, layers, heads, MLP width, patch)
VIT_SHAPES = {"vit_small_patch16_224": (384, 12, 6, 1536, 16),
              "vit_base_patch16_224": (768, 12, 12, 3072, 16),
              "vit_large_patch32_224": (1024, 24, 16, 4096, 32)}
VIT_PUBLISHED = [
    ("train", "vit_small_patch16_224", "RTX-3090", "nchw", 384, 1052.92, TRAIN_NCHW),
    ("train", "vit_base_patch16_224", "RTX-3090", "nchw", 192, 390.86, TRAIN_NCHW),
    ("train", "vit_large_patch32_224", "RTX-3090", "nchw", 256, 521.73, TRAIN_NCHW),
]


# Depthwise convolutions, a table of their own: ConvNeXt-T (7x7 depthwise,
# layer norms, GELU MLPs), MobileNetV2 (3x3 depthwise, ReLU6, inverted
# residuals) and EfficientNet-B0 (3x3 and 5x5 depthwise, squeeze-and-excite,
# SiLU), traced from Hugging Face configs of timm's shapes (their parameter
# counts are timm's), training on the RTX 3090 in both formats.
DEPTHWISE_PUBLISHED = [
    ("train", "convnext_tiny", "RTX-3090", "nchw", 256, 813.16, TRAIN_NCHW),
    ("train", "convnext_tiny", "RTX-3090", "nhwc", 256, 819.24, TRAIN_NHWC),
    ("train", "mobilenetv2_100", "RTX-3090", "nchw", 512, 1832.14, TRAIN_NCHW),
    ("train", "mobilenetv2_100", "RTX-3090", "nhwc", 512, 2313.1, TRAIN_NHWC),
    ("train", "efficientnet_b0", "RTX-3090", "nchw", 384, 1459.11, TRAIN_NCHW),
    ("train", "efficientnet_b0", "RTX-3090", "nhwc", 512, 1751.72, TRAIN_NHWC),
]
# model: (Hugging Face model type, config fields that make it timm's)
DEPTHWISE_CONFIGS = {
    "convnext_tiny": ("convnext", {}),
    # timm pads symmetrically, Hugging Face's default is TensorFlow's "same"
    "mobilenetv2_100": ("mobilenet_v2", {"tf_padding": False}),
    # Hugging Face's defaults are B7's
    "efficientnet_b0": ("efficientnet", {"width_coefficient": 1.0, "depth_coefficient": 1.0,
                                         "image_size": 224, "dropout_rate": 0.2,
                                         "hidden_dim": 1280}),
}


def depthwise_config(model: str):
    """The Hugging Face config of timm's `model` (see DEPTHWISE_CONFIGS)."""
    from transformers import AutoConfig

    kind, fields = DEPTHWISE_CONFIGS[model]
    arch = {"convnext": "ConvNext", "mobilenet_v2": "MobileNetV2",
            "efficientnet": "EfficientNet"}[kind] + "ForImageClassification"
    return AutoConfig.for_model(kind, id2label={str(i): str(i) for i in range(1000)},
                                architectures=[arch], **fields)


def vit_config(model: str):
    """The Hugging Face ViT config of timm's `model` (see VIT_SHAPES)."""
    from transformers import AutoConfig

    hidden, layers, heads, mlp, patch = VIT_SHAPES[model]
    return AutoConfig.for_model(
        "vit", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=mlp, patch_size=patch, image_size=224, num_channels=3,
        qkv_bias=True, id2label={str(i): str(i) for i in range(1000)},
        architectures=["ViTForImageClassification"], attn_implementation="eager")


def _trace(model: str, batch: int, fmt: str, mode: str):
    import predictor
    from predictor.zoo import vision

    if model in VIT_SHAPES:
        return predictor.trace(vit_config(model), batch_size=batch, amp="fp16",
                               optimizer="sgd-loop", mode=mode, name=f"timm-{model}")
    if model in DEPTHWISE_CONFIGS:
        return predictor.trace(depthwise_config(model), batch_size=batch, amp="fp16",
                               optimizer="sgd-loop", mode=mode,
                               memory_format="channels_last" if fmt == "nhwc" else None,
                               name=f"timm-{model}")
    if model in RESNET_BLOCKS:
        build, inputs = (lambda: vision.ResNet(RESNET_BLOCKS[model])), vision.resnet50_inputs
    else:
        build, inputs = (lambda: vision.Inception3(aux_logits=False)), vision.inception_v3_inputs
    return predictor.trace(build, inputs, loss_fn=vision.classification_loss,
                           batch_size=batch, amp="fp16", optimizer="sgd-loop", mode=mode,
                           memory_format="channels_last" if fmt == "nhwc" else None,
                           name=f"timm-{model}")


def run(table=None) -> list[dict]:
    import predictor

    graphs: dict = {}
    out = []
    for mode, model, gpu, fmt, batch, published, source in (PUBLISHED if table is None
                                                            else table):
        key = (mode, model, fmt)
        if key not in graphs:
            graphs[key] = _trace(model, batch, fmt, mode)
        p = predictor.predict(graphs[key], gpu, batch_size=batch)
        predicted = batch / p.iteration_ms * 1e3
        out.append({"mode": mode, "model": model, "gpu": gpu, "memory_format": fmt,
                    "batch": batch, "published": published, "predicted": predicted,
                    "step_ms": p.iteration_ms,
                    "error_pct": 100.0 * (predicted - published) / published,
                    "source": source})
    return out


def format_ratios(rows) -> list[dict]:
    """Channels-last over NCHW throughput, published and predicted, for each
    (mode, model, GPU) with both: what NCHW's layout transposes cost."""
    by = {(r["mode"], r["model"], r["gpu"], r["memory_format"]): r for r in rows}
    out = []
    for (mode, model, gpu, fmt), r in by.items():
        other = by.get((mode, model, gpu, "nchw"))
        if fmt != "nhwc" or other is None:
            continue
        out.append({"mode": mode, "model": model, "gpu": gpu,
                    "published": r["published"] / other["published"],
                    "predicted": r["predicted"] / other["predicted"]})
    return out


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    rows = run()
    print("| mode | model | GPU | memory format | batch | published samples/s | predicted "
          "| error |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['mode']} | {r['model']} | {r['gpu']} | {r['memory_format'].upper()} "
              f"| {r['batch']} | {r['published']:,.1f} | {r['predicted']:,.1f} "
              f"| {r['error_pct']:+.1f} % |")
    print()
    for mode in ("train", "inference"):
        for fmt in ("nchw", "nhwc"):
            sel = [abs(r["error_pct"]) for r in rows
                   if r["mode"] == mode and r["memory_format"] == fmt]
            if sel:
                print(f"{mode} {fmt.upper()}: mean |error| {np.mean(sel):.1f} % over {len(sel)}")
    print(f"all: mean |error| {np.mean([abs(r['error_pct']) for r in rows]):.1f} % "
          f"over {len(rows)} figures")
    print()
    print("| mode | model | GPU | NHWC / NCHW published | predicted |")
    print("| --- | --- | --- | ---: | ---: |")
    for r in format_ratios(rows):
        print(f"| {r['mode']} | {r['model']} | {r['gpu']} | {r['published']:.2f} "
              f"| {r['predicted']:.2f} |")
    print()
    vit = run(VIT_PUBLISHED)
    print("Vision transformers, traced from Hugging Face ViT configs of timm's shapes:")
    print()
    print("| model | GPU | batch | published samples/s | predicted | error |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in vit:
        print(f"| {r['model']} | {r['gpu']} | {r['batch']} | {r['published']:,.1f} "
              f"| {r['predicted']:,.1f} | {r['error_pct']:+.1f} % |")
    print(f"mean |error| {np.mean([abs(r['error_pct']) for r in vit]):.1f} % over {len(vit)}")
    print()
    dw = run(DEPTHWISE_PUBLISHED)
    print("Depthwise convolutions, traced from Hugging Face configs of timm's shapes:")
    print()
    print("| model | GPU | memory format | batch | published samples/s | predicted | error |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in dw:
        print(f"| {r['model']} | {r['gpu']} | {r['memory_format'].upper()} | {r['batch']} "
              f"| {r['published']:,.1f} | {r['predicted']:,.1f} | {r['error_pct']:+.1f} % |")
    print(f"mean |error| {np.mean([abs(r['error_pct']) for r in dw]):.1f} % over {len(dw)}")
    for r in format_ratios(dw):
        print(f"{r['model']} NHWC / NCHW: published {r['published']:.2f}, "
              f"predicted {r['predicted']:.2f}")
    print()
    print("Sources: " + "; ".join(sorted({r["source"] for r in rows + vit + dw})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
