"""Transformer-big training throughput predicted against NVIDIA's published
single-GPU figures: a check of an attention model trained by tokens.

    python -m benchmarks.transformer_published
    python -m benchmarks.transformer_published --breakdown

A reported check, not a fit: nothing in the predictor is tuned to these
figures. NVIDIA's DeepLearningExamples README for its PyTorch Transformer
(PyTorch/Translation/Transformer/README.md, the pytorch-22.06-py3 NGC
container, "Training performance results", 1 GPU) gives tokens/s averaged
over a training epoch of WMT14 English-German on a DGX A100 (A100 40GB: TF32
and mixed precision, 10,240 tokens a batch) and a DGX-1 (V100 16GB: fp32 at
2,560 tokens, mixed precision at 5,120). Its DGX-2 row is of the V100 SXM3
32GB, which the GPU database does not hold.

What `train.py` runs there (the same version's code), written again here as
`TransformerStep`: `transformer_wmt_en_de_big_t2t`, 6 + 6 pre-norm layers of
1,024 with 16 heads and a 4,096 feed-forward, attention projections without
bias, dropout 0.1 (embeddings, attention weights, ReLU and residual), one
33,712-token embedding shared by the encoder, the decoder and the output
projection (no bias), sinusoidal positions, the embeddings scaled by 32;
`F.log_softmax` in fp32 over the logits, then label smoothing 0.1 as plain
ops (gather, sum), the loss summed. The optimizer is apex's FusedAdam, one
multi-tensor kernel (traced as PyTorch's fused Adam, `adam-fused`); no
gradient clipping. "Mixed precision" is `torch.cuda.amp` autocast with a
GradScaler (`amp="fp16"` here); "TF32" is the fp32 program with TF32
matmuls, as NVIDIA's containers run it (`tf32_matmul=True`).

How a batch is counted. Batches are filled to at most `max_tokens`
sentence x length (the longer of source and target), and the figure counts
target tokens without padding, over the wall time. The corpus is sorted by
length, so a batch holds sentences of one source length and near-equal
target lengths. Traced here: n sentences of L tokens on both sides, n =
max_tokens // L rounded down to a multiple of 8 as the loader rounds it, and
predicted tokens/s = n x L over the predicted step, at L = 32 and 64 (the
step is nearly proportional to the tokens, so the figure moves little with
L). Where a pair's target is shorter than its source, a batch holds fewer
target tokens than this counts (and where it is longer, less encoder work):
the published figure can sit a few per cent either side for that alone.
Not modelled: the per-parameter division of the gradients by the batch's
token count (a loop of about 200 small kernels) and data loading.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.gnmt_published import speedups
from benchmarks.ncf_published import print_summary

SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Translation/Transformer/README.md (commit "
          "d666f14), 'Training performance results', 1 GPU, pytorch-22.06-py3 NGC container")
VOCAB, D_MODEL, HEADS, FFN, LAYERS = 33_712, 1024, 16, 4096, 6
DROPOUT, SMOOTHING = 0.1, 0.1
MAX_POSITIONS = 1024

# (GPU, precision, tokens a batch, published tokens/s)
PUBLISHED = [
    ("A100-SXM4-40GB", "tf32", 10240, 51057),
    ("A100-SXM4-40GB", "amp", 10240, 82059),
    ("V100-SXM2-16GB", "fp32", 2560, 8742),
    ("V100-SXM2-16GB", "amp", 5120, 32942),
]
LENGTHS = (32, 64)
OPTIMIZER = "adam-fused"


def sentences(max_tokens: int, length: int) -> int:
    """Sentences of `length` tokens in a batch of at most `max_tokens`,
    rounded down to a multiple of 8 as the loader rounds them."""
    return max(max_tokens // length // 8 * 8, 8)


def _sinusoids(n: int, d: int) -> torch.Tensor:
    half = d // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1)))
    angle = torch.arange(n, dtype=torch.float32)[:, None] * freq[None, :]
    return torch.cat((angle.sin(), angle.cos()), dim=1)


class Attention(nn.Module):
    """Multi-head attention with bias-free projections; queries from `x`,
    keys and values from `memory` (self-attention when it is `x`)."""

    def __init__(self, d=D_MODEL, heads=HEADS, dropout=DROPOUT):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x, memory, causal=None):
        b, t, d = x.shape
        s, h = memory.shape[1], self.heads
        q = self.q(x).view(b, t, h, d // h).transpose(1, 2).reshape(b * h, t, d // h)
        k, v = self.kv(memory).view(b, s, 2, h, d // h).permute(2, 0, 3, 1, 4) \
            .reshape(2, b * h, s, d // h).unbind(0)
        scores = torch.bmm(q * (d // h) ** -0.5, k.transpose(1, 2))
        if causal is not None:
            scores = scores + causal
        p = F.dropout(F.softmax(scores, dim=-1), self.dropout, self.training)
        o = torch.bmm(p, v).view(b, h, t, d // h).transpose(1, 2).reshape(b, t, d)
        return self.out(o)


class Layer(nn.Module):
    """A pre-norm encoder layer, or with `cross` a decoder layer."""

    def __init__(self, cross: bool):
        super().__init__()
        self.self_norm, self.self_attn = nn.LayerNorm(D_MODEL), Attention()
        self.cross_norm = nn.LayerNorm(D_MODEL) if cross else None
        self.cross_attn = Attention() if cross else None
        self.ffn_norm = nn.LayerNorm(D_MODEL)
        self.fc1, self.fc2 = nn.Linear(D_MODEL, FFN), nn.Linear(FFN, D_MODEL)

    def forward(self, x, memory=None, causal=None):
        h = self.self_norm(x)
        x = x + F.dropout(self.self_attn(h, h, causal), DROPOUT, self.training)
        if self.cross_attn is not None:
            x = x + F.dropout(self.cross_attn(self.cross_norm(x), memory), DROPOUT, self.training)
        h = F.dropout(F.relu(self.fc1(self.ffn_norm(x))), DROPOUT, self.training)
        return x + F.dropout(self.fc2(h), DROPOUT, self.training)


class TransformerStep(nn.Module):
    """Transformer-big and its label-smoothed loss: (source, target) token ids
    -> the summed loss."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.register_buffer("pos", _sinusoids(MAX_POSITIONS, D_MODEL), persistent=False)
        self.encoder = nn.ModuleList(Layer(cross=False) for _ in range(LAYERS))
        self.decoder = nn.ModuleList(Layer(cross=True) for _ in range(LAYERS))
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)

    def _embed(self, tokens):
        x = self.embed(tokens) * math.sqrt(D_MODEL) + self.pos[:tokens.shape[1]]
        return F.dropout(x, DROPOUT, self.training)

    def forward(self, source, target):
        x = self._embed(source)
        for layer in self.encoder:
            x = layer(x)
        memory = self.encoder_norm(x)
        t = target.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf"), device=target.device), diagonal=1)
        y = self._embed(target)
        for layer in self.decoder:
            y = layer(y, memory, causal)
        logits = F.linear(self.decoder_norm(y), self.embed.weight)
        lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32).view(-1, VOCAB)
        nll = -lprobs.gather(-1, target.reshape(-1, 1))
        smooth = -lprobs.sum(dim=-1, keepdim=True)
        return (1.0 - SMOOTHING) * nll.sum() + SMOOTHING / VOCAB * smooth.sum()


