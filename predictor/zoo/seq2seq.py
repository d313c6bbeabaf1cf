"""Sequence-to-sequence translation models in plain torch.nn.

* Transformer base (Vaswani et al. 2017): d_model 512, 8 heads, 6+6 layers,
  FF 2048, dropout 0.1, post-norm, shared 32000-token vocabulary (the source
  and target embeddings and the output projection are one matrix, no output
  bias), sinusoidal positions, embeddings scaled by sqrt(d_model). Built on
  ``torch.nn.Transformer(batch_first=True)``, which (unlike the paper) also
  applies a final LayerNorm to the encoder and to the decoder output (+2,048
  parameters).
* GNMT v2 as in MLPerf / NVIDIA DeepLearningExamples (Habitat's GNMT):
  shared 32320 x 1024 embedding, encoder of 4 LSTM layers (first
  bidirectional, residual connections from the third), decoder whose first
  LSTM layer feeds a normalized Bahdanau attention whose context is
  concatenated to the input of every later decoder LSTM layer (residual from
  the third), dropout 0.2, linear classifier to 32320. Deviation: every
  sentence is full length (no source lengths, no packed sequences and no
  attention padding mask), because those depend on tensor values.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import check_batch, check_seq

# --------------------------------------------------------------------------- Transformer

TRANSFORMER_VOCAB = 32000
TRANSFORMER_MAX_LEN = 1024


def _sinusoids(max_len: int, d_model: int) -> torch.Tensor:
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)
    return pe


class TransformerBase(nn.Module):
    def __init__(
        self,
        vocab_size: int = TRANSFORMER_VOCAB,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        max_len: int = TRANSFORMER_MAX_LEN,
    ):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, mean=0.0, std=d_model**-0.5)
        self.register_buffer("pos", _sinusoids(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        with warnings.catch_warnings():
            # nn.Transformer deep-copies its layers; under FakeTensorMode that
            # copy checks data_ptr() and warns. The copies are fine.
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            self.transformer = nn.Transformer(
                d_model=d_model,
                nhead=nhead,
                num_encoder_layers=num_encoder_layers,
                num_decoder_layers=num_decoder_layers,
                dim_feedforward=dim_feedforward,
                dropout=dropout,
                batch_first=True,
            )

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        return self.dropout(self.embed(tokens) * math.sqrt(self.d_model) + self.pos[:s])

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        t = tgt.shape[1]
        # Causal mask from a tensor created here: shape-driven, never value-dependent.
        # tgt_is_causal=True stops nn.Transformer from comparing the mask's values.
        causal = torch.triu(torch.full((t, t), float("-inf"), device=tgt.device), diagonal=1)
        h = self.transformer(self._embed(src), self._embed(tgt), tgt_mask=causal, tgt_is_causal=True)
        return F.linear(h, self.embed.weight)  # shared output projection -> (B, T, V)


def build_transformer() -> nn.Module:
    return TransformerBase()


def transformer_inputs(batch_size: int, seq_len: int | None = None) -> tuple:
    b = check_batch(batch_size)
    s = check_seq(seq_len, 50, TRANSFORMER_MAX_LEN, "transformer")
    return torch.ones(b, s, dtype=torch.long), torch.ones(b, s, dtype=torch.long)


# --------------------------------------------------------------------------- GNMT

GNMT_VOCAB = 32320
GNMT_PAD = 0


class BahdanauAttention(nn.Module):
    """Normalized Bahdanau (additive) attention, as in NVIDIA's GNMT v2."""

    def __init__(self, query_size: int, key_size: int, num_units: int, init_weight: float = 0.1):
        super().__init__()
        self.linear_q = nn.Linear(query_size, num_units, bias=False)
        self.linear_k = nn.Linear(key_size, num_units, bias=False)
        self.linear_att = nn.Parameter(torch.empty(num_units).uniform_(-init_weight, init_weight))
        self.normalize_scalar = nn.Parameter(torch.full((1,), 1.0 / math.sqrt(num_units)))
        self.normalize_bias = nn.Parameter(torch.zeros(num_units))

    def forward(self, query: torch.Tensor, keys: torch.Tensor):
        # query (B, Tq, H), keys (B, Tk, H)
        pq = self.linear_q(query).unsqueeze(2)  # (B, Tq, 1, U)
        pk = self.linear_k(keys).unsqueeze(1)  # (B, 1, Tk, U)
        sum_qk = pq + pk + self.normalize_bias
        att = self.linear_att / self.linear_att.norm() * self.normalize_scalar
        scores = torch.tanh(sum_qk).matmul(att)  # (B, Tq, Tk)
        scores = F.softmax(scores, dim=-1)
        context = torch.bmm(scores, keys)  # (B, Tq, H)
        return context, scores


