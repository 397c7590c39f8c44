// `tandem launch -n N [options] -- PROGRAM ARGS...`: starts N local ranks of one job (POSIX; no
// library calls needed). Each rank gets TANDEM_RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/
// MASTER_ADDR/MASTER_PORT (and torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/
// MASTER_PORT) and a fresh random TANDEM_SECRET; its stdout/stderr lines come out
// prefixed "[rank i] ". When this launcher's stderr is a terminal (and no --log-dir), rank 0 also gets
// TANDEM_LAUNCH_PROGRESS=1: tandem train then draws its progress bar (the job's, "\r"-redrawn) on its stderr pipe,
// and the launcher keeps it unprefixed on the terminal's last line.
// Ranks on other machines (--hosts h1:2,h2:2 over --ssh-cmd, or --host-exec WRAPPER) get a small
// sh script instead of an environment: it reads the secret from stdin (never on a command line, so
// never in `ps`), then runs the command under `env` with every variable spelled out, so nothing
// depends on ssh or a wrapper forwarding the environment. The same stdin stays open as a lifeline:
// when the launcher (or its ssh) goes away, the remote side sees EOF and stops its rank.
// The first rank to fail decides the exit status (its code, or 128+signal) and the others are
// stopped (SIGTERM, then SIGKILL after --grace-ms). SIGINT/SIGTERM/SIGHUP are forwarded. Every
// rank runs in its own process group, and the launcher kills and reaps all of it.
// Elastic jobs (--min-ranks A below -n; issue #17): a rank that dies is reported (which, and how)
// but the others are left running -- they shrink their communicator and go on (tandem train
// --elastic) -- and the launcher exits 0 when at least A ranks finished with status 0. The ranks
// get TANDEM_MIN_RANKS=A, tandem train's default --min-ranks.
// Growing jobs (issue #17): `--max-ranks B` (default -n) bounds the job's ranks; above -n it lets ranks join later: `tandem launch --join -n K --port P
// --secret-file F -- tandem train ...` starts K ranks with TANDEM_JOIN=1 and the running job's rendezvous and
// secret (F, written by the job's own launch with --secret-file F); its elastic ranks admit them at a step
// boundary, at most B in all.
// The job's rendezvous store (issue #17): a new job's launcher serves it itself at the rendezvous port (--port,
// else a free one), where it outlives every rank, and tells the ranks so with TANDEM_STORE=ADDR:PORT (equal to
// TANDEM_MASTER_ADDR:TANDEM_MASTER_PORT): no rank serves it, so the survivors of any rank's death, rank 0's
// included, agree on their membership there (tandem_store_serve). It needs --master-addr to be an address of
// this machine (the default 127.0.0.1, or --hosts run from the first host); otherwise rank 0 serves the store as
// before and losing rank 0 stops an elastic job. torchrun's MASTER_PORT is then another free port, for programs
// whose rank 0 serves a rendezvous of its own there (PyTorch's env://). A joining launch (--join) serves nothing:
// its ranks meet the running job's store at --port.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "tandem/tandem.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxLineBytes = 64 * 1024;  // a longer line is cut (bounded memory per stream)

struct LaunchOptions {
  int nprocs = 0;
  std::string transport;
  int64_t timeout_ms = 0;
  int port = 0;
  std::string master_addr;
  std::string host_exec;
  std::string hosts;                    // "h1:2,h2:2": ranks over ssh, filled host by host
  std::string ssh_cmd = "ssh -o BatchMode=yes";  // run as: SSH_CMD... HOST SCRIPT
  std::vector<std::string> env_names;   // --env NAME[=VALUE]: more variables for remote ranks
  int64_t grace_ms = 3000;
  bool json = false;        // stdout: the ranks' JSON lines with a "rank" field; everything else to stderr
  std::string log_dir;      // each rank's stdout/stderr to <dir>/rank-<i>.out/.err instead of the terminal
  int min_ranks = 0;        // elastic below -n: ranks that must finish; 0: -n (not elastic)
  bool min_ranks_given = false;  // --min-ranks on the command line (at -n too: the ranks' floor, TANDEM_MIN_RANKS)
  int max_ranks = 0;        // 0: -n; above -n the ranks get TANDEM_MAX_RANKS (tandem train's default --max-ranks)
  bool join = false;        // --join: the ranks join a running elastic job (TANDEM_JOIN=1) instead of starting one
  std::string secret_file;  // start: write the job's secret there (0600); --join: read it from there
  std::vector<std::string> command;
};

// ---- small POSIX helpers -------------------------------------------------------------------

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Rank 0's progress bar while it is drawn on this terminal (TANDEM_LAUNCH_PROGRESS, see Launcher::run): every
// other line written to the terminal takes it away first and draws it again after, so the bar stays the last line.
std::string g_bar;
constexpr char kClearLine[] = "\r\033[K";

void write_line(int fd, const std::string& line) {
  static const bool tty[3] = {false, ::isatty(1) != 0, ::isatty(2) != 0};  // a pipe or file needs no room made
  if (g_bar.empty() || fd < 1 || fd > 2 || !tty[fd]) {
    write_all(fd, line.data(), line.size());
    return;
  }
  write_all(2, kClearLine, sizeof(kClearLine) - 1);
  write_all(fd, line.data(), line.size());
  write_all(2, g_bar.data(), g_bar.size());
}

