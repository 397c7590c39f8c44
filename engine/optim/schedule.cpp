#include "engine/optim/schedule.hpp"

#include <cmath>
#include <string>

#include "engine/core/error.hpp"

namespace tandem::engine::optim {

void ScheduleConfig::validate() const {
  TANDEM_REQUIRE(std::isfinite(base_lr) && base_lr >= 0, "schedule: base_lr must be >= 0 (got {})", base_lr);
  TANDEM_REQUIRE(warmup_steps >= 0, "schedule: warmup_steps must be >= 0 (got {})", warmup_steps);
  TANDEM_REQUIRE(step_size >= 1, "schedule: step_size must be >= 1 (got {})", step_size);
  TANDEM_REQUIRE(gamma > 0 && gamma <= 1, "schedule: gamma must be in (0, 1] (got {})", gamma);
  TANDEM_REQUIRE(total_steps >= 1, "schedule: total_steps must be >= 1 (got {})", total_steps);
  TANDEM_REQUIRE(min_lr >= 0 && min_lr <= base_lr, "schedule: min_lr must be in [0, base_lr] (got {})", min_lr);
}

float lr_at(const ScheduleConfig& s, int64_t step) {
  TANDEM_REQUIRE(step >= 0, "schedule: step {} must be >= 0", step);
  if (step < s.warmup_steps) {
    return static_cast<float>(static_cast<double>(s.base_lr) * static_cast<double>(step + 1) /
                              static_cast<double>(s.warmup_steps));
  }
  const int64_t t = step - s.warmup_steps;
  switch (s.kind) {
    case ScheduleKind::kConstant:
      return s.base_lr;
    case ScheduleKind::kStep:
      return static_cast<float>(s.base_lr * std::pow(static_cast<double>(s.gamma), static_cast<double>(t / s.step_size)));
    case ScheduleKind::kCosine: {
      const int64_t span = std::max<int64_t>(1, s.total_steps - s.warmup_steps);
      const double frac = std::min(1.0, static_cast<double>(t) / static_cast<double>(span));
      return static_cast<float>(s.min_lr + (s.base_lr - s.min_lr) * 0.5 * (1.0 + std::cos(M_PI * frac)));
    }
  }
  return s.base_lr;
}

namespace {
double number(std::string_view text, std::string_view what, std::string_view whole) {
  try {
    size_t used = 0;
    const std::string s(text);
    const double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  TANDEM_THROW(Status::kInvalidArgument, "schedule '{}': {} '{}' is not a number", whole, what, text);
}
}  // namespace

ScheduleConfig parse_schedule(std::string_view text, float base_lr, int64_t steps_per_epoch, int64_t total_epochs) {
  TANDEM_REQUIRE(steps_per_epoch >= 1 && total_epochs >= 1, "schedule: steps per epoch {} and epochs {} must be >= 1",
                 steps_per_epoch, total_epochs);
  ScheduleConfig s;
  s.base_lr = base_lr;
  s.total_steps = steps_per_epoch * total_epochs;
  std::string_view main = text, extra;
  if (const auto comma = text.find(','); comma != std::string_view::npos) {
    main = text.substr(0, comma);
    extra = text.substr(comma + 1);
  }
  if (main == "constant" || main.empty()) {
    s.kind = ScheduleKind::kConstant;
  } else if (main == "cosine") {
    s.kind = ScheduleKind::kCosine;
  } else if (main.substr(0, 5) == "step:") {
    s.kind = ScheduleKind::kStep;
    const std::string_view rest = main.substr(5);
    const auto colon = rest.find(':');
    TANDEM_REQUIRE(colon != std::string_view::npos, "schedule '{}': expected step:EPOCHS:GAMMA", text);
    const double epochs = number(rest.substr(0, colon), "step epochs", text);
    TANDEM_REQUIRE(epochs >= 1, "schedule '{}': step epochs must be >= 1", text);
    s.step_size = static_cast<int64_t>(std::llround(epochs * static_cast<double>(steps_per_epoch)));
    s.gamma = static_cast<float>(number(rest.substr(colon + 1), "gamma", text));
  } else {
    TANDEM_THROW(Status::kInvalidArgument, "schedule '{}': unknown kind '{}' (expected constant, step:E:G or cosine)",
                 text, main);
  }
  if (!extra.empty()) {
    TANDEM_REQUIRE(extra.substr(0, 7) == "warmup:", "schedule '{}': unknown option '{}' (expected warmup:EPOCHS)",
                   text, extra);
    const double w = number(extra.substr(7), "warm-up epochs", text);
    TANDEM_REQUIRE(w >= 0, "schedule '{}': warm-up epochs must be >= 0", text);
    s.warmup_steps = static_cast<int64_t>(std::llround(w * static_cast<double>(steps_per_epoch)));
  }
  s.validate();
  return s;
}

}  // namespace tandem::engine::optim
