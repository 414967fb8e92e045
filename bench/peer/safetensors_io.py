"""The safetensors format written and read by hand (no `safetensors` package here).

Layout: u64 little-endian N | N bytes of JSON header | raw data.
Header: {name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
         "__metadata__": {str: str}}; offsets are relative to the start of the data
section. The header is padded with spaces so the data starts 8-byte aligned.
Tensors are row-major, little-endian.
"""
import json
import struct

import numpy as np

# safetensors dtype string -> numpy dtype (little-endian)
DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
    "U16": np.dtype("<u2"), "U32": np.dtype("<u4"), "U64": np.dtype("<u8"),
}


def _st_dtype(arr):
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    for k, v in DTYPES.items():
        if dt == v:
            return k
    raise ValueError(f"dtype {arr.dtype} has no safetensors name here")


def _to_numpy(t):
    if hasattr(t, "detach"):  # torch tensor; BF16 not supported by this writer
        t = t.detach().cpu().contiguous().numpy()
    return np.array(t, copy=False, order="C")  # keeps 0-d shapes (ascontiguousarray would not)


def save(path, tensors, metadata=None):
    """tensors: {name: numpy array or torch tensor}; written in name order."""
    arrays = {k: _to_numpy(v) for k, v in tensors.items()}
    header = {}
    offset = 0
    for name in sorted(arrays):
        a = arrays[name]
        nbytes = a.size * a.dtype.itemsize
        header[name] = {"dtype": _st_dtype(a), "shape": list(a.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-(8 + len(hbytes))) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for name in sorted(arrays):
            a = arrays[name]
            f.write(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes(order="C"))


class FormatError(ValueError):
    pass


def load(path):
    """Returns (tensors {name: numpy array}, metadata dict). Validates the header:
    known dtypes, offsets inside the file, sizes matching shapes, no overlaps."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise FormatError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise FormatError(f"{path}: header length {n} runs past the end ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: header is not JSON: {e}")
    data = memoryview(raw)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    spans = []
    for name, info in header.items():
        dt = info.get("dtype")
        if dt not in DTYPES:
            raise FormatError(f"{path}: tensor {name!r} has unsupported dtype {dt!r}")
        shape = info.get("shape")
        b, e = info.get("data_offsets", [None, None])
        if not isinstance(shape, list) or b is None or e is None or not 0 <= b <= e <= len(data):
            raise FormatError(f"{path}: tensor {name!r} has bad shape/offsets {info}")
        numel = int(np.prod(shape)) if shape else 1
        if numel * DTYPES[dt].itemsize != e - b:
            raise FormatError(f"{path}: tensor {name!r} shape {shape} {dt} needs "
                              f"{numel * DTYPES[dt].itemsize} bytes, offsets give {e - b}")
        spans.append((b, e, name))
        tensors[name] = np.frombuffer(data[b:e], dtype=DTYPES[dt]).reshape(shape).copy()
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(f"{path}: tensors {n0!r} and {n1!r} overlap")
    return tensors, metadata


if __name__ == "__main__":
    import os
    import tempfile
    t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2], np.int64),
         "c": np.zeros((0, 4), np.float32), "d": np.float32(3.5).reshape(())}
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.safetensors")
        save(p, t, {"format": "pt"})
        raw = open(p, "rb").read()
        assert (8 + struct.unpack("<Q", raw[:8])[0]) % 8 == 0
        got, meta = load(p)
        assert meta == {"format": "pt"}
        for k in t:
            assert got[k].dtype == t[k].dtype and np.array_equal(got[k], t[k]), k
    print("safetensors_io self-check OK")


def load_checkpoint(path):
    """A saturate checkpoint directory (one with manifest.json, or the newest step-* under
    it) as (tensors {name: numpy array}, metadata): the parameters and model states, each
    assembled from its pieces, under their PyTorch names."""
    import os
    if not os.path.exists(os.path.join(path, "manifest.json")):
        steps = sorted(d for d in os.listdir(path) if d.startswith("step-")
                       and os.path.exists(os.path.join(path, d, "manifest.json")))
        if not steps:
            raise FormatError(f"{path}: no checkpoint (step-*/manifest.json)")
        path = os.path.join(path, steps[-1])
    with open(os.path.join(path, "manifest.json")) as f:
        man = json.load(f)
    files = {}
    out = {}
    for logical, t in man["tensors"].items():
        kind, _, name = logical.partition("/")
        if kind not in ("param", "state"):
            continue
        shape = t["shape"]
        full = np.zeros(shape, dtype=DTYPES[t["dtype"]])
        for p in t["pieces"]:
            if p["file"] not in files:
                files[p["file"]] = load(os.path.join(path, p["file"]))[0]
            piece = np.asarray(files[p["file"]][p["key"]])
            if "dim" not in p:
                full[...] = piece.reshape(shape)
                continue
            d, parts, index, stride = p["dim"], p["parts"], p["index"], p["stride"]
            outer = int(np.prod(shape[:d])) if d else 1
            inner = int(np.prod(shape[d + 1:])) if d + 1 < len(shape) else 1
            n = shape[d] // (stride * parts)
            view = full.reshape(outer, stride, parts, n, inner)
            view[:, :, index] = piece.reshape(outer, stride, n, inner)
        out[name] = full
    return out, {"format": "pt", "model": man["model"], "step": str(man["step"])}
