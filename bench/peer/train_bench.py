#!/usr/bin/python3
"""PyTorch side of saturate's training-speed benchmark.

  train_bench.py --model M --batch B --steps S --warmup W --threads T
                 [--optimizer sgd|adamw] [--lr LR] [--momentum MOM] [--chw CxHxW]
                 [--autocast bf16]

Synthetic data of the model's input shape is generated up front (a few distinct
batches, cycled) so no data loading is timed. The loop is the standard one:
zero_grad, forward, loss, backward, step; with --autocast bf16 the forward and the
loss run under torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's CPU mixed
precision (fp32 weights, bf16 products and the activations autocast keeps). Prints one JSON line:
{"model","batch","threads","steps_per_second","samples_per_second", ...}
measured over the S steps after W warm-up steps.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=models.model_arg)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.0,
                    help="SGD momentum (default 0: plain SGD, the cheapest update)")
    ap.add_argument("--chw", help="image input shape CxHxW (default per model)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seq-len", type=int, default=None, help="GPT sequence length (default: config T)")
    ap.add_argument("--distinct-batches", type=int, default=4)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    chw = models.parse_chw(args.chw) if args.chw else None
    model, spec = models.build(args.model, chw=chw, classes=args.classes, seq_len=args.seq_len)
    model.train()
    B = args.batch
    if spec["kind"] == "image":
        batches = [(torch.rand((B,) + tuple(spec["chw"])), torch.randint(0, spec["classes"], (B,)))
                   for _ in range(args.distinct_batches)]
    else:
        T, V = spec["T"], spec["V"]
        batches = [(torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T)))
                   for _ in range(args.distinct_batches)]
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            loss = models.loss_fn(model, model(x), y)
        loss.backward()
        opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    loss = float(loss.item())  # eager CPU: already synchronous; keeps the value honest
    dt = time.perf_counter() - t0
    sps = args.steps / dt
    print(json.dumps({"model": args.model, "batch": B, "threads": args.threads,
                      "steps_per_second": sps, "samples_per_second": sps * B,
                      "optimizer": args.optimizer, "autocast": args.autocast, "steps": args.steps, "warmup": args.warmup,
                      "seconds": dt, "last_loss": loss, "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
