#!/usr/bin/python3
"""Plans from Python: the memory plan of one layout (saturate info) and the fastest layout
of a cluster (saturate plan), as Python objects.

Usage: python3 examples/python/plan.py   (PYTHONPATH=build)
"""
import saturate

info = saturate.info("gpt-mini", batch=8)
print(f"{info.model}: {info.parameters} parameters, {info.total_bytes / 2**20:.1f} MiB per step at batch 8")
for row in info.memory:
    print(f"  {row.name:<22} {row.bytes / 2**20:8.1f} MiB  {row.note}")

plan = saturate.plan("gpt2-124m", gpus=8, gpu="h100-sxm", global_batch=256)
best = plan.best
print(f"best of {plan.layouts_searched} layouts on 8 H100s: {best.layout}, "
      f"{best.memory_bytes_per_gpu / 2**30:.1f} GiB per GPU, MFU {100 * best.mfu:.0f}%")
print(best.command)
