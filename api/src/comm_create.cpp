// Bootstrapping the engine communicator for tandem_comm_create.
#include "api/src/comm_handles.hpp"

namespace tandem::api {

std::unique_ptr<engine::comm::Communicator> create_engine_comm(const CreateParams&) {
  // TODO(#2): call engine/comm/bootstrap.hpp's create_communicator_from_env once it lands.
  TANDEM_THROW(Status::kUnsupported, "tandem_comm_create: the rendezvous bootstrap is not built into this library yet");
}

}  // namespace tandem::api
