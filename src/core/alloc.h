// Every byte the engine uses for a training step is allocated here, so the test of
// the memory plan can compare the plan's prediction with what was really allocated,
// and a memory budget can be enforced (an allocation beyond it throws OutOfMemory,
// never crashes: on the CPU this makes the machine behave like a GPU of that size).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace sat {

struct MemoryStats {
  size_t current = 0;   // bytes allocated now through sat::alloc
  size_t peak = 0;      // high-water mark since the last reset_peak()
  size_t budget = 0;    // 0 = unlimited
  size_t allocations = 0;
  size_t failed = 0;    // allocations refused by the budget
};

// 64-byte aligned allocation, counted. `what` names the buffer in error messages.
void* mem_alloc(size_t bytes, const char* what);
void mem_free(void* p);
MemoryStats mem_stats();
void mem_reset_peak();
void mem_set_budget(size_t bytes);  // 0 = unlimited

// An owning, counted, aligned byte buffer (move-only).
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, const char* what) : bytes_(bytes) {
    ptr_ = bytes ? mem_alloc(bytes, what) : nullptr;
  }
  ~Buffer() { mem_free(ptr_); }
  Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) { mem_free(ptr_); ptr_ = o.ptr_; bytes_ = o.bytes_; o.ptr_ = nullptr; o.bytes_ = 0; }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

std::string format_bytes(double bytes);  // "12.3 MiB"

}  // namespace sat
