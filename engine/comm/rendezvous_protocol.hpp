#pragma once
// Wire format of the rendezvous store (internal to rendezvous_server.cpp / rendezvous_client.cpp).
//
// Transport: ZeroMQ ROUTER (rank 0) <-> DEALER (every rank). Each message is a few frames; frame 0
// is a fixed 10-byte header {op, code, request id (u64 little-endian)}. Every frame length is
// bounded: libzmq drops a connection announcing a frame above kMaxFrameBytes (ZMQ_MAXMSGSIZE)
// before allocating it, and the handlers check each frame against its own bound.
//
// Handshake (mutual challenge-response; the secret never crosses the wire):
//   C->S HELLO     [hdr][client nonce(32)][rank,size (2 x i32 LE), generation (u64 LE)][name (<= kMaxNameBytes)]
//   S->C CHALLENGE [hdr][server nonce(32)][HMAC(k, "srv" | client nonce | server nonce)]
//   C->S AUTH      [hdr][HMAC(k, "cli" | server nonce | client nonce | rank,size | name)]
//   S->C OK | DENIED | MISMATCH | NOT_SERVED [hdr][message]
// with k = BLAKE2b("tandem-rendezvous-v1" | secret) and HMAC = crypto_auth (HMAC-SHA512-256).
// The client checks the server's proof before answering, so a fake server learns nothing.
// Requests from a connection that has not completed AUTH get a NOAUTH reply carrying no data.
//
// Generations: the k-th communicator a process creates on one rendezvous address is generation k
// (every rank counts alike, as creation is collective). A server serves the generations rank 0
// admitted (a second communicator created while the first lives shares rank 0's server); a client
// of another generation gets NOT_SERVED -- typically it reached the server of an earlier
// communicator that is shutting down -- and tries again until its deadline. A client's keys live
// under "g<k>/" (none for generation 0), so generations sharing a server never see each other's keys.
//
// Requests (after AUTH):
//   SET   [hdr][key][value]            -> OK
//   GET   [hdr][key][timeout_ms u64]   -> OK [value] | TIMEOUT   (the server holds the request)
//   ADD   [hdr][key][delta i64]        -> OK [new value i64]     (value stored as decimal text)
//   ERASE [hdr][key]                   -> OK [existed u8]
//   BYE   [hdr]                        -> (no reply) the client is closing; a stopping server waits for
//                                         every joined client's BYE (bounded by its shutdown grace)
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <sodium.h>
#include <zmq.hpp>

