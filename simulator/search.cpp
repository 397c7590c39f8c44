#include "simulator/search.hpp"

#include <algorithm>
#include <chrono>

#include "engine/core/error.hpp"

namespace tandem::simulator {

namespace {
using engine::comm::Algorithm;
using engine::parallel::ScheduleKind;

bool multi_rank_hosts(const ClusterSpec& c) {
  for (const NodeSpec& n : c.nodes)
    if (n.ranks() > 1) return true;
  return false;
}
}  // namespace

SearchResult search_plans(const ClusterSpec& cluster, const JobSpec& base, const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  TANDEM_REQUIRE(opt.top >= 1, "plan search: top must be >= 1, got {}", opt.top);
  Simulation sim;
  SearchResult out;
  const int32_t E = cluster.endpoints();
  std::vector<int32_t> worlds;
  if (opt.use_all_devices) {
    worlds.push_back(E);
  } else {
    for (int32_t w = 1; w < E; w *= 2) worlds.push_back(w);
    worlds.push_back(E);
  }
  std::vector<Algorithm> algos = {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree};
  if (multi_rank_hosts(cluster)) algos.push_back(Algorithm::kHierarchical);
  std::vector<Candidate> all;
  size_t layers = 0;
  for (int32_t world : worlds) {
    for (int32_t pp = 1; pp <= world; ++pp) {
      if (world % pp) continue;
      const int32_t dp = world / pp;
      JobSpec j = base;
      j.boundaries.clear();  // the cut follows each candidate's pp
      j.dp = dp;
      j.pp = pp;
      j.strategy = pp == 1 ? (dp == 1 ? Strategy::kSingle : Strategy::kDdp) : (dp == 1 ? Strategy::kPipeline : Strategy::kHybrid);
      j.staleness_lr = engine::parallel::StalenessLr::kNone;  // ps-async's alone
      std::vector<int32_t> mbs = {1};
      std::vector<ScheduleKind> scheds = {base.schedule};
      if (pp > 1) {
        mbs.clear();
        for (int32_t m : opt.micro_batches)
          if (m <= base.batch) mbs.push_back(m);
        scheds = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB};
      }
      std::vector<Algorithm> as = {base.algorithm};
      if (dp > 1) as = algos;
      for (int32_t m : mbs) {
        for (ScheduleKind sk : scheds) {
          if (m == 1 && sk == ScheduleKind::kGPipe && pp > 1) continue;  // same as 1F1B with one micro-batch
          for (Algorithm a : as) {
            JobSpec c = j;
            c.micro_batches = m;
            c.schedule = sk;
            c.algorithm = a;
            SimOptions so;
            so.baseline = false;
            so.advise = false;  // a candidate that does not fit is ranked last, not advised
            try {
              SimResult r = sim.run(cluster, c, so);
              layers = r.stage_boundaries.empty() ? layers : static_cast<size_t>(r.stage_boundaries.back());
              all.push_back({c, std::move(r)});
              ++out.evaluated;
            } catch (const Error& e) {
              // configurations the model cannot take (more stages than layers) are skipped
              if (e.status() != Status::kInvalidArgument) throw;
            }
          }
        }
      }
    }
  }
  if (opt.strategies && E > 1) {
    std::vector<JobSpec> extra;
    JobSpec j = base;
    j.boundaries.clear();
    j.staleness_lr = engine::parallel::StalenessLr::kNone;  // ps-async's alone (its candidates take base's)
    j.pp = 0;
    j.dp = 0;  // every device: workers, then servers where the strategy has them
    j.micro_batches = 1;
    for (Strategy st : {Strategy::kPs, Strategy::kPsAsync, Strategy::kSsp}) {
      for (int32_t servers = 1; servers < E; servers *= 2) {
        JobSpec c = j;
        c.strategy = st;
        c.servers = servers;
        if (st == Strategy::kPsAsync) c.staleness_lr = base.staleness_lr;
        extra.push_back(c);
      }
    }
    for (Strategy st : {Strategy::kLocalSgd, Strategy::kEasgd}) {
      for (Algorithm a : algos) {
        JobSpec c = j;
        c.strategy = st;
        c.easgd_async = false;
        c.algorithm = a;
        extra.push_back(c);
      }
    }
    for (Strategy st : {Strategy::kAsgd, Strategy::kFedAvg}) {
      JobSpec c = j;
      c.strategy = st;
      extra.push_back(c);
    }
    for (const JobSpec& c : extra) {
      SimOptions so;
      so.baseline = false;
      so.advise = false;  // a candidate that does not fit is ranked last, not advised
      try {
        all.push_back({c, sim.run(cluster, c, so)});
        ++out.evaluated;
      } catch (const Error& e) {
        if (e.status() != Status::kInvalidArgument) throw;
      }
    }
  }
  TANDEM_REQUIRE(!all.empty(), "plan search: no configuration of {} could be simulated", cluster.describe());
  for (const Candidate& c : all) out.fitting += c.result.fits ? 1 : 0;
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.result.fits != b.result.fits) return a.result.fits;
    return a.result.total_time_s < b.result.total_time_s;
  });
  const SimResult one = sim.baseline(cluster, base);
  out.baseline_total_time_s = one.total_time_s;
  for (size_t i = 0; i < all.size() && static_cast<int32_t>(out.best.size()) < opt.top; ++i) {
    Candidate c = std::move(all[i]);
    c.result.baseline_total_time_s = out.baseline_total_time_s;
    c.result.speedup = speedup_against(c.result, one);
    c.result.efficiency = c.result.speedup / c.result.ranks;
    out.best.push_back(std::move(c));
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

nlohmann::json SearchResult::to_json() const {
  nlohmann::json j = {{"evaluated", evaluated},
                      {"fitting", fitting},
                      {"baseline_total_time_s", baseline_total_time_s},
                      {"search_wall_s", wall_s}};
  j["candidates"] = nlohmann::json::array();
  for (const Candidate& c : best) {
    nlohmann::json r = c.result.to_json();
    r.erase("step_ranks");
    r.erase("nodes");
    r.erase("phases");
    j["candidates"].push_back(std::move(r));
  }
  return j;
}

}  // namespace tandem::simulator
