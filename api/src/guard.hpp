#pragma once
// The one guard every exported function body goes through: records the thread-local message and
// maps tandem::Error to its status, std::bad_alloc to OUT_OF_MEMORY, anything else to INTERNAL.
#include <new>
#include <string>

#include "api/src/enums.hpp"
#include "engine/core/error.hpp"
#include "tandem/tandem.h"

namespace tandem::api {

void set_last_error(std::string message) noexcept;
void clear_last_error() noexcept;

template <typename F>
tandem_status_t guarded(F&& body) noexcept {
  try {
    clear_last_error();
    body();
    return TANDEM_OK;
  } catch (const tandem::Error& e) {
    set_last_error(e.what());
    return to_c(e.status());
  } catch (const std::bad_alloc&) {
    set_last_error("out of memory");
    return TANDEM_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return TANDEM_ERR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return TANDEM_ERR_INTERNAL;
  }
}

}  // namespace tandem::api
