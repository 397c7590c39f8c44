#pragma once
// Ranks as threads: each thread builds its own backend, model and communicator (inproc transport,
// one MemoryStore), runs a body and reports failures as strings (Boost.Test assertions are not
// thread-safe), which the test's thread then checks.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/bootstrap.hpp"
#include "engine/comm/communicator.hpp"
#include "engine/compute/backend.hpp"
#include "engine/core/error.hpp"
#include "engine/data/dataset.hpp"
#include "engine/nn/model.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/parallel/parallel_trainer.hpp"
#include "engine/train/trainer.hpp"
#include "transports/memory_store.hpp"

namespace tandem::testing {

namespace comm = engine::comm;
namespace data = engine::data;
namespace nn = engine::nn;
namespace par = engine::parallel;
namespace train = engine::train;

struct RankError {
  Status status = Status::kOk;
  std::string message;
};

// Runs fn(rank, world) on n threads; returns each rank's failure (status kOk when none).
inline std::vector<RankError> run_world(int n, comm::CommOptions opts,
                                        const std::function<void(int, comm::Communicator&)>& fn) {
  auto store = std::make_shared<transports::MemoryStore>();
  std::vector<RankError> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  opts.transport = "inproc";
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::BootstrapInfo info;
        info.rank = r;
        info.size = n;
        info.host = "localhost";
        auto world = comm::Communicator::create(info, store, opts);
        fn(r, *world);
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = {e.status(), e.what()};
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = {Status::kInternal, e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// A logger that keeps what it is told (install it on a rank's thread with log::Scope).
struct Captured {
  std::mutex mu;
  std::vector<std::string> lines;
  static void sink(int, const char* m, void* user) {
    auto* c = static_cast<Captured*>(user);
    std::lock_guard lock(c->mu);
    c->lines.emplace_back(m);
  }
  bool contains(const std::string& needle) {
    std::lock_guard lock(mu);
    for (const auto& l : lines)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

// Synthetic 1x12x12 images of 4 classes (256 to train, 64 to test) and LeNet-5 for them: the parameter-server tests'.
inline const data::Dataset& synthetic12_train() {
  static const data::Dataset d = data::make_synthetic(1, 12, 12, 4, 256, 1);
  return d;
}
inline const data::Dataset& synthetic12_test() {
  static const data::Dataset d = data::make_synthetic(1, 12, 12, 4, 64, 2);
  return d;
}
inline nn::ModelSpec lenet12() { return nn::zoo_model("lenet5", {1, 12, 12}, 4); }

// The elastic tests' communicator options: a death is seen at once; the deadline only bounds the worst case.
inline comm::CommOptions quick_deadline() {
  comm::CommOptions o;
  o.timeout = std::chrono::milliseconds(4000);
  return o;
}

// The options of jobs whose ranks are threads calling comm::create_communicator(rank, size, "127.0.0.1", port,
// secret, inproc()). inproc opens nothing: it names a job by its address, port, secret and starting size, so each
// case takes its own port (unique_port). The deadline, 10 s, only bounds a hang.
inline comm::CommOptions inproc() {
  comm::CommOptions o;
  o.transport = "inproc";
  o.timeout = std::chrono::milliseconds(10000);
  return o;
}

inline int unique_port(int salt) { return 20000 + static_cast<int>((::getpid() * 7 + salt) % 20000); }

// A rank started later that joins such a job (of `job_size` ranks at its start): asks, waits up to 30 s for the
// job to admit it at a step boundary and returns the grown world.
inline std::unique_ptr<comm::Communicator> join_job(int index, int port, const std::string& secret, int job_size = 2) {
  comm::BootstrapConfig bc;
  bc.info.rank = index;
  bc.info.size = job_size;
  bc.master_addr = "127.0.0.1";
  bc.master_port = port;
  bc.secret = secret;
  return comm::join_communicator(bc, inproc(), std::chrono::milliseconds(30000));
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Waits until `pred` holds, polling every 5 ms; after 20 s gives up with an error naming `what` (a bound on a hang,
// not a timing the test relies on). A collective predicate (Communicator::pending_joins) must be polled by every
// rank of its communicator: they all get the same answer, so they all poll the same number of times.
template <typename P>
void wait_for(P pred, const char* what) {
  for (int k = 0; k < 4000; ++k) {
    if (pred()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw std::runtime_error(fmt::format("timed out after 20 s waiting for {}", what));
}

inline void require_no_errors(const std::vector<RankError>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    BOOST_REQUIRE_MESSAGE(errors[r].status == Status::kOk, "rank " << r << ": " << errors[r].message);
}

inline std::unique_ptr<engine::compute::Backend> one_thread_backend(const std::string& name = "cpu") {
  engine::compute::BackendOptions o;
  o.num_threads = 1;
  return engine::compute::make_backend(name, o);
}

// The whole model's layout: the layers `m` holds (a pipeline stage holds only its own) at their offsets, zeros
// elsewhere.
inline std::vector<float> host_params(nn::Model& m) {
  std::vector<float> out(static_cast<size_t>(m.total_params()), 0.0f);
  const Tensor h = m.backend().to_host(m.params());
  const float* p = h.data<float>();
  std::copy(p, p + h.numel(), out.begin() + m.param_offset(m.held_begin()));
  return out;
}

// max |a - b| / max |b|
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

inline train::TrainerConfig sgd_config(int64_t batch, int64_t limit_batches = 0) {
  train::TrainerConfig c;
  c.batch_size = batch;
  c.optimizer.kind = engine::optim::OptimizerKind::kSgd;
  c.optimizer.lr = 0.05f;
  c.optimizer.momentum = 0.9f;
  c.seed = 7;
  c.prefetch = 0;
  c.limit_batches = limit_batches;
  return c;
}

// Single-process reference: `steps` steps of train::Trainer on the global batch.
inline std::vector<float> reference_params(const nn::ModelSpec& spec, const data::Dataset& train_set,
                                           const train::TrainerConfig& cfg, int steps, uint64_t model_seed = 3) {
  auto be = one_thread_backend();
  nn::Model m(spec, *be, model_seed);
  train::Trainer t(m, train_set, nullptr, cfg);
  for (int i = 0; i < steps; ++i) {
    const train::StepResult s = t.step();
    BOOST_REQUIRE(s.samples > 0);
  }
  return host_params(m);
}

struct ParallelRun {
  std::vector<std::vector<float>> params;  // per rank: host_params (the rank's stage, zeros elsewhere)
  std::vector<std::vector<int32_t>> bounds;
  std::vector<par::Grid> grids;
  std::vector<par::TimeSplit> splits;
  // The trained model assembled from replica 0's stages.
  std::vector<float> assembled(const nn::ModelSpec& spec) const;
};

inline std::vector<float> ParallelRun::assembled(const nn::ModelSpec& spec) const {
  auto be = one_thread_backend("reference");
  nn::Model m(spec, *be, 0);  // only for offsets
  std::vector<float> out(params[0].size());
  const par::Grid& g = grids[0];
  for (int s = 0; s < g.pp; ++s) {
    const auto& b = bounds[0];
    const int64_t p0 = m.param_offset(static_cast<size_t>(b[static_cast<size_t>(s)]));
    const int64_t p1 = m.param_offset(static_cast<size_t>(b[static_cast<size_t>(s) + 1]));
    const auto& src = params[static_cast<size_t>(g.rank_of(0, s))];
    std::copy(src.begin() + p0, src.begin() + p1, out.begin() + p0);
  }
  return out;
}

// Trains `steps` steps with `world` ranks; every rank's model starts from model_seed.
inline ParallelRun run_parallel(const nn::ModelSpec& spec, const data::Dataset& train_set,
                                const train::TrainerConfig& cfg, const par::ParallelConfig& pcfg, int world, int steps,
                                comm::CommOptions opts = {}, uint64_t model_seed = 3) {
  ParallelRun run;
  run.params.resize(static_cast<size_t>(world));
  run.bounds.resize(static_cast<size_t>(world));
  run.grids.resize(static_cast<size_t>(world));
  run.splits.resize(static_cast<size_t>(world));
  const auto errors = run_world(world, opts, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(spec, *be, model_seed);
    par::ParallelTrainer t(m, train_set, nullptr, cfg, pcfg, &c);
    for (int i = 0; i < steps; ++i) {
      const train::StepResult s = t.step();
      if (s.samples == 0) throw std::runtime_error("ran out of batches");
    }
    run.params[static_cast<size_t>(r)] = host_params(m);
    run.bounds[static_cast<size_t>(r)] = t.boundaries();
    run.grids[static_cast<size_t>(r)] = t.grid();
    run.splits[static_cast<size_t>(r)] = t.local_split();
  });
  require_no_errors(errors);
  return run;
}

}  // namespace tandem::testing
