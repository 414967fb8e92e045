"""Import a PyTorch module into saturate: a model file (--model file:NET.json) and its weights.

    imp = import_module(module, example_input)   # example_input: a batch [B, ...]
    imp.model_json, imp.weights (float32 arrays; BatchNorm's num_batches_tracked int64), imp.input_shape,
    imp.takes_tokens, imp.classes
    imp.state_dict(weights)                       # saturate's weights -> the module's state_dict

The module is traced with torch.fx by a tracer that runs every operation on the example
batch as it goes, so sizes (x.size(), .shape, b, t = idx.size()) are plain ints; each leaf
module and function becomes one of saturate's layers, or the import stops with a
TorchImportError naming the operation and where it is. A feature vector [N] (--input N) is
[1, 1, N] in the model file, as saturate's readers give features, and flattened first.
Run as a script it is
`saturate import`: python3 saturate_torch.py MODULE:FACTORY --input SHAPE [--out] [--weights].
"""
import ast
import importlib
import inspect
import json
import math
import operator
import os
import re
import struct
import sys

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

SUPPORTED = ("Linear, Conv2d, BatchNorm2d, LayerNorm, Embedding, ReLU, GELU, SiLU, Dropout, MaxPool2d, "
             "AdaptiveAvgPool2d, Flatten, Identity, relu, gelu, silu, add (residuals), flatten/view/reshape that "
             "flatten, dropout, F.cross_entropy, causal self-attention (a module with a fused qkv Linear and an output "
             "Linear, or MultiheadAttention with a causal mask), token + position embeddings")


class TorchImportError(Exception):
    """Why a module cannot be imported: one line naming the operation and where it is."""


# ---- tracing with concrete values -------------------------------------------------------

_LEAVES = (nn.Linear, nn.Conv2d, nn.BatchNorm2d, nn.LayerNorm, nn.Embedding, nn.ReLU, nn.GELU, nn.SiLU,
           nn.Dropout, nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Identity, nn.CrossEntropyLoss,
           nn.MultiheadAttention)


def _has_tensor(v):
    found = []
    fx.node.map_aggregate(v, lambda a: found.append(a) if isinstance(a, torch.Tensor) else None)
    return bool(found)


def _shape_spec(shape, tokens):
    """A per-sample shape as --input writes it."""
    return f"tokens:{shape[-1]}" if tokens else "x".join(str(int(d)) for d in shape)


class _ConcreteProxy(fx.Proxy):
    """A proxy that also holds the value its node computes on the example batch."""

    def __getattr__(self, k):
        if k in ("shape", "dtype", "device", "ndim", "is_cuda", "is_floating_point") and "value" in self.__dict__:
            return getattr(self.__dict__["value"], k)
        return super().__getattr__(k)

    def __len__(self):
        return len(self.value)

    def __iter__(self):  # q, k, v = x.split(...): one getitem node each
        return iter([self[i] for i in range(len(self.value))])


def _describe(kind, target):
    if kind == "call_function":
        return getattr(target, "__name__", str(target))
    if kind == "call_method":
        return "Tensor." + target
    return str(target)


