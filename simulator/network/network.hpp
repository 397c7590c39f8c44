#pragma once
// Flow-level network model (the max-min model of SimGrid's CM02 without correction factors).
//
// A transfer is a flow along a route of unidirectional links. It first waits the route's latency
// (the sum of its links' latencies) without using bandwidth, then joins its links; concurrent flows
// share every link max-min fairly (progressive filling: the most constrained link fixes the rate of
// its flows, which are removed, and so on). Rates are recomputed when a flow joins or leaves, once
// per simulated instant, and only over the connected component of flows that share links (directly
// or transitively) with a changed link -- every other flow's rate provably stays the same, so its
// completion event is left alone. That keeps a step of a 1,024-node ring all-reduce linear in the
// number of transfers.
//
// Sharing::kRttWeighted is SimGrid CM02's variant: a flow's share on a link is proportional to
// 1 / (its route latency), as TCP's throughput is to 1/RTT (a route with no latency weighs 1, as in
// SimGrid). kMaxMin (the default) gives every flow the same weight.
//
// Wire costs (issue #16). A route may charge each of its links a multiple of the flow's rate (its
// payload rate): TCP's headers make a data link carry 1514/1448 bytes per payload byte, and its ACKs
// load the links of the reverse path (add_route's RouteCost); the max-min solution then holds
// sum(coefficient x rate) <= capacity on every link. A link may also carry a token bucket
// (set_token_bucket): it runs at its capacity (the line rate) while it holds at least one frame of
// tokens, which fill at the bucket's rate up to the burst and drain at (load - rate); empty, its
// capacity is the bucket's rate. Links without either keep the plain model, and so its speed.
// Max-min fixes every flow on its bottleneck, so a flow whose ACKs cross a busy link is held to that link's
// level, C / (n x data + ack). That already couples a link's two directions at least as tightly as an ACK clock
// behind a reverse FIFO would (window / (RTT + backlog / C) with the sender-queue windows below; tried and measured
// in bench/strategies/README.md, session 13).
//
// Slow start after idle (issue #16; Linux's net.ipv4.tcp_slow_start_after_idle=1, tcp_cwnd_restart,
// RFC 2861). A route given a SlowStart is one TCP connection: it gets a private "connection" link,
// unlimited unless it is in slow start, that all its flows cross. When a flow starts on a connection
// that has carried nothing for longer than its RTO (RTT + the 200 ms minimum), the congestion window it
// held (the last rate times the RTT; a connection never used counts as having run at its path's full
// rate) is halved once per RTO of the idle time beyond the first, but not below the initial window
// (10 segments, RFC 6928). While that window is below the path's full rate times the RTT, the
// connection link's capacity is window / RTT, and it doubles every RTT for as long as it binds
// (the connection is window limited); once it no longer binds or reaches the full rate, slow start
// ends. Concurrent flows of one connection share its window.
//
// A queue at the sender (issue #13; set_fifo_queue). A link may have a drop-tail FIFO of Q wire bytes at its
// entrance: a host NIC's qdisc, such as a tbf's limit. TCP flows posted on it together (a parameter server
// answering every worker at once) then do not start together: the sender's kernel queues each connection's
// window in the order the flows were posted, and a flow's first byte leaves after the windows queued ahead of
// it. Measured on the emulated t2.micro cluster (bench/strategies/ps_capture.py): a server's four replies started
// on the wire after 0, 43, 166 and 295 kB of the others, and the first ended at 82 ms where max-min sharing of
// replies started together ends all four at 122 ms. The model: when flows start on such a link, each of the n
// flows then on it (in transmission, or starting in this instant) queues a window of min(Q / n, 128 KiB): flows
// filling one drop-tail queue settle at equal shares of it, and Linux's TCP small queues let one socket hold at
// most two 64 KB GSO packets in the qdisc (kTcpSmallQueueBytes). The link keeps a backlog, at most Q: the windows
// queued by earlier starts less what the link could have sent since. A starting flow waits backlog / capacity
// before it joins the link (before its route's latency), then adds min(its wire bytes, its window) to the
// backlog; once it has joined it shares the link max-min as every flow does. Links without a queue, and every
// flow that starts on one alone on an empty queue, start as before.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "simulator/des/simulator.hpp"

namespace tandem::simulator::network {

using LinkId = uint32_t;
using RouteId = uint32_t;
using FlowId = uint32_t;
constexpr double kUnlimited = std::numeric_limits<double>::infinity();

// Receives completions. `tag` is the caller's value given to start_flow.
class FlowObserver {
 public:
  virtual void on_flow_done(uint64_t tag) = 0;

