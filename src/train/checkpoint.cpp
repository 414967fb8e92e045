#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "core/error.h"
#include "core/io.h"
#include "nn/safetensors.h"
#include "nn/shard.h"

namespace sat {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "saturate-checkpoint";
// 2: the manifest's checksum and the run's settings.
constexpr int kVersion = 2;
constexpr const char* kManifest = "manifest.json";

// Writes all of `data` to fd (sat::Error naming the file).
void write_all(int fd, const void* data, size_t n, const std::string& path, uint32_t& crc) {
  auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    const size_t chunk = std::min<size_t>(n - done, size_t(1) << 30);
    const ssize_t w = ::write(fd, p + done, chunk);
    if (w < 0 && errno == EINTR) continue;
    SAT_CHECK(w > 0, "--checkpoint-dir: writing ", path, " failed: ", std::strerror(errno));
    crc = uint32_t(::crc32(crc, p + done, uInt(w)));
    done += size_t(w);
  }
}

uint32_t file_crc(const std::string& path, uint64_t& bytes) {
  std::ifstream f(path, std::ios::binary);
  SAT_CHECK(f, path, ": cannot open: ", std::strerror(errno));
  std::vector<char> buf(size_t(1) << 20);
  uint32_t crc = uint32_t(::crc32(0, nullptr, 0));
  bytes = 0;
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    const auto got = f.gcount();
    if (got <= 0) break;
    crc = uint32_t(::crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), uInt(got)));
    bytes += uint64_t(got);
  }
  return crc;
}

json piece_json(const CkptPiece& p) {
  json j = {{"file", p.file}, {"key", p.key}};
  if (p.dim >= 0) j.update({{"dim", p.dim}, {"parts", p.parts}, {"index", p.index}, {"stride", p.stride}});
  return j;
}

json tensors_json(const std::map<std::string, CkptTensor>& ts) {
  json out = json::object();
  for (const auto& [name, t] : ts) {
    json pieces = json::array();
    for (const auto& p : t.pieces) pieces.push_back(piece_json(p));
    out[name] = {{"shape", t.shape}, {"dtype", t.dtype}, {"pieces", pieces}};
  }
  return out;
}

template <class T>
struct is_vector : std::false_type {};
template <class E>
struct is_vector<std::vector<E>> : std::true_type {};

// Whether x converts to T exactly: the type, and integers within T's range (nlohmann's own
// conversion of 1e30 or -1 to an integer type is undefined behaviour). A double may be
// null (a NaN that JSON cannot spell).
template <class T>
bool fits(const json& x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x.is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    if (x.is_number_unsigned()) return x.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
    if (!x.is_number_integer()) return false;
    const int64_t v = x.get<int64_t>();
    return v >= 0 || (std::is_signed_v<T> && v >= int64_t(std::numeric_limits<T>::min()));
  } else if constexpr (std::is_floating_point_v<T>) {
    return x.is_number() || x.is_null();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return x.is_string();
  } else {
    static_assert(is_vector<T>::value);
    if (!x.is_array()) return false;
    for (const auto& e : x)
      if (!fits<typename T::value_type>(e)) return false;
    return true;
  }
}

template <class T>
T convert(const json& x) {
  if constexpr (std::is_floating_point_v<T>) {
    return x.is_null() ? std::numeric_limits<T>::quiet_NaN() : x.get<T>();
  } else if constexpr (is_vector<T>::value) {
    T out;
    for (const auto& e : x) out.push_back(convert<typename T::value_type>(e));
    return out;
  } else {
    return x.get<T>();
  }
}

// A JSON value's field, with errors naming the file and the key.
struct Reader {
  const std::string& where;
  template <class T>
  T get(const json& j, const char* key, const std::string& path) const {
    SAT_CHECK(j.is_object() && j.contains(key), where, ": key '", path, key, "' is missing");
    SAT_CHECK(fits<T>(j.at(key)), where, ": key '", path, key, "' has the wrong type or is out of range");
    return convert<T>(j.at(key));
  }
};

