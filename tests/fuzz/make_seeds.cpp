// make_fuzz_seeds CORPUS_DIR: writes valid inputs for every fuzz target into CORPUS_DIR/<target>/seed-*, each made
// by the project's own writers (model_to_json, profile_to_json, save_checkpoint, the wire structs, ...).
// Regenerate after a format change and commit the result; regression inputs (crash-*) are kept by hand.
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/comm/rendezvous_protocol.hpp"
#include "engine/comm/wire.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/train/checkpoint.hpp"
#include "simulator/compute/profile.hpp"
#include "tests/fuzz/checkpoint_identity.hpp"
#include "transports/tcp/wire.hpp"
#include "transports/zmq/wire.hpp"

namespace fs = std::filesystem;
namespace nn = tandem::engine::nn;
namespace rdv = tandem::engine::comm::rendezvous;

namespace {

fs::path root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / ("seed-" + name), std::ios::binary) << bytes;
}

template <typename T>
std::string bytes_of(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string gzip(const std::string& plain) {
  const std::string path = (fs::temp_directory_path() / "tandem-seed.gz").string();
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, plain.data(), static_cast<unsigned>(plain.size()));
  gzclose(f);
  std::ifstream in(path, std::ios::binary);
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(path);
  return out;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

void wire_seeds() {
  namespace tcp = tandem::transports::tcp;
  tcp::FrameHeader frame;
  frame.kind = static_cast<uint16_t>(tcp::Kind::kData);
  frame.src = 0;
  frame.tag = 7;
  frame.bytes = 4096;
  tcp::Hello hello;
  hello.rank = 1;
  hello.world = 2;
  hello.acceptor_nonce = 0x1234;
  const std::string prefix = std::string{0, 2} + bytes_of(uint32_t{1} << 20);
  put("tcp_wire", "data", prefix + bytes_of(frame) + bytes_of(hello) + bytes_of(uint64_t{0x1234}));
  frame.kind = static_cast<uint16_t>(tcp::Kind::kGoodbye);
  frame.bytes = 0;
  put("tcp_wire", "goodbye", prefix + bytes_of(frame) + bytes_of(hello) + bytes_of(uint64_t{0x1234}));

  namespace zw = tandem::transports::zmq;
  zw::WireHeader z;
  z.kind = static_cast<uint16_t>(zw::Kind::kData);
  z.src = 1;
  z.tag = 3;
  z.total = 1 << 20;
  z.offset = 1 << 19;
  z.seg_bytes = 1 << 19;
  put("zmq_wire", "data", std::string{4} + bytes_of(z));
  z.kind = static_cast<uint16_t>(zw::Kind::kHello);
  z.total = z.offset = z.seg_bytes = 0;
  put("zmq_wire", "hello", std::string{4} + bytes_of(z));

  namespace comm = tandem::engine::comm;
  comm::WireHeader a;
  a.comm_id = 1;
  a.seq = 5;
  a.count = 1024;
  a.chunk = 256;
  a.kind = static_cast<uint8_t>(comm::WireKind::kAllreduce);
  comm::WireHeader b = a;
  b.kind = static_cast<uint8_t>(comm::WireKind::kBroadcast);
  b.root = 2;
  const auto notice = comm::make_control(comm::ControlType::kTimeoutNotice, 1, 0, 5, "2,5");
  put("comm_wire", "allreduce-vs-broadcast", bytes_of(b) + bytes_of(a) + bytes_of(notice));
  const auto abort = comm::make_control(comm::ControlType::kAbort, 0, 7, 5, "rank 3 timed out");
  put("comm_wire", "same-abort", bytes_of(a) + bytes_of(a) + bytes_of(abort));
}

void rendezvous_seeds() {
  const std::string sep("\xfe\xfd\xfc", 3);
  auto hdr = [](rdv::Op op, uint64_t id) {
    return rdv::encode_header({op, static_cast<rdv::Code>(rdv::kProtocolVersion), id});
  };
  put("rendezvous", "set", "\x01" + hdr(rdv::Op::kSet, 1) + sep + "key" + sep + "value");
  put("rendezvous", "get", "\x01" + hdr(rdv::Op::kGet, 2) + sep + "key" + sep + rdv::encode_u64(10));
  put("rendezvous", "add", "\x01" + hdr(rdv::Op::kAdd, 3) + sep + "counter" + sep + rdv::encode_u64(5));
  put("rendezvous", "erase", "\x01" + hdr(rdv::Op::kErase, 4) + sep + "key");
  put("rendezvous", "hello", std::string(1, '\0') + hdr(rdv::Op::kHello, 5) + sep + std::string(32, 'n') + sep +
                                 rdv::encode_rank_size(2, 4, 0) + sep + "rank 2");
  put("rendezvous", "bye", "\x01" + hdr(rdv::Op::kBye, 6));
  put("rendezvous", "unauthenticated-set", std::string(1, '\0') + hdr(rdv::Op::kSet, 7) + sep + "k" + sep + "v");
}

// rendezvous_client inputs: [flags: bit 0 honest handshake, bits 1-3 the request][reply][rsep][reply]...; a reply is
// [flags: bit 0 = a well-formed header with code flags >> 1][frame][fsep][frame]...
void rendezvous_client_seeds() {
  const std::string rsep("\xfb\xfa\xf9", 3), fsep("\xfe\xfd\xfc", 3);
  auto ok = [&](const std::string& frames) { return std::string(1, '\x01') + frames; };
  const std::string set = "\x01", get = "\x03", add = "\x05", erase = "\x07", barrier = "\x09";
  put("rendezvous_client", "set-ok", set + ok(""));
  put("rendezvous_client", "get-value", get + ok(fsep + "value"));
  put("rendezvous_client", "add-counter", add + ok(fsep + rdv::encode_u64(3)));
  put("rendezvous_client", "erase-existed", erase + ok(fsep + rdv::encode_u64(1)));
  put("rendezvous_client", "barrier", barrier + ok(fsep + rdv::encode_u64(2)) + rsep + ok(fsep + "1"));
  const auto code = [](rdv::Code c) { return std::string(1, static_cast<char>(1 | (static_cast<int>(c) << 1))); };
  put("rendezvous_client", "set-bad-request", set + code(rdv::Code::kBadRequest) + fsep + "why");
  put("rendezvous_client", "get-timeout", get + code(rdv::Code::kTimeout));
  put("rendezvous_client", "challenge-wrong-proof",
      std::string(1, '\0') + code(rdv::Code::kChallenge) + fsep + std::string(32, 'n') + fsep + std::string(32, 'p'));
  put("rendezvous_client", "raw-header", std::string(1, '\0') + std::string(1, '\0') + std::string(10, '\x80'));
}

void json_seeds() {
  for (const char* m : {"mlp", "lenet5", "resnet18"})
    put("model_spec_json", m, nn::model_to_json(nn::zoo_model(m, nn::zoo_default_input(m), 10)).dump(1));
  put("cluster_json", "preset", "t2.micro:4");
  put("cluster_json", "mixed", "c5.large:2+t2.micro:2");
  put("cluster_json", "nodes",
      R"({"nodes": [{"preset": "t2.micro", "count": 4, "credit_mode": "standard", "initial_credits": 30}],)"
      R"( "topology": {"kind": "star"}, "sharing": "max-min"})");
  put("job_json", "hybrid",
      R"({"model": "mobilenetv2", "dataset": "cifar10", "samples": 50000, "input": [3, 32, 32], "classes": 10,)"
      R"( "batch": 256, "epochs": 10, "strategy": "hybrid", "dp": 2, "pp": 2, "micro_batches": 4,)"
      R"( "schedule": "1f1b", "algorithm": "ring", "bucket_mb": 25, "overlap": true, "optimizer": "momentum"})");
  put("job_json", "ddp", R"({"model": "lenet5", "batch": 64, "strategy": "ddp", "compression": "fp16"})");
  tandem::simulator::CalibrationProfile p;
  p.machine = "seed";
  p.backend = "cpu";
  p.model = "mlp";
  p.input = {1, 28, 28};
  p.batch = 64;
  const nn::ModelSpec mlp = nn::zoo_model("mlp", nn::zoo_default_input("mlp"), 10);
  for (const auto& l : mlp.layers) p.layers.push_back({l.name, 1e-4, 2e-4});
  p.optimizer_step_s = 3e-5;
  put("profile_json", "minimal", tandem::simulator::profile_to_json(p).dump(1));
  p.memory_bytes_per_s = 1.2e10;
  p.p2p_bytes_per_s = 1.1e9;
  p.p2p_latency_s = 4.2e-5;
  p.runtime_rss_bytes = 4.2e7;
  p.activation_peak_bytes = 6.1e7;
  p.activation_peak_curve = {{32, 3.2e7}, {64, 6.1e7}};
  p.fp16_convert_s = {1.7e-9, 2.3e-9};
  put("profile_json", "full", tandem::simulator::profile_to_json(p).dump(1));
}

void data_seeds() {
  std::string images = be32(0x00000803) + be32(3) + be32(4) + be32(4);
  for (int i = 0; i < 3 * 16; ++i) images += static_cast<char>(i * 5);
  put("idx", "images", images);
  put("idx", "images-gz", gzip(images));
  std::string labels = be32(0x00000801) + be32(3) + std::string{1, 0, 9};
  put("idx", "labels", labels);
  std::string cifar;
  for (int r = 0; r < 2; ++r) {
    cifar += static_cast<char>(r * 7);
    for (int i = 0; i < 3 * 32 * 32; ++i) cifar += static_cast<char>((i + r) & 0xff);
  }
  put("cifar", "two-records", cifar);
}

void checkpoint_seeds() {
  namespace train = tandem::engine::train;
  const tandem::fuzz::CheckpointIdentity id;
  const auto totals = id.spec.totals();
  train::TrainingProgress progress;
  progress.optimizer_steps = 12;
  progress.sampler = {42, 1, 16};
  progress.rng = {1, 2, 3, 4};
  const std::vector<float> params(static_cast<size_t>(totals.params), 0.5f);
  const std::string path = (fs::temp_directory_path() / "tandem-seed.ckpt").string();
  auto read_back = [&] {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  train::save_checkpoint(path, train::make_training_checkpoint(id.identity, progress, params, {}, {}));
  put("checkpoint", "trainer", read_back());
  train::save_checkpoint(path, train::make_training_checkpoint(id.identity, progress, params, {}, {params}));
  put("checkpoint", "trainer-momentum", read_back());
  train::Checkpoint plain;
  plain.meta = {{"note", "plain"}};
  plain.add("t", {1.0f, 2.0f});
  train::save_checkpoint(path, plain);
  put("checkpoint", "plain", read_back());
  fs::remove(path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds CORPUS_DIR\n");
    return 2;
  }
  root = argv[1];
  wire_seeds();
  rendezvous_seeds();
  rendezvous_client_seeds();
  json_seeds();
  data_seeds();
  checkpoint_seeds();
  return 0;
}