 protected:
  ~FlowObserver() = default;
};

// What a route's flows cost its links per payload byte: `data` on its own links, `ack` on
// `ack_links` (the reverse path, whose latency the flow does not wait).
struct RouteCost {
  double data = 1.0;
  std::vector<uint32_t> ack_links;
  double ack = 0.0;
};

// A TCP connection's slow start after idle (rtt_s 0: none; see the header comment).
constexpr double kTcpMinRtoS = 0.2;            // Linux's TCP_RTO_MIN
constexpr double kTcpInitialWindowSegments = 10;  // RFC 6928, Linux's TCP_INIT_CWND
struct SlowStart {
  double rtt_s = 0;           // round trip: the data path's latency and the ACK path's
  double initial_window = 0;  // payload bytes (kTcpInitialWindowSegments x MSS)
  double data_cost = 0;       // wire bytes per payload byte that bound the path's full rate (0: the route's data cost)
};

// A connection's slow-start state to carry into the next step: the window it held when it last went idle
// (< 0: never used) and when.
struct ConnectionState {
  double held = -1;
  des::TimeNs idle_since = 0;
};

// What one TCP socket may hold in its host's qdisc: Linux's TCP small queues (tcp_small_queue_check) allow two
// GSO packets of up to 64 KB, whatever the congestion window.
constexpr double kTcpSmallQueueBytes = 2.0 * 65536;

// Tokens one frame needs: a bucket with less runs at its rate (tbf sends whole packets).
constexpr double kBucketFrameBytes = 1514;

struct LinkStats {
  double bytes = 0;       // bytes carried so far (wire bytes: payload x the route's cost)
  uint64_t flows = 0;     // flows that have used the link
};

enum class Sharing : uint8_t { kMaxMin = 0, kRttWeighted = 1 };

class Network final : public des::EventHandler, public des::InstantHook {
 public:
  explicit Network(des::Simulator& sim, Sharing sharing = Sharing::kMaxMin);
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // bandwidth in bytes/s (> 0, may be kUnlimited); latency in seconds (>= 0).
  LinkId add_link(double bandwidth_bytes_per_s, double latency_s);
  // A route is an ordered list of links (it may be empty: a local copy that takes no time).
  RouteId add_route(const std::vector<LinkId>& links);
  RouteId add_route(const std::vector<LinkId>& links, const RouteCost& cost);
  // A route that is one TCP connection with slow start after idle (ss.rtt_s > 0 and a non-empty route).
  RouteId add_route(const std::vector<LinkId>& links, const RouteCost& cost, const SlowStart& ss);
  // A token bucket on link l: tokens fill at rate_bytes_per_s (< the link's bandwidth) up to
  // burst_bytes; the bucket starts full.
  void set_token_bucket(LinkId l, double rate_bytes_per_s, double burst_bytes);
  // A drop-tail FIFO of queue_bytes (> 0, wire bytes) at link l's entrance: flows whose route starts on l
  // wait for the windows queued ahead of them (see the header comment).
  void set_fifo_queue(LinkId l, double queue_bytes);

  size_t num_links() const noexcept { return links_.size(); }
  double link_bandwidth(LinkId l) const { return links_.at(l).capacity; }
  double link_latency_s(LinkId l) const { return des::to_seconds(links_.at(l).latency_ns); }
  double route_latency_s(RouteId r) const { return des::to_seconds(routes_.at(r).latency_ns); }
  const std::vector<LinkId> route_links(RouteId r) const;
  const LinkStats& link_stats(LinkId l) const { return links_.at(l).stats; }
  // A slow-start route's connection (nullopt for other routes), and setting it (before its first flow): slow start
  // after idle counted across steps (Topology::resume_connections).
  std::optional<ConnectionState> connection_state(RouteId r) const;
  void set_connection_state(RouteId r, const ConnectionState& s);

  // Starts a flow of `bytes` (>= 0) on route `r` now; observer->on_flow_done(tag) runs when its
  // last byte has arrived. `latency_ns` (>= 0), where given, replaces the route's latency for this flow: a
  // message whose bytes follow an earlier one's on the same connection waits only what is left of it. `weight`
  // (> 0) multiplies the route's share weight for this flow alone: TCP connections through one FIFO share it in
  // proportion to their windows, which differ (Topology::fanout_cv's draws); 1: the route's.
  void start_flow(RouteId r, double bytes, FlowObserver* observer, uint64_t tag, des::TimeNs latency_ns = -1,
                  double weight = 1.0);

  size_t active_flows() const noexcept { return active_count_; }
  uint64_t flows_started() const noexcept { return flows_started_; }
  uint64_t rate_updates() const noexcept { return rate_updates_; }
  uint64_t slow_starts() const noexcept { return slow_starts_; }  // restarts after idle so far
  // Current rate of every flow in transmission, for tests (bytes/s), in no particular order.
  std::vector<double> current_rates() const;

  void on_event(uint64_t arg) override;
  void on_instant_end() override;

