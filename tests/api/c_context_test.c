/* C99: a context's settings (TANDEM_* overrides in params, checked when the context is created) and
 * its own log sink and level, which calls through its handles use and no other context sees. */
#include <stdio.h>
#include <string.h>
#include <tandem/tandem.h>

static int g_rank = -1;
#include "../common/c_expect.h"

typedef struct {
  char text[16384];
  int count;
} log_buf_t;

static void collect(tandem_log_level_t level, const char* message, void* user) {
  log_buf_t* b = (log_buf_t*)user;
  size_t used = strlen(b->text);
  (void)level;
  snprintf(b->text + used, sizeof b->text - used, "%s\n", message);
  b->count++;
}

static tandem_context_t* context_with(log_buf_t* buf, const char* const* settings, size_t n) {
  tandem_context_params_t p = TANDEM_CONTEXT_PARAMS_INIT;
  tandem_context_t* ctx = NULL;
  p.field_mask = TANDEM_CONTEXT_PARAM_LOG_SINK | TANDEM_CONTEXT_PARAM_SETTINGS;
  p.log_sink = collect;
  p.log_user_data = buf;
  p.settings = settings;
  p.num_settings = n;
  EXPECT_OK(tandem_context_create(&p, &ctx));
  return ctx;
}

static void comm_once(tandem_context_t* ctx) {
  tandem_comm_t* comm = NULL;
  EXPECT_OK(tandem_comm_create(ctx, NULL, &comm));
  tandem_comm_destroy(comm);
}

static void overrides_are_honoured(void) {
  static log_buf_t buf;
  const char* settings[] = {"TANDEM_LOG_LEVEL=debug", "TANDEM_TIMEOUT_MS=60", "TANDEM_TIMEOUT_MS=4321"};
  tandem_context_t* ctx = context_with(&buf, settings, 3);
  /* TANDEM_LOG_LEVEL=debug took effect: the creation's debug line reached the sink. */
  EXPECT(strstr(buf.text, "tandem_context_create") != NULL);
  comm_once(ctx); /* later entries win: the communicator got 4321 ms, not 60 */
  EXPECT(strstr(buf.text, "timeout 4321 ms") != NULL);
  tandem_context_destroy(ctx);

  /* An empty value unsets: the level falls back to WARN and debug lines are dropped. */
  {
    static log_buf_t quiet;
    const char* unset[] = {"TANDEM_LOG_LEVEL=debug", "TANDEM_LOG_LEVEL="};
    ctx = context_with(&quiet, unset, 2);
    comm_once(ctx);
    EXPECT(quiet.count == 0);
    tandem_context_destroy(ctx);
  }
}

static void bad_settings_are_refused(void) {
  tandem_context_params_t p = TANDEM_CONTEXT_PARAMS_INIT;
  tandem_context_t* ctx = NULL;
  const char* unknown[] = {"TANDEM_LOG_LEVEL=info", "TANDEM_NO_SUCH_SETTING=1"};
  const char* malformed[] = {"TANDEM_TIMEOUT_MS=soon"};
  const char* no_equals[] = {"TANDEM_TIMEOUT_MS"};
  const char* bad_choice[] = {"TANDEM_ZMQ_LOCAL=maybe"};
  p.field_mask = TANDEM_CONTEXT_PARAM_SETTINGS;
  p.settings = unknown;
  p.num_settings = 2;
  EXPECT_FAIL(tandem_context_create(&p, &ctx), TANDEM_ERR_INVALID_ARGUMENT, "TANDEM_NO_SUCH_SETTING");
  EXPECT(ctx == NULL);
  p.settings = malformed;
  p.num_settings = 1;
  EXPECT_FAIL(tandem_context_create(&p, &ctx), TANDEM_ERR_INVALID_ARGUMENT, "TANDEM_TIMEOUT_MS='soon'");
  p.settings = no_equals;
  EXPECT_FAIL(tandem_context_create(&p, &ctx), TANDEM_ERR_INVALID_ARGUMENT, "NAME=VALUE");
  p.settings = bad_choice;
  EXPECT_FAIL(tandem_context_create(&p, &ctx), TANDEM_ERR_INVALID_ARGUMENT, "TANDEM_ZMQ_LOCAL");
  p.settings = NULL;
  EXPECT_FAIL(tandem_context_create(&p, &ctx), TANDEM_ERR_INVALID_ARGUMENT, "settings is NULL");
  EXPECT(ctx == NULL);
  /* num_settings 0 with no array is fine. */
  p.num_settings = 0;
  EXPECT_OK(tandem_context_create(&p, &ctx));
  tandem_context_destroy(ctx);
}

static void two_contexts_keep_their_own_sinks(void) {
  static log_buf_t a, b, quiet;
  const char* sa[] = {"TANDEM_LOG_LEVEL=debug", "TANDEM_TIMEOUT_MS=1111"};
  const char* sb[] = {"TANDEM_LOG_LEVEL=debug", "TANDEM_TIMEOUT_MS=2222"};
  const char* sq[] = {"TANDEM_TIMEOUT_MS=3333"};
  tandem_context_t* ca = context_with(&a, sa, 2);
  tandem_context_t* cb = context_with(&b, sb, 2);
  tandem_context_t* cq = context_with(&quiet, sq, 1); /* WARN: no debug lines */
  comm_once(ca);
  comm_once(cb);
  comm_once(cq);
  comm_once(ca);
  EXPECT(strstr(a.text, "timeout 1111 ms") != NULL);
  EXPECT(strstr(a.text, "timeout 2222 ms") == NULL);
  EXPECT(strstr(b.text, "timeout 2222 ms") != NULL);
  EXPECT(strstr(b.text, "timeout 1111 ms") == NULL);
  EXPECT(strstr(a.text, "3333") == NULL && strstr(b.text, "3333") == NULL);
  EXPECT(quiet.count == 0);
  tandem_context_destroy(cq);
  tandem_context_destroy(cb);
  tandem_context_destroy(ca);
}

int main(void) {
  overrides_are_honoured();
  bad_settings_are_refused();
  two_contexts_keep_their_own_sinks();
  printf("c_context_test: ok\n");
  return 0;
}
