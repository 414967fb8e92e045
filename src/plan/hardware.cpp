#include "plan/hardware.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <optional>

#include "core/error.h"
#include "core/json.h"

namespace sat {

namespace {

constexpr double kMiB = 1048576.0, kGiB = 1073741824.0;
constexpr double kTflops = 1e12, kGBs = 1e9;

// A unit of the file format: SI = figure * size, or figure / size for a small unit (us), so
// that the figures people write (3 us, 494.7 TFLOP/s) convert exactly both ways.
struct Unit {
  double size;
  bool small = false;
  constexpr double to_si(double x) const { return small ? x / size : x * size; }
  constexpr double from_si(double x) const { return small ? x * size : x / size; }
};
constexpr Unit kOne{1}, kInTflops{kTflops}, kInGBs{kGBs}, kInGiB{kGiB}, kInMiB{kMiB}, kInUs{1e6, true};

// The built-in kinds, as one GPU of a typical node of its kind. Peaks are dense: vendor
// sheets mark figures with structured (2:4) sparsity with an asterisk, and the dense rate is
// half of that. bf16/fp16 are tensor rates with fp32 accumulation (what training uses), fp8
// likewise (0: the device has none). Link bandwidths are per GPU and per direction (vendor
// NVLink totals count both directions). Sources, by kind:
//   l4: NVIDIA L4 Tensor Core GPU datasheet (2023): FP32 30.3 TFLOP/s; TF32 120*, BF16/FP16
//     242*, FP8 485* (sparse); 24 GB GDDR6, 300 GB/s; PCIe Gen4 x16, no NVLink. Node: AWS
//     g6.48xlarge (8 L4, 100 Gbps) and GCP g2-standard-96 (8 L4): 8 per node.
//   a10: NVIDIA A10 Tensor Core GPU datasheet (2021): FP32 31.2; TF32 62.5, BF16/FP16 125
//     (dense; 125*, 250* sparse); no FP8; 24 GB GDDR6, 600 GB/s; PCIe Gen4 x16. Node: OCI
//     BM.GPU.A10.4 (4 A10, 2 x 50 Gbps): 4 per node.
//   a10g: AWS's variant (no NVIDIA datasheet): FP32 31.52; TF32 35, BF16/FP16 70 (dense);
//     24 GB GDDR6, 600 GB/s (Baseten, "NVIDIA A10 vs A10G for ML model inference", 2023).
//     Node: AWS g5.48xlarge (8 A10G over PCIe Gen4, 100 Gbps).
//   l40s: NVIDIA L40S datasheet (2023): FP32 91.6; TF32 183, BF16/FP16 362.05, FP8 733
//     (dense; 366*, 733*, 1,466* sparse); 48 GB GDDR6, 864 GB/s; PCIe Gen4 x16 (64 GB/s both
//     ways), no NVLink. Node: AWS g6e.48xlarge (8 L40S, 400 Gbps).
//   rtx-4090: NVIDIA Ada Lovelace architecture whitepaper (2022), appendix: FP32 82.6; TF32
//     82.6, BF16 and FP16 with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3 (GeForce
//     runs FP32 accumulation at half the FP16-accumulate rate); 24 GB GDDR6X, 1,008 GB/s; PCIe
//     Gen4 x16. Its driver allows no peer-to-peer copies, so NCCL stages through host memory:
//     the PCIe figure is an upper bound. Node: 8 cards in a PCIe server as rented (a
//     workstation has 2 to 4: --gpus-per-node), 100 Gb/s Ethernet per node (an assumption).
//   rtx-a6000: NVIDIA RTX A6000 datasheet (2020): FP32 38.7, tensor 309.7* (sparse BF16/FP16
//     with FP32 accumulate: 154.8 dense); NVIDIA Ampere GA102 whitepaper (2020): TF32 77.4
//     dense; no FP8; 48 GB GDDR6 ECC, 768 GB/s; PCIe Gen4 x16. Its NVLink bridge joins pairs
//     only: an 8-GPU node is modelled on PCIe. Node: 8 per PCIe server, 100 Gb/s per node
//     (an assumption).
//   a100-40gb, a100-80gb: NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5, TF32 156,
//     BF16/FP16 312 (dense); no FP8; 1,555 GB/s (40GB) and 2,039 GB/s (80GB SXM); NVLink
//     600 GB/s. DGX A100 user guide: eight ConnectX-6 HDR InfiniBand, 200 Gb/s, one per GPU.
//   h100-sxm: NVIDIA H100 datasheet (2023, SXM): FP32 67; TF32 989*, BF16/FP16 1,979*, FP8
//     3,958* (494.7, 989.4 and 1,978.9 dense, the Hopper whitepaper's); 3.35 TB/s; NVLink
//     900 GB/s. DGX H100 user guide: eight ConnectX-7 NDR, 400 Gb/s, one per GPU.
//   h100-pcie: the same datasheet (PCIe): FP32 51; TF32 756*, BF16/FP16 1,513*, FP8 3,026*;
//     80 GB HBM2e, 2 TB/s; PCIe Gen5 x16 128 GB/s both ways (its NVLink bridge joins pairs
//     only). Node: 8 per PCIe server, one 200 Gb/s NIC per GPU (an assumption).
//   h200: NVIDIA H200 datasheet (2024, SXM): the H100 SXM's FLOP/s; 141 GB HBM3e at 4.8
//     TB/s; NVLink 900 GB/s. DGX H200 user guide: eight ConnectX-7 NDR, 400 Gb/s.
//   b200: NVIDIA HGX B200 specifications (2025), one GPU: FP32 75; TF32 2.2 P*, BF16/FP16
//     4.5 P*, FP8 9 P* (sparse); 180 GB HBM3e, 7.7 TB/s; NVLink 5 1.8 TB/s. DGX B200 user
//     guide: eight ConnectX-7, 400 Gb/s, one per GPU.
//   mi300x: AMD Instinct MI300X data sheet (2023): FP32 163.4; TF32 653.7, BF16/FP16 1,307.4,
//     FP8 2,614.9 (dense); 192 GB HBM3, 5.3 TB/s; Infinity Fabric: 7 links of 128 GB/s (both
//     ways) to the other 7 GPUs of an 8-GPU platform, 448 GB/s each way in all. Network: eight
//     400 Gb/s NICs per 8-GPU node (Azure ND MI300X v5).
// PCIe-only cards take PCIe Gen4 x16's 32 GB/s (Gen5: 64 GB/s) each way for the intra-node
// link; a network of N Gb/s per node shared by G GPUs gives N / 8 / G GB/s per GPU.
// Memory is the capacity nvidia-smi (rocm-smi) reports, in MiB: L4 23034, A10 and A10G 23028,
// L40S 46068, RTX 4090 24564, RTX A6000 49140, A100-SXM4-40GB 40960, A100-SXM4-80GB 81920,
// H100 80GB HBM3 and H100 PCIe 81559, H200 143771, B200 183359, MI300X 196288
// (205,822,885,888 bytes): the H200's "141 GB" is 140.4 GiB, the B200's "180 GB" 179.1 GiB,
// the MI300X's "192 GB" 191.7 GiB.
// Latency of one message: NCCL's own cost model (src/graph/tuning.cc, hwLat) charges a ring
// step 0.6 (LL) to 3.4 us (Simple) over NVLink and 2.7 to 14 us over the network; we take
// 3 us and 8 us, the range nccl-tests' small-message all-reduces show (PCIe and Infinity
// Fabric take NVLink's 3 us).
// Efficiencies: fitted by `saturate plan --calibrate bench/plan/published/sc21-table1.json
// --gpu a100-80gb` (Narayanan et al., SC21, Table 1: ten GPT runs of 1.7B to 1T parameters on
// 32 to 3072 A100s; docs/planning.md, "Calibration") with a GEMM's shape counted at a half-rate
// dimension of 64 (gemm_half_dim: a head's 96 or 128 channels, a tensor-parallel slice of a
// few hundred): GEMMs at 0.825 of peak at large sizes, memory-bound kernels at 0.77 of the
// bandwidth, collectives at the full link bandwidth. The half-rate dimension of 64 is the one
// of 0, 32, 64 and 128 that fitted Table 1 best (median error 3.4%, 2.9%, 1.7%, 4.2% before the
// refit) and that puts one layer of Korthikanti et al.'s 22B model within 4% of their Table 4
// under its five recomputation and sequence-parallel variants (--engine megatron). No other kind has a published
// calibration set here: every kind takes the A100's fractions, uncalibrated.
constexpr Efficiency kFitted{0.8254, 1e9, 0.7668, 5e-6, 1.0, 64};
struct Builtin {
  const char* name;
  double fp32, tf32, bf16, fp16, fp8;  // TFLOP/s, dense
  double memory_mib, memory_gbs;
  int gpus_per_node;
  double intra_gbs, network_gbs;  // per GPU, each way
};
// Per-GPU network shares: 100 Gb/s over 8 GPUs 1.5625 GB/s, over 4 GPUs 3.125; 400 Gb/s
// over 8 6.25.
constexpr Builtin kBuiltins[] = {
    {"l4", 30.3, 60, 121, 121, 242.5, 23034, 300, 8, 32, 1.5625},
    {"a10", 31.2, 62.5, 125, 125, 0, 23028, 600, 4, 32, 3.125},
    {"a10g", 31.52, 35, 70, 70, 0, 23028, 600, 8, 32, 1.5625},
    {"l40s", 91.6, 183, 362.05, 362.05, 733, 46068, 864, 8, 32, 6.25},
    {"rtx-4090", 82.6, 82.6, 165.2, 165.2, 330.3, 24564, 1008, 8, 32, 1.5625},
    {"rtx-a6000", 38.7, 77.4, 154.8, 154.8, 0, 49140, 768, 8, 32, 1.5625},
    {"a100-40gb", 19.5, 156, 312, 312, 0, 40960, 1555, 8, 300, 25},
    {"a100-80gb", 19.5, 156, 312, 312, 0, 81920, 2039, 8, 300, 25},
    {"h100-sxm", 67, 494.7, 989.4, 989.4, 1978.9, 81559, 3350, 8, 450, 50},
    {"h100-pcie", 51, 378, 756.5, 756.5, 1513, 81559, 2000, 8, 64, 25},
    {"h200", 67, 494.7, 989.4, 989.4, 1978.9, 143771, 4800, 8, 450, 50},
    {"b200", 75, 1100, 2250, 2250, 4500, 183359, 7700, 8, 900, 50},
    {"mi300x", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 196288, 5300, 8, 448, 50},
};
constexpr double kLinkAlpha = kInUs.to_si(3), kNetworkAlpha = kInUs.to_si(8);

Hardware from_builtin(const Builtin& b) {
  Hardware h;
  h.name = b.name;
  h.source = "built-in";
  h.gpu = true;
  h.peak_fp32 = b.fp32 * kTflops, h.peak_tf32 = b.tf32 * kTflops;
  h.peak_bf16 = b.bf16 * kTflops, h.peak_fp16 = b.fp16 * kTflops, h.peak_fp8 = b.fp8 * kTflops;
  h.memory_bytes = b.memory_mib * kMiB;
  h.memory_bandwidth = b.memory_gbs * kGBs;
  h.gpus_per_node = b.gpus_per_node;
  h.intra = {kLinkAlpha, b.intra_gbs * kGBs};
  h.inter = {kNetworkAlpha, b.network_gbs * kGBs};
  h.p2p_intra = h.intra, h.p2p_inter = h.inter, h.intra_busy = h.intra;
  h.eff = kFitted;
  return h;
}

const Builtin* find_builtin(const std::string& name) {
  for (const auto& b : kBuiltins)
    if (name == b.name) return &b;
  return nullptr;
}

// "l4, a10, ..., mi300x" + last
std::string builtin_list(const char* last) {
  std::string s;
  for (const auto& b : kBuiltins) s += str_cat(b.name, &b == &kBuiltins[std::size(kBuiltins) - 1] ? "" : ", ");
  return s + last;
}

// ---- reading the file format ------------------------------------------------------------

enum class Range { positive, non_negative, fraction };  // fraction: (0, 1]

// obj[key] in `unit` into x when the key is there; when `required`, a missing key is an error.
void read_number(const JsonRef& obj, const char* key, bool required, Unit unit, Range range, double& x) {
  const std::optional<JsonRef> v = required ? obj.at(key) : obj.find(key);
  if (!v) return;
  const double n = v->number();
  if (range == Range::positive && !(n > 0)) v->fail(str_cat("expected a positive number, got ", n));
  if (range == Range::non_negative && !(n >= 0)) v->fail(str_cat("expected a number >= 0, got ", n));
  if (range == Range::fraction && !(n > 0 && n <= 1)) v->fail(str_cat("expected a fraction in (0, 1], got ", n));
  // In SI units the figure must stay a finite double (1e300 TFLOP/s overflows), and a positive
  // one positive (1e-320 GB/s underflows); hardware_json must be able to write it back.
  const double si = unit.to_si(n);
  if (!std::isfinite(si) || (range != Range::non_negative && !(si > 0)) || (si > 0 && si < 1e-300) || si > 1e300)
    v->fail(str_cat("expected a figure of plausible size, got ", n));
  x = si;
}

void read_bool(const JsonRef& obj, const char* key, bool& x) {
  if (const auto v = obj.find(key)) x = v->boolean();
}

// obj[key] as an object of the listed keys (none when absent and not required).
std::optional<JsonRef> read_section(const JsonRef& obj, const char* key, bool required,
                                    std::initializer_list<std::string_view> keys) {
  const std::optional<JsonRef> s = required ? obj.at(key) : obj.find(key);
  if (!s) return s;
  if (!s->is_object()) s->fail(str_cat("expected an object, got ", JsonRef::type_name(s->value())));
  s->expect_keys(keys);
  return s;
}

void read_link(const JsonRef& obj, const char* key, bool required, Link& link) {
  const auto s = read_section(obj, key, required, {"bandwidth_gbs", "latency_us"});
  if (!s) return;
  read_number(*s, "bandwidth_gbs", required, kInGBs, Range::positive, link.bandwidth);
  read_number(*s, "latency_us", required, kInUs, Range::non_negative, link.alpha);
}

void read_peaks(const JsonRef& obj, bool required, Hardware& h) {
  const auto s = read_section(obj, "peak_tflops", required, {"fp32", "tf32", "bf16", "fp16", "fp8"});
  if (!s) return;
  read_number(*s, "fp32", required, kInTflops, Range::positive, h.peak_fp32);
  read_number(*s, "tf32", required, kInTflops, Range::non_negative, h.peak_tf32);
  read_number(*s, "bf16", required, kInTflops, Range::non_negative, h.peak_bf16);
  read_number(*s, "fp16", required, kInTflops, Range::non_negative, h.peak_fp16);
  // Optional (0: none), so that descriptions written before it existed still read.
  read_number(*s, "fp8", false, kInTflops, Range::non_negative, h.peak_fp8);
}

void read_efficiency(const JsonRef& obj, Efficiency& e) {
  const auto s = read_section(obj, "efficiency", false,
                              {"gemm_max", "gemm_half_flops", "memory_eff", "kernel_overhead_us", "comm_eff", "gemm_half_dim"});
  if (!s) return;
  read_number(*s, "gemm_max", false, kOne, Range::fraction, e.gemm_max);
  read_number(*s, "gemm_half_flops", false, kOne, Range::non_negative, e.gemm_half_flops);
  read_number(*s, "memory_eff", false, kOne, Range::fraction, e.memory_eff);
  read_number(*s, "kernel_overhead_us", false, kInUs, Range::non_negative, e.kernel_overhead);
  read_number(*s, "comm_eff", false, kOne, Range::fraction, e.comm_eff);
  read_number(*s, "gemm_half_dim", false, kOne, Range::non_negative, e.gemm_half_dim);
}

// The point-to-point links are the collectives' unless the file gives them (a base is a
// built-in kind: its links are the same for both).
void read_links(const JsonRef& j, bool required, Hardware& h) {
  read_link(j, "intra_node", required, h.intra);
  read_link(j, "inter_node", required, h.inter);
  h.p2p_intra = h.intra, h.p2p_inter = h.inter, h.intra_busy = h.intra;
  read_link(j, "p2p_intra_node", false, h.p2p_intra);
  read_link(j, "p2p_inter_node", false, h.p2p_inter);
  read_link(j, "intra_node_busy", false, h.intra_busy);
}

void read_cache(const JsonRef& j, Cache& c) {
  const auto s = read_section(j, "cache", false, {"size_mib", "bandwidth_gbs"});
  if (!s) return;
  read_number(*s, "size_mib", true, kInMiB, Range::positive, c.bytes);
  read_number(*s, "bandwidth_gbs", true, kInGBs, Range::positive, c.bandwidth);
}

void read_gpus_per_node(const JsonRef& j, bool required, int& x) {
  const std::optional<JsonRef> g = required ? j.at("gpus_per_node") : j.find("gpus_per_node");
  if (!g) return;
  const int64_t n = g->integer();
  if (n < 1 || n > 1000000) g->fail(str_cat("expected a positive number of devices, got ", n));
  x = int(n);
}

Hardware base_of(const JsonRef& j) {
  const auto b = j.find("base");
  if (!b) return Hardware{};
  const Builtin* k = find_builtin(b->string());
  if (!k) b->fail(str_cat("unknown kind '", b->string(), "' (expected a built-in kind: ", builtin_list(""), ")"));
  return from_builtin(*k);
}

Hardware from_file(const std::string& path) {
  const JsonRef j = JsonRef::parse_file(path, "--gpu");
  if (!j.is_object()) j.fail(str_cat("expected an object, got ", JsonRef::type_name(j.value())));
  j.expect_keys({"name", "base", "gpu", "gpus_per_node", "memory_gib", "memory_bandwidth_gbs", "peak_tflops",
                 "tf32_matmul", "intra_node", "inter_node", "p2p_intra_node", "p2p_inter_node", "intra_node_busy",
                 "cache", "efficiency"});
  Hardware h = base_of(j);
  const bool required = !j.contains("base");  // without a base every figure must be there
  h.name = j.contains("name") ? j.at("name").string() : std::filesystem::path(path).stem().string();
  h.source = path;
  read_bool(j, "gpu", h.gpu);
  read_gpus_per_node(j, required, h.gpus_per_node);
  read_number(j, "memory_gib", required, kInGiB, Range::positive, h.memory_bytes);
  read_number(j, "memory_bandwidth_gbs", required, kInGBs, Range::positive, h.memory_bandwidth);
  read_peaks(j, required, h);
  read_bool(j, "tf32_matmul", h.tf32_matmul);
  read_links(j, required, h);
  read_cache(j, h.cache);
  read_efficiency(j, h.eff);
  return h;
}

// A name that is meant as a file rather than a kind.
bool looks_like_file(const std::string& s) {
  return s.find('/') != std::string::npos || s.ends_with(".json") || std::filesystem::exists(s);
}

// ---- writing ------------------------------------------------------------------------------

JsonValue link_json(const Link& l) {
  return {{"bandwidth_gbs", json_number(kInGBs.from_si(l.bandwidth))}, {"latency_us", json_number(kInUs.from_si(l.alpha))}};
}

bool same_link(const Link& a, const Link& b) { return a.alpha == b.alpha && a.bandwidth == b.bandwidth; }

// "312 TFLOP/s", "95.2 GFLOP/s"
std::string rate(double flops) {
  const char* unit = flops >= 1e12 ? "TFLOP/s" : flops >= 1e9 ? "GFLOP/s" : "MFLOP/s";
  const double scale = flops >= 1e12 ? 1e12 : flops >= 1e9 ? 1e9 : 1e6;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.4g %s", flops / scale, unit);
  return buf;
}

std::string link_text(const Link& l) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.4g GB/s per direction, latency %.3g us", l.bandwidth / kGBs, kInUs.from_si(l.alpha));
  return buf;
}

}  // namespace

