/* TANDEM_CPU_MAX_ISA through the C ABI (tandem_context_cpu_isa), in a process of its own: the first
 * context's cap reaches oneDNN before any primitive, a model trains under it, a later context without
 * a cap keeps oneDNN where it is, and a stricter later cap is refused naming the setting.
 * TANDEM_CPU_WINOGRAD: a bad value refused naming it; under the AVX2 cap ResNet-18's logits with
 * Tandem's Winograd (auto) agree with the direct kernels' (off), also after tandem_model_set_params
 * replaced weights whose transforms the Winograd model had kept. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/tandem.h"

static int failures = 0;
#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      ++failures;                                            \
    }                                                        \
  } while (0)

static tandem_context_t* context_with2(const char* setting, const char* second) {
  tandem_context_params_t p = TANDEM_CONTEXT_PARAMS_INIT;
  tandem_context_t* ctx = NULL;
  const char* settings[2];
  settings[0] = setting;
  settings[1] = second;
  if (setting != NULL) {
    p.field_mask = TANDEM_CONTEXT_PARAM_SETTINGS;
    p.settings = settings;
    p.num_settings = second != NULL ? 2 : 1;
  }
  if (tandem_context_create(&p, &ctx) != TANDEM_OK) return NULL;
  return ctx;
}

static tandem_context_t* context_with(const char* setting) { return context_with2(setting, NULL); }

/* ResNet-18's logits for 2 fixed 3x32x32 images under ctx (seed 3), into logits[0..19]; then, after
 * tandem_model_set_params scaled every parameter by 0.8, into logits[20..39]. 0 on failure. Each is
 * followed by three more forwards, checked equal to it (the third keeps Tandem's Winograd transforms, the
 * fourth runs from them; set_params then replaces the weights they were made from). */
