"""Transformer-XL training throughput predicted against Lambda's published
single-GPU figures: a language model with a 267,735-word softmax and
relative-position attention, on twelve GPUs in half precision and fp32/TF32.

    python -m benchmarks.transformerxl_published
    python -m benchmarks.transformerxl_published --breakdown

A reported check, not a fit: nothing in the predictor is tuned to these
figures. Lambda's PyTorch benchmark (github.com/lambdal/deeplearning-benchmark,
`pytorch/pytorch-train-throughput-fp16.csv` and `-fp32.csv` at commit
0551cb7, columns `transformerxlbase` and `transformerxllarge`, one GPU; the
batch per GPU from `pytorch-train-bs-fp16.csv` and `-fp32.csv` at 08d77c4)
runs NVIDIA DeepLearningExamples' Transformer-XL (PyTorch/LanguageModeling/
Transformer-XL) on WikiText-103 for 40 steps in the pytorch-22.09/22.10 NGC
containers; the figure is the closing "Training throughput", the tokens of
the last 10 steps over their time (batch x target length / ms a batch in
the log, e.g. `pytorch/results/AdaA6000_v1/PyTorch_transformerxlbase_FP16/`:
64 x 192 tokens at 334.4 ms a batch, 36,745 tok/s).

What the runs' own logs say they train (`Namespace(...)` in each log),
written again here as `TransformerXLStep` after the model's paper (Dai et
al., 2019) and its reference code's structure:

- base: 16 layers of d_model 512, 8 heads of 64, a 2,048 feed-forward,
  dropout 0.1, no attention dropout, target and memory length 192, optimizer
  `jitlamb`; large: 18 layers of 1,024, 16 heads of 64, a 4,096
  feed-forward, dropout and attention dropout 0.2, lengths 256, optimizer
  `adam`. Both post-norm (`pre_lnorm=False`), `attn_type=0` (relative
  positions with the two learned biases shared by every layer),
  `adaptive=False`, `div_val=1`, tied: one 267,735-word embedding, scaled by
  sqrt(d_model), shared with the output layer (which has a bias), the loss a
  full log-softmax over the vocabulary, the target's log-probability
  gathered, the mean over tokens in fp32; gradient clipping at 0.25.
- Each step attends to the previous step's hidden states (the memory: one
  [mem_len, batch, d_model] tensor per layer and the embedding, no gradient),
  so the keys and values are over mem_len + tgt_len positions; the new
  memory is the last mem_len of each layer's input, concatenated under
  no_grad.
- "fp16" is apex O2 (the whole model in fp16, fp32 master weights):
  `amp_published.o2_graph` of the fp32 trace, as the BERT SQuAD rows of
  `amp_published.py` are priced. "fp32" is the fp32 program, with TF32 matmuls on
  Ampere and later as NVIDIA's containers run it (`amp_published.
  lambda_precision`).

Approximated: both optimizers are traced as PyTorch's for-loop Adam with
clipping (`adam-loop+clip`: per-parameter kernels, as the TorchScript LAMB
and PyTorch 1.13's default Adam run; LAMB's two extra norms a parameter are
left out). The A10 and H100 SXM5 rows have no batch-size table row:
their batch is each run's own (its log, `pytorch/results/LambdaCloud_A10_v1/`
and `H100_80GB_SXM5_v1/`: the `batch_size` its Namespace line prints, or
WikiText-103's 103,227,021 training tokens over the batches an epoch it
counts and the target length), and each of their figures is the one its
log closes with.
"""

from __future__ import annotations


import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.amp_published import lambda_precision, o2_graph, spearman
from benchmarks.gnmt_published import speedups
from benchmarks.ncf_published import breakdown_args, print_step_table, print_summary, step_row

_LAMBDA = "https://github.com/lambdal/deeplearning-benchmark/blob/{}/pytorch/{}"
SOURCE = ("Lambda, " + _LAMBDA.format("0551cb70ffdc155dc4cb2c10dddebb65651c3883",
                                      "pytorch-train-throughput-fp16.csv")
          + " and -fp32.csv (columns transformerxlbase, transformerxllarge; 1 GPU); batch "
          "from pytorch-train-bs-fp16.csv / -fp32.csv at 08d77c4")
VOCAB = 267_735
# size -> (layers, d_model, heads, d_head, d_inner, dropout, attention dropout,
# target length = memory length)
CONFIGS = {
    "base": (16, 512, 8, 64, 2048, 0.1, 0.0, 192),
    "large": (18, 1024, 16, 64, 4096, 0.2, 0.2, 256),
}
OPTIMIZER = "adam-loop+clip"