namespace tandem::engine::comm::rendezvous {

enum class Op : uint8_t { kHello = 1, kAuth = 2, kSet = 3, kGet = 4, kAdd = 5, kErase = 6, kBye = 7, kReply = 0x80 };

enum class Code : uint8_t {
  kOk = 0,
  kChallenge = 1,
  kTimeout = 2,
  kDenied = 3,     // wrong secret
  kNoAuth = 4,     // request before a completed handshake
  kBadRequest = 5, // malformed or over a limit; frame 1 says why
  kMismatch = 6,   // authenticated, but the peer's world size / rank does not fit this job
  kShutdown = 7,   // the server is stopping
  kNotServed = 8,  // authenticated, but the peer's communicator generation is not (or no longer) served here
};

constexpr uint8_t kProtocolVersion = 2;
constexpr size_t kHeaderBytes = 10;
constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = crypto_auth_BYTES;  // 32
constexpr size_t kKeyBytes = crypto_auth_KEYBYTES; // 32
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t{16} << 20;
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes;
constexpr size_t kMaxFrames = 4;  // header + up to 3 arguments; longer messages are malformed

using Key = std::array<unsigned char, kKeyBytes>;
using Nonce = std::array<unsigned char, kNonceBytes>;
using Proof = std::array<unsigned char, kProofBytes>;

struct Header {
  Op op = Op::kReply;
  Code code = Code::kOk;   // replies; in requests: the protocol version
  uint64_t request_id = 0;
};

inline std::string encode_header(const Header& h) {
  std::string out(kHeaderBytes, '\0');
  out[0] = static_cast<char>(h.op);
  out[1] = static_cast<char>(h.code);
  for (int i = 0; i < 8; ++i) out[2 + i] = static_cast<char>((h.request_id >> (8 * i)) & 0xff);
  return out;
}

inline bool decode_header(std::string_view bytes, Header* h) {
  if (bytes.size() != kHeaderBytes) return false;
  h->op = static_cast<Op>(static_cast<uint8_t>(bytes[0]));
  h->code = static_cast<Code>(static_cast<uint8_t>(bytes[1]));
  h->request_id = 0;
  for (int i = 0; i < 8; ++i) h->request_id |= uint64_t{static_cast<uint8_t>(bytes[2 + i])} << (8 * i);
  return true;
}

inline std::string encode_u64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

inline bool decode_u64(std::string_view bytes, uint64_t* v) {
  if (bytes.size() != 8) return false;
  *v = 0;
  for (int i = 0; i < 8; ++i) *v |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  return true;
}

constexpr size_t kJoinBytes = 16;  // HELLO's rank, size and generation

inline std::string encode_rank_size(int32_t rank, int32_t size, uint64_t generation = 0) {
  return encode_u64(static_cast<uint32_t>(rank) | (uint64_t{static_cast<uint32_t>(size)} << 32)) +
         encode_u64(generation);
}

inline bool decode_rank_size(std::string_view bytes, int32_t* rank, int32_t* size, uint64_t* generation) {
  uint64_t v = 0;
  if (bytes.size() != kJoinBytes || !decode_u64(bytes.substr(0, 8), &v) || !decode_u64(bytes.substr(8), generation))
    return false;
  *rank = static_cast<int32_t>(static_cast<uint32_t>(v & 0xffffffffu));
  *size = static_cast<int32_t>(static_cast<uint32_t>(v >> 32));
  return true;
}

// Throws nothing; sodium_init() is idempotent and thread-safe.
inline bool ensure_sodium() { return sodium_init() >= 0; }

inline Key derive_key(std::string_view secret) {
  Key key{};
  constexpr std::string_view kContext = "tandem-rendezvous-v1";
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, key.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(kContext.data()), kContext.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  crypto_generichash_final(&st, key.data(), key.size());
  return key;
}

inline Nonce random_nonce() {
  Nonce n{};
  randombytes_buf(n.data(), n.size());
  return n;
}

// HMAC-SHA512-256 over the concatenation of `parts`.
template <typename... Parts>
Proof hmac(const Key& key, const Parts&... parts) {
  crypto_auth_hmacsha512256_state st;
  crypto_auth_hmacsha512256_init(&st, key.data(), key.size());
  auto feed = [&](std::string_view p) {
    crypto_auth_hmacsha512256_update(&st, reinterpret_cast<const unsigned char*>(p.data()), p.size());
  };
  (feed(std::string_view(reinterpret_cast<const char*>(std::data(parts)), std::size(parts))), ...);
  Proof out{};
  crypto_auth_hmacsha512256_final(&st, out.data());
  return out;
}

inline Proof server_proof(const Key& k, const Nonce& client_nonce, const Nonce& server_nonce) {
  return hmac(k, std::string_view("srv"), client_nonce, server_nonce);
}

inline Proof client_proof(const Key& k, const Nonce& server_nonce, const Nonce& client_nonce,
                          std::string_view rank_size, std::string_view name) {
  return hmac(k, std::string_view("cli"), server_nonce, client_nonce, rank_size, name);
}

// Constant-time comparison of a received proof.
inline bool proof_equals(const Proof& expected, std::string_view got) {
  return got.size() == expected.size() && sodium_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

template <size_t N>
inline std::string_view as_view(const std::array<unsigned char, N>& a) {
  return {reinterpret_cast<const char*>(a.data()), a.size()};
}

// zmq::poll that treats a signal delivered to the calling thread (SIGCHLD in a launcher, a profiler's SIGPROF, a
// fuzzer's alarm) as "nothing happened yet" instead of throwing EINTR: the callers loop on their own deadlines.
inline int poll_through_signals(zmq::pollitem_t* items, size_t n, std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(items, n, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
    for (size_t i = 0; i < n; ++i) items[i].revents = 0;
    return 0;
  }
}

// zmq recv and send that retry a call a signal interrupted (EINTR: zmq_msg_recv/zmq_msg_send fail with it whatever
// SA_RESTART says, even with ZMQ_DONTWAIT, when a signal lands while libzmq reads its command pipe). Any other
// error throws as before; EAGAIN gives an empty result.
inline zmq::recv_result_t recv_through_signals(zmq::socket_ref s, zmq::message_t& m, zmq::recv_flags flags) {
  for (;;) {
    try {
      return s.recv(m, flags);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

inline zmq::send_result_t send_through_signals(zmq::socket_ref s, zmq::const_buffer b, zmq::send_flags flags) {
  for (;;) {
    try {
      return s.send(b, flags);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

}  // namespace tandem::engine::comm::rendezvous
