#pragma once
// Element-wise reduction kernels for every (dtype, op). Vectorised by the compiler;
// on x86-64 a second clone for x86-64-v3 (AVX2, F16C) is chosen at load time.
#include <cstddef>

#include "hetobs/common/wire.h"

namespace hetobs {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b. kAvg reduces as kSum;
// the caller divides once at the end (scaleByInverse).
void reduceInto(DType dtype, RedOp op, void* dst, const void* a, const void* b, size_t count);

// x[i] /= divisor (floating dtypes only; avg's final step).
void divideBy(DType dtype, void* x, size_t count, double divisor);

}  // namespace hetobs
