#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/: small valid examples and a few malformed
ones per parser (see each fuzz_<target>.cpp for how an input is laid out). Run from
anywhere: python3 fuzz/make_corpus.py. Files the fuzzers found (crashes fixed since) are
kept beside these as regression inputs, named regress-*."""
import gzip
import json
import os
import struct
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def gz(b):
    return gzip.compress(b, mtime=0)


def be(*v):
    return b"".join(struct.pack(">I", x) for x in v)


# ---- idx: byte 0 = slot (0 train images, 1 train labels, 2 t10k images, 3 t10k labels) | 4 (.gz name)
imgs = be(2051, 1, 2, 2) + bytes([0, 85, 170, 255])
imgs3 = be(2051, 3, 2, 2) + bytes(range(12))
labels = be(2049, 1) + bytes([3])
put("idx", "train-images", b"\x00" + imgs)
put("idx", "train-images-gz", b"\x04" + gz(imgs))
put("idx", "train-labels", b"\x01" + labels)
put("idx", "t10k-labels-gz", b"\x07" + gz(labels))
put("idx", "t10k-images-3", b"\x02" + imgs3)
put("idx", "bad-magic", b"\x00" + be(2049, 1) + b"\x01")
put("idx", "truncated", b"\x00" + be(2051, 10, 28, 28) + bytes(100))
put("idx", "too-long", b"\x01" + be(2049, 1) + bytes([1, 2]))
put("idx", "zero-dim", b"\x00" + be(2051, 0, 2, 2))
put("idx", "huge-dims", b"\x00" + be(2051, 0x7FFFFFFF, 0xFFFF, 0xFFFF))
put("idx", "gz-truncated", b"\x04" + gz(imgs)[:-6])
put("idx", "label-out-of-range", b"\x01" + be(2049, 1) + bytes([10]))
# Regression: the dimensions' product wrapped to 65536 in 64 bits.
put("idx", "regress-dims-wrap", b"\x00" + be(2051, 2, 4294901761, 2147516416) + bytes(64))

# ---- cifar: byte 0 mod 6 = which file (data_batch_1..5.bin, test_batch.bin)
rec = bytes([4]) + bytes((i * 7) % 256 for i in range(3072))
put("cifar", "batch1-one", b"\x00" + rec)
put("cifar", "test-two-gz", b"\x05" + gz(rec + rec))
put("cifar", "partial-record", b"\x02" + rec[:1000])
put("cifar", "bad-label", b"\x01" + bytes([10]) + rec[1:])
put("cifar", "empty", b"\x03")
put("cifar", "gz-corrupt", b"\x04" + gz(rec)[:20] + b"\xff" * 30)

# ---- tokens: byte 0 -> T = 1 + b % 16, byte 1 -> vocab = 1 + b * 257; then the shard
def shard(tokens, magic=20240520, version=1, count=None, width="H"):
    hdr = [magic, version, len(tokens) if count is None else count] + [0] * 253
    return struct.pack("<256i", *hdr) + struct.pack("<%d%s" % (len(tokens), width), *tokens)


toks = [i % 50 for i in range(40)]
put("tokens", "valid", bytes([3, 1]) + shard(toks))
put("tokens", "valid-gz", bytes([7, 1]) + gz(shard(toks)))
put("tokens", "token-beyond-vocab", bytes([3, 0]) + shard(toks))
put("tokens", "bad-magic", bytes([3, 1]) + shard(toks, magic=1))
put("tokens", "version-2", bytes([3, 1]) + shard(toks, version=2))
put("tokens", "count-too-big", bytes([3, 1]) + shard(toks, count=0x7FFFFFFF))
put("tokens", "count-negative", bytes([3, 1]) + shard(toks, count=-1))
put("tokens", "short-header", bytes([3, 1]) + shard(toks)[:100])
put("tokens", "too-few-for-T", bytes([15, 1]) + shard(toks[:5]))
# llm.c's uint32 shards (magic 20240801, version 7): ids up to the vocabulary, beyond 65,535
put("tokens", "valid-u32", bytes([3, 255]) + shard([i * 1601 for i in range(40)], 20240801, 7, width="I"))
put("tokens", "u32-version-1", bytes([3, 255]) + shard(toks, 20240801, 1, width="I"))
put("tokens", "u32-truncated", bytes([3, 255]) + shard(toks, 20240801, 7, width="I")[:1100])

# ---- csv: byte 0 -> --val-fraction (bits 0-1: none, 0.2, 0.5, 0.9), seed (bits 2-7); then
# the table, whose label column is "y"
iris = ("sepal,petal,y\r\n5.1,1.4,setosa\r\n7.0,4.7,versicolor\r\n6.3,6.0,virginica\r\n"
        "4.9,1.5,setosa\r\n6.4,4.5,versicolor\r\n")
put("csv", "strings", b"\x00" + iris.encode())
put("csv", "val-fraction", b"\x05" + iris.encode())
put("csv", "gz", b"\x02" + gz(iris.encode()))
put("csv", "integers-quoted", b"\x00" + b'a,"b,c",y\n1,"2",10\n"3",4e-1,9\n5,-6,"-1"\n\n\n')
put("csv", "bom-blank-lines", b"\x00\xef\xbb\xbfx,y\n\n1,a\n\n2,b\n")
put("csv", "ragged", b"\x00a,b,y\n1,2,p\n3,q\n")
put("csv", "not-a-number", b"\x00a,y\n1,p\nfour,q\n")
put("csv", "duplicate-columns", b"\x00a,a,y\n1,2,p\n")
put("csv", "no-label-column", b"\x00a,b\n1,2\n")
put("csv", "header-only", b"\x00a,y\n")
put("csv", "empty", b"\x00")
put("csv", "open-quote", b"\x00a,y\n1,\"p\n2,q\n")
put("csv", "huge-values", b"\x00a,y\n3e38,p\n-3e38,q\n3e38,q\n")


# ---- image: byte 0 -> channels (bit 0: 1 or 3), the model's H x W (bits 1-3), the crop's seed
# (bits 4-7); then a PNG or JPEG file. PNGs are built here (zlib); the JPEGs are small files
# TurboJPEG wrote (gray, RGB 4:2:0, CMYK, progressive RGB 4:4:4), kept as bytes.
def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(w, h, color_type, depth, rows, plte=b"", trns=b"", interlace=0, gamma=None, after=b""):
    """rows: the filtered scanlines (each a filter byte, then the row's bytes), joined."""
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, interlace))
    if gamma is not None:
        out += png_chunk(b"gAMA", struct.pack(">I", gamma))
    if plte:
        out += png_chunk(b"PLTE", plte)
    if trns:
        out += png_chunk(b"tRNS", trns)
    return out + png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b"") + after


