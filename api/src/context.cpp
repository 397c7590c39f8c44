// Versions, status strings, last error, and the context handle.
#include <atomic>
#include <memory>
#include <string>

#include "api/src/guard.hpp"
#include "api/src/handles.hpp"
#include "engine/core/dtype.hpp"
#include "engine/core/log.hpp"

namespace tandem::api {
namespace {
thread_local std::string t_last_error;

// A context's logger with the user's sink it forwards to; they live and die together (handles
// keep the logger, so it may outlive the context).
struct SinkedLogger {
  log::Logger logger;
  tandem_log_fn fn = nullptr;
  void* user = nullptr;
};

void sink_trampoline(int level, const char* message, void* user) {
  auto* box = static_cast<SinkedLogger*>(user);
  box->fn(static_cast<tandem_log_level_t>(level), message, box->user);
}

// The context's settings: the environment now, then params->settings in order, all checked.
std::shared_ptr<const settings::Settings> resolve_settings(const tandem_context_params_t* params) {
  auto s = std::make_shared<settings::Settings>(settings::Settings::from_environment());
  if (params != nullptr && (params->field_mask & TANDEM_CONTEXT_PARAM_SETTINGS) && params->num_settings > 0) {
    TANDEM_REQUIRE(params->settings != nullptr, "tandem_context_create: settings is NULL but num_settings is {}",
                   params->num_settings);
    for (size_t i = 0; i < params->num_settings; ++i) {
      TANDEM_REQUIRE(params->settings[i] != nullptr, "tandem_context_create: settings[{}] is NULL", i);
      s->assign(params->settings[i]);
    }
  }
  s->validate();
  return s;
}
}  // namespace

void set_last_error(std::string message) noexcept {
  try {
    t_last_error = std::move(message);
  } catch (...) {
  }
}
void clear_last_error() noexcept { t_last_error.clear(); }
const std::string& last_error() noexcept { return t_last_error; }

}  // namespace tandem::api

using tandem::api::guarded;

extern "C" {

TANDEM_API uint32_t tandem_version(void) TANDEM_NOEXCEPT { return TANDEM_VERSION; }

TANDEM_API const char* tandem_version_string(void) TANDEM_NOEXCEPT {
#define TANDEM_STR2(x) #x
#define TANDEM_STR(x) TANDEM_STR2(x)
  return TANDEM_STR(TANDEM_VERSION_MAJOR) "." TANDEM_STR(TANDEM_VERSION_MINOR) "." TANDEM_STR(TANDEM_VERSION_PATCH);
}

TANDEM_API const char* tandem_status_string(tandem_status_t s) TANDEM_NOEXCEPT {
  if (s < TANDEM_OK || s > TANDEM_ERR_AUTH) return "unknown status";
  return tandem::status_name(static_cast<tandem::Status>(s));
}

TANDEM_API const char* tandem_last_error_message(void) TANDEM_NOEXCEPT { return tandem::api::last_error().c_str(); }

TANDEM_API size_t tandem_dtype_size(tandem_dtype_t dtype) TANDEM_NOEXCEPT {
  if (!tandem::dtype_valid(dtype)) return 0;
  return tandem::dtype_size(static_cast<tandem::DType>(dtype));
}

TANDEM_API tandem_status_t tandem_context_create_v(uint32_t header_version, const tandem_context_params_t* params,
                                                   tandem_context_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    TANDEM_REQUIRE(out != nullptr, "tandem_context_create: out must be non-null");
    // A newer minor version's header may declare calls, fields and field_mask bits this library lacks; only a
    // newer patch (fixes, no new surface) is accepted.
    TANDEM_CHECK(header_version / 100 <= TANDEM_VERSION / 100, tandem::Status::kUnsupported,
                 "tandem_context_create: header version {}.{}.{} is newer than library version {} (a header of a "
                 "newer major or minor version is not supported; link the library it came with)",
                 header_version / 10000, header_version / 100 % 100, header_version % 100, tandem_version_string());
    auto ctx = std::make_unique<tandem_context>();
    if (params != nullptr) {
      tandem::api::check_field_mask(params->field_mask, tandem::api::mask_through(TANDEM_CONTEXT_PARAM_SETTINGS),
                                    "tandem_context_params_t");
    }
    ctx->env.settings = tandem::api::resolve_settings(params);
    auto sinked = std::make_shared<tandem::api::SinkedLogger>();
    const char* env_level = ctx->env.settings->get("TANDEM_LOG_LEVEL");
    sinked->logger.set_level(env_level ? *tandem::log::parse_level(env_level) : tandem::log::Level::kWarn);
    if (params != nullptr) {
      if (params->field_mask & TANDEM_CONTEXT_PARAM_NUM_THREADS) {
        TANDEM_REQUIRE(params->num_threads >= 0 && params->num_threads <= 4096,
                       "tandem_context_create: num_threads {} out of range [0, 4096]", params->num_threads);
        ctx->num_threads = params->num_threads;
      }
      if (params->field_mask & TANDEM_CONTEXT_PARAM_LOG_LEVEL) {
        TANDEM_REQUIRE(params->log_level >= TANDEM_LOG_TRACE && params->log_level <= TANDEM_LOG_OFF,
                       "tandem_context_create: log_level {} out of range", static_cast<int>(params->log_level));
        sinked->logger.set_level(static_cast<tandem::log::Level>(params->log_level));
      }
      if ((params->field_mask & TANDEM_CONTEXT_PARAM_LOG_SINK) && params->log_sink != nullptr) {
        sinked->fn = params->log_sink;
        sinked->user = params->log_user_data;
        sinked->logger.set_sink(&tandem::api::sink_trampoline, sinked.get());
      }
    }
    ctx->env.logger = std::shared_ptr<tandem::log::Logger>(sinked, &sinked->logger);
    const tandem::api::ContextScope scope(ctx->env);
    tandem::log::debug("tandem_context_create: {} settings given", params != nullptr &&
                       (params->field_mask & TANDEM_CONTEXT_PARAM_SETTINGS) ? params->num_settings : 0);
    *out = ctx.release();
  });
}

TANDEM_API void tandem_context_destroy(tandem_context_t* ctx) TANDEM_NOEXCEPT { tandem::api::destroy_handle(ctx); }

}  // extern "C"
