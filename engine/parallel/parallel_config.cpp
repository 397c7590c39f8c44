#include "engine/parallel/parallel_config.hpp"

#include <algorithm>

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/core/error.hpp"

namespace tandem::engine::parallel {

const char* strategy_name(Strategy s) noexcept {
  switch (s) {
    case Strategy::kSingle: return "single";
    case Strategy::kDdp: return "ddp";
    case Strategy::kPipeline: return "pipeline";
    case Strategy::kHybrid: return "hybrid";
    case Strategy::kPs: return "ps";
    case Strategy::kPsAsync: return "ps-async";
    case Strategy::kSsp: return "ssp";
    case Strategy::kAsgd: return "asgd";
    case Strategy::kEasgd: return "easgd";
    case Strategy::kFedAvg: return "fedavg";
    case Strategy::kLocalSgd: return "localsgd";
  }
  return "?";
}

bool has_servers(Strategy s, bool easgd_async) noexcept {
  return s == Strategy::kPs || s == Strategy::kPsAsync || s == Strategy::kSsp ||
         (s == Strategy::kEasgd && easgd_async);
}

Strategy parse_strategy(std::string_view s) {
  if (s == "single") return Strategy::kSingle;
  if (s == "ddp" || s == "dp") return Strategy::kDdp;
  if (s == "pipeline" || s == "pp") return Strategy::kPipeline;
  if (s == "hybrid") return Strategy::kHybrid;
  if (s == "ps") return Strategy::kPs;
  if (s == "ps-async") return Strategy::kPsAsync;
  if (s == "ssp") return Strategy::kSsp;
  if (s == "asgd") return Strategy::kAsgd;
  if (s == "easgd") return Strategy::kEasgd;
  if (s == "fedavg") return Strategy::kFedAvg;
  if (s == "localsgd" || s == "local-sgd") return Strategy::kLocalSgd;
  TANDEM_THROW(Status::kInvalidArgument,
               "unknown strategy \"{}\" (single, ddp, pipeline, hybrid, ps, ps-async, ssp, asgd, easgd, fedavg, localsgd)",
               s);
}

bool absorbs_worker_loss(const ParallelConfig& c) noexcept {
  switch (c.strategy) {
    case Strategy::kDdp:
    case Strategy::kPs:
    case Strategy::kPipeline:
    case Strategy::kHybrid: return c.elastic;
    case Strategy::kPsAsync:
    case Strategy::kSsp:
    case Strategy::kAsgd:
    case Strategy::kEasgd:
    case Strategy::kFedAvg:
    case Strategy::kLocalSgd: return true;
    default: return false;
  }
}

const char* compression_name(GradCompression c) noexcept {
  switch (c) {
    case GradCompression::kNone: return "none";
    case GradCompression::kF16: return "fp16";
    case GradCompression::kBF16: return "bf16";
  }
  return "?";
}

GradCompression parse_compression(std::string_view s) {
  if (s == "none" || s == "f32" || s == "fp32") return GradCompression::kNone;
  if (s == "fp16" || s == "f16") return GradCompression::kF16;
  if (s == "bf16") return GradCompression::kBF16;
  TANDEM_THROW(Status::kInvalidArgument, "unknown gradient compression \"{}\" (none, fp16, bf16)", s);
}

const char* staleness_lr_name(StalenessLr s) noexcept {
  switch (s) {
    case StalenessLr::kNone: return "none";
    case StalenessLr::kInverse: return "inverse";
    case StalenessLr::kMomentum: return "momentum";
  }
  return "?";
}

StalenessLr parse_staleness_lr(std::string_view s) {
  if (s == "none") return StalenessLr::kNone;
  if (s == "inverse") return StalenessLr::kInverse;
  if (s == "momentum") return StalenessLr::kMomentum;
  TANDEM_THROW(Status::kInvalidArgument, "--staleness-lr \"{}\" is not a rule (none, inverse, momentum)", s);
}

PartitionCost parse_partition_cost(std::string_view s) {
  if (s == "flops") return PartitionCost::kFlops;
  if (s == "measured") return PartitionCost::kMeasured;
  TANDEM_THROW(Status::kInvalidArgument, "unknown partition cost \"{}\" (flops, measured)", s);
}

Grid resolve_grid(ParallelConfig& c, int world, int rank, int64_t num_layers, int64_t batch_size) {
  TANDEM_REQUIRE(world >= 1 && rank >= 0 && rank < world, "rank {} is outside a world of {}", rank, world);
  TANDEM_REQUIRE(c.dp >= 0 && c.pp >= 0, "--dp and --pp must be >= 1 (got dp={}, pp={})", c.dp, c.pp);
  const char* name = strategy_name(c.strategy);
  TANDEM_REQUIRE(c.server_replicas == 0 || has_servers(c.strategy, c.easgd_async),
                 "--server-replicas {}: strategy {} has no parameter servers to replicate (ps, ps-async and ssp have)",
                 c.server_replicas, name);
  TANDEM_REQUIRE(c.staleness_lr == StalenessLr::kNone || c.staleness_lr == StalenessLr::kInverse ||
                     c.staleness_lr == StalenessLr::kMomentum,
                 "--staleness-lr: {} is not a rule (0: none, 1: inverse, 2: momentum)",
                 static_cast<int32_t>(c.staleness_lr));
  TANDEM_REQUIRE(c.staleness_lr == StalenessLr::kNone || c.strategy == Strategy::kPsAsync,
                 "--staleness-lr {}: strategy {} applies no stale pushes (only ps-async scales a push by its "
                 "staleness; ssp bounds it instead)", staleness_lr_name(c.staleness_lr), name);
  switch (c.strategy) {
    case Strategy::kSingle:
      TANDEM_REQUIRE(world == 1,
                     "strategy single trains on one rank but the world has {} ranks (use --strategy ddp, pipeline "
                     "or hybrid, or launch one rank)",
                     world);
      TANDEM_REQUIRE(c.dp <= 1 && c.pp <= 1, "strategy single needs dp=1 and pp=1 (got dp={}, pp={})", c.dp, c.pp);
      c.dp = c.pp = 1;
      break;
    case Strategy::kDdp:
      TANDEM_REQUIRE(c.pp <= 1, "strategy ddp has no pipeline stages (got pp={}; use --strategy hybrid)", c.pp);
      TANDEM_REQUIRE(c.dp == 0 || c.dp == world, "strategy ddp: dp={} but the world has {} ranks (ddp uses dp = world)",
                     c.dp, world);
      c.dp = world;
      c.pp = 1;
      break;
    case Strategy::kPipeline:
      TANDEM_REQUIRE(c.dp <= 1, "strategy pipeline has no data parallelism (got dp={}; use --strategy hybrid)", c.dp);
      TANDEM_REQUIRE(c.pp == 0 || c.pp == world,
                     "strategy pipeline: pp={} but the world has {} ranks (pipeline uses pp = world)", c.pp, world);
      c.dp = 1;
      c.pp = world;
      break;
    case Strategy::kHybrid:
      if (c.dp == 0 && c.pp == 0) {
        TANDEM_THROW(Status::kInvalidArgument, "strategy hybrid needs --dp and/or --pp (world {} = dp x pp)", world);
      } else if (c.dp == 0) {
        TANDEM_REQUIRE(world % c.pp == 0, "world size {} is not divisible by pp={} (strategy hybrid, world = dp x pp)",
                       world, c.pp);
        c.dp = world / c.pp;
      } else if (c.pp == 0) {
        TANDEM_REQUIRE(world % c.dp == 0, "world size {} is not divisible by dp={} (strategy hybrid, world = dp x pp)",
                       world, c.dp);
        c.pp = world / c.dp;
      }
      TANDEM_REQUIRE(world % (c.dp * c.pp) == 0,
                     "world size {} is not divisible by dp x pp = {} x {} = {} (strategy hybrid needs world = dp x pp)",
                     world, c.dp, c.pp, c.dp * c.pp);
      TANDEM_REQUIRE(world == c.dp * c.pp,
                     "world size {} is not dp x pp = {} x {} = {} (strategy hybrid needs world = dp x pp; with {} "
                     "ranks try --dp {} --pp {})",
                     world, c.dp, c.pp, c.dp * c.pp, world, world / c.pp, c.pp);
      break;
    case Strategy::kPs:
    case Strategy::kPsAsync:
    case Strategy::kSsp:
    case Strategy::kAsgd:
    case Strategy::kEasgd:
    case Strategy::kFedAvg:
    case Strategy::kLocalSgd: {
      TANDEM_REQUIRE(c.pp <= 1, "strategy {} is data parallel only (got pp={})", name, c.pp);
      const int servers = has_servers(c.strategy, c.easgd_async) ? c.servers : 0;
      TANDEM_REQUIRE(servers >= 0, "--servers must be >= 1 (got {})", c.servers);
      TANDEM_REQUIRE(!has_servers(c.strategy, c.easgd_async) || servers >= 1,
                     "strategy {} needs at least one server (got --servers {})", name, c.servers);
      TANDEM_REQUIRE(world - servers >= 1,
                     "strategy {} with {} server(s) needs at least {} ranks (the world has {}: servers are the last "
                     "ranks, the rest are workers)",
                     name, servers, servers + 1, world);
      TANDEM_REQUIRE(c.dp == 0 || c.dp == world - servers,
                     "strategy {}: dp={} but {} ranks less {} server(s) leave {} workers", name, c.dp, world, servers,
                     world - servers);
      TANDEM_REQUIRE(c.server_replicas >= 0, "--server-replicas must be >= 0 (got {})", c.server_replicas);
      TANDEM_CHECK(c.server_replicas == 0 || c.strategy != Strategy::kEasgd, Status::kUnsupported,
                   "--server-replicas {}: the asynchronous EASGD centre is not replicated yet (ps, ps-async and ssp "
                   "are)", c.server_replicas);
      TANDEM_REQUIRE(c.server_replicas < std::max(servers, 1),
                     "--server-replicas {} needs more servers: each server's shard is backed up on other servers, so "
                     "at most servers - 1 = {} replicas (got --servers {})",
                     c.server_replicas, std::max(servers, 1) - 1, servers);
      TANDEM_REQUIRE(c.server_replicas == 0 || absorbs_worker_loss(c),
                     "--server-replicas {} with strategy {} needs --elastic (synchronous ps survives a lost rank only "
                     "when elastic)", c.server_replicas, name);
      TANDEM_REQUIRE(c.staleness >= 0, "--staleness must be >= 0 (got {})", c.staleness);
      TANDEM_REQUIRE(c.tau >= 1, "--tau must be >= 1 step (got {})", c.tau);
      TANDEM_REQUIRE(std::isfinite(c.alpha) && c.alpha >= 0 && c.alpha < 1, "--alpha must be in [0, 1) (got {})",
                     c.alpha);
      TANDEM_REQUIRE(c.clients >= 0, "--clients must be >= 0 (got {})", c.clients);
      TANDEM_REQUIRE(std::isfinite(c.dirichlet_alpha) && c.dirichlet_alpha >= 0,
                     "--dirichlet-alpha must be >= 0 (0: IID; got {})", c.dirichlet_alpha);
      TANDEM_REQUIRE(std::isfinite(c.client_fraction) && c.client_fraction > 0 && c.client_fraction <= 1,
                     "--client-fraction must be in (0, 1] (got {})", c.client_fraction);
      TANDEM_REQUIRE(c.local_epochs >= 1, "--local-epochs must be >= 1 (got {})", c.local_epochs);
      TANDEM_REQUIRE(std::isfinite(c.round_deadline_s) && c.round_deadline_s >= 0,
                     "--round-deadline-s must be >= 0 (0: the communicator's timeout; got {})", c.round_deadline_s);
      TANDEM_REQUIRE(c.average_every >= 1, "--average-every must be >= 1 step (got {})", c.average_every);
      TANDEM_REQUIRE(c.warmup_steps >= 0, "--warmup-steps must be >= 0 (got {})", c.warmup_steps);
      c.dp = world - servers;
      c.pp = 1;
      break;
    }
  }
  if (c.elastic) {
    TANDEM_CHECK(absorbs_worker_loss(c), Status::kUnsupported,
                 "elastic training runs strategies ddp, pipeline, hybrid, ps, ps-async, ssp, asgd, easgd, fedavg and "
                 "localsgd (got {})",
                 name);
    TANDEM_CHECK(c.compression == GradCompression::kNone, Status::kUnsupported,
                 "elastic training does not support gradient compression ({}) yet", compression_name(c.compression));
  }
  if (c.elastic || absorbs_worker_loss(c)) {
    TANDEM_REQUIRE(c.min_ranks >= 1 && (c.joining || c.min_ranks <= world),
                   "elastic: min_ranks must be in [1, {}] (the world's size; got {})", world, c.min_ranks);
    TANDEM_REQUIRE(c.max_ranks == 0 || c.max_ranks >= std::max(world, c.joining ? 1 : c.min_ranks),
                   "elastic: max_ranks must be 0 (no bound) or at least the world's size {} and min_ranks {} (got {})",
                   world, c.min_ranks, c.max_ranks);
    TANDEM_REQUIRE(c.join_poll_steps >= 1, "elastic: join_poll_steps must be >= 1 (got {})", c.join_poll_steps);
  }
  TANDEM_REQUIRE(c.pp <= num_layers, "{} pipeline stages but the model has only {} layers (strategy {}, pp={})", c.pp,
                 num_layers, name, c.pp);
  TANDEM_REQUIRE(batch_size >= 1, "batch size must be >= 1 (got {})", batch_size);
  TANDEM_REQUIRE(c.micro_batches >= 1, "micro-batches must be >= 1 (got {})", c.micro_batches);
  TANDEM_REQUIRE(c.micro_batches <= batch_size,
                 "{} micro-batches are more than the {} samples of a batch (each micro-batch needs at least one; "
                 "the batch size is per data-parallel rank)",
                 c.micro_batches, batch_size);
  TANDEM_REQUIRE(c.accumulation >= 1, "gradient accumulation must be >= 1 batch (got {})", c.accumulation);
  TANDEM_REQUIRE(static_cast<int64_t>(c.micro_batches) * c.accumulation <= 0xffff,
                 "{} micro-batches x {} accumulation steps exceed the 65535 micro-batches a step may have",
                 c.micro_batches, c.accumulation);
  TANDEM_REQUIRE(std::isfinite(c.bucket_mb) && c.bucket_mb > 0 && c.bucket_mb <= 4096,
                 "bucket size must be in (0, 4096] MiB (got {})", c.bucket_mb);
  TANDEM_REQUIRE(std::isfinite(c.first_bucket_mb) && c.first_bucket_mb >= 0 && c.first_bucket_mb <= 4096,
                 "first bucket size must be in [0, 4096] MiB, 0 for bucket_mb (got {})", c.first_bucket_mb);
  TANDEM_REQUIRE(c.bucket_sizes_mb.empty() || c.first_bucket_mb == 0,
                 "give the first bucket's size (first_bucket_mb {}) or the bucket sizes ({} of them), not both",
                 c.first_bucket_mb, c.bucket_sizes_mb.size());
  TANDEM_REQUIRE(c.bucket_sizes_mb.size() <= 65536, "{} bucket sizes are more than the 65536 allowed",
                 c.bucket_sizes_mb.size());
  for (size_t k = 0; k < c.bucket_sizes_mb.size(); ++k)
    TANDEM_REQUIRE(std::isfinite(c.bucket_sizes_mb[k]) && c.bucket_sizes_mb[k] > 0 && c.bucket_sizes_mb[k] <= 4096,
                   "bucket size {} (of the bucket sizes) must be in (0, 4096] MiB (got {})", k, c.bucket_sizes_mb[k]);
  if (!c.boundaries.empty()) {
    TANDEM_REQUIRE(static_cast<int>(c.boundaries.size()) == c.pp + 1,
                   "explicit stage cut has {} boundaries, {} stages need {}", c.boundaries.size(), c.pp, c.pp + 1);
    TANDEM_REQUIRE(c.boundaries.front() == 0 && c.boundaries.back() == num_layers,
                   "explicit stage cut must run from layer 0 to {} (got {} .. {})", num_layers, c.boundaries.front(),
                   c.boundaries.back());
    for (size_t i = 1; i < c.boundaries.size(); ++i)
      TANDEM_REQUIRE(c.boundaries[i] > c.boundaries[i - 1], "explicit stage cut: stage {} is empty ({} -> {})", i - 1,
                     c.boundaries[i - 1], c.boundaries[i]);
  }
  Grid g;
  g.world = world;
  g.rank = rank;
  g.dp = c.dp;
  g.pp = c.pp;
  g.servers = world - c.dp * c.pp;
  g.server = rank >= c.dp * c.pp;
  g.server_index = g.server ? rank - c.dp * c.pp : -1;
  g.stage = g.server ? 0 : rank % c.pp;
  g.dp_rank = g.server ? 0 : rank / c.pp;
  return g;
}

std::string describe(const ParallelConfig& c) {
  return fmt::format("{} dp={} pp={} micro_batches={} schedule={} bucket_mb={}{} compression={} accumulation={}",
                     strategy_name(c.strategy), c.dp, c.pp, c.micro_batches, schedule_name(c.schedule), c.bucket_mb,
                     c.first_bucket_mb > 0 ? fmt::format(" first_bucket_mb={}", c.first_bucket_mb)
                     : c.bucket_sizes_mb.empty() ? std::string()
                                                 : fmt::format(" bucket_sizes_mb={}", fmt::join(c.bucket_sizes_mb, ",")),
                     compression_name(c.compression), c.accumulation) +
         (c.staleness_lr != StalenessLr::kNone ? fmt::format(" staleness_lr={}", staleness_lr_name(c.staleness_lr))
                                               : std::string());
}

}  // namespace tandem::engine::parallel
