// Hardware descriptions for the layout planner (plan/hardware.h): the built-in kinds' figures,
// the JSON file format (every mistake named by file and key, a written description reads
// back the same), and `this` measured: positive, finite figures as one process; under mpirun
// with 2 ranks (CMake runs this binary as hardware_np2) positive fitted latencies and
// bandwidths that every rank agrees on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/timer.h"
#include "mpi_world.h"
#include "plan/hardware.h"
#include "error_of.h"

namespace fs = std::filesystem;
using sat::Hardware;
using sat::hardware;
using sat::test::world;

namespace {

using sat::test::error_of;

// A folder of this process's own (ranks of one job run these tests side by side), removed
// at exit.
struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("sat_hardware_" + std::to_string(getpid()));
  ScratchDir() { fs::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

fs::path scratch_dir() {
  static const ScratchDir d;
  return d.path;
}

std::string write_file(const std::string& name, const std::string& text) {
  const fs::path p = scratch_dir() / name;
  std::ofstream(p) << text;
  return p.string();
}

// The README's example: every figure, no base.
const char* kCluster = R"({
  "name": "my-cluster",
  "gpus_per_node": 8,
  "memory_gib": 80,
  "memory_bandwidth_gbs": 2039,
  "peak_tflops": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
  "intra_node": {"bandwidth_gbs": 300, "latency_us": 3},
  "inter_node": {"bandwidth_gbs": 25, "latency_us": 8}
})";

// The error hardware() gives for cluster.json with `from` replaced by `to` in kCluster.
std::string cluster_error(const std::string& from, const std::string& to) {
  std::string text = kCluster;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  const std::string path = write_file("cluster.json", text);
  const std::string e = error_of([&] { hardware(path); });
  // "FILE:LINE: what", or "FILE:LINE:COL: what" for a syntax error
  EXPECT_EQ(e.rfind(path + ":", 0), 0u) << "the error should start with the file: " << e;
  if (e.rfind(path + ":", 0) != 0) return e;
  const std::string rest = e.substr(path.size() + 1);
  const size_t digits = rest.find_first_not_of("0123456789");
  return digits > 0 && rest.compare(digits, 2, ": ") == 0 ? rest.substr(digits + 2) : rest;
}

void expect_same(const Hardware& a, const Hardware& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.gpu, b.gpu);
  EXPECT_EQ(a.tf32_matmul, b.tf32_matmul);
  EXPECT_EQ(a.gpus_per_node, b.gpus_per_node);
  const double x[] = {a.peak_fp32, a.peak_tf32, a.peak_bf16, a.peak_fp16, a.peak_fp8, a.memory_bytes, a.memory_bandwidth,
                      a.intra.alpha, a.intra.bandwidth, a.inter.alpha, a.inter.bandwidth, a.p2p_intra.alpha,
                      a.p2p_intra.bandwidth, a.p2p_inter.alpha, a.p2p_inter.bandwidth, a.intra_busy.alpha, a.intra_busy.bandwidth, a.cache.bytes, a.cache.bandwidth, a.eff.gemm_max,
                      a.eff.gemm_half_flops, a.eff.memory_eff, a.eff.kernel_overhead, a.eff.comm_eff};
  const double y[] = {b.peak_fp32, b.peak_tf32, b.peak_bf16, b.peak_fp16, b.peak_fp8, b.memory_bytes, b.memory_bandwidth,
                      b.intra.alpha, b.intra.bandwidth, b.inter.alpha, b.inter.bandwidth, b.p2p_intra.alpha,
                      b.p2p_intra.bandwidth, b.p2p_inter.alpha, b.p2p_inter.bandwidth, b.intra_busy.alpha, b.intra_busy.bandwidth, b.cache.bytes, b.cache.bandwidth, b.eff.gemm_max,
                      b.eff.gemm_half_flops, b.eff.memory_eff, b.eff.kernel_overhead, b.eff.comm_eff};
  for (size_t i = 0; i < std::size(x); ++i) EXPECT_DOUBLE_EQ(x[i], y[i]) << "field " << i << " of " << a.name;
}

