"""PyTorch twins of saturate's model builders. Parameter names are saturate's
safetensors names, so they must not change.

build(name, ...) takes a preset name or a family string, as saturate's --model does
(gpt:layers=L,heads=H,width=C,context=T,vocab=V[,dropout=P],
llama:layers=L,heads=H,kv_heads=K,width=C,ffn=F,context=T,vocab=V[,norm_eps=E][,rope_theta=R],
mlp:IN-HIDDEN...-CLASSES,
resnet:18|34; dropout is not modelled here), and returns (model, spec) where spec
describes the input:
  {"kind": "image", "chw": (C,H,W), "classes": n}  or
  {"kind": "tokens", "T": seq_len, "V": vocab}
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """flatten -> fc1(w0,w1) -> ReLU -> ... -> fcN(w[N-1],w[N]); widths = [in, hidden..., classes]"""

    def __init__(self, widths):
        super().__init__()
        self.n = len(widths) - 1
        for i in range(self.n):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x):
        x = torch.flatten(x, 1)
        for i in range(1, self.n):
            x = F.relu(getattr(self, f"fc{i}")(x))
        return getattr(self, f"fc{self.n}")(x)


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


RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class ResNet(nn.Module):
    """CIFAR BasicBlock ResNet (18 or 34) with torchvision names: 3x3 stem, no max-pool."""

    def __init__(self, C=3, classes=10, depth=18):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        cin = 64
        for i, (width, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)]):
            n = RESNET_BLOCKS[depth][i]
            blocks = [BasicBlock(cin, width, stride)] + [BasicBlock(width, width, 1) for _ in range(n - 1)]
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


class RMSNorm(nn.Module):
    """Llama's RMSNorm (HF LlamaRMSNorm in float32): x * rsqrt(mean(x^2) + eps) * weight."""
    is_norm = True  # common.parity_init: a norm weight (starts near 1)

    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(T, hs, dtype, theta=10000.0):
    """cos, sin [T, hs] of HF's LlamaRotaryEmbedding, computed in float32 as it does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2).float() / hs))
    ang = torch.arange(T).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    """Grouped-query causal attention with rotary q and k (HF LlamaAttention, no bias)."""

    def __init__(self, C, n_head, n_kv_head, theta=10000.0):
        super().__init__()
        self.nh, self.nkv, self.hs, self.theta = n_head, n_kv_head, C // n_head, theta
        self.q_proj = nn.Linear(C, n_head * self.hs, bias=False)
        self.k_proj = nn.Linear(C, n_kv_head * self.hs, bias=False)
        self.v_proj = nn.Linear(C, n_kv_head * self.hs, bias=False)
        self.o_proj = nn.Linear(n_head * self.hs, C, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hs).transpose(1, 2)  # [B, nh, T, hs]
        k = self.k_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)  # [B, nkv, T, hs]
        v = self.v_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        cos, sin = rope_tables(T, self.hs, x.dtype, self.theta)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.nh // self.nkv, dim=1)  # HF's repeat_kv
        v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, self.nh * self.hs)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, C, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(C, ffn, bias=False)
        self.up_proj = nn.Linear(C, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoeMLP(nn.Module):
    """saturate's moe feed-forward layer (src/nn/layers/moe.h): router `gate` (no bias), softmax
    over the E experts, top k, gates renormalised over the k; an expert takes at most
    ceil(capacity * tokens * k / E) assignments of the batch, in token order (capacity 0: all),
    the rest contribute zero; experts and the shared expert (width shared * ffn, ungated) are
    SwiGLU MLPs. aux_loss: aux * E * sum_e f_e P_e, f_e the share of the tokens * k assignments
    (before drops) choosing e, P_e the mean router probability."""

    def __init__(self, C, ffn, E, k, shared=0, capacity=0.0, aux=0.01):
        super().__init__()
        self.E, self.k, self.capacity, self.aux = E, k, capacity, aux
        self.gate = nn.Linear(C, E, bias=False)
        self.experts = nn.ModuleList([LlamaMLP(C, ffn) for _ in range(E)])
        if shared:
            self.shared_expert = LlamaMLP(C, shared * ffn)
        self.aux_loss = None

    def forward(self, x):
        shape, C = x.shape, x.shape[-1]
        h = x.reshape(-1, C)
        n, E, k = h.shape[0], self.E, self.k
        p = F.softmax(self.gate(h), dim=-1)
        topv, topi = torch.topk(p, k, dim=-1)
        gates = topv / topv.sum(-1, keepdim=True)
        cap = n * k if self.capacity <= 0 else min(n * k, math.ceil(self.capacity * n * k / E))
        onehot = F.one_hot(topi.reshape(-1), E)  # [n k, E], token-major
        rank = ((torch.cumsum(onehot, 0) - 1) * onehot).sum(-1)  # position in its expert's queue
        keep = (rank < cap).reshape(n, k)
        y = torch.zeros_like(h)
        for e in range(E):
            tok, j = ((topi == e) & keep).nonzero(as_tuple=True)
            if tok.numel():
                y = y.index_add(0, tok, gates[tok, j, None] * self.experts[e](h[tok]))
        self.dropped = int((~keep).sum())
        if self.aux > 0:
            f = onehot.sum(0).to(p.dtype) / (n * k)
            self.aux_loss = self.aux * E * (f * p.mean(0)).sum()
        if hasattr(self, "shared_expert"):
            y = y + self.shared_expert(h)
        return y.view(shape)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, C, n_head, n_kv_head, ffn, eps=1e-5, theta=10000.0, moe=None):
        super().__init__()
        self.input_layernorm = RMSNorm(C, eps)
        self.self_attn = LlamaAttention(C, n_head, n_kv_head, theta)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.mlp = MoeMLP(C, ffn, *moe) if moe else LlamaMLP(C, ffn)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, n_layer, n_head, n_kv_head, C, ffn, V, eps=1e-5, theta=10000.0, moe=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([LlamaDecoderLayer(C, n_head, n_kv_head, ffn, eps, theta, moe)
                                     for _ in range(n_layer)])
        self.norm = RMSNorm(C, eps)


class Llama(nn.Module):
    """HF LlamaForCausalLM's layout and names (model.embed_tokens, model.layers.N.self_attn.q_proj,
    ..., model.norm, lm_head untied); every weight N(0, 0.02), norms ones; RMSNorm eps and rope
    theta as the spec's norm_eps and rope_theta (1e-5 and 10000 unless given). T: the context,
    for the spec only (rotary embeddings have no table)."""

    def __init__(self, n_layer, n_head, n_kv_head, C, ffn, T, V, eps=1e-5, theta=10000.0, moe=None):
        super().__init__()
        self.T, self.V = T, V
        self.model = LlamaModel(n_layer, n_head, n_kv_head, C, ffn, V, eps, theta, moe)
        self.lm_head = nn.Linear(C, V, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))

    def aux_losses(self):
        """The moe layers' load-balancing losses of the last forward (added to the loss)."""
        return [layer.mlp.aux_loss for layer in self.model.layers
                if isinstance(layer.mlp, MoeMLP) and layer.mlp.aux_loss is not None]


