"""Parallel layouts and recomputation (predictor.layouts, the layout pass):
physics checks against published analytical figures, the bubble formula,
collective costs, the Megatron pairs found in a traced graph, and the
single-GPU path unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import predictor
from predictor import layouts
from predictor.errors import InvalidArgumentError
from predictor.optable import ACTIVATIONS

S, H, A, B, V, NL = 128, 256, 4, 2, 2048, 4


class Block(nn.Module):
    """A Megatron GPT block (Korthikanti et al. 2022, Fig. 2): LN, fused QKV,
    scores, softmax, dropout, PV, projection, dropout, LN, fc1, GeLU, fc2,
    dropout."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(H, dim=2)
        q, k, v = (t.view(b, s, A, H // A).transpose(1, 2) for t in (q, k, v))
        att = F.dropout(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(H // A), -1), 0.1)
        y = (att @ v).transpose(1, 2).reshape(b, s, H)
        x = x + F.dropout(self.proj(y), 0.1)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), 0.1)


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, H)
        self.blocks = nn.ModuleList(Block() for _ in range(NL))
        self.ln_f = nn.LayerNorm(H)
        self.head = nn.Linear(H, V, bias=False)

    def forward(self, ids):
        x = self.wte(ids)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, V).float(), ids.view(-1))


@pytest.fixture(scope="module")
def gpt():
    return predictor.trace(GPT(), (torch.zeros(B, S, dtype=torch.long),),
                           loss_fn=lambda out: out, name="gpt-block-test")


def _block_activation_bytes(g, par, checkpoint=None, block=2):
    """Stored activation bytes of one block at batch B in 16 bits, as the
    layout model divides them."""
    lp, prof = g.layout, g.memory
    size = prof.bytes_at(B, 2).astype(float)   # bf16
    sel = (prof.category == ACTIVATIONS) & (lp.act_group == block)
    div = np.where(((lp.act_flags & 1) > 0) | par.sequence_parallel, par.tp, 1)
    b = size / div
    if checkpoint == "selective":
        b = np.where((lp.act_flags & 2) > 0, 0.0, b)
    return float(b[sel].sum())


def test_megatron_pairs_found(gpt):
    lp = gpt.layout
    assert lp.n_blocks == NL
    assert sorted(lp.column_parallel) == sorted(
        [f"blocks.{i}.{n}.weight" for i in range(NL) for n in ("qkv", "fc1")])
    assert sorted(lp.row_parallel) == sorted(
        [f"blocks.{i}.{n}.weight" for i in range(NL) for n in ("proj", "fc2")])
    assert lp.vocab_parallel == ["head.weight", "wte.weight"]
    assert lp.kept_whole == {}
    # every row's executions are accounted for, once
    cnt = np.bincount(lp.split_row, weights=lp.split_count, minlength=len(gpt.ops))
    assert np.array_equal(cnt.astype(np.int64), gpt.ops.count)
    # two all-reduces per block forward (after proj and fc2), two backward
    for blk in range(1, NL + 1):
        assert int(((lp.comm_group == blk) & (lp.comm_phase == 0)).sum()) == 2
        assert int(((lp.comm_group == blk) & (lp.comm_phase == 1)).sum()) == 2
        # each moves the block's output, s*b*h elements
        sel = lp.comm_group == blk
        assert set((lp.comm_base[sel] + lp.comm_slope[sel] * B).tolist()) == {S * B * H}


@pytest.mark.parametrize("tp, sp, checkpoint, formula", [
    # Korthikanti et al. 2022, Table 2: activation bytes per layer / (s b h)
    (1, False, None, 34 + 5 * A * S / H),
    (4, False, None, 10 + 24 / 4 + 5 * A * S / (H * 4)),
    (4, True, None, 34 / 4 + 5 * A * S / (H * 4)),
    (4, True, "selective", 34 / 4),
])
def test_activation_memory_matches_korthikanti(gpt, tp, sp, checkpoint, formula):
    par = predictor.Parallel(tp=tp, sequence_parallel=sp)
    ours = _block_activation_bytes(gpt, par, checkpoint) / (S * B * H)
    # the formula ignores LayerNorm statistics and the like: a few per cent
    assert ours == pytest.approx(formula, rel=0.06)


