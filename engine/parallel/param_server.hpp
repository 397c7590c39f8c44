#pragma once
// Parameter servers (issue #13): the synchronous (ps), asynchronous (ps-async) and bounded-staleness (ssp)
// parameter server, and the centre variable of asynchronous EASGD -- the runtime side of a CompiledJob's
// SyncProgram with servers (exchange kPushPull, or kElastic with easgd_async). The simulator times the same program.
//
// Roles: workers are world ranks [0, W), servers [W, W + S). Server s holds key range shards[s] of the model's flat
// f32 parameter vector and, for push/pull, the optimizer state of that range: one optim::Optimizer per bucket piece
// (an update is elementwise, so updating piece by piece equals updating the whole vector), which lets a piece be
// updated as soon as its pushes are in.
//
// A worker's step: when backward completes bucket b (the model's grad-ready hook, as DDP's all-reduce), each piece
// of b is pushed to its server at once, non-blocking, and the piece's pull reply is posted, so pushes and pulls
// overlap the rest of backward; finish() waits for the replies and writes the pulled parameters into the model
// before the next forward. The worker runs no optimizer.
//
// Update rules (on the server, per piece):
//   ps and ssp: the pushes of clock t (a worker's t-th step) of all W workers are summed in worker order and scaled by
//     1/W -- DDP's average -- then one optimizer step with lr_at(schedule, t - 1). The pull reply to a worker's push
//     of clock t is released once the piece has applied clock t - S (ps: S = 0, the update of t itself; ssp: S =
//     staleness). A worker thus starts step t + 1 only when the slowest worker has pushed step t - S: its clock runs
//     at most S ahead of the slowest (instrumented: max_clock_gap()). S = 0 is ps exactly (the same code).
//   ps-async: each push is applied as it arrives: one optimizer step with the pushing worker's gradient as it is (the
//     mean over that worker's own batch, not divided by W), at lr_at(schedule, updates / W) so the schedule advances
//     once per W updates (ps's pace per sample). The reply carries the newest parameters, right after that update.
//     With SyncProgram::staleness_lr kInverse the rate of that step is divided by max(tau, 1), where tau is the
//     push's staleness on this piece: the piece's update count now minus its count when its values last went to the
//     pushing worker (the reply to its previous push, or the shard sent at the last sync point, re-form or grow; a
//     restore counts as sent), i.e. the updates of other workers its gradient did not see (Zhang et al. 2016). tau is
//     measured per piece, on the server, with no extra message. The optimizer's rate is what is divided, so the step
//     it takes -- lr (mu v + g) for SGD with momentum, Adam's normalised step -- is scaled as a whole: scaling the
//     gradient instead would leave Adam's step unchanged. With kMomentum (SGD with momentum mu) the rate is kept and
//     the push's momentum coefficient is mu_tau = max(0, 1 - (1 - mu)(tau + 1)) -- v <- mu_tau v + g, by scaling the
//     piece's buffer by mu_tau / mu before the optimizer's step: asynchrony itself acts as momentum of about
//     tau / (tau + 1) (Mitliagkas et al. 2016, "Asynchrony begets momentum"), and (1 - mu_tau)(1 - tau / (tau + 1))
//     = 1 - mu keeps the total at mu. Without momentum (or with Adam) kMomentum changes nothing. Why both exist:
//     at momentum 0.9 on 4 workers the rate's rule alone stalls at chance for up to 936 steps before it trains, the
//     momentum rule trains from the start (bench/strategies/README.md, session 21).
//   easgd (asynchronous centre c): a worker sends its parameters x; the server sets d = alpha (x - c), c <- c + d and
//     replies d; the worker sets x <- x - d (Zhang et al. 2015, asynchronous EASGD). Exchanges apply one at a time.
//
// Protocol (the world communicator, tagged point-to-point; every message starts with a 32-byte header -- kind,
// sender, piece, clock, payload floats -- followed by f32 values):
//   worker -> server, control tag (header only): kStep(t) before step t's pushes, kElastic(t) before an elastic
//     exchange, kPause(t) at a sync point. A server keeps exactly one control receive posted per worker inside the
//     region, so every posted receive is matched by a message its worker is bound to send.
//   worker -> server: kPush (tag push + piece), kCentre (elastic payload); server -> worker: kPull (tag pull +
//     piece), kDelta (elastic reply), kFinal (the whole shard at a sync point); rank 0 -> server: kInit.
// Every wait is bounded by the communicator's deadline; a message whose header differs from what the protocol
// expects (kind, sender, piece, clock, size) is a kMismatch error naming the world rank that sent it.
//
// Replication (issue #17; SyncProgram::replicas = r > 0, ps, ps-async and ssp): server s backs up the shards that
// servers s - 1, ..., s - r (ring order, replica_servers) own -- values, optimizer state and the optimizer's update
// count (ps, ssp: the piece's clock). After every update it applies to a piece, the owner sends that piece's new
// values and state to each backup (kReplica: a header on the replica-header tag, then the payload), and the backup
// acknowledges it (kAck). ps and ssp release a pull reply of clock t only once every backup acknowledged clock
// t - S of the piece, so whatever a worker has pulled is on a backup: a backup's copy is never behind what any
// worker has seen, and a lost server's shard is restored exactly (ps: up to float rounding -- the same values).
// ps-async does not wait: a reply goes out at once and the updates a lost server applied after its backup's last
// acknowledgement are lost (at most the pushes in flight at the loss). Cost: every update sends (values + state) of
// the piece to r servers, and ps/ssp replies wait for one server-to-server round trip (the blocking wait on one
// receive that ps otherwise uses is then a poll). A server enters the region by sending a full replica of every
// piece when its state changed outside the stream (construction, restore, growth); a re-form sends it inside its
// transaction and waits, before voting, until its backups acknowledged it and it holds its primaries' (reform()). A
// backup replaces its copy of a piece only once a replica's payload arrived whole (a primary lost between header and
// payload leaves the last complete copy). At a sync point a server waits for its backups' acknowledgements and sends
// each an end marker, and serves until its own primaries' markers came.
//
// Collective points: ranks enter the push/pull region with their first step and leave it at sync_point(), which the
// trainer calls before every world collective (end of an epoch, evaluate, checkpoint, trace) and at destruction:
// workers send kPause(clock); a server serves until every worker has paused, then (push/pull) sends each worker its
// whole shard, so every worker leaves holding the servers' parameters (async workers differ until then).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/nn/model.hpp"
#include "engine/optim/optimizer.hpp"
#include "engine/optim/schedule.hpp"
#include "engine/parallel/gradient_sync.hpp"
#include "engine/parallel/job.hpp"
#include "engine/parallel/schedule.hpp"
#include "engine/parallel/step_trace.hpp"