double Hardware::peak(DType precision) const {
  switch (precision) {
    case DType::f32: return tf32_matmul && peak_tf32 > 0 ? peak_tf32 : peak_fp32;
    case DType::bf16: return peak_bf16;
    case DType::f16: return peak_fp16;
    default: break;
  }
  fail("Hardware::peak: no FLOP rate for ", dtype_name(precision), " (expected f32, bf16 or f16)");
}

const std::vector<std::string>& hardware_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& b : kBuiltins) v.push_back(b.name);
    return v;
  }();
  return names;
}

Hardware hardware(const std::string& kind_or_file, dist::Comm* world) {
  if (kind_or_file == "this") return measure_this(world);
  if (const Builtin* b = find_builtin(kind_or_file)) return from_builtin(*b);
  SAT_CHECK(looks_like_file(kind_or_file), "--gpu: unknown kind '", kind_or_file, "' (expected ", builtin_list(", this (measure this machine) or a JSON file"), ")");
  return from_file(kind_or_file);
}

std::string hardware_json(const Hardware& h) {
  const auto num = json_number;
  JsonValue j;
  j["name"] = h.name;
  j["gpu"] = h.gpu;
  j["gpus_per_node"] = h.gpus_per_node;
  j["memory_gib"] = num(kInGiB.from_si(h.memory_bytes));
  j["memory_bandwidth_gbs"] = num(kInGBs.from_si(h.memory_bandwidth));
  j["peak_tflops"] = {{"fp32", num(kInTflops.from_si(h.peak_fp32))}, {"tf32", num(kInTflops.from_si(h.peak_tf32))},
                      {"bf16", num(kInTflops.from_si(h.peak_bf16))}, {"fp16", num(kInTflops.from_si(h.peak_fp16))},
                      {"fp8", num(kInTflops.from_si(h.peak_fp8))}};
  j["tf32_matmul"] = h.tf32_matmul;
  j["intra_node"] = link_json(h.intra);
  j["inter_node"] = link_json(h.inter);
  if (!same_link(h.p2p_intra, h.intra)) j["p2p_intra_node"] = link_json(h.p2p_intra);
  if (!same_link(h.p2p_inter, h.inter)) j["p2p_inter_node"] = link_json(h.p2p_inter);
  if (!same_link(h.intra_busy, h.intra)) j["intra_node_busy"] = link_json(h.intra_busy);
  if (h.cache.bytes > 0)
    j["cache"] = {{"size_mib", num(kInMiB.from_si(h.cache.bytes))}, {"bandwidth_gbs", num(kInGBs.from_si(h.cache.bandwidth))}};
  j["efficiency"] = {{"gemm_max", num(h.eff.gemm_max)}, {"gemm_half_flops", num(h.eff.gemm_half_flops)},
                     {"memory_eff", num(h.eff.memory_eff)}, {"kernel_overhead_us", num(kInUs.from_si(h.eff.kernel_overhead))},
                     {"comm_eff", num(h.eff.comm_eff)}};
  if (h.eff.gemm_half_dim > 0) j["efficiency"]["gemm_half_dim"] = num(h.eff.gemm_half_dim);
  return j.dump(2) + "\n";
}

