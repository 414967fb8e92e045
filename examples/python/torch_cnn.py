#!/usr/bin/python3
"""A CNN written the usual PyTorch way, imported into saturate, trained there, and its
trained weights loaded back into the PyTorch module.

Usage: python3 examples/python/torch_cnn.py   (PYTHONPATH=build; needs python3-torch)
`saturate import torch_cnn:SmallCNN --input 1x28x28` imports the same class from the
command line (with examples/python on PYTHONPATH, or from this directory).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.gelu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def main():
    import saturate

    torch.manual_seed(0)
    net = SmallCNN()
    model = saturate.from_torch(net, torch.zeros(8, 1, 28, 28))
    print(model.summary())

    rng = np.random.default_rng(0)  # a learnable toy task: the class is the index of the quadrant made brighter
    x = rng.random((2048, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 4, 2048)
    for i, (r, c) in enumerate([(0, 0), (0, 14), (14, 0), (14, 14)]):
        x[y == i, :, r:r + 14, c:c + 14] += 0.1
    history = saturate.fit(model, x, y, batch_size=32, epochs=2, validation=(x[:256], y[:256]), progress=False)
    print(f"after {history.steps} steps: loss {history.loss[-1]:.4f}, "
          f"validation accuracy {100 * history.epochs[-1].val_accuracy:.1f}%")

    net.load_state_dict(model.state_dict_for_torch(), strict=True)  # saturate's weights, back in PyTorch
    net.eval()
    with torch.no_grad():
        torch_logits = net(torch.from_numpy(x[:64])).numpy()
    ours = saturate.predict(model, x[:64])
    print(f"PyTorch and saturate agree on {(torch_logits.argmax(1) == ours.argmax(1)).sum()} of 64 predictions, "
          f"logits within {np.abs(torch_logits - ours).max():.1e}")


if __name__ == "__main__":
    main()