class _Tracer(fx.Tracer):
    def __init__(self, root, inputs):
        super().__init__()
        self.root_module = root
        self.inputs = list(inputs)
        self.path = [""]
        self.computing = False
        self.example_shape = tuple(inputs[0].shape[1:]) if inputs else ()
        self.tokens = bool(inputs) and not inputs[0].is_floating_point()

    def is_leaf_module(self, m, qualname):
        if isinstance(m, _LEAVES):
            return True
        if type(m).__module__.startswith("torch.nn") and not isinstance(m, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            return True  # a torch.nn module saturate has no layer for: refused when converted
        return False

    def call_module(self, m, forward, args, kwargs):
        name = self.path_of_module(m)
        self.path.append(name)
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self.path.pop()

    def to_bool(self, obj):
        where = self.path[-1] or type(self.root_module).__name__
        raise TorchImportError(f"data-dependent control flow in '{where}': a Python condition (if, while, assert, "
                               f"bool) on a tensor's values, which a traced graph cannot hold (torch.fx: symbolically "
                               f"traced variables cannot be used as inputs to control flow)")

    def iter(self, obj):
        return iter(obj)

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if self.computing:  # a leaf module's forward on the example batch: its real parameters
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def _value(self, kind, target, args, kwargs):
        val = lambda a: a.value if isinstance(a, _ConcreteProxy) else a  # noqa: E731
        a = fx.node.map_aggregate(args, val)
        k = fx.node.map_aggregate(kwargs, val)
        if kind == "placeholder":
            return self.inputs.pop(0) if self.inputs else None
        if kind == "get_attr":
            obj = self.root_module
            for p in target.split("."):
                obj = getattr(obj, p)
            return obj
        if kind == "call_function":
            return target(*a, **k)
        if kind == "call_method":
            return getattr(a[0], target)(*a[1:], **k)
        if kind == "call_module":
            return self.root_module.get_submodule(target).forward(*a, **k)  # __call__ is the tracer's now
        return None

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        if kind == "output":
            return super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        try:
            self.computing = True
            with torch.no_grad():
                value = self._value(kind, target, args, kwargs)
        except TorchImportError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the module on the example batch
            where = target if kind == "call_module" else self.path[-1]
            op = type(self.root_module.get_submodule(target)).__name__ if kind == "call_module" else _describe(kind, target)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            shape = _shape_spec(self.example_shape, self.tokens)
            m = self.root_module.get_submodule(target) if kind == "call_module" else None
            xv = args[0].value if args and isinstance(args[0], _ConcreteProxy) else None
            if isinstance(m, nn.Linear) and isinstance(xv, torch.Tensor) and xv.shape[-1] != m.in_features:
                msg = f"it takes {m.in_features} features, and gets {list(xv.shape)}"
            elif isinstance(m, nn.Conv2d) and isinstance(xv, torch.Tensor) and xv.dim() == 4 and xv.shape[1] != m.in_channels:
                msg = f"it takes {m.in_channels} channels, and gets {list(xv.shape)}"
            raise TorchImportError(f"--input {shape}: '{where or type(self.root_module).__name__}' ({op}) fails on a "
                                   f"batch of that shape: {msg}") from None
        finally:
            self.computing = False
        if kind not in ("placeholder", "get_attr") and not _has_tensor(value):
            return value  # sizes, shapes and other plain values are constants of the graph
        p = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        p.value = value
        p.node.meta["value"] = value
        p.node.meta["path"] = target if kind == "call_module" else self.path[-1]
        return p

    def proxy(self, node):
        return _ConcreteProxy(node, self)


def _trace_module(module, inputs):
    """The traced graph, with each node's value on the example batch in node.meta["value"]."""
    tracer = _Tracer(module, inputs)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    before = set(vars(module))
    try:
        graph = tracer.trace(module)
    except TorchImportError:
        raise
    except (fx.proxy.TraceError, NotImplementedError, AssertionError, TypeError) as e:
        gist = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TorchImportError(f"torch.fx cannot trace '{tracer.path[-1] or type(module).__name__}': {gist}") from None
    finally:
        module.load_state_dict(state)  # BatchNorm's statistics as they were
    consts = {}
    for name in set(vars(module)) - before:  # tensors torch.fx stored on the module as constants
        consts[name] = getattr(module, name)
        delattr(module, name)
    for n in graph.nodes:
        if n.op == "get_attr" and "value" not in n.meta:
            obj = consts.get(n.target)
            if obj is None:
                obj = module
                for p in n.target.split("."):
                    obj = getattr(obj, p)
            n.meta["value"] = obj
            n.meta.setdefault("path", "")
    return graph


# ---- what saturate's layers compute -----------------------------------------------------

def _causal_attention(qkv, heads):
    """saturate's attention layer: causal self-attention of a fused q, k, v input [B, T, 3C]."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // heads
    q, k, v = (t.reshape(B, T, heads, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, C)


def _close(a, b):
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
        bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5 * max(1.0, float(b.abs().max()))))


_RELU = {F.relu, torch.relu, "relu", "relu_"}
_ADD = {operator.add, operator.iadd, torch.add, "add", "add_"}
_FLAT = {torch.flatten, "flatten", "view", "reshape"}
_SAME = {"contiguous"}
_GELU = {F.gelu, "gelu"}
_DROP = {F.dropout}
_CE = {F.cross_entropy}
_MAXPOOL = {F.max_pool2d}
_AVGPOOL = {F.adaptive_avg_pool2d}
_SILU = {F.silu, "silu"}
_CONTAINERS = (nn.Sequential, nn.ModuleList)


def _int2(v, what, where):
    v = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(v) != 2 or v[0] != v[1] or not isinstance(v[0], int):
        raise TorchImportError(f"{where}: {what} {v}: saturate takes square {what}s (one int)")
    return v[0]


class _Converter:
    """The traced graph as saturate layers, with the weights under the model file's names."""

    def __init__(self, module, graph, takes_tokens):
        self.module = module
        self.graph = graph
        self.tokens = takes_tokens
        self.layers = []           # (layer dict, block key)
        self.name = {}             # node -> the model file's value name
        self.used = set()
        self.weights = {}          # model file name -> numpy array
        self.file_of = {}          # id(torch parameter or buffer) -> model file name
        self.consumed = set()
        self.emit_at = {}          # node -> a function emitting its layers (attention, embeddings)
        self.modules = dict(module.named_modules())
        self.vocab_parallel = set()  # gpt_embedding's token tables: split by vocabulary under --tp
        self.alias = {}            # node -> the node whose value it passes on unchanged

    # -- helpers --
    def where(self, n):
        path = n.meta.get("path", "")
        m = self.modules.get(path)
        return f"'{path}' ({type(m).__name__})" if path and m is not None else f"'{type(self.module).__name__}.forward'"

    def refuse(self, n, what=None):
        op = what or _describe(n.op, n.target if n.op != "call_module" else type(self.modules[n.target]).__name__)
        raise TorchImportError(f"unsupported operation {op} in {self.where(n)}; saturate imports: {SUPPORTED}")

    def unique(self, name):
        base, k = name, 1
        while name in self.used or name in ("x", "y", "loss"):
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name

    def block_of(self, path):
        parts = path.split(".") if path else []
        for i in range(1, len(parts) + 1):
            parent = self.modules.get(".".join(parts[:i - 1]))
            here = self.modules.get(".".join(parts[:i]))
            if isinstance(parent, _CONTAINERS) and here is not None and not isinstance(here, _LEAVES):
                return ".".join(parts[:i])
        return None

    def add(self, n, layer, inputs, path=None):
        """Appends a layer reading the given nodes (or value names); n's value becomes its output."""
        layer = dict(layer)
        layer["name"] = self.unique(layer["name"])
        names = [self.name[i] if isinstance(i, fx.Node) else i for i in inputs]
        prev = self.layers[-1][0]["name"] if self.layers else "x"
        if names != [prev]:
            layer["inputs"] = names
        self.layers.append((layer, self.block_of(path if path is not None else n.meta.get("path", ""))))
        if n is not None:
            self.name[n] = layer["name"]
        return layer

    def param(self, layer_name, key, t):
        name = f"{layer_name}.{key}"
        v = t.detach().cpu()
        v = v.numpy() if v.dtype == torch.int64 else v.float().numpy()  # num_batches_tracked stays int64
        self.weights[name] = np.array(v, order="C", copy=True)
        self.file_of[id(t)] = name

    def tensor_arg(self, n, k=0):
        a = n.args[k] if k < len(n.args) else None
        if not isinstance(a, fx.Node):
            self.refuse(n, f"{_describe(n.op, n.target)} of a constant")
        return self.resolve(a)

    def resolve(self, a):
        while a in self.alias:
            a = self.alias[a]
        return a

    # -- leaf modules --
    def module_layer(self, n, m):
        path, x = n.target, self.tensor_arg(n)
        xv = x.meta["value"]
        if isinstance(m, nn.Linear):
            layer = {"name": path, "type": "linear", "out": m.out_features, "bias": m.bias is not None}
            tied = self.file_of.get(id(m.weight))
            if tied:
                layer["tied_to"] = tied
                if tied in self.vocab_parallel:  # gpt_embedding splits its vocabulary under --tp: so must the head
                    layer["tp"] = "column"
            lay = self.add(n, layer, [x])
            if not tied:
                self.param(lay["name"], "weight", m.weight)
            if m.bias is not None:
                self.param(lay["name"], "bias", m.bias)
            return
        if isinstance(m, nn.Conv2d):
            w = f"'{path}' (Conv2d)"
            if isinstance(m.padding, str) or m.padding_mode != "zeros" or _int2(m.dilation, "dilation", w) != 1:
                self.refuse(n, "Conv2d with string padding, dilation or a padding mode other than zeros")
            layer = {"name": path, "type": "conv2d", "out_channels": m.out_channels,
                     "kernel": _int2(m.kernel_size, "kernel", w), "stride": _int2(m.stride, "stride", w),
                     "padding": _int2(m.padding, "padding", w), "bias": m.bias is not None}
            if m.groups != 1:
                layer["groups"] = m.groups
            lay = self.add(n, layer, [x])
            self.param(lay["name"], "weight", m.weight)
            if m.bias is not None:
                self.param(lay["name"], "bias", m.bias)
            return
        if isinstance(m, nn.BatchNorm2d):
            if not (m.affine and m.track_running_stats) or m.momentum is None:
                self.refuse(n, "BatchNorm2d without affine parameters, running statistics or a momentum")
            lay = self.add(n, {"name": path, "type": "batchnorm2d", "eps": m.eps, "momentum": m.momentum}, [x])
            for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
                self.param(lay["name"], k, getattr(m, k))
            return
        if isinstance(m, nn.LayerNorm):
            if tuple(m.normalized_shape) != (xv.shape[-1],) or not m.elementwise_affine:
                self.refuse(n, "LayerNorm over more than the last dimension or without affine parameters")
            lay = self.add(n, {"name": path, "type": "layernorm", "eps": m.eps}, [x])
            self.param(lay["name"], "weight", m.weight)
            self.param(lay["name"], "bias", m.bias)
            return
        if isinstance(m, nn.Embedding):
            if m.padding_idx is not None or m.max_norm is not None or x.op != "placeholder":
                self.refuse(n, "Embedding with padding_idx or max_norm, or of something other than the input tokens")
            lay = self.add(n, {"name": path, "type": "embedding", "vocab": m.num_embeddings,
                               "width": m.embedding_dim}, [x])
            self.param(lay["name"], "weight", m.weight)
            return
        if isinstance(m, nn.MultiheadAttention):
            return self.multihead_attention(n, m, x, xv)
        self.simple_module(n, m, x, xv)

    def multihead_attention(self, n, m, x, xv):
        """nn.MultiheadAttention(batch_first=True) of one input with a causal attn_mask: saturate's attention."""
        qkv = [n.args[i] if len(n.args) > i else n.kwargs.get(k) for i, k in enumerate(("query", "key", "value"))]
        out = n.meta["value"][0]
        ok = len(set(qkv)) == 1 and m.batch_first and m._qkv_same_embed_dim and m.bias_k is None and \
            not m.add_zero_attn and (m.dropout == 0 or not m.training) and n.kwargs.get("key_padding_mask") is None
        if ok:
            with torch.no_grad():
                ok = _close(m.out_proj(_causal_attention(F.linear(xv, m.in_proj_weight, m.in_proj_bias), m.num_heads)),
                            out)
        if not ok:
            self.refuse(n, "MultiheadAttention other than causal self-attention (batch_first=True, one input, a causal "
                           "attn_mask, no dropout, key padding or extra bias)")
        path, bias = n.target, m.in_proj_bias is not None
        la = self.add(None, {"name": f"{path}.in_proj", "type": "linear", "out": 3 * m.embed_dim, "bias": bias,
                             "tp": "column", "tp_stride": 3}, [x], path)
        self.param(la["name"], "weight", m.in_proj_weight)
        if bias:
            self.param(la["name"], "bias", m.in_proj_bias)
        at = self.add(None, {"name": f"{path}.attention", "type": "attention", "heads": m.num_heads}, [la["name"]], path)
        lb = self.add(n, {"name": f"{path}.out_proj", "type": "linear", "out": m.embed_dim,
                          "bias": m.out_proj.bias is not None, "tp": "row"}, [at["name"]], path)
        self.param(lb["name"], "weight", m.out_proj.weight)
        if m.out_proj.bias is not None:
            self.param(lb["name"], "bias", m.out_proj.bias)

    def simple_module(self, n, m, x, xv):
        path = n.target
        if isinstance(m, nn.ReLU):
            return self.add(n, {"name": path, "type": "relu"}, [x])
        if isinstance(m, nn.GELU):
            return self.add(n, {"name": path, "type": "gelu", "approximate": m.approximate}, [x])
        if isinstance(m, nn.SiLU):
            return self.add(n, {"name": path, "type": "silu"}, [x])
        if isinstance(m, nn.Dropout):
            return self.dropout(n, x, m.p, path)
        if isinstance(m, (nn.Identity,)):
            self.alias[n] = x
            return None
        if isinstance(m, nn.Flatten):
            return self.flatten(n, x, path)
        if isinstance(m, nn.MaxPool2d):
            return self.maxpool(n, x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, path)
        if isinstance(m, nn.AdaptiveAvgPool2d):
            return self.avgpool(n, x, path)
        self.refuse(n)

    def dropout(self, n, x, p, path):
        if p == 0:
            self.alias[n] = x
            return None
        return self.add(n, {"name": path, "type": "dropout", "p": p}, [x])

    def flatten(self, n, x, path):
        xs, ys = tuple(x.meta["value"].shape), tuple(n.meta["value"].shape)
        if xs == ys:
            self.alias[n] = x
            return None
        if len(xs) >= 3 and ys == (xs[0], math.prod(xs[1:])):
            return self.add(n, {"name": path, "type": "flatten"}, [x])
        self.refuse(n, f"{_describe(n.op, n.target)} from {list(xs)} to {list(ys)} (only flattening [B, ...] to "
                       f"[B, N])")

    def maxpool(self, n, x, k, s, p, d, ceil, path):
        w = self.where(n)
        if _int2(d, "dilation", w) != 1 or ceil:
            self.refuse(n, "max pooling with dilation or ceil_mode")
        k = _int2(k, "kernel", w)
        s = _int2(s if s is not None and s != [] else k, "stride", w)
        return self.add(n, {"name": path, "type": "maxpool2d", "kernel": k, "stride": s,
                            "padding": _int2(p, "padding", w)}, [x])

    def avgpool(self, n, x, path):
        h, w = n.meta["value"].shape[-2:]
        return self.add(n, {"name": path, "type": "avgpool2d", "output": [int(h), int(w)]}, [x])

    # -- functions and tensor methods --
    def function_layer(self, n):
        t = n.target
        path = n.meta.get("path", "")
        base = re.sub(r"_\d+$", "", n.name)
        name = f"{path}.{base}" if path else base
        arg = lambda k, key, d=None: n.args[k] if len(n.args) > k else n.kwargs.get(key, d)  # noqa: E731
        if t is operator.getitem and isinstance(n.args[0], fx.Node) and n.args[0] in self.name and n.args[1] == 0 and \
                n.args[0].op == "call_module" and isinstance(self.modules[n.args[0].target], nn.MultiheadAttention):
            self.name[n] = self.name[n.args[0]]  # MultiheadAttention's output (its weights are not used)
            return None
        if t in _RELU:
            return self.add(n, {"name": name, "type": "relu"}, [self.tensor_arg(n)])
        if t in _GELU:
            return self.add(n, {"name": name, "type": "gelu", "approximate": n.kwargs.get("approximate", "none")},
                            [self.tensor_arg(n)])
        if t in _SILU:
            return self.add(n, {"name": name, "type": "silu"}, [self.tensor_arg(n)])
        if t in _ADD:
            a, b = (n.args + (None,))[:2]
            if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)) or n.kwargs.get("alpha", 1) != 1 or \
                    a.meta["value"].shape != b.meta["value"].shape:
                self.refuse(n, f"{_describe(n.op, t)} other than of two tensors of one shape")
            return self.add(n, {"name": name, "type": "add"}, [self.resolve(a), self.resolve(b)])
        if t in _FLAT:
            return self.flatten(n, self.tensor_arg(n), name)
        if t in _SAME:
            self.alias[n] = self.tensor_arg(n)
            return None
        if t in _DROP:
            return self.dropout(n, self.tensor_arg(n), arg(1, "p", 0.5) if arg(2, "training", True) else 0, name)
        if t in _MAXPOOL:
            k = arg(1, "kernel_size")
            return self.maxpool(n, self.tensor_arg(n), k, arg(2, "stride", None), arg(3, "padding", 0),
                                arg(4, "dilation", 1), arg(5, "ceil_mode", False), name)
        if t in _AVGPOOL:
            return self.avgpool(n, self.tensor_arg(n), name)
        self.refuse(n)

    # -- recognised subgraphs --
    def members(self, path):
        return [n for n in self.graph.nodes if n.op not in ("placeholder", "output", "get_attr")
                and (n.meta.get("path", "") == path or n.meta.get("path", "").startswith(path + "."))]

    def find_attention(self, path, m):
        """A module computing saturate's causal self-attention: x -> Linear(C, 3C) -> attention -> Linear(C, C)."""
        nodes = self.members(path)
        inside = set(nodes)
        lins = [n for n in nodes if n.op == "call_module" and isinstance(self.modules[n.target], nn.Linear)]
        if len(lins) != 2:
            return False
        ext = {a for n in nodes for a in n.all_input_nodes if a not in inside and a.op != "get_attr"}
        outs = [n for n in nodes if any(u not in inside for u in n.users)]
        if len(ext) != 1 or len(outs) != 1:
            return False
        x, out = ext.pop(), outs[0]
        xv, ov = x.meta.get("value"), out.meta.get("value")
        qkv, proj = (self.modules[n.target] for n in lins)
        if not isinstance(xv, torch.Tensor) or xv.dim() != 3 or not isinstance(ov, torch.Tensor):
            return False
        C = xv.shape[-1]
        if qkv.in_features != C or qkv.out_features != 3 * C or (proj.in_features, proj.out_features) != (C, C):
            return False
        hint = [getattr(m, k) for k in ("n_head", "num_heads", "n_heads", "heads") if isinstance(getattr(m, k, None), int)]
        with torch.no_grad():
            for h in hint + [h for h in range(1, C + 1) if C % h == 0 and h not in hint]:
                if C % h == 0 and _close(proj(_causal_attention(qkv(xv), h)), ov):
                    break
            else:
                return False
        self.consumed |= inside
        self.emit_at[out] = lambda: self.emit_attention(out, x, lins, h, path)
        return True

    def emit_attention(self, out, x, lins, heads, path):
        a, b = lins
        qkv, proj = self.modules[a.target], self.modules[b.target]
        la = self.add(None, {"name": a.target, "type": "linear", "out": qkv.out_features, "bias": qkv.bias is not None,
                             "tp": "column", "tp_stride": 3}, [self.resolve(x)], a.target)
        at = self.add(None, {"name": f"{path}.attention", "type": "attention", "heads": heads}, [la["name"]], path)
        lb = self.add(out, {"name": b.target, "type": "linear", "out": proj.out_features, "bias": proj.bias is not None,
                            "tp": "row"}, [at["name"]], b.target)
        for lay, mod in ((la, qkv), (lb, proj)):
            self.param(lay["name"], "weight", mod.weight)
            if mod.bias is not None:
                self.param(lay["name"], "bias", mod.bias)

    def find_embedding(self, n):
        """wte(tokens) + wpe(arange(T)) -> gpt_embedding."""
        if n.target not in _ADD or len(n.args) != 2 or not all(isinstance(a, fx.Node) for a in n.args):
            return False
        embs = [a for a in n.args if a.op == "call_module" and isinstance(self.modules[a.target], nn.Embedding)]
        if len(embs) != 2:
            return False
        tok = [e for e in embs if isinstance(e.args[0], fx.Node) and e.args[0].op == "placeholder"]
        pos = [e for e in embs if e not in tok]
        if len(tok) != 1 or len(pos) != 1 or len(tok[0].users) != 1 or len(pos[0].users) != 1:
            return False
        T = tok[0].args[0].meta["value"].shape[-1]
        pv = pos[0].args[0].meta.get("value") if isinstance(pos[0].args[0], fx.Node) else None
        if not isinstance(pv, torch.Tensor) or not torch.equal(pv.reshape(-1).cpu(), torch.arange(T)):
            return False
        wte, wpe = self.modules[tok[0].target], self.modules[pos[0].target]
        self.consumed |= {tok[0], pos[0], pos[0].args[0]}
        self.emit_at[n] = lambda: self.emit_embedding(n, tok[0], wte, wpe)
        return True

    def emit_embedding(self, n, tok, wte, wpe):
        a, b = tok.target, [k for k, v in self.modules.items() if v is wpe][0]
        pa, pb = a.rsplit(".", 1), b.rsplit(".", 1)
        name = pa[0] if len(pa) == 2 and len(pb) == 2 and pa[0] == pb[0] and pa[1] == "wte" and pb[1] == "wpe" \
            else f"{a}_and_{b}"
        lay = self.add(n, {"name": name, "type": "gpt_embedding", "vocab": wte.num_embeddings,
                           "width": wte.embedding_dim, "context": wpe.num_embeddings}, [tok.args[0]], a)
        self.param(lay["name"], "wte.weight", wte.weight)
        self.vocab_parallel.add(f"{lay['name']}.wte.weight")
        self.param(lay["name"], "wpe.weight", wpe.weight)

    # -- the whole graph --
    def strip(self, n):
        while isinstance(n, fx.Node) and (n.target in ("view", "reshape", "flatten", "contiguous") or
                                          n.target in (torch.flatten, torch.reshape)):
            n = n.args[0]
        return n

    def find_loss(self, out):
        ces = [n for n in self.graph.nodes if (n.op == "call_function" and n.target in _CE) or
               (n.op == "call_module" and isinstance(self.modules[n.target], nn.CrossEntropyLoss))]
        if not ces:
            first = []
            fx.node.map_arg(out.args, lambda a: first.append(a))
            if not first or not isinstance(first[0].meta.get("value"), torch.Tensor):
                raise TorchImportError(f"'{type(self.module).__name__}.forward' returns no tensor of logits")
            return first[0]
        if len(ces) > 1:
            raise TorchImportError(f"{len(ces)} cross-entropy losses in '{type(self.module).__name__}': saturate "
                                   f"takes one")
        ce = ces[0]
        m = self.modules.get(ce.target) if ce.op == "call_module" else None
        kw = dict(ce.kwargs) if m is None else {"reduction": m.reduction, "ignore_index": m.ignore_index,
                                                "label_smoothing": m.label_smoothing, "weight": m.weight}
        if len(ce.args) > 2 and m is None:
            kw["weight"] = ce.args[2]
        if kw.get("reduction", "mean") != "mean" or kw.get("label_smoothing", 0.0) or kw.get("weight") is not None \
                or kw.get("ignore_index", -100) >= 0:
            self.refuse(ce, "cross_entropy other than a mean with a negative ignore_index and no weights or smoothing")
        target = self.strip(ce.args[1])
        if not (isinstance(target, fx.Node) and target.op == "placeholder" and self.name.get(target) == "y"):
            self.refuse(ce, "cross_entropy of targets other than forward's second argument")
        return self.strip(ce.args[0])

    def convert(self):
        ph = [n for n in self.graph.nodes if n.op == "placeholder"]
        self.name[ph[0]] = "x"
        if len(ph) > 1:
            self.name[ph[1]] = "y"
        logits = self.find_loss(next(n for n in self.graph.nodes if n.op == "output"))
        live, todo = set(), [logits]
        while todo:
            n = todo.pop()
            if n not in live:
                live.add(n)
                todo.extend(n.all_input_nodes)
        for path, m in self.modules.items():
            if path and not isinstance(m, _LEAVES) and not (set(self.members(path)) & self.consumed):
                self.find_attention(path, m)
        for n in self.graph.nodes:
            if n in live and n.op in ("call_function", "call_method") and n not in self.consumed:
                self.find_embedding(n)
        for n in self.graph.nodes:
            if n not in live or n.op in ("placeholder", "get_attr", "output"):
                continue
            if n in self.emit_at:
                self.emit_at[n]()
            elif n in self.consumed:
                continue
            elif n.op == "call_module":
                self.module_layer(n, self.modules[n.target])
            else:
                self.function_layer(n)
        lv = logits.meta["value"]
        if lv.dim() != (3 if self.tokens else 2):
            raise TorchImportError(f"the logits are {list(lv.shape)}: saturate's loss reads [B, classes] for "
                                   f"images and features, [B, T, vocabulary] for tokens")
        src = self.resolve(logits)
        if src.op == "placeholder":
            raise TorchImportError(f"'{type(self.module).__name__}' computes nothing from its input")
        self.add(None, {"name": "loss", "type": "cross_entropy"}, [self.name[src], "y"], "")
        self.layers[-1][0]["name"] = "loss"
        return int(lv.shape[-1])

    def mark_tensor_parallel(self):
        """Linear -> (relu|gelu|silu|dropout)* -> Linear pairs: the first "column", the second "row"."""
        layers = [l for l, _ in self.layers]
        readers = {}
        prev = "x"
        for l in layers:
            for i in l.get("inputs", [prev]):
                readers.setdefault(i, []).append(l)
            prev = l["name"]
        free = lambda l: l["type"] == "linear" and "tp" not in l and "tied_to" not in l  # noqa: E731
        for a in layers:
            if not free(a):
                continue
            cur = a
            while len(readers.get(cur["name"], [])) == 1 and \
                    readers[cur["name"]][0]["type"] in ("relu", "gelu", "silu", "dropout"):
                cur = readers[cur["name"]][0]
            nxt = readers.get(cur["name"], [])
            if len(nxt) == 1 and free(nxt[0]) and nxt[0] is not a:
                a["tp"], nxt[0]["tp"] = "column", "row"

    def model_json(self, name, x_shape, classes):
        T = x_shape[0] if self.tokens else None
        if not self.tokens and len(x_shape) == 1:
            # saturate's feature inputs are [1, 1, N] (as its readers give them): flattened first
            x_shape = (1, 1, x_shape[0])
            for l, _ in self.layers:
                if "inputs" in l:
                    l["inputs"] = ["x.flatten" if i == "x" else i for i in l["inputs"]]
            self.layers.insert(0, ({"name": "x.flatten", "type": "flatten"}, None))
        inputs = {"x": {"shape": list(x_shape), **({"dtype": "int32"} if self.tokens else {})},
                  "y": {"shape": [T] if self.tokens else [], "dtype": "int32"}}
        out, i = [], 0
        while i < len(self.layers):
            layer, key = self.layers[i]
            j = i
            while key is not None and j + 1 < len(self.layers) and self.layers[j + 1][1] == key:
                j += 1
            if j > i:
                out.append('    {"block": [\n' + ",\n".join("      " + json.dumps(l) for l, _ in self.layers[i:j + 1])
                           + "\n    ]}")
            else:
                out.append("    " + json.dumps(layer))
            i = j + 1
        head = json.dumps({"name": name, "inputs": inputs})[:-1]
        return head + ',\n  "layers": [\n' + ",\n".join(out) + "\n  ]\n}\n"


