// The rendezvous client's reply parsing, against a server that answers with the fuzzer's bytes: a ROUTER socket on
// 127.0.0.1 (ephemeral port) served by a thread, and a real RendezvousClient that joins it and makes one request.
// The server either runs the handshake honestly (it knows the secret: a buggy or compromised rank 0) or answers the
// handshake with fuzzed replies too (another program on the port). A client call may return or throw tandem::Error;
// a crash, a sanitizer report, another exception type or a hang past the client's deadline is a bug in the client.
#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "engine/comm/rendezvous_client.hpp"
#include "engine/comm/rendezvous_protocol.hpp"
#include "engine/core/error.hpp"
#include "tests/fuzz/fuzz_target.hpp"

namespace {

namespace rdv = tandem::engine::comm::rendezvous;
constexpr const char* kSecret = "fuzz-secret";
constexpr std::string_view kReplySeparator("\xfb\xfa\xf9", 3);  // splits the input into replies
constexpr std::string_view kFrameSeparator("\xfe\xfd\xfc", 3);  // splits a reply into frames
constexpr auto kClientTimeout = std::chrono::milliseconds(250);

std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  for (size_t pos = 0;;) {
    const size_t at = s.find(sep, pos);
    out.push_back(s.substr(pos, at == std::string_view::npos ? std::string_view::npos : at - pos));
    if (at == std::string_view::npos) return out;
    pos = at + sep.size();
  }
}

// One scripted reply: [flags u8][frame][sep][frame]... flags bit 0: the first frame is replaced by a well-formed
// reply header carrying the request's id and the code in flags >> 1 (else the first frame goes out as it is).
struct Script {
  bool honest_handshake = false;
  std::vector<std::string_view> replies;
};

struct Server {
  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  int port = 0;

  Server() {
    router.set(zmq::sockopt::linger, 0);
    router.bind("tcp://127.0.0.1:0");
    const std::string ep = router.get(zmq::sockopt::last_endpoint);
    port = std::stoi(ep.substr(ep.rfind(':') + 1));
  }

  void reply(const std::string& identity, const std::vector<std::string>& frames) {
    router.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    for (size_t i = 0; i < frames.size(); ++i)
      router.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }

  // Serves one client until `stop`: requests from other connections (an earlier input's client saying goodbye)
  // are ignored; this input's client is the first that says HELLO.
  void serve(const Script& script, const std::atomic<bool>& stop) {
    const rdv::Key key = rdv::derive_key(kSecret);
    std::string client;
    size_t next_reply = 0;
    while (!stop.load()) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      rdv::poll_through_signals(&item, 1, std::chrono::milliseconds(10));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<std::string> frames;
      zmq::message_t m;
      while (router.recv(m, zmq::recv_flags::dontwait)) {
        frames.push_back(m.to_string());
        if (!m.more()) break;
      }
      rdv::Header h;
      if (frames.size() < 2 || !rdv::decode_header(frames[1], &h)) continue;
      if (client.empty() && h.op == rdv::Op::kHello) client = frames[0];
      if (frames[0] != client) continue;
      if (script.honest_handshake && h.op == rdv::Op::kHello && frames.size() >= 3 &&
          frames[2].size() == rdv::kNonceBytes) {
        rdv::Nonce client_nonce{}, server_nonce = rdv::random_nonce();
        std::copy(frames[2].begin(), frames[2].end(), client_nonce.begin());
        reply(client, {rdv::encode_header({rdv::Op::kReply, rdv::Code::kChallenge, h.request_id}),
                       std::string(rdv::as_view(server_nonce)),
                       std::string(rdv::as_view(rdv::server_proof(key, client_nonce, server_nonce)))});
        continue;
      }
      if (script.honest_handshake && h.op == rdv::Op::kAuth) {
        reply(client, {rdv::encode_header({rdv::Op::kReply, rdv::Code::kOk, h.request_id})});
        continue;
      }
      if (next_reply >= script.replies.size()) continue;  // out of script: the client's deadline ends it
      const std::string_view r = script.replies[next_reply++];
      if (r.empty()) continue;
      std::vector<std::string> out;
      for (std::string_view f : split(r.substr(1), kFrameSeparator)) out.emplace_back(f);
      const auto flags = static_cast<uint8_t>(r[0]);
      if (flags & 1)
        out[0] = rdv::encode_header({rdv::Op::kReply, static_cast<rdv::Code>(flags >> 1), h.request_id});
      reply(client, out);
    }
  }
};

}  // namespace

// [flags u8: bit 0 = honest handshake, bits 1-3 = the request][reply][rsep][reply]...
TANDEM_FUZZ_TARGET(rendezvous_client) {
  static Server server;
  if (size == 0) return;
  Script script;
  script.honest_handshake = data[0] & 1;
  const int request = (data[0] >> 1) & 7;
  script.replies = split(tandem::fuzz::as_text(data + 1, size - 1), kReplySeparator);

  std::atomic<bool> stop{false};
  std::thread serving([&] { server.serve(script, stop); });
  try {
    tandem::engine::comm::RendezvousClientOptions o;
    o.port = server.port;
    o.secret = kSecret;
    o.rank = 1;
    o.size = 4;
    o.timeout = kClientTimeout;
    tandem::engine::comm::RendezvousClient c(o);
    switch (request) {
      case 0: c.set("key", "value"); break;
      case 1: (void)c.get("key", kClientTimeout); break;
      case 2: (void)c.add("counter", 3); break;
      case 3: (void)c.erase("key"); break;
      default: c.barrier("b", 2, kClientTimeout); break;
    }
  } catch (const tandem::Error&) {
    // the expected outcome for a malformed reply: a clear error
  }
  stop.store(true);
  serving.join();
}
