#include "simulator/network/network.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "engine/core/error.hpp"

namespace tandem::simulator::network {

Network::Network(des::Simulator& sim, Sharing sharing) : sim_(sim), sharing_(sharing) {
  sim_.add_instant_hook(this);
  bucket_events_.net = this;
  round_events_.net = this;
}

LinkId Network::add_link(double bandwidth_bytes_per_s, double latency_s) {
  TANDEM_REQUIRE(bandwidth_bytes_per_s > 0 && !std::isnan(bandwidth_bytes_per_s),
                 "link {}: bandwidth must be > 0 bytes/s, got {}", links_.size(), bandwidth_bytes_per_s);
  TANDEM_REQUIRE(latency_s >= 0 && std::isfinite(latency_s), "link {}: latency must be >= 0 s, got {}", links_.size(),
                 latency_s);
  Link l;
  l.capacity = l.peak = bandwidth_bytes_per_s;
  l.latency_ns = des::to_ns(latency_s);
  links_.push_back(std::move(l));
  return static_cast<LinkId>(links_.size() - 1);
}

RouteId Network::add_route(const std::vector<LinkId>& links) { return add_route(links, RouteCost{}); }

RouteId Network::add_route(const std::vector<LinkId>& links, const RouteCost& cost, const SlowStart& ss) {
  TANDEM_REQUIRE(ss.rtt_s >= 0 && std::isfinite(ss.rtt_s) && (ss.rtt_s == 0 || ss.initial_window > 0),
                 "route {}: slow start needs a finite RTT >= 0 s and an initial window > 0 bytes, got {} s and {}",
                 routes_.size(), ss.rtt_s, ss.initial_window);
  const RouteId r = add_route(links, cost);
  if (ss.rtt_s <= 0 || links.empty() || des::to_ns(ss.rtt_s) == 0) return r;
  double full = kUnlimited;
  for (LinkId l : links) full = std::min(full, links_[l].peak / (ss.data_cost > 0 ? ss.data_cost : cost.data));
  if (std::isinf(full)) return r;  // nothing to ramp up to
  const LinkId c = add_link(kUnlimited, 0);
  Link& k = links_[c];
  k.conn_rtt = des::to_ns(ss.rtt_s);
  k.conn_iw = ss.initial_window;
  k.full_rate = full;
  Route& rt = routes_[r];
  TANDEM_CHECK(rt.offset + rt.length == route_links_.size(), Status::kInternal, "route {} is not the last", r);
  route_links_.push_back(c);
  route_coef_.push_back(1.0);
  ++rt.length;
  rt.conn = true;
  return r;
}

RouteId Network::add_route(const std::vector<LinkId>& links, const RouteCost& cost) {
  TANDEM_REQUIRE(cost.data >= 1 && std::isfinite(cost.data) && cost.ack >= 0 && std::isfinite(cost.ack),
                 "route {}: costs per payload byte must be finite, data >= 1 and ack >= 0, got {} and {}", routes_.size(),
                 cost.data, cost.ack);
  Route r{static_cast<uint32_t>(route_links_.size()), static_cast<uint32_t>(links.size()), 0, 1.0};
  for (LinkId l : links) {
    TANDEM_REQUIRE(l < links_.size(), "route {}: link {} does not exist ({} links)", routes_.size(), l, links_.size());
    r.latency_ns += links_[l].latency_ns;
    route_links_.push_back(l);
    route_coef_.push_back(cost.data);
  }
  if (cost.ack > 0) {
    for (LinkId l : cost.ack_links) {
      TANDEM_REQUIRE(l < links_.size(), "route {}: ACK link {} does not exist ({} links)", routes_.size(), l,
                     links_.size());
      route_links_.push_back(l);
      route_coef_.push_back(cost.ack);
      ++r.length;
    }
  }
  if (sharing_ == Sharing::kRttWeighted && r.latency_ns > 0) r.weight = 1.0 / des::to_seconds(r.latency_ns);
  routes_.push_back(r);
  return static_cast<RouteId>(routes_.size() - 1);
}

void Network::set_token_bucket(LinkId l, double rate_bytes_per_s, double burst_bytes) {
  TANDEM_REQUIRE(l < links_.size(), "token bucket: link {} does not exist ({} links)", l, links_.size());
  Link& k = links_[l];
  TANDEM_REQUIRE(rate_bytes_per_s > 0 && rate_bytes_per_s < k.peak, "link {}: token bucket rate must be in (0, line "
                 "rate {} bytes/s), got {}", l, k.peak, rate_bytes_per_s);
  TANDEM_REQUIRE(burst_bytes >= kBucketFrameBytes && std::isfinite(burst_bytes),
                 "link {}: token bucket burst must hold a frame ({} bytes), got {}", l, kBucketFrameBytes, burst_bytes);
  TANDEM_REQUIRE(k.flows.empty(), "link {}: token bucket set while flows use it", l);
  k.bucket_rate = rate_bytes_per_s;
  k.burst = k.tokens = burst_bytes;
  k.bucket_last = sim_.now();
  has_buckets_ = true;
}

void Network::set_fifo_queue(LinkId l, double queue_bytes) {
  TANDEM_REQUIRE(l < links_.size(), "FIFO queue: link {} does not exist ({} links)", l, links_.size());
  TANDEM_REQUIRE(queue_bytes > 0 && std::isfinite(queue_bytes), "link {}: a FIFO queue must hold a finite number of "
                 "bytes > 0, got {}", l, queue_bytes);
  Link& k = links_[l];
  TANDEM_REQUIRE(k.flows.empty(), "link {}: FIFO queue set while flows use it", l);
  TANDEM_REQUIRE(std::isfinite(k.peak), "link {}: a FIFO queue needs a link of finite bandwidth", l);
  k.fifo_q = queue_bytes;
  k.fifo_at = sim_.now();
  has_fifo_ = true;
}

const std::vector<LinkId> Network::route_links(RouteId r) const {
  const Route& rt = routes_.at(r);
  return {route_links_.begin() + rt.offset, route_links_.begin() + rt.offset + rt.length - (rt.conn ? 1 : 0)};
}

std::optional<ConnectionState> Network::connection_state(RouteId r) const {
  const Route& rt = routes_.at(r);
  if (!rt.conn) return std::nullopt;
  const Link& c = links_[route_links_[rt.offset + rt.length - 1]];
  return ConnectionState{c.held, c.conn_idle_since};
}

void Network::set_connection_state(RouteId r, const ConnectionState& s) {
  const Route& rt = routes_.at(r);
  TANDEM_REQUIRE(rt.conn, "route {}: not a connection with slow start", r);
  Link& c = links_[route_links_[rt.offset + rt.length - 1]];
  TANDEM_REQUIRE(c.flows.empty() && c.window == 0, "route {}: its connection is in use", r);
  c.held = s.held;
  c.conn_idle_since = s.idle_since;
}

std::vector<double> Network::current_rates() const {
  std::vector<double> out;
  for (const Flow& f : flows_)
    if (f.state == State::kActive) out.push_back(f.rate);
  return out;
}

void Network::start_flow(RouteId r, double bytes, FlowObserver* observer, uint64_t tag, des::TimeNs latency_ns,
                         double weight) {
  TANDEM_REQUIRE(r < routes_.size(), "flow on route {}: no such route ({} routes)", r, routes_.size());
  TANDEM_REQUIRE(bytes >= 0 && std::isfinite(bytes), "flow of {} bytes: size must be finite and >= 0", bytes);
  TANDEM_REQUIRE(weight > 0 && std::isfinite(weight), "flow of {} bytes: share weight must be finite and > 0, got {}",
                 bytes, weight);
  FlowId f;
  if (!free_flows_.empty()) {
    f = free_flows_.back();
    free_flows_.pop_back();
  } else {
    f = static_cast<FlowId>(flows_.size());
    TANDEM_CHECK(flows_.size() < (uint64_t{1} << 32) - 1, Status::kOutOfMemory, "too many concurrent flows");
    flows_.emplace_back();
  }
  Flow& fl = flows_[f];
  fl.state = State::kLatency;
  fl.route = r;
  fl.bytes = bytes;
  fl.observer = observer;
  fl.tag = tag;
  ++flows_started_;
  const Route& rt = routes_[r];
  fl.latency = latency_ns >= 0 ? latency_ns : rt.latency_ns;
  fl.weight = rt.weight * weight;
  if (has_fifo_ && bytes > 0 && rt.length > 0) {
    const LinkId first = route_links_[rt.offset];
    Link& q = links_[first];
    if (q.fifo_q > 0) {  // waits in kLatency until admit_queued, at the end of this instant
      if (q.fifo_new.empty()) fifo_links_.push_back(first);
      q.fifo_new.push_back(f);
      return;
    }
  }
  if (fl.latency == 0 && bytes > 0 && rt.length > 0) {
    activate(f);
  } else {
    sim_.schedule_in(fl.latency, this, pack(f, fl.gen, true));
  }
}

void Network::on_event(uint64_t arg) {
  const FlowId f = static_cast<FlowId>((arg >> 1) & 0xffffffffu);
  const uint32_t gen = static_cast<uint32_t>(arg >> 33);
  Flow& fl = flows_[f];
  if ((fl.gen & 0x7fffffffu) != gen) return;  // stale: rescheduled or finished since
  if (arg & 1u) {
    activate(f);
  } else if (fl.state == State::kActive) {
    finish(f);
  }
}

void Network::activate(FlowId f) {
  Flow& fl = flows_[f];
  const Route& rt = routes_[fl.route];
  if (fl.bytes <= 0 || rt.length == 0) {
    fl.state = State::kActive;  // nothing to send: done at the end of its latency
    fl.pos.clear();
    finish(f);
    return;
  }
  fl.state = State::kActive;
  fl.last = sim_.now();
  fl.remaining = fl.bytes;
  fl.rate = 0;
  fl.pos.resize(rt.length);
  ++active_count_;
  if (rt.conn) {
    Link& c = links_[route_links_[rt.offset + rt.length - 1]];
    if (c.flows.empty()) conn_start(c);
  }
  // Fast path: when every link of the route is idle, the flow is a component of its own and its
  // rate is the route's narrowest link; later changes on these links recompute it with the rest.
  bool idle = true;
  double rate = kUnlimited;
  for (uint32_t i = 0; i < rt.length; ++i) {
    const Link& l = links_[route_links_[rt.offset + i]];
    idle = idle && l.flows.empty() && l.bucket_rate == 0;  // a bucket's state is settled in recompute()
    rate = std::min(rate, l.capacity / route_coef_[rt.offset + i]);
  }
  for (uint32_t i = 0; i < rt.length; ++i) {
    LinkId lid = route_links_[rt.offset + i];
    Link& l = links_[lid];
    fl.pos[i] = static_cast<uint32_t>(l.flows.size());
    l.flows.push_back(f);
    l.coef.push_back(route_coef_[rt.offset + i]);
    ++l.stats.flows;
    if (!idle) mark_dirty(lid);
  }
  if (idle) {
    fl.rate = rate;
    schedule_completion(f);
  }
}

void Network::finish(FlowId f) {
  Flow& fl = flows_[f];
  const Route& rt = routes_[fl.route];
  if (!fl.pos.empty()) {
    for (uint32_t i = 0; i < rt.length; ++i) {
      LinkId lid = route_links_[rt.offset + i];
      Link& l = links_[lid];
      uint32_t p = fl.pos[i];
      if (l.bucket_rate > 0) settle_bucket(l, sim_.now());
      FlowId moved = l.flows.back();
      l.flows[p] = moved;
      l.flows.pop_back();
      l.coef[p] = l.coef.back();
      l.coef.pop_back();
      if (moved != f) {
        // find which route position of `moved` refers to this link (routes are short)
        Flow& m = flows_[moved];
        const Route& mr = routes_[m.route];
        for (uint32_t j = 0; j < mr.length; ++j) {
          if (route_links_[mr.offset + j] == lid && m.pos[j] == l.flows.size()) {
            m.pos[j] = p;
            break;
          }
        }
      }
      l.stats.bytes += fl.bytes * route_coef_[rt.offset + i];
      if (!l.flows.empty()) {
        mark_dirty(lid);
      } else if (l.conn_rtt > 0) {
        conn_idle(l, fl.rate);
      } else if (l.bucket_rate > 0) {
        l.load = 0;
        ++l.bucket_gen;  // no longer draining
      }
    }
    --active_count_;
  }
  FlowObserver* obs = fl.observer;
  uint64_t tag = fl.tag;
  fl.state = State::kFree;
  fl.gen = (fl.gen + 1) & 0x7fffffffu;
  fl.pos.clear();
  free_flows_.push_back(f);
  obs->on_flow_done(tag);
}

void Network::mark_dirty(LinkId l) {
  if (!links_[l].dirty) {
    links_[l].dirty = true;
    dirty_.push_back(l);
  }
}

void Network::on_instant_end() {
  if (!fifo_links_.empty()) admit_queued();
  if (!dirty_.empty()) recompute();
}

void Network::admit_queued() {
  const des::TimeNs now = sim_.now();
  for (LinkId lid : fifo_links_) {
    Link& q = links_[lid];
    // what the link could send since the last start drains the windows queued then (its rate now: a token
    // bucket's varies, and the backlog is an estimate of the queue, not a record of it)
    const double cap = q.capacity;
    q.fifo_backlog = std::max(0.0, q.fifo_backlog - cap * des::to_seconds(now - q.fifo_at));
    q.fifo_at = now;
    const double window =
        std::min(kTcpSmallQueueBytes, q.fifo_q / static_cast<double>(q.flows.size() + q.fifo_new.size()));
    for (FlowId f : q.fifo_new) {
      Flow& fl = flows_[f];
      const Route& rt = routes_[fl.route];
      const des::TimeNs wait = des::to_ns(q.fifo_backlog / cap);
      q.fifo_backlog = std::min(q.fifo_q, q.fifo_backlog + std::min(fl.bytes * route_coef_[rt.offset], window));
      if (wait == 0 && fl.latency == 0) {
        activate(f);
      } else {
        sim_.schedule_in(wait + fl.latency, this, pack(f, fl.gen, true));
      }
    }
    q.fifo_new.clear();
  }
  fifo_links_.clear();
}

void Network::recompute() {
  ++epoch_;
  for (size_t d = 0; d < dirty_.size(); ++d) {
    LinkId start = dirty_[d];
    links_[start].dirty = false;
    if (links_[start].mark == epoch_) continue;  // already solved with an earlier dirty link
    comp_links_.clear();
    comp_flows_.clear();
    links_[start].mark = epoch_;
    comp_links_.push_back(start);
    for (size_t i = 0; i < comp_links_.size(); ++i) {
      const Link& l = links_[comp_links_[i]];
      for (FlowId f : l.flows) {
        Flow& fl = flows_[f];
        if (fl.mark == epoch_) continue;
        fl.mark = epoch_;
        comp_flows_.push_back(f);
        const Route& rt = routes_[fl.route];
        for (uint32_t k = 0; k < rt.length; ++k) {
          LinkId l2 = route_links_[rt.offset + k];
          if (links_[l2].mark != epoch_) {
            links_[l2].mark = epoch_;
            comp_links_.push_back(l2);
          }
        }
      }
    }
    if (!comp_flows_.empty()) solve_component();
  }
  dirty_.clear();
}

// Weighted progressive filling over the component in comp_links_/comp_flows_: a link's level is its
// capacity left per unit of unfixed weight; the lowest level fixes its flows at weight * level.
// Levels of the remaining links only grow as bottlenecks are removed, so a lazy min-heap with stale
// entries skipped is exact.
void Network::solve_component() {
  heap_.clear();
  const des::TimeNs now = sim_.now();
  for (LinkId lid : comp_links_) {
    Link& l = links_[lid];
    if (l.bucket_rate > 0) {  // the tokens as they are now set the link's capacity until the next change
      settle_bucket(l, now);
      l.capacity = l.tokens >= std::min(l.burst, kBucketFrameBytes) ? l.peak : l.bucket_rate;
    }
    l.rem = l.capacity;
    l.unfixed = static_cast<uint32_t>(l.flows.size());
    l.wsum = 0;
    for (size_t i = 0; i < l.flows.size(); ++i) l.wsum += flows_[l.flows[i]].weight * l.coef[i];
    if (l.unfixed > 0) heap_.emplace_back(l.rem / l.wsum, lid);
  }
  for (FlowId f : comp_flows_) flows_[f].fixed = false;
  auto cmp = std::greater<std::pair<double, LinkId>>();
  std::make_heap(heap_.begin(), heap_.end(), cmp);
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), cmp);
    auto [level, lid] = heap_.back();
    heap_.pop_back();
    Link& l = links_[lid];
    if (l.unfixed == 0 || level != l.rem / l.wsum) continue;  // stale entry
    for (FlowId f : l.flows) {
      Flow& fl = flows_[f];
      if (fl.fixed) continue;
      fl.fixed = true;
      const Route& rt = routes_[fl.route];
      const double rate = level * fl.weight;
      for (uint32_t k = 0; k < rt.length; ++k) {
        LinkId l2id = route_links_[rt.offset + k];
        Link& l2 = links_[l2id];
        const double c = route_coef_[rt.offset + k];
        --l2.unfixed;
        l2.wsum = l2.unfixed == 0 ? 0.0 : std::max(l2.wsum - fl.weight * c, 1e-300);
        if (!std::isinf(rate)) l2.rem = std::max(0.0, l2.rem - rate * c);
        if (l2id != lid && l2.unfixed > 0) {
          heap_.emplace_back(l2.rem / l2.wsum, l2id);
          std::push_heap(heap_.begin(), heap_.end(), cmp);
        }
      }
      if (fl.rate != rate) {
        settle(fl, now);
        fl.rate = rate;
        ++rate_updates_;
        schedule_completion(f);
      }
    }
  }
  if (has_buckets_)
    for (LinkId lid : comp_links_)
      if (links_[lid].bucket_rate > 0) bucket_load(lid);
}