void say(const std::string& msg) { write_line(2, "tandem launch: " + msg + "\n"); }

std::optional<std::string> random_secret() {
  unsigned char bytes[32];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = ::read(fd, bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != sizeof(bytes)) return std::nullopt;
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

// --secret-file for a joining launch: the running job's secret (written by its launcher), else TANDEM_SECRET.
std::optional<std::string> read_secret_file(const std::string& path) {
  if (path.empty()) {
    const char* env = std::getenv("TANDEM_SECRET");
    if (env != nullptr && *env != '\0') return std::string(env);
    say("--join needs the running job's secret: give --secret-file (the file its `tandem launch --secret-file` "
        "wrote) or export TANDEM_SECRET");
    return std::nullopt;
  }
  std::ifstream in(path);
  std::string secret;
  if (!in || !std::getline(in, secret) || secret.empty()) {
    say("--secret-file " + path + ": cannot read a secret from it (" + std::strerror(errno) + ")");
    return std::nullopt;
  }
  return secret;
}

// --secret-file for a new job: the secret, readable by this user only, for `tandem launch --join`.
bool write_secret_file(const std::string& path, const std::string& secret) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const std::string line = secret + "\n";
  const bool ok = fd >= 0 && ::fchmod(fd, 0600) == 0 && write_all(fd, line.data(), line.size());
  if (fd >= 0) ::close(fd);
  if (!ok) say("--secret-file " + path + ": cannot write the job's secret there (" + std::strerror(errno) + ")");
  return ok;
}

// A TCP port free right now (the kernel's choice); 0 on failure.
int pick_free_port(bool loopback) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

bool is_loopback(const std::string& a) { return a == "localhost" || a == "::1" || a.rfind("127.", 0) == 0; }

// Whether `addr` (a name or an address, [v6] allowed) is an address of this machine: a socket can bind it.
bool is_local_address(const std::string& addr) {
  std::string h = addr;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(h.c_str(), "0", &hints, &res) != 0 || res == nullptr) return false;
  bool local = false;
  for (addrinfo* a = res; a != nullptr && !local; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    local = fd >= 0 && ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (fd >= 0) ::close(fd);
  }
  ::freeaddrinfo(res);
  return local;
}

// The job's rendezvous store, served by the launcher (the header comment above); empty when it serves none.
class HostedStore {
 public:
  HostedStore() = default;
  HostedStore(const HostedStore&) = delete;
  HostedStore& operator=(const HostedStore&) = delete;
  ~HostedStore() {
    tandem_store_destroy(store_);
    tandem_context_destroy(ctx_);
  }
  // Serves at bind_addr:port (0: a free one) with the job's secret; the port, or 0 after saying why not.
  int serve(const std::string& bind_addr, int port, const std::string& secret) {
    int32_t bound = 0;
    // The store's threads take none of the signals the launcher handles (they inherit this mask).
    sigset_t block, old;
    sigemptyset(&block);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&block, sig);
    ::pthread_sigmask(SIG_BLOCK, &block, &old);
    const bool ok = tandem_context_create(nullptr, &ctx_) == TANDEM_OK &&
                    tandem_store_serve(ctx_, bind_addr.c_str(), port, secret.c_str(), &store_) == TANDEM_OK &&
                    tandem_store_port(store_, &bound) == TANDEM_OK;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (!ok) {
      say(std::string("cannot serve the job's rendezvous store: ") + tandem_last_error_message());
      return 0;
    }
    return bound;
  }

 private:
  tandem_context_t* ctx_ = nullptr;
  tandem_store_t* store_ = nullptr;
};

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

// One word for sh: single-quoted, a ' inside as '\''.
std::string sh_quote(const std::string& s) { return "'" + replace_all(s, "'", "'\\''") + "'"; }

// What a rank placed by ssh or --host-exec runs (under `sh -c`). fd 3 keeps the launcher's pipe: an
// asynchronous command's stdin is /dev/null in a shell without job control, so the watcher takes it from 3.
std::string remote_script(const std::vector<std::string>& env, const std::vector<std::string>& command,
                          const std::string& cwd) {
  std::string s =
      "IFS= read -r TANDEM_SECRET || { echo 'tandem launch: no job secret on stdin' >&2; exit 97; }; "
      "export TANDEM_SECRET; exec 3<&0; ";
  if (!cwd.empty()) {
    s += "cd " + sh_quote(cwd) + " 2>/dev/null || echo \"tandem launch: $(hostname): no directory \"" +
         sh_quote(cwd) + "\"; running in $PWD\" >&2; ";
  }
  s += "env";
  for (const auto& e : env) s += " " + sh_quote(e);
  for (const auto& w : command) s += " " + sh_quote(w);
  s += " </dev/null 3<&- & p=$!; "
       "( cat >/dev/null; kill -TERM $p ) <&3 >/dev/null 2>&1 & w=$!; exec 3<&-; "
       "wait $p; rc=$?; kill $w 2>/dev/null; exit $rc";
  return s;
}

struct HostSlots {
  std::string name;
  int slots = 1;
};

