#include "engine/train/loss_scaler.hpp"

#include <cmath>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::engine::train {

namespace {
const char* mode_name(LossScaleConfig::Mode m) {
  switch (m) {
    case LossScaleConfig::Mode::kOff: return "off";
    case LossScaleConfig::Mode::kFixed: return "fixed";
    case LossScaleConfig::Mode::kDynamic: return "dynamic";
  }
  return "?";
}
}  // namespace

void LossScaleConfig::validate() const {
  TANDEM_REQUIRE(mode == Mode::kOff || mode == Mode::kFixed || mode == Mode::kDynamic,
                 "loss scaling: mode {} is not off (0), fixed (1) or dynamic (2)", static_cast<int>(mode));
  if (mode == Mode::kFixed)
    TANDEM_REQUIRE(std::isfinite(scale) && scale > 0, "loss scaling: the fixed scale must be a finite number > 0 (got {})",
                   scale);
  if (mode != Mode::kDynamic) return;
  TANDEM_REQUIRE(std::isfinite(init) && init > 0 && init <= 3.4e38,
                 "loss scaling: the initial scale must be a finite number in (0, 3.4e38] (got {})", init);
  TANDEM_REQUIRE(std::isfinite(growth) && growth > 1, "loss scaling: the growth factor must be > 1 (got {})", growth);
  TANDEM_REQUIRE(std::isfinite(backoff) && backoff > 0 && backoff < 1,
                 "loss scaling: the backoff factor must be in (0, 1) (got {})", backoff);
  TANDEM_REQUIRE(growth_interval >= 1, "loss scaling: the growth interval must be >= 1 step (got {})", growth_interval);
}

std::string LossScaleConfig::describe() const {
  switch (mode) {
    case Mode::kOff: return "off";
    case Mode::kFixed: return fmt::format("fixed {}", scale);
    case Mode::kDynamic:
      return fmt::format("dynamic (init {}, growth {} every {} steps, backoff {})", init, growth, growth_interval,
                         backoff);
  }
  return "?";
}

LossScaler::LossScaler(LossScaleConfig c) : config_(c) {
  config_.validate();
  state_.scale = config_.mode == LossScaleConfig::Mode::kDynamic ? config_.init
                 : config_.mode == LossScaleConfig::Mode::kFixed ? config_.scale
                                                                  : 1.0;
}

bool LossScaler::update(bool found_nonfinite) {
  if (!enabled()) return true;
  state_.last_skipped = found_nonfinite;
  if (found_nonfinite) ++state_.skipped;
  if (config_.mode != LossScaleConfig::Mode::kDynamic) return !found_nonfinite;
  // torch.amp.GradScaler's update (_amp_update_scale_): back off and restart the count, or count and grow.
  if (found_nonfinite) {
    state_.scale *= config_.backoff;
    state_.growth_tracker = 0;
  } else if (++state_.growth_tracker >= config_.growth_interval) {
    // The loss gradient is multiplied by a float: no growth past f32's range.
    if (state_.scale * config_.growth <= 3.4e38) state_.scale *= config_.growth;
    state_.growth_tracker = 0;
  }
  return !found_nonfinite;
}

bool LossScaler::unscale_and_update(compute::Backend& be, Tensor& grads, const Agree& agree, double* sum_squares) {
  if (!enabled()) {
    if (sum_squares != nullptr) *sum_squares = be.sum_squares(grads);
    return true;
  }
  if (state_.scale != 1.0) be.scale(grads, static_cast<float>(1.0 / state_.scale));
  const double ss = grads.numel() > 0 ? be.sum_squares(grads) : 0.0;
  if (sum_squares != nullptr) *sum_squares = ss;
  const bool local = !std::isfinite(ss);
  return update(agree ? agree(local) : local);
}

nlohmann::json LossScaler::to_json() const {
  return {{"mode", mode_name(config_.mode)}, {"scale", state_.scale}, {"growth_tracker", state_.growth_tracker},
          {"skipped", state_.skipped}};
}

void LossScaler::restore(const nlohmann::json& j) {
  const std::string mode = j.at("mode").get<std::string>();
  const double scale = j.at("scale").get<double>();
  const int64_t tracker = j.at("growth_tracker").get<int64_t>(), skipped = j.at("skipped").get<int64_t>();
  TANDEM_CHECK(std::isfinite(scale) && scale > 0 && tracker >= 0 && skipped >= 0, Status::kIo,
               "its loss scaler state is damaged (scale {}, growth tracker {}, skipped {})", scale, tracker, skipped);
  // A dynamic scale continues where it stood; a fixed one is this run's own choice, and a run that switches between
  // fixed and dynamic scaling (or turns scaling on) starts its scale afresh.
  if (config_.mode == LossScaleConfig::Mode::kDynamic && mode == "dynamic") {
    state_.scale = scale;
    state_.growth_tracker = tracker;
  }
  state_.skipped = skipped;
}

}  // namespace tandem::engine::train
