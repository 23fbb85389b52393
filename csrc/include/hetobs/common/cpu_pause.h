#pragma once
// HETOBS_PAUSE(): the CPU's spin-wait hint (x86 PAUSE), for the short spins before a thread
// sleeps; it lets the sibling hyperthread run and saves power. A no-op elsewhere.
#if defined(__x86_64__)
#include <immintrin.h>
#define HETOBS_PAUSE() _mm_pause()
#else
#define HETOBS_PAUSE() \
  do {                 \
  } while (0)
#endif
