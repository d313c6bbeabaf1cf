"""WaveGlow training throughput predicted against Lambda's published
single-GPU figures: a flow of dilated 1-D convolutions (WaveNet-like affine
couplings), on twelve GPUs in fp32/TF32.

    python -m benchmarks.waveglow_published
    python -m benchmarks.waveglow_published --breakdown

A reported check, not a fit: nothing in the predictor is tuned to these
figures. Lambda's PyTorch benchmark (github.com/lambdal/deeplearning-benchmark,
`pytorch/pytorch-train-throughput-fp32.csv` at commit 0551cb7, column
`waveglow`, one GPU; the batch per GPU from `pytorch-train-bs-fp32.csv` at
08d77c4) trains NVIDIA DeepLearningExamples' WaveGlow (PyTorch/
SpeechSynthesis/Tacotron2, `train.py -m WaveGlow --segment-length 8000`) on
a 625-clip part of LJSpeech for two epochs in the pytorch-22.09/22.10 NGC
containers; the figure is the closing `train_items_per_sec`, audio samples a
second averaged over the last epoch's iterations (the first one of the
epoch, after validation and a checkpoint, included).

What the runs train (`PARAMETER` lines of each log, and the script's
defaults, `waveglow/arg_parser.py`), written again here as `WaveGlowStep`
after the model's paper (Prenger et al., 2019) and its reference code's
structure:

- 12 flows over groups of 8 samples (a segment of 8,000 samples is 1,000
  steps of 8 channels), 2 channels sent to the output every 4 flows; each
  flow an invertible 1x1 convolution and an affine coupling whose WN has 8
  layers of 512 channels: a dilated convolution of kernel 3 (dilation 1 to
  128) to 1,024 channels, a 1x1 convolution of the upsampled mel
  spectrogram (80 bands x 8) to 1,024, tanh x sigmoid, a 1x1 convolution
  back to 1,024 (512 on the last layer) split into the residual and the
  skip; every WN convolution but the last under weight normalisation.
- The mel spectrogram of a segment is 32 frames, upsampled by a transposed
  convolution (kernel 1,024, stride 256) and cut to the segment.
- The loss: sum(z^2) / 2 - sum of the log-scales - the log-determinants of
  the 1x1 convolutions' weights, over the number of samples. Adam
  (PyTorch 1.13's, one parameter at a time) with gradient clipping, as
  `train.py` steps it (`adam-loop+clip`).
- Lambda's "fp16" column is the same program: its configuration passes
  `--amp-run`, which that version of `train.py` no longer reads, and every
  fp16 log prints `PARAMETER amp : False` (e.g.
  `pytorch/results/4090_v1/PyTorch_waveglow_FP16/21-10-2022_05-29-52.txt`,
  at the fp32 column's batch and rate). It is left out. The fp32 column is
  TF32 on Ampere and later (cuDNN convolutions, PyTorch's default), fp32
  before (`amp_published.lambda_precision`).

The A10 and H100 SXM5 have no batch-size table row: their batch is their
run's own (`batch_size : 18` and `32` in `pytorch/results/
LambdaCloud_A10_v1/` and `H100_80GB_SXM5_v1/PyTorch_waveglow_FP32/`).
"""

from __future__ import annotations


import torch
import torch.nn as nn

from benchmarks.ncf_published import (breakdown_args, lambda_fp32_rows, print_fp32_check,
                                      print_summary)

_LAMBDA = "https://github.com/lambdal/deeplearning-benchmark/blob/{}/pytorch/{}"
SOURCE = ("Lambda, " + _LAMBDA.format("0551cb70ffdc155dc4cb2c10dddebb65651c3883",
                                      "pytorch-train-throughput-fp32.csv")
          + " (column waveglow; 1 GPU); batch from pytorch-train-bs-fp32.csv at 08d77c4")
SEGMENT = 8000          # audio samples a training segment (--segment-length)
HOP = 256               # STFT hop: a mel frame every 256 samples
MEL_FRAMES = SEGMENT // HOP
N_MEL = 80
FLOWS, GROUP, EARLY_EVERY, EARLY_SIZE = 12, 8, 4, 2
WN_LAYERS, WN_CHANNELS, WN_KERNEL = 8, 512, 3
OPTIMIZER = "adam-loop+clip"

# (GPU, batch, published samples/s)
PUBLISHED = [
    ("QUADRO-RTX-8000", 32, 44068),
    ("V100-SXM2-16GB", 8, 47394),
    ("RTX-3090", 18, 97404),
    ("A10", 18, 79965),
    ("A100-PCIE-40GB", 24, 194634),
    ("A100-PCIE-80GB", 32, 225014),
    ("A100-SXM4-80GB", 32, 231379),
    ("RTX-6000-ADA", 32, 157877),
    ("RTX-A6000", 32, 117073),
    ("RTX-4090", 18, 161590),
    ("H100-PCIE-80GB", 32, 262302),
    ("H100-SXM5-80GB", 32, 360558),
]


def _weight_norm(conv: nn.Conv1d) -> nn.Conv1d:
    return nn.utils.parametrizations.weight_norm(conv)


