/* Check macros shared by the C99 ABI tests. The including file defines `static int g_rank` (the
 * rank printed with each failure, -1 before it is known). A failed check prints file:line, the
 * expression and the library's last error message, then exits 1. */
#ifndef TANDEM_TESTS_C_EXPECT_H
#define TANDEM_TESTS_C_EXPECT_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tandem/tandem.h>

#define EXPECT(cond)                                                                                       \
  do {                                                                                                     \
    if (!(cond)) {                                                                                         \
      fprintf(stderr, "rank %d: %s:%d: failed: %s (last error: %s)\n", g_rank, __FILE__, __LINE__, #cond,  \
              tandem_last_error_message());                                                                \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)
#define EXPECT_OK(call) EXPECT((call) == TANDEM_OK)
/* A call that must fail with `status` and a message containing `needle`. */
#define EXPECT_FAIL(call, status, needle)                                                                  \
  do {                                                                                                     \
    tandem_status_t s_ = (call);                                                                           \
    if (s_ != (status) || strstr(tandem_last_error_message(), (needle)) == NULL) {                         \
      fprintf(stderr, "rank %d: %s:%d: %s returned %s (\"%s\"), expected %s mentioning \"%s\"\n", g_rank,   \
              __FILE__, __LINE__, #call, tandem_status_string(s_), tandem_last_error_message(),            \
              tandem_status_string(status), (needle));                                                     \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)

#endif
