#pragma once
// Ranks as threads: each thread creates its own Communicator over the named transport, sharing one
// MemoryStore. Boost.Test assertions are not thread-safe, so rank bodies report failures by throwing
// (EXPECT below); run_ranks collects them and reports them from the test's thread.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "engine/comm/communicator.hpp"
#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"
#include "tests/common/transport_variants.hpp"
#include "transports/memory_store.hpp"
#include "transports/transport.hpp"

namespace tandem::testing {

using engine::comm::BootstrapInfo;
using engine::comm::CommOptions;
using engine::comm::Communicator;

#define EXPECT(cond, ...)                                                                                \
  do {                                                                                                   \
    if (!(cond))                                                                                         \
      throw std::runtime_error(fmt::format("{}:{}: {} -- ", __FILE__, __LINE__, #cond) + fmt::format(__VA_ARGS__)); \
  } while (0)

// Every transport, plus tcp and zmq kept off local sockets ("tcp+inet", "zmq+inet"); plain "tcp"
// is tcp through shared memory. "tcp+unix" (frames over the local sockets) is left to
// tests/transports: what it changes lies below the collectives, and CI time is short.
inline std::vector<std::string> transports_under_test() {
  auto all = transports::testing::transport_variants(transports::available_transports());
  std::erase(all, "tcp+unix");
  return all;
}

// Options with a deadline of `ms` milliseconds.
inline CommOptions with_timeout(int ms) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// host_of(rank) names each rank's host (for hierarchical algorithms); default: one host.
template <typename Fn, typename HostFn>
void run_ranks_on(const std::string& transport, int n, const CommOptions& base, HostFn host_of, Fn fn) {
  const transports::testing::VariantEnv env(transport);
  auto store = std::make_shared<transports::MemoryStore>();
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  CommOptions opts = base;
  opts.transport = transports::testing::transport_name(transport);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        BootstrapInfo info;
        info.rank = r;
        info.size = n;
        info.host = host_of(r);
        auto comm = Communicator::create(info, store, opts);
        fn(r, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[r].empty()) BOOST_ERROR(transport << " world " << n << " rank " << r << ": " << errors[r]);
}

template <typename Fn>
void run_ranks(const std::string& transport, int n, const CommOptions& base, Fn fn) {
  run_ranks_on(transport, n, base, [](int) { return std::string("localhost"); }, fn);
}

// Values as doubles <-> elements of any dtype (exact for the small integers the tests use).
inline void encode(DType t, void* dst, size_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(dst)[i] = static_cast<float>(v); return;
    case DType::kF64: static_cast<double*>(dst)[i] = v; return;
    case DType::kF16: static_cast<uint16_t*>(dst)[i] = float_to_half(static_cast<float>(v)); return;
    case DType::kBF16: static_cast<uint16_t*>(dst)[i] = float_to_bf16(static_cast<float>(v)); return;
    case DType::kI32: static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v); return;
    case DType::kI64: static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(v); return;
    case DType::kU8: static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(v); return;
  }
}
inline double decode(DType t, const void* src, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(src)[i];
    case DType::kF64: return static_cast<const double*>(src)[i];
    case DType::kF16: return half_to_float(static_cast<const uint16_t*>(src)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(src)[i]);
    case DType::kI32: return static_cast<const int32_t*>(src)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(src)[i]);
    case DType::kU8: return static_cast<const uint8_t*>(src)[i];
  }
  return 0;
}

// What ReduceOp::kAvg leaves after dividing an exact sum by n, computed the way tandem::divide_by does.
inline double avg_of(DType t, double sum, int n) {
  std::vector<unsigned char> tmp(8);
  encode(t, tmp.data(), 0, sum);
  divide_by(tmp.data(), 1, t, n);
  return decode(t, tmp.data(), 0);
}

inline Status status_of(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.status();
  }
  return Status::kOk;
}

}  // namespace tandem::testing