def test_full_recompute_keeps_block_inputs(gpt):
    lp = gpt.layout
    # the block boundary is the residual stream, s*b*h elements: 2sbh bytes in 16 bits
    assert lp.boundary_base + lp.boundary_slope * B == S * B * H
    plain = predictor.predict(gpt, "H100-SXM5-80GB", batch_size=B, dtype="bf16",
                              parallel=predictor.Parallel(tp=2), checkpoint=None)
    full = predictor.predict(gpt, "H100-SXM5-80GB", batch_size=B, dtype="bf16",
                             parallel=predictor.Parallel(tp=2), checkpoint="full")
    sel = predictor.predict(gpt, "H100-SXM5-80GB", batch_size=B, dtype="bf16",
                            parallel=predictor.Parallel(tp=2), checkpoint="selective")
    assert full.memory_parts_gb["activations"] < sel.memory_parts_gb["activations"] \
        < plain.memory_parts_gb["activations"]
    assert full.recompute_ms > sel.recompute_ms > 0 == plain.recompute_ms
    assert full.iteration_ms > sel.iteration_ms > plain.iteration_ms


def test_zero_bytes_per_param_match_the_paper():
    # ZeRO (Rajbhandari et al. 2020), Fig. 1: 7.5B params, Adam, mixed
    # precision, N_d = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU.
    w, g, k = layouts.state_bytes_per_param(2, "adam", 8.0)   # bf16: 2 + 2 + 12
    assert (w, g, k) == (2.0, 2.0, 12.0)
    psi = 7.5e9
    got = [psi * layouts.zero_bytes_per_param(w, g, k, z, 64) / 1e9 for z in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.875], abs=0.06)
    assert layouts.state_bytes_per_param(None, "adam", 8.0) == (4.0, 4.0, 8.0)


def test_zero_memory_follows_sharding(gpt):
    mem = []
    for z in range(4):
        p = predictor.predict(gpt, "H100-SXM5-80GB", batch_size=B, dtype="bf16",
                              parallel=predictor.Parallel(dp=8, zero=z))
        mem.append(p.memory_parts_gb["model_states"])
    n = sum(int(x) for x in gpt.layout.param_numel)
    assert mem[0] * 2**30 == pytest.approx(16 * n)
    assert mem[3] * 2**30 == pytest.approx(16 * n / 8)
    assert mem[0] > mem[1] > mem[2] > mem[3]
    assert predictor.Parallel(dp=8, fsdp=True).zero == 3


def test_bubble_formula(gpt):
    for pp, m, v in ((2, 4, 1), (4, 8, 1), (2, 8, 2)):
        par = predictor.Parallel(pp=pp, microbatches=m, interleave=v)
        p = predictor.predict(gpt, "H100-SXM5-80GB", batch_size=B, parallel=par)
        slowest = max(p.stage_ms)
        assert p.bubble_ms == pytest.approx((pp - 1) / v * slowest)
        assert p.bubble_ms / (m * slowest) == pytest.approx((pp - 1) / (v * m))


def test_collective_costs():
    ln = layouts.Link(gbs=100.0, alpha_us=0.0)
    # ring all-reduce moves 2 (n-1)/n of the bytes per rank
    assert layouts.allreduce_ms(1e9, 8, ln) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9 * 1e3)
    assert layouts.gather_ms(1e9, 8, ln) == pytest.approx(7 / 8 * 1e9 / 100e9 * 1e3)
    assert layouts.allreduce_ms(1e9, 1, ln) == 0.0
    # small messages over many ranks: the tree's log latency wins
    lat = layouts.Link(gbs=100.0, alpha_us=10.0)
    assert layouts.allreduce_ms(8, 256, lat) == pytest.approx(
        (2 * 8 / 100e9 + 2 * 8 * 10e-6) * 1e3)
    h100 = predictor.gpus()  # noqa: F841 — the database loads
    from predictor import hardware
    g = hardware.get("H100-SXM5-80GB")
    par = predictor.Parallel(dp=4, tp=8, gpus_per_node=8)
    intra, inter = layouts.link(g, par, 8, 1), layouts.link(g, par, 4, 8)
    assert intra.gbs > inter.gbs == pytest.approx(50 * layouts.INTER_NODE_EFFICIENCY)
    # a ring over whole nodes crosses on every NIC of the node (8 ranks per node here)
    assert layouts.link(g, predictor.Parallel(inter_node_gbs=10.0), 16, 1).gbs == \
        pytest.approx(8 * 10 * layouts.INTER_NODE_EFFICIENCY)
    # two ranks per node: two NICs' worth; never above NVLink
    assert layouts.link(g, predictor.Parallel(inter_node_gbs=10.0), 8, 4).gbs == \
        pytest.approx(2 * 10 * layouts.INTER_NODE_EFFICIENCY)
    assert layouts.link(g, predictor.Parallel(inter_node_gbs=1e4), 16, 1).gbs == intra.gbs


