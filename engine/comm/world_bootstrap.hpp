#pragma once
// Communicator::create's steps before the communicator exists: a key namespace of its own on the
// store, the host names and the settings every rank must agree on, and the topology those hosts give.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "transports/transport.hpp"

namespace tandem::engine::comm {

// "tandem/comm<k>/" for the k-th world communicator created on `store` by `rank` (from 0). Ranks
// create them collectively, so the k-th creation on a store is the same on every rank. Stores are
// told apart by identity: a new store never continues an old one's count.
std::string world_key_prefix(const std::shared_ptr<transports::KvStore>& store, int rank);

// The settings ranks must agree on (algorithm, determinism, chunk), as text.
std::string agreed_settings(const CommOptions& options);

// Publishes this rank's `host` and `settings` under `prefix` and reads every rank's (waiting up to
// `timeout` for each); returns the host of every rank. kMismatch naming both ranks and both
// settings when a rank's differ from this one's.
std::vector<std::string> exchange_hosts(transports::KvStore& store, const std::string& prefix, int rank, int size,
                                        const std::string& host, const std::string& settings,
                                        std::chrono::milliseconds timeout);

// The world communicator of `info` under the key namespace `prefix` (Communicator::create with the
// prefix given, not counted): a grown world (Communicator::grow, join_communicator) is built by old
// and new ranks alike this way. `epoch` and `parent_ranks` become its lineage; `host` is this rank's
// host identity as exchange_hosts publishes it ("" = this machine's).
std::unique_ptr<Communicator> create_world(const BootstrapInfo& info, std::shared_ptr<transports::KvStore> store,
                                           const CommOptions& options, const std::string& prefix, int epoch,
                                           std::vector<int> parent_ranks, std::string host = "");

// host_of[r]: index of rank r's host, numbered in order of first appearance.
Topology topology_of(const std::vector<std::string>& hosts);

}  // namespace tandem::engine::comm
