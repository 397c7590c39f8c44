// Tandem's own Winograd F(4x4, 3x3) convolution (engine/compute/cpu/cpu_winograd.hpp): forward,
// backward data and backward weights against the reference backend's direct convolution in f64, on shapes whose planes are
// not whole tiles and whose channels are not whole vectors, at batch 1 and above; and
// TANDEM_CPU_WINOGRAD's choice of algorithm (auto, on, off; a bad value refused, naming the setting);
// kept weight transforms served only while the weights hold the bytes they were made from.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>

#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/compute/cpu/cpu_winograd.hpp"
#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"
#include "tests/compute/test_util.hpp"

using namespace tandem;
using namespace tandem::engine::compute;
using namespace tandem::engine::compute::testing;
using cpu::ConvAlgo;
using cpu::CpuBackend;

namespace {

struct Case {
  int64_t n, c, h, w, o, pad;
  bool bias;
};

// Relative errors of `got` against the f64 reference: max |a - b| / max |b|, and the RMS of a - b over
// the RMS of b.
struct Errors {
  double max_rel = 0, rms_rel = 0;
};
Errors errors(const std::vector<double>& got, const std::vector<double>& want) {
  double scale = 0, e2 = 0, w2 = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    worst = std::max(worst, std::abs(got[i] - want[i]));
    e2 += (got[i] - want[i]) * (got[i] - want[i]);
    w2 += want[i] * want[i];
  }
  return {worst / scale, std::sqrt(e2 / w2)};
}

std::unique_ptr<Backend> cpu_backend_with(const char* mode) {
  const settings::ScopedProcessValue v("TANDEM_CPU_WINOGRAD", mode);
  return make_backend("cpu");
}

// Measured here (AMD EPYC; the cases below): max error up to 6.2e-6 of the largest output, forward and
// backward data, relative RMS up to 1.6e-6; oneDNN's direct kernels up to 4.5e-7 and 2.1e-7. F(4x4, 3x3)
// amplifies rounding by its transforms' constants (up to 8 in A, 5 in B), hence the margin.
constexpr double kMaxRel = 2e-5;
constexpr double kRmsRel = 5e-6;

}  // namespace

BOOST_AUTO_TEST_SUITE(cpu_winograd)

