#include "engine/comm/rendezvous_client.hpp"

#include <algorithm>
#include <thread>

#include <zmq.hpp>

#include "engine/comm/rendezvous_protocol.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

namespace rdv = rendezvous;
using Clock = std::chrono::steady_clock;

namespace {

// How long the thread driving the socket polls before letting queued requests of other threads go
// out. Replies are handed over as soon as they arrive; this only bounds a second sender's delay.
constexpr auto kDriveSlice = std::chrono::milliseconds(5);
// Extra time a GET waits for the server's own TIMEOUT answer before concluding the server is gone.
constexpr auto kGetGrace = std::chrono::milliseconds(250);
// A HELLO unanswered this long is sent again; a server that does not serve our generation is asked
// again after kRetryPause.
constexpr auto kHelloRetry = std::chrono::milliseconds(1000);
constexpr auto kRetryPause = std::chrono::milliseconds(20);

std::string client_endpoint(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

struct RendezvousClient::Socket {
  zmq::context_t ctx{1};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
};

RendezvousClient::RendezvousClient(const RendezvousClientOptions& options) : options_(options) {
  TANDEM_REQUIRE(!options.secret.empty(), "rendezvous client: the job secret is empty (set TANDEM_SECRET)");
  TANDEM_REQUIRE(options.port > 0 && options.port <= 65535, "rendezvous client: port {} is out of range 1..65535",
                 options.port);
  TANDEM_REQUIRE(!options.host.empty(), "rendezvous client: the server address is empty");
  TANDEM_REQUIRE(options.timeout.count() > 0, "rendezvous client: timeout must be positive, got {} ms",
                 options.timeout.count());
  TANDEM_CHECK(rdv::ensure_sodium(), Status::kInternal, "rendezvous client: libsodium failed to initialise");
  if (options_.name.empty()) options_.name = fmt::format("rank {}", options.rank);
  if (options_.name.size() > rdv::kMaxNameBytes) options_.name.resize(rdv::kMaxNameBytes);
  const rdv::Key k = rdv::derive_key(options.secret);
  secret_key_.assign(reinterpret_cast<const char*>(k.data()), k.size());
  options_.secret.clear();  // keep only the derived key
  endpoint_ = client_endpoint(options.host, options.port);
  socket_ = std::make_unique<Socket>();
  auto& d = socket_->dealer;
  d.set(zmq::sockopt::linger, 0);
  d.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(rdv::kMaxFrameBytes));
  d.set(zmq::sockopt::ipv6, 1);
  d.set(zmq::sockopt::reconnect_ivl, 50);
  d.set(zmq::sockopt::reconnect_ivl_max, 500);
  d.set(zmq::sockopt::sndhwm, 100000);
  try {
    d.connect(endpoint_);
  } catch (const zmq::error_t& e) {
    TANDEM_THROW(Status::kInvalidArgument, "rendezvous client: cannot connect to {}: {}", endpoint_, e.what());
  }
  const auto deadline = Clock::now() + options_.timeout;
  while (!handshake(deadline)) {
    // The server of an earlier communicator of this job (going away) or of another one still alive:
    // rank 0's server for this generation takes the port once the earlier one has closed.
    TANDEM_CHECK(Clock::now() + kRetryPause < deadline, Status::kTimeout,
                 "rank {}: the rendezvous at {} did not serve this communicator (generation {}) within {} ms: {} "
                 "(has rank 0 created it? Every rank must create and destroy the job's communicators in the same "
                 "order)",
                 options_.rank, endpoint_, options_.generation, options_.timeout.count(), not_served_);
    std::this_thread::sleep_for(kRetryPause);
  }
}

std::string RendezvousClient::scoped(const std::string& key) const {
  return options_.generation == 0 ? key : fmt::format("g{}/{}", options_.generation, key);
}

RendezvousClient::~RendezvousClient() {
  // Say goodbye so a stopping server need not wait for us; best effort, bounded by the linger.
  try {
    auto& d = socket_->dealer;
    d.set(zmq::sockopt::linger, 200);
    const std::string hdr = rdv::encode_header({rdv::Op::kBye, static_cast<rdv::Code>(rdv::kProtocolVersion), 0});
    (void)rdv::send_through_signals(d, zmq::buffer(hdr), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  }
}

bool RendezvousClient::handshake(Clock::time_point deadline) {
  rdv::Key k{};
  std::memcpy(k.data(), secret_key_.data(), k.size());
  const rdv::Nonce client_nonce = rdv::random_nonce();
  const std::string rank_size = rdv::encode_rank_size(options_.rank, options_.size, options_.generation);
  // A HELLO queued on a connection that then closes (an earlier server going away) is lost: ask again
  // every kHelloRetry rather than wait for the whole deadline.
  std::optional<Reply> hello;
  while (!hello && Clock::now() < deadline)
    hello = roundtrip(static_cast<uint8_t>(rdv::Op::kHello),
                      {std::string(rdv::as_view(client_nonce)), rank_size, options_.name},
                      std::min(deadline, Clock::now() + kHelloRetry));
  TANDEM_CHECK(hello.has_value(), Status::kTimeout,
               "rank {}: could not reach the rendezvous server at {} within {} ms (is rank 0 running, and are "
               "TANDEM_MASTER_ADDR/TANDEM_MASTER_PORT right?)",
               options_.rank, endpoint_, options_.timeout.count());
  TANDEM_CHECK(hello->code == static_cast<uint8_t>(rdv::Code::kChallenge) && hello->frames.size() == 2 &&
                   hello->frames[0].size() == rdv::kNonceBytes,
               Status::kAuth, "rank {}: the rendezvous server at {} answered the handshake with code {} ({} frames)",
               options_.rank, endpoint_, hello->code, hello->frames.size());
  rdv::Nonce server_nonce{};
  std::memcpy(server_nonce.data(), hello->frames[0].data(), server_nonce.size());
  if (!rdv::proof_equals(rdv::server_proof(k, client_nonce, server_nonce), hello->frames[1])) {
    // Give up with an empty answer (it reveals nothing), so a real server logs the refusal now
    // rather than when the half-done handshake expires.
    (void)roundtrip(static_cast<uint8_t>(rdv::Op::kAuth), {std::string()},
                    std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
    TANDEM_THROW(Status::kAuth,
                 "rank {}: the rendezvous server at {} could not prove it knows the job secret (TANDEM_SECRET "
                 "differs from rank 0's, or another program listens on that port)",
                 options_.rank, endpoint_);
  }
  const rdv::Proof proof = rdv::client_proof(k, server_nonce, client_nonce, rank_size, options_.name);
  auto done = roundtrip(static_cast<uint8_t>(rdv::Op::kAuth), {std::string(rdv::as_view(proof))},
                        std::min(deadline, Clock::now() + kHelloRetry));
  if (!done && Clock::now() < deadline) {  // the server went away mid-handshake (an earlier one closing): again
    not_served_ = "the handshake was not answered";
    return false;
  }
  TANDEM_CHECK(done.has_value(), Status::kTimeout, "rank {}: the rendezvous server at {} did not finish the handshake",
               options_.rank, endpoint_);
  if (done->code == static_cast<uint8_t>(rdv::Code::kNotServed)) {
    not_served_ = done->frames.empty() ? std::string("not served") : done->frames[0].substr(0, 512);
    return false;
  }
  if (done->code != static_cast<uint8_t>(rdv::Code::kOk)) throw_reply_error(*done, "joining the job");
  log::debug("rank {}: joined the rendezvous at {} (generation {})", options_.rank, endpoint_, options_.generation);
  return true;
}

std::optional<RendezvousClient::Reply> RendezvousClient::roundtrip(uint8_t op, std::vector<std::string> args,
                                                                   Clock::time_point deadline) {
  std::unique_lock lk(mu_);
  const uint64_t id = next_id_++;
  args.insert(args.begin(),
              rdv::encode_header({static_cast<rdv::Op>(op), static_cast<rdv::Code>(rdv::kProtocolVersion), id}));
  outbox_.emplace_back(id, std::move(args));
  pending_[id] = std::nullopt;
  for (;;) {
    auto it = pending_.find(id);
    if (it->second.has_value()) {
      Reply r = std::move(*it->second);
      pending_.erase(it);
      return r;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      pending_.erase(it);
      std::erase_if(outbox_, [id](const auto& m) { return m.first == id; });
      return std::nullopt;
    }
    if (driving_) {
      cv_.wait_until(lk, std::min(deadline, now + std::chrono::milliseconds(50)));
      continue;
    }
    // Drive the socket: send what is queued, wait a slice for replies, hand them to their owners.
    driving_ = true;
    auto out = std::move(outbox_);
    outbox_.clear();
    lk.unlock();
    std::vector<std::pair<uint64_t, Reply>> got;
    std::deque<std::pair<uint64_t, std::vector<std::string>>> unsent;
    std::string failure;
    try {
      auto& d = socket_->dealer;
      for (auto& m : out) {
        bool ok = true;
        for (size_t i = 0; i < m.second.size() && ok; ++i) {
          const auto flags = i + 1 < m.second.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                                     : zmq::send_flags::dontwait;
          ok = rdv::send_through_signals(d, zmq::buffer(m.second[i]), flags).has_value();
          // A part already accepted means the message is committed: libzmq accepts the rest.
          if (!ok && i > 0) ok = true;
        }
        if (!ok) unsent.push_back(std::move(m));
      }
      const auto wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                                   std::chrono::milliseconds(0), std::chrono::milliseconds(kDriveSlice));
      zmq::pollitem_t item{d.handle(), 0, ZMQ_POLLIN, 0};
      rdv::poll_through_signals(&item, 1, wait);
      for (;;) {
        zmq::message_t first;
        if (!rdv::recv_through_signals(d, first, zmq::recv_flags::dontwait)) break;
        std::vector<zmq::message_t> frames;
        bool more = first.more();
        frames.push_back(std::move(first));
        bool truncated = false;
        while (more) {
          zmq::message_t part;
          if (!rdv::recv_through_signals(d, part, zmq::recv_flags::none)) break;
          more = part.more();
          if (frames.size() < rdv::kMaxFrames) {
            frames.push_back(std::move(part));
          } else {
            truncated = true;
          }
        }
        rdv::Header h;
        if (truncated || !rdv::decode_header(frames[0].to_string_view(), &h) || h.op != rdv::Op::kReply) {
          log::debug("rank {}: dropped a malformed message from the rendezvous server", options_.rank);
          continue;
        }
        Reply r;
        r.code = static_cast<uint8_t>(h.code);
        for (size_t i = 1; i < frames.size(); ++i) r.frames.push_back(frames[i].to_string());
        got.emplace_back(h.request_id, std::move(r));
      }
    } catch (const zmq::error_t& e) {
      failure = e.what();
    }
    lk.lock();
    driving_ = false;
    for (auto& [rid, r] : got) {
      auto p = pending_.find(rid);
      if (p != pending_.end()) p->second = std::move(r);  // else: a late answer to a request that gave up
    }
    for (auto rit = unsent.rbegin(); rit != unsent.rend(); ++rit) outbox_.push_front(std::move(*rit));
    cv_.notify_all();
    if (!failure.empty()) {
      pending_.erase(id);
      TANDEM_THROW(Status::kTransport, "rank {}: rendezvous socket to {} failed: {}", options_.rank, endpoint_,
                   failure);
    }
  }
}

RendezvousClient::Reply RendezvousClient::request(uint8_t op, std::vector<std::string> args,
                                                  std::chrono::milliseconds timeout, const std::string& what,
                                                  bool hard) {
  const auto deadline = Clock::now() + timeout;
  for (int attempt = 0;; ++attempt) {
    auto r = roundtrip(op, args, deadline);
    TANDEM_CHECK(r.has_value(), Status::kTimeout,
                 "rank {}: {}: no answer from the rendezvous server at {} within {} ms (has rank 0 exited?)",
                 options_.rank, what, endpoint_, timeout.count());
    if (r->code == static_cast<uint8_t>(rdv::Code::kNoAuth) && attempt == 0) {
      // The server no longer knows this connection (libzmq reconnected under us): join again once.
      log::info("rank {}: rendezvous connection was reset; authenticating again", options_.rank);
      if (!handshake(hard ? deadline : Clock::now() + options_.timeout))
        TANDEM_THROW(Status::kPeerFailure, "rank {}: {}: the rendezvous at {} no longer serves this communicator: {}",
                     options_.rank, what, endpoint_, not_served_);
      continue;
    }
    return std::move(*r);
  }
}

void RendezvousClient::throw_reply_error(const Reply& r, const std::string& what) const {
  const std::string detail = r.frames.empty() ? std::string() : ": " + r.frames[0].substr(0, 512);
  switch (static_cast<rdv::Code>(r.code)) {
    case rdv::Code::kDenied:
      TANDEM_THROW(Status::kAuth, "rank {}: {}: the rendezvous server at {} refused this rank's secret{}",
                   options_.rank, what, endpoint_, detail);
    case rdv::Code::kNoAuth:
      TANDEM_THROW(Status::kAuth, "rank {}: {}: the rendezvous server at {} does not know this connection",
                   options_.rank, what, endpoint_);
    case rdv::Code::kMismatch:
      TANDEM_THROW(Status::kMismatch, "rank {}: {}: refused by the rendezvous server at {}{}", options_.rank, what,
                   endpoint_, detail);
    case rdv::Code::kBadRequest:
      TANDEM_THROW(Status::kInvalidArgument, "rank {}: {}: rejected by the rendezvous server{}", options_.rank, what,
                   detail);
    case rdv::Code::kShutdown:
      TANDEM_THROW(Status::kPeerFailure, "rank {}: {}: the rendezvous server at {} is shutting down (rank 0 exited)",
                   options_.rank, what, endpoint_);
    default:
      TANDEM_THROW(Status::kTransport, "rank {}: {}: unexpected answer code {} from the rendezvous server at {}",
                   options_.rank, what, r.code, endpoint_);
  }
}

void RendezvousClient::set(const std::string& key, const std::string& value) {
  set_within(key, value, options_.timeout);
}

void RendezvousClient::set_within(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) {
  TANDEM_REQUIRE(key.size() <= rdv::kMaxKeyBytes, "rendezvous set: key of {} bytes exceeds {}", key.size(),
                 rdv::kMaxKeyBytes);
  TANDEM_REQUIRE(value.size() <= rdv::kMaxValueBytes, "rendezvous set '{}': value of {} bytes exceeds {}", key,
                 value.size(), rdv::kMaxValueBytes);
  const std::string what = fmt::format("set '{}'", key);
  Reply r = request(static_cast<uint8_t>(rdv::Op::kSet), {scoped(key), value}, timeout, what,
                    timeout < options_.timeout);
  if (r.code != static_cast<uint8_t>(rdv::Code::kOk)) throw_reply_error(r, what);
}

std::string RendezvousClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  TANDEM_REQUIRE(key.size() <= rdv::kMaxKeyBytes, "rendezvous get: key of {} bytes exceeds {}", key.size(),
                 rdv::kMaxKeyBytes);
  if (timeout.count() < 0) timeout = std::chrono::milliseconds(0);
  const std::string what = fmt::format("get '{}'", key);
  Reply r = request(static_cast<uint8_t>(rdv::Op::kGet), {scoped(key), rdv::encode_u64(static_cast<uint64_t>(timeout.count()))},
                    timeout + kGetGrace, what);
  if (r.code == static_cast<uint8_t>(rdv::Code::kTimeout)) {
    TANDEM_THROW(Status::kTimeout, "rank {}: key '{}' did not appear in the rendezvous store within {} ms",
                 options_.rank, key, timeout.count());
  }
  if (r.code != static_cast<uint8_t>(rdv::Code::kOk) || r.frames.size() != 1) throw_reply_error(r, what);
  return std::move(r.frames[0]);
}

int64_t RendezvousClient::add(const std::string& key, int64_t delta) {
  TANDEM_REQUIRE(key.size() <= rdv::kMaxKeyBytes, "rendezvous add: key of {} bytes exceeds {}", key.size(),
                 rdv::kMaxKeyBytes);
  const std::string what = fmt::format("add '{}'", key);
  Reply r = request(static_cast<uint8_t>(rdv::Op::kAdd), {scoped(key), rdv::encode_u64(static_cast<uint64_t>(delta))},
                    options_.timeout, what);
  uint64_t v = 0;
  if (r.code != static_cast<uint8_t>(rdv::Code::kOk) || r.frames.size() != 1 || !rdv::decode_u64(r.frames[0], &v)) {
    throw_reply_error(r, what);
  }
  return static_cast<int64_t>(v);
}

bool RendezvousClient::erase(const std::string& key) {
  TANDEM_REQUIRE(key.size() <= rdv::kMaxKeyBytes, "rendezvous erase: key of {} bytes exceeds {}", key.size(),
                 rdv::kMaxKeyBytes);
  const std::string what = fmt::format("erase '{}'", key);
  Reply r = request(static_cast<uint8_t>(rdv::Op::kErase), {scoped(key)}, options_.timeout, what);
  if (r.code != static_cast<uint8_t>(rdv::Code::kOk) || r.frames.size() != 1 || r.frames[0].size() != 1) {
    throw_reply_error(r, what);
  }
  return r.frames[0][0] != '\0';
}

void RendezvousClient::barrier(const std::string& name, int count, std::chrono::milliseconds timeout) {
  TANDEM_REQUIRE(count > 0, "barrier '{}': count must be positive, got {}", name, count);
  const auto start = Clock::now();
  const std::string arrived_key = name + "/arrived";
  const std::string done_key = name + "/done";
  const int64_t n = add(arrived_key, 1);
  TANDEM_REQUIRE(n <= count, "barrier '{}' was entered {} times but expects {} (a reused barrier name?)", name, n,
                 count);
  if (n == count) set(done_key, "1");
  const auto left = std::max(std::chrono::milliseconds(0),
                             timeout - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start));
  try {
    get(done_key, left);
  } catch (const Error& e) {
    if (e.status() != Status::kTimeout) throw;
    int64_t arrived = -1;
    try {
      arrived = add(arrived_key, 0);
    } catch (const Error&) {
    }
    TANDEM_THROW(Status::kTimeout, "rank {}: barrier '{}': only {} of {} arrived within {} ms", options_.rank, name,
                 arrived, count, timeout.count());
  }
}

}  // namespace tandem::engine::comm
