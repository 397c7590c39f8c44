#pragma once
// The Transport front of a transport whose state lives in a shared Core (zmq, tcp, ucx): validates
// arguments and hands out OpRequests. The Core outlives the Transport while requests hold it;
// destroying the Transport shuts the Core down (see transport.hpp for what that cancels).
#include <memory>

#include "engine/core/error.hpp"
#include "transports/op_request.hpp"
#include "transports/transport.hpp"

namespace tandem::transports {

template <typename Core, typename SendOp, typename RecvOp>
class CoreTransport final : public Transport {
 public:
  CoreTransport(const char* name, Capabilities caps, const TransportOptions& o)
      : name_(name), caps_(caps), core_(std::make_shared<Core>(o)) {}
  ~CoreTransport() override { core_->shutdown(); }

  const char* name() const override { return name_; }
  int rank() const override { return core_->rank(); }
  int size() const override { return core_->size(); }
  Capabilities capabilities() const override { return caps_; }
  void progress() override { core_->progress(); }
  void drop_unexpected(uint64_t tag, uint64_t mask) override {
    if constexpr (requires(Core& c) { c.drop_unexpected(tag, mask); }) core_->drop_unexpected(tag, mask);
  }
  void wait_for_progress(std::chrono::microseconds timeout) override { core_->wait_for_progress(timeout); }
  int at_fault(int peer) const override {
    if constexpr (requires(Core& c) { c.at_fault(peer); }) return core_->at_fault(peer);
    return peer;
  }
  std::vector<int> dead_peers() override {
    if constexpr (requires(Core& c) { c.dead_peers(); }) return core_->dead_peers();
    return {};
  }
  void reconnect(KvStore& store, const std::string& key_prefix, std::span<const int> peers,
                 std::chrono::milliseconds timeout) override {
    if constexpr (requires(Core& c) { c.reconnect(store, key_prefix, peers, timeout); })
      core_->reconnect(store, key_prefix, peers, timeout);
  }

  std::unique_ptr<Request> isend(int peer, uint64_t tag, std::span<const ConstPart> parts) override {
    check(peer, tag, "send to");
    return std::make_unique<OpRequest<Core, SendOp>>(core_, core_->send(peer, tag, parts));
  }
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, std::span<const MutPart> parts) override {
    check(peer, tag, "receive from");
    return std::make_unique<OpRequest<Core, RecvOp>>(core_, core_->recv(peer, tag, parts));
  }

 private:
  void check(int peer, uint64_t tag, const char* what) const {
    TANDEM_REQUIRE(peer >= 0 && peer < size(), "{}: rank {} cannot {} rank {}: the world has {} ranks", name_, rank(),
                   what, peer, size());
    TANDEM_REQUIRE(tag < (uint64_t{1} << 40), "{}: tag {} is not below 2^40", name_, tag);
  }

  const char* name_;
  Capabilities caps_;
  std::shared_ptr<Core> core_;
};

}  // namespace tandem::transports
