#include "transports/ucx/ucx_transport.hpp"

#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"
#include "transports/completion.hpp"
#include "transports/match_key.hpp"
#include "transports/core_transport.hpp"
#include "transports/parts.hpp"

namespace tandem::transports::ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRankShift = 40;
constexpr int kMaxRank = (1 << 23) - 1;
constexpr uint64_t kControlBit = uint64_t{1} << 63;
constexpr uint64_t kFullMask = ~uint64_t{0};
constexpr uint64_t kHello = 1;
constexpr uint64_t kGoodbye = 2;
// Hearing checks (see Core::check_hearing): a probe from this rank's own sentinel worker; a deaf rank's notice to its
// same-host peers (payload: the sentinel's address and why); a peer's answer to it, sent to the sentinel.
constexpr uint64_t kProbe = 3;
constexpr uint64_t kDeaf = 4;
constexpr uint64_t kDeafAck = 5;
// A rank that could not keep a copy of a cancelled send (no memory, see Core::keep_source) cuts its endpoint to the
// receiver and tells it so: nothing that rank sent it and it has not taken whole can be trusted any more.
constexpr uint64_t kCutOff = 6;
// How long that rank progresses for the notice to leave before it closes the endpoint (which would drop it).
constexpr auto kCutOffNotice = std::chrono::milliseconds(200);
// How long a probe may go unheard, over at least kDeafProbeRounds rounds of progress, before the worker is deaf.
constexpr auto kDeafProbe = std::chrono::milliseconds(50);
constexpr int kDeafProbeRounds = 64;
constexpr size_t kMaxDeafNotice = 4096;
constexpr auto kReconnectPoll = std::chrono::milliseconds(10);  // reconnect reads a peer's address, progressing between
constexpr auto kShutdownDeadline = std::chrono::seconds(2);
constexpr auto kWatchInterval = std::chrono::milliseconds(100);
// Shared-memory UCX needs polling, so a waiter polls and yields -- while the worker is busy. After
// the busy window (TANDEM_UCX_BUSY_US, default 2 ms) without any event (nothing completed, arrived or was posted: a pipeline stage waiting
// for its activations, an idle progress thread with a receive posted) it sleeps kIdleSleep between
// polls instead: a yielding poller kept a core busy all the time and took it from compute threads.
// (0: sleep between polls whenever a wait finds nothing; lowest CPU, most latency.)
constexpr auto kDefaultBusyWindow = std::chrono::microseconds(2000);  // TANDEM_UCX_BUSY_US
constexpr auto kIdleSleep = std::chrono::microseconds(50);
constexpr auto kStuckGrace = std::chrono::milliseconds(200);
constexpr auto kDropInterval = std::chrono::milliseconds(1);
// A receive shorter than its message gets the prefix through a bounce buffer of the message's
// size; a length from the wire above this is consumed without data (size and truncation only).
constexpr size_t kMaxBounceBytes = size_t{1} << 30;

std::chrono::microseconds busy_window_from_env() {
  const auto us = settings::current()->integer("TANDEM_UCX_BUSY_US");  // [0, 60000000]
  return us ? std::chrono::microseconds(*us) : kDefaultBusyWindow;
}

uint64_t wire_tag(int src, uint64_t tag) { return (static_cast<uint64_t>(src) << kRankShift) | tag; }
uint64_t control_tag(int src, uint64_t kind) { return kControlBit | wire_tag(src, kind); }
int tag_source(uint64_t wire) { return static_cast<int>((wire >> kRankShift) & kMaxRank); }

class Core;

struct ErrArg {  // what UCX hands back to the endpoint error handler
  Core* core;
  int peer;
};

// One send or receive. Alive while a UCX request references it (Core::inflight_) or a Request does.
struct Op {
  Core* core = nullptr;
  bool is_send = false;
  bool control = false;  // a hello or goodbye: nobody waits on it
  int peer = 0;
  uint64_t tag = 0;
  std::vector<MutPart> parts;
  size_t capacity = 0;
  size_t msg_bytes = 0;
  std::vector<char> bounce;  // only for a receive shorter than its message
  // Every message with data is sent and received through the generic datatype (copied_datatype): UCX asks this Op for
  // the bytes (pack_op) and hands them to it (unpack_op), and never holds a pointer into the caller's parts -- neither
  // this rank's UCX nor a peer's (no zero-copy rendezvous: nothing of the caller's is registered or announced). An
  // operation given up on (cancelled, or a receive failed mid-message) may still be finished by UCX later and must
  // then not touch memory its caller freed: a receive takes data only while it is pending for its caller; a send reads
  // `source`, which let_go points away from the caller's parts at once. That holds at every size, so no cancel waits
  // for UCX; the cost is the rendezvous's zero-copy path (bench/transports/p2p_bench: see the ucx note in
  // transport.hpp).
  bool copied = false;
  // A copied send's data: the caller's parts; once let go of, `kept` (a copy of the whole message), or nothing when
  // its endpoint is closed (its peer is gone, or this rank cut it off for want of memory for the copy): pack_op is
  // then never asked for data that would leave, and writes zeros into UCX's own buffer if it is asked at all.
  std::vector<ConstPart> source;
  std::unique_ptr<char[]> kept;
  void* req = nullptr;       // the UCX request while in flight
  ucp_worker_h worker = nullptr;  // the worker that holds req (the rank's worker when it was posted)
  // Cancelled (or failed) while UCX still held it: it has failed for its caller, nobody waits for it (shutdown
  // neither), and UCX finishes or drops it on its own.
  bool abandoned = false;
  Completion done;
};

// kCut: alive, but one of the two can no longer hear the other over shared memory (a deaf worker, see
// Core::check_hearing), and both have let go of everything between them: nothing is waited for.
enum class PeerState { kAlive, kClosed, kLost, kCut };

struct Peer {
  ucp_ep_h ep = nullptr;
  PeerState state = PeerState::kAlive;
  bool ep_failed = false;
  pid_t watch_pid = 0;  // same host and pid namespace: liveness is checked through /proc
  bool hello = false;
  std::string why;
  Clock::time_point gone_at{};  // when it stopped being alive
  bool owes_deaf_ack = false;   // this rank is deaf and told it so; it has not yet let go of this rank's messages
  ucp_ep_h ack_ep = nullptr;    // to its sentinel worker, after it went deaf (the acknowledgement went there)
  std::vector<unsigned char> address;  // the worker address `ep` was made with (reconnect compares it)
  bool same_host = false;              // same kernel and pid namespace: endpoints in mode NONE (shared memory)
  bool cut_by_us = false;  // this rank cut it off for want of memory (cut_off): the fault is this rank's (at_fault)
  // It is known gone: its goodbye, its pid on this host exited, or UCX reset the connection to it -- not a keepalive
  // timeout nor a cut (kCut: both alive): Transport::dead_peers lists it.
  bool ended = false;
};

// Identifies this kernel and pid namespace: peers with the same key can watch each other's pids.
std::string host_key() {
  std::string boot;
  if (std::ifstream in("/proc/sys/kernel/random/boot_id"); in) std::getline(in, boot);
  std::error_code ec;
  const auto ns = std::filesystem::read_symlink("/proc/self/ns/pid", ec).string();
  return boot.empty() || ns.empty() ? std::string("unknown") : boot + "/" + ns.substr(ns.find('[') + 1, ns.size());
}

// False once `pid` has exited (gone, or a zombie nobody reaped yet).
bool process_alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return false;
  const size_t paren = stat.rfind(')');
  const char state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
  return state != 'Z' && state != 'X';
}

// Closes `ep` without flushing; returns UCX's request for the close (to free), or nullptr.
void* close_without_flush(ucp_ep_h ep) {
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t s = ucp_ep_close_nbx(ep, &prm);
  return s != nullptr && !UCS_PTR_IS_ERR(s) ? s : nullptr;
}