// "h1:2,user@h2:4,[::1]:2,h3" (no count: 1 slot); nullopt with `why` set when malformed.
std::optional<std::vector<HostSlots>> parse_hosts(const std::string& spec, std::string& why) {
  std::vector<HostSlots> out;
  std::istringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    HostSlots h{item, 1};
    const size_t colon = item.rfind(':');
    const bool bracketed = !item.empty() && item[0] == '[';
    if (colon != std::string::npos && (!bracketed || item.rfind(']') < colon) &&
        (bracketed || item.find(':') == colon)) {
      const std::string count = item.substr(colon + 1);
      char* end = nullptr;
      const long n = std::strtol(count.c_str(), &end, 10);
      if (count.empty() || *end != '\0' || n < 1 || n > 4096) {
        why = "'" + item + "': the slot count after ':' must be a whole number from 1 to 4096";
        return std::nullopt;
      }
      h.name = item.substr(0, colon);
      h.slots = static_cast<int>(n);
    }
    if (h.name.empty() || h.name.find_first_of(" \t'\"\\") != std::string::npos) {
      why = "'" + item + "' is not a host name";
      return std::nullopt;
    }
    out.push_back(h);
  }
  if (out.empty()) {
    why = "no hosts given";
    return std::nullopt;
  }
  return out;
}

// The address rank 0 is reached at, from its --hosts entry: user@ and IPv6 brackets stripped.
std::string host_address(const std::string& name) {
  std::string a = name.substr(name.find('@') == std::string::npos ? 0 : name.find('@') + 1);
  if (a.size() > 2 && a.front() == '[' && a.back() == ']') a = a.substr(1, a.size() - 2);
  return a;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                  strsignal(WTERMSIG(status)) + ")";
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

// Why a bare program name was not found: it is looked up on PATH (this launcher's own folder is not searched).
std::string path_hint(const std::string& program, int exec_errno) {
  if (exec_errno != ENOENT || program.find('/') != std::string::npos) return "";
  std::string hint = "; it is looked up on PATH";
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    const std::string exe(self, static_cast<size_t>(n));
    const std::string dir = exe.substr(0, exe.rfind('/'));
    if (program == exe.substr(exe.rfind('/') + 1))  // `launch -- tandem ...` from a build tree
      return hint + " (this launcher is " + exe + ": give that path, or export PATH=\"" + dir + ":$PATH\")";
  }
  return hint + " (give its path, or put its folder on PATH)";
}

// ---- the ranks -----------------------------------------------------------------------------

struct Stream {
  int fd = -1;      // read end of the rank's pipe; -1 once closed
  int out_fd = 1;   // where prefixed lines go
  bool own_fd = false;  // out_fd is a log file of this rank's (closed with the stream)
  bool progress = false;  // rank 0's stderr under TANDEM_LAUNCH_PROGRESS: "\r" redraws a bar, drawn unprefixed
  std::string partial;
};

struct Rank {
  int index = 0;
  std::string host;   // --hosts: where it runs (empty: here)
  int local_rank = 0, local_world = 1;
  int stdin_fd = -1;  // remote ranks: the secret, then kept open as the lifeline
  pid_t pid = -1;   // also its process group id
  bool running = false;
  int status = 0;
  Stream out, err;
};

class Launcher {
 public:
  Launcher(LaunchOptions o, std::vector<HostSlots> hosts) : o_(std::move(o)), hosts_(std::move(hosts)) {}
  int run();

 private:
  bool spawn(Rank& r, const std::vector<std::string>& env, const std::vector<std::string>& remote_env);
  void pump(Rank& r, Stream& s);
  void emit(const Rank& r, Stream& s, const char* data, size_t n);
  void emit_bar(const Rank& r, Stream& s, const std::string& text, bool ended);
  void flush_partial(const Rank& r, Stream& s);
  void reap();
  void signal_all(int sig);
  void sweep_orphans();

  LaunchOptions o_;
  std::string secret_;
  std::vector<HostSlots> hosts_;  // --hosts, in rank order
  std::vector<Rank> ranks_;
  std::optional<int> first_failure_;       // exit code to return
  int forwarded_signal_ = 0;               // a signal we received and passed on
  std::optional<Clock::time_point> kill_at_;  // SIGKILL stragglers at this time
  std::vector<std::string> lost_;          // elastic: "rank i (how it ended)" for each rank that failed
  HostedStore store_;                      // the job's rendezvous store, when served here
  bool progress_ = false;                  // rank 0 draws its progress bar through us (run())
  bool elastic() const noexcept { return o_.min_ranks < o_.nprocs; }
};

bool Launcher::spawn(Rank& r, const std::vector<std::string>& env, const std::vector<std::string>& remote_env) {
  std::vector<std::string> argv;
  const bool remote = !r.host.empty() || !o_.host_exec.empty();
  char cwd_buf[4096];
  const std::string cwd = ::getcwd(cwd_buf, sizeof(cwd_buf)) != nullptr ? cwd_buf : "";
  if (!r.host.empty()) {
    argv = split_words(o_.ssh_cmd);
    argv.push_back(r.host);
    argv.push_back(remote_script(remote_env, o_.command, cwd));  // ssh hands it to the remote login shell
  } else if (!o_.host_exec.empty()) {
    for (const auto& w : split_words(o_.host_exec)) argv.push_back(replace_all(w, "{rank}", std::to_string(r.index)));
    for (const char* w : {"/bin/sh", "-c"}) argv.emplace_back(w);
    argv.push_back(remote_script(remote_env, o_.command, ""));
  } else {
    argv = o_.command;
  }
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  int out_pipe[2], err_pipe[2], exec_pipe[2], in_pipe[2] = {-1, -1};
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0 || ::pipe2(exec_pipe, O_CLOEXEC) != 0 ||
      (remote && ::pipe2(in_pipe, O_CLOEXEC) != 0)) {
    say("cannot create pipes: " + std::string(std::strerror(errno)));
    return false;
  }
  const int null_fd = remote ? in_pipe[0] : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    say("fork failed: " + std::string(std::strerror(errno)));
    return false;
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    ::setpgid(0, 0);
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher was SIGKILLed: do not outlive it
    if (::getppid() != parent) ::_exit(127);
