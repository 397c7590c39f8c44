#pragma once
// AWS CPU credits of burstable instances (t2, t3). One credit is one vCPU at 100% for one minute.
// Credits are earned at credits_per_hour (the baseline: 6/h = 10% of one vCPU for t2.micro) up to
// max_credits; t2 instances in standard mode also start with launch credits (30 per vCPU), spent
// before earned ones and not counted against the cap. Using `usage` vCPUs spends usage credits per
// minute. In standard mode, when the balance reaches zero the CPU is held to its baseline share; in
// unlimited mode it keeps bursting and the surplus is billed per vCPU-hour.
// (docs.aws.amazon.com/AWSEC2/latest/UserGuide/burstable-credits-baseline-concepts.html)
#include <limits>

#include "simulator/presets.hpp"

namespace tandem::simulator {

class CreditAccount {
 public:
  // initial_total < 0: launch credits (standard mode) and nothing earned yet.
  CreditAccount(const BurstSpec& spec, int vcpus, CreditMode mode, double initial_total = -1);

  double balance() const noexcept { return launch_ + earned_; }
  CreditMode mode() const noexcept { return mode_; }
  // Seconds until the balance reaches zero while using `usage` vCPUs (infinity if it never does).
  double seconds_until_empty(double usage) const;
  // Spends `seconds` at `usage` vCPUs. In unlimited mode a zero balance accrues surplus credits.
  void advance(double seconds, double usage);
  double surplus_credits() const noexcept { return surplus_; }
  double surplus_usd() const noexcept { return surplus_ / 60.0 * spec_.surplus_usd_per_vcpu_hour; }
  double earn_per_s() const noexcept { return spec_.credits_per_hour / 3600.0; }
  // The share of full speed a CPU held to its baseline gets (standard mode, empty balance).
  double baseline_speed() const noexcept { return spec_.baseline; }

 private:
  BurstSpec spec_;
  int vcpus_;
  CreditMode mode_;
  double launch_ = 0, earned_ = 0, surplus_ = 0;
};

}  // namespace tandem::simulator