# (GPU, Lambda's column, batch base / large, published tok/s base / large)
PUBLISHED = [
    ("QUADRO-RTX-8000", "fp16", (64, 32), (18223, 7853)),
    ("V100-SXM2-16GB", "fp16", (12, 4), (18493, 6071)),
    ("RTX-3090", "fp16", (24, 8), (22863, 7821)),
    ("A100-PCIE-40GB", "fp16", (52, 24), (35366, 16034)),
    ("A100-PCIE-80GB", "fp16", (104, 48), (41602, 17082)),
    ("A100-SXM4-80GB", "fp16", (104, 48), (43078, 17918)),
    ("RTX-6000-ADA", "fp16", (64, 32), (36745, 16049)),
    ("RTX-A6000", "fp16", (64, 32), (26030, 11126)),
    ("RTX-4090", "fp16", (24, 8), (40427, 14509)),
    ("H100-PCIE-80GB", "fp16", (104, 48), (47919, 22586)),
    ("QUADRO-RTX-8000", "fp32", (32, 16), (6623, 2515)),
    ("V100-SXM2-16GB", "fp32", (8, 2), (6920, 2081)),
    ("RTX-3090", "fp32", (14, 4), (12101, 4165)),
    ("A100-PCIE-40GB", "fp32", (26, 12), (23192, 10388)),
    ("A100-PCIE-80GB", "fp32", (52, 24), (28650, 12455)),
    ("A100-SXM4-80GB", "fp32", (52, 24), (30462, 13353)),
    ("RTX-6000-ADA", "fp32", (32, 16), (20477, 8641)),
    ("RTX-A6000", "fp32", (32, 16), (14495, 6143)),
    ("RTX-4090", "fp32", (14, 4), (22750, 7905)),
    ("H100-PCIE-80GB", "fp32", (52, 24), (34241, 15459)),
    ("A10", "fp16", (24, 8), (16283, 5614)),
    ("A10", "fp32", (14, 4), (8940, 3031)),
    ("H100-SXM5-80GB", "fp16", (104, 48), (62259, 30841)),
    ("H100-SXM5-80GB", "fp32", (52, 24), (45697, 22251)),
]


class RelAttention(nn.Module):
    """Multi-head attention over the memory and the segment, with relative
    positions (the paper's terms (a)+(c) and (b)+(d): `AC` and the shifted
    `BD`), residual and post-norm."""

    def __init__(self, d_model, heads, d_head, dropout, dropatt):
        super().__init__()
        self.heads, self.d_head, self.dropout, self.dropatt = heads, d_head, dropout, dropatt
        self.qkv_net = nn.Linear(d_model, 3 * heads * d_head, bias=False)
        self.r_net = nn.Linear(d_model, heads * d_head, bias=False)
        self.o_net = nn.Linear(heads * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        self.scale = 1.0 / d_head ** 0.5

    @staticmethod
    def _rel_shift(x):
        zero_pad = x.new_zeros(x.size(0), x.size(1), x.size(2), 1)
        padded = torch.cat([zero_pad, x], dim=3)
        padded = padded.view(x.size(0), x.size(1), x.size(3) + 1, x.size(2))
        return padded[:, :, 1:].view_as(x)

    def forward(self, w, r, r_w_bias, r_r_bias, mask, mem):
        qlen, bsz = w.shape[0], w.shape[1]
        n, dh = self.heads, self.d_head
        w_heads = self.qkv_net(torch.cat([mem, w], 0))
        r_head_k = self.r_net(r).view(r.shape[0], n, dh)
        q, k, v = torch.chunk(w_heads, 3, dim=-1)
        klen = k.shape[0]
        q = q[-qlen:].view(qlen, bsz, n, dh)
        k = k.view(klen, bsz, n, dh)
        v = v.view(klen, bsz, n, dh)
        ac = torch.einsum("ibnd,jbnd->bnij", q + r_w_bias, k)
        bd = self._rel_shift(torch.einsum("ibnd,jnd->bnij", q + r_r_bias, r_head_k))
        score = ac + bd
        score.mul_(self.scale)
        score.masked_fill_(mask[None, None], -float("inf"))
        prob = F.softmax(score, dim=3)
        if self.dropatt > 0:
            prob = F.dropout(prob, self.dropatt, self.training)
        vec = torch.einsum("bnij,jbnd->ibnd", prob, v).contiguous().view(qlen, bsz, n * dh)
        out = F.dropout(self.o_net(vec), self.dropout, self.training)
        return self.layer_norm(w + out)


class FeedForward(nn.Module):
    """Linear, ReLU, dropout, linear, dropout; residual and post-norm."""

    def __init__(self, d_model, d_inner, dropout):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_inner), nn.Linear(d_inner, d_model)
        self.layer_norm = nn.LayerNorm(d_model)
        self.dropout = dropout

    def forward(self, x):
        h = F.dropout(F.relu(self.fc1(x)), self.dropout, self.training)
        return self.layer_norm(x + F.dropout(self.fc2(h), self.dropout, self.training))


