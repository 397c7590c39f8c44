// The job compiler (engine/parallel/job.hpp): the cut, the plan, the buckets with their all-reduce requests and
// each stage's memory, derived once from a job -- what the trainer executes and the simulator times.
#include <boost/test/unit_test.hpp>

#include "engine/nn/zoo.hpp"
#include "engine/parallel/job.hpp"
#include "tests/nn/expect_error.hpp"

using namespace tandem;
using namespace tandem::engine;
namespace par = tandem::engine::parallel;
using par::CompiledJob;

namespace {

par::Job hybrid_job(int dp, int pp, int micro_batches, par::ScheduleKind schedule) {
  par::Job j;
  j.model = nn::zoo_model("mobilenetv2", {3, 32, 32}, 10);
  j.batch = 64;
  j.parallel.strategy = par::Strategy::kHybrid;
  j.parallel.dp = dp;
  j.parallel.pp = pp;
  j.parallel.micro_batches = micro_batches;
  j.parallel.schedule = schedule;
  j.optimizer.momentum = 0.9f;
  return j;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(job_compiler)

BOOST_AUTO_TEST_CASE(stages_keep_what_their_schedule_keeps) {
  // 1F1B over 4 stages and 8 micro-batches of 8: stage s keeps 4 - s micro-batches; GPipe keeps all 8.
  const CompiledJob one = par::compile_job(hybrid_job(1, 4, 8, par::ScheduleKind::kOneFOneB), 4);
  for (int s = 0; s < 4; ++s) {
    BOOST_TEST(one.stages[static_cast<size_t>(s)].memory.samples_in_flight == 8 * (4 - s));
    BOOST_TEST(one.stages[static_cast<size_t>(s)].memory.micro_batch == 8);
  }
  const CompiledJob gpipe = par::compile_job(hybrid_job(1, 4, 8, par::ScheduleKind::kGPipe), 4);
  BOOST_TEST(gpipe.stages[3].memory.samples_in_flight == 64);
  BOOST_TEST(gpipe.stages[3].memory.activation_bytes > one.stages[3].memory.activation_bytes);
  // Fewer micro-batches than stages: never more than the batch.
  const CompiledJob few = par::compile_job(hybrid_job(1, 4, 2, par::ScheduleKind::kOneFOneB), 4);
  BOOST_TEST(few.stages[0].memory.samples_in_flight == 64);
  // Uneven micro-batches: 64 samples in 3 are 22, 21, 21; stage 1 of 4 keeps the first three.
  const CompiledJob uneven = par::compile_job(hybrid_job(1, 4, 3, par::ScheduleKind::kOneFOneB), 4);
  BOOST_TEST(uneven.stages[1].memory.samples_in_flight == 64);
  BOOST_TEST(uneven.stages[3].memory.samples_in_flight == 22);
}

BOOST_AUTO_TEST_CASE(the_cut_and_the_memory_add_up_to_the_model) {
  const CompiledJob cj = par::compile_job(hybrid_job(2, 2, 4, par::ScheduleKind::kOneFOneB), 4);
  const nn::ModelSpec& spec = cj.job.model;
  BOOST_REQUIRE(cj.boundaries.size() == 3u);
  BOOST_TEST(cj.boundaries.front() == 0);
  BOOST_TEST(cj.boundaries.back() == static_cast<int32_t>(spec.layers.size()));
  // the FLOPs cut is partition_layers over the specs' forward + backward FLOPs
  std::vector<double> cost;
  for (const auto& l : spec.layers) cost.push_back(l.fwd_flops + l.bwd_flops());
  BOOST_TEST(cj.boundaries == par::partition_layers(cost, 2));
  double params = 0;
  for (const auto& st : cj.stages) params += st.memory.param_bytes;
  BOOST_TEST(params == static_cast<double>(spec.totals(0, spec.layers.size()).params) * 4);
  // momentum: 4 bytes of state per parameter
  BOOST_TEST(cj.stages[0].memory.optimizer_bytes == cj.stages[0].memory.param_bytes);
  // data parallel: a bucket and its receive scratch, at most the stage's gradients
  BOOST_TEST(cj.stages[0].memory.bucket_bytes == 2 * std::min(cj.stages[0].memory.param_bytes, 25.0 * 1048576));
  // what crosses the cut is what the stage after it reads
  BOOST_REQUIRE(cj.boundary_bytes_per_sample.size() == 1u);
  BOOST_TEST(cj.boundary_bytes_per_sample[0] > 0.0);
  BOOST_TEST(cj.grid(3).stage == 1);
  BOOST_TEST(cj.grid(3).dp_rank == 1);
}

BOOST_AUTO_TEST_CASE(every_bucket_has_its_allreduce_request) {
  par::Job j = hybrid_job(4, 1, 1, par::ScheduleKind::kOneFOneB);
  j.parallel.strategy = par::Strategy::kDdp;
  j.parallel.pp = 0;
  j.parallel.dp = 0;
  j.parallel.bucket_mb = 0.5;
  j.algorithm = comm::Algorithm::kRing;
  j.chunk_bytes = 1 << 16;
  const CompiledJob f32 = par::compile_job(j, 4);
  const auto& buckets = f32.pipeline.stage_plans[0].buckets;
  BOOST_REQUIRE(buckets.size() > 1u);
  BOOST_REQUIRE(f32.stages[0].bucket_allreduces.size() == buckets.size());
  uint64_t total = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const comm::PlanRequest& r = f32.stages[0].bucket_allreduces[b];
    BOOST_TEST(r.world == 4);
    BOOST_TEST(r.count * 4 == buckets[b].bytes);
    BOOST_TEST(r.elem_bytes == 4u);
    BOOST_TEST((r.algorithm == comm::Algorithm::kRing));
    BOOST_TEST(r.chunk_bytes == comm::effective_chunk_bytes(1 << 16, r.count * 4));
    BOOST_TEST(r.in_place);
    total += buckets[b].bytes;
  }
  BOOST_TEST(static_cast<double>(total) == f32.stages[0].memory.param_bytes);
  // fp16 on the wire: the same buckets at 2 bytes an element, and every bucket's wire copy kept
  j.parallel.compression = par::GradCompression::kF16;
  const CompiledJob f16 = par::compile_job(j, 4);
  BOOST_TEST(f16.stages[0].bucket_allreduces[0].elem_bytes == 2u);
  BOOST_TEST(f16.stages[0].bucket_allreduces[0].count == f32.stages[0].bucket_allreduces[0].count);
  BOOST_TEST(f16.stages[0].memory.bucket_bytes == f32.stages[0].memory.bucket_bytes + f32.stages[0].memory.param_bytes / 2);
  BOOST_TEST(par::compare_compiled_jobs(f32, f16).find("compression") != std::string::npos,
             par::compare_compiled_jobs(f32, f16));
  BOOST_TEST(par::compare_compiled_jobs(f16, par::compile_job(j, 4)) == "");
}

BOOST_AUTO_TEST_CASE(accumulation_multiplies_the_micro_batches_of_a_step) {
  par::Job j = hybrid_job(1, 2, 2, par::ScheduleKind::kGPipe);
  j.parallel.accumulation = 3;
  const CompiledJob cj = par::compile_job(j, 2);
  BOOST_TEST(cj.step_micro_batches == 6);
  BOOST_TEST(cj.step_batch == 192);
  BOOST_TEST(cj.pipeline.micro_batches == 6);
  BOOST_TEST(cj.pipeline_for(2).micro_batches == 2);  // a short last batch
  BOOST_TEST(&cj.pipeline_for(6) == &cj.pipeline);
}

BOOST_AUTO_TEST_CASE(a_measured_cut_uses_the_measured_costs) {
  par::Job j = hybrid_job(1, 2, 1, par::ScheduleKind::kOneFOneB);
  j.parallel.partition = par::PartitionCost::kMeasured;
  testing::expect_error([&] { par::compile_job(j, 2); }, Status::kInvalidArgument, {"needs per-layer costs"});
  const size_t L = j.model.layers.size();
  // the first layer costs as much as all the others: it is a stage of its own (the only optimal cut)
  const CompiledJob cj = par::compile_job(j, 2, [&] {
    std::vector<double> c(L, 1.0);
    c.front() = static_cast<double>(L - 1);
    return c;
  });
  BOOST_TEST(cj.boundaries[1] == 1);
  BOOST_TEST(par::compile_job(hybrid_job(1, 2, 1, par::ScheduleKind::kOneFOneB), 2).boundaries[1] != 1);
  testing::expect_error([&] { par::compile_job(j, 2, [] { return std::vector<double>{1.0}; }); }, Status::kInvalidArgument, {"1 layer costs"});
  // explicit boundaries win over any partition
  j.parallel.boundaries = {0, 3, static_cast<int32_t>(L)};
  BOOST_TEST(par::compile_job(j, 2).boundaries[1] == 3);
}

BOOST_AUTO_TEST_CASE(bad_jobs_fail_naming_the_problem) {
  testing::expect_error([] { par::compile_job(hybrid_job(2, 2, 1, par::ScheduleKind::kGPipe), 6); }, Status::kInvalidArgument, {"world size 6"});
  testing::expect_error([] { par::compile_job(hybrid_job(1, 2, 65, par::ScheduleKind::kGPipe), 2); }, Status::kInvalidArgument, {"micro-batches"});
  par::Job j = hybrid_job(1, 2, 1, par::ScheduleKind::kGPipe);
  j.parallel.accumulation = 4096;
  j.parallel.micro_batches = 32;
  testing::expect_error([&] { par::compile_job(j, 2); }, Status::kInvalidArgument, {"65535"});
}

BOOST_AUTO_TEST_SUITE_END()
