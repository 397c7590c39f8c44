#pragma once
// Whole-file writes that a reader never sees half done: the bytes go to a temporary file next to the
// target (same directory, so the rename stays on one file system), which is fsync'd and renamed over
// the target; then the directory is fsync'd so the rename itself survives a crash. On any failure the
// temporary file is removed and the target is left as it was.
#include <string>
#include <string_view>

namespace tandem {

// Throws Error{kIo} naming `what` (e.g. "calibration profile"), the path and the system's reason.
void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view what);

}  // namespace tandem