class TransformerXLStep(nn.Module):
    """One training step's forward and loss: (data, target, memories) -> the
    mean negative log-likelihood over the batch's tokens. `data` and
    `target` are [batch, tgt_len] token ids (batch first, as the tracer
    scales them), the memories n_layer + 1 tensors of [mem_len, batch,
    d_model]."""

    def __init__(self, size: str):
        super().__init__()
        layers, d, heads, d_head, d_inner, dropout, dropatt, _ = CONFIGS[size]
        self.d_model, self.dropout = d, dropout
        self.embed = nn.Embedding(VOCAB, d)
        self.out_bias = nn.Parameter(torch.zeros(VOCAB))
        self.r_w_bias = nn.Parameter(torch.zeros(heads, d_head))
        self.r_r_bias = nn.Parameter(torch.zeros(heads, d_head))
        self.attn = nn.ModuleList(RelAttention(d, heads, d_head, dropout, dropatt)
                                  for _ in range(layers))
        self.ff = nn.ModuleList(FeedForward(d, d_inner, dropout) for _ in range(layers))
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0.0, d, 2.0) / d)),
                             persistent=False)

    def forward(self, data, target, *mems):
        data, target = data.t(), target.t()
        qlen, mlen = data.shape[0], mems[0].shape[0]
        klen = qlen + mlen
        word = self.embed(data)
        word.mul_(self.d_model ** 0.5)
        mask = torch.triu(word.new_ones(qlen, klen), diagonal=1 + mlen).bool()
        pos_seq = torch.arange(klen - 1, -1, -1.0, device=word.device, dtype=word.dtype)
        angles = torch.outer(pos_seq, self.inv_freq.to(word.dtype))
        pos = torch.cat([angles.sin(), angles.cos()], dim=-1)[:, None, :]
        core = F.dropout(word, self.dropout, self.training)
        pos = F.dropout(pos, self.dropout, self.training)
        hids = [core]
        for i, (attn, ff) in enumerate(zip(self.attn, self.ff)):
            core = ff(attn(core, pos, self.r_w_bias, self.r_r_bias, mask, mems[i]))
            hids.append(core)
        core = F.dropout(core, self.dropout, self.training)
        with torch.no_grad():  # the next step's memories: the last mem_len of each input
            for mem, h in zip(mems, hids):
                torch.cat([mem, h], 0)[-mlen:].detach()
        logit = F.linear(core.view(-1, self.d_model), self.embed.weight, self.out_bias)
        nll = -F.log_softmax(logit, dim=-1).gather(1, target.reshape(-1, 1)).squeeze(1)
        return nll.float().mean()


def inputs(size: str):
    """`batch -> inputs` for `TransformerXLStep(size)`."""
    layers, d, *_, length = CONFIGS[size]

    def make(batch: int):
        ids = torch.ones(batch, length, dtype=torch.long)
        return (ids, ids.clone(), *(torch.zeros(length, batch, d) for _ in range(layers + 1)))
    return make


def trace(size: str):
    import predictor

    return predictor.trace(lambda: TransformerXLStep(size), inputs(size), loss_fn=lambda out: out,
                           optimizer=OPTIMIZER, batch_size=8, name=f"transformer-xl-{size}")


def predict_rows(table=None) -> list[dict]:
    """One dict per published figure: predicted tokens/s and its error."""
    import predictor

    graphs = {size: trace(size) for size in CONFIGS}
    out = []
    for gpu, column, batches, published in (PUBLISHED if table is None else table):
        prec = lambda_precision(gpu, column == "fp16")
        for j, size in enumerate(CONFIGS):
            length = CONFIGS[size][-1]
            graph = o2_graph(graphs[size]) if prec == "amp" else graphs[size]
            p = predictor.predict(graph, gpu, batch_size=batches[j],
                                  tf32_matmul=True if prec == "tf32" else None)
            out.append(step_row(f"transformer-xl-{size}", gpu, prec, batches[j], published[j],
                                batches[j] * length, p, SOURCE))
    return out


def main(argv=None) -> int:
    args = breakdown_args(__doc__, argv)
    rows = predict_rows()
    print(SOURCE)
    print_step_table(rows, "tok")
    for model in dict.fromkeys(r["model"] for r in rows):
        sub = [r for r in rows if r["model"] == model]
        print(f"\n{model}:")
        for gpu, pub, pred in speedups(sub):
            print(f"  {gpu}: half-precision speedup published {pub:.2f}x, predicted {pred:.2f}x")
        for group, precs in (("fp16", ("amp",)), ("fp32/tf32", ("fp32", "tf32"))):
            g = [r for r in sub if r["precision"] in precs]
            print(f"  {group}: mean |error| {np.mean([abs(r['error_pct']) for r in g]):.1f} % "
                  f"over {len(g)}, Spearman across GPUs "
                  f"{spearman([r['published'] for r in g], [r['predicted'] for r in g]):.2f}")
    print_summary(rows, args.breakdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
