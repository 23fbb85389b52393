#pragma once
// Ops between their NCCL call and their completion on the GPU. Each op takes a slot of
// a fixed table (claimed with compare-and-swap: no lock, no allocation on the
// application's thread), gets a CUDA start event before the NCCL call and an end event
// after it on the op's stream, and is ended by a poller thread when cudaEventQuery says
// the end event completed: its duration is the GPU's (cudaEventElapsedTime). The
// stream is never synchronized.
//
// Grouped ops (ncclGroupStart/End) are launched by NCCL at the outermost ncclGroupEnd,
// so their events are recorded around that call. Ops of a non-blocking communicator
// that return ncclInProgress are enqueued later by NCCL: the poller records their end
// event once ncclCommGetAsyncError stops saying ncclInProgress. Ops captured into a
// CUDA graph are not recorded (they do not run at the call).
#include <cstdint>
#include <memory>

#include "hetobs/observe/external_comm.h"
#include "nccl_api.h"
#include "nccl_comm.h"

namespace hetobs {
namespace nccl {

constexpr uint32_t kNoSlot = UINT32_MAX;

// Record the start of `op` on `comm` issued on `stream`; kNoSlot if it is not recorded.
uint32_t beginOp(const std::shared_ptr<NcclComm>& comm, const ExternalOp& op, cudaStream_t stream);
// The NCCL call for the op in `slot` returned `r`.
void afterOp(uint32_t slot, ncclResult_t r);

// ncclGroupStart / ncclGroupEnd bookkeeping (per thread).
void groupStarted();
ncclResult_t groupEnd(ncclResult_t (*realGroupEnd)());

// The comm is being destroyed or aborted: after an abort its unfinished ops fail.
void commClosed(NcclComm& comm, bool aborted);

// At exit: stop the poller (before the CUDA runtime goes away); true if no op was left.
bool stopWatching();

}  // namespace nccl
}  // namespace hetobs
