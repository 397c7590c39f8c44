#pragma once
// The checks every shim makes at the C boundary, in one place: field masks, text copied out through a caller's
// buffer, and handles. Each throws tandem::Error (the shim's guard turns it into a status and a message).
//
//   check_field_mask(p->field_mask, mask_through(TANDEM_MODEL_PARAM_INIT), "tandem_model_params_t");
//   copy_text_out(h.text, json, json_bytes, "tandem_calibration_json: json_bytes");
//   const auto& h = checked(model, "tandem_model_query", "model");   // or checked(model, "model")
//
// Handle structs derive from Handle<kMagic> (registered while alive); see checked() below.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "engine/core/error.hpp"
#include "tandem/tandem.h"

namespace tandem::api {

// ---- Field masks --------------------------------------------------------------------------------------------

// Every bit up to and including `highest`, the struct's highest defined TANDEM_*_PARAM_* / *_ATTR_* bit (bits
// are allocated densely from bit 0, so this is the mask the library knows). Not a single bit: a compile error.
consteval uint64_t mask_through(uint64_t highest) {
  if (highest == 0 || (highest & (highest - 1)) != 0) throw "mask_through: not a single field_mask bit";
  return highest | (highest - 1);
}

// kUnsupported "<struct_name>: unknown field_mask bits 0x.. (this library knows 0x..)" when `mask` has a bit
// outside `known`.
void check_field_mask(uint64_t mask, uint64_t known, const char* struct_name);

// ---- Text out -----------------------------------------------------------------------------------------------

// Copies `text` out the one way every *_json and message call does: *size_inout is in: the capacity of `buf`
// in bytes, out: the bytes the whole text needs including its NUL. `buf` may be NULL (a size query); a
// capacity of 0 writes nothing; otherwise the text is truncated to capacity - 1 bytes and NUL-terminated.
// size_inout NULL: kInvalidArgument "<size_name> is NULL" (where the C doc lets it be NULL with buf NULL, the
// shim skips the call). Nothing is written when it throws.
void copy_text_out(std::string_view text, char* buf, size_t* size_inout, const char* size_name = "json_bytes");

// ---- Handles ------------------------------------------------------------------------------------------------

// The set of live handles: a destroyed or foreign pointer is caught by a lookup before any field is read, so the
// check holds even when the memory has been freed (and under AddressSanitizer).
void register_handle(const void* h);
void unregister_handle(const void* h) noexcept;
bool handle_live(const void* h);

// Base of every struct behind an opaque C handle: registers itself while it lives, and carries a magic word.
// (The base is empty; a struct deriving from it starts with `magic`.)
class LiveHandle {
 public:
  LiveHandle() { register_handle(this); }
  ~LiveHandle() { unregister_handle(this); }
  LiveHandle(const LiveHandle&) = delete;
  LiveHandle& operator=(const LiveHandle&) = delete;
};
template <uint32_t Magic>
struct Handle : LiveHandle {
  static constexpr uint32_t kMagic = Magic;
  uint32_t magic = kMagic;
  ~Handle() { magic = 0; }
};

// True for a live handle of type H: the registry is asked first, so a destroyed or foreign pointer is never
// dereferenced; the magic word then tells handle kinds apart (a freed address reused by another kind).
template <typename H>
bool is_live(const H* h) {
  using T = std::remove_const_t<H>;
  static_assert(std::is_base_of_v<LiveHandle, T>, "every struct behind a C handle derives from Handle<kMagic>");
  if (h == nullptr) return false;
  return handle_live(static_cast<const LiveHandle*>(h)) && h->magic == T::kMagic;
}

// The one handle check: `h` itself, or kInvalidArgument "<fn>: <what> is NULL" / "<fn>: <what> is not a live
// handle (already destroyed?)". The two-argument form leaves out "<fn>: ".
template <typename H>
H& checked(H* h, const char* fn, const char* what) {
  TANDEM_REQUIRE(h != nullptr, "{}: {} is NULL", fn, what);
  TANDEM_REQUIRE(is_live(h), "{}: {} is not a live handle (already destroyed?)", fn, what);
  return *h;
}
template <typename H>
H& checked(H* h, const char* what) {
  TANDEM_REQUIRE(h != nullptr, "{} is NULL", what);
  TANDEM_REQUIRE(is_live(h), "{} is not a live handle (already destroyed?)", what);
  return *h;
}

// The body of every tandem_X_destroy: NULL, a destroyed or a foreign pointer is a no-op.
template <typename H>
void destroy_handle(H* h) noexcept {
  if (is_live(h)) delete h;
}

}  // namespace tandem::api