# ---- the API ----------------------------------------------------------------------------

class ImportedModel:
    """A module as a saturate model file and weights, and the way back to its state_dict."""

    def __init__(self, module, model_json, weights, file_of, input_shape, takes_tokens, classes):
        self.module = module
        self.model_json = model_json
        self.weights = weights
        self.input_shape = list(input_shape)
        self.takes_tokens = takes_tokens
        self.classes = classes
        self._file_of = file_of

    def state_dict(self, weights):
        """saturate's weights (model-file names -> arrays) as the module's state_dict (its own names and
        layouts; what saturate does not hold, such as BatchNorm's num_batches_tracked, as the module has it)."""
        out = {}
        for key, t in self.module.state_dict(keep_vars=True).items():
            name = self._file_of.get(id(t))
            if name is None:
                out[key] = t.detach().clone()
                continue
            if name not in weights:
                raise KeyError(f"saturate's weights have no '{name}' (the module's '{key}')")
            v = torch.from_numpy(np.array(weights[name], copy=True))
            if v.numel() != t.numel():
                raise ValueError(f"'{name}' has {v.numel()} values, the module's '{key}' {t.numel()}")
            out[key] = v.reshape(t.shape).to(t.dtype)
        return out


def _example_targets(module, x, tokens):
    """Targets for forward(x, targets) when forward takes a second argument (None otherwise)."""
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) < 2:
        return None
    with torch.no_grad():
        state = {k: v.clone() for k, v in module.state_dict().items()}
        try:
            out = module(x)
        except Exception as e:  # noqa: BLE001
            shape = _shape_spec(x.shape[1:], tokens)
            raise TorchImportError(f"--input {shape}: '{type(module).__name__}' fails on a batch of that shape: "
                                   f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        finally:
            module.load_state_dict(state)
    logits = out[0] if isinstance(out, (tuple, list)) else out
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, logits.shape[-1], tuple(x.shape) if tokens else x.shape[:1], generator=g)


