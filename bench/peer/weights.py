#!/usr/bin/python3
"""Export PyTorch-layout safetensors files, and check saturate-made files against
PyTorch's names, shapes and dtypes.

  weights.py export MODEL OUT.safetensors [--parity-init]
      state_dict (BatchNorm buffers included) minus the tied lm_head.weight.
      Without --parity-init the weights are PyTorch's default random init (seed 0).
  weights.py check MODEL FILE|CHECKPOINT_DIR [--parity-init] [--tol T]
      (a saturate checkpoint's parameters, assembled from their pieces, or a file)
      strict check of names/shapes/dtypes, then load_state_dict(strict=True);
      prints OK or every mismatch (exit status 1). With --parity-init it also
      compares every parameter's values to the parity init (max |diff| <= tol,
      default 0: bit-exact) and buffers to PyTorch's defaults.
Common options: --chw CxHxW, --classes N (image models), --seq-len T (GPT: wpe rows).
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import models  # noqa: E402
import safetensors_io as st  # noqa: E402

TIED = {"lm_head.weight": "transformer.wte.weight"}

_TORCH_TO_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
                torch.int32: np.int32, torch.float16: np.float16, torch.uint8: np.uint8,
                torch.bool: np.bool_}


def _build(args):
    chw = models.parse_chw(args.chw) if args.chw else None
    model, spec = models.build(args.model, chw=chw, classes=args.classes, seq_len=args.seq_len)
    return model, spec


def expected_entries(model):
    """state_dict entries a saturate file must hold: {name: tensor} minus tied copies."""
    sd = model.state_dict()
    return {k: v for k, v in sd.items() if not (k in TIED and TIED[k] in sd)}


def cmd_export(args):
    torch.manual_seed(0)
    model, spec = _build(args)
    if args.parity_init:
        common.parity_init(model)
    tensors = expected_entries(model)
    meta = {"format": "pt", "model": args.model,
            "init": "parity" if args.parity_init else "torch-default-seed0"}
    st.save(args.out, tensors, meta)
    total = sum(t.numel() for t in tensors.values())
    print(f"wrote {args.out}: {len(tensors)} tensors, {total} elements")
    return 0


def cmd_check(args):
    model, spec = _build(args)
    try:
        tensors, meta = st.load_checkpoint(args.file) if os.path.isdir(args.file) else st.load(args.file)
    except (OSError, st.FormatError) as e:
        print(f"FORMAT ERROR: {e}")
        return 1
    want = expected_entries(model)
    problems = []
    for name in sorted(set(want) - set(tensors)):
        problems.append(f"missing {name}: expected shape {list(want[name].shape)} "
                        f"{str(want[name].dtype).replace('torch.', '')}")
    for name in sorted(set(tensors) - set(want)):
        if name in TIED and TIED[name] in tensors:
            same = (tensors[name].shape == tensors[TIED[name]].shape
                    and np.array_equal(tensors[name], tensors[TIED[name]]))
            if not same:
                problems.append(f"tied {name} differs from {TIED[name]} (they must be one tensor)")
            continue  # a tied copy that equals its twin is tolerated
        problems.append(f"unexpected {name}: shape {list(tensors[name].shape)} {tensors[name].dtype}")
    for name in sorted(set(want) & set(tensors)):
        w, g = want[name], tensors[name]
        if list(g.shape) != list(w.shape):
            problems.append(f"shape {name}: file {list(g.shape)}, PyTorch {list(w.shape)}")
        if g.dtype != _TORCH_TO_NP.get(w.dtype):
            problems.append(f"dtype {name}: file {g.dtype}, PyTorch {w.dtype}")
    if not problems:
        sd = {k: torch.from_numpy(np.array(v)) for k, v in tensors.items() if k in want}
        try:  # names were checked above; the tied copy is filled through its twin
            res = model.load_state_dict(sd, strict=False)
            left = [k for k in res.missing_keys if k not in TIED] + list(res.unexpected_keys)
            if left:
                problems.append(f"load_state_dict left over: {left}")
        except RuntimeError as e:
            problems.append(f"load_state_dict: {e}")
    if not problems:
        for name, t in tensors.items():
            if name in want and t.dtype.kind == "f" and not np.isfinite(t).all():
                problems.append(f"non-finite values in {name}")
    if not problems and args.parity_init:
        ref, _ = _build(args)
        common.parity_init(ref)
        ref_sd = expected_entries(ref)
        for name in sorted(ref_sd):
            r = ref_sd[name].numpy()
            g = np.asarray(tensors[name])
            diff = float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64)))) if r.size else 0.0
            if diff > args.tol:
                idx = int(np.argmax(np.abs(g.astype(np.float64) - r.astype(np.float64)).reshape(-1)))
                problems.append(f"values {name}: max |diff| {diff:.3g} at flat index {idx} "
                                f"(file {g.reshape(-1)[idx]!r}, parity {r.reshape(-1)[idx]!r})")
    if problems:
        print(f"{args.file}: {len(problems)} mismatch(es) against PyTorch {args.model}:")
        for p in problems:
            print("  " + p)
        return 1
    extra = " and parity-init values" if args.parity_init else ""
    print(f"OK: {args.file} matches PyTorch {args.model} ({len(want)} tensors: names, shapes, "
          f"dtypes{extra})")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("export", "check"):
        p = sub.add_parser(name)
        p.add_argument("model", type=models.model_arg)
        p.add_argument("out" if name == "export" else "file")
        p.add_argument("--parity-init", action="store_true")
        p.add_argument("--chw", help="image input shape CxHxW (default per model)")
        p.add_argument("--classes", type=int, default=10)
        p.add_argument("--seq-len", type=int, default=None, help="GPT: rows of wpe (default: config T)")
        if name == "check":
            p.add_argument("--tol", type=float, default=0.0, help="max |diff| for --parity-init")
    args = ap.parse_args(argv)
    return cmd_export(args) if args.cmd == "export" else cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
