#include "train/run_dir.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "core/error.h"
#include "core/io.h"

namespace sat {

namespace fs = std::filesystem;

namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

std::string host_name() {
  char h[256] = {0};
  return gethostname(h, sizeof h - 1) == 0 ? std::string(h) : std::string("?");
}

}  // namespace

RunDirectory::RunDirectory(std::string dir, bool resuming) : dir_(std::move(dir)) {
  check_output_dir("--out", dir_);
  for (const char* f : kRunResultFiles) {
    if (resuming && std::string(f) == "metrics.jsonl") continue;
    std::error_code ec;
    fs::remove(fs::path(dir_) / f, ec);
    SAT_CHECK(!ec, "--out: cannot remove the earlier run's ", dir_, "/", f, ": ", ec.message());
  }
  // An earlier run's --keep-best checkpoint (and what its writer left half done), unless
  // this run goes on with it; a directory "best" that is not a checkpoint is not touched.
  std::error_code ec;
  const fs::path best = fs::path(dir_) / "best";
  if (!resuming && fs::exists(best / "manifest.json", ec)) {
    fs::remove_all(best, ec);
    SAT_CHECK(!ec, "--out: cannot remove the earlier run's ", best.string(), ": ", ec.message());
  }
  if (!resuming)
    for (const char* stale : {".best.tmp", ".best.old"}) fs::remove_all(fs::path(dir_) / stale, ec);
  started_ = {{"started", utc_now()}, {"pid", long(getpid())}, {"host", host_name()}};
  mark("running", {});
}

RunDirectory::~RunDirectory() {
  if (ended_) return;
  try {
    mark("failed", {{"note", "the run ended with an error (see its output); metrics.jsonl holds the steps it did"}});
  } catch (...) {  // the "running" mark stays: still clearly incomplete
  }
}

void RunDirectory::mark(const std::string& status, nlohmann::ordered_json extra) {
  nlohmann::ordered_json j{{"status", status}};
  for (auto& [k, v] : started_.items()) j[k] = v;
  for (auto& [k, v] : extra.items()) j[k] = v;
  write_file_atomic("--out", dir_ + "/summary.json", j.dump(2) + "\n");
}

void RunDirectory::complete(nlohmann::ordered_json summary) {
  nlohmann::ordered_json j{{"status", "complete"}};
  for (auto& [k, v] : summary.items()) j[k] = v;
  j["started"] = started_["started"];
  j["ended"] = utc_now();
  write_file_atomic("--out", dir_ + "/summary.json", j.dump(2) + "\n");
  ended_ = true;
}

void RunDirectory::stopped(int signal, long long steps, const std::string& checkpoint) {
  mark("stopped", {{"signal", signal}, {"steps", steps}, {"checkpoint", checkpoint}, {"ended", utc_now()}});
  ended_ = true;
}

}  // namespace sat
