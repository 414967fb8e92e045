"""PyTorch twins of saturate's model builders. Parameter names are saturate's
safetensors names, so they must not change.

build(name, ...) returns (model, spec) where spec describes the input:
  {"kind": "image", "chw": (C,H,W), "classes": n}  or
  {"kind": "tokens", "T": seq_len, "V": vocab}
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """flatten -> fc1(in,1024) -> ReLU -> fc2(1024,1024) -> ReLU -> fc3(1024,classes)"""

    def __init__(self, in_features, classes, hidden=1024):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class ConvNet(nn.Module):
    """conv1(C,32,3,p1,nobias) bn1 relu pool2 conv2(32,64) bn2 relu pool2 flatten
    fc1(64*(H//4)*(W//4),128) relu fc2(128,classes)"""

    def __init__(self, C, H, W, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * (H // 4) * (W // 4), 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """CIFAR ResNet-18 with torchvision names: 3x3 stem, no max-pool."""

    def __init__(self, C=3, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        cin = 64
        for i, (width, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)]):
            blocks = [BasicBlock(cin, width, stride), BasicBlock(width, width, 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            cin = width
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # [B, nh, T, hs]
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # [B, nh, T, T]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GptMLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, n_head)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = GptMLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT layout; lm_head.weight is tied to transformer.wte.weight."""

    def __init__(self, n_layer, n_head, C, T, V):
        super().__init__()
        self.T, self.V = T, V
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C),
            wpe=nn.Embedding(T, C),
            h=nn.ModuleList([Block(C, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(C),
        ))
        self.lm_head = nn.Linear(C, V, bias=False)
        # transformer is registered first, so named_parameters() yields the tied
        # tensor once, as transformer.wte.weight.
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    @staticmethod
    def loss(logits, targets):
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


GPT_CONFIGS = {
    # name: (n_layer, n_head, C, T, V)
    "gpt-mini": (4, 4, 256, 128, 4096),
    "gpt2-124m": (12, 12, 768, 1024, 50257),
}

IMAGE_DEFAULTS = {
    "mlp": (1, 28, 28),
    "convnet": (1, 28, 28),
    "resnet18": (3, 32, 32),
}

MODEL_NAMES = list(IMAGE_DEFAULTS) + list(GPT_CONFIGS)


def build(name, chw=None, classes=10, seq_len=None):
    """Build model `name`. Image models take chw (default per model) and classes;
    GPT models may shorten seq_len (wpe keeps T_max = the config's T unless
    seq_len is given, in which case wpe has seq_len rows). Returns (model, spec)."""
    if name in IMAGE_DEFAULTS:
        C, H, W = tuple(chw) if chw else IMAGE_DEFAULTS[name]
        if name == "mlp":
            model = MLP(C * H * W, classes)
        elif name == "convnet":
            model = ConvNet(C, H, W, classes)
        else:
            model = ResNet18(C, classes)
        return model, {"kind": "image", "chw": (C, H, W), "classes": classes}
    if name in GPT_CONFIGS:
        L, nh, C, T, V = GPT_CONFIGS[name]
        if seq_len:
            T = seq_len
        return GPT(L, nh, C, T, V), {"kind": "tokens", "T": T, "V": V}
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")


def loss_fn(model, out, y):
    return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))


def parse_chw(s):
    """'3x32x32' -> (3, 32, 32)"""
    parts = tuple(int(p) for p in s.lower().split("x"))
    if len(parts) != 3:
        raise ValueError(f"expected CxHxW, got {s!r}")
    return parts
