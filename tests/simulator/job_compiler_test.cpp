// One job, two executors: the job a parallel trainer runs and the job the simulator times are the same compiled
// object (engine/parallel/job.hpp). Trainers run one step on 2 ranks (threads, inproc transport); the simulator
// compiles the same description for a cluster, and a prediction times the trainer's own compiled job.
#include <boost/test/unit_test.hpp>

#include <memory>
#include <vector>

#include "engine/nn/zoo.hpp"
#include "simulator/cluster.hpp"
#include "simulator/simulate.hpp"
#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;
namespace sim = tandem::simulator;

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