def _orthonormal(conv: nn.Conv1d) -> nn.Conv1d:
    """An invertible 1x1 convolution starts as a rotation (determinant +1,
    so that its log-determinant is defined): here the identity, which needs
    no data-dependent sign fix the tracer could not follow."""
    with torch.no_grad():
        conv.weight.copy_(torch.eye(conv.out_channels)[..., None])
    return conv


class WN(nn.Module):
    """The affine coupling's network: `n_in` audio channels and the mel
    condition in, 2 x `n_in` channels (log-scale and shift) out."""

    def __init__(self, n_in: int, n_cond: int):
        super().__init__()
        c = WN_CHANNELS
        self.start = _weight_norm(nn.Conv1d(n_in, c, 1))
        self.end = nn.Conv1d(c, 2 * n_in, 1)
        self.in_layers = nn.ModuleList(
            _weight_norm(nn.Conv1d(c, 2 * c, WN_KERNEL, dilation=2 ** i,
                                   padding=(WN_KERNEL - 1) * 2 ** i // 2))
            for i in range(WN_LAYERS))
        self.cond_layers = nn.ModuleList(_weight_norm(nn.Conv1d(n_cond, 2 * c, 1))
                                         for _ in range(WN_LAYERS))
        self.res_skip_layers = nn.ModuleList(
            _weight_norm(nn.Conv1d(c, 2 * c if i < WN_LAYERS - 1 else c, 1))
            for i in range(WN_LAYERS))

    def forward(self, audio, spect):
        c = WN_CHANNELS
        audio = self.start(audio)
        output = None
        for i in range(WN_LAYERS):
            act = self.in_layers[i](audio) + self.cond_layers[i](spect)
            acts = torch.tanh(act[:, :c]) * torch.sigmoid(act[:, c:])
            res_skip = self.res_skip_layers[i](acts)
            if i < WN_LAYERS - 1:
                audio = res_skip[:, :c] + audio
                skip = res_skip[:, c:]
            else:
                skip = res_skip
            output = skip if output is None else skip + output
        return self.end(output)


class WaveGlowStep(nn.Module):
    """One training step's forward and loss: (mel [batch, 80, 32], audio
    [batch, 8000]) -> the negative log-likelihood per sample."""

    def __init__(self):
        super().__init__()
        self.upsample = nn.ConvTranspose1d(N_MEL, N_MEL, 1024, stride=HOP)
        self.wn = nn.ModuleList()
        self.convinv = nn.ModuleList()
        n_half, remaining = GROUP // 2, GROUP
        for k in range(FLOWS):
            if k % EARLY_EVERY == 0 and k > 0:
                n_half -= EARLY_SIZE // 2
                remaining -= EARLY_SIZE
            self.convinv.append(_orthonormal(nn.Conv1d(remaining, remaining, 1, bias=False)))
            self.wn.append(WN(n_half, N_MEL * GROUP))

    def forward(self, spect, audio):
        batch = audio.shape[0]
        spect = self.upsample(spect)[:, :, :SEGMENT]
        # [batch, 80, steps, 8] -> [batch, 640, steps]: a group's 8 frames of each band
        spect = spect.unfold(2, GROUP, GROUP).permute(0, 2, 1, 3).contiguous()
        spect = spect.view(batch, SEGMENT // GROUP, -1).permute(0, 2, 1)
        audio = audio.unfold(1, GROUP, GROUP).permute(0, 2, 1)
        out, log_s_total, log_det_total = [], 0.0, 0.0
        for k in range(FLOWS):
            if k % EARLY_EVERY == 0 and k > 0:
                out.append(audio[:, :EARLY_SIZE])
                audio = audio[:, EARLY_SIZE:]
            w = self.convinv[k].weight.squeeze(-1)
            log_det_total = log_det_total + batch * (SEGMENT // GROUP) * torch.logdet(w)
            audio = self.convinv[k](audio)
            n_half = audio.shape[1] // 2
            a0, a1 = audio[:, :n_half], audio[:, n_half:]
            h = self.wn[k](a0, spect)
            log_s, b = h[:, n_half:], h[:, :n_half]
            a1 = torch.exp(log_s) * a1 + b
            log_s_total = log_s_total + log_s.sum()
            audio = torch.cat([a0, a1], 1)
        out.append(audio)
        z = torch.cat(out, 1)
        loss = (z * z).sum() / 2 - log_s_total - log_det_total
        return loss / z.numel()


def inputs(batch: int):
    return torch.zeros(batch, N_MEL, MEL_FRAMES), torch.zeros(batch, SEGMENT)


def trace():
    import predictor

    return predictor.trace(WaveGlowStep, inputs, loss_fn=lambda out: out,
                           optimizer=OPTIMIZER, batch_size=8, name="waveglow")


def predict_rows(table=None) -> list[dict]:
    """One dict per published figure: predicted samples/s and its error."""
    return lambda_fp32_rows(trace(), "waveglow", PUBLISHED if table is None else table, SEGMENT,
                            SOURCE)


def main(argv=None) -> int:
    args = breakdown_args(__doc__, argv)
    rows = predict_rows()
    print(SOURCE)
    print_fp32_check(rows, "samples")
    print_summary(rows, args.breakdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
