#include "engine/data/readers.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <zlib.h>

#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"

namespace tandem::engine::data {
namespace {

// Deflate's largest compression ratio (zlib's technical notes: 1032:1): no file holds more data than this times its
// size on disk, gzipped or plain.
constexpr size_t kMaxInflateRatio = 1032;

namespace fs = std::filesystem;

struct GzCloser {
  void operator()(gzFile f) const noexcept { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// A file read through zlib: gzread passes plain files through unchanged, so one path serves both.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    TANDEM_CHECK(fs::is_regular_file(path_, ec), Status::kIo, "'{}': no such file", path_);
    f_.reset(gzopen(path_.c_str(), "rb"));
    TANDEM_CHECK(f_ != nullptr, Status::kIo, "'{}': cannot open", path_);
    gzbuffer(f_.get(), 1 << 20);
  }
  // Reads up to n bytes; returns how many were read (short only at the end of the data).
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const auto chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f_.get(), static_cast<char*>(dst) + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(f_.get(), &code);
        TANDEM_THROW(Status::kIo, "'{}': corrupt or truncated data after {} bytes ({})", path_, done, msg);
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    // A gzip stream cut short reads as a clean end with a pending error.
    int code = 0;
    const char* msg = gzerror(f_.get(), &code);
    TANDEM_CHECK(code == Z_OK || code == Z_STREAM_END, Status::kIo, "'{}': corrupt or truncated compressed data ({})",
                 path_, msg);
    return done;
  }
  void read_exact(void* dst, size_t n, const char* what) {
    const size_t got = read(dst, n);
    TANDEM_CHECK(got == n, Status::kIo, "'{}': truncated: {} needs {} bytes, file has {}", path_, what, n, got);
  }
  bool at_end() {
    char c;
    return read(&c, 1) == 0;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  GzFile f_;
};

uint32_t big_endian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string first_existing(const std::string& dir, const std::string& base) {
  for (const fs::path& candidate : {fs::path(dir) / base, fs::path(dir) / (base + ".gz")}) {
    if (fs::exists(candidate)) return candidate.string();
  }
  TANDEM_THROW(Status::kIo, "'{}': missing (also tried '{}.gz')", (fs::path(dir) / base).string(),
               (fs::path(dir) / base).string());
}

}  // namespace

IdxArray read_idx(const std::string& path, int64_t limit) {
  Reader r(path);
  uint8_t magic[4];
  const size_t got = r.read(magic, 4);
  TANDEM_CHECK(got == 4, Status::kIo, "'{}': truncated: {} bytes, too short for an IDX header", path, got);
  TANDEM_CHECK(magic[0] == 0 && magic[1] == 0, Status::kIo,
               "'{}': wrong magic {:02x}{:02x}{:02x}{:02x} (an IDX file starts with two zero bytes)", path, magic[0],
               magic[1], magic[2], magic[3]);
  TANDEM_CHECK(magic[2] == 0x08, Status::kIo, "'{}': element type 0x{:02x} unsupported (expected 0x08, unsigned byte)",
               path, magic[2]);
  const int rank = magic[3];
  TANDEM_CHECK(rank >= 1 && rank <= 4, Status::kIo, "'{}': {} dimensions (expected 1 to 4)", path, rank);
  IdxArray a;
  uint8_t dim_bytes[16];
  r.read_exact(dim_bytes, 4 * static_cast<size_t>(rank), "the dimension list");
  int64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = big_endian(dim_bytes + 4 * i);
    TANDEM_CHECK(d > 0 && d < (int64_t{1} << 31), Status::kIo, "'{}': dimension {} is {}", path, i, d);
    a.dims.push_back(d);
    // checked before multiplying: total < 2^36 times d < 2^31 would overflow int64_t
    TANDEM_CHECK(d < (int64_t{1} << 36) / total, Status::kIo, "'{}': dimensions {} describe an implausibly large array",
                 path, fmt::join(a.dims, "x"));
    total *= d;
  }
  const int64_t records = a.file_records = a.dims[0];
  const int64_t kept = limited_samples(records, limit);
  const auto keep = static_cast<size_t>(total / records * kept);
  // The header's size is a claim: memory grows with the data actually read, so a short file announcing 2^35
  // values fails as truncated instead of allocating them first. The capacity is reserved once, up to what the
  // file can hold (its size on disk times deflate's largest ratio): a vector grown by doubling held its old and
  // new blocks at once, ~1.7x the set at the peak of loading (Fashion-MNIST's 47 MB: 93 MB, issue #16).
  std::error_code ec;
  const auto on_disk = static_cast<size_t>(fs::file_size(path, ec));
  a.values.reserve(ec ? 0 : std::min(keep, on_disk * kMaxInflateRatio));
  constexpr size_t kStep = size_t{16} << 20;
  size_t have = 0;
  auto check = [&](size_t want, size_t got) {
    TANDEM_CHECK(got == want, Status::kIo, "'{}': truncated: the {} data needs {} bytes, file has {}", path,
                 fmt::join(a.dims, "x"), total, have + got);
  };
  while (have < keep) {
    const size_t want = std::min(keep - have, kStep);
    a.values.resize(have + want);
    check(want, r.read(a.values.data() + have, want));
    have += want;
  }
  // Past the limit: read and checked, not kept.
  std::vector<uint8_t> scratch(std::min(static_cast<size_t>(total) - keep, kStep));
  while (have < static_cast<size_t>(total)) {
    const size_t want = std::min(static_cast<size_t>(total) - have, kStep);
    check(want, r.read(scratch.data(), want));
    have += want;
  }
  TANDEM_CHECK(r.at_end(), Status::kIo, "'{}': trailing bytes after the {} data (wrong dimensions?)", path,
               fmt::join(a.dims, "x"));
  a.dims[0] = kept;
  return a;
}

