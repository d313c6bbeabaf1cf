"""Models written for a GPU trace on a machine without one: `.cuda()`,
`.to("cuda")` and `device="cuda"` mean the trace's device
(predictor.frontend.devices)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import predictor
from predictor.frontend.devices import OnTraceDevice, is_accelerator


class MovesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x.cuda(non_blocking=True))


class MakesACudaTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("scale", torch.ones(16, device="cuda"))

    def forward(self, x):
        mask = torch.ones(x.shape[0], 16, device=torch.device("cuda", 0))
        return self.fc(x.to("cuda:0")) * mask * self.scale


def _ms(model, dtype=torch.float32, mode="train"):
    g = predictor.trace(model, lambda b: (torch.zeros(b, 16, dtype=dtype),), mode=mode,
                        batch_size=2, optimizer="adam" if mode == "train" else None)
    p = predictor.predict(g, "T4", batch_size=8)
    assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0
    return p


@pytest.mark.parametrize("model", [MovesItsInput, MakesACudaTensor])
def test_a_model_that_names_cuda_traces(model):
    ops = _ms(model).ops
    assert len(ops[ops.family == "matmul"]) > 0


@pytest.mark.parametrize("factory, dtype", [
    (lambda: MovesItsInput().cuda().half(), torch.float16),
    (lambda: MovesItsInput().to("cuda", torch.bfloat16), torch.bfloat16),
    (lambda: MovesItsInput().to(device="cuda:0").eval(), torch.float32),
    (lambda: MovesItsInput().to("cpu", torch.bfloat16), torch.bfloat16)])
def test_a_factory_that_moves_its_model_to_the_gpu_traces(factory, dtype):
    ops = _ms(factory, dtype, mode="inference").ops
    assert set(ops[ops.family == "matmul"].dtype) == {str(dtype).split(".")[1]}


def test_accelerators_are_named_by_device_or_index():
    for d in ("cuda", "cuda:1", torch.device("cuda"), 0, "mps"):
        assert is_accelerator(d), d
    for d in ("cpu", "meta", torch.device("cpu"), None, True, torch.float16):
        assert not is_accelerator(d), d


def test_to_keeps_its_dtype_and_memory_format():
    x = torch.ones(2, 3, 4, 5)
    with OnTraceDevice():
        y = x.to("cuda", torch.float16, memory_format=torch.channels_last)
        z = x.to(device="cuda", dtype=torch.bfloat16)
        assert x.cuda() is x and x.to(0) is x
    assert y.dtype == torch.float16 and y.device.type == "cpu"
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert z.dtype == torch.bfloat16


GPU_SCRIPT = '''
import torch, torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = x.to("cuda", non_blocking=True)
        return self.head(self.conv(x).mean((2, 3)))

def build():
    device = torch.device("cuda")
    model = Net().to(device).half().to(memory_format=torch.channels_last)
    return model, torch.randn(4, 3, 32, 32, device=device, dtype=torch.float16)
'''


def test_a_training_scripts_factory_traces_as_written(tmp_path):
    """`file.py:build` written for a GPU (the model moved, converted and made
    channels-last, the inputs made on the GPU) and a factory function
    returning (model, inputs): both trace, in half precision."""
    path = tmp_path / "gpu_model.py"
    path.write_text(GPU_SCRIPT)
    for model in (f"{path}:build", lambda: (MovesItsInput().cuda().half(),
                                            torch.zeros(2, 16, device="cuda",
                                                        dtype=torch.float16))):
        g = predictor.trace(model, mode="inference")
        ops = predictor.predict(g, "A100-SXM4-80GB", batch_size=8).ops
        gemms = ops[ops.family.isin(["matmul", "conv"])]
        assert len(gemms) and set(gemms.dtype) == {"float16"}
