#pragma once
// ucx: the UCP tag API. One context and worker per transport; worker addresses (with pid and a
// host key: boot id + pid namespace) are exchanged through the KvStore under
// "<key_prefix>/ucx/<rank>"; one endpoint per peer, self included. Dead peers fail operations
// instead of hanging them:
//  - peers on other hosts: UCP_ERR_HANDLING_MODE_PEER, UCX reports the failure (keepalive);
//  - peers on this host: UCP_ERR_HANDLING_MODE_NONE, because UCX 1.13's shared-memory transports
//    have no peer-failure support and PEER mode would push them onto TCP; their process is
//    watched through /proc every 100 ms instead (TANDEM_UCX_ERR_MODE=peer forces PEER mode).
//  - 64-bit UCX tag = (source rank << 40) | tag, matched with a full mask; bit 63 marks control
//    messages (hello while connecting, goodbye on destruction), so ranks are below 2^23.
//  - Receives are matched by probing (ucp_tag_probe_nb) and then received with
//    ucp_tag_msg_recv_nbx straight into the caller's parts (IOV datatype for several parts):
//    knowing the length first is what lets a short receive report truncation and still get the
//    prefix (through a bounce buffer, only in that case).
//  - UCX picks the wire: shared memory (posix/sysv/cma) between ranks of one host, TCP or verbs
//    across hosts; large messages use UCX's rendezvous, so a send may wait for its receive.
//  - wait_for_progress polls and yields while the worker is busy; after TANDEM_UCX_BUSY_US (default
//    2000) without any event it sleeps 50 us between polls, so a rank waiting long (a pipeline
//    stage) leaves the core to others.
// Environment: UCX_* as usual; TANDEM_UCX_BUSY_US (above); UCX_KEEPALIVE_INTERVAL defaults to 1s here (UCX's own is 20s) so a
// dead peer is noticed quickly. Under TSan set UCX_MEM_EVENTS=no.
#include <memory>

#include "transports/transport.hpp"

namespace tandem::transports::ucx {

std::unique_ptr<Transport> create(const TransportOptions& options);

}  // namespace tandem::transports::ucx
