// An epoch that ends with a short batch (issue #16): the cpu backend builds the primitives of that second batch shape
// beside the full batch's and keeps them. The job compiler knows from the job's training set, batch, replicas and
// batch limit whether each replica's epoch ends with one (CompiledJob::short_batch) and derives what its shape costs
// (StageMemory::short_batch_bytes); the simulator charges exactly that to a Tandem rank on a CPU node, or the
// profile's measured figure (primitive_bytes_curve) where the profile is of the job's model. The same curve moves the
// profile's runtime figure, which holds the primitives of its own batch, to the job's micro-batch.
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <string>

#include "engine/nn/cpu_storage.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/parallel/job.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/expect_error.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;
namespace par = tandem::engine::parallel;
namespace nn = tandem::engine::nn;
namespace tt = boost::test_tools;

namespace {

constexpr double kMiB = 1048576.0;

// lenet5 on the first `samples` of fashion-mnist at batch 64, one process on one c5.large (or DDP over `dp` of
// them), each epoch cut after `limit` batches (0: none).
JobSpec lenet5(int64_t samples, int64_t limit, int32_t dp = 1, const std::string& profile = "") {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.samples = samples;
  j.batch = 64;
  j.epochs = 1;
  j.limit_batches = limit;
  j.profile = profile;
  if (dp > 1) {
    j.strategy = Strategy::kDdp;
    j.dp = dp;
  }
  return j;
}

double need(const JobSpec& j, int32_t nodes = 1) {
  return simulate(parse_cluster("c5.large:" + std::to_string(nodes)), j, {.baseline = false}).memory_per_node_bytes;
}

par::Job engine_lenet5(int64_t samples, int64_t limit) {
  par::Job j;
  j.model = nn::zoo_model("lenet5", {1, 28, 28}, 10);
  j.batch = 64;
  j.train_samples = samples;
  j.limit_batches = limit;
  return j;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(short_batch)

BOOST_AUTO_TEST_CASE(the_compiler_finds_each_replicas_short_last_batch) {
  // 6,000 samples: 93 batches of 64 and one of 48
  BOOST_TEST(par::compile_job(engine_lenet5(6000, 0), 1).short_batch == 48);
  BOOST_TEST(par::compile_job(engine_lenet5(5952, 0), 1).short_batch == 0);   // 93 whole batches
  BOOST_TEST(par::compile_job(engine_lenet5(6000, 93), 1).short_batch == 0);  // the epoch ends before it
  BOOST_TEST(par::compile_job(engine_lenet5(6000, 94), 1).short_batch == 48);
  BOOST_TEST(par::compile_job(engine_lenet5(0, 0), 1).short_batch == 0);      // the set not known: nothing
  // two replicas: each samples ceil(6000 / 2) = 3,000 (46 x 64 + 56); 6,001 pads the shards to 3,001
  par::Job ddp = engine_lenet5(6000, 0);
  ddp.parallel.strategy = par::Strategy::kDdp;
  BOOST_TEST(par::compile_job(ddp, 2).short_batch == 56);
  ddp.train_samples = 6001;
  BOOST_TEST(par::compile_job(ddp, 2).short_batch == 57);
  // the figure: the derived primitives of the whole model at the short batch's size, on the one stage
  const par::CompiledJob cj = par::compile_job(engine_lenet5(6000, 0), 1);
  const par::StageMemory& m = cj.stages.front().memory;
  BOOST_TEST(m.short_micro_batch == 48);
  BOOST_TEST(m.short_batch_bytes > 0);
  BOOST_TEST(m.short_batch_bytes == nn::cpu_primitive_bytes(cj.job.model, 0, cj.job.model.layers.size(), 48));
  BOOST_TEST(par::compile_job(engine_lenet5(5952, 0), 1).stages.front().memory.short_batch_bytes == 0.0);
  // a pipeline of 4 micro-batches of 16: a short batch of 63 runs 16, 16, 16 and 15 -- only 15 is a new shape,
  // charged on each stage for the stage's own layers
  par::Job pipe = engine_lenet5(93 * 64 + 63, 0);
  pipe.parallel.strategy = par::Strategy::kPipeline;
  pipe.parallel.micro_batches = 4;
  const par::CompiledJob pj = par::compile_job(pipe, 2);
  BOOST_TEST(pj.short_batch == 63);
  for (const par::StageProgram& s : pj.stages) {
    BOOST_TEST(s.memory.short_micro_batch == 15);
    BOOST_TEST(s.memory.short_batch_bytes ==
               nn::cpu_primitive_bytes(pj.job.model, static_cast<size_t>(s.first_layer), static_cast<size_t>(s.end_layer), 15));
  }
  // bad input names the field
  testing::expect_error([] { par::compile_job(engine_lenet5(-1, 0), 1); }, "job.train_samples");
  testing::expect_error([] { par::compile_job(engine_lenet5(6000, -2), 1); }, "job.limit_batches");
}

BOOST_AUTO_TEST_CASE(a_partial_last_batch_predicts_more_memory_by_the_modelled_amount) {
  // the same data sets either way: only the batch limit decides whether the 48-sample batch is trained
  const double modelled = par::compile_job(engine_lenet5(6000, 0), 1).stages.front().memory.short_batch_bytes;
  BOOST_REQUIRE(modelled > 0);
  const double with = need(lenet5(6000, 0)), without = need(lenet5(6000, 93));
  BOOST_TEST(with - without == modelled, tt::tolerance(1e-9));
  // each of two DDP replicas sees its own short batch (56 of its 3,000): every node pays that shape's figure
  par::Job ddp = engine_lenet5(6000, 0);
  ddp.parallel.strategy = par::Strategy::kDdp;
  const double per_rank = par::compile_job(ddp, 2).stages.front().memory.short_batch_bytes;
  BOOST_TEST(per_rank == nn::cpu_primitive_bytes(ddp.model, 0, ddp.model.layers.size(), 56));
  BOOST_TEST(need(lenet5(6000, 0, 2), 2) - need(lenet5(6000, 46, 2), 2) == per_rank, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(the_profiles_measured_primitives_replace_the_derived_figure) {
  const std::string path = "/tmp/tandem_sim_short_batch.json";
  // one more shape costs 1 MiB at 16 samples and 1.5 MiB at 32 (2 MiB at 48, 2.5 MiB at the profile's 64)
  testing::write_lenet5_profile(path, {{"runtime_rss_bytes", 20 * kMiB},
                                       {"primitive_bytes_curve", {{16, 1.0 * kMiB}, {32, 1.5 * kMiB}}}});
  BOOST_TEST(need(lenet5(6000, 0, 1, path)) - need(lenet5(6000, 93, 1, path)) == 2.0 * kMiB, tt::tolerance(1e-9));
  // at batch 32 the profile's runtime figure (primitives of batch 64) holds 1 MiB more primitives than the job's
  JobSpec at32 = lenet5(5984, 0, 1, path);  // 187 whole batches of 32
  at32.batch = 32;
  testing::write_lenet5_profile(path, {{"runtime_rss_bytes", 20 * kMiB}});
  const double plain = need(at32);
  testing::write_lenet5_profile(path, {{"runtime_rss_bytes", 20 * kMiB},
                                       {"primitive_bytes_curve", {{16, 1.0 * kMiB}, {32, 1.5 * kMiB}}}});
  BOOST_TEST(plain - need(at32) == 1.0 * kMiB, tt::tolerance(1e-9));
  // a curve that falls towards the larger batch (noise between two near points) moves the runtime figure not at all
  testing::write_lenet5_profile(path, {{"runtime_rss_bytes", 20 * kMiB},
                                       {"primitive_bytes_curve", {{16, 1.5 * kMiB}, {32, 1.4 * kMiB}}}});
  BOOST_TEST(need(at32) == plain, tt::tolerance(1e-12));
  // a profile of another model keeps the derived figure, and no runtime shift
  testing::write_lenet5_profile(path, {{"model", "lenet5-variant"}, {"runtime_rss_bytes", 20 * kMiB},
                                       {"primitive_bytes_curve", {{16, 1.0 * kMiB}, {32, 1.5 * kMiB}}}});
  const double modelled = par::compile_job(engine_lenet5(6000, 0), 1).stages.front().memory.short_batch_bytes;
  BOOST_TEST(need(lenet5(6000, 0, 1, path)) - need(lenet5(6000, 93, 1, path)) == modelled, tt::tolerance(1e-9));
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(the_curve_is_optional_round_trips_and_is_read_per_batch) {
  nlohmann::json j = {{"format", "tandem-calibration"}, {"version", 1}, {"model", "lenet5"}, {"batch", 64},
                      {"optimizer_step_s", 0.001},
                      {"layers", {{{"name", "conv1"}, {"forward_s", 0.001}, {"backward_s", 0.002}}}}};
  BOOST_TEST(profile_from_json(j).primitive_bytes_curve.empty());
  BOOST_TEST(!primitive_bytes_at(profile_from_json(j), 16).has_value());
  j["primitive_bytes_curve"] = {{16, 1e6}, {32, 0}};  // no growth at all is a measurement too
  const CalibrationProfile p = profile_from_json(j);
  BOOST_TEST(profile_from_json(profile_to_json(p)).primitive_bytes_curve == p.primitive_bytes_curve);
  BOOST_TEST(primitive_bytes_at(p, 24).value_or(-1) == 0.5e6, tt::tolerance(1e-12));
  BOOST_TEST(primitive_bytes_at(p, 64).value_or(-1) == 0.0);  // the line beyond, floored at 0
  j["primitive_bytes_curve"] = {{16, 1e6}};  // one point: the same at every batch
  BOOST_TEST(primitive_bytes_at(profile_from_json(j), 128).value_or(-1) == 1e6);
  for (const nlohmann::json& bad : {nlohmann::json("1 MB"), nlohmann::json::array(), nlohmann::json({{0, 1e6}}),
                                    nlohmann::json({{16, -1.0}}), nlohmann::json({{32, 1e6}, {16, 1e6}})}) {
    j["primitive_bytes_curve"] = bad;
    BOOST_TEST_MESSAGE("curve " << bad.dump());
    testing::expect_error([&] { profile_from_json(j, "p.json"); }, "p.json.primitive_bytes_curve");
  }
}

BOOST_AUTO_TEST_SUITE_END()
