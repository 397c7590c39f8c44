#pragma once
// A client of the rendezvous server (rendezvous_server.hpp): the KvStore every rank of a
// multi-process job uses, rank 0 included. The constructor connects and completes the mutual
// challenge-response handshake; every call afterwards has a deadline.
//
// Threads: any. Several threads may share one client; their requests are multiplexed over one
// socket (whichever thread waits drives the socket and hands replies to their owners).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "transports/transport.hpp"

namespace tandem::engine::comm {

struct RendezvousClientOptions {
  std::string host = "127.0.0.1";  // the server's address (IP literal or resolvable name)
  int port = 0;
  std::string secret;
  int rank = 0;                    // announced to the server (checked against its world size)
  int size = 0;                    // 0 = do not check
  std::string name;                // for the server's logs; defaults to "rank <rank>"
  std::chrono::milliseconds timeout{30000};  // connecting + handshake, and each set/add/erase
  uint64_t generation = 0;         // the communicator generation joined (rendezvous_protocol.hpp)
};

class RendezvousClient final : public transports::KvStore {
 public:
  // Throws tandem::Error: kTimeout (server unreachable within options.timeout), kAuth (the server
  // refused our secret, or could not prove it knows it), kMismatch (world size / rank do not fit the
  // server's job), kInvalidArgument (bad options). A server that does not serve options.generation (an
  // earlier communicator's, still shutting down) is asked again until the deadline: then kTimeout says so.
  explicit RendezvousClient(const RendezvousClientOptions& options);
  ~RendezvousClient() override;
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  void set(const std::string& key, const std::string& value) override;
  // Within `timeout` in all: the request and any re-handshake it needs (set's re-handshake has options.timeout).
  void set_within(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) override;
  // Waits (server side) until `key` exists; kTimeout naming the key after `timeout`.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  // Atomically adds `delta` to the counter at `key` (absent = 0) and returns the new value.
  int64_t add(const std::string& key, int64_t delta) override;
  // Removes `key`; returns whether it existed.
  bool erase(const std::string& key);
  // Returns once `count` callers (any processes) have entered the barrier `name`; kTimeout saying
  // how many arrived otherwise. Each barrier name is single-use.
  void barrier(const std::string& name, int count, std::chrono::milliseconds timeout);

  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Reply {
    uint8_t code = 0;
    std::vector<std::string> frames;  // after the header
  };
  struct Socket;

  // False when the server answered NOT_SERVED (its reason in not_served_).
  bool handshake(std::chrono::steady_clock::time_point deadline);
  std::string scoped(const std::string& key) const;  // the key under this generation's namespace
  // Sends a request and waits for its reply until `deadline`; nullopt on deadline.
  std::optional<Reply> roundtrip(uint8_t op, std::vector<std::string> args,
                                 std::chrono::steady_clock::time_point deadline);
  // roundtrip + one re-handshake when the server forgot this connection (NOAUTH); throws on
  // deadline, naming `what`.
  // hard: a re-handshake keeps to the same deadline (else it has options.timeout of its own).
  Reply request(uint8_t op, std::vector<std::string> args, std::chrono::milliseconds timeout, const std::string& what,
                bool hard = false);
  [[noreturn]] void throw_reply_error(const Reply& r, const std::string& what) const;

  RendezvousClientOptions options_;
  std::string endpoint_;
  std::string secret_key_;  // derived key bytes (never the secret itself)
  std::string not_served_;

  std::unique_ptr<Socket> socket_;  // used only by the thread holding `driving_`
  std::mutex mu_;
  std::condition_variable cv_;
  bool driving_ = false;
  uint64_t next_id_ = 1;
  std::deque<std::pair<uint64_t, std::vector<std::string>>> outbox_;  // requests not yet sent
  std::map<uint64_t, std::optional<Reply>> pending_;                 // id -> reply once it arrived
};

}  // namespace tandem::engine::comm