// Statuses that mean the peer went away. UCS_ERR_SHMEM_SEGMENT comes only from shared-memory transports (a
// peer on this host) when the peer's segment can no longer be attached: its worker was destroyed, the peer left.
bool is_peer_error(ucs_status_t s) {
  return s == UCS_ERR_CONNECTION_RESET || s == UCS_ERR_ENDPOINT_TIMEOUT || s == UCS_ERR_UNREACHABLE ||
         s == UCS_ERR_REJECTED || s == UCS_ERR_IO_ERROR || s == UCS_ERR_SHMEM_SEGMENT;
}

std::string to_hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s(2 * n, '0');
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

bool from_hex(const std::string& s, std::vector<unsigned char>& out) {
  if (s.size() % 2) return false;
  out.resize(s.size() / 2);
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

class Core {
 public:
  explicit Core(const TransportOptions& o);
  ~Core() { shutdown(); }

  int rank() const { return rank_; }
  int size() const { return size_; }

  std::shared_ptr<Op> send(int peer, uint64_t tag, std::span<const ConstPart> parts);
  std::shared_ptr<Op> recv(int peer, uint64_t tag, std::span<const MutPart> parts);
  void progress();
  void wait_for_progress(std::chrono::microseconds timeout);
  void cancel(const std::shared_ptr<Op>& op);
  // A request that completes or fails while UCX still holds its send (a peer that died): lets go as cancel does.
  void release(const std::shared_ptr<Op>& op);
  void drop_unexpected(uint64_t tag, uint64_t mask);
  void shutdown() noexcept;
  void reconnect(KvStore& store, const std::string& key_prefix, std::span<const int> peers,
                 std::chrono::milliseconds timeout);
  int at_fault(int peer);  // Transport::at_fault
  std::vector<int> dead_peers();  // Transport::dead_peers

  // Called by UCX from inside ucp_worker_progress / ucp_request_cancel (mu_ held).
  void on_complete(Op* op, void* request, ucs_status_t status);
  void on_ep_error(int peer, ucs_status_t status);

 private:
  void connect(const TransportOptions& o);
  // "<address hex> <pid> <host key>": what this rank publishes for its worker; and a peer's, read back.
  struct Record {
    std::vector<unsigned char> address;
    pid_t pid = 0;
    std::string host;
  };
  std::string record() const;
  Record parse_record(int peer, const std::string& value) const;
  ucp_ep_h make_ep(int peer);  // from worker_ to peers_[peer].address, in the mode its host calls for
  std::shared_ptr<Op> post_send(int peer, uint64_t wire, std::span<const ConstPart> parts, bool control);
  void start_recv(const std::shared_ptr<Op>& op, ucp_tag_message_h msg, size_t length);
  void finish_recv(Op& op, ucs_status_t status);
  void drive(int rounds);
  // One round of everything progress() does (mu_ held): every waiting loop runs it, so a rank waiting in a cancel
  // still takes what its peers wait for -- matches posted receives, drops retired tags, notices deaths.
  void pump();
  void fail_stuck_receives();
  void touch() noexcept;  // the worker just did something: waiters keep polling

  void handle_control();
  void match_posted();
  // Consumes every message still queued unmatched (at shutdown, so UCX has none to complain about).
  void discard_unexpected();
  // Consumes the unmatched messages on the tags drop_unexpected retired (mu_ held).
  void drop_retired();
  // Receives without a buffer the unmatched messages from live ranks (and this one) whose tag matches `tag` under
  // `mask` (the low 40 bits; `control`: control messages too). A gone rank's are left to UCX: answering its
  // rendezvous would read a dead process's memory (UCX 1.13 aborts on that with CMA) or queue a reply on its
  // closed endpoint, which ucp_worker_destroy then trips over.
  void consume_unmatched(uint64_t tag, uint64_t mask, bool control, int only = -1);
  // `ended`: it is known gone (Peer::ended; a goodbye, kClosed, always is).
  void peer_gone(int peer, PeerState state, std::string why, bool ended = false);
  // Closes the endpoint to a peer that is gone without flushing: UCX completes what it still holds for
  // it (cancelled), so no buffer of ours stays with UCX.
  void force_close(int peer);
  // Send `op`'s caller lets go of it (cancelled, or failed while UCX still holds it): from here on it reads only
  // memory of its own (mu_ held; returns without waiting, see the definition).
  void let_go(Op& op);
  // A copied send to a live peer that UCX still holds: its data from here on is a copy of the whole message; without
  // memory for that copy, cut_off.
  void keep_source(Op& op);
  // This rank could not keep `op`'s data: tells its peer (kCutOff), then cuts it (PeerState::kCut), so that the peer
  // never takes a message this rank can no longer send whole -- every operation between the two fails, naming the
  // rank that cut, until Transport::reconnect.
  void cut_off(Op& op);
  // The other side of cut_off: `src` cut this rank off.
  void on_cut_off(int src);
  // Fails the same-host peers whose process has exited (every kWatchInterval).
  void watch_processes();
  // Deaf-worker detection. UCX 1.13's shared-memory transports (posix/sysv "mm") deliver through one receive FIFO
  // per worker that every same-host peer writes into: a writer claims a slot (atomic head), fills it, and only then
  // flips the slot's owner bit; the reader takes slots strictly in order and stops at one not yet flipped. A peer
  // SIGKILLed between claim and flip leaves a slot that is never completed, and this worker then hears nobody on
  // that interface again (it still sends). After a same-host peer dies, a probe is sent into our own FIFO from a
  // sentinel worker of this rank; unheard within kDeafProbe over kDeafProbeRounds rounds, the worker is deaf:
  // become_deaf() tells the live same-host peers (kDeaf, which they do hear) with the sentinel's address; each drops
  // what it holds of ours, stops reading or writing our memory, answers at the sentinel (kDeafAck) and cuts us;
  // on each answer this rank cuts that peer (PeerState::kCut): every operation between the two fails at once,
  // naming the rank whose death blocked the FIFO (before, the cancels on each side waited out a 2 s window).
  void check_hearing();
  void become_deaf();
  void on_deaf_notice(int src, const std::string& notice);
  std::string sentinel_address();
  void close_sentinel();
  // reconnect's steps (mu_ held): let a same-host death's hearing check conclude; a deaf rank's move to its sentinel
  // (rebuild_worker); a peer's new endpoint once both sides let go of the old one (revive).
  void settle_hearing(Clock::time_point until);
  void rebuild_worker();
  void revive(int peer, const Record& r);
  std::string failure(const Op& op, ucs_status_t status) const;

  std::mutex mu_;
  const int rank_, size_;
  bool closed_ = false;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  // Workers a rebuild left behind (deaf): progressed until shutdown so that what they still hold completes.
  std::vector<ucp_worker_h> retired_workers_;
  std::string my_host_;
  bool peer_mode_everywhere_ = false;  // TANDEM_UCX_ERR_MODE=peer
  std::vector<Peer> peers_;
  std::vector<ErrArg> err_args_;  // sized once: UCX keeps pointers to its elements
  std::unordered_map<MatchKey, std::deque<std::shared_ptr<Op>>, MatchKeyHash> posted_;
  std::unordered_map<Op*, std::shared_ptr<Op>> inflight_;
  std::vector<void*> closing_;  // force_close's requests, released at shutdown
  // Tags retired by drop_unexpected (tag, mask): a failed communicator's, never received again. What arrives on them
  // later is dropped too, in every waiting loop: its sender may be blocked in a cancel until it is.
  std::vector<std::pair<uint64_t, uint64_t>> retired_;
  Clock::time_point next_drop_{};  // pump drops at most once per kDropInterval (a probe per live rank and tag)
  Clock::time_point next_watch_{};
  std::atomic<int64_t> last_event_ns_{0};  // steady clock: last completion, arrival or new operation
  int gone_peers_ = 0;                     // peers no longer alive (fail_stuck_receives looks only then)
  // Deaf-worker detection (check_hearing): the sentinel worker and its endpoint to ours, made on first need.
  ucp_worker_h sentinel_ = nullptr;
  ucp_ep_h sentinel_ep_ = nullptr;
  bool probe_due_ = false;  // a same-host peer died: probe our hearing
  bool probing_ = false;
  int probes_sent_ = 0, probes_heard_ = 0, probe_rounds_ = 0;
  Clock::time_point probe_sent_at_{};
  std::shared_ptr<Op> probe_op_;
  bool deaf_ = false;
  std::string lost_why_;  // the last same-host death: what a deaf worker blames
  struct Notice {         // a kDeaf whose payload had not arrived when it was matched
    int src;
    std::shared_ptr<Op> op;
    std::shared_ptr<std::string> text;
  };
  std::vector<Notice> notices_;
  std::string deaf_notice_;  // what a deaf rank sent its peers (kept: the sends may still read it)
  const std::chrono::microseconds busy_window_ = busy_window_from_env();
};

void send_cb(void* request, ucs_status_t status, void* user) {
  auto* op = static_cast<Op*>(user);
  op->core->on_complete(op, request, status);
}
void recv_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* /*info*/, void* user) {
  auto* op = static_cast<Op*>(user);
  op->core->on_complete(op, request, status);
}
void ep_error_cb(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* a = static_cast<ErrArg*>(arg);
  a->core->on_ep_error(a->peer, status);
}

