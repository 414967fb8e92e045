#include "nn/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/io.h"
#include "core/json.h"
#include "nn/shard.h"

namespace sat {
namespace {

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;
constexpr uint64_t kMaxDim = uint64_t(1) << 40;

// Every dtype of the format, with its element size.
struct FormatDType {
  const char* name;
  size_t size;
};
constexpr FormatDType kFormatDTypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1},
                                         {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
                                         {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}};

size_t format_dtype_size(const std::string& name) {
  for (const auto& d : kFormatDTypes)
    if (name == d.name) return d.size;
  return 0;
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += str_cat(i ? ", " : "", dims[i]);
  return s + "]";
}

// A header entry's list of whole numbers from 0 to max: nlohmann's own conversion of 1e30 or
// -1 to an integer type is undefined behaviour.
std::vector<uint64_t> naturals(const std::string& at, const JsonValue& entry, const char* key, uint64_t max) {
  const auto it = entry.find(key);
  SAT_CHECK(it != entry.end(), at, ": no '", key, "'");
  SAT_CHECK(it->is_array(), at, ": '", key, "' is not an array; expected whole numbers");
  std::vector<uint64_t> v;
  for (const auto& x : *it) {
    SAT_CHECK(x.is_number_unsigned() && x.get<uint64_t>() <= max, at, ": '", key, "' holds ", x.dump(),
              "; expected whole numbers from 0 to ", max);
    v.push_back(x.get<uint64_t>());
  }
  return v;
}

// One entry of the header, checked on its own: a known dtype, a shape, offsets within the
// data that span exactly the shape's bytes.
SafetensorsTensor read_entry(const std::string& path, const std::string& name, const JsonValue& entry,
                             uint64_t data_size) {
  const std::string at = str_cat(path, ": tensor '", name, "'");
  SAT_CHECK(entry.is_object(), at, ": its header entry is not an object");
  SafetensorsTensor t;
  t.name = name;
  const auto dt = entry.find("dtype");
  SAT_CHECK(dt != entry.end() && dt->is_string(), at, ": no 'dtype' string");
  t.dtype = dt->get<std::string>();
  const size_t elem = format_dtype_size(t.dtype);
  if (elem == 0) {
    std::string names;
    for (const auto& d : kFormatDTypes) names += str_cat(names.empty() ? "" : ", ", d.name);
    fail(at, " has dtype '", t.dtype, "' (expected one of ", names, ")");
  }
  const std::vector<uint64_t> dims = naturals(at, entry, "shape", kMaxDim);
  const std::vector<uint64_t> offs = naturals(at, entry, "data_offsets", uint64_t(1) << 62);
  SAT_CHECK(dims.size() <= size_t(Shape::kMaxDims), at, " has ", dims.size(), " dimensions; expected at most ",
            Shape::kMaxDims);
  t.shape.assign(dims.begin(), dims.end());
  SAT_CHECK(offs.size() == 2 && offs[0] <= offs[1], at, ": 'data_offsets' must be [BEGIN, END] with BEGIN <= END");
  SAT_CHECK(offs[1] <= data_size, at, " has data offsets outside the file (truncated file?)");
  t.begin = offs[0], t.end = offs[1];
  unsigned __int128 numel = 1;
  for (uint64_t d : dims) numel = std::min<unsigned __int128>(numel * d, uint64_t(1) << 62);
  SAT_CHECK(numel * elem == t.end - t.begin, at, " has shape ", dims_str(t.shape), " of ", t.dtype, " but ",
            t.end - t.begin, " bytes of data");
  return t;
}

// decl: a parameter's declaration (a tensor-parallel part is loaded from the full tensor).
struct Entry { std::string name; Tensor t; const ParamDecl* decl = nullptr; };

std::vector<Entry> entries(const ParamStore& ps) {
  std::vector<Entry> e;
  for (size_t i = 0; i < ps.num_params(); ++i)
    if (!ps.decl(i).shared) e.push_back({ps.decl(i).name, ps.host_param(i), &ps.decl(i)});
  for (size_t i = 0; i < ps.num_states(); ++i) e.push_back({ps.state_decl(i).name, ps.host_state(i)});
  return e;
}

// Weights that are NaN or infinite would train to NaN, reported later as a divergence that
// blames --lr: refused at load, naming the file and the tensor.
void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  if (t.dtype != DType::f32) return;
  const float* x = t.f32();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    SAT_CHECK(std::isfinite(x[i]), path, ": tensor '", name, "' holds ", x[i], " at element ", i,
              "; expected finite weights");
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

uint64_t write_safetensors(const std::vector<SafetensorsBlob>& tensors, const SafetensorsMetadata& metadata,
                           const std::function<void(const void*, size_t)>& write) {
  JsonValue h = JsonValue::object();
  if (!metadata.empty()) {
    JsonValue& m = h["__metadata__"] = JsonValue::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  std::vector<uint64_t> bytes;
  uint64_t off = 0;
  for (const SafetensorsBlob& t : tensors) {
    bytes.push_back(uint64_t(std::accumulate(t.shape.begin(), t.shape.end(), int64_t(1), std::multiplies<>())) *
                    dtype_size(t.dtype));
    h[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + bytes.back()}}};
    off += bytes.back();
  }
  // (a name or metadata that is not UTF-8 is written with U+FFFD: the header stays JSON)
  std::string header = h.dump(-1, ' ', false, JsonValue::error_handler_t::replace);
  while (header.size() % 8) header += ' ';  // the data starts 8-byte aligned
  uint8_t n[8];
  for (int i = 0; i < 8; ++i) n[i] = uint8_t(uint64_t(header.size()) >> (8 * i));  // little-endian
  write(n, 8);
  write(header.data(), header.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    if (bytes[i] > 0) write(tensors[i].data, size_t(bytes[i]));
  return 8 + header.size() + off;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  uint64_t size = 0;
  {
    InputFile in("", path);
    size = in.size();
    fd_ = in.release();
  }
  uint8_t n[8] = {};
  SAT_CHECK(size >= 8 && read_at(0, n, 8), path, ": not a safetensors file (shorter than 8 bytes)");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(n[i]) << (8 * i);
  SAT_CHECK(hlen >= 2 && hlen <= size - 8 && hlen < kMaxHeader, path, ": not a safetensors file (header length ", hlen,
            " does not fit a file of ", size, " bytes)");
  std::string header(hlen, '\0');
  SAT_CHECK(read_at(8, header.data(), hlen), path, ": reading the safetensors header failed");
  data_start_ = 8 + hlen;
  const JsonRef h = JsonRef::parse(header, path + ": safetensors header");  // (refuses a name given twice)
  SAT_CHECK(h.is_object(), path, ": safetensors header is not a JSON object");
  for (const auto& [name, entry] : h.value().items()) {
    if (name == "__metadata__") {
      SAT_CHECK(entry.is_object(), path, ": '__metadata__' must map names to strings");
      for (const auto& [k, v] : entry.items()) {
        SAT_CHECK(v.is_string(), path, ": '__metadata__' must map names to strings ('", k, "' does not)");
        metadata_.emplace_back(k, v.get<std::string>());
      }
      continue;
    }
    tensors_.push_back(read_entry(path, name, entry, size - data_start_));
  }
  // No two tensors share a byte.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& t : tensors_)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    SAT_CHECK(by_offset[i]->begin >= by_offset[i - 1]->end, path, ": tensors '", by_offset[i - 1]->name, "' and '",
              by_offset[i]->name, "' overlap in the data");
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool SafetensorsFile::read_at(uint64_t offset, void* dst, uint64_t n) const {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, offset += uint64_t(r), n -= uint64_t(r);
  }
  return true;
}

