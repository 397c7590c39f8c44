// The "tandem" torch.distributed backend in C++: a c10d::Backend (PyTorch >= 2.0) whose collectives call Tandem's C
// ABI on the tensors' own memory. Built by tandem/torch.py at first import (torch.utils.cpp_extension) into a cache
// directory per PyTorch version; tandem/torch.py falls back to its Python backend, saying why, when that fails.
//
// Why C++: the Python backend hands every operation to a Python worker thread, so each collective costs two GIL
// handoffs between that thread and autograd's -- milliseconds per call on oversubscribed cores (bench/torch/README.md).
// Here the worker is a plain C++ thread that never takes the GIL.
//
// Threads: the C ABI wants the calls on one communicator serialized, and every rank must issue them in one order, so
// all operations of a group run on one worker thread, in call order. The caller gets a Work whose future completes
// with the operation's output tensors once the worker has run it; DDP's backward keeps computing meanwhile.
//
// The communicator itself (rendezvous, secret, transport) is created by tandem/torch.py through the same library and
// handed over as a handle; Python keeps it alive until it has stopped this backend's worker (stop()).
#include <tandem/tandem.h>

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if !defined(TORCH_VERSION_MAJOR) || TORCH_VERSION_MAJOR < 2
#error "the C++ tandem backend needs PyTorch >= 2.0 (c10d::Backend); tandem/torch.py uses its Python backend on 1.x"
#endif

namespace tandem_torch {

namespace {

std::string tandem_failure(const char* op, tandem_status_t s) {
  return std::string("tandem backend: ") + op + ": " + tandem_status_string(s) + ": " + tandem_last_error_message();
}

tandem_dtype_t dtype_of(const char* op, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return TANDEM_F32;
    case at::kDouble: return TANDEM_F64;
    case at::kHalf: return TANDEM_F16;
    case at::kBFloat16: return TANDEM_BF16;
    case at::kInt: return TANDEM_I32;
    case at::kLong: return TANDEM_I64;
    case at::kByte: return TANDEM_U8;
    default:
      TORCH_CHECK(false, "tandem backend: ", op, ": dtype ", t.scalar_type(), " is not supported (float32/64, "
                  "float16, bfloat16, int32/64, uint8)");
  }
}

tandem_op_t op_of(const char* op, const c10d::ReduceOp& r) {
  switch (r.op_) {
    case c10d::ReduceOp::SUM: return TANDEM_SUM;
    case c10d::ReduceOp::AVG: return TANDEM_AVG;
    case c10d::ReduceOp::MIN: return TANDEM_MIN;
    case c10d::ReduceOp::MAX: return TANDEM_MAX;
    case c10d::ReduceOp::PRODUCT: return TANDEM_PROD;
    default:
      TORCH_CHECK(false, "tandem backend: ", op, ": reduce op ", static_cast<int>(r.op_),
                  " is not supported (sum, avg, min, max, product)");
  }
}

// A tensor's memory as the C ABI wants it; checked on the caller's thread so a bad argument raises there, on every
// rank that passes it, before anything is sent.
struct Buf {
  void* ptr;
  size_t count;
  tandem_dtype_t dtype;
};

Buf buf_of(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "tandem backend: ", op, ": only CPU tensors for now, got one on ", t.device());
  TORCH_CHECK(t.is_contiguous(), "tandem backend: ", op, ": the tensor must be contiguous (shape ", t.sizes(),
              ", stride ", t.strides(), "); call .contiguous() first");
  TORCH_CHECK(!t.is_sparse(), "tandem backend: ", op, ": sparse tensors are not supported");
  return Buf{t.data_ptr(), static_cast<size_t>(t.numel()), dtype_of(op, t)};
}

void check_like(const char* op, const char* what, const at::Tensor& t, const at::Tensor& like, int64_t count) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == count, "tandem backend: ", op, ": ", what,
              " has ", t.numel(), " elements of ", t.scalar_type(), ", expected ", count, " of ", like.scalar_type());
}

}  // namespace