// The generic datatype's callbacks (called by UCX inside ucp_worker_progress or the posting call, mu_ held). The
// "buffer" UCX passes around is the Op, which inflight_ keeps alive while UCX holds its request.
void* start_pack_op(void* /*context*/, const void* buffer, size_t /*count*/) { return const_cast<void*>(buffer); }
void* start_unpack_op(void* /*context*/, void* buffer, size_t /*count*/) { return buffer; }
size_t packed_size_op(void* state) { return static_cast<Op*>(state)->msg_bytes; }
size_t pack_op(void* state, size_t offset, void* dest, size_t max_length) {
  const Op& op = *static_cast<const Op*>(state);
  const size_t n = offset < op.msg_bytes ? std::min(max_length, op.msg_bytes - offset) : 0;
  const size_t got = copy_out_at(op.source, offset, dest, n);
  if (got < n) std::memset(static_cast<char*>(dest) + got, 0, n - got);  // its endpoint is closed (see Op::source)
  return n;
}
ucs_status_t unpack_op(void* state, size_t offset, const void* src, size_t length) {
  Op& op = *static_cast<Op*>(state);
  // Finished for its caller (failed, cancelled, given up): the parts may be freed or reused already; drop the data.
  if (op.done.pending()) copy_into_at(op.parts, offset, src, length);
  return UCS_OK;
}
void finish_op(void* /*state*/) {}

ucp_datatype_t copied_datatype() {
  static const ucp_datatype_t dt = [] {
    static const ucp_generic_dt_ops_t ops{&start_pack_op, &start_unpack_op, &packed_size_op, &pack_op, &unpack_op,
                                          &finish_op};
    ucp_datatype_t d = 0;
    const ucs_status_t st = ucp_dt_create_generic(&ops, nullptr, &d);
    TANDEM_CHECK(st == UCS_OK, Status::kTransport, "ucx: cannot create the generic datatype for copied messages: {}",
                 ucs_status_string(st));
    return d;
  }();
  return dt;
}

Core::Core(const TransportOptions& o) : rank_(o.rank), size_(o.size), peers_(o.size) {
  TANDEM_REQUIRE(o.store != nullptr, "ucx: rank {} needs a KvStore to exchange worker addresses", o.rank);
  TANDEM_REQUIRE(o.size - 1 <= kMaxRank, "ucx: {} ranks do not fit the 23 rank bits of the UCX tag", o.size);
  try {
    connect(o);
  } catch (...) {
    shutdown();
    throw;
  }
}

void Core::connect(const TransportOptions& o) {
  const auto deadline = Clock::now() + o.connect_timeout;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  TANDEM_CHECK(st == UCS_OK, Status::kTransport, "ucx: rank {} cannot read the UCX configuration: {}", rank_,
               ucs_status_string(st));
  if (!std::getenv("UCX_KEEPALIVE_INTERVAL")) ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  st = ucp_init(&params, config, &ctx_);
  ucp_config_release(config);
  TANDEM_CHECK(st == UCS_OK, Status::kTransport, "ucx: rank {} ucp_init failed: {}", rank_, ucs_status_string(st));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // any thread may call, mu_ serializes them
  st = ucp_worker_create(ctx_, &wp, &worker_);
  TANDEM_CHECK(st == UCS_OK, Status::kTransport, "ucx: rank {} cannot create a worker: {}", rank_, ucs_status_string(st));

  my_host_ = host_key();
  const std::string mine = record();
  const std::string key_base = o.key_prefix + "/ucx/";
  o.store->set(key_base + std::to_string(rank_), mine);
  peer_mode_everywhere_ = settings::current()->text("TANDEM_UCX_ERR_MODE") == "peer";

  err_args_.reserve(size_);
  for (int p = 0; p < size_; ++p) err_args_.push_back({this, p});
  for (int p = 0; p < size_; ++p) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const std::string value = p == rank_ ? mine : o.store->get(key_base + std::to_string(p), std::max(left, std::chrono::milliseconds(1)));
    const Record r = parse_record(p, value);
    // UCX 1.13's shared-memory transports have no peer-failure support: an endpoint in
    // UCP_ERR_HANDLING_MODE_PEER would fall back to TCP. Peers that share our kernel and pid
    // namespace therefore get mode NONE (shared memory) and are watched through /proc instead;
    // the others get mode PEER, where UCX itself reports their failure.
    peers_[p].same_host = r.host == my_host_ && r.host != "unknown" && !peer_mode_everywhere_;
    if (peers_[p].same_host && r.pid != ::getpid()) peers_[p].watch_pid = r.pid;
    peers_[p].address = r.address;
    peers_[p].ep = make_ep(p);
  }

  // Hellos wire up every endpoint now, so a peer that cannot be reached fails here, in time.
  std::vector<std::shared_ptr<Op>> hellos;
  {
    std::lock_guard lock(mu_);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) hellos.push_back(post_send(p, control_tag(rank_, kHello), {}, true));
  }
  for (;;) {
    std::string missing;
    {
      std::lock_guard lock(mu_);
      drive(64);
      handle_control();
      for (int p = 0; p < size_; ++p) {
        const bool sent = p == rank_ || !hellos[p < rank_ ? p : p - 1]->done.pending();
        if (p != rank_ && (!peers_[p].hello || !sent)) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", p);
      }
      for (const auto& h : hellos) h->done.test();  // a failed hello throws, naming the rank
    }
    if (missing.empty()) break;
    TANDEM_CHECK(Clock::now() < deadline, Status::kTimeout,
                 "ucx: rank {} did not connect to rank(s) {} within {} ms (key prefix '{}')", rank_, missing,
                 o.connect_timeout.count(), o.key_prefix);
  }
  log::debug("ucx: rank {} of {} connected", rank_, size_);
}

std::string Core::record() const {
  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  const ucs_status_t st = ucp_worker_get_address(worker_, &address, &address_bytes);
  TANDEM_CHECK(st == UCS_OK, Status::kTransport, "ucx: rank {} cannot get its worker address: {}", rank_,
               ucs_status_string(st));
  std::string hex = to_hex(address, address_bytes);
  ucp_worker_release_address(worker_, address);
  return fmt::format("{} {} {}", hex, ::getpid(), my_host_);
}

Core::Record Core::parse_record(int peer, const std::string& value) const {
  Record r;
  std::istringstream fields(value);
  std::string hex;
  long pid = 0;
  fields >> hex >> pid >> r.host;
  TANDEM_CHECK(fields && from_hex(hex, r.address) && !r.address.empty() && pid > 0, Status::kTransport,
               "ucx: rank {} read a malformed worker address for rank {} from the store", rank_, peer);
  r.pid = static_cast<pid_t>(pid);
  return r;
}

ucp_ep_h Core::make_ep(int peer) {
  const Peer& p = peers_[peer];
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(p.address.data());
  ep.err_mode = p.same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  if (!p.same_host) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_handler.cb = &ep_error_cb;
    ep.err_handler.arg = &err_args_[peer];
  }
  ucp_ep_h h = nullptr;
  const ucs_status_t st = ucp_ep_create(worker_, &ep, &h);
  TANDEM_CHECK(st == UCS_OK, Status::kTransport, "ucx: rank {} cannot create an endpoint to rank {}: {}", rank_, peer,
               ucs_status_string(st));
  return h;
}

