"""Deterministic hash-based weights and data shared by saturate's C++ tests and the
PyTorch peer, so both sides start from bit-identical float32 tensors.

Spec (all arithmetic mod 2^64; the C++ side implements exactly this):
  splitmix64(x): x += 0x9E3779B97F4A7C15; z = x;
                 z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
                 z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31)
  fnv1a64(s):    h = 0xcbf29ce484222325; per utf-8 byte b: h ^= b; h *= 0x100000001b3
  unit(h, k)   = (splitmix64(h + k) >> 40) / 2^24     in [0,1), exact in float32

Parity init: for each parameter (named_parameters(), so a tied weight is initialised
once, under its first name), h = fnv1a64(name), k = flat row-major index,
v = 2*unit(h,k) - 1 (float64), then stored to float32:
  weight of BatchNorm2d / LayerNorm        -> 1 + 0.1*v
  any other 1-D parameter (biases)          -> 0.1*v
  >= 2-D parameter                          -> v / sqrt(numel / shape[0])
Buffers keep PyTorch's defaults.

Parity data: image sample i: x[i][k] = unit(fnv1a64("x"), i*numel + k) over CHW,
y[i] = splitmix64(fnv1a64("y") + i) % classes. Token sequence i, k in 0..T:
tok = splitmix64(fnv1a64("tok") + i*(T+1) + k) % V; inputs tok[:T], targets tok[1:].

Run this file to self-check the numpy versions against pure-Python big integers.
"""
import math

import numpy as np

M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


# ---- pure-Python reference (big ints, masked): the spec, written literally ------
def splitmix64_py(x):
    x = (x + _GOLDEN) & M64
    z = x
    z = ((z ^ (z >> 30)) * _MUL1) & M64
    z = ((z ^ (z >> 27)) * _MUL2) & M64
    return z ^ (z >> 31)


def fnv1a64(s):
    """FNV-1a 64 of the utf-8 bytes of s (a Python int). Strings are short, so
    there is no vectorised version."""
    h = 0xCBF29CE484222325
    for b in s.encode("utf-8"):
        h ^= b
        h = (h * 0x100000001B3) & M64
    return h


def unit_py(h, k):
    return (splitmix64_py((h + k) & M64) >> 40) / float(1 << 24)


# ---- vectorised numpy versions (uint64 arrays wrap mod 2^64) --------------------
_U = np.uint64