BOOST_AUTO_TEST_CASE(forward_backward_data_and_weights_match_the_f64_reference) {
  const Case cases[] = {
      {1, 3, 5, 7, 5, 1, true},      // batch 1, one partial tile, 3 and 5 channels (one padded block each)
      {2, 13, 9, 11, 6, 1, false},   // odd planes, 13 -> 16 channels padded
      {3, 16, 8, 8, 24, 1, true},    // whole tiles and blocks
      {2, 10, 7, 6, 17, 0, false},   // no padding: 5x4 output
      {2, 8, 6, 5, 9, 2, true},      // padding 2: 8x7 output; backward data pads 0
      {1, 64, 13, 13, 32, 1, false}, // many channels, 4x4 tiles with a partial last row and column
      {2, 24, 11, 10, 40, 1, false}, // whole blocks, no bias: Winograd weight gradients (smaller layers
      {3, 16, 9, 7, 8, 0, false},    // with partial blocks take the direct weights kernel)
  };
  auto win = cpu_backend_with("on");
  auto direct = cpu_backend_with("off");
  auto ref = make_backend("reference");
  auto& wb = dynamic_cast<CpuBackend&>(*win);
  uint32_t seed = 1;
  for (const Case& k : cases) {
    const std::string name = std::to_string(k.n) + "x" + std::to_string(k.c) + "x" + std::to_string(k.h) + "x" +
                             std::to_string(k.w) + " -> " + std::to_string(k.o) + " pad " + std::to_string(k.pad);
    ConvParams p;
    p.pad_h = p.pad_w = k.pad;
    const Shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c, 3, 3};
    const Tensor x = random_tensor(xs, seed++), w = random_tensor(ws, seed++, -0.5, 0.5);
    const Tensor bias = k.bias ? random_tensor(Shape{k.o}, seed++) : Tensor();
    BOOST_TEST((wb.conv_algo_of(xs, ws, k.bias, p) == ConvAlgo::kTandemWinograd), name);
    BOOST_TEST((wb.conv_algo_of(xs, ws, false, p) == ConvAlgo::kTandemWinograd), name);
    // The f64 reference.
    const Tensor y64 = ref->conv_forward(cast(x, DType::kF64), cast(w, DType::kF64),
                                         k.bias ? cast(bias, DType::kF64) : Tensor(), p);
    const Tensor y = win->conv_forward(x, w, bias, p);
    const Tensor yd = direct->conv_forward(x, w, bias, p);
    const Errors ef = errors(values(*win, y), values(*ref, y64)), efd = errors(values(*direct, yd), values(*ref, y64));
    const Tensor dy = random_tensor(y64.shape(), seed++);
    const Tensor dx64 = ref->conv_backward_data(cast(dy, DType::kF64), cast(w, DType::kF64), xs, p);
    const Tensor dx = win->conv_backward_data(dy, w, xs, p);
    const Tensor dxd = direct->conv_backward_data(dy, w, xs, p);
    BOOST_TEST_REQUIRE((dx.shape() == xs));
    const Errors eb = errors(values(*win, dx), values(*ref, dx64)), ebd = errors(values(*direct, dxd), values(*ref, dx64));
    BOOST_TEST_MESSAGE(name << ": forward max " << ef.max_rel << " rms " << ef.rms_rel << " (direct " << efd.max_rel
                            << ", " << efd.rms_rel << "); backward data max " << eb.max_rel << " rms " << eb.rms_rel
                            << " (direct " << ebd.max_rel << ", " << ebd.rms_rel << ")");
    BOOST_TEST(ef.max_rel < kMaxRel, name << " forward: max relative error " << ef.max_rel);
    BOOST_TEST(ef.rms_rel < kRmsRel, name << " forward: relative RMS error " << ef.rms_rel);
    BOOST_TEST(eb.max_rel < kMaxRel, name << " backward data: max relative error " << eb.max_rel);
    BOOST_TEST(eb.rms_rel < kRmsRel, name << " backward data: relative RMS error " << eb.rms_rel);
    // Weight gradients: Tandem's Winograd without a bias, oneDNN's direct kernel with one; then accumulated.
    Tensor dw = Tensor::empty(ws), db = k.bias ? Tensor::empty(Shape{k.o}) : Tensor();
    win->conv_backward_weights(x, dy, dw, db, p, false);
    Tensor dw64 = Tensor::empty(ws, DType::kF64), db64 = k.bias ? Tensor::empty(Shape{k.o}, DType::kF64) : Tensor();
    ref->conv_backward_weights(cast(x, DType::kF64), cast(dy, DType::kF64), dw64, db64, p, false);
    const Errors ew = errors(values(dw), values(dw64));
    BOOST_TEST_MESSAGE(name << ": backward weights max " << ew.max_rel << " rms " << ew.rms_rel);
    BOOST_TEST(ew.max_rel < kMaxRel, name << " backward weights: max relative error " << ew.max_rel);
    BOOST_TEST(ew.rms_rel < kRmsRel, name << " backward weights: relative RMS error " << ew.rms_rel);
    win->conv_backward_weights(x, dy, dw, db, p, true);
    std::vector<double> twice = values(dw64);
    for (double& v : twice) v *= 2;
    BOOST_TEST(errors(values(dw), twice).max_rel < kMaxRel, name << " backward weights, accumulated");
  }
}

