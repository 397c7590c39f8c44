/* Compiled as C99 with -pedantic -Werror: the public header must be plain C. */
#include <stdio.h>
#include <string.h>
#include <tandem/tandem.h>
#ifdef __cplusplus
#error "compile this file as C"
#endif

#define EXPECT(cond)                                                 \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              tandem_last_error_message());                          \
      return 1;                                                      \
    }                                                                \
  } while (0)

int main(void) {
  tandem_context_params_t p = TANDEM_CONTEXT_PARAMS_INIT;
  tandem_context_t* ctx = NULL;
  EXPECT(tandem_context_create(&p, &ctx) == TANDEM_OK);
  EXPECT(ctx != NULL);
  tandem_context_destroy(ctx);
  tandem_context_destroy(NULL); /* NULL must be a no-op */
  EXPECT(tandem_version() == TANDEM_VERSION);
  EXPECT(strcmp(tandem_version_string(), "0.5.0") == 0);
  EXPECT(tandem_context_create(&p, NULL) == TANDEM_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(tandem_last_error_message(), "out") != NULL);
  p.field_mask = UINT64_C(1) << 40;
  ctx = NULL;
  EXPECT(tandem_context_create(&p, &ctx) == TANDEM_ERR_UNSUPPORTED);
  EXPECT(ctx == NULL); /* untouched on failure */
  EXPECT(tandem_context_create_v((TANDEM_VERSION_MAJOR + 1) * 10000, NULL, &ctx) == TANDEM_ERR_UNSUPPORTED);
  /* A newer minor version's header may declare what this library lacks: refused (it was accepted); a newer patch
   * and an older minor are not. */
  EXPECT(tandem_context_create_v(TANDEM_VERSION + 100, NULL, &ctx) == TANDEM_ERR_UNSUPPORTED);
  EXPECT(ctx == NULL);
  EXPECT(strstr(tandem_last_error_message(), "newer") != NULL);
  EXPECT(tandem_context_create_v(TANDEM_VERSION + 1, NULL, &ctx) == TANDEM_OK);
  tandem_context_destroy(ctx);
  ctx = NULL;
#if TANDEM_VERSION_MINOR > 0
  EXPECT(tandem_context_create_v(TANDEM_VERSION - 100, NULL, &ctx) == TANDEM_OK);
  tandem_context_destroy(ctx);
  ctx = NULL;
#endif
  EXPECT(tandem_dtype_size(TANDEM_BF16) == 2);
  EXPECT(strcmp(tandem_status_string(TANDEM_ERR_TIMEOUT), "timeout") == 0);
  return 0;
}
