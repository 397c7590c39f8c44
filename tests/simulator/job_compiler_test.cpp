// One job, two executors: the job a parallel trainer runs and the job the simulator times are the same compiled
// object (engine/parallel/job.hpp). Trainers run one step on 2 ranks (threads, inproc transport); the simulator
// compiles the same description for a cluster, and a prediction times the trainer's own compiled job.
#include <boost/test/unit_test.hpp>

#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/nn/zoo.hpp"
#include "simulator/cluster.hpp"
#include "simulator/job.hpp"
#include "simulator/simulate.hpp"
#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;
namespace sim = tandem::simulator;
namespace tt = boost::test_tools;

namespace {

const data::Dataset& train_set() {
  static const data::Dataset d = data::make_synthetic(1, 12, 12, 4, 256, 1);
  return d;
}
nn::ModelSpec lenet() { return nn::zoo_model("lenet5", {1, 12, 12}, 4); }

// What each of 2 ranks compiled, after one training step.
std::vector<par::CompiledJob> run_one_step(const par::ParallelConfig& p, int64_t batch) {
  std::vector<par::CompiledJob> jobs(2);
  require_no_errors(run_world(2, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, sgd_config(batch, 1), p, &c);
    const train::StepResult s = t.step();
    if (s.samples != batch) throw Error(Status::kInternal, "the step trained no full batch");
    jobs[static_cast<size_t>(r)] = t.job();
  }));
  return jobs;
}

