// The tcp transport's shared-memory path between ranks of one host (TANDEM_TCP_LOCAL=shm, the
// default; transports/tcp/shm_ring.hpp): that it is taken and leaves nothing behind, that a peer
// which corrupts the rings is failed by name, and that a peer killed in the middle of a message
// fails the receive naming it. The conformance suite runs every exchange over it as plain "tcp".
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/transports/file_store.hpp"
#include "tests/transports/harness.hpp"
#include "tests/transports/peer_process.hpp"
#include "transports/tcp/shm_ring.hpp"


namespace bdata = boost::unit_test::data;
using namespace tandem;
using namespace tandem::transports;
using namespace tandem::transports::testing;

namespace {

// Start addresses of this process's mappings of shared-memory segments of the tcp transport.
std::vector<uintptr_t> segment_mappings() {
  std::vector<uintptr_t> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("memfd:tandem-tcp-shm") != std::string::npos) out.push_back(std::stoull(line, nullptr, 16));
  return out;
}

std::set<std::string> dev_shm_entries() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) out.insert(e.path().filename());
  return out;
}

// The outcome of waiting (at most 10 s) for `rq`: "ok", or the status name and message.
std::string outcome_of(Transport& t, Request& rq) {
  try {
    return poll_for(t, rq, std::chrono::milliseconds(10000)) ? "ok" : "still pending after 10 s";
  } catch (const Error& e) {
    return std::string(status_name(e.status())) + ": " + e.what();
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tcp_shared_memory)

BOOST_AUTO_TEST_CASE(ranks_of_one_host_exchange_through_a_segment_that_leaves_nothing_behind) {
  const auto before = dev_shm_entries();
  const size_t mapped_before = segment_mappings().size();
  size_t mapped_during = 0;
  run_ranks("tcp", 3, [&](Rank& r) {
    // 3 ranks, 3 pairs, each segment mapped by both of its ranks.
    r.sync.arrive_and_wait();
    if (r.rank == 0) mapped_during = segment_mappings().size() - mapped_before;
    r.sync.arrive_and_wait();
  });
  BOOST_TEST(mapped_during == 6u);
  BOOST_TEST(segment_mappings().size() == mapped_before);  // unmapped with the transports
  BOOST_TEST((dev_shm_entries() == before));              // memfd: nothing named anywhere
}

BOOST_AUTO_TEST_CASE(the_unix_setting_keeps_ranks_of_one_host_on_their_sockets) {
  const size_t mapped_before = segment_mappings().size();
  size_t mapped_during = 1;
  run_ranks("tcp+unix", 2, [&](Rank& r) {
    r.sync.arrive_and_wait();
    if (r.rank == 0) mapped_during = segment_mappings().size() - mapped_before;
    r.sync.arrive_and_wait();
  });
  BOOST_TEST(mapped_during == 0u);
}

// The peer (rank 1, the connector, which writes ring 0) scribbles over an index of that ring:
// "head" as the writer, which rank 0 reads; "tail" as if it were the reader, which rank 1 itself
// checks when it writes next. Either way the rank that reads the bad index fails its operations
// with kPeerFailure naming the other rank and the corruption -- no crash, no hang.
BOOST_DATA_TEST_CASE(a_corrupted_ring_index_fails_the_peer_by_name, bdata::make({"head", "tail"}), which) {
  const std::string index = which;
  const size_t mapped_before = segment_mappings().size();
  std::string failure[2];
  run_ranks("tcp", 2, [&](Rank& r) {
    const int peer = 1 - r.rank;
    r.sync.arrive_and_wait();  // both connected: the segment is mapped
    if (r.rank == 0) {
      const auto maps = segment_mappings();
      CHECK_RANK(maps.size() == mapped_before + 2, "expected one segment mapped twice");
      auto* h = reinterpret_cast<tcp::ShmSegmentHeader*>(maps.back());
      if (index == "head") h->ring[0].head.store(uint64_t{1} << 50);
      else h->ring[0].tail.store(uint64_t{3} << 40);
    }
    r.sync.arrive_and_wait();
    std::vector<unsigned char> in(4096), out(4096, 7);
    if (index == "head" ? r.rank == 0 : r.rank == 1) {
      std::unique_ptr<Request> rq;
      if (r.rank == 0) {
        MutPart p{in.data(), in.size()};
        rq = r.t.irecv(peer, 1, std::span<const MutPart>(&p, 1));
      } else {
        ConstPart p{out.data(), out.size()};
        rq = r.t.isend(peer, 1, std::span<const ConstPart>(&p, 1));
      }
      failure[r.rank] = outcome_of(r.t, *rq);
    }
    r.sync.arrive_and_wait();
  });
  const std::string& why = failure[index == "head" ? 0 : 1];
  BOOST_TEST(why.find(status_name(Status::kPeerFailure)) == 0, why);
  BOOST_TEST(why.find(fmt::format("rank {} corrupted the shared memory", index == "head" ? 1 : 0)) != std::string::npos,
             why);
  BOOST_TEST(why.find(index + " index") != std::string::npos, why);
}

BOOST_DATA_TEST_CASE(a_peer_killed_mid_message_fails_the_receive_naming_it, bdata::make({"tcp", "tcp+unix"}), name) {
  // Rank 0 is another process: it sends 100 bytes, then starts a 64 MiB message (more than the
  // ring and the socket hold) and SIGKILLs itself right after. Rank 1 gets the first message; the
  // receive of the second fails with kPeerFailure naming rank 0, "mid-message".
  const std::string spec = name;
  const VariantEnv env(spec);
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("tandem-shm-test-{}-{}", ::getpid(), unique_prefix("kill").substr(5));
  std::filesystem::remove_all(dir);
  FileStore store(dir);
  const std::string prefix = "killed-mid";
  const pid_t pid = spawn_peer({TANDEM_TRANSPORT_PEER_EXE, spec, dir.string(), prefix, "0", "2", "mid"});
  BOOST_REQUIRE(pid > 0);
  std::string first, second;
  try {
    auto t = create_transport(options_for(spec, 1, 2, store, prefix));
    std::vector<unsigned char> small(100), big(size_t{64} << 20);
    MutPart a{small.data(), small.size()}, b{big.data(), big.size()};
    auto r1 = t->irecv(0, 3, std::span<const MutPart>(&a, 1));
    auto r2 = t->irecv(0, 5, std::span<const MutPart>(&b, 1));
    first = outcome_of(*t, *r1);
    if (small != payload(0, 1, 9, 100)) first = "wrong bytes";
    second = outcome_of(*t, *r2);
  } catch (const std::exception& e) {
    second = std::string("unexpected: ") + e.what();
  }
  const int status = reap_peer(pid);  // by PID; never left behind
  std::filesystem::remove_all(dir);
  BOOST_TEST(WIFSIGNALED(status));
  BOOST_TEST(first == "ok", first);
  BOOST_TEST(second.find(status_name(Status::kPeerFailure)) == 0, second);
  BOOST_TEST(second.find("rank 0") != std::string::npos, second);
  BOOST_TEST(second.find("mid-message") != std::string::npos, second);
}

BOOST_AUTO_TEST_CASE(a_segment_that_is_not_one_is_refused) {
  // What an acceptor checks before it maps what a connector passed: sealed, sized as its header says.
  std::string why;
  const int unsealed = ::memfd_create("not-a-segment", MFD_CLOEXEC);
  BOOST_REQUIRE(unsealed >= 0);
  BOOST_REQUIRE(::ftruncate(unsealed, static_cast<off_t>(tcp::shm_segment_bytes(tcp::kShmRingBytes))) == 0);
  BOOST_TEST(!tcp::ShmChannel::map(unsealed, false, why));
  BOOST_TEST(why.find("sealed") != std::string::npos, why);
  ::close(unsealed);

  const int sealed_empty = ::memfd_create("not-a-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  BOOST_REQUIRE(sealed_empty >= 0);
  BOOST_REQUIRE(::ftruncate(sealed_empty, static_cast<off_t>(tcp::shm_segment_bytes(tcp::kShmRingBytes))) == 0);
  BOOST_REQUIRE(::fcntl(sealed_empty, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0);
  BOOST_TEST(!tcp::ShmChannel::map(sealed_empty, false, why));  // all zeros: no magic
  BOOST_TEST(why.find("header") != std::string::npos, why);
  ::close(sealed_empty);

  const int good = tcp::shm_create_segment(tcp::kShmRingBytes, why);
  BOOST_REQUIRE(good >= 0);
  auto a = tcp::ShmChannel::map(good, true, why), b = tcp::ShmChannel::map(good, false, why);
  ::close(good);
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  // A message larger than the ring goes through in turns, intact, across the ring's end.
  std::vector<unsigned char> out(tcp::kShmRingBytes * 2 + 12345), in(out.size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<unsigned char>(k * 131 + 7);
  size_t sent = 0, got = 0;
  for (int turn = 0; turn < 100 && got < in.size(); ++turn) {
    const iovec w{out.data() + sent, std::min<size_t>(out.size() - sent, 300000)};
    const ptrdiff_t n = a->write(&w, 1);
    BOOST_REQUIRE(n >= 0);
    sent += static_cast<size_t>(n);
    const iovec r{in.data() + got, in.size() - got};
    const ptrdiff_t m = b->read(&r, 1);
    BOOST_REQUIRE(m >= 0);
    got += static_cast<size_t>(m);
  }
  BOOST_TEST(got == in.size());
  BOOST_TEST((in == out));
  BOOST_TEST(tcp::shm_create_segment(3000, why) == -1);  // not a power of two
}

BOOST_AUTO_TEST_SUITE_END()
