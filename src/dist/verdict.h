// The job's verdict on work each rank does on its own. Reading its files, checking its flags,
// opening its data: a rank can fail there while the others succeed (a data directory missing
// on one node, an MPMD command line that differs). If the failing rank then simply stopped,
// the others would wait for it in their next collective, or meet its error handling in a
// collective of another shape (MPI_ERR_TRUNCATE). So every such phase ends in a verdict, a
// collective that every rank reaches whatever happened to it: all learn whether any rank
// failed and the first failing rank's message, print one line each, and stop together
// (ReportedError: the CLI finalises MPI and exits with status 2 on every rank).
//
// The job's first verdict is taken where the job starts (make_world_comm, for the ranks that
// got there; end_job_after_input_error, for a rank that failed before): no other collective
// can come first, so a rank failing its setup ends the job within seconds, whichever it is.
#pragma once
#include <string>
#include <type_traits>

#include "core/error.h"
#include "dist/comm.h"

namespace sat::dist {

struct Verdict {
  int first = -1;       // the first failing rank (-1: none failed)
  int failures = 0;     // how many ranks failed
  std::string message;  // the first failing rank's
  bool ok() const { return failures == 0; }
};

// Collective over c: every rank's outcome (error: this rank's message, nullptr when it
// succeeded). grace > 0 bounds the wait for the other ranks in seconds: false when they
// have not all arrived by then (v is then unset). Messages longer than 4 KiB are cut.
bool agree_on_outcome(Comm& c, const std::string* error, Verdict& v, double grace = 0);

// Ends this rank's part for a verdict that failed: a rank that did not fail itself prints
// which rank failed and why (a failing rank printed its own line where it failed), then
// every rank throws ReportedError.
[[noreturn]] void stop_with(const Comm& c, const Verdict& v, bool failed_here);

// Collective over c: every rank's `mine` must equal rank 0's, or every rank stops
// (ReportedError) with the first differing rank's line: "WHAT: this rank has MINE where rank
// 0 has THEIRS (HINT)".
void agree_on_text(Comm& c, const std::string& mine, const std::string& what, const std::string& hint);

// "saturate: error on rank R: MESSAGE" on stderr.
void print_rank_error(int rank, const std::string& message);

// Runs fn (work each rank does on its own: no collective inside) and takes the verdict: on
// every rank fn's result, or on every rank ReportedError when any rank's fn threw sat::Error
// (its message printed by that rank and by every other). In a job of one: fn itself.
template <typename F>
auto on_every_rank(Comm& c, F&& fn) -> decltype(fn()) {
  if (c.size() <= 1) return fn();
  std::string error;
  auto settle = [&](bool failed) {
    if (failed) print_rank_error(c.rank(), error);
    Verdict v;
    agree_on_outcome(c, failed ? &error : nullptr, v);
    if (!v.ok()) stop_with(c, v, failed);
  };
  if constexpr (std::is_void_v<decltype(fn())>) {
    bool failed = false;
    try {
      fn();
    } catch (const ReportedError&) {
      throw;
    } catch (const Error& e) {
      failed = true, error = e.what();
    }
    settle(failed);
  } else {
    bool failed = false;
    decltype(fn()) r{};
    try {
      r = fn();
    } catch (const ReportedError&) {
      throw;
    } catch (const Error& e) {
      failed = true, error = e.what();
    }
    settle(failed);
    return r;
  }
}

}  // namespace sat::dist
