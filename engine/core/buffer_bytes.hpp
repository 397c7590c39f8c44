#pragma once
// The one check of a buffer's element count, shared by the C shims (api/src) and the communicator
// (engine/comm), so both refuse the same counts with the same message.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem {

// The largest buffer, in bytes, any call accepts: PTRDIFF_MAX, so that every pointer into a buffer and every
// offset between two of its bytes is defined. (A negative count cast to size_t lands above it.)
inline constexpr size_t kMaxBufferBytes = static_cast<size_t>(PTRDIFF_MAX);

// Bytes of `count` x `ranks` elements of `dtype` (a raw value, as a caller passed it: it is checked here too).
// kInvalidArgument naming `fn` and `what` (the count's name, e.g. "count") when the dtype is not valid or the
// bytes exceed kMaxBufferBytes. ranks 0 gives 0.
size_t checked_buffer_bytes(std::string_view fn, std::string_view what, size_t count, size_t ranks, int32_t dtype);

}  // namespace tandem
