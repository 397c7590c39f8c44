// oneDNN CPU backend: construction, layouts and reorders, elementwise ops, loss, dropout and the
// fused optimizer updates (OpenMP loops; oneDNN itself runs on the same OpenMP threads).
#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/compute/cpu/cpu_kernels.hpp"
#include "engine/compute/cpu/cpu_plans.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "engine/compute/cpu/dnnl_exec.hpp"
#include "engine/compute/dropout_mask.hpp"
#include "engine/compute/validate.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"

namespace tandem::engine::compute {

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

namespace cpu {

// Below this many elements a loop runs on one thread (fork/join costs more than it saves).
constexpr int64_t kParallelMin = 1 << 15;

std::string DnnlLayout::describe() const {
  const auto& d = md_.data;
  std::string s = "dnnl:";
  if (d.format_kind != dnnl_blocked) return s + "non-blocked";
  const auto& b = d.format_desc.blocking;
  s += "strides(";
  for (int i = 0; i < d.ndims; ++i) s += fmt::format("{}{}", i ? "," : "", b.strides[i]);
  s += ")";
  for (int i = 0; i < b.inner_nblks; ++i) s += fmt::format("{}{}", b.inner_blks[i], static_cast<char>('a' + b.inner_idxs[i]));
  return s;
}

bool DnnlLayout::same_as(const Layout& other) const {
  const auto* o = dynamic_cast<const DnnlLayout*>(&other);
  return o != nullptr && o->md_ == md_;
}

std::string md_key(const memory::desc& md) {
  const auto& d = md.data;
  std::string s = fmt::format("{}:{}:", static_cast<int>(d.data_type), static_cast<int>(d.format_kind));
  for (int i = 0; i < d.ndims; ++i) s += fmt::format("{}/{},", d.dims[i], d.padded_dims[i]);
  if (d.format_kind == dnnl_blocked) {
    const auto& b = d.format_desc.blocking;
    for (int i = 0; i < d.ndims; ++i) s += fmt::format("s{}", b.strides[i]);
    for (int i = 0; i < b.inner_nblks; ++i) s += fmt::format("b{}@{}", b.inner_blks[i], b.inner_idxs[i]);
  }
  s += fmt::format("o{}x{}", d.offset0, static_cast<int>(d.extra.flags));
  return s;
}

memory::desc plain_md(const Shape& s, memory::data_type dt) {
  memory::dims dims(s.dims().begin(), s.dims().end());
  if (dims.empty()) dims.push_back(1);
  memory::dims strides(dims.size());
  int64_t st = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = st;
    st *= std::max<int64_t>(dims[i], 1);
  }
  return memory::desc(dims, dt, strides);
}

memory::desc channel_blocked_md(const Shape& s, int64_t lanes, memory::data_type dt) {
  const memory::dims d{s[0], s[1], s[2], s[3]};
  using tag = memory::format_tag;
  return memory::desc(d, dt, lanes == 1 ? tag::nchw : lanes == 8 ? tag::aBcd8b : tag::aBcd16b);
}

int64_t channel_block_lanes(const memory::desc& md, const Shape& s, memory::data_type dt) {
  if (s.rank() != 4) return 0;
  for (int64_t lanes : {1, 8, 16})
    if (md == channel_blocked_md(s, lanes, dt)) return lanes;
  return 0;
}

namespace {

dnnl_cpu_isa_t onednn_isa_for(CpuIsa cap) {
  switch (cap) {
    case CpuIsa::kAvx512: return dnnl_cpu_isa_avx512_core_amx;  // every AVX-512 level oneDNN 2.6 has
    case CpuIsa::kAvx2: return dnnl_cpu_isa_avx2;
    case CpuIsa::kBaseline: break;
  }
  return dnnl_cpu_isa_sse41;
}

// dnnl_cpu_isa_t values are bit masks: each ISA's includes those of every ISA it implies. avx2_vnni (AVX2 with
// VNNI, no AVX-512) is below an AVX-512 cap though its bit is not in avx512_core_amx's mask.
bool onednn_within(dnnl_cpu_isa_t isa, dnnl_cpu_isa_t cap) {
  unsigned allowed = static_cast<unsigned>(cap);
  if (cap == dnnl_cpu_isa_avx512_core_amx) allowed |= static_cast<unsigned>(dnnl_cpu_isa_avx2_vnni);
  return (static_cast<unsigned>(isa) & ~allowed) == 0;
}

const char* onednn_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_all: return "all";
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: break;
  }
  return "unknown";
}

std::mutex g_isa_mu;

}  // namespace

