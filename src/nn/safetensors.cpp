#include "nn/safetensors.h"

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/io.h"
#include "nn/shard.h"

namespace sat {
namespace {


// decl: a parameter's declaration (a tensor-parallel part is loaded from the full tensor).
struct Entry { std::string name; Tensor t; const ParamDecl* decl = nullptr; };

std::vector<Entry> entries(const ParamStore& ps) {
  std::vector<Entry> e;
  for (size_t i = 0; i < ps.num_params(); ++i)
    if (!ps.decl(i).shared) e.push_back({ps.decl(i).name, ps.host_param(i), &ps.decl(i)});
  for (size_t i = 0; i < ps.num_states(); ++i) e.push_back({ps.state_decl(i).name, ps.host_state(i)});
  return e;
}

}  // namespace

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

void save_safetensors(const std::string& path, const ParamStore& ps, const std::string& model_name) {
  auto es = entries(ps);
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}, {"producer", "saturate"}, {"model", model_name}};
  size_t off = 0;
  for (auto& e : es) {
    h[e.name] = {{"dtype", safetensors_dtype(e.t.dtype)}, {"shape", e.t.shape.vec()}, {"data_offsets", {off, off + e.t.bytes()}}};
    off += e.t.bytes();
  }
  std::string header = h.dump();
  while ((header.size() + 8) % 8) header += ' ';
  write_file_atomic("--save-weights", path, [&](std::ostream& f) {
    uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(header.data(), std::streamsize(header.size()));
    for (auto& e : es) f.write(static_cast<const char*>(e.t.ptr), std::streamsize(e.t.bytes()));
  });
}

void load_safetensors(const std::string& path, ParamStore& ps, const std::set<std::string>* model_names) {
  SAT_CHECK(ps.device() == Device::cpu, "internal error: load weights before moving parameters to the GPU");
  std::ifstream f(path, std::ios::binary);
  SAT_CHECK(f, path, ": cannot open safetensors file: ", std::strerror(errno));
  f.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(f.tellg());
  f.seekg(0);
  uint64_t hlen = 0;
  SAT_CHECK(size >= 8 && f.read(reinterpret_cast<char*>(&hlen), 8), path, ": not a safetensors file (shorter than 8 bytes)");
  SAT_CHECK(hlen >= 2 && hlen <= size - 8 && hlen < (100u << 20), path, ": not a safetensors file (header length ", hlen,
            " does not fit a file of ", size, " bytes)");
  std::string header(hlen, '\0');
  f.read(header.data(), std::streamsize(hlen));
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    fail(path, ": safetensors header is not valid JSON (", e.what(), ")");
  }
  SAT_CHECK(h.is_object(), path, ": safetensors header is not a JSON object");
  const uint64_t data_size = size - 8 - hlen;
  std::map<std::string, Tensor> want;
  std::map<std::string, const ParamDecl*> split;  // tensor-parallel parts: the file holds the full tensor
  for (auto& e : entries(ps)) {
    want[e.name] = e.t;
    if (e.decl && e.decl->shard.split()) split[e.name] = e.decl;
  }
  std::set<std::string> seen;
  for (auto& item : h.items()) {
    const std::string& name = item.key();
    const nlohmann::json& info = item.value();
    if (name == "__metadata__") continue;
    auto it = want.find(name);
    if (it == want.end()) {
      // PyTorch state_dicts of tied models carry lm_head.weight as a second name of wte;
      // a pipeline stage skips the tensors of the others.
      auto known = [&](const std::string& n) { return want.count(n) || (model_names && model_names->count(n)); };
      if ((name == "lm_head.weight" && known("transformer.wte.weight")) || known(name)) continue;
      fail(path, ": unexpected tensor '", name, "' (this model has no parameter of that name)");
    }
    const ParamDecl* part = split.count(name) ? split.at(name) : nullptr;
    const Tensor t = part ? Tensor(nullptr, part->full_shape(), it->second.dtype) : it->second;
    try {
      std::string dt = info.at("dtype");
      // Whole numbers >= 0 only: nlohmann's conversion of 1e30 or -1 to an integer type is
      // undefined behaviour, and a shape of huge dimensions overflows its element count.
      auto naturals = [&](const char* key, uint64_t max) {
        const nlohmann::json& a = info.at(key);
        SAT_CHECK(a.is_array(), path, ": tensor '", name, "': '", key, "' is not an array; expected whole numbers");
        std::vector<uint64_t> v;
        for (const auto& x : a) {
          SAT_CHECK(x.is_number_unsigned() && x.get<uint64_t>() <= max, path, ": tensor '", name, "': '", key,
                    "' holds ", x.dump(), "; expected whole numbers from 0 to ", max);
          v.push_back(x.get<uint64_t>());
        }
        return v;
      };
      std::vector<uint64_t> dims = naturals("shape", uint64_t(1) << 40);
      std::vector<uint64_t> offs = naturals("data_offsets", data_size);
      SAT_CHECK(dims.size() <= size_t(Shape::kMaxDims), path, ": tensor '", name, "' has ", dims.size(),
                " dimensions; expected at most ", Shape::kMaxDims);
      SAT_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size, path, ": tensor '", name,
                "' has data offsets outside the file (truncated file?)");
      unsigned __int128 numel = 1;
      for (uint64_t d : dims) numel = std::min<unsigned __int128>(numel * d, uint64_t(1) << 62);
      const Shape shape(std::vector<int64_t>(dims.begin(), dims.end()));
      bool i64_counter = t.dtype == DType::i64;
      if (shape != t.shape && !(i64_counter && numel == 1))
        fail(path, ": tensor '", name, "' has shape ", shape.str(), ", expected ", t.shape.str());
      SAT_CHECK(dt == safetensors_dtype(t.dtype), path, ": tensor '", name, "' has dtype ", dt, ", expected ", safetensors_dtype(t.dtype));
      SAT_CHECK(offs[1] - offs[0] == t.bytes(), path, ": tensor '", name, "' has ", offs[1] - offs[0], " bytes of data, expected ",
                t.bytes());
      f.seekg(std::streamoff(8 + hlen + offs[0]));
      std::vector<uint8_t> full(part ? t.bytes() : 0);
      f.read(part ? reinterpret_cast<char*>(full.data()) : static_cast<char*>(t.ptr), std::streamsize(t.bytes()));
      SAT_CHECK(f, path, ": reading tensor '", name, "' failed (truncated file?)");
      if (part) shard_extract(*part, full.data(), it->second.ptr, dtype_size(t.dtype));
    } catch (const nlohmann::json::exception& e) {
      fail(path, ": tensor '", name, "' has a malformed header entry (", e.what(), ")");
    }
    seen.insert(name);
  }
  for (auto& [name, t] : want)
    SAT_CHECK(seen.count(name), path, ": tensor '", name, "' ",
              (split.count(name) ? split.at(name)->full_shape() : t.shape).str(), " is missing");
}

}  // namespace sat
