"""The error each prediction quotes beside it (``predictor.expected_error``):
the 90th percentile of |error| of predictions of the same standing against
measured or published iterations, and whether that band holds for a GPU left
out of it.

    python -m benchmarks.e2e --data ../shared/data/neusight --csv in_dist.csv
    python -m benchmarks.e2e --data ../shared/data/neusight --logo --csv logo.csv
    python -m benchmarks.expected_error --in-dist in_dist.csv --logo logo.csv [--write]
    python -m benchmarks.expected_error --published-only [--write]

- ``trained``: the first file's labels (fp32 iterations of the five training
  boards, the shipped op models);
- ``unseen``: the second's (each GPU's labels predicted by op models trained
  without it), and every published or logged fp32 figure the harnesses
  price on a board outside the op models' data (the V100 SXM2s, the Quadro
  RTX 8000, and Lambda's 2020-2022 runs on a GTX 1080 Ti and four TU102
  boards: ResNet-50, BERT, GNMT, NCF, Transformer-big, Transformer-XL,
  WaveGlow, Tacotron 2);
- ``tensor cores``: the AMP and TF32 rows of ``benchmarks.amp_published``
  (published ResNet-50 and BERT training throughput), of
  ``benchmarks.timm_published`` (timm's AMP training and inference of
  ResNets and Inception v3, NCHW and channels-last, and training of
  ConvNeXt-T, MobileNetV2 and EfficientNet-B0), and of
  ``benchmarks.gnmt_published``, ``benchmarks.ncf_published`` (NVIDIA's and
  Lambda's tables), ``benchmarks.transformer_published``,
  ``benchmarks.transformerxl_published``,
  ``benchmarks.waveglow_published``, ``benchmarks.tacotron2_published`` and
  ``benchmarks.diffusion_published`` (Stable Diffusion's half-precision
  denoising steps): every published figure the predictor prices on tensor
  cores, computed here.

The held-out check: for each GPU, the band from every *other* GPU's labels,
and the share of its own labels inside it. A band that holds about 90 % of
a left-out GPU's predictions is one a GPU outside the data can trust.
``--write`` stores the figures in ``predictor/weights/expected_error.json``
(atomically). ``--published-only`` recomputes the ``tensor cores`` standing
alone (100 s) and keeps the other two of that file: for a change of the
tensor-core pricing, which no fp32 figure sees (a change of fp32 pricing
moves the ``unseen`` standing's published rows too: run the whole)."""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
from pathlib import Path

import numpy as np

from predictor import expected_error

OUT = Path(__file__).resolve().parent.parent / "predictor" / "weights" / expected_error.FILE
COMMAND = ("python -m benchmarks.expected_error --in-dist in_dist.csv --logo logo.csv --write "
           "(module docstring: the e2e runs that write the two files)")


def p90(err) -> float:
    return float(np.percentile(np.abs(np.asarray(err, dtype=np.float64)), 90))


def held_out(gpus, err) -> tuple[dict[str, float], float]:
    """({gpu: share of its |error| within the band of the other GPUs'},
    share over all rows)."""
    gpus = np.asarray(gpus, dtype=object)
    err = np.abs(np.asarray(err, dtype=np.float64))
    shares, inside = {}, 0
    for g in dict.fromkeys(gpus):
        mine = gpus == g
        if mine.all():
            continue
        band = p90(err[~mine])
        n_in = int((err[mine] <= band).sum())
        shares[str(g)] = n_in / int(mine.sum())
        inside += n_in
    return shares, inside / len(err)


def from_e2e(path: Path) -> tuple[list[str], np.ndarray]:
    import pandas as pd

    df = pd.read_csv(path)
    return df["gpu"].astype(str).tolist(), df["err_pct"].to_numpy(np.float64)


def _published_candidates() -> list[dict]:
    """Every published row the harnesses price, each with its "precision"."""
    from benchmarks import (amp_published, diffusion_published, gnmt_published, ncf_published,
                            tacotron2_published, timm_published, transformer_published,
                            transformerxl_published, waveglow_published)

    return (amp_published.run()
            + [dict(r, precision="amp") for r in timm_published.run()]
            + [dict(r, precision="amp")
               for r in timm_published.run(timm_published.DEPTHWISE_PUBLISHED)]
            + [dict(r, precision="amp") for r in diffusion_published.predict_rows()]
            + gnmt_published.predict_rows()
            + gnmt_published.predict_rows(table=gnmt_published.LAMBDA)
            + ncf_published.predict_rows() + ncf_published.predict_rows(ncf_published.lambda_table())
            + transformer_published.predict_rows() + transformerxl_published.predict_rows()
            + waveglow_published.predict_rows() + tacotron2_published.predict_rows())


def _early_candidates() -> list[dict]:
    """Lambda's 2020-2022 runs the harnesses price from their logs."""
    from benchmarks import amp_published, gnmt_published

    return amp_published.early_logged_steps() + gnmt_published.early_rows()


def from_published(candidates: list[dict] | None = None) -> tuple[list[str], np.ndarray]:
    """The published rows whose GEMMs the predictor runs on tensor cores
    (AMP, or TF32 where the GPU has TF32 tensor cores), as a prediction's
    standing is decided."""
    from benchmarks.amp_published import standing_of

    rows = [r for r in (_published_candidates() if candidates is None else candidates)
            if r["precision"] in ("amp", "tf32")
            and standing_of(r["gpu"], r["precision"]) == "tensor cores"]
    return [r["gpu"] for r in rows], np.array([r["error_pct"] for r in rows])