#endif
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    environ = cenv.data();
    ::execvp(cargv[0], cargv.data());
    const int e = errno;
    (void)!::write(exec_pipe[1], &e, sizeof(e));
    ::_exit(127);
  }
  (void)parent;
  ::setpgid(pid, pid);  // also here, so the group exists before we might signal it
  if (null_fd >= 0) ::close(null_fd);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ::close(exec_pipe[1]);
  if (remote) {
    // The secret travels on stdin; the pipe then stays open until the rank is reaped (its lifeline).
    const std::string line = secret_ + "\n";
    r.stdin_fd = in_pipe[1];
    if (!write_all(r.stdin_fd, line.data(), line.size()))
      say("rank " + std::to_string(r.index) + ": cannot send the job secret");
  }
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  r.pid = pid;
  r.running = true;
  r.out.fd = out_pipe[0];
  r.out.out_fd = 1;
  r.err.fd = err_pipe[0];
  r.err.out_fd = 2;
  r.err.progress = progress_ && r.index == 0;
  if (!o_.log_dir.empty()) {
    for (auto [stream, ext] : {std::pair<Stream*, const char*>{&r.out, "out"}, {&r.err, "err"}}) {
      const std::string path = o_.log_dir + "/rank-" + std::to_string(r.index) + "." + ext;
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) {
        say("cannot write " + path + ": " + std::strerror(errno));
      } else {
        stream->out_fd = fd;
        stream->own_fd = true;
      }
    }
  }
  if (n == sizeof(exec_errno)) {
    say("rank " + std::to_string(r.index) + ": cannot run '" + argv[0] + "': " + std::strerror(exec_errno) +
        path_hint(argv[0], exec_errno));
  }
  return true;
}

void Launcher::emit(const Rank& r, Stream& s, const char* data, size_t n) {
  // One write per line: lines of different ranks never interleave.
  std::string line;
  int fd = s.out_fd;
  if (s.own_fd) {
    line.assign(data, n);  // a rank's own log file: its lines as it wrote them
  } else if (o_.json && &s == &r.out && n >= 2 && data[0] == '{' && data[n - 1] == '}') {
    // a JSON object: the same object with the rank first, so stdout stays one JSON object per line
    line = "{\"rank\":" + std::to_string(r.index) + (n == 2 ? "" : ",");
    line.append(data + 1, n - 1);
  } else {
    if (o_.json) fd = 2;  // anything else keeps out of the JSON stream
    line = "[rank " + std::to_string(r.index) + "] ";
    line.append(data, n);
  }
  line += '\n';
  if (s.own_fd) {
    write_all(fd, line.data(), line.size());
  } else {
    write_line(fd, line);
  }
}

// `text` holds "\r"-separated redraws of rank 0's bar (anything before the first is an ordinary line): the last one
// is drawn in place; `ended` (its newline, or the stream's end) leaves it on the terminal as a line of its own.
void Launcher::emit_bar(const Rank& r, Stream& s, const std::string& text, bool ended) {
  const size_t first = text.find('\r');
  if (first > 0) emit(r, s, text.data(), std::min(first, text.size()));
  if (first == std::string::npos) return;
  std::string bar = text.substr(text.rfind('\r') + 1);
  if (bar.empty() && !ended) return;      // the next redraw has not arrived yet
  if (bar.empty()) bar = g_bar;           // "...\r\n": the bar as it was drawn
  const std::string out = bar == g_bar ? (ended ? "\n" : "") : kClearLine + bar + (ended ? "\n" : "");
  write_all(2, out.data(), out.size());
  g_bar = ended ? std::string() : bar;
}

// The stream's last bytes, without their newline, at its end.
void Launcher::flush_partial(const Rank& r, Stream& s) {
  if (s.progress && s.partial.find('\r') != std::string::npos) {
    emit_bar(r, s, s.partial, true);
  } else if (!s.partial.empty()) {
    emit(r, s, s.partial.data(), s.partial.size());
  }
  if (s.progress && !g_bar.empty()) {  // the bar was drawn and its rank stopped without ending the line
    write_all(2, "\n", 1);
    g_bar.clear();
  }
  s.partial.clear();
}

void Launcher::pump(Rank& r, Stream& s) {
  char buf[65536];
  ssize_t n = ::read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    flush_partial(r, s);
    ::close(s.fd);
    s.fd = -1;
    if (s.own_fd) ::close(s.out_fd);
    s.own_fd = false;
    return;
  }
  s.partial.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    if (s.progress && std::memchr(s.partial.data() + start, '\r', nl - start) != nullptr) {
      emit_bar(r, s, s.partial.substr(start, nl - start), true);
    } else {
      emit(r, s, s.partial.data() + start, nl - start);
    }
  }
  s.partial.erase(0, start);
  if (s.progress && s.partial.find('\r') != std::string::npos) {  // a bar being redrawn: draw its latest state
    emit_bar(r, s, s.partial, false);
    s.partial.erase(0, s.partial.rfind('\r'));
  }
  while (s.partial.size() > kMaxLineBytes) {
    emit(r, s, s.partial.data(), kMaxLineBytes);
    s.partial.erase(0, kMaxLineBytes);
  }
}

