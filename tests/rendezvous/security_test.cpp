// Peers without the secret, fake servers and garbage on the port: refused, logged, harmless.
#include <random>
#include <thread>

#include <boost/test/unit_test.hpp>
#include <zmq.hpp>

#include "engine/comm/rendezvous_client.hpp"
#include "engine/comm/rendezvous_protocol.hpp"
#include "engine/comm/rendezvous_server.hpp"
#include "engine/core/error.hpp"
#include "test_util.hpp"

using namespace tandem;
using namespace tandem::engine::comm;
using namespace std::chrono_literals;
namespace rdv = tandem::engine::comm::rendezvous;

namespace {

constexpr const char* kSecret = "the-real-job-secret";

RendezvousClientOptions client_for(int port, const std::string& secret) {
  RendezvousClientOptions o;
  o.port = port;
  o.secret = secret;
  o.timeout = 3000ms;
  return o;
}

Status status_of_join(int port, const std::string& secret, std::string* msg = nullptr) {
  try {
    RendezvousClient c(client_for(port, secret));
  } catch (const Error& e) {
    if (msg != nullptr) *msg = e.what();
    return e.status();
  }
  return Status::kOk;
}

// Sends one request over a raw DEALER (no handshake) and returns the reply frames (header first).
std::vector<std::string> raw_request(zmq::socket_t& d, rdv::Op op, std::vector<std::string> args) {
  args.insert(args.begin(), rdv::encode_header({op, static_cast<rdv::Code>(rdv::kProtocolVersion), 42}));
  for (size_t i = 0; i < args.size(); ++i) {
    d.send(zmq::buffer(args[i]), i + 1 < args.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  std::vector<std::string> out;
  zmq::pollitem_t item{d.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, 2000ms) <= 0) return out;
  for (;;) {
    zmq::message_t m;
    if (!d.recv(m, zmq::recv_flags::none)) break;
    out.push_back(m.to_string());
    if (!m.more()) break;
  }
  return out;
}

// A ZMTP 3.0 greeting (NULL mechanism) followed by a READY command announcing a DEALER.
std::string zmtp_greeting_and_ready() {
  std::string g(64, '\0');
  g[0] = '\xff';
  g[9] = '\x7f';
  g[10] = 3;
  g[11] = 0;
  std::memcpy(&g[12], "NULL", 4);
  std::string body = "\x05READY";
  body += '\x0b';
  body += "Socket-Type";
  body += std::string("\0\0\0\x06", 4);
  body += "DEALER";
  std::string ready;
  ready += '\x04';  // short command
  ready += static_cast<char>(body.size());
  ready += body;
  return g + ready;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(rendezvous_security)

BOOST_AUTO_TEST_CASE(wrong_secret_is_refused_logged_and_the_job_goes_on) {
  rdv_test::LogCapture logs;
  RendezvousServerOptions so;
  so.secret = kSecret;
  RendezvousServer server(so);
  RendezvousClient good(client_for(server.port(), kSecret));
  good.set("job/addr", "10.0.0.1:1234");

  std::string msg;
  // The client notices first: the server cannot prove knowledge of *its* (wrong) secret.
  BOOST_TEST(static_cast<int>(status_of_join(server.port(), "not-the-secret", &msg)) ==
             static_cast<int>(Status::kAuth));
  BOOST_TEST(msg.find("could not prove") != std::string::npos, msg);
  BOOST_TEST(server.stats().refused == 1u);
  BOOST_TEST(logs.contains("refused peer 127.0.0.1"));

  BOOST_TEST(good.get("job/addr", 1000ms) == "10.0.0.1:1234");
  good.set("job/more", "x");
  RendezvousClient second_good(client_for(server.port(), kSecret));
  BOOST_TEST(second_good.get("job/more", 1000ms) == "x");
}

BOOST_AUTO_TEST_CASE(forged_answer_without_the_secret_is_refused_and_logged_with_its_address) {
  // An attacker skips the client's check of the server and answers the challenge with a guess.
  rdv_test::LogCapture logs;
  RendezvousServerOptions so;
  so.secret = kSecret;
  RendezvousServer server(so);
  zmq::context_t ctx;
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.connect("tcp://127.0.0.1:" + std::to_string(server.port()));
  const rdv::Nonce nonce = rdv::random_nonce();
  auto challenge = raw_request(d, rdv::Op::kHello,
                               {std::string(rdv::as_view(nonce)), rdv::encode_rank_size(1, 0), "intruder"});
  BOOST_REQUIRE(challenge.size() == 3u);
  rdv::Header h;
  BOOST_REQUIRE(rdv::decode_header(challenge[0], &h));
  BOOST_TEST(static_cast<int>(h.code) == static_cast<int>(rdv::Code::kChallenge));
  // Answer keyed by a wrong secret.
  rdv::Nonce server_nonce{};
  std::memcpy(server_nonce.data(), challenge[1].data(), server_nonce.size());
  const rdv::Proof forged = rdv::client_proof(rdv::derive_key("guess"), server_nonce, nonce,
                                              rdv::encode_rank_size(1, 0), "intruder");
  auto verdict = raw_request(d, rdv::Op::kAuth, {std::string(rdv::as_view(forged))});
  BOOST_REQUIRE(!verdict.empty());
  BOOST_REQUIRE(rdv::decode_header(verdict[0], &h));
  BOOST_TEST(static_cast<int>(h.code) == static_cast<int>(rdv::Code::kDenied));
  // Still unauthenticated: a SET is not applied, a GET returns no data.
  auto set_reply = raw_request(d, rdv::Op::kSet, {"stolen", "evil"});
  BOOST_REQUIRE(!set_reply.empty());
  BOOST_REQUIRE(rdv::decode_header(set_reply[0], &h));
  BOOST_TEST(static_cast<int>(h.code) == static_cast<int>(rdv::Code::kNoAuth));
  BOOST_TEST(server.stats().refused == 1u);
  BOOST_TEST(logs.contains("refused peer 127.0.0.1"));
  BOOST_TEST(logs.contains("wrong job secret"));
  RendezvousClient good(client_for(server.port(), kSecret));
  BOOST_TEST(static_cast<int>([&] {
               try {
                 good.get("stolen", 0ms);
               } catch (const Error& e) {
                 return e.status();
               }
               return Status::kOk;
             }()) == static_cast<int>(Status::kTimeout));
}

BOOST_AUTO_TEST_CASE(requests_without_a_handshake_get_no_data) {
  RendezvousServerOptions so;
  so.secret = kSecret;
  RendezvousServer server(so);
  RendezvousClient good(client_for(server.port(), kSecret));
  good.set("secret/value", "confidential");

  zmq::context_t ctx;
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.connect("tcp://127.0.0.1:" + std::to_string(server.port()));
  auto reply = raw_request(d, rdv::Op::kGet, {"secret/value", rdv::encode_u64(0)});
  BOOST_REQUIRE(reply.size() == 1u);  // a bare header: no value
  rdv::Header h;
  BOOST_REQUIRE(rdv::decode_header(reply[0], &h));
  BOOST_TEST(static_cast<int>(h.code) == static_cast<int>(rdv::Code::kNoAuth));
  raw_request(d, rdv::Op::kSet, {"secret/value", "overwritten"});
  raw_request(d, rdv::Op::kErase, {"secret/value"});
  BOOST_TEST(good.get("secret/value", 1000ms) == "confidential");
}

BOOST_AUTO_TEST_CASE(client_refuses_a_server_that_does_not_know_the_secret) {
  // A fake server answers HELLO with a random "proof"; the client must not answer the challenge.
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  const std::string ep = router.get(zmq::sockopt::last_endpoint);
  const int port = std::stoi(ep.substr(ep.rfind(':') + 1));
  std::atomic<int> auth_seen{0};
  std::atomic<bool> stop{false};
  std::thread fake([&] {
    while (!stop) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, 20ms) <= 0) continue;
      std::vector<zmq::message_t> frames;
      for (;;) {
        zmq::message_t m;
        (void)router.recv(m, zmq::recv_flags::none);
        const bool more = m.more();
        frames.push_back(std::move(m));
        if (!more) break;
      }
      rdv::Header h;
      if (frames.size() < 2 || !rdv::decode_header(frames[1].to_string_view(), &h)) continue;
      // The client may give up with an empty answer; it must never send a real proof.
      if (h.op == rdv::Op::kAuth && (frames.size() < 3 || frames[2].size() != 0)) ++auth_seen;
      if (h.op != rdv::Op::kHello) continue;
      const std::string hdr = rdv::encode_header({rdv::Op::kReply, rdv::Code::kChallenge, h.request_id});
      const std::string nonce(rdv::kNonceBytes, 'n'), proof(rdv::kProofBytes, 'p');
      router.send(frames[0], zmq::send_flags::sndmore);
      router.send(zmq::buffer(hdr), zmq::send_flags::sndmore);
      router.send(zmq::buffer(nonce), zmq::send_flags::sndmore);
      router.send(zmq::buffer(proof), zmq::send_flags::none);
    }
  });
  std::string msg;
  const Status st = status_of_join(port, kSecret, &msg);
  std::this_thread::sleep_for(50ms);
  stop = true;
  fake.join();
  BOOST_TEST(static_cast<int>(st) == static_cast<int>(Status::kAuth), msg);
  BOOST_TEST(auth_seen.load() == 0);
}