void Network::settle_bucket(Link& l, des::TimeNs now) {
  if (now > l.bucket_last) {
    l.tokens = std::clamp(l.tokens + (l.bucket_rate - l.load) * des::to_seconds(now - l.bucket_last), 0.0, l.burst);
    l.bucket_last = now;
  }
}

void Network::bucket_load(LinkId lid) {
  Link& l = links_[lid];
  double load = 0;
  for (size_t i = 0; i < l.flows.size(); ++i) load += flows_[l.flows[i]].rate * l.coef[i];
  l.load = load;
  ++l.bucket_gen;
  if (load > l.bucket_rate && l.tokens > 0 && !std::isinf(load)) {
    const des::TimeNs at = sim_.now() + des::ceil_ns(l.tokens / (load - l.bucket_rate));
    sim_.schedule_at(at, &bucket_events_, (static_cast<uint64_t>(l.bucket_gen) << 32) | lid);
  }
}

// A bucket ran dry: its link drops to the bucket's rate (recomputed at the end of the instant).
void Network::bucket_empty(uint64_t arg) {
  const auto lid = static_cast<LinkId>(arg & 0xffffffffu);
  Link& l = links_[lid];
  if (static_cast<uint32_t>(arg >> 32) != l.bucket_gen) return;
  settle_bucket(l, sim_.now());
  l.tokens = 0;
  if (!l.flows.empty()) mark_dirty(lid);
}

