#pragma once
// Every enum that crosses the C boundary, C value beside engine value, checked at compile time; and the only
// conversions between them (to_c, from_c, checked_enum) -- shims use these, never a bare static_cast.
//
//   c.strategy = checked_enum(p->strategy, "tandem_trainer_create_parallel: params->strategy");  // validated
//   e.dtype = from_c(dtype);                    // a value already validated (checked_enum / checked_bytes)
//   *algo = to_c(comm.allreduce_algorithm_for(n, dtype));
//
// Adding a value to a C enum: add its row to the table below (the static_asserts then check it against the
// engine's enum); the C doc's "expected 0..N" messages follow the table.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>

#include "engine/comm/plan.hpp"
#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/optim/optimizer.hpp"
#include "engine/parallel/parallel_config.hpp"
#include "engine/parallel/schedule.hpp"
#include "simulator/presets.hpp"
#include "tandem/tandem.h"

namespace tandem::api {

template <typename C, typename E>
struct EnumRow {
  C c;
  E e;
};

// Per C enum: its name, its engine enum and the rows, every C value from 0 in order.
template <typename C>
struct CEnum;
// Per engine enum: its C enum.
template <typename E>
struct EngineEnum;

#define TANDEM_API_ENUM(CType, EType, ...)                                                      \
  template <>                                                                                   \
  struct CEnum<CType> {                                                                         \
    using Engine = EType;                                                                       \
    static constexpr const char* kName = #CType;                                                \
    static constexpr EnumRow<CType, EType> kRows[] = {__VA_ARGS__};                             \
  };                                                                                            \
  template <>                                                                                   \
  struct EngineEnum<EType> {                                                                    \
    using C = CType;                                                                            \
  }

TANDEM_API_ENUM(tandem_status_t, Status,                                                        //
                {TANDEM_OK, Status::kOk}, {TANDEM_IN_PROGRESS, Status::kInProgress},            //
                {TANDEM_ERR_INVALID_ARGUMENT, Status::kInvalidArgument},                        //
                {TANDEM_ERR_UNSUPPORTED, Status::kUnsupported},                                 //
                {TANDEM_ERR_OUT_OF_MEMORY, Status::kOutOfMemory},                               //
                {TANDEM_ERR_TRANSPORT, Status::kTransport}, {TANDEM_ERR_BACKEND, Status::kBackend},  //
                {TANDEM_ERR_TIMEOUT, Status::kTimeout}, {TANDEM_ERR_INTERNAL, Status::kInternal},  //
                {TANDEM_ERR_MISMATCH, Status::kMismatch},                                       //
                {TANDEM_ERR_PEER_FAILURE, Status::kPeerFailure}, {TANDEM_ERR_IO, Status::kIo},  //
                {TANDEM_ERR_AUTH, Status::kAuth});
TANDEM_API_ENUM(tandem_dtype_t, DType,                                                          //
                {TANDEM_F32, DType::kF32}, {TANDEM_F64, DType::kF64}, {TANDEM_F16, DType::kF16},  //
                {TANDEM_BF16, DType::kBF16}, {TANDEM_I32, DType::kI32}, {TANDEM_I64, DType::kI64},  //
                {TANDEM_U8, DType::kU8});
TANDEM_API_ENUM(tandem_op_t, ReduceOp,                                                          //
                {TANDEM_SUM, ReduceOp::kSum}, {TANDEM_AVG, ReduceOp::kAvg}, {TANDEM_MIN, ReduceOp::kMin},  //
                {TANDEM_MAX, ReduceOp::kMax}, {TANDEM_PROD, ReduceOp::kProd});
TANDEM_API_ENUM(tandem_log_level_t, log::Level,                                                 //
                {TANDEM_LOG_TRACE, log::Level::kTrace}, {TANDEM_LOG_DEBUG, log::Level::kDebug},  //
                {TANDEM_LOG_INFO, log::Level::kInfo}, {TANDEM_LOG_WARN, log::Level::kWarn},     //
                {TANDEM_LOG_ERROR, log::Level::kError}, {TANDEM_LOG_OFF, log::Level::kOff});
TANDEM_API_ENUM(tandem_algo_t, engine::comm::Algorithm,                                         //
                {TANDEM_ALGO_AUTO, engine::comm::Algorithm::kAuto},                             //
                {TANDEM_ALGO_RING, engine::comm::Algorithm::kRing},                             //
                {TANDEM_ALGO_HALVING_DOUBLING, engine::comm::Algorithm::kHalvingDoubling},      //
                {TANDEM_ALGO_TREE, engine::comm::Algorithm::kTree},                             //
                {TANDEM_ALGO_HIERARCHICAL, engine::comm::Algorithm::kHierarchical},             //
                {TANDEM_ALGO_DIRECT, engine::comm::Algorithm::kDirect},                         //
                {TANDEM_ALGO_DETERMINISTIC, engine::comm::Algorithm::kDeterministic});
TANDEM_API_ENUM(tandem_optimizer_kind_t, engine::optim::OptimizerKind,                          //
                {TANDEM_OPTIMIZER_SGD, engine::optim::OptimizerKind::kSgd},                     //
                {TANDEM_OPTIMIZER_ADAM, engine::optim::OptimizerKind::kAdam},                   //
                {TANDEM_OPTIMIZER_ADAMW, engine::optim::OptimizerKind::kAdamW});
TANDEM_API_ENUM(tandem_strategy_t, engine::parallel::Strategy,                                  //
                {TANDEM_STRATEGY_SINGLE, engine::parallel::Strategy::kSingle},                  //
                {TANDEM_STRATEGY_DDP, engine::parallel::Strategy::kDdp},                        //
                {TANDEM_STRATEGY_PIPELINE, engine::parallel::Strategy::kPipeline},              //
                {TANDEM_STRATEGY_HYBRID, engine::parallel::Strategy::kHybrid},                  //
                {TANDEM_STRATEGY_PS, engine::parallel::Strategy::kPs},                          //
                {TANDEM_STRATEGY_PS_ASYNC, engine::parallel::Strategy::kPsAsync},               //
                {TANDEM_STRATEGY_SSP, engine::parallel::Strategy::kSsp},                        //
                {TANDEM_STRATEGY_ASGD, engine::parallel::Strategy::kAsgd},                      //
                {TANDEM_STRATEGY_EASGD, engine::parallel::Strategy::kEasgd},                    //
                {TANDEM_STRATEGY_FEDAVG, engine::parallel::Strategy::kFedAvg},                  //
                {TANDEM_STRATEGY_LOCALSGD, engine::parallel::Strategy::kLocalSgd});
TANDEM_API_ENUM(tandem_schedule_t, engine::parallel::ScheduleKind,                              //
                {TANDEM_SCHEDULE_GPIPE, engine::parallel::ScheduleKind::kGPipe},                //
                {TANDEM_SCHEDULE_1F1B, engine::parallel::ScheduleKind::kOneFOneB});
TANDEM_API_ENUM(tandem_compression_t, engine::parallel::GradCompression,                        //
                {TANDEM_COMPRESSION_NONE, engine::parallel::GradCompression::kNone},            //
                {TANDEM_COMPRESSION_FP16, engine::parallel::GradCompression::kF16},             //
                {TANDEM_COMPRESSION_BF16, engine::parallel::GradCompression::kBF16});
TANDEM_API_ENUM(tandem_staleness_lr_t, engine::parallel::StalenessLr,                           //
                {TANDEM_STALENESS_LR_NONE, engine::parallel::StalenessLr::kNone},                //
                {TANDEM_STALENESS_LR_INVERSE, engine::parallel::StalenessLr::kInverse},          //
                {TANDEM_STALENESS_LR_MOMENTUM, engine::parallel::StalenessLr::kMomentum});
TANDEM_API_ENUM(tandem_partition_t, engine::parallel::PartitionCost,                            //
                {TANDEM_PARTITION_FLOPS, engine::parallel::PartitionCost::kFlops},              //
                {TANDEM_PARTITION_MEASURED, engine::parallel::PartitionCost::kMeasured});
#undef TANDEM_API_ENUM

// True when the rows list the C values 0, 1, ..., N-1 in order and each engine value equals its C value: then
// a static_cast between the two is exact, and a C value is valid exactly when it is below N.
template <typename C>
consteval bool rows_agree() {
  int64_t i = 0;
  for (const auto& r : CEnum<C>::kRows) {
    if (static_cast<int64_t>(r.c) != i || static_cast<int64_t>(r.e) != i) return false;
    ++i;
  }
  return true;
}
static_assert(rows_agree<tandem_status_t>(), "tandem_status_t and tandem::Status disagree");
static_assert(rows_agree<tandem_dtype_t>(), "tandem_dtype_t and tandem::DType disagree");
static_assert(std::size(CEnum<tandem_dtype_t>::kRows) == kNumDTypes, "a DType without a tandem_dtype_t");
static_assert(rows_agree<tandem_op_t>(), "tandem_op_t and tandem::ReduceOp disagree");
static_assert(std::size(CEnum<tandem_op_t>::kRows) == kNumReduceOps, "a ReduceOp without a tandem_op_t");
static_assert(rows_agree<tandem_log_level_t>(), "tandem_log_level_t and log::Level disagree");
static_assert(rows_agree<tandem_algo_t>(), "tandem_algo_t and engine::comm::Algorithm disagree");
static_assert(rows_agree<tandem_optimizer_kind_t>(), "tandem_optimizer_kind_t and optim::OptimizerKind disagree");
static_assert(rows_agree<tandem_strategy_t>(), "tandem_strategy_t and parallel::Strategy disagree");
static_assert(rows_agree<tandem_schedule_t>(), "tandem_schedule_t and parallel::ScheduleKind disagree");
static_assert(rows_agree<tandem_compression_t>(), "tandem_compression_t and parallel::GradCompression disagree");
static_assert(rows_agree<tandem_partition_t>(), "tandem_partition_t and parallel::PartitionCost disagree");
static_assert(rows_agree<tandem_staleness_lr_t>(), "tandem_staleness_lr_t and parallel::StalenessLr disagree");

// How many values C has (its valid values are 0 .. count - 1).
template <typename C>
constexpr int64_t enum_count() {
  return static_cast<int64_t>(std::size(CEnum<C>::kRows));
}
// Whether a C value (as the caller passed it, possibly out of range) is one of C's.
template <typename C>
constexpr bool enum_valid(C v) {
  const auto i = static_cast<int64_t>(v);
  return i >= 0 && i < enum_count<C>();
}
// The engine value of a valid C value.
template <typename C>
constexpr typename CEnum<C>::Engine from_c(C v) {
  return static_cast<typename CEnum<C>::Engine>(v);
}
// The C value of an engine value.
template <typename E>
constexpr typename EngineEnum<E>::C to_c(E e) {
  return static_cast<typename EngineEnum<E>::C>(e);
}
// The engine value of a C value the caller gave, or kInvalidArgument "<what> <v> is not a valid <C> (expected
// 0..N-1)".
template <typename C>
typename CEnum<C>::Engine checked_enum(C v, const char* what) {
  TANDEM_REQUIRE(enum_valid(v), "{} {} is not a valid {} (expected 0..{})", what, static_cast<int64_t>(v),
                 CEnum<C>::kName, enum_count<C>() - 1);
  return from_c(v);
}

// tandem_credit_mode_t is not a copy of simulator::CreditMode: PRESET (0) means "the preset's own", no mode;
// the others agree by value.
static_assert(static_cast<int>(TANDEM_CREDIT_MODE_STANDARD) == static_cast<int>(simulator::CreditMode::kStandard) &&
              static_cast<int>(TANDEM_CREDIT_MODE_UNLIMITED) == static_cast<int>(simulator::CreditMode::kUnlimited));
// nullopt for PRESET; kInvalidArgument naming `what` for a value outside the enum.
inline std::optional<simulator::CreditMode> checked_credit_mode(tandem_credit_mode_t v, const char* what) {
  switch (v) {
    case TANDEM_CREDIT_MODE_PRESET: return std::nullopt;
    case TANDEM_CREDIT_MODE_STANDARD: return simulator::CreditMode::kStandard;
    case TANDEM_CREDIT_MODE_UNLIMITED: return simulator::CreditMode::kUnlimited;
    default: break;
  }
  TANDEM_THROW(Status::kInvalidArgument, "{} {} is not a valid tandem_credit_mode_t (expected 0..2)", what,
               static_cast<int64_t>(v));
}

}  // namespace tandem::api