BOOST_AUTO_TEST_CASE(garbage_and_oversized_frames_do_not_disturb_the_server) {
  RendezvousServerOptions so;
  so.secret = kSecret;
  RendezvousServer server(so);
  RendezvousClient good(client_for(server.port(), kSecret));
  good.set("before", "1");

  // 1. Random bytes on a raw TCP connection.
  std::mt19937 rng(7);
  std::string junk(64 * 1024, '\0');
  for (auto& ch : junk) ch = static_cast<char>(rng());
  int fd_junk = rdv_test::tcp_connect(server.port());
  BOOST_REQUIRE(fd_junk >= 0);
  rdv_test::write_all(fd_junk, junk);

  // 2. A valid ZMTP handshake, then a frame announcing 2^63-1 bytes: dropped before allocation.
  int fd_huge = rdv_test::tcp_connect(server.port());
  BOOST_REQUIRE(fd_huge >= 0);
  std::string huge = zmtp_greeting_and_ready();
  huge += '\x02';  // long message frame
  huge += std::string("\x7f\xff\xff\xff\xff\xff\xff\xff", 8);
  huge += "some bytes";
  rdv_test::write_all(fd_huge, huge);

  // 3. A frame just over the limit, announced honestly (17 MiB of zeros follow).
  int fd_big = rdv_test::tcp_connect(server.port());
  BOOST_REQUIRE(fd_big >= 0);
  std::string big = zmtp_greeting_and_ready();
  const uint64_t n = rdv::kMaxFrameBytes + 1;
  big += '\x02';
  for (int i = 7; i >= 0; --i) big += static_cast<char>((n >> (8 * i)) & 0xff);
  rdv_test::write_all(fd_big, big);
  (void)rdv_test::write_all(fd_big, std::string(1 << 20, '\0'));  // the server may hang up meanwhile

  // 4. A connection that says nothing at all, held open through the rest of the test.
  int fd_silent = rdv_test::tcp_connect(server.port());
  BOOST_REQUIRE(fd_silent >= 0);

  // 5. A well-formed ZMQ peer sending too many frames and undersized headers.
  zmq::context_t ctx;
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.connect("tcp://127.0.0.1:" + std::to_string(server.port()));
  for (int i = 0; i < 10; ++i) d.send(zmq::buffer(std::string("x")), zmq::send_flags::sndmore);
  d.send(zmq::buffer(std::string("x")), zmq::send_flags::none);
  d.send(zmq::buffer(std::string("short")), zmq::send_flags::none);

  BOOST_TEST(rdv_test::wait_closed(fd_huge, 3000));  // the bound was enforced: connection dropped
  BOOST_TEST(rdv_test::wait_closed(fd_big, 3000));
  BOOST_TEST(rdv_test::wait_closed(fd_junk, 3000));

  // The store is intact and serves both old and new good peers promptly.
  const auto start = rdv_test::Clock::now();
  BOOST_TEST(good.get("before", 1000ms) == "1");
  RendezvousClient late(client_for(server.port(), kSecret));
  late.set("after", "2");
  BOOST_TEST(good.get("after", 1000ms) == "2");
  BOOST_TEST(rdv_test::ms_since(start) < 1500);
  BOOST_TEST(server.stats().malformed >= 2u);
  ::close(fd_junk);
  ::close(fd_huge);
  ::close(fd_big);
  ::close(fd_silent);
}

BOOST_AUTO_TEST_SUITE_END()
