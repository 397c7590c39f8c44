/* Tandem: hybrid-parallel training runtime and cluster simulator -- the public C ABI.
 *
 * This is the only public header. It compiles as C99 and as C++. Conventions (see STYLE.md):
 *  - every fallible call returns tandem_status_t; on failure a one-line message describing what
 *    failed is kept per thread (tandem_last_error_message) until the next tandem_ call on it;
 *  - _create returns a handle, _destroy releases it (NULL is a no-op);
 *  - params structs start with field_mask; the library reads only flagged fields;
 *  - inputs are borrowed for the call; returned strings stay owned by the library;
 *  - a failing call leaves its out-parameters untouched.
 */
#ifndef TANDEM_TANDEM_H
#define TANDEM_TANDEM_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(TANDEM_BUILDING_LIBRARY)
#    define TANDEM_API __declspec(dllexport)
#  else
#    define TANDEM_API __declspec(dllimport)
#  endif
#else
#  define TANDEM_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
#  define TANDEM_NOEXCEPT noexcept
extern "C" {
#else
#  define TANDEM_NOEXCEPT
#endif

#define TANDEM_DEPRECATED(msg) __attribute__((deprecated(msg)))

/* ---- Versions ----------------------------------------------------------------------------- */
#define TANDEM_VERSION_MAJOR 0
#define TANDEM_VERSION_MINOR 5
#define TANDEM_VERSION_PATCH 0
#define TANDEM_VERSION (TANDEM_VERSION_MAJOR * 10000 + TANDEM_VERSION_MINOR * 100 + TANDEM_VERSION_PATCH)

/* 0.5 added (nothing changed or removed): tandem_sim_result_query_v and tandem_sim_result_candidate_v,
 * told sizeof(tandem_sim_summary_t) as the caller compiled it, read and write nothing past it; the summary's
 * memory_data_bytes (TANDEM_SIM_SUMMARY_MEMORY_DATA, appended, _v calls only); the calibration's shared-core wake-up
 * probe (TANDEM_CALIBRATE_PARAM_WAKEUP: wakeup_burst_s, wakeup_ranks_per_core, appended to tandem_calibrate_params_t
 * and read only when the bit is set). tandem_sim_result_query and _candidate
 * now write only the fields of the groups asked for, within 0.4's struct (before, they copied the whole struct in and
 * out: a caller built against an older, shorter struct had memory past it read and rewritten).
 * 0.4.1 changed: tandem_parallel_train and tandem_simulate refuse (TANDEM_ERR_INVALID_ARGUMENT, naming the bit)
 * strategy fields whose bits are set for another strategy (TANDEM_PARALLEL_PARAM_SERVERS with "ddp", ...); 0.4.0
 * ignored them silently.
 * 0.4 added (nothing changed or removed): loss scaling for fp16 math (tandem_trainer_params_t.loss_scale and
 * loss_scale_init/_growth/_backoff/_growth_interval behind TANDEM_TRAINER_PARAM_LOSS_SCALE and
 * TANDEM_TRAINER_PARAM_LOSS_SCALER, appended and read only when their bits are set; tandem_trainer_loss_scale);
 * tandem_context_cpu_isa; the settings TANDEM_CPU_MAX_ISA and TANDEM_CPU_MATH.
 * 0.3 added (nothing changed or removed): collectives on device memory (tandem_coll_params_t,
 * tandem_comm_allreduce_ex, tandem_comm_broadcast_ex, tandem_comm_device_path, tandem_nccl_version,
 * tandem_cuda_device_count); the
 * calibration's per-sample cost curve (TANDEM_CALIBRATE_PARAM_CURVE, TANDEM_CALIBRATION_ATTR_CURVE,
 * tandem_calibration_curve). */
/* The loaded library's TANDEM_VERSION. Threads: any. */
TANDEM_API uint32_t tandem_version(void) TANDEM_NOEXCEPT;
/* The loaded library's version as "MAJOR.MINOR.PATCH"; static storage. Threads: any. */
TANDEM_API const char* tandem_version_string(void) TANDEM_NOEXCEPT;

/* ---- Status and errors -------------------------------------------------------------------- */
typedef enum tandem_status {
  TANDEM_OK = 0,
  TANDEM_IN_PROGRESS = 1,
  TANDEM_ERR_INVALID_ARGUMENT = 2,
  TANDEM_ERR_UNSUPPORTED = 3,
  TANDEM_ERR_OUT_OF_MEMORY = 4,
  TANDEM_ERR_TRANSPORT = 5,
  TANDEM_ERR_BACKEND = 6,
  TANDEM_ERR_TIMEOUT = 7,
  TANDEM_ERR_INTERNAL = 8,
  TANDEM_ERR_MISMATCH = 9,      /* ranks called different collectives or disagree on a configuration */
  TANDEM_ERR_PEER_FAILURE = 10, /* a peer died, disconnected or aborted */
  TANDEM_ERR_IO = 11,           /* a file could not be read/written or is malformed */
  TANDEM_ERR_AUTH = 12,         /* rendezvous authentication failed */
  TANDEM_STATUS_FORCE_INT32_ = 0x7fffffff
} tandem_status_t;

/* Static text naming a status ("timeout", ...). Threads: any. */
TANDEM_API const char* tandem_status_string(tandem_status_t s) TANDEM_NOEXCEPT;
/* This thread's last failure message ("" if none); valid until the next tandem_ call on this
 * thread. Threads: any (per thread). */
TANDEM_API const char* tandem_last_error_message(void) TANDEM_NOEXCEPT;

/* ---- Element types and reductions --------------------------------------------------------- */
typedef enum tandem_dtype {
  TANDEM_F32 = 0, TANDEM_F64 = 1, TANDEM_F16 = 2, TANDEM_BF16 = 3, TANDEM_I32 = 4, TANDEM_I64 = 5,
  TANDEM_U8 = 6, TANDEM_DTYPE_FORCE_INT32_ = 0x7fffffff
} tandem_dtype_t;

typedef enum tandem_op {
  TANDEM_SUM = 0, TANDEM_AVG = 1, TANDEM_MIN = 2, TANDEM_MAX = 3, TANDEM_PROD = 4,
  TANDEM_OP_FORCE_INT32_ = 0x7fffffff
} tandem_op_t;

/* Size in bytes of one element (0 for an invalid dtype). Threads: any. */
TANDEM_API size_t tandem_dtype_size(tandem_dtype_t dtype) TANDEM_NOEXCEPT;

/* ---- Logging ------------------------------------------------------------------------------ */
typedef enum tandem_log_level {
  TANDEM_LOG_TRACE = 0, TANDEM_LOG_DEBUG = 1, TANDEM_LOG_INFO = 2, TANDEM_LOG_WARN = 3,
  TANDEM_LOG_ERROR = 4, TANDEM_LOG_OFF = 5, TANDEM_LOG_FORCE_INT32_ = 0x7fffffff
} tandem_log_level_t;
/* A log sink; called on the thread of a call through its context, serialized per context (see
 * "Logging" below). Must not call back into tandem_. */
typedef void (*tandem_log_fn)(tandem_log_level_t level, const char* message, void* user_data);

/* ---- Context ------------------------------------------------------------------------------ */
typedef struct tandem_context tandem_context_t;

#define TANDEM_CONTEXT_PARAM_NUM_THREADS (UINT64_C(1) << 0)
#define TANDEM_CONTEXT_PARAM_LOG_SINK    (UINT64_C(1) << 1) /* covers log_sink + log_user_data */
#define TANDEM_CONTEXT_PARAM_LOG_LEVEL   (UINT64_C(1) << 2)
#define TANDEM_CONTEXT_PARAM_SETTINGS    (UINT64_C(1) << 3) /* covers settings + num_settings */
typedef struct tandem_context_params {
  uint64_t field_mask;
  int32_t num_threads;          /* compute threads; default: OMP_NUM_THREADS or all cores */
  tandem_log_fn log_sink;       /* default: stderr */
  void* log_user_data;
  tandem_log_level_t log_level; /* default: the context's TANDEM_LOG_LEVEL, else WARN */
  /* "NAME=VALUE" strings overriding the environment's TANDEM_* settings for this context (see the
   * table below); an empty VALUE unsets NAME. Copied; later entries win. */
  const char* const* settings;
  size_t num_settings;
} tandem_context_params_t;
#define TANDEM_CONTEXT_PARAMS_INIT {0}

/* Settings. Each context snapshots the TANDEM_* environment variables below once, in
 * tandem_context_create, and applies params->settings over them; every value is checked there
 * (TANDEM_ERR_INVALID_ARGUMENT naming the variable). Work done through the context's handles uses
 * that snapshot; code that runs without a context uses one snapshot per process, taken on first
 * use. Changing the environment later has no effect on either. Unset (or empty) means the default.
 *
 *  Launcher (per-job bootstrap; `tandem launch` sets them; torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
 *  LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, Open MPI's OMPI_COMM_WORLD_* and Slurm's SLURM_PROCID,
 *  SLURM_NTASKS, SLURM_LOCALID are read, from the environment, when these are unset)
 *   TANDEM_RANK               this process's rank, read with TANDEM_WORLD_SIZE    default 0
 *   TANDEM_WORLD_SIZE         ranks in the job                                     default 1
 *   TANDEM_LOCAL_RANK         rank among the job's ranks on this host              default derived
 *   TANDEM_LOCAL_WORLD_SIZE   the job's ranks on this host                         default derived
 *   TANDEM_MASTER_ADDR        rendezvous host (rank 0 serves it, see TANDEM_STORE) default 127.0.0.1
 *   TANDEM_MASTER_PORT        rendezvous port, 1..65535                            default derived
 *   TANDEM_SECRET             the job's shared rendezvous secret          default derived (logged)
 *   TANDEM_STORE              HOST:PORT of a rendezvous store another process serves
 *                             (`tandem launch` sets it; see tandem_store_serve)  default unset
 *  Communicator (tandem_comm_params_t fields win over these)
 *   TANDEM_TRANSPORT          auto, inproc, tcp, zmq, ucx, rdma                    default auto
 *   TANDEM_TIMEOUT_MS         deadline of every blocking operation, ms             default 60000
 *   TANDEM_ALLREDUCE_ALGO     auto, ring, hd, tree, hier, direct, det              default auto
 *   TANDEM_DETERMINISTIC      1: reduce in a fixed order (bit-identical runs)      default 0
 *   TANDEM_CHUNK_BYTES        pipelining chunk of large collectives, bytes   default per algorithm
 *  Transports
 *   TANDEM_IFACE_ADDR         address tcp and zmq listen on                  default the bind host
 *   TANDEM_TCP_LOCAL          shm, unix or tcp: same-host ranks use shared memory,
 *                             AF_UNIX streams, or TCP                             default shm
 *   TANDEM_TCP_SPIN_US        tcp: us a waiter polls before blocking, 0..1000000   default 100
 *   TANDEM_TCP_MAX_UNEXPECTED tcp: bytes one unexpected message may allocate       default 4 GiB
 *   TANDEM_ZMQ_LOCAL          ipc, or tcp: same-host ranks use TCP instead of ipc  default ipc
 *   TANDEM_ZMQ_SPIN_US        zmq: us a waiter polls before blocking, 0..1000000   default 100
 *   TANDEM_ZMQ_IO_THREADS     zmq: ZeroMQ I/O threads per transport, 1..64         default 1
 *   TANDEM_ZMQ_HEAP_PAD       zmq, opt-in: bytes of glibc malloc M_TOP_PAD (0..2^30) to set,
 *                             once and for the whole process, so large frames do not fault
 *                             their pages in again each time; 0 leaves malloc alone  default 0
 *   TANDEM_UCX_BUSY_US        ucx: us of busy polling before sleeping, 0..60000000 default 2000
 *   TANDEM_UCX_ERR_MODE       ucx: peer (peer error mode on every endpoint) or auto   def. auto
 *  Compute, data, training
 *   TANDEM_CPU_WINOGRAD       cpu: auto, on or off (1 and 0: auto and off): the     def. auto
 *                             algorithm of 3x3 stride-1 convolutions. auto: Winograd
 *                             F(4x4,3x3), oneDNN's where it has one (AVX-512), else
 *                             Tandem's own for all three passes (AVX2, at least 32
 *                             channels in and out); on: Tandem's on every
 *                             such layer, any ISA; off: direct kernels everywhere.
 *                             Winograd rounds differently: Tandem's errs by up to
 *                             6e-6 of the largest output in the tests (bound 2e-5;
 *                             direct kernels 5e-7). Read when a context's CPU
 *                             backend is made
 *   TANDEM_CPU_MAX_ISA        cpu: all, avx512, avx2 or sse41: the highest vector  default all
 *                             ISA of the CPU backend's own kernels, the collectives'
 *                             reductions and oneDNN (min of it and the CPU's; see
 *                             tandem_context_cpu_isa). oneDNN's cap is process-wide and
 *                             takes effect only before the process's first oneDNN
 *                             primitive: a later, stricter cap fails with
 *                             TANDEM_ERR_UNSUPPORTED naming it
 *   TANDEM_CUDA_ALLOW_TF32    cuda: 1 allows TF32 tensor cores                     default 0
 *   TANDEM_CPU_MATH           cpu, reference: f32, or fp16: an EMULATION of the    default f32
 *                             cuda backend's fp16 math (operands of convolutions
 *                             and GEMMs rounded to IEEE half, convolution results
 *                             too; f32 otherwise). Slower than f32, not faster: it
 *                             checks that a model trains in fp16 before a GPU does
 *   TANDEM_CUDA_MATH          cuda: f32, or bf16 / fp16: convolutions and GEMMs    default f32
 *                             round their inputs to bf16 / fp16 for the tensor
 *                             cores (f32 accumulation; tensors between layers stay
 *                             f32). fp16 needs loss scaling (trainer params)
 *   TANDEM_HALF_GROUPED_CONV  1: grouped (depthwise) convolutions take 16-bit      default 0
 *                             math too (cuda bf16 / fp16, the cpu fp16 emulation);
 *                             by default they stay f32 (memory-bound: the tensor
 *                             cores gain them nothing, the conversions cost)
 *   TANDEM_DEVICE_COLLECTIVES auto, nccl or staged: how collectives move device
 *                             memory (see tandem_comm_allreduce_ex)               default auto
 *   TANDEM_DATA_DIR           extra folder tried first for datasets (DIR/fashion-mnist) def. unset
 *   TANDEM_MEMORY_GUARD       0 skips the out-of-memory check before training      default 1
 *   TANDEM_MEMORY_LIMIT_BYTES memory limit that check uses       default cgroup or MemAvailable
 *   TANDEM_TEST_NONFINITE     test hook, "rank:step": that world rank's gradients get a NaN at
 *                             that step of a loss-scaled parallel job (every rank must skip)  default unset
 *   TANDEM_TEST_FEDAVG_STALL  test hook, "rank:round:seconds": that world rank sleeps before it
 *                             reports that FedAvg round (a straggler for deadline tests) default unset
 *   TANDEM_TEST_REFORM_LEAVE  test hook, "rank:point": that world rank leaves the job at that point
 *                             (agreed, voting, voted, committed or restoring) of a parameter-server
 *                             re-form, between a replica's header and payload
 *                             (replicating), or of an admission of workers (growing,
 *                             grow-voted or grow-committed; split: that rank's split of
 *                             the grown world fails after the others' completed)   default unset
 *   TANDEM_TEST_SAVE_FAULT    test hook, "rank:save:what": that world rank leaves the job
 *                             (what = leave) or stalls that many seconds (what = a number) at
 *                             the start of its save-th checkpoint save of a parallel job  default unset
 *   TANDEM_TEST_UCX_NO_COPY   test hook, 1: ucx finds no memory for the copy a cancelled send
 *                             goes on from, so it cuts that peer off                default 0
 *   TANDEM_TEST_TCP_NO_COPY   test hook, 1: tcp finds no memory for the unwritten rest of a
 *                             cancelled send, so it gives that connection up       default 0
 *   TANDEM_TEST_CLOSINGS_BEHIND test hook, a world rank: at a re-form it reports one closing
 *                             collective (sums, time split, evaluation) fewer than it
 *                             completed, a mix the survivors cannot reconcile     default unset
 *  Logging and tools
 *   TANDEM_LOG_LEVEL          trace, debug, info, warn, error, off (params->log_level wins) def. warn
 *   TANDEM_EMU_NAME, TANDEM_EMU_HOST   emulated cluster and host named in calibration profiles
 *                             (set by tools/emu-cluster)                           default unset
 *   TANDEM_PREDICT_CLUSTER, TANDEM_PROFILE   the `tandem` CLI's --predict cluster and profile
 *                             (read by the CLI only, not by the library)          default unset
 *   TANDEM_MIN_RANKS          the `tandem` CLI's default train --min-ranks; `tandem launch
 *                             --min-ranks` sets it (read by the CLI only)         default unset
 *   TANDEM_MAX_RANKS          the `tandem` CLI's default train --max-ranks; `tandem launch
 *                             --max-ranks` above -n sets it (read by the CLI only) default unset
 *   TANDEM_JOIN               1: `tandem train` joins a running elastic job (tandem_comm_join);
 *                             `tandem launch --join` sets it (read by the CLI only) default 0
 *   TANDEM_JOIN_WAIT_MS       how long such a joiner waits for admission (CLI only) def. 600000
 *   TANDEM_LAUNCH_PROGRESS    1: `tandem train` draws its progress bar on stderr even when that is a
 *                             pipe or stdout carries --json; `tandem launch` (not in --json mode)
 *                             sets it for rank 0 when its own stderr is a terminal, `tandem demo`
 *                             for its one-rank run (read by the CLI only)        default 0
 *   TANDEM_TEST_KILL_AFTER_REPORT test hook, an epoch: the rank of `tandem train` that reports it
 *                             kills itself with SIGKILL right after printing it (CLI only) unset
 *
 * Logging. A context's log_sink and log_level apply to calls made through it and its handles
 * (communicators, models, datasets, trainers...): the library installs the context's logger on the
 * calling thread for the duration of each such call. Two contexts with different sinks never see
 * each other's messages. Messages from threads the library starts itself (transport progress,
 * data loaders) and from calls without a context go to the process logger: stderr at the process
 * snapshot's TANDEM_LOG_LEVEL. A sink is called serialized per context, from the calling thread. */

/* Creates a context, the root of every other handle.
 * [in] header_version: TANDEM_VERSION of the header the caller compiled against.
 * [in] params: may be NULL (all defaults). [out] out: the new context.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (out NULL; a setting that is not
 * NAME=VALUE, names no TANDEM_* setting of the table above, or has a malformed value -- the message
 * names it), TANDEM_ERR_UNSUPPORTED (a header newer than the library -- a newer major or minor
 * version, which may declare calls and fields this library lacks; a newer patch is accepted -- or
 * an unknown field_mask bit). */
TANDEM_API tandem_status_t tandem_context_create_v(uint32_t header_version, const tandem_context_params_t* params,
                                                   tandem_context_t** out) TANDEM_NOEXCEPT;
static inline tandem_status_t tandem_context_create(const tandem_context_params_t* params, tandem_context_t** out) {
  return tandem_context_create_v(TANDEM_VERSION, params, out);
}
/* Destroys a context; every handle created from it must be destroyed first. NULL is a no-op.
 * Threads: creator only. */
TANDEM_API void tandem_context_destroy(tandem_context_t* ctx) TANDEM_NOEXCEPT;

/* The CPU vector ISAs in effect under ctx's TANDEM_CPU_MAX_ISA (see the settings table), as static
 * names; any out pointer may be NULL.
 * [out] host: the best this CPU runs ("avx512", "avx2" or "baseline"); [out] cap: the setting
 * ("all", "avx512", "avx2" or "sse41"); [out] kernels: the variant of the CPU backend's own kernels
 * and of the collectives' reductions under the cap ("avx512", "avx2" or "baseline");
 * [out] onednn: oneDNN's effective ISA in this process ("avx2", "avx512_core_bf16", ...).
 * It applies the cap to oneDNN as creating a CPU model does, which fixes oneDNN's ISA for the
 * process. Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (ctx NULL),
 * TANDEM_ERR_UNSUPPORTED (oneDNN already runs above the cap in this process; the message names
 * the setting). */
TANDEM_API tandem_status_t tandem_context_cpu_isa(tandem_context_t* ctx, const char** host, const char** cap,
                                                  const char** kernels, const char** onednn) TANDEM_NOEXCEPT;

/* ---- Communicator ------------------------------------------------------------------------- *
 * A communicator is a group of ranks (processes, or threads with the inproc transport) that run
 * collectives together. Every rank of the group must call the same collectives in the same order
 * with matching counts, dtypes, ops and roots; a rank that does not gets TANDEM_ERR_MISMATCH (on
 * every rank), never corrupted data. Every blocking call has a deadline (timeout_ms). When a peer
 * dies, stalls or mismatches, the communicator fails: the failing and every later operation
 * returns an error naming the operation and the rank(s) involved, and the communicator can only
 * be destroyed, or shrunk to the ranks still alive (tandem_comm_shrink, elastic training). Counts are in elements; buffers are host memory borrowed for the call (blocking)
 * or until the request completes (non-blocking). */
typedef struct tandem_comm tandem_comm_t;
typedef struct tandem_request tandem_request_t;

/* Collective algorithms (values are stable). AUTO picks by message size and world size. As a
 * communicator's allreduce_algo every value but DIRECT is accepted; DIRECT (every rank talks to every
 * rank: the barrier's and point-to-point's pattern) has no allreduce plan, and tandem_comm_create
 * returns TANDEM_ERR_UNSUPPORTED for it. */
typedef enum tandem_algo {
  TANDEM_ALGO_AUTO = 0,
  TANDEM_ALGO_RING = 1,
  TANDEM_ALGO_HALVING_DOUBLING = 2, /* recursive halving-doubling */
  TANDEM_ALGO_TREE = 3,
  TANDEM_ALGO_HIERARCHICAL = 4,     /* reduce within a host, ring across hosts, broadcast within */
  TANDEM_ALGO_DIRECT = 5,           /* barrier, send/recv; not an allreduce algorithm (see above) */
  TANDEM_ALGO_DETERMINISTIC = 6,    /* fixed reduction order rank 0..n-1 */
  TANDEM_ALGO_FORCE_INT32_ = 0x7fffffff
} tandem_algo_t;

#define TANDEM_COMM_PARAM_RANK           (UINT64_C(1) << 0)
#define TANDEM_COMM_PARAM_SIZE           (UINT64_C(1) << 1)
#define TANDEM_COMM_PARAM_MASTER_ADDR    (UINT64_C(1) << 2)
#define TANDEM_COMM_PARAM_MASTER_PORT    (UINT64_C(1) << 3)
#define TANDEM_COMM_PARAM_SECRET         (UINT64_C(1) << 4)
#define TANDEM_COMM_PARAM_TRANSPORT      (UINT64_C(1) << 5)
#define TANDEM_COMM_PARAM_TIMEOUT_MS     (UINT64_C(1) << 6)
#define TANDEM_COMM_PARAM_ALLREDUCE_ALGO (UINT64_C(1) << 7)
#define TANDEM_COMM_PARAM_DETERMINISTIC  (UINT64_C(1) << 8)
/* Fields not flagged in field_mask come from the environment, in this order of precedence:
 * TANDEM_* (TANDEM_RANK, TANDEM_WORLD_SIZE, TANDEM_MASTER_ADDR, TANDEM_MASTER_PORT, TANDEM_SECRET,
 * TANDEM_TRANSPORT, TANDEM_TIMEOUT_MS, TANDEM_ALLREDUCE_ALGO, TANDEM_DETERMINISTIC), torchrun's
 * RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, Open MPI's OMPI_COMM_WORLD_*, Slurm's
 * SLURM_PROCID/SLURM_NTASKS; with none of them set, a single-rank job (rank 0 of 1). */
typedef struct tandem_comm_params {
  uint64_t field_mask;
  int32_t rank;                 /* 0 <= rank < size */
  int32_t size;                 /* >= 1 */
  const char* master_addr;      /* rendezvous host (rank 0 serves it), e.g. "127.0.0.1" */
  const char* secret;           /* the job's shared secret (never sent over the wire) */
  const char* transport;        /* "auto", "tcp", "zmq", "ucx" or "inproc" */
  int32_t master_port;          /* 1..65535 */
  tandem_algo_t allreduce_algo; /* default AUTO */
  int64_t timeout_ms;           /* deadline of every blocking wait, > 0; default 60000 */
  int32_t deterministic;        /* non-zero: bit-identical reductions run to run */
} tandem_comm_params_t;
#define TANDEM_COMM_PARAMS_INIT {0}

/* Creates this process's communicator over all ranks of the job (collective: every rank calls it).
 * Rank 0 serves the rendezvous (unless TANDEM_STORE names another process's, below); the others connect
 * with the shared secret and exchange transport addresses. Blocks until every rank has joined or timeout_ms
 * passes.
 * Who serves the rendezvous store: rank 0, in its process -- unless TANDEM_STORE=HOST:PORT names the
 * communicator's rendezvous (its master_addr and master_port, spelled as in TANDEM_STORE): then another
 * process serves the store there (tandem_store_serve; `tandem launch` does, for every job it starts, when
 * --master-addr is an address of its own machine) and every rank, rank 0 included, is only its client. Such
 * a store survives the death of any rank, so elastic recovery (tandem_comm_shrink) works after rank 0 dies.
 * A communicator that meets elsewhere (another port, e.g. a sub-job's) ignores TANDEM_STORE.
 * [in] ctx: the owning context; must outlive the communicator.
 * [in] params: may be NULL (everything from the environment); strings are copied.
 * [out] out: the new communicator; destroy with tandem_comm_destroy.
 * Threads: any (one call per rank). Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (a NULL or
 * destroyed ctx, out NULL, a field out of range, a malformed environment variable),
 * TANDEM_ERR_UNSUPPORTED (unknown field_mask bit, unknown transport -- on every rank, before any
 * waiting -- or allreduce_algo DIRECT), TANDEM_ERR_TIMEOUT (peers did not join in time),
 * TANDEM_ERR_AUTH (wrong secret), TANDEM_ERR_TRANSPORT.
 * A job may create communicators again and again (destroy one, create the next) and may hold
 * several at once on one master_port: each creation is matched with the other ranks' creation of
 * the same order. With transport "inproc" the ranks (threads of this process) meet in memory: no
 * port is opened, and master_addr, master_port and secret only tell jobs of one process apart. */
TANDEM_API tandem_status_t tandem_comm_create(tandem_context_t* ctx, const tandem_comm_params_t* params,
                                              tandem_comm_t** out) TANDEM_NOEXCEPT;

/* Splits a communicator: ranks passing the same color form a new communicator, ranked by
 * (key, rank in comm). Collective over comm. A negative color joins no group: *out is set to NULL
 * and TANDEM_OK is returned.
 * [out] out: the new communicator (independent of comm; destroy each separately).
 * Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_TIMEOUT,
 * TANDEM_ERR_PEER_FAILURE, TANDEM_ERR_TRANSPORT. */
TANDEM_API tandem_status_t tandem_comm_split(tandem_comm_t* comm, int32_t color, int32_t key,
                                             tandem_comm_t** out) TANDEM_NOEXCEPT;

/* A rendezvous store served by this process (not by a rank): the job's ranks reach it through TANDEM_STORE
 * (see tandem_comm_create); it lives until tandem_store_destroy, however many ranks die. Peers authenticate
 * with the job's secret exactly as with rank 0's store (a mutual challenge-response; the secret never crosses
 * the wire); it serves every communicator the ranks create.
 * `tandem launch` hosts one per job.
 * tandem_store_serve: [in] ctx: the owning context; must outlive the store. [in] bind_addr: an IP literal,
 * "*" (every interface) or an interface name; NULL: "127.0.0.1". [in] port: 0..65535, 0 = a free port (see
 * tandem_store_port). [in] secret: the job's secret, non-empty (copied). [out] out: the store.
 * Threads: any (the store answers from a thread of its own). Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT
 * (NULL/destroyed ctx, out NULL, secret NULL or empty, port out of range), TANDEM_ERR_TRANSPORT (cannot
 * listen there, e.g. the port is taken; the message names the address). */
typedef struct tandem_store tandem_store_t;
TANDEM_API tandem_status_t tandem_store_serve(tandem_context_t* ctx, const char* bind_addr, int32_t port,
                                              const char* secret, tandem_store_t** out) TANDEM_NOEXCEPT;
/* The port the store listens on. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed store,
 * port NULL). */
TANDEM_API tandem_status_t tandem_store_port(const tandem_store_t* store, int32_t* port) TANDEM_NOEXCEPT;
/* Stops serving at once (requests still waiting are answered "shutting down"; destroy it after the ranks
 * are done) and frees the store. NULL or a destroyed store is a no-op. Threads: any, once. */
TANDEM_API void tandem_store_destroy(tandem_store_t* store) TANDEM_NOEXCEPT;

/* Elastic recovery (shrink, not revoke + rebuild): after comm failed because ranks died, stalled or
 * aborted, the ranks still alive each call this and get a new communicator of the survivors, over the
 * same connections, without restarting any process. Collective over the survivors.
 * Membership rule: the survivors agree through the job's rendezvous store on one view, decided once by
 * a single coordinator (the first survivor to ask). Out are the ranks blamed for the failure (see
 * tandem_comm_get_failure; an aborting rank included), every rank that a survivor's transport saw gone
 * before it called tandem_comm_shrink (its connection closed or reset, or its process on this host
 * exited: counted out at once, not waited for), and every other rank that has not called
 * tandem_comm_shrink within comm's timeout_ms -- a slow rank counts as dead, and when it calls later it
 * is refused (TANDEM_ERR_PEER_FAILURE, "declared dead"), so there are never two views at once. A deadline
 * alone never counts a rank out early; a rank that did call stays unless blamed for the failure.
 * The survivors keep their order: new rank i is the i-th surviving old rank (the lowest survivor becomes
 * rank 0). The store must survive: with tcp, zmq or ucx rank 0 of the job serves it unless TANDEM_STORE
 * names a store served elsewhere (tandem_store_serve; `tandem launch` does), so losing rank 0 can be
 * survived only then. When the store or the coordinator dies while deciding, every survivor gets
 * TANDEM_ERR_TIMEOUT.
 * [in] failed: a communicator whose async status is a failure; it stays failed (destroy it when done).
 * [out] out: the survivors' communicator (independent of failed; destroy each separately).
 * Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed handle, out NULL,
 * or failed has not failed: nobody to remove), TANDEM_ERR_PEER_FAILURE (this rank was declared dead),
 * TANDEM_ERR_TIMEOUT (no decision: the store or the coordinator died), TANDEM_ERR_TRANSPORT. */
TANDEM_API tandem_status_t tandem_comm_shrink(tandem_comm_t* failed, tandem_comm_t** out) TANDEM_NOEXCEPT;

/* Elastic growth (issue #17): ranks started later join a running job, and its ranks admit them together.
 * Rule: a joiner (tandem_comm_join) proves the job's secret to its rendezvous -- a wrong secret is refused
 * there (TANDEM_ERR_AUTH) and is never counted -- takes a ticket from a counter in the job's store and
 * waits. The running ranks check for joiners at points of their choosing (a trainer: step boundaries)
 * with tandem_comm_pending_joins, and admit them with tandem_comm_grow: rank 0 of comm decides once
 * (joiners in ticket order; those beyond max_ranks are refused with the reason), the old ranks keep
 * ranks 0..n-1 and joiners take the next ones, and every old rank and joiner builds a new communicator
 * over new connections (epoch + 1). The old ranks then vote on comm: when any of them could not build
 * it within timeout_ms (a joiner died while being admitted), every old rank gets *out = NULL and goes
 * on with comm, and the joiners get TANDEM_ERR_PEER_FAILURE. Never two views: the decision is one
 * record in the store, and comm stays as it was (destroy it when done with it).
 *
 * tandem_comm_pending_joins: collective over comm (a healthy communicator built by tandem_comm_create,
 * tandem_comm_grow or tandem_comm_join); rank 0 reads the job's store and every rank gets the same count.
 * [out] pending: joiners waiting for admission (>= 0).
 * Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed comm, pending
 * NULL), TANDEM_ERR_UNSUPPORTED (a communicator without a store: a split or a single-rank job),
 * TANDEM_ERR_PEER_FAILURE, TANDEM_ERR_TIMEOUT, TANDEM_ERR_TRANSPORT (comm failed). */
TANDEM_API tandem_status_t tandem_comm_pending_joins(tandem_comm_t* comm, int64_t* pending) TANDEM_NOEXCEPT;

/* tandem_comm_grow: collective over comm. [in] max_ranks: > 0 bounds the grown size (joiners beyond it
 * are refused with TANDEM_ERR_UNSUPPORTED naming the bound); 0: no bound.
 * [out] out: the grown communicator, or NULL when nobody was admitted (none waiting, all refused, or the
 * admission abandoned) -- comm stays usable either way.
 * Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed comm, out NULL,
 * max_ranks < 0), TANDEM_ERR_UNSUPPORTED (a communicator without a store), TANDEM_ERR_PEER_FAILURE,
 * TANDEM_ERR_TIMEOUT, TANDEM_ERR_TRANSPORT (comm failed on the way). */
TANDEM_API tandem_status_t tandem_comm_grow(tandem_comm_t* comm, int32_t max_ranks, tandem_comm_t** out) TANDEM_NOEXCEPT;

/* tandem_comm_join: joins the running job that params (or the environment, as for tandem_comm_create)
 * names: master_addr, master_port and secret as its ranks have them (with transport "inproc", size too:
 * the job's size at creation); rank and size only number the joiners. Waits up to wait_ms for admission.
 * [out] out: the grown communicator (this rank follows the old ranks); destroy with tandem_comm_destroy.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed ctx, out NULL, wait_ms
 * <= 0, a field out of range), TANDEM_ERR_AUTH (wrong secret: refused, never admitted),
 * TANDEM_ERR_UNSUPPORTED (refused: the job is at its max_ranks; or an unknown transport),
 * TANDEM_ERR_TIMEOUT (no admission within wait_ms: the job is not elastic, or gone; or the rendezvous is
 * unreachable), TANDEM_ERR_PEER_FAILURE (the running ranks abandoned this admission),
 * TANDEM_ERR_TRANSPORT. */
TANDEM_API tandem_status_t tandem_comm_join(tandem_context_t* ctx, const tandem_comm_params_t* params,
                                            int64_t wait_ms, tandem_comm_t** out) TANDEM_NOEXCEPT;

/* Destroys a communicator. Requests created from it stay valid until destroyed (they keep the
 * underlying connections alive). A live communicator that is not failed should be destroyed by all
 * ranks; destroying it on one rank only makes the others' pending operations fail with
 * TANDEM_ERR_PEER_FAILURE. NULL is a no-op. Threads: per handle. */
TANDEM_API void tandem_comm_destroy(tandem_comm_t* comm) TANDEM_NOEXCEPT;

/* [out] rank: this process's rank in comm. Threads: any. Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed comm, NULL rank). */
TANDEM_API tandem_status_t tandem_comm_rank(const tandem_comm_t* comm, int32_t* rank) TANDEM_NOEXCEPT;
/* [out] size: the number of ranks in comm. Threads: any. Returns as tandem_comm_rank. */
TANDEM_API tandem_status_t tandem_comm_size(const tandem_comm_t* comm, int32_t* size) TANDEM_NOEXCEPT;
/* [out] name: the transport in use ("tcp", "zmq", "ucx", "inproc"); owned by comm, valid until it is
 * destroyed. Threads: any. Returns as tandem_comm_rank. */
TANDEM_API tandem_status_t tandem_comm_transport_name(const tandem_comm_t* comm, const char** name) TANDEM_NOEXCEPT;
/* [out] algo: the allreduce algorithm comm uses for `count` elements of `dtype` (never AUTO).
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_comm_allreduce_algo(const tandem_comm_t* comm, size_t count, tandem_dtype_t dtype,
                                                      tandem_algo_t* algo) TANDEM_NOEXCEPT;
/* Static lowercase name of an algorithm, as logs print it: "auto", "ring", "hd", "tree", "hier",
 * "direct", "det" ("unknown" if invalid). Threads: any. */
TANDEM_API const char* tandem_algo_string(tandem_algo_t algo) TANDEM_NOEXCEPT;

/* The communicator's sticky state: TANDEM_OK while healthy, else the status of its first failure
 * (including failures of background work and aborts received from peers).
 * [out] status: that status.
 * [out] message: may be NULL; receives the failure description, NUL-terminated, truncated to fit.
 * [in,out] message_bytes: may be NULL if message is; in: capacity of message; out: bytes needed
 * including the NUL. Threads: any. Returns TANDEM_OK (the query worked), TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_comm_get_async_status(const tandem_comm_t* comm, tandem_status_t* status,
                                                        char* message, size_t* message_bytes) TANDEM_NOEXCEPT;
/* Who comm's failure is blamed on, as every rank of the job reports it: ranks that detect a fault
 * themselves tell each other and all keep the report with the lowest origin, so a moment after the
 * failing call returned (once the reports have crossed) every rank gives the same origin and ranks.
 * [out] origin: the rank where the failure started -- the one that called tandem_comm_abort, or the one that
 * first detected the fault (a dead or closed peer, a mismatched call, a deadline) and told the others;
 * -1 while comm is healthy. [out] aborted: may be NULL; 1 when the origin aborted (the application gave up)
 * rather than detecting a fault, else 0.
 * [out] ranks: may be NULL; receives up to *num_ranks of the ranks blamed, ascending: a peer that died or
 * closed, the ranks that never took part before a deadline, the sender of a mismatched call (none for an abort,
 * or where nobody can be named). [in,out] num_ranks: may be NULL if ranks is; in: capacity of ranks; out: the
 * number of ranks blamed (may exceed the capacity: call again with more room).
 * Threads: any. Returns TANDEM_OK (the query worked), TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_comm_get_failure(const tandem_comm_t* comm, int32_t* origin, int32_t* aborted,
                                                   int32_t* ranks, size_t* num_ranks) TANDEM_NOEXCEPT;
/* Fails every pending operation on comm and tells the peers (best effort), so that they fail fast
 * with TANDEM_ERR_PEER_FAILURE instead of waiting for their deadline.
 * [in] reason: may be NULL; copied into the failure message. Threads: any.
 * Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_comm_abort(tandem_comm_t* comm, const char* reason) TANDEM_NOEXCEPT;

/* Collectives. Common rules:
 *  - count is elements per rank (see each call); count * tandem_dtype_size(dtype) must fit size_t;
 *    a buffer may be NULL only when its byte size is 0.
 *  - op is a tandem_op_t; TANDEM_AVG divides the sum by the group size (integers truncate).
 *  - Blocking forms return once this rank's part is done (buffers reusable) or the deadline passed.
 *  - Non-blocking forms (tandem_comm_i*) return a request in *req; buffers stay borrowed until the
 *    request completes; requests complete in call order per communicator.
 *  - When an operation returns an error, the library no longer writes its receive buffer, and ucx,
 *    zmq, tcp and inproc no longer read its send buffer (tcp copies what it had left to write of a
 *    message already started; ucx first waits, at most about 2 s per peer, until
 *    each peer took or dropped what was sent to it -- a failed communicator drops what it will not
 *    receive -- or is gone; zmq waits, at most 2 s per peer, until what it had queued was written out
 *    to a live peer or dropped with a dead one); the buffers may be freed. Only towards a peer that
 *    takes no data at all (a stopped process) may a zmq send buffer still be read after that wait (an
 *    error is logged) until the communicator is destroyed. (tandem_comm_send's buffer is always free
 *    at once.)
 *  - Threads: per handle -- calls on one communicator (and tests/waits of its requests) must be
 *    serialized by the caller; different communicators may be used in parallel.
 *  - Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed comm, a NULL buffer, an
 *    overflowing count, unknown dtype/op, root/peer/tag out of range, buffers overlapping where not
 *    allowed), TANDEM_ERR_MISMATCH (ranks called different collectives or arguments),
 *    TANDEM_ERR_TIMEOUT (the deadline passed; names the missing ranks), TANDEM_ERR_PEER_FAILURE
 *    (a peer died or aborted), TANDEM_ERR_TRANSPORT, TANDEM_ERR_UNSUPPORTED (op/dtype pair not
 *    supported). A non-blocking form reports argument errors at the call; the others from
 *    tandem_request_test/wait. */

/* recv[i] = op over ranks of send[i], for count elements. send == recv is in place; otherwise the
 * buffers must not overlap. */
TANDEM_API tandem_status_t tandem_comm_allreduce(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                 tandem_dtype_t dtype, tandem_op_t op) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_iallreduce(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                  tandem_dtype_t dtype, tandem_op_t op,
                                                  tandem_request_t** req) TANDEM_NOEXCEPT;
/* send holds size*count elements; recv (count elements) receives block `rank` of the reduction.
 * In place: recv == send + rank*count elements; otherwise the buffers must not overlap. */
TANDEM_API tandem_status_t tandem_comm_reduce_scatter(tandem_comm_t* comm, const void* send, void* recv,
                                                      size_t count, tandem_dtype_t dtype,
                                                      tandem_op_t op) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_ireduce_scatter(tandem_comm_t* comm, const void* send, void* recv,
                                                       size_t count, tandem_dtype_t dtype, tandem_op_t op,
                                                       tandem_request_t** req) TANDEM_NOEXCEPT;
/* send holds count elements; recv (size*count elements) receives every rank's block in rank
 * order. In place: send == recv + rank*count elements; otherwise the buffers must not overlap. */
TANDEM_API tandem_status_t tandem_comm_allgather(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                 tandem_dtype_t dtype) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_iallgather(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                  tandem_dtype_t dtype, tandem_request_t** req) TANDEM_NOEXCEPT;
/* Copies root's buf (count elements) into every rank's buf. */
TANDEM_API tandem_status_t tandem_comm_broadcast(tandem_comm_t* comm, void* buf, size_t count, tandem_dtype_t dtype,
                                                 int32_t root) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_ibroadcast(tandem_comm_t* comm, void* buf, size_t count, tandem_dtype_t dtype,
                                                  int32_t root, tandem_request_t** req) TANDEM_NOEXCEPT;
/* root's recv[i] = op over ranks of send[i]. recv is used on root only and may be NULL elsewhere;
 * on root send == recv is in place. */
TANDEM_API tandem_status_t tandem_comm_reduce(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                              tandem_dtype_t dtype, tandem_op_t op, int32_t root) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_ireduce(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                               tandem_dtype_t dtype, tandem_op_t op, int32_t root,
                                               tandem_request_t** req) TANDEM_NOEXCEPT;
/* Device memory (issue #14). The collectives above take host memory. The _ex forms take a
 * tandem_coll_params_t that says where the buffers live; with TANDEM_MEMORY_CUDA they are device
 * pointers on cuda:`device`, and the call is stream-ordered as NCCL's are: it runs after the work
 * queued on `stream` before it, and work queued on `stream` after it sees its result.
 * How a communicator moves device memory (its device path) is decided once, on the first device-memory
 * call, by every rank together, so every rank of comm must make that call (the first _ex call with
 * TANDEM_MEMORY_CUDA, or tandem_comm_device_path) at the same point of its sequence of collectives:
 *  - NCCL (TANDEM_DEVICE_PATH_NCCL): libnccl.so.2 is loaded at run time (never linked: one build runs on
 *    CPU-only and GPU nodes alike); an NCCL communicator over comm's ranks is created then, bound to that
 *    first call's device. The call only queues the work on `stream` and returns.
 *  - Staged (TANDEM_DEVICE_PATH_STAGED): where NCCL is not loadable on every rank (or TANDEM_DEVICE_COLLECTIVES
 *    =staged), `stream` is synchronized, the data is copied to host memory, reduced by comm's own transport,
 *    and copied back before the call returns.
 *  - None: a rank has no usable CUDA device (no driver, no device, a library built without CUDA):
 *    every rank's call returns TANDEM_ERR_UNSUPPORTED naming the ranks and this rank's reason; comm stays
 *    usable for host memory. The device path is fixed from then on.
 * The setting TANDEM_DEVICE_COLLECTIVES (auto, nccl, staged) chooses; nccl where NCCL cannot be loaded is
 * TANDEM_ERR_UNSUPPORTED on every rank. Where a peer dies during an NCCL call, NCCL reports it (or not:
 * NCCL has no deadline of its own); the staged path keeps comm's deadlines and failure reports. */
typedef enum tandem_memory_type {
  TANDEM_MEMORY_HOST = 0,
  TANDEM_MEMORY_CUDA = 1,
  TANDEM_MEMORY_FORCE_INT32_ = 0x7fffffff
} tandem_memory_type_t;

typedef enum tandem_device_path {
  TANDEM_DEVICE_PATH_NONE = 0,   /* device memory cannot be used on this communicator (see the message) */
  TANDEM_DEVICE_PATH_NCCL = 1,   /* NCCL, queued on the caller's stream */
  TANDEM_DEVICE_PATH_STAGED = 2, /* copied through host memory, reduced by comm's transport */
  TANDEM_DEVICE_PATH_FORCE_INT32_ = 0x7fffffff
} tandem_device_path_t;

#define TANDEM_COLL_PARAM_MEMORY (UINT64_C(1) << 0) /* covers memory + device */
#define TANDEM_COLL_PARAM_STREAM (UINT64_C(1) << 1)
typedef struct tandem_coll_params {
  uint64_t field_mask;
  tandem_memory_type_t memory; /* default TANDEM_MEMORY_HOST */
  int32_t device;              /* CUDA: the device holding the buffers (cuda:N); default 0 */
  void* stream;                /* CUDA: the cudaStream_t the call is ordered on; default NULL (the
                                  device's default stream) */
} tandem_coll_params_t;
#define TANDEM_COLL_PARAMS_INIT {0}

/* tandem_comm_allreduce / tandem_comm_broadcast on the memory params names (params NULL or HOST: exactly
 * the host forms). Returns as they do, and TANDEM_ERR_UNSUPPORTED (device memory unusable, see above; an
 * unknown field_mask bit), TANDEM_ERR_INVALID_ARGUMENT (an unknown memory type, a device this host lacks,
 * a device other than the one comm's NCCL path is bound to), TANDEM_ERR_BACKEND (a CUDA or NCCL call
 * failed; the message names it). */
TANDEM_API tandem_status_t tandem_comm_allreduce_ex(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                    tandem_dtype_t dtype, tandem_op_t op,
                                                    const tandem_coll_params_t* params) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_broadcast_ex(tandem_comm_t* comm, void* buf, size_t count,
                                                    tandem_dtype_t dtype, int32_t root,
                                                    const tandem_coll_params_t* params) TANDEM_NOEXCEPT;
/* The device path comm uses for the memory params names (HOST: TANDEM_DEVICE_PATH_NONE, nothing decided),
 * deciding it first if it is not yet (collective then: see above).
 * [out] path. [out] message: may be NULL; why the path was chosen (for NONE: why device memory cannot be
 * used), NUL-terminated, truncated to fit; [in,out] message_bytes: as tandem_comm_get_async_status.
 * Threads: per handle. Returns TANDEM_OK (also for NONE: the query worked),
 * TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_UNSUPPORTED (unknown field_mask bit), and the errors of the
 * collectives that agree on the path (TANDEM_ERR_TIMEOUT, TANDEM_ERR_PEER_FAILURE, ...). */
TANDEM_API tandem_status_t tandem_comm_device_path(tandem_comm_t* comm, const tandem_coll_params_t* params,
                                                   tandem_device_path_t* path, char* message,
                                                   size_t* message_bytes) TANDEM_NOEXCEPT;
/* [out] version: the version code of the NCCL this process can load (e.g. 22809 for 2.28.9), without
 * needing a GPU. Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (version NULL),
 * TANDEM_ERR_UNSUPPORTED (a library built without CUDA, or libnccl.so.2 not loadable: the message says
 * why). */
TANDEM_API tandem_status_t tandem_nccl_version(int32_t* version) TANDEM_NOEXCEPT;
/* [out] count: the CUDA devices this process can use (0.3 addition). Threads: any. Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT (count NULL), TANDEM_ERR_UNSUPPORTED (a library built without CUDA, no usable
 * driver, or no device: the message says why; count untouched). */
TANDEM_API tandem_status_t tandem_cuda_device_count(int32_t* count) TANDEM_NOEXCEPT;

/* Returns once every rank has entered the barrier. */
TANDEM_API tandem_status_t tandem_comm_barrier(tandem_comm_t* comm) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_ibarrier(tandem_comm_t* comm, tandem_request_t** req) TANDEM_NOEXCEPT;
/* Point to point: sends count elements to rank `peer`, matched by the peer's recv with the same
 * tag (below TANDEM_TAG_LIMIT) and this rank as its peer; messages between two ranks with one tag
 * arrive in order. A recv whose count differs from the send's fails with TANDEM_ERR_MISMATCH.
 * Sends are buffered, alike on every transport: tandem_comm_send returns (and a tandem_comm_isend
 * request completes) as soon as the library holds a copy of buf -- never waiting for the peer to
 * post its recv, whatever the size -- so buf may be reused at once, and a ring where every rank
 * sends before it receives cannot deadlock. (Unlike MPI_Send, which may wait for the matching
 * receive.) The copy stays with the library until delivered; a send that cannot be delivered (the
 * peer died) fails the communicator, and a later operation reports it. A recv completes when the
 * message has arrived. */
#define TANDEM_TAG_LIMIT (UINT32_C(1) << 24)
TANDEM_API tandem_status_t tandem_comm_send(tandem_comm_t* comm, const void* buf, size_t count, tandem_dtype_t dtype,
                                            int32_t peer, uint32_t tag) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_isend(tandem_comm_t* comm, const void* buf, size_t count,
                                             tandem_dtype_t dtype, int32_t peer, uint32_t tag,
                                             tandem_request_t** req) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_recv(tandem_comm_t* comm, void* buf, size_t count, tandem_dtype_t dtype,
                                            int32_t peer, uint32_t tag) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_irecv(tandem_comm_t* comm, void* buf, size_t count, tandem_dtype_t dtype,
                                             int32_t peer, uint32_t tag, tandem_request_t** req) TANDEM_NOEXCEPT;

/* Checks a non-blocking operation without blocking (drives progress).
 * [out] done: 1 when the operation completed successfully, 0 while it is in flight.
 * Threads: per handle (serialized with its communicator's calls). Returns TANDEM_OK, or the
 * operation's failure status (then *done is untouched and every later test/wait returns it too),
 * TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed request, NULL done). */
TANDEM_API tandem_status_t tandem_request_test(tandem_request_t* req, int* done) TANDEM_NOEXCEPT;
/* Blocks until the operation completes or the communicator's deadline passes.
 * Threads: per handle. Returns TANDEM_OK or the operation's failure status (TANDEM_ERR_TIMEOUT,
 * TANDEM_ERR_MISMATCH, TANDEM_ERR_PEER_FAILURE, ...), TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_request_wait(tandem_request_t* req) TANDEM_NOEXCEPT;
/* Releases a request. If it is still in flight, first waits for it (bounded by the deadline),
 * because its buffers are in use until then; a failure seen there stays visible through
 * tandem_comm_get_async_status. NULL is a no-op. Threads: per handle. */
TANDEM_API void tandem_request_destroy(tandem_request_t* req) TANDEM_NOEXCEPT;

/* ---- Training ----------------------------------------------------------------------------- *
 * Single-process training: a model (a zoo network or a JSON spec) on a compute backend, datasets
 * held in memory, an optimizer configuration and a trainer that runs steps, epochs, evaluation and
 * checkpoints. Handles are independent objects; a trainer retains its model and datasets (they must
 * outlive it) and copies the optimizer configuration. Results and attributes use query structs:
 * set field_mask to the fields wanted; the library fills only those (unknown bits:
 * TANDEM_ERR_UNSUPPORTED). */
typedef struct tandem_model tandem_model_t;
typedef struct tandem_dataset tandem_dataset_t;
typedef struct tandem_optimizer tandem_optimizer_t;
typedef struct tandem_trainer tandem_trainer_t;

#define TANDEM_MODEL_PARAM_NAME        (UINT64_C(1) << 0) /* zoo model name */
#define TANDEM_MODEL_PARAM_SPEC_PATH   (UINT64_C(1) << 1) /* JSON spec file */
#define TANDEM_MODEL_PARAM_SPEC_JSON   (UINT64_C(1) << 2) /* JSON spec text */
#define TANDEM_MODEL_PARAM_INPUT_SHAPE (UINT64_C(1) << 3) /* covers input_channels, input_height, input_width */
#define TANDEM_MODEL_PARAM_NUM_CLASSES (UINT64_C(1) << 4)
#define TANDEM_MODEL_PARAM_WIDTH_MULT  (UINT64_C(1) << 5)
#define TANDEM_MODEL_PARAM_BACKEND     (UINT64_C(1) << 6)
#define TANDEM_MODEL_PARAM_SEED        (UINT64_C(1) << 7)
#define TANDEM_MODEL_PARAM_INIT        (UINT64_C(1) << 8)
typedef struct tandem_model_params {
  uint64_t field_mask;
  const char* name;        /* "mlp", "lenet5", "resnet18", "mobilenetv2", "vgg16", "alexnet" */
  const char* spec_path;   /* a JSON model spec file (instead of name) */
  const char* spec_json;   /* a JSON model spec as text (instead of name) */
  int64_t input_channels;  /* zoo only; default 1x28x28 for mlp and lenet5, else 3x32x32 */
  int64_t input_height;
  int64_t input_width;
  int64_t num_classes;     /* zoo only; default 10 */
  double width_mult;       /* mobilenetv2 and mobilenetv2_imagenet only (another zoo model given one other than 1.0:
                            * TANDEM_ERR_INVALID_ARGUMENT); default 1.0 */
  const char* backend;     /* "cpu" (oneDNN, default), "reference", "cuda" or "cuda:N" (device N),
                              or "none" (spec only: summaries, no parameters, no training) */
  uint64_t seed;           /* weight initialisation; default 0 */
  const char* init;        /* "kaiming" (default), "xavier", "uniform" */
} tandem_model_params_t;
#define TANDEM_MODEL_PARAMS_INIT {0}

/* Creates a model: exactly one of NAME, SPEC_PATH, SPEC_JSON must be set. The backend uses the
 * context's num_threads. [in] ctx: must outlive the model. [in] params: strings are copied.
 * [out] out: the new model. Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (unknown
 * model, a malformed spec -- the message names the field --, a bad shape or class count),
 * TANDEM_ERR_IO (unreadable spec file), TANDEM_ERR_UNSUPPORTED (unknown field_mask bit, a backend
 * not available here), TANDEM_ERR_OUT_OF_MEMORY, TANDEM_ERR_BACKEND. */
TANDEM_API tandem_status_t tandem_model_create(tandem_context_t* ctx, const tandem_model_params_t* params,
                                               tandem_model_t** out) TANDEM_NOEXCEPT;
/* Destroys a model; trainers using it must be destroyed first. NULL is a no-op. Threads: per handle. */
TANDEM_API void tandem_model_destroy(tandem_model_t* model) TANDEM_NOEXCEPT;

#define TANDEM_MODEL_ATTR_NAME        (UINT64_C(1) << 0) /* name, backend */
#define TANDEM_MODEL_ATTR_SHAPE       (UINT64_C(1) << 1) /* input_*, num_classes, num_layers */
#define TANDEM_MODEL_ATTR_COST        (UINT64_C(1) << 2) /* params .. activation_bytes */
#define TANDEM_MODEL_ATTR_HELD        (UINT64_C(1) << 3) /* held_first_layer, held_end_layer, held_params */
typedef struct tandem_model_attr {
  uint64_t field_mask;
  const char* name;           /* owned by the model */
  const char* backend;        /* static */
  int64_t input_channels, input_height, input_width;
  int64_t num_classes;
  size_t num_layers;
  int64_t params;             /* learnable scalars */
  int64_t buffers;            /* non-learnable state (batch-norm running statistics) */
  int64_t macs;               /* multiply-adds per sample, forward */
  double fwd_flops;           /* per sample (a multiply-add is 2 FLOPs) */
  double bwd_flops;           /* per sample, data + weight gradients */
  int64_t activation_bytes;   /* per sample, f32 outputs of every layer */
  /* The layers whose parameters, gradients and state this model holds: [held_first_layer, held_end_layer).
   * Every layer (0, num_layers) unless a pipeline or hybrid trainer made the model hold only its rank's stage.
   * held_params: the parameters of those layers -- the count tandem_model_get_params/_set_params take. */
  size_t held_first_layer, held_end_layer;
  int64_t held_params;
} tandem_model_attr_t;
#define TANDEM_MODEL_ATTR_INIT {0}
/* [in,out] attr: fields flagged in attr->field_mask are filled. Threads: any.
 * Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_UNSUPPORTED (unknown bit). */
TANDEM_API tandem_status_t tandem_model_query(const tandem_model_t* model, tandem_model_attr_t* attr) TANDEM_NOEXCEPT;

#define TANDEM_LAYER_ATTR_NAME  (UINT64_C(1) << 0) /* name, kind, num_inputs, inputs */
#define TANDEM_LAYER_ATTR_SHAPE (UINT64_C(1) << 1) /* out_channels, out_height, out_width */
#define TANDEM_LAYER_ATTR_COST  (UINT64_C(1) << 2) /* params .. activation_bytes */
typedef struct tandem_layer_attr {
  uint64_t field_mask;
  const char* name;           /* owned by the model */
  const char* kind;           /* static: "conv2d", "batchnorm2d", "relu", "linear", "add", ... */
  int32_t num_inputs;         /* 1, 2 for add, 2 or more for concat */
  int32_t inputs[2];          /* the first two producer layer indices; -1 is the model input */
  int64_t out_channels, out_height, out_width;
  int64_t params;
  int64_t macs;
  double fwd_flops;           /* per sample */
  double bwd_flops;           /* per sample */
  int64_t activation_bytes;   /* per sample */
} tandem_layer_attr_t;
#define TANDEM_LAYER_ATTR_INIT {0}
/* [in] index: 0 <= index < num_layers. [in,out] attr: as tandem_model_query. Threads: any.
 * Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (index out of range), TANDEM_ERR_UNSUPPORTED. */
TANDEM_API tandem_status_t tandem_model_layer_query(const tandem_model_t* model, size_t index,
                                                    tandem_layer_attr_t* attr) TANDEM_NOEXCEPT;

/* Copies the model's parameters (f32, layer after layer: weights then biases; batch norm gamma then
 * beta) into dst. [in] count: must equal the parameters the model holds (held_params of
 * tandem_model_query with TANDEM_MODEL_ATTR_HELD: all of them, or only its stage's once a pipeline or
 * hybrid trainer has been created on it). Threads: per handle. Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT (wrong count, NULL dst, a "none"-backend model). */
TANDEM_API tandem_status_t tandem_model_get_params(const tandem_model_t* model, float* dst,
                                                   size_t count) TANDEM_NOEXCEPT;
/* Replaces the model's parameters with src (layout as tandem_model_get_params). Threads: per handle.
 * Returns as tandem_model_get_params. */
TANDEM_API tandem_status_t tandem_model_set_params(tandem_model_t* model, const float* src,
                                                   size_t count) TANDEM_NOEXCEPT;
/* Inference: logits for `batch` samples. [in] input: batch * C*H*W f32 values, NCHW, already
 * normalised. [out] logits: batch * num_classes values. [in] logits_count: its capacity.
 * Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_BACKEND. */
TANDEM_API tandem_status_t tandem_model_forward(tandem_model_t* model, const float* input, int64_t batch,
                                                float* logits, size_t logits_count) TANDEM_NOEXCEPT;

#define TANDEM_DATASET_PARAM_KIND        (UINT64_C(1) << 0)
#define TANDEM_DATASET_PARAM_PATH        (UINT64_C(1) << 1)
#define TANDEM_DATASET_PARAM_LABELS_PATH (UINT64_C(1) << 2)
#define TANDEM_DATASET_PARAM_TRAIN       (UINT64_C(1) << 3)
#define TANDEM_DATASET_PARAM_LIMIT       (UINT64_C(1) << 4)
#define TANDEM_DATASET_PARAM_SHAPE       (UINT64_C(1) << 5) /* covers channels, height, width */
#define TANDEM_DATASET_PARAM_NUM_CLASSES (UINT64_C(1) << 6)
#define TANDEM_DATASET_PARAM_COUNT       (UINT64_C(1) << 7)
#define TANDEM_DATASET_PARAM_SEED        (UINT64_C(1) << 8)
typedef struct tandem_dataset_params {
  uint64_t field_mask;
  const char* kind;         /* "fashion-mnist" (default), "cifar10", "idx", "synthetic" */
  const char* path;         /* fashion-mnist: directory (default: found automatically);
                               cifar10: directory of the binary batches (required);
                               idx: the images file (plain or gzip) */
  const char* labels_path;  /* idx: the labels file */
  int32_t train;            /* non-zero: the training split (default); 0: the test split */
  int64_t limit;            /* > 0: keep only the first `limit` samples */
  int64_t channels, height, width; /* synthetic: sample shape (default 1x28x28) */
  int64_t num_classes;      /* synthetic: default 10 */
  int64_t count;            /* synthetic: samples (default 1024) */
  uint64_t seed;            /* synthetic: default 0 */
} tandem_dataset_params_t;
#define TANDEM_DATASET_PARAMS_INIT {0}
/* Loads (or generates) a dataset into memory. [out] out: the new dataset. Threads: any.
 * Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_IO (missing, truncated or malformed
 * files; the message names the file and the fault), TANDEM_ERR_UNSUPPORTED, TANDEM_ERR_OUT_OF_MEMORY. */
TANDEM_API tandem_status_t tandem_dataset_create(tandem_context_t* ctx, const tandem_dataset_params_t* params,
                                                 tandem_dataset_t** out) TANDEM_NOEXCEPT;
/* NULL is a no-op; trainers using the dataset must be destroyed first. Threads: per handle. */
TANDEM_API void tandem_dataset_destroy(tandem_dataset_t* dataset) TANDEM_NOEXCEPT;
/* [out] size, channels, height, width, num_classes: any may be NULL. Threads: any.
 * Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_dataset_info(const tandem_dataset_t* dataset, int64_t* size, int64_t* channels,
                                               int64_t* height, int64_t* width,
                                               int64_t* num_classes) TANDEM_NOEXCEPT;

typedef enum tandem_optimizer_kind {
  TANDEM_OPTIMIZER_SGD = 0, TANDEM_OPTIMIZER_ADAM = 1, TANDEM_OPTIMIZER_ADAMW = 2,
  TANDEM_OPTIMIZER_FORCE_INT32_ = 0x7fffffff
} tandem_optimizer_kind_t;
#define TANDEM_OPTIMIZER_PARAM_KIND         (UINT64_C(1) << 0)
#define TANDEM_OPTIMIZER_PARAM_LR           (UINT64_C(1) << 1)
#define TANDEM_OPTIMIZER_PARAM_MOMENTUM     (UINT64_C(1) << 2)
#define TANDEM_OPTIMIZER_PARAM_DAMPENING    (UINT64_C(1) << 3)
#define TANDEM_OPTIMIZER_PARAM_NESTEROV     (UINT64_C(1) << 4)
#define TANDEM_OPTIMIZER_PARAM_WEIGHT_DECAY (UINT64_C(1) << 5)
#define TANDEM_OPTIMIZER_PARAM_BETAS        (UINT64_C(1) << 6) /* covers beta1, beta2 */
#define TANDEM_OPTIMIZER_PARAM_EPS          (UINT64_C(1) << 7)
#define TANDEM_OPTIMIZER_PARAM_SCHEDULE     (UINT64_C(1) << 8)
#define TANDEM_OPTIMIZER_PARAM_CLIP_NORM    (UINT64_C(1) << 9)
typedef struct tandem_optimizer_params {
  uint64_t field_mask;
  tandem_optimizer_kind_t kind; /* default SGD */
  float lr;                     /* default 0.01 */
  float momentum;               /* SGD; default 0 */
  float dampening;              /* SGD; default 0 */
  int32_t nesterov;             /* SGD; non-zero: Nesterov momentum */
  float weight_decay;           /* default 0 (AdamW: decoupled) */
  float beta1, beta2;           /* Adam/AdamW; default 0.9, 0.999 */
  float eps;                    /* Adam/AdamW; default 1e-8 */
  const char* schedule;         /* "constant" (default), "step:EPOCHS:GAMMA", "cosine", each optionally
                                   followed by ",warmup:EPOCHS" */
  double clip_norm;             /* > 0: clip gradients to this global L2 norm; default 0 (off) */
} tandem_optimizer_params_t;
#define TANDEM_OPTIMIZER_PARAMS_INIT {0}
/* An optimizer configuration (validated here; trainers copy it). Threads: any. Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT (names the field), TANDEM_ERR_UNSUPPORTED. */
TANDEM_API tandem_status_t tandem_optimizer_create(tandem_context_t* ctx, const tandem_optimizer_params_t* params,
                                                   tandem_optimizer_t** out) TANDEM_NOEXCEPT;
/* NULL is a no-op. Threads: per handle. */
TANDEM_API void tandem_optimizer_destroy(tandem_optimizer_t* optimizer) TANDEM_NOEXCEPT;

/* Progress of an epoch, passed to a tandem_progress_fn after every batch. */
typedef struct tandem_progress {
  int64_t epoch;          /* 1-based */
  int64_t batch;          /* batches done in this epoch */
  int64_t batches;        /* batches in this epoch */
  double loss;            /* running mean training loss */
  double images_per_sec;
  double elapsed_s;
} tandem_progress_t;
/* Called on the thread running tandem_trainer_epoch; must not call back into the trainer. */
typedef void (*tandem_progress_fn)(const tandem_progress_t* progress, void* user_data);

#define TANDEM_TRAINER_PARAM_BATCH_SIZE         (UINT64_C(1) << 0)
#define TANDEM_TRAINER_PARAM_EPOCHS             (UINT64_C(1) << 1)
#define TANDEM_TRAINER_PARAM_SEED               (UINT64_C(1) << 2)
#define TANDEM_TRAINER_PARAM_LIMIT_BATCHES      (UINT64_C(1) << 3)
#define TANDEM_TRAINER_PARAM_EVAL_LIMIT_BATCHES (UINT64_C(1) << 4)
#define TANDEM_TRAINER_PARAM_AUGMENT            (UINT64_C(1) << 5)
#define TANDEM_TRAINER_PARAM_PREFETCH           (UINT64_C(1) << 6)
#define TANDEM_TRAINER_PARAM_PROGRESS           (UINT64_C(1) << 7) /* covers progress + progress_user_data */
#define TANDEM_TRAINER_PARAM_NORMALIZE          (UINT64_C(1) << 8)
#define TANDEM_TRAINER_PARAM_LOSS_SCALE         (UINT64_C(1) << 9)  /* covers loss_scale */
#define TANDEM_TRAINER_PARAM_LOSS_SCALER        (UINT64_C(1) << 10) /* covers loss_scale_init, _growth, _backoff,
                                                                       _growth_interval */
/* tandem_trainer_params_t.loss_scale: dynamic loss scaling. */
#define TANDEM_LOSS_SCALE_DYNAMIC (-1.0)
typedef struct tandem_trainer_params {
  uint64_t field_mask;
  int64_t batch_size;         /* default 64 */
  int64_t epochs;             /* the run's planned length (for cosine schedules); default 1 */
  uint64_t seed;              /* shuffling and augmentation; default 0 */
  int64_t limit_batches;      /* > 0: an epoch ends after this many batches */
  int64_t eval_limit_batches; /* > 0: evaluation stops after this many batches */
  int32_t augment;            /* non-zero: random crop with padding (+ flips for 3 channels) */
  int32_t prefetch;           /* batches the loader thread prepares ahead; default 2 */
  tandem_progress_fn progress;
  void* progress_user_data;
  int32_t normalize;          /* default 1: per-channel normalisation with the data set's statistics */
  /* Loss scaling, for fp16 math (TANDEM_CUDA_MATH=fp16, or its emulation TANDEM_CPU_MATH=fp16): the loss gradient
   * is multiplied by the scale S before backward and the gradients divided by S before clipping and the optimizer
   * (f32 master weights); a step whose gradients hold an inf or NaN on ANY rank is skipped on every rank. */
  double loss_scale;          /* 0: off (default); > 0: a fixed S; TANDEM_LOSS_SCALE_DYNAMIC: dynamic, as
                                 PyTorch's GradScaler: S backs off after a skipped step and grows after
                                 loss_scale_growth_interval finite steps in a row */
  double loss_scale_init;     /* dynamic: the first S, > 0; default 65536 */
  double loss_scale_growth;   /* dynamic: > 1; default 2 */
  double loss_scale_backoff;  /* dynamic: in (0, 1); default 0.5 */
  int64_t loss_scale_growth_interval; /* dynamic: >= 1 step; default 2000 */
} tandem_trainer_params_t;
#define TANDEM_TRAINER_PARAMS_INIT {0}
/* Creates a trainer. [in] model, train: retained until the trainer is destroyed. [in] test: may be
 * NULL (no evaluation after epochs); retained likewise. [in] optimizer: copied.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL handles, a dataset whose
 * samples or classes do not fit the model, a "none"-backend model, bad params),
 * TANDEM_ERR_UNSUPPORTED. */
TANDEM_API tandem_status_t tandem_trainer_create(tandem_model_t* model, const tandem_dataset_t* train,
                                                 const tandem_dataset_t* test, const tandem_optimizer_t* optimizer,
                                                 const tandem_trainer_params_t* params,
                                                 tandem_trainer_t** out) TANDEM_NOEXCEPT;
/* NULL is a no-op. Threads: per handle. */
TANDEM_API void tandem_trainer_destroy(tandem_trainer_t* trainer) TANDEM_NOEXCEPT;

#define TANDEM_STEP_RESULT_LOSS      (UINT64_C(1) << 0) /* loss, correct, samples */
#define TANDEM_STEP_RESULT_LR        (UINT64_C(1) << 1)
#define TANDEM_STEP_RESULT_EPOCH_END (UINT64_C(1) << 2)
typedef struct tandem_step_result {
  uint64_t field_mask;
  double loss;        /* mean over the batch */
  int64_t correct;    /* top-1 hits in the batch */
  int64_t samples;    /* 0 when the epoch had no batch left */
  float lr;           /* the learning rate used */
  int32_t epoch_end;  /* non-zero when this call ended the epoch */
} tandem_step_result_t;
#define TANDEM_STEP_RESULT_INIT {0}
/* Trains on one batch (the next epoch starts when the last one ended). [in,out] result: may be NULL.
 * Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_BACKEND, TANDEM_ERR_TIMEOUT (the loader thread
 * stalled), TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_UNSUPPORTED. */
TANDEM_API tandem_status_t tandem_trainer_step(tandem_trainer_t* trainer,
                                               tandem_step_result_t* result) TANDEM_NOEXCEPT;

#define TANDEM_EPOCH_RESULT_TRAIN (UINT64_C(1) << 0) /* epoch, train_loss, train_accuracy, train_samples */
#define TANDEM_EPOCH_RESULT_TEST  (UINT64_C(1) << 1) /* test_loss, test_accuracy (NaN without a test set) */
#define TANDEM_EPOCH_RESULT_TIME  (UINT64_C(1) << 2) /* images_per_sec, train_s, wall_s */
#define TANDEM_EPOCH_RESULT_REPORT (UINT64_C(1) << 3) /* already_reported */
typedef struct tandem_epoch_result {
  uint64_t field_mask;
  int64_t epoch;            /* 1-based */
  double train_loss;        /* NaN when no sample was scored in the epoch (train_samples 0): e.g. an elastic job
                               whose scoring ranks were all lost; never a false 0 */
  double train_accuracy;    /* in [0, 1]; NaN when no sample was scored */
  int64_t train_samples;    /* samples scored: an elastic job counts the survivors' (a lost rank's are gone) */
  double test_loss;
  double test_accuracy;     /* in [0, 1] */
  double images_per_sec;    /* training only */
  double train_s;
  double wall_s;            /* training + evaluation */
  int32_t already_reported; /* elastic: non-zero when a rank that has since left the job reported this epoch (it was
                               rank 0 when the epoch closed there); the survivors' rank 0 need not report it again.
                               Holds however that rank ended, killed by a signal too: it records the epoch in the
                               job's store before this call returns it there. At most once: a rank killed between
                               that record and its own report leaves the epoch unreported */
} tandem_epoch_result_t;
#define TANDEM_EPOCH_RESULT_INIT {0}
/* Trains the rest of the current epoch (or the next whole one), then evaluates on the test set.
 * [in,out] result: may be NULL. Threads: per handle. Returns as tandem_trainer_step. */
TANDEM_API tandem_status_t tandem_trainer_epoch(tandem_trainer_t* trainer,
                                                tandem_epoch_result_t* result) TANDEM_NOEXCEPT;

/* Evaluates the model on a dataset (no training).
 * [out] loss: mean cross-entropy; [out] accuracy: top-1 in [0, 1]; either may be NULL.
 * [in] limit_batches: > 0 stops after that many batches; 0 uses the whole dataset.
 * Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_BACKEND. */
TANDEM_API tandem_status_t tandem_trainer_evaluate(tandem_trainer_t* trainer, const tandem_dataset_t* dataset,
                                                   int64_t limit_batches, double* loss,
                                                   double* accuracy) TANDEM_NOEXCEPT;
/* Writes a checkpoint (model, optimizer state, schedule position, sampler and RNG state) atomically:
 * a temporary file, fsync, rename. Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_IO,
 * TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_trainer_save_checkpoint(tandem_trainer_t* trainer, const char* path) TANDEM_NOEXCEPT;
/* Restores a checkpoint written by a trainer of the same model and optimizer kind; training then
 * continues exactly as the saving run would have. Threads: per handle. Returns TANDEM_OK,
 * TANDEM_ERR_IO (missing, corrupted -- CRC --, truncated or foreign file), TANDEM_ERR_INVALID_ARGUMENT
 * (another model or optimizer kind); on failure the trainer is unchanged. */
TANDEM_API tandem_status_t tandem_trainer_load_checkpoint(tandem_trainer_t* trainer, const char* path) TANDEM_NOEXCEPT;
/* [out] epochs: completed epochs; [out] steps: optimizer steps taken; either may be NULL.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_trainer_progress(const tandem_trainer_t* trainer, int64_t* epochs,
                                                   int64_t* steps) TANDEM_NOEXCEPT;
/* Loss scaling's state (tandem_trainer_params_t.loss_scale), the same on every rank of a parallel job.
 * [out] scale: the scale the next step uses (1 with loss scaling off); [out] skipped_steps: steps whose
 * gradients were not finite and which the optimizer skipped; either may be NULL. Checkpoints keep both.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_trainer_loss_scale(const tandem_trainer_t* trainer, double* scale,
                                                     int64_t* skipped_steps) TANDEM_NOEXCEPT;

/* ---- Parallel training -------------------------------------------------------------------- *
 * A trainer whose work is spread over the ranks of a communicator: data parallelism (DDP: gradient
 * buckets all-reduced while backward runs), pipeline model parallelism (the model cut into balanced
 * stages; GPipe or 1F1B over micro-batches) or both (hybrid DP x PP: rank r holds stage r % pp of
 * replica r / pp). The math is single-device training on the global batch (batch_size x dp samples
 * per step); batch norm uses each micro-batch's (and each replica's) own statistics, as GPipe and
 * PyTorch DDP do. Every rank of the communicator creates the trainer with the same settings, and
 * every tandem_trainer_* call on it is then collective: all ranks call the same ones in the same
 * order. Epoch, evaluation and checkpoint results are global (the same on every rank); a step
 * result's loss is this rank's view (NaN where the rank does not hold the last stage). While the
 * trainer lives, the communicator must not be used by anything else. */
typedef enum tandem_strategy {
  TANDEM_STRATEGY_SINGLE = 0, TANDEM_STRATEGY_DDP = 1, TANDEM_STRATEGY_PIPELINE = 2, TANDEM_STRATEGY_HYBRID = 3,
  /* Data parallel only (pp = 1). Server ranks are the last `servers` ranks of the world. */
  TANDEM_STRATEGY_PS = 4,        /* parameter server, synchronous (a step waits for every worker) */
  TANDEM_STRATEGY_PS_ASYNC = 5,  /* parameter server, asynchronous (each push applied as it arrives) */
  TANDEM_STRATEGY_SSP = 6,       /* parameter server, bounded staleness (`staleness` clocks) */
  TANDEM_STRATEGY_ASGD = 7,      /* asynchronous SGD without servers */
  TANDEM_STRATEGY_EASGD = 8,     /* elastic averaging SGD (every `tau` steps, moving rate `alpha`) */
  TANDEM_STRATEGY_FEDAVG = 9,    /* federated averaging over (virtual) clients */
  TANDEM_STRATEGY_LOCALSGD = 10, /* local SGD: parameters averaged every `average_every` steps */
  TANDEM_STRATEGY_FORCE_INT32_ = 0x7fffffff
} tandem_strategy_t;
/* The averaging strategies run local optimizer steps on each worker and exchange parameters (and batch-norm
 * buffers): LOCALSGD averages them by all-reduce every `average_every` steps after `warmup_steps` synchronous DDP
 * steps (average_every 1 without warmup is DDP for SGD with momentum); EASGD (synchronous) moves each worker and a
 * centre replicated on every worker by the elastic rule every `tau` steps; ASGD gossips: each step the workers are
 * paired by a seeded matching and average with their partner while computing. FEDAVG runs rounds -- one per
 * tandem_trainer_epoch (and per tandem_trainer_step) -- of sampled clients' local epochs, averaged by sample count;
 * updates that miss `round_deadline_s` are dropped (logged) and the round closes with whoever reported.
 * Evaluation and checkpoints use the strategy's model: EASGD's centre, the workers' mean (LOCALSGD, ASGD), the
 * global model (FEDAVG); checkpoints also keep each worker's own state, so resuming continues exactly. */
/* PS_ASYNC: how one push's step is scaled by its staleness tau, the updates its piece received on the server since
 * the worker was sent the values it computed the gradient from (measured per piece, no extra message). */
typedef enum tandem_staleness_lr {
  TANDEM_STALENESS_LR_NONE = 0,    /* every push one step at the schedule's rate */
  TANDEM_STALENESS_LR_INVERSE = 1, /* the rate / max(tau, 1) (Zhang et al. 2016, staleness-aware async SGD) */
  TANDEM_STALENESS_LR_MOMENTUM = 2, /* SGD momentum mu: the push's momentum max(0, 1 - (1 - mu)(tau + 1)), the rate
                                     * kept (asynchrony's own momentum, Mitliagkas et al. 2016, taken out) */
  TANDEM_STALENESS_LR_FORCE_INT32_ = 0x7fffffff
} tandem_staleness_lr_t;
typedef enum tandem_schedule {
  TANDEM_SCHEDULE_GPIPE = 0, /* all forwards, then all backwards */
  TANDEM_SCHEDULE_1F1B = 1,  /* one forward, one backward: fewer activations in flight */
  TANDEM_SCHEDULE_FORCE_INT32_ = 0x7fffffff
} tandem_schedule_t;
typedef enum tandem_compression {
  TANDEM_COMPRESSION_NONE = 0, TANDEM_COMPRESSION_FP16 = 1, TANDEM_COMPRESSION_BF16 = 2,
  TANDEM_COMPRESSION_FORCE_INT32_ = 0x7fffffff
} tandem_compression_t;
typedef enum tandem_partition {
  TANDEM_PARTITION_FLOPS = 0,    /* balance the layer specs' forward + backward FLOPs */
  TANDEM_PARTITION_MEASURED = 1, /* balance per-layer times measured on rank 0 at creation */
  TANDEM_PARTITION_FORCE_INT32_ = 0x7fffffff
} tandem_partition_t;

#define TANDEM_PARALLEL_PARAM_STRATEGY      (UINT64_C(1) << 0)
#define TANDEM_PARALLEL_PARAM_GRID          (UINT64_C(1) << 1) /* covers dp, pp */
#define TANDEM_PARALLEL_PARAM_MICRO_BATCHES (UINT64_C(1) << 2)
#define TANDEM_PARALLEL_PARAM_SCHEDULE      (UINT64_C(1) << 3)
#define TANDEM_PARALLEL_PARAM_BUCKET_MB     (UINT64_C(1) << 4)
#define TANDEM_PARALLEL_PARAM_COMPRESSION   (UINT64_C(1) << 5)
#define TANDEM_PARALLEL_PARAM_ACCUMULATION  (UINT64_C(1) << 6)
#define TANDEM_PARALLEL_PARAM_PARTITION     (UINT64_C(1) << 7)
#define TANDEM_PARALLEL_PARAM_BOUNDARIES    (UINT64_C(1) << 8) /* covers boundaries, num_boundaries */
#define TANDEM_PARALLEL_PARAM_TRACE         (UINT64_C(1) << 9)
#define TANDEM_PARALLEL_PARAM_SERVERS       (UINT64_C(1) << 10) /* covers servers */
#define TANDEM_PARALLEL_PARAM_STALENESS     (UINT64_C(1) << 11) /* covers staleness */
#define TANDEM_PARALLEL_PARAM_EASGD         (UINT64_C(1) << 12) /* covers tau, alpha, easgd_async */
#define TANDEM_PARALLEL_PARAM_FEDAVG        (UINT64_C(1) << 13) /* covers clients .. round_deadline_s */
#define TANDEM_PARALLEL_PARAM_LOCALSGD      (UINT64_C(1) << 14) /* covers average_every, warmup_steps */
#define TANDEM_PARALLEL_PARAM_ELASTIC       (UINT64_C(1) << 15) /* covers elastic, min_ranks, elastic_checkpoint */
#define TANDEM_PARALLEL_PARAM_GROW          (UINT64_C(1) << 16) /* covers max_ranks, join_poll_steps, joining */
#define TANDEM_PARALLEL_PARAM_SERVER_REPLICAS (UINT64_C(1) << 17) /* covers server_replicas */
#define TANDEM_PARALLEL_PARAM_BUCKETS       (UINT64_C(1) << 18) /* covers first_bucket_mb, bucket_sizes_mb,
                                                                  * num_bucket_sizes (added in 0.5) */
#define TANDEM_PARALLEL_PARAM_STALENESS_LR  (UINT64_C(1) << 19) /* covers staleness_lr */
typedef struct tandem_parallel_params {
  uint64_t field_mask;
  tandem_strategy_t strategy;       /* default SINGLE */
  int32_t dp;                       /* data-parallel replicas; 0 (default): derived from strategy and world */
  int32_t pp;                       /* pipeline stages; 0 (default): derived likewise */
  int32_t micro_batches;            /* per step and replica; default 1; at most the batch size */
  tandem_schedule_t schedule;       /* default 1F1B */
  double bucket_mb;                 /* gradient bucket size in MiB; default 25 */
  tandem_compression_t compression; /* gradients on the wire; default NONE */
  int32_t accumulation;             /* batches per optimizer step (one all-reduce); default 1 */
  tandem_partition_t partition;     /* how stages are balanced; default FLOPS */
  const int32_t* boundaries;        /* explicit cut: pp + 1 layer indices 0 = b0 < b1 < ... = num_layers */
  size_t num_boundaries;
  int32_t trace;                    /* non-zero: record spans for tandem_trainer_write_trace */
  /* The strategies of the parameter-server and averaging families (PS .. LOCALSGD). A field's bit set for a strategy
   * that does not read it (e.g. STALENESS with PS_ASYNC, EASGD with FEDAVG, SERVERS with DDP or synchronous EASGD)
   * fails with TANDEM_ERR_INVALID_ARGUMENT naming the field and its strategies (it used to be ignored). */
  int32_t servers;                  /* PS, PS_ASYNC, SSP, EASGD with easgd_async: server ranks, the last of the
                                     * world; default 1, >= 1 */
  int32_t staleness;                /* SSP: clocks a worker may run ahead of the slowest; default 2, >= 0 (0: sync) */
  int32_t tau;                      /* EASGD: local steps between elastic exchanges; default 4, >= 1 */
  double alpha;                     /* EASGD: moving rate in [0, 1); default 0: 0.9 / workers */
  int32_t easgd_async;              /* EASGD: non-zero: asynchronous variant, the centre on a server; default 0 */
  int32_t clients;                  /* FEDAVG: virtual clients over the workers, at most the training samples;
                                     * default 0: one per worker */
  double dirichlet_alpha;           /* FEDAVG: Dirichlet(alpha) label skew of the clients' data; default 0: IID */
  double client_fraction;           /* FEDAVG: fraction of clients sampled per round, in (0, 1]; default 1 */
  int32_t local_epochs;             /* FEDAVG: epochs a sampled client runs on its data per round; default 1 */
  double round_deadline_s;          /* FEDAVG: a round closes after this long with whoever reported (later
                                     * updates are dropped); default 0: the communicator's timeout */
  int32_t average_every;            /* LOCALSGD: H, steps between parameter averages; default 8, >= 1 */
  int32_t warmup_steps;             /* LOCALSGD: synchronous DDP steps first (post-local SGD); default 0 */
  /* Elastic DDP: when ranks die, the survivors shrink the communicator and go on with fewer
   * replicas -- the per-replica batch kept, the learning rate x survivors / starting replicas, the epoch's global
   * sample order continued; the step in flight is redone from the last consistent parameters. Elastic PS likewise
   * goes on with fewer workers (PS and SSP: the learning rate x workers left / starting workers; PS_ASYNC keeps
   * it); PS_ASYNC, SSP, ASGD, EASGD, FEDAVG and LOCALSGD absorb a lost worker without
   * elastic (min_ranks still applies); a lost parameter server is taken over from a replica (server_replicas) or
   * restored from elastic_checkpoint, else fails the job naming it; PIPELINE and HYBRID refuse
   * elastic (TANDEM_ERR_UNSUPPORTED). Fewer survivors than
   * min_ranks write elastic_checkpoint (atomically) and fail with TANDEM_ERR_PEER_FAILURE naming the lost ranks.
   * Losing rank 0 over tcp, zmq or ucx is survived when the store is served outside the ranks (TANDEM_STORE, as
   * `tandem launch` sets it; the lowest survivor becomes rank 0); with rank 0 serving the store it stops the job
   * (TANDEM_ERR_TIMEOUT). */
  int32_t elastic;                  /* non-zero: elastic; default 0 */
  int32_t min_ranks;                /* elastic: in [1, world]; default 1 */
  const char* elastic_checkpoint;   /* elastic: copied; NULL or "" (default): no checkpoint at the stop */
  /* Growth (elastic ddp, pipeline and hybrid): every join_poll_steps optimizer steps, at the step boundary, rank 0
   * checks the job's store for joiners (tandem_comm_join) and the ranks admit them together (tandem_comm_grow): the
   * joiners get the whole state (parameters, buffers, optimizer state, step and epoch counters, the sampler's
   * global position, RNG) and the grid widens to dp'. The per-replica batch is kept, so the global batch becomes
   * batch x dp'; the learning rate is x dp' / starting replicas -- the rule shrink uses. A pipeline or hybrid grid
   * of pp stages widens by whole rows: for n ranks pp' = min(pp, n) and dp' = floor(n / pp') (pp: the launch depth),
   * so a joiner that completes no row waits (a spare) until one does; each new replica of a stage gets that
   * stage's state from an existing replica. A survivor of a loss that has no place in the re-formed grid waits
   * there as a spare too (its tandem_trainer_step blocks) and is drafted when the grid can widen; when the job ends
   * it is released (its last epoch returns at once; no error). A pipeline that widens runs as hybrid. PS, PS_ASYNC
   * and SSP (elastic) grow by workers: a joiner becomes a worker (the servers stay the last ranks), pulls the
   * servers' current parameters and the data re-shards as above; the servers count it from the next step (SSP: at the
   * current clock); the learning rate is x workers' / starting workers for PS and SSP and kept for PS_ASYNC (one
   * worker's batch per update); a later worker loss applies the same rule to the workers left (a shrink after a
   * grow does not keep the grown factor). PS and SSP: worker 0 alone reads the store for joiners and the decision
   * rides on the push/pull messages (admitted at the step it names); PS_ASYNC: each check is a sync point. These
   * jobs check only when max_ranks > 0. Servers never join; after a server loss a joiner is admitted as a worker
   * and pulls each shard from the server that owns it since the fail-over (every rank checks it holds the same
   * ownership, else TANDEM_ERR_MISMATCH). A joiner creates its trainer with joining non-zero over the communicator tandem_comm_join
   * returned, with the job's settings (the data-parallel width and the stage cut are the job's to choose). */
  int32_t max_ranks;                /* grow: > 0: joiners beyond this many ranks are refused; default 0: no bound */
  int32_t join_poll_steps;          /* grow: steps between checks for joiners, >= 0; default 0 = 1: every step
                                     * (each check: one store round trip on rank 0 and an 8-byte broadcast; PS and
                                     * SSP: the store read alone, the decision carried on the push/pull messages;
                                     * PS_ASYNC: also a sync point) */
  int32_t joining;                  /* grow: non-zero on a joiner; default 0 */
  /* PS, PS_ASYNC, SSP: every server keeps a backup of the shards of the server_replicas servers before it in ring
   * order (values, optimizer state, clock), refreshed after each update it applies; PS and SSP release a pull only
   * once the backups hold that update. A lost server's shard is then taken over by its backup and training goes on
   * with no restart (PS: exactly the uninterrupted run's parameters; PS_ASYNC loses the updates not yet
   * acknowledged, SSP at most the staleness bound's). Without a surviving replica a lost shard is restored from
   * elastic_checkpoint (every rank goes back to it), else the job fails with TANDEM_ERR_PEER_FAILURE naming the
   * server. In [0, servers - 1]; PS needs elastic. Cost: each update sends the piece's values and optimizer state to
   * server_replicas servers, and a PS/SSP pull waits for one server-to-server round trip. */
  int32_t server_replicas;          /* default 0: no replica */
  /* The bucket policy beside bucket_mb (BUCKETS; every data-parallel strategy): gradients are bucketed in
   * gradient-ready order (the stage's last layers first), whole layers per bucket. The first num_bucket_sizes buckets
   * close once they hold at least bucket_sizes_mb[k] MiB (rounded to whole bytes), the ones after at bucket_mb; with
   * no sizes, first_bucket_mb > 0 caps the first bucket alone (PyTorch DDP: 1). Sizes taken from another framework's
   * buckets (PyTorch DDP logs them in bytes: give bytes / 1048576) rebuild those buckets where they end at layer
   * boundaries. first_bucket_mb in [0, 4096] (0: bucket_mb); sizes in (0, 4096], at most 65536 of them; not both.
   * bucket_sizes_mb is copied; NULL with num_bucket_sizes 0: none. */
  double first_bucket_mb;           /* default 0 */
  const double* bucket_sizes_mb;    /* default NULL */
  size_t num_bucket_sizes;          /* default 0 */
  /* PS_ASYNC only (STALENESS_LR set for another strategy: TANDEM_ERR_INVALID_ARGUMENT naming the field): each push's
   * rate (INVERSE) or momentum (MOMENTUM) follows its staleness. Every rank gives the same (else TANDEM_ERR_MISMATCH). Not checkpoint state: a
   * resumed run may change it, as it may the rate. */
  tandem_staleness_lr_t staleness_lr; /* default NONE */
} tandem_parallel_params_t;
#define TANDEM_PARALLEL_PARAMS_INIT {0}

/* Creates a parallel trainer on this rank (collective over comm: every rank calls it with the same
 * settings). Before any communication every rank checks the configuration -- world size not
 * dp x pp, a strategy contradicting dp/pp, more stages than layers, more micro-batches than the
 * batch -- and fails with TANDEM_ERR_INVALID_ARGUMENT naming the problem; then the ranks compare
 * their settings and a rank that differs fails every rank with TANDEM_ERR_MISMATCH naming it and
 * the field. Parameters are broadcast from data-parallel rank 0.
 * [in] model: the whole model on every rank (a stage trains its layer range); retained.
 * [in] train, test: as tandem_trainer_create (every rank loads them). [in] optimizer: copied.
 * [in] params: as tandem_trainer_create; batch_size is per data-parallel replica.
 * [in] parallel: may be NULL (single). [in] comm: the job's communicator, retained until the
 * trainer is destroyed; NULL runs a one-rank job. [out] out: destroy with tandem_trainer_destroy.
 * Threads: any (one call per rank). Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT,
 * TANDEM_ERR_UNSUPPORTED (unknown field_mask bit), TANDEM_ERR_MISMATCH, TANDEM_ERR_TIMEOUT,
 * TANDEM_ERR_PEER_FAILURE, TANDEM_ERR_TRANSPORT. */
TANDEM_API tandem_status_t tandem_trainer_create_parallel(tandem_model_t* model, const tandem_dataset_t* train,
                                                          const tandem_dataset_t* test,
                                                          const tandem_optimizer_t* optimizer,
                                                          const tandem_trainer_params_t* params,
                                                          const tandem_parallel_params_t* parallel,
                                                          tandem_comm_t* comm, tandem_trainer_t** out) TANDEM_NOEXCEPT;

#define TANDEM_PARALLEL_ATTR_GRID  (UINT64_C(1) << 0) /* world, rank, dp, pp, stage, replica */
#define TANDEM_PARALLEL_ATTR_PLAN  (UINT64_C(1) << 1) /* strategy .. partition */
#define TANDEM_PARALLEL_ATTR_SPLIT (UINT64_C(1) << 2) /* steps .. max_bubble_fraction */
#define TANDEM_PARALLEL_ATTR_SYNC  (UINT64_C(1) << 3) /* workers .. warmup_steps */
#define TANDEM_PARALLEL_ATTR_ELASTIC (UINT64_C(1) << 4) /* elastic .. lr_scale */
#define TANDEM_PARALLEL_ATTR_REPLICAS (UINT64_C(1) << 5) /* server_replicas, shards */
#define TANDEM_PARALLEL_ATTR_ASYNC (UINT64_C(1) << 6) /* staleness_lr */
typedef struct tandem_parallel_attr {
  uint64_t field_mask;
  int32_t world, rank, dp, pp;
  int32_t stage;                /* this rank's pipeline stage (rank % pp) */
  int32_t replica;              /* this rank's data-parallel index (rank / pp) */
  const char* strategy;         /* static: "single", "ddp", "pipeline", "hybrid", "ps", "ps-async", "ssp", "asgd",
                                 * "easgd", "fedavg", "localsgd" */
  const char* schedule;         /* static: "gpipe", "1f1b" */
  int32_t micro_batches;
  int32_t accumulation;
  int32_t first_layer, end_layer; /* this rank's layers [first_layer, end_layer) */
  const char* partition;        /* the cut, one line per stage joined by " | "; owned by the trainer */
  /* The last tandem_trainer_epoch's time per step, averaged over the ranks (seconds): */
  int64_t steps;
  double step_s;
  double compute_s;             /* forward, backward, optimizer */
  double bubble_s;              /* waiting for activations / gradients from neighbouring stages */
  double comm_s;                /* exposed communication: waiting for all-reduces and sends */
  double data_s;                /* waiting for the data loader */
  double other_s;
  double allreduce_s;           /* the all-reduces' own time (comm_s is the part not hidden by backward) */
  double bubble_fraction;       /* bubble_s / step_s, mean over ranks */
  double max_bubble_fraction;   /* the most idle rank's */
  /* The strategy's exchange settings as the trainer runs them (tandem_parallel_params_t's, defaults resolved): */
  int32_t workers, servers;     /* data-parallel workers (dp) and server ranks (0 without servers) */
  int32_t staleness, tau;
  double alpha;                 /* EASGD's moving rate (0 given: 0.9 / workers) */
  int32_t easgd_async;
  int32_t clients;              /* FEDAVG's clients (0 given: one per worker) */
  double dirichlet_alpha, client_fraction;
  int32_t local_epochs;
  double round_deadline_s;
  int32_t average_every, warmup_steps;
  /* Elastic DDP: world, rank and dp (TANDEM_PARALLEL_ATTR_GRID) then describe the survivors. */
  int32_t elastic, min_ranks;
  int32_t lost_ranks;           /* ranks lost so far */
  int32_t world_rank;           /* this rank in the world the job started with */
  double lr_scale;              /* the learning-rate factor now applied: survivors / starting replicas */
  /* Parameter servers: replicas per shard now (min(server_replicas, servers - 1); 0 without servers) and the
   * key-range shards the job started with, whatever servers hold them now (0 without servers). */
  int32_t server_replicas, shards;
  /* ps-async: the rule that scales a stale push's step, as the trainer runs it (TANDEM_STALENESS_LR_NONE for every
   * other strategy, which reads no such rule). */
  tandem_staleness_lr_t staleness_lr;
} tandem_parallel_attr_t;
#define TANDEM_PARALLEL_ATTR_INIT {0}
/* [in,out] attr: fields flagged in attr->field_mask are filled. Threads: any (not during a call on
 * the trainer). Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (a NULL handle, or a trainer made by
 * tandem_trainer_create), TANDEM_ERR_UNSUPPORTED (unknown bit). */
TANDEM_API tandem_status_t tandem_trainer_parallel_query(tandem_trainer_t* trainer,
                                                         tandem_parallel_attr_t* attr) TANDEM_NOEXCEPT;
/* Writes one Chrome trace (JSON; opens in Perfetto) with every rank's spans -- forward/backward per
 * micro-batch, sends, receives (bubble), all-reduces per bucket, waits -- on one time line: rank 0
 * gathers them and writes `path` atomically. Collective; needs TANDEM_PARALLEL_PARAM_TRACE.
 * Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (tracing off, bad path),
 * TANDEM_ERR_IO, TANDEM_ERR_TIMEOUT, TANDEM_ERR_PEER_FAILURE. */
TANDEM_API tandem_status_t tandem_trainer_write_trace(tandem_trainer_t* trainer, const char* path) TANDEM_NOEXCEPT;

/* ---- Simulation --------------------------------------------------------------------------- *
 * Predicts a training job on a modelled cluster before anyone rents it: a discrete-event simulator
 * executes the runtime's own collective and pipeline plans over a flow-level network, with compute
 * from a roofline or a calibration profile, AWS CPU credits for t2/t3 instances and a memory check.
 * A cluster is "PRESET:COUNT" (presets: t2.micro, t3.micro, c5.large, c5.xlarge, g4dn.xlarge,
 * p3.2xlarge, p3.16xlarge, p4d.24xlarge, p5.48xlarge; several joined by '+'), a JSON file path, or
 * JSON text (format: simulator/cluster.hpp). Results are handles holding a JSON document; the main
 * figures are also available through a query struct. */
typedef struct tandem_sim_cluster tandem_sim_cluster_t;
typedef struct tandem_sim_result tandem_sim_result_t;

/* Parses a cluster. [in] ctx: must outlive the cluster. [in] spec: copied. [out] out: the cluster.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (unknown preset, malformed JSON --
 * the message names the field and the reason), TANDEM_ERR_IO (unreadable file). */
TANDEM_API tandem_status_t tandem_sim_cluster_create(tandem_context_t* ctx, const char* spec,
                                                     tandem_sim_cluster_t** out) TANDEM_NOEXCEPT;
/* The same kind of node as the cluster's first, `nodes` times (for sweeps). [out] out: a new cluster.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (nodes < 1). */
TANDEM_API tandem_status_t tandem_sim_cluster_resize(const tandem_sim_cluster_t* cluster, int32_t nodes,
                                                     tandem_sim_cluster_t** out) TANDEM_NOEXCEPT;
/* [out] nodes, devices: may be NULL. devices counts ranks the cluster can host (GPUs, or one per
 * CPU node). Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_sim_cluster_info(const tandem_sim_cluster_t* cluster, int32_t* nodes,
                                                   int32_t* devices) TANDEM_NOEXCEPT;
/* NULL is a no-op. Threads: per handle. */
TANDEM_API void tandem_sim_cluster_destroy(tandem_sim_cluster_t* cluster) TANDEM_NOEXCEPT;

/* Burstable CPUs' credit mode (t2/t3): PRESET keeps the preset's own (standard for t2, unlimited for t3). */
typedef enum tandem_credit_mode {
  TANDEM_CREDIT_MODE_PRESET = 0, TANDEM_CREDIT_MODE_STANDARD = 1, TANDEM_CREDIT_MODE_UNLIMITED = 2,
  TANDEM_CREDIT_MODE_FORCE_INT32_ = 0x7fffffff
} tandem_credit_mode_t;

/* Facts about a dataset the simulator knows by name ("cifar10", "cifar100", "fashion-mnist", "mnist",
 * "imagenet"): its training samples, sample shape and classes -- what a model for it is created with.
 * [out] any may be NULL. Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (unknown name,
 * listing the known ones). */
TANDEM_API tandem_status_t tandem_sim_dataset_info(const char* name, int64_t* samples, int64_t* channels,
                                                   int64_t* height, int64_t* width,
                                                   int64_t* num_classes) TANDEM_NOEXCEPT;

/* The job to simulate, typed: the model is a tandem_model_t (a zoo name, a spec file or JSON text is
 * loaded into one by tandem_model_create; the "none" backend holds only the spec), the optimizer a
 * tandem_optimizer_t, everything else the header's enums -- the same description a parallel trainer
 * takes. The simulator compiles it with the trainer's own job compiler (stage cut, pipeline plan,
 * buckets and their all-reduces, memory) and times that compiled job. Changed in 0.2: the string fields
 * (model, strategy, schedule, algorithm, optimizer, credit_mode, partition, compression) and the model
 * shape fields are gone. */
#define TANDEM_SIM_JOB_MODEL           (UINT64_C(1) << 0)
#define TANDEM_SIM_JOB_DATASET         (UINT64_C(1) << 1)
#define TANDEM_SIM_JOB_SAMPLES         (UINT64_C(1) << 2)
#define TANDEM_SIM_JOB_BATCH           (UINT64_C(1) << 3)
#define TANDEM_SIM_JOB_EPOCHS          (UINT64_C(1) << 4)
#define TANDEM_SIM_JOB_STRATEGY        (UINT64_C(1) << 5)
#define TANDEM_SIM_JOB_DP              (UINT64_C(1) << 6)
#define TANDEM_SIM_JOB_PP              (UINT64_C(1) << 7)
#define TANDEM_SIM_JOB_MICRO_BATCHES   (UINT64_C(1) << 8)
#define TANDEM_SIM_JOB_SCHEDULE        (UINT64_C(1) << 9)
#define TANDEM_SIM_JOB_ALGORITHM       (UINT64_C(1) << 10)
#define TANDEM_SIM_JOB_BUCKET_MB       (UINT64_C(1) << 11)
#define TANDEM_SIM_JOB_OVERLAP         (UINT64_C(1) << 12)
#define TANDEM_SIM_JOB_OPTIMIZER       (UINT64_C(1) << 13)
#define TANDEM_SIM_JOB_PROFILE         (UINT64_C(1) << 14) /* covers profile, profile_network */
#define TANDEM_SIM_JOB_EPOCH_TIME      (UINT64_C(1) << 15)
#define TANDEM_SIM_JOB_CREDIT_MODE     (UINT64_C(1) << 16)
#define TANDEM_SIM_JOB_INITIAL_CREDITS (UINT64_C(1) << 17)
#define TANDEM_SIM_JOB_CHUNK_BYTES     (UINT64_C(1) << 18)
#define TANDEM_SIM_JOB_TRACE           (UINT64_C(1) << 19)
#define TANDEM_SIM_JOB_BASELINE        (UINT64_C(1) << 20)
#define TANDEM_SIM_JOB_JSON            (UINT64_C(1) << 21) /* job_json: applied first, other flagged fields override */
#define TANDEM_SIM_JOB_PARTITION       (UINT64_C(1) << 22)
#define TANDEM_SIM_JOB_BOUNDARIES      (UINT64_C(1) << 23) /* covers boundaries, num_boundaries */
#define TANDEM_SIM_JOB_COMPRESSION     (UINT64_C(1) << 24)
#define TANDEM_SIM_JOB_ACCUMULATION    (UINT64_C(1) << 25)
/* added for the strategies of issue #13 (PS, PS_ASYNC, SSP, ASGD, EASGD, FEDAVG, LOCALSGD; pp = 1): the fields
 * of tandem_parallel_params_t with the same names, defaults and rules (tandem_simulate refuses one its strategy does
 * not read, flagged or as a job_json key; a plan search's base job is not checked so); each has its
 * bit */
#define TANDEM_SIM_JOB_SERVERS          (UINT64_C(1) << 26)
#define TANDEM_SIM_JOB_STALENESS        (UINT64_C(1) << 27)
#define TANDEM_SIM_JOB_TAU              (UINT64_C(1) << 28)
#define TANDEM_SIM_JOB_ALPHA            (UINT64_C(1) << 29)
#define TANDEM_SIM_JOB_EASGD_ASYNC      (UINT64_C(1) << 30)
#define TANDEM_SIM_JOB_CLIENTS          (UINT64_C(1) << 31)
#define TANDEM_SIM_JOB_DIRICHLET_ALPHA  (UINT64_C(1) << 32)
#define TANDEM_SIM_JOB_CLIENT_FRACTION  (UINT64_C(1) << 33)
#define TANDEM_SIM_JOB_LOCAL_EPOCHS     (UINT64_C(1) << 34)
#define TANDEM_SIM_JOB_ROUND_DEADLINE   (UINT64_C(1) << 35)
#define TANDEM_SIM_JOB_AVERAGE_EVERY    (UINT64_C(1) << 36)
#define TANDEM_SIM_JOB_WARMUP_STEPS     (UINT64_C(1) << 37)
/* issue #16: memory options and the framework's process (bits 38-49 are this group's) */
#define TANDEM_SIM_JOB_PRECISION        (UINT64_C(1) << 38)
#define TANDEM_SIM_JOB_RECOMPUTE        (UINT64_C(1) << 39) /* covers recompute, recompute_every */
#define TANDEM_SIM_JOB_ZERO             (UINT64_C(1) << 40)
#define TANDEM_SIM_JOB_FRAMEWORK        (UINT64_C(1) << 41)
/* issue #13, continued (bits 50- ) */
#define TANDEM_SIM_JOB_SEED             (UINT64_C(1) << 50)
#define TANDEM_SIM_JOB_LIMIT_BATCHES    (UINT64_C(1) << 51)
#define TANDEM_SIM_JOB_BROADCAST_BUFFERS (UINT64_C(1) << 52)
#define TANDEM_SIM_JOB_BUCKETS          (UINT64_C(1) << 53) /* covers first_bucket_mb, bucket_sizes_mb,
                                                               num_bucket_sizes (added in 0.5) */
#define TANDEM_SIM_JOB_COMM_CYCLE       (UINT64_C(1) << 54) /* covers comm_cycle_ms (added in 0.5) */
#define TANDEM_SIM_JOB_COMM_NEGOTIATION (UINT64_C(1) << 55) /* covers comm_negotiation_ms (added in 0.5) */
#define TANDEM_SIM_JOB_HOST_STAGING     (UINT64_C(1) << 56) /* covers host_staging_gbps (added in 0.5) */
/* Mixed precision: 16-bit working weights, gradients (all-reduced as they are) and activations; f32 master weights
 * counted with the optimizer state. */
typedef enum tandem_precision {
  TANDEM_PRECISION_F32 = 0, TANDEM_PRECISION_BF16 = 1, TANDEM_PRECISION_FP16 = 2,
  TANDEM_PRECISION_FORCE_INT32_ = 0x7fffffff
} tandem_precision_t;
/* Activation recomputation: keep every output (NONE), only each micro-batch's stage input (STAGE_INPUTS), or every
 * k-th layer's output (EVERY_K with recompute_every = k); what is dropped is recomputed during backward (timed). */
typedef enum tandem_recompute {
  TANDEM_RECOMPUTE_NONE = 0, TANDEM_RECOMPUTE_STAGE_INPUTS = 1, TANDEM_RECOMPUTE_EVERY_K = 2,
  TANDEM_RECOMPUTE_FORCE_INT32_ = 0x7fffffff
} tandem_recompute_t;
/* Whose training process: its runtime memory allowance (PyTorch: 340 MiB per CPU process). */
typedef enum tandem_framework {
  TANDEM_FRAMEWORK_TANDEM = 0, TANDEM_FRAMEWORK_PYTORCH_DDP = 1,
  TANDEM_FRAMEWORK_FORCE_INT32_ = 0x7fffffff
} tandem_framework_t;
typedef struct tandem_sim_job_params {
  uint64_t field_mask;
  const tandem_model_t* model;  /* read during the call; default: mobilenetv2 for the dataset's samples */
  const char* dataset;          /* a dataset name (tandem_sim_dataset_info; default "cifar10"), or "" with
                                   samples: the model's input shape and classes are then the data's */
  int64_t samples;              /* training samples per epoch; default: the dataset's */
  int64_t batch;                /* per data-parallel replica; default 64 */
  double epochs;                /* default 1 */
  tandem_strategy_t strategy;   /* default SINGLE */
  int32_t dp;                   /* 0 (default): derived from the strategy and the cluster */
  int32_t pp;
  int32_t micro_batches;        /* default 1 */
  tandem_schedule_t schedule;   /* default 1F1B */
  tandem_algo_t algorithm;      /* the gradient all-reduce; default AUTO (the runtime's rule) */
  double bucket_mb;             /* gradient bucket; default 25 */
  int32_t overlap;              /* all-reduce during backward; default 1 */
  const tandem_optimizer_t* optimizer; /* read during the call; default SGD with momentum */
  const char* profile;          /* calibration profile path (tandem calibrate) instead of the roofline */
  int32_t profile_network;      /* use the profile's measured p2p bandwidth/latency for every NIC */
  double epoch_time_s;          /* > 0: scale compute so one full-speed single-node epoch takes this */
  tandem_credit_mode_t credit_mode; /* burstable nodes; default PRESET */
  double initial_credits;       /* burstable nodes' starting balance; default: launch credits */
  uint64_t chunk_bytes;         /* collective pipelining chunk; 0: the runtime's default */
  int32_t trace;                /* record the first step for tandem_sim_result_write_trace */
  int32_t baseline;             /* also simulate one device for speedup and efficiency; default 1 */
  const char* job_json;         /* a job as JSON TEXT (never a path): keys as `tandem simulate`'s options
                                   ({"model": "lenet5" or a spec object, "model_file": PATH, "batch": 256,
                                   "strategy": "hybrid", ...}); errors name the key */
  tandem_partition_t partition; /* pipeline cut as the trainer makes it; MEASURED balances the profile's (else
                                   the roofline's) per-layer times */
  const int32_t* boundaries;    /* explicit cut: num_boundaries = pp + 1 layer indices, 0 first, layers last */
  size_t num_boundaries;
  tandem_compression_t compression; /* data-parallel gradients on the wire (half the bytes, plus converting each
                                       bucket before and after its all-reduce); default NONE */
  int32_t accumulation;         /* batches per optimizer step; default 1 */
  /* added for issue #13; what is timed is the communication pattern, never the update math (simulator/README.md) */
  int32_t servers;              /* PS, PS_ASYNC, SSP, EASGD with easgd_async: server ranks, the last ones, beside
                                   dp workers; default 1 */
  int32_t staleness;            /* SSP: clocks a worker may run ahead of the slowest; default 2 (0: as PS) */
  int32_t tau;                  /* EASGD: local steps between elastic exchanges; default 4 */
  double alpha;                 /* EASGD moving rate (update math: not timed); default 0 (0.9 / workers) */
  int32_t easgd_async;          /* EASGD: push/pull with the servers without a barrier instead of an all-reduce */
  int32_t clients;              /* FEDAVG: virtual clients (client k on worker k mod workers); 0 (default): one
                                   per worker */
  double dirichlet_alpha;       /* FEDAVG: label skew; the clients' shares are cut as the runtime cuts them (with
                                   seed), and a client's round compute follows its share's size */
  double client_fraction;       /* FEDAVG: clients sampled per round, in (0, 1]; default 1 */
  int32_t local_epochs;         /* FEDAVG: epochs over its share a sampled client runs per round; default 1 */
  double round_deadline_s;      /* FEDAVG: a round closes then with whoever reported; 0 (default): no deadline */
  int32_t average_every;        /* LOCALSGD: H, steps between parameter averages; default 8 */
  int32_t warmup_steps;         /* LOCALSGD: DDP steps first; default 0 */
  /* added for issue #16 */
  tandem_precision_t precision; /* default F32 */
  tandem_recompute_t recompute; /* default NONE */
  int32_t recompute_every;      /* EVERY_K: k >= 1 */
  int32_t zero;                 /* sharding over each stage's data-parallel group: 0 (default) none, 1 optimizer state
                                   (and mixed precision's master weights), 2 gradients too; all-reduce strategies only */
  tandem_framework_t framework; /* default TANDEM */
  /* added for issue #13 (continued) */
  uint64_t seed;                /* the training run's seed (tandem train --seed): FEDAVG's client draw and Dirichlet
                                   shares, ASGD's gossip matching; default 0, as the trainer's */
  int64_t limit_batches;        /* the training run's --limit-batches: > 0 ends an epoch (a FEDAVG client's local
                                   epoch) after that many batches, as the trainer does; 0 (default): whole epochs */
  /* added for issue #16 (continued) */
  int32_t broadcast_buffers;    /* FRAMEWORK PYTORCH_DDP only: 1 as DDP's broadcast_buffers=True (its default; rank 0's
                                   module buffers, e.g. BatchNorm statistics, are broadcast before every forward),
                                   0 as broadcast_buffers=False; other values are refused. Unset: 1 */
  /* The bucket policy beside bucket_mb, as tandem_parallel_params_t's BUCKETS fields (the same rule, the same
   * limits). Unset: FRAMEWORK PYTORCH_DDP caps the first bucket at 1 MiB, TANDEM does not. */
  double first_bucket_mb;
  const double* bucket_sizes_mb;    /* read during the call */
  size_t num_bucket_sizes;
  /* A framework whose background loop starts collectives in cycles (Horovod: HOROVOD_CYCLE_TIME, 5 ms by default):
   * a bucket ready between two ticks waits for the next, and a cycle's all-reduces start together. Milliseconds,
   * >= 0; default 0 (no cycle: each bucket's all-reduce starts when it is ready, as Tandem's and PyTorch DDP's). */
  double comm_cycle_ms;
  /* Each cycle's negotiation before its collectives start (Horovod: rank 0 gathers every rank's ready list and
   * broadcasts the plan): the cycle's all-reduces start this long after its tick; the period still counts from the
   * tick. Milliseconds, >= 0, and > 0 only with comm_cycle_ms > 0; default 0. */
  double comm_negotiation_ms;
  /* A framework that all-reduces device buffers through host memory (Caffe2's Gloo on GPUs): each bucket is copied
   * to the host before its all-reduce and back after it, at this rate in Gbit/s each way. >= 0; default 0 (no
   * staging). */
  double host_staging_gbps;
} tandem_sim_job_params_t;
#define TANDEM_SIM_JOB_PARAMS_INIT {0}

/* Simulates a job on a cluster. [in] job: may be NULL (defaults); read during the call.
 * [out] out: the result. Threads: any (the cluster is only read). Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT (bad job -- the message names the field --, more ranks than devices,
 * a value outside its enum, a model whose input is not the data's), TANDEM_ERR_IO (unreadable profile or
 * model file), TANDEM_ERR_UNSUPPORTED (unknown field_mask bit, an algorithm the collective lacks). */
TANDEM_API tandem_status_t tandem_simulate(const tandem_sim_cluster_t* cluster, const tandem_sim_job_params_t* job,
                                           tandem_sim_result_t** out) TANDEM_NOEXCEPT;
/* Searches DP x PP splits, micro-batches, schedules and all-reduce algorithms for the job on the
 * cluster (the job's strategy, dp, pp, micro_batches, schedule and algorithm are ignored), and on every device
 * PS, PS_ASYNC and SSP with 1, 2, 4, ... servers, LOCALSGD and EASGD with each all-reduce, ASGD and FEDAVG with
 * the job's knobs (staleness, tau, average_every, clients, ...). Candidates compare by time, not time to
 * accuracy: statistical efficiency is not simulated.
 * [in] top: configurations to keep (>= 1). [out] out: a result whose candidates (fastest fitting first)
 * are read with tandem_sim_result_candidate; its summary is the best candidate's. Threads: any.
 * Returns as tandem_simulate. */
TANDEM_API tandem_status_t tandem_sim_plan(const tandem_sim_cluster_t* cluster, const tandem_sim_job_params_t* job,
                                           int32_t top, tandem_sim_result_t** out) TANDEM_NOEXCEPT;

#define TANDEM_SIM_SUMMARY_TIMES    (UINT64_C(1) << 0) /* step_time_s, epoch_time_s, total_time_s, images_per_sec */
#define TANDEM_SIM_SUMMARY_SCALING  (UINT64_C(1) << 1) /* speedup, efficiency, baseline_total_time_s */
#define TANDEM_SIM_SUMMARY_SPLIT    (UINT64_C(1) << 2) /* compute_s, comm_exposed_s, bubble_s, throttled_s, idle_s */
#define TANDEM_SIM_SUMMARY_MEMORY   (UINT64_C(1) << 3) /* memory_per_node_bytes, fits */
#define TANDEM_SIM_SUMMARY_COST     (UINT64_C(1) << 4) /* cost_usd, surplus_usd */
#define TANDEM_SIM_SUMMARY_LAYOUT   (UINT64_C(1) << 5) /* dp, pp, micro_batches, ranks, nodes_used, num_nodes */
#define TANDEM_SIM_SUMMARY_JOB      (UINT64_C(1) << 6) /* strategy .. num_stages */
#define TANDEM_SIM_SUMMARY_NAMES    (UINT64_C(1) << 7) /* cluster, model, dataset, allreduce, compute_source,
                                                          bottleneck, scaling_note */
#define TANDEM_SIM_SUMMARY_SEARCH   (UINT64_C(1) << 8) /* evaluated, fitting, candidates, search_wall_s */
#define TANDEM_SIM_SUMMARY_STRATEGY (UINT64_C(1) << 9) /* workers .. note (issue #13's strategies) */
#define TANDEM_SIM_SUMMARY_MEMORY_DETAIL (UINT64_C(1) << 10) /* memory_node .. memory_advice (issue #16) */
#define TANDEM_SIM_SUMMARY_MEMORY_DATA (UINT64_C(1) << 11) /* memory_data_bytes (0.5; through the _v calls only) */
/* The summary grows at its end, one field_mask bit per group added. The library writes only the fields of the groups
 * field_mask asks for and reads only field_mask, and the _v calls below are told the struct's size as the caller
 * compiled it: a group that lies past that size is refused, so nothing past the caller's struct is read or written. */
typedef struct tandem_sim_summary {
  uint64_t field_mask;      /* the groups wanted; the library fills only those */
  double step_time_s, epoch_time_s, total_time_s, images_per_sec;
  double speedup, efficiency;  /* against one device of the first node's kind; 0 without baseline */
  double compute_s, comm_exposed_s, bubble_s, throttled_s, idle_s;  /* over the run, mean over ranks */
  double memory_per_node_bytes;
  int32_t fits;
  double cost_usd;
  int32_t dp, pp, micro_batches, ranks;
  /* added in 0.2 */
  double baseline_total_time_s;    /* SCALING */
  double surplus_usd;              /* COST: unlimited-mode surplus credits, included in cost_usd */
  int32_t nodes_used, num_nodes;   /* LAYOUT: nodes hosting ranks, nodes in the cluster */
  tandem_strategy_t strategy;      /* JOB */
  tandem_schedule_t schedule;
  tandem_compression_t compression; /* NONE unless data-parallel */
  tandem_algo_t algorithm;         /* the first bucket's all-reduce as resolved (AUTO: no data parallelism) */
  int64_t batch, global_batch, samples, steps_per_epoch;
  double epochs, total_steps;
  int32_t num_stages;              /* pp: tandem_sim_result_stage_cut gives the layers */
  const char* cluster;             /* NAMES: owned by the result */
  const char* model;
  const char* dataset;
  const char* allreduce;           /* the plan's description, or "none" */
  const char* compute_source;      /* "roofline" or "profile" */
  int32_t evaluated, fitting, candidates;  /* SEARCH (tandem_sim_plan results; 0 otherwise) */
  double search_wall_s;
  const char* bottleneck;          /* NAMES: what the run spends the most time on, or memory when it does not fit */
  const char* scaling_note;        /* NAMES: why the speedup is super-linear (credits, memory), or "" */
  /* added for issue #13: STRATEGY */
  int32_t workers, servers;        /* data-parallel workers [0, workers), servers the last ranks */
  int32_t window_steps;            /* steps (FEDAVG: rounds) simulated; the figures are their mean */
  double staleness_wait_s;         /* SSP: over the run, mean over ranks (also part of the split) */
  double busiest_nic_bytes;        /* per step (round), either direction: pushes, pulls, exchanges, uploads;
                                      all-reduces: the mean a rank sends */
  int32_t busiest_nic_rank;        /* -1: none */
  double round_time_s;             /* FEDAVG: mean round (= step_time_s), and per round: */
  double clients_sampled, clients_counted, clients_dropped;  /* dropped: past round_deadline_s */
  const char* exchange;            /* "bucket-allreduce", "push-pull", "param-average", "elastic", "gossip", "round" */
  const char* busiest_nic;         /* "rank 3 (server 0): 1.2 MB in per step (incast of 3 workers)", or "" */
  const char* note;                /* what the figures leave out (statistical efficiency), or "" */
  /* added for issue #16: MEMORY_DETAIL -- the largest rank on the node that fits worst, by kind (they add up to its
     need); when the job does not fit, the smallest change that fits */
  int32_t memory_node, memory_rank;
  double memory_param_bytes, memory_grad_bytes, memory_optimizer_bytes, memory_activation_bytes;
  double memory_runtime_bytes, memory_buffer_bytes;
  const char* memory_advice;       /* "fits with --recompute stage; or with --batch <= 96 as it is", or "" */
  /* added in 0.5: MEMORY_DATA (tandem_sim_result_query_v and _candidate_v only) */
  double memory_data_bytes;        /* the rank's data sets as its loader holds them (training set, test set, FedAvg's
                                      client subsets): the part of memory_runtime_bytes that is data */
} tandem_sim_summary_t;
#define TANDEM_SIM_SUMMARY_INIT {0}

/* Fills the groups of `summary` its field_mask asks for.
 * [in] summary_size: sizeof(tandem_sim_summary_t) as the caller compiled it (pass sizeof(summary)); the library reads
 * and writes nothing at or past it, and refuses a field_mask bit whose group ends past it. A size larger than this
 * header's struct (a newer header) is accepted: the bytes this library does not know stay untouched.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (summary NULL or shorter than its field_mask, a group
 * past summary_size -- the message names the bit and both sizes), TANDEM_ERR_UNSUPPORTED (unknown bit). */
TANDEM_API tandem_status_t tandem_sim_result_query_v(size_t summary_size, const tandem_sim_result_t* result,
                                                     tandem_sim_summary_t* summary) TANDEM_NOEXCEPT;
/* A plan search's candidate `index` (0: the best; < summary.candidates), as tandem_sim_result_query_v fills
 * the result's own summary (SEARCH excepted). Threads: any. Returns as tandem_sim_result_query_v, and
 * TANDEM_ERR_INVALID_ARGUMENT for an index out of range or a result that is not a plan search's. */
TANDEM_API tandem_status_t tandem_sim_result_candidate_v(size_t summary_size, const tandem_sim_result_t* result,
                                                         int32_t index, tandem_sim_summary_t* summary) TANDEM_NOEXCEPT;
/* The 0.4 calls, kept for programs built against 0.4 or older headers: the _v calls with the size of 0.4's struct
 * (up to memory_advice), so MEMORY_DATA is refused here. New code calls the _v forms with sizeof. */
TANDEM_API tandem_status_t tandem_sim_result_query(const tandem_sim_result_t* result,
                                                   tandem_sim_summary_t* summary) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_sim_result_candidate(const tandem_sim_result_t* result, int32_t index,
                                                       tandem_sim_summary_t* summary) TANDEM_NOEXCEPT;

#define TANDEM_SIM_NODE_MEMORY  (UINT64_C(1) << 0) /* name .. swapping */
#define TANDEM_SIM_NODE_CREDITS (UINT64_C(1) << 1) /* cpu_utilization .. surplus_usd */
typedef struct tandem_sim_node {
  uint64_t field_mask;
  const char* name;                /* owned by the result */
  const char* preset;
  int32_t ranks;                   /* ranks of the job on the node (0: unused, not billed) */
  double memory_bytes;             /* need: host memory (CPU node) or the largest per-GPU need */
  double memory_capacity_bytes;    /* usable: host memory less the OS reserve, or GPU memory */
  double runtime_bytes;            /* per rank, included in memory_bytes */
  int32_t fits, swapping;
  double cpu_utilization;          /* of the first phase */
  double credits_start, credits_end;
  int32_t throttled;               /* standard-mode credits ran out ... */
  double throttle_start_s;         /* ... at this time */
  double surplus_usd;
} tandem_sim_node_t;
#define TANDEM_SIM_NODE_INIT {0}
/* Node `index` of the cluster (< summary.num_nodes) as the run used it. Threads: any. Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT (index out of range, a plan result), TANDEM_ERR_UNSUPPORTED. */
TANDEM_API tandem_status_t tandem_sim_result_node(const tandem_sim_result_t* result, int32_t index,
                                                  tandem_sim_node_t* node) TANDEM_NOEXCEPT;
/* The stage cut the job ran with: pp + 1 layer indices. [out] boundaries: may be NULL; receives at most
 * *count entries. [in,out] count: in: capacity; out: entries available. Threads: any. Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_sim_result_stage_cut(const tandem_sim_result_t* result, int32_t* boundaries,
                                                       size_t* count) TANDEM_NOEXCEPT;
/* The whole result as one JSON object (for tandem_simulate: every field of `tandem simulate --json`; for a
 * plan search: the candidates) -- an extra for tools that want JSON; the figures above are the interface.
 * [out] json: may be NULL; receives the text, NUL-terminated, truncated to fit.
 * [in,out] json_bytes: in: capacity of json; out: bytes needed including the NUL.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_sim_result_json(const tandem_sim_result_t* result, char* json,
                                                  size_t* json_bytes) TANDEM_NOEXCEPT;
/* Writes the first simulated step as a Chrome trace (the runtime's trace format) to `path`.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (the job did not ask for a trace),
 * TANDEM_ERR_IO. */
TANDEM_API tandem_status_t tandem_sim_result_write_trace(const tandem_sim_result_t* result,
                                                         const char* path) TANDEM_NOEXCEPT;
/* NULL is a no-op. Threads: per handle. */
TANDEM_API void tandem_sim_result_destroy(tandem_sim_result_t* result) TANDEM_NOEXCEPT;

/* ---- Calibration and prediction ----------------------------------------------------------- *
 * Calibration measures what a model's training step costs on this machine -- per layer forward and
 * backward, the optimizer step -- with the real compute backend, plus (given a communicator of two
 * or more ranks) point-to-point bandwidth and latency between ranks 0 and 1, and writes it as a
 * calibration profile for the simulator (tandem_sim_job_params_t.profile; format:
 * simulator/compute/profile.hpp). Prediction sets a parallel trainer's measured figures beside the
 * simulator's prediction for the same job on a given cluster. */
typedef struct tandem_calibration tandem_calibration_t;

#define TANDEM_CALIBRATE_PARAM_BATCH     (UINT64_C(1) << 0)
#define TANDEM_CALIBRATE_PARAM_WARMUP    (UINT64_C(1) << 1)
#define TANDEM_CALIBRATE_PARAM_ITERS     (UINT64_C(1) << 2)
#define TANDEM_CALIBRATE_PARAM_OPTIMIZER (UINT64_C(1) << 3)
#define TANDEM_CALIBRATE_PARAM_MACHINE   (UINT64_C(1) << 4)
#define TANDEM_CALIBRATE_PARAM_P2P       (UINT64_C(1) << 5) /* covers p2p_bytes, p2p_iters */
#define TANDEM_CALIBRATE_PARAM_SEED      (UINT64_C(1) << 6)
#define TANDEM_CALIBRATE_PARAM_CURVE     (UINT64_C(1) << 7) /* covers curve_batches, num_curve_batches (0.3) */
#define TANDEM_CALIBRATE_PARAM_WAKEUP    (UINT64_C(1) << 8) /* covers wakeup_burst_s, wakeup_ranks_per_core (0.5) */
typedef struct tandem_calibrate_params {
  uint64_t field_mask;
  int64_t batch;                       /* samples per measured pass; default 64 */
  int32_t warmup;                      /* untimed passes first; default 2 */
  int32_t iters;                       /* timed passes (medians per layer); default 10 */
  const tandem_optimizer_t* optimizer; /* the optimizer to time; default SGD with momentum 0.9 */
  const char* machine;                 /* free text for the profile; default: host name, CPU model, threads */
  uint64_t p2p_bytes;                  /* bandwidth exchange size, >= 64; default 4 MiB */
  int32_t p2p_iters;                   /* timed exchanges (pings: 10x as many); default 3 */
  uint64_t seed;                       /* synthetic data; default 0 */
  /* The per-sample cost curve: whole passes (forward, loss, backward) also timed at these batch sizes
   * (each in [1, 2^20], at most 64 of them; `batch` is always a point), so the simulator prices a
   * micro-batch of m samples by what m costs (smaller batches cost more per sample); default none. */
  const int64_t* curve_batches;
  size_t num_curve_batches;
  /* The wake-up latency on shared cores (the profile's wakeup_latency_s; CPU backends): a ring of
   * wakeup_ranks_per_core x (this process's CPUs) rank-like threads, each computing wakeup_burst_s seconds of CPU
   * time between blocking waits for its neighbour's message, against one thread per CPU. wakeup_burst_s in
   * [0, 0.1]; default 0: what an all-reduce peer computes between messages, the reduction of one default pipeline
   * chunk (512 KiB) at the measured reduction bandwidth (~30 us here). wakeup_ranks_per_core in [2, 8]; default 2. */
  double wakeup_burst_s;
  int32_t wakeup_ranks_per_core;
} tandem_calibrate_params_t;
#define TANDEM_CALIBRATE_PARAMS_INIT {0}

/* Measures `model` on its backend (with the context's thread count) with synthetic data: each layer
 * alone, `iters` times after `warmup`, its median kept; then the per-layer medians are scaled so that
 * they add up to the mean of whole training steps (forward, loss, backward, optimizer) timed alongside,
 * which is what a quota-limited host sustains. The model's parameters and statistics are restored.
 * [in] comm: may be NULL, and should be for a process measuring alone: a one-rank communicator's transport
 * (its context, threads and code) would count in the profile's runtime_rss_bytes, the resident size of a
 * process training alone (which has none). With two or more ranks the call is collective: every rank measures its own
 * compute at the same time (as a job would run), the times are averaged over the ranks, then ranks 0
 * and 1 measure their link: latency, half the median round trip of 4-byte pings; bandwidth, from
 * exchanges of p2p_bytes with both ranks sending at once (as collectives load a link); every rank
 * gets the same result.
 * [out] out: destroy with tandem_calibration_destroy.
 * Threads: per model (and per communicator). Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL or
 * "none"-backend model, a bad field -- named), TANDEM_ERR_UNSUPPORTED (unknown field_mask bit),
 * TANDEM_ERR_BACKEND, TANDEM_ERR_TIMEOUT, TANDEM_ERR_PEER_FAILURE, TANDEM_ERR_MISMATCH (ranks
 * calibrating different models). */
TANDEM_API tandem_status_t tandem_calibrate(tandem_model_t* model, const tandem_calibrate_params_t* params,
                                            tandem_comm_t* comm, tandem_calibration_t** out) TANDEM_NOEXCEPT;
/* NULL is a no-op. Threads: per handle. */
TANDEM_API void tandem_calibration_destroy(tandem_calibration_t* calibration) TANDEM_NOEXCEPT;

#define TANDEM_CALIBRATION_ATTR_SHAPE (UINT64_C(1) << 0) /* batch, num_layers, threads, ranks */
#define TANDEM_CALIBRATION_ATTR_TIMES (UINT64_C(1) << 1) /* forward_s .. scale */
#define TANDEM_CALIBRATION_ATTR_P2P   (UINT64_C(1) << 2) /* has_p2p, p2p_bytes_per_s, p2p_latency_s */
#define TANDEM_CALIBRATION_ATTR_CURVE (UINT64_C(1) << 3) /* num_curve_points (0.3) */
typedef struct tandem_calibration_attr {
  uint64_t field_mask;
  int64_t batch;
  size_t num_layers;
  int32_t threads;               /* compute threads of the backend */
  int32_t ranks;                 /* ranks whose compute times were averaged */
  double forward_s, backward_s;  /* sums over layers, for `batch` samples */
  double optimizer_step_s;
  double step_mean_s;            /* whole steps: the mean (of the middle 80% when iters >= 10) the
                                    layers were scaled to */
  double step_median_s;
  double scale;                  /* step_mean_s / (sum of unscaled layer medians + optimizer median) */
  double memory_bytes_per_s;     /* local reduction bandwidth (dst += src, 3 x 4 bytes per element) */
  int32_t has_p2p;               /* non-zero when p2p figures were measured */
  double p2p_bytes_per_s, p2p_latency_s;
  size_t num_curve_points;       /* the cost curve's points (0 without curve_batches) */
} tandem_calibration_attr_t;
#define TANDEM_CALIBRATION_ATTR_INIT {0}
/* [in,out] attr: fields flagged in attr->field_mask are filled. Threads: any. Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_UNSUPPORTED (unknown bit). */
TANDEM_API tandem_status_t tandem_calibration_query(const tandem_calibration_t* calibration,
                                                    tandem_calibration_attr_t* attr) TANDEM_NOEXCEPT;
/* One layer's times. [in] index: < num_layers. [out] name (owned by the calibration), forward_s,
 * backward_s: any may be NULL. Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_calibration_layer(const tandem_calibration_t* calibration, size_t index,
                                                    const char** name, double* forward_s,
                                                    double* backward_s) TANDEM_NOEXCEPT;
/* Point `index` (< num_curve_points, ascending by batch) of the per-sample cost curve: [out] batch, and
 * seconds of one forward + loss + backward pass at that batch (averaged over the ranks); either may be
 * NULL. Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (index out of range). */
TANDEM_API tandem_status_t tandem_calibration_curve(const tandem_calibration_t* calibration, size_t index,
                                                    int64_t* batch, double* seconds) TANDEM_NOEXCEPT;
/* The calibration as profile JSON text. [out] json: may be NULL; receives the text, NUL-terminated,
 * truncated to fit. [in,out] json_bytes: in: capacity; out: bytes needed including the NUL.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_calibration_json(const tandem_calibration_t* calibration, char* json,
                                                   size_t* json_bytes) TANDEM_NOEXCEPT;
/* Writes the profile to `path` atomically (a temporary file in the same directory, fsync, rename):
 * a reader sees the old file or the whole new one. Threads: any. Returns TANDEM_OK,
 * TANDEM_ERR_INVALID_ARGUMENT, TANDEM_ERR_IO (names the path and the reason). */
TANDEM_API tandem_status_t tandem_calibration_write(const tandem_calibration_t* calibration,
                                                    const char* path) TANDEM_NOEXCEPT;

#define TANDEM_PREDICT_PARAM_CLUSTER  (UINT64_C(1) << 0)
#define TANDEM_PREDICT_PARAM_PROFILE  (UINT64_C(1) << 1) /* covers profile, profile_network */
#define TANDEM_PREDICT_PARAM_MEASURED (UINT64_C(1) << 2) /* covers measured_step_s, measured_steps */
typedef struct tandem_predict_params {
  uint64_t field_mask;
  const char* cluster;        /* as tandem_sim_cluster_create; required */
  const char* profile;        /* calibration profile for the compute times; default: the roofline */
  int32_t profile_network;    /* use the profile's p2p figures for every NIC */
  double measured_step_s;     /* a single-process trainer's measured step time (it keeps no split) */
  int64_t measured_steps;
} tandem_predict_params_t;
#define TANDEM_PREDICT_PARAMS_INIT {0}

#define TANDEM_PREDICTION_STEP   (UINT64_C(1) << 0) /* measured_/predicted_/error of step, compute, comm, bubble; steps */
#define TANDEM_PREDICTION_MEMORY (UINT64_C(1) << 1) /* measured_memory_bytes .. predicted_fits */
#define TANDEM_PREDICTION_LAYOUT (UINT64_C(1) << 2) /* rank, world, dp, pp, micro_batches, strategy, compute_source, same_cut */
#define TANDEM_PREDICTION_JOB    (UINT64_C(1) << 3) /* compression .. allreduce_bytes_per_step */
typedef struct tandem_prediction {
  /* Changed in 0.2: field_mask first -- the groups wanted; the library fills only those (unknown bits:
   * TANDEM_ERR_UNSUPPORTED), so the struct can grow at its end.
   * measured: the trainer's last tandem_trainer_epoch (per step, mean over ranks); memory: this
   * process's peak resident size when that call returned (what the caller does after it is not counted),
   * or on a GPU the device memory this process held then, as the driver counts it per process (NVML, the
   * figure nvidia-smi shows; host resident size where the driver does not tell).
   * predicted: the simulator timing the trainer's own compiled job on the
   * cluster; memory: the need of the node hosting this rank. error: (predicted - measured) / measured (NaN
   * if measured is 0). */
  uint64_t field_mask;
  double measured_step_s, predicted_step_s, step_error;
  double measured_compute_s, predicted_compute_s, compute_error;
  double measured_comm_s, predicted_comm_s, comm_error;       /* exposed communication */
  double measured_bubble_s, predicted_bubble_s, bubble_error;
  double measured_memory_bytes, predicted_memory_bytes, memory_error;
  double predicted_memory_capacity_bytes;
  int32_t predicted_fits;
  int32_t rank, world, dp, pp, micro_batches;
  int64_t steps;              /* steps the measured figures average over */
  const char* strategy;       /* static */
  const char* compute_source; /* static: "profile" or "roofline" */
  int32_t same_cut;           /* non-zero: the simulator timed the trainer's own stage cut (always, since 0.2:
                                 it times the trainer's compiled job) */
  tandem_compression_t compression;  /* JOB: gradients on the wire, as the trainer sends them */
  tandem_algo_t algorithm;           /* the first gradient bucket's all-reduce as resolved (AUTO: none) */
  int32_t num_buckets;               /* gradient buckets of this rank's stage (0 without data parallelism) */
  double allreduce_bytes_per_step;   /* bytes a rank sends in its stage's gradient all-reduces per step */
} tandem_prediction_t;
#define TANDEM_PREDICTION_INIT {0}

/* Predicts the job `trainer` runs on `cluster`: the simulator times the trainer's own compiled job
 * (its stage cut, pipeline plan, gradient buckets and their all-reduces with the trainer's algorithm,
 * chunk and compression, its memory figures), and sets the prediction beside the figures the trainer
 * measured in its last epoch. Local (not collective); call it after an epoch.
 * [in] params: cluster required. [in,out] out: the groups its field_mask asks for are filled. [out] json: may
 * be NULL; the whole
 * simulator result as JSON, truncated to fit; [in,out] json_bytes: as tandem_sim_result_json (may be
 * NULL when json is). Threads: per handle. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (no cluster,
 * no epoch trained yet, a single-process trainer without measured figures, a profile of another
 * model), TANDEM_ERR_IO, TANDEM_ERR_UNSUPPORTED. */
TANDEM_API tandem_status_t tandem_trainer_predict(tandem_trainer_t* trainer, const tandem_predict_params_t* params,
                                                  tandem_prediction_t* out, char* json,
                                                  size_t* json_bytes) TANDEM_NOEXCEPT;

/* TANDEM_API_SECTIONS: later sections (communicator, training, simulation) follow. */

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* TANDEM_TANDEM_H */
