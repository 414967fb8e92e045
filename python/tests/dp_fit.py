"""A rank of test_saturate.py's data-parallel test: run under mpirun -np 2, every rank fits
the tiny MLP alike at batch 8; rank 0 writes the losses (one process at batch 16 follows)."""
import json
import os
import sys

import saturate
from helpers import blobs, quiet, tiny

x, y = blobs(512, 9)
h = saturate.fit(tiny(), x, y, **quiet(batch_size=8, steps=12, shuffle=False))
assert h.processes == 2, h.processes
if os.environ.get("OMPI_COMM_WORLD_RANK") == "0":
    with open(sys.argv[1], "w") as f:
        json.dump(h.loss, f)