CkptPiece parse_piece(const Reader& r, const json& j, const std::string& at, const Manifest& m) {
  CkptPiece p;
  p.file = r.get<std::string>(j, "file", at);
  p.key = r.get<std::string>(j, "key", at);
  SAT_CHECK(m.files.count(p.file), r.where, ": key '", at, "file' names ", p.file, ", which is not in 'files'");
  if (j.contains("dim")) {
    p.dim = r.get<int>(j, "dim", at);
    p.parts = r.get<int>(j, "parts", at);
    p.index = r.get<int>(j, "index", at);
    p.stride = r.get<int>(j, "stride", at);
    SAT_CHECK(p.dim >= 0 && p.dim < Shape::kMaxDims && p.parts >= 1 && p.parts <= 65536 && p.index >= 0 &&
                  p.index < p.parts && p.stride >= 1 && p.stride <= 65536,
              r.where, ": key '", at, "' describes an impossible piece");
  }
  return p;
}

void parse_tensors(const Reader& r, const json& j, Manifest& m) {
  SAT_CHECK(j.is_object(), r.where, ": key 'tensors' must be an object");
  for (const auto& [name, t] : j.items()) {
    const std::string at = "tensors." + name + ".";
    CkptTensor ct;
    ct.shape = r.get<std::vector<int64_t>>(t, "shape", at);
    SAT_CHECK(ct.shape.size() <= size_t(Shape::kMaxDims), r.where, ": key '", at, "shape' has more than ",
              Shape::kMaxDims, " dimensions");
    int64_t numel = 1;
    for (int64_t d : ct.shape) {
      SAT_CHECK(d >= 1 && d <= (int64_t(1) << 40) && numel <= (int64_t(1) << 48) / d, r.where, ": key '", at,
                "shape' has a bad size");
      numel *= d;
    }
    ct.dtype = r.get<std::string>(t, "dtype", at);
    SAT_CHECK(t.contains("pieces") && t["pieces"].is_array() && !t["pieces"].empty(), r.where, ": key '", at,
              "pieces' must be a non-empty array");
    for (size_t i = 0; i < t["pieces"].size(); ++i)
      ct.pieces.push_back(parse_piece(r, t["pieces"][i], at + "pieces[" + std::to_string(i) + "].", m));
    m.tensors[name] = std::move(ct);
  }
}

std::string checksum_of(json j) {
  j.erase("checksum");
  const std::string canonical = j.dump();  // compact, keys sorted (nlohmann::json's objects are ordered maps)
  char b[32];
  std::snprintf(b, sizeof b, "crc32:%08x",
                unsigned(::crc32(::crc32(0, nullptr, 0), reinterpret_cast<const Bytef*>(canonical.data()),
                                 uInt(canonical.size()))));
  return b;
}