std::string Core::failure(const Op& op, ucs_status_t status) const {
  const Peer& p = peers_[op.peer];
  return fmt::format("ucx: {} rank {} tag {} failed: {}{}{}", op.is_send ? "send to" : "receive from", op.peer, op.tag,
                     ucs_status_string(status), p.why.empty() ? "" : "; ", p.why);
}

void Core::on_complete(Op* op, void* request, ucs_status_t status) {
  op->req = nullptr;
  ucp_request_free(request);
  if (op->is_send) {
    if (status == UCS_OK) op->done.complete(op->msg_bytes, false);
    else op->done.fail(is_peer_error(status) || peers_[op->peer].state != PeerState::kAlive ? Status::kPeerFailure
                                                                                             : Status::kTransport,
                       failure(*op, status));
  } else {
    finish_recv(*op, status);
  }
  inflight_.erase(op);  // may destroy *op: last
}

void Core::on_ep_error(int peer, ucs_status_t status) {
  peers_[peer].ep_failed = true;
  peer_gone(peer, PeerState::kLost, fmt::format("rank {} failed ({})", peer, ucs_status_string(status)),
            status == UCS_ERR_CONNECTION_RESET);  // an endpoint timeout (keepalive) is a deadline, not proof
}

void Core::peer_gone(int peer, PeerState state, std::string why, bool ended) {
  Peer& p = peers_[peer];
  if (p.state != PeerState::kAlive) return;
  p.state = state;
  p.ended = ended || state == PeerState::kClosed;
  p.why = std::move(why);
  p.gone_at = Clock::now();
  ++gone_peers_;
  // Sends UCX still holds for that peer fail now; their buffers stay with UCX until it lets go.
  for (auto& [raw, op] : inflight_)
    if (op->is_send && !op->control && op->peer == peer)
      op->done.fail(Status::kPeerFailure, fmt::format("ucx: send to rank {} tag {}: {}", peer, op->tag, p.why));
  if (state == PeerState::kLost) log::warn("ucx: rank {}: {}", rank_, p.why);
  if (state == PeerState::kLost && p.watch_pid > 0) {  // it may have died while writing into our receive FIFO
    probe_due_ = true;
    lost_why_ = p.why;
  }
  // Nothing sent to it can finish now: closing the endpoint makes UCX give back every buffer it
  // holds for it (the sends complete as cancelled), so callers may free them.
  force_close(peer);
  // Receives from it are failed by match_posted once nothing that arrived before matches them;
  // receives already matched to one of its messages, by fail_stuck_receives.
}

void Core::fail_stuck_receives() {
  // A receive matched to a message of a rank that died mid-transfer (its rendezvous was under way)
  // may never complete: UCX neither finishes nor fails it. Once the rank has been gone for
  // kStuckGrace -- time enough to take in whatever it had put in shared memory -- the receive
  // fails naming it instead of waiting for the caller's deadline (seen: a pipeline stage's receive
  // of activations from a SIGKILLed stage ran into its 5 s deadline).
  if (gone_peers_ == 0) return;
  const auto now = Clock::now();
  std::vector<std::shared_ptr<Op>> stuck;
  for (auto& [raw, op] : inflight_) {
    if (op->is_send || op->control || !op->done.pending()) continue;
    const Peer& p = peers_[op->peer];
    // Only a rank that died: one that closed its transport flushes its sends first.
    if ((p.state == PeerState::kLost && now - p.gone_at >= kStuckGrace) || p.state == PeerState::kCut)
      stuck.push_back(op);
  }
  for (auto& op : stuck) {
    const Peer& p = peers_[op->peer];
    op->done.fail(Status::kPeerFailure,
                  fmt::format("ucx: receive from rank {} tag {}: {}{}", op->peer, op->tag, p.why,
                              p.state == PeerState::kLost ? " mid-message" : ""));
    if (op->req) ucp_request_cancel(op->worker, op->req);
  }
}

std::shared_ptr<Op> Core::post_send(int peer, uint64_t wire, std::span<const ConstPart> parts, bool control) {
  auto op = std::make_shared<Op>();
  op->core = this;
  op->is_send = true;
  op->control = control;
  op->peer = peer;
  op->tag = wire & ((uint64_t{1} << kRankShift) - 1);
  op->msg_bytes = total_bytes(parts);
  op->copied = op->msg_bytes > 0;
  if (op->copied) op->source.assign(parts.begin(), parts.end());
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  prm.cb.send = &send_cb;
  prm.user_data = op.get();
  const void* buf = nullptr;
  size_t count = 0;
  if (op->copied) {
    prm.datatype = copied_datatype();
    buf = op.get();
    count = op->msg_bytes;
  } else {
    prm.datatype = ucp_dt_make_contig(1);  // no data
  }
  ucs_status_ptr_t s = ucp_tag_send_nbx(peers_[peer].ep, buf, count, wire, &prm);
  if (s == nullptr) op->done.complete(op->msg_bytes, false);
  else if (UCS_PTR_IS_ERR(s)) op->done.fail(Status::kTransport, failure(*op, UCS_PTR_STATUS(s)));
  else {
    op->req = s;
    op->worker = worker_;
    inflight_[op.get()] = op;
  }
  return op;
}

std::shared_ptr<Op> Core::send(int peer, uint64_t tag, std::span<const ConstPart> parts) {
  touch();
  std::lock_guard lock(mu_);
  // A deaf rank starts nothing new with the same-host ranks it told: once one answers, it lets go of every buffer
  // it sent to it, and the peer no longer takes its messages.
  const bool deaf_to_it = deaf_ && peers_[peer].watch_pid > 0;
  if (closed_ || peers_[peer].state != PeerState::kAlive || deaf_to_it) {
    auto op = std::make_shared<Op>();
    op->is_send = true;
    op->peer = peer;
    op->tag = tag;
    if (closed_) op->done.fail(Status::kTransport, fmt::format("ucx: rank {} sends to rank {} on a destroyed transport", rank_, peer));
    else op->done.fail(Status::kPeerFailure, fmt::format("ucx: send to rank {} tag {}: {}", peer, tag,
                                                         deaf_to_it && peers_[peer].state == PeerState::kAlive
                                                             ? deaf_notice_.substr(deaf_notice_.find(' ') + 1)
                                                             : peers_[peer].why));
    return op;
  }
  return post_send(peer, wire_tag(rank_, tag), parts, false);
}

std::shared_ptr<Op> Core::recv(int peer, uint64_t tag, std::span<const MutPart> parts) {
  auto op = std::make_shared<Op>();
  op->core = this;
  op->peer = peer;
  op->tag = tag;
  op->parts.assign(parts.begin(), parts.end());
  op->capacity = total_bytes(parts);
  touch();
  std::lock_guard lock(mu_);
  if (closed_) {
    op->done.fail(Status::kTransport, fmt::format("ucx: rank {} receives from rank {} on a destroyed transport", rank_, peer));
    return op;
  }
  posted_[{peer, tag}].push_back(op);
  match_posted();
  return op;
}

void Core::start_recv(const std::shared_ptr<Op>& op, ucp_tag_message_h msg, size_t length) {
  op->msg_bytes = length;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  prm.cb.recv = &recv_cb;
  prm.user_data = op.get();
  prm.datatype = ucp_dt_make_contig(1);
  void* buf = nullptr;
  size_t count = 0;
  if (op->control || (length > op->capacity && length > kMaxBounceBytes)) {
    // nothing to deliver: UCX consumes the message and reports truncation, handled below
  } else if (length > op->capacity) {
    try {
      op->bounce.resize(length);  // the prefix is copied out on completion
      buf = op->bounce.data();
      count = length;
    } catch (const std::bad_alloc&) {
      // Consume the message without data: the receive still reports its size and truncation.
      log::error("ucx: rank {} cannot buffer a {}-byte message from rank {} for a {}-byte receive", rank_, length,
                 op->peer, op->capacity);
    }
  } else if (length > 0) {
    op->copied = true;  // unpack_op scatters it into the parts while the receive is pending
    prm.datatype = copied_datatype();
    buf = op.get();
    count = length;
  }
  ucs_status_ptr_t s = ucp_tag_msg_recv_nbx(worker_, buf, count, msg, &prm);
  if (s == nullptr) finish_recv(*op, UCS_OK);
  else if (UCS_PTR_IS_ERR(s)) finish_recv(*op, UCS_PTR_STATUS(s));
  else {
    op->req = s;
    op->worker = worker_;
    inflight_[op.get()] = op;
  }
}

