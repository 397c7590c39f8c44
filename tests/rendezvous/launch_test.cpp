// `tandem launch` through the built binary: environment, output prefixing, exit status, stopping
// the other ranks, signal forwarding, and no process left behind (checked by PID).
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "test_util.hpp"

using rdv_test::ProcessResult;
using rdv_test::process_gone;
using rdv_test::run_process;

namespace {

const std::string kTandem = TANDEM_CLI_PATH;
const std::string kProbe = RENDEZVOUS_PROBE_PATH;
constexpr int kDeadlineMs = 20000;

ProcessResult launch(std::vector<std::string> args, const std::map<std::string, std::string>& env = {}) {
  args.insert(args.begin(), {kTandem, "launch"});
  return run_process(args, env, kDeadlineMs);
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// PIDs printed as "pid N" (after the rank prefix).
std::vector<pid_t> pids_in(const std::string& out, const std::string& tag = "pid") {
  std::vector<pid_t> pids;
  const std::regex re("\\] " + tag + " ([0-9]+)");
  for (const auto& l : lines_of(out)) {
    std::smatch m;
    if (std::regex_search(l, m, re)) pids.push_back(static_cast<pid_t>(std::stol(m[1])));
  }
  return pids;
}

bool all_gone(const std::vector<pid_t>& pids) {
  // The launcher has returned; give the kernel a moment to finish tearing processes down.
  for (int i = 0; i < 100; ++i) {
    bool gone = true;
    for (pid_t p : pids) gone = gone && process_gone(p);
    if (gone) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A folder where ranks say they are ready (a file each) before another rank or the test acts on them: the tests
// below must not assume that a rank got anywhere within a fixed time (under load, starting a shell can take seconds).
struct ReadyDir {
  std::filesystem::path path;
  ReadyDir() {
    std::string t = (std::filesystem::temp_directory_path() / "tandem_launch_XXXXXX").string();
    BOOST_REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~ReadyDir() { std::filesystem::remove_all(path); }
  // Shell: touch NAME here (say it is ready).
  std::string say(const std::string& name) const { return "touch \"" + (path / name).string() + "\""; }
  // Shell: wait (at most 20 s) until NAME is here.
  std::string await(const std::string& name) const {
    return "i=0; until [ -e \"" + (path / name).string() + "\" ] || [ $i -ge 2000 ]; do sleep 0.01; i=$((i+1)); done";
  }
  // The test: waits (at most 20 s) until every name is here.
  bool wait_for(const std::vector<std::string>& names) const {
    for (int k = 0; k < 2000; ++k) {
      bool all = true;
      for (const auto& n : names) all = all && std::filesystem::exists(path / n);
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(launcher)

BOOST_AUTO_TEST_CASE(prefixes_every_line_with_its_rank_and_keeps_streams_apart) {
  const auto r = launch({"-n", "3", "--", "sh", "-c",
                         "echo out $TANDEM_RANK; echo err $TANDEM_RANK >&2; printf 'no newline'"});
  BOOST_TEST(r.exit_code() == 0, r.err);
  for (int i = 0; i < 3; ++i) {
    const std::string p = "[rank " + std::to_string(i) + "] ";
    BOOST_TEST(r.out.find(p + "out " + std::to_string(i) + "\n") != std::string::npos, r.out);
    BOOST_TEST(r.out.find(p + "no newline\n") != std::string::npos, r.out);
    BOOST_TEST(r.err.find(p + "err " + std::to_string(i) + "\n") != std::string::npos, r.err);
    BOOST_TEST(r.out.find(p + "err") == std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(lines_of_busy_ranks_never_interleave) {
  // Each rank writes 300 lines of 200 copies of its digit as fast as it can.
  const auto r = launch({"-n", "4", "--", "sh", "-c",
                         "line=$(printf \"%200s\" \"\" | tr ' ' \"$TANDEM_RANK\"); i=0; "
                         "while [ $i -lt 300 ]; do echo \"$line\"; i=$((i+1)); done"});
  BOOST_TEST(r.exit_code() == 0, r.err);
  const auto lines = lines_of(r.out);
  BOOST_TEST(lines.size() == 1200u);
  const std::regex re("^\\[rank ([0-3])\\] ([0-3])\\2{199}$");
  int bad = 0;
  std::map<std::string, int> per_rank;
  for (const auto& l : lines) {
    std::smatch m;
    if (!std::regex_match(l, m, re) || m[1] != m[2]) {
      ++bad;
    } else {
      ++per_rank[m[1]];
    }
  }
  BOOST_TEST(bad == 0);
  for (const auto& [rank, n] : per_rank) BOOST_TEST(n == 300, "rank " << rank);
}

BOOST_AUTO_TEST_CASE(sets_the_job_environment_with_a_fresh_secret) {
  const std::vector<std::string> args = {
      "-n", "2", "--transport", "zmq", "--timeout-ms", "1234", "--",
      "sh", "-c",
      "echo env $TANDEM_RANK $TANDEM_WORLD_SIZE $TANDEM_LOCAL_RANK $TANDEM_LOCAL_WORLD_SIZE $TANDEM_MASTER_ADDR "
      "$TANDEM_MASTER_PORT $TANDEM_TRANSPORT $TANDEM_TIMEOUT_MS $TANDEM_SECRET"};
  // A stale value from the caller's environment must be replaced, not inherited.
  const auto a = launch(args, {{"TANDEM_SECRET", "stale"}, {"TANDEM_RANK", "7"}});
  const auto b = launch(args);
  BOOST_TEST(a.exit_code() == 0, a.err);
  const std::regex re("^\\[rank ([01])\\] env ([01]) 2 ([01]) 2 127\\.0\\.0\\.1 ([0-9]+) zmq 1234 ([0-9a-f]{64})$");
  std::set<std::string> secrets, ports;
  int matched = 0;
  for (const auto& l : lines_of(a.out)) {
    std::smatch m;
    if (!std::regex_match(l, m, re)) continue;
    ++matched;
    BOOST_TEST(m[1] == m[2]);
    BOOST_TEST(m[2] == m[3]);
    ports.insert(m[4]);
    secrets.insert(m[5]);
  }
  BOOST_TEST(matched == 2, a.out);
  BOOST_TEST(secrets.size() == 1u);  // one secret per job ...
  BOOST_TEST(ports.size() == 1u);
  BOOST_TEST(!secrets.empty());
  if (!secrets.empty()) BOOST_TEST(b.out.find(*secrets.begin()) == std::string::npos);  // ... fresh for each job
}

// Issue #17: the launcher serves the job's store itself at the rendezvous port and says so with TANDEM_STORE;
// torchrun's MASTER_PORT is another port, free for a program's own rank-0 rendezvous (PyTorch's env://).
BOOST_AUTO_TEST_CASE(the_launcher_serves_the_store_and_names_it_in_tandem_store) {
  const int port = rdv_test::free_port();
  const auto r = launch({"-n", "2", "--port", std::to_string(port), "--", "sh", "-c",
                         "echo store $TANDEM_STORE $TANDEM_MASTER_ADDR:$TANDEM_MASTER_PORT $MASTER_PORT"});
  BOOST_TEST(r.exit_code() == 0, r.err);
  const std::string want = "store 127.0.0.1:" + std::to_string(port) + " 127.0.0.1:" + std::to_string(port) + " ";
  int seen = 0;
  for (const auto& l : lines_of(r.out)) {
    const size_t at = l.find("] store ");
    if (at == std::string::npos) continue;
    ++seen;
    BOOST_TEST(l.substr(at + 2, want.size()) == want, l);
    BOOST_TEST(l.substr(at + 2 + want.size()) != std::to_string(port), l);  // MASTER_PORT is another port
  }
  BOOST_TEST(seen == 2, r.out);
  // The port taken: the launcher says so before starting any rank.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  BOOST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 1) == 0 &&
                ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const auto taken = launch({"-n", "2", "--port", std::to_string(ntohs(a.sin_port)), "--", "echo", "ran"});
  ::close(fd);
  BOOST_TEST(taken.exit_code() == 1, taken.err);
  BOOST_TEST(taken.err.find("cannot serve the job's rendezvous store") != std::string::npos, taken.err);
  BOOST_TEST(taken.out.find("ran") == std::string::npos, taken.out);
}

BOOST_AUTO_TEST_CASE(ranks_meet_through_the_rendezvous_store) {
  const auto r = launch({"-n", "3", "--", kProbe, "exchange"});
  BOOST_TEST(r.exit_code() == 0, r.err);
  for (int i = 0; i < 3; ++i) {
    const std::string want = "[rank " + std::to_string(i) + "] rank " + std::to_string(i) + " of 3: saw 0,1,2\n";
    BOOST_TEST(r.out.find(want) != std::string::npos, r.out << r.err);
  }
}

BOOST_AUTO_TEST_CASE(a_failing_rank_stops_the_others_and_its_code_is_returned) {
  const ReadyDir ready;  // rank 1 fails once the others have printed their PIDs
  const auto r = launch({"-n", "3", "--", "sh", "-c",
                         "echo pid $$; if [ $TANDEM_RANK = 1 ]; then " + ready.await("0") + "; " + ready.await("2") +
                             "; exit 3; fi; " + ready.say("$TANDEM_RANK") + "; exec sleep 30"});
  BOOST_TEST(r.exit_code() == 3, r.err);
  BOOST_TEST(!r.timed_out);
  BOOST_TEST(r.elapsed_ms < 5000);
  BOOST_TEST(r.err.find("rank 1 exited with status 3") != std::string::npos, r.err);
  const auto pids = pids_in(r.out);
  BOOST_TEST(pids.size() == 3u, r.out);
  BOOST_TEST(all_gone(pids));
}

BOOST_AUTO_TEST_CASE(death_by_signal_is_128_plus_the_signal) {
  const auto r = launch({"-n", "2", "--", "sh", "-c", "if [ $TANDEM_RANK = 0 ]; then kill -9 $$; fi; exec sleep 30"});
  BOOST_TEST(r.exit_code() == 137, r.err);
  BOOST_TEST(r.elapsed_ms < 5000);
}

BOOST_AUTO_TEST_CASE(a_rank_ignoring_sigterm_is_killed_after_the_grace_period) {
  const ReadyDir ready;  // rank 1 fails once rank 0 ignores SIGTERM
  const auto r = launch({"-n", "2", "--grace-ms", "300", "--", "sh", "-c",
                         "echo pid $$; if [ $TANDEM_RANK = 1 ]; then " + ready.await("0") + "; exit 2; fi; "
                         "trap '' TERM; " + ready.say("0") + "; while :; do sleep 0.05; done"});
  BOOST_TEST(r.exit_code() == 2, r.err);
  BOOST_TEST(r.elapsed_ms >= 300);  // the grace, after the failure
  BOOST_TEST(r.elapsed_ms < 5000);
  BOOST_TEST(r.err.find("did not stop within 300 ms") != std::string::npos, r.err);
  BOOST_TEST(all_gone(pids_in(r.out)));
}

BOOST_AUTO_TEST_CASE(sigint_is_forwarded_and_nothing_survives) {
  const ReadyDir ready;  // the interrupt comes once both ranks have printed their PIDs
  bool both_ready = false;
  const auto r = run_process({kTandem, "launch", "-n", "2", "--", "sh", "-c",
                              "echo pid $$; " + ready.say("$TANDEM_RANK") + "; exec sleep 30"},
                             {}, kDeadlineMs, [&](pid_t launcher) {
                               both_ready = ready.wait_for({"0", "1"});
                               ::kill(launcher, SIGINT);
                             });
  BOOST_TEST(both_ready);
  BOOST_TEST(r.exit_code() == 130, r.err);
  BOOST_TEST(r.elapsed_ms < 5000);
  const auto pids = pids_in(r.out);
  BOOST_TEST(pids.size() == 2u, r.out);
  BOOST_TEST(all_gone(pids));
}

BOOST_AUTO_TEST_CASE(background_and_escaped_children_are_cleaned_up) {
  // One rank leaves a child in its process group; the other leaves one in a new session (once it printed its PID).
  const ReadyDir ready;
  const auto r = launch({"-n", "2", "--", "sh", "-c",
                         "if [ $TANDEM_RANK = 0 ]; then sleep 30 & echo bg $!; "
                         "else setsid sh -c 'echo bg $$; " + ready.say("bg") + "; exec sleep 30' & " +
                             ready.await("bg") + "; fi; echo done"});
  BOOST_TEST(r.exit_code() == 0, r.err);
  BOOST_TEST(r.elapsed_ms < 5000);
  const auto bg = pids_in(r.out, "bg");
  BOOST_TEST(bg.size() == 2u, r.out);
  BOOST_TEST(all_gone(bg));
}

BOOST_AUTO_TEST_CASE(a_missing_program_is_reported_with_127) {
  const auto r = launch({"-n", "2", "--", "/nonexistent/tandem-test-program"});
  BOOST_TEST(r.exit_code() == 127);
  BOOST_TEST(r.err.find("cannot run '/nonexistent/tandem-test-program'") != std::string::npos, r.err);
}

BOOST_AUTO_TEST_CASE(host_exec_wraps_each_rank_and_needs_a_master_address) {
  const auto r = launch({"-n", "2", "--host-exec", "env TANDEM_TEST_HOST={rank}", "--master-addr", "10.9.0.1", "--",
                         "sh", "-c",
                         "echo host $TANDEM_TEST_HOST rank $TANDEM_RANK local $TANDEM_LOCAL_RANK/"
                         "$TANDEM_LOCAL_WORLD_SIZE master $TANDEM_MASTER_ADDR"});
  BOOST_TEST(r.exit_code() == 0, r.err);
  BOOST_TEST(r.out.find("[rank 0] host 0 rank 0 local 0/1 master 10.9.0.1\n") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("[rank 1] host 1 rank 1 local 0/1 master 10.9.0.1\n") != std::string::npos, r.out);
  const auto no_addr = launch({"-n", "2", "--host-exec", "env X={rank}", "--", "true"});
  BOOST_TEST(no_addr.exit_code() == 2);
  BOOST_TEST(no_addr.err.find("--master-addr") != std::string::npos, no_addr.err);
}

BOOST_AUTO_TEST_SUITE_END()
