// tandem calibrate: what sharing cores costs (api/src/calibrate_handles.hpp measure_corun_slowdown,
// measure_wakeup_latency; the model: simulator/compute/node_cpu.hpp).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "api/src/calibrate_handles.hpp"
#include "engine/compute/backend.hpp"
#include "engine/core/error.hpp"
#include "engine/core/host_info.hpp"
#include "engine/core/rng.hpp"
#include "engine/nn/model.hpp"

namespace tandem::api {

namespace {

double mono_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The CPUs this process may run on.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// One forward + loss + backward pass of `model` over a synthetic batch, as a training step runs it.
struct Pass {
  engine::nn::Model& model;
  Tensor x, labels;
  Pass(engine::nn::Model& m, int64_t batch, uint64_t seed) : model(m) {
    const engine::nn::ModelSpec& spec = m.spec();
    const engine::nn::SampleShape in = spec.input;
    const Shape xs = in.h * in.w == 1 ? Shape{batch, in.c} : Shape{batch, in.c, in.h, in.w};
    Rng rng(seed);
    x = Tensor::empty(xs, DType::kF32);
    float* px = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) px[i] = static_cast<float>(rng.uniform() * 2.0 - 1.0);
    labels = Tensor::empty(Shape{batch}, DType::kI32);
    int32_t* pl = labels.data<int32_t>();
    for (int64_t i = 0; i < batch; ++i)
      pl[i] = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(spec.num_classes()));
  }
  void run() {
    engine::compute::Backend& be = model.backend();
    const Tensor logits = model.forward(x, true);
    engine::compute::LossOutput loss = be.softmax_cross_entropy(logits, labels, true, 0);
    model.backward(loss.dlogits);
    be.synchronize();
  }
};

// k threads, each with its own backend (one compute thread) and copy of the model, pass back to back from a common
// start until `window_s` has passed (each at least once): the median thread CPU seconds of a pass over every
// thread's passes (a few passes disturbed by the machine's other work do not move it).
double corun_cpu_per_pass(const engine::nn::ModelSpec& spec, const std::string& backend, int64_t batch, int k,
                          double window_s) {
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  bool go = false;
  double start = 0;
  std::vector<std::vector<double>> per_pass(static_cast<size_t>(k));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(k));
  std::vector<std::thread> threads;
  for (int t = 0; t < k; ++t) {
    threads.emplace_back([&, t] {
      try {
        engine::compute::BackendOptions bo;
        bo.num_threads = 1;
        auto be = engine::compute::make_backend(backend, bo);
        engine::nn::Model model(spec, *be, 1);
        Pass pass(model, batch, 7 + static_cast<uint64_t>(t));
        pass.run();  // the backend builds its primitives here
        {
          std::unique_lock lock(mu);
          ++ready;
          cv.notify_all();
          cv.wait(lock, [&] { return go; });
        }
        std::vector<double>& mine = per_pass[static_cast<size_t>(t)];
        do {
          const double c0 = thread_cpu_s();
          pass.run();
          mine.push_back(thread_cpu_s() - c0);
        } while (mono_s() - start < window_s);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
        std::unique_lock lock(mu);
        ++ready;
        cv.notify_all();
      }
    });
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return ready == k; });
    start = mono_s();
    go = true;
    cv.notify_all();
  }
  for (std::thread& th : threads) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<double> all;
  for (const auto& v : per_pass) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  return all[all.size() / 2];
}

// The cgroup's count of throttled periods (cpu.stat nr_throttled, summed from this process's cgroup up to the
// mounted root); 0 without a cgroup.
struct Throttles {
  std::vector<std::string> files;
  Throttles() {
    const auto cg = find_cgroup("cpu");
    if (!cg) return;
    std::string rel = cg->path;
    if (cg->mount_root != "/" && rel.rfind(cg->mount_root, 0) == 0) rel = rel.substr(cg->mount_root.size());
    for (;;) {
      files.push_back(cg->mount + (rel == "/" ? std::string() : rel) + "/cpu.stat");
      if (rel.empty() || rel == "/") break;
      const size_t slash = rel.find_last_of('/');
      rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
    }
  }
  long count() const {
    long total = 0;
    for (const std::string& f : files) {
      std::ifstream in(f);
      std::string key;
      long v = 0;
      while (in >> key >> v)
        if (key == "nr_throttled") total += v;
    }
    return total;
  }
};

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::sched_setaffinity(0, sizeof set, &set);
}

[[noreturn]] void sched_error(const char* call) {
  TANDEM_THROW(Status::kIo, "calibrate: measuring the wake-up latency on a shared core: {} failed: {}", call,
               std::strerror(errno));
}

// Child processes, killed and reaped on scope exit.
struct Children {
  std::vector<pid_t> pids;
  ~Children() {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  }
};

