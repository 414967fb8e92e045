#include "train/signals.h"

#include <unistd.h>

#include <atomic>
#include <initializer_list>
#include <csignal>

namespace sat {

namespace {
std::atomic<int> g_signal{0};
std::atomic<int> g_interrupts{0};

extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_interrupts.fetch_add(1) >= 1) {
    static const char msg[] = "\nsaturate: second interrupt: stopping at once, without a checkpoint\n";
    [[maybe_unused]] ssize_t n = ::write(2, msg, sizeof msg - 1);
    ::_exit(130);
  }
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
}
}  // namespace

void install_stop_signals() {
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGUSR1, SIGINT}) sigaction(sig, &sa, nullptr);
}

int stop_signal_received() { return g_signal.load(); }

int stop_exit_status(int sig) { return 128 + sig; }

}  // namespace sat
