#include "engine/comm/rendezvous_server.hpp"

#include <charconv>
#include <limits>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "engine/comm/rendezvous_protocol.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

namespace rdv = rendezvous;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxPendingSessions = 1024;   // unauthenticated handshakes in flight
constexpr size_t kMaxWaiters = 65536;          // GETs held at once
constexpr uint64_t kMaxStoreBytes = uint64_t{1} << 30;
constexpr int kMessagesPerWakeup = 256;        // then look at deadlines again
constexpr uint64_t kMaxGetTimeoutMs = 24ull * 3600 * 1000;

std::string format_endpoint(const std::string& host, const std::string& port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + port;
}

}  // namespace

struct RendezvousServer::Impl {
  struct Session {
    std::string peer;  // "ip" when libzmq knows it
    rdv::Nonce client_nonce{};
    rdv::Nonce server_nonce{};
    std::string rank_size;
    std::string name;
    bool authenticated = false;
    Clock::time_point created;
    int fd = -1;  // the connection's socket (ZMQ_SRCFD), to forget the session when it closes
  };
  struct Waiter {
    std::string routing_id;
    uint64_t request_id;
    std::string key;
  };

  RendezvousServerOptions options;
  rdv::Key key{};
  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  zmq::socket_t wake_rx{ctx, zmq::socket_type::pair};
  zmq::socket_t wake_tx{ctx, zmq::socket_type::pair};
  zmq::socket_t monitor_rx{ctx, zmq::socket_type::pair};  // the router's disconnect events
  std::atomic<bool> stop{false};

  // Owned by the server thread only.
  std::unordered_map<std::string, Session> sessions;
  std::map<std::string, std::string> store;
  uint64_t store_bytes = 0;
  std::multimap<Clock::time_point, Waiter> waiters;  // by deadline
  Clock::time_point next_sweep;
  uint64_t refusals_logged = 0;

  mutable std::mutex stats_mu;
  RendezvousServerStats stats;
  std::set<uint64_t> generations;  // guarded by stats_mu

  bool serves(uint64_t g) const {
    if (options.every_generation) return true;
    std::lock_guard lock(stats_mu);
    return generations.count(g) != 0;
  }
  std::string generations_text() const {
    std::lock_guard lock(stats_mu);
    std::string t;
    for (uint64_t g : generations) t += fmt::format("{}{}", t.empty() ? "" : ", ", g);
    return t;
  }

  void run();
  void handle(std::vector<zmq::message_t>& frames, bool truncated);
  // A connection closed (its process exited or died): its session is gone, so a stopping server does
  // not wait for a goodbye that cannot come.
  void read_monitor();
  void handle_hello(const std::string& rid, Session* existing, const rdv::Header& h, std::vector<zmq::message_t>& f);
  void handle_auth(const std::string& rid, Session& s, const rdv::Header& h, std::vector<zmq::message_t>& f);
  void handle_request(const std::string& rid, const rdv::Header& h, std::vector<zmq::message_t>& f);
  void reply(const std::string& rid, uint64_t id, rdv::Code code, std::vector<std::string> payload = {});
  void wake_waiters(const std::string& key, const std::string& value);
  void expire(Clock::time_point now);
  void refuse(const Session& s, const std::string& rid, uint64_t id, rdv::Code code, const std::string& why);
  void sync_keys() {
    std::lock_guard lock(stats_mu);
    stats.keys = store.size();
  }
  void count(uint64_t RendezvousServerStats::*field) {
    std::lock_guard lock(stats_mu);
    ++(stats.*field);
  }
};

