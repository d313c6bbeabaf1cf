"""Parallel layouts against torch's own FSDP2, FSDPMemTracker and tensor
parallelism on a fake process group (one CPU process, fake tensors):
benchmarks/fsdp_fake_pg.py. Skipped where this torch cannot run them."""

from __future__ import annotations

import pytest

from benchmarks import fsdp_fake_pg as F

pytestmark = pytest.mark.skipif(F.unavailable() is not None,
                                reason=F.unavailable() or "fake process group available")

B = 2


@pytest.fixture(scope="module")
def graph():
    return F.trace()


@pytest.fixture(scope="module")
def fsdp():
    return {n: F.fsdp_measure(n, B) for n in (2, 4, 8)}


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zero3_memory_per_gpu_against_fsdp_mem_tracker(graph, fsdp, world):
    # measured (python benchmarks/fsdp_fake_pg.py): +10.5 / +5.3 / +0.7 % at 2 / 4 / 8
    m, p = fsdp[world], F.predicted(graph, world, B)
    assert p["tensor_bytes"] == pytest.approx(m["peak_bytes"], rel=0.12)
    # the model states follow the sharding: the tracker's sharded parameters
    # and optimizer state are the predictor's weight and Adam bytes over N
    params = sum(F.unit_bytes(graph)[0]) + F.unit_bytes(graph)[1]
    assert m["parts"]["Sharded Param"] == params // world
    # (plus Adam's step counters: one scalar per parameter tensor)
    assert m["parts"]["OptState"] == pytest.approx(2 * params / world, rel=1e-4)
    assert p["parts"]["model_states"] * 2**30 == pytest.approx(4 * params / world)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zero3_collective_volumes_equal_fsdp2s(graph, fsdp, world):
    m, p = fsdp[world], F.predicted(graph, world, B)
    blocks, root = F.unit_bytes(graph)
    # every gradient reduce-scattered once per step, one collective per unit
    assert m["reduce_scatter_calls"] == sorted(blocks + [root])
    assert m["reduce_scatter"] == p["reduce_scatter"]
    # each block's weights gathered in forward and again in backward; FSDP2
    # keeps the root unit (embedding, final norm, head) gathered from forward
    # to backward, which layouts.py prices as a second gather
    assert m["all_gather_calls"] == sorted(blocks * 2 + [root])
    assert p["all_gather"] - m["all_gather"] == root


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_all_reduce_volumes_equal_torch_tensor_parallel(graph, tp):
    torch_bytes = sorted(F.tp_measure(tp, B))
    priced = F.tp_priced(graph, B)
    # two per block forward (after proj and fc2), two backward (the inputs'
    # gradients of qkv and fc1), each the block's output: b * s * h fp32
    assert len(priced) == 4 * F.NL
    assert set(priced) == {B * F.S * F.H * 4}
    assert torch_bytes == priced


def test_zero2_collective_volumes_equal_fsdp2s_shard_grad_op(graph):
    # FSDP2 without resharding after forward moves ZeRO-2's bytes: every weight
    # gathered once, every gradient reduce-scattered once; layouts.py prices
    # ZeRO-2 as a reduce-scatter of the gradients and an all-gather of the
    # updated weights
    m = F.fsdp_measure(4, B, reshard=False)
    blocks, root = F.unit_bytes(graph)
    params = sum(blocks) + root
    assert m["all_gather_calls"] == sorted(blocks + [root])
    assert m["reduce_scatter_calls"] == sorted(blocks + [root])
    lp = graph.layout
    priced = float(lp.param_numel.sum()) * 4   # n_stage * w_b = n_train * g_b, fp32
    assert m["all_gather"] == m["reduce_scatter"] == priced == params