def scan(h, row):
    return b"".join(b"\x00" + row(y) for y in range(h))


gray = png(5, 3, 0, 8, scan(3, lambda y: bytes((x * 50 + y * 20) % 256 for x in range(5))))
rgb = png(4, 4, 2, 8, scan(4, lambda y: bytes((x * 60 + c * 80 + y) % 256 for x in range(4) for c in range(3))))
rgba = png(3, 2, 6, 8, scan(2, lambda y: bytes([200, 10, 30, 0, 5, 250, 60, 128, 9, 9, 9, 255])[:12]))
put("image", "png-gray", b"\x00" + gray)
put("image", "png-rgb-to-gray", b"\x02" + rgb)
put("image", "png-rgba", b"\x05" + rgba)
put("image", "png-gray-alpha", b"\x07" + png(2, 2, 4, 8, scan(2, lambda y: bytes([40, 0, 250, 255]))))
put("image", "png-palette-trns", b"\x09" + png(4, 2, 3, 2, scan(2, lambda y: bytes([0b00011011])),
                                                plte=bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9]),
                                                trns=bytes([0, 128])))
put("image", "png-gray-1bit", b"\x0b" + png(9, 2, 0, 1, scan(2, lambda y: bytes([0b10101010, 0b10000000]))))
put("image", "png-rgb-16bit", b"\x0d" + png(2, 2, 2, 16, scan(2, lambda y: bytes(range(y, y + 12)))))
put("image", "png-gamma", b"\x01" + png(5, 3, 0, 8, scan(3, lambda y: bytes([y * 40] * 5)), gamma=100000))
put("image", "png-filters", b"\x03" + png(3, 4, 0, 8, b"".join(bytes([f]) + bytes([7, 70, 170]) for f in range(5))[:16]))
# Adam7: a 3x3 image's passes 1, 4, 6 and 7 (passes 2, 3 and 5 are empty at this size).
put("image", "png-interlaced", b"\x10" + png(3, 3, 0, 8, b"\x00\x0a" + b"\x00\x14" + b"\x00\x1e\x28" +
                                              b"\x00\x32\x3c\x46" + b"\x00\x50\x5a\x64", interlace=1))
