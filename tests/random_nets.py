"""A small random group network for tests that need weights of a known
layout but no trained values."""

import numpy as np

from predictor.calibration.train import GroupModel
from predictor.kernels.features import N_FEATURES


def random_net(group: int, seed: int, aux=None) -> GroupModel:
    """A two-hidden-layer network of `group` with seeded random weights and
    auxiliary numbers `aux` (None: none)."""
    rng = np.random.default_rng(seed)
    layers = [(rng.normal(0, 0.4, (8, N_FEATURES)), rng.normal(0, 0.3, 8)),
              (rng.normal(0, 0.4, (6, 8)), rng.normal(0, 0.3, 6)),
              (rng.normal(0, 0.4, 6), float(rng.normal(0, 0.3)))]
    return GroupModel(group, rng.normal(0, 3, N_FEATURES), rng.uniform(0.5, 4, N_FEATURES),
                      layers, 2.0, 1.0, None if aux is None else np.asarray(aux, float))