void Core::finish_recv(Op& op, ucs_status_t status) {
  // Received without a buffer (a control message, or no bounce buffer): size and truncation only.
  if (status == UCS_ERR_MESSAGE_TRUNCATED && op.bounce.empty()) status = UCS_OK;
  if (status != UCS_OK) {
    op.done.fail(is_peer_error(status) || peers_[op.peer].state != PeerState::kAlive ? Status::kPeerFailure
                                                                                     : Status::kTransport,
                 failure(op, status));
    return;
  }
  if (!op.done.pending()) return;  // failed already (a stuck receive): its parts may be gone
  if (!op.bounce.empty()) {
    copy_into_at(op.parts, 0, op.bounce.data(), op.bounce.size());
    std::vector<char>().swap(op.bounce);
  }
  op.done.complete(op.msg_bytes, op.msg_bytes > op.capacity);
}

void Core::drive(int rounds) {
  int i = 0;
  while (i < rounds && ucp_worker_progress(worker_) != 0) ++i;
  for (ucp_worker_h old : retired_workers_) ucp_worker_progress(old);  // what it still holds completes (cancelled)
  if (i > 0) touch();
}

void Core::touch() noexcept {
  last_event_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}

void Core::handle_control() {
  for (;;) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, kControlBit, kControlBit, 1, &info);
    if (!msg) return;
    const int src = tag_source(info.sender_tag);
    const uint64_t kind = info.sender_tag & ((uint64_t{1} << kRankShift) - 1);
    auto op = std::make_shared<Op>();
    op->core = this;
    op->control = true;
    op->peer = src < size_ ? src : rank_;
    if (kind == kDeaf && src < size_ && src != rank_ && info.length > 0 && info.length <= kMaxDeafNotice) {
      auto text = std::make_shared<std::string>(info.length, '\0');
      op->control = false;
      op->parts.push_back({text->data(), text->size()});
      op->capacity = text->size();
      start_recv(op, msg, info.length);
      notices_.push_back({src, op, text});  // read by check_hearing once it has arrived
      continue;
    }
    start_recv(op, msg, info.length);  // zero bytes: consumes it
    if (kind == kProbe && src == rank_ && info.length == 0) {
      ++probes_heard_;
      continue;
    }
    if (kind == kDeafAck && info.length == 0) continue;  // a late answer, sent to the sentinel that became our worker
    if (kind == kCutOff && src < size_ && info.length == 0) {
      on_cut_off(src);
      continue;
    }
    if (src >= size_ || info.length != 0 || (kind != kHello && kind != kGoodbye)) {
      log::warn("ucx: rank {} dropped a malformed control message (tag 0x{:016x}, {} bytes)", rank_, info.sender_tag,
                info.length);
      continue;
    }
    if (kind == kHello) peers_[src].hello = true;
    else peer_gone(src, PeerState::kClosed, fmt::format("rank {} closed its transport", src));
  }
}

void Core::discard_unexpected() { consume_unmatched(0, 0, true); }

void Core::consume_unmatched(uint64_t tag, uint64_t mask, bool control, int only) {
  const uint64_t low = (uint64_t{1} << kRankShift) - 1;
  const uint64_t rank_bits = uint64_t{kMaxRank} << kRankShift;
  for (int src = 0; src < size_; ++src) {
    if (src != rank_ && (peers_[src].state != PeerState::kAlive || peers_[src].ep_failed)) continue;
    if (only >= 0 && src != only) continue;
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, wire_tag(src, tag & mask & low),
                                               rank_bits | (mask & low) | (control ? 0 : kControlBit), 1, &info);
      if (!msg) break;
      auto op = std::make_shared<Op>();
      op->core = this;
      op->control = true;  // received without a buffer: the sender's request completes
      op->peer = src;
      start_recv(op, msg, info.length);
    }
  }
}

void Core::match_posted() {
  for (auto it = posted_.begin(); it != posted_.end();) {
    auto& q = it->second;
    const MatchKey key = it->first;
    // A cut rank's messages are never matched: one arriving after the cut may be a rendezvous whose buffer its
    // sender has let go of (it cut us when we answered its deafness notice).
    while (!q.empty() && peers_[key.peer].state != PeerState::kCut) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, wire_tag(key.peer, key.tag), kFullMask, 1, &info);
      if (!msg) break;
      std::shared_ptr<Op> op = std::move(q.front());
      q.pop_front();
      start_recv(op, msg, info.length);
    }
    const Peer& p = peers_[key.peer];
    if (!q.empty() && p.state != PeerState::kAlive) {
      for (auto& op : q)
        op->done.fail(Status::kPeerFailure, fmt::format("ucx: receive from rank {} tag {}: {}", key.peer, key.tag, p.why));
      q.clear();
    }
    it = q.empty() ? posted_.erase(it) : std::next(it);
  }
}

void Core::wait_for_progress(std::chrono::microseconds timeout) {
  // Shared-memory UCX moves data only when a worker is progressed: keep polling, but yield (or,
  // once the worker has been idle for the busy window, sleep briefly).
  progress();
  const auto idle = std::chrono::nanoseconds(Clock::now().time_since_epoch().count() -
                                             last_event_ns_.load(std::memory_order_relaxed));
  if (idle > busy_window_ && timeout.count() > 0)
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(timeout, kIdleSleep));
  else
    std::this_thread::yield();
}

void Core::watch_processes() {
  const auto now = Clock::now();
  if (now < next_watch_) return;
  next_watch_ = now + kWatchInterval;
  for (int peer = 0; peer < size_; ++peer) {
    const Peer& p = peers_[peer];
    if (p.watch_pid > 0 && p.state == PeerState::kAlive && !process_alive(p.watch_pid))
      peer_gone(peer, PeerState::kLost, fmt::format("rank {} (pid {} on this host) died", peer, p.watch_pid), true);
  }
}

