// One description, two executors, for memory (issue #16): the cpu backend's figures of a rank -- its activations as
// that backend stores them, backward's scratch, the largest convolution's weight-gradient scratch, the convolutions'
// reordered weights -- are derived once, by the job compiler (StageMemory), and the runtime's memory guard
// (engine/train/memory_guard.hpp) and the simulator's profile-less figure charge the same bytes for the same job:
// resnet18 and mobilenetv2, one process and each stage of a 2-stage pipeline. A profile's measured peak scales a
// stage's own derived peak.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "engine/compute/backend.hpp"
#include "engine/core/error.hpp"
#include "engine/nn/cpu_storage.hpp"
#include "engine/nn/model.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/parallel/job.hpp"
#include "engine/train/memory_guard.hpp"
#include "simulator/job.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;
namespace par = tandem::engine::parallel;
namespace nn = tandem::engine::nn;
namespace train = tandem::engine::train;
namespace tt = boost::test_tools;

namespace {

// `model` on CIFAR-10 shapes at batch 16, one process (pp 1) or a 1F1B pipeline of two stages and two
// micro-batches, one rank per node; no data sets charged, so a node's need is its rank's tensors and runtime.
// dp 2: DDP over two nodes instead (the ranks' bucket buffers).
JobSpec cifar_job(const std::string& model, int32_t pp, int32_t dp = 1) {
  JobSpec j;
  j.model = model;
  j.dataset = "cifar10";
  j.batch = 16;
  j.epochs = 0.001;
  j.data_bytes = 0.0;
  if (pp > 1) {
    j.strategy = Strategy::kPipeline;
    j.pp = pp;
    j.micro_batches = 2;
  } else if (dp > 1) {
    j.strategy = Strategy::kDdp;
    j.dp = dp;
  }
  return j;
}

// What the guard charges for the stage's activations, the cpu backend's workspace, the loader's batches and the bucket
// buffers: its estimate less the same estimate without them (what remains -- the first step's constant, the resident
// size -- is the guard's own).
double guard_cpu_terms(const nn::Model& model, const train::TrainingFootprint& f) {
  train::TrainingFootprint none = f;
  none.activation_bytes = none.layout_bytes = none.scratch_bytes = none.conv_scratch_bytes = none.conv_copy_bytes = 0;
  none.loader_bytes = none.bucket_bytes = none.short_batch_bytes = 0;
  const train::MemoryEstimate e = train::estimate_training_memory(model, f);
  const train::MemoryEstimate e0 = train::estimate_training_memory(model, none);
  return e.activation_bytes + e.workspace_bytes - e0.activation_bytes - e0.workspace_bytes;
}

const char* const kModels[] = {"resnet18", "mobilenetv2"};
const int32_t kStages[] = {1, 2};
// one process, a 2-stage pipeline, DDP over 2 ranks: {pp, dp}, by index
const int32_t kLayoutPp[] = {1, 2, 1}, kLayoutDp[] = {1, 1, 2};
const int kLayouts[] = {0, 1, 2};

}  // namespace

BOOST_AUTO_TEST_SUITE(memory_agreement)

// The guard's footprint of a rank is par::training_footprint of its stage, the one function ParallelTrainer calls:
// a StageMemory figure it stopped passing would leave the guard short of the simulator here.
BOOST_DATA_TEST_CASE(the_guard_and_the_simulator_charge_the_same_cpu_terms,
                     boost::unit_test::data::make(kModels) * boost::unit_test::data::make(kLayouts), model_name, layout) {
  const int32_t pp = kLayoutPp[layout], dp = kLayoutDp[layout];
  const JobSpec j = cifar_job(model_name, pp, dp);
  const ClusterSpec cluster = parse_cluster(fmt::format("c5.xlarge:{}", pp * dp));
  Simulation sim;
  const par::CompiledJob cj = sim.compile(cluster, j);
  BOOST_REQUIRE(cj.pp() == pp);
  BOOST_REQUIRE(cj.dp() == dp);
  const SimResult r = sim.run(cluster, j, {.baseline = false});
  tandem::engine::compute::BackendOptions o;
  o.num_threads = 1;
  const auto be = tandem::engine::compute::make_backend("cpu", o);
  const nn::Model model(cj.job.model, *be, 0);
  for (int32_t s = 0; s < pp; ++s) {
    BOOST_TEST_MESSAGE(model_name << " stage " << s << " of " << pp << ", dp " << dp);
    const par::StageMemory& m = cj.stages[static_cast<size_t>(s)].memory;
    // every term weighs, so that leaving any one out on either side shows below
    BOOST_TEST(m.activation_bytes > 0);
    BOOST_TEST(m.layout_bytes >= 0);
    BOOST_TEST(m.scratch_bytes > 0);
    BOOST_TEST(m.conv_scratch_bytes > 0);
    BOOST_TEST(m.conv_copy_bytes > 0);
    BOOST_TEST(m.loader_bytes > 0);  // every stage's rank reads the loader (the labels, the first stage the images)
    BOOST_TEST((m.bucket_bytes > 0) == (dp > 1));
    BOOST_TEST(m.optimizer_bytes > 0);  // momentum
    // CIFAR-10's 50,000 samples: whole batches of 16 in one replica, 25,000 = 1,562 x 16 + 8 in each of two -- a
    // short last batch, whose shape's primitives both charge
    BOOST_TEST((m.short_batch_bytes > 0) == (dp > 1));
    const double expected = nn::kCpuActivationOverhead * (m.activation_bytes + m.layout_bytes) + m.scratch_bytes +
                            m.conv_scratch_bytes + m.conv_copy_bytes + m.loader_bytes + m.short_batch_bytes;
    // the simulator: the rank's node need less its weights, gradients, optimizer state, buckets and the allowance
    // (the job's data sets are 0 here)
    const double sim_terms =
        r.nodes[static_cast<size_t>(s)].memory_bytes - (m.total() - m.activation_bytes) - kDefaultCpuRuntimeBytes;
    BOOST_TEST(sim_terms == expected, tt::tolerance(1e-9));
    // the guard: the same terms, and the buckets the simulator counts with the tensors above; the optimizer state
    // still to allocate is the stage's
    const train::TrainingFootprint f = par::training_footprint(
        cj.stages[static_cast<size_t>(s)], par::optimizer_state_bytes_per_param(cj.job.optimizer));
    BOOST_TEST(guard_cpu_terms(model, f) == expected + m.bucket_bytes, tt::tolerance(1e-9));
    BOOST_TEST(train::estimate_training_memory(model, f).optimizer_bytes == m.optimizer_bytes, tt::tolerance(1e-12));
  }
}