namespace tandem::engine::parallel {

class ParameterServerSync final : public GradientSync {
 public:
  // Collective over `world` (every rank, workers and servers): servers take their shard's initial values from world
  // rank 0. `program`: the job's SyncProgram (kPushPull, or kElastic with servers); `buckets`: the stage plan's
  // (the pieces' bucket indices refer to them); `alpha`: the elastic moving rate (kElastic only). `world`, `model`
  // and `tracer` are borrowed and must outlive this object. Workers install the model's grad-ready hook.
  ParameterServerSync(comm::Communicator& world, nn::Model& model, SyncProgram program,
                      std::vector<GradientBucket> buckets, optim::OptimizerConfig optimizer,
                      optim::ScheduleConfig schedule, double alpha, Tracer& tracer);
  // Leaves the region (sync_point) unless the communicator failed; errors are swallowed here.
  ~ParameterServerSync() override;
  ParameterServerSync(const ParameterServerSync&) = delete;
  ParameterServerSync& operator=(const ParameterServerSync&) = delete;

  bool is_server() const noexcept { return server_ >= 0; }
  int32_t workers() const noexcept { return program_.workers; }
  // Steps this worker has completed (pushed and pulled); on a server, the steps it has served.
  int64_t clock() const noexcept { return clock_; }