CpuIsa apply_cpu_isa_cap() {
  const std::optional<CpuIsa> cap = cpu_isa_cap(*settings::current());
  if (cap) {
    const std::lock_guard lock(g_isa_mu);
    const dnnl_cpu_isa_t want = onednn_isa_for(*cap);
    // Fails (harmlessly) once oneDNN has fixed its ISA; what matters is whether that ISA is within the cap.
    const dnnl_status_t set = dnnl_set_max_cpu_isa(want);
    const dnnl_cpu_isa_t now = dnnl_get_effective_cpu_isa();
    TANDEM_CHECK(onednn_within(now, want), Status::kUnsupported,
                 "TANDEM_CPU_MAX_ISA={} cannot take effect: oneDNN already runs {} in this process (its ISA is "
                 "fixed at the process's first oneDNN primitive; set the cap in the environment or on the first "
                 "context that creates a CPU model)",
                 cpu_isa_cap_name(cap), onednn_name(now));
    if (set != dnnl_success)
      log::debug("TANDEM_CPU_MAX_ISA={}: oneDNN's ISA was already fixed at {}, within the cap", cpu_isa_cap_name(cap),
                 onednn_name(now));
  }
  return variant_cpu_isa(effective_cpu_isa(cap));
}

const char* onednn_isa_name() {
  const std::lock_guard lock(g_isa_mu);
  return onednn_name(dnnl_get_effective_cpu_isa());
}

CpuBackend::CpuBackend(const BackendOptions& options)
    : threads_(options.num_threads > 0 ? options.num_threads : omp_get_max_threads()),
      isa_(apply_cpu_isa_cap()),
      winograd_mode_(settings::current()->text("TANDEM_CPU_WINOGRAD").value_or("auto")),
      engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_) {
  if (options.num_threads > 0) omp_set_num_threads(options.num_threads);
  // Refuses a bad value now, naming the setting, rather than at the first convolution.
  (void)conv_algo(winograd_mode_, isa_, Shape{1, 1, 1, 1}, Shape{1, 1, 3, 3}, ConvParams{});
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::set_num_threads(int n) {
  TANDEM_REQUIRE(n >= 1, "set_num_threads: {} must be >= 1", n);
  threads_ = n;
  omp_set_num_threads(n);
}

Tensor CpuBackend::empty(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype); }
Tensor CpuBackend::zeros(const Shape& shape, DType dtype) { return Tensor::zeros(shape, dtype); }

memory::desc CpuBackend::md_of(const Tensor& t) const {
  if (t.is_plain()) return plain_md(t.shape());
  const auto* l = dynamic_cast<const DnnlLayout*>(t.layout());
  TANDEM_REQUIRE(l != nullptr, "cpu backend: tensor {} is in a layout of another backend", t.str());
  return l->md();
}

Tensor CpuBackend::alloc(const memory::desc& md, const Shape& shape, DType dtype) {
  if (md == plain_md(shape)) return Tensor::empty(shape, dtype);
  return Tensor::with_layout(shape, dtype, Device::cpu(), std::make_shared<DnnlLayout>(md));
}

void CpuBackend::reorder(const Tensor& src, const memory::desc& src_md, const Tensor& dst, const memory::desc& dst_md) {
  const std::string key = md_key(src_md) + "|" + md_key(dst_md);
  auto it = reorders_.find(key);
  if (it == reorders_.end()) {
    auto r = dnnl_try("reorder", [&] {
      return std::make_unique<dnnl::reorder>(dnnl::reorder::primitive_desc(engine_, src_md, engine_, dst_md));
    });
    it = reorders_.emplace(key, std::move(r)).first;
  }
  run(*it->second, {{DNNL_ARG_FROM, mem(src, src_md)}, {DNNL_ARG_TO, mem(dst, dst_md)}}, "reorder");
}