def factory(length: int, batch: int = 8):
    """The factory `predictor.trace` takes: (model, example inputs) at
    `batch` sentences of `length` tokens on both sides."""
    ids = torch.ones(batch, length, dtype=torch.long)
    return TransformerStep(), (ids, ids.clone())


def predict_rows(lengths=LENGTHS) -> list[dict]:
    """One dict per published figure: the predicted tokens/s at each length,
    and the error of their mean."""
    import predictor

    graphs = {}
    for seq in lengths:
        for amp in (None, "fp16"):
            graphs[(amp, seq)] = predictor.trace(lambda s=seq: factory(s), loss_fn=lambda out: out,
                                                 optimizer=OPTIMIZER, amp=amp)
    out = []
    for gpu, prec, max_tokens, published in PUBLISHED:
        row = {"gpu": gpu, "precision": prec, "max_tokens": max_tokens, "published": published}
        main, steps = [], {}
        for seq in lengths:
            n = sentences(max_tokens, seq)
            g = graphs[("fp16" if prec == "amp" else None, seq)]
            p = predictor.predict(g, gpu, batch_size=n, tf32_matmul=prec == "tf32")
            main.append(n * seq / p.iteration_ms * 1e3)
            row[f"L{seq}"] = main[-1]
            steps[seq] = p
        row["predicted"] = float(np.mean(main))
        row["error_pct"] = 100 * (row["predicted"] / published - 1)
        row["by_family"] = steps[lengths[0]].by_family()
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--breakdown", action="store_true",
                    help=f"each row's time by op family (at L = {LENGTHS[0]})")
    args = ap.parse_args(argv)
    rows = predict_rows()
    print(SOURCE)
    cols = " | ".join(f"L = {s}" for s in LENGTHS)
    print(f"\n| GPU | precision | tokens a batch | published tokens/s | predicted, {cols} "
          "| mean | error |")
    print("| --- | --- | ---: | ---: |" + " ---: |" * len(LENGTHS) + " ---: | ---: |")
    for r in rows:
        lens = " | ".join(f"{r[f'L{s}']:,.0f}" for s in LENGTHS)
        print(f"| {r['gpu']} | {r['precision']} | {r['max_tokens']:,} | {r['published']:,} | "
              f"{lens} | {r['predicted']:,.0f} | {r['error_pct']:+.1f} % |")
    print()
    for gpu, pub, pred in speedups(rows):
        print(f"{gpu}: mixed-precision speedup published {pub:.2f}x, predicted {pred:.2f}x")
    print_summary(rows, args.breakdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