Dataset load_idx(const std::string& images_path, const std::string& labels_path, const std::string& name,
                 int64_t limit) {
  IdxArray images = read_idx(images_path, limit);
  IdxArray labels = read_idx(labels_path);  // all of them (1 byte each): the classes are the whole file's
  TANDEM_CHECK(images.dims.size() == 3, Status::kIo, "'{}': images must have 3 dimensions [N, H, W], got {}",
               images_path, images.dims.size());
  TANDEM_CHECK(labels.dims.size() == 1, Status::kIo, "'{}': labels must have 1 dimension [N], got {}", labels_path,
               labels.dims.size());
  TANDEM_CHECK(images.file_records == labels.dims[0], Status::kIo, "'{}' holds {} images but '{}' holds {} labels",
               images_path, images.file_records, labels_path, labels.dims[0]);
  Dataset d;
  d.name = name;
  d.channels = 1;
  d.height = images.dims[1];
  d.width = images.dims[2];
  d.pixels = std::move(images.values);
  d.num_classes = 1 + *std::max_element(labels.values.begin(), labels.values.end());
  d.labels.assign(labels.values.begin(), labels.values.begin() + images.dims[0]);
  return d;
}

std::string find_fashion_mnist(const std::string& dir) {
  std::vector<std::string> tried;
  if (!dir.empty()) {
    tried.push_back(dir);
  } else {
    if (const auto env = settings::current()->text("TANDEM_DATA_DIR"))
      tried.push_back((fs::path(*env) / "fashion-mnist").string());
    tried.push_back("/usr/share/datasets/fashion-mnist");
  }
  for (const auto& d : tried) {
    if (fs::exists(fs::path(d) / "train-labels-idx1-ubyte.gz") || fs::exists(fs::path(d) / "train-labels-idx1-ubyte"))
      return d;
  }
  TANDEM_THROW(Status::kIo,
               "Fashion-MNIST not found (tried {}); install Debian's dataset-fashion-mnist or pass its directory",
               fmt::join(tried, ", "));
}

Dataset load_fashion_mnist(bool train, const std::string& dir, int64_t limit) {
  const std::string d = find_fashion_mnist(dir);
  const std::string prefix = train ? "train" : "t10k";
  Dataset ds = load_idx(first_existing(d, prefix + "-images-idx3-ubyte"), first_existing(d, prefix + "-labels-idx1-ubyte"),
                        train ? "fashion-mnist-train" : "fashion-mnist-test", limit);
  ds.num_classes = 10;
  ds.validate();
  return ds;
}

Dataset load_cifar10(bool train, const std::string& dir, int64_t limit) {
  TANDEM_REQUIRE(!dir.empty(), "CIFAR-10: a directory holding the binary batches is required");
  std::string base = dir;
  if (!fs::exists(fs::path(base) / "test_batch.bin") && fs::exists(fs::path(base) / "cifar-10-batches-bin"))
    base = (fs::path(base) / "cifar-10-batches-bin").string();
  std::vector<std::string> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) files.push_back((fs::path(base) / fmt::format("data_batch_{}.bin", i)).string());
  } else {
    files.push_back((fs::path(base) / "test_batch.bin").string());
  }
  constexpr size_t kImage = 3 * 32 * 32, kRecord = 1 + kImage;
  Dataset d;
  d.name = train ? "cifar10-train" : "cifar10-test";
  d.channels = 3;
  d.height = d.width = 32;
  d.num_classes = 10;
  // Reserved once (the plain batches hold whole records; a gzipped one reserves less and grows): see read_idx.
  int64_t records = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto bytes = fs::file_size(f, ec);
    if (!ec) records += static_cast<int64_t>(bytes / kRecord);
  }
  const int64_t keep = limited_samples(records, limit);
  d.pixels.reserve(static_cast<size_t>(keep) * kImage);
  d.labels.reserve(static_cast<size_t>(keep));
  std::vector<uint8_t> record(kRecord);
  for (const auto& f : files) {
    Reader r(f);
    for (int64_t k = 0;; ++k) {
      const size_t got = r.read(record.data(), kRecord);
      if (got == 0) {
        TANDEM_CHECK(k > 0, Status::kIo, "'{}': empty file", f);
        break;
      }
      TANDEM_CHECK(got == kRecord, Status::kIo, "'{}': truncated: record {} has {} of {} bytes", f, k, got, kRecord);
      TANDEM_CHECK(record[0] < 10, Status::kIo, "'{}': record {} has label {} (CIFAR-10 labels are 0-9)", f, k,
                   record[0]);
      if (limit > 0 && d.size() >= limit) continue;  // past the limit: read and checked, not kept
      d.labels.push_back(record[0]);
      d.pixels.insert(d.pixels.end(), record.begin() + 1, record.end());
    }
  }
  return d;
}

}  // namespace tandem::engine::data
