#include "engine/comm/plan_cache.hpp"

namespace tandem::engine::comm {

size_t PlanCache::KeyHash::operator()(const Key& k) const noexcept {
  size_t h = std::hash<uint64_t>()(k.count);
  auto mix = [&](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(k.collective | (uint64_t{k.algorithm} << 8) | (uint64_t{k.in_place} << 16));
  mix(static_cast<uint64_t>(static_cast<uint32_t>(k.root)));
  mix(k.elem_bytes);
  mix(k.chunk_bytes);
  return h;
}

PlanCache::Key PlanCache::key_of(const PlanRequest& r) {
  return Key{static_cast<uint8_t>(r.collective), static_cast<uint8_t>(r.algorithm), r.in_place, r.root, r.count,
             r.elem_bytes, r.chunk_bytes};
}

const CompiledPlan* PlanCache::find(const PlanRequest& request) const {
  auto it = plans_.find(key_of(request));
  return it == plans_.end() ? nullptr : it->second.get();
}

const CompiledPlan& PlanCache::build(const PlanRequest& request) {
  PlanRequest r = request;
  r.topology = topology_;
  const Plan plan = make_plan(r);
#ifndef NDEBUG
  validate_plan(plan);
#endif
  if (plans_.size() >= kCapacity) plans_.clear();
  auto compiled = compile_plan(plan, rank_);
  return *plans_.insert_or_assign(key_of(request), std::move(compiled)).first->second;
}

}  // namespace tandem::engine::comm