// The redundant fields of a manifest against each other: a forgery that kept the checksum
// consistent must still tell one story (sat::Error naming `where`).
void check_consistent(const Manifest& m, const std::string& where) {
  const std::string edited = ": the manifest has been edited or damaged (";
  SAT_CHECK(int64_t(m.losses.size()) == m.step, where, edited, "'losses' holds ", m.losses.size(),
            " values, one per step, but 'step' is ", m.step, ")");
  SAT_CHECK(m.total_steps >= m.step, where, edited, "'total_steps' ", m.total_steps, " is below 'step' ", m.step, ")");
  // The optimizer counts one update per step (fp16 skips those with inf/NaN gradients).
  const auto precision = m.settings.find("precision");
  const bool skips = precision != m.settings.end() && precision->second == "fp16";
  SAT_CHECK(m.optimizer_steps == m.step || (skips && m.optimizer_steps >= 0 && m.optimizer_steps < m.step), where,
            edited, "'optimizer.steps' is ", m.optimizer_steps, ", the optimizer counts one update per step and 'step' is ",
            m.step, ")");
  // epoch = step / P and step_in_epoch = step % P for the P steps of an epoch (no epoch: P unknown, 0).
  const bool position = m.step_in_epoch <= m.step &&
                        (m.epoch == 0 ? m.step_in_epoch == m.step
                                      : (m.step - m.step_in_epoch) % m.epoch == 0 &&
                                            m.step_in_epoch < (m.step - m.step_in_epoch) / m.epoch);
  SAT_CHECK(position, where, edited, "epoch ", m.epoch, ", step ", m.step_in_epoch, " of it, does not follow from step ",
            m.step, " at any number of steps per epoch)");
  const CkptLayout& l = m.layout;
  constexpr int kMaxRanks = 1 << 20;
  SAT_CHECK(l.dp >= 1 && l.tp >= 1 && l.pp >= 1 && l.dp <= kMaxRanks && l.tp <= kMaxRanks && l.pp <= kMaxRanks &&
                l.cp >= 1 && l.cp <= kMaxRanks && int64_t(l.world) == int64_t(l.dp) * l.tp * l.pp * l.cp &&
                l.zero >= 0 && l.zero <= 3 && l.virtual_stages >= 1 && l.ep >= 1 && l.dp % l.ep == 0,
            where, edited, "the layout: world ", l.world, " is not dp x tp x pp", l.cp > 1 ? " x cp" : "", " = ", l.dp,
            " x ", l.tp, " x ", l.pp, l.cp > 1 ? str_cat(" x ", l.cp) : std::string(),
            ", or zero, virtual_stages or ep is out of range)");
  // global_batch = micro_batch x accum x dp, without overflowing.
  const bool batch = m.global_batch % m.micro_batch == 0 && (m.global_batch / m.micro_batch) % m.accum == 0 &&
                     m.global_batch / m.micro_batch / m.accum == l.dp;
  SAT_CHECK(batch, where, edited, "'global_batch' ", m.global_batch, " is not micro_batch x accum x dp = ",
            m.micro_batch, " x ", m.accum, " x ", l.dp, ")");
  const bool slots = m.optimizer == "adamw" ? m.slots == std::vector<std::string>{"exp_avg", "exp_avg_sq"}
                     : m.optimizer == "sgd" ? m.slots.empty() || m.slots == std::vector<std::string>{"momentum_buffer"}
                                            : false;
  SAT_CHECK(slots, where, edited, "optimizer '", m.optimizer, "' does not keep the state arrays 'optimizer.slots' names)");
  SAT_CHECK(m.parameters == manifest_parameters(m), where, edited, "'parameters' is ", m.parameters, ", its 'param/' "
            "tensors hold ", manifest_parameters(m), ")");
  // The settings record the same run.
  auto setting = [&](const char* key, const std::string& want) {
    const auto it = m.settings.find(key);
    SAT_CHECK(it == m.settings.end() || it->second == want, where, edited, "'settings.", key, "' is ", it->second,
              ", the manifest's own field says ", want, ")");
  };
  setting("seed", std::to_string(m.seed));
  setting("shuffle", m.shuffle ? "1" : "0");
  setting("optimizer", m.optimizer);
  setting("global_batch", std::to_string(m.global_batch));
  setting("tp", std::to_string(l.tp));
  setting("pp", std::to_string(l.pp));
  setting("zero", std::to_string(l.zero));
  const auto steps = m.settings.find("steps");
  if (steps != m.settings.end() && steps->second != "0") setting("steps", std::to_string(m.total_steps));
}

}  // namespace

int64_t manifest_parameters(const Manifest& m) {
  int64_t n = 0;
  for (const auto& [name, t] : m.tensors)  // parse_manifest bounds each to 2^48 values; the sum saturates
    if (name.rfind("param/", 0) == 0 && t.shape.size() <= size_t(Shape::kMaxDims))
      n = std::min(n + Shape(t.shape).numel(), int64_t(1) << 62);
  return n;
}

std::string manifest_checksum(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  SAT_CHECK(!j.is_discarded() && j.is_object(), "a checkpoint manifest must be a JSON object");
  return checksum_of(std::move(j));
}