// One operation's handle: completes (its future with the output tensors) once the worker ran it.
class WorkTandem : public c10d::Work {
 public:
  WorkTandem(c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  void complete(std::exception_ptr error) {
    finish(error);  // Work's own state: isCompleted, isSuccess, exception
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }

  bool wait(std::chrono::milliseconds /*timeout*/) override {
    future_->wait();  // Tandem's own deadline (TANDEM_TIMEOUT_MS) bounds every operation
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

class BackendTandem : public c10d::Backend {
 public:
  // comm: a tandem_comm_t* (as an integer, from Python), borrowed until stop().
  BackendTandem(uintptr_t comm, int rank, int size)
      : c10d::Backend(rank, size), comm_(reinterpret_cast<tandem_comm_t*>(comm)), worker_([this] { run(); }) {
    TORCH_CHECK(comm_ != nullptr, "tandem backend: no communicator");
  }

  ~BackendTandem() override { stop(); }

  // Runs what is queued, then joins the worker; later operations raise. Idempotent.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    std::lock_guard<std::mutex> join_lock(join_mutex_);
    if (worker_.joinable()) worker_.join();
  }

  const std::string getBackendName() const override { return "tandem"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const tandem_op_t op = op_of("allreduce", opts.reduceOp);
    std::vector<Buf> bufs;
    for (const auto& t : tensors) bufs.push_back(buf_of("allreduce", t));
    return submit(c10d::OpType::ALLREDUCE, tensors, [this, bufs, op] {
      for (const Buf& b : bufs) call("allreduce", tandem_comm_allreduce(comm_, b.ptr, b.ptr, b.count, b.dtype, op));
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return allreduce(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const auto root = static_cast<int32_t>(opts.rootRank);
    std::vector<Buf> bufs;
    for (const auto& t : tensors) bufs.push_back(buf_of("broadcast", t));
    return submit(c10d::OpType::BROADCAST, tensors, [this, bufs, root] {
      for (const Buf& b : bufs) call("broadcast", tandem_comm_broadcast(comm_, b.ptr, b.count, b.dtype, root));
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    const tandem_op_t op = op_of("reduce", opts.reduceOp);
    const auto root = static_cast<int32_t>(opts.rootRank);
    std::vector<Buf> bufs;
    for (const auto& t : tensors) bufs.push_back(buf_of("reduce", t));
    return submit(c10d::OpType::REDUCE, tensors, [this, bufs, op, root] {
      for (const Buf& b : bufs) call("reduce", tandem_comm_reduce(comm_, b.ptr, b.ptr, b.count, b.dtype, op, root));
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "tandem backend: allgather: ", outputs.size(),
                " output lists for ", inputs.size(), " inputs");
    std::vector<at::Tensor> flats, all_outputs;
    for (size_t k = 0; k < inputs.size(); ++k) {
      TORCH_CHECK(static_cast<int>(outputs[k].size()) == size_, "tandem backend: allgather: ", outputs[k].size(),
                  " output tensors for a group of ", size_);
      for (size_t i = 0; i < outputs[k].size(); ++i) {
        check_like("allgather", ("output " + std::to_string(i)).c_str(), outputs[k][i], inputs[k], inputs[k].numel());
        buf_of("allgather", outputs[k][i]);
        all_outputs.push_back(outputs[k][i]);
      }
      buf_of("allgather", inputs[k]);
      flats.push_back(at::empty({size_ * inputs[k].numel()}, inputs[k].options()));
    }
    return submit(c10d::OpType::ALLGATHER, all_outputs, [this, outputs, inputs, flats] {
      for (size_t k = 0; k < inputs.size(); ++k) {
        const Buf in = buf_of("allgather", inputs[k]);
        call("allgather", tandem_comm_allgather(comm_, in.ptr, flats[k].data_ptr(), in.count, in.dtype));
        for (size_t i = 0; i < outputs[k].size(); ++i)
          outputs[k][i].view({-1}).copy_(flats[k].narrow(0, static_cast<int64_t>(i * in.count), in.count));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    const char* name = "all_gather_into_tensor";
    check_like(name, "the output", output, input, input.numel() * size_);
    const Buf in = buf_of(name, input), out = buf_of(name, output);
    return submit(c10d::OpType::_ALLGATHER_BASE, {output}, [this, in, out, name] {
      call(name, tandem_comm_allgather(comm_, in.ptr, out.ptr, in.count, in.dtype));
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "tandem backend: all_gather_into_tensor_coalesced: ",
                outputs.size(), " outputs for ", inputs.size(), " inputs");
    c10::intrusive_ptr<c10d::Work> last = barrier_if(inputs.empty());
    for (size_t i = 0; i < inputs.size(); ++i) last = _allgather_base(outputs[i], inputs[i], opts);
    return last;  // operations complete in call order: the last one's completion covers all
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const char* name = "reduce_scatter";
    const tandem_op_t op = op_of(name, opts.reduceOp);
    TORCH_CHECK(outputs.size() == inputs.size(), "tandem backend: reduce_scatter: ", outputs.size(),
                " outputs for ", inputs.size(), " input lists");
    std::vector<Buf> outs;
    std::vector<at::Tensor> sends;
    for (size_t k = 0; k < outputs.size(); ++k) {
      TORCH_CHECK(static_cast<int>(inputs[k].size()) == size_, "tandem backend: reduce_scatter: ", inputs[k].size(),
                  " input tensors for a group of ", size_);
      for (size_t i = 0; i < inputs[k].size(); ++i)
        check_like(name, ("input " + std::to_string(i)).c_str(), inputs[k][i], outputs[k], outputs[k].numel());
      outs.push_back(buf_of(name, outputs[k]));
      std::vector<at::Tensor> flat;
      for (const auto& t : inputs[k]) flat.push_back(t.reshape({-1}));
      sends.push_back(at::cat(flat));  // the copy Tandem's one-buffer reduce_scatter needs
    }
    return submit(c10d::OpType::REDUCE_SCATTER, outputs, [this, outs, sends, op, name] {
      for (size_t k = 0; k < outs.size(); ++k)
        call(name, tandem_comm_reduce_scatter(comm_, sends[k].data_ptr(), outs[k].ptr, outs[k].count, outs[k].dtype,
                                              op));
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    const char* name = "reduce_scatter_tensor";
    const tandem_op_t op = op_of(name, opts.reduceOp);
    check_like(name, "the input", input, output, output.numel() * size_);
    const Buf in = buf_of(name, input), out = buf_of(name, output);
    return submit(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [this, in, out, op, name] {
      call(name, tandem_comm_reduce_scatter(comm_, in.ptr, out.ptr, out.count, out.dtype, op));
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "tandem backend: reduce_scatter_tensor_coalesced: ",
                outputs.size(), " outputs for ", inputs.size(), " inputs");
    c10::intrusive_ptr<c10d::Work> last = barrier_if(inputs.empty());
    for (size_t i = 0; i < inputs.size(); ++i) last = _reduce_scatter_base(outputs[i], inputs[i], opts);
    return last;
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    return submit(c10d::OpType::BARRIER, {}, [this] { call("barrier", tandem_comm_barrier(comm_)); });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    std::vector<Buf> bufs;
    for (const auto& t : tensors) bufs.push_back(buf_of("send", t));
    return submit(c10d::OpType::SEND, tensors, [this, bufs, dst, tag] {
      for (const Buf& b : bufs)
        call("send", tandem_comm_send(comm_, b.ptr, b.count, b.dtype, dst, static_cast<uint32_t>(tag)));
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    std::vector<Buf> bufs;
    for (const auto& t : tensors) bufs.push_back(buf_of("recv", t));
    return submit(c10d::OpType::RECV, tensors, [this, bufs, src, tag] {
      for (const Buf& b : bufs)
        call("recv", tandem_comm_recv(comm_, b.ptr, b.count, b.dtype, src, static_cast<uint32_t>(tag)));
    });
  }

  // What Tandem's C ABI does not offer: a clear error on every rank (each rank calls them), never a hang.
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                                        const c10d::GatherOptions&) override {
    unsupported("gather");
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
                                         const c10d::ScatterOptions&) override {
    unsupported("scatter");
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&,
                                               std::vector<int64_t>&, const c10d::AllToAllOptions&) override {
    unsupported("all_to_all_single");
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>&, std::vector<at::Tensor>&,
                                          const c10d::AllToAllOptions&) override {
    unsupported("all_to_all");
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    unsupported("recv from any source");
  }

 private:
  [[noreturn]] static void unsupported(const char* name) {
    TORCH_CHECK(false, "tandem backend: ", name, " is not supported (allreduce, broadcast, allgather, reduce, "
                "reduce_scatter, barrier, send, recv are)");
  }

  static void call(const char* op, tandem_status_t s) {
    if (s != TANDEM_OK) throw std::runtime_error(tandem_failure(op, s));
  }

  c10::intrusive_ptr<c10d::Work> barrier_if(bool needed) {
    return needed ? barrier(c10d::BarrierOptions()) : c10::intrusive_ptr<c10d::Work>();
  }

  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::vector<at::Tensor> outputs,
                                        std::function<void()> fn) {
    auto work = c10::make_intrusive<WorkTandem>(type, std::move(outputs));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(!stopping_, "tandem backend: ", c10d::opTypeToString(type), ": the process group was shut down");
      queue_.emplace_back(std::move(fn), work);
    }
    cv_.notify_one();
    return work;
  }

  void run() {
    for (;;) {
      std::pair<std::function<void()>, c10::intrusive_ptr<WorkTandem>> item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything queued has run
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        item.first();
      } catch (...) {
        error = std::current_exception();
      }
      item.second->complete(error);
    }
  }

  tandem_comm_t* comm_;
  std::mutex mutex_;  // guards queue_ and stopping_
  std::mutex join_mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, c10::intrusive_ptr<WorkTandem>>> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts once the members above exist
};

}  // namespace tandem_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  py::module_::import("torch.distributed");  // registers c10d::Backend with pybind11 first
  py::class_<tandem_torch::BackendTandem, c10d::Backend, c10::intrusive_ptr<tandem_torch::BackendTandem>>(
      m, "BackendTandem")
      .def(py::init<uintptr_t, int, int>(), py::arg("comm"), py::arg("rank"), py::arg("size"))
      .def("stop", &tandem_torch::BackendTandem::stop, py::call_guard<py::gil_scoped_release>(),
           "Runs what is queued, then joins the worker thread; the communicator may be destroyed afterwards.");
}
