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
#define TANDEM_VERSION_MINOR 1
#define TANDEM_VERSION_PATCH 0
#define TANDEM_VERSION (TANDEM_VERSION_MAJOR * 10000 + TANDEM_VERSION_MINOR * 100 + TANDEM_VERSION_PATCH)

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
/* A log sink; called from any library thread, serialized. Must not call back into tandem_. */
typedef void (*tandem_log_fn)(tandem_log_level_t level, const char* message, void* user_data);

/* ---- Context ------------------------------------------------------------------------------ */
typedef struct tandem_context tandem_context_t;

#define TANDEM_CONTEXT_PARAM_NUM_THREADS (UINT64_C(1) << 0)
#define TANDEM_CONTEXT_PARAM_LOG_SINK    (UINT64_C(1) << 1) /* covers log_sink + log_user_data */
#define TANDEM_CONTEXT_PARAM_LOG_LEVEL   (UINT64_C(1) << 2)
typedef struct tandem_context_params {
  uint64_t field_mask;
  int32_t num_threads;          /* compute threads; default: TANDEM_NUM_THREADS or all cores */
  tandem_log_fn log_sink;       /* default: stderr */
  void* log_user_data;
  tandem_log_level_t log_level; /* default: TANDEM_LOG_LEVEL or WARN */
} tandem_context_params_t;
#define TANDEM_CONTEXT_PARAMS_INIT {0}

/* Creates a context, the root of every other handle.
 * [in] header_version: TANDEM_VERSION of the header the caller compiled against.
 * [in] params: may be NULL (all defaults). [out] out: the new context.
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (out NULL), TANDEM_ERR_UNSUPPORTED
 * (header major newer than the library, or an unknown field_mask bit). */
TANDEM_API tandem_status_t tandem_context_create_v(uint32_t header_version, const tandem_context_params_t* params,
                                                   tandem_context_t** out) TANDEM_NOEXCEPT;
static inline tandem_status_t tandem_context_create(const tandem_context_params_t* params, tandem_context_t** out) {
  return tandem_context_create_v(TANDEM_VERSION, params, out);
}
/* Destroys a context; every handle created from it must be destroyed first. NULL is a no-op.
 * Threads: creator only. */
TANDEM_API void tandem_context_destroy(tandem_context_t* ctx) TANDEM_NOEXCEPT;

/* ---- Communicator ------------------------------------------------------------------------- *
 * A communicator is a group of ranks (processes, or threads with the inproc transport) that run
 * collectives together. Every rank of the group must call the same collectives in the same order
 * with matching counts, dtypes, ops and roots; a rank that does not gets TANDEM_ERR_MISMATCH (on
 * every rank), never corrupted data. Every blocking call has a deadline (timeout_ms). When a peer
 * dies, stalls or mismatches, the communicator fails: the failing and every later operation
 * returns an error naming the operation and the rank(s) involved, and the communicator can only
 * be destroyed. Counts are in elements; buffers are host memory borrowed for the call (blocking)
 * or until the request completes (non-blocking). */
typedef struct tandem_comm tandem_comm_t;
typedef struct tandem_request tandem_request_t;

/* Allreduce algorithms (values are stable). AUTO picks by message size and world size. */
typedef enum tandem_algo {
  TANDEM_ALGO_AUTO = 0,
  TANDEM_ALGO_RING = 1,
  TANDEM_ALGO_HALVING_DOUBLING = 2, /* recursive halving-doubling */
  TANDEM_ALGO_TREE = 3,
  TANDEM_ALGO_HIERARCHICAL = 4,     /* reduce within a host, ring across hosts, broadcast within */
  TANDEM_ALGO_DIRECT = 5,
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
  const char* transport;        /* "auto", "zmq", "ucx" or "inproc" */
  int32_t master_port;          /* 1..65535 */
  tandem_algo_t allreduce_algo; /* default AUTO */
  int64_t timeout_ms;           /* deadline of every blocking wait, > 0; default 60000 */
  int32_t deterministic;        /* non-zero: bit-identical reductions run to run */
} tandem_comm_params_t;
#define TANDEM_COMM_PARAMS_INIT {0}

