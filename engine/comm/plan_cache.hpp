#pragma once
// A communicator's compiled plans, keyed by everything that shapes a plan for one rank: collective,
// algorithm, in-place layout, root, count, element size and chunk. The world, the rank and the
// topology are the cache's own (fixed per communicator), so a request's topology is not part of the key.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "engine/comm/executor.hpp"
#include "engine/comm/plan.hpp"

namespace tandem::engine::comm {

class PlanCache {
 public:
  static constexpr size_t kCapacity = 256;  // a full cache is emptied before the next plan goes in

  PlanCache(int rank, Topology topology) : rank_(rank), topology_(std::move(topology)) {}

  // The cached plan for `request`, or nullptr.
  const CompiledPlan* find(const PlanRequest& request) const;
  // Builds (make_plan with this cache's topology), checks in debug builds, compiles for this rank
  // and caches the plan for `request`.
  const CompiledPlan& build(const PlanRequest& request);
  size_t size() const { return plans_.size(); }

 private:
  struct Key {
    uint8_t collective, algorithm;
    bool in_place;
    int32_t root;
    uint64_t count, elem_bytes, chunk_bytes;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept;
  };
  static Key key_of(const PlanRequest& r);

  const int rank_;
  const Topology topology_;
  std::unordered_map<Key, std::shared_ptr<const CompiledPlan>, KeyHash> plans_;
};

}  // namespace tandem::engine::comm
