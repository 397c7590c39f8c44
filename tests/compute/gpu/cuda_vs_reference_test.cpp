#include <boost/test/unit_test.hpp>

#include "tests/compute/conformance.hpp"
#include "tests/compute/gpu/gpu_available.hpp"
#include "engine/core/allocator.hpp"
#include "engine/core/settings.hpp"

#include <cmath>
#include <string>
#include <vector>

using namespace tandem;
using namespace tandem::engine::compute;
using namespace tandem::engine::compute::testing;
using conformance::Pair;

#define GPU_CASE(name)                                                                      \
  BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(CudaAvailable())) {            \
    Pair b("cuda");                                                                         \
    conformance::name(b);                                                                   \
  }

BOOST_AUTO_TEST_SUITE(cuda_vs_reference)

GPU_CASE(convolution_forward_and_backward)
GPU_CASE(batch_norm_training_inference_and_backward)
GPU_CASE(activations_on_plain_and_blocked_inputs)
GPU_CASE(pooling_forward_and_backward)
GPU_CASE(linear_forward_and_backward)
GPU_CASE(softmax_cross_entropy_loss_grad_and_accuracy)
GPU_CASE(dropout_masks_match_and_rate_is_p)
GPU_CASE(elementwise_ops_mix_layouts)
GPU_CASE(small_network_keeps_blocked_layouts_and_matches)
GPU_CASE(optimizers_match_reference)

BOOST_AUTO_TEST_CASE(tensors_round_trip_and_errors_name_the_device,
                     *boost::unit_test::precondition(CudaAvailable())) {
  auto be = make_backend("cuda");
  Tensor h = random_tensor({3, 5}, 1);
  Tensor d = be->to_plain(h);
  BOOST_TEST(d.device().is_cuda());
  BOOST_TEST((status_of([&] { (void)d.data<float>(); }) == Status::kInvalidArgument));
  expect_close(values(be->to_host(d)), values(h), 0, 0, "round trip");
  auto cpu = make_backend("cpu");
  BOOST_TEST((status_of([&] { cpu->add(d, d); }) == Status::kInvalidArgument));  // wrong device
  Tensor logits = be->to_plain(random_tensor({2, 3}, 2));
  Tensor bad = be->to_plain(Tensor::from_vector({2}, std::vector<int64_t>{0, 5}));
  try {
    be->softmax_cross_entropy(logits, bad, true, 0);
    BOOST_FAIL("no throw");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("label 5 of row 1") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(device_allocator_reuses_blocks, *boost::unit_test::precondition(CudaAvailable())) {
  auto be = make_backend("cuda");
  void* first = nullptr;
  {
    Tensor t = be->empty({1 << 20}, DType::kF32);
    first = t.raw_data();
  }
  Tensor u = be->empty({1 << 20}, DType::kF32);
  BOOST_TEST(u.raw_data() == first);
  BOOST_TEST(reinterpret_cast<uintptr_t>(u.raw_data()) % 64 == 0);
}

// The driver's per-process count of this process's device memory (NVML, what nvidia-smi shows; tandem_trainer_predict
// measures a GPU rank's memory by it): known once a cuda backend exists, and it grows by a fresh 512 MiB block.
BOOST_AUTO_TEST_CASE(process_device_memory_counts_this_processs_blocks, *boost::unit_test::precondition(CudaAvailable())) {
  auto be = make_backend("cuda");
  const double before = process_device_memory_bytes(be->device());
  BOOST_TEST_MESSAGE("this process holds " << before / 1048576 << " MiB on " << be->device().str());
  BOOST_TEST(before > 0, "the driver gave no per-process figure (NVML)");
  BOOST_TEST(process_device_memory_bytes(Device::cpu()) == 0);
  Tensor big = be->empty({int64_t{128} << 20}, DType::kF32);  // 512 MiB, larger than any cached block here
  const double after = process_device_memory_bytes(be->device());
  BOOST_TEST(after - before >= 512.0 * 1048576, "grew by " << (after - before) / 1048576 << " MiB for a 512 MiB block");
}

// Relative error ||got - want|| / ||want|| of two equally long vectors.
double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0, n = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    d += (got[i] - want[i]) * (got[i] - want[i]);
    n += want[i] * want[i];
  }
  return std::sqrt(d / n);
}

