// Readers against the real Fashion-MNIST files and against broken files written here; the sampler, augmentation and
// the prefetching loader.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <zlib.h>

#include "engine/core/error.hpp"
#include "tests/nn/expect_error.hpp"
#include "engine/data/augment.hpp"
#include "engine/data/loader.hpp"
#include "engine/data/readers.hpp"
#include "engine/data/sampler.hpp"

using namespace tandem::engine::data;
using tandem::Error;
using tandem::Status;
using tandem::testing::expect_error;
namespace fs = std::filesystem;

namespace {

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tandem_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string file(const std::string& name, const std::vector<uint8_t>& bytes, bool gzip = false) const {
    const std::string p = (path / name).string();
    if (gzip) {
      gzFile f = gzopen(p.c_str(), "wb");
      gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
      gzclose(f);
    } else {
      std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    }
    return p;
  }
};

std::vector<uint8_t> idx(std::vector<uint32_t> dims, uint8_t type = 0x08, int64_t data_bytes = -1) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  int64_t n = 1;
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
    n *= d;
  }
  if (data_bytes < 0) data_bytes = n;
  for (int64_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<uint8_t>(i * 7));
  return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fashion_mnist)

BOOST_AUTO_TEST_CASE(real_files_have_the_known_counts_labels_and_pixels) {
  const Dataset train = load_fashion_mnist(true);
  BOOST_TEST(train.size() == 60000);
  BOOST_TEST(train.channels == 1);
  BOOST_TEST(train.height == 28);
  BOOST_TEST(train.width == 28);
  BOOST_TEST(train.num_classes == 10);
  const std::vector<int32_t> first = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};  // the first ten training labels
  BOOST_TEST(std::vector<int32_t>(train.labels.begin(), train.labels.begin() + 10) == first);
  BOOST_TEST(train.sample(0)[14 * 28 + 14] == 217);  // the ankle boot's centre pixel
  BOOST_TEST(train.sample(0)[10 * 28 + 10] == 0);
  std::vector<int> per_class(10);
  for (int32_t l : train.labels) ++per_class[static_cast<size_t>(l)];
  for (int c : per_class) BOOST_TEST(c == 6000);
  BOOST_TEST(std::accumulate(train.pixels.begin(), train.pixels.end(), uint64_t{0}) == 3431114169ull);

  const Dataset test = load_fashion_mnist(false);
  BOOST_TEST(test.size() == 10000);
  BOOST_TEST(test.labels[0] == 9);
  BOOST_TEST(test.labels[1] == 2);
  BOOST_TEST(test.sample(0)[14 * 28 + 14] == 110);
  BOOST_TEST(test.sample(9999)[20 * 28 + 10] == 57);
}

// Issue #16: with a limit (`tandem train --train-limit N`) the reader keeps only the first N samples -- it held the
// whole set first and copied the head, so the run's peak held both --, and a set is held once: its vector grew by
// doubling (16, 32, 64 MiB for Fashion-MNIST's 47 MB), the old and new blocks both resident at the peak of loading.
BOOST_AUTO_TEST_CASE(a_limit_keeps_the_first_samples_and_a_set_is_held_once) {
  const Dataset all = load_fashion_mnist(true);
  BOOST_TEST(all.pixels.capacity() == all.pixels.size());  // reserved once, never reallocated
  const Dataset first = load_fashion_mnist(true, "", 1000);
  BOOST_TEST(first.size() == limited_samples(60000, 1000));
  BOOST_TEST(first.num_classes == 10);
  BOOST_TEST(first.pixels.capacity() == first.pixels.size());  // 1000 samples' bytes, not 60,000's
  BOOST_TEST((first.pixels == all.head(1000).pixels));
  BOOST_TEST((first.labels == all.head(1000).labels));
  BOOST_TEST(first.resident_bytes() == resident_bytes(1000, 28 * 28));
  BOOST_TEST(load_fashion_mnist(false, "", 20000).size() == 10000);  // a limit above the set keeps the set
  BOOST_TEST(limited_samples(10000, 0) == 10000);
}

