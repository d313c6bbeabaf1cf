"""Tacotron 2 training throughput predicted against Lambda's published
single-GPU figures: an attention decoder stepped from Python, one mel frame
at a time, on twelve GPUs in fp32/TF32.

    python -m benchmarks.tacotron2_published
    python -m benchmarks.tacotron2_published --breakdown

A reported check, not a fit: nothing in the predictor is tuned to these
figures. Lambda's PyTorch benchmark (github.com/lambdal/deeplearning-benchmark,
`pytorch/pytorch-train-throughput-fp32.csv` at commit 0551cb7, column
`tacotron2`, one GPU; the batch per GPU from `pytorch-train-bs-fp32.csv` at
08d77c4, the A10's from `csv_v1_v2/pytorch-train-bs-fp32.csv` at e3c3fe3 and
the H100 SXM5's from its log) trains NVIDIA DeepLearningExamples' Tacotron 2
(PyTorch/SpeechSynthesis/Tacotron2, `train.py -m Tacotron2`) on a 625-clip
part of LJSpeech for two epochs in the pytorch-22.09/22.10 NGC containers.
The figure is the closing `train_items_per_sec`: mel frames a second (the
clips' own lengths, padding not counted), averaged over the last epoch's
iterations; each iteration's time runs from the batch on the host to the
optimizer step, synchronised, so the input pipeline is not in it.

What the runs train (the `PARAMETER` lines of each log and the script's
defaults, `tacotron2/arg_parser.py`), written again here as `Tacotron2Step`
after the model's paper (Shen et al., 2018) and its reference code's
structure:

- Encoder: a 148-symbol embedding of 512, three 1-D convolutions of kernel
  5 and 512 channels with batch norm, ReLU and dropout, a bidirectional LSTM
  of 2 x 256 (on the padded batch here; the script packs it).
- Decoder, teacher-forced: a prenet of two 256-wide linear layers with
  dropout always on, then one step per mel frame of the longest clip in the
  batch, stepped from Python: an attention LSTM cell of 1,024, location-
  sensitive attention (128 wide; 32 location filters of kernel 31 over the
  previous and cumulative weights), a decoder LSTM cell of 1,024, a linear
  projection to the 80-band frame and a stop-gate logit. Each step takes its
  input frame as `decoder_inputs[t]`, as the script does.
- Postnet: five 1-D convolutions of kernel 5 (80 -> 512 x 4 -> 80) with
  batch norm, tanh and dropout, added to the decoder's frames.
- Loss: the two frames' MSE against the target plus the gate's BCE with
  logits. Adam (PyTorch 1.13's, one parameter at a time, weight decay
  1e-6) with gradient clipping (`adam-loop+clip`). The fp32 column is TF32
  on Ampere and later (NGC containers switch it on for cuBLAS and cuDNN:
  `tf32_matmul=True`, as in the GNMT and WaveGlow checks), fp32 before
  (`amp_published.lambda_precision`).

The clips' lengths are not in the logs, so two of the step's dims are
taken from the data set, and one from the logs:

- `MEAN_FRAMES` = 566 mel frames a clip: each logged iteration's
  `train_items_per_sec` x `train_iter_time` / batch (RTX 4090: 49,870 frames
  for 88 clips; H100 SXM5: 144,290 and 145,452 for 256), LJSpeech's mean
  clip of 6.57 s at 22,050 Hz and a hop of 256.
- `DECODER_STEPS` = 850, the padded length: the longest of a batch of 48 or
  more clips of LJSpeech, whose longest clip, 10.1 s, is 870 frames.
- `TEXT_LENGTH` = 180 symbols, the longest transcript of such a batch.

The step's time is nearly proportional to `DECODER_STEPS`: at 800 frames
instead of 850 every board's step is 6-7 % shorter, at 870 2-3 % longer.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.ncf_published import (breakdown_args, lambda_fp32_rows, print_fp32_check,
                                      print_summary)

_LAMBDA = "https://github.com/lambdal/deeplearning-benchmark/blob/{}/pytorch/{}"
SOURCE = ("Lambda, " + _LAMBDA.format("0551cb70ffdc155dc4cb2c10dddebb65651c3883",
                                      "pytorch-train-throughput-fp32.csv")
          + " (column tacotron2; 1 GPU); batch from pytorch-train-bs-fp32.csv at 08d77c4 "
          "(the A10's from csv_v1_v2/pytorch-train-bs-fp32.csv at e3c3fe3, the H100 SXM5's "
          "from its log)")
N_MEL, N_SYMBOLS, EMBED = 80, 148, 512
ENC_KERNEL, ENC_CONVS = 5, 3
ATT_RNN, DEC_RNN, ATT_DIM, PRENET = 1024, 1024, 128, 256
LOC_FILTERS, LOC_KERNEL = 32, 31
POST_DIM, POST_KERNEL, POST_CONVS = 512, 5, 5
MEAN_FRAMES = 566       # mel frames a clip, from the logs
DECODER_STEPS = 850     # mel frames of a batch's longest clip
TEXT_LENGTH = 180       # symbols of a batch's longest transcript
OPTIMIZER = "adam-loop+clip"

# (GPU, batch, published mel frames/s)
PUBLISHED = [
    ("QUADRO-RTX-8000", 136, 17717),
    ("V100-SXM2-16GB", 48, 12502),
    ("RTX-3090", 88, 25350),
    ("A10", 80, 16757),
    ("A100-PCIE-40GB", 144, 37999),
    ("A100-PCIE-80GB", 256, 58992),
    ("A100-SXM4-80GB", 256, 55464),
    ("RTX-6000-ADA", 136, 31837),
    ("RTX-A6000", 136, 25135),
    ("RTX-4090", 88, 32910),
    ("H100-PCIE-80GB", 256, 61491),
    ("H100-SXM5-80GB", 256, 80446),
]


def _conv_bn(c_in: int, c_out: int, k: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv1d(c_in, c_out, k, padding=k // 2), nn.BatchNorm1d(c_out))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(_conv_bn(EMBED, EMBED, ENC_KERNEL) for _ in range(ENC_CONVS))
        self.lstm = nn.LSTM(EMBED, EMBED // 2, 1, batch_first=True, bidirectional=True)

    def forward(self, x):
        for conv in self.convs:
            x = F.dropout(F.relu(conv(x)), 0.5, self.training)
        return self.lstm(x.transpose(1, 2))[0]


class Attention(nn.Module):
    """Location-sensitive attention: energies from the query, the memory and
    32 filters over the previous and cumulative attention weights."""

    def __init__(self):
        super().__init__()
        self.query = nn.Linear(ATT_RNN, ATT_DIM, bias=False)
        self.memory = nn.Linear(EMBED, ATT_DIM, bias=False)
        self.v = nn.Linear(ATT_DIM, 1, bias=False)
        self.location_conv = nn.Conv1d(2, LOC_FILTERS, LOC_KERNEL, padding=LOC_KERNEL // 2,
                                       bias=False)
        self.location_dense = nn.Linear(LOC_FILTERS, ATT_DIM, bias=False)

    def forward(self, query, memory, processed_memory, weights_cat, mask):
        q = self.query(query.unsqueeze(1))
        loc = self.location_dense(self.location_conv(weights_cat).transpose(1, 2))
        energies = self.v(torch.tanh(q + loc + processed_memory)).squeeze(-1)
        weights = F.softmax(energies.masked_fill(mask, -float("inf")), dim=1)
        context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)
        return context, weights


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.prenet = nn.ModuleList([nn.Linear(N_MEL, PRENET, bias=False),
                                     nn.Linear(PRENET, PRENET, bias=False)])
        self.attention_rnn = nn.LSTMCell(PRENET + EMBED, ATT_RNN)
        self.attention = Attention()
        self.decoder_rnn = nn.LSTMCell(ATT_RNN + EMBED, DEC_RNN)
        self.projection = nn.Linear(DEC_RNN + EMBED, N_MEL)
        self.gate = nn.Linear(DEC_RNN + EMBED, 1)

    def forward(self, memory, mels, mask):
        batch, steps = memory.shape[0], mels.shape[2]
        go = memory.new_zeros(1, batch, N_MEL)
        x = torch.cat((go, mels.permute(2, 0, 1)), 0)
        for layer in self.prenet:
            x = F.dropout(F.relu(layer(x)), 0.5, True)
        processed_memory = self.attention.memory(memory)
        att_h, att_c = memory.new_zeros(batch, ATT_RNN), memory.new_zeros(batch, ATT_RNN)
        dec_h, dec_c = memory.new_zeros(batch, DEC_RNN), memory.new_zeros(batch, DEC_RNN)
        weights = memory.new_zeros(batch, memory.shape[1])
        weights_cum = memory.new_zeros(batch, memory.shape[1])
        context = memory.new_zeros(batch, EMBED)
        frames, gates = [], []
        for t in range(steps):
            att_h, att_c = self.attention_rnn(torch.cat((x[t], context), -1), (att_h, att_c))
            att_h = F.dropout(att_h, 0.1, self.training)
            weights_cat = torch.cat((weights.unsqueeze(1), weights_cum.unsqueeze(1)), 1)
            context, weights = self.attention(att_h, memory, processed_memory, weights_cat, mask)
            weights_cum = weights_cum + weights
            dec_h, dec_c = self.decoder_rnn(torch.cat((att_h, context), -1), (dec_h, dec_c))
            dec_h = F.dropout(dec_h, 0.1, self.training)
            out = torch.cat((dec_h, context), 1)
            frames.append(self.projection(out))
            gates.append(self.gate(out).squeeze(1))
        return torch.stack(frames).permute(1, 2, 0), torch.stack(gates).t()


class Tacotron2Step(nn.Module):
    """One training step's forward and loss: (text [batch, symbols], text
    lengths [batch], mel target [batch, 80, frames], gate target [batch,
    frames]) -> the loss."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(N_SYMBOLS, EMBED)
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.postnet = nn.ModuleList(
            _conv_bn(N_MEL if i == 0 else POST_DIM, N_MEL if i == POST_CONVS - 1 else POST_DIM,
                     POST_KERNEL) for i in range(POST_CONVS))

    def forward(self, text, text_lengths, mel_target, gate_target):
        memory = self.encoder(self.embedding(text).transpose(1, 2))
        ids = torch.arange(text.shape[1], device=text.device)
        mask = ids.unsqueeze(0) >= text_lengths.unsqueeze(1)
        # teacher forcing: the decoder's inputs are the target's frames
        mels, gates = self.decoder(memory, mel_target, mask)
        post = mels
        for i, conv in enumerate(self.postnet):
            post = conv(post)
            post = F.dropout(torch.tanh(post) if i < POST_CONVS - 1 else post, 0.5, self.training)
        post = post + mels
        return (F.mse_loss(mels, mel_target) + F.mse_loss(post, mel_target)
                + F.binary_cross_entropy_with_logits(gates, gate_target))


def inputs(batch: int):
    text = torch.ones(batch, TEXT_LENGTH, dtype=torch.long)
    lengths = torch.full((batch,), TEXT_LENGTH, dtype=torch.long)
    return text, lengths, torch.zeros(batch, N_MEL, DECODER_STEPS), torch.zeros(batch, DECODER_STEPS)


def trace():
    import predictor

    return predictor.trace(Tacotron2Step, inputs, loss_fn=lambda out: out,
                           optimizer=OPTIMIZER, batch_size=4, name="tacotron2")


def predict_rows(table=None) -> list[dict]:
    """One dict per published figure: predicted mel frames/s and its error."""
    return lambda_fp32_rows(trace(), "tacotron2", PUBLISHED if table is None else table,
                            MEAN_FRAMES, SOURCE)


def main(argv=None) -> int:
    args = breakdown_args(__doc__, argv)
    rows = predict_rows()
    print(SOURCE)
    print_fp32_check(rows, "frames")
    print("exposed host overhead, ms: " + ", ".join(
        f"{r['gpu']} {r['overhead_ms']:.0f}" for r in rows))
    print_summary(rows, args.breakdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