// TANDEM_CUDA_MATH=bf16: convolutions and GEMMs round their inputs to bf16 (8-bit mantissa) and accumulate in
// f32, so they land near bf16's unit roundoff from the f64-accumulating reference -- and not at f32's, which
// would mean the bf16 path was not taken. Fresh random inputs, a conv with bias and groups 1, a depthwise conv
// (in bf16 too: TANDEM_HALF_GROUPED_CONV=1), and a linear layer; forward, both backward passes, and an accumulating
// weight gradient.
BOOST_AUTO_TEST_CASE(bf16_math_convolutions_and_gemms_are_within_bf16_rounding,
                     *boost::unit_test::precondition(CudaAvailable())) {
  const settings::ScopedProcessValue math("TANDEM_CUDA_MATH", "bf16");
  const settings::ScopedProcessValue grouped("TANDEM_HALF_GROUPED_CONV", "1");
  auto be = make_backend("cuda");
  auto ref = make_backend("reference");
  auto check = [&](const Tensor& got, const Tensor& want, const std::string& what) {
    const double e = rel_error(values(*be, got), values(*ref, want));
    BOOST_TEST(e < 1e-2, what << ": relative error " << e << " is above bf16's rounding");
    BOOST_TEST(e > 1e-5, what << ": relative error " << e << " is f32's: the bf16 path was not taken");
  };
  struct Case {
    Shape x, w;
    ConvParams p;
  };
  ConvParams dw3;
  dw3.pad_h = dw3.pad_w = 1;
  dw3.groups = 16;
  ConvParams s2;
  s2.stride_h = s2.stride_w = 2;
  s2.pad_h = s2.pad_w = 1;
  const Case cases[] = {{{4, 16, 12, 12}, {32, 16, 3, 3}, s2}, {{4, 16, 10, 10}, {16, 1, 3, 3}, dw3}};
  uint32_t seed = 101;
  for (const Case& c : cases) {
    const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++), bias = random_tensor({c.w[0]}, seed++);
    const Tensor y = ref->conv_forward(x, w, bias, c.p);
    const Tensor dy = random_tensor(y.shape(), seed++);
    check(be->conv_forward(be->to_plain(x), be->to_plain(w), be->to_plain(bias), c.p), y, "conv forward");
    check(be->conv_backward_data(be->to_plain(dy), be->to_plain(w), x.shape(), c.p),
          ref->conv_backward_data(dy, w, x.shape(), c.p), "conv backward data");
    Tensor dw_c = be->to_plain(random_tensor(w.shape(), seed)), db_c = be->zeros({c.w[0]}, DType::kF32);
    Tensor dw_r = random_tensor(w.shape(), seed++), db_r = ref->zeros({c.w[0]}, DType::kF32);
    be->conv_backward_weights(be->to_plain(x), be->to_plain(dy), dw_c, db_c, c.p, true);  // accumulates
    ref->conv_backward_weights(x, dy, dw_r, db_r, c.p, true);
    check(dw_c, dw_r, "conv backward weights (accumulated)");
  }
  const Tensor x = random_tensor({8, 96}, seed++), w = random_tensor({40, 96}, seed++), b = random_tensor({40}, seed++);
  const Tensor dy = random_tensor({8, 40}, seed++);
  check(be->linear_forward(be->to_plain(x), be->to_plain(w), be->to_plain(b)), ref->linear_forward(x, w, b),
        "linear forward");
  check(be->linear_backward_data(be->to_plain(dy), be->to_plain(w), x.shape()),
        ref->linear_backward_data(dy, w, x.shape()), "linear backward data");
  Tensor dw_c = be->zeros({40, 96}, DType::kF32), db_c = be->zeros({40}, DType::kF32);
  Tensor dw_r = ref->zeros({40, 96}, DType::kF32), db_r = ref->zeros({40}, DType::kF32);
  be->linear_backward_weights(be->to_plain(x), be->to_plain(dy), dw_c, db_c, false);
  ref->linear_backward_weights(x, dy, dw_r, db_r, false);
  check(dw_c, dw_r, "linear backward weights");
}

