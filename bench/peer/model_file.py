"""A saturate model file (--model file:NET.json; src/nn/model_file.h) as a PyTorch module.

The same layers, wired the same way, with the same parameter names (a layer "a.b" of type
linear holds "a.b.weight" and "a.b.bias"), so a safetensors file of saturate's loads with
load_state_dict(strict=True) and both compute the same loss.

  build(path) -> (module, spec)   spec as models.build's: {"kind": "image", "chw", "classes"}
                                  or {"kind": "tokens", "T", "V"}
The module's forward(x) returns the logits (the loss layer's first input).
"""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import models


def _expand(entries, out, i=None):
    """The file's layer list with "block" groups flattened and "repeat"s unrolled."""
    for e in entries:
        if "block" in e:
            _expand(e["block"], out, i)
        elif "repeat" in e:
            for k in range(e.get("start", 0), e.get("start", 0) + e["repeat"]):
                _expand(e["layers"], out, k)
        else:
            layer = dict(e)
            if i is not None:
                layer["name"] = layer["name"].replace("{i}", str(i))
                if "inputs" in layer:
                    layer["inputs"] = [s.replace("{i}", str(i)) for s in layer["inputs"]]
            out.append(layer)
    return out


def _attention(heads, kv_heads, *xs):
    """Causal self-attention (saturate's attention layer) of a fused q, k, v input [B, T, 3C]
    or of q [B, T, heads*hs], k and v [B, T, kv_heads*hs] (grouped-query attention)."""
    if len(xs) == 1:
        xs = xs[0].split(xs[0].shape[-1] // 3, dim=2)
    B, T, C = xs[0].shape
    hs = C // heads
    q = xs[0].view(B, T, heads, hs).transpose(1, 2)
    k, v = (t.view(B, T, kv_heads, hs).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1) for t in xs[1:])
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.ones(T, T, dtype=torch.bool, device=qkv.device).tril()
    att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


