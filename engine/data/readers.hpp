#pragma once
// Readers for real data sets: IDX (MNIST / Fashion-MNIST format, plain or gzip) and CIFAR-10 binary batches.
// Malformed files (missing, truncated, wrong magic, wrong dimensions) throw kIo naming the file and what is wrong.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/dataset.hpp"

namespace tandem::engine::data {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;  // unsigned-byte IDX only (type 0x08)
  int64_t file_records = 0;     // dims[0] as the file has it (dims[0] is what a limit kept)
};

// Reads an unsigned-byte IDX file; gzip-compressed files are recognised by content, not by name. `limit` > 0 keeps
// only the first limited_samples(dims[0], limit) records (dims[0] says how many); the rest is read and checked as
// the whole file is, never held. The values are held once: no reallocation while they grow (see the .cpp).
IdxArray read_idx(const std::string& path, int64_t limit = 0);
// Images [N, H, W] and labels [N] -> a 1-channel dataset; classes = 1 + the largest label of the whole file.
// `limit` as read_idx's.
Dataset load_idx(const std::string& images_path, const std::string& labels_path, const std::string& name,
                 int64_t limit = 0);

// The Fashion-MNIST directory: `dir` when given, else $TANDEM_DATA_DIR/fashion-mnist, else where Debian's
// dataset-fashion-mnist installs it (/usr/share/datasets/fashion-mnist). Throws kIo listing the places tried.
std::string find_fashion_mnist(const std::string& dir = "");
// train: 60,000 samples, else the 10,000 test samples. Files may be gzipped (*.gz) or plain.
Dataset load_fashion_mnist(bool train, const std::string& dir = "", int64_t limit = 0);

// CIFAR-10 binary version: data_batch_1..5.bin (train) or test_batch.bin in `dir` (or dir/cifar-10-batches-bin).
Dataset load_cifar10(bool train, const std::string& dir, int64_t limit = 0);

}  // namespace tandem::engine::data
