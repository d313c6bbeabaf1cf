"""Calibrated batch-size extrapolation on this CPU, against real measurements.

For each model: trace it at batch b, calibrate on the CPU (every op and the
real training step timed at b/4, b and 2b), predict the iteration at
batch 4b with that calibration, and compare with the real step at 4b (warm,
median of several iterations). The 4b iterations are timed in between the
calibration's passes (so that both see the same state of a shared machine);
the calibration never sees them.

Models (both small enough for a 2-core CI box):

- ``resnet18``: a ResNet-18 (basic blocks 2-2-2-2, 11.2 M params) on 64 x 64
  images, 100 classes, cross-entropy, Adam;
- ``encoder``: a 4-layer Transformer encoder (d_model 256, 4 heads, FFN 1024,
  sequence 128, token embedding + LM head over 1000 tokens), cross-entropy,
  Adam.

Also printed, for contrast: the per-op sum alone (without the overhead model)
and the pure-mode prediction (the analytical model on the CPU's measured
peaks, no measurement of any op).

Timing on a shared machine: by default torch runs one thread and times are
CPU time of the process (``--clock cpu``), which equals the uncontended wall
time of a single-threaded run even while other jobs share the cores; use
``--clock wall --threads N`` on a quiet machine.

    python -m benchmarks.calibration_cpu                      # both models, b = 8
    python -m benchmarks.calibration_cpu --models resnet18 --batch 4 --factor 4
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------- models --

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18Small(nn.Module):
    """ResNet-18 for 64 x 64 inputs: a 3x3 stem without max-pool (CIFAR style)."""

    def __init__(self, classes: int = 100):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1),
                             (512, 2), (512, 1)):
            blocks.append(BasicBlock(cin, cout, stride))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Encoder(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 256, heads: int = 4, ffn: int = 1024,
                 layers: int = 4, seq: int = 128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.encoder(self.tok(ids) + self.pos))


def class_loss(out):
    return F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long, device=out.device))


def token_loss(out):
    flat = out.reshape(-1, out.shape[-1])
    return F.cross_entropy(flat, torch.zeros(flat.shape[0], dtype=torch.long, device=out.device))


MODELS = {
    "resnet18": (ResNet18Small, lambda b: (torch.randn(b, 3, 64, 64),), class_loss),
    "encoder": (Encoder, lambda b: (torch.randint(0, 1000, (b, 128)),), token_loss),
}


# ----------------------------------------------------------------------- run --

def run_model(name: str, batch: int, factor: int, repeats: int, iterations: int, clock: str,
              threads: int, progress: bool, measure_iterations: int) -> dict:
    import statistics

    import predictor
    from predictor.calibration.step import build_step, step_samples

    make, inputs, loss = MODELS[name]
    torch.manual_seed(0)
    graph = predictor.trace(make(), inputs(batch), loss_fn=loss, batch_size=batch, name=name)
    target = factor * batch
    cpu = torch.device("cpu")
    # The ground truth: the real step at the target batch, built and timed as
    # the calibration times its own real iterations. Its iterations are
    # interleaved with the calibration's passes (the calibration never sees
    # them), so that both measure the same state of a shared machine.
    truth = build_step(graph.source, graph.mode, graph.optimizer, target, cpu, graph.amp)
    step_samples(truth, cpu, iterations=1, warmup=1, clock=clock)
    real: list[float] = []
    sizes = sorted({max(1, batch // 4), batch, 2 * batch})  # the calibration's default
    passes = len(sizes) * repeats
    due = [(p + 1) * measure_iterations // passes - p * measure_iterations // passes
           for p in range(passes)]

    def interleave(b: int, p: int) -> None:
        k = due[sizes.index(b) * repeats + p]
        if k:
            torch.set_num_threads(threads)
            real.extend(step_samples(truth, cpu, iterations=k, warmup=0, clock=clock))

    t0 = time.perf_counter()
    cal = predictor.calibrate(graph, device="cpu", repeats=repeats, batch_sizes=sizes,
                              iterations=iterations, clock=clock, threads=threads,
                              progress=progress, on_pass=interleave)
    cal_s = time.perf_counter() - t0
    del truth
    pred = predictor.predict(graph, "cpu", calibration=cal, batch_size=target)
    pure = _pure_cpu(graph, cal, target)
    return {
        "model": name, "batch": batch, "target": target, "cal": cal, "cal_s": cal_s,
        "predicted": pred.iteration_ms, "ops_only": pred.iteration_ms - pred.overhead_ms,
        "measured": float(statistics.median(real)), "measured_n": len(real),
        "measured_spread": (min(real), max(real)), "pure": pure,
    }


def _pure_cpu(graph, cal, batch: int) -> float:
    """The uncalibrated model on the CPU's measured peaks (no op measured)."""
    from predictor.calibration.calibrate import origin_model_us
    from predictor.engine import model_params

    us = origin_model_us(graph.ops, batch, cal.device_info, model_params())
    return float((us * graph.ops.count).sum() * 1e-3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,encoder")
    ap.add_argument("--batch", type=int, default=8, help="calibration batch size b")
    ap.add_argument("--factor", type=int, default=4, help="predict and measure batch factor x b")
    ap.add_argument("--repeats", type=int, default=7, help="timing samples (passes) per op")
    ap.add_argument("--iterations", type=int, default=10,
                    help="real iterations the calibration times per batch size (median)")
    ap.add_argument("--measure-iterations", type=int, default=20,
                    help="real iterations timed at the predicted batch size (median)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), clock={args.clock}, repeats={args.repeats}, "
          f"iterations={args.iterations}, measured iterations={args.measure_iterations}")
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in MODELS:
            print(f"unknown model {name!r}; choose from {', '.join(MODELS)}", file=sys.stderr)
            return 2
        r = run_model(name, args.batch, args.factor, args.repeats, args.iterations, args.clock,
                      args.threads, not args.no_progress, args.measure_iterations)
        cal = r["cal"]
        s = cal.summary()
        print(f"\n## {name}: calibrated at batch {s['batch_sizes']} in {r['cal_s']:.0f} s "
              f"({s['measured_rows']}/{s['rows']} rows measured"
              + (f", skipped: {s['skipped']}" if s["skipped"] else "") + ")")
        info = cal.device_info
        print(f"   CPU: {info.peak_gflops:.1f} GFLOP/s (fp32 matmul), {info.bandwidth_gbs:.1f} GB/s "
              f"(triad), {info.op_overhead_us:.1f} us per op, fresh memory "
              f"{(info.alloc_us_per_mib or 0):.0f} us/MiB above "
              f"{(info.alloc_threshold_bytes or 0) / 2**20:.0f} MiB")
        for b, o, it in zip(s["batch_sizes"], s["ops_ms"], s["iteration_ms"]):
            gap = "" if it is None else f", real iteration {it:.1f} ms, gap {it - o:+.1f} ms"
            print(f"   batch {b}: per-op sum {o:.1f} ms{gap}")
        ov = cal.overhead
        print(f"   overhead model: real = (1 {ov.scale:+.3f}) x ops + {ov.fixed_ms:.1f} ms "
              f"({ov.points} points)")
        lo, hi = r["measured_spread"]
        print(f"   batch {r['target']}: real iteration {r['measured']:.1f} ms (median of "
              f"{r['measured_n']}, {lo:.1f}..{hi:.1f}), predicted {r['predicted']:.1f} ms")
        rows.append(r)
    print("\n| model | calibrated at | predicted at | measured ms | calibrated ms | error "
          "| per-op sum only | error | pure model | error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = r["measured"]

        def err(x):
            return f"{(x - m) / m * 100:+.1f} %"

        sizes = ", ".join(str(int(b)) for b in r["cal"].batch_sizes)
        print(f"| {r['model']} | {sizes} | {r['target']} | {m:.1f} | "
              f"{r['predicted']:.1f} | {err(r['predicted'])} | {r['ops_only']:.1f} | "
              f"{err(r['ops_only'])} | {r['pure']:.1f} | {err(r['pure'])} |")
    worst = max(abs(r["predicted"] - r["measured"]) / r["measured"] for r in rows)
    print(f"\nworst calibrated error {worst * 100:.1f} % (target <= 10 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
