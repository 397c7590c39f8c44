#include "simulator/compute/credits.hpp"

#include <algorithm>
#include <cmath>

#include "engine/core/error.hpp"

namespace tandem::simulator {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

CreditAccount::CreditAccount(const BurstSpec& spec, int vcpus, CreditMode mode, double initial_total)
    : spec_(spec), vcpus_(vcpus), mode_(mode) {
  TANDEM_REQUIRE(vcpus >= 1, "credit account: vcpus must be >= 1, got {}", vcpus);
  if (initial_total < 0) {
    launch_ = mode == CreditMode::kStandard ? spec.launch_credits_per_vcpu * vcpus : 0.0;
  } else {
    // a given balance counts as earned (capped) plus, above the cap, launch credits
    earned_ = std::min(initial_total, spec.max_credits);
    launch_ = initial_total - earned_;
  }
}

double CreditAccount::seconds_until_empty(double usage) const {
  const double spend = std::clamp(usage, 0.0, static_cast<double>(vcpus_)) / 60.0;
  const double earn = earn_per_s();
  double t = 0, earned = earned_;
  if (launch_ > 0) {
    if (spend <= 0) return kInf;
    t = launch_ / spend;
    earned = std::min(spec_.max_credits, earned + earn * t);
  }
  if (spend <= earn) return kInf;
  return t + earned / (spend - earn);
}

void CreditAccount::advance(double seconds, double usage) {
  TANDEM_REQUIRE(seconds >= 0, "credit account: cannot advance by {} s", seconds);
  const double spend = std::clamp(usage, 0.0, static_cast<double>(vcpus_)) / 60.0;
  const double earn = earn_per_s();
  double left = seconds;
  if (launch_ > 0 && left > 0) {
    const double t = spend > 0 ? std::min(left, launch_ / spend) : left;
    launch_ = std::max(0.0, launch_ - spend * t);
    if (t == left && spend > 0 && launch_ < 1e-12 * spec_.launch_credits_per_vcpu) launch_ = 0;
    earned_ = std::min(spec_.max_credits, earned_ + earn * t);
    left -= t;
  }
  if (left <= 0) return;
  const double net = spend - earn;
  if (net <= 0) {
    earned_ = std::min(spec_.max_credits, earned_ - net * left);
    return;
  }
  const double t = std::min(left, earned_ / net);
  earned_ = std::max(0.0, earned_ - net * t);
  left -= t;
  if (left > 0 && mode_ == CreditMode::kUnlimited) surplus_ += net * left;
}

}  // namespace tandem::simulator