RendezvousServer::RendezvousServer(const RendezvousServerOptions& options) : impl_(std::make_unique<Impl>()) {
  TANDEM_REQUIRE(!options.secret.empty(), "rendezvous server: the job secret is empty (set TANDEM_SECRET)");
  TANDEM_REQUIRE(options.port >= 0 && options.port <= 65535, "rendezvous server: port {} is out of range 0..65535",
                 options.port);
  TANDEM_CHECK(rdv::ensure_sodium(), Status::kInternal, "rendezvous server: libsodium failed to initialise");
  Impl& m = *impl_;
  m.options = options;
  m.generations.insert(options.generation);
  m.key = rdv::derive_key(options.secret);
  m.router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(rdv::kMaxFrameBytes));
  m.router.set(zmq::sockopt::linger, 200);
  m.router.set(zmq::sockopt::handshake_ivl, 5000);  // drop connections that never finish ZMTP's greeting
  // IPv6 sockets only where needed ("*" listens on both): an IPv4 bind then reports a plain address.
  m.router.set(zmq::sockopt::ipv6, options.bind_host == "*" || options.bind_host.find(':') != std::string::npos);
  m.router.set(zmq::sockopt::sndhwm, 100000);
  const std::string want =
      format_endpoint(options.bind_host, options.port == 0 ? std::string("*") : std::to_string(options.port));
  try {
    m.router.bind(want);
  } catch (const zmq::error_t& e) {
    TANDEM_THROW(Status::kTransport, "rendezvous server cannot listen on {}: {}{}", want, e.what(),
                 e.num() == EADDRINUSE ? " (another job may be using this port: choose another with "
                                         "TANDEM_MASTER_PORT / --port)"
                                       : "");
  }
  endpoint_ = m.router.get(zmq::sockopt::last_endpoint);
  const auto colon = endpoint_.rfind(':');
  port_ = colon == std::string::npos ? 0 : std::atoi(endpoint_.c_str() + colon + 1);
  const std::string wake = "inproc://rendezvous-wake";
  m.wake_rx.bind(wake);
  m.wake_tx.connect(wake);
  const std::string monitor = "inproc://rendezvous-monitor";
  if (zmq_socket_monitor(m.router.handle(), monitor.c_str(), ZMQ_EVENT_DISCONNECTED) == 0) {
    m.monitor_rx.connect(monitor);
  } else {
    log::debug("rendezvous server: no disconnect monitor ({}); stopping waits for goodbyes up to the grace",
               zmq_strerror(zmq_errno()));
  }
  m.next_sweep = Clock::now();
  log::info("rendezvous server listening on {}", endpoint_);
  thread_ = std::thread([&m] {
    try {
      m.run();
    } catch (const std::exception& e) {
      log::error("rendezvous server stopped on an internal error: {}", e.what());
    }
  });
}

RendezvousServer::~RendezvousServer() {
  impl_->stop.store(true);
  try {
    impl_->wake_tx.send(zmq::const_buffer("x", 1), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  }
  if (thread_.joinable()) thread_.join();
}

void RendezvousServer::admit(uint64_t generation) {
  std::lock_guard lock(impl_->stats_mu);
  impl_->generations.insert(generation);
}

RendezvousServerStats RendezvousServer::stats() const {
  std::lock_guard lock(impl_->stats_mu);
  return impl_->stats;
}

void RendezvousServer::Impl::run() {
  std::optional<Clock::time_point> drain_until;  // set once stopping: serve until peers said BYE
  for (;;) {
    const auto now = Clock::now();
    if (stop.load() && !drain_until) drain_until = now + options.shutdown_grace;
    if (drain_until) {
      size_t joined = 0;
      for (const auto& [id, s] : sessions) joined += s.authenticated ? 1 : 0;
      if (joined == 0 || now >= *drain_until) {
        if (joined > 0) {
          log::info("rendezvous server: stopping with {} peer(s) that never closed (crashed or still running)",
                    joined);
        }
        break;
      }
    }
    auto wake_at = std::min(next_sweep, waiters.empty() ? next_sweep : waiters.begin()->first);
    if (drain_until) wake_at = std::min(wake_at, *drain_until);
    const auto wait_ms = std::clamp<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(wake_at - now).count() + 1, 0, 1000);
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0},
                               {wake_rx.handle(), 0, ZMQ_POLLIN, 0},
                               {monitor_rx.handle(), 0, ZMQ_POLLIN, 0}};
    rdv::poll_through_signals(items, 3, std::chrono::milliseconds(wait_ms));
    if (items[2].revents & ZMQ_POLLIN) read_monitor();
    if (items[1].revents & ZMQ_POLLIN) {
      zmq::message_t m;
      while (rdv::recv_through_signals(wake_rx, m, zmq::recv_flags::dontwait)) {
      }
    }
    for (int n = 0; n < kMessagesPerWakeup; ++n) {
      std::vector<zmq::message_t> frames;
      zmq::message_t first;
      if (!rdv::recv_through_signals(router, first, zmq::recv_flags::dontwait)) break;
      bool more = first.more();
      frames.push_back(std::move(first));
      bool truncated = false;
      while (more) {  // the rest of a multipart message is already queued
        zmq::message_t part;
        if (!rdv::recv_through_signals(router, part, zmq::recv_flags::none)) break;
        more = part.more();
        if (frames.size() < rdv::kMaxFrames + 1) {
          frames.push_back(std::move(part));
        } else {
          truncated = true;  // discard the excess frames
        }
      }
      handle(frames, truncated);
    }
    expire(Clock::now());
  }
  // Tell everyone still waiting that the job's store is going away, so they fail fast.
  for (auto& [deadline, w] : waiters) reply(w.routing_id, w.request_id, rdv::Code::kShutdown);
  waiters.clear();
}