// The kernels themselves, per ISA variant this CPU runs (the baseline's generic products, the vector
// ones' FMA kernel), on tile blocks smaller than the plane so several blocks and a partial one run.
BOOST_AUTO_TEST_CASE(every_isa_variant_matches_the_reference) {
  namespace wg = cpu::winograd;
  auto ref = make_backend("reference");
  const int64_t N = 2, C = 11, H = 9, W = 10, O = 21;
  wg::Geometry g{N, C, H, W, O, H, W, 1, 1};
  g.block = 7;  // 2 x 3 x 3 = 18 tiles: blocks of 7, 7 and 4
  const Tensor x = random_tensor(Shape{N, C, H, W}, 21), w = random_tensor(Shape{O, C, 3, 3}, 22, -0.5, 0.5);
  const Tensor bias = random_tensor(Shape{O}, 23);
  ConvParams p;
  p.pad_h = p.pad_w = 1;
  const std::vector<double> want = values(*ref, ref->conv_forward(cast(x, DType::kF64), cast(w, DType::kF64),
                                                                  cast(bias, DType::kF64), p));
  // x as nChw8c.
  const int64_t cb = g.cp() / wg::kLanes, ob = g.op() / wg::kLanes;
  std::vector<float> xb(static_cast<size_t>(N * cb * H * W * wg::kLanes), 0.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < H * W; ++i)
        xb[((n * cb + c / 8) * H * W + i) * 8 + c % 8] = x.data<float>()[(n * C + c) * H * W + i];
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (variant_cpu_isa(isa) != isa) continue;
    std::vector<float> u(static_cast<size_t>(wg::u_floats(g))), scratch(static_cast<size_t>(wg::scratch_floats(g, 2)));
    std::vector<float> yb(static_cast<size_t>(N * ob * H * W * wg::kLanes), -1.0f);
    wg::weight_transform(isa, w.data<float>(), u.data(), g, false, 2);
    wg::convolution(isa, xb.data(), u.data(), bias.data<float>(), yb.data(), scratch.data(), g, 2);
    std::vector<double> got(want.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t i = 0; i < H * W; ++i) got[(n * O + o) * H * W + i] = yb[((n * ob + o / 8) * H * W + i) * 8 + o % 8];
    bool padding_zero = true;  // channels 21..23 of the last block
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = O; o < g.op(); ++o)
        for (int64_t i = 0; i < H * W; ++i) padding_zero = padding_zero && yb[((n * ob + o / 8) * H * W + i) * 8 + o % 8] == 0.0f;
    const Errors e = errors(got, want);
    BOOST_TEST(e.max_rel < kMaxRel, cpu_isa_name(isa) << ": max relative error " << e.max_rel);
    BOOST_TEST(padding_zero, cpu_isa_name(isa) << ": padded output channels are not zero");
    // The weights' gradient, with y's blocked values as dy (padded channels zero).
    std::vector<float> dw(static_cast<size_t>(O * C * 9)), du(static_cast<size_t>(wg::du_floats(g, 2)));
    wg::weight_gradient(isa, xb.data(), yb.data(), dw.data(), false, scratch.data(), du.data(), g, 2);
    Tensor dy = Tensor::empty(Shape{N, O, H, W}), dw64 = Tensor::empty(Shape{O, C, 3, 3}, DType::kF64), none;
    for (size_t i = 0; i < got.size(); ++i) dy.data<float>()[i] = static_cast<float>(got[i]);
    ref->conv_backward_weights(cast(x, DType::kF64), cast(dy, DType::kF64), dw64, none, p, false);
    std::vector<double> dwd(dw.begin(), dw.end());
    const Errors ew = errors(dwd, values(dw64));
    BOOST_TEST(ew.max_rel < kMaxRel, cpu_isa_name(isa) << ": weight gradient max relative error " << ew.max_rel);
  }
}

BOOST_AUTO_TEST_CASE(blocked_inputs_from_a_previous_layer_are_taken_as_they_are) {
  // Two chained 3x3 layers: the second one's input is the first one's (blocked) output.
  auto win = cpu_backend_with("on");
  auto ref = make_backend("reference");
  ConvParams p;
  p.pad_h = p.pad_w = 1;
  const Tensor x = random_tensor(Shape{2, 12, 10, 9}, 11), w1 = random_tensor(Shape{20, 12, 3, 3}, 12, -0.3, 0.3),
               w2 = random_tensor(Shape{7, 20, 3, 3}, 13, -0.3, 0.3);
  const Tensor y = win->conv_forward(win->conv_forward(x, w1, Tensor(), p), w2, Tensor(), p);
  const Tensor y64 = ref->conv_forward(ref->conv_forward(cast(x, DType::kF64), cast(w1, DType::kF64), Tensor(), p),
                                       cast(w2, DType::kF64), Tensor(), p);
  const Errors e = errors(values(*win, y), values(*ref, y64));
  BOOST_TEST(e.max_rel < kMaxRel, "max relative error " << e.max_rel);
}