// As Linux's tcp_cwnd_restart: after more than an RTO of idle, the window held is halved once per RTO
// beyond the first, down to the initial window; below the path's full rate it starts a slow start.
void Network::conn_start(Link& c) {
  const des::TimeNs now = sim_.now();
  if (c.held < 0) c.held = c.full_rate * des::to_seconds(c.conn_rtt);  // as if it had run at full rate
  const des::TimeNs rto = c.conn_rtt + des::to_ns(kTcpMinRtoS);
  if (now - c.conn_idle_since <= rto) return;
  const double restart = std::min(c.conn_iw, c.held);
  double w = c.held;
  for (des::TimeNs d = now - c.conn_idle_since - rto; d > 0 && w > restart; d -= rto) w /= 2;
  w = std::max(w, restart);
  if (w / des::to_seconds(c.conn_rtt) >= c.full_rate) return;
  ++slow_starts_;
  c.window = w;
  c.capacity = w / des::to_seconds(c.conn_rtt);
  ++c.conn_gen;
  const auto lid = static_cast<LinkId>(&c - links_.data());
  sim_.schedule_in(c.conn_rtt, &round_events_, (static_cast<uint64_t>(c.conn_gen) << 32) | lid);
}

// The connection's last flow left: it holds the window it reached (its last rate over one RTT).
void Network::conn_idle(Link& c, double last_rate) {
  const double rtt = des::to_seconds(c.conn_rtt);
  c.held = std::max(c.conn_iw, c.window > 0 ? std::min(c.window, last_rate * rtt) : last_rate * rtt);
  c.conn_idle_since = sim_.now();
  c.window = 0;
  c.capacity = kUnlimited;
  ++c.conn_gen;  // its pending round is void
}

