#include "nn/kernel_choice.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cblas.h>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <optional>

#include "backend/cpu/blas.h"
#include "core/error.h"
#include "core/io.h"
#include "core/json.h"
#include "core/text.h"
#include "core/timer.h"

#if SAT_HAVE_DNNL
#include <dnnl.h>
#endif

namespace sat {

namespace fs = std::filesystem;

std::string KernelKey::str() const { return str_cat(kind, " ", shape, " ", dtype, " threads ", threads); }

const char* kernel_source_name(KernelChoice::Source s) {
  switch (s) {
    case KernelChoice::Source::measured: return "measured";
    case KernelChoice::Source::cache: return "cache";
    case KernelChoice::Source::only: return "only candidate";
  }
  return "?";
}

namespace {

std::mutex g_mu;  // the process's choices (setup may run on several threads: tests, fit)
std::vector<KernelChoice> g_choices;

bool cache_on() {
  const char* v = std::getenv("SAT_KERNEL_CACHE");
  const std::string s = v ? v : "";
  SAT_CHECK(s.empty() || s == "on" || s == "off", "SAT_KERNEL_CACHE: expected on or off, got '", s, "'");
  return s != "off";
}

// /proc/cpuinfo's first "model name" and the flags among those the kernels use.
std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown cpu", flags;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line) && !(have_model && have_flags)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = line.substr(0, line.find_first_of(" \t"));
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (!have_model && name == "model") {
      if (line.rfind("model name", 0) == 0) model = value, have_model = true;
    } else if (!have_flags && name == "flags") {
      for (const char* want : {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                               "amx_tile", "amx_bf16"})
        if ((" " + value + " ").find(std::string(" ") + want + " ") != std::string::npos) flags += str_cat(" ", want);
      have_flags = true;
    }
  }
  return model + " |" + flags;
}

std::string library_versions() {
  std::string v = str_cat("OpenBLAS ", openblas_get_config());
#if SAT_HAVE_DNNL
  const dnnl_version_t* d = dnnl_version();
  v += str_cat(" | oneDNN ", d->major, ".", d->minor, ".", d->patch, " ", d->hash ? d->hash : "");
#endif
  return v;
}

std::string cache_base() {  // tune_cache_dir's base (tune/policy.cpp)
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  return xdg && *xdg ? xdg : std::string(home && *home ? home : "/tmp") + "/.cache";
}

// The file's choices for this machine: key -> (chosen, ms per candidate). A file that does
// not parse, or holds something else, is ignored with a warning (it is rewritten).
using FileChoices = std::map<std::string, std::pair<std::string, std::vector<std::pair<std::string, double>>>>;

FileChoices read_cache(const std::string& path) {
  FileChoices out;
  std::error_code ec;
  if (!fs::exists(path, ec)) return out;
  try {
    const JsonRef doc = JsonRef::parse_file(path, "kernel cache");
    SAT_CHECK(doc.at("machine").string() == kernel_machine_key(), path, ": another machine's choices");
    for (const auto& [key, entry] : doc.at("choices").members()) {
      auto& [chosen, ms] = out[key];
      chosen = entry.at("chosen").string();
      for (const auto& [name, t] : entry.at("ms").members()) ms.emplace_back(name, t.number());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "saturate: ignoring the kernel cache %s (%s); it is written again\n", path.c_str(), e.what());
    out.clear();
  }
  return out;
}

void write_cache(const std::string& path, const FileChoices& all) {
  JsonValue doc = JsonValue::object();
  doc["machine"] = kernel_machine_key();
  JsonValue& ch = doc["choices"] = JsonValue::object();
  for (const auto& [key, entry] : all) {
    JsonValue e = JsonValue::object();
    e["chosen"] = entry.first;
    JsonValue& ms = e["ms"] = JsonValue::object();
    for (const auto& [name, t] : entry.second) ms[name] = json_number(double(int64_t(t * 1e4 + 0.5)) / 1e4);
    ch[key] = e;
  }
  write_file_atomic("kernel cache", path, doc.dump(1) + "\n");
}

// An exclusive lock on path + ".lock" for the scope (none when the directory cannot be
// made or the lock file opened: then the process goes on alone).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) return;
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// Best seconds per candidate (infinity: it threw). Each is built and warmed up, then the
// timed runs go round the candidates (A B C A B C ...), so that a burst of other work on a
// shared machine slows all of them rather than one; rounds go on while the shape's cap lasts.
std::vector<double> measure(const std::vector<std::string>& names,
                            const std::function<std::function<void()>(const std::string&)>& make_runner) {
  std::vector<double> best(names.size(), HUGE_VAL);
  std::vector<std::function<void()>> runs(names.size());
  auto guarded = [&](size_t i, bool timed) {
    try {
      if (!runs[i]) runs[i] = make_runner(names[i]);
      const double t0 = now_seconds();
      runs[i]();
      if (timed) best[i] = std::min(best[i], now_seconds() - t0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "saturate: kernel %s could not be measured (%s); left out\n", names[i].c_str(), e.what());
      runs[i] = nullptr;
      best[i] = -1;  // never again
    }
  };
  const double t_end = now_seconds() + kKernelShapeSeconds;
  for (size_t i = 0; i < names.size(); ++i) guarded(i, false);  // build and warm up
  for (int r = 0; r < kKernelReps && (r == 0 || now_seconds() < t_end); ++r)
    for (size_t i = 0; i < names.size(); ++i)
      if (best[i] >= 0) guarded(i, true);
  for (double& b : best)
    if (b < 0) b = HUGE_VAL;
  return best;
}

// Another thread may have chosen for the same key meanwhile: the last choice stands (both
// are candidates of the same key).
KernelChoice remember(KernelChoice c) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (KernelChoice& old : g_choices)
    if (old.key == c.key) return old = c;
  g_choices.push_back(c);
  return c;
}

}  // namespace