// The single-process trainer's footprint (layer_footprint: engine/train cannot call the job compiler) is the job
// compiler's StageMemory of the same layers, samples and micro-batch.
BOOST_DATA_TEST_CASE(the_guards_layer_footprint_is_the_job_compilers,
                     boost::unit_test::data::make(kModels) * boost::unit_test::data::make(kStages), model_name, pp) {
  Simulation sim;
  const par::CompiledJob cj = sim.compile(parse_cluster(fmt::format("c5.xlarge:{}", pp)), cifar_job(model_name, pp));
  for (const par::StageProgram& s : cj.stages) {
    BOOST_TEST_MESSAGE(model_name << " stage " << s.stage << " of " << pp);
    const train::TrainingFootprint f =
        train::layer_footprint(cj.job.model, static_cast<size_t>(s.first_layer), static_cast<size_t>(s.end_layer),
                               s.memory.samples_in_flight, s.memory.micro_batch);
    BOOST_TEST(f.activation_bytes == s.memory.activation_bytes, tt::tolerance(1e-12));
    BOOST_TEST(f.layout_bytes == s.memory.layout_bytes, tt::tolerance(1e-9));
    BOOST_TEST(f.scratch_bytes == s.memory.scratch_bytes, tt::tolerance(1e-12));
    BOOST_TEST(f.conv_scratch_bytes == s.memory.conv_scratch_bytes, tt::tolerance(1e-12));
    BOOST_TEST(f.conv_copy_bytes == s.memory.conv_copy_bytes, tt::tolerance(1e-12));
  }
  if (cj.pp() == 1) {  // and the single trainer's, at the job's batch
    const train::TrainingFootprint one = train::single_footprint(cj.job.model, 16, 2);
    BOOST_TEST(one.activation_bytes + one.layout_bytes ==
                   cj.stages[0].memory.activation_bytes + cj.stages[0].memory.layout_bytes, tt::tolerance(1e-12));
    BOOST_TEST(one.scratch_bytes == cj.stages[0].memory.scratch_bytes, tt::tolerance(1e-12));
    BOOST_TEST(one.loader_bytes > 0);
    BOOST_TEST(one.loader_bytes == cj.stages[0].memory.loader_bytes, tt::tolerance(1e-12));
  }
}