void RendezvousServer::Impl::read_monitor() {
  for (;;) {
    zmq::message_t event;
    if (!rdv::recv_through_signals(monitor_rx, event, zmq::recv_flags::dontwait)) return;
    while (event.more()) {  // the event's second frame: the endpoint
      zmq::message_t rest;
      if (!rdv::recv_through_signals(monitor_rx, rest, zmq::recv_flags::none) || !rest.more()) break;
    }
    if (event.size() < 6) continue;
    uint16_t id = 0;
    uint32_t fd = 0;
    std::memcpy(&id, event.data(), sizeof(id));
    std::memcpy(&fd, static_cast<const char*>(event.data()) + 2, sizeof(fd));
    if (id != ZMQ_EVENT_DISCONNECTED) continue;
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (it->second.fd == static_cast<int>(fd)) {
        log::debug("rendezvous server: '{}' ({}) disconnected", it->second.name, it->second.peer);
        it = sessions.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void RendezvousServer::Impl::handle(std::vector<zmq::message_t>& frames, bool truncated) {
  if (frames.size() < 2) {
    count(&RendezvousServerStats::malformed);
    return;
  }
  const std::string rid = frames[0].to_string();
  rdv::Header h;
  auto it = sessions.find(rid);
  int fd = -1;
  try {
    fd = frames[1].get(ZMQ_SRCFD);
  } catch (const zmq::error_t&) {
  }
  if (it != sessions.end() && fd >= 0) it->second.fd = fd;
  if (truncated || !rdv::decode_header(frames[1].to_string_view(), &h)) {
    count(&RendezvousServerStats::malformed);
    log::debug("rendezvous server: dropped a malformed message ({} frames{})", frames.size(),
               truncated ? ", too many" : "");
    return;
  }
  frames.erase(frames.begin(), frames.begin() + 2);  // leave the arguments
  if (h.op == rdv::Op::kHello) {
    handle_hello(rid, it == sessions.end() ? nullptr : &it->second, h, frames);
    if (auto s = sessions.find(rid); s != sessions.end()) s->second.fd = fd;
    return;
  }
  if (it == sessions.end()) {
    count(&RendezvousServerStats::malformed);
    if (h.op == rdv::Op::kSet || h.op == rdv::Op::kGet || h.op == rdv::Op::kAdd || h.op == rdv::Op::kErase) {
      reply(rid, h.request_id, rdv::Code::kNoAuth);
    }
    return;
  }
  if (h.op == rdv::Op::kAuth) {
    handle_auth(rid, it->second, h, frames);
    return;
  }
  if (h.op == rdv::Op::kBye) {
    log::debug("rendezvous server: '{}' ({}) left", it->second.name, it->second.peer);
    sessions.erase(it);
    return;
  }
  if (!it->second.authenticated) {
    count(&RendezvousServerStats::malformed);
    reply(rid, h.request_id, rdv::Code::kNoAuth);
    return;
  }
  handle_request(rid, h, frames);
}

void RendezvousServer::Impl::handle_hello(const std::string& rid, Session* existing, const rdv::Header& h,
                                          std::vector<zmq::message_t>& f) {
  if (f.size() != 3 || f[0].size() != rdv::kNonceBytes || f[1].size() != rdv::kJoinBytes || f[2].size() > rdv::kMaxNameBytes ||
      static_cast<uint8_t>(h.code) != rdv::kProtocolVersion) {
    count(&RendezvousServerStats::malformed);
    return;
  }
  if (existing == nullptr) {
    size_t pending = 0;
    for (const auto& [id, s] : sessions) pending += s.authenticated ? 0 : 1;
    if (pending >= kMaxPendingSessions) {
      count(&RendezvousServerStats::malformed);
      log::warn("rendezvous server: {} handshakes already pending; ignoring a new one", pending);
      return;
    }
  }
  Session s;
  try {
    const char* addr = f[0].gets("Peer-Address");
    if (addr != nullptr) s.peer = addr;
    if (s.peer.rfind("::ffff:", 0) == 0 && s.peer.find('.') != std::string::npos) s.peer.erase(0, 7);  // v4-mapped
  } catch (const zmq::error_t&) {
  }
  std::memcpy(s.client_nonce.data(), f[0].data(), rdv::kNonceBytes);
  s.server_nonce = rdv::random_nonce();
  s.rank_size = f[1].to_string();
  s.name = f[2].to_string();
  s.created = Clock::now();
  const rdv::Proof proof = rdv::server_proof(key, s.client_nonce, s.server_nonce);
  const std::string nonce(rdv::as_view(s.server_nonce));
  sessions[rid] = std::move(s);  // a new HELLO restarts the handshake (and drops any earlier auth)
  reply(rid, h.request_id, rdv::Code::kChallenge, {nonce, std::string(rdv::as_view(proof))});
}

void RendezvousServer::Impl::refuse(const Session& s, const std::string& rid, uint64_t id, rdv::Code code,
                                    const std::string& why) {
  // A peer hammering the port must not flood the log: the first 20 refusals, then every 1000th.
  const uint64_t n = ++refusals_logged;
  if (n <= 20 || n % 1000 == 0) {
    log::warn("rendezvous server refused peer {} ('{}'): {}{}", s.peer.empty() ? "(address unknown)" : s.peer,
              s.name.substr(0, 64), why, n > 20 ? fmt::format(" [{} refusals so far]", n) : std::string());
  }
  reply(rid, id, code, {why});
  sessions.erase(rid);
}

void RendezvousServer::Impl::handle_auth(const std::string& rid, Session& s, const rdv::Header& h,
                                         std::vector<zmq::message_t>& f) {
  if (s.authenticated || f.size() != 1) {
    count(&RendezvousServerStats::malformed);
    return;
  }
  const rdv::Proof expected = rdv::client_proof(key, s.server_nonce, s.client_nonce, s.rank_size, s.name);
  if (!rdv::proof_equals(expected, f[0].to_string_view())) {
    count(&RendezvousServerStats::refused);
    refuse(s, rid, h.request_id, rdv::Code::kDenied, "wrong job secret");
    return;
  }
  int32_t rank = 0, size = 0;
  uint64_t generation = 0;
  rdv::decode_rank_size(s.rank_size, &rank, &size, &generation);
  if (options.world_size > 0 && ((size != 0 && size != options.world_size) || rank < 0 || rank >= options.world_size)) {
    refuse(s, rid, h.request_id, rdv::Code::kMismatch,
           fmt::format("peer announces rank {} and world size {}, but this job (rank 0) has world size {} "
                       "(ranks 0..{})",
                       rank, size, options.world_size, options.world_size - 1));
    return;
  }
  if (!serves(generation)) {
    // Most likely the server of an earlier communicator, about to go: the client asks again (no warning).
    log::debug("rendezvous server: '{}' ({}) asks for communicator generation {}, not served here", s.name, s.peer,
               generation);
    reply(rid, h.request_id, rdv::Code::kNotServed,
          {fmt::format("rank 0's rendezvous on this port serves communicator generation(s) {} of the job, not {}",
                       generations_text(), generation)});
    sessions.erase(rid);
    return;
  }
  s.authenticated = true;
  count(&RendezvousServerStats::authenticated);
  log::debug("rendezvous server: '{}' ({}) joined", s.name, s.peer);
  reply(rid, h.request_id, rdv::Code::kOk);
}

void RendezvousServer::Impl::handle_request(const std::string& rid, const rdv::Header& h,
                                            std::vector<zmq::message_t>& f) {
  auto bad = [&](const std::string& why) {
    count(&RendezvousServerStats::malformed);
    reply(rid, h.request_id, rdv::Code::kBadRequest, {why});
  };
  if (f.empty() || f[0].size() > rdv::kMaxKeyBytes) {
    return bad(fmt::format("missing key, or key longer than {} bytes", rdv::kMaxKeyBytes));
  }
  std::string key_name = f[0].to_string();
  switch (h.op) {
    case rdv::Op::kSet: {
      if (f.size() != 2 || f[1].size() > rdv::kMaxValueBytes) {
        return bad(fmt::format("SET '{}': expected one value of at most {} bytes", key_name, rdv::kMaxValueBytes));
      }
      auto [it, inserted] = store.try_emplace(key_name);
      const uint64_t old_bytes = inserted ? 0 : it->first.size() + it->second.size();
      const uint64_t new_bytes = key_name.size() + f[1].size();
      if (store_bytes - old_bytes + new_bytes > kMaxStoreBytes) {
        if (inserted) store.erase(it);
        return bad(fmt::format("SET '{}': the store would exceed {} bytes", key_name, kMaxStoreBytes));
      }
      it->second = f[1].to_string();
      store_bytes = store_bytes - old_bytes + new_bytes;
      sync_keys();
      reply(rid, h.request_id, rdv::Code::kOk);
      wake_waiters(key_name, it->second);
      return;
    }
    case rdv::Op::kGet: {
      uint64_t timeout_ms = 0;
      if (f.size() != 2 || !rdv::decode_u64(f[1].to_string_view(), &timeout_ms)) {
        return bad(fmt::format("GET '{}': malformed timeout", key_name));
      }
      auto it = store.find(key_name);
      if (it != store.end()) return reply(rid, h.request_id, rdv::Code::kOk, {it->second});
      if (timeout_ms == 0) return reply(rid, h.request_id, rdv::Code::kTimeout);
      if (waiters.size() >= kMaxWaiters) return bad(fmt::format("GET '{}': too many waiting requests", key_name));
      const auto deadline = Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, kMaxGetTimeoutMs));
      waiters.emplace(deadline, Waiter{rid, h.request_id, std::move(key_name)});
      return;
    }
    case rdv::Op::kAdd: {
      uint64_t raw = 0;
      if (f.size() != 2 || !rdv::decode_u64(f[1].to_string_view(), &raw)) {
        return bad(fmt::format("ADD '{}': malformed delta", key_name));
      }
      int64_t value = 0;
      auto it = store.find(key_name);
      if (it != store.end()) {
        const std::string& s = it->second;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
        if (ec != std::errc() || p != s.data() + s.size()) {
          return bad(fmt::format("ADD '{}': the key holds a value that is not a counter", key_name));
        }
      }
      const auto delta = static_cast<int64_t>(raw);
      if ((delta > 0 && value > std::numeric_limits<int64_t>::max() - delta) ||
          (delta < 0 && value < std::numeric_limits<int64_t>::min() - delta)) {
        return bad(fmt::format("ADD '{}': counter overflow", key_name));
      }
      value += delta;
      std::string text = std::to_string(value);
      const uint64_t old_bytes = it == store.end() ? 0 : key_name.size() + it->second.size();
      store_bytes = store_bytes - old_bytes + key_name.size() + text.size();
      store[key_name] = text;
      sync_keys();
      reply(rid, h.request_id, rdv::Code::kOk, {rdv::encode_u64(static_cast<uint64_t>(value))});
      wake_waiters(key_name, text);
      return;
    }
    case rdv::Op::kErase: {
      if (f.size() != 1) return bad(fmt::format("ERASE '{}': unexpected arguments", key_name));
      auto it = store.find(key_name);
      const bool existed = it != store.end();
      if (existed) {
        store_bytes -= it->first.size() + it->second.size();
        store.erase(it);
        sync_keys();
      }
      return reply(rid, h.request_id, rdv::Code::kOk, {std::string(1, existed ? '\1' : '\0')});
    }
    default:
      return bad(fmt::format("unknown operation {}", static_cast<int>(h.op)));
  }
}

void RendezvousServer::Impl::reply(const std::string& rid, uint64_t id, rdv::Code code,
                                   std::vector<std::string> payload) {
  try {
    rdv::send_through_signals(router, zmq::buffer(rid), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    const std::string hdr = rdv::encode_header({rdv::Op::kReply, code, id});
    rdv::send_through_signals(router, zmq::buffer(hdr), payload.empty() ? zmq::send_flags::dontwait
                                                  : zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    for (size_t i = 0; i < payload.size(); ++i) {
      rdv::send_through_signals(router, zmq::buffer(payload[i]),
                  i + 1 < payload.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                         : zmq::send_flags::dontwait);
    }
  } catch (const zmq::error_t& e) {
    // A ROUTER drops messages to vanished peers by itself; anything else is worth a note.
    log::debug("rendezvous server: reply to a peer failed: {}", e.what());
  }
}

void RendezvousServer::Impl::wake_waiters(const std::string& key_name, const std::string& value) {
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->second.key == key_name) {
      reply(it->second.routing_id, it->second.request_id, rdv::Code::kOk, {value});
      it = waiters.erase(it);
    } else {
      ++it;
    }
  }
}

void RendezvousServer::Impl::expire(Clock::time_point now) {
  while (!waiters.empty() && waiters.begin()->first <= now) {
    const Waiter& w = waiters.begin()->second;
    reply(w.routing_id, w.request_id, rdv::Code::kTimeout);
    waiters.erase(waiters.begin());
  }
  if (now < next_sweep) return;
  next_sweep = now + std::chrono::seconds(1);
  for (auto it = sessions.begin(); it != sessions.end();) {
    if (!it->second.authenticated && now - it->second.created > options.handshake_timeout) {
      it = sessions.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace tandem::engine::comm
