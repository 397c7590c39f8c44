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

/* TANDEM_API_SECTIONS: later sections (communicator, training, simulation) follow. */

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* TANDEM_TANDEM_H */
