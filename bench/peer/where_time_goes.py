#!/usr/bin/python3
"""Where PyTorch's training step goes: its dense layers' kernels against everything else.

Runs the peer's training step (the same model, batch, thread count and SGD as
bench/compare's PyTorch side) under torch.profiler and prints the step time, the time in
the dense layers' kernels (Linear's matrix products aten::mm and addmm, convolutions
forward and backward) and in attention's batched products (aten::bmm, baddbmm), and
the bound on saturate/PyTorch for an engine that runs the dense layers' arithmetic at
PyTorch's speed: profiled step / dense kernels (everything else free). A ratio above it
needs faster kernels or less arithmetic (Winograd convolutions, attention that skips
the causal mask's zeros), not less overhead.

  /usr/bin/python3 bench/peer/where_time_goes.py --model gpt-mini --batch 8 [--threads 2]
      [--steps 5] [--warmup 3] [--top 12]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

DENSE = ("aten::mm", "aten::addmm", "aten::mkldnn_convolution", "aten::convolution_backward",
         "aten::thnn_conv2d", "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward")
ATTENTION = ("aten::bmm", "aten::baddbmm")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=models.model_arg)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="profiled steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=12, help="operators listed by their own time")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        print("where_time_goes.py: --batch and --steps must be positive, --warmup not negative", file=sys.stderr)
        return 2

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    model, spec = models.build(args.model)
    model.train()
    B = args.batch
    if spec["kind"] == "image":
        x, y = torch.rand((B,) + tuple(spec["chw"])), torch.randint(0, spec["classes"], (B,))
    else:
        x, y = torch.randint(0, spec["V"], (B, spec["T"])), torch.randint(0, spec["V"], (B, spec["T"]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        models.loss_fn(model, model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    plain_ms = (time.perf_counter() - t0) / args.steps * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / args.steps / 1e3  # ms per step
    def ms(keys):
        return sum(e.self_cpu_time_total for e in events if e.key in keys) / args.steps / 1e3

    dense, attention = ms(DENSE), ms(ATTENTION)
    print(f"{args.model} batch {B}, {args.threads} threads, torch {torch.__version__}")
    print(f"step {plain_ms:.2f} ms unprofiled, {total:.2f} ms profiled; dense layers' kernels {dense:.2f} ms "
          f"({100 * dense / total:.1f}%), attention's products {attention:.2f} ms ({100 * attention / total:.1f}%)")
    if dense > 0:
        print(f"bound on saturate/PyTorch at PyTorch's dense-kernel speed and arithmetic "
              f"(profiled step / dense kernels): {total / dense:.2f}")
    print(f"\n{'operator':40s} {'ms/step':>9s} {'share':>7s}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]:
        ms = e.self_cpu_time_total / args.steps / 1e3
        print(f"{e.key[:40]:40s} {ms:9.3f} {100 * ms / total:6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