def from_published_fp32(candidates: list[dict] | None = None) -> tuple[list[str], np.ndarray]:
    """The published and logged fp32 rows on boards outside the op models'
    data (standing "unseen"): the harnesses' fp32 figures and Lambda's
    2020-2022 runs' logged ones (``amp_published.early_logged_steps``,
    ``gnmt_published.early_rows``), error as each harness states it (of the
    throughput)."""
    from benchmarks.amp_published import standing_of

    if candidates is None:
        candidates = _published_candidates() + _early_candidates()
    rows = [r for r in candidates
            if r["precision"] == "fp32" and standing_of(r["gpu"], "fp32") == "unseen"]
    return [r["gpu"] for r in rows], np.array([r["error_pct"] for r in rows])


def standing_figures(gpus, err, source: str) -> dict:
    shares, share = held_out(gpus, err)
    return {"p90_abs_error_pct": round(p90(err), 1),
            "mean_abs_error_pct": round(float(np.mean(np.abs(err))), 1),
            "labels": len(err), "gpus": len(set(gpus)), "source": source,
            "held_out_share_within": round(share, 3),
            "held_out_share_within_by_gpu": {g: round(v, 3) for g, v in shares.items()}}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=OUT.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in-dist", type=Path,
                    help="per-label CSV of `python -m benchmarks.e2e --csv` (shipped op models)")
    ap.add_argument("--logo", type=Path,
                    help="per-label CSV of `python -m benchmarks.e2e --logo --csv`")
    ap.add_argument("--published-only", action="store_true",
                    help=f"recompute the 'tensor cores' standing only, keeping the other two "
                         f"of {OUT.name}")
    ap.add_argument("--write", action="store_true", help=f"store the figures in {OUT}")
    args = ap.parse_args(argv)
    e2e_files = (args.in_dist is not None, args.logo is not None)
    if any(e2e_files) if args.published_only else not all(e2e_files):
        ap.error("give --in-dist and --logo, or --published-only")
    candidates = _published_candidates()
    if args.published_only:
        kept = json.loads(OUT.read_text(encoding="utf-8"))["standings"]
        standings = {"trained": kept["trained"], "unseen": kept["unseen"]}
    else:
        logo_gpus, logo_err = from_e2e(args.logo)
        pub_gpus, pub_err = from_published_fp32(candidates + _early_candidates())
        standings = {
            "trained": standing_figures(*from_e2e(args.in_dist),
                                        "NeuSight's measured fp32 iterations of the five "
                                        "training boards, shipped op models (benchmarks.e2e)"),
            "unseen": standing_figures(logo_gpus + pub_gpus,
                                       np.concatenate([logo_err, pub_err]),
                                       "the same iterations, each GPU's predicted by op models "
                                       "trained without it (benchmarks.e2e --logo), and every "
                                       "published or logged fp32 figure on a board outside the "
                                       "data that the harnesses price (the V100 SXM2s, Quadro "
                                       "RTX 8000 and Lambda's 2020-2022 runs on Pascal and "
                                       "Turing boards: ResNet-50, BERT, GNMT, NCF, "
                                       "Transformer-big, Transformer-XL, WaveGlow, "
                                       "Tacotron 2)"),
        }
    standings["tensor cores"] = standing_figures(*from_published(candidates),
                                                 "published AMP and TF32 throughput: "
                                                 "ResNet-50 and BERT training "
                                                 "(benchmarks.amp_published), ResNets and "
                                                 "Inception v3 training and inference, "
                                                 "ConvNeXt-T, MobileNetV2 and "
                                                 "EfficientNet-B0 training "
                                                 "(benchmarks.timm_published), GNMT, NCF, "
                                                 "Transformer-big, Transformer-XL, WaveGlow "
                                                 "and Tacotron 2 training "
                                                 "(benchmarks.gnmt_published, ncf_published, "
                                                 "transformer_published, "
                                                 "transformerxl_published, waveglow_published, "
                                                 "tacotron2_published), Stable Diffusion "
                                                 "v1.5 denoising steps "
                                                 "(benchmarks.diffusion_published)")
    print("| standing | labels | GPUs | mean abs error | 90th percentile | held-out GPU's "
          "labels within the others' band |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, s in standings.items():
        print(f"| {name} | {s['labels']} | {s['gpus']} | {s['mean_abs_error_pct']:.1f} % | "
              f"{s['p90_abs_error_pct']:.1f} % | {s['held_out_share_within']:.0%} |")
    for name, s in standings.items():
        by = ", ".join(f"{g} {v:.0%}" for g, v in s["held_out_share_within_by_gpu"].items())
        print(f"{name}, by held-out GPU: {by}")
    if args.write:
        from predictor.io import atomic_writer

        command = COMMAND if not args.published_only else \
            COMMAND + "; the tensor-cores standing since by --published-only"
        doc = {"format": expected_error.FORMAT, "command": command,
               "date": datetime.date.today().isoformat(), "commit": _commit(),
               "standings": standings}
        with atomic_writer(OUT, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(doc, indent=1) + "\n")
        expected_error.read(OUT)  # what was written reads back
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