// A weight version's transform is kept from its third use in each direction (forward, backward data)
// and served while the weights' bytes are those it was made from: after a write of one element, an
// optimizer update, a return to earlier values and another shape over the same storage, forward and
// backward data equal the direct kernels' on the weights as they are now.
BOOST_AUTO_TEST_CASE(kept_transforms_are_served_only_for_the_weights_they_were_made_from) {
  auto win = cpu_backend_with("on");
  auto direct = cpu_backend_with("off");
  auto& wb = dynamic_cast<CpuBackend&>(*win);
  ConvParams p;
  p.pad_h = p.pad_w = 1;
  const Shape xs{2, 16, 9, 8}, ws{24, 16, 3, 3};
  const Tensor x = random_tensor(xs, 31), dy = random_tensor(Shape{2, 24, 9, 8}, 32);
  Tensor w = random_tensor(ws, 33, -0.5, 0.5);
  const Tensor original = w.clone();
  const auto both = [&](Backend& be, const Tensor& wt, const Tensor& in, const Tensor& grad) {
    return std::pair{values(be, be.conv_forward(in, wt, Tensor(), p)),
                     values(be, be.conv_backward_data(grad, wt, in.shape(), p))};
  };
  // Four uses: a transform for each of the first two calls, one kept at the third, then the kept one.
  const auto s0 = wb.winograd_cache_stats();
  const auto r1 = both(*win, w, x, dy), r2 = both(*win, w, x, dy);
  BOOST_TEST(wb.winograd_cache_stats().bytes == static_cast<int64_t>(ws.numel() * 4));  // only the copy
  const auto r3 = both(*win, w, x, dy), r4 = both(*win, w, x, dy);
  const auto s1 = wb.winograd_cache_stats();
  BOOST_TEST(s1.transforms - s0.transforms == 6);  // 3 per direction
  BOOST_TEST(s1.hits - s0.hits == 2);
  BOOST_TEST(s1.entries == 1);
  BOOST_TEST(s1.bytes == static_cast<int64_t>(ws.numel() * 4 + 2 * 36 * 16 * 24 * 4));  // the copy and both U
  BOOST_TEST((r1 == r2 && r2 == r3 && r3 == r4), "kept transforms gave other results than fresh ones");
  std::vector<double> last = r4.first;
  const auto check = [&](const std::string& what, const Tensor& wt, const Tensor& in, const Tensor& grad) {
    const auto before = wb.winograd_cache_stats();
    const auto got = both(*win, wt, in, grad);
    const auto again = both(*win, wt, in, grad);
    const auto want = both(*direct, wt, in, grad);
    BOOST_TEST(wb.winograd_cache_stats().transforms > before.transforms, what << ": not transformed again");
    BOOST_TEST((got == again), what);
    const Errors ef = errors(got.first, want.first), eb = errors(got.second, want.second);
    BOOST_TEST(ef.max_rel < kMaxRel, what << " forward: max relative error " << ef.max_rel);
    BOOST_TEST(eb.max_rel < kMaxRel, what << " backward data: max relative error " << eb.max_rel);
    if (got.first.size() == last.size()) {  // a stale transform would have given the previous results
      BOOST_TEST(errors(last, want.first).max_rel > 100 * kMaxRel, what << ": the change moved nothing");
    }
    last = got.first;
  };
  w.data<float>()[ws.numel() - 1] += 1.0f;  // the last element only: a write straight into the buffer
  check("one element written", w, x, dy);
  Tensor grad = random_tensor(ws, 34), momentum = Tensor::zeros(ws);
  SgdParams sp;
  sp.lr = 0.1f;
  win->sgd_update(w, grad, momentum, sp);
  check("an SGD update", w, x, dy);
  w.copy_from(original);  // back to the first version, whose transforms were dropped
  check("the first values again", w, x, dy);
  BOOST_TEST((last == r1.first));
  // The same storage as [16, 24, 3, 3]: another convolution (24 channels in, 16 out) at the same address.
  const Tensor x2 = random_tensor(Shape{2, 24, 9, 8}, 35), dy2 = random_tensor(Shape{2, 16, 9, 8}, 36);
  check("another shape over the same storage", w.view(Shape{16, 24, 3, 3}), x2, dy2);
  BOOST_TEST(wb.winograd_cache_stats().entries == 1);
}