GPT_CONFIGS = {
    # name: (n_layer, n_head, C, T, V)
    "gpt-mini": (4, 4, 256, 128, 4096),
    "gpt2-124m": (12, 12, 768, 1024, 50257),
}

# The presets as saturate's family strings (src/nn/model_config.cpp).
PRESETS = {
    "mlp": "mlp:784-1024-1024-10",
    "resnet18": "resnet:18",
    "gpt-mini": "gpt:layers=4,heads=4,width=256,context=128,vocab=4096",
    "gpt2-124m": "gpt:layers=12,heads=12,width=768,context=1024,vocab=50257",
}

LLAMA_KEYS = ("layers", "heads", "kv_heads", "width", "ffn", "context", "vocab")
LLAMA_FLOATS = {"norm_eps": (1e-5, 0.0), "rope_theta": (10000.0, 1.0)}  # key: (default, the bound it must exceed)

MODEL_NAMES = ["mlp", "convnet", "resnet18", "gpt-mini", "gpt2-124m"]


def parse_family(name):
    """A family string -> (family, config): ("gpt", (L, H, C, T, V)), ("llama", (L, H, K, C,
    F, T, V, norm_eps, rope_theta)), ("mlp", [widths]), ("resnet", depth). ValueError naming
    the string otherwise."""
    family, _, body = name.partition(":")
    try:
        if family == "gpt":
            kv = dict(item.split("=", 1) for item in body.split(","))
            kv.pop("dropout", None)
            keys = ("layers", "heads", "width", "context", "vocab")
            if sorted(kv) != sorted(keys):
                raise ValueError(f"expected the keys {', '.join(keys)}")
            return "gpt", tuple(int(kv[k]) for k in keys)
        if family == "llama":
            kv = dict(item.split("=", 1) for item in body.split(","))
            floats = []
            for key, (default, above) in LLAMA_FLOATS.items():
                v = float(kv.pop(key, default))
                if not (v > above and math.isfinite(v)):
                    raise ValueError(f"{key!r} must be a number above {above:g}")
                floats.append(v)
            if sorted(kv) != sorted(LLAMA_KEYS):
                raise ValueError(f"expected the keys {', '.join(LLAMA_KEYS)}[, norm_eps, rope_theta]")
            return "llama", tuple(int(kv[k]) for k in LLAMA_KEYS) + tuple(floats)
        if family == "moe":
            kv = dict(item.split("=", 1) for item in body.split(","))
            L, nh, C = int(kv.pop("layers")), int(kv.pop("heads")), int(kv.pop("width"))
            T, V, E, k = int(kv.pop("context")), int(kv.pop("vocab")), int(kv.pop("experts")), int(kv.pop("top_k"))
            nkv, ffn = int(kv.pop("kv_heads", nh)), int(kv.pop("ffn", 4 * C))
            S, cf, aux = int(kv.pop("shared", 0)), float(kv.pop("capacity", 0.0)), float(kv.pop("aux", 0.01))
            eps, theta = float(kv.pop("norm_eps", 1e-5)), float(kv.pop("rope_theta", 10000.0))
            if kv or not 1 <= k <= E:
                raise ValueError(f"unexpected keys {sorted(kv)} or top_k {k} not in [1, experts {E}]")
            return "moe", (L, nh, nkv, C, ffn, T, V, eps, theta, (E, k, S, cf, aux))
        if family == "mlp":
            widths = [int(w) for w in body.split("-")]
            if len(widths) < 2 or min(widths) < 1:
                raise ValueError("expected positive widths IN-HIDDEN...-CLASSES")
            return "mlp", widths
        if family == "resnet" and int(body) in RESNET_BLOCKS:
            return "resnet", int(body)
    except ValueError as e:
        raise ValueError(f"model {name!r}: {e}") from None
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}, or gpt:..., llama:..., mlp:..., resnet:18|34")


