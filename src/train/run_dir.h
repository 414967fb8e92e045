// One run's --out directory, always one run's: complete, or clearly marked incomplete.
//
// summary.json is the mark. When the run starts it says "status": "running" (with the
// process and the start time): a run killed at any moment leaves that behind, never an
// earlier run's summary beside its own partial metrics.jsonl. The results of an earlier run
// that this one replaces (--overwrite) are removed then, not kept to be mistaken for its
// own. A run that ends normally writes its summary with "status": "complete"; one stopped by
// a signal "stopped" (with its checkpoint), one that fails "failed" (best effort: on a full
// disk the "running" mark stays).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace sat {

// The files a run writes in its --out directory.
inline constexpr const char* kRunResultFiles[] = {"metrics.jsonl", "summary.json", "config.toml", "table.json",
                                                  "images.json",   "tune.json",    "tune.html",   "report.html"};

class RunDirectory {
 public:
  // Claims dir (whose earlier results the caller has checked may be replaced): removes them
  // (all but metrics.jsonl and the --keep-best checkpoint best/ when `resuming`: the resumed
  // run goes on with them) and marks the directory running. sat::Error naming --out when it cannot be written.
  RunDirectory(std::string dir, bool resuming);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  // The run's summary, marked "complete".
  void complete(nlohmann::ordered_json summary);
  // Stopped by a signal after `steps`, its checkpoint `checkpoint` ("" when none).
  void stopped(int signal, long long steps, const std::string& checkpoint);

 private:
  void mark(const std::string& status, nlohmann::ordered_json extra);

  std::string dir_;
  nlohmann::ordered_json started_;
  bool ended_ = false;
};

}  // namespace sat