  // ---- workers: GradientSync (push on bucket completion, pull in finish) ----
  void arm(bool armed) noexcept override { armed_ = armed; }
  void issue(int bucket) override;
  int64_t finish() override;
  int64_t last_allreduce_ns() const noexcept override { return last_busy_ns_; }

  // ---- workers: asynchronous EASGD ----
  // One elastic exchange of this worker's parameters with the centre (every server's shard); counts as a step of
  // the worker's clock. Call it every tau local steps.
  void elastic_exchange();
  // Servers: the centre variable's shard [shards[s].begin, end).
  const std::vector<float>& shard() const noexcept { return owned_.front().host; }

  // ---- servers ----
  // Serves pushes, pulls and exchanges until every worker has completed `steps` steps (kElastic: made every exchange
  // due by then, one per `period` steps). Messages of later steps are served too (async workers run ahead).
  void serve(int64_t steps);
  // The largest clock gap seen when releasing a pull reply: the pushing worker's clock minus the slowest worker's
  // (the clock of the step every worker has completely pushed to this server). ssp keeps it <= staleness.
  int64_t max_clock_gap() const noexcept { return max_gap_; }

  // ---- every rank ----
  // Collective: leaves the push/pull region (see the header comment); a no-op outside it.
  void sync_point();
  // Collective over `survivors` after worker(s) died (issue #13/#17: a worker loss is absorbed). `survivors` is the
  // communicator shrunk from this one's (Communicator::shrink: workers first, then every server -- a lost server is
  // the trainer's to refuse before this call); kept[i] is the worker index new worker i had here; `steps`: on a
  // worker, the steps it completed (its step in flight, if any, is abandoned). Every survivor calls it, whatever it
  // was doing when the failure surfaced. The rule:
  //  - clocks: each worker keeps its own (elastic: exchanges made). ps and ssp: A = the clock that every piece of
  //    every server has applied; a worker below A (its push of step A was applied everywhere, only the pull was lost)
  //    moves to A and its step in flight counts as done (step_done);
  //  - servers: the lost worker's state and pending pushes are dropped, as are the pushes of a step in flight (it is
  //    pushed again); every clock now complete over the survivors is applied, averaged over them. A push of a clock
  //    a piece applied already (a step redone after its first push arrived) is answered with the current values and
  //    not applied twice. ps-async: nothing pending. Elastic (easgd): the centre is kept as it is;
  //  - parameters (push/pull): every server sends its shard to every worker, so the workers go on from the servers'
  //    newest parameters (elastic workers keep their own);
  //  - everyone is back in the push/pull region; ssp's bound holds over the survivors.
  // Lost servers (issue #17): `kept_servers` holds the index each surviving server had here (servers follow the
  // workers in `survivors`). Every lost shard goes to its owner's first surviving backup (fail_over_servers, the job
  // compiler's rule), which takes it over from its replica: values, optimizer state and clock (ps, ssp: applied =
  // the replica's clock, which is never behind what a worker pulled, so the clock rule above stays exact: a worker
  // that redoes its step starts again from the parameters it started it with). When a lost shard has no complete
  // replica on a survivor: with `checkpoint` true it goes to the next surviving server in ring order with empty
  // values and `from_checkpoint` is set -- the caller must restore every rank from its checkpoint (restore());
  // otherwise every survivor throws kPeerFailure naming every such shard, its lost server and why (no replica on a
  // survivor -- its backups were lost with it, at once or before the replicas were re-seeded -- or an incomplete one),
  // and that there is no checkpoint. ssp: the clocks the lost owner applied after its replica's (at most S, pushed by
  // the workers that completed them) are skipped on the taken-over shard -- their updates to it are lost. The replicas are then re-placed
  // over the survivors and re-seeded inside the transaction below (before the vote), so a server lost right after the
  // commit is taken over from them exactly as one lost later. A worker whose step in flight is to be redone keeps the
  // parameters that step started from until it completes it, across further re-forms.
  // Transactional (issue #17: a second loss during a re-form): the old view -- the program (membership, shard
  // ownership), the owned shards' values, their optimizers' state and clocks, the backups kept, the clocks -- is set
  // aside untouched while the new one is built beside it (copies), the shards are taken over and sent to the workers,
  // and the region re-entered; then every survivor votes (an all-reduce of ones over `survivors`). Only when the vote completes
  // does the new view replace the old one (view_epoch() counts the commits). When any of it fails (another rank lost:
  // kPeerFailure or kTimeout from `survivors`), the attempt is discarded, the old view put back exactly as it was, and
  // the error rethrown: the caller shrinks again and calls reform() over the smaller membership, which starts from the
  // old view (the lost ranks of both failures counted against it). The buffers of an abandoned attempt's operations
  // move into the next successful reform's `retired`.
  // A rank lost inside the vote itself: the vote can complete (commit) on some survivors and fail on others. The sum
  // completes on a rank only with every survivor's one in it, so when any rank committed, every survivor had built
  // the new view completely before voting. A rank whose vote failed therefore keeps the view it built aside
  // (has_tentative()) beside the old one it goes back to, and the caller settles the outcome over the next
  // membership before anything else (ParallelTrainer::settle_ps_view): when a survivor committed (its view_epoch() is
  // one above), the others adopt_tentative() -- they are then where a rank that committed and lost a peer at once
  // is -- otherwise every survivor drop_tentative()s and goes on from the old view. Nothing but the next re-form runs
  // between, so a rolled-forward view is re-formed at once.
  // Buffers of the failed communicator's operations move into `retired`, which must outlive that communicator.
  struct Reformed {
    bool step_done = false;
    bool from_checkpoint = false;  // the caller restores every rank from the checkpoint (lost shard(s) with no replica)
    std::vector<int32_t> lost_servers;  // indices the lost servers had before this reform
    std::shared_ptr<void> retired;
  };
  Reformed reform(comm::Communicator& survivors, const std::vector<int>& kept, const std::vector<int>& kept_servers,
                  int64_t steps, bool checkpoint);
  // Re-forms this rank committed (or adopted).
  int64_t view_epoch() const noexcept { return view_epoch_; }
  // This rank's vote on its last re-form failed after it had built the new view, which it keeps aside (see reform()).
  bool has_tentative() const noexcept { return tentative_ != nullptr; }
  // The kept view becomes this rank's (as if its vote had completed): its Reformed (`retired` empty) is returned.
  Reformed adopt_tentative();
  // The kept view is discarded (no survivor committed it).
  void drop_tentative();
  // A re-form took shards from the checkpoint (Reformed::from_checkpoint) and restore() has not run since: the
  // shards' values are not real yet. The next reform() (any survivor's flag counts) goes back to the checkpoint
  // again, whatever was lost, rather than take them as real.
  bool restore_due() const noexcept { return restore_due_; }
  // Collective over `grown` after new workers joined (issue #17: growth at a step boundary). Every rank is outside
  // the push/pull region (the trainer's sync point before it polled for joiners; a joiner's object is new), at one
  // clock. `grown` orders the workers first (the old ones in their order, then the joiners) and then the servers,
  // which keep their indices; from_worker[i] is the index worker i had before (-1: a joiner). `program` is the job
  // compiled at the new width (the compiler sizes the servers; the shards and pieces are those of the running job, as
  // no server joins). `clock`: the job's steps, which every rank takes (the joiner starts at the current clock).
  // The rule: ps counts the new workers in every clock from the next (each clock averages W' pushes); ssp starts them
  // at the current clock, the slowest, so its bound holds over all W'; ps-async has nothing to wait for (the schedule
  // keeps its pace: one step per W' updates from here). The replicas are re-placed (their world ranks moved) and
  // re-seeded on entering the region. Then every server sends its shards to every worker: the joiners' first pull
  // is the servers' current parameters (the old workers get the values they hold already). `lr_scale` multiplies
  // the servers' learning rate from now on (the trainer's rule).
  // A view change like reform()'s, and the same transaction (issue #17: never two views at once): the old view is
  // set aside untouched while the grown one is built beside it (copies) and the shards sent; then every rank of
  // `grown` votes with its view epoch (an allgather: it completes nowhere unless every rank, the joiners too, built
  // its part). Only then does the grown view replace the old one, at view epoch max(every rank's) + 1, so a joiner
  // counts every re-form before it and all ranks leave at the same epoch. When any of it fails (a rank lost), the
  // attempt is discarded, the old view put back exactly as it was and the error rethrown; a rank whose vote failed
  // keeps the grown view aside (has_tentative()) and the caller settles it over the next membership as a re-form's
  // (ParallelTrainer::settle_ps_view): adopted when a rank committed, dropped when none did.
  void grow(comm::Communicator& grown, const std::vector<int>& from_worker, const SyncProgram& program, int64_t clock,
            double lr_scale);
  double lr_scale() const noexcept { return lr_scale_; }
  // Test hook (documented at ParallelTrainer's TANDEM_TEST_REFORM_LEAVE): called by reform() at its named points,
  // "agreed" (after the survivors' agreement, before anything is built), "voting" (the new view built, the shards
  // sent and the replicas re-seeded, before the vote), "voted" (the vote completed here, before the commit) and
  // "committed" (after the commit); by a server between a replica's header and its payload, "replicating" (only
  // replicas of updates >= 1); and by grow() at "growing" (the grown view built, before a server sends its shards or
  // a worker receives them), "grow-voted" and "grow-committed" (as "voted" and "committed"). It may throw; reform()
  // and grow() then discard the attempt as after a peer's loss (at "voted"/"grow-voted", as a vote that failed: the
  // new view kept aside; at "committed"/"grow-committed" the commit stands).
  void set_reform_hook(std::function<void(const char*)> hook) { reform_hook_ = std::move(hook); }
  // What a server did to a piece, in the order it did it (the replay of racing runs: param_server_test.cpp).
  //  kApplied: an update of the piece. ps/ssp: clock `clock`, every worker's push of it averaged (`worker` -1);
  //    ps-async: worker `worker`'s push of clock `clock`. `version`: the piece's updates so far, this one included
  //    (ps/ssp: its clocks applied; ps-async: its optimizer's update count).
  //  kReplied: the pull reply to worker `worker`'s push of clock `clock` left with the piece's values after `version`
  //    updates -- the parameters that worker computes its step clock + 1 from.
  struct PieceEvent {
    enum Kind : int32_t { kApplied, kReplied };
    Kind kind = kApplied;
    int32_t piece = 0;   // global index in program().pieces
    int32_t worker = -1;
    int64_t clock = 0;
    int64_t version = 0;
  };
  // Servers: called on every such event (on the serving thread); empty: none (the default).
  void set_piece_hook(std::function<void(const PieceEvent&)> hook) { piece_hook_ = std::move(hook); }
  // The buffers of operations that may still be in flight on a failed communicator (abandoned re-form attempts, an
  // exchange of shards cut short): the caller keeps them until that communicator is destroyed.
  std::shared_ptr<void> take_retired();
  // ---- the piggy-backed joiner check (issue #17; ps and ssp, staleness S >= 0) ----
  // Worker 0, having read the job's store (Communicator::peek_joins, rank 0 alone), asks for an admission: its next
  // kStep(t) control message carries the request (Header::reserved = 1), which makes the admission due at the step
  // boundary B = t + S. A server that has seen the request puts B on every pull reply from then on (reserved =
  // 1 + B - clock), so every rank knows B by the time it completes step B:
  //  - a server serves step B only once worker 0 pushed clock B >= t, so after its kStep(t) arrived;
  //  - a worker's pull reply of clock c >= B = t + S waits until every piece applied clock c - S >= t, which needs
  //    worker 0's push of t, so it leaves after the request; and no worker completes step c without that reply.
  // Nothing is collective until the boundary where a joiner waits (the trainer's sync point and admission there).
  // -1: no admission due. reform() and grow() clear it (worker 0 asks again if someone still waits).
  void request_admission();
  int64_t admission_due() const noexcept { return admit_at_; }
  void clear_admission() noexcept {
    admit_at_ = -1;
    request_next_ = false;
  }
  // Servers: the learning-rate factor from the next update on (the trainer's rule after the workers changed: a loss
  // re-applies it as growth does, so a shrink after a grow does not keep the grown factor). kInvalidArgument unless > 0.
  void set_lr_scale(double lr_scale);
  // The program as it is now (after a server loss: the surviving servers' shards and pieces).
  const SyncProgram& program() const noexcept { return program_; }
  // Servers: the shard indices (in program().shards) this server owns now, and one's values (kInvalidArgument when
  // this server does not own it).
  std::vector<int32_t> owned_shards() const;
  const std::vector<float>& shard_values(int32_t index) const;