def model_arg(name):
    """argparse type for --model: a preset name, a family string or file:NET.json."""
    if name.startswith("file:"):
        if not os.path.isfile(name[len("file:"):]):
            raise ValueError(f"no model file {name[len('file:'):]!r}")
        return name
    if name not in MODEL_NAMES:
        parse_family(name)
    return name


def build(name, chw=None, classes=10, seq_len=None):
    """Build model `name` (a preset or a family string). Image models take chw (default
    per model) and classes (an mlp's family string fixes both widths); GPT models may
    shorten seq_len (wpe keeps T_max = the config's T unless seq_len is given, in which
    case wpe has seq_len rows). Returns (model, spec)."""
    if name.startswith("file:"):  # a saturate model file: its own inputs and classes
        import model_file
        return model_file.build(name[len("file:"):])
    if name == "convnet":
        C, H, W = tuple(chw) if chw else (1, 28, 28)
        return ConvNet(C, H, W, classes), {"kind": "image", "chw": (C, H, W), "classes": classes}
    family, cfg = parse_family(PRESETS.get(name, name))
    if family == "mlp":
        widths = list(cfg)
        default = (1, 28, 28) if widths[0] == 784 else (1, 1, widths[0])
        C, H, W = tuple(chw) if chw else default
        if name == "mlp":  # the preset takes the data's size and classes, as it always did here
            widths[0], widths[-1] = C * H * W, classes
        elif C * H * W != widths[0]:
            raise ValueError(f"model {name!r} takes inputs of {widths[0]} values, not {C}x{H}x{W}")
        return MLP(widths), {"kind": "image", "chw": (C, H, W), "classes": widths[-1]}
    if family == "resnet":
        C, H, W = tuple(chw) if chw else (3, 32, 32)
        return ResNet(C, classes, cfg), {"kind": "image", "chw": (C, H, W), "classes": classes}
    if family == "llama":
        L, nh, nkv, C, ffn, T, V, eps, theta = cfg
        T = seq_len or T
        return Llama(L, nh, nkv, C, ffn, T, V, eps, theta), {"kind": "tokens", "T": T, "V": V}
    if family == "moe":
        L, nh, nkv, C, ffn, T, V, eps, theta, moe = cfg
        T = seq_len or T
        return Llama(L, nh, nkv, C, ffn, T, V, eps, theta, moe), {"kind": "tokens", "T": T, "V": V}
    L, nh, C, T, V = cfg
    if seq_len:
        T = seq_len
    return GPT(L, nh, C, T, V), {"kind": "tokens", "T": T, "V": V}


def loss_fn(model, out, y):
    loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
    for aux in model.aux_losses() if hasattr(model, "aux_losses") else []:
        loss = loss + aux  # the moe family's load-balancing losses, layer by layer
    return loss


def parse_chw(s):
    """'3x32x32' -> (3, 32, 32)"""
    parts = tuple(int(p) for p in s.lower().split("x"))
    if len(parts) != 3:
        raise ValueError(f"expected CxHxW, got {s!r}")
    return parts
