#include "engine/train/wakeup_probe.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <system_error>
#include <thread>

#include "engine/core/error.hpp"

namespace tandem::engine::train {

namespace {

int64_t now_ns(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void ring_error(const char* what) {
  TANDEM_THROW(Status::kIo, "calibrate: measuring the wake-up latency on shared cores: {} failed: {}", what,
               std::strerror(errno));
}

// Busy work for `ns` of this thread's CPU time.
void burn(int64_t ns) {
  const int64_t end = now_ns(CLOCK_THREAD_CPUTIME_ID) + ns;
  volatile uint64_t x = 1;
  while (now_ns(CLOCK_THREAD_CPUTIME_ID) < end)
    for (int i = 0; i < 64; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
}

void set_affinity(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
}

// The pipes of the ring: pipes[i] carries thread i's messages to thread (i + 1) % n.
struct Pipes {
  std::vector<int> read_fd, write_fd;
  explicit Pipes(int n) {
    for (int i = 0; i < n; ++i) {
      int fd[2];
      if (::pipe2(fd, O_CLOEXEC) != 0) ring_error("pipe2");
      read_fd.push_back(fd[0]);
      write_fd.push_back(fd[1]);
    }
  }
  Pipes(const Pipes&) = delete;
  Pipes& operator=(const Pipes&) = delete;
  ~Pipes() {
    for (int fd : read_fd) ::close(fd);
    for (int& fd : write_fd)
      if (fd >= 0) ::close(fd);
  }
};

}  // namespace

double mean_of(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

WakeupSamples sample_wakeups(const WakeupRingOptions& o) {
  TANDEM_REQUIRE(o.ranks >= 2 && o.ranks <= 64, "wake-up ring: ranks must be in [2, 64], got {}", o.ranks);
  TANDEM_REQUIRE(o.burst_s >= 0 && o.burst_s <= 0.1, "wake-up ring: burst_s must be in [0, 0.1] s, got {}", o.burst_s);
  TANDEM_REQUIRE(o.window_s > 0 && o.window_s <= 10, "wake-up ring: window_s must be in (0, 10] s, got {}", o.window_s);
  const int n = o.ranks;
  Pipes pipes(n);
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<WakeupSamples> per(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  const int64_t burst_ns = static_cast<int64_t>(o.burst_s * 1e9);
  auto rank = [&](int i) {
    WakeupSamples& mine = per[static_cast<size_t>(i)];
    const int in = pipes.read_fd[static_cast<size_t>((i + n - 1) % n)];
    int& out = pipes.write_fd[static_cast<size_t>(i)];
    try {
      set_affinity(o.cpus);
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      for (int64_t round = 0;; ++round) {
        if (round >= 2 && stop.load()) break;
        burn(burst_ns);
        const int64_t sent = now_ns(CLOCK_MONOTONIC);
        if (::write(out, &sent, sizeof sent) != static_cast<ssize_t>(sizeof sent)) ring_error("write");
        const long t0 = o.throttles ? o.throttles() : 0;
        const int64_t blocked = now_ns(CLOCK_MONOTONIC);
        pollfd p{in, POLLIN, 0};
        const int ready_fds = ::poll(&p, 1, 10000);
        if (ready_fds < 0) ring_error("poll");
        if (ready_fds == 0) {
          errno = ETIMEDOUT;
          ring_error("a message within 10 s");
        }
        int64_t stamp = 0;
        const ssize_t got = ::read(in, &stamp, sizeof stamp);
        const int64_t woke = now_ns(CLOCK_MONOTONIC);
        if (got == 0) break;  // the previous thread stopped
        if (got != static_cast<ssize_t>(sizeof stamp)) ring_error("read");
        ++mine.messages;
        if (stamp < blocked) continue;  // it was there before this thread blocked: no wake-up
        if (o.throttles && o.throttles() != t0) {
          ++mine.throttled;
          continue;
        }
        mine.latency_s.push_back(1e-9 * static_cast<double>(woke - stamp));
      }
    } catch (...) {
      errors[static_cast<size_t>(i)] = std::current_exception();
    }
    ::close(out);  // the next thread reads the end of the ring
    out = -1;
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  try {
    for (int i = 0; i < n; ++i) threads.emplace_back(rank, i);
  } catch (const std::system_error& e) {  // the ring ends at the last thread made: its reader sees the pipe close
    for (size_t j = threads.size(); j < static_cast<size_t>(n); ++j) {
      ::close(pipes.write_fd[j]);
      pipes.write_fd[j] = -1;
    }
    stop.store(true);
    go.store(true);
    for (std::thread& t : threads) t.join();
    TANDEM_THROW(Status::kIo, "calibrate: measuring the wake-up latency on shared cores: thread {} of {}: {}",
                 threads.size(), n, e.what());
  }
  while (ready.load() < n) std::this_thread::yield();
  go.store(true);
  const timespec window{static_cast<time_t>(o.window_s),
                        static_cast<long>((o.window_s - static_cast<time_t>(o.window_s)) * 1e9)};
  ::nanosleep(&window, nullptr);
  stop.store(true);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  WakeupSamples all;
  for (const WakeupSamples& s : per) {
    all.latency_s.insert(all.latency_s.end(), s.latency_s.begin(), s.latency_s.end());
    all.messages += s.messages;
    all.throttled += s.throttled;
  }
  return all;
}

double wakeup_wait_s(const std::vector<std::vector<double>>& shared, const std::vector<std::vector<double>>& alone) {
  TANDEM_REQUIRE(shared.size() == alone.size(),
                 "wake-up wait: {} shared repetitions against {} baseline ones (they are paired)", shared.size(),
                 alone.size());
  std::vector<double> diffs;
  for (size_t i = 0; i < shared.size(); ++i)
    if (!shared[i].empty() && !alone[i].empty()) diffs.push_back(mean_of(shared[i]) - mean_of(alone[i]));
  if (diffs.empty()) return 0;
  std::sort(diffs.begin(), diffs.end());
  const size_t m = diffs.size();
  const double median = m % 2 ? diffs[m / 2] : 0.5 * (diffs[m / 2 - 1] + diffs[m / 2]);
  return std::max(0.0, median);
}

}  // namespace tandem::engine::train