 private:
  enum class State : uint8_t { kFree, kLatency, kActive };
  struct Link {
    double capacity;
    des::TimeNs latency_ns;
    std::vector<FlowId> flows;  // flows in transmission
    uint32_t mark = 0;          // epoch stamp for component search
    bool dirty = false;
    double rem = 0;             // progressive filling scratch: capacity left,
    double wsum = 0;            // weight of the flows not yet fixed,
    uint32_t unfixed = 0;       // and their number
    std::vector<double> coef;   // per entry of `flows`: the flow's cost per payload byte here
    LinkStats stats;
    // token bucket (bucket_rate 0: none); `peak` is the line rate, `capacity` the current one
    double peak = 0, bucket_rate = 0, burst = 0, tokens = 0, load = 0;
    des::TimeNs bucket_last = 0;
    uint32_t bucket_gen = 0;
    // a connection link (conn_rtt > 0): window while in slow start (0: not), the window held when it
    // went idle (< 0: never used), when it went idle, its path's full payload rate
    des::TimeNs conn_rtt = 0, conn_idle_since = 0;
    double conn_iw = 0, window = 0, held = -1, full_rate = 0;
    uint32_t conn_gen = 0;
    // a FIFO at the entrance (fifo_q 0: none): the windows queued (wire bytes) as of fifo_at, and the flows
    // that start on it in this instant, in the order they were posted
    double fifo_q = 0, fifo_backlog = 0;
    des::TimeNs fifo_at = 0;
    std::vector<FlowId> fifo_new;
  };
  // Token buckets' "empty" events (a separate handler: the network's own events are flows').
  struct BucketEvents final : des::EventHandler {
    Network* net = nullptr;
    void on_event(uint64_t arg) override { net->bucket_empty(arg); }
  };
  struct RoundEvents final : des::EventHandler {  // slow start's rounds
    Network* net = nullptr;
    void on_event(uint64_t arg) override { net->slow_start_round(arg); }
  };
  struct Route {
    uint32_t offset;
    uint32_t length;            // links: the data path, then the ACK path
    des::TimeNs latency_ns;     // of the data path
    double weight;  // share weight of its flows (1, or 1/latency under kRttWeighted)
    bool conn = false;          // its last link is its connection link (slow start)
  };
  struct Flow {
    State state = State::kFree;
    RouteId route = 0;
    uint32_t gen = 0;          // invalidates stale completion events
    uint32_t mark = 0;
    bool fixed = false;
    double bytes = 0;
    double remaining = 0;      // bytes left at time `last`
    double rate = 0;           // bytes/s
    des::TimeNs last = 0;
    des::TimeNs latency = 0;   // waited before it joins its links: its route's, or what start_flow was told
    double weight = 1;         // share weight: its route's times start_flow's factor
    FlowObserver* observer = nullptr;
    uint64_t tag = 0;
    std::vector<uint32_t> pos; // index of this flow in each route link's `flows`
  };

  static uint64_t pack(FlowId f, uint32_t gen, bool activation) {
    return (static_cast<uint64_t>(gen) << 33) | (static_cast<uint64_t>(f) << 1) | (activation ? 1u : 0u);
  }
  void activate(FlowId f);
  void finish(FlowId f);
  void mark_dirty(LinkId l);
  void recompute();
  void solve_component();
  void settle(Flow& fl, des::TimeNs now);
  void schedule_completion(FlowId f);
  void settle_bucket(Link& l, des::TimeNs now);
  void bucket_load(LinkId l);  // after its flows' rates changed: the new load, and when it empties
  void bucket_empty(uint64_t arg);
  void conn_start(Link& c);     // a flow starts on an idle connection
  void conn_idle(Link& c, double last_rate);
  void slow_start_round(uint64_t arg);
  void admit_queued();          // at the end of an instant: flows posted on FIFO links wait their turn

  des::Simulator& sim_;
  Sharing sharing_;
  std::vector<Link> links_;
  std::vector<Route> routes_;
  std::vector<LinkId> route_links_;
  std::vector<double> route_coef_;  // per entry of route_links_
  bool has_buckets_ = false;
  bool has_fifo_ = false;
  std::vector<LinkId> fifo_links_;  // FIFO links with flows posted in this instant
  BucketEvents bucket_events_;
  RoundEvents round_events_;
  uint64_t slow_starts_ = 0;
  std::vector<Flow> flows_;
  std::vector<FlowId> free_flows_;
  std::vector<LinkId> dirty_;
  // component scratch
  std::vector<LinkId> comp_links_;
  std::vector<FlowId> comp_flows_;
  std::vector<std::pair<double, LinkId>> heap_;
  uint32_t epoch_ = 0;
  size_t active_count_ = 0;
  uint64_t flows_started_ = 0;
  uint64_t rate_updates_ = 0;
};

}  // namespace tandem::simulator::network
