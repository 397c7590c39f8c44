#pragma once
// The Request handed out by transports whose operations live in a shared core: test() drives the
// core's progress while the operation is pending; destroying an incomplete request cancels it.
// Core needs progress() and cancel(const std::shared_ptr<Op>&); Op needs a Completion `done`.
#include <memory>

#include "transports/transport.hpp"

namespace tandem::transports {

template <typename Core, typename Op>
class OpRequest final : public Request {
 public:
  OpRequest(std::shared_ptr<Core> core, std::shared_ptr<Op> op) : core_(std::move(core)), op_(std::move(op)) {}
  ~OpRequest() override { cancel(); }
  bool test() override {
    if (op_->done.pending()) core_->progress();
    return op_->done.test();
  }
  size_t bytes() const override { return op_->done.bytes(); }
  bool truncated() const override { return op_->done.truncated(); }
  void cancel() override {
    if (op_->done.pending())
      core_->cancel(op_);
    else if constexpr (requires(Core& c, const std::shared_ptr<Op>& o) { c.release(o); })
      core_->release(op_);  // finished for the caller, but the core may still hold its buffers (ucx)
  }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<Op> op_;
};

}  // namespace tandem::transports
