#!/usr/bin/env python3
"""PyTorch (2.x, CUDA) side of saturate's GPU benchmark; bench/gpu/compare runs it.

  peer.py --model M --batches 8,16 [--mode eager|compile] [--precision bf16|f32]
          [--steps S] [--warmup W] [--windows K] [--attention sdpa|naive]
          [--channels-last] [--adamw fused|foreach]
  peer.py --peak     the bf16 GEMM rate of this GPU (8192^3, median of 10 after warm-up)

The models are bench/peer/models.py's, so both engines train the same network. The
loop is the usual one: copy the batch from pinned host memory (non_blocking), forward
and loss under autocast (bf16) or in float32, backward, AdamW step, zero_grad. The
batches are made up front (a few distinct ones, cycled), so nothing else is timed.
After W warm-up steps (torch.compile compiles in the first), K windows of S steps
are timed with CUDA events; steps/s is the median window, best_* the fastest.

GPT attention: 'sdpa' (default) runs the same projections through
F.scaled_dot_product_attention(is_causal=True), the flash kernel a PyTorch user gets;
'naive' keeps models.py's explicit softmax(QK^T)V.

Prints one JSON line per batch size (or one for --peak). A batch that fails (out of
memory, a compile error) prints {"model", "batch", "mode", "error"} and the others
still run; the exit status is 1 if any failed.
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "peer"))
import models  # noqa: E402

DEVICE = torch.device("cuda")


def sdpa_attention_forward(self, x):
    """models.CausalSelfAttention.forward with the attention itself through SDPA."""
    B, T, C = x.shape
    hs = C // self.n_head
    q, k, v = self.c_attn(x).split(C, dim=2)
    q = q.view(B, T, self.n_head, hs).transpose(1, 2)
    k = k.view(B, T, self.n_head, hs).transpose(1, 2)
    v = v.view(B, T, self.n_head, hs).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def gpt_flops_per_token(name):
    """nanoGPT's / PaLM's estimate: 6 N + 12 L H Q T, with N the parameters less the
    position embedding (the tied token embedding counts once)."""
    L, H, C, T, V = models.GPT_CONFIGS[name]
    n_params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    n = n_params - T * C
    return {"params": n_params, "params_no_wpe": n, "flops_per_token": 6 * n + 12 * L * H * (C // H) * T}


def measure_peak(n=8192, warmup=3, reps=10):
    dev = DEVICE
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)  # random, never zeros
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(warmup):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, b, out=c)
        e.record()
        e.synchronize()
        ms.append(s.elapsed_time(e))
    med = statistics.median(ms)
    return {"peak": True, "n": n, "median_ms": med, "tflops": 2 * n ** 3 / (med * 1e-3) / 1e12,
            "best_tflops": 2 * n ** 3 / (min(ms) * 1e-3) / 1e12}


def make_batches(spec, B, count, channels_last):
    """`count` distinct (x, y) batches in pinned host memory."""
    out = []
    for _ in range(count):
        if spec["kind"] == "image":
            x = torch.rand((B,) + tuple(spec["chw"]))
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, spec["classes"], (B,))
        else:
            x = torch.randint(0, spec["V"], (B, spec["T"]))
            y = torch.randint(0, spec["V"], (B, spec["T"]))
        out.append((x.pin_memory(), y.pin_memory()))
    return out


def run_batch(args, B):
    dev = DEVICE
    torch.manual_seed(0)
    if args.mode == "compile":
        torch._dynamo.reset()
    model, spec = models.build(args.model)
    model = model.to(dev).train()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    kw = {"fused": True} if args.adamw == "fused" else {"foreach": True}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, **kw)
    fwd = torch.compile(model, dynamic=False) if args.mode == "compile" else model
    batches = make_batches(spec, B, args.distinct_batches, args.channels_last)
    bf16 = args.precision == "bf16"

    def step(i):
        x, y = batches[i % len(batches)]
        x = x.to(dev, non_blocking=True)
        y = y.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = models.loss_fn(model, fwd(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    step(0)
    torch.cuda.synchronize()
    first_step_s = time.perf_counter() - t0
    for i in range(1, args.warmup):
        step(i)
    torch.cuda.synchronize()
    sps = []
    i = args.warmup
    for _ in range(args.windows):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(args.steps):
            loss = step(i)
            i += 1
        e.record()
        e.synchronize()
        sps.append(args.steps / (s.elapsed_time(e) * 1e-3))
    last_loss = float(loss.item())
    r = {"model": args.model, "batch": B, "mode": args.mode, "precision": args.precision,
         "steps_per_second": statistics.median(sps), "best_steps_per_second": max(sps),
         "window_steps_per_second": sps, "steps": args.steps, "windows": args.windows,
         "warmup": args.warmup, "first_step_seconds": first_step_s, "last_loss": last_loss,
         "max_memory_bytes": torch.cuda.max_memory_allocated(),
         "optimizer": f"AdamW lr={args.lr} wd={args.weight_decay} ({args.adamw})"}
    r["samples_per_second"] = r["steps_per_second"] * B
    if spec["kind"] == "tokens":
        r["tokens_per_second"] = r["samples_per_second"] * spec["T"]
        r["attention"] = args.attention
        r.update(gpt_flops_per_token(args.model))
    else:
        r["channels_last"] = args.channels_last
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peak", action="store_true", help="measure the bf16 GEMM rate and exit")
    ap.add_argument("--model", choices=models.MODEL_NAMES)
    ap.add_argument("--batches", help="comma-separated micro-batch sizes, each measured in turn")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed window")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (at least 1)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--adamw", choices=["fused", "foreach"], default="fused",
                    help="PyTorch's AdamW implementation (fused: one kernel per step)")
    ap.add_argument("--attention", choices=["sdpa", "naive"], default="sdpa")
    ap.add_argument("--channels-last", action="store_true", help="image models: NHWC model and input")
    ap.add_argument("--distinct-batches", type=int, default=4)
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("peer.py: PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version()}
    if args.peak:
        print(json.dumps({**measure_peak(), **info}), flush=True)
        return 0
    if not args.model or not args.batches:
        ap.error("--model and --batches are required (or --peak)")
    args.warmup = max(1, args.warmup)
    if args.attention == "sdpa":
        models.CausalSelfAttention.forward = sdpa_attention_forward
    torch.backends.cudnn.benchmark = True
    failed = False
    for B in [int(b) for b in args.batches.split(",") if b.strip()]:
        try:
            r = run_batch(args, B)
        except Exception as e:  # noqa: BLE001 -- one batch's failure must not hide the others
            traceback.print_exc(file=sys.stderr)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            r = {"model": args.model, "batch": B, "mode": args.mode, "error": f"{type(e).__name__}: {msg}"[:300]}
            failed = True
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        print(json.dumps({**r, **info}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
