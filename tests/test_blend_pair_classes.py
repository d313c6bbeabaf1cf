"""benchmarks.blend_pair_classes: a weight per kind of GPU pair, fitted
leave-one-GPU-out with the shipped no-losing-pair rule."""
import itertools

import numpy as np
import pandas as pd

from benchmarks.blend_pair_classes import scores

GPUS = ["A100-PCIE-40GB", "P100-PCIE-16GB", "P4", "T4", "V100-PCIE-32GB"]
PRE_VOLTA = {"P100-PCIE-16GB", "P4"}


def _residuals():
    """Elementwise residuals that recur between GPUs of one SM generation and
    flip sign across generations."""
    rng = np.random.default_rng(0)
    parts = []
    for o, t in itertools.permutations(GPUS, 2):
        r_o = rng.normal(0.0, 0.2, 50)
        same = (o in PRE_VOLTA) == (t in PRE_VOLTA)
        parts.append(pd.DataFrame({"op": "add", "group": "elementwise", "origin": o,
                                   "target": t, "r_o": r_o, "r_t": r_o if same else -r_o}))
    return pd.concat(parts, ignore_index=True)


def test_a_class_whose_residuals_recur_earns_its_own_weight():
    df = scores(_residuals())
    one = df[df.classing == "one weight (shipped)"]
    assert (one.w == 0).all()                      # across-generation pairs would lose
    gen = df[(df.classing == "SM generation") & ~df.target.isin(PRE_VOLTA)
             & ~df.origin.isin(PRE_VOLTA)]
    assert len(gen) == 6 and (gen.w == 1).all()    # Volta-and-later pairs: the ratio
    assert (gen.blend < 1e-6).all() and (gen.pure > 5).all()
    # the class is "same generation or not": the P4 -> P100 pair takes the
    # weight the Volta-and-later pairs earned; the pairs across keep 0
    pre = df[(df.classing == "SM generation") & df.target.isin(PRE_VOLTA)]
    same = pre.origin.isin(PRE_VOLTA)
    assert (pre[same].w == 1).all() and (pre[~same].w == 0).all()