std::string kernel_machine_key() {
  static const std::string key = cpu_description() + " | " + library_versions();
  return key;
}

std::string kernel_cache_file() {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, as tune_cache_dir
  for (unsigned char c : kernel_machine_key()) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return cache_base() + "/saturate/tune/kernels-" + hex + ".json";
}

std::vector<KernelChoice> kernel_choices() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_choices;
}

void forget_kernel_choices() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_choices.clear();
}

std::string choose_kernel(const KernelKey& k, const std::vector<std::string>& names,
                          const std::function<std::function<void()>(const std::string&)>& make_runner) {
  SAT_CHECK(!names.empty(), "internal error: a kernel choice without candidates");
  KernelChoice c;
  c.key = k.str();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const KernelChoice& old : g_choices)
      if (old.key == c.key && std::find(names.begin(), names.end(), old.chosen) != names.end()) return old.chosen;
  }
  if (names.size() == 1) {
    c.chosen = names[0];
    c.source = KernelChoice::Source::only;
    return remember(c).chosen;
  }
  const bool file = cache_on();
  const std::string path = file ? kernel_cache_file() : "";
  std::optional<FileLock> lock;
  FileChoices all;
  if (file) {
    lock.emplace(path);
    all = read_cache(path);
    auto it = all.find(c.key);
    if (it != all.end() && std::find(names.begin(), names.end(), it->second.first) != names.end()) {
      c.chosen = it->second.first;
      c.ms = it->second.second;
      c.source = KernelChoice::Source::cache;
      return remember(c).chosen;
    }
  }
  const std::vector<double> best = measure(names, make_runner);
  size_t win = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (best[i] < best[win]) win = i;
    if (best[i] < HUGE_VAL) c.ms.emplace_back(names[i], 1e3 * best[i]);
  }
  c.chosen = names[win];
  c.source = KernelChoice::Source::measured;
  if (file) {
    all[c.key] = {c.chosen, c.ms};
    try {
      write_cache(path, all);
    } catch (const Error& e) {
      std::fprintf(stderr, "saturate: could not write the kernel cache (%s); carrying on\n", e.what());
    }
  }
  return remember(c).chosen;
}

namespace {

struct HeapBuffer {  // 64-byte aligned, outside sat::alloc's count
  void* p = nullptr;
  explicit HeapBuffer(size_t bytes) {
    p = ::operator new(std::max<size_t>(bytes, 64), std::align_val_t(64));
    std::memset(p, 0, std::max<size_t>(bytes, 64));
  }
  ~HeapBuffer() { ::operator delete(p, std::align_val_t(64)); }
  HeapBuffer(const HeapBuffer&) = delete;
  HeapBuffer& operator=(const HeapBuffer&) = delete;
};

struct Bench {
  std::shared_ptr<Layer> layer;
  std::vector<std::unique_ptr<HeapBuffer>> bufs;
  LayerCtx fwd, bwd;
  Tensor make(const TensorSpec& t, bool fill) {
    bufs.push_back(std::make_unique<HeapBuffer>(t.bytes()));
    Tensor x(bufs.back()->p, t.shape, t.dtype);
    if (fill && t.dtype == DType::f32) {
      uint32_t r = 12345;
      float* f = x.f32();
      for (int64_t i = 0; i < x.numel(); ++i) f[i] = float(int32_t((r = r * 1664525u + 1013904223u) >> 9) - (1 << 22)) * 1e-7f;
    }
    return x;
  }
};

}  // namespace

std::function<void()> layer_runner(std::shared_ptr<Layer> layer, const LayerSetup& s) {
  auto b = std::make_shared<Bench>();
  b->layer = std::move(layer);
  LayerCtx& c = b->fwd;
  c.training = s.training;
  for (const TensorSpec& t : s.inputs) {
    c.in.push_back(b->make(t, true));
    c.din.push_back(s.training ? b->make(t, false) : Tensor());
  }
  c.out = b->make(s.output, false);
  c.dout = s.training ? b->make(s.output, true) : Tensor();
  for (const ParamDecl& p : s.params) {
    c.params.push_back(b->make(p.spec, true));
    c.grads.push_back(s.training ? b->make(p.spec, false) : Tensor());
    c.accumulate.push_back(false);
  }
  for (const ParamDecl& p : s.states) c.states.push_back(b->make(p.spec, false));
  for (const TensorSpec& t : s.saved) c.saved.push_back(b->make(t, false));
  c.params_lp = c.params;
  b->bwd = c;
  for (const TensorSpec& t : s.scratch_fwd) b->fwd.scratch.push_back(b->make(t, false));
  for (const TensorSpec& t : s.scratch_bwd) b->bwd.scratch.push_back(b->make(t, false));
  return [b] {
    b->layer->forward(b->fwd);
    if (b->bwd.training) b->layer->backward(b->bwd);
  };
}

}  // namespace sat

namespace sat {

std::string kernel_choices_table() {
  const std::vector<KernelChoice> all = kernel_choices();
  if (all.empty()) return "";
  std::string out = str_cat("kernel choices (forward + backward ms per candidate, best of ", kKernelReps,
                            "; cache ", kernel_cache_file(), "):\n");
  for (const KernelChoice& c : all) {
    out += str_cat("  ", c.key, ": ", c.chosen, " (", kernel_source_name(c.source), ")");
    for (size_t i = 0; i < c.ms.size(); ++i)
      out += strf("%s%s %.3f", i == 0 ? "  " : ", ", c.ms[i].first.c_str(), c.ms[i].second);
    out += "\n";
  }
  return out;
}

}  // namespace sat
