// Faults the conformance suite cannot stage with threads: garbage on the wire, a peer process
// killed with SIGKILL, malformed zmq headers and tcp frames, strays at connection setup.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sched.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <functional>
#include <sstream>
#include <malloc.h>
#include <random>
#include <zmq.hpp>

#include "engine/core/settings.hpp"
#include "tests/transports/file_store.hpp"
#include "tests/transports/harness.hpp"
#include "tests/transports/peer_process.hpp"
#include "transports/socket_setup.hpp"
#include "transports/tcp/wire.hpp"
#include "transports/zmq/wire.hpp"

extern char** environ;

namespace bdata = boost::unit_test::data;
using namespace tandem;
using namespace tandem::transports;
using namespace tandem::transports::testing;

namespace {

std::vector<std::string> networked_transports() {
  std::vector<std::string> out;
  for (const auto& n : available_transports())
    if (n != "inproc") out.push_back(n);
  return out;
}

// Throws unless the exchange of one message each way between ranks 0 and 1 is intact.
void exchange_intact(Rank& r, int seq, size_t bytes = 70000) {
  if (r.rank > 1) return;
  const int peer = 1 - r.rank;
  auto out = payload(r.rank, peer, seq, bytes);
  std::vector<unsigned char> in(bytes);
  MutPart rp{in.data(), in.size()};
  ConstPart sp{out.data(), out.size()};
  auto rq = r.t.irecv(peer, 1, std::span<const MutPart>(&rp, 1));
  auto sq = r.t.isend(peer, 1, std::span<const ConstPart>(&sp, 1));
  wait(r.t, *sq);
  wait(r.t, *rq);
  CHECK_RANK(in == payload(peer, r.rank, seq, bytes), "exchange " << seq);
}

// Raw TCP: connect to host:port and write `bytes`, then close.
void spray_tcp(const std::string& endpoint, const std::vector<unsigned char>& bytes) {
  // endpoint is "tcp://127.0.0.1:PORT"
  const size_t colon = endpoint.rfind(':');
  const int port = std::stoi(endpoint.substr(colon + 1));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  CHECK_RANK(fd >= 0, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    [[maybe_unused]] auto n = ::write(fd, bytes.data(), bytes.size());
  }
  ::close(fd);
}

std::vector<std::string> fields(const std::string& v) {
  std::vector<std::string> out;
  std::istringstream in(v);
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

// Connects to a rank's abstract local socket.
int local_connect(const std::string& name) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  CHECK_RANK(::connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0, "connect " << name << ": " << std::strerror(errno));
  return fd;
}

// The job's store, with each rank's published tcp or zmq address rewritten on the way in.
class RewritingStore : public KvStore {
 public:
  using Rewrite = std::function<std::string(std::vector<std::string> fields)>;
  RewritingStore(KvStore& inner, Rewrite rewrite) : inner_(inner), rewrite_(std::move(rewrite)) {}
  void set(const std::string& key, const std::string& value) override {
    std::string v = value;
    if (key.find("/tcp/") != std::string::npos || key.find("/zmq/") != std::string::npos) v = rewrite_(fields(value));
    inner_.set(key, v);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override { return inner_.get(key, timeout); }

 private:
  KvStore& inner_;
  Rewrite rewrite_;
};

std::string join(const std::vector<std::string>& f) {
  std::string out;
  for (const auto& x : f) out += (out.empty() ? "" : " ") + x;
  return out;
}

int dead_tcp_port() {  // bound, then closed: nobody listens there
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

// Runs `n` ranks of `transport` as threads over `store`, ranks 0 and 1 exchanging
// (exchange_intact); returns every rank's error, "" when all went well.
std::string run_job(const std::string& transport, KvStore& store, int n,
                    std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(20000)) {
  return run_rank_threads(
      transport, n, store, unique_prefix(transport + "-job"),
      [](Rank& rk, std::unique_ptr<Transport>&) {
        for (int seq = 0; seq < 3; ++seq) exchange_intact(rk, seq, 300000);
        rk.sync.arrive_and_wait();  // nobody closes while a peer still reads
      },
      {}, connect_timeout);
}

// run_job with 2 ranks, local sockets turned off by `var`=tcp and an 800 ms connection deadline;
// `ms` is how long it took.
std::string run_job_on_tcp_only(const std::string& transport, const char* var, KvStore& store, long long& ms) {
  const settings::ScopedProcessValue tcp_only(var, "tcp");
  const auto t0 = std::chrono::steady_clock::now();
  std::string out = run_job(transport, store, 2, std::chrono::milliseconds(800));
  ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

int tcp_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK_RANK(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect: " << std::strerror(errno));
  return fd;
}

// Creates a 1-rank transport with the setting `var` set to `value` in the process snapshot (unset
// again afterwards); returns "<status>: <message>" of the error it throws ("" when it does not).
std::string creation_error(const std::string& transport, const char* var, const char* value) {
  MemoryStore store;
  const settings::ScopedProcessValue setting(var, value);
  std::string out;
  try {
    create_transport(options_for(transport, 0, 1, store, unique_prefix("bad-env")));
  } catch (const Error& e) {
    out = std::string(status_name(e.status())) + ": " + e.what();
  }
  return out;
}

// Two ranks exchange `rounds` messages each way, 4 KiB and `big` bytes alternately, and check them.
void exchange_rounds(const std::string& transport, int rounds, size_t big) {
  run_ranks(transport, 2, [&](Rank& r) {
    for (int round = 0; round < rounds; ++round) exchange_intact(r, round, round % 2 ? big : 4096);
  });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(zmq_wire)

BOOST_AUTO_TEST_CASE(check_header_accepts_a_valid_header_and_rejects_each_defect) {
  using namespace tandem::transports::zmq;
  WireHeader good;
  good.kind = static_cast<uint16_t>(Kind::kData);
  good.src = 2;
  good.tag = 5;
  good.total = 100;
  good.offset = 60;
  good.seg_bytes = 40;
  WireHeader out;
  BOOST_TEST(check_header(&good, sizeof good, 4, out).empty());
  BOOST_TEST(out.seg_bytes == 40u);

  auto rejects = [&](WireHeader h, size_t bytes = sizeof(WireHeader)) { return !check_header(&h, bytes, 4, out).empty(); };
  BOOST_TEST(rejects(good, sizeof good - 1));
  WireHeader h = good;
  h.magic ^= 1;
  BOOST_TEST(rejects(h));
  h = good;
  h.version = 99;
  BOOST_TEST(rejects(h));
  h = good;
  h.kind = 0;
  BOOST_TEST(rejects(h));
  h = good;
  h.src = 4;  // world of 4
  BOOST_TEST(rejects(h));
  h = good;
  h.src = -1;
  BOOST_TEST(rejects(h));
  h = good;
  h.tag = uint64_t{1} << 40;
  BOOST_TEST(rejects(h));
  h = good;
  h.seg_bytes = 41;  // past the end
  BOOST_TEST(rejects(h));
  h = good;
  h.offset = ~uint64_t{0} - 10;  // offset + seg_bytes would wrap
  BOOST_TEST(rejects(h));
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int i = 0; i < 10000; ++i) {  // random bytes essentially never pass
    unsigned char junk[sizeof(WireHeader)];
    for (auto& c : junk) c = static_cast<unsigned char>(rng());
    accepted += check_header(junk, sizeof junk, 4, out).empty();
  }
  BOOST_TEST(accepted == 0);
}

BOOST_AUTO_TEST_CASE(zmq_spin_setting_is_checked_and_zero_blocks_at_once) {
  // TANDEM_ZMQ_SPIN_US: a bad value is refused naming the variable; 0 (never poll before blocking)
  // still delivers every message, woken by the sockets alone.
  const std::string msg = creation_error("zmq", "TANDEM_ZMQ_SPIN_US", "ten");
  BOOST_TEST(msg.find("invalid argument") == 0, msg);
  BOOST_TEST(msg.find("TANDEM_ZMQ_SPIN_US") != std::string::npos, msg);
  const settings::ScopedProcessValue no_spin("TANDEM_ZMQ_SPIN_US", "0");
  exchange_rounds("zmq", 50, 100000);
}

BOOST_AUTO_TEST_CASE(zmq_keeps_freed_frame_memory_at_the_top_of_the_heap) {
  // A bad TANDEM_ZMQ_HEAP_PAD is refused naming it; asked for (it is off by default: M_TOP_PAD is
  // process-wide), a zmq transport makes malloc keep freed memory at the top of its heap (so the
  // next large frame does not fault its pages in again): after 3 MiB of 96 KiB blocks are freed, at
  // least 2 MiB stay releasable at the top.
  const std::string msg = creation_error("zmq", "TANDEM_ZMQ_HEAP_PAD", "-1");
  BOOST_TEST(msg.find("TANDEM_ZMQ_HEAP_PAD") != std::string::npos, msg);
  MemoryStore store;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)  // gcc's names
  return;  // a sanitizer's allocator replaces glibc's heap: nothing of it to look at
#elif defined(__has_feature)                                           // clang's
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return;
#endif
#endif
  const settings::ScopedProcessValue pad("TANDEM_ZMQ_HEAP_PAD", "8388608");
  auto t = create_transport(options_for("zmq", 0, 1, store, unique_prefix("pad")));
  std::vector<void*> blocks;
  for (int i = 0; i < 32; ++i) {
    blocks.push_back(std::malloc(96 * 1024));
    std::memset(blocks.back(), i, 96 * 1024);
  }
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) std::free(*it);
  const auto info = mallinfo2();
  BOOST_TEST(info.keepcost >= size_t{2} << 20, "only " << info.keepcost << " bytes kept at the top of the heap");
}

BOOST_AUTO_TEST_CASE(ucx_busy_window_is_checked_and_zero_still_delivers) {
  // TANDEM_UCX_BUSY_US: a bad value is refused naming the variable; 0 (sleep between polls as soon
  // as a wait finds nothing) still delivers small and rendezvous-sized messages.
  const auto names = available_transports();
  if (std::find(names.begin(), names.end(), "ucx") == names.end()) return;
  const std::string msg = creation_error("ucx", "TANDEM_UCX_BUSY_US", "2ms");
  BOOST_TEST(msg.find("TANDEM_UCX_BUSY_US") != std::string::npos, msg);
  const settings::ScopedProcessValue no_busy("TANDEM_UCX_BUSY_US", "0");
  exchange_rounds("ucx", 20, 300000);
}

// Issue #17: once cancel() of a ucx send returns, UCX no longer reads its buffer -- the caller may reuse or free it
// (freeing it after a failed operation crashed inside UCX). A rendezvous-sized send that rank 1 has not received
// yet: cancel returns at once and the message goes on from a copy of the data as it was (rank 1 receives that, while
// rank 0 keeps making progress) or is dropped by rank 1 (drop_unexpected, what a failed communicator does);
// overwriting the buffer afterwards changes nothing received.
BOOST_AUTO_TEST_CASE(a_cancelled_ucx_send_no_longer_reads_its_buffer_once_cancel_returns) {
  const auto names = available_transports();
  if (std::find(names.begin(), names.end(), "ucx") == names.end()) return;
  constexpr size_t kBytes = size_t{4} << 20;  // far above UCX's rendezvous threshold
  for (const bool dropped : {false, true}) {
    std::atomic<bool> received{false};  // rank 1 is done receiving: rank 0 may stop making progress
    run_ranks("ucx", 2, [&](Rank& rk) {
      if (rk.rank == 0) {
        std::vector<unsigned char> buf(kBytes, 0x5a);
        const ConstPart part{buf.data(), buf.size()};
        auto req = rk.t.isend(1, 77, std::span(&part, 1));
        rk.t.progress();
        rk.sync.arrive_and_wait();  // rank 1 starts receiving (or dropping) now
        const auto t0 = std::chrono::steady_clock::now();
        req->cancel();
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
        std::fill(buf.begin(), buf.end(), 0xee);  // what a freed and reused buffer would hold
        // the cancelled send goes on from its copy as this rank makes progress (a survivor keeps calling into it)
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
        while (!dropped && !received.load() && std::chrono::steady_clock::now() < until)
          rk.t.wait_for_progress(std::chrono::milliseconds(1));
        rk.sync.arrive_and_wait();
        CHECK_RANK(ms.count() < 1500, "cancel took " << ms.count() << " ms");
        rk.sync.arrive_and_wait();
        return;
      }
      std::vector<unsigned char> got(kBytes, 0);
      const MutPart part{got.data(), got.size()};
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the send arrives unexpected
      rk.t.progress();
      rk.sync.arrive_and_wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 is in cancel()
      bool done = false;
      if (dropped) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
        while (std::chrono::steady_clock::now() < until) {
          rk.t.drop_unexpected(77, ~uint64_t{0});
          rk.t.wait_for_progress(std::chrono::milliseconds(1));
        }
      } else {
        auto recv = rk.t.irecv(0, 77, std::span(&part, 1));
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!done && std::chrono::steady_clock::now() < until) {
          try {
            done = recv->test();
          } catch (const Error&) {
            done = true;  // a cancelled message may fail the receive: it must never deliver new bytes
          }
          rk.t.wait_for_progress(std::chrono::milliseconds(1));
        }
        received = true;
      }
      rk.sync.arrive_and_wait();  // rank 0 has overwritten its buffer
      for (int i = 0; i < 50; ++i) rk.t.wait_for_progress(std::chrono::milliseconds(1));
      if (!dropped) {
        CHECK_RANK(done, "the receive of the cancelled send neither completed nor failed");
        CHECK_RANK(std::count(got.begin(), got.end(), 0xee) == 0, "bytes written into rank 0's buffer after cancel arrived");
      } else {
        // Dropped: a receive posted now finds nothing.
        auto late = rk.t.irecv(0, 77, std::span(&part, 1));
        CHECK_RANK(!poll_for(rk.t, *late, std::chrono::milliseconds(200)), "a dropped message was still delivered");
        late->cancel();
      }
      rk.sync.arrive_and_wait();
    });
  }
}

