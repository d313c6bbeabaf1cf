"""Hardware-aware architecture search with Ray Tune, the predictor as the cost model.

    pip install "ray[tune]"
    python examples/ray_tune_search.py --samples 40            # a local Ray
    python examples/ray_tune_search.py --samples 400 --address auto   # a cluster

Maximises accuracy proxy x predicted T4 training throughput over a small
ResNet/ViT family under a peak-memory limit (examples/hardware_aware.py); no GPU
is needed. Each Tune trial is one call of ``hardware_aware.evaluate``.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hardware_aware as hw  # noqa: E402


def trainable(config: dict) -> dict:
    # Tune runs this in a worker process: the examples folder is on its path
    # through the runtime environment set in main().
    import hardware_aware

    return hardware_aware.evaluate(config)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--address", default=None, help="a Ray cluster (e.g. auto); default a local one")
    ap.add_argument("--cpus", type=int, default=None, help="CPUs of the local Ray")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import ray
    from ray import tune

    env = {"env_vars": {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}}
    ray.init(address=args.address, num_cpus=args.cpus, runtime_env=env,
             include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        tuner = tune.Tuner(
            trainable,
            param_space={k: tune.choice(v) for k, v in hw.SPACE.items()},
            tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=args.samples,
                                        search_alg=tune.search.BasicVariantGenerator(
                                            random_state=args.seed)),
            run_config=tune.RunConfig(verbose=0))
        result = tuner.fit().get_best_result()
    finally:
        ray.shutdown()
    best = {**result.config, **{k: result.metrics[k] for k in
                                ("score", "accuracy_proxy", "samples_per_s", "iteration_ms",
                                 "memory_gb", "fits", "params")}}
    print(f"{args.samples} trials on {hw.GPU}, memory limit {hw.MEMORY_LIMIT_GB} GiB; best:")
    for k, v in best.items():
        print(f"  {k:15} {v:.4g}" if isinstance(v, float) else f"  {k:15} {v}")
    return best


if __name__ == "__main__":
    main()
