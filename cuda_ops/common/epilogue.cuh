// The conv epilogue shared by every conv kernel family:
//   y = activation(acc + bias[k] + residual[n,p,q,k])   in fp32, one rounding to the output type.
// The codes are jaxcnn/ops/epilogue.py's ACTIVATION_CODES (tests/ops/test_epilogue_codes.py checks that
// the two tables agree); the math is jax.nn's.
#pragma once

#include <cstdint>

namespace jaxcnn {

enum class Activation : int {
  kNone = 0,
  kRelu = 1,
  kRelu6 = 2,
  kSilu = 3,       // x * sigmoid(x)
  kHardSwish = 4,  // x * relu6(x + 3) / 6
  kGeluTanh = 5,   // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  kGeluErf = 6,    // 0.5 x (1 + erf(x / sqrt(2)))
  kSigmoid = 7,
  kLeakyRelu = 8,  // x >= 0 ? x : alpha x
};
constexpr int kNumActivations = 9;

// The activation and its one parameter, as the kernels take them.
struct EpilogueActivation {
  Activation act = Activation::kNone;
  float alpha = 0.0f;  // leaky_relu's negative slope
};

inline bool ValidActivationCode(int64_t code) { return code >= 0 && code < kNumActivations; }

#if defined(__CUDACC__)
// ReLU-like clamps compare with `v < 0` rather than fmaxf so NaN passes like jnp.maximum.
__host__ __device__ __forceinline__ float ApplyActivation(Activation act, float v, float alpha) {
  switch (act) {
    case Activation::kNone:
      return v;
    case Activation::kRelu:
      return v < 0.0f ? 0.0f : v;
    case Activation::kRelu6:
      return v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v);
    case Activation::kSilu:
      return v / (1.0f + expf(-v));
    case Activation::kHardSwish: {
      float t = v + 3.0f;
      t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
      return v * t * (1.0f / 6.0f);
    }
    case Activation::kGeluTanh: {
      const float k = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
    case Activation::kGeluErf:
      return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    case Activation::kSigmoid:
      return 1.0f / (1.0f + expf(-v));
    case Activation::kLeakyRelu:
      return v >= 0.0f ? v : alpha * v;
  }
  return v;
}

__host__ __device__ __forceinline__ float ApplyActivation(const EpilogueActivation& e, float v) {
  return ApplyActivation(e.act, v, e.alpha);
}
#endif

}  // namespace jaxcnn