std::string checkpoint_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08lld", static_cast<long long>(step));
  return b;
}

int64_t checkpoint_step_of(const std::string& name, bool tmp) {
  const std::string prefix = tmp ? "." : "", suffix = tmp ? ".tmp" : "";
  if (name.size() < prefix.size() + suffix.size() + 13 || name.size() > prefix.size() + suffix.size() + 23 ||
      name.compare(0, prefix.size(), prefix) != 0 || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string mid = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());  // step-NNNNNNNN
  int64_t step = 0;
  for (size_t i = 5; i < mid.size(); ++i) {
    if (mid[i] < '0' || mid[i] > '9') return -1;
    step = step * 10 + (mid[i] - '0');
  }
  return checkpoint_name(step) == mid ? step : -1;  // only saturate's own spelling of the step
}

std::string temp_checkpoint_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / ("." + checkpoint_name(step) + ".tmp")).string();
}

std::string manifest_json(const Manifest& m) {
  json files = json::object();
  for (const auto& [name, f] : m.files) files[name] = {{"bytes", f.bytes}, {"crc32", f.crc32}};
  const CkptLayout& l = m.layout;
  json j = {{"format", kFormat},
            {"version", kVersion},
            {"model", m.model},
            {"parameters", m.parameters},
            {"step", m.step},
            {"total_steps", m.total_steps},
            {"epoch", m.epoch},
            {"step_in_epoch", m.step_in_epoch},
            {"global_batch", m.global_batch},
            {"micro_batch", m.micro_batch},
            {"accum", m.accum},
            {"seed", m.seed},
            {"shuffle", m.shuffle},
            {"optimizer", {{"name", m.optimizer}, {"steps", m.optimizer_steps}, {"slots", m.slots}}},
            {"layout",
             {{"world", l.world},
              {"dp", l.dp},
              {"tp", l.tp},
              {"pp", l.pp},
              {"zero", l.zero},
              {"virtual_stages", l.virtual_stages},
              {"sequence_parallel", l.sequence_parallel},
              {"schedule", l.schedule}}},
            {"losses", m.losses},
            {"files", files},
            {"tensors", tensors_json(m.tensors)},
            {"settings", m.settings}};
  if (m.seq_len > 0) j["seq_len"] = m.seq_len;
  if (l.cp > 1) j["layout"]["cp"] = l.cp;
  if (l.ep > 1) j["layout"]["ep"] = l.ep;
  if (!m.best_metric.empty()) j["best"] = {{"metric", m.best_metric}, {"value", m.best_value}, {"step", m.step}};
  j["checksum"] = checksum_of(j);
  return j.dump(1);
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(where, ": not valid JSON (", e.what(), ")");
  }
  SAT_CHECK(j.is_object(), where, ": not a checkpoint manifest (expected a JSON object)");
  const Reader r{where};
  SAT_CHECK(r.get<std::string>(j, "format", "") == kFormat, where, ": not a saturate checkpoint manifest");
  const int version = r.get<int>(j, "version", "");
  SAT_CHECK(version == kVersion, where, ": checkpoint format version ", version, ", this saturate reads ", kVersion);
  SAT_CHECK(j.contains("checksum"), where, ": the manifest has no checksum: it has been edited or damaged");
  SAT_CHECK(j["checksum"] == checksum_of(j), where, ": the manifest has been edited or damaged (its checksum does "
            "not match its content)");
  Manifest m;
  m.model = r.get<std::string>(j, "model", "");
  m.parameters = r.get<int64_t>(j, "parameters", "");
  m.step = r.get<int64_t>(j, "step", "");
  m.total_steps = r.get<int64_t>(j, "total_steps", "");
  m.epoch = r.get<int64_t>(j, "epoch", "");
  m.step_in_epoch = r.get<int64_t>(j, "step_in_epoch", "");
  m.global_batch = r.get<int64_t>(j, "global_batch", "");
  m.micro_batch = r.get<int64_t>(j, "micro_batch", "");
  m.accum = r.get<int64_t>(j, "accum", "");
  m.seed = r.get<uint64_t>(j, "seed", "");
  m.shuffle = r.get<bool>(j, "shuffle", "");
  if (j.contains("seq_len")) {
    m.seq_len = r.get<int64_t>(j, "seq_len", "");
    SAT_CHECK(m.seq_len >= 1, where, ": key 'seq_len' must be a positive window of tokens");
  }
  if (j.contains("best")) {
    m.best_metric = r.get<std::string>(j["best"], "metric", "best.");
    m.best_value = r.get<double>(j["best"], "value", "best.");
    SAT_CHECK((m.best_metric == "val_loss" || m.best_metric == "val_accuracy") && std::isfinite(m.best_value) &&
                  r.get<int64_t>(j["best"], "step", "best.") == m.step,
              where, ": key 'best' must name val_loss or val_accuracy, a finite value and the checkpoint's step");
  }
  SAT_CHECK(m.step >= 1 && m.step <= (int64_t(1) << 40) && m.epoch >= 0 && m.step_in_epoch >= 0 &&
                m.global_batch >= 1 && m.micro_batch >= 1 && m.accum >= 1 && m.parameters >= 0,
            where, ": the run's position (step, epoch, batch sizes) is out of range");
  const json& o = j.contains("optimizer") ? j["optimizer"] : json();
  m.optimizer = r.get<std::string>(o, "name", "optimizer.");
  m.optimizer_steps = r.get<int64_t>(o, "steps", "optimizer.");
  m.slots = r.get<std::vector<std::string>>(o, "slots", "optimizer.");
  const json& l = j.contains("layout") ? j["layout"] : json();
  m.layout.world = r.get<int>(l, "world", "layout.");
  m.layout.dp = r.get<int>(l, "dp", "layout.");
  m.layout.tp = r.get<int>(l, "tp", "layout.");
  m.layout.pp = r.get<int>(l, "pp", "layout.");
  m.layout.zero = r.get<int>(l, "zero", "layout.");
  m.layout.virtual_stages = r.get<int>(l, "virtual_stages", "layout.");
  m.layout.sequence_parallel = r.get<bool>(l, "sequence_parallel", "layout.");
  m.layout.schedule = r.get<std::string>(l, "schedule", "layout.");
  if (l.is_object() && l.contains("cp")) m.layout.cp = r.get<int>(l, "cp", "layout.");
  if (l.is_object() && l.contains("ep")) m.layout.ep = r.get<int>(l, "ep", "layout.");
  m.losses = r.get<std::vector<double>>(j, "losses", "");
  SAT_CHECK(j.contains("files") && j["files"].is_object(), where, ": key 'files' must be an object");
  for (const auto& [name, f] : j["files"].items()) {
    SAT_CHECK(!name.empty() && name.find('/') == std::string::npos && name.find("..") == std::string::npos &&
                  name.front() != '.',
              where, ": key 'files' names '", name, "', which is not a plain file name");
    m.files[name] = {r.get<uint64_t>(f, "bytes", "files." + name + "."),
                     r.get<uint32_t>(f, "crc32", "files." + name + ".")};
  }
  SAT_CHECK(j.contains("tensors"), where, ": key 'tensors' is missing");
  parse_tensors(r, j["tensors"], m);
  SAT_CHECK(j.contains("settings") && j["settings"].is_object(), where, ": key 'settings' must be an object");
  for (const auto& [key, value] : j["settings"].items())
    m.settings[key] = r.get<std::string>(j["settings"], key.c_str(), "settings.");
  check_consistent(m, where);
  return m;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  if (fs::exists(path)) (void)InputFile("checkpoint manifest", path);  // a FIFO or device: refused, not waited on
  std::ifstream f(path, std::ios::binary);
  SAT_CHECK(f, path, ": no checkpoint manifest (", std::strerror(errno), ")");
  f.seekg(0, std::ios::end);
  const auto size = f.tellg();
  SAT_CHECK(size >= 0 && size < (std::streamoff(256) << 20), path, ": a manifest of ", size, " bytes is not plausible");
  f.seekg(0);
  std::string text(size_t(size), '\0');
  f.read(text.data(), size);
  return parse_manifest(text, path);
}

