#pragma once
// cuDNN and cuBLAS are loaded with dlopen when the first CUDA backend is created, not linked:
// linking them costs every process ~0.9 s of start-up and ~200 MB of resident memory even when
// it never touches a GPU (measured here), and would make libtandem unloadable on machines
// without them. The CUDA runtime is linked statically (it costs nothing until called).
#include <cublas_v2.h>
#include <cudnn.h>

namespace tandem::engine::compute::cuda {

#define TANDEM_CUDNN_FUNCTIONS(X)                                                                   \
  X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream) X(cudnnGetErrorString) X(cudnnGetVersion)         \
  X(cudnnCreateTensorDescriptor) X(cudnnDestroyTensorDescriptor) X(cudnnSetTensor4dDescriptor)       \
  X(cudnnCreateFilterDescriptor) X(cudnnDestroyFilterDescriptor) X(cudnnSetFilter4dDescriptor)       \
  X(cudnnCreateConvolutionDescriptor) X(cudnnDestroyConvolutionDescriptor)                           \
  X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionGroupCount) X(cudnnSetConvolutionMathType) \
  X(cudnnGetConvolutionForwardAlgorithm_v7) X(cudnnGetConvolutionBackwardDataAlgorithm_v7)           \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7) X(cudnnGetConvolutionForwardWorkspaceSize)        \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize) X(cudnnGetConvolutionBackwardFilterWorkspaceSize)  \
  X(cudnnConvolutionForward) X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)

#define TANDEM_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasSetStream_v2) X(cublasSgemm_v2) X(cublasSetMathMode)

struct CudaLibs {
#define TANDEM_DECLARE_FN(name) decltype(&::name) name = nullptr;
  TANDEM_CUDNN_FUNCTIONS(TANDEM_DECLARE_FN)
  TANDEM_CUBLAS_FUNCTIONS(TANDEM_DECLARE_FN)
#undef TANDEM_DECLARE_FN
  // cublasGemmEx is overloaded in C++ (cublasComputeType_t or, older, cudaDataType): the compute-type form.
  cublasStatus_t (*cublasGemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                 const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                 cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;

  // Loads both libraries once per process; throws kUnsupported naming the library and the
  // loader's reason when one is missing.
  static const CudaLibs& get();
};

}  // namespace tandem::engine::compute::cuda