BOOST_AUTO_TEST_CASE(the_setting_picks_the_algorithm) {
  const Shape x64{8, 64, 16, 16}, w64{64, 64, 3, 3}, x3{8, 3, 16, 16}, w3{64, 3, 3, 3}, x24{8, 24, 16, 16},
      w24{24, 24, 3, 3}, w1x1{64, 64, 1, 1};
  ConvParams s1;
  s1.pad_h = s1.pad_w = 1;
  ConvParams s2 = s1;
  s2.stride_h = s2.stride_w = 2;
  ConvParams grouped = s1;
  grouped.groups = 64;
  const Shape wdw{64, 1, 3, 3};
  const auto algo = [](const char* mode, CpuIsa isa, const Shape& x, const Shape& w, const ConvParams& p) {
    return CpuBackend::conv_algo(mode, isa, x, w, p);
  };
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    BOOST_TEST((algo("off", isa, x64, w64, s1) == ConvAlgo::kDirect));
    BOOST_TEST((algo("0", isa, x64, w64, s1) == ConvAlgo::kDirect));
    BOOST_TEST((algo("on", isa, x64, w64, s1) == ConvAlgo::kTandemWinograd));
    BOOST_TEST((algo("on", isa, x3, w3, s1) == ConvAlgo::kTandemWinograd));
    for (const char* mode : {"on", "auto"}) {  // never taken: stride 2, 1x1, depthwise
      BOOST_TEST((algo(mode, isa, x64, w64, s2) == ConvAlgo::kDirect));
      BOOST_TEST((algo(mode, isa, x64, w1x1, ConvParams{}) == ConvAlgo::kDirect));
      BOOST_TEST((algo(mode, isa, x64, wdw, grouped) == ConvAlgo::kDirect));
    }
  }
  // auto: oneDNN's on AVX-512 (whole 16-channel blocks), Tandem's on AVX2 (32 or more channels), else direct.
  BOOST_TEST((algo("auto", CpuIsa::kAvx512, x64, w64, s1) == ConvAlgo::kOnednnWinograd));
  BOOST_TEST((algo("1", CpuIsa::kAvx512, x64, w64, s1) == ConvAlgo::kOnednnWinograd));
  BOOST_TEST((algo("auto", CpuIsa::kAvx512, x24, w24, s1) == ConvAlgo::kDirect));
  BOOST_TEST((algo("auto", CpuIsa::kAvx2, x64, w64, s1) == ConvAlgo::kTandemWinograd));
  BOOST_TEST((algo("auto", CpuIsa::kAvx2, x24, w24, s1) == ConvAlgo::kDirect));  // too few channels to pay
  BOOST_TEST((algo("auto", CpuIsa::kAvx2, Shape{8, 32, 16, 16}, Shape{32, 32, 3, 3}, s1) == ConvAlgo::kTandemWinograd));
  BOOST_TEST((algo("auto", CpuIsa::kAvx2, x3, w3, s1) == ConvAlgo::kDirect));
  // Too few 4x4 output tiles: U (4x the weights) read for little work. 16 tiles and more take it.
  const Shape w512{512, 512, 3, 3};
  BOOST_TEST((algo("auto", CpuIsa::kAvx2, Shape{1, 512, 4, 4}, w512, s1) == ConvAlgo::kDirect));
  BOOST_TEST((algo("auto", CpuIsa::kAvx2, Shape{15, 512, 4, 4}, w512, s1) == ConvAlgo::kDirect));
  BOOST_TEST((algo("auto", CpuIsa::kAvx2, Shape{16, 512, 4, 4}, w512, s1) == ConvAlgo::kTandemWinograd));
  BOOST_TEST((algo("auto", CpuIsa::kAvx2, Shape{1, 64, 13, 13}, Shape{64, 64, 3, 3}, s1) == ConvAlgo::kTandemWinograd));
  BOOST_TEST((algo("on", CpuIsa::kAvx2, Shape{1, 512, 4, 4}, w512, s1) == ConvAlgo::kTandemWinograd));
  BOOST_TEST((algo("auto", CpuIsa::kBaseline, x64, w64, s1) == ConvAlgo::kDirect));
  try {
    algo("yes", CpuIsa::kAvx2, x64, w64, s1);
    BOOST_ERROR("a bad TANDEM_CPU_WINOGRAD was accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("TANDEM_CPU_WINOGRAD") != std::string::npos, e.what());
  }
  // A backend's plans follow the setting in force when it was made.
  for (const char* mode : {"on", "off", "auto"}) {
    auto be = cpu_backend_with(mode);
    auto& cb = dynamic_cast<CpuBackend&>(*be);
    const ConvAlgo want = CpuBackend::conv_algo(mode, cb.kernel_isa(), x64, w64, s1);
    BOOST_TEST((cb.conv_algo_of(x64, w64, false, s1) == want), mode);
    const Tensor y = be->conv_forward(random_tensor(x64, 1), random_tensor(w64, 2), Tensor(), s1);
    BOOST_TEST((y.shape() == x64));
  }
  // A bad value is refused by the settings registry, naming it.
  settings::Settings bad;
  try {
    bad.set("TANDEM_CPU_WINOGRAD", "maybe");
    bad.validate();
    BOOST_ERROR("TANDEM_CPU_WINOGRAD=maybe was accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("TANDEM_CPU_WINOGRAD") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()
