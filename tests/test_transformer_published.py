"""NVIDIA's published Transformer-big throughput
(benchmarks/transformer_published.py): the model has transformer_wmt_en_de_big_t2t's
parameters, batches are counted as the loader fills them, and each figure and
mixed-precision speedup is priced near the published one."""

import math

import pytest

import predictor
from benchmarks import transformer_published as tp


def test_the_model_has_transformer_big_parameters():
    d, f, v, n = tp.D_MODEL, tp.FFN, tp.VOCAB, tp.LAYERS
    attention = 4 * d * d                      # q, k, v and output projections, no bias
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder = n * (attention + ffn + 2 * norm)
    decoder = n * (2 * attention + ffn + 3 * norm)
    want = v * d + encoder + decoder + 2 * norm  # one shared embedding, final norms
    assert sum(p.numel() for p in tp.TransformerStep().parameters()) == want
    assert 205e6 < want < 215e6  # the "big" Transformer's ~210 M


def test_batches_hold_whole_multiples_of_eight_sentences_within_the_token_budget():
    for tokens in (2560, 5120, 10240):
        for length in (7, 32, 64, 100):
            n = tp.sentences(tokens, length)
            assert n % 8 == 0 and n * length <= tokens and (n + 8) * length > tokens


def test_rows_are_priced_near_the_published_figures():
    known = set(predictor.gpus()["id"])
    rows = tp.predict_rows()
    assert len(rows) == len(tp.PUBLISHED)
    for r in rows:
        assert r["gpu"] in known
        assert math.isfinite(r["predicted"]) and r["predicted"] > 0
        assert r["error_pct"] == pytest.approx(100 * (r["predicted"] / r["published"] - 1))
        assert abs(r["error_pct"]) < 25, r
    for gpu, published, predicted in tp.speedups(rows):
        assert abs(predicted / published - 1) < 0.2, (gpu, published, predicted)
