#include "simulator/job.hpp"

#include "engine/core/error.hpp"

namespace tandem::simulator {

DatasetInfo find_dataset(const std::string& name) {
  if (name == "cifar10") return {name, 50000, {3, 32, 32}, 10};
  if (name == "cifar100") return {name, 50000, {3, 32, 32}, 100};
  if (name == "fashion-mnist" || name == "fashion_mnist") return {"fashion-mnist", 60000, {1, 28, 28}, 10};
  if (name == "mnist") return {name, 60000, {1, 28, 28}, 10};
  if (name == "imagenet") return {name, 1281167, {3, 224, 224}, 1000};
  TANDEM_THROW(Status::kInvalidArgument,
               "unknown dataset \"{}\" (cifar10, cifar100, fashion-mnist, mnist, imagenet; or give --samples and "
               "--input)", name);
}

JobSpec resolve_job(const JobSpec& in, int32_t endpoints) {
  JobSpec j = in;
  TANDEM_REQUIRE(j.batch >= 1, "job.batch: must be >= 1, got {}", j.batch);
  TANDEM_REQUIRE(j.epochs > 0, "job.epochs: must be > 0, got {}", j.epochs);
  TANDEM_REQUIRE(j.micro_batches >= 1, "job.micro_batches: must be >= 1, got {}", j.micro_batches);
  TANDEM_REQUIRE(j.micro_batches <= j.batch, "job.micro_batches: {} micro-batches do not fit a batch of {}",
                 j.micro_batches, j.batch);
  TANDEM_REQUIRE(j.bucket_mb > 0, "job.bucket_mb: must be > 0, got {}", j.bucket_mb);
  TANDEM_REQUIRE(j.epoch_time_s >= 0, "job.epoch_time_s: must be >= 0, got {}", j.epoch_time_s);
  TANDEM_REQUIRE(j.dp >= 0 && j.pp >= 0, "job.dp/pp: must be >= 0 (0 derives them)");
  switch (j.strategy) {
    case Strategy::kSingle:
      TANDEM_REQUIRE(j.dp <= 1 && j.pp <= 1, "job: strategy single runs on one rank (got dp {} pp {})", j.dp, j.pp);
      j.dp = j.pp = 1;
      break;
    case Strategy::kDdp:
      TANDEM_REQUIRE(j.pp <= 1, "job.pp: strategy ddp has no pipeline stages (got pp {}; use hybrid)", j.pp);
      j.pp = 1;
      if (j.dp == 0) j.dp = endpoints;
      break;
    case Strategy::kPipeline:
      TANDEM_REQUIRE(j.dp <= 1, "job.dp: strategy pipeline has one replica (got dp {}; use hybrid)", j.dp);
      j.dp = 1;
      if (j.pp == 0) j.pp = endpoints;
      break;
    case Strategy::kHybrid:
      if (j.dp == 0 && j.pp == 0) {
        TANDEM_THROW(Status::kInvalidArgument, "job: strategy hybrid needs --dp and/or --pp");
      }
      if (j.dp == 0) j.dp = endpoints / j.pp;
      if (j.pp == 0) j.pp = endpoints / j.dp;
      break;
  }
  TANDEM_REQUIRE(j.dp >= 1 && j.pp >= 1, "job: dp {} x pp {} leaves no rank (the cluster has {})", j.dp, j.pp,
                 endpoints);
  TANDEM_REQUIRE(static_cast<int64_t>(j.dp) * j.pp <= endpoints,
                 "job: dp {} x pp {} = {} ranks but the cluster has {} devices", j.dp, j.pp, j.dp * j.pp, endpoints);
  if (j.pp == 1 && j.strategy != Strategy::kPipeline && j.strategy != Strategy::kHybrid) j.micro_batches = 1;
  return j;
}

}  // namespace tandem::simulator
