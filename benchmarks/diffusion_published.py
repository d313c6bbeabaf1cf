"""Stable Diffusion v1.5 denoising steps predicted against the throughput
Hugging Face's diffusers team published for PyTorch 2.0: a half-precision
UNet with group norms, fused attention and channels-last convolutions, on
five GPUs at batch sizes 1, 4 and 16.

    python -m benchmarks.diffusion_published
    python -m benchmarks.diffusion_published --breakdown
    python -m benchmarks.diffusion_published --measure DIR   # on a CUDA GPU (gpu_session.sh)

A reported check, not a fit: nothing in the predictor is tuned to these
figures. Source: diffusers' documentation page "Accelerated PyTorch 2.0
support in Diffusers" (`docs/source/en/optimization/torch2.0.mdx`, the
"Benchmark" section, stored at commit 07dc8fe), the column "torch 2.0 - no
compile" of its "SD - txt2img" rows: iterations a second (tqdm's rate over
the 50 denoising steps; the T4 at batch 16 as seconds an iteration) of
`DiffusionPipeline.from_pretrained("runwayml/stable-diffusion-v1-5",
torch_dtype=torch.float16)` with `pipe.unet.to(memory_format=
torch.channels_last)`, diffusers 0.17.0.dev0, on an A100, a V100, a T4, an
RTX 3090 and an RTX 4090; the batch is `num_images_per_prompt`.

What one iteration runs (diffusers 0.17's pipeline and models, written again
here as `DenoisingStep`; the UNet's configuration is SD v1.5's, 859,520,964
parameters):

- classifier-free guidance: the latents `[B, 4, 64, 64]` (512 x 512 images)
  are doubled, so the UNet runs at batch 2B against the text encoder's
  `[2B, 77, 768]` embeddings (computed once before the loop, not in it);
  then `uncond + 7.5 * (text - uncond)`;
- the UNet (`UNet2DConditionModel`): 320 / 640 / 1,280 / 1,280 channels, two
  ResNet blocks a level down and three up (group norm of 32 groups, SiLU,
  3 x 3 convolutions, the time embedding added), a transformer block after
  each ResNet block of the first three levels and in the middle (group
  norm, a 1 x 1 projection, self-attention, cross-attention to the text,
  a GEGLU feed-forward; 8 heads, attention by
  `F.scaled_dot_product_attention`, PyTorch 2.0's fused kernels);
- the scheduler's step: PNDM's linear multistep (the 4-term combination of
  this and the last three noise predictions, then the update of the
  latents), a dozen small pointwise kernels.

Assumed, as the page does not say: the A100 is an A100 SXM4 40GB and the
V100 a V100 SXM2 16GB (the cloud boards of those names in 2023). The A100
PCIe 40GB and the A100 SXM4 80GB are shown beside it (`--a100`).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.ncf_published import breakdown_parser, print_step_table, print_summary, step_row

SOURCE = ("Hugging Face diffusers, https://github.com/huggingface/diffusers/blob/"
          "07dc8feb1d54c93adb9a7443a48a6741e1dbf43f/docs/source/en/optimization/torch2.0.mdx "
          "(Benchmark, SD - txt2img, torch 2.0 - no compile)")

LATENT, LATENT_CHANNELS = 64, 4          # a 512 x 512 image's latents
TEXT_TOKENS, TEXT_DIM = 77, 768          # CLIP ViT-L/14's last hidden state
CHANNELS = (320, 640, 1280, 1280)
HEADS, GROUPS = 8, 32
GUIDANCE = 7.5

# (GPU, batch, published seconds a denoising step): the page's it/s
# inverted, and the T4's batch-16 figure, which it gives in s/it.
PUBLISHED = [
    ("A100-SXM4-40GB", 1, 1 / 21.66),
    ("A100-SXM4-40GB", 4, 1 / 11.6),
    ("A100-SXM4-40GB", 16, 1 / 3.04),
    ("V100-SXM2-16GB", 1, 1 / 18.99),
    ("V100-SXM2-16GB", 4, 1 / 5.96),
    ("V100-SXM2-16GB", 16, 1 / 1.66),
    ("T4", 1, 1 / 6.9),
    ("T4", 4, 1 / 1.79),
    ("T4", 16, 2.34),
    ("RTX-3090", 1, 1 / 22.56),
    ("RTX-3090", 4, 1 / 6.46),
    ("RTX-3090", 16, 1 / 1.7),
    ("RTX-4090", 1, 1 / 40.5),
    ("RTX-4090", 4, 1 / 12.62),
    ("RTX-4090", 16, 1 / 3.17),
]
OTHER_A100 = ("A100-PCIE-40GB", "A100-SXM4-80GB")
# The same table's "torch 2.0 - compile" column (`torch.compile(unet,
# mode="reduce-overhead", fullgraph=True)`), seconds a step: CUDA graphs take
# the host out and Inductor fuses the pointwise work, so such a step is at
# least the time of its GEMMs, convolutions and attention. The T4 at batch 16
# ran out of memory.
COMPILED = {("A100-SXM4-40GB", 1): 1 / 44.03, ("A100-SXM4-40GB", 4): 1 / 14.62,
            ("A100-SXM4-40GB", 16): 1 / 3.83, ("V100-SXM2-16GB", 1): 1 / 20.95,
            ("V100-SXM2-16GB", 4): 1 / 6.83, ("V100-SXM2-16GB", 16): 1 / 1.92,
            ("T4", 1): 1 / 7.3, ("T4", 4): 1 / 2.03, ("RTX-3090", 1): 1 / 23.84,
            ("RTX-3090", 4): 1 / 7.29, ("RTX-3090", 16): 1 / 1.93, ("RTX-4090", 1): 1 / 44.65,
            ("RTX-4090", 4): 1 / 15.32, ("RTX-4090", 16): 1 / 3.84}
TENSOR_FAMILIES = ("conv", "matmul", "attention")


class ResnetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, time_dim: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(GROUPS, c_in, eps=1e-5)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.time_emb_proj = nn.Linear(time_dim, c_out)
        self.norm2 = nn.GroupNorm(GROUPS, c_out, eps=1e-5)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return (x + h) / 1.0       # diffusers divides by output_scale_factor (1.0): a kernel


class Attention(nn.Module):
    def __init__(self, dim: int, context_dim: int | None = None):
        super().__init__()
        kv = context_dim or dim
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(kv, dim, bias=False)
        self.to_v = nn.Linear(kv, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, context=None):
        b = x.shape[0]
        context = x if context is None else context
        q, k, v = (t.view(b, -1, HEADS, t.shape[-1] // HEADS).transpose(1, 2)
                   for t in (self.to_q(x), self.to_k(context), self.to_v(context)))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(b, -1, q.shape[1] * q.shape[-1]))


class TransformerBlock(nn.Module):
    """diffusers' Transformer2DModel with one BasicTransformerBlock."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.GroupNorm(GROUPS, dim, eps=1e-6)
        self.proj_in = nn.Conv2d(dim, dim, 1)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(dim) for _ in range(3))
        self.attn1 = Attention(dim)
        self.attn2 = Attention(dim, TEXT_DIM)
        self.ff_proj = nn.Linear(dim, 8 * dim)      # GEGLU: value and gate
        self.ff_out = nn.Linear(4 * dim, dim)
        self.proj_out = nn.Conv2d(dim, dim, 1)

    def forward(self, x, context):
        b, c, hgt, wid = x.shape
        h = self.proj_in(self.norm(x))
        h = h.permute(0, 2, 3, 1).reshape(b, hgt * wid, c)
        h = self.attn1(self.norm1(h)) + h
        h = self.attn2(self.norm2(h), context) + h
        value, gate = self.ff_proj(self.norm3(h)).chunk(2, dim=-1)
        h = self.ff_out(value * F.gelu(gate)) + h
        h = h.reshape(b, hgt, wid, c).permute(0, 3, 1, 2).contiguous()
        return self.proj_out(h) + x