/* Creates this process's communicator over all ranks of the job (collective: every rank calls it).
 * Rank 0 serves the rendezvous; the others connect with the shared secret and exchange transport
 * addresses. Blocks until every rank has joined or timeout_ms passes.
 * [in] ctx: the owning context; must outlive the communicator.
 * [in] params: may be NULL (everything from the environment); strings are copied.
 * [out] out: the new communicator; destroy with tandem_comm_destroy.
 * Threads: any (one call per rank). Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (a NULL or
 * destroyed ctx, out NULL, a field out of range, a malformed environment variable),
 * TANDEM_ERR_UNSUPPORTED (unknown field_mask bit or transport), TANDEM_ERR_TIMEOUT (peers did not
 * join in time), TANDEM_ERR_AUTH (wrong secret), TANDEM_ERR_TRANSPORT. */
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
/* [out] name: the transport in use ("zmq", "ucx", "inproc"); owned by comm, valid until it is
 * destroyed. Threads: any. Returns as tandem_comm_rank. */
TANDEM_API tandem_status_t tandem_comm_transport_name(const tandem_comm_t* comm, const char** name) TANDEM_NOEXCEPT;
/* [out] algo: the allreduce algorithm comm uses for `count` elements of `dtype` (never AUTO).
 * Threads: any. Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_comm_allreduce_algo(const tandem_comm_t* comm, size_t count, tandem_dtype_t dtype,
                                                      tandem_algo_t* algo) TANDEM_NOEXCEPT;
/* Static lowercase name of an algorithm ("ring", "hd", ...; "unknown" if invalid). Threads: any. */
TANDEM_API const char* tandem_algo_string(tandem_algo_t algo) TANDEM_NOEXCEPT;

/* The communicator's sticky state: TANDEM_OK while healthy, else the status of its first failure
 * (including failures of background work and aborts received from peers).
 * [out] status: that status.
 * [out] message: may be NULL; receives the failure description, NUL-terminated, truncated to fit.
 * [in,out] message_bytes: may be NULL if message is; in: capacity of message; out: bytes needed
 * including the NUL. Threads: any. Returns TANDEM_OK (the query worked), TANDEM_ERR_INVALID_ARGUMENT. */
TANDEM_API tandem_status_t tandem_comm_get_async_status(const tandem_comm_t* comm, tandem_status_t* status,
                                                        char* message, size_t* message_bytes) TANDEM_NOEXCEPT;
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
 *  - Threads: per handle -- calls on one communicator (and tests/waits of its requests) must be
 *    serialized by the caller; different communicators may be used in parallel.
 *  - Returns TANDEM_OK, TANDEM_ERR_INVALID_ARGUMENT (NULL/destroyed comm, a NULL buffer, an
 *    overflowing count, unknown dtype/op, root/peer out of range, buffers overlapping where not
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
 * The buffers must not overlap. */
TANDEM_API tandem_status_t tandem_comm_reduce_scatter(tandem_comm_t* comm, const void* send, void* recv,
                                                      size_t count, tandem_dtype_t dtype,
                                                      tandem_op_t op) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_ireduce_scatter(tandem_comm_t* comm, const void* send, void* recv,
                                                       size_t count, tandem_dtype_t dtype, tandem_op_t op,
                                                       tandem_request_t** req) TANDEM_NOEXCEPT;
/* send holds count elements; recv (size*count elements) receives every rank's block in rank
 * order. The buffers must not overlap. */
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
/* Returns once every rank has entered the barrier. */
TANDEM_API tandem_status_t tandem_comm_barrier(tandem_comm_t* comm) TANDEM_NOEXCEPT;
TANDEM_API tandem_status_t tandem_comm_ibarrier(tandem_comm_t* comm, tandem_request_t** req) TANDEM_NOEXCEPT;
/* Point to point: sends count elements to rank `peer`, matched by the peer's recv with the same
 * tag and this rank as its peer; messages between two ranks with one tag arrive in order. A recv
 * whose count differs from the send's fails with TANDEM_ERR_MISMATCH. */
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

/* TANDEM_API_SECTIONS: later sections (communicator, training, simulation) follow. */

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* TANDEM_TANDEM_H */
