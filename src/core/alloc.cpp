#include "core/alloc.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace sat {
namespace {
std::mutex g_mu;
MemoryStats g_stats;
std::unordered_map<void*, size_t> g_sizes;
}  // namespace

void* mem_alloc(size_t bytes, const char* what) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_stats.budget && g_stats.current + bytes > g_stats.budget) {
    g_stats.failed++;
    throw OutOfMemory(str_cat("out of memory: allocating ", format_bytes(double(bytes)), " for ", what,
                              " would exceed the memory budget of ", format_bytes(double(g_stats.budget)),
                              " (", format_bytes(double(g_stats.current)), " in use)"));
  }
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw OutOfMemory(str_cat("out of memory: the system refused ", format_bytes(double(bytes)), " for ", what));
  g_sizes[p] = bytes;
  g_stats.current += bytes;
  g_stats.allocations++;
  if (g_stats.current > g_stats.peak) g_stats.peak = g_stats.current;
  return p;
}

void mem_free(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_sizes.find(p);
    if (it != g_sizes.end()) {
      g_stats.current -= it->second;
      g_sizes.erase(it);
    }
  }
  std::free(p);
}

MemoryStats mem_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

void mem_reset_peak() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.peak = g_stats.current;
}

void mem_set_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.budget = bytes;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

}  // namespace sat
