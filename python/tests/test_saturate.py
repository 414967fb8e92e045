"""The Python module `saturate` (python/): models, weights, plan, info, fit, evaluate,
predict, errors, from_torch and data-parallel fit under mpirun. Run by CTest (`python`)
with PYTHONPATH at the build directory."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import saturate
from helpers import GPT, TINY, blobs, quiet, tiny

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.dirname(os.path.abspath(saturate.__file__))
CLI = os.path.join(BUILD, "saturate")


def test_model_load_describes_the_builtin():
    m = saturate.Model.load("mlp")
    assert m.name == "mlp"
    assert m.classes == 10 and not m.takes_tokens
    assert m.input_shape == (1, 28, 28)
    assert m.parameters > 0 and str(m.parameters) in m.summary()
    assert m.json is None and m.weights() == {} and not m.has_weights


def test_model_from_json_keeps_its_text(tmp_path):
    m = tiny()
    assert json.loads(m.json) == TINY
    assert m.input_shape == (1, 1, 4) and m.classes == 2
    assert m.parameters == 4 * 16 + 16 + 16 * 2 + 2
    path = tmp_path / "tiny.json"
    path.write_text(m.json)
    for spec in (str(path), "file:" + str(path)):
        assert saturate.Model.load(spec).json == m.json
    assert saturate.__version__.count(".") == 2


def test_plan_is_what_saturate_plan_json_writes(tmp_path):
    p = saturate.plan(GPT, gpus=2, gpu="h100-sxm", global_batch=16)
    assert p.best.dp * p.best.tp * p.best.pp == 2
    assert p["best"]["micro_batch"] == p.best.micro_batch and p.layouts[0] == p.best
    assert p.best.fits and p.best.memory_bytes_per_gpu > 0 and p.run
    if os.path.exists(CLI):
        out = tmp_path / "plan.json"
        subprocess.run([CLI, "plan", "--model", GPT, "--gpus", "2", "--gpu", "h100-sxm", "--global-batch", "16",
                        "--json", str(out)], check=True, capture_output=True)
        cli = json.loads(out.read_text())
        for d in (cli, p):
            d.pop("search_seconds")
        assert cli == p


def test_info_rows_sum_to_the_total():
    m = tiny()
    i = saturate.info(m, batch=8)
    assert i.parameters == m.parameters and i.micro_batch == 8
    assert sum(r.bytes for r in i.memory) == i.total_bytes > 0
    assert len(i.stages) == 1 and i.stages[0].memory == i.memory
    assert saturate.info("mlp", batch=8, zero=1, ranks=2).zero == 1


def test_info_is_what_saturate_info_prints():
    if not os.path.exists(CLI):
        pytest.skip("no saturate command beside the module")
    i = saturate.info("mlp", batch=32)
    text = subprocess.run([CLI, "info", "--model", "mlp", "--batch", "32"], check=True, capture_output=True,
                          text=True).stdout
    for row in i.memory + [saturate.Record(name="total", bytes=i.total_bytes)]:
        line = next(l for l in text.splitlines() if l.startswith("  " + row.name + " "))
        assert int(line[len(row.name) + 2:].split()[0]) == row.bytes, line


def test_fit_with_validation_learns_and_predict_agrees_with_evaluate():
    m = tiny()
    x, y = blobs(512, 1)
    xv, yv = blobs(128, 2)
    seen = []
    h = saturate.fit(m, x, y, **quiet(batch_size=32, epochs=2, lr=2e-2, validation=(xv, yv), on_epoch=seen.append))
    assert len(h.loss) == h.steps == 2 * 512 // 32 and h.batch_size == 32 and h.processes == 1
    assert [e.epoch for e in h.epochs] == [1, 2] and seen == h.epochs
    assert h.epochs[-1].val_accuracy > 0.9 and h.epochs[-1].val_loss < h.epochs[0].loss
    assert h.samples_per_second > 0 and m.has_weights
    e = saturate.evaluate(m, xv, yv, batch_size=50)
    assert e.samples == 128 and e.loss == pytest.approx(h.epochs[-1].val_loss, rel=1e-5)
    logits = saturate.predict(m, xv)
    assert logits.shape == (128, 2) and logits.dtype == np.float32
    assert np.mean(logits.argmax(1) == yv) == pytest.approx(e.accuracy)
    probs = saturate.predict(m, xv, probabilities=True)
    assert np.allclose(probs.sum(1), 1, atol=1e-5)


def test_fit_on_tokens_and_predict_gives_every_position():
    m = saturate.Model.load(GPT)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 64, (64, 8))
    h = saturate.fit(m, x, np.roll(x, -1, axis=1), **quiet(batch_size=8, steps=3))
    assert len(h.loss) == 3 and all(np.isfinite(h.loss))
    assert saturate.predict(m, x[:5]).shape == (5, 8, 64)


def test_on_epoch_false_stops_and_callback_errors_propagate():
    x, y = blobs(64, 3)
    h = saturate.fit(tiny(), x, y, **quiet(batch_size=16, epochs=5, on_epoch=lambda e: False))
    assert len(h.epochs) == 1 and h.steps == 4

    def boom(e):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        saturate.fit(tiny(), x, y, **quiet(batch_size=16, epochs=3, on_epoch=boom))
    steps = []
    saturate.fit(tiny(), x, y, **quiet(batch_size=16, steps=3, on_step=lambda s: steps.append(s.step)))
    assert steps == [1, 2, 3]


def test_fit_releases_the_gil(tmp_path):
    """This thread runs while saturate trains: it sees metrics.jsonl with some of the steps."""
    import threading

    rng = np.random.default_rng(7)
    x, y = rng.random((256, 1, 28, 28), np.float32), rng.integers(0, 10, 256)
    m, metrics = saturate.Model.load("mlp"), tmp_path / "metrics.jsonl"
    t = threading.Thread(target=saturate.fit, args=(m, x, y), kwargs=quiet(batch_size=32, steps=60, out_dir=tmp_path))
    t.start()
    lines = set()
    while t.is_alive():
        if metrics.exists():
            lines.add(metrics.read_text().count("\n"))
    t.join()
    assert any(0 < n < 60 for n in lines), f"saw only {sorted(lines)} of the 60 steps' lines"


def test_ctrl_c_stops_fit_after_the_step_and_raises_keyboard_interrupt():
    import signal

    x, y = blobs(256, 8)
    m, steps = tiny(), []

    def step(s):
        steps.append(s.step)
        if s.step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        saturate.fit(m, x, y, **quiet(batch_size=8, steps=1000, on_step=step))
    assert steps == [1, 2, 3] and m.has_weights
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    saturate.fit(m, x, y, **quiet(batch_size=8, steps=2))  # the next fit runs to its end


def test_batch_size_auto_is_the_tuner():
    x, y = blobs(256, 4)
    h = saturate.fit(tiny(), x, y, **quiet(batch_size="auto", steps=2))
    assert h.batch_size >= 1 and len(h.loss) == 2


def test_weights_round_trip_through_dict_and_file(tmp_path):
    m = tiny()
    x, y = blobs(128, 5)
    saturate.fit(m, x, y, **quiet(batch_size=32))
    w = m.weights()
    assert set(w) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert w["fc1.weight"].shape == (16, 4) and w["fc1.weight"].dtype == np.float32
    copy = tiny()
    copy.set_weights({k: v.astype(np.float64) for k, v in w.items()})
    assert np.array_equal(saturate.predict(copy, x), saturate.predict(m, x))
    m.save(tmp_path / "w.safetensors")
    loaded = tiny()
    loaded.load_weights(str(tmp_path / "w.safetensors"))
    for k, v in loaded.weights().items():
        assert np.array_equal(v, w[k]), k
    loaded.set_weights({"fc2.bias": np.array([1.0, -1.0])})  # a model with weights keeps the rest
    assert np.array_equal(loaded.weights()["fc2.bias"], [1, -1])
    assert np.array_equal(loaded.weights()["fc1.weight"], w["fc1.weight"])


def test_errors_are_saturate_errors_naming_what_is_wrong():
    assert issubclass(saturate.Error, ValueError)
    m = tiny()
    x, y = blobs(64, 6)
    cases = [
        (lambda: saturate.Model.load("gpt:layers=2"), "gpt:layers=2"),
        (lambda: saturate.fit(m, x.astype(np.int32), y, **quiet()), "x: expected a float32 array"),
        (lambda: saturate.fit(m, x, y[:10], **quiet()), "y: expected 64 class labels"),
        (lambda: saturate.fit(m, x, y + 5, **quiet()), "y: label"),
        (lambda: saturate.fit(m, x, y.astype(np.float32), **quiet()), "y: expected an integer array"),
        (lambda: saturate.fit(m, x, y, **quiet(batch_size="big")), "batch_size: expected a positive int or 'auto'"),
        (lambda: saturate.fit(m, x, y, **quiet(validation=x)), "validation: expected a tuple"),
        (lambda: saturate.fit(m, x, y, **quiet(optimizer="adam")), "FitOptions::optimizer.name"),
        (lambda: saturate.fit(m, x, y, **quiet(betas=0.9)), "betas: expected a pair of numbers"),
        (lambda: saturate.fit(m, x, y, **quiet(betas=(0.9, "a"))), "betas: expected a pair of numbers"),
        (lambda: saturate.fit(m, x, y, **quiet(betas=(0.9, 1.5))), "FitOptions::optimizer.beta1/beta2"),
        (lambda: saturate.fit(m, x, y, **quiet(nesterov=True)), "FitOptions::optimizer.nesterov"),
        (lambda: saturate.fit(m, x, y, **quiet(clip_grad_norm=-1.0)), "FitOptions::optimizer.clip_grad_norm"),
        (lambda: saturate.fit(m, x[:4], y[:4], **quiet(batch_size=8)), "fewer than one step"),
        (lambda: saturate.evaluate(m, x, y), "has no weights yet"),
        (lambda: m.set_weights({"fc1.weight": np.zeros((4, 16))}), "'fc1.weight' has shape (16, 4), got (4, 16)"),
        (lambda: m.set_weights({"fc3.weight": np.zeros(3)}), "no weight named 'fc3.weight'"),
        (lambda: m.set_weights({"fc1.weight": np.zeros((16, 4))}), "'fc1.bias' is missing"),
        (lambda: m.set_weights({"fc1.bias": "abc"}), "expected an array of numbers"),
        (lambda: m.load_weights("/nonexistent.safetensors"), "/nonexistent.safetensors"),
        (lambda: m.state_dict_for_torch(), "not imported from PyTorch"),
        (lambda: saturate.plan(m, global_batch=0), "--global-batch"),
        (lambda: saturate.info(m, batch=0), "batch: expected a micro-batch"),
        (lambda: saturate.fit(saturate.Model.load(GPT), x, y, **quiet()), "x: expected an integer array of tokens, got float32"),
    ]
    for call, message in cases:
        with pytest.raises(saturate.Error) as e:
            call()
        assert message in str(e.value) and "\n" not in str(e.value)
    assert not m.has_weights  # nothing above set some of them


def test_from_torch_imports_a_module_with_its_weights():
    torch = pytest.importorskip("torch")
    try:
        import saturate_torch  # noqa: F401
    except ImportError as e:
        pytest.skip(f"saturate_torch is not importable here ({e})")
    torch.manual_seed(0)
    nn = torch.nn
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))
    with torch.no_grad():
        cnn(torch.randn(16, 1, 6, 6))  # running statistics that are not the initial ones
    for net, x in ((mlp, torch.randn(6, 1, 1, 4)), (cnn, torch.randn(5, 1, 6, 6))):
        net.eval()
        m = saturate.from_torch(net, x)
        assert m.classes == 3 and m.parameters == sum(p.numel() for p in net.parameters())
        with torch.no_grad():
            want = net(x).numpy()
        assert np.allclose(saturate.predict(m, x.numpy()), want, atol=1e-5)
        net.load_state_dict(m.state_dict_for_torch(), strict=True)


def test_from_torch_refusals_are_saturate_errors():
    torch = pytest.importorskip("torch")
    try:
        import saturate_torch  # noqa: F401
    except ImportError as e:
        pytest.skip(f"saturate_torch is not importable here ({e})")
    nn = torch.nn

    class Wavy(nn.Module):
        def forward(self, x):
            return torch.sin(x)

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x) if x.sum() > 0 else self.fc(-x)

    cases = [(nn.Sequential(nn.Linear(4, 8), Wavy(), nn.Linear(8, 3)), torch.randn(2, 4), "sin in '1'"),
             (Branchy(), torch.randn(2, 4), "data-dependent control flow in 'Branchy'"),
             (nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), torch.randn(2, 3, 32, 32), "takes 784 features")]
    for net, x, message in cases:
        with pytest.raises(saturate.Error) as e:
            saturate.from_torch(net, x)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_data_parallel_fit_under_mpirun_follows_one_process(tmp_path):
    mpiexec = os.environ.get("SAT_MPIEXEC", "mpirun --oversubscribe" if shutil.which("mpirun") else "")
    if not mpiexec:
        pytest.skip("no mpirun (this build has no MPI)")
    out = tmp_path / "losses.json"
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_WAIT_POLICY": "passive", "PYTHONPATH": BUILD}
    cmd = ["timeout", "-k", "5", "180", *mpiexec.split(), "-np", "2", sys.executable, os.path.join(HERE, "dp_fit.py"),
           str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    two = json.loads(out.read_text())
    x, y = blobs(512, 9)
    one = saturate.fit(tiny(), x, y, **quiet(batch_size=16, steps=12, shuffle=False)).loss
    assert len(two) == len(one) == 12
    assert two == pytest.approx(one, rel=1e-5)


def test_optimizer_settings_reach_the_trainer():
    x, y = blobs(256, 3)
    runs = {}
    for name, kw in {"default": {}, "clipped": {"clip_grad_norm": 0.01}, "betas": {"betas": (0.5, 0.9), "eps": 1e-3},
                     "sgd": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9},
                     "nesterov": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True}}.items():
        runs[name] = saturate.fit(tiny(), x, y, **quiet(batch_size=32, steps=6, seed=4, **kw)).loss
    assert runs["default"][0] == runs["clipped"][0] == runs["betas"][0]  # the same first batch and weights
    for a, b in (("default", "clipped"), ("default", "betas"), ("sgd", "nesterov")):
        assert runs[a][1:] != runs[b][1:], (a, b)
