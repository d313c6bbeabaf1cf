"""Hardware-aware architecture search with Optuna, the predictor as the cost model.

    pip install optuna
    python examples/optuna_search.py --trials 40

Maximises accuracy proxy x predicted T4 training throughput over a small
ResNet/ViT family under a peak-memory limit (examples/hardware_aware.py); no GPU
is needed. Each trial costs one trace per new (arch, depth, width) and one
prediction.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hardware_aware as hw  # noqa: E402


def objective(trial) -> float:
    config = {k: trial.suggest_categorical(k, v) for k, v in hw.SPACE.items()}
    metrics = hw.evaluate(config)
    for k, v in metrics.items():
        if k != "score":
            trial.set_user_attr(k, v)
    return metrics["score"]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=args.seed))
    study.optimize(objective, n_trials=args.trials)
    best = {**study.best_params, "score": study.best_value, **study.best_trial.user_attrs}
    print(f"{len(study.trials)} trials on {hw.GPU}, memory limit {hw.MEMORY_LIMIT_GB} GiB; best:")
    for k, v in best.items():
        print(f"  {k:15} {v:.4g}" if isinstance(v, float) else f"  {k:15} {v}")
    return best


if __name__ == "__main__":
    main()