  // Collective (after sync_point): the optimizer state of every server's shard, assembled on world rank `root` into
  // whole-model vectors (one per state tensor of the optimizer: sgd with momentum 1, adam 2); empty elsewhere.
  std::vector<std::vector<float>> gather_state(int root);
  // Asynchronous EASGD, collective (after sync_point): the centre variable, every server's shard, assembled on world
  // rank `root` into one whole-model parameter vector; empty elsewhere.
  std::vector<float> gather_centre(int root);
  // After a checkpoint is read on every rank (outside the region): `steps` completed worker steps, the whole model's
  // parameters and optimizer state vectors. Servers take their shard; every rank resets its clocks to `steps`.
  // Asynchronous EASGD: `params` is the centre (the servers take their shard of it; `state` is not used) and every
  // rank's exchange count becomes ceil(steps / tau), the exchanges a worker makes in its first `steps` steps.
  // `updates` (ps-async, >= 0): the servers' optimizer update count when the checkpoint was written (updates()); it
  // is steps x workers only at one width -- after a grow or a shrink the pushes per step changed. -1: steps x workers.
  void restore(int64_t steps, const float* params, const std::vector<const std::vector<float>*>& state,
               int64_t updates = -1);
  // Servers: their optimizer's update count (the same on every piece after sync_point); -1 on a worker.
  int64_t updates() const noexcept;