class UNet(nn.Module):
    """SD v1.5's UNet2DConditionModel (down: three cross-attention levels and
    a plain one; up: the mirror, each ResNet block fed the matching skip)."""

    def __init__(self, channels: tuple[int, ...] = CHANNELS):
        super().__init__()
        c0 = channels[0]
        self.channels = channels
        self.time_1 = nn.Linear(c0, 4 * c0)
        self.time_2 = nn.Linear(4 * c0, 4 * c0)
        self.conv_in = nn.Conv2d(LATENT_CHANNELS, c0, 3, padding=1)
        self.down = nn.ModuleList()
        skips = [c0]
        c_prev = c0
        for level, c in enumerate(channels):
            attn = level < 3
            blocks = nn.ModuleList()
            for i in range(2):
                blocks.append(nn.ModuleList([ResnetBlock(c_prev if i == 0 else c, c, 4 * c0)]
                                            + ([TransformerBlock(c)] if attn else [])))
                skips.append(c)
            down = nn.Conv2d(c, c, 3, stride=2, padding=1) if level < 3 else None
            if down is not None:
                skips.append(c)
            self.down.append(nn.ModuleDict({"blocks": blocks, **({"down": down} if down else {})}))
            c_prev = c
        self.mid = nn.ModuleList([ResnetBlock(channels[-1], channels[-1], 4 * c0),
                                  TransformerBlock(channels[-1]),
                                  ResnetBlock(channels[-1], channels[-1], 4 * c0)])
        self.up = nn.ModuleList()
        for level, c in enumerate(reversed(channels)):
            attn = level > 0
            blocks = nn.ModuleList()
            for i in range(3):
                c_in = (c_prev if i == 0 else c) + skips.pop()
                blocks.append(nn.ModuleList([ResnetBlock(c_in, c, 4 * c0)]
                                            + ([TransformerBlock(c)] if attn else [])))
            up = nn.Conv2d(c, c, 3, padding=1) if level < 3 else None
            self.up.append(nn.ModuleDict({"blocks": blocks, **({"up": up} if up else {})}))
            c_prev = c
        self.norm_out = nn.GroupNorm(GROUPS, c0, eps=1e-5)
        self.conv_out = nn.Conv2d(c0, LATENT_CHANNELS, 3, padding=1)

    def time_embedding(self, t, batch: int, dtype):
        half = self.channels[0] // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32,
                                                          device=t.device) / half)
        emb = t.expand(batch)[:, None].float() * freqs[None, :]
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1).to(dtype)   # flip_sin_to_cos
        return self.time_2(F.silu(self.time_1(emb)))

    def forward(self, x, t, context):
        temb = self.time_embedding(t, x.shape[0], x.dtype)
        h = self.conv_in(x)
        skips = [h]
        for level in self.down:
            for block in level["blocks"]:
                h = block[0](h, temb)
                if len(block) > 1:
                    h = block[1](h, context)
                skips.append(h)
            if "down" in level:
                h = level["down"](h)
                skips.append(h)
        h = self.mid[0](h, temb)
        h = self.mid[2](self.mid[1](h, context), temb)
        for level in self.up:
            for block in level["blocks"]:
                h = block[0](torch.cat([h, skips.pop()], dim=1), temb)
                if len(block) > 1:
                    h = block[1](h, context)
            if "up" in level:
                h = level["up"](F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(h)))


