#include "engine/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <zlib.h>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::train {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'C', 'K', 'P', 'T'};
enum RecordKind : uint8_t { kJson = 1, kF32 = 2 };

uint32_t crc(const void* data, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

template <typename T> void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);  // little-endian hosts only (checked at load by the magic)
  out.insert(out.end(), p, p + sizeof(T));
}

void put_record(std::vector<uint8_t>& out, const std::string& name, RecordKind kind, const void* data, size_t n) {
  put<uint32_t>(out, static_cast<uint32_t>(name.size()));
  out.insert(out.end(), name.begin(), name.end());
  put<uint8_t>(out, kind);
  put<uint64_t>(out, n);
  put<uint32_t>(out, crc(data, n));
  const auto* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + n);
}

class Cursor {
 public:
  Cursor(const std::string& path, const std::vector<uint8_t>& buf) : path_(path), buf_(buf) {}
  template <typename T> T get(const std::string& what) {
    T v;
    need(sizeof(T), what);
    std::memcpy(&v, buf_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  const uint8_t* take(size_t n, const std::string& what) {
    need(n, what);
    const uint8_t* p = buf_.data() + pos_;
    pos_ += n;
    return p;
  }
  bool done() const { return pos_ == buf_.size(); }
  size_t pos() const { return pos_; }

 private:
  void need(size_t n, const std::string& what) {
    TANDEM_CHECK(buf_.size() - pos_ >= n, Status::kIo,
                 "checkpoint '{}': truncated: {} needs {} bytes at offset {}, the file has {} left", path_, what, n,
                 pos_, buf_.size() - pos_);
  }
  const std::string& path_;
  const std::vector<uint8_t>& buf_;
  size_t pos_ = 0;
};

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    TANDEM_CHECK(w > 0, Status::kIo, "checkpoint '{}': write failed: {}", path, std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

bool Checkpoint::has(const std::string& name) const {
  for (const auto& [n, v] : tensors) {
    if (n == name) return true;
  }
  return false;
}

const std::vector<float>& Checkpoint::tensor(const std::string& name) const {
  for (const auto& [n, v] : tensors) {
    if (n == name) return v;
  }
  TANDEM_THROW(Status::kIo, "checkpoint has no tensor record '{}'", name);
}

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  TANDEM_REQUIRE(!path.empty(), "checkpoint: empty path");
  std::vector<uint8_t> out(kMagic, kMagic + 8);
  put<uint32_t>(out, kCheckpointVersion);
  put<uint32_t>(out, static_cast<uint32_t>(1 + ckpt.tensors.size()));
  const std::string meta = ckpt.meta.dump();
  put_record(out, "meta", kJson, meta.data(), meta.size());
  for (const auto& [name, values] : ckpt.tensors) put_record(out, name, kF32, values.data(), values.size() * 4);

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK(fd >= 0, Status::kIo, "checkpoint '{}': cannot create '{}': {}", path, tmp, std::strerror(errno));
  try {
    write_all(fd, out.data(), out.size(), path);
    TANDEM_CHECK(::fsync(fd) == 0, Status::kIo, "checkpoint '{}': fsync failed: {}", path, std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    TANDEM_THROW(Status::kIo, "checkpoint '{}': rename from '{}' failed: {}", path, tmp, std::strerror(e));
  }
  // Make the rename itself durable.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

Checkpoint load_checkpoint(const std::string& path) {
  // An ifstream opens a directory and then fails inside the read ("internal error: basic_filebuf::underflow").
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), Status::kIo,
               "checkpoint '{}': is a directory, not a checkpoint file", path);
  std::ifstream f(path, std::ios::binary);
  TANDEM_CHECK(f.good(), Status::kIo, "checkpoint '{}': cannot open", path);
  const std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  TANDEM_CHECK(!f.bad(), Status::kIo, "checkpoint '{}': read failed", path);
  Cursor c(path, buf);
  const uint8_t* magic = c.take(8, "the header");
  TANDEM_CHECK(std::memcmp(magic, kMagic, 8) == 0, Status::kIo, "checkpoint '{}': not a Tandem checkpoint (bad magic)",
               path);
  const auto version = c.get<uint32_t>("the version");
  TANDEM_CHECK(version == kCheckpointVersion, Status::kIo,
               "checkpoint '{}': format version {} is not supported (this build reads version {})", path, version,
               kCheckpointVersion);
  const auto records = c.get<uint32_t>("the record count");
  Checkpoint ck;
  bool have_meta = false;
  for (uint32_t r = 0; r < records; ++r) {
    const std::string rec = fmt::format("record {}", r);
    const auto name_len = c.get<uint32_t>(rec + " name length");
    TANDEM_CHECK(name_len <= 4096, Status::kIo, "checkpoint '{}': {} has a {}-byte name (corrupted)", path, rec,
                 name_len);
    const auto* np = c.take(name_len, rec + " name");
    const std::string name(reinterpret_cast<const char*>(np), name_len);
    const std::string what = fmt::format("record '{}'", name);
    const auto kind = c.get<uint8_t>(what + " kind");
    const auto n = c.get<uint64_t>(what + " length");
    const auto want_crc = c.get<uint32_t>(what + " CRC");
    TANDEM_CHECK(n <= buf.size(), Status::kIo, "checkpoint '{}': {} claims {} bytes (corrupted or truncated)", path,
                 what, n);
    const uint8_t* data = c.take(static_cast<size_t>(n), what + " data");
    TANDEM_CHECK(crc(data, static_cast<size_t>(n)) == want_crc, Status::kIo,
                 "checkpoint '{}': {} fails its CRC32 check (the file is corrupted)", path, what);
    if (kind == kJson) {
      try {
        ck.meta = nlohmann::json::parse(data, data + n);
      } catch (const std::exception& e) {
        TANDEM_THROW(Status::kIo, "checkpoint '{}': {} is not valid JSON: {}", path, what, e.what());
      }
      have_meta = true;
    } else if (kind == kF32) {
      TANDEM_CHECK(n % 4 == 0, Status::kIo, "checkpoint '{}': {} length {} is not a multiple of 4", path, what, n);
      std::vector<float> v(static_cast<size_t>(n / 4));
      if (n > 0) std::memcpy(v.data(), data, static_cast<size_t>(n));  // an empty record has no buffer to copy into
      ck.tensors.emplace_back(name, std::move(v));
    } else {
      TANDEM_THROW(Status::kIo, "checkpoint '{}': {} has unknown kind {}", path, what, kind);
    }
  }
  TANDEM_CHECK(c.done(), Status::kIo, "checkpoint '{}': {} unexpected bytes after the last record", path,
               buf.size() - c.pos());
  TANDEM_CHECK(have_meta, Status::kIo, "checkpoint '{}': no metadata record", path);
  return ck;
}

// ------------------------------------------------------------------------------ trainer checkpoints

namespace {
constexpr const char* kTrainingFormat = "tandem-checkpoint";
std::string state_record(size_t k) { return fmt::format("optimizer.state.{}", k); }
}  // namespace

Checkpoint make_training_checkpoint(const TrainingIdentity& id, const TrainingProgress& p, std::vector<float> params,
                                    std::vector<float> buffers, std::vector<std::vector<float>> optimizer_state) {
  TANDEM_CHECK(id.spec != nullptr, Status::kInternal, "checkpoint: no model spec");
  const optim::OptimizerConfig& oc = id.optimizer;
  Checkpoint ck;
  ck.meta = {
      {"format", kTrainingFormat},
      {"model", nn::model_to_json(*id.spec)},
      {"params", static_cast<int64_t>(params.size())},
      {"optimizer",
       {{"kind", std::string(optim::optimizer_name(oc.kind))}, {"lr", oc.lr}, {"momentum", oc.momentum},
        {"dampening", oc.dampening}, {"nesterov", oc.nesterov}, {"weight_decay", oc.weight_decay},
        {"beta1", oc.beta1}, {"beta2", oc.beta2}, {"eps", oc.eps}, {"steps", p.optimizer_steps}}},
      {"schedule", id.schedule},
      {"completed_epochs", p.completed_epochs},
      {"sampler", {{"seed", p.sampler.seed}, {"epoch", p.sampler.epoch}, {"position", p.sampler.position},
                   {"world", p.sampler_world}, {"rank", p.sampler_rank}}},
      {"rng", {p.rng[0], p.rng[1], p.rng[2], p.rng[3]}},
      {"batch_size", id.batch_size},
  };
  ck.add("model.params", std::move(params));
  ck.add("model.buffers", std::move(buffers));
  for (size_t k = 0; k < optimizer_state.size(); ++k) ck.add(state_record(k), std::move(optimizer_state[k]));
  return ck;
}

TrainingCheckpoint load_training_checkpoint(const std::string& path, const TrainingIdentity& id, int sampler_world,
                                            int sampler_rank) {
  TANDEM_CHECK(id.spec != nullptr, Status::kInternal, "checkpoint: no model spec");
  TrainingCheckpoint out;  // its pointers address out.file's records, which moving `out` keeps in place
  out.file = load_checkpoint(path);
  in_checkpoint(path, [&] {
    const auto& m = out.file.meta;
    const nn::ModelTotals totals = id.spec->totals(0, id.spec->layers.size());
    TANDEM_CHECK(m.value("format", "") == kTrainingFormat, Status::kIo, "metadata is not a trainer checkpoint's");
    TANDEM_REQUIRE(m.at("model") == nn::model_to_json(*id.spec),
                   "it was written for model '{}' ({} parameters), this run trains '{}' ({})",
                   m.at("model").value("name", "?"), m.at("params").get<int64_t>(), id.spec->name, totals.params);
    const auto& o = m.at("optimizer");
    const std::string kind = o.at("kind").get<std::string>();
    TANDEM_REQUIRE(kind == optim::optimizer_name(id.optimizer.kind), "it holds {} optimizer state, this run uses {}",
                   kind, optim::optimizer_name(id.optimizer.kind));
    const auto& s = m.at("sampler");
    const int world = s.at("world").get<int>(), rank = s.at("rank").get<int>();
    TANDEM_REQUIRE(world >= 1 && rank >= 0 && rank < world, "its sampler is rank {} of {}", rank, world);
    if (sampler_rank >= 0) {
      TANDEM_REQUIRE(world == sampler_world && rank == sampler_rank,
                     "it was written by rank {} of {}, this is rank {} of {}", rank, world, sampler_rank,
                     sampler_world);
    }
    out.params = &out.file.tensor("model.params");
    out.buffers = &out.file.tensor("model.buffers");
    const int64_t buffers = totals.buffers;
    TANDEM_REQUIRE(static_cast<int64_t>(out.params->size()) == totals.params &&
                       static_cast<int64_t>(out.buffers->size()) == buffers,
                   "its tensors have {} parameters and {} buffers, the model {} and {}", out.params->size(),
                   out.buffers->size(), totals.params, buffers);
    for (size_t k = 0; out.file.has(state_record(k)); ++k) {
      const auto& v = out.file.tensor(state_record(k));
      TANDEM_REQUIRE(static_cast<int64_t>(v.size()) == totals.params,
                     "{} has {} values, the model {} parameters", state_record(k), v.size(), totals.params);
      out.optimizer_state.push_back(&v);
    }
    TrainingProgress& p = out.progress;
    p.optimizer_steps = o.at("steps").get<int64_t>();
    p.completed_epochs = m.at("completed_epochs").get<int64_t>();
    p.sampler = {s.at("seed").get<uint64_t>(), s.at("epoch").get<int64_t>(), s.at("position").get<int64_t>()};
    p.sampler_world = world;
    p.sampler_rank = rank;
    const auto& r = m.at("rng");
    p.rng = {r.at(0).get<uint64_t>(), r.at(1).get<uint64_t>(), r.at(2).get<uint64_t>(), r.at(3).get<uint64_t>()};
  });
  return out;
}

data::SamplerState reshard_sampler(const TrainingProgress& p, int64_t dataset_size, int world) {
  const int from = p.sampler_world;
  data::SamplerState s = p.sampler;
  if (from == world) return s;
  const data::DistributedSampler before(dataset_size, from, 0, false, 0), after(dataset_size, world, 0, false, 0);
  TANDEM_REQUIRE(s.position >= 0 && s.position <= before.shard_size(),
                 "its sampler position {} does not fit a shard of {} samples ({} samples over {} replicas)", s.position,
                 before.shard_size(), dataset_size, from);
  if (s.position == before.shard_size()) {  // the epoch is over at either width
    s.position = after.shard_size();
    return s;
  }
  const int64_t global = s.position * from;
  const int64_t resumed = global / world;  // whole entries per new shard; the rest (< world) is seen again
  TANDEM_REQUIRE(resumed <= after.shard_size(),
                 "it stopped {} samples into epoch {} ({} per replica x {} replicas), past the {} samples per replica "
                 "that {} data-parallel replicas take of {}",
                 global, s.epoch, s.position, from, after.shard_size(), world, dataset_size);
  if (resumed * world != global)
    log::warn("resuming {} samples into epoch {} ({} per replica x {} replicas) on {} data-parallel replicas, which "
              "cannot split it evenly: each starts at {}, so the epoch's samples {}..{} of its order are trained a "
              "second time (resume with a dp that divides {}, or from a checkpoint at an epoch boundary, to see "
              "each once)",
              global, s.epoch, s.position, from, world, resumed, resumed * world, global - 1, global);
  s.position = resumed;
  return s;
}

}  // namespace tandem::engine::train