static int resnet18_logits(tandem_context_t* ctx, float* logits) {
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  tandem_model_attr_t attr;
  tandem_model_t* model = NULL;
  static float input[2 * 3 * 32 * 32];
  float again[20];
  float* params = NULL;
  int i, round, ok = 1;
  tandem_status_t st;
  mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND | TANDEM_MODEL_PARAM_SEED;
  mp.name = "resnet18";
  mp.backend = "cpu";
  mp.seed = 3;
  st = tandem_model_create(ctx, &mp, &model);
  CHECK(st == TANDEM_OK, "resnet18: %s", tandem_last_error_message());
  if (st != TANDEM_OK) return 0;
  for (i = 0; i < 2 * 3 * 32 * 32; ++i) input[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  memset(&attr, 0, sizeof(attr));
  attr.field_mask = TANDEM_MODEL_ATTR_HELD;
  st = tandem_model_query(model, &attr);
  CHECK(st == TANDEM_OK, "resnet18 query: %s", tandem_last_error_message());
  if (st == TANDEM_OK) params = (float*)malloc(sizeof(float) * (size_t)attr.held_params);
  ok = st == TANDEM_OK && params != NULL;
  for (round = 0; ok && round < 2; ++round) {
    if (round == 1) {
      st = tandem_model_get_params(model, params, (size_t)attr.held_params);
      CHECK(st == TANDEM_OK, "get_params: %s", tandem_last_error_message());
      for (i = 0; i < (int)attr.held_params; ++i) params[i] *= 0.8f;
      if (st == TANDEM_OK) st = tandem_model_set_params(model, params, (size_t)attr.held_params);
      CHECK(st == TANDEM_OK, "set_params: %s", tandem_last_error_message());
      ok = st == TANDEM_OK;
      if (!ok) break;
    }
    st = tandem_model_forward(model, input, 2, logits + 20 * round, 20);
    for (i = 0; i < 3 && st == TANDEM_OK; ++i) {
      st = tandem_model_forward(model, input, 2, again, 20);
      CHECK(st != TANDEM_OK || memcmp(again, logits + 20 * round, sizeof(again)) == 0,
            "forward %d gave other logits than the first", i + 2);
    }
    CHECK(st == TANDEM_OK, "resnet18 forward: %s", tandem_last_error_message());
    ok = st == TANDEM_OK;
  }
  free(params);
  tandem_model_destroy(model);
  return ok;
}

int main(void) {
  const char *host = NULL, *cap = NULL, *kernels = NULL, *onednn = NULL;
  tandem_context_t* bad = context_with("TANDEM_CPU_MAX_ISA=avx3");
  CHECK(bad == NULL, "a bad TANDEM_CPU_MAX_ISA was accepted");
  CHECK(strstr(tandem_last_error_message(), "TANDEM_CPU_MAX_ISA") != NULL, "message: %s", tandem_last_error_message());
  CHECK(tandem_context_cpu_isa(NULL, &host, NULL, NULL, NULL) == TANDEM_ERR_INVALID_ARGUMENT, "NULL ctx accepted");
  bad = context_with("TANDEM_CPU_WINOGRAD=yes");
  CHECK(bad == NULL, "a bad TANDEM_CPU_WINOGRAD was accepted");
  CHECK(strstr(tandem_last_error_message(), "TANDEM_CPU_WINOGRAD") != NULL, "message: %s", tandem_last_error_message());

  /* The first context caps at AVX2: nothing of oneDNN has run in this process yet. */
  tandem_context_t* avx2 = context_with("TANDEM_CPU_MAX_ISA=avx2");
  CHECK(avx2 != NULL, "%s", tandem_last_error_message());
  if (avx2 == NULL) return 1;
  tandem_status_t st = tandem_context_cpu_isa(avx2, &host, &cap, &kernels, &onednn);
  CHECK(st == TANDEM_OK, "%s", tandem_last_error_message());
  if (st != TANDEM_OK) return 1;
  printf("host %s, cap %s: kernels %s, oneDNN %s\n", host, cap, kernels, onednn);
  CHECK(strcmp(cap, "avx2") == 0, "cap %s", cap);
  if (strcmp(host, "baseline") == 0) {
    CHECK(strcmp(kernels, "baseline") == 0, "kernels %s on a baseline host", kernels);
  } else {
    CHECK(strcmp(kernels, "avx2") == 0, "kernels %s under an avx2 cap on an %s host", kernels, host);
    CHECK(strcmp(onednn, "avx2") == 0, "oneDNN %s under an avx2 cap on an %s host", onednn, host);
  }
  /* Queries with NULL outs are fine. */
  CHECK(tandem_context_cpu_isa(avx2, NULL, NULL, NULL, NULL) == TANDEM_OK, "%s", tandem_last_error_message());

  /* A CPU model runs under the cap (oneDNN's AVX2 kernels, Tandem's avx2 max-pool variant). */
  {
    tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
    tandem_model_t* model = NULL;
    static float input[2 * 28 * 28];
    float logits[2 * 10];
    int i, finite = 1;
    mp.field_mask = TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_BACKEND;
    mp.name = "lenet5";
    mp.backend = "cpu";
    st = tandem_model_create(avx2, &mp, &model);
    CHECK(st == TANDEM_OK, "lenet5 under the avx2 cap: %s", tandem_last_error_message());
    for (i = 0; i < 2 * 28 * 28; ++i) input[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    if (st == TANDEM_OK) {
      st = tandem_model_forward(model, input, 2, logits, 20);
      CHECK(st == TANDEM_OK, "forward under the avx2 cap: %s", tandem_last_error_message());
      for (i = 0; i < 20; ++i) finite = finite && logits[i] == logits[i] && logits[i] < 1e30f && logits[i] > -1e30f;
      CHECK(st != TANDEM_OK || finite, "non-finite logits under the avx2 cap");
    }
    tandem_model_destroy(model);
  }

  /* Tandem's Winograd (auto picks it under the AVX2 cap) against the direct kernels. */
  {
    tandem_context_t* off = context_with2("TANDEM_CPU_MAX_ISA=avx2", "TANDEM_CPU_WINOGRAD=off");
    tandem_context_t* on = context_with2("TANDEM_CPU_MAX_ISA=avx2", "TANDEM_CPU_WINOGRAD=auto");
    float direct[40], wino[40];
    CHECK(off != NULL && on != NULL, "%s", tandem_last_error_message());
    if (off != NULL && on != NULL && resnet18_logits(off, direct) && resnet18_logits(on, wino)) {
      int i, round;
      for (round = 0; round < 2; ++round) {
        float worst = 0.0f, scale = 0.0f, moved = 0.0f;
        for (i = 20 * round; i < 20 * round + 20; ++i) {
          const float d = direct[i] > wino[i] ? direct[i] - wino[i] : wino[i] - direct[i];
          const float a = direct[i] > 0 ? direct[i] : -direct[i];
          const float m = direct[i] > direct[i % 20] ? direct[i] - direct[i % 20] : direct[i % 20] - direct[i];
          worst = d > worst ? d : worst;
          scale = a > scale ? a : scale;
          moved = m > moved ? m : moved;
        }
        printf("resnet18 logits%s, winograd against direct: max difference %g of %g\n",
               round == 0 ? "" : " after set_params", worst, scale);
        CHECK(scale > 0.0f && worst <= 1e-4f * scale, "round %d: max difference %g of %g", round, worst, scale);
        /* set_params moved the logits far more than the tolerance: stale transforms would fail above. */
        CHECK(round == 0 || moved > 1e-2f * scale, "set_params moved the logits by %g of %g only", moved, scale);
      }
    }
    tandem_context_destroy(off);
    tandem_context_destroy(on);
  }

  /* A later context without a cap: oneDNN stays at its process-wide ISA, kernels run the host's best. */
  tandem_context_t* all = context_with(NULL);
  CHECK(all != NULL, "%s", tandem_last_error_message());
  if (all != NULL) {
    const char* onednn2 = NULL;
    CHECK(tandem_context_cpu_isa(all, NULL, &cap, &kernels, &onednn2) == TANDEM_OK, "%s", tandem_last_error_message());
    CHECK(strcmp(cap, "all") == 0, "cap %s", cap);
    CHECK(strcmp(kernels, host) == 0, "kernels %s without a cap on an %s host", kernels, host);
    CHECK(strcmp(onednn2, onednn) == 0, "oneDNN moved from %s to %s", onednn, onednn2);
    tandem_context_destroy(all);
  }

  /* A stricter cap after oneDNN has fixed its ISA cannot take effect: refused, naming the setting. */
  tandem_context_t* sse = context_with("TANDEM_CPU_MAX_ISA=sse41");
  CHECK(sse != NULL, "%s", tandem_last_error_message());
  if (sse != NULL) {
    if (strcmp(onednn, "sse41") != 0) {
      st = tandem_context_cpu_isa(sse, NULL, NULL, &kernels, NULL);
      CHECK(st == TANDEM_ERR_UNSUPPORTED, "status %d", (int)st);
      CHECK(strstr(tandem_last_error_message(), "TANDEM_CPU_MAX_ISA=sse41") != NULL, "message: %s",
            tandem_last_error_message());
    }
    tandem_context_destroy(sse);
  }
  tandem_context_destroy(avx2);
  if (failures == 0) printf("c_cpu_isa_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