class DenoisingStep(nn.Module):
    """One iteration of the pipeline's loop: guidance doubles the batch, the
    UNet predicts the noise, PNDM's multistep moves the latents."""

    def __init__(self, channels: tuple[int, ...] = CHANNELS):
        super().__init__()
        self.unet = UNet(channels)

    def forward(self, latents, t, context, ets1, ets2, ets3):
        noise = self.unet(torch.cat([latents] * 2), t, context)
        uncond, text = noise.chunk(2)
        noise = uncond + GUIDANCE * (text - uncond)
        # PNDM (skip_prk_steps): the last four noise predictions combined,
        # then prev = a * sample - b * noise / c with the step's scalars
        noise = (1 / 24) * (55 * noise - 59 * ets1 + 37 * ets2 - 9 * ets3)
        return 0.99 * latents - 0.01 * noise / 0.98


def build() -> nn.Module:
    return DenoisingStep().half().eval()


def inputs(batch: int):
    latent = torch.zeros(batch, LATENT_CHANNELS, LATENT, LATENT, dtype=torch.float16)
    return (latent, torch.tensor(981), torch.zeros(2 * batch, TEXT_TOKENS, TEXT_DIM,
                                                    dtype=torch.float16),
            latent.clone(), latent.clone(), latent.clone())


def trace():
    import predictor

    return predictor.trace(build, inputs, mode="inference", batch_size=1,
                           memory_format="channels_last", name="sd15-denoising-step")


def predict_rows(table=None, graph=None) -> list[dict]:
    """One dict per published figure: predicted images/s and its error."""
    import predictor

    graph = trace() if graph is None else graph
    out = []
    for gpu, batch, seconds in (PUBLISHED if table is None else table):
        p = predictor.predict(graph, gpu, batch_size=batch)
        out.append(step_row("sd15", gpu, "fp16", batch, batch / seconds, batch, p, SOURCE))
    return out


