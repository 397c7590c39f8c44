#include "simulator/job.hpp"

#include <fstream>
#include <sstream>

#include "engine/core/error.hpp"
#include "engine/core/suggest.hpp"
#include "engine/nn/zoo.hpp"
#include "simulator/units.hpp"

namespace tandem::simulator {

DatasetInfo find_dataset(const std::string& name) {
  if (name == "cifar10") return {name, 50000, {3, 32, 32}, 10, 10000};
  if (name == "cifar100") return {name, 50000, {3, 32, 32}, 100, 10000};
  if (name == "fashion-mnist" || name == "fashion_mnist") return {"fashion-mnist", 60000, {1, 28, 28}, 10, 10000};
  if (name == "mnist") return {name, 60000, {1, 28, 28}, 10, 10000};
  if (name == "imagenet") return {name, 1281167, {3, 224, 224}, 1000, 50000, false};
  TANDEM_THROW(Status::kInvalidArgument,
               "unknown dataset \"{}\"{} (cifar10, cifar100, fashion-mnist, mnist, imagenet; or give --samples and "
               "--input)", name, did_you_mean(name, {"cifar10", "cifar100", "fashion-mnist", "mnist", "imagenet"}));
}

engine::optim::OptimizerConfig optimizer_config(OptimizerKind k) {
  engine::optim::OptimizerConfig c;
  switch (k) {
    case OptimizerKind::kSgd: break;
    case OptimizerKind::kMomentum: c.momentum = 0.9f; break;
    case OptimizerKind::kAdam: c.kind = engine::optim::OptimizerKind::kAdam; break;
  }
  return c;
}

OptimizerKind optimizer_kind(const engine::optim::OptimizerConfig& c) noexcept {
  if (c.kind != engine::optim::OptimizerKind::kSgd) return OptimizerKind::kAdam;
  return c.momentum > 0 ? OptimizerKind::kMomentum : OptimizerKind::kSgd;
}

int32_t ranks_for(const JobSpec& j, int32_t endpoints) {
  TANDEM_REQUIRE(j.batch >= 1, "job.batch: must be >= 1, got {}", j.batch);
  TANDEM_REQUIRE(j.epochs > 0, "job.epochs: must be > 0, got {}", j.epochs);
  TANDEM_REQUIRE(j.micro_batches >= 1, "job.micro_batches: must be >= 1, got {}", j.micro_batches);
  TANDEM_REQUIRE(j.micro_batches <= j.batch, "job.micro_batches: {} micro-batches do not fit a batch of {}",
                 j.micro_batches, j.batch);
  TANDEM_REQUIRE(j.bucket_mb > 0, "job.bucket_mb: must be > 0, got {}", j.bucket_mb);
  TANDEM_REQUIRE(j.epoch_time_s >= 0, "job.epoch_time_s: must be >= 0, got {}", j.epoch_time_s);
  TANDEM_REQUIRE(j.comm_cycle_ms >= 0, "job.comm_cycle_ms: must be >= 0 (0: no cycle), got {}", j.comm_cycle_ms);
  TANDEM_REQUIRE(j.comm_negotiation_ms >= 0, "job.comm_negotiation_ms: must be >= 0 (0: none), got {}",
                 j.comm_negotiation_ms);
  TANDEM_REQUIRE(j.host_staging_gbps >= 0, "job.host_staging_gbps: must be >= 0 (0: no staging), got {}",
                 j.host_staging_gbps);
  TANDEM_REQUIRE(j.comm_negotiation_ms == 0 || j.comm_cycle_ms > 0,
                 "job.comm_negotiation_ms: {} ms per cycle needs a cycle, but comm_cycle_ms is 0",
                 j.comm_negotiation_ms);
  TANDEM_REQUIRE(j.dp >= 0 && j.pp >= 0, "job.dp/pp: must be >= 0 (0 derives them)");
  int64_t world = 1;
  switch (j.strategy) {
    case Strategy::kSingle: world = 1; break;
    case Strategy::kDdp: world = j.dp > 0 ? j.dp : endpoints; break;
    case Strategy::kPipeline: world = j.pp > 0 ? j.pp : endpoints; break;
    case Strategy::kHybrid:
      TANDEM_REQUIRE(j.dp > 0 || j.pp > 0, "job: strategy hybrid needs --dp and/or --pp");
      if (j.dp > 0 && j.pp > 0) {
        world = static_cast<int64_t>(j.dp) * j.pp;
      } else {
        const int32_t given = j.dp > 0 ? j.dp : j.pp;
        world = static_cast<int64_t>(endpoints / given) * given;
      }
      break;
    default: {  // ps, ps-async, ssp, asgd, easgd, fedavg, localsgd (issue #13)
      // data parallel (pp = 1); servers, where the strategy has them, are the last ranks: dp workers + servers,
      // else every device
      const int32_t servers = engine::parallel::has_servers(j.strategy, j.easgd_async) ? j.servers : 0;
      TANDEM_REQUIRE(j.pp <= 1, "job: strategy {} is data parallel only (pp = 1, got pp {})",
                     engine::parallel::strategy_name(j.strategy), j.pp);
      TANDEM_REQUIRE(servers >= 0, "job.servers: must be >= 1, got {}", j.servers);
      world = j.dp > 0 ? static_cast<int64_t>(j.dp) + servers : endpoints;
      break;
    }
  }
  TANDEM_REQUIRE(world >= 1, "job: dp {} x pp {} leaves no rank (the cluster has {} devices)", j.dp, j.pp, endpoints);
  TANDEM_REQUIRE(world <= endpoints, "job: dp {} x pp {} = {} ranks but the cluster has {} devices", j.dp, j.pp, world,
                 endpoints);
  return static_cast<int32_t>(world);
}

const char* framework_name(Framework f) noexcept {
  switch (f) {
    case Framework::kTandem: return "tandem";
    case Framework::kPytorchDdp: return "pytorch-ddp";
  }
  return "?";
}

Framework parse_framework(const std::string& s) {
  if (s == "tandem") return Framework::kTandem;
  if (s == "pytorch-ddp" || s == "pytorch") return Framework::kPytorchDdp;
  TANDEM_THROW(Status::kInvalidArgument, "unknown framework '{}' (tandem, pytorch-ddp)", s);
}

engine::parallel::Job engine_job(const JobSpec& j, const engine::nn::SampleShape& input, int64_t classes) {
  engine::parallel::Job e;
  if (j.model_spec) {
    e.model = *j.model_spec;
  } else {
    if (!engine::nn::is_zoo_model(j.model)) {
      std::string known;
      for (const auto& n : engine::nn::zoo_names()) known += (known.empty() ? "" : ", ") + n;
      TANDEM_THROW(Status::kInvalidArgument, "job.model: \"{}\" is not a zoo model ({}); a model file or JSON spec is "
                   "loaded as a model of its own (--model-file, \"model_file\" in a job, tandem_model_create)", j.model,
                   known);
    }
    engine::nn::ZooOptions opt;
    opt.width_mult = j.width_mult;
    e.model = engine::nn::zoo_model(j.model, input, classes, opt);
  }
  e.batch = j.batch;
  e.parallel.strategy = j.strategy;
  e.parallel.dp = j.dp;
  e.parallel.pp = j.pp;
  e.parallel.micro_batches = j.micro_batches;
  e.parallel.accumulation = j.accumulation;
  e.parallel.schedule = j.schedule;
  e.parallel.bucket_mb = j.bucket_mb;
  e.parallel.bucket_sizes_mb = j.bucket_sizes_mb;
  // the framework's first bucket gives way to explicit sizes; one given together with them is refused (resolve_grid)
  e.parallel.first_bucket_mb = j.first_bucket_mb.value_or(
      j.framework == Framework::kPytorchDdp && j.bucket_sizes_mb.empty() ? kPytorchFirstBucketMb : 0.0);
  e.parallel.compression = j.compression;
  e.parallel.partition = j.partition;
  e.parallel.boundaries = j.boundaries;
  e.algorithm = j.algorithm;
  e.chunk_bytes = j.chunk_bytes;
  e.optimizer = optimizer_config(j.optimizer);
  e.overlap = j.overlap;
  e.parallel.servers = j.servers;
  e.parallel.server_replicas = j.server_replicas;
  e.parallel.elastic = j.elastic;
  e.parallel.max_ranks = j.max_ranks;
  e.parallel.join_poll_steps = j.join_poll_steps;
  e.parallel.staleness = j.staleness;
  e.parallel.staleness_lr = j.staleness_lr;
  e.parallel.tau = j.tau;
  e.parallel.alpha = j.alpha;
  e.parallel.easgd_async = j.easgd_async;
  e.parallel.clients = j.clients;
  e.parallel.dirichlet_alpha = j.dirichlet_alpha;
  e.parallel.client_fraction = j.client_fraction;
  e.parallel.local_epochs = j.local_epochs;
  e.parallel.round_deadline_s = j.round_deadline_s;
  e.parallel.average_every = j.average_every;
  e.parallel.warmup_steps = j.warmup_steps;
  e.memory = j.memory;
  e.prefetch = j.prefetch;
  // Tandem trains fp16 with loss scaling (tandem train --precision fp16), whose skip decision every rank of these
  // strategies agrees on (CompiledJob::agree_finite); the others refuse loss scaling.
  const bool common_step = j.strategy == Strategy::kSingle || j.strategy == Strategy::kDdp ||
                           j.strategy == Strategy::kPipeline || j.strategy == Strategy::kHybrid;
  e.loss_scaling = j.memory.precision == engine::parallel::Precision::kF16 && j.framework == Framework::kTandem &&
                   common_step;
  return e;
}

JobSpec job_from_json(const nlohmann::json& j, JobSpec job, const std::string& where) {
  json_check_keys(j, {"model", "model_file", "dataset", "samples", "input", "classes", "batch", "epochs", "strategy", "dp", "pp",
                      "micro_batches", "schedule", "algorithm", "bucket_mb", "first_bucket_mb", "bucket_sizes_mb", "overlap", "optimizer", "profile",
                      "profile_network", "epoch_time_s", "credit_mode", "initial_credits", "width_mult", "chunk_bytes",
                      "partition", "boundaries", "compression", "accumulation", "servers", "server_replicas", "elastic", "max_ranks", "join_poll_steps", "staleness", "staleness_lr", "tau", "alpha",
                      "easgd_async", "clients", "dirichlet_alpha", "client_fraction", "local_epochs", "round_deadline_s",
                      "average_every", "warmup_steps", "precision", "recompute", "zero", "framework",
                      "broadcast_buffers", "seed", "limit_batches", "comm_cycle_ms", "comm_negotiation_ms", "host_staging_gbps", "prefetch"},
                  where);
  auto text = [&](const char* k) -> std::optional<std::string> {
    if (!j.contains(k)) return std::nullopt;
    TANDEM_REQUIRE(j[k].is_string(), "{}.{}: expected a string, got {}", where, k, j[k].dump());
    return j[k].get<std::string>();
  };
  auto integer = [&](const char* k, int64_t lo) -> std::optional<int64_t> {
    if (!j.contains(k)) return std::nullopt;
    TANDEM_REQUIRE(j[k].is_number_integer() && j[k].get<int64_t>() >= lo, "{}.{}: expected an integer >= {}, got {}",
                   where, k, lo, j[k].dump());
    return j[k].get<int64_t>();
  };
  auto flag = [&](const char* k) -> std::optional<bool> {
    if (!j.contains(k)) return std::nullopt;
    TANDEM_REQUIRE(j[k].is_boolean(), "{}.{}: expected true or false, got {}", where, k, j[k].dump());
    return j[k].get<bool>();
  };
  // enum-like strings: parse errors get the field name in front
  auto named = [&](const char* k, auto parse) {
    try {
      return parse(*text(k));
    } catch (const Error& e) {
      TANDEM_THROW(Status::kInvalidArgument, "{}.{}: {}", where, k, e.what());
    }
  };
  if (j.contains("model")) {
    // a zoo name, or a model spec object (engine/nn/model_spec.hpp): told apart by the JSON type, never by sniffing
    if (j["model"].is_object()) {
      job.model_spec = engine::nn::model_from_json(j["model"]);
    } else {
      job.model = *text("model");
      job.model_spec.reset();
    }
  }
  if (auto v = text("model_file")) job.model_spec = engine::nn::load_model_file(*v);
  if (auto v = text("dataset")) job.dataset = *v;
  if (auto v = integer("samples", 1)) job.samples = *v;
  if (j.contains("input")) {
    const auto& in = j["input"];
    TANDEM_REQUIRE(in.is_array() && in.size() == 3, "{}.input: expected [C, H, W], got {}", where, in.dump());
    for (const auto& d : in)
      TANDEM_REQUIRE(d.is_number_integer() && d.get<int64_t>() >= 1, "{}.input: dimensions must be integers >= 1, "
                     "got {}", where, in.dump());
    job.input = engine::nn::SampleShape{in[0].get<int64_t>(), in[1].get<int64_t>(), in[2].get<int64_t>()};
  }
  if (auto v = integer("classes", 1)) job.classes = *v;
  if (auto v = integer("batch", 1)) job.batch = *v;
  if (auto v = json_number(j, "epochs", where)) job.epochs = *v;
  if (j.contains("strategy")) job.strategy = named("strategy", [](const std::string& s) { return parse_strategy(s); });
  if (auto v = integer("dp", 0)) job.dp = static_cast<int32_t>(*v);
  if (auto v = integer("pp", 0)) job.pp = static_cast<int32_t>(*v);
  if (auto v = integer("micro_batches", 1)) job.micro_batches = static_cast<int32_t>(*v);
  if (auto v = integer("accumulation", 1)) job.accumulation = static_cast<int32_t>(*v);
  if (j.contains("schedule"))
    job.schedule = named("schedule", [](const std::string& s) { return engine::parallel::parse_schedule(s); });
  if (j.contains("algorithm"))
    job.algorithm = named("algorithm", [](const std::string& s) { return engine::comm::parse_algorithm(s); });
  if (auto v = json_number(j, "bucket_mb", where)) job.bucket_mb = *v;
  if (auto v = json_number(j, "first_bucket_mb", where)) job.first_bucket_mb = *v;
  if (j.contains("bucket_sizes_mb")) {
    const auto& b = j["bucket_sizes_mb"];
    TANDEM_REQUIRE(b.is_array() && !b.empty(), "{}.bucket_sizes_mb: expected [MiB, ...] (the first buckets' sizes in "
                   "gradient-ready order), got {}", where, b.dump());
    job.bucket_sizes_mb.clear();
    for (const auto& x : b) {
      TANDEM_REQUIRE(x.is_number() && x.get<double>() > 0, "{}.bucket_sizes_mb: sizes must be numbers > 0 (MiB), got {}",
                     where, b.dump());
      job.bucket_sizes_mb.push_back(x.get<double>());
    }
  }
  if (auto v = flag("overlap")) job.overlap = *v;
  if (j.contains("optimizer")) job.optimizer = named("optimizer", [](const std::string& s) { return parse_optimizer(s); });
  if (auto v = text("profile")) job.profile = *v;
  if (auto v = flag("profile_network")) job.profile_network = *v;
  if (auto v = json_number(j, "epoch_time_s", where)) job.epoch_time_s = *v;
  if (auto v = json_number(j, "comm_cycle_ms", where)) job.comm_cycle_ms = *v;
  if (auto v = json_number(j, "comm_negotiation_ms", where)) job.comm_negotiation_ms = *v;
  if (auto v = json_number(j, "host_staging_gbps", where)) job.host_staging_gbps = *v;
  if (j.contains("credit_mode"))
    job.credit_mode = named("credit_mode", [](const std::string& s) { return parse_credit_mode(s); });
  if (auto v = json_number(j, "initial_credits", where)) job.initial_credits = *v;
  if (auto v = json_number(j, "width_mult", where)) job.width_mult = *v;
  if (auto v = integer("chunk_bytes", 0)) job.chunk_bytes = static_cast<uint64_t>(*v);
  if (j.contains("compression"))
    job.compression =
        named("compression", [](const std::string& s) { return engine::parallel::parse_compression(s); });
  if (j.contains("partition"))
    job.partition = named("partition", [](const std::string& s) { return engine::parallel::parse_partition_cost(s); });
  if (auto v = integer("servers", 1)) job.servers = static_cast<int32_t>(*v);
  if (auto v = integer("server_replicas", 0)) job.server_replicas = static_cast<int32_t>(*v);
  if (auto v = flag("elastic")) job.elastic = *v;
  if (auto v = integer("max_ranks", 0)) job.max_ranks = static_cast<int32_t>(*v);
  if (auto v = integer("join_poll_steps", 1)) job.join_poll_steps = static_cast<int32_t>(*v);
  if (auto v = integer("staleness", 0)) job.staleness = static_cast<int32_t>(*v);
  if (j.contains("staleness_lr"))
    job.staleness_lr =
        named("staleness_lr", [](const std::string& s) { return engine::parallel::parse_staleness_lr(s); });
  if (auto v = integer("tau", 1)) job.tau = static_cast<int32_t>(*v);
  if (auto v = json_number(j, "alpha", where)) job.alpha = *v;
  if (auto v = flag("easgd_async")) job.easgd_async = *v;
  if (auto v = integer("clients", 0)) job.clients = static_cast<int32_t>(*v);
  if (auto v = json_number(j, "dirichlet_alpha", where)) job.dirichlet_alpha = *v;
  if (auto v = json_number(j, "client_fraction", where)) job.client_fraction = *v;
  if (auto v = integer("local_epochs", 1)) job.local_epochs = static_cast<int32_t>(*v);
  if (auto v = json_number(j, "round_deadline_s", where)) job.round_deadline_s = *v;
  if (auto v = integer("average_every", 1)) job.average_every = static_cast<int32_t>(*v);
  if (auto v = integer("warmup_steps", 0)) job.warmup_steps = static_cast<int32_t>(*v);
  if (auto v = integer("seed", 0)) job.seed = static_cast<uint64_t>(*v);
  if (auto v = integer("limit_batches", 0)) job.limit_batches = *v;
  if (auto v = integer("prefetch", 0)) {
    TANDEM_REQUIRE(*v <= 64, "{}.prefetch: {} batches ahead is more than the loader's 64", where, *v);
    job.prefetch = static_cast<int32_t>(*v);
  }
  if (j.contains("precision"))
    job.memory.precision = named("precision", [](const std::string& s) { return engine::parallel::parse_precision(s); });
  if (j.contains("recompute")) {
    if (j["recompute"].is_number_integer()) {
      engine::parallel::parse_recompute(std::to_string(*integer("recompute", 1)), job.memory);
    } else {
      named("recompute", [&](const std::string& s) { engine::parallel::parse_recompute(s, job.memory); return 0; });
    }
  }
  if (auto v = integer("zero", 0)) {
    TANDEM_REQUIRE(*v <= 2, "{}.zero: {} is not a ZeRO stage (0, 1 or 2)", where, *v);
    job.memory.zero = static_cast<int32_t>(*v);
  }
  if (j.contains("framework")) job.framework = named("framework", [](const std::string& s) { return parse_framework(s); });
  if (j.contains("broadcast_buffers")) {
    TANDEM_REQUIRE(j["broadcast_buffers"].is_boolean(), "{}.broadcast_buffers: expected true or false, got {}", where,
                   j["broadcast_buffers"].dump());
    job.broadcast_buffers = j["broadcast_buffers"].get<bool>();
  }
  if (j.contains("boundaries")) {
    const auto& b = j["boundaries"];
    TANDEM_REQUIRE(b.is_array() && b.size() >= 2, "{}.boundaries: expected [0, ..., layers] (pp + 1 layer indices), "
                   "got {}", where, b.dump());
    job.boundaries.clear();
    for (const auto& x : b) {
      TANDEM_REQUIRE(x.is_number_integer() && x.get<int64_t>() >= 0, "{}.boundaries: layer indices must be integers "
                     ">= 0, got {}", where, b.dump());
      job.boundaries.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
  }
  return job;
}

JobSpec parse_job_text(const std::string& text, JobSpec base) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TANDEM_THROW(Status::kInvalidArgument, "job JSON: {}", e.what());
  }
  TANDEM_REQUIRE(j.is_object(), "job JSON: expected an object, got {}", j.dump().substr(0, 60));
  return job_from_json(j, std::move(base), "job");
}

JobSpec load_job_file(const std::string& path, JobSpec base) {
  const nlohmann::json j = read_json_file(path, "job file");
  TANDEM_REQUIRE(j.is_object(), "job file \"{}\": expected an object", path);
  return job_from_json(j, std::move(base), path);
}

}  // namespace tandem::simulator