class GNMTEncoder(nn.Module):
    def __init__(self, embedder: nn.Embedding, hidden: int = 1024, num_layers: int = 4, dropout: float = 0.2):
        super().__init__()
        self.embedder = embedder
        self.rnn_layers = nn.ModuleList(
            [
                nn.LSTM(hidden, hidden, batch_first=True, bidirectional=True),
                nn.LSTM(2 * hidden, hidden, batch_first=True),
            ]
            + [nn.LSTM(hidden, hidden, batch_first=True) for _ in range(num_layers - 2)]
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embedder(src))
        x, _ = self.rnn_layers[0](x)
        x = self.dropout(x)
        x, _ = self.rnn_layers[1](x)
        for i in range(2, len(self.rnn_layers)):
            residual = x
            x = self.dropout(x)
            x, _ = self.rnn_layers[i](x)
            x = x + residual
        return x


class GNMTDecoder(nn.Module):
    def __init__(self, embedder: nn.Embedding, vocab: int, hidden: int = 1024, num_layers: int = 4, dropout: float = 0.2):
        super().__init__()
        self.embedder = embedder
        self.att_rnn = nn.LSTM(hidden, hidden, batch_first=True)
        self.attn = BahdanauAttention(hidden, hidden, hidden)
        self.rnn_layers = nn.ModuleList(
            [nn.LSTM(2 * hidden, hidden, batch_first=True) for _ in range(num_layers - 1)]
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, vocab)

    def forward(self, tgt: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embedder(tgt))
        # Attention sits on top of the first LSTM layer (no input feeding), so
        # under teacher forcing it is computed for all steps at once.
        x, _ = self.att_rnn(x)
        attn, _ = self.attn(x, context)
        x = self.dropout(x)
        x = torch.cat((x, attn), dim=2)
        x, _ = self.rnn_layers[0](x)
        for i in range(1, len(self.rnn_layers)):
            residual = x
            x = self.dropout(x)
            x = torch.cat((x, attn), dim=2)
            x, _ = self.rnn_layers[i](x)
            x = x + residual
        return self.classifier(x)


class GNMT(nn.Module):
    def __init__(self, vocab_size: int = GNMT_VOCAB, hidden: int = 1024, num_layers: int = 4, dropout: float = 0.2):
        super().__init__()
        embedder = nn.Embedding(vocab_size, hidden, padding_idx=GNMT_PAD)  # shared
        self.encoder = GNMTEncoder(embedder, hidden, num_layers, dropout)
        self.decoder = GNMTDecoder(embedder, vocab_size, hidden, num_layers, dropout)
        for name, p in self.named_parameters():
            if "attn" not in name:
                nn.init.uniform_(p, -0.1, 0.1)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.decoder(tgt, self.encoder(src))  # (B, T, V)


def build_gnmt() -> nn.Module:
    return GNMT()


def gnmt_inputs(batch_size: int, seq_len: int | None = None) -> tuple:
    b = check_batch(batch_size)
    s = check_seq(seq_len, 50, None, "gnmt")
    # token 1 (UNK), not the padding index 0
    return torch.ones(b, s, dtype=torch.long), torch.ones(b, s, dtype=torch.long)