def import_module(module, example_input, name=None):
    """Traces module on example_input (a batch [B, ...]: float features/images or int64 tokens [B, T])
    and returns an ImportedModel; raises TorchImportError (one line) for what saturate cannot hold."""
    if not isinstance(module, nn.Module):
        raise TorchImportError(f"expected a torch.nn.Module, got {type(module).__name__}")
    x = example_input
    tokens = not x.is_floating_point()
    if tokens:
        x = x.long()
    y = _example_targets(module, x, tokens)
    graph = _trace_module(module, [x] + ([y] if y is not None else []))
    conv = _Converter(module, graph, tokens)
    classes = conv.convert()
    conv.mark_tensor_parallel()
    name = name or type(module).__name__
    text = conv.model_json(name, tuple(x.shape[1:]), classes)
    return ImportedModel(module, text, conv.weights, conv.file_of, x.shape[1:], tokens, classes)


# ---- saturate import --------------------------------------------------------------------

def save_safetensors(path, weights):
    """weights (name -> float32 array, or int64 for BatchNorm's num_batches_tracked) as a safetensors file."""
    header, off, blobs = {}, 0, []
    for k in sorted(weights):
        i64 = np.asarray(weights[k]).dtype == np.int64
        a = np.ascontiguousarray(weights[k], dtype=np.int64 if i64 else np.float32)
        header[k] = {"dtype": "I64" if i64 else "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        if v["dtype"] == "I64":
            out[k] = np.frombuffer(data[s:e], dtype=np.int64).reshape(v["shape"]).copy()
        elif v["dtype"] == "F32":
            out[k] = np.frombuffer(data[s:e], dtype=np.float32).reshape(v["shape"]).copy()
        else:
            raise ValueError(f"{path}: tensor '{k}' is {v['dtype']}; saturate's weights are F32 (and I64 counters)")
    return out


def _factory(spec):
    """MODULE:FACTORY or MODULE:FACTORY(k=v, ...) (literal arguments) -> (the module, FACTORY's name)."""
    mod_name, sep, call = spec.partition(":")
    if not sep or not mod_name or not call:
        raise TorchImportError(f"expected MODULE:FACTORY (e.g. torchvision.models:resnet18(num_classes=10)), got '{spec}'")
    try:
        expr = ast.parse(call.strip(), mode="eval").body
    except SyntaxError:
        raise TorchImportError(f"'{call}': expected FACTORY or FACTORY(k=v, ...) with literal values") from None
    fname, args, kwargs = expr, [], {}
    if isinstance(expr, ast.Call):
        try:
            fname, args = expr.func, [ast.literal_eval(a) for a in expr.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in expr.keywords}
        except ValueError:
            raise TorchImportError(f"'{call}': the factory's arguments must be literals (numbers, strings, ...)") from None
    if not isinstance(fname, ast.Name):
        raise TorchImportError(f"'{call}': expected FACTORY or FACTORY(k=v, ...) with literal values")
    sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - ImportError, or the module's own failure
        raise TorchImportError(f"cannot import module '{mod_name}' (from the Python path or the current directory): "
                               f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}") from None
    fn = getattr(mod, fname.id, None)
    if not callable(fn):
        raise TorchImportError(f"module '{mod_name}' has no callable '{fname.id}'")
    try:
        net = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        raise TorchImportError(f"{mod_name}:{call} failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}") \
            from None
    return net, fname.id


def example_batch(module, spec, batch=2, seed=0):
    """--input SHAPE (CxHxW, N, ...) or tokens:T -> a seeded example batch."""
    g = torch.Generator().manual_seed(seed)
    try:
        if spec.startswith("tokens:"):
            T = int(spec[len("tokens:"):])
            embs = [m for m in module.modules() if isinstance(m, nn.Embedding)]
            V = embs[0].num_embeddings if embs else 2
            assert T > 0
            return torch.randint(0, V, (batch, T), generator=g)
        dims = [int(d) for d in spec.lower().split("x")]
        assert dims and all(d > 0 for d in dims)
    except (ValueError, AssertionError):
        raise TorchImportError(f"--input '{spec}': expected the per-sample shape (e.g. 3x32x32 or 784) or tokens:T") \
            from None
    return torch.randn((batch, *dims), generator=g)


def main(argv):
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise TorchImportError(message)

    ap = Parser(prog="saturate import", add_help=True)
    ap.add_argument("factory")
    ap.add_argument("--input", required=True)
    ap.add_argument("--out")
    ap.add_argument("--weights")
    try:
        a = ap.parse_args(argv)
        torch.manual_seed(0)
        net, fname = _factory(a.factory)
        if not isinstance(net, nn.Module):
            raise TorchImportError(f"{a.factory} returned a {type(net).__name__}, not a torch.nn.Module")
        out = a.out or f"{fname}.json"
        wpath = a.weights or os.path.splitext(out)[0] + ".safetensors"
        net.train()
        imp = import_module(net, example_batch(net, a.input), name=fname)
        with open(out, "w") as f:
            f.write(imp.model_json)
        save_safetensors(wpath, imp.weights)
    except TorchImportError as e:
        print(f"saturate: error: import: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"saturate: error: import: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    n = sum(int(np.prod(v.shape)) for v in imp.weights.values())
    layers = imp.model_json.count('"type"')
    print(f"wrote {out} ({layers} layers, input {imp.input_shape}{' tokens' if imp.takes_tokens else ''}, "
          f"{imp.classes} classes) and {wpath} ({len(imp.weights)} tensors, {n} values)")
    print(f"train it: saturate train --model file:{out} --init-weights {wpath} --data ...")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