// The loader's prefetch is part of the job (job JSON "prefetch", tandem train/simulate --prefetch): the job compiler
// derives what its batches ahead and the evaluation's batch hold (StageMemory::loader_bytes, data::loader_bytes), the
// simulator charges that to every worker, and the guard's footprint of the same trainer settings is the same figure.
// Before, the simulator did not know the setting (the key was refused) and charged no loader batches; the guard alone
// charged them. The evaluation's batch (issue #16) is charged with every prefetch, 0 too.
BOOST_AUTO_TEST_CASE(the_loader_prefetch_is_part_of_the_job_and_both_executors_charge_it) {
  const ClusterSpec cluster = parse_cluster("c5.xlarge:2");
  const auto with = [&](const char* json) { return parse_job_text(json, cifar_job("resnet18", 2)); };
  Simulation sim;
  const JobSpec none = with(R"({"prefetch": 0})");
  BOOST_TEST(none.prefetch == 0);
  const SimResult r0 = sim.run(cluster, none, {.baseline = false});
  const par::CompiledJob c0 = sim.compile(cluster, none);
  for (const int prefetch : {1, 2, 5}) {
    const JobSpec j = with(fmt::format(R"({{"prefetch": {}}})", prefetch).c_str());
    BOOST_TEST(j.prefetch == prefetch);
    const par::CompiledJob cj = sim.compile(cluster, j);
    const SimResult r = sim.run(cluster, j, {.baseline = false});
    // the queue of `prefetch` batches and the thread's next one, f32 images and int32 labels of 16 CIFAR samples
    // each, beside the evaluation's batch, which prefetch 0 holds alone
    const double batch = 16.0 * (3 * 32 * 32 * 4 + 4);
    const double expected = (prefetch + 1) * batch + batch;
    for (int32_t s = 0; s < 2; ++s) {
      BOOST_TEST_MESSAGE("prefetch " << prefetch << " stage " << s);
      const auto k = static_cast<size_t>(s);
      BOOST_TEST(cj.stages[k].memory.loader_bytes == expected);
      BOOST_TEST(c0.stages[k].memory.loader_bytes == batch);
      BOOST_TEST(r.nodes[k].memory_bytes - r0.nodes[k].memory_bytes == expected - batch, tt::tolerance(1e-12));
    }
    BOOST_TEST(r.memory.loader_bytes == expected);  // its own line of the breakdown, not a data set
    BOOST_TEST(r0.memory.loader_bytes == batch);
    BOOST_TEST(r.memory.data_bytes == r0.memory.data_bytes);
    // the single trainer's guard, for one process of the same model, batch and prefetch
    par::Job one = cj.job;
    one.parallel = {};
    const par::CompiledJob single = par::compile_job(one, 1);
    BOOST_TEST(train::single_footprint(cj.job.model, 16, prefetch).loader_bytes == single.stages[0].memory.loader_bytes);
    BOOST_TEST(single.stages[0].memory.loader_bytes == expected);
  }
  // outside the loader's range: refused, naming the key
  for (const char* bad : {R"({"prefetch": -1})", R"({"prefetch": 65})", R"({"prefetch": "2"})"}) {
    BOOST_TEST_MESSAGE(bad);
    BOOST_CHECK_EXCEPTION(with(bad), tandem::Error,
                          [](const tandem::Error& e) { return std::string(e.what()).find("prefetch") != std::string::npos; });
  }
  par::Job j = c0.job;
  j.prefetch = 65;
  BOOST_CHECK_EXCEPTION(par::compile_job(j, 2), tandem::Error,
                        [](const tandem::Error& e) { return std::string(e.what()).find("prefetch 65") != std::string::npos; });
}

// With a profile of the job's model, a pipeline stage is charged the measured peak's scale (over the derived peak of
// one process at the micro-batch) times its own derived peak: its own activations, scratch and largest convolution.
// Before, the whole model's measured peak per counted activation byte was spread over the stage's activations, so a
// stage got a share of the other stage's batch-independent scratch, once per micro-batch in flight.
BOOST_AUTO_TEST_CASE(a_stage_scales_its_own_derived_peak_by_the_measurement) {
  const std::string path = "/tmp/tandem_sim_stage_peak.json";
  // measured: twice the derived peak of one process, at 16 and 32 samples
  const auto derived = [](int64_t batch) {
    par::Job one;
    one.model = nn::zoo_model("lenet5", {1, 28, 28}, 10);
    one.batch = batch;
    return par::compile_job(one, 1).stages[0].memory.cpu_activation_peak_bytes();
  };
  testing::write_lenet5_profile(path, {{"activation_peak_curve", {{16, 2 * derived(16)}, {32, 2 * derived(32)}}}});
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.001;
  j.data_bytes = 0.0;
  j.profile = path;
  j.strategy = Strategy::kPipeline;
  j.pp = 2;
  j.micro_batches = 4;  // micro-batches of 16; 1F1B: stage 0 holds two in flight, stage 1 one
  const ClusterSpec cluster = parse_cluster("c5.large:2");
  Simulation sim;
  const par::CompiledJob cj = sim.compile(cluster, j);
  const SimResult r = sim.run(cluster, j, {.baseline = false});
  BOOST_REQUIRE(cj.stages.size() == 2u);
  BOOST_TEST(cj.stages[0].memory.samples_in_flight == 32);
  for (int32_t s = 0; s < 2; ++s) {
    const par::StageMemory& m = cj.stages[static_cast<size_t>(s)].memory;
    // the node's need less the rest of the rank (its loader's batches ahead too): its activation charge
    // (the profile has no runtime_rss_bytes: the stage's reordered weights are added to the default allowance, and
    // fashion-mnist's 60,000 samples end each epoch with a batch of 32 -- micro-batches of 8, a shape of its own)
    BOOST_TEST(m.short_batch_bytes > 0);
    const double runtime = r.nodes[static_cast<size_t>(s)].runtime_bytes + m.conv_copy_bytes + m.short_batch_bytes;
    const double charged =
        r.nodes[static_cast<size_t>(s)].memory_bytes - (m.total() - m.activation_bytes) - runtime - m.loader_bytes;
    BOOST_TEST(charged == 2 * m.cpu_activation_peak_bytes(), tt::tolerance(1e-9));
  }
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_SUITE_END()