 private:
  struct Header {
    int32_t kind = 0;
    int32_t sender = 0;
    int32_t piece = 0;
    int32_t reserved = 0;
    int64_t clock = 0;
    int64_t count = 0;  // f32 values after the header
  };
  static_assert(sizeof(Header) == 32);
  // A header followed by `count` floats; owns its storage and the Work using it.
  struct Message {
    std::vector<float> buf;  // 8 floats of header, then the payload
    std::unique_ptr<comm::Work> work;
    Header header() const;
    float* payload() { return buf.data() + 8; }
    const float* payload() const { return buf.data() + 8; }
    void set(const Header& h);
  };
  struct ServerPiece {  // a piece of a shard this server owns
    int32_t global = 0;  // index in program_.pieces
    int32_t shard = 0;   // index in owned_
    int64_t offset = 0, size = 0;  // in the shard
    std::vector<int64_t> acked;  // per backup link: the newest update count it acknowledged (-1: none)
    int64_t replicated() const noexcept;  // the lowest of acked (INT64_MAX without backups)
    std::unique_ptr<optim::Optimizer> optimizer;
    int64_t applied = 0;  // ps/ssp: clocks applied
    // ps-async: the schedule's step is lr_steps + (updates - lr_updates) / workers; the base moves when the number of
    // workers changes (grow, reform), so the schedule keeps its place rather than jump.
    int64_t lr_steps = 0, lr_updates = 0;
    int64_t schedule_step(int64_t updates, int32_t workers) const noexcept {
      return lr_steps + (updates - lr_updates) / workers;
    }
    std::map<int64_t, std::vector<std::vector<float>>> pending;  // clock -> per-worker gradients (empty: not in)
  };
  struct WorkerState {  // a server's view of one worker
    Message control;                 // the posted control receive
    std::vector<Message> push;       // per local piece
    std::vector<Message> reply;      // per local piece: the last reply sent
    std::vector<int64_t> push_clock; // per local piece: the clock of its last push received
    std::vector<int64_t> pulled;     // per local piece: its update count when its values last went to this worker
                                     // (ps-async staleness: a reply, a sync point's shard, a restore)
    int64_t started = 0;             // clock of its last kStep / kElastic
    int64_t done = 0;                // clocks completely pushed (every local piece) / exchanges made
    int64_t replied = 0;             // pull replies sent for clock `started`
    int64_t started_ns = 0;          // when its kStep of clock `started` was taken (the trace's push spans)
    bool paused = true;
    Message elastic;                 // elastic payload being received
    Message delta;                   // elastic reply
  };
  struct Withheld {
    int32_t worker, piece;  // local piece index
    int64_t clock;
  };

