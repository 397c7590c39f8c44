// The rendezvous server's message parsing, through its real socket: a server on 127.0.0.1 (ephemeral port) and
// one DEALER connection that sends each input as a multipart message, optionally after a valid handshake, then a
// well-formed ERASE whose reply proves that the server survived the input and still answers.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "engine/comm/rendezvous_protocol.hpp"
#include "engine/comm/rendezvous_server.hpp"
#include "tests/fuzz/fuzz_target.hpp"

namespace {

namespace rdv = tandem::engine::comm::rendezvous;
constexpr const char* kSecret = "fuzz-secret";
constexpr std::string_view kFrameSeparator("\xfe\xfd\xfc", 3);  // splits an input into frames
constexpr auto kReplyTimeout = std::chrono::seconds(5);

struct Harness {
  std::unique_ptr<tandem::engine::comm::RendezvousServer> server;
  zmq::context_t ctx{1};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
  uint64_t next_id = uint64_t{1} << 62;  // sentinel and handshake ids: the fuzzed ones rarely collide

  Harness() {
    tandem::engine::comm::RendezvousServerOptions o;
    o.secret = kSecret;
    o.world_size = 4;
    o.shutdown_grace = std::chrono::milliseconds(100);
    server = std::make_unique<tandem::engine::comm::RendezvousServer>(o);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect("tcp://127.0.0.1:" + std::to_string(server->port()));
  }

  void send(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      dealer.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }

  // The frames of the reply to request `id`; other replies (to fuzzed requests) are skipped. A server that does
  // not answer within kReplyTimeout has hung or died: that is the bug this target looks for.
  std::vector<std::string> await(uint64_t id) {
    const auto deadline = std::chrono::steady_clock::now() + kReplyTimeout;
    for (;;) {
      zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
      rdv::poll_through_signals(&item, 1, std::chrono::milliseconds(100));
      std::vector<std::string> frames;
      zmq::message_t m;
      while (item.revents & ZMQ_POLLIN && dealer.recv(m, zmq::recv_flags::dontwait)) {
        frames.push_back(m.to_string());
        if (!m.more()) break;
      }
      rdv::Header h;
      if (!frames.empty() && rdv::decode_header(frames[0], &h) && h.request_id == id) return frames;
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "rendezvous fuzz: the server did not answer request %llu within 5 s\n",
                     static_cast<unsigned long long>(id));
        __builtin_trap();
      }
    }
  }

  std::string header(rdv::Op op, uint64_t id) {
    return rdv::encode_header({op, static_cast<rdv::Code>(rdv::kProtocolVersion), id});
  }

  void handshake() {
    const rdv::Key k = rdv::derive_key(kSecret);
    const rdv::Nonce client_nonce = rdv::random_nonce();
    const std::string rank_size = rdv::encode_rank_size(1, 4, 0);
    const std::string name = "fuzz";
    const uint64_t hello_id = next_id++;
    send({header(rdv::Op::kHello, hello_id), std::string(rdv::as_view(client_nonce)), rank_size, name});
    const auto challenge = await(hello_id);
    if (challenge.size() != 3) __builtin_trap();
    rdv::Nonce server_nonce{};
    std::memcpy(server_nonce.data(), challenge[1].data(), std::min(challenge[1].size(), server_nonce.size()));
    const uint64_t auth_id = next_id++;
    send({header(rdv::Op::kAuth, auth_id),
          std::string(rdv::as_view(rdv::client_proof(k, server_nonce, client_nonce, rank_size, name)))});
    const auto ok = await(auth_id);
    rdv::Header h;
    if (!rdv::decode_header(ok[0], &h) || h.code != rdv::Code::kOk) __builtin_trap();
  }
};

}  // namespace

// [flags u8: bit 0 = handshake first][frame][sep][frame]...: frames separated by kFrameSeparator.
TANDEM_FUZZ_TARGET(rendezvous) {
  static Harness harness;
  if (size == 0) return;
  if (data[0] & 1) harness.handshake();
  const std::string_view rest = tandem::fuzz::as_text(data + 1, size - 1);
  std::vector<std::string> frames;
  for (size_t pos = 0;;) {
    const size_t sep = rest.find(kFrameSeparator, pos);
    frames.emplace_back(rest.substr(pos, sep == std::string_view::npos ? std::string_view::npos : sep - pos));
    if (sep == std::string_view::npos) break;
    pos = sep + kFrameSeparator.size();
  }
  harness.send(frames);
  const uint64_t id = harness.next_id++;
  harness.send({harness.header(rdv::Op::kErase, id), "sentinel"});
  (void)harness.await(id);
}