void verify_checkpoint(const std::string& dir, const Manifest& m) {
  for (const auto& [name, want] : m.files) {
    const std::string path = (fs::path(dir) / name).string();
    std::error_code ec;
    SAT_CHECK(fs::is_regular_file(path, ec), path, ": missing (the checkpoint's manifest lists it)");
    const uint64_t size = fs::file_size(path, ec);
    SAT_CHECK(!ec && size == want.bytes, path, ": ", size, " bytes, the manifest says ", want.bytes, " (truncated?)");
    uint64_t read = 0;
    const uint32_t crc = file_crc(path, read);
    SAT_CHECK(read == want.bytes && crc == want.crc32, path, ": checksum mismatch (CRC-32 ", crc,
              ", the manifest says ", want.crc32, "): the file is corrupt");
  }
}

namespace {
bool complete(const fs::path& dir) {
  try {
    const Manifest m = read_manifest(dir.string());
    for (const auto& [name, f] : m.files) {
      std::error_code ec;
      if (fs::file_size(dir / name, ec) != f.bytes || ec) return false;
    }
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The complete checkpoints under root, oldest first.
std::vector<fs::path> checkpoints(const std::string& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (checkpoint_step_of(n) >= 0 && e.is_directory(ec) && complete(e.path())) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());  // fixed-width step numbers: name order is step order
  return out;
}
}  // namespace

std::string newest_checkpoint(const std::string& root) {
  const auto all = checkpoints(root);
  return all.empty() ? "" : all.back().string();
}

std::string resolve_checkpoint(const std::string& dir_or_root, const std::string& flag) {
  std::error_code ec;
  SAT_CHECK(fs::is_directory(dir_or_root, ec), flag, ": ", dir_or_root, " is not a directory");
  if (fs::exists(fs::path(dir_or_root) / kManifest, ec)) return dir_or_root;
  const std::string newest = newest_checkpoint(dir_or_root);
  SAT_CHECK(!newest.empty(), flag, ": ", dir_or_root, " holds no complete checkpoint (step-*/manifest.json)");
  return newest;
}

std::vector<uint8_t> read_logical(const std::string& dir, const Manifest& m, const std::string& name,
                                  const Shape& shape, DType dtype) {
  const std::string where = (fs::path(dir) / kManifest).string();
  auto it = m.tensors.find(name);
  SAT_CHECK(it != m.tensors.end(), where, ": the checkpoint has no tensor '", name,
            "' (a checkpoint of another model or optimizer?)");
  const CkptTensor& t = it->second;
  SAT_CHECK(Shape(t.shape) == shape, where, ": tensor '", name, "' has shape ", Shape(t.shape).str(),
            ", this model's is ", shape.str(), " (a checkpoint of another model?)");
  SAT_CHECK(t.dtype == safetensors_dtype(dtype), where, ": tensor '", name, "' is ", t.dtype, ", expected ",
            safetensors_dtype(dtype));
  const size_t elem = dtype_size(dtype);
  std::vector<uint8_t> full(size_t(shape.numel()) * elem);
  std::set<int> seen;
  int parts = 0;
  for (const CkptPiece& p : t.pieces) {
    ParamDecl d;
    d.name = name;
    d.spec.shape = shape;
    d.spec.dtype = dtype;
    if (p.dim >= 0 && p.parts > 1) {
      SAT_CHECK(p.dim < shape.nd && shape[p.dim] % (int64_t(p.parts) * p.stride) == 0, where, ": tensor '", name,
                "' has a piece that does not divide its shape");
      d.spec.shape.d[size_t(p.dim)] /= p.parts;
      d.shard.dim = p.dim, d.shard.parts = p.parts, d.shard.stride = p.stride, d.shard.index = p.index;
    }
    SAT_CHECK(parts == 0 || parts == std::max(p.parts, 1), where, ": tensor '", name,
              "' mixes pieces of different splits");
    parts = std::max(p.parts, 1);
    SAT_CHECK(seen.insert(p.index).second, where, ": tensor '", name, "' has piece ", p.index, " twice");
    const std::string path = (fs::path(dir) / p.file).string();
    SafetensorsFile file(path);
    const SafetensorsTensor* item = file.find(p.key);
    SAT_CHECK(item, path, ": no tensor '", p.key, "' (the manifest names it)");
    SAT_CHECK(Shape(item->shape) == d.spec.shape && item->dtype == t.dtype &&
                  item->end - item->begin == uint64_t(d.spec.shape.numel()) * elem,
              path, ": tensor '", p.key, "' is not the piece the manifest describes");
    std::vector<uint8_t> part(size_t(item->end - item->begin));
    file.read(*item, part.data());
    shard_insert_part(d, d.shard.index, part.data(), full.data(), elem);
  }
  SAT_CHECK(int(seen.size()) == parts, where, ": tensor '", name, "' has ", seen.size(), " of its ", parts, " pieces");
  return full;
}

void sync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  SAT_CHECK(fd >= 0, path, ": cannot open to sync: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  SAT_CHECK(rc == 0 || err == EINVAL, path, ": fsync failed: ", std::strerror(err));
}

void write_pieces(const std::string& dir, const std::string& file, const std::vector<CkptEntry>& entries, Manifest& m,
                  const std::string& data_schema) {
  std::vector<SafetensorsBlob> blobs;
  for (const CkptEntry& e : entries) {
    std::string key = e.name;
    if (e.dim >= 0 && e.parts > 1) key += "@tp" + std::to_string(e.index) + "/" + std::to_string(e.parts);
    blobs.push_back({key, e.dtype, e.shape, e.data});
    CkptTensor& t = m.tensors[e.name];
    t.shape = e.full_shape;
    t.dtype = safetensors_dtype(e.dtype);
    CkptPiece p{file, key};
    if (e.dim >= 0 && e.parts > 1) p.dim = e.dim, p.parts = e.parts, p.index = e.index, p.stride = e.stride;
    t.pieces.push_back(p);
  }
  const std::string path = (fs::path(dir) / file).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SAT_CHECK(fd >= 0, "--checkpoint-dir: cannot create ", path, ": ", std::strerror(errno));
  uint32_t crc = 0;
  uint64_t bytes = 0;
  try {
    SafetensorsMetadata metadata{{"format", "pt"}, {"producer", "saturate checkpoint"}};
    if (!data_schema.empty()) metadata.emplace_back(kDataSchemaKey, data_schema);
    bytes = write_safetensors(blobs, metadata, [&](const void* data, size_t n) { write_all(fd, data, n, path, crc); });
    SAT_CHECK(::fsync(fd) == 0, "--checkpoint-dir: fsync of ", path, " failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  SAT_CHECK(::close(fd) == 0, "--checkpoint-dir: closing ", path, " failed: ", std::strerror(errno));
  m.files[file] = {bytes, crc};
}

void merge_fragment(Manifest& into, const Manifest& fragment) {
  for (const auto& [name, f] : fragment.files) into.files[name] = f;
  for (const auto& [name, t] : fragment.tensors) {
    auto it = into.tensors.find(name);
    if (it == into.tensors.end()) {
      into.tensors[name] = t;
      continue;
    }
    // Another tensor-parallel part joins; a part already there is a second stage's copy.
    for (const CkptPiece& p : t.pieces) {
      bool have = false;
      for (const CkptPiece& q : it->second.pieces) have = have || q.index == p.index;
      if (!have) it->second.pieces.push_back(p);
    }
  }
}

void prune_checkpoints(const std::string& root, int keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (checkpoint_step_of(e.path().filename().string(), true) >= 0 && e.is_directory(ec)) fs::remove_all(e.path(), ec);
  if (keep <= 0) return;
  const auto all = checkpoints(root);
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i], ec);
}

}  // namespace sat