def _rotary(x, hs, theta):
    """Rotary embeddings of q or k [B, T, heads*hs], rotating each head's halves (HF's rotate_half)."""
    B, T, C = x.shape
    cos, sin = models.rope_tables(T, hs, x.dtype, theta)
    h = x.view(B, T, C // hs, hs).transpose(1, 2)
    h = h * cos + models.rotate_half(h) * sin
    return h.transpose(1, 2).reshape(B, T, C)


def _init(module, spec, fan_out=None):
    """weight_init strings: default, zeros, ones, normal(S), uniform(B), constant(V), kaiming_normal_fan_out."""
    if spec in (None, "default"):
        return
    with torch.no_grad():
        if spec == "zeros":
            module.zero_()
        elif spec == "ones":
            module.fill_(1.0)
        elif spec == "kaiming_normal_fan_out":
            module.normal_(0.0, math.sqrt(2.0 / fan_out))
        else:
            kind, arg = spec[:-1].split("(")
            x = float(arg)
            if kind == "normal":
                module.normal_(0.0, x)
            elif kind == "uniform":
                module.uniform_(-x, x)
            else:
                module.fill_(x)


class FileNet(nn.Module):
    def __init__(self, doc):
        super().__init__()
        (self.x_name, x), (self.y_name, y) = list(doc["inputs"].items())
        self.tokens = x.get("dtype", "float32") == "int32"
        self.x_shape = tuple(x["shape"])
        self.layers = _expand(doc["layers"], [])
        self.ops = []  # (name, inputs, function of the input tensors)
        self.depth = max(1, sum(l["type"] == "transformer_block" for l in self.layers))
        dummy = (torch.zeros((1,) + self.x_shape, dtype=torch.long) if self.tokens
                 else torch.zeros((1,) + self.x_shape))
        values = {self.x_name: dummy, self.y_name: None}
        prev = self.x_name
        for layer in self.layers:
            ins = layer.get("inputs", [prev])
            fn = self._make(layer, [values[n] for n in ins])
            self.ops.append((layer["name"], ins, fn))
            if layer["type"] == "cross_entropy":
                self.logits = ins[0]
            else:
                with torch.no_grad():
                    was = self.training
                    self.eval()  # shapes only: BatchNorm's statistics stay as they are
                    values[layer["name"]] = fn(*[values[n] for n in ins])
                    self.train(was)
            prev = layer["name"]

    def _put(self, dotted, module):
        """Registers module under its dotted name, creating plain containers on the way."""
        parent = self
        *path, leaf = dotted.split(".")
        for p in path:
            if not hasattr(parent, p) or not isinstance(getattr(parent, p), nn.Module):
                parent.add_module(p, nn.Module())
            parent = getattr(parent, p)
        parent.add_module(leaf, module)
        return module

    def _param(self, name):
        return dict(self.named_parameters())[name]

    def _make(self, l, xs):
        t, name, x = l["type"], l["name"], xs[0]
        if t == "linear":
            m = self._put(name, nn.Linear(x.shape[-1], l["out"], bias=l.get("bias", True)))
            _init(m.weight, l.get("weight_init"))
            if m.bias is not None:
                _init(m.bias, l.get("bias_init"))
            if "tied_to" in l:
                m.weight = self._param(l["tied_to"])
            return m
        if t == "conv2d":
            k = l["kernel"]
            m = self._put(name, nn.Conv2d(x.shape[1], l["out_channels"], k, l.get("stride", 1), l.get("padding", 0),
                                          groups=l.get("groups", 1), bias=l.get("bias", True)))
            _init(m.weight, l.get("weight_init"), fan_out=l["out_channels"] * k * k)
            return m
        if t == "batchnorm2d":
            return self._put(name, nn.BatchNorm2d(x.shape[1], eps=l.get("eps", 1e-5), momentum=l.get("momentum", 0.1)))
        if t == "rmsnorm":
            return self._put(name, models.RMSNorm(x.shape[-1], eps=l.get("eps", 1e-5)))
        if t == "layernorm":
            return self._put(name, nn.LayerNorm(x.shape[-1], eps=l.get("eps", 1e-5)))
        if t == "embedding":
            return self._put(name, nn.Embedding(l["vocab"], l["width"]))
        if t == "gpt_embedding":
            wte = self._put(name + ".wte", nn.Embedding(l["vocab"], l["width"]))
            wpe = self._put(name + ".wpe", nn.Embedding(l.get("context", x.shape[1]), l["width"]))
            drop = l.get("dropout", 0.0)
            return lambda i: F.dropout(wte(i) + wpe(torch.arange(i.shape[1], device=i.device)), drop, self.training)
        if t == "transformer_block":
            assert l.get("dropout", 0.0) == 0.0, "the PyTorch transformer_block has no dropout"
            return self._put(name, models.Block(x.shape[-1], l["heads"]))
        if t == "basic_block":
            return self._put(name, models.BasicBlock(x.shape[1], l["out_channels"], l.get("stride", 1)))
        simple = {
            "relu": F.relu,
            "gelu": lambda a: F.gelu(a, approximate=l.get("approximate", "tanh")),
            "silu": F.silu,
            "flatten": lambda a: torch.flatten(a, 1),
            "add": lambda a, b: a + b,
            "dropout": lambda a: F.dropout(a, l.get("p", 0.0), self.training),
            "attention": lambda *a: _attention(l["heads"], l.get("kv_heads", l["heads"]), *a),
            "rotary": lambda a: _rotary(a, l["head_size"], l.get("theta", 10000.0)),
            "swiglu": lambda gate, up: F.silu(gate) * up,
            "maxpool2d": lambda a: F.max_pool2d(a, l["kernel"], l.get("stride", l["kernel"]), l.get("padding", 0)),
            "avgpool2d": lambda a: F.adaptive_avg_pool2d(a, tuple(l.get("output", [1, 1]))),
            "cross_entropy": None,
        }
        if t not in simple:
            raise ValueError(f"layer {name!r}: unknown type {t!r}")
        return simple[t]

    def forward(self, x):
        values = {self.x_name: x}
        for name, ins, fn in self.ops:
            if fn is None:  # the loss: computed by models.loss_fn from the logits
                break
            values[name] = fn(*[values[n] for n in ins])
        return values[self.logits]


def build(path):
    with open(path) as f:
        doc = json.load(f)
    net = FileNet(doc)
    with torch.no_grad():
        was = net.training
        net.eval()
        dummy = (torch.zeros((1,) + net.x_shape, dtype=torch.long) if net.tokens else torch.zeros((1,) + net.x_shape))
        classes = net(dummy).shape[-1]
        net.train(was)
    if net.tokens:
        return net, {"kind": "tokens", "T": net.x_shape[0], "V": classes}
    return net, {"kind": "image", "chw": net.x_shape, "classes": classes}