// Round trips of one byte between this thread and an echoing process, both pinned to `cpu`, one every ~1 ms (so
// that each side sleeps before it is woken); rounds during which the cgroup was throttled are left out. Returns the
// mean round trip, or -1 with fewer than 20 rounds kept.
double mean_round_trip(int to_echo, int from_echo, int rounds, double deadline_s, const Throttles& th) {
  double sum = 0;
  int kept = 0;
  const double end = mono_s() + deadline_s;
  char b = 'p';
  for (int i = 0; i < rounds + 5 && mono_s() < end; ++i) {
    const timespec gap{0, 1000000};
    ::nanosleep(&gap, nullptr);
    const long before = th.files.empty() ? 0 : th.count();
    const double t0 = mono_s();
    if (::write(to_echo, &b, 1) != 1) sched_error("write");
    if (::read(from_echo, &b, 1) != 1) sched_error("read");
    const double rtt = mono_s() - t0;
    if (i < 5) continue;  // warm-up
    if (!th.files.empty() && th.count() != before) continue;
    sum += rtt;
    ++kept;
  }
  return kept >= 20 ? sum / kept : -1.0;
}

}  // namespace

std::vector<std::pair<double, double>> measure_corun_slowdown(const engine::nn::ModelSpec& spec,
                                                             const std::string& backend, int64_t batch) {
  const std::vector<int> cpus = allowed_cpus();
  const int cores = std::max<int>(1, static_cast<int>(cpus.size()));
  const double quota = cgroup_cpu_quota_cores().value_or(static_cast<double>(cores));
  const double speed = std::min(static_cast<double>(cores), quota);  // cores' worth of CPU the threads share
  std::vector<int> ks = {1};
  for (int k : {cores, 2 * cores})
    if (k > ks.back() && k <= 8) ks.push_back(k);
  std::vector<std::pair<double, double>> table;
  double alone = 0;
  for (int k : ks) {
    // ~5 passes per thread at its share of the CPU, within [0.5, 3] s
    const double window = alone > 0 ? std::clamp(5.0 * k * alone / speed, 0.5, 3.0) : 0.5;
    const double per_pass = corun_cpu_per_pass(spec, backend, batch, k, window);
    if (k == 1) alone = per_pass;
    table.emplace_back(static_cast<double>(k) / cores, per_pass / alone);
  }
  return table;
}

double measure_wakeup_latency() {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.empty()) sched_error("sched_getaffinity");
  // the echo (and later the competitor) on the first core; this thread on another where there is one, so that only
  // the echo's wake-up meets the competitor (one hop per round trip), else on the same (two hops)
  const int shared_cpu = cpus.front(), my_cpu = cpus.size() > 1 ? cpus[1] : cpus.front();
  const double hops = cpus.size() > 1 ? 1.0 : 2.0;
  int to_echo[2], from_echo[2];
  if (::pipe2(to_echo, O_CLOEXEC) != 0) sched_error("pipe2");
  if (::pipe2(from_echo, O_CLOEXEC) != 0) {
    ::close(to_echo[0]);
    ::close(to_echo[1]);
    sched_error("pipe2");
  }
  struct Close {
    int* a;
    int* b;
    ~Close() {
      for (int fd : {a[0], a[1], b[0], b[1]}) ::close(fd);
    }
  } close_pipes{to_echo, from_echo};
  Children kids;
  const pid_t echo = ::fork();
  if (echo < 0) sched_error("fork");
  if (echo == 0) {  // the echo: answers each byte until killed
    pin_to(shared_cpu);
    char b = 0;
    while (::read(to_echo[0], &b, 1) == 1)
      if (::write(from_echo[1], &b, 1) != 1) break;
    ::_exit(0);
  }
  kids.pids.push_back(echo);
  const Throttles th;
  cpu_set_t saved;  // this thread pinned for the measurement, then as it was
  CPU_ZERO(&saved);
  ::sched_getaffinity(0, sizeof saved, &saved);
  pin_to(my_cpu);
  struct Restore {
    cpu_set_t& s;
    ~Restore() { ::sched_setaffinity(0, sizeof s, &s); }
  } restore{saved};
  const double quiet = mean_round_trip(to_echo[1], from_echo[0], 200, 2.0, th);
  const pid_t hog = ::fork();
  if (hog < 0) sched_error("fork");
  if (hog == 0) {  // a runnable competitor on the echo's core: spins until killed (at most 10 s)
    pin_to(shared_cpu);
    const double end = mono_s() + 10.0;
    while (mono_s() < end) {
    }
    ::_exit(0);
  }
  kids.pids.push_back(hog);
  const double busy = mean_round_trip(to_echo[1], from_echo[0], 200, 4.0, th);
  if (quiet < 0 || busy < 0) return 0;  // too few rounds outside throttled periods: not measured
  return std::max(0.0, (busy - quiet) / hops);
}

}  // namespace tandem::api
