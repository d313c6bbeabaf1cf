"""Optimizer steps: the foreach step, the for-loop step (-loop), the fused
step (-fused) and gradient clipping (+clip), through the trace, the engine
and the CLI."""

import json

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor import cli
from predictor.errors import InvalidArgumentError
from predictor.frontend import optimizers
from predictor.kernels import layout as L


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 8)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _trace(optimizer):
    return predictor.trace(_MLP(), (torch.randn(4, 64),), optimizer=optimizer)


def _opt_rows(g):
    ops = g.ops
    sel = np.nonzero(ops.phase == L.OPTIMIZER_PHASE)[0]
    return [(ops.op_names[ops.op[i]], int(ops.count[i])) for i in sel]


@pytest.mark.parametrize("text,canonical", [
    ("adam", "adam"), ("AdamW", "adamw"), ("sgd", "sgd"), ("none", None), (None, None),
    ("adamw+clip", "adamw+clip"), ("adam-loop", "adam-loop"), ("adam_loop", "adam-loop"),
    ("sgd-loop+clip", "sgd-loop+clip"), ("adamw-fused", "adamw-fused"),
    ("Adam_Fused+clip", "adam-fused+clip"),
])
def test_names(text, canonical):
    assert optimizers.check(text) == canonical


@pytest.mark.parametrize("text", ["rmsprop", "adam+loop", "adam-clip", "clip", "adamw+clip-loop",
                                  "adam-fused-loop", "adam-loop-fused"])
def test_unknown_names_list_the_forms(text):
    with pytest.raises(InvalidArgumentError, match="-loop.*\\+clip"):
        optimizers.check(text)


def test_fused_is_for_adam_and_adamw():
    with pytest.raises(InvalidArgumentError, match="-fused is for adam and adamw"):
        optimizers.check("sgd-fused")


@pytest.mark.parametrize("base", ["adam", "adamw"])
def test_fused_step_is_one_pass_over_the_state(base):
    """fused=True: one multi-tensor kernel reading parameters, gradients and
    both moments and writing parameters and moments (after a multi-tensor
    increment of the step counters): the same bytes as the foreach step's
    reads of them once, in one pass instead of seven or eight."""
    g = _trace(f"{base}-fused")
    rows = _opt_rows(g)
    assert {name for name, _ in rows} == {f"_fused_{base}_", "_foreach_add_"}
    n = g.trainable_parameters
    ops, d = g.ops, g.ops.dims(4)
    (i,) = [i for i in range(len(ops.family)) if ops.op_names[ops.op[i]] == f"_fused_{base}_"]
    assert (int(d[i][L.MEM_READ]), int(d[i][L.MEM_WRITTEN])) == (4 * n, 3 * n)
    fused = predictor.predict(predictor.trace("bert-base", batch_size=2, optimizer=f"{base}-fused"),
                              "A100-SXM4-80GB")
    plain = predictor.predict(predictor.trace("bert-base", batch_size=2, optimizer=base),
                              "A100-SXM4-80GB")
    assert fused.optimizer_ms < 0.6 * plain.optimizer_ms


def test_loop_step_is_one_kernel_per_parameter_and_operation():
    n_params = len(list(_MLP().parameters()))
    foreach, loop = _opt_rows(_trace("adamw")), _opt_rows(_trace("adamw-loop"))
    # foreach: each operation one kernel over every parameter (8 for AdamW)
    assert sum(count for _, count in foreach) == 8
    # for-loop: PyTorch's _single_tensor_adamw, 8 kernels a parameter
    assert sum(count for _, count in loop) == 8 * n_params
    assert {name for name, _ in loop} == {"mul_", "lerp_", "addcmul_", "sqrt", "div", "add_",
                                          "addcdiv_"}
    assert sum(count for name, count in loop if name == "addcdiv_") == n_params


def test_same_bytes_more_launches():
    foreach, loop = _trace("adamw"), _trace("adamw-loop")
    for g in (foreach, loop):
        assert g.trainable_parameters == sum(p.numel() for p in _MLP().parameters())
    p0 = predictor.predict(foreach, "A100-SXM4-80GB")
    p1 = predictor.predict(loop, "A100-SXM4-80GB")
    assert p1.optimizer_ms > p0.optimizer_ms  # kernels of a few thousand elements: launches
    assert p1.forward_ms == pytest.approx(p0.forward_ms)
    assert loop.host_ops[L.OPTIMIZER_PHASE] > foreach.host_ops[L.OPTIMIZER_PHASE]


def test_clip_adds_a_norm_and_a_scale_of_every_gradient():
    plain, clipped = _opt_rows(_trace("sgd")), _opt_rows(_trace("sgd+clip"))
    added = [name for name, _ in clipped if name not in {n for n, _ in plain}]
    assert "_foreach_norm" in added and "_foreach_mul_" in added and "stack" in added
    g = _trace("sgd+clip")
    d = g.ops.dims(4)
    norm = [i for i in range(len(g.ops.family))
            if g.ops.op_names[g.ops.op[i]] == "_foreach_norm"]
    assert len(norm) == 1 and int(d[norm[0]][L.MEM_READ]) == g.trainable_parameters


def test_fp16_autocast_unscales_before_clipping():
    g = predictor.trace(_MLP(), (torch.randn(4, 64),), optimizer="adamw+clip", amp="fp16")
    names = [n for n, _ in _opt_rows(g)]
    assert names.index("_amp_foreach_non_finite_check_and_unscale_") < names.index("_foreach_norm")


def test_cli_takes_the_variants_and_refuses_others(capsys):
    assert cli.main(["predict", "dcgan", "-b", "4", "--gpus", "T4", "--optimizer",
                     "adamw-loop+clip", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predictions"][0]["optimizer_ms"] > 0
    with pytest.raises(SystemExit) as exc:
        cli.main(["predict", "dcgan", "-b", "4", "--gpus", "T4", "--optimizer", "lion"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown optimizer 'lion'" in err and "+clip" in err


def test_csv_and_titles_name_the_optimizer(capsys, tmp_path):
    assert cli.main(["predict", "dcgan", "-b", "4", "--gpus", "T4", "--optimizer", "sgd+clip",
                     "--csv"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    fields = dict(zip(header.split(","), row.split(",")))
    assert fields["mode"] == "train" and fields["optimizer"] == "sgd+clip"
    assert cli.main(["predict", "dcgan", "-b", "4", "--gpus", "T4", "--optimizer",
                     "adamw-loop"]) == 0
    assert "train, adamw-loop" in capsys.readouterr().out
    out = tmp_path / "s.csv"
    assert cli.main(["sweep", "dcgan", "-b", "2,4", "--gpus", "T4", "--optimizer", "none",
                     "--csv", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert "optimizer" in lines[0].split(",") and lines[1].split(",")[-2] == ""