put("image", "png-data-after-iend", b"\x00" + png(5, 3, 0, 8, scan(3, lambda y: bytes(5)), after=b"\x00" * 100))
put("image", "png-truncated", b"\x00" + gray[:-20])
put("image", "png-bad-crc", b"\x00" + gray[:40] + bytes([gray[40] ^ 0xff]) + gray[41:])
put("image", "png-huge", b"\x00" + png(1 << 20, 1 << 20, 0, 8, b"\x00" * 10))
put("image", "png-zero-width", b"\x00" + png(0, 3, 0, 8, b""))
JPEG_GRAY_8 = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300080606070605080707070909080a0c140d0c0b0b0c1912"
    "130f141d1a1f1e1d1a1c1c20242e2720222c231c1c2837292c30313434341f27393d38323c2e333432ffc0000b080008"
    "000801011100ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b51000020103"
    "03020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f024336272"
    "82090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475"
    "767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9"
    "cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffda0008010100003f00698ac6cb4b9ece00"
    "963a1ba6d4217179a885e19635241d8c5946319c72c543328fffd9")
JPEG_RGB_420 = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb0043000d090a0b0a080d0b0a0b0e0e0d0f13201513121213271c"
    "1e17202e2931302e292d2c333a4a3e333646372c2d405741464c4e525352323e5a615a50604a51524fffdb0043010e0e"
    "0e131113261515264f352d354f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f4f"
    "4f4f4f4f4f4f4f4f4f4f4f4f4f4fffc0001108000c001003012200021101031101ffc4001f0000010501010101010100"
    "000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d010203000411051221"
    "31410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a"
    "434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a9293949596979899"
    "9aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1"
    "f2f3f4f5f6f7f8f9faffc4001f0100030101010101010101010000000000000102030405060708090a0bffc400b51100"
    "020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109233352f015"
    "6272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a63646566676869"
    "6a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4"
    "c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f0045"
    "511ec8d62ea42f94ac067a2ecc838e06d4ce33feb6877219c8918023929f297cfcdbb031ea5863f8a48fd2a4b7851ee4"
    "db8255230a8b83d8b88cf5f6ddcfabb1fa5679dcc048f94fca72a48e5823138e80e64cf1fdd5f4a6d5d5fbfea1657e5f"
    "ebb9ffd9")
JPEG_CMYK = bytes.fromhex(
    "ffd8ffee000e41646f626500640000000002ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123251d"
    "283a333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffdb00430111121218"
    "15182f1a1a2f634238426363636363636363636363636363636363636363636363636363636363636363636363636363"
    "636363636363636363636363ffc00014080008000804011100021101031101041100ffc4001f00000105010101010101"
    "00000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d0102030004110512"
    "2131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a343536373839"
    "3a434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a92939495969798"
    "999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9ea"
    "f1f2f3f4f5f6f7f8f9faffc4001f0100030101010101010101010000000000000102030405060708090a0bffc400b511"
    "00020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109233352f0"
    "156272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a636465666768"
    "696a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3"
    "c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000e04010002110311040000"
    "3f005455570e18c8db8146739dc4640cfa82db9fe82935369a7a6f7fbfb74bbb2bab6d6ee2734f5fc7b69e7b5a3ab4d5"
    "aef71238a22de5c722a9c2b007692010db588e870a1e4e307711e95fffd9")
