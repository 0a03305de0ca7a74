// The element types every kernel family is built for, as one list: the launchers' explicit
// instantiations (.cu) and their extern declarations (.h) expand it, so adding a type is one edit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Expands X(T, ...) for T = float, __nv_bfloat16, __half; the extra arguments are passed through
// (e.g. `extern` for the declarations, nothing for the instantiations).
#define JAXCNN_FOR_EACH_FLOAT_TYPE(X, ...) \
  X(float, __VA_ARGS__)                    \
  X(__nv_bfloat16, __VA_ARGS__)            \
  X(__half, __VA_ARGS__)

// An elementwise-shaped launcher `name`<T>(x, y, params, stream) (pooling, softmax) for element
// type T: `prefix` is `extern` in the declaration, empty in the instantiation.
#define JAXCNN_XY_LAUNCHER_OF(T, prefix, name, Params) \
  prefix template cudaError_t name<T>(const T*, T*, const Params&, cudaStream_t);

// Declares the launcher template `name`<T>(x, y, params, stream) and its extern instantiations
// for every float type; the family's .cu defines it and expands JAXCNN_XY_LAUNCHER_INSTANTIATE.
#define JAXCNN_XY_LAUNCHER_DECLARE(name, Params)                                    \
  template <typename T>                                                             \
  cudaError_t name(const T* x, T* y, const Params& params, cudaStream_t stream);    \
  JAXCNN_FOR_EACH_FLOAT_TYPE(JAXCNN_XY_LAUNCHER_OF, extern, name, Params)

#define JAXCNN_XY_LAUNCHER_INSTANTIATE(name, Params) \
  JAXCNN_FOR_EACH_FLOAT_TYPE(JAXCNN_XY_LAUNCHER_OF, , name, Params)
