// `tandem bench allreduce`: an nccl-tests style allreduce benchmark over the C ABI.
//
// Outside a launched job it starts its own ranks (`tandem launch -n N -- tandem bench allreduce
// ... --result-file F`) and prints what rank 0 wrote to F, so the table is not interleaved with
// the launcher's per-rank prefixes. Inside a job every rank runs the loop; rank 0 reports.
//
// Per size: `warmup` untimed calls, then `iters` timed calls, each preceded by a barrier; an
// iteration's time is the slowest rank's, the reported time the median over iterations.
// algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests' definition for allreduce).
// Results are checked after the warm-up and after the last iteration; `wrong` counts mismatching
// elements summed over ranks.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "tandem/tandem.h"

namespace {

struct BenchOptions {
  std::string sizes = "4K,64K,1M,16M";
  std::string algo = "auto";
  std::string transport = "auto";
  std::string dtype = "f32";
  std::string op = "sum";
  int iters = 20;
  int warmup = 3;
  int nranks = 2;
  int64_t timeout_ms = 60000;
  bool json = false;
  std::string result_file;  // internal: where rank 0 writes its report when spawned by bench itself
};

// ---- Parsing --------------------------------------------------------------------------------

std::vector<size_t> parse_sizes(const std::string& text) {
  std::vector<size_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t pos = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(item, &pos);
    } catch (const std::exception&) {
      throw std::invalid_argument(fmt::format("--sizes: '{}' is not a size (e.g. 4096, 4K, 1M, 16MiB)", item));
    }
    std::string suffix = item.substr(pos);
    for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (suffix.size() > 1 && (suffix.back() == 'B')) suffix.pop_back();
    if (suffix.size() > 1 && suffix.back() == 'I') suffix.pop_back();
    unsigned long long mult = 1;
    if (suffix == "K") mult = 1ull << 10;
    else if (suffix == "M") mult = 1ull << 20;
    else if (suffix == "G") mult = 1ull << 30;
    else if (!suffix.empty() && suffix != "B")
      throw std::invalid_argument(fmt::format("--sizes: unknown unit in '{}' (use K, M or G)", item));
    if (v == 0 || v > (1ull << 40) / mult)
      throw std::invalid_argument(fmt::format("--sizes: '{}' is out of range (1 byte .. 1 TiB)", item));
    out.push_back(static_cast<size_t>(v * mult));
  }
  if (out.empty()) throw std::invalid_argument("--sizes: no sizes given");
  return out;
}

tandem_dtype_t parse_dtype(const std::string& s) {
  static const std::pair<const char*, tandem_dtype_t> kNames[] = {
      {"f32", TANDEM_F32}, {"float32", TANDEM_F32}, {"f64", TANDEM_F64}, {"float64", TANDEM_F64},
      {"f16", TANDEM_F16}, {"float16", TANDEM_F16}, {"bf16", TANDEM_BF16}, {"bfloat16", TANDEM_BF16},
      {"i32", TANDEM_I32}, {"int32", TANDEM_I32}, {"i64", TANDEM_I64}, {"int64", TANDEM_I64}};
  for (const auto& [n, v] : kNames)
    if (s == n) return v;
  throw std::invalid_argument(fmt::format("--dtype: unknown '{}' (f32, f64, f16, bf16, i32, i64)", s));
}

tandem_op_t parse_op(const std::string& s) {
  static const std::pair<const char*, tandem_op_t> kNames[] = {
      {"sum", TANDEM_SUM}, {"avg", TANDEM_AVG}, {"min", TANDEM_MIN}, {"max", TANDEM_MAX}, {"prod", TANDEM_PROD}};
  for (const auto& [n, v] : kNames)
    if (s == n) return v;
  throw std::invalid_argument(fmt::format("--op: unknown '{}' (sum, avg, min, max, prod)", s));
}

tandem_algo_t parse_algo(const std::string& s) {
  const std::string name = s == "halving_doubling" ? "hd"
                           : s == "hierarchical"   ? "hier"
                           : s == "deterministic"  ? "det"
                                                   : s;
  for (int a = TANDEM_ALGO_AUTO; a <= TANDEM_ALGO_DETERMINISTIC; ++a)
    if (name == tandem_algo_string(static_cast<tandem_algo_t>(a))) return static_cast<tandem_algo_t>(a);
  throw std::invalid_argument(fmt::format("--algo: unknown '{}' (auto, ring, hd, tree, hier, direct, det)", s));
}