void Core::check_hearing() {
  if (!worker_) return;
  for (size_t i = 0; i < notices_.size();) {
    if (notices_[i].op->done.pending()) {
      ++i;
      continue;
    }
    Notice n = std::move(notices_[i]);
    notices_.erase(notices_.begin() + static_cast<std::ptrdiff_t>(i));
    if (n.op->done.state() == Completion::kDone) on_deaf_notice(n.src, *n.text);
  }
  if (probe_due_ && !probing_ && !deaf_) {
    probe_due_ = false;
    if (!sentinel_) {
      ucp_worker_params_t wp{};
      wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
      wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
      ucp_address_t* address = nullptr;
      size_t address_bytes = 0;
      ucs_status_t st = ucp_worker_create(ctx_, &wp, &sentinel_);
      if (st == UCS_OK) st = ucp_worker_get_address(worker_, &address, &address_bytes);
      if (st == UCS_OK) {
        ucp_ep_params_t ep{};
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.address = address;
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = ucp_ep_create(sentinel_, &ep, &sentinel_ep_);
        ucp_worker_release_address(worker_, address);
      }
      if (st != UCS_OK) {
        log::warn("ucx: rank {} cannot check whether it still hears its same-host peers: {}", rank_,
                  ucs_status_string(st));
        close_sentinel();
        return;
      }
    }
    ucp_request_param_t prm{};
    ucs_status_ptr_t s = ucp_tag_send_nbx(sentinel_ep_, nullptr, 0, control_tag(rank_, kProbe), &prm);
    if (UCS_PTR_IS_ERR(s)) {
      log::warn("ucx: rank {} cannot probe its own receive queue: {}", rank_, ucs_status_string(UCS_PTR_STATUS(s)));
      return;
    }
    if (s != nullptr) ucp_request_free(s);  // released by UCX once sent; it has no buffer
    ++probes_sent_;
    probe_rounds_ = 0;
    probe_sent_at_ = Clock::now();
    probing_ = true;
  }
  if (!sentinel_) return;
  for (int i = 0; i < 16 && ucp_worker_progress(sentinel_) != 0; ++i) {
  }
  if (probing_) {
    if (probes_heard_ >= probes_sent_) {
      probing_ = false;
      log::debug("ucx: rank {} still hears its shared-memory peers", rank_);
    } else if (++probe_rounds_ >= kDeafProbeRounds && Clock::now() - probe_sent_at_ >= kDeafProbe) {
      become_deaf();
    }
  }
  if (!deaf_) return;
  for (;;) {  // the answers of the peers told (kDeafAck), at the sentinel
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(sentinel_, kControlBit, kControlBit, 1, &info);
    if (!msg) break;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    prm.datatype = ucp_dt_make_contig(1);
    ucs_status_ptr_t s = ucp_tag_msg_recv_nbx(sentinel_, nullptr, 0, msg, &prm);
    if (s != nullptr && !UCS_PTR_IS_ERR(s)) ucp_request_free(s);
    const int src = tag_source(info.sender_tag);
    const uint64_t kind = info.sender_tag & ((uint64_t{1} << kRankShift) - 1);
    if (kind != kDeafAck || src >= size_ || !peers_[src].owes_deaf_ack) continue;
    peers_[src].owes_deaf_ack = false;
    // It dropped what it held of ours and no longer reads or writes our memory: nothing between us is waited for.
    peer_gone(src, PeerState::kCut, fmt::format("rank {} cannot receive from rank {}: {}", rank_, src, deaf_notice_.substr(deaf_notice_.find(' ') + 1)));
  }
}

void Core::become_deaf() {
  deaf_ = true;
  probing_ = false;
  const std::string why = fmt::format(
      "{} while writing into rank {}'s shared-memory receive queue, which then stays blocked (UCX 1.13's "
      "shared-memory FIFO waits for ever on the slot it claimed): rank {} can receive nothing more from same-host "
      "ranks",
      lost_why_.empty() ? std::string("a same-host rank died") : lost_why_, rank_, rank_);
  log::error("ucx: rank {}: {}", rank_, why);
  deaf_notice_ = sentinel_address() + " " + why;
  const ConstPart part{deaf_notice_.data(), deaf_notice_.size()};
  for (int p = 0; p < size_; ++p) {
    Peer& peer = peers_[p];
    if (p == rank_ || peer.state != PeerState::kAlive || peer.watch_pid <= 0 || !peer.ep || peer.ep_failed) continue;
    peer.owes_deaf_ack = true;
    post_send(p, control_tag(rank_, kDeaf), {&part, 1}, true);
  }
}

void Core::on_deaf_notice(int src, const std::string& notice) {
  Peer& p = peers_[src];
  if (p.state != PeerState::kAlive || p.ep_failed) return;
  const size_t space = notice.find(' ');
  std::vector<unsigned char> address;
  if (space == std::string::npos || !from_hex(notice.substr(0, space), address) || address.empty()) {
    log::warn("ucx: rank {} dropped a malformed deafness notice from rank {}", rank_, src);
    return;
  }
  if (address == p.address) return;  // late: it has moved to that worker already (rebuild_worker) and we to it
  log::warn("ucx: rank {}: rank {} reports: {}", rank_, src, notice.substr(space + 1));
  // It will never read what we send it, nor answer a rendezvous: drop what it sent us and we have not taken (its
  // messages to us came before the notice), then cut it -- our sends to it are released with the endpoint and our
  // receives from it fail at once -- and only then answer, so that it may let go of its buffers.
  consume_unmatched(0, 0, false, src);
  peer_gone(src, PeerState::kCut, fmt::format("rank {} cannot receive any more: {}", src, notice.substr(space + 1)));
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ucs_status_t st = ucp_ep_create(worker_, &ep, &p.ack_ep);
  if (st != UCS_OK) {
    p.ack_ep = nullptr;
    log::warn("ucx: rank {} cannot answer rank {}'s deafness notice: {}", rank_, src, ucs_status_string(st));
    return;
  }
  ucp_request_param_t prm{};
  ucs_status_ptr_t s = ucp_tag_send_nbx(p.ack_ep, nullptr, 0, control_tag(rank_, kDeafAck), &prm);
  if (UCS_PTR_IS_ERR(s))
    log::warn("ucx: rank {} cannot answer rank {}'s deafness notice: {}", rank_, src, ucs_status_string(UCS_PTR_STATUS(s)));
  else if (s != nullptr)
    ucp_request_free(s);
}

std::string Core::sentinel_address() {
  ucp_address_t* address = nullptr;
  size_t bytes = 0;
  if (!sentinel_ || ucp_worker_get_address(sentinel_, &address, &bytes) != UCS_OK) return "00";
  std::string hex = to_hex(address, bytes);
  ucp_worker_release_address(sentinel_, address);
  return hex;
}

void Core::close_sentinel() {
  if (sentinel_ep_) {
    if (void* s = close_without_flush(sentinel_ep_)) ucp_request_free(s);
    sentinel_ep_ = nullptr;
  }
  if (sentinel_) ucp_worker_destroy(sentinel_);
  sentinel_ = nullptr;
}

void Core::settle_hearing(Clock::time_point until) {
  next_watch_ = {};  // look at the same-host peers' processes now
  auto unsettled = [&] {
    if ((probe_due_ && !deaf_) || probing_) return true;  // a death was seen: is our queue still heard?
    return deaf_ && std::any_of(peers_.begin(), peers_.end(), [](const Peer& p) {
             return p.owes_deaf_ack && p.state == PeerState::kAlive;  // told, not yet answered
           });
  };
  do pump();
  while (unsettled() && Clock::now() < until);
}

void Core::rebuild_worker() {
  if (!sentinel_) return;
  // The sentinel becomes this rank's worker: a fresh receive queue, which every peer that reconnects writes into.
  // The peers still alive here first (one that did not answer the notice, one on another host) are cut like the
  // others: their messages go to the old worker, which nobody reads any more.
  const std::string why = fmt::format("rank {} moved to a new worker (its old one could no longer hear same-host "
                                      "ranks)", rank_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || peers_[p].state != PeerState::kAlive) continue;
    peers_[p].owes_deaf_ack = false;
    peer_gone(p, PeerState::kCut, why);
  }
  force_close(rank_);  // our own endpoint lives on the old worker too
  if (sentinel_ep_) {
    if (void* s = close_without_flush(sentinel_ep_)) closing_.push_back(s);
    sentinel_ep_ = nullptr;
  }
  retired_workers_.push_back(worker_);
  worker_ = sentinel_;
  sentinel_ = nullptr;
  deaf_ = probing_ = probe_due_ = false;
  probes_sent_ = probes_heard_ = probe_rounds_ = 0;
  Peer& self = peers_[rank_];
  self.address = parse_record(rank_, record()).address;
  self.ep = make_ep(rank_);
  self.ep_failed = false;
  log::warn("ucx: rank {} moved to a new worker; the ranks that reconnect to it are heard again", rank_);
}

void Core::revive(int peer, const Record& r) {
  Peer& p = peers_[peer];
  if (p.state == PeerState::kLost || p.state == PeerState::kClosed) return;  // gone for good: its operations fail
  if (p.state == PeerState::kAlive && r.address == p.address) return;          // nothing moved
  // It moved to a new worker without telling us (we missed its notice): what is under way with the old one fails.
  if (p.state == PeerState::kAlive) peer_gone(peer, PeerState::kCut, fmt::format("rank {} moved to a new worker", peer));
  // Cut: both sides let go of everything between them (check_hearing), so a new endpoint starts clean. Its messages
  // that reached us while it was cut waited, unmatched (match_posted), for this.
  if (p.ack_ep) {
    if (void* s = close_without_flush(p.ack_ep)) closing_.push_back(s);
    p.ack_ep = nullptr;
  }
  force_close(peer);
  p.address = r.address;
  p.ep = make_ep(peer);
  p.state = PeerState::kAlive;
  p.ep_failed = false;
  p.owes_deaf_ack = false;
  p.gone_at = Clock::time_point{};
  p.cut_by_us = false;
  log::info("ucx: rank {} reconnected to rank {} (was: {})", rank_, peer, p.why);
  p.why.clear();
  --gone_peers_;
}