def splitmix64(x):
    """x: uint64 array (or anything convertible); returns uint64 array.
    numpy uint64 array arithmetic wraps modulo 2^64; errstate silences the
    overflow warnings numpy may give for 0-d values."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + _U(_GOLDEN)
        z = (x ^ (x >> _U(30))) * _U(_MUL1)
        z = (z ^ (z >> _U(27))) * _U(_MUL2)
        return z ^ (z >> _U(31))


def _offsets(base, start, n):
    """uint64 array [(base + start + j) mod 2^64 for j in 0..n)."""
    first = _U((base + start) & M64)
    with np.errstate(over="ignore"):
        return first + np.arange(n, dtype=np.uint64)


def unit(h, k):
    """unit(h, k) for a uint64-convertible array k (h a Python int); float64 array.
    (z >> 40) < 2^24, so the value is exact in float32 as well."""
    k = np.asarray(k, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = splitmix64(_U(h) + k)
    return (z >> _U(40)).astype(np.float64) / float(1 << 24)


def unit_range(h, start, n):
    """unit(h, start + j) for j in 0..n; float64 array of length n."""
    z = splitmix64(_offsets(h, start, n))
    return (z >> _U(40)).astype(np.float64) / float(1 << 24)


# ---- parity init ------------------------------------------------------------------
_CHUNK = 1 << 22  # elements per chunk, to bound temporaries for big embeddings


def parity_values(name, shape, norm_weight=False):
    """float32 numpy array of the given shape with the parity-init values of `name`."""
    shape = tuple(int(s) for s in shape)
    numel = int(np.prod(shape)) if shape else 1
    h = fnv1a64(name)
    out = np.empty(numel, dtype=np.float32)
    if len(shape) >= 2:
        scale = math.sqrt(numel // shape[0])
    for s in range(0, numel, _CHUNK):
        n = min(_CHUNK, numel - s)
        v = 2.0 * unit_range(h, s, n) - 1.0  # float64
        if len(shape) >= 2:
            out[s:s + n] = v / scale
        elif norm_weight:
            out[s:s + n] = 1.0 + 0.1 * v
        else:
            out[s:s + n] = 0.1 * v
    return out.reshape(shape)


def parity_init(model):
    """Overwrite every parameter of a torch module with its parity-init values.
    Tied parameters appear once in named_parameters() (under the first name)."""
    import torch
    norm_types = (torch.nn.BatchNorm2d, torch.nn.LayerNorm)
    norm_weights = set()
    for mname, mod in model.named_modules():
        is_norm = isinstance(mod, norm_types) or getattr(mod, "is_norm", False)  # models.RMSNorm
        if is_norm and getattr(mod, "weight", None) is not None:
            norm_weights.add(id(mod.weight))
    with torch.no_grad():
        for name, p in model.named_parameters():
            vals = parity_values(name, p.shape, id(p) in norm_weights)
            p.copy_(torch.from_numpy(vals))
    return model


# ---- parity data -----------------------------------------------------------------
def parity_images(first, count, chw, classes):
    """Samples first..first+count of the image stream: x float32 [count,C,H,W],
    y int64 [count]."""
    chw = tuple(int(s) for s in chw)
    numel = int(np.prod(chw))
    x = unit_range(fnv1a64("x"), first * numel, count * numel).astype(np.float32)
    y = splitmix64(_offsets(fnv1a64("y"), first, count)) % _U(classes)
    return x.reshape((count,) + chw), y.astype(np.int64)


def parity_tokens(first, count, T, V):
    """Sequences first..first+count of the token stream: inputs, targets int64 [count,T]."""
    z = splitmix64(_offsets(fnv1a64("tok"), first * (T + 1), count * (T + 1)))
    tok = (z % _U(V)).astype(np.int64).reshape(count, T + 1)
    return tok[:, :T].copy(), tok[:, 1:].copy()


def parity_data(kind, step, batch, first=0, **kw):
    """Batch of step `step` (samples first+step*batch .. first+step*batch+batch-1) as torch
    tensors. kind 'image': kw chw=(C,H,W), classes. kind 'tokens': kw T, V."""
    import torch
    if kind == "image":
        x, y = parity_images(first + step * batch, batch, kw["chw"], kw["classes"])
    elif kind == "tokens":
        x, y = parity_tokens(first + step * batch, batch, kw["T"], kw["V"])
    else:
        raise ValueError(f"unknown data kind {kind!r}")
    return torch.from_numpy(x), torch.from_numpy(y)


# ---- self-check --------------------------------------------------------------------
def _self_check():
    import random
    rng = random.Random(1234)
    # splitmix64 on edge cases and random 64-bit values (including near-wraparound)
    xs = [0, 1, M64, M64 - _GOLDEN, M64 - _GOLDEN + 1, 1 << 63, (1 << 63) - 1]
    xs += [rng.getrandbits(64) for _ in range(2000)]
    got = splitmix64(np.array(xs, dtype=np.uint64))
    for x, g in zip(xs, got):
        assert int(g) == splitmix64_py(x), (x, int(g), splitmix64_py(x))
    # known value: splitmix64 seeded with 0 yields 0xE220A8397B1DCDAF first
    assert splitmix64_py(0) == 0xE220A8397B1DCDAF
    # fnv1a64 known vectors
    assert fnv1a64("") == 0xCBF29CE484222325
    assert fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a64("foobar") == 0x85944171F73967E8
    # unit / unit_range, with h + k wrapping past 2^64
    for name in ["x", "y", "tok", "fc1.weight", "transformer.wte.weight", "ü"]:
        h = fnv1a64(name)
        for start in [0, 17, M64 - 5 - h if h <= M64 - 5 else 0, rng.getrandbits(40)]:
            n = 64
            vec = unit_range(h, start, n)
            vec2 = unit(h, np.arange(start, start + n, dtype=np.uint64) if start + n <= M64 else
                        np.array([(start + j) & M64 for j in range(n)], dtype=np.uint64))
            for j in range(n):
                ref = unit_py(h, (start + j) & M64)
                assert vec[j] == ref and vec2[j] == ref, (name, start, j)
                assert float(np.float32(ref)) == ref
    # wraparound explicitly: h + k > 2^64
    h = M64 - 3
    vec = unit_range(h, 0, 10)
    for j in range(10):
        assert vec[j] == unit_py(h, j)
    # parity values against the literal spec
    for name, shape, normw in [("fc1.weight", (7, 5), False), ("fc1.bias", (9,), False),
                               ("bn1.weight", (6,), True), ("conv1.weight", (4, 3, 3, 3), False)]:
        arr = parity_values(name, shape, normw).reshape(-1)
        h = fnv1a64(name)
        numel = arr.size
        for k in range(numel):
            v = 2.0 * unit_py(h, k) - 1.0
            if len(shape) >= 2:
                ref = v / math.sqrt(numel // shape[0])
            elif normw:
                ref = 1.0 + 0.1 * v
            else:
                ref = 0.1 * v
            assert arr[k] == np.float32(ref), (name, k)
    # data against the literal spec
    x, y = parity_images(3, 2, (1, 2, 3), 10)
    for i in range(2):
        for k in range(6):
            assert x[i].reshape(-1)[k] == np.float32(unit_py(fnv1a64("x"), (3 + i) * 6 + k))
        assert y[i] == splitmix64_py((fnv1a64("y") + 3 + i) & M64) % 10
    inp, tgt = parity_tokens(5, 2, 4, 4096)
    for i in range(2):
        tok = [splitmix64_py((fnv1a64("tok") + (5 + i) * 5 + k) & M64) % 4096 for k in range(5)]
        assert list(inp[i]) == tok[:4] and list(tgt[i]) == tok[1:]
    print("common.py self-check OK")
    # a few printed values the C++ tests can pin
    print(f"fnv1a64('x')   = 0x{fnv1a64('x'):016x}")
    print(f"splitmix64(0)  = 0x{splitmix64_py(0):016x}")
    print(f"unit(fnv1a64('x'), 0..3) = {[unit_py(fnv1a64('x'), k) for k in range(4)]}")


if __name__ == "__main__":
    _self_check()