void Launcher::signal_all(int sig) {
  for (auto& r : ranks_) {
    if (r.running) ::kill(-r.pid, sig);  // the group: the rank and whatever it started
  }
}

void Launcher::reap() {
  for (auto& r : ranks_) {
    if (!r.running) continue;
    siginfo_t info{};
    // Look without reaping: while the leader is a zombie its group id cannot be reused, so killing
    // the group (leftover children of a finished rank) cannot hit an unrelated process.
    if (::waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) {
      continue;
    }
    ::kill(-r.pid, SIGKILL);
    ::waitpid(r.pid, &r.status, 0);
    r.running = false;
    if (r.stdin_fd >= 0) ::close(r.stdin_fd);
    r.stdin_fd = -1;
    if (exit_code_of(r.status) != 0 && forwarded_signal_ == 0 && elastic()) {
      if (!first_failure_) first_failure_ = exit_code_of(r.status);
      lost_.push_back("rank " + std::to_string(r.index) + " (" + describe_status(r.status) + ")");
      int running = 0;
      for (const auto& q : ranks_) running += q.running ? 1 : 0;
      say("rank " + std::to_string(r.index) + " " + describe_status(r.status) + "; elastic job (--min-ranks " +
          std::to_string(o_.min_ranks) + "): the other " + std::to_string(running) + " running rank(s) go on");
    } else if (exit_code_of(r.status) != 0 && !first_failure_ && forwarded_signal_ == 0) {
      first_failure_ = exit_code_of(r.status);
      bool others = false;
      for (const auto& q : ranks_) others = others || q.running;
      say("rank " + std::to_string(r.index) + " " + describe_status(r.status) +
          (others ? "; stopping the other ranks" : ""));
      if (others) {
        signal_all(SIGTERM);
        kill_at_ = Clock::now() + std::chrono::milliseconds(o_.grace_ms);
      }
    }
  }
  // Orphans re-parented to us (we are a subreaper): reap them so none stays a zombie.
  for (;;) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) break;
    bool is_rank = false;
    for (const auto& r : ranks_) is_rank = is_rank || (r.running && r.pid == info.si_pid);
    if (is_rank) break;  // handled by the loop above on the next pass
    ::waitpid(info.si_pid, nullptr, 0);
  }
}

void Launcher::sweep_orphans() {
#ifdef __linux__
  // Descendants that left their rank's process group (setsid, double fork) were re-parented to us.
  for (int round = 0; round < 10; ++round) {
    std::ifstream f("/proc/self/task/" + std::to_string(::getpid()) + "/children");
    std::vector<pid_t> kids;
    for (long p; f >> p;) kids.push_back(static_cast<pid_t>(p));
    if (kids.empty()) return;
    for (pid_t p : kids) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  }
#endif
}

