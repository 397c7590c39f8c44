// The boundary checks of boundary.hpp: field masks, text out, and the set of live handles.
#include "api/src/boundary.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace tandem::api {

void check_field_mask(uint64_t mask, uint64_t known, const char* struct_name) {
  TANDEM_CHECK((mask & ~known) == 0, Status::kUnsupported,
               "{}: unknown field_mask bits 0x{:x} (this library knows 0x{:x}; set only the TANDEM_* bits of its "
               "header)",
               struct_name, mask & ~known, known);
}

void copy_text_out(std::string_view text, char* buf, size_t* size_inout, const char* size_name) {
  TANDEM_REQUIRE(size_inout != nullptr, "{} is NULL", size_name);
  if (buf != nullptr && *size_inout > 0) {
    const size_t n = std::min(text.size(), *size_inout - 1);
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  *size_inout = text.size() + 1;
}

namespace {
// Keyed by a library-private type so that the set's template code stays hidden in libtandem.so.
struct HandleKey {
  const void* p;
  bool operator==(const HandleKey& o) const { return p == o.p; }
};
struct HandleKeyHash {
  size_t operator()(const HandleKey& k) const { return std::hash<const void*>()(k.p); }
};
std::mutex g_live_mu;
std::unordered_set<HandleKey, HandleKeyHash>& live_set() {
  static std::unordered_set<HandleKey, HandleKeyHash> s;
  return s;
}
}  // namespace

void register_handle(const void* h) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_set().insert(HandleKey{h});
}
void unregister_handle(const void* h) noexcept {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_set().erase(HandleKey{h});
}
bool handle_live(const void* h) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  return live_set().count(HandleKey{h}) == 1;
}

}  // namespace tandem::api
