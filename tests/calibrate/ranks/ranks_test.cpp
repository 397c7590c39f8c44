// Calibration and prediction across ranks, through the C ABI; CTest runs it as `tandem launch -n 2`. Each rank:
//  1. calibrates lenet5 with the other rank: the profile carries the runtime's own resident memory
//     (runtime_rss_bytes: above the bare minimum, below this process's RSS) and a per-message latency for the
//     simulator that is no less than the ping's and equals the small all-reduce's per-round cost where larger;
//  2. the simulator reads the profile with and without runtime_rss_bytes (old profiles still load), and a node's
//     predicted memory moves by exactly what the field moves by;
//  3. trains a 2-stage pipeline cut at layer 1 -- a cut the simulator's FLOPs balance would never choose -- and
//     tandem_trainer_predict simulates that very cut (same_cut, the result's stage_boundaries), while the same
//     job without the cut is balanced elsewhere (so this test fails if the prediction drops the trainer's cut).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/tandem.h"

static int g_rank = -1;
#include "tests/common/c_expect.h"

namespace {

constexpr int kH = 28;

double vm_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return -1;
}

tandem_model_t* make_model(tandem_context_t* ctx) {
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_INPUT_SHAPE | TANDEM_MODEL_PARAM_NUM_CLASSES |
                  TANDEM_MODEL_PARAM_SEED | TANDEM_MODEL_PARAM_BACKEND;
  mp.name = "lenet5";
  mp.input_channels = 1;
  mp.input_height = kH;
  mp.input_width = kH;
  mp.num_classes = 10;
  mp.seed = 3;
  mp.backend = "cpu";
  tandem_model_t* m = nullptr;
  EXPECT_OK(tandem_model_create(ctx, &mp, &m));
  return m;
}

tandem_dataset_t* make_data(tandem_context_t* ctx, int64_t count) {
  tandem_dataset_params_t dp = TANDEM_DATASET_PARAMS_INIT;
  dp.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_SHAPE | TANDEM_DATASET_PARAM_NUM_CLASSES |
                  TANDEM_DATASET_PARAM_COUNT | TANDEM_DATASET_PARAM_SEED;
  dp.kind = "synthetic";
  dp.channels = 1;
  dp.height = kH;
  dp.width = kH;
  dp.num_classes = 10;
  dp.count = count;
  dp.seed = 1;
  tandem_dataset_t* d = nullptr;
  EXPECT_OK(tandem_dataset_create(ctx, &dp, &d));
  return d;
}

// One node's predicted memory for a one-rank lenet5 job priced with `profile`.
double node_memory(tandem_context_t* ctx, const std::string& profile) {
  tandem_sim_cluster_t* cl = nullptr;
  EXPECT_OK(tandem_sim_cluster_create(ctx, "t2.micro:1", &cl));
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND;
  mp.name = "lenet5";
  mp.backend = "none";
  tandem_model_t* lenet = nullptr;
  EXPECT_OK(tandem_model_create(ctx, &mp, &lenet));
  tandem_sim_job_params_t j = TANDEM_SIM_JOB_PARAMS_INIT;
  j.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_PROFILE |
                 TANDEM_SIM_JOB_BASELINE;
  j.model = lenet;
  j.dataset = "fashion-mnist";
  j.batch = 16;
  j.profile = profile.c_str();
  j.baseline = 0;
  tandem_sim_result_t* res = nullptr;
  EXPECT_OK(tandem_simulate(cl, &j, &res));
  tandem_sim_node_t node = TANDEM_SIM_NODE_INIT;
  node.field_mask = TANDEM_SIM_NODE_MEMORY;
  EXPECT_OK(tandem_sim_result_node(res, 0, &node));
  tandem_sim_result_destroy(res);
  tandem_sim_cluster_destroy(cl);
  tandem_model_destroy(lenet);
  return node.memory_bytes;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(1) << "\n";
  EXPECT(out.good());
}

}  // namespace

