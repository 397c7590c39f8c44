#include "engine/core/buffer_bytes.hpp"

#include <string>

#include <fmt/format.h>

#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"

namespace tandem {

size_t checked_buffer_bytes(std::string_view fn, std::string_view what, size_t count, size_t ranks, int32_t dtype) {
  if (!dtype_valid(dtype)) {
    std::string names;
    for (int i = 0; i < kNumDTypes; ++i) names += fmt::format("{}{}", i ? ", " : "", dtype_name(static_cast<DType>(i)));
    TANDEM_THROW(Status::kInvalidArgument, "{}: dtype {} is not a valid dtype (expected 0..{}: {})", fn, dtype,
                 kNumDTypes - 1, names);
  }
  const size_t elem = dtype_size(static_cast<DType>(dtype));
  TANDEM_REQUIRE(ranks == 0 || count <= kMaxBufferBytes / ranks / elem,
                 "{}: {} {} overflows the largest buffer ({} x {}-byte elements{} > {} bytes); a negative count "
                 "cast to size_t looks like this",
                 fn, what, count, count, elem, ranks > 1 ? fmt::format(" x {} ranks", ranks) : "", kMaxBufferBytes);
  return count * ranks * elem;
}

}  // namespace tandem