BOOST_AUTO_TEST_CASE(zmq_ranks_of_one_host_connect_over_ipc_and_zmq_local_turns_it_off) {
  // Every rank publishes a TCP endpoint where nothing listens: the job still runs, over the ipc
  // endpoints. With TANDEM_ZMQ_LOCAL=tcp the same job does not connect and says so within its
  // deadline; a bad TANDEM_ZMQ_LOCAL is refused naming it.
  MemoryStore inner;
  const std::string dead = fmt::format("tcp://127.0.0.1:{}", dead_tcp_port());
  RewritingStore store(inner, [&](std::vector<std::string> f) {
    f[0] = dead;
    return join(f);
  });
  const std::string failures = run_job("zmq", store, 3);
  BOOST_TEST(failures.empty(), failures);

  long long ms = 0;
  const std::string refused = run_job_on_tcp_only("zmq", "TANDEM_ZMQ_LOCAL", store, ms);
  BOOST_TEST(refused.find("did not hear from rank(s)") != std::string::npos, refused);
  BOOST_TEST(ms < 5000, ms << " ms");
  const std::string msg = creation_error("zmq", "TANDEM_ZMQ_LOCAL", "unix");
  BOOST_TEST(msg.find("invalid argument") == 0, msg);
  BOOST_TEST(msg.find("TANDEM_ZMQ_LOCAL") != std::string::npos, msg);
}

