// Checkpoint atomicity under kills (issue #17, chaos): a child process writes checkpoints in a loop and is SIGKILLed
// at random moments; the file on disk always loads as a complete checkpoint, the previous one or a newer one, never a
// torn one, and a torn temporary file never loads.
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/train/checkpoint.hpp"

using namespace tandem;
using namespace tandem::engine::train;
namespace fs = std::filesystem;

namespace {

constexpr int kTrials = 30;

// Generation g: every value says g, and the sizes vary with g, so a file mixing two generations or cut short shows.
Checkpoint generation(int64_t g) {
  Checkpoint ck;
  ck.meta = {{"generation", g}};
  ck.add("values", std::vector<float>(static_cast<size_t>(200000 + 4099 * (g % 7)), static_cast<float>(g)));
  ck.add("tail", std::vector<float>(1000, -static_cast<float>(g)));
  return ck;
}

// The generation a loaded checkpoint holds; fails the test when its records disagree.
int64_t generation_of(const Checkpoint& ck) {
  const int64_t g = ck.meta.at("generation").get<int64_t>();
  const std::vector<float>& v = ck.tensor("values");
  BOOST_TEST(v.size() == static_cast<size_t>(200000 + 4099 * (g % 7)));
  BOOST_TEST((v.front() == static_cast<float>(g) && v.back() == static_cast<float>(g)));
  BOOST_TEST(ck.tensor("tail").back() == -static_cast<float>(g));
  return g;
}

// Kills and reaps `pid` (only the child this test forked).
void kill_child(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(checkpoint_kills)

BOOST_AUTO_TEST_CASE(a_writer_killed_at_random_moments_never_leaves_a_torn_file_that_loads) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tandem_ckpt_kill_{}", ::getpid());
  fs::create_directories(dir);
  const std::string path = (dir / "run.ckpt").string(), tmp = path + ".tmp";
  save_checkpoint(path, generation(0));
  std::mt19937 rng(17);  // fixed: the same kill moments each run
  std::uniform_int_distribution<int> delay_us(0, 40000);
  int64_t last = 0;
  int advanced = 0, torn_tmp = 0, whole_tmp = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const int64_t first = last + 1;
    const pid_t pid = ::fork();
    BOOST_REQUIRE_MESSAGE(pid >= 0, "fork failed");
    if (pid == 0) {
      // The child: a bounded writing loop; it never returns into the test framework.
      try {
        for (int64_t g = first; g < first + 10000; ++g) save_checkpoint(path, generation(g));
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    kill_child(pid);
    // The file always loads whole: the last one seen before, or a newer one.
    try {
      const int64_t g = generation_of(load_checkpoint(path));
      BOOST_TEST(g >= last, "trial " << trial << ": generation " << g << " replaced the newer " << last);
      if (g > last) ++advanced;
      last = g;
    } catch (const Error& e) {
      BOOST_FAIL("trial " << trial << ": the checkpoint does not load: " << e.what());
    }
    // A temporary file left by the kill either is a complete checkpoint or is refused, naming it.
    if (fs::exists(tmp)) {
      try {
        generation_of(load_checkpoint(tmp));
        ++whole_tmp;
      } catch (const Error& e) {
        ++torn_tmp;
        BOOST_TEST(static_cast<int>(e.status()) == static_cast<int>(Status::kIo));
        BOOST_TEST(std::string(e.what()).find(tmp) != std::string::npos, e.what());
      }
    }
  }
  BOOST_TEST_MESSAGE(kTrials << " kills: the file advanced in " << advanced << ", a torn temp file was refused in "
                             << torn_tmp << ", a complete one was left in " << whole_tmp);
  BOOST_TEST(advanced > 0, "the child wrote at least one checkpoint before some kill");
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_torn_file_never_loads_at_any_length) {
  // What a kill can leave in the temporary file: every prefix of a checkpoint (and a corrupted byte) is refused.
  const fs::path dir = fs::temp_directory_path() / fmt::format("tandem_ckpt_torn_{}", ::getpid());
  fs::create_directories(dir);
  const std::string whole = (dir / "whole.ckpt").string(), torn = (dir / "torn.ckpt").string();
  Checkpoint ck = generation(3);
  ck.tensors[0].second.resize(5000);  // small, to try many lengths quickly
  save_checkpoint(whole, ck);
  std::ifstream in(whole, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_REQUIRE(bytes.size() > 20000);
  std::mt19937 rng(5);
  std::vector<size_t> lengths{0, 1, 8, 12, 16, 17, bytes.size() - 1};
  for (int k = 0; k < 40; ++k) lengths.push_back(std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng));
  for (const size_t n : lengths) {
    std::ofstream(torn, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(n));
    try {
      load_checkpoint(torn);
      BOOST_FAIL("a checkpoint cut to " << n << " of " << bytes.size() << " bytes loaded");
    } catch (const Error& e) {
      BOOST_TEST(static_cast<int>(e.status()) == static_cast<int>(Status::kIo));
      BOOST_TEST(std::string(e.what()).find(torn) != std::string::npos, e.what());
    }
  }
  std::vector<char> flipped = bytes;
  flipped[bytes.size() - 100] ^= 0x10;
  std::ofstream(torn, std::ios::binary | std::ios::trunc).write(flipped.data(), static_cast<std::streamsize>(flipped.size()));
  try {
    load_checkpoint(torn);
    BOOST_FAIL("a corrupted checkpoint loaded");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("CRC32") != std::string::npos, e.what());
  }
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
