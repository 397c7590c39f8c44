// tandem calibrate: what sharing cores costs (api/src/calibrate_handles.hpp measure_corun_slowdown,
// measure_wakeup_latency; the models: simulator/compute/node_cpu.hpp, simulator/step.cpp; the wake-up ring:
// engine/train/wakeup_probe.hpp).
#include <sched.h>
#include <time.h>

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
#include "engine/train/wakeup_probe.hpp"

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

[[noreturn]] void sched_error(const char* call) {
  TANDEM_THROW(Status::kIo, "calibrate: measuring the wake-up latency on a shared core: {} failed: {}", call,
               std::strerror(errno));
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

WakeupFigures measure_wakeup_latency(const WakeupProbe& probe) {
  TANDEM_REQUIRE(probe.burst_s > 0 && probe.burst_s <= 0.1,
                 "calibrate: wake-up burst must be in (0, 100000] us, got {} us", probe.burst_s * 1e6);
  TANDEM_REQUIRE(probe.ranks_per_core >= 2 && probe.ranks_per_core <= 8,
                 "calibrate: wake-up ranks per core must be in [2, 8], got {}", probe.ranks_per_core);
  std::vector<int> cpus = allowed_cpus();
  if (cpus.empty()) sched_error("sched_getaffinity");
  if (cpus.size() > 8) cpus.resize(8);  // a ring of 2 x 8 threads already shows what each core does
  const int c = static_cast<int>(cpus.size());
  const Throttles th;
  engine::train::WakeupRingOptions shared;  // ranks as `tandem launch` starts them: unpinned, on the host's CPUs
  shared.ranks = probe.ranks_per_core * c;
  shared.cpus = cpus;
  shared.burst_s = probe.burst_s;
  shared.window_s = probe.window_s;
  if (!th.files.empty()) shared.throttles = [&th] { return th.count(); };
  // as many ranks as cores, unpinned alike (a pinned rank could not leave a core the machine's other work holds)
  engine::train::WakeupRingOptions alone = shared;
  alone.ranks = std::max(2, c);
  if (c == 1) alone.burst_s = 0;  // two ranks on the one core: nothing computes when a message arrives
  std::vector<std::vector<double>> busy, idle;
  WakeupFigures f;
  for (int rep = 0; rep < probe.repetitions; ++rep) {  // interleaved: the machine's other work meets both alike
    engine::train::WakeupSamples a = engine::train::sample_wakeups(alone);
    engine::train::WakeupSamples b = engine::train::sample_wakeups(shared);
    f.throttled += a.throttled + b.throttled;
    idle.push_back(std::move(a.latency_s));
    busy.push_back(std::move(b.latency_s));
  }
  f.wait_s = engine::train::wakeup_wait_s(busy, idle);
  std::vector<double> all_busy, all_idle;
  for (const auto& v : busy) all_busy.insert(all_busy.end(), v.begin(), v.end());
  for (const auto& v : idle) all_idle.insert(all_idle.end(), v.begin(), v.end());
  std::sort(all_busy.begin(), all_busy.end());
  auto q = [&](double p) {
    return all_busy.empty() ? 0.0 : all_busy[std::min(all_busy.size() - 1, static_cast<size_t>(p * all_busy.size()))];
  };
  f.note = fmt::format(
      "wake-up on shared cores: {} rank-like threads on {} CPU(s), {:.0f} us bursts, {} wake-ups: mean {:.0f} us "
      "(p50 {:.0f}, p90 {:.0f}, p99 {:.0f}), beside {:.0f} us with one rank per core ({} wake-ups){}; "
      "wakeup_latency_s {:.0f} us (median over {} repetitions of the difference)",
      shared.ranks, c, probe.burst_s * 1e6, all_busy.size(), engine::train::mean_of(all_busy) * 1e6, q(0.5) * 1e6,
      q(0.9) * 1e6, q(0.99) * 1e6, engine::train::mean_of(all_idle) * 1e6, all_idle.size(),
      f.throttled ? fmt::format(", {} left out in throttled periods", f.throttled) : std::string(), f.wait_s * 1e6,
      probe.repetitions);
  return f;
}

}  // namespace tandem::api