// By default 16-bit math leaves grouped (depthwise) convolutions in f32 (half_math_for_conv): under bf16 and fp16
// math a depthwise convolution's forward and backward passes are f32-exact against the reference, while an
// ungrouped one in the same backend is not.
BOOST_AUTO_TEST_CASE(grouped_convolutions_stay_f32_in_16_bit_math_by_default,
                     *boost::unit_test::precondition(CudaAvailable())) {
  auto ref = make_backend("reference");
  ConvParams dw3;
  dw3.pad_h = dw3.pad_w = 1;
  dw3.groups = 16;
  const ConvParams dense;
  for (const char* math : {"bf16", "fp16"}) {
    const settings::ScopedProcessValue m("TANDEM_CUDA_MATH", math);
    auto be = make_backend("cuda");
    uint32_t seed = 301;
    for (const bool grouped : {true, false}) {
      const ConvParams& p = grouped ? dw3 : dense;
      const Shape ws = grouped ? Shape{16, 1, 3, 3} : Shape{16, 16, 3, 3};
      const Tensor x = random_tensor({4, 16, 10, 10}, seed++), w = random_tensor(ws, seed++);
      const Tensor y = ref->conv_forward(x, w, Tensor(), p), dy = random_tensor(y.shape(), seed++);
      Tensor dw_c = be->zeros(ws, DType::kF32), db_c, dw_r = ref->zeros(ws, DType::kF32), db_r;
      be->conv_backward_weights(be->to_plain(x), be->to_plain(dy), dw_c, db_c, p, false);
      ref->conv_backward_weights(x, dy, dw_r, db_r, p, false);
      const double errors[] = {
          rel_error(values(*be, be->conv_forward(be->to_plain(x), be->to_plain(w), Tensor(), p)), values(*ref, y)),
          rel_error(values(*be, be->conv_backward_data(be->to_plain(dy), be->to_plain(w), x.shape(), p)),
                    values(*ref, ref->conv_backward_data(dy, w, x.shape(), p))),
          rel_error(values(*be, dw_c), values(*ref, dw_r))};
      for (const double e : errors) {
        if (grouped) {
          BOOST_TEST(e < 1e-5, math << " depthwise: relative error " << e << " is not f32's");
        } else {
          BOOST_TEST(e > 1e-5, math << " dense: relative error " << e << " is f32's: 16-bit math was not taken");
        }
      }
    }
  }
}