const char* dtype_name(tandem_dtype_t t) {
  static const char* const kNames[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
  return kNames[static_cast<int>(t)];
}

// ---- Typed data (small integers, exact in every dtype) ----------------------------------------

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  if ((u & 0x7fffffffu) == 0) return static_cast<uint16_t>(sign);
  const uint32_t e = ((u >> 23) & 0xffu) - 127 + 15;
  return static_cast<uint16_t>(sign | (e << 10) | ((u >> 13) & 0x3ffu));
}
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  const uint32_t u = (e == 0 && m == 0) ? sign : (sign | ((e - 15 + 127) << 23) | (m << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void put(void* buf, tandem_dtype_t t, size_t i, double v) {
  const auto f = static_cast<float>(v);
  uint32_t u;
  switch (t) {
    case TANDEM_F32: static_cast<float*>(buf)[i] = f; break;
    case TANDEM_F64: static_cast<double*>(buf)[i] = v; break;
    case TANDEM_F16: static_cast<uint16_t*>(buf)[i] = f32_to_f16(f); break;
    case TANDEM_BF16: std::memcpy(&u, &f, 4); static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(u >> 16); break;
    case TANDEM_I32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case TANDEM_I64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    default: break;
  }
}

double get(const void* buf, tandem_dtype_t t, size_t i) {
  float f;
  uint32_t u;
  switch (t) {
    case TANDEM_F32: return static_cast<const float*>(buf)[i];
    case TANDEM_F64: return static_cast<const double*>(buf)[i];
    case TANDEM_F16: return f16_to_f32(static_cast<const uint16_t*>(buf)[i]);
    case TANDEM_BF16:
      u = static_cast<uint32_t>(static_cast<const uint16_t*>(buf)[i]) << 16;
      std::memcpy(&f, &u, 4);
      return f;
    case TANDEM_I32: return static_cast<const int32_t*>(buf)[i];
    case TANDEM_I64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    default: return std::nan("");
  }
}

// Rank r's element i; sum/avg/min/max use (i % 4) + 2r, prod 1 or 2, so results stay exact.
double input_value(tandem_op_t op, int r, size_t i) {
  if (op == TANDEM_PROD) return 1.0 + static_cast<double>((static_cast<size_t>(r) + i) % 2);
  return static_cast<double>(i % 4) + 2.0 * r;
}
double expected_value(tandem_op_t op, int n, size_t i) {
  const auto base = static_cast<double>(i % 4);
  switch (op) {
    case TANDEM_SUM: return n * base + static_cast<double>(n) * (n - 1);
    case TANDEM_AVG: return base + (n - 1);
    case TANDEM_MIN: return base;
    case TANDEM_MAX: return base + 2.0 * (n - 1);
    case TANDEM_PROD: {
      int twos = 0;
      for (int r = 0; r < n; ++r) twos += static_cast<int>((static_cast<size_t>(r) + i) % 2);
      return std::ldexp(1.0, twos);
    }
    default: return std::nan("");
  }
}

int64_t count_wrong(const void* recv, tandem_dtype_t t, tandem_op_t op, int n, size_t count) {
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += get(recv, t, i) != expected_value(op, n, i);
  return wrong;
}

// ---- The benchmark on one rank ----------------------------------------------------------------

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(tandem_status_t s, const char* what) {
  if (s != TANDEM_OK)
    throw Failure(fmt::format("{} failed: {}: {}", what, tandem_status_string(s), tandem_last_error_message()));
}

struct Row {
  size_t bytes, count;
  std::string algo;
  double time_us, algbw, busbw;
  int64_t wrong;
};

Row bench_size(tandem_comm_t* comm, int rank, int n, size_t bytes, const BenchOptions& o, tandem_dtype_t dtype,
               tandem_op_t op) {
  const size_t elem = tandem_dtype_size(dtype);
  const size_t count = std::max<size_t>(1, bytes / elem);
  Row row{count * elem, count, "", 0, 0, 0, 0};
  std::vector<unsigned char> send(row.bytes), recv(row.bytes);
  for (size_t i = 0; i < count; ++i) put(send.data(), dtype, i, input_value(op, rank, i));
  tandem_algo_t algo = TANDEM_ALGO_AUTO;
  check(tandem_comm_allreduce_algo(comm, count, dtype, &algo), "tandem_comm_allreduce_algo");
  row.algo = tandem_algo_string(algo);

  for (int w = 0; w < std::max(1, o.warmup); ++w)
    check(tandem_comm_allreduce(comm, send.data(), recv.data(), count, dtype, op), "allreduce (warm-up)");
  int64_t wrong = count_wrong(recv.data(), dtype, op, n, count);
  std::fill(recv.begin(), recv.end(), 0);

  std::vector<double> times(static_cast<size_t>(o.iters));
  for (auto& t : times) {
    check(tandem_comm_barrier(comm), "barrier");
    const auto t0 = std::chrono::steady_clock::now();
    check(tandem_comm_allreduce(comm, send.data(), recv.data(), count, dtype, op), "allreduce");
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  wrong += count_wrong(recv.data(), dtype, op, n, count);
  // The slowest rank defines each iteration; wrong elements add up over ranks.
  check(tandem_comm_allreduce(comm, times.data(), times.data(), times.size(), TANDEM_F64, TANDEM_MAX), "allreduce");
  check(tandem_comm_allreduce(comm, &wrong, &wrong, 1, TANDEM_I64, TANDEM_SUM), "allreduce");
  std::sort(times.begin(), times.end());
  const size_t m = times.size();
  row.time_us = m % 2 ? times[m / 2] : (times[m / 2 - 1] + times[m / 2]) / 2;
  row.algbw = static_cast<double>(row.bytes) / (row.time_us * 1e-6) / 1e9;
  row.busbw = row.algbw * 2.0 * (n - 1) / n;
  row.wrong = wrong;
  return row;
}

// MemAvailable of /proc/meminfo in bytes, 0 when unknown.
double mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// Every rank holds a send and a receive buffer of the largest size; the ranks of this host share its memory. A size
// past what the host has either threw std::bad_alloc ("tandem: std::bad_alloc") or, overcommitted, had the ranks
// killed by the OOM killer while they filled their buffers: refused here, naming the size.
void check_memory(const std::vector<size_t>& sizes) {
  const size_t largest = *std::max_element(sizes.begin(), sizes.end());
  long local = 1;
  for (const char* v : {"TANDEM_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"})
    if (const char* s = std::getenv(v); s != nullptr && std::atol(s) > 0) {
      local = std::atol(s);
      break;
    }
  const double need = 2.0 * static_cast<double>(largest) * static_cast<double>(local);
  const double avail = mem_available_bytes();
  if (avail > 0 && need > avail)
    throw std::invalid_argument(fmt::format(
        "--sizes: {} bytes need {:.1f} GiB on this host (a send and a receive buffer on each of its {} rank(s)) but "
        "{:.1f} GiB is available (MemAvailable); give a smaller size",
        largest, need / (1 << 30), local, avail / (1 << 30)));
}

int run_rank(const BenchOptions& o) {
  std::vector<size_t> sizes;
  tandem_dtype_t dtype;
  tandem_op_t op;
  tandem_algo_t algo;
  try {
    sizes = parse_sizes(o.sizes);
    check_memory(sizes);
    dtype = parse_dtype(o.dtype);
    op = parse_op(o.op);
    algo = parse_algo(o.algo);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "tandem bench allreduce: %s\n", e.what());
    return 2;
  }
  tandem_context_t* ctx = nullptr;
  tandem_comm_t* comm = nullptr;
  int rc = 0;
  try {
    check(tandem_context_create(nullptr, &ctx), "tandem_context_create");
    tandem_comm_params_t p = TANDEM_COMM_PARAMS_INIT;
    p.field_mask = TANDEM_COMM_PARAM_ALLREDUCE_ALGO | TANDEM_COMM_PARAM_TIMEOUT_MS;
    p.allreduce_algo = algo;
    p.timeout_ms = o.timeout_ms;
    if (o.transport != "auto") {
      p.field_mask |= TANDEM_COMM_PARAM_TRANSPORT;
      p.transport = o.transport.c_str();
    }
    check(tandem_comm_create(ctx, &p, &comm), "tandem_comm_create");
    int32_t rank = 0, n = 1;
    const char* transport = "";
    check(tandem_comm_rank(comm, &rank), "tandem_comm_rank");
    check(tandem_comm_size(comm, &n), "tandem_comm_size");
    check(tandem_comm_transport_name(comm, &transport), "tandem_comm_transport_name");

    FILE* out = stdout;
    if (rank == 0 && !o.result_file.empty()) {
      out = std::fopen(o.result_file.c_str(), "w");
      if (out == nullptr) throw Failure(fmt::format("cannot write {}: {}", o.result_file, std::strerror(errno)));
    }
    if (rank == 0 && !o.json) {
      std::fprintf(out, "# tandem bench allreduce: %d ranks, transport %s, dtype %s, op %s, %d iterations (median)\n",
                   n, transport, dtype_name(dtype), o.op.c_str(), o.iters);
      std::fprintf(out, "# %12s %12s %6s %14s %12s %12s %12s %8s\n", "bytes", "count", "dtype", "algo", "time_us",
                   "algbw_GB/s", "busbw_GB/s", "wrong");
      std::fflush(out);
    }
    for (size_t bytes : sizes) {
      const Row r = bench_size(comm, rank, n, bytes, o, dtype, op);
      if (r.wrong != 0) rc = 3;
      if (rank != 0) continue;
      if (o.json) {
        nlohmann::ordered_json j = {{"bytes", r.bytes},      {"count", r.count},         {"dtype", dtype_name(dtype)},
                            {"op", o.op},            {"algo", r.algo},           {"transport", transport},
                            {"world", n},            {"time_us", r.time_us},     {"algbw_gbps", r.algbw},
                            {"busbw_gbps", r.busbw}, {"wrong", r.wrong}};
        std::fprintf(out, "%s\n", j.dump().c_str());
      } else {
        std::fprintf(out, "  %12zu %12zu %6s %14s %12.1f %12.3f %12.3f %8lld\n", r.bytes, r.count, dtype_name(dtype),
                     r.algo.c_str(), r.time_us, r.algbw, r.busbw, static_cast<long long>(r.wrong));
      }
      std::fflush(out);
    }
    if (out != stdout) std::fclose(out);
  } catch (const Failure& e) {
    std::fprintf(stderr, "tandem bench allreduce: %s\n", e.what());
    rc = 1;
  }
  tandem_comm_destroy(comm);
  tandem_context_destroy(ctx);
  return rc;
}

// ---- Starting ranks -----------------------------------------------------------------------------

bool inside_job() {
  for (const char* v : {"TANDEM_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return std::getenv("SLURM_PROCID") != nullptr && std::getenv("SLURM_STEP_ID") != nullptr;
}

std::string self_exe() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) throw Failure(fmt::format("cannot find this program (/proc/self/exe): {}", std::strerror(errno)));
  return std::string(buf.data(), static_cast<size_t>(n));
}

int spawn_ranks(const BenchOptions& o) {
  char path[] = "/tmp/tandem-bench-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return tandem::cli::fail(fmt::format("cannot create a temporary file: {}", std::strerror(errno)));
  ::close(fd);
  std::vector<std::string> args;
  try {
    const std::string exe = self_exe();
    args = {exe,      "launch",    "-n",          std::to_string(o.nranks),        "--",
            exe,      "bench",     "allreduce",   "--sizes",                       o.sizes,
            "--algo", o.algo,      "--transport", o.transport,                     "--dtype",
            o.dtype,  "--op",      o.op,          "--iters",                       std::to_string(o.iters),
            "--warmup", std::to_string(o.warmup), "--timeout-ms", std::to_string(o.timeout_ms),
            "--result-file", path};
    if (o.json) args.push_back("--json");
  } catch (const Failure& e) {
    ::unlink(path);
    return tandem::cli::fail(e.what());
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::unlink(path);
    return tandem::cli::fail(fmt::format("fork failed: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "tandem bench: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream in(path);
  std::stringstream report;
  report << in.rdbuf();
  ::unlink(path);
  std::fputs(report.str().c_str(), stdout);
  std::fflush(stdout);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

tandem::cli::Registration reg{
    "bench", "benchmarks (allreduce: nccl-tests style table or JSON)", [](CLI::App& app) -> tandem::cli::Runner {
      auto o = std::make_shared<BenchOptions>();
      app.require_subcommand(1);
      CLI::App* ar = app.add_subcommand("allreduce", "allreduce bandwidth and latency per message size");
      ar->add_option("--sizes", o->sizes, "message sizes in bytes, comma separated (K, M, G suffixes)")
          ->capture_default_str();
      ar->add_option("--algo", o->algo, "auto, ring, hd, tree, hier, direct or det (deterministic)")
          ->capture_default_str();
      ar->add_option("--transport", o->transport, "auto, tcp, zmq, ucx or inproc")->capture_default_str();
      ar->add_option("--dtype", o->dtype, "f32, f64, f16, bf16, i32 or i64")->capture_default_str();
      ar->add_option("--op", o->op, "sum, avg, min, max or prod")->capture_default_str();
      ar->add_option("--iters", o->iters, "timed iterations per size")->check(CLI::Range(1, 100000))
          ->capture_default_str();
      ar->add_option("--warmup", o->warmup, "untimed iterations per size")->check(CLI::Range(0, 100000))
          ->capture_default_str();
      ar->add_option("-n,--ranks", o->nranks, "ranks to start when not already inside a launched job")
          ->check(CLI::Range(1, 1024))->capture_default_str();
      ar->add_option("--timeout-ms", o->timeout_ms, "deadline of every collective")->check(CLI::Range(1, 86400000))
          ->capture_default_str();
      ar->add_flag("--json", o->json, "one JSON object per size instead of the table");
      ar->add_option("--result-file", o->result_file, "where rank 0 writes its report (used internally)")
          ->group("");
      return [o] {
        if (!inside_job() && o->nranks > 1) return spawn_ranks(*o);
        return run_rank(*o);
      };
    }};

}  // namespace
