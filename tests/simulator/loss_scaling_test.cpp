// fp16 loss scaling in the simulator (issue #14): the compiled job's agree_finite all-reduce is a meeting of every
// rank before each optimizer step, and the unscale pass is compute -- both charged, from the job the trainer runs.
#include <boost/test/unit_test.hpp>

#include <algorithm>

#include "engine/nn/zoo.hpp"
#include "engine/parallel/job.hpp"
#include "simulator/presets.hpp"
#include "simulator/simulate.hpp"

using namespace tandem;
using namespace tandem::simulator;
namespace par = tandem::engine::parallel;

namespace {

par::CompiledJob compiled(par::Strategy strategy, int dp, int pp, bool loss_scaling) {
  par::Job j;
  j.model = engine::nn::zoo_model("lenet5", {1, 28, 28}, 10);
  j.batch = 64;
  j.parallel.strategy = strategy;
  j.parallel.dp = dp;
  j.parallel.pp = pp;
  j.parallel.micro_batches = pp > 1 ? 4 : 1;
  j.loss_scaling = loss_scaling;
  return par::compile_job(j, dp * pp);
}

SimResult run(const par::CompiledJob& cj, const char* cluster) {
  RunSpec r;
  r.dataset = "fashion-mnist";
  r.samples = 6400;
  SimOptions o;
  o.baseline = false;
  o.trace = true;
  return simulate(parse_cluster(cluster), cj, r, o);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(loss_scaling)

BOOST_AUTO_TEST_CASE(the_job_describes_the_agreement_over_every_rank) {
  const par::CompiledJob on = compiled(par::Strategy::kHybrid, 2, 2, true);
  BOOST_TEST(on.job.loss_scaling);
  BOOST_TEST(on.agree_finite.world == 4);
  BOOST_TEST(on.agree_finite.count == 1u);
  BOOST_TEST((on.agree_finite.collective == engine::comm::Collective::kAllreduce));
  const par::CompiledJob off = compiled(par::Strategy::kHybrid, 2, 2, false);
  BOOST_TEST(par::compare_compiled_jobs(on, off).find("loss scaling") != std::string::npos);
}

// Every rank of a pipeline meets before its optimizer step: the first stage, done with backward last, holds the
// others there, so every rank's step ends after the slowest one reached the meeting. The step grows by at least
// the unscale pass; the trace shows the meeting on every rank.
BOOST_AUTO_TEST_CASE(a_pipeline_meets_before_the_optimizer_and_pays_for_it) {
  const SimResult off = run(compiled(par::Strategy::kPipeline, 1, 2, false), "c5.xlarge:2");
  const SimResult on = run(compiled(par::Strategy::kPipeline, 1, 2, true), "c5.xlarge:2");
  BOOST_TEST_MESSAGE("lenet5 pipeline 1x2 on c5.xlarge:2: step " << off.step_time_s << " s without loss scaling, "
                                                                 << on.step_time_s << " s with");
  BOOST_TEST(on.step_time_s > off.step_time_s);
  int meetings = 0;
  double last_arrival = 0, first_release = 1e30;
  for (const TraceSpan& t : on.trace)
    if (t.name == "agree finite") ++meetings, first_release = std::min(first_release, t.end_s);
  for (const TraceSpan& t : on.trace)
    if (t.name == "unscale gradients") last_arrival = std::max(last_arrival, t.end_s);
  BOOST_TEST(meetings >= 1);
  BOOST_TEST(first_release >= last_arrival, "a rank left the meeting at " << first_release
                                                                          << " before the last arrived at "
                                                                          << last_arrival);
  // the two stages finish their step together (within the optimizer's own time), not a stage apart
  const double a = on.rank_step[0].finish_s, b = on.rank_step[1].finish_s;
  BOOST_TEST(std::abs(a - b) < 0.5 * off.step_time_s);
}

// DDP over 4 nodes: the meeting costs at least one network latency; the symmetric (one-rank) execution and the
// full model agree.
BOOST_AUTO_TEST_CASE(ddp_pays_the_flags_latency_in_both_executions) {
  const par::CompiledJob cj = compiled(par::Strategy::kDdp, 4, 1, true);
  const SimResult off = run(compiled(par::Strategy::kDdp, 4, 1, false), "c5.xlarge:4");
  const SimResult on = run(cj, "c5.xlarge:4");
  BOOST_TEST_MESSAGE("lenet5 ddp 4x1 on c5.xlarge:4: step " << off.step_time_s << " s without loss scaling, "
                                                            << on.step_time_s << " s with");
  BOOST_TEST(on.step_time_s > off.step_time_s);
  RunSpec r;
  r.dataset = "fashion-mnist";
  r.samples = 6400;
  r.symmetric = false;
  SimOptions o;
  o.baseline = false;
  const SimResult full = simulate(parse_cluster("c5.xlarge:4"), cj, r, o);
  BOOST_TEST(full.step_time_s == on.step_time_s, boost::test_tools::tolerance(1e-3));
}

// A described job (tandem simulate, a job JSON, the C ABI) compiles with loss scaling exactly where Tandem's trainer
// would scale: fp16, Tandem's own runtime, a strategy whose ranks step together.
BOOST_AUTO_TEST_CASE(a_described_fp16_job_scales_its_loss_where_the_trainer_would) {
  const ClusterSpec cluster = parse_cluster("c5.xlarge:2");
  auto described = [&](par::Precision precision, Strategy strategy, Framework framework) {
    JobSpec j;
    j.model = "lenet5";
    j.dataset = "fashion-mnist";
    j.strategy = strategy;
    j.memory.precision = precision;
    j.framework = framework;
    Simulation sim;
    return sim.compile(cluster, j).job.loss_scaling;
  };
  BOOST_TEST(described(par::Precision::kF16, Strategy::kDdp, Framework::kTandem));
  BOOST_TEST(described(par::Precision::kF16, Strategy::kPipeline, Framework::kTandem));
  BOOST_TEST(!described(par::Precision::kBF16, Strategy::kDdp, Framework::kTandem));
  BOOST_TEST(!described(par::Precision::kF32, Strategy::kDdp, Framework::kTandem));
  BOOST_TEST(!described(par::Precision::kF16, Strategy::kDdp, Framework::kPytorchDdp));
  BOOST_TEST(!described(par::Precision::kF16, Strategy::kLocalSgd, Framework::kTandem));
}

BOOST_AUTO_TEST_SUITE_END()