  struct Shard {  // a key range this server owns
    int32_t index = 0;  // in program_.shards
    KeyRange range;
    std::vector<float> host;  // its values (parameters or the elastic centre), host memory
    Tensor dev;               // the same on the backend (the optimizers' buffer)
  };
  struct Link {  // this server -> one of its backups
    int to = 0;                                    // world rank
    std::vector<Message> sends;                    // replica messages in flight (buffered sends complete at once)
    std::vector<std::pair<int32_t, int64_t>> unacked;  // (local piece, update count), in send order
    Message ack;                                   // the posted acknowledgement receive (while unacked is non-empty)
  };
  struct Primary {  // a server whose shards this server backs up
    int from = 0;     // world rank
    Message header;   // the posted replica-header receive (inside the region until the primary's end marker)
    bool ended = true;
  };
  struct Kept {  // this server's backup of one piece
    std::vector<float> values;  // values, then the optimizer's state tensors
    int64_t updates = -1;       // the optimizer's update count (ps, ssp: the piece's clock); -1: none yet
  };
  struct View {  // moved whole: a Shard keeps its buffers (its pieces' optimizers point into them)
    SyncProgram program;
    comm::Communicator* world = nullptr;
    int rank = 0, server = -1;
    int64_t clock = 0, exchanges = 0;
    bool step_started = false, in_region = false, reseed = false;
    std::vector<Shard> owned;
    std::vector<ServerPiece> pieces;
    std::map<int32_t, Kept> kept;
  };