void SafetensorsFile::read(const SafetensorsTensor& t, void* dst) {
  SAT_CHECK(read_at(data_start_ + t.begin, dst, t.end - t.begin), path_, ": reading tensor '", t.name,
            "' failed (truncated file?)");
}

void save_safetensors(const std::string& path, const ParamStore& ps, const std::string& model_name,
                      const SafetensorsMetadata& extra) {
  std::vector<SafetensorsBlob> blobs;
  for (auto& e : entries(ps)) blobs.push_back({e.name, e.t.dtype, e.t.shape.vec(), e.t.ptr});
  SafetensorsMetadata metadata{{"format", "pt"}, {"producer", "saturate"}, {"model", model_name}};
  metadata.insert(metadata.end(), extra.begin(), extra.end());
  write_file_atomic("--save-weights", path, [&](std::ostream& f) {
    write_safetensors(blobs, metadata,
                      [&](const void* p, size_t n) { f.write(static_cast<const char*>(p), std::streamsize(n)); });
  });
}

void load_safetensors(const std::string& path, ParamStore& ps, const std::set<std::string>* model_names) {
  SAT_CHECK(ps.device() == Device::cpu, "internal error: load weights before moving parameters to the GPU");
  SafetensorsFile file(path);
  std::map<std::string, Tensor> want;
  std::map<std::string, const ParamDecl*> split;  // tensor-parallel parts: the file holds the full tensor
  for (auto& e : entries(ps)) {
    want[e.name] = e.t;
    if (e.decl && e.decl->shard.split()) split[e.name] = e.decl;
  }
  std::set<std::string> seen;
  for (const SafetensorsTensor& st : file.tensors()) {
    const std::string& name = st.name;
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
    const Shape shape(st.shape);
    // BatchNorm's counter: PyTorch's is a scalar [], saturate's a [1] (one element: its bytes).
    const bool i64_counter = t.dtype == DType::i64 && t.shape.numel() == 1 && st.end - st.begin == 8;
    SAT_CHECK(shape == t.shape || i64_counter, path, ": tensor '", name, "' has shape ", shape.str(), ", expected ",
              t.shape.str());
    SAT_CHECK(st.dtype == safetensors_dtype(t.dtype), path, ": tensor '", name, "' has dtype ", st.dtype, ", expected ",
              safetensors_dtype(t.dtype));
    std::vector<uint8_t> full(part ? t.bytes() : 0);
    file.read(st, part ? static_cast<void*>(full.data()) : t.ptr);
    check_finite(path, name, Tensor(part ? static_cast<void*>(full.data()) : t.ptr, t.shape, t.dtype));
    if (part) shard_extract(*part, full.data(), it->second.ptr, dtype_size(t.dtype));
    seen.insert(name);
  }
  for (auto& [name, t] : want)
    SAT_CHECK(seen.count(name), path, ": tensor '", name, "' ",
              (split.count(name) ? split.at(name)->full_shape() : t.shape).str(), " is missing");
}

}  // namespace sat
