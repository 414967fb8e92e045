"""Small models and data for the saturate module's tests (fast: a tiny MLP, a few hundred samples)."""
import json

import numpy as np

import saturate

TINY = {
    "name": "tiny",
    "inputs": {"x": {"shape": [1, 1, 4]}, "y": {"shape": [], "dtype": "int32"}},
    "layers": [
        {"name": "flatten", "type": "flatten"},
        {"name": "fc1", "type": "linear", "out": 16},
        {"name": "relu", "type": "relu"},
        {"name": "fc2", "type": "linear", "out": 2},
        {"name": "loss", "type": "cross_entropy", "inputs": ["fc2", "y"]},
    ],
    "loss": "loss",
}
GPT = "gpt:layers=1,heads=2,width=32,context=8,vocab=64"


def tiny():
    return saturate.Model.from_json(json.dumps(TINY), "tiny")


def blobs(n, seed):
    """Two Gaussian blobs in 4 features: class 1 around +1, class 0 around -1."""
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % 2).astype(np.int64)
    x = (np.where(y[:, None] == 1, 1.0, -1.0) + rng.normal(0, 0.5, (n, 4))).astype(np.float32)
    return x, y


def quiet(**kw):
    """fit's arguments for the tests: one thread, no progress lines."""
    return dict(threads=1, progress=False, **kw)