// TANDEM_CUDA_MATH=fp16 against its CPU emulation (TANDEM_CPU_MATH=fp16 on the reference backend): both round the
// operands to IEEE half (and convolution results too), so they agree to f32 accumulation order -- at most a half ulp
// of a convolution's result (2^-11 relative) -- far below plain f32's distance from them. Values up to 4 keep every
// operand normal in half. Forward, both backward passes, an accumulating weight gradient, and a linear layer.
BOOST_AUTO_TEST_CASE(fp16_math_matches_the_cpu_emulation, *boost::unit_test::precondition(CudaAvailable())) {
  const settings::ScopedProcessValue gpu_math("TANDEM_CUDA_MATH", "fp16");
  auto be = make_backend("cuda");
  const settings::ScopedProcessValue cpu_math("TANDEM_CPU_MATH", "fp16");
  auto emu = make_backend("reference");
  const settings::ScopedProcessValue plain_cpu("TANDEM_CPU_MATH", "f32");
  auto f32 = make_backend("reference");
  auto check = [&](const Tensor& got, const Tensor& emulated, const Tensor& plain, const std::string& what) {
    const std::vector<double> g = values(*be, got), e = values(*emu, emulated), p = values(*f32, plain);
    const double to_emulation = rel_error(g, e), to_f32 = rel_error(g, p);
    BOOST_TEST(to_emulation < 1e-3, what << ": relative error " << to_emulation << " to the CPU emulation");
    BOOST_TEST(to_f32 > 4 * to_emulation, what << ": the GPU is as near f32 (" << to_f32 << ") as the emulation ("
                                               << to_emulation << "): the fp16 path was not taken");
  };
  ConvParams s2;
  s2.stride_h = s2.stride_w = 2;
  s2.pad_h = s2.pad_w = 1;
  uint32_t seed = 201;
  const Tensor x = random_tensor({4, 16, 12, 12}, seed++, -4, 4), w = random_tensor({32, 16, 3, 3}, seed++, -1, 1);
  const Tensor bias = random_tensor({32}, seed++);
  const Tensor dy = random_tensor(conv_output_shape(x.shape(), w.shape(), s2), seed++);
  check(be->conv_forward(be->to_plain(x), be->to_plain(w), be->to_plain(bias), s2), emu->conv_forward(x, w, bias, s2),
        f32->conv_forward(x, w, bias, s2), "conv forward");
  check(be->conv_backward_data(be->to_plain(dy), be->to_plain(w), x.shape(), s2),
        emu->conv_backward_data(dy, w, x.shape(), s2), f32->conv_backward_data(dy, w, x.shape(), s2),
        "conv backward data");
  Tensor dw_c = be->to_plain(random_tensor(w.shape(), seed)), db_c = be->zeros({32}, DType::kF32);
  Tensor dw_e = random_tensor(w.shape(), seed), db_e = emu->zeros({32}, DType::kF32);
  Tensor dw_f = random_tensor(w.shape(), seed++), db_f = f32->zeros({32}, DType::kF32);
  be->conv_backward_weights(be->to_plain(x), be->to_plain(dy), dw_c, db_c, s2, true);
  emu->conv_backward_weights(x, dy, dw_e, db_e, s2, true);
  f32->conv_backward_weights(x, dy, dw_f, db_f, s2, true);
  check(dw_c, dw_e, dw_f, "conv backward weights (accumulated)");
  const Tensor lx = random_tensor({8, 96}, seed++, -4, 4), lw = random_tensor({40, 96}, seed++);
  const Tensor lb = random_tensor({40}, seed++), ldy = random_tensor({8, 40}, seed++);
  check(be->linear_forward(be->to_plain(lx), be->to_plain(lw), be->to_plain(lb)), emu->linear_forward(lx, lw, lb),
        f32->linear_forward(lx, lw, lb), "linear forward");
  Tensor ldw_c = be->zeros({40, 96}, DType::kF32), ldb_c = be->zeros({40}, DType::kF32);
  Tensor ldw_e = emu->zeros({40, 96}, DType::kF32), ldb_e = emu->zeros({40}, DType::kF32);
  Tensor ldw_f = f32->zeros({40, 96}, DType::kF32), ldb_f = f32->zeros({40}, DType::kF32);
  be->linear_backward_weights(be->to_plain(lx), be->to_plain(ldy), ldw_c, ldb_c, false);
  emu->linear_backward_weights(lx, ldy, ldw_e, ldb_e, false);
  f32->linear_backward_weights(lx, ldy, ldw_f, ldb_f, false);
  check(ldw_c, ldw_e, ldw_f, "linear backward weights");
}

BOOST_AUTO_TEST_SUITE_END()

// Runs everywhere: without a GPU, creating the backend must fail with kUnsupported and a reason.
BOOST_AUTO_TEST_CASE(cuda_backend_reports_why_it_is_unavailable) {
  const auto& probe = cuda_probe();
  if (probe.available) {
    BOOST_TEST_MESSAGE("CUDA device present: backend created");
    return;
  }
  BOOST_TEST_MESSAGE("no CUDA device: " << probe.reason);
  BOOST_TEST((status_of([] { make_backend("cuda"); }) == Status::kUnsupported));
  BOOST_TEST(!probe.reason.empty());
}