int Launcher::run() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    say("cannot create a pipe: " + std::string(std::strerror(errno)));
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
#ifdef __linux__
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif

  // A joining launch proves the running job's secret (from --secret-file, else TANDEM_SECRET); a new job draws one.
  std::optional<std::string> secret;
  if (o_.join) {
    secret = read_secret_file(o_.secret_file);
    if (!secret) return 2;
  } else {
    secret = random_secret();
    if (!secret) {
      say("cannot read 32 random bytes from /dev/urandom for the job secret");
      return 1;
    }
    if (!o_.secret_file.empty() && !write_secret_file(o_.secret_file, *secret)) return 1;
  }
  secret_ = *secret;
  const bool loopback = is_loopback(o_.master_addr);
  // A new job's store is served here when the ranks reach this machine at --master-addr (header comment).
  const bool host_store = !o_.join && (loopback || is_local_address(o_.master_addr));
  int port = o_.port;
  if (host_store) {
    std::string bind = loopback ? (o_.master_addr == "localhost" ? "127.0.0.1" : o_.master_addr) : "*";
    if (bind.size() > 2 && bind.front() == '[' && bind.back() == ']') bind = bind.substr(1, bind.size() - 2);
    port = store_.serve(bind, o_.port, *secret);
    if (port == 0) return 1;
  } else if (port == 0) {
    port = pick_free_port(loopback);
  }
  // torchrun's MASTER_PORT: where such a program's rank 0 may serve its own rendezvous, so not the store's port.
  const int torch_port = host_store ? pick_free_port(loopback) : port;
  if (port == 0 || torch_port == 0) {
    say("cannot find a free TCP port; give one with --port");
    return 1;
  }
  // Rank 0's progress bar (tandem train's, drawn when its stderr is a terminal) reaches this terminal through its pipe
  // when told TANDEM_LAUNCH_PROGRESS=1; not into --log-dir files, nor for ranks joining a job already drawing one, nor
  // under --json (machine-read output: nothing is drawn).
  progress_ = ::isatty(2) != 0 && o_.log_dir.empty() && !o_.join && !o_.json;
  // Children get our environment with the job's variables replaced.
  std::map<std::string, std::string> common = {
      {"TANDEM_WORLD_SIZE", std::to_string(o_.nprocs)},
      {"TANDEM_MASTER_ADDR", o_.master_addr},
      {"TANDEM_MASTER_PORT", std::to_string(port)},
      {"TANDEM_SECRET", *secret},
  };
  if (host_store) common["TANDEM_STORE"] = o_.master_addr + ":" + std::to_string(port);
  // torchrun's names too, so scripts written for it (PyTorch's env:// rendezvous) run unchanged
  common["WORLD_SIZE"] = common["TANDEM_WORLD_SIZE"];
  common["MASTER_ADDR"] = o_.master_addr;
  common["MASTER_PORT"] = std::to_string(torch_port);
  if (!o_.transport.empty()) common["TANDEM_TRANSPORT"] = o_.transport;
  if (o_.timeout_ms > 0) common["TANDEM_TIMEOUT_MS"] = std::to_string(o_.timeout_ms);
  // tandem train's default --min-ranks. Given at -n (every rank must finish) the ranks get it too: an elastic trainer
  // left with fewer then writes its checkpoint and stops naming the lost ranks (it went on with min 1 while this
  // launcher stopped it, and was killed after --grace-ms, its checkpoint not written).
  if (elastic() || (o_.min_ranks_given && !o_.join)) common["TANDEM_MIN_RANKS"] = std::to_string(o_.min_ranks);
  // and --max-ranks, the job's bound (-n by default): without it an elastic ddp, pipeline or hybrid job admitted every
  // joiner (`launch -n 2 --max-ranks 2` grew to 3 ranks). Joiners take the running job's bound, not their own -n.
  if (!o_.join) common["TANDEM_MAX_RANKS"] = std::to_string(o_.max_ranks);
  if (o_.join) common["TANDEM_JOIN"] = "1";  // TANDEM_RANK / TANDEM_WORLD_SIZE then number the joiners
  // --env NAME=VALUE reaches the local ranks as well (it reached remote ones only: a local rank saw the launcher's
  // own NAME, or none); the job's variables above win over it.
  for (const auto& n : o_.env_names)
    if (const size_t eq = n.find('='); eq != std::string::npos) common.emplace(n.substr(0, eq), n.substr(eq + 1));
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string s(*e);
    const std::string k = s.substr(0, s.find('='));
    if (common.count(k) == 0 && k != "TANDEM_RANK" && k != "TANDEM_LOCAL_RANK" && k != "RANK" && k != "LOCAL_RANK" &&
        k != "TANDEM_LOCAL_WORLD_SIZE" && k != "LOCAL_WORLD_SIZE" && k != "TANDEM_LAUNCH_PROGRESS")
      base_env.push_back(s);
  }
  for (const auto& [k, v] : common) base_env.push_back(k + "=" + v);
  // Remote ranks: the job's variables, this environment's other TANDEM_* settings and --env, spelled out.
  std::map<std::string, std::string> remote_common = common;
  remote_common.erase("TANDEM_SECRET");
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string s(*e);
    const std::string k = s.substr(0, s.find('='));
    if (k.rfind("TANDEM_", 0) == 0 && k != "TANDEM_SECRET" && k != "TANDEM_RANK" && k != "TANDEM_LOCAL_RANK" &&
        k != "TANDEM_LOCAL_WORLD_SIZE" && k != "TANDEM_LAUNCH_PROGRESS" && remote_common.count(k) == 0) {
      remote_common[k] = s.substr(k.size() + 1);
    }
  }
  for (const auto& n : o_.env_names) {
    const size_t eq = n.find('=');
    const char* v = eq == std::string::npos ? std::getenv(n.c_str()) : nullptr;
    if (eq != std::string::npos) {
      remote_common[n.substr(0, eq)] = n.substr(eq + 1);
    } else if (v != nullptr) {
      remote_common[n] = v;
    }
  }
  // --hosts: ranks fill each host's slots in order.
  if (!hosts_.empty()) {
    int i = 0;
    ranks_.resize(static_cast<size_t>(o_.nprocs));
    for (const auto& h : hosts_) {
      for (int k = 0; k < h.slots; ++k, ++i) {
        ranks_[i].host = h.name;
        ranks_[i].local_rank = k;
        ranks_[i].local_world = h.slots;
      }
    }
  }

  ranks_.resize(static_cast<size_t>(o_.nprocs));
  for (int i = 0; i < o_.nprocs; ++i) {
    Rank& r = ranks_[i];
    r.index = i;
    if (r.host.empty() && o_.host_exec.empty()) {
      r.local_rank = i;
      r.local_world = o_.nprocs;
    }
    auto env = base_env;
    const std::vector<std::string> rank_vars = {
        "TANDEM_RANK=" + std::to_string(i), "RANK=" + std::to_string(i),
        "TANDEM_LOCAL_RANK=" + std::to_string(r.local_rank), "LOCAL_RANK=" + std::to_string(r.local_rank),
        "TANDEM_LOCAL_WORLD_SIZE=" + std::to_string(r.local_world),
        "LOCAL_WORLD_SIZE=" + std::to_string(r.local_world)};
    env.insert(env.end(), rank_vars.begin(), rank_vars.end());
    std::vector<std::string> remote_env;
    for (const auto& [k, v] : remote_common) remote_env.push_back(k + "=" + v);
    remote_env.insert(remote_env.end(), rank_vars.begin(), rank_vars.end());
    if (progress_ && i == 0) {  // tandem train draws its bar on a pipe only when told so
      env.emplace_back("TANDEM_LAUNCH_PROGRESS=1");
      remote_env.emplace_back("TANDEM_LAUNCH_PROGRESS=1");
    }
    if (!spawn(r, env, remote_env)) {
      first_failure_ = 1;
      signal_all(SIGTERM);
      kill_at_ = Clock::now() + std::chrono::milliseconds(o_.grace_ms);
      ranks_.resize(static_cast<size_t>(i));
      break;
    }
  }

  std::optional<Clock::time_point> drain_until;  // after the last rank: how long to wait for output
  for (;;) {
    reap();
    bool any_running = false;
    for (const auto& r : ranks_) any_running = any_running || r.running;
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, Stream*>> owners;
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
    for (auto& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&r, s);
      }
    }
    const auto now = Clock::now();
    if (!any_running) {
      if (fds.size() == 1) break;
      // Every rank is gone but something still holds a pipe: give it a moment, then clean up.
      if (!drain_until) drain_until = now + std::chrono::milliseconds(500);
      if (now >= *drain_until) {
        sweep_orphans();
        for (auto& [r, s] : owners) {
          if (s == nullptr) continue;
          flush_partial(*r, *s);
          ::close(s->fd);
          s->fd = -1;
        }
        break;
      }
    }
    if (kill_at_ && now >= *kill_at_) {
      for (const auto& r : ranks_) {
        if (r.running) say("rank " + std::to_string(r.index) + " did not stop within " + std::to_string(o_.grace_ms) +
                           " ms; killing it");
      }
      signal_all(SIGKILL);
      kill_at_.reset();
    }
    int wait_ms = 1000;
    auto until = [&](Clock::time_point t) {
      wait_ms = std::min<int>(wait_ms, static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1)));
    };
    if (kill_at_) until(*kill_at_);
    if (drain_until) until(*drain_until);
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      if (i == 0) {
        unsigned char sigs[64];
        ssize_t n = ::read(g_signal_pipe[0], sigs, sizeof(sigs));
        for (ssize_t k = 0; k < n; ++k) {
          const int sig = sigs[k];
          if (sig == SIGCHLD) continue;  // reap() runs every pass
          if (forwarded_signal_ != 0 && sig == SIGINT) {
            say("second interrupt: killing all ranks");
            signal_all(SIGKILL);
            continue;
          }
          if (forwarded_signal_ == 0) {
            forwarded_signal_ = sig;
            signal_all(sig);
            kill_at_ = Clock::now() + std::chrono::milliseconds(o_.grace_ms);
          }
        }
        continue;
      }
      pump(*owners[i].first, *owners[i].second);
    }
  }
  sweep_orphans();
  if (elastic() && forwarded_signal_ == 0 && !lost_.empty()) {
    int finished = 0;
    for (const auto& r : ranks_) finished += !r.running && exit_code_of(r.status) == 0 ? 1 : 0;
    std::string lost;
    for (const auto& l : lost_) lost += (lost.empty() ? "" : ", ") + l;
    const bool ok = finished >= o_.min_ranks;
    say("elastic job " + std::string(ok ? "finished" : "failed") + " with " + std::to_string(finished) + " of " +
        std::to_string(o_.nprocs) + " ranks (--min-ranks " + std::to_string(o_.min_ranks) + "); lost: " + lost);
    if (ok) return 0;
  }
  if (first_failure_) return *first_failure_;
  if (forwarded_signal_ != 0) return 128 + forwarded_signal_;
  return 0;
}

