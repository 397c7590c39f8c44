#include "engine/core/settings.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <mutex>

#include "engine/core/error.hpp"

namespace tandem::settings {
namespace {

using K = Kind;
constexpr int64_t kNoLimit = INT64_MAX;

// Keep in step with the table in api/include/tandem/tandem.h (tests/core/settings_test.cpp checks
// both against the tree's readers).
constexpr Variable kVariables[] = {
    // Launcher (per-job bootstrap inputs; `tandem launch` sets them; torchrun, Open MPI and Slurm
    // names are accepted too, see engine/comm/bootstrap.hpp).
    {"TANDEM_RANK", K::kInteger, 0, kNoLimit, "", "0", "this process's rank (with TANDEM_WORLD_SIZE)"},
    {"TANDEM_WORLD_SIZE", K::kInteger, 1, kNoLimit, "", "1", "number of ranks in the job"},
    {"TANDEM_LOCAL_RANK", K::kInteger, 0, kNoLimit, "", "derived", "rank among the job's ranks on this host"},
    {"TANDEM_LOCAL_WORLD_SIZE", K::kInteger, 1, kNoLimit, "", "derived", "number of the job's ranks on this host"},
    {"TANDEM_MASTER_ADDR", K::kText, 0, 0, "", "127.0.0.1", "rendezvous host (rank 0 serves it)"},
    {"TANDEM_MASTER_PORT", K::kInteger, 1, 65535, "", "derived", "rendezvous port"},
    {"TANDEM_SECRET", K::kText, 0, 0, "", "derived from the job (logged)", "the job's shared rendezvous secret"},
    {"TANDEM_STORE", K::kText, 0, 0, "", "unset (rank 0 serves)",
     "HOST:PORT of the rendezvous store another process serves (tandem launch sets it)"},
    // Communicator.
    {"TANDEM_TRANSPORT", K::kText, 0, 0, "", "auto", "transport: auto, inproc, tcp, zmq, ucx, rdma"},
    {"TANDEM_TIMEOUT_MS", K::kInteger, 1, kNoLimit, "", "60000", "deadline of every blocking operation"},
    {"TANDEM_ALLREDUCE_ALGO", K::kChoice, 0, 0,
     "auto|ring|hd|rhd|halving-doubling|halving_doubling|tree|hier|hierarchical|direct|det|deterministic", "auto",
     "all-reduce algorithm"},
    {"TANDEM_DETERMINISTIC", K::kChoice, 0, 0, "0|1", "0", "1: reduce in a fixed order (bit-identical runs)"},
    {"TANDEM_CHUNK_BYTES", K::kInteger, 1, kNoLimit, "", "per algorithm", "pipelining chunk of large collectives"},
    // Transports.
    {"TANDEM_IFACE_ADDR", K::kText, 0, 0, "", "the bind host", "address tcp/zmq listen on"},
    {"TANDEM_TCP_LOCAL", K::kChoice, 0, 0, "shm|unix|tcp", "shm",
     "tcp: same-host ranks: shared memory, AF_UNIX streams, or TCP"},
    {"TANDEM_TCP_SPIN_US", K::kInteger, 0, 1000000, "", "100", "tcp: microseconds a waiter polls before blocking"},
    {"TANDEM_TCP_MAX_UNEXPECTED", K::kInteger, 0, int64_t{1} << 40, "", "4 GiB",
     "tcp: bytes one unexpected message may allocate"},
    {"TANDEM_ZMQ_LOCAL", K::kChoice, 0, 0, "ipc|tcp", "ipc", "zmq: tcp: same-host ranks use TCP, not ipc"},
    {"TANDEM_ZMQ_SPIN_US", K::kInteger, 0, 1000000, "", "100", "zmq: microseconds a waiter polls before blocking"},
    {"TANDEM_ZMQ_IO_THREADS", K::kInteger, 1, 64, "", "1", "zmq: ZeroMQ I/O threads per transport"},
    {"TANDEM_ZMQ_HEAP_PAD", K::kInteger, 0, int64_t{1} << 30, "", "0 (malloc untouched)",
     "zmq: opt-in; bytes of glibc M_TOP_PAD to set, process-wide, once"},
    {"TANDEM_UCX_BUSY_US", K::kInteger, 0, 60000000, "", "2000", "ucx: microseconds of busy polling"},
    {"TANDEM_UCX_ERR_MODE", K::kChoice, 0, 0, "peer|auto", "auto", "ucx: peer: peer error mode on every endpoint"},
    // Compute, data, training.
    {"TANDEM_CPU_WINOGRAD", K::kChoice, 0, 0, "auto|on|off|1|0", "auto",
     "cpu: 3x3 stride-1 convolutions: auto (oneDNN's Winograd on AVX-512, Tandem's on AVX2, 32+ channels), "
     "on (Tandem's everywhere), off (direct); 1 and 0 mean auto and off"},
    {"TANDEM_CPU_MAX_ISA", K::kChoice, 0, 0, "all|avx512|avx2|sse41", "all",
     "cpu: the highest vector ISA Tandem's kernels and oneDNN may use (process-wide for oneDNN)"},
    {"TANDEM_CUDA_ALLOW_TF32", K::kChoice, 0, 0, "0|1", "0", "cuda: 1 allows TF32 tensor cores"},
    {"TANDEM_CPU_MATH", K::kChoice, 0, 0, "f32|fp16", "f32",
     "cpu, reference: fp16 emulates the cuda backend's fp16 math (operands rounded to half; slower, not faster)"},
    {"TANDEM_CUDA_MATH", K::kChoice, 0, 0, "f32|bf16|fp16", "f32",
     "cuda: bf16 or fp16 runs convolutions and GEMMs on 16-bit tensor cores (f32 tensors, f32 accumulation)"},
    {"TANDEM_HALF_GROUPED_CONV", K::kChoice, 0, 0, "0|1", "0",
     "16-bit math (cuda bf16/fp16, cpu fp16 emulation): 1 runs grouped (depthwise) convolutions in it too"},
    {"TANDEM_DEVICE_COLLECTIVES", K::kChoice, 0, 0, "auto|nccl|staged", "auto",
     "how collectives move device memory: NCCL, or copied through the host (see tandem_comm_allreduce_ex)"},
    {"TANDEM_DATA_DIR", K::kText, 0, 0, "", "unset", "extra dataset folder (DIR/fashion-mnist), tried first"},
    {"TANDEM_MEMORY_GUARD", K::kChoice, 0, 0, "0|1", "1", "0: skip the out-of-memory check before training"},
    {"TANDEM_MEMORY_LIMIT_BYTES", K::kInteger, 1, kNoLimit, "", "cgroup / MemAvailable",
     "memory limit the guard checks against"},
    {"TANDEM_TEST_NONFINITE", K::kText, 0, 0, "", "unset",
     "test hook: rank:step, that world rank's gradients get a NaN at that step (loss scaling's agreement)"},
    {"TANDEM_TEST_FEDAVG_STALL", K::kText, 0, 0, "", "unset",
     "test hook: rank:round:seconds, that rank sleeps before it reports that fedavg round"},
    {"TANDEM_TEST_REFORM_LEAVE", K::kText, 0, 0, "", "unset",
     "test hook: rank:point, that world rank leaves the job at that point (agreed|voting|voted|committed|restoring) "
     "of a parameter-server re-form, between a replica's header and payload (replicating), or of an admission of "
     "workers (growing|grow-voted|grow-committed; split: that rank's split of the grown world fails after the others' "
     "completed)"},
    {"TANDEM_TEST_SAVE_FAULT", K::kText, 0, 0, "", "unset",
     "test hook: rank:save:what, that world rank leaves the job (what = leave) or stalls that many seconds at the "
     "start of its save-th checkpoint save of a parallel job"},
    {"TANDEM_TEST_UCX_NO_COPY", K::kChoice, 0, 0, "0|1", "0",
     "test hook: 1: ucx finds no memory for the copy a cancelled send goes on from (it cuts the peer off)"},
    {"TANDEM_TEST_TCP_NO_COPY", K::kChoice, 0, 0, "0|1", "0",
     "test hook: 1: tcp finds no memory for the unwritten rest of a cancelled send (it gives the connection up)"},
    {"TANDEM_TEST_CLOSINGS_BEHIND", K::kInteger, 0, kNoLimit, "", "unset",
     "test hook: world rank R reports one closing collective fewer than it completed when the survivors of a loss "
     "compare them (a mix the re-form cannot reconcile)"},
    // Logging.
    {"TANDEM_LOG_LEVEL", K::kChoice, 0, 0, "trace|debug|info|warn|error|off", "warn", "log level"},
    // Calibration (set by tools/emu-cluster).
    {"TANDEM_EMU_NAME", K::kText, 0, 0, "", "unset", "emulated cluster named in calibration profiles"},
    {"TANDEM_EMU_HOST", K::kText, 0, 0, "", "unset", "emulated host named in calibration profiles"},
    // The `tandem` CLI only.
    {"TANDEM_PREDICT_CLUSTER", K::kText, 0, 0, "", "unset", "cli: cluster for --predict"},
    {"TANDEM_PROFILE", K::kText, 0, 0, "", "unset", "cli: calibration profile for --predict"},
    {"TANDEM_MIN_RANKS", K::kInteger, 1, 1 << 20, "", "unset",
     "cli: tandem train's default --min-ranks (tandem launch --min-ranks sets it)"},
    {"TANDEM_MAX_RANKS", K::kInteger, 1, 1 << 20, "", "unset",
     "cli: tandem train's default --max-ranks (tandem launch --max-ranks above -n sets it)"},
    {"TANDEM_JOIN", K::kChoice, 0, 0, "0|1", "0",
     "cli: 1: tandem train joins a running elastic job (tandem launch --join sets it)"},
    {"TANDEM_JOIN_WAIT_MS", K::kInteger, 1, kNoLimit, "", "600000", "cli: how long a joiner waits for admission"},
    {"TANDEM_TEST_KILL_AFTER_REPORT", K::kInteger, 1, kNoLimit, "", "unset",
     "cli: test hook: the rank that reports epoch E (tandem train's rank 0) kills itself with SIGKILL right after "
     "printing it"},
    {"TANDEM_LAUNCH_PROGRESS", K::kChoice, 0, 0, "0|1", "0",
     "cli: 1: tandem train draws its progress bar on stderr, pipe or --json alike (tandem launch sets it for rank 0 "
     "on a terminal, tandem demo for its one-rank run)"},
};

size_t index_of(std::string_view name) {
  const Variable* v = find(name);
  TANDEM_CHECK(v != nullptr, Status::kInternal, "setting {} is not registered (engine/core/settings.cpp)", name);
  return static_cast<size_t>(v - kVariables);
}

bool is_choice(std::string_view choices, std::string_view value) {
  for (size_t at = 0; at <= choices.size();) {
    const size_t bar = std::min(choices.find('|', at), choices.size());
    if (choices.substr(at, bar - at) == value) return true;
    at = bar + 1;
  }
  return false;
}

std::mutex g_process_mu;
std::shared_ptr<const Settings>& process_slot() {
  static std::shared_ptr<const Settings> s = std::make_shared<const Settings>(Settings::from_environment());
  return s;
}
thread_local std::shared_ptr<const Settings> t_current;

}  // namespace

std::span<const Variable> variables() noexcept { return kVariables; }

const Variable* find(std::string_view name) noexcept {
  for (const auto& v : kVariables)
    if (v.name == name) return &v;
  return nullptr;
}

void check_value(const Variable& v, std::string_view value) {
  if (v.kind == Kind::kChoice) {
    TANDEM_REQUIRE(is_choice(v.choices, value), "{}='{}' must be one of {}", v.name, value, v.choices);
  } else if (v.kind == Kind::kInteger) {
    int64_t n = 0;
    const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    TANDEM_REQUIRE(ec == std::errc() && p == value.data() + value.size() && n >= v.min && n <= v.max,
                   "{}='{}' must be an integer in [{}, {}]", v.name, value, v.min, v.max);
  }
}

Settings Settings::from_environment() {
  Settings s;
  for (size_t i = 0; i < std::size(kVariables); ++i) {
    const std::string name(kVariables[i].name);
    if (const char* e = std::getenv(name.c_str()); e != nullptr && *e != '\0') s.values_[i] = e;
  }
  return s;
}

void Settings::set(std::string_view name, std::optional<std::string> value) {
  const Variable* v = find(name);
  TANDEM_REQUIRE(v != nullptr, "unknown setting '{}' (tandem.h lists the TANDEM_* settings)", name);
  if (value && value->empty()) value.reset();
  values_[static_cast<size_t>(v - kVariables)] = std::move(value);
}

void Settings::assign(std::string_view assignment) {
  const size_t eq = assignment.find('=');
  TANDEM_REQUIRE(eq != std::string_view::npos && eq > 0, "setting '{}' is not of the form NAME=VALUE", assignment);
  set(assignment.substr(0, eq), std::string(assignment.substr(eq + 1)));
}

void Settings::validate() const {
  for (size_t i = 0; i < values_.size(); ++i)
    if (values_[i]) check_value(kVariables[i], *values_[i]);
}

const char* Settings::get(std::string_view name) const {
  const auto& v = values_[index_of(name)];
  return v ? v->c_str() : nullptr;
}

std::optional<std::string> Settings::text(std::string_view name) const {
  const size_t i = index_of(name);
  if (values_[i]) check_value(kVariables[i], *values_[i]);
  return values_[i];
}

std::optional<int64_t> Settings::integer(std::string_view name) const {
  const size_t i = index_of(name);
  if (!values_[i]) return std::nullopt;
  check_value(kVariables[i], *values_[i]);
  return std::stoll(*values_[i]);
}

std::optional<bool> Settings::flag(std::string_view name) const {
  const size_t i = index_of(name);
  if (!values_[i]) return std::nullopt;
  check_value(kVariables[i], *values_[i]);
  return *values_[i] == "1";
}

std::shared_ptr<const Settings> process() {
  std::lock_guard lock(g_process_mu);
  return process_slot();
}

std::shared_ptr<const Settings> current() { return t_current ? t_current : process(); }

const char* lookup(const char* name) {
  if (find(name) == nullptr) return std::getenv(name);
  return t_current ? t_current->get(name) : process()->get(name);
}

Scope::Scope(std::shared_ptr<const Settings> s) : prev_(std::exchange(t_current, std::move(s))) {}
Scope::~Scope() { t_current = std::move(prev_); }

ScopedProcessValue::ScopedProcessValue(std::string_view name, const char* value) {
  std::lock_guard lock(g_process_mu);
  auto next = std::make_shared<Settings>(*process_slot());
  next->set(name, value != nullptr ? std::optional<std::string>(value) : std::nullopt);
  prev_ = std::exchange(process_slot(), std::move(next));
}

ScopedProcessValue::~ScopedProcessValue() {
  std::lock_guard lock(g_process_mu);
  process_slot() = std::move(prev_);
}

}  // namespace tandem::settings