int main() {
  tandem_context_t* ctx = nullptr;
  tandem_comm_t* comm = nullptr;
  int32_t rank = 0, world = 1;
  EXPECT_OK(tandem_context_create(nullptr, &ctx));
  EXPECT_OK(tandem_comm_create(ctx, nullptr, &comm));
  EXPECT_OK(tandem_comm_rank(comm, &rank));
  EXPECT_OK(tandem_comm_size(comm, &world));
  g_rank = rank;
  EXPECT(world == 2);

  // ---- 1. calibration over both ranks ----
  tandem_model_t* cal_model = make_model(ctx);
  tandem_calibrate_params_t cp = TANDEM_CALIBRATE_PARAMS_INIT;
  cp.field_mask = TANDEM_CALIBRATE_PARAM_BATCH | TANDEM_CALIBRATE_PARAM_WARMUP | TANDEM_CALIBRATE_PARAM_ITERS |
                  TANDEM_CALIBRATE_PARAM_P2P;
  cp.batch = 8;
  cp.warmup = 1;
  cp.iters = 3;
  cp.p2p_bytes = 1 << 16;
  cp.p2p_iters = 2;
  tandem_calibration_t* cal = nullptr;
  EXPECT_OK(tandem_calibrate(cal_model, &cp, comm, &cal));
  size_t bytes = 0;
  EXPECT_OK(tandem_calibration_json(cal, nullptr, &bytes));
  std::string text(bytes, '\0');
  EXPECT_OK(tandem_calibration_json(cal, text.data(), &bytes));
  const nlohmann::json prof = nlohmann::json::parse(text.c_str());
  const double rss_now = vm_rss_bytes();
  EXPECT(prof.contains("runtime_rss_bytes") && prof["runtime_rss_bytes"].is_number_integer());
  const double runtime = prof["runtime_rss_bytes"].get<double>();
  // Libraries, backend and communicator are several MiB; the model's storage is left out, so below RSS now.
  if (!(runtime > 4.0 * 1048576 && runtime < rss_now)) {
    std::fprintf(stderr, "rank %d: runtime_rss_bytes %.0f not in (4 MiB, RSS now %.0f)\n", rank, runtime, rss_now);
    return 1;
  }
  tandem_calibration_attr_t ca = TANDEM_CALIBRATION_ATTR_INIT;
  ca.field_mask = TANDEM_CALIBRATION_ATTR_P2P;
  EXPECT_OK(tandem_calibration_query(cal, &ca));
  EXPECT(ca.has_p2p == 1 && ca.p2p_latency_s > 0 && ca.p2p_latency_s < 0.1);
  EXPECT(std::fabs(prof.at("p2p").at("latency_s").get<double>() - ca.p2p_latency_s) < 1e-12);
  // The machine text records both figures; the latency written is the larger of the ping and the per-round cost.
  const std::string machine = prof.at("machine").get<std::string>();
  double ping_us = -1, round_us = -1;
  const size_t at_ping = machine.find("ping ");
  const size_t at_round = machine.find(" us per round");
  EXPECT(at_ping != std::string::npos && at_round != std::string::npos);
  ping_us = std::stod(machine.substr(at_ping + 5));
  const size_t start = machine.rfind(": ", at_round);
  EXPECT(start != std::string::npos);
  round_us = std::stod(machine.substr(start + 2, at_round - start - 2));
  const double lat_us = ca.p2p_latency_s * 1e6;
  if (!(ping_us > 0 && lat_us >= ping_us - 0.05 && std::fabs(lat_us - std::max(ping_us, round_us)) < 0.1)) {
    std::fprintf(stderr, "rank %d: p2p latency %.2f us is not max(ping %.2f, all-reduce round %.2f): %s\n", rank,
                 lat_us, ping_us, round_us, machine.c_str());
    return 1;
  }

  // ---- 2. the simulator reads it; old profiles (without the field) still load ----
  if (rank == 0) {
    const std::string base = "calibrate_ranks_test_" + std::to_string(::getpid());
    nlohmann::json old = prof, more = prof;
    old.erase("runtime_rss_bytes");
    more["runtime_rss_bytes"] = prof["runtime_rss_bytes"].get<int64_t>() + (int64_t{100} << 20);
    write_json(base + ".json", prof);
    write_json(base + ".old.json", old);
    write_json(base + ".more.json", more);
    const double m = node_memory(ctx, base + ".json");
    const double m_old = node_memory(ctx, base + ".old.json");
    const double m_more = node_memory(ctx, base + ".more.json");
    std::remove((base + ".json").c_str());
    std::remove((base + ".old.json").c_str());
    std::remove((base + ".more.json").c_str());
    if (!(m > 0 && m_old > 0 && std::fabs((m_more - m) - 100.0 * 1048576) < 1.0)) {
      std::fprintf(stderr, "rank 0: node memory with the profile's runtime %.0f, +100 MiB %.0f (moved %.0f), "
                   "without the field %.0f\n", m, m_more, m_more - m, m_old);
      return 1;
    }
  }
  tandem_calibration_destroy(cal);
  tandem_model_destroy(cal_model);

  // ---- 3. the prediction simulates the trainer's own cut ----
  tandem_model_t* model = make_model(ctx);
  tandem_model_attr_t ma = TANDEM_MODEL_ATTR_INIT;
  ma.field_mask = TANDEM_MODEL_ATTR_SHAPE;
  EXPECT_OK(tandem_model_query(model, &ma));
  const int32_t layers = static_cast<int32_t>(ma.num_layers);
  EXPECT(layers > 4);
  tandem_dataset_t* train = make_data(ctx, 256);
  tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
  op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND | TANDEM_OPTIMIZER_PARAM_MOMENTUM;
  op.kind = TANDEM_OPTIMIZER_SGD;
  op.momentum = 0.9f;
  tandem_optimizer_t* opt = nullptr;
  EXPECT_OK(tandem_optimizer_create(ctx, &op, &opt));
  tandem_trainer_params_t tp = TANDEM_TRAINER_PARAMS_INIT;
  tp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_SEED | TANDEM_TRAINER_PARAM_LIMIT_BATCHES |
                  TANDEM_TRAINER_PARAM_PREFETCH;
  tp.batch_size = 16;
  tp.seed = 7;
  tp.limit_batches = 3;
  tp.prefetch = 0;
  const int32_t cut[3] = {0, 1, layers};
  tandem_parallel_params_t pp = TANDEM_PARALLEL_PARAMS_INIT;
  pp.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_GRID | TANDEM_PARALLEL_PARAM_MICRO_BATCHES |
                  TANDEM_PARALLEL_PARAM_SCHEDULE | TANDEM_PARALLEL_PARAM_BOUNDARIES;
  pp.strategy = TANDEM_STRATEGY_PIPELINE;
  pp.dp = 1;
  pp.pp = 2;
  pp.micro_batches = 2;
  pp.schedule = TANDEM_SCHEDULE_1F1B;
  pp.boundaries = cut;
  pp.num_boundaries = 3;
  tandem_trainer_t* trainer = nullptr;
  EXPECT_OK(tandem_trainer_create_parallel(model, train, nullptr, opt, &tp, &pp, comm, &trainer));
  tandem_epoch_result_t er = TANDEM_EPOCH_RESULT_INIT;
  er.field_mask = TANDEM_EPOCH_RESULT_TRAIN;
  EXPECT_OK(tandem_trainer_epoch(trainer, &er));

  tandem_predict_params_t prm = TANDEM_PREDICT_PARAMS_INIT;
  prm.field_mask = TANDEM_PREDICT_PARAM_CLUSTER;
  prm.cluster = "t2.micro:2";
  tandem_prediction_t r = TANDEM_PREDICTION_INIT;
  r.field_mask = TANDEM_PREDICTION_LAYOUT;
  size_t jb = size_t{1} << 20;
  std::string js(jb, '\0');
  EXPECT_OK(tandem_trainer_predict(trainer, &prm, &r, js.data(), &jb));
  EXPECT(jb <= js.size());
  const nlohmann::json pred = nlohmann::json::parse(js.c_str());
  EXPECT(r.same_cut == 1 && r.pp == 2);
  EXPECT(pred.at("stage_boundaries") == nlohmann::json(std::vector<int32_t>(cut, cut + 3)));

  // The same job handed to the simulator without the cut: balanced by FLOPs, elsewhere.
  tandem_sim_cluster_t* cl = nullptr;
  EXPECT_OK(tandem_sim_cluster_create(ctx, "t2.micro:2", &cl));
  tandem_sim_job_params_t j = TANDEM_SIM_JOB_PARAMS_INIT;
  j.field_mask = TANDEM_SIM_JOB_MODEL | TANDEM_SIM_JOB_DATASET | TANDEM_SIM_JOB_BATCH | TANDEM_SIM_JOB_STRATEGY |
                 TANDEM_SIM_JOB_PP | TANDEM_SIM_JOB_MICRO_BATCHES | TANDEM_SIM_JOB_BASELINE;
  j.model = model;
  j.dataset = "fashion-mnist";
  j.batch = 16;
  j.strategy = TANDEM_STRATEGY_PIPELINE;
  j.pp = 2;
  j.micro_batches = 2;
  j.baseline = 0;
  tandem_sim_result_t* res = nullptr;
  EXPECT_OK(tandem_simulate(cl, &j, &res));
  int32_t own[3] = {0, 0, 0};
  size_t n = 3;
  EXPECT_OK(tandem_sim_result_stage_cut(res, own, &n));
  EXPECT(n == 3 && own[1] != 1);
  tandem_sim_result_destroy(res);
  tandem_sim_cluster_destroy(cl);

  tandem_trainer_destroy(trainer);
  tandem_optimizer_destroy(opt);
  tandem_dataset_destroy(train);
  tandem_model_destroy(model);
  tandem_comm_destroy(comm);
  tandem_context_destroy(ctx);
  if (rank == 0) std::printf("calibrate_ranks_test: all checks passed on %d ranks\n", world);
  return 0;
}
