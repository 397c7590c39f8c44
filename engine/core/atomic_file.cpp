#include "engine/core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "engine/core/error.hpp"

namespace tandem {

void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view what) {
  TANDEM_REQUIRE(!path.empty(), "{}: empty output path", what);
  const std::filesystem::path target(path);
  const std::string dir = target.parent_path().empty() ? std::string(".") : target.parent_path().string();
  // mkstemp: a unique name, so two writers of one path (two ranks, two runs) never share a temporary.
  std::string tmpl = (std::filesystem::path(dir) / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  TANDEM_CHECK(fd >= 0, Status::kIo, "{} '{}': cannot create a temporary file in '{}': {}", what, path, dir,
               std::strerror(errno));
  const std::string tmp(name.data());
  auto fail = [&](const char* step) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    TANDEM_THROW(Status::kIo, "{} '{}': {} '{}' failed: {}", what, path, step, tmp, std::strerror(e));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing");
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0) fail("chmod of");  // mkstemp makes 0600; a profile is not a secret
  if (::fsync(fd) != 0) fail("fsync of");
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    TANDEM_THROW(Status::kIo, "{} '{}': rename from '{}' failed: {}", what, path, tmp, std::strerror(e));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace tandem