  enum Kind : int32_t { kStep = 1, kPause = 2, kPush = 3, kPull = 4, kFinal = 5, kInit = 6, kElastic = 7,
                        kCentre = 8, kDelta = 9, kState = 10, kReplica = 11, kAck = 12, kReplicaEnd = 13 };
  static const char* kind_name(int32_t kind) noexcept;
  uint32_t push_tag(int32_t piece) const;
  uint32_t pull_tag(int32_t piece) const;
  // Checks a received message's header: kMismatch naming the sender when it is not what the protocol expects.
  void expect(const Message& m, int from, int32_t kind, int32_t piece, int64_t clock, int64_t count) const;
  void send_control(int32_t kind, int64_t clock);
  // Collective: K values per key of every owned shard (fill(i, out): owned_[i]'s, K x its size, value-major) sent to
  // `root`, which assembles K whole-model vectors (gather_state, gather_centre).
  std::vector<std::vector<float>> gather_shards(int root, size_t K,
                                                const std::function<void(size_t shard, float* out)>& fill);

  // worker
  void on_grad_ready(size_t layer);
  void copy_into_params(int64_t begin, int64_t size, const float* src);
  void receive_shards();  // every shard's kFinal (clock clock_) from its owner into the model's parameters
  void send_shards(const std::vector<int64_t>& clocks);  // server: each owned shard to worker w, at clocks[w]
  // server
  void enter_region();
  // The shard `index` of program_.shards, taken over with `values` (its whole range): its pieces get optimizers.
  Shard& own_shard(int32_t index, const float* values);
  const float* host_of(const ServerPiece& p) const;
  // Replication: links to this server's backups and from its primaries, for the current program.
  void place_replicas();
  void replicate(ServerPiece& p);  // the piece's values and state to every backup
  bool poll_replication();
  bool replication_flushed() const;
  bool replicas_seeded() const;  // every piece of every primary has a complete replica here
  void end_replication();  // sync point: the end marker to every backup
  // A server's view of a worker (re)started at `clock`, outside the region, for the current pieces.
  void reset_peer(WorkerState& ws, int64_t clock) const;
  // ps-async staleness: every piece's values as they are now went to this worker (WorkerState::pulled).
  void mark_pulled(WorkerState& ws) const;
  // ps-async: before the number of workers changes, each piece's schedule keeps its place (ServerPiece::lr_steps).
  void rebase_schedule();
  bool poll_worker(int w);
  void on_push(int w, int j);
  void apply_clock(ServerPiece& p, int64_t clock);
  void apply_complete(ServerPiece& p);  // ps/ssp: every complete clock from the oldest
  void apply_async(ServerPiece& p, const float* grad, const WorkerState& from, int j);
  void reply(int w, int j, int64_t clock);
  bool release_withheld();
  void on_elastic(int w);
  int64_t slowest() const;
  // ps: a posted receive that will land without a reply of ours (for serving up to clock `due`), or null.
  comm::Work* next_receive(int64_t due);
  template <typename Done>
  void serve_until(const Done& done, int64_t due, const char* what);