JPEG_RGB_444_PROGRESSIVE = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb00430006040506050406060506070706080a100a0a09090a140e"
    "0f0c1017141818171416161a1d251f1a1b231c1616202c20232627292a29191f2d302d283025282928ffdb0043010707"
    "070a080a130a0a13281a161a282828282828282828282828282828282828282828282828282828282828282828282828"
    "2828282828282828282828282828ffc20011080007000903011100021101031101ffc400150001010000000000000000"
    "0000000000000001ffc400160101010100000000000000000000000000040103ffda000c030100021003100000015c61"
    "1dffc4001810000203000000000000000000000000000203000115ffda0008010100010502a0250ed2a7ffc4001f1100"
    "000309000000000000000000000000000102041214213153a2c1f1ffda0008010301013f0125c9d5d3bb310ec57b131f"
    "ffc40020110000040603000000000000000000000000010212030411132153a1b1c1ffda0008010201013f014b63aaa5"
    "85174ef5a2ccfede087fffc4001c1000010305000000000000000000000000010012a1021133c2e1ffda000801010006"
    "3f0268b34802291b158a78bfffc400191000020301000000000000000000000000000111215161ffda0008010100013f"
    "2140b8851ab87217ffda000c030100020003000000106fffc4001a110101000203000000000000000000000001112131"
    "104151ffda0008010301013f1014e502136610793236b34f5c27ffc4001a110101000203000000000000000000000001"
    "110051314161ffda0008010201013f106eba5b17846bc5354eeb9bffc4001b1001000202030000000000000000000000"
    "01001121415181f1ffda0008010100013f10beea5428a21c72f7baa9ec67ffd9")
