#include "dist/verdict.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/text.h"

namespace sat::dist {

namespace {

constexpr size_t kMessageBytes = 4096;

// Waits for w, at most `grace` seconds when grace > 0 (false: it has not completed).
bool settle(const WorkPtr& w, double grace) {
  if (grace <= 0) {
    w->wait();
    return true;
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!w->done()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > grace) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

void print_rank_error(int rank, const std::string& message) {
  std::fprintf(stderr, "saturate: error on rank %d: %s\n", rank, printable(message).c_str());
  std::fflush(stderr);
}

bool agree_on_outcome(Comm& c, const std::string* error, Verdict& v, double grace) {
  // The first failing rank (size: none), then how many failed, then the first's message.
  int32_t counts[2] = {error ? c.rank() : c.size(), error ? 1 : 0};
  int32_t first = counts[0], failures = counts[1];
  if (!settle(c.all_reduce(&first, 1, DType::i32, ReduceOp::min), grace)) return false;
  if (!settle(c.all_reduce(&failures, 1, DType::i32, ReduceOp::sum), grace)) return false;
  v = Verdict{};
  if (first >= c.size()) return true;
  std::vector<char> text(kMessageBytes, 0);
  if (c.rank() == first) std::copy_n(error->data(), std::min(error->size(), kMessageBytes - 1), text.data());
  if (!settle(c.broadcast(text.data(), text.size(), DType::u8, first), grace)) return false;
  v.first = first;
  v.failures = failures;
  v.message = text.data();
  return true;
}

void agree_on_text(Comm& c, const std::string& mine, const std::string& what, const std::string& hint) {
  if (c.size() <= 1) return;
  int64_t n = c.rank() == 0 ? int64_t(mine.size()) : 0;
  c.broadcast_sync(&n, 1, DType::i64, 0);
  std::string first(size_t(n), '\0');
  if (c.rank() == 0) first = mine;
  if (n > 0) c.broadcast_sync(first.data(), size_t(n), DType::u8, 0);
  const bool differs = first != mine;
  const std::string error = differs ? str_cat(what, ": this rank has ", mine.empty() ? "none" : mine, " where rank 0 has ",
                                              first.empty() ? "none" : first, " (", hint, ")")
                                    : "";
  if (differs) print_rank_error(c.rank(), error);
  Verdict v;
  agree_on_outcome(c, differs ? &error : nullptr, v);
  if (!v.ok()) stop_with(c, v, differs);
}

void stop_with(const Comm& c, const Verdict& v, bool failed_here) {
  if (!failed_here) {
    const std::string others = v.failures > 1 ? str_cat(" (and on ", v.failures - 1, " other rank(s))") : "";
    std::fprintf(stderr, "saturate: rank %d stops: error on rank %d%s: %s\n", c.rank(), v.first, others.c_str(),
                 printable(v.message).c_str());
    std::fflush(stderr);
  }
  throw ReportedError(v.message);
}

}  // namespace sat::dist