  comm::Communicator* world_;  // the job's communicator (reform() moves to the survivors')
  nn::Model& model_;
  SyncProgram program_;
  std::vector<GradientBucket> buckets_;
  optim::OptimizerConfig optimizer_config_;
  optim::ScheduleConfig schedule_;
  float alpha_;
  Tracer& tracer_;
  int rank_ = 0;
  int server_ = -1;      // this rank's server index, -1 on a worker
  bool elastic_ = false;
  bool in_region_ = false;
  int64_t clock_ = 0;
  int64_t exchanges_ = 0;  // elastic exchanges made (worker)
  int64_t max_gap_ = 0;
  int64_t last_busy_ns_ = 0;
  std::vector<Message> stray_;  // receive_shards/send_shards cut short: their messages, which may still be in flight
  std::function<void(const char*)> reform_hook_;
  std::function<void(const PieceEvent&)> piece_hook_;
  void note(PieceEvent::Kind kind, const ServerPiece& p, int32_t worker, int64_t clock) const;
  struct InFlight;             // operations of a failed communicator (or an abandoned re-form) and their buffers
  void retire_in_flight(InFlight& into);
  std::vector<std::shared_ptr<void>> abandoned_;  // abandoned re-form attempts' buffers, until the next commit
  View take_view();          // this object's view, moved out
  void put_view(View&& v);   // and back in
  // Server, building a new view: copies of the old view's shards this server keeps (values; each piece's optimizer
  // state and update count, clock and schedule base), then `more` for each piece with its old self.
  void copy_owned(const View& old, const std::function<void(ServerPiece&, const ServerPiece&)>& more);
  std::unique_ptr<View> tentative_;  // a re-form's new view whose vote failed here (has_tentative())
  Reformed tentative_out_;
  int64_t view_epoch_ = 0;
  bool restore_due_ = false;
  int64_t admit_at_ = -1;     // the step boundary an admission is due at (request_admission), -1: none
  bool request_next_ = false;  // worker 0: the next kStep carries the request
  double lr_scale_ = 1.0;  // servers: x the schedule's learning rate (growth's rule; parallel_trainer.hpp)

  // worker
  std::vector<std::vector<int32_t>> bucket_pieces_;  // per bucket: global piece indices
  std::vector<int> trigger_bucket_;                  // per layer: bucket complete after it, or -1
  std::vector<bool> issued_;
  std::vector<Message> push_, pull_;                 // per global piece
  std::vector<std::unique_ptr<comm::Work>> control_sends_;
  std::vector<Header> control_out_;                  // per server: the control header being sent
  bool armed_ = false;
  bool step_started_ = false;
  int64_t first_issue_ns_ = 0;

  std::vector<float> step_start_;  // ps with replicas: this worker's parameters at the start of its step in flight

  // server
  std::vector<Shard> owned_;  // the key ranges it owns (one at start; more after taking over a lost server's)
  std::vector<ServerPiece> pieces_;
  std::vector<Link> backups_;
  std::vector<Primary> primaries_;
  std::map<int32_t, Kept> kept_;  // global piece -> this server's backup of it
  std::vector<Message> ack_sends_;  // acknowledgements in flight
  bool reseed_ = true;  // send a full replica of every piece on entering the region
  std::vector<WorkerState> peers_;
  std::vector<Withheld> withheld_;
};

}  // namespace tandem::engine::parallel