put("image", "jpeg-gray", b"\x00" + JPEG_GRAY_8)
put("image", "jpeg-gray-to-rgb", b"\x1f" + JPEG_GRAY_8)
put("image", "jpeg-rgb-420", b"\x21" + JPEG_RGB_420)
put("image", "jpeg-rgb-to-gray", b"\x40" + JPEG_RGB_420)
put("image", "jpeg-cmyk", b"\x01" + JPEG_CMYK)
put("image", "jpeg-progressive", b"\x33" + JPEG_RGB_444_PROGRESSIVE)
put("image", "jpeg-truncated", b"\x00" + JPEG_RGB_420[:len(JPEG_RGB_420) // 2])
put("image", "jpeg-no-eoi", b"\x00" + JPEG_GRAY_8[:-2])
put("image", "jpeg-huge", b"\x00" + JPEG_GRAY_8.replace(b"\xff\xc0\x00\x0b\x08\x00\x08\x00\x08",
                                                         b"\xff\xc0\x00\x0b\x08\xff\xff\xff\xff"))
put("image", "jpeg-corrupt-data", b"\x00" + JPEG_RGB_420[:-40] + bytes(range(38)) + b"\xff\xd9")
put("image", "not-an-image", b"\x00" + b"P5 2 2 255\n\x00\x01\x02\x03")
put("image", "empty", b"\x00")


# ---- safetensors: byte 0 even = convnet's store, odd = a GPT's tensor-parallel part
def st(entries, meta=True, pad=True):
    h = {"__metadata__": {"format": "pt"}} if meta else {}
    off, blob = 0, b""
    for name, dtype, shape, data in entries:
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blob += data
    hs = json.dumps(h).encode()
    if pad:
        hs += b" " * ((8 - (len(hs) + 8) % 8) % 8)
    return struct.pack("<Q", len(hs)) + hs + blob


put("safetensors", "empty-header", b"\x00" + st([]))
put("safetensors", "unknown-tensor", b"\x00" + st([("nope", "F32", [2], bytes(8))]))
put("safetensors", "wrong-shape", b"\x00" + st([("conv1.weight", "F32", [1], bytes(4))]))
put("safetensors", "gpt-wte", b"\x01" + st([("transformer.wte.weight", "F32", [16, 8], bytes(512))]))
put("safetensors", "gpt-lm-head", b"\x01" + st([("lm_head.weight", "F32", [16, 8], bytes(512))]))
put("safetensors", "gpt-attn-split", b"\x01" + st([("transformer.h.0.attn.c_attn.weight", "F32", [24, 8], bytes(768))]))
put("safetensors", "i64-counter", b"\x00" + st([("bn1.num_batches_tracked", "I64", [], bytes(8))]))
put("safetensors", "bad-offsets", b"\x01" + st([("transformer.wte.weight", "F32", [16, 8], bytes(16))])[:-8])
put("safetensors", "header-too-long", b"\x00" + struct.pack("<Q", 1 << 40) + b"{}")
put("safetensors", "not-json", b"\x00" + struct.pack("<Q", 4) + b"{x:}")
put("safetensors", "short", b"\x00\x01\x02")
put("safetensors", "negative-shape",
    b"\x01" + st([("transformer.wte.weight", "F32", [-16, -8], bytes(512))]))

# ---- hardware: the --gpu FILE
cluster = {
    "name": "my-cluster", "gpus_per_node": 8, "memory_gib": 80, "memory_bandwidth_gbs": 2039,
    "peak_tflops": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
    "intra_node": {"bandwidth_gbs": 300, "latency_us": 3},
    "inter_node": {"bandwidth_gbs": 25, "latency_us": 8},
}
put("hardware", "cluster.json", json.dumps(cluster, indent=1))
put("hardware", "base.json", '{"base": "a100-80gb", "inter_node": {"bandwidth_gbs": 12.5}}')
put("hardware", "fp8.json", '{"base": "mi300x", "gpus_per_node": 4, "peak_tflops": {"fp8": 0, "bf16": 1000}}')
put("hardware", "full.json", json.dumps(dict(cluster, gpu=False, tf32_matmul=True,
                                             p2p_intra_node={"bandwidth_gbs": 100, "latency_us": 1},
                                             p2p_inter_node={"bandwidth_gbs": 10, "latency_us": 2},
                                             efficiency={"gemm_max": 0.9, "gemm_half_flops": 1e8, "memory_eff": 0.7,
                                                         "kernel_overhead_us": 4, "comm_eff": 0.95})))
put("hardware", "missing-key.json", '{"name": "x", "gpus_per_node": 8}')
put("hardware", "typo.json", '{"base": "h100-sxm", "inter_node": {"bandwith_gbs": 1}}')
put("hardware", "syntax.json", '{"base": "h200",, }')
put("hardware", "huge.json", '{"base": "h200", "memory_gib": 1e308, "peak_tflops": {"fp32": 1e300}}')
put("hardware", "deep.json", "[" * 300 + "]" * 300)
put("hardware", "escapes.json", '{"name": "\\ud83d\\ude00 \\u0000 \\"q\\"", "base": "a100-40gb"}')

# ---- model: --model strings
for i, s in enumerate(["mlp", "convnet", "resnet18", "gpt-mini", "gpt2-124m", "mlp:784-1024-1024-10", "mlp:3-2",
                       "resnet:34", "gpt:layers=2,heads=2,width=8,context=4,vocab=16,dropout=0.1",
                       "gpt:layers=1,heads=3,width=8,context=4,vocab=16", "gpt:layers=1", "mlp:784--10",
                       "mlp:99999999999999999999-1", "resnet:50",
                       "gpt:layers=1,heads=1,width=8,context=4,vocab=16,dropout=0.99999999",
                       "gpt:layers=1,heads=1,width=8,context=4,vocab=16,dropout=0.99999992", "gpt:layers=1,layers=2", "gpt:heads=100000000,"
                       "layers=1,width=100000000,context=100000000,vocab=1", "unknown:x", ":"]):
    put("model", "m%02d" % i, s)

# ---- layout: --layout strings
for i, s in enumerate(["dp=2,tp=4,pp=8,micro=1,schedule=interleaved,v=2,recompute=full,sp=on,zero=1", "tp=2",
                       "zero=3", "sp=off", "schedule=gpipe", "micro=99999999999999999999", "dp=0", "dp", "=3",
                       "dp=2,,tp=2", "", "recompute=selective,schedule=1f1b", "zero=4", "dp=2,dp=4", "pp=-1",
                       "dp=2147483648", "tp=+2"]):
    put("layout", "l%02d" % i, s)

# ---- tune_cache: a tune.json of the layout tuning
choice = {"dp": 2, "tp": 1, "pp": 1, "micro_batch": 16, "accum": 2, "schedule": "1f1b", "virtual_stages": 1,
          "recompute": "none", "sequence_parallel": False, "zero": 0, "planner_rank": 1,
          "measured_samples_per_second": 1234.5, "predicted_samples_per_second": 1300.25, "reason": "fastest"}
put("tune_cache", "choice.json", json.dumps({"kind": "layout", "layout_choice": choice}, indent=2))
put("tune_cache", "pp.json", json.dumps({"layout_choice": dict(choice, pp=4, schedule="interleaved",
                                                              virtual_stages=2)}))
put("tune_cache", "zero-dp.json", json.dumps({"layout_choice": dict(choice, dp=0)}))
put("tune_cache", "negative.json", json.dumps({"layout_choice": dict(choice, tp=-3, micro_batch=-1)}))
put("tune_cache", "huge.json", json.dumps({"layout_choice": dict(choice, dp=9007199254740992, accum=1e300)}))
put("tune_cache", "batch-cache.json", json.dumps({"choice": {"micro_batch": 32, "accum": 1, "lr": 0.01}}))
put("tune_cache", "batch-choice.json", json.dumps({"model": "mlp", "choice": {
    "micro_batch": 48, "accum": 2, "global_batch": 96, "zero": 1, "recompute": "selective", "lr": 0.02,
    "lr_rule": "linear (SGD)", "warmup_fraction": 0.05, "reason": "the knee of the throughput curve"}}))
put("tune_cache", "strings.json", '{"a": ["\\u00e9", "\\ud800", 1.5e-320, -0, 1E+2, true, null], "b": {}}')
put("tune_cache", "bad.json", '{"layout_choice": {"dp": 1,}}')
put("tune_cache", "bom.json", "\ufeff{}")

# ---- manifest: the manifests of two real runs (kept in the corpus; rewrite them with
#   saturate train --model mlp:784-8-10 --data synthetic --steps 2 --checkpoint-dir A --eval off --threads 1
#   mpirun -np 2 saturate train --model gpt:layers=1,heads=2,width=8,context=4,vocab=16 --data synthetic \
#          --batch 2 --steps 2 --tp 2 --optimizer sgd --checkpoint-dir B --eval off --threads 1
# and copy A/step-00000002/manifest.json to mlp-adamw.json, B's to gpt-tp2.json), and damaged or
# edited copies of the first. An edited copy keeps its old checksum, which no longer matches
# (fuzz_manifest.cpp also tries each input with a matching one, to reach the field checks).
def manifest_edits():
    path = os.path.join(ROOT, "manifest", "mlp-adamw.json")
    with open(path) as f:
        text = f.read()
    good = json.loads(text)

    def edited(name, edit):
        m = json.loads(text)
        edit(m)
        put("manifest", name, json.dumps(m, indent=1, sort_keys=True))

    put("manifest", "truncated.json", text[:200])
    edited("bad-float-step.json", lambda m: m.update(step=1e30))
    edited("bad-file-name.json", lambda m: m.update(files={"../../etc/passwd": m["files"]["rank-00000.safetensors"]}))
    edited("bad-piece.json", lambda m: m["tensors"]["optim/exp_avg/fc1.bias"]["pieces"][0].update(
        dim=0, parts=3, index=2, stride=1))
    edited("no-checksum.json", lambda m: m.pop("checksum"))
    edited("old-version.json", lambda m: (m.update(version=1), m.pop("checksum"), m.pop("settings")))
    edited("edited-step.json", lambda m: m.update(step=15))
    edited("edited-optimizer-steps.json", lambda m: m["optimizer"].update(steps=1))
    edited("edited-epoch.json", lambda m: m.update(epoch=1, step_in_epoch=0))
    edited("edited-losses.json", lambda m: m["losses"].append(1.0))
    edited("edited-global-batch.json", lambda m: m.update(global_batch=2 * good["global_batch"]))
    edited("edited-settings.json", lambda m: m["settings"].update(seed="7", lr="0.5"))
    edited("edited-slots.json", lambda m: m["optimizer"].update(slots=["momentum_buffer"]))
    edited("edited-layout.json", lambda m: m["layout"].update(world=3))


manifest_edits()

# ---- resume: LIST '\n' RECORD (fuzz_resume.cpp): --resume-change's value, then a settings
# record compared with a real run's.
RUN = ("model=mlp:784-1024-1024-10;model_config=input 784, hidden widths 1024, 1024, 10 classes;vocab=0;seq_len=0;"
       "classes=10;data=synthetic train;normalize=pixels/255;train_samples=10000;test_samples=-1;batch=64;accum=1;"
       "epochs=1;steps=10;optimizer=adamw;lr=0.001;momentum=0;nesterov=0;weight_decay=0.01;betas=0.9,0.999,1e-08;"
       "schedule=cosine;warmup=0,0.05;step_size=0;gamma=0.1;seed=0;shuffle=1;eval=0;tp=1;sequence_parallel=0;"
       "recompute=0;pp=1;pp_schedule=2;virtual_stages=1;pp_split=;last_batch=0;bucket_mb=25;sync_bn=0;zero=0;"
       "noise_scale=0;dist_backend=0;device=auto;precision=fp32;cuda_graph=1;checkpoints=1;global_batch=64")


def run_with(**changes):
    fields = dict(f.split("=", 1) for f in RUN.split(";"))
    fields.update(changes)
    return ";".join(k + "=" + v for k, v in fields.items())


put("resume", "same", "\n" + RUN)
put("resume", "longer-other-layout", "\n" + run_with(steps="40", tp="2", batch="32", accum="2"))
put("resume", "lr-refused", "\n" + run_with(lr="0.5"))
put("resume", "lr-named", "lr,weight-decay\n" + run_with(lr="0.5", weight_decay="0.1"))
put("resume", "data-normalize", "data,normalize\n" + run_with(data="mnist train", train_samples="60000",
                                                                normalize="(pixels/255 - 0.5)/0.5"))
put("resume", "optimizer-never", "optimizer\n" + run_with(optimizer="sgd"))
put("resume", "unknown-key", "\n" + RUN + ";mystery=1")
put("resume", "bad-list", "lr,,bogus\n" + RUN)
put("resume", "empty", "")
put("resume", "no-equals", "\nlr;steps=;=5;;")

# ---- config: --config FILE.toml into train's flags (fuzz_config.cpp)
put("config", "small.toml", 'model = "mlp"\nbatch = 16\nsteps = 2\nlr = 0.01\nshuffle = "off"\n')
put("config", "tables.toml", '[model]\nmodel = "gpt-mini"\nseq_len = 32\n[training]\noptimizer = "adamw"\n'
    'betas = "0.9,0.95"\nclip-grad-norm = 1.0\npp-split = [1, 2]\n')
put("config", "switch.toml", 'overwrite = true\nsequence-parallel = false\nprofile = true\n')
put("config", "wrong-type.toml", 'batch = "sixteen"\n')
put("config", "unknown-key.toml", 'batchsize = 16\n')
put("config", "twice.toml", 'lr = 0.1\nlr = 0.2\n')
put("config", "syntax.toml", 'model = "mlp\n[[x]\n= 3\n')
put("config", "huge.toml", 'steps = 99999999999999999999\nlr = 1e400\n')
put("config", "empty.toml", '')
put("config", "out.toml", 'out = "run"\ncheckpoint-dir = "ck"\nmodel = "mlp"\n')