// The same job as a simulator description (sgd_config: SGD with momentum 0.9, the simulator's "momentum").
sim::JobSpec description(const par::ParallelConfig& p, int64_t batch) {
  sim::JobSpec j;
  j.model_spec = lenet();
  j.dataset = "";
  j.samples = 256;
  j.input = nn::SampleShape{1, 12, 12};
  j.classes = 4;
  j.batch = batch;
  j.strategy = p.strategy;
  j.dp = p.dp;
  j.pp = p.pp;
  j.micro_batches = p.micro_batches;
  j.schedule = p.schedule;
  j.bucket_mb = p.bucket_mb;
  j.compression = p.compression;
  j.optimizer = sim::OptimizerKind::kMomentum;
  j.prefetch = 0;  // sgd_config's loader assembles on the training thread: no batches ahead (StageMemory::loader_bytes
                   // holds the evaluation's alone)
  return j;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(job_compiler_two_executors)

BOOST_AUTO_TEST_CASE(trainer_and_simulator_compile_the_same_job) {
  par::ParallelConfig ddp;
  ddp.strategy = par::Strategy::kDdp;
  ddp.bucket_mb = 0.02;  // several buckets
  ddp.compression = par::GradCompression::kF16;
  par::ParallelConfig pipe;
  pipe.strategy = par::Strategy::kPipeline;
  pipe.micro_batches = 4;
  pipe.schedule = par::ScheduleKind::kGPipe;
  const sim::ClusterSpec cluster = sim::parse_cluster("c5.large:2");
  for (const par::ParallelConfig& p : {ddp, pipe}) {
    const std::vector<par::CompiledJob> ran = run_one_step(p, 16);
    BOOST_TEST(par::compare_compiled_jobs(ran[0], ran[1]) == "", "the two ranks compiled different jobs");
    sim::Simulation s;
    const par::CompiledJob simulated = s.compile(cluster, description(p, 16));
    // field by field: cut, schedule ops, buckets and their all-reduce requests, memory
    BOOST_TEST(par::compare_compiled_jobs(ran[0], simulated) == "", par::compare_compiled_jobs(ran[0], simulated));
    BOOST_TEST(ran[0].boundaries == simulated.boundaries);
    BOOST_REQUIRE(ran[0].stages.size() == simulated.stages.size());
    for (size_t st = 0; st < ran[0].stages.size(); ++st) {
      BOOST_TEST(ran[0].stages[st].memory.total() == simulated.stages[st].memory.total());
      BOOST_TEST(ran[0].stages[st].bucket_allreduces.size() == simulated.stages[st].bucket_allreduces.size());
    }
    if (p.strategy == par::Strategy::kDdp) {
      BOOST_TEST(ran[0].stages[0].bucket_allreduces.size() > 1u);
      BOOST_TEST(ran[0].stages[0].bucket_allreduces[0].elem_bytes == 2u);  // fp16 on the wire
    }
    // A prediction times the trainer's own object, not a copy made from its settings.
    sim::RunSpec run = description(p, 16);  // the data part of the description
    const sim::SimResult res = sim::simulate(cluster, ran[0], run, {});
    BOOST_REQUIRE(res.job != nullptr);
    BOOST_TEST(par::compare_compiled_jobs(*res.job, ran[0]) == "");
    BOOST_TEST(res.stage_boundaries == ran[0].boundaries);
    BOOST_TEST(res.compression == (p.strategy == par::Strategy::kDdp ? "fp16" : "none"));
  }
  // and a job that differs in one field is told apart, naming the field
  par::ParallelConfig other = ddp;
  other.bucket_mb = 0.5;
  sim::Simulation s;
  const std::string d = par::compare_compiled_jobs(run_one_step(ddp, 16)[0], s.compile(cluster, description(other, 16)));
  BOOST_TEST(d.find("bucket") != std::string::npos, d);
}

BOOST_AUTO_TEST_CASE(compressed_gradients_are_predicted_to_send_less) {
  // t2.micro's ~65 Mbit/s: lenet5's gradient all-reduce is exposed, and fp16 halves its bytes
  const sim::ClusterSpec cluster = sim::parse_cluster("t2.micro:2");
  par::ParallelConfig p;
  p.strategy = par::Strategy::kDdp;
  sim::RunSpec run;
  run.dataset = "";
  run.samples = 256;
  run.input = nn::SampleShape{1, 12, 12};
  run.classes = 4;
  const par::CompiledJob f32 = run_one_step(p, 16)[0];
  p.compression = par::GradCompression::kF16;
  const par::CompiledJob f16 = run_one_step(p, 16)[0];
  sim::SimOptions o;
  o.baseline = false;
  const sim::SimResult a = sim::simulate(cluster, f32, run, o), b = sim::simulate(cluster, f16, run, o);
  BOOST_TEST(a.comm_exposed_s > 0.0);
  BOOST_TEST(b.comm_exposed_s < 0.75 * a.comm_exposed_s, b.comm_exposed_s << " vs " << a.comm_exposed_s);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pytorch_ddp_buckets)

namespace {

// PyTorch DDP's documented rule (torch/csrc/distributed/c10d/reducer.cpp compute_bucket_assignment_by_size, limits
// {dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB, bucket_cap_mb}, buckets rebuilt after the first iteration in
// gradient-ready order): over the parameter tensors in ready order -- the reverse of the parameters' order, a layer's
// bias before its weight -- each tensor joins the open bucket, which closes once it holds >= its limit: 1 MiB for the
// first, the cap for the others. Returns the buckets' bytes.
std::vector<uint64_t> pytorch_bucket_bytes(const nn::ModelSpec& m, uint64_t cap) {
  std::vector<uint64_t> out;
  uint64_t open = 0;
  for (size_t l = m.layers.size(); l-- > 0;) {
    const auto shapes = m.layers[l].param_shapes();
    for (size_t t = shapes.size(); t-- > 0;) {
      uint64_t n = 4;
      for (int64_t d : shapes[t]) n *= static_cast<uint64_t>(d);
      open += n;
      if (open >= (out.empty() ? uint64_t{1} << 20 : cap)) {
        out.push_back(open);
        open = 0;
      }
    }
  }
  if (open > 0) out.push_back(open);
  return out;
}

std::vector<uint64_t> compiled_bucket_bytes(const std::string& model, sim::Framework f, double bucket_mb,
                                            std::optional<double> first_bucket_mb = std::nullopt,
                                            std::vector<double> bucket_sizes_mb = {}) {
  sim::JobSpec j;
  j.first_bucket_mb = first_bucket_mb;
  j.bucket_sizes_mb = std::move(bucket_sizes_mb);
  j.model = model;
  j.dataset = model == "lenet5" ? "fashion-mnist" : "cifar10";
  j.batch = 32;
  j.strategy = par::Strategy::kDdp;
  j.framework = f;
  j.bucket_mb = bucket_mb;
  sim::Simulation s;
  const par::CompiledJob cj = s.compile(sim::parse_cluster("c5.large:4"), j);
  std::vector<uint64_t> out;
  for (const par::GradientBucket& b : cj.pipeline.stage_plans[0].buckets) out.push_back(b.bytes);
  return out;
}

}  // namespace

// --framework pytorch-ddp describes PyTorch DDP's buckets exactly: lenet5 (247 KB of gradients: one bucket, below the
// 1 MiB first cap) and resnet18 (44.7 MB: fc, the last batch norm and the last 9.4 MB convolution, which crosses
// 1 MiB; then 25 MiB buckets). The expected bytes are PyTorch 1.13's own (dist._compute_bucket_assignment_by_size
// over these models' tensor sizes in ready order, limits [1 MiB, 25 MiB] and [1 MiB, 5 MiB]), and the rule above
// reproduces them. Tandem's own jobs keep 25 MiB from the first bucket.
BOOST_AUTO_TEST_CASE(pytorch_ddp_caps_the_first_bucket_at_one_mib_in_ready_order) {
  const std::vector<uint64_t> torch_lenet5{246824}, torch_resnet18{9461800, 26494976, 8739072},
      torch_resnet18_cap5{9461800, 9441280, 9969664, 7084032, 6037504, 2701568};
  const nn::ModelSpec lenet5 = nn::zoo_model("lenet5", nn::zoo_default_input("lenet5"), 10);
  const nn::ModelSpec r18 = nn::zoo_model("resnet18", nn::zoo_default_input("resnet18"), 10);
  BOOST_TEST(pytorch_bucket_bytes(lenet5, 25ull << 20) == torch_lenet5, tt::per_element());
  BOOST_TEST(pytorch_bucket_bytes(r18, 25ull << 20) == torch_resnet18, tt::per_element());
  BOOST_TEST(pytorch_bucket_bytes(r18, 5ull << 20) == torch_resnet18_cap5, tt::per_element());
  BOOST_TEST(compiled_bucket_bytes("lenet5", sim::Framework::kPytorchDdp, 25) == torch_lenet5, tt::per_element());
  BOOST_TEST(compiled_bucket_bytes("resnet18", sim::Framework::kPytorchDdp, 25) == torch_resnet18, tt::per_element());
  BOOST_TEST(compiled_bucket_bytes("resnet18", sim::Framework::kPytorchDdp, 5) == torch_resnet18_cap5, tt::per_element());
  const std::vector<uint64_t> own = compiled_bucket_bytes("resnet18", sim::Framework::kTandem, 25);
  BOOST_TEST_MESSAGE("resnet18 tandem buckets: " << fmt::format("{}", fmt::join(own, ", ")));
  BOOST_TEST(own.front() >= (25u << 20));
}

// The bucket policy on its own (issue #16: "first-bucket cap, explicit bucket sizes"): Tandem's job with a 1 MiB
// first bucket is PyTorch DDP's; pytorch-ddp with first_bucket_mb 0 is Tandem's; explicit sizes copied from a
// framework's logged bucket bytes (/ 2^20) rebuild its buckets exactly -- PyTorch's 5 MiB-cap resnet18 buckets from
// a 25 MiB job -- and the buckets after the list close at bucket_mb.
BOOST_AUTO_TEST_CASE(a_first_bucket_cap_or_explicit_sizes_rebuild_another_frameworks_buckets) {
  const std::vector<uint64_t> torch_resnet18{9461800, 26494976, 8739072},
      torch_resnet18_cap5{9461800, 9441280, 9969664, 7084032, 6037504, 2701568};
  BOOST_TEST(compiled_bucket_bytes("resnet18", sim::Framework::kTandem, 25, 1.0) == torch_resnet18, tt::per_element());
  BOOST_TEST(compiled_bucket_bytes("resnet18", sim::Framework::kPytorchDdp, 25, 0.0) ==
                 compiled_bucket_bytes("resnet18", sim::Framework::kTandem, 25),
             tt::per_element());
  std::vector<double> sizes;
  for (uint64_t b : torch_resnet18_cap5) sizes.push_back(static_cast<double>(b) / 1048576.0);
  BOOST_TEST(compiled_bucket_bytes("resnet18", sim::Framework::kTandem, 25, std::nullopt, sizes) == torch_resnet18_cap5,
             tt::per_element());
  // the list's first three, then 25 MiB: the rest (7084032 + 6037504 + 2701568 bytes) is one bucket
  const std::vector<double> head(sizes.begin(), sizes.begin() + 3);
  const std::vector<uint64_t> mixed{9461800, 9441280, 9969664, 7084032 + 6037504 + 2701568};
  BOOST_TEST(compiled_bucket_bytes("resnet18", sim::Framework::kTandem, 25, std::nullopt, head) == mixed,
             tt::per_element());
  // both, or a bad size: refused by name
  BOOST_CHECK_EXCEPTION(compiled_bucket_bytes("resnet18", sim::Framework::kTandem, 25, 1.0, {2.0}), tandem::Error,
                        [](const tandem::Error& e) { return std::string(e.what()).find("not both") != std::string::npos; });
  BOOST_CHECK_EXCEPTION(compiled_bucket_bytes("resnet18", sim::Framework::kTandem, 25, std::nullopt, {2.0, 0.0}),
                        tandem::Error, [](const tandem::Error& e) {
                          return std::string(e.what()).find("bucket size 1") != std::string::npos;
                        });
}

// The job JSON takes the same policy under the flags' names; bad values are named.
BOOST_AUTO_TEST_CASE(the_job_json_reads_the_bucket_policy) {
  const sim::JobSpec j = sim::parse_job_text(R"({"first_bucket_mb": 2})");
  BOOST_TEST(j.first_bucket_mb.value_or(-1) == 2.0);
  const sim::JobSpec k = sim::parse_job_text(R"({"bucket_sizes_mb": [1, 24.5]})");
  BOOST_TEST(k.bucket_sizes_mb == (std::vector<double>{1, 24.5}), tt::per_element());
  BOOST_CHECK_EXCEPTION(sim::parse_job_text(R"({"bucket_sizes_mb": 3})"), tandem::Error, [](const tandem::Error& e) {
    return std::string(e.what()).find("job.bucket_sizes_mb") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(sim::parse_job_text(R"({"bucket_sizes_mb": [1, -2]})"), tandem::Error, [](const tandem::Error& e) {
    return std::string(e.what()).find("job.bucket_sizes_mb") != std::string::npos;
  });
}

BOOST_AUTO_TEST_SUITE_END()
