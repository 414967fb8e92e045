// A shell command run to its end, its standard output and error together: for tests that
// run the saturate binary (or mpirun) the way a user does.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace sat::test {

struct CmdResult {
  int status = -1;  // exit status (128 + signal when killed)
  std::string out;  // stdout and stderr
};

inline CmdResult run_command(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  CmdResult r;
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// mpirun, or "" when this machine has none (the test then skips).
inline std::string mpirun() {
  FILE* p = popen("command -v mpirun 2>/dev/null", "r");
  char buf[512] = {0};
  const bool found = p && fgets(buf, sizeof buf, p) != nullptr;
  if (p) pclose(p);
  std::string s = found ? std::string(buf) : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace sat::test