BOOST_AUTO_TEST_CASE(missing_directory_lists_the_places_tried) {
  expect_error([] { load_fashion_mnist(true, "/nonexistent/fmnist"); }, Status::kIo, {"/nonexistent/fmnist", "not found"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(idx_reader)

BOOST_AUTO_TEST_CASE(reads_plain_and_gzip_alike) {
  TempDir t;
  const auto bytes = idx({3, 2, 4});
  const IdxArray a = read_idx(t.file("a.idx", bytes));
  const IdxArray b = read_idx(t.file("b.idx.gz", bytes, true));
  BOOST_TEST(a.dims == (std::vector<int64_t>{3, 2, 4}));
  BOOST_TEST(a.values.size() == 24u);
  BOOST_TEST(a.values[5] == 35);
  BOOST_TEST(a.values == b.values);
  // A limit keeps the first records; the rest is still read and checked (a truncated tail fails as before).
  const IdxArray head = read_idx(t.file("c.idx.gz", bytes, true), 2);
  BOOST_TEST(head.dims == (std::vector<int64_t>{2, 2, 4}));
  BOOST_TEST(head.file_records == 3);
  BOOST_TEST((head.values == std::vector<uint8_t>(b.values.begin(), b.values.begin() + 16)));
  const std::string cut = t.file("cut.idx", idx({3, 2, 4}, 0x08, 20));
  expect_error([&] { read_idx(cut, 1); }, Status::kIo, {cut, "truncated", "needs 24 bytes, file has 20"});
}

BOOST_AUTO_TEST_CASE(bad_files_name_the_file_and_the_fault) {
  TempDir t;
  const std::string magic = t.file("magic.idx", {1, 2, 8, 1, 0, 0, 0, 1, 5});
  expect_error([&] { read_idx(magic); }, Status::kIo, {magic, "wrong magic"});
  const std::string type = t.file("type.idx", idx({4}, 0x0d));
  expect_error([&] { read_idx(type); }, Status::kIo, {type, "element type 0x0d"});
  const std::string trunc = t.file("trunc.idx", idx({10, 3}, 0x08, 17));
  expect_error([&] { read_idx(trunc); }, Status::kIo, {trunc, "truncated", "needs 30 bytes, file has 17"});
  const std::string header = t.file("header.idx", {0, 0, 8, 3, 0, 0});
  expect_error([&] { read_idx(header); }, Status::kIo, {header, "truncated", "dimension list"});
  const std::string trailing = t.file("trail.idx", idx({4}, 0x08, 6));
  expect_error([&] { read_idx(trailing); }, Status::kIo, {trailing, "trailing bytes"});
  expect_error([&] { read_idx((t.path / "none.idx").string()); }, Status::kIo, {"none.idx", "no such file"});

  // A gzip stream cut in half.
  std::vector<uint8_t> big = idx({64, 64});
  const std::string gz = t.file("cut.gz", big, true);
  const auto size = fs::file_size(gz);
  fs::resize_file(gz, size / 2);
  expect_error([&] { read_idx(gz); }, Status::kIo, {gz});
}

// Found by the idx fuzz target: the header's sizes used to be allocated (and zero-filled) before any data was read.
BOOST_AUTO_TEST_CASE(a_header_claiming_32_gib_fails_as_truncated_without_allocating_it) {
  TempDir t;
  const std::string huge = t.file("huge.idx", {0, 0, 8, 2, 0, 2, 0, 0, 0, 4, 0, 0, 'a', 'b', 'c', 'd'});
  expect_error([&] { read_idx(huge); }, Status::kIo, {huge, "truncated", "needs 34359738368 bytes, file has 4"});
}

BOOST_AUTO_TEST_CASE(image_and_label_files_must_agree) {
  TempDir t;
  const std::string images = t.file("img", idx({5, 2, 2}));
  const std::string labels = t.file("lab", idx({4}));
  expect_error([&] { load_idx(images, labels, "x"); }, Status::kIo, {"5 images", "4 labels"});
  expect_error([&] { load_idx(images, labels, "x", 2); }, Status::kIo, {"5 images", "4 labels"});  // the files' counts
  const std::string flat = t.file("flat", idx({5, 4}));
  expect_error([&] { load_idx(flat, labels, "x"); }, Status::kIo, {flat, "3 dimensions"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cifar10)

BOOST_AUTO_TEST_CASE(reads_binary_batches_and_refuses_truncation) {
  TempDir t;
  constexpr size_t kRecord = 3073;
  auto batch = [&](int records, uint8_t first_label) {
    std::vector<uint8_t> b;
    for (int r = 0; r < records; ++r) {
      b.push_back(static_cast<uint8_t>((first_label + r) % 10));
      for (size_t i = 0; i < kRecord - 1; ++i) b.push_back(static_cast<uint8_t>(r + i));
    }
    return b;
  };
  for (int i = 1; i <= 5; ++i) t.file("data_batch_" + std::to_string(i) + ".bin", batch(3, static_cast<uint8_t>(i)));
  t.file("test_batch.bin", batch(2, 7));
  const Dataset train = load_cifar10(true, t.path.string());
  BOOST_TEST(train.size() == 15);
  BOOST_TEST(train.labels[3] == 2);  // first record of data_batch_2
  BOOST_TEST(train.sample(4)[1024] == static_cast<uint8_t>(1 + 1024));  // record 1 of batch 2, green plane start
  BOOST_TEST(train.pixels.capacity() == train.pixels.size());  // reserved from the files' sizes: held once
  const Dataset head = load_cifar10(true, t.path.string(), 4);  // the first 4 records, the rest read and checked
  BOOST_TEST(head.size() == 4);
  BOOST_TEST((head.pixels == train.head(4).pixels));
  BOOST_TEST(head.pixels.capacity() == head.pixels.size());
  const Dataset test = load_cifar10(false, t.path.string());
  BOOST_TEST(test.size() == 2);
  BOOST_TEST(test.labels[1] == 8);
  auto cut = batch(2, 0);
  cut.resize(kRecord + 100);
  const std::string bad = t.file("test_batch.bin", cut);
  expect_error([&] { load_cifar10(false, t.path.string()); }, Status::kIo, {bad, "truncated", "record 1"});
  expect_error([&] { load_cifar10(false, t.path.string(), 1); }, Status::kIo, {bad, "truncated", "record 1"});
  expect_error([&] { load_cifar10(true, "/nonexistent/cifar"); }, Status::kIo, {"data_batch_1.bin", "no such file"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(synthetic)

BOOST_AUTO_TEST_CASE(same_seed_same_data_any_shape) {
  const Dataset a = make_synthetic(3, 5, 7, 4, 50, 11), b = make_synthetic(3, 5, 7, 4, 50, 11);
  const Dataset c = make_synthetic(3, 5, 7, 4, 50, 12);
  BOOST_TEST(a.pixels.size() == 50u * 105);
  BOOST_TEST(a.pixels == b.pixels);
  BOOST_TEST(a.labels == b.labels);
  BOOST_TEST(a.pixels != c.pixels);
  a.validate();
  std::set<int32_t> classes(a.labels.begin(), a.labels.end());
  BOOST_TEST(classes.size() == 4u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(sampler)

BOOST_AUTO_TEST_CASE(ranks_partition_the_epoch) {
  const int world = 3;
  std::multiset<int64_t> seen;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(10, world, r, true, 5);
    BOOST_TEST(s.shard_size() == 4);  // ceil(10 / 3); two samples repeat to even out
    for (int64_t i : s.indices()) seen.insert(i);
  }
  BOOST_TEST(seen.size() == 12u);
  for (int64_t i = 0; i < 10; ++i) BOOST_TEST(seen.count(i) >= 1u);
  DistributedSampler d(10, world, 0, true, 5, true);
  BOOST_TEST(d.shard_size() == 3);
}

BOOST_AUTO_TEST_CASE(reshuffles_per_epoch_from_the_seed) {
  DistributedSampler a(1000, 2, 1, true, 42), b(1000, 2, 1, true, 42), c(1000, 2, 1, true, 43);
  BOOST_TEST(a.indices() == b.indices());
  BOOST_TEST(a.indices() != c.indices());
  const auto e0 = a.indices();
  a.next_epoch();
  BOOST_TEST(a.indices() != e0);
  DistributedSampler plain(6, 2, 1, false, 0);
  BOOST_TEST(plain.indices() == (std::vector<int64_t>{1, 3, 5}));
}

BOOST_AUTO_TEST_CASE(state_round_trip_resumes_mid_epoch) {
  DistributedSampler a(100, 1, 0, true, 9);
  a.set_epoch(3);
  a.take(37);
  const SamplerState st = a.state();
  const auto rest = a.take(100);
  BOOST_TEST(rest.size() == 63u);
  DistributedSampler b(100, 1, 0, true, 9);
  b.restore(st);
  BOOST_TEST(b.take(100) == rest);
  DistributedSampler other_seed(100, 1, 0, true, 10);
  expect_error([&] { other_seed.restore(st); }, Status::kInvalidArgument, {"seed 9"});
  expect_error([&] { b.restore({9, 0, 101}); }, Status::kInvalidArgument, {"position 101"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(augmentation)

BOOST_AUTO_TEST_CASE(normalises_per_channel) {
  Augment a;
  a.mean = {0.5f, 0.0f};
  a.std = {0.5f, 2.0f};
  SampleConverter conv(a, 2, 1, 2);
  const uint8_t src[4] = {0, 255, 51, 255};
  float dst[4];
  conv.convert(src, dst, nullptr);
  BOOST_TEST(dst[0] == -1.0f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(dst[1] == 1.0f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(dst[2] == 0.1f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(dst[3] == 0.5f, boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(crop_and_flip_move_pixels_and_pad_with_zero) {
  Augment a;
  a.crop_padding = 2;
  a.hflip = true;
  const int64_t h = 6, w = 6;
  std::vector<uint8_t> src(h * w);
  for (int64_t i = 0; i < h * w; ++i) src[i] = static_cast<uint8_t>(i + 1);  // unique, non-zero
  SampleConverter conv(a, 1, h, w);
  std::set<std::pair<int64_t, int64_t>> seen_shifts;
  int flips = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    tandem::Rng rng(seed);
    std::vector<float> dst(h * w);
    conv.convert(src.data(), dst.data(), &rng);
    // Find the shift and flip that explain the output: every output pixel is a moved source pixel or 0 (padding).
    bool explained = false;
    for (int flip = 0; flip < 2 && !explained; ++flip) {
      for (int64_t dy = -2; dy <= 2 && !explained; ++dy) {
        for (int64_t dx = -2; dx <= 2 && !explained; ++dx) {
          bool ok = true;
          for (int64_t y = 0; y < h && ok; ++y) {
            for (int64_t x = 0; x < w && ok; ++x) {
              const int64_t sy = y + dy, sx = (flip ? w - 1 - x : x) + dx;
              const float want = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? src[sy * w + sx] / 255.0f : 0.0f;
              ok = std::abs(dst[y * w + x] - want) < 1e-6f;
            }
          }
          if (ok) {
            explained = true;
            seen_shifts.insert({dy, dx});
            flips += flip;
          }
        }
      }
    }
    BOOST_TEST(explained, "seed " << seed);
  }
  BOOST_TEST(seen_shifts.size() == 25u);  // every offset in [-2, 2]^2 occurs
  BOOST_TEST(flips > 60);
  BOOST_TEST(flips < 140);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(loader)

BOOST_AUTO_TEST_CASE(batches_follow_the_sampler_in_order) {
  const Dataset d = make_synthetic(1, 4, 4, 3, 103, 1);
  DistributedSampler s(d.size(), 1, 0, true, 7);
  LoaderOptions o;
  o.batch_size = 10;
  Loader l(d, s, o);
  BOOST_TEST(l.batches_per_epoch() == 11);
  const std::vector<int64_t> order = s.indices();
  Batch b;
  int64_t seen = 0, batches = 0;
  while (l.next(b)) {
    ++batches;
    for (int64_t i = 0; i < b.size; ++i, ++seen) {
      BOOST_TEST(b.labels[i] == d.labels[static_cast<size_t>(order[seen])]);
      BOOST_TEST(b.images[i * 16 + 5] == d.sample(order[seen])[5] / 255.0f, boost::test_tools::tolerance(1e-6f));
    }
    BOOST_TEST(s.position() == seen);
  }
  BOOST_TEST(batches == 11);
  BOOST_TEST(seen == 103);
  BOOST_TEST(!l.next(b));  // stays exhausted until the sampler moves on
  s.next_epoch();
  BOOST_TEST(l.next(b));
  BOOST_TEST(b.size == 10);
}

BOOST_AUTO_TEST_CASE(prefetching_and_synchronous_give_identical_augmented_batches) {
  const Dataset d = make_synthetic(3, 8, 8, 5, 64, 2);
  auto collect = [&](int prefetch, int64_t skip_batches) {
    DistributedSampler s(d.size(), 2, 1, true, 3);
    LoaderOptions o;
    o.batch_size = 8;
    o.prefetch = prefetch;
    o.augment = cifar10_normalization();
    o.augment.crop_padding = 2;
    o.augment.hflip = true;
    o.seed = 99;
    o.drop_last = true;
    std::vector<float> all;
    Batch b;
    {
      Loader l(d, s, o);
      for (int64_t i = 0; i < skip_batches; ++i) l.next(b);
    }
    // A new loader continues where the sampler stands (as after a checkpoint restore).
    Loader l(d, s, o);
    while (l.next(b)) all.insert(all.end(), b.images.begin(), b.images.end());
    return all;
  };
  const auto a = collect(2, 0), b = collect(0, 0), c = collect(3, 2);
  BOOST_TEST(a.size() == 4u * 8 * 192);  // 32 samples per rank, 4 full batches
  BOOST_TEST(a == b);
  BOOST_TEST(c.size() == 2u * 8 * 192);
  BOOST_TEST(std::equal(c.begin(), c.end(), a.begin() + 2 * 8 * 192));
}

BOOST_AUTO_TEST_CASE(stops_cleanly_mid_epoch) {
  const Dataset d = make_synthetic(1, 2, 2, 2, 1000, 3);
  DistributedSampler s(d.size());
  LoaderOptions o;
  o.batch_size = 1;
  o.prefetch = 4;
  Batch b;
  for (int i = 0; i < 20; ++i) {
    Loader l(d, s, o);
    BOOST_TEST(l.next(b));
  }  // destroyed with the thread blocked on a full queue: must join, not hang
  BOOST_TEST(s.position() == 20);
}

BOOST_AUTO_TEST_SUITE_END()