void Core::reconnect(KvStore& store, const std::string& key_prefix, std::span<const int> peers,
                     std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string mine;
  {
    std::lock_guard lock(mu_);
    TANDEM_CHECK(!closed_, Status::kTransport, "ucx: rank {} cannot reconnect a destroyed transport", rank_);
    // A same-host death may have left this worker deaf; that shows ~0.1 s after the death. Let the check conclude
    // (and the peers told answer) before publishing where this rank is heard.
    settle_hearing(std::min(deadline, Clock::now() + kShutdownDeadline));
    if (deaf_) rebuild_worker();
    mine = record();
  }
  store.set(key_prefix + std::to_string(rank_), mine);
  for (int peer : peers) {
    TANDEM_REQUIRE(peer >= 0 && peer < size_, "ucx: rank {} cannot reconnect to rank {}: the world has {} ranks",
                   rank_, peer, size_);
    if (peer == rank_) continue;
    const std::string key = key_prefix + std::to_string(peer);
    std::string value;
    for (;;) {
      try {
        value = store.get(key, kReconnectPoll);
        break;
      } catch (const Error& e) {
        if (e.status() != Status::kTimeout) throw;
      }
      {
        // Died since the survivors agreed: nothing to mend; the new communicator's first operation with it fails.
        std::lock_guard lock(mu_);
        if (peers_[peer].state == PeerState::kLost || peers_[peer].state == PeerState::kClosed) break;
      }
      TANDEM_CHECK(Clock::now() < deadline, Status::kTimeout,
                   "ucx: rank {} did not learn rank {}'s worker address within {} ms (key '{}')", rank_, peer,
                   timeout.count(), key);
      progress();  // that rank may wait for our answer to its deafness notice before it publishes
    }
    if (value.empty()) continue;
    const Record r = parse_record(peer, value);
    std::lock_guard lock(mu_);
    if (!closed_) revive(peer, r);
  }
}

void Core::progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || closed_) return;  // another thread is already driving it
  pump();
}

void Core::pump() {
  drive(64);
  handle_control();
  watch_processes();
  match_posted();
  if (!retired_.empty()) {
    const auto now = Clock::now();
    if (now >= next_drop_) {
      next_drop_ = now + kDropInterval;
      drop_retired();
    }
  }
  fail_stuck_receives();
  check_hearing();
}

void Core::let_go(Op& op) {
  // Once is enough (a cancelled request's destruction comes back here: release).
  if (!op.is_send || !op.req || op.abandoned || closed_) return;
  // Nothing is waited for. UCX reads a send's data only through pack_op, from op.source, never from the caller's
  // parts by itself (Op::copied), so pointing op.source away from them is all it takes before the caller may free
  // them. Before, when large messages went zero-copy, a cancel waited up to a 2 s window per peer for the peer to take
  // or drop the message: a survivor of a stalled rank sat in that wait ~1 s longer than over tcp before it could
  // re-form (bench/chaos/README.md). What that wait gave besides, and what stands for it now:
  //  - two survivors cancelling towards each other: neither waits, so neither waits for the other (the rank still
  //    drops a failed communicator's messages whenever it progresses, drop_unexpected, so the peer's copies go);
  //  - a peer that died or closed: its endpoint is closed already (peer_gone), so nothing of the message leaves;
  //  - a live peer (stalled, or just slow to post its receive) may still take the message, whole, from a copy, as it
  //    would have from the caller's parts had it answered within the window; one that never does leaves the copy
  //    with UCX until it drops the message or this transport is destroyed, whose teardown does not wait for it.
  // The message is no longer owed: it has failed (or been cancelled) for its caller.
  ucp_request_cancel(op.worker, op.req);  // UCX 1.13 cancels expected receives only; harmless on a send
  if (!op.req) return;                    // completed (or cancelled) by it
  op.abandoned = true;
  if (!op.copied) return;  // no data
  const Peer& p = peers_[op.peer];
  if (p.state == PeerState::kAlive && !p.ep_failed) {
    keep_source(op);
  } else {
    force_close(op.peer);  // closed by peer_gone already; UCX may keep the request until our worker goes, idle
    op.source.clear();
  }
  log::debug("ucx: rank {}: a cancelled send to rank {} tag {} stays with UCX{}", rank_, op.peer, op.tag,
             op.kept ? ", from a copy of its data" : "");
}

void Core::keep_source(Op& op) {
  try {
    if (settings::current()->flag("TANDEM_TEST_UCX_NO_COPY").value_or(false)) throw std::bad_alloc();
    op.kept.reset(new char[op.msg_bytes]);
  } catch (const std::bad_alloc&) {
    // Sending zeros instead (as before) would hand the peer fabricated data it takes as the message.
    cut_off(op);
    return;
  }
  copy_out_at(op.source, 0, op.kept.get(), op.msg_bytes);
  op.source.assign(1, ConstPart{op.kept.get(), op.msg_bytes});
}

void Core::cut_off(Op& op) {
  const int peer = op.peer;
  const std::string why =
      fmt::format("rank {} cut rank {} off: it had no memory to keep a copy of a cancelled {}-byte send (tag {}) to it "
                  "and sends nothing more rather than an incomplete message",
                  rank_, peer, op.msg_bytes, op.tag);
  log::error("ucx: {}", why);
  // The notice goes on the same endpoint, after everything this rank sent the peer. Meanwhile the parts are still
  // the caller's (valid until let_go returns): a peer that takes the message now takes it whole.
  auto notice = post_send(peer, control_tag(rank_, kCutOff), {}, true);
  const auto until = Clock::now() + kCutOffNotice;
  while (notice->done.pending() && peers_[peer].state == PeerState::kAlive && Clock::now() < until) pump();
  if (notice->done.pending())  // closing the endpoint drops it: the peer's receives from us run into their deadline
    log::error("ucx: rank {} could not tell rank {} that it cut it off within {} ms", rank_, peer,
               kCutOffNotice.count());
  // Cut for this rank's own want of memory: the blame is this rank's (at_fault), as the peer's is (on_cut_off). Unless
  // the peer went first meanwhile (died or closed): then it is gone for its own reason.
  if (peers_[peer].state == PeerState::kAlive) peers_[peer].cut_by_us = true;
  peer_gone(peer, PeerState::kCut, why);  // closes the endpoint: nothing more of the message leaves
  op.source.clear();
}

std::vector<int> Core::dead_peers() {
  progress();  // the goodbyes, endpoint errors and exited pids already there
  std::lock_guard lock(mu_);
  std::vector<int> out;
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && peers_[p].ended) out.push_back(p);
  return out;
}

int Core::at_fault(int peer) {
  std::lock_guard lock(mu_);
  return peer >= 0 && peer < size_ && peers_[peer].cut_by_us ? rank_ : peer;
}

void Core::on_cut_off(int src) {
  if (src == rank_ || peers_[src].state != PeerState::kAlive) return;
  // Drop what it sent and we have not taken (the notice came after it): it may never come whole. Cut, its messages
  // are matched no more and receives from it -- posted, or matched to a message under way -- fail naming it.
  consume_unmatched(0, 0, false, src);
  peer_gone(src, PeerState::kCut,
            fmt::format("rank {} cut rank {} off (it had no memory to keep a cancelled send to it whole)", src, rank_));
}

void Core::release(const std::shared_ptr<Op>& op) {
  // A send that completed was given back by UCX before it completed; only a failed one may still be held.
  if (!op->is_send || op->done.state() != Completion::kFailed) return;
  std::lock_guard lock(mu_);
  let_go(*op);
}