// Through a file and back.
Hardware round_trip(const Hardware& h) {
  const std::string path = write_file(h.name + ".json", sat::hardware_json(h));
  Hardware back = hardware(path);
  EXPECT_EQ(back.source, path);
  return back;
}

void expect_positive_finite(double x, const char* what) {
  EXPECT_TRUE(std::isfinite(x) && x > 0) << what << " = " << x;
}

}  // namespace

TEST(Hardware, BuiltInKinds) {
  EXPECT_EQ(sat::hardware_names(),
            (std::vector<std::string>{"l4", "a10", "a10g", "l40s", "rtx-4090", "rtx-a6000", "a100-40gb", "a100-80gb",
                                      "h100-sxm", "h100-pcie", "h200", "b200", "mi300x"}));
  // The figures of docs/hardware-files.md's table (dense TFLOP/s; MiB; GB/s each way).
  struct Want {
    const char* name;
    double fp32, tf32, bf16, fp8, mem_mib, mem_gbs;
    int per_node;
    double intra_gbs, net_gbs;
  };
  const Want want[] = {{"l4", 30.3, 60, 121, 242.5, 23034, 300, 8, 32, 1.5625},
                       {"a10", 31.2, 62.5, 125, 0, 23028, 600, 4, 32, 3.125},
                       {"a10g", 31.52, 35, 70, 0, 23028, 600, 8, 32, 1.5625},
                       {"l40s", 91.6, 183, 362.05, 733, 46068, 864, 8, 32, 6.25},
                       {"rtx-4090", 82.6, 82.6, 165.2, 330.3, 24564, 1008, 8, 32, 1.5625},
                       {"rtx-a6000", 38.7, 77.4, 154.8, 0, 49140, 768, 8, 32, 1.5625},
                       {"a100-40gb", 19.5, 156, 312, 0, 40960, 1555, 8, 300, 25},
                       {"a100-80gb", 19.5, 156, 312, 0, 81920, 2039, 8, 300, 25},
                       {"h100-sxm", 67, 494.7, 989.4, 1978.9, 81559, 3350, 8, 450, 50},
                       {"h100-pcie", 51, 378, 756.5, 1513, 81559, 2000, 8, 64, 25},
                       {"h200", 67, 494.7, 989.4, 1978.9, 143771, 4800, 8, 450, 50},
                       {"b200", 75, 1100, 2250, 4500, 183359, 7700, 8, 900, 50},
                       {"mi300x", 163.4, 653.7, 1307.4, 2614.9, 196288, 5300, 8, 448, 50}};
  ASSERT_EQ(std::size(want), sat::hardware_names().size());
  const sat::Efficiency a100_eff = hardware("a100-80gb").eff;
  for (const auto& w : want) {
    const Hardware h = hardware(w.name);
    EXPECT_EQ(h.name, w.name);
    EXPECT_EQ(h.source, "built-in");
    EXPECT_TRUE(h.gpu);
    EXPECT_FALSE(h.tf32_matmul);
    EXPECT_EQ(h.gpus_per_node, w.per_node) << w.name;
    EXPECT_DOUBLE_EQ(h.peak_fp32, w.fp32 * 1e12) << w.name;
    EXPECT_DOUBLE_EQ(h.peak_tf32, w.tf32 * 1e12) << w.name;
    EXPECT_DOUBLE_EQ(h.peak_bf16, w.bf16 * 1e12) << w.name;
    EXPECT_DOUBLE_EQ(h.peak_fp16, w.bf16 * 1e12) << w.name;
    EXPECT_DOUBLE_EQ(h.peak_fp8, w.fp8 * 1e12) << w.name;
    EXPECT_DOUBLE_EQ(h.memory_bytes, w.mem_mib * 1048576) << w.name;
    EXPECT_DOUBLE_EQ(h.memory_bandwidth, w.mem_gbs * 1e9) << w.name;
    EXPECT_DOUBLE_EQ(h.intra.bandwidth, w.intra_gbs * 1e9) << w.name;
    EXPECT_DOUBLE_EQ(h.inter.bandwidth, w.net_gbs * 1e9) << w.name;
    EXPECT_DOUBLE_EQ(h.intra.alpha, 3e-6);
    EXPECT_DOUBLE_EQ(h.inter.alpha, 8e-6);
    EXPECT_DOUBLE_EQ(h.p2p_intra.bandwidth, h.intra.bandwidth);
    EXPECT_DOUBLE_EQ(h.p2p_inter.alpha, h.inter.alpha);
    // Uncalibrated: every kind takes the A100's fitted efficiency.
    EXPECT_EQ(h.eff.gemm_max, a100_eff.gemm_max) << w.name;
    EXPECT_EQ(h.eff.memory_eff, a100_eff.memory_eff) << w.name;
    EXPECT_EQ(h.eff.comm_eff, a100_eff.comm_eff) << w.name;
    // Dense peaks rank as the tensor cores do: fp8 (where there is one) above bf16 above tf32.
    EXPECT_GE(h.peak_tf32, h.peak_fp32) << w.name;
    EXPECT_GT(h.peak_bf16, h.peak_tf32) << w.name;
    if (h.peak_fp8 > 0) {
      EXPECT_GT(h.peak_fp8, h.peak_bf16) << w.name;
    }
    expect_same(h, round_trip(h));
  }
  EXPECT_NEAR(hardware("h200").memory_bytes / 1e9, 150.76, 0.01);  // "141 GB" is GiB: 140.4 GiB
  // The figures read as they were written in the datasheets.
  const std::string j = sat::hardware_json(hardware("h100-sxm"));
  for (const char* want : {"\"tf32\": 494.7,", "\"fp8\": 1978.9\n", "\"latency_us\": 3\n", "\"kernel_overhead_us\": 5,",
                           "\"memory_bandwidth_gbs\": 3350,", "\"memory_gib\": 79.6474609375,"})
    EXPECT_NE(j.find(want), std::string::npos) << want << " in\n" << j;
}

