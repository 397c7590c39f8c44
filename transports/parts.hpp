#pragma once
// Helpers shared by the transports for the scatter/gather parts of a message.
#include <cstddef>
#include <span>

#include "transports/transport.hpp"

namespace tandem::transports {

size_t total_bytes(std::span<const ConstPart> parts) noexcept;
size_t total_bytes(std::span<const MutPart> parts) noexcept;

// Copies the concatenation of `src` into the concatenation of `dst`, part boundaries independent;
// stops when either side runs out. Returns the number of bytes copied.
size_t scatter_copy(std::span<const ConstPart> src, std::span<const MutPart> dst) noexcept;

// Copies `bytes` from `data` into `dst` starting at byte `offset` of the concatenated parts;
// bytes beyond the end of `dst` are dropped. Returns the number of bytes written.
size_t copy_into_at(std::span<const MutPart> dst, size_t offset, const void* data, size_t bytes) noexcept;

// The reverse: copies up to `bytes` from byte `offset` of the concatenated `src` into `out`. Returns the number of
// bytes copied (fewer when `src` ends first).
size_t copy_out_at(std::span<const ConstPart> src, size_t offset, void* out, size_t bytes) noexcept;

}  // namespace tandem::transports