tandem::cli::Registration reg{
    "launch",
    "start the ranks of one job: N local ones (tandem launch -n N -- PROGRAM ARGS...) or on other machines over ssh "
    "(--hosts h1:2,h2:2)",
    [](CLI::App& sub) -> tandem::cli::Runner {
      auto o = std::make_shared<LaunchOptions>();
      sub.add_option("-n,--nprocs", o->nprocs, "number of ranks (with --hosts: the slots' total, the default)")
          ->check(CLI::Range(1, 4096));
      sub.add_option("--hosts", o->hosts,
                     "ranks on other machines over ssh: HOST[:SLOTS],... (e.g. h1:2,h2:2), filled in order; rank, "
                     "world, address and port go on the remote command line, the secret on stdin");
      sub.add_option("--ssh-cmd", o->ssh_cmd,
                     "how to reach a host: run as SSH_CMD HOST SCRIPT (default 'ssh -o BatchMode=yes'; e.g. "
                     "'ssh -i key -p 2222')");
      sub.add_option("--env", o->env_names, "NAME or NAME=VALUE: pass this variable to remote ranks too (repeatable; "
                     "TANDEM_* settings always go; NAME=VALUE sets it for local ranks as well)")
          ->allow_extra_args(false)  // one value per --env: `--env A=1 -- sh -c ...` took `sh` as a second one
          ->check(CLI::Validator(
              [](std::string& v) -> std::string {
                return v.empty() || v[0] == '=' ? "expected NAME or NAME=VALUE, got '" + v + "'" : std::string();
              },
              "NAME[=VALUE]"));
      sub.add_option("--transport", o->transport, "TANDEM_TRANSPORT for every rank (inproc, tcp, zmq, ucx, auto)");
      sub.add_option("--timeout-ms", o->timeout_ms, "TANDEM_TIMEOUT_MS: deadline of every blocking wait")
          ->check(tandem::cli::kPositive);
      sub.add_option("--port", o->port, "rendezvous port; a new job's launcher serves the store there (default: a "
                     "free one)")->check(CLI::Range(0, 65535));
      sub.add_option("--master-addr", o->master_addr,
                     "rank 0's address as the other ranks reach it (default 127.0.0.1; needed with --host-exec)");
      sub.add_option("--host-exec", o->host_exec,
                     "wrap each rank's command, '{rank}' replaced by its index "
                     "(e.g. 'tools/emu-cluster exec {rank} --')");
      sub.add_option("--grace-ms", o->grace_ms, "after SIGTERM, how long ranks get before SIGKILL (default 3000)")
          ->check(tandem::cli::kNonNegative);
      sub.add_flag("--json", o->json, "stdout carries only the ranks' JSON lines, each with a \"rank\" field; other "
                   "output goes to stderr");
      sub.add_option("--log-dir", o->log_dir, "write each rank's stdout and stderr to DIR/rank-<i>.out/.err");
      sub.add_option("--min-ranks", o->min_ranks,
                     "elastic job: when a rank dies the others go on (tandem train --elastic, or a strategy that absorbs "
                     "a lost worker); success when at least this many ranks finish (default -n: not elastic, the "
                     "first failure stops every rank). The ranks get TANDEM_MIN_RANKS, tandem train's default "
                     "--min-ranks (given at -n too: a loss then stops every elastic rank with its checkpoint)")
          ->check(CLI::Range(1, 4096));
      sub.add_option("--max-ranks", o->max_ranks, "upper bound of the job's ranks, joiners included (default -n; "
                     "must be >= -n): more are refused, naming it. The ranks get TANDEM_MAX_RANKS, tandem train's "
                     "default --max-ranks (a parameter-server job checks for joiners only when it is above -n)")
          ->check(CLI::Range(1, 4096));
      sub.add_flag("--join", o->join, "start -n ranks that join the running elastic job at --port (tandem train "
                   "--strategy ddp, pipeline, hybrid, ps, ps-async or ssp --elastic, with the job's other options): "
                   "they get TANDEM_JOIN=1 and are admitted at its next step boundary, up to its --max-ranks (a "
                   "pipeline or hybrid grid admits whole rows of pp ranks, the others wait as spares; a "
                   "parameter-server job admits them as workers)");
      sub.add_option("--secret-file", o->secret_file, "write the job's secret to this file (mode 0600), for "
                     "`tandem launch --join`; with --join: read it from there (default: TANDEM_SECRET)");
      // After `--` every word is the rank's command, option-looking ones included.
      sub.add_option("command", o->command, "PROGRAM ARGS... (after --)")->required();
      return [o] {
        std::vector<HostSlots> hosts;
        if (!o->hosts.empty()) {
          std::string why;
          const auto parsed = parse_hosts(o->hosts, why);
          if (!parsed) {
            say("--hosts " + o->hosts + ": " + why);
            return 2;
          }
          hosts = *parsed;
          int total = 0;
          for (const auto& h : hosts) total += h.slots;
          if (o->nprocs != 0 && o->nprocs != total) {
            say("-n " + std::to_string(o->nprocs) + " does not match --hosts " + o->hosts + " (" +
                std::to_string(total) + " slots)");
            return 2;
          }
          if (!o->host_exec.empty()) {
            say("give --hosts (ranks over ssh) or --host-exec (a wrapper per rank), not both");
            return 2;
          }
          o->nprocs = total;
          if (o->master_addr.empty()) o->master_addr = host_address(hosts.front().name);
        }
        if (o->nprocs == 0) {
          say("how many ranks? give -n N (or --hosts HOST:SLOTS,...)");
          return 2;
        }
        if (!o->host_exec.empty() && o->master_addr.empty()) {
          say("--host-exec places ranks on other hosts: give --master-addr (rank 0's host address, e.g. "
              "$(tools/emu-cluster addr 0))");
          return 2;
        }
        if (o->master_addr.empty()) o->master_addr = "127.0.0.1";
        o->min_ranks_given = o->min_ranks > 0;
        if (o->min_ranks == 0) o->min_ranks = o->nprocs;
        if (o->max_ranks == 0) o->max_ranks = o->nprocs;
        if (o->min_ranks > o->nprocs || o->nprocs > o->max_ranks) {
          say("--min-ranks " + std::to_string(o->min_ranks) + " <= -n " + std::to_string(o->nprocs) + " <= --max-ranks " +
              std::to_string(o->max_ranks) + " does not hold (the job starts with -n ranks; more join later with "
              "tandem launch --join, up to --max-ranks)");
          return 2;
        }
        if (o->join && o->port == 0) {
          say("--join: give --port, the running job's rendezvous port (and --master-addr unless it is this host)");
          return 2;
        }
        if (!o->log_dir.empty() && ::access(o->log_dir.c_str(), W_OK) != 0) {
          say("--log-dir " + o->log_dir + ": not a writable directory (" + std::strerror(errno) + ")");
          return 2;
        }
        // a writable file passed the check above; the ranks' output was then lost with exit 0
        if (struct stat st{}; !o->log_dir.empty() && (::stat(o->log_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
          say("--log-dir " + o->log_dir + ": not a directory");
          return 2;
        }
        return Launcher(*o, std::move(hosts)).run();
      };
    }};

}  // namespace