void Core::cancel(const std::shared_ptr<Op>& op) {
  std::lock_guard lock(mu_);
  let_go(*op);
  if (!op->done.pending()) return;
  auto it = posted_.find({op->peer, op->tag});
  if (it != posted_.end()) {
    std::erase(it->second, op);
    if (it->second.empty()) posted_.erase(it);
  }
  if (!op->is_send && op->req && !closed_) {
    // Matched to a message UCX is still taking in, which it cannot withdraw: the receive stays with UCX, which
    // finishes or fails it later. Nothing is waited for: unpack_op writes into the parts only while the receive is
    // pending for its caller (and a bounce buffer is the Op's own), so they are free once this returns. Before, the
    // cancel waited up to a 2 s window per peer for the message to finish (zero-copy UCX wrote into the parts).
    ucp_request_cancel(op->worker, op->req);  // UCX 1.13 cannot withdraw a matched receive; harmless
    if (op->req) {
      op->abandoned = true;
      log::debug("ucx: rank {}: a cancelled receive from rank {} tag {} stays with UCX ({})", rank_, op->peer, op->tag,
                 peers_[op->peer].state == PeerState::kAlive ? "rank alive" : peers_[op->peer].why);
    }
  }
  op->done.fail(Status::kTransport, fmt::format("ucx: {} rank {} tag {} was cancelled", op->is_send ? "send to" : "receive from",
                                                op->peer, op->tag));
}

void Core::force_close(int peer) {
  Peer& p = peers_[peer];
  if (!p.ep) return;
  if (void* s = close_without_flush(p.ep)) closing_.push_back(s);
  p.ep = nullptr;
  p.ep_failed = true;
}

void Core::drop_unexpected(uint64_t tag, uint64_t mask) {
  std::lock_guard lock(mu_);
  if (closed_) return;
  const std::pair<uint64_t, uint64_t> retired{tag & mask, mask};
  if (std::find(retired_.begin(), retired_.end(), retired) == retired_.end()) retired_.push_back(retired);
  drive(16);       // take in what is arriving
  match_posted();  // what a posted receive matches is not unexpected
  drop_retired();
}

void Core::drop_retired() {
  for (const auto& [tag, mask] : retired_) consume_unmatched(tag, mask, false);
}

void Core::shutdown() noexcept {
  std::lock_guard lock(mu_);
  if (closed_) return;
  closed_ = true;
  try {
    if (worker_) {
      const auto until = Clock::now() + kShutdownDeadline;
      // Sends to live peers first: a rendezvous's data is packed by this worker once the peer posts its receive,
      // so it can only be delivered while this worker lives (the communicator's sends are buffered and have
      // completed for their callers already). Bounded by the shutdown deadline; the goodbye follows them.
      auto sends_owed = [&] {
        return std::any_of(inflight_.begin(), inflight_.end(), [&](const auto& kv) {
          const Op& op = *kv.second;
          return op.is_send && !op.control && !op.abandoned && op.peer != rank_ && op.done.pending() &&
                 peers_[op.peer].state == PeerState::kAlive && !peers_[op.peer].ep_failed;
        });
      };
      // Deaths and goodbyes are noticed meanwhile: a rank that died or closed cannot take what it is owed (a peer's
      // goodbye went unread here before, and a rank whose peer had closed waited the whole deadline).
      while (sends_owed() && Clock::now() < until) {
        drive(16);
        handle_control();
        watch_processes();
        check_hearing();
      }
      std::vector<std::shared_ptr<Op>> byes;
      for (int p = 0; p < size_; ++p)
        if (p != rank_ && peers_[p].ep && peers_[p].state == PeerState::kAlive && peers_[p].hello)
          byes.push_back(post_send(p, control_tag(rank_, kGoodbye), {}, true));
      auto pending = [&] {
        return std::any_of(byes.begin(), byes.end(), [](const auto& b) { return b->done.pending(); });
      };
      while (pending() && Clock::now() < until) {
        drive(16);
        handle_control();
        watch_processes();
        check_hearing();
      }
      discard_unexpected();

      const std::string gone = fmt::format("ucx: rank {} destroyed its transport", rank_);
      for (auto& [key, q] : posted_)
        for (auto& op : q) op->done.fail(Status::kTransport, fmt::format("{}; receive from rank {} tag {} cancelled", gone, key.peer, key.tag));
      posted_.clear();
      std::vector<std::shared_ptr<Op>> live;
      for (auto& [raw, op] : inflight_) live.push_back(op);
      for (auto& op : live) {
        op->done.fail(Status::kTransport, fmt::format("{}; {} rank {} tag {} cancelled", gone,
                                                      op->is_send ? "send to" : "receive from", op->peer, op->tag));
        if (op->req) ucp_request_cancel(op->worker, op->req);
      }
      std::vector<void*> closing;
      for (auto& p : peers_) {
        if (p.ack_ep) {  // to a deaf peer's sentinel: nothing is owed there
          if (void* s = close_without_flush(p.ack_ep)) closing_.push_back(s);
          p.ack_ep = nullptr;
        }
        if (!p.ep) continue;
        ucp_request_param_t prm{};
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        // Flush only towards live peers: a closed or failed one would never acknowledge.
        prm.flags = p.ep_failed || p.state != PeerState::kAlive ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        ucs_status_ptr_t s = ucp_ep_close_nbx(p.ep, &prm);
        if (s != nullptr && !UCS_PTR_IS_ERR(s)) closing.push_back(s);
        p.ep = nullptr;
      }
      // Only operations with a live other rank can still finish: a rendezvous send to this rank
      // itself or to a peer that closed or died waits for a receive nobody will post (UCX keeps
      // such requests until the worker goes; waiting for them only delayed every such shutdown
      // by the whole deadline).
      // Nor do the bufferless receives that consumed dropped or control messages: a dropped rendezvous's stays
      // with UCX after its sender was let go, and nothing of ours is at stake (waiting for it took the whole
      // deadline in the shutdown of every rank that dropped a failed communicator's message).
      // Nor do the operations a cancel let go of (Op::abandoned): they failed for their callers and nothing is owed
      // (waiting for them made the teardown of an integration_faults survivor take 1.9 s).
      auto can_finish = [&](const Op& op) {
        return op.peer != rank_ && !op.abandoned && !(op.control && !op.is_send) &&
               peers_[op.peer].state == PeerState::kAlive &&
               !peers_[op.peer].ep_failed;
      };
      auto awaited = [&] {
        return std::count_if(inflight_.begin(), inflight_.end(), [&](const auto& kv) { return can_finish(*kv.second); });
      };
      while (Clock::now() < until) {
        drive(16);
        watch_processes();
        std::erase_if(closing, [](void* r) {
          if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
          ucp_request_free(r);
          return true;
        });
        if (closing.empty() && awaited() == 0) break;
      }
      if (!closing.empty() || awaited() > 0)
        log::warn("ucx: rank {}: {} endpoint(s) and {} operation(s) with live ranks did not finish within {} s of "
                  "shutdown", rank_, closing.size(), awaited(), kShutdownDeadline.count());
      else if (!inflight_.empty())
        log::debug("ucx: rank {}: {} operation(s) with closed or failed ranks left to the worker at shutdown", rank_,
                   inflight_.size());
      for (void* r : closing) ucp_request_free(r);  // released: the worker reclaims them
      for (void* r : closing_) ucp_request_free(r);
      closing_.clear();
      discard_unexpected();
      close_sentinel();
      ucp_worker_destroy(worker_);
      worker_ = nullptr;
      for (ucp_worker_h old : retired_workers_) ucp_worker_destroy(old);
      retired_workers_.clear();
      inflight_.clear();
    }
    if (ctx_) ucp_cleanup(ctx_);
    ctx_ = nullptr;
  } catch (const std::exception& e) {
    log::error("ucx: rank {} shutdown: {}", rank_, e.what());
  }
}

}  // namespace

std::unique_ptr<Transport> create(const TransportOptions& options) {
  return std::make_unique<CoreTransport<Core, Op, Op>>("ucx", Capabilities{.shared_memory = true}, options);
}

}  // namespace tandem::transports::ucx
