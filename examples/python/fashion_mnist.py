#!/usr/bin/python3
"""Fit saturate's convnet to Fashion-MNIST from Python, on NumPy arrays.

Usage: python3 examples/python/fashion_mnist.py [STEPS]
       (PYTHONPATH=build, or the prefix's lib/python3/dist-packages after cmake --install)
Under `mpirun -np N python3 ...` each rank runs this script and fit is data-parallel.
"""
import gzip
import sys

import numpy as np

import saturate

DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def idx(name):
    with gzip.open(f"{DATA}/{name}-ubyte.gz") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


x = (idx("train-images-idx3").astype(np.float32) / 255)[:, None]  # [60000, 1, 28, 28]
y = idx("train-labels-idx1").astype(np.int64)
xt = (idx("t10k-images-idx3").astype(np.float32) / 255)[:, None]
yt = idx("t10k-labels-idx1").astype(np.int64)

model = saturate.Model.load("convnet")
print(model.summary())
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 0  # 0: one epoch
history = saturate.fit(model, x, y, batch_size=64, epochs=1, steps=steps, validation=(xt, yt), progress=False)
last = history.epochs[-1]
print(f"{history.steps} steps of {history.batch_size} on {history.processes} process(es): "
      f"loss {last.loss:.4f}, validation accuracy {100 * last.val_accuracy:.2f}%")
test = saturate.evaluate(model, xt, yt)
labels = saturate.predict(model, xt[:8]).argmax(axis=1)
print(f"test accuracy {100 * test.accuracy:.2f}% on {test.samples} samples; first predictions {labels.tolist()}, "
      f"labels {yt[:8].tolist()}")
model.save("convnet.safetensors")
