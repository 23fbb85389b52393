#include "hetobs/collectives/reduce_kernels.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hetobs/common/error.h"

// Not in sanitizer builds: the clones' ifunc resolvers run before the sanitizer runtime is up.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(HETOBS_SANITIZED)
#define HETOBS_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HETOBS_CLONES
#endif

namespace hetobs {
namespace {

// bfloat16 is the top half of a float32; converting back rounds to nearest even.
inline float bf16ToFloat(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint16_t floatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

struct Sum { template <class T> static T apply(T a, T b) { return T(a + b); } };
struct Prod { template <class T> static T apply(T a, T b) { return T(a * b); } };
struct Min { template <class T> static T apply(T a, T b) { return b < a ? b : a; } };
struct Max { template <class T> static T apply(T a, T b) { return a < b ? b : a; } };

template <class T, class Op>
HETOBS_CLONES void loop(T* __restrict dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

template <class Op>
HETOBS_CLONES void loopHalf(_Float16* dst, const _Float16* a, const _Float16* b, size_t n) {
  // Compute in float and round once per step, as numpy does for float16.
  for (size_t i = 0; i < n; ++i) dst[i] = _Float16(Op::apply(float(a[i]), float(b[i])));
}

template <class Op>
HETOBS_CLONES void loopBf16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = floatToBf16(Op::apply(bf16ToFloat(a[i]), bf16ToFloat(b[i])));
}

template <class Op>
void dispatch(DType t, void* dst, const void* a, const void* b, size_t n) {
  switch (t) {
    case DType::kInt8: {
      // Integer wrap-around as numpy does; compute in unsigned to avoid UB.
      auto* d = static_cast<int8_t*>(dst);
      auto* x = static_cast<const int8_t*>(a);
      auto* y = static_cast<const int8_t*>(b);
      for (size_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<Op, Sum>) d[i] = int8_t(uint8_t(x[i]) + uint8_t(y[i]));
        else if constexpr (std::is_same_v<Op, Prod>) d[i] = int8_t(uint8_t(x[i]) * uint8_t(y[i]));
        else d[i] = Op::apply(x[i], y[i]);
      }
      return;
    }
    case DType::kUint8:
      return loop<uint8_t, Op>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                               static_cast<const uint8_t*>(b), n);
    case DType::kInt32: {
      if constexpr (std::is_same_v<Op, Sum> || std::is_same_v<Op, Prod>)
        return loop<uint32_t, Op>(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(a),
                                  static_cast<const uint32_t*>(b), n);
      else
        return loop<int32_t, Op>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                                 static_cast<const int32_t*>(b), n);
    }
    case DType::kInt64: {
      if constexpr (std::is_same_v<Op, Sum> || std::is_same_v<Op, Prod>)
        return loop<uint64_t, Op>(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(a),
                                  static_cast<const uint64_t*>(b), n);
      else
        return loop<int64_t, Op>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                                 static_cast<const int64_t*>(b), n);
    }
    case DType::kFloat16:
      return loopHalf<Op>(static_cast<_Float16*>(dst), static_cast<const _Float16*>(a),
                          static_cast<const _Float16*>(b), n);
    case DType::kBFloat16:
      return loopBf16<Op>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                          static_cast<const uint16_t*>(b), n);
    case DType::kFloat32:
      return loop<float, Op>(static_cast<float*>(dst), static_cast<const float*>(a),
                             static_cast<const float*>(b), n);
    case DType::kFloat64:
      return loop<double, Op>(static_cast<double*>(dst), static_cast<const double*>(a),
                              static_cast<const double*>(b), n);
    default:
      throw Error(strFormat("reduce: invalid dtype code %d", int(t)));
  }
}

}  // namespace

void reduceInto(DType dtype, RedOp op, void* dst, const void* a, const void* b, size_t count) {
  if (count == 0) return;
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return dispatch<Sum>(dtype, dst, a, b, count);
    case RedOp::kProd:
      return dispatch<Prod>(dtype, dst, a, b, count);
    case RedOp::kMin:
      return dispatch<Min>(dtype, dst, a, b, count);
    case RedOp::kMax:
      return dispatch<Max>(dtype, dst, a, b, count);
    default:
      throw Error(strFormat("reduce: invalid reduction code %d", int(op)));
  }
}

void divideBy(DType dtype, void* x, size_t n, double divisor) {
  switch (dtype) {
    case DType::kFloat16: {
      auto* p = static_cast<_Float16*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = _Float16(float(p[i]) / float(divisor));
      return;
    }
    case DType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = floatToBf16(bf16ToFloat(p[i]) / float(divisor));
      return;
    }
    case DType::kFloat32: {
      auto* p = static_cast<float*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = p[i] / float(divisor);
      return;
    }
    case DType::kFloat64: {
      auto* p = static_cast<double*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = p[i] / divisor;
      return;
    }
    default:
      throw Error(strFormat("avg needs a floating dtype, got %s", dtypeName(dtype)));
  }
}

}  // namespace hetobs