BOOST_AUTO_TEST_CASE(stray_connections_with_garbage_do_not_disturb_a_zmq_job) {
  MemoryStore store;
  const std::string prefix = unique_prefix("zmq-stray");
  const std::string failures = run_rank_threads("zmq", 2, store, prefix, [&](Rank& rk, std::unique_ptr<Transport>&) {
    exchange_intact(rk, 0);
    rk.sync.arrive_and_wait();
    if (rk.rank == 1) {
      // Attack rank 0's ROUTER while rank 0 keeps progressing.
      // Its TCP endpoint and its local one (ipc://@name, published after the host id).
      const auto f = fields(store.get(prefix + "/zmq/0", std::chrono::milliseconds(1000)));
      CHECK_RANK(f.size() == 4, "rank 0 published no local endpoint");
      const std::string endpoint = f[0], local = f[3];
      std::mt19937 rng(11);
      std::vector<unsigned char> junk(100000);
      for (auto& c : junk) c = static_cast<unsigned char>(rng());
      spray_tcp(endpoint, junk);
      std::vector<unsigned char> greeting(junk.begin(), junk.begin() + 1012);
      const unsigned char zmtp[] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0};  // a ZMTP-looking start
      std::copy(std::begin(zmtp), std::end(zmtp), greeting.begin());
      spray_tcp(endpoint, greeting);
      for (const auto* bytes : {&junk, &greeting}) {
        const int fd = local_connect(local.substr(std::string("ipc://@").size()));
        [[maybe_unused]] auto n = ::send(fd, bytes->data(), bytes->size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::close(fd);
      }
      ::zmq::context_t ctx;
      for (int kind = 0; kind < 6; ++kind) {
        ::zmq::socket_t d(ctx, ::zmq::socket_type::dealer);
        d.set(::zmq::sockopt::linger, 200);
        if (kind % 3 == 1) {  // guesses rank 1's routing id shape with a wrong nonce
          std::string id(13, '\x01');
          id[0] = 'T';
          d.set(::zmq::sockopt::routing_id, id);
        }
        d.connect(kind < 3 ? endpoint : local);
        transports::zmq::WireHeader h;
        h.kind = static_cast<uint16_t>(kind % 3 == 2 ? transports::zmq::Kind::kData : transports::zmq::Kind::kHello);
        h.src = 1;
        h.total = h.seg_bytes = 4;
        if (kind % 3 == 2) {  // a data segment where only hellos are accepted
          d.send(::zmq::buffer(&h, sizeof h), ::zmq::send_flags::sndmore);
          d.send(::zmq::str_buffer("evil"), ::zmq::send_flags::none);
        } else {  // a well-formed hello from a routing id that is not rank 1's
          d.send(::zmq::buffer(&h, sizeof h), ::zmq::send_flags::none);
        }
        d.send(::zmq::buffer(junk.data(), 5000), ::zmq::send_flags::none);  // over the ROUTER's 1 KiB limit
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    } else {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
      while (std::chrono::steady_clock::now() < until) rk.t.progress();
    }
    rk.sync.arrive_and_wait();
    for (int seq = 1; seq < 4; ++seq) exchange_intact(rk, seq);
    rk.sync.arrive_and_wait();
  });
  BOOST_TEST(failures.empty(), failures);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// "host port nonce [host-id local-name]" as the tcp transport publishes it.
struct TcpAddress {
  std::string host;
  int port = 0;
  uint64_t nonce = 0;
  std::string host_id, local_name;  // empty when the rank has no local socket
};
TcpAddress tcp_address(KvStore& store, const std::string& prefix, int rank) {
  const auto f = fields(store.get(prefix + "/tcp/" + std::to_string(rank), std::chrono::milliseconds(10000)));
  // "<host> <port> <nonce>", then "<host id> <local name>" with local sockets, then "shm" with shared memory.
  CHECK_RANK(f.size() == 3 || f.size() == 5 || (f.size() == 6 && f[5] == "shm"),
             "published address has " << f.size() << " fields");
  TcpAddress a{f[0], std::stoi(f[1]), std::stoull(f[2], nullptr, 16), "", ""};
  if (f.size() >= 5) a.host_id = f[3], a.local_name = f[4];
  return a;
}

// A connection to rank 0's TCP listener ("tcp") or to its local socket ("local").
int stray(const std::string& via, const TcpAddress& zero) {
  return via == "local" ? local_connect(zero.local_name) : tcp_connect(zero.port);
}

void write_raw(int fd, const void* data, size_t bytes) {
  CHECK_RANK(::send(fd, data, bytes, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes), "short write");
}

// Rank 1 of a 2-rank tcp job, played by hand over a raw socket: publishes an address, greets rank 0
// with a correct hello and then writes whatever the test wants.
struct FakeTcpRank1 {
  int fd = -1;
  FakeTcpRank1(KvStore& store, const std::string& prefix) {
    const uint64_t nonce = 0x1234567890abcdefull;
    store.set(prefix + "/tcp/1", fmt::format("127.0.0.1 9 {:016x}", nonce));
    const TcpAddress zero = tcp_address(store, prefix, 0);
    fd = tcp_connect(zero.port);
    transports::tcp::Hello h;
    h.rank = 1;
    h.world = 2;
    h.acceptor_nonce = zero.nonce;
    h.connector_nonce = nonce;
    write_raw(fd, &h, sizeof h);
  }
  ~FakeTcpRank1() { ::close(fd); }
  void frame(uint64_t tag, const std::vector<unsigned char>& data, uint64_t declared, uint32_t magic) {
    transports::tcp::FrameHeader f;
    f.magic = magic;
    f.kind = static_cast<uint16_t>(transports::tcp::Kind::kData);
    f.src = 1;
    f.tag = tag;
    f.bytes = declared;
    write_raw(fd, &f, sizeof f);
    if (!data.empty()) write_raw(fd, data.data(), data.size());
  }
};

// What a receive's wait ends with: "ok" or "<status>: <message>".
std::string outcome(Transport& t, Request& rq) {
  try {
    return poll_for(t, rq, std::chrono::milliseconds(10000)) ? "ok" : "still pending after 10 s";
  } catch (const Error& e) {
    return std::string(status_name(e.status())) + ": " + e.what();
  }
}

// The host id a child process sees after moving into a network namespace of its own, or
// "!<why>" when it could not (not root, or no namespaces in this container).
std::string host_id_in_new_netns() {
  int fds[2];
  if (::pipe(fds) != 0) return "!pipe";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string id = ::unshare(CLONE_NEWNET) == 0 ? transports::local_host_id()
                                                       : std::string("!unshare: ") + std::strerror(errno);
    [[maybe_unused]] auto n = ::write(fds[1], id.data(), id.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

boost::test_tools::assertion_result can_make_a_network_namespace(boost::unit_test::test_unit_id) {
  const std::string id = host_id_in_new_netns();
  boost::test_tools::assertion_result r(id.empty() || id[0] != '!');
  r.message() << "cannot make a network namespace here (" << id << ")";
  return r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tcp_transport)

BOOST_AUTO_TEST_CASE(another_network_namespace_is_another_host_for_local_sockets,
                     *boost::unit_test::precondition(can_make_a_network_namespace)) {
  // Abstract local sockets are scoped by the network namespace: ranks in namespaces of their own
  // (the emulated hosts of bench/emu, containers) must see different host ids and so keep to TCP.
  const std::string here = transports::local_host_id(), there = host_id_in_new_netns();
  BOOST_TEST(!here.empty());
  BOOST_TEST(!there.empty());
  BOOST_TEST(here != there);
  BOOST_TEST(here.substr(0, here.find(':')) == there.substr(0, there.find(':')));  // the same boot
}

BOOST_AUTO_TEST_CASE(check_frame_and_check_hello_reject_each_defect) {
  using namespace tandem::transports::tcp;
  FrameHeader good;
  good.kind = static_cast<uint16_t>(Kind::kData);
  good.src = 2;
  good.tag = 5;
  good.bytes = 100;
  BOOST_TEST(check_frame(good, 2, 1000).empty());
  auto rejects = [&](FrameHeader h, int peer = 2) { return !check_frame(h, peer, 1000).empty(); };
  BOOST_TEST(rejects(good, 1));  // from another connection than its claimed source
  FrameHeader h = good;
  h.magic ^= 1;
  BOOST_TEST(rejects(h));
  h = good;
  h.version = 9;
  BOOST_TEST(rejects(h));
  h = good;
  h.kind = 7;
  BOOST_TEST(rejects(h));
  h = good;
  h.tag = uint64_t{1} << 40;
  BOOST_TEST(rejects(h));
  h = good;
  h.bytes = 1001;
  BOOST_TEST(check_frame(h, 2, 1000).find("above the limit") != std::string::npos);
  h = good;
  h.kind = static_cast<uint16_t>(Kind::kGoodbye);
  BOOST_TEST(rejects(h));  // a goodbye carries nothing
  h.bytes = 0;
  BOOST_TEST(!rejects(h));

  Hello hello;
  hello.rank = 3;
  hello.world = 4;
  hello.acceptor_nonce = 42;
  BOOST_TEST(check_hello(hello, 1, 4, 42).empty());
  BOOST_TEST(!check_hello(hello, 1, 4, 43).empty());  // not our nonce
  BOOST_TEST(!check_hello(hello, 3, 4, 42).empty());  // only higher ranks connect to us
  BOOST_TEST(!check_hello(hello, 1, 5, 42).empty());  // another world size
  Hello bad = hello;
  bad.magic = 0;
  BOOST_TEST(!check_hello(bad, 1, 4, 42).empty());
  std::mt19937_64 rng(3);
  int accepted = 0;
  for (int i = 0; i < 10000; ++i) {  // random bytes essentially never pass
    unsigned char junk[sizeof(FrameHeader)];
    for (auto& c : junk) c = static_cast<unsigned char>(rng());
    FrameHeader f;
    std::memcpy(&f, junk, sizeof f);
    accepted += check_frame(f, f.src, uint64_t{1} << 40).empty();
  }
  BOOST_TEST(accepted == 0);
}

BOOST_AUTO_TEST_CASE(tcp_settings_are_checked_and_spin_zero_still_delivers) {
  for (const char* var : {"TANDEM_TCP_SPIN_US", "TANDEM_TCP_MAX_UNEXPECTED", "TANDEM_TCP_LOCAL"}) {
    const std::string msg = creation_error("tcp", var, "-5");
    BOOST_TEST(msg.find("invalid argument") == 0, msg);
    BOOST_TEST(msg.find(var) != std::string::npos, msg);
  }
  const settings::ScopedProcessValue no_spin("TANDEM_TCP_SPIN_US", "0");
  exchange_rounds("tcp", 50, 300000);
}

BOOST_AUTO_TEST_CASE(tcp_listens_and_connects_over_ipv6) {
  // TANDEM_IFACE_ADDR=::1: the ranks listen on, publish and connect to the IPv6 loopback address.
  std::optional<settings::ScopedProcessValue> ipv6(std::in_place, "TANDEM_IFACE_ADDR", "::1");
  MemoryStore store;
  const std::string prefix = unique_prefix("tcp-ipv6");
  std::barrier<> sync(2);
  std::string failures[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        auto t = create_transport(options_for("tcp", r, 2, store, prefix));
        Rank rk{r, 2, *t, sync};
        for (int seq = 0; seq < 3; ++seq) exchange_intact(rk, seq, 200000);
      } catch (const std::exception& e) {
        failures[r] = e.what();
        sync.arrive_and_drop();
      }
    });
  for (auto& th : threads) th.join();
  ipv6.reset();
  BOOST_TEST(failures[0].empty(), failures[0]);
  BOOST_TEST(failures[1].empty(), failures[1]);
  const std::string published = store.get(prefix + "/tcp/1", std::chrono::milliseconds(100));
  BOOST_TEST(published.rfind("::1 ", 0) == 0, published);
}

BOOST_AUTO_TEST_CASE(connection_setup_fails_within_its_deadline_naming_the_missing_rank) {
  // Rank 0 whose peer never comes: kTimeout naming rank 1 once connect_timeout is over. Rank 1
  // whose rank 0 published an address where nothing listens any more: kTimeout naming rank 0 and
  // the address -- never a hang past the deadline.
  auto attempt = [](int rank, MemoryStore& store, const std::string& prefix, long long& ms) {
    auto o = options_for("tcp", rank, 2, store, prefix);
    o.connect_timeout = std::chrono::milliseconds(600);
    const auto t0 = std::chrono::steady_clock::now();
    std::string out;
    try {
      create_transport(o);
    } catch (const Error& e) {
      out = std::string(status_name(e.status())) + ": " + e.what();
    }
    ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    return out;
  };
  MemoryStore store;
  long long ms = 0;
  const std::string alone = attempt(0, store, unique_prefix("tcp-alone"), ms);
  BOOST_TEST(alone.find(status_name(Status::kTimeout)) == 0, alone);
  BOOST_TEST(alone.find("rank(s) 1") != std::string::npos, alone);
  BOOST_TEST(ms < 3000, ms << " ms");

  const std::string prefix = unique_prefix("tcp-gone");
  const int port = dead_tcp_port();
  store.set(prefix + "/tcp/0", fmt::format("127.0.0.1 {} {:016x}", port, 7));
  const std::string gone = attempt(1, store, prefix, ms);
  BOOST_TEST(gone.find(status_name(Status::kTimeout)) == 0, gone);
  BOOST_TEST(gone.find("rank 0") != std::string::npos, gone);
  BOOST_TEST(gone.find(std::to_string(port)) != std::string::npos, gone);
  BOOST_TEST(ms < 3000, ms << " ms");

  const std::string bad_prefix = unique_prefix("tcp-bad");
  store.set(bad_prefix + "/tcp/0", "127.0.0.1 notaport 0000000000000007");
  const std::string bad = attempt(1, store, bad_prefix, ms);
  BOOST_TEST(bad.find("malformed address for rank 0") != std::string::npos, bad);
}

BOOST_AUTO_TEST_CASE(malformed_local_socket_fields_in_the_store_are_named) {
  // What a rank publishes for its local socket is read as carefully as its TCP address: a missing
  // field, a doubled space, a name too long for a socket address, or a zmq local endpoint that is
  // not ipc://@ -- each fails setup naming the rank and the value, instead of connecting somewhere.
  const std::string id = transports::local_host_id();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tcp", "127.0.0.1 9 0000000000000007 " + id},
      {"tcp", "127.0.0.1 9 0000000000000007  " + id + " tandem-tcp-x"},
      {"tcp", "127.0.0.1 9 0000000000000007 " + id + " " + std::string(200, 'n')},
      {"zmq", "tcp://127.0.0.1:9 0000000000000007 " + id},
      {"zmq", "tcp://127.0.0.1:9 0000000000000007 " + id + " ipc:///tmp/elsewhere"},
      {"zmq", "tcp://127.0.0.1:9 0000000000000007 " + id + " tcp://127.0.0.1:10"}};
  for (const auto& [transport, value] : cases) {
    MemoryStore store;
    const std::string prefix = unique_prefix(transport + "-bad-local");
    store.set(prefix + "/" + transport + "/0", value);
    auto o = options_for(transport, 1, 2, store, prefix);
    o.connect_timeout = std::chrono::milliseconds(2000);
    std::string error;
    try {
      create_transport(o);
    } catch (const Error& e) {
      error = e.what();
    }
    BOOST_TEST(error.find("malformed address for rank 0") != std::string::npos, transport << " '" << value << "': " << error);
    BOOST_TEST(error.find(value) != std::string::npos, error);
  }
}

BOOST_AUTO_TEST_CASE(ranks_of_one_host_connect_over_local_sockets_and_tcp_local_turns_it_off) {
  // Every rank publishes a TCP port where nothing listens: the job still runs, so the ranks (all
  // of this host) met over their local sockets. With TANDEM_TCP_LOCAL=tcp the same job cannot
  // connect, and says so within its deadline naming the rank and the dead address.
  MemoryStore inner;
  const int dead = dead_tcp_port();
  RewritingStore store(inner, [&](std::vector<std::string> f) {
    f[1] = std::to_string(dead);
    return join(f);
  });
  const std::string failures = run_job("tcp", store, 3);
  BOOST_TEST(failures.empty(), failures);

  long long ms = 0;
  const std::string refused = run_job_on_tcp_only("tcp", "TANDEM_TCP_LOCAL", store, ms);
  BOOST_TEST(refused.find("could not connect to rank 0 at 127.0.0.1:" + std::to_string(dead)) != std::string::npos,
             refused);
  BOOST_TEST(ms < 5000, ms << " ms");
}

BOOST_AUTO_TEST_CASE(ranks_that_cannot_meet_on_a_local_socket_use_tcp) {
  // A local socket name nobody listens on (each rank falls back to TCP, with a warning), and host
  // ids that differ (as between hosts, or network namespaces of one host): the job runs over TCP.
  MemoryStore a;
  RewritingStore gone(a, [](std::vector<std::string> f) {
    if (f.size() == 5) f[4] = "tandem-tcp-nobody-listens-here";
    return join(f);
  });
  std::string failures = run_job("tcp", gone, 3);
  BOOST_TEST(failures.empty(), failures);
  MemoryStore b;
  std::atomic<int> next{0};
  RewritingStore apart(b, [&](std::vector<std::string> f) {
    if (f.size() == 5) f[3] += "-host" + std::to_string(next++);
    return join(f);
  });
  failures = run_job("tcp", apart, 3);
  BOOST_TEST(failures.empty(), failures);
}

BOOST_DATA_TEST_CASE(strays_at_connection_setup_are_refused_and_the_job_runs,
                     bdata::make(std::vector<std::string>{"tcp", "local"}), via) {
  // While rank 0 waits for rank 1 to connect, on its TCP listener or on its local socket: 100 KB
  // of garbage, a hello that does not carry rank 0's nonce, a connection that never says anything,
  // and one that closes at once. Each is refused (logged); rank 1 then connects and the job
  // exchanges intact data.
  MemoryStore store;
  const std::string prefix = unique_prefix("tcp-stray");
  std::string error0;
  std::unique_ptr<Transport> t0;
  std::thread rank0([&] {
    try {
      t0 = create_transport(options_for("tcp", 0, 2, store, prefix));
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  const TcpAddress zero = tcp_address(store, prefix, 0);
  if (via == "local") BOOST_REQUIRE(!zero.local_name.empty());
  std::mt19937 rng(5);
  std::vector<unsigned char> junk(100000);
  for (auto& c : junk) c = static_cast<unsigned char>(rng());
  const int garbage = stray(via, zero);
  [[maybe_unused]] auto w = ::send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  transports::tcp::Hello guess;
  guess.rank = 1;
  guess.world = 2;
  guess.acceptor_nonce = zero.nonce ^ 1;
  const int wrong = stray(via, zero);
  write_raw(wrong, &guess, sizeof guess);
  const int silent = stray(via, zero);
  ::close(stray(via, zero));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::unique_ptr<Transport> t1;
  BOOST_REQUIRE_NO_THROW(t1 = create_transport(options_for("tcp", 1, 2, store, prefix)));
  rank0.join();
  for (int fd : {garbage, wrong, silent}) ::close(fd);
  BOOST_REQUIRE_MESSAGE(error0.empty(), error0);
  std::barrier<> sync(2);
  std::string failure;
  std::thread other([&] {
    try {
      Rank r{0, 2, *t0, sync};
      for (int seq = 0; seq < 3; ++seq) exchange_intact(r, seq);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  Rank r{1, 2, *t1, sync};
  for (int seq = 0; seq < 3; ++seq) exchange_intact(r, seq);
  other.join();
  BOOST_TEST(failure.empty(), failure);
}

BOOST_AUTO_TEST_CASE(a_malformed_frame_fails_the_peer_naming_it) {
  // A connected peer whose stream turns to garbage cannot be resynchronised: after one good
  // message, a frame with a bad magic fails the pending receive with kPeerFailure naming rank 1
  // and the defect, and later receives from it fail the same way.
  MemoryStore store;
  const std::string prefix = unique_prefix("tcp-malformed");
  std::unique_ptr<Transport> t0;
  std::thread rank0([&] { t0 = create_transport(options_for("tcp", 0, 2, store, prefix)); });
  FakeTcpRank1 fake(store, prefix);
  rank0.join();
  BOOST_REQUIRE(t0);
  const auto good = payload(1, 0, 0, 5000);
  std::vector<unsigned char> in(5000), more(10);
  MutPart a{in.data(), in.size()}, b{more.data(), more.size()};
  auto first = t0->irecv(1, 3, std::span<const MutPart>(&a, 1));
  auto second = t0->irecv(1, 4, std::span<const MutPart>(&b, 1));
  fake.frame(3, good, good.size(), transports::tcp::kFrameMagic);
  fake.frame(4, {}, 10, 0xdeadbeef);
  BOOST_TEST(outcome(*t0, *first) == "ok");
  BOOST_TEST((in == good));
  const std::string why = outcome(*t0, *second);
  BOOST_TEST(why.find(status_name(Status::kPeerFailure)) == 0, why);
  BOOST_TEST(why.find("rank 1") != std::string::npos, why);
  BOOST_TEST(why.find("bad frame magic") != std::string::npos, why);
  auto later = t0->irecv(1, 5, std::span<const MutPart>(&b, 1));
  BOOST_TEST(outcome(*t0, *later).find(status_name(Status::kPeerFailure)) == 0);
  // Its stream was given up on, but its end is still open: a bad stream is no proof it died (Transport::dead_peers).
  BOOST_TEST(t0->dead_peers().empty());
}

BOOST_AUTO_TEST_CASE(an_unexpected_message_above_the_limit_is_refused_before_allocation) {
  // TANDEM_TCP_MAX_UNEXPECTED bounds what a message nobody waits for may make us allocate: a frame
  // declaring 1 TiB (nothing follows) fails the peer naming the limit -- no allocation, no hang.
  std::optional<settings::ScopedProcessValue> limit(std::in_place, "TANDEM_TCP_MAX_UNEXPECTED", "1000000");
  MemoryStore store;
  const std::string prefix = unique_prefix("tcp-oversize");
  std::unique_ptr<Transport> t0;
  std::thread rank0([&] { t0 = create_transport(options_for("tcp", 0, 2, store, prefix)); });
  FakeTcpRank1 fake(store, prefix);
  rank0.join();
  limit.reset();
  BOOST_REQUIRE(t0);
  fake.frame(8, {}, uint64_t{1} << 40, transports::tcp::kFrameMagic);
  std::vector<unsigned char> in(10);
  MutPart a{in.data(), in.size()};
  auto rq = t0->irecv(1, 9, std::span<const MutPart>(&a, 1));
  const std::string why = outcome(*t0, *rq);
  BOOST_TEST(why.find(status_name(Status::kPeerFailure)) == 0, why);
  BOOST_TEST(why.find("TANDEM_TCP_MAX_UNEXPECTED") != std::string::npos, why);
  BOOST_TEST(why.find("rank 1") != std::string::npos, why);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(peer_death)

BOOST_DATA_TEST_CASE(a_peer_killed_with_sigkill_fails_pending_receives_naming_it,
                     bdata::make(transport_variants(networked_transports())), name) {
  // Rank 0 is another process: it sends one message, then SIGKILLs itself (no goodbye). Rank 1
  // (this process) still gets that message, and its pending receive fails with kPeerFailure.
  const VariantEnv env(name);  // before the spawn: the peer inherits it
  PeerDir dir("kill");
  FileStore& store = dir.store();
  const std::string prefix = "killed";
  const pid_t pid = spawn_peer({TANDEM_TRANSPORT_PEER_EXE, name, dir.path(), prefix, "0", "2"});
  BOOST_REQUIRE(pid > 0);

  std::string outcome;
  bool delivered = false;
  std::vector<int> dead;
  try {
    auto t = create_transport(options_for(name, 1, 2, store, prefix));
    std::vector<unsigned char> in(100), never(10);
    MutPart a{in.data(), in.size()}, b{never.data(), never.size()};
    auto got = t->irecv(0, 3, std::span<const MutPart>(&a, 1));
    auto pending = t->irecv(0, 4, std::span<const MutPart>(&b, 1));
    wait(*t, *got);
    delivered = in == payload(0, 1, 9, 100);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      outcome = poll_for(*t, *pending, std::chrono::milliseconds(30000)) ? "completed" : "still pending after 30 s";
    } catch (const Error& e) {
      outcome = std::string(status_name(e.status())) + ": " + e.what();
    }
    BOOST_TEST_MESSAGE(name << ": detected in "
                            << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count()
                            << " ms: " << outcome);
    dead = dead_peers_once_listed(*t, 0, std::chrono::milliseconds(10000));  // its connection ended with it

  } catch (const std::exception& e) {
    outcome = std::string("unexpected: ") + e.what();
  }
  const int status = reap_peer(pid);  // by PID; never left behind
  BOOST_TEST(WIFSIGNALED(status));
  BOOST_TEST(delivered);
  BOOST_TEST(outcome.find(status_name(Status::kPeerFailure)) == 0, outcome);
  BOOST_TEST(outcome.find("rank 0") != std::string::npos, outcome);
  BOOST_TEST((dead == std::vector<int>{0}));  // Transport::dead_peers: a killed process is gone for good
}

BOOST_AUTO_TEST_SUITE_END()