void CpuBackend::run(const dnnl::primitive& p, const std::unordered_map<int, memory>& args, const char* what) {
  if (omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
  exec(p, stream_, args, what);
}

Tensor CpuBackend::as_layout(const Tensor& t, const memory::desc& md) {
  const memory::desc cur = md_of(t);
  if (cur == md) return t;
  Tensor out = alloc(md, t.shape(), t.dtype());
  reorder(t, cur, out, md);
  return out;
}

Tensor CpuBackend::to_plain(const Tensor& x) {
  TANDEM_REQUIRE(x.defined(), "to_plain: undefined tensor");
  TANDEM_REQUIRE(x.device().is_cpu(), "to_plain (cpu): {} is not on the host", x.str());
  if (x.is_plain()) return x;
  return as_layout(x, plain_md(x.shape()));
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  TANDEM_REQUIRE(dst.is_plain(), "copy (cpu): destination {} must be plain", dst.str());
  dst.copy_from(to_plain(src));
}

void CpuBackend::store_param_grad(const Tensor& src, const memory::desc& src_md, Tensor& dst,
                                  const memory::desc& dmd, bool accumulate) {
  if (!accumulate) {
    if (src_md == dmd) {
      if (src.raw_data() != dst.raw_data()) std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
    } else {
      reorder(src, src_md, dst, dmd);
    }
    return;
  }
  Tensor tmp = src;
  if (!(src_md == dmd)) {
    tmp = Tensor::empty(dst.shape(), DType::kF32);  // dmd is plain: same bytes as dst's shape
    reorder(src, src_md, tmp, dmd);
  }
  add_raw(static_cast<float*>(dst.raw_data()), static_cast<const float*>(dst.raw_data()),
          static_cast<const float*>(tmp.raw_data()), dst.numel());
}

void CpuBackend::add_raw(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------- elementwise

namespace {
void check_f32(const Tensor& t, const char* op, const char* arg) {
  validate::tensor(t, op, arg, Device::cpu(), -1, false);
}
// Elements in a tensor's storage (blocked layouts include zero padding, which stays zero).
int64_t storage_elems(const Tensor& t) { return static_cast<int64_t>(t.nbytes() / sizeof(float)); }
}  // namespace

Tensor CpuBackend::add(const Tensor& a, const Tensor& b) {
  check_f32(a, "add", "a");
  check_f32(b, "add", "b");
  validate::same_shape(a, b, "add", "a", "b");
  const memory::desc md = md_of(a);
  Tensor bb = as_layout(b, md);
  Tensor c = alloc(md, a.shape());
  add_raw(static_cast<float*>(c.raw_data()), static_cast<const float*>(a.raw_data()),
          static_cast<const float*>(bb.raw_data()), storage_elems(a));
  return c;
}

void CpuBackend::add_inplace(Tensor& a, const Tensor& b) {
  check_f32(a, "add_inplace", "a");
  check_f32(b, "add_inplace", "b");
  validate::same_shape(a, b, "add_inplace", "a", "b");
  Tensor bb = as_layout(b, md_of(a));
  add_raw(static_cast<float*>(a.raw_data()), static_cast<const float*>(a.raw_data()),
          static_cast<const float*>(bb.raw_data()), storage_elems(a));
}

void CpuBackend::scale(Tensor& x, float alpha) {
  check_f32(x, "scale", "x");
  float* p = static_cast<float*>(x.raw_data());
  const int64_t n = storage_elems(x);
#pragma omp parallel for simd num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

void CpuBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  check_f32(x, "axpy", "x");
  check_f32(y, "axpy", "y");
  validate::same_shape(x, y, "axpy", "x", "y");
  Tensor xx = as_layout(x, md_of(y));
  const float* xp = static_cast<const float*>(xx.raw_data());
  float* yp = static_cast<float*>(y.raw_data());
  const int64_t n = storage_elems(y);
#pragma omp parallel for simd num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) yp[i] += alpha * xp[i];
}

void CpuBackend::fill(Tensor& x, float value) {
  check_f32(x, "fill", "x");
  TANDEM_REQUIRE(x.is_plain(), "fill (cpu): {} must be plain", x.str());
  float* p = static_cast<float*>(x.raw_data());
  const int64_t n = x.numel();
#pragma omp parallel for simd num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

double CpuBackend::sum_squares(const Tensor& x) {
  check_f32(x, "sum_squares", "x");
  const float* p = static_cast<const float*>(x.raw_data());
  const int64_t n = storage_elems(x);
  double s = 0;
#pragma omp parallel for simd reduction(+ : s) num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}

// ---------------------------------------------------------------- dropout

DropoutForward CpuBackend::dropout_forward(const Tensor& x, float p, uint64_t seed) {
  check_f32(x, "dropout_forward", "input");
  validate::dropout_p(p);
  Tensor xp = to_plain(x);
  DropoutForward out{Tensor::empty(x.shape()), Tensor::empty(x.shape(), DType::kU8)};
  const uint32_t th = dropout_threshold24(p);
  const float s = 1.0f / (1.0f - p);
  const float* in = static_cast<const float*>(xp.raw_data());
  float* y = static_cast<float*>(out.y.raw_data());
  uint8_t* m = static_cast<uint8_t*>(out.mask.raw_data());
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = dropout_keep(seed, static_cast<uint64_t>(i), th);
    m[i] = keep ? 1 : 0;
    y[i] = keep ? in[i] * s : 0.0f;
  }
  return out;
}

Tensor CpuBackend::dropout_backward(const Tensor& dy, const Tensor& mask, float p) {
  check_f32(dy, "dropout_backward", "dy");
  validate::plain(mask, "dropout_backward", "mask", Device::cpu(), dy.shape(), DType::kU8);
  validate::dropout_p(p);
  Tensor d = to_plain(dy);
  Tensor dx = Tensor::empty(dy.shape());
  const float s = 1.0f / (1.0f - p);
  const float* g = static_cast<const float*>(d.raw_data());
  const uint8_t* m = static_cast<const uint8_t*>(mask.raw_data());
  float* o = static_cast<float*>(dx.raw_data());
  const int64_t n = dy.numel();
#pragma omp parallel for simd num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] = m[i] ? g[i] * s : 0.0f;
  return dx;
}

// ---------------------------------------------------------------- loss

LossOutput CpuBackend::softmax_cross_entropy(const Tensor& logits_in, const Tensor& labels, bool want_grad,
                                             int64_t normalizer) {
  validate::tensor(logits_in, "softmax_cross_entropy", "logits", Device::cpu(), 2, false);
  const auto [N, K] = validate::loss(logits_in, labels, device());
  TANDEM_REQUIRE(normalizer >= 0, "softmax_cross_entropy: normalizer {} must be >= 0", normalizer);
  TANDEM_REQUIRE(labels.is_plain(), "softmax_cross_entropy: labels {} must be plain", labels.str());
  Tensor logits = to_plain(logits_in);
  const double norm = normalizer > 0 ? static_cast<double>(normalizer) : static_cast<double>(std::max<int64_t>(N, 1));
  LossOutput out;
  if (want_grad) out.dlogits = Tensor::empty(logits.shape());
  const float* x = static_cast<const float*>(logits.raw_data());
  float* g = want_grad ? static_cast<float*>(out.dlogits.raw_data()) : nullptr;
  const bool i32 = labels.dtype() == DType::kI32;
  double total = 0;
  int64_t correct = 0, bad_row = -1, bad_label = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t l = i32 ? static_cast<const int32_t*>(labels.raw_data())[n]
                          : static_cast<const int64_t*>(labels.raw_data())[n];
    if (l < 0 || l >= K) {
      bad_row = n;
      bad_label = l;
      break;
    }
    const float* row = x + n * K;
    int64_t arg = 0;
    for (int64_t k = 1; k < K; ++k)
      if (row[k] > row[arg]) arg = k;
    double se = 0;
    for (int64_t k = 0; k < K; ++k) se += std::exp(static_cast<double>(row[k] - row[arg]));
    const double lse = row[arg] + std::log(se);
    total += lse - row[l];
    correct += arg == l;
    if (g) {
      float* gr = g + n * K;
      for (int64_t k = 0; k < K; ++k)
        gr[k] = static_cast<float>((std::exp(row[k] - lse) - (k == l ? 1.0 : 0.0)) / norm);
    }
  }
  TANDEM_REQUIRE(bad_row < 0, "softmax_cross_entropy: label {} of row {} is outside [0, {})", bad_label, bad_row, K);
  out.loss = total / norm;
  out.correct = correct;
  return out;
}

// ---------------------------------------------------------------- optimizers

void CpuBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& p) {
  validate::sgd(p);
  const bool mom = p.momentum != 0.0f;
  validate::optimizer_buffers(param, grad, mom ? &buf : nullptr, nullptr, "sgd_update", device());
  TANDEM_REQUIRE(param.dtype() == DType::kF32, "sgd_update (cpu): param must be f32, got {}", param.str());
  float* w = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* b = mom ? static_cast<float*>(buf.raw_data()) : nullptr;
  const kernels::SgdStep step{p.lr, p.weight_decay, p.momentum, 1.0f - p.dampening, mom, p.step == 1, p.nesterov};
  kernels::parallel_chunks(param.numel(), threads_, kParallelMin, [&](int64_t lo, int64_t hi) {
    kernels::sgd(isa_, w + lo, g + lo, mom ? b + lo : nullptr, hi - lo, step);
  });
}

void CpuBackend::adam_update(Tensor& param, const Tensor& grad, Tensor& mbuf, Tensor& vbuf, const AdamParams& p) {
  validate::adam(p);
  validate::optimizer_buffers(param, grad, &mbuf, &vbuf, "adam_update", device());
  TANDEM_REQUIRE(param.dtype() == DType::kF32, "adam_update (cpu): param must be f32, got {}", param.str());
  float* w = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* m = static_cast<float*>(mbuf.raw_data());
  float* v = static_cast<float*>(vbuf.raw_data());
  const int64_t n = param.numel();
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  const float step = static_cast<float>(p.lr / bc1), inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float b1 = p.beta1, b2 = p.beta2, eps = p.eps;
  const float l2 = p.decoupled_weight_decay ? 0.0f : p.weight_decay;
  const float decay = p.decoupled_weight_decay ? 1.0f - p.lr * p.weight_decay : 1.0f;
#pragma omp parallel for simd num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + l2 * w[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay - step * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace cpu
}  // namespace tandem::engine::compute