std::string hardware_table(const Hardware& h) {
  std::string s;
  const auto row = [&](const char* label, const std::string& text) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%-15s ", label);
    s += buf + text + "\n";
  };
  const char* dev = h.gpu ? "GPU" : "process";
  row("hardware", str_cat(h.name, " (", h.source, ")"));
  row("devices", str_cat(h.gpu ? "GPUs" : "CPU processes (no GPU)", ", ", h.gpus_per_node, " per node"));
  std::string peaks = "fp32 " + rate(h.peak_fp32);
  for (auto [p, x] : {std::pair{"tf32", h.peak_tf32}, std::pair{"bf16", h.peak_bf16}, std::pair{"fp16", h.peak_fp16},
                      std::pair{"fp8", h.peak_fp8}})
    if (x > 0) peaks += str_cat(", ", p, " ", rate(x));
  row("peak (dense)", peaks + (h.tf32_matmul ? "; fp32 matmuls in tf32" : ""));
  char mem[96];
  std::snprintf(mem, sizeof mem, "%.4g GiB per %s, %.4g GB/s", h.memory_bytes / kGiB, dev, h.memory_bandwidth / kGBs);
  row("memory", mem);
  row("intra-node", link_text(h.intra));
  row("inter-node", link_text(h.inter));
  if (!same_link(h.p2p_intra, h.intra)) row("p2p intra-node", link_text(h.p2p_intra));
  if (!same_link(h.p2p_inter, h.inter)) row("p2p inter-node", link_text(h.p2p_inter));
  if (!same_link(h.intra_busy, h.intra)) row("beside compute", link_text(h.intra_busy) + " (intra-node all-reduce)");
  if (h.cache.bytes > 0) {
    char c[160];
    std::snprintf(c, sizeof c, "%.4g MiB per %s, %.4g GB/s (a stage's parameters that fit stay between micro-batches)",
                  h.cache.bytes / kMiB, dev, h.cache.bandwidth / kGBs);
    row("cache", c);
  }
  char eff[200];
  std::snprintf(eff, sizeof eff,
                "GEMM %.3g of peak at large sizes (half of that at %.3g FLOPs), memory %.3g, collectives %.3g, "
                "%.3g us per kernel",
                h.eff.gemm_max, h.eff.gemm_half_flops, h.eff.memory_eff, h.eff.comm_eff, kInUs.from_si(h.eff.kernel_overhead));
  row("efficiency", eff);
  return s;
}

}  // namespace sat