TEST(Hardware, PeakByPrecision) {
  Hardware h = hardware("a100-80gb");
  EXPECT_EQ(h.peak(sat::DType::f32), 19.5e12);
  EXPECT_EQ(h.peak(sat::DType::bf16), 312e12);
  EXPECT_EQ(h.peak(sat::DType::f16), 312e12);
  h.tf32_matmul = true;
  EXPECT_EQ(h.peak(sat::DType::f32), 156e12);
  EXPECT_NE(error_of([&] { h.peak(sat::DType::i32); }).find("no FLOP rate for"), std::string::npos);
}

TEST(Hardware, UnknownKindListsTheKinds) {
  EXPECT_EQ(error_of([] { hardware("a100"); }),
            "--gpu: unknown kind 'a100' (expected l4, a10, a10g, l40s, rtx-4090, rtx-a6000, a100-40gb, a100-80gb, "
            "h100-sxm, h100-pcie, h200, b200, mi300x, this (measure this machine) or a JSON file)");
  EXPECT_NE(error_of([] { hardware("no/such/cluster.json"); }).find("no/such/cluster.json: cannot read the file"),
            std::string::npos);
}

TEST(Hardware, ReadsTheFileFormat) {
  const std::string path = write_file("cluster.json", kCluster);
  const Hardware h = hardware(path);
  EXPECT_EQ(h.name, "my-cluster");
  EXPECT_EQ(h.source, path);
  EXPECT_TRUE(h.gpu);
  EXPECT_EQ(h.gpus_per_node, 8);
  EXPECT_EQ(h.memory_bytes, 80.0 * 1073741824);
  EXPECT_EQ(h.memory_bandwidth, 2039e9);
  EXPECT_EQ(h.peak_tf32, 156e12);
  EXPECT_EQ(h.intra.bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(h.intra.alpha, 3e-6);
  EXPECT_EQ(h.inter.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(h.inter.alpha, 8e-6);
  EXPECT_DOUBLE_EQ(h.p2p_inter.alpha, 8e-6);
  const sat::Efficiency defaults;
  EXPECT_EQ(h.eff.gemm_max, defaults.gemm_max);
  EXPECT_EQ(h.eff.kernel_overhead, defaults.kernel_overhead);
}

// Every figure a file without a base must give: missing, negative, or zero where zero means
// nothing (a device without memory, a link without bandwidth) is one line naming the file
// (cluster_error checks the "FILE:LINE: " start) and the key.
TEST(Hardware, EveryFigureIsCheckedMissingNegativeOrZero) {
  struct Field {
    const char* key;      // as the error names it
    const char* present;  // its text in kCluster
    const char* absent;   // the text without it
    const char* value;    // its value in `present`
    bool zero_ok;         // 0 means "none" (a precision the device lacks, a free message)
  };
  const Field fields[] = {
      {"gpus_per_node", "\"gpus_per_node\": 8,", "", "8", false},
      {"memory_gib", "\"memory_gib\": 80,", "", "80", false},
      {"memory_bandwidth_gbs", "\"memory_bandwidth_gbs\": 2039,", "", "2039", false},
      {"peak_tflops.fp32", "\"fp32\": 19.5, ", "", "19.5", false},
      {"peak_tflops.tf32", "\"tf32\": 156, ", "", "156", true},
      {"peak_tflops.bf16", "\"bf16\": 312, ", "", "312", true},
      {"peak_tflops.fp16", ", \"fp16\": 312", "", "312", true},
      {"intra_node.bandwidth_gbs", "\"bandwidth_gbs\": 300, ", "", "300", false},
      {"intra_node.latency_us", ", \"latency_us\": 3}", "}", "3", true},
      {"inter_node.bandwidth_gbs", "\"bandwidth_gbs\": 25, ", "", "25", false},
      {"inter_node.latency_us", ", \"latency_us\": 8}", "}", "8", true},
  };
  for (const Field& f : fields) {
    const std::string present = f.present, value = f.value;
    const std::string missing = cluster_error(present, f.absent);
    EXPECT_EQ(missing, std::string("missing key '") + f.key + "'") << f.key;
    std::string negative = present;
    negative.replace(negative.find(value), value.size(), "-" + value);
    const std::string e = cluster_error(present, negative);
    EXPECT_EQ(e.rfind(std::string("key '") + f.key + "': expected a", 0), 0u) << e;
    EXPECT_NE(e.find("got -" + value), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
    std::string zero = present;
    zero.replace(zero.find(value), value.size(), "0");
    if (f.zero_ok) {
      const std::string path = write_file("zero.json", std::string(kCluster).replace(std::string(kCluster).find(present),
                                                                                      present.size(), zero));
      EXPECT_NO_THROW(hardware(path)) << f.key;
    } else {
      EXPECT_EQ(cluster_error(present, zero).rfind(std::string("key '") + f.key + "': expected a positive", 0), 0u)
          << f.key;
    }
  }
  // fp8 may be left out (descriptions written before it existed): 0, none.
  EXPECT_EQ(hardware(write_file("no-fp8.json", kCluster)).peak_fp8, 0.0);
}

TEST(Hardware, BaseAndOverrides) {
  const std::string path = write_file("slow-net.json", R"({"base": "a100-80gb", "inter_node": {"bandwidth_gbs": 12.5},
    "tf32_matmul": true, "efficiency": {"gemm_max": 0.7, "kernel_overhead_us": 10},
    "p2p_intra_node": {"latency_us": 1.5}})");
  const Hardware h = hardware(path);
  const Hardware a = hardware("a100-80gb");
  EXPECT_EQ(h.name, "slow-net");  // the file's name when it gives none
  EXPECT_EQ(h.inter.bandwidth, 12.5e9);
  EXPECT_EQ(h.inter.alpha, a.inter.alpha);
  EXPECT_EQ(h.p2p_inter.bandwidth, 12.5e9);  // point-to-point follows the collectives' link
  EXPECT_EQ(h.p2p_intra.alpha, 1.5e-6);
  EXPECT_EQ(h.p2p_intra.bandwidth, a.intra.bandwidth);
  EXPECT_EQ(h.memory_bytes, a.memory_bytes);
  EXPECT_TRUE(h.tf32_matmul);
  EXPECT_EQ(h.peak(sat::DType::f32), 156e12);
  EXPECT_EQ(h.eff.gemm_max, 0.7);
  EXPECT_DOUBLE_EQ(h.eff.kernel_overhead, 10e-6);
  EXPECT_EQ(h.eff.comm_eff, a.eff.comm_eff);
  expect_same(h, round_trip(h));
}

TEST(Hardware, WrittenDescriptionsReadBack) {
  Hardware h = hardware("h200");
  h.name = "odd \"one\"";
  h.gpu = false;
  h.gpus_per_node = 3;
  h.memory_bytes = 12345678901.0;
  h.peak_bf16 = 0;
  h.peak_fp8 = 1234.5e12;
  h.p2p_intra = {2.5e-5, 7.77e9};
  h.p2p_inter = {1.1e-4, 0.3e9};
  h.intra_busy = {3.3e-5, 1.25e9};
  h.cache = {24.0 * 1048576, 61.5e9};
  h.eff = {0.55, 3.3e8, 0.61, 1.7e-5, 0.93};
  const Hardware back = round_trip(h);
  expect_same(h, back);
  EXPECT_EQ(back.cache.bytes, 24.0 * 1048576);
  EXPECT_EQ(sat::hardware_json(back), sat::hardware_json(h));
}

TEST(Hardware, EveryMistakeNamesTheKey) {
  EXPECT_EQ(cluster_error("\"gpus_per_node\": 8,", ""), "missing key 'gpus_per_node'");
  EXPECT_EQ(cluster_error("\"gpus_per_node\": 8", "\"gpus_per_node\": 2.5"), "key 'gpus_per_node': expected an integer, got 2.5");
  EXPECT_EQ(cluster_error("\"gpus_per_node\": 8", "\"gpus_per_node\": 0"),
            "key 'gpus_per_node': expected a positive number of devices, got 0");
  EXPECT_EQ(cluster_error("\"memory_gib\": 80", "\"memory_gib\": \"80\""), "key 'memory_gib': expected a number, got a string");
  EXPECT_EQ(cluster_error("\"memory_gib\": 80", "\"memory_gib\": -80"), "key 'memory_gib': expected a positive number, got -80");
  EXPECT_EQ(cluster_error("\"memory_gib\": 80", "\"memory_gb\": 80"),
            "unknown key 'memory_gb' (expected name, base, gpu, gpus_per_node, memory_gib, memory_bandwidth_gbs, "
            "peak_tflops, tf32_matmul, intra_node, inter_node, p2p_intra_node, p2p_inter_node, intra_node_busy, cache or efficiency)");
  EXPECT_EQ(cluster_error("\"memory_bandwidth_gbs\": 2039", "\"memory_bandwidth_gbs\": 0"),
            "key 'memory_bandwidth_gbs': expected a positive number, got 0");
  EXPECT_EQ(cluster_error("\"fp32\": 19.5", "\"fp32\": 0"), "key 'peak_tflops.fp32': expected a positive number, got 0");
  EXPECT_EQ(cluster_error("\"bf16\": 312", "\"bf16\": -1"), "key 'peak_tflops.bf16': expected a number >= 0, got -1");
  EXPECT_EQ(cluster_error("\"fp16\": 312", "\"fp4\": 312"),
            "unknown key 'peak_tflops.fp4' (expected fp32, tf32, bf16, fp16 or fp8)");
  EXPECT_EQ(cluster_error("\"fp16\": 312", "\"fp16\": 312, \"fp8\": -624"),
            "key 'peak_tflops.fp8': expected a number >= 0, got -624");
  EXPECT_EQ(cluster_error(", \"fp16\": 312", ""), "missing key 'peak_tflops.fp16'");
  EXPECT_EQ(cluster_error("{\"bandwidth_gbs\": 300, \"latency_us\": 3}", "300"),
            "key 'intra_node': expected an object, got a number");
  EXPECT_EQ(cluster_error("\"bandwidth_gbs\": 25", "\"bandwith_gbs\": 25"),
            "unknown key 'inter_node.bandwith_gbs' (expected bandwidth_gbs or latency_us)");
  const std::string memory = "\"memory_gib\": 80,";
  EXPECT_EQ(cluster_error(memory, memory + " \"cache\": {\"size_mib\": 32},"), "missing key 'cache.bandwidth_gbs'");
  EXPECT_EQ(cluster_error(memory, memory + " \"cache\": {\"size_mib\": 0, \"bandwidth_gbs\": 60},"),
            "key 'cache.size_mib': expected a positive number, got 0");
  EXPECT_EQ(cluster_error(memory, memory + " \"cache\": {\"size_mb\": 32, \"bandwidth_gbs\": 60},"),
            "unknown key 'cache.size_mb' (expected size_mib or bandwidth_gbs)");
  EXPECT_EQ(cluster_error("\"bandwidth_gbs\": 25", "\"bandwidth_gbs\": \"25\""),
            "key 'inter_node.bandwidth_gbs': expected a number, got a string");
  EXPECT_EQ(cluster_error("\"bandwidth_gbs\": 25", "\"bandwidth_gbs\": 0"),
            "key 'inter_node.bandwidth_gbs': expected a positive number, got 0");
  EXPECT_EQ(cluster_error(", \"latency_us\": 8", ""), "missing key 'inter_node.latency_us'");
  EXPECT_EQ(cluster_error("\"latency_us\": 8", "\"latency_us\": -8"), "key 'inter_node.latency_us': expected a number >= 0, got -8");
  EXPECT_EQ(cluster_error("\"name\": \"my-cluster\"", "\"name\": 7"), "key 'name': expected a string, got a number");
  EXPECT_EQ(cluster_error("\"name\": \"my-cluster\"", "\"name\": \"x\", \"gpu\": \"yes\""), "key 'gpu': expected a boolean, got a string");
  EXPECT_EQ(cluster_error("\"name\": \"my-cluster\"", "\"base\": \"a100\""),
            "key 'base': unknown kind 'a100' (expected a built-in kind: l4, a10, a10g, l40s, rtx-4090, rtx-a6000, "
            "a100-40gb, a100-80gb, h100-sxm, h100-pcie, h200, b200, mi300x)");
  EXPECT_EQ(cluster_error("\"name\": \"my-cluster\"", "\"efficiency\": {\"gemm_max\": 1.5}"),
            "key 'efficiency.gemm_max': expected a fraction in (0, 1], got 1.5");
  EXPECT_EQ(cluster_error("\"name\": \"my-cluster\"", "\"efficiency\": {\"kernel_overhead_us\": -1}"),
            "key 'efficiency.kernel_overhead_us': expected a number >= 0, got -1");
  EXPECT_EQ(cluster_error("\"name\": \"my-cluster\"", "\"efficiency\": {\"gemm_eff\": 0.5}"),
            "unknown key 'efficiency.gemm_eff' (expected gemm_max, gemm_half_flops, memory_eff, kernel_overhead_us, "
            "comm_eff or gemm_half_dim)");
  EXPECT_EQ(cluster_error("\"gpus_per_node\": 8,", "\"gpus_per_node\": 8"), "4:3: expected ',' or '}' after an object member, got '\"'");
  const std::string top = write_file("list.json", "[1]");
  EXPECT_EQ(error_of([&] { hardware(top); }), top + ":1: expected an object, got an array");
  // The line of the value (or of the object a key is missing from).
  std::string text = kCluster;
  const std::string figure = "\"memory_bandwidth_gbs\": 2039";
  text.replace(text.find(figure), figure.size(), "\"memory_bandwidth_gbs\": -1");
  const std::string five = write_file("line.json", text);
  EXPECT_EQ(error_of([&] { hardware(five); }), five + ":5: key 'memory_bandwidth_gbs': expected a positive number, got -1");
  // Regression (fuzz_hardware): figures that leave a double in SI units were taken, as
  // infinite FLOP/s or a bandwidth of 0, and the description could not be written back.
  EXPECT_EQ(cluster_error("\"fp32\": 19.5", "\"fp32\": 1e300"),
            "key 'peak_tflops.fp32': expected a figure of plausible size, got 1e+300");
  EXPECT_EQ(cluster_error("\"memory_gib\": 80", "\"memory_gib\": 1e308"),
            "key 'memory_gib': expected a figure of plausible size, got 1e+308");
  EXPECT_EQ(cluster_error("\"latency_us\": 8", "\"latency_us\": 1e-310"),
            "key 'inter_node.latency_us': expected a figure of plausible size, got 1e-310");
}

// A curve made by the cost model's own formula comes back; the fit never puts gemm_max above 1.
TEST(Hardware, GemmFitRecoversTheCurve) {
  const double peak = 100e9, gmax = 0.9, half = 5e8, overhead = 1e-5;
  std::vector<sat::GemmSample> s;
  for (double f : {3e7, 2.7e8, 2.1e9, 1.7e10, 1.3e8})
    s.push_back({f, (f + half) / (peak * gmax) + overhead});
  const sat::GemmFit g = sat::fit_gemm(s, overhead);
  EXPECT_NEAR(g.peak, peak * gmax, 1e-6 * peak);  // above the best rate measured: gemm_max 1
  EXPECT_DOUBLE_EQ(g.gemm_max, 1.0);
  EXPECT_NEAR(g.half_flops, half, 1e-6 * half);
  // Rates that level off below the best one measured: gemm_max < 1 against that peak.
  s = {{1e8, 1e8 / 50e9}, {1e9, 1e9 / 80e9}, {1e10, 1e10 / 70e9}};
  const sat::GemmFit h = sat::fit_gemm(s, 0);
  EXPECT_DOUBLE_EQ(h.peak, 80e9);
  EXPECT_GT(h.gemm_max, 0.8);
  EXPECT_LT(h.gemm_max, 1.0);
  EXPECT_NE(error_of([&] { sat::fit_gemm({s[0]}, 0); }).find("at least two GEMM shapes"), std::string::npos);
}

TEST(Hardware, TableForPeople) {
  const std::string t = sat::hardware_table(hardware("h100-sxm"));
  for (const char* want : {"h100-sxm (built-in)", "GPUs, 8 per node", "fp32 67 TFLOP/s", "bf16 989.4 TFLOP/s",
                           "fp16 989.4 TFLOP/s, fp8 1979 TFLOP/s",
                           "79.65 GiB per GPU, 3350 GB/s", "450 GB/s per direction, latency 3 us",
                           "50 GB/s per direction, latency 8 us"})
    EXPECT_NE(t.find(want), std::string::npos) << "missing '" << want << "' in\n" << t;
}

TEST(Hardware, ThisMachineAsOneProcess) {
  if (sat::test::distributed()) GTEST_SKIP() << "one process only (hardware_np2 measures the job)";
  const double t0 = sat::now_seconds();
  const Hardware h = hardware("this");
  const double seconds = sat::now_seconds() - t0;
  // How long the measuring takes, and how the cache's rate compares with the memory's, are
  // bench/plan/measure_this's figures: here, only what each figure must be.
  std::printf("measured in %.2f s:\n%s", seconds, sat::hardware_table(h).c_str());
  EXPECT_EQ(h.name, "this");
  EXPECT_FALSE(h.gpu);
  EXPECT_EQ(h.gpus_per_node, 1);
  expect_positive_finite(h.peak_fp32, "peak_fp32");
  EXPECT_EQ(h.peak_bf16, h.peak_fp32);  // the CPU engine computes bf16 products in float32
  expect_positive_finite(h.memory_bytes, "memory_bytes");
  expect_positive_finite(h.memory_bandwidth, "memory_bandwidth");
  for (const sat::Link* l : {&h.intra, &h.inter, &h.p2p_intra, &h.p2p_inter}) {
    expect_positive_finite(l->alpha, "alpha");
    expect_positive_finite(l->bandwidth, "bandwidth");
  }
  EXPECT_EQ(h.intra.bandwidth, h.memory_bandwidth);
  EXPECT_EQ(h.intra_busy.bandwidth, h.intra.bandwidth);  // one process: no ranks to reduce over
  // The last-level cache where Linux's sysfs describes it (all of it: one process on the host),
  // and the triad's rate inside it.
  if (std::filesystem::exists("/sys/devices/system/cpu/cpu0/cache/index0/size")) {
    expect_positive_finite(h.cache.bytes, "cache bytes");
    EXPECT_GE(h.cache.bytes, 1048576.0);
    EXPECT_EQ(std::fmod(h.cache.bytes, 1024.0), 0.0) << h.cache.bytes;
    expect_positive_finite(h.cache.bandwidth, "cache bandwidth");
  }
  expect_positive_finite(h.eff.gemm_max, "gemm_max");
  EXPECT_LE(h.eff.gemm_max, 1.0);
  EXPECT_TRUE(std::isfinite(h.eff.gemm_half_flops) && h.eff.gemm_half_flops >= 0) << h.eff.gemm_half_flops;
  expect_positive_finite(h.eff.kernel_overhead, "kernel_overhead");
  expect_same(h, round_trip(h));
}

// Under mpirun -np 2: every rank measures and gets rank 0's figures.
TEST(HardwareRanks, ThisMachineOverTwoRanks) {
  if (!sat::test::world_is(2)) GTEST_SKIP() << "under mpirun -np 2 only";
  sat::dist::Comm& w = world();
  const Hardware h = hardware("this", &w);
  EXPECT_EQ(h.gpus_per_node, 2);
  for (const sat::Link* l : {&h.intra, &h.inter, &h.p2p_intra, &h.p2p_inter}) {
    expect_positive_finite(l->alpha, "alpha");
    expect_positive_finite(l->bandwidth, "bandwidth");
  }
  // Beside compute the fit's latency may come out 0 (then the bandwidth alone is fitted).
  expect_positive_finite(h.intra_busy.bandwidth, "bandwidth beside compute");
  EXPECT_TRUE(std::isfinite(h.intra_busy.alpha) && h.intra_busy.alpha >= 0) << h.intra_busy.alpha;
  expect_positive_finite(h.peak_fp32, "peak_fp32");
  expect_positive_finite(h.memory_bandwidth, "memory_bandwidth");
  if (h.cache.bytes > 0) {  // each rank's share
    EXPECT_LE(h.cache.bytes, hardware("this").cache.bytes / 2);
    expect_positive_finite(h.cache.bandwidth, "cache bandwidth");
  }
  std::vector<double> mine = {h.peak_fp32,         h.memory_bytes,          h.memory_bandwidth, h.intra.alpha,
                              h.intra.bandwidth,   h.p2p_intra.alpha,       h.p2p_intra.bandwidth,
                              h.eff.gemm_max,      h.eff.gemm_half_flops,   h.eff.kernel_overhead,
                              double(h.gpus_per_node), h.intra_busy.alpha, h.intra_busy.bandwidth,
                              h.cache.bytes,       h.cache.bandwidth};
  std::vector<double> root = mine;
  w.broadcast_sync(root.data(), root.size(), sat::DType::f64, 0);
  EXPECT_EQ(mine, root) << "rank " << w.rank() << " disagrees with rank 0";
  if (w.rank() == 0) std::printf("%s", sat::hardware_table(h).c_str());
}
