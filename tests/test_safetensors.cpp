// The safetensors codec (nn/safetensors.h) that weights and checkpoints share: what it
// writes reads back (names, dtypes, shapes, offsets, metadata, bytes), the data starts
// 8-byte aligned, and a damaged header is refused with one line naming the file and tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "error_of.h"
#include "nn/params.h"
#include "nn/safetensors.h"

namespace fs = std::filesystem;
using sat::test::error_of;

namespace {

std::string temp_file(const std::string& name) {
  return (fs::temp_directory_path() / ("sat_st_" + std::to_string(getpid()) + "_" + name)).string();
}

// A file of the given header JSON and `data` zero bytes.
std::string file_with_header(const std::string& header, size_t data) {
  std::string f(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(f.data(), &n, 8);
  f += header + std::string(data, '\0');
  const std::string path = temp_file("h.safetensors");
  std::ofstream(path, std::ios::binary) << f;
  return path;
}

std::string header_error(const std::string& header, size_t data = 16) {
  const std::string path = file_with_header(header, data);
  std::string e = error_of([&] { sat::SafetensorsFile f(path); });
  fs::remove(path);
  if (e.rfind(path, 0) == 0) e = e.substr(path.size());
  return e;
}

}  // namespace

TEST(Safetensors, WrittenFilesReadBack) {
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> n = {42};
  const std::vector<uint16_t> h = {7, 8, 9};
  const std::vector<sat::SafetensorsBlob> blobs = {
      {"layer.weight", sat::DType::f32, {2, 3}, w.data()}, {"count", sat::DType::i64, {}, n.data()},
      {"half", sat::DType::bf16, {3}, h.data()}, {"empty", sat::DType::f32, {0, 4}, nullptr}};
  std::string bytes;
  const uint64_t total = sat::write_safetensors(blobs, {{"format", "pt"}, {"model", "m"}}, [&](const void* p, size_t k) {
    bytes.append(static_cast<const char*>(p), k);
  });
  EXPECT_EQ(total, bytes.size());
  uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  EXPECT_EQ(hlen % 8, 0u);  // the data starts aligned
  EXPECT_EQ(bytes.size(), 8 + hlen + 24 + 8 + 6);
  const std::string path = temp_file("w.safetensors");
  std::ofstream(path, std::ios::binary) << bytes;
  sat::SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "layer.weight");  // in the order written
  EXPECT_EQ(f.metadata(), (sat::SafetensorsMetadata{{"format", "pt"}, {"model", "m"}}));
  const sat::SafetensorsTensor* t = f.find("half");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "BF16");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(t->end - t->begin, 6u);
  std::vector<uint16_t> back(3);
  f.read(*t, back.data());
  EXPECT_EQ(back, h);
  std::vector<float> wb(6);
  f.read(*f.find("layer.weight"), wb.data());
  EXPECT_EQ(wb, w);
  EXPECT_EQ(f.find("count")->shape, std::vector<int64_t>{});
  EXPECT_EQ(f.find("nothing"), nullptr);
  fs::remove(path);
}

TEST(Safetensors, DamagedHeadersAreRefused) {
  EXPECT_EQ(header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})"),
            ": tensors 'a' and 'b' overlap in the data");
  EXPECT_EQ(header_error(R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})"),
            ": tensor 'a' has dtype 'Q4' (expected one of F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, "
            "U32, U16, U8, BOOL)");
  EXPECT_EQ(header_error(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})"),
            ": tensor 'a' has shape [3] of F32 but 8 bytes of data");
  EXPECT_EQ(header_error(R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})"),
            ": tensor 'a' has data offsets outside the file (truncated file?)");
  EXPECT_EQ(header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})"),
            ": tensor 'a': 'data_offsets' must be [BEGIN, END] with BEGIN <= END");
  EXPECT_EQ(header_error(R"({"a": {"dtype": "F32", "shape": [2]}})"), ": tensor 'a': no 'data_offsets'");
  EXPECT_EQ(header_error(R"({"a": [1]})"), ": tensor 'a': its header entry is not an object");
  EXPECT_EQ(header_error(R"({"__metadata__": {"n": 1}})"), ": '__metadata__' must map names to strings ('n' does not)");
  EXPECT_EQ(header_error(R"([1, 2])"), ": safetensors header is not a JSON object");
  EXPECT_EQ(header_error(R"({"a": {}, "a": {}})"), ": safetensors header:1:11: duplicate key 'a'");
  EXPECT_EQ(header_error(R"({"a": )"), ": safetensors header:1:7: expected a value, got end of input");
  EXPECT_EQ(header_error("{}", 0), "");  // no tensors at all is a file
  const std::string path = temp_file("short");
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_EQ(error_of([&] { sat::SafetensorsFile f(path); }), path + ": not a safetensors file (shorter than 8 bytes)");
  std::ofstream(path, std::ios::binary) << std::string("\xff\xff\0\0\0\0\0\0{}", 10);
  EXPECT_EQ(error_of([&] { sat::SafetensorsFile f(path); }),
            path + ": not a safetensors file (header length 65535 does not fit a file of 10 bytes)");
  fs::remove(path);
}

// Weights that are NaN or infinite are refused when loaded, naming the file and the tensor
// (they trained to NaN, reported later as a divergence that blamed --lr).
TEST(Safetensors, NonFiniteWeightsAreRefusedAtLoad) {
  sat::ParamDecl d;
  d.name = "layer.weight";
  d.spec = {sat::Shape{3}, sat::DType::f32};
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    const std::vector<float> w = {1, bad, 3};
    const std::string path = temp_file("nan.safetensors");
    std::string bytes;
    sat::write_safetensors({{"layer.weight", sat::DType::f32, {3}, w.data()}}, {},
                           [&](const void* p, size_t k) { bytes.append(static_cast<const char*>(p), k); });
    std::ofstream(path, std::ios::binary) << bytes;
    sat::ParamStore ps({d}, {}, 0);
    const std::string e = error_of([&] { sat::load_safetensors(path, ps); });
    EXPECT_EQ(e.rfind(path + ": tensor 'layer.weight' holds ", 0), 0u) << e;
    EXPECT_NE(e.find(" at element 1; expected finite weights"), std::string::npos) << e;
    fs::remove(path);
  }
}

// Shapes are counted in int64 with a check: a shape whose element count overflows is an
// error naming it, not undefined behaviour (model files' input shapes reached it).
TEST(Safetensors, ShapesWhoseCountOverflowsAreErrors) {
  const sat::Shape big{int64_t(1) << 40, int64_t(1) << 40};
  EXPECT_EQ(error_of([&] { (void)big.numel(); }),
            "a tensor of shape [1099511627776, 1099511627776] has more elements than fit in 64 bits");
  EXPECT_EQ((sat::Shape{int64_t(1) << 31, int64_t(1) << 31}.numel()), int64_t(1) << 62);
}