def test_single_gpu_prediction_unchanged(gpt):
    base = predictor.predict(gpt, "A100-SXM4-80GB", batch_size=B)
    same = predictor.predict(gpt, "A100-SXM4-80GB", batch_size=B,
                             parallel=predictor.Parallel(), checkpoint=None)
    assert same.iteration_ms == base.iteration_ms and same.memory_gb == base.memory_gb
    assert type(same) is type(base)


def test_tensor_parallel_divides_compute(gpt):
    # a batch at which the small test model is GPU-bound (at batch 8 the host's
    # launches take longer than its kernels, with or without TP)
    one = predictor.predict(gpt, "H100-SXM5-80GB", batch_size=256, dtype="bf16",
                            parallel=predictor.Parallel(tp=1, microbatches=1, dp=1, pp=1),
                            checkpoint="selective")
    four = predictor.predict(gpt, "H100-SXM5-80GB", batch_size=256, dtype="bf16",
                             parallel=predictor.Parallel(tp=4), checkpoint="selective")
    assert four.compute_ms < one.compute_ms
    small = [predictor.predict(gpt, "H100-SXM5-80GB", batch_size=8, dtype="bf16",
                               parallel=predictor.Parallel(tp=t), checkpoint="selective")
             for t in (1, 4)]
    assert all(p.overhead_ms > 0 for p in small) and one.overhead_ms < small[0].overhead_ms
    assert four.comm_ms > 0 == one.comm_ms
    for p in (one, four):
        assert all(math.isfinite(x) and x > 0 for x in (p.iteration_ms, p.memory_gb))


@pytest.mark.parametrize("kwargs, match", [
    (dict(tp=0), "tp must be"), (dict(zero=4), "zero must be"),
    (dict(interleave=2), "needs pipeline"), (dict(sequence_parallel=True), "needs tensor"),
    (dict(fsdp=True, zero=2), "fsdp=True is zero=3"), (dict(inter_node_gbs=-1.0), "inter_node_gbs"),
    (dict(pp=2, microbatches=3, interleave=2), "multiple of pp"),
])
def test_bad_layouts_one_line(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match) as e:
        predictor.Parallel(**kwargs)
    assert "\n" not in str(e.value)


def test_bad_checkpoint_and_too_many_stages(gpt):
    with pytest.raises(InvalidArgumentError, match="checkpoint must be"):
        predictor.predict(gpt, "H100-SXM5-80GB", checkpoint="some")
    with pytest.raises(InvalidArgumentError, match="too few"):
        predictor.predict(gpt, "H100-SXM5-80GB", parallel=predictor.Parallel(pp=8, microbatches=8))


def test_search_layouts(gpt):
    rows = predictor.search_layouts(gpt, "H100-SXM5-80GB", 8, 16, zeros=(0, 3),
                                    checkpoints=(None, "full"), max_micro_batch=4)
    assert rows and all({"dp", "tp", "pp", "zero", "checkpoint", "microbatches",
                         "micro_batch"} <= set(r) for r in rows)
    assert all(r["dp"] * r["tp"] * r["pp"] == 8 for r in rows)
    assert all(r["micro_batch"] * r["microbatches"] * r["dp"] == 16 for r in rows)
    fits = [r["iteration_ms"] for r in rows if r["fits"]]
    assert fits == sorted(fits)


def test_cli_layout_errors_are_one_line(capsys):
    from predictor.cli import main

    for argv in (["predict", "gpt2", "--sequence-parallel"],
                 ["predict", "gpt2", "--fsdp", "--zero", "2"],
                 ["predict", "gpt2", "--tp", "2", "--inter-node-gbs", "-3"]):
        with pytest.raises(SystemExit) as e:
            rc = main(argv)
            raise SystemExit(rc)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "error" in err
