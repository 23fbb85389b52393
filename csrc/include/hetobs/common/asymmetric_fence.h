#pragma once
// Asymmetric fences (membarrier(2)) for a Dekker-style handshake whose two sides run at
// very different rates: a producer looks for a sleeping consumer after every message it
// publishes, a consumer announces itself only when it is about to sleep. Each side needs a
// full fence between its store and its load. The producer's (mfence on x86) waits for the
// published line to reach the consumer's core: ~100 ns of an 8 B all_reduce at 2 ranks, in
// every message. With these, the producer's becomes a compiler barrier and the consumer pays
// one membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) per sleep instead, which runs a full fence
// on every CPU running a process registered for it (liburcu and folly use the same pair).
namespace hetobs {

// Whether this process is registered for global expedited membarriers and the kernel runs
// them (registered on first call; false where the kernel or a seccomp filter refuses).
bool asymmetricFencesAvailable();

// The consumer's side: a full fence on every CPU running a registered process, this one
// included; a plain full fence where membarriers are unavailable.
void heavyFence();

}  // namespace hetobs