// One RTT of slow start passed: a window that bound the connection's rate doubles; one that did not
// (the flows are limited elsewhere), or that reaches the path's full rate, ends slow start.
void Network::slow_start_round(uint64_t arg) {
  const auto lid = static_cast<LinkId>(arg & 0xffffffffu);
  Link& c = links_[lid];
  if (static_cast<uint32_t>(arg >> 32) != c.conn_gen || c.window <= 0 || c.flows.empty()) return;
  double rate = 0;
  for (FlowId f : c.flows) rate += flows_[f].rate;
  const double rtt = des::to_seconds(c.conn_rtt);
  if (rate < c.capacity * (1 - 1e-9) || 2 * c.window / rtt >= c.full_rate) {
    c.capacity = kUnlimited;
    c.window = 0;
  } else {
    c.window *= 2;
    c.capacity = c.window / rtt;
    sim_.schedule_in(c.conn_rtt, &round_events_, (static_cast<uint64_t>(c.conn_gen) << 32) | lid);
  }
  mark_dirty(lid);
}

void Network::settle(Flow& fl, des::TimeNs now) {
  if (now > fl.last) {
    fl.remaining = std::max(0.0, fl.remaining - fl.rate * des::to_seconds(now - fl.last));
    fl.last = now;
  }
}

void Network::schedule_completion(FlowId f) {
  Flow& fl = flows_[f];
  fl.gen = (fl.gen + 1) & 0x7fffffffu;  // older completion events become stale
  des::TimeNs at = fl.last;
  if (!std::isinf(fl.rate) && fl.remaining > 0) {
    TANDEM_CHECK(fl.rate > 0, Status::kInternal, "flow {} has rate 0 on a finite route", f);
    at += des::ceil_ns(fl.remaining / fl.rate);
  }
  sim_.schedule_at(std::max(at, sim_.now()), this, pack(f, fl.gen, false));
}

}  // namespace tandem::simulator::network