def print_compiled(rows: list[dict]) -> None:
    """Each row's published eager and compiled step beside the predicted
    step and the predicted time of its GEMMs, convolutions and attention
    alone, which no compiled step can beat."""
    print("\n| GPU | batch | published eager ms | published compiled ms | predicted ms "
          "| of which GEMMs, convolutions, attention |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        compiled = COMPILED.get((r["gpu"], r["batch"]))
        tensor = float(r["by_family"]["ms"].reindex(list(TENSOR_FAMILIES)).fillna(0).sum())
        shown = f"{compiled * 1e3:.0f}" if compiled else "out of memory"
        print(f"| {r['gpu']} | {r['batch']} | {r['published_step_ms']:.0f} | {shown} | "
              f"{r['step_ms']:.0f} | {tensor:.0f} |")


def measure(out_dir, device: str = "cuda", batches=(1, 4, 16), latent: int = LATENT,
            steps: int = 10, channels: tuple[int, ...] = CHANNELS) -> dict:
    """Time `DenoisingStep` (random fp16 weights, channels-last, no_grad) on
    `device` at each batch, and profile one step's kernels: what the
    published figures cannot say, whether a GPU's time goes where the
    prediction puts it. Writes ``sd15.json`` (ms a step by batch, the
    predicted ms for this GPU where the database names it) and
    ``sd15-b<batch>-kernels.csv`` (device µs a step by kernel name)."""
    import json
    from pathlib import Path

    import pandas as pd
    from torch.profiler import ProfilerActivity, profile

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    half = torch.float16 if dev.type == "cuda" else torch.float32
    with torch.device(dev):
        step = DenoisingStep(channels).to(half).to(memory_format=torch.channels_last).eval()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    result = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else device,
              "torch": torch.__version__, "latent": latent, "ms": {}}
    for batch in batches:
        x = torch.randn(batch, LATENT_CHANNELS, latent, latent, device=dev, dtype=half)
        args = (x, torch.tensor(981, device=dev),
                torch.randn(2 * batch, TEXT_TOKENS, TEXT_DIM, device=dev, dtype=half), x, x, x)
        with torch.no_grad():
            for _ in range(3):
                step(*args)
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                step(*args)
            sync()
            result["ms"][batch] = (time.perf_counter() - t0) / steps * 1e3
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
            with profile(activities=acts) as prof:
                step(*args)
                sync()
        rows = [{"kernel": e.key, "calls": e.count,
                 "us": getattr(e, "device_time_total", 0.0) if dev.type == "cuda"
                 else e.self_cpu_time_total} for e in prof.key_averages()]
        pd.DataFrame(rows).sort_values("us", ascending=False).to_csv(
            out / f"sd15-b{batch}-kernels.csv", index=False)
        print(f"batch {batch}: {result['ms'][batch]:.1f} ms a step", flush=True)
    (out / "sd15.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv=None) -> int:
    ap = breakdown_parser(__doc__)
    ap.add_argument("--measure", metavar="DIR",
                    help="time and profile the step on this machine's CUDA GPU instead, "
                         "writing DIR/sd15.json and the kernels' CSVs")
    ap.add_argument("--smoke", action="store_true",
                    help="with --measure: a small rehearsal on the CPU (a narrow UNet, "
                         "latents of 16, batch 1, 2 steps)")
    args = ap.parse_args(argv)
    if args.smoke and not args.measure:
        ap.error("--smoke rehearses --measure: give --measure DIR")
    if args.measure:
        if args.smoke:
            measure(args.measure, "cpu", batches=(1,), latent=16, steps=2,
                    channels=(32, 64, 64, 64))
        else:
            measure(args.measure)
        return 0
    graph = trace()
    rows = predict_rows(graph=graph)
    print(SOURCE)
    print_step_table(rows, "images")
    from benchmarks.amp_published import spearman

    print(f"Spearman across the 15 figures {spearman([r['published'] for r in rows], [r['predicted'] for r in rows]):.2f}")
    for gpu in OTHER_A100:
        alt = predict_rows([(gpu, b, s) for g, b, s in PUBLISHED if g.startswith("A100")], graph)
        print(f"the A100 rows as {gpu}: " + ", ".join(f"batch {r['batch']} {r['error_pct']:+.1f} %"
                                                      for r in alt))
    print_compiled(rows)
    if rows[0]["unsupported"]:
        print(f"priced by the fallback estimate: {rows[0]['unsupported']}")
    print_summary(rows, args.breakdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
