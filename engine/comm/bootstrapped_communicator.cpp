#include "engine/comm/bootstrapped_communicator.hpp"

namespace tandem::engine::comm {

std::unique_ptr<Communicator> BootstrappedCommunicator::split(int color, int key) {
  auto child = inner_->split(color, key);
  if (!child) return child;
  return std::make_unique<BootstrappedCommunicator>(rendezvous_, std::move(child));
}

std::unique_ptr<Communicator> BootstrappedCommunicator::shrink() {
  return std::make_unique<BootstrappedCommunicator>(rendezvous_, inner_->shrink());
}

std::unique_ptr<Communicator> BootstrappedCommunicator::grow(const GrowOptions& options) {
  std::unique_ptr<Communicator> grown = inner_->grow(options);
  return grown ? std::make_unique<BootstrappedCommunicator>(rendezvous_, std::move(grown)) : nullptr;
}

std::unique_ptr<Communicator> BootstrappedCommunicator::rejoin(std::chrono::milliseconds wait) {
  return std::make_unique<BootstrappedCommunicator>(rendezvous_, inner_->rejoin(wait));
}

}  // namespace tandem::engine::comm
