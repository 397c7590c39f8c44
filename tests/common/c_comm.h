/* The communicator of a C99 ABI test whose ranks are POSIX threads of one process (inproc transport).
 * Include after c_expect.h. */
#ifndef TANDEM_TESTS_C_COMM_H
#define TANDEM_TESTS_C_COMM_H
#include <tandem/tandem.h>

/* Rank `rank` of `size`; `port` and `secret` tell this job apart from other jobs of the process. */
static tandem_comm_t* inproc_comm(tandem_context_t* ctx, int rank, int size, int port, const char* secret,
                                  int64_t timeout_ms) {
  tandem_comm_params_t p = TANDEM_COMM_PARAMS_INIT;
  tandem_comm_t* comm = NULL;
  p.field_mask = TANDEM_COMM_PARAM_RANK | TANDEM_COMM_PARAM_SIZE | TANDEM_COMM_PARAM_TRANSPORT |
                 TANDEM_COMM_PARAM_TIMEOUT_MS | TANDEM_COMM_PARAM_MASTER_PORT | TANDEM_COMM_PARAM_SECRET;
  p.rank = rank;
  p.size = size;
  p.transport = "inproc";
  p.timeout_ms = timeout_ms;
  p.master_port = port;
  p.secret = secret;
  EXPECT_OK(tandem_comm_create(ctx, &p, &comm));
  return comm;
}

#endif
