// The NCCL backend: a communicator over the GPUs of the job, one per process. Buffers are
// device memory (Comm::device() == Device::cuda); every op is enqueued on the CUDA stream
// given at construction, so later work on that stream is ordered after it without any
// host synchronisation, and Work::wait() is only needed when the host must see the result.
//
//  * Bootstrap: over `boot`, a host communicator with the same ranks (the MPI communicator,
//    or the self communicator for a world of one): rank 0 creates the NCCL unique id and
//    broadcasts it, every rank calls ncclCommInitRankConfig on `cuda_device`.
//  * Work: a CUDA event recorded after the op. wait() polls the event, NCCL's asynchronous
//    error state and the communication timeout (comm_timeout_seconds()); on an error or a
//    timeout it aborts the NCCL communicator (ncclCommAbort: the kernels stuck waiting for
//    a dead peer exit) and throws sat::Error naming the rank and op. The communicator is
//    unusable after that; every later op throws.
//  * During CUDA graph capture on the stream, ops are captured into the graph and their
//    Work is complete at once (there is nothing to wait for on the host until the graph
//    runs).
//  * NCCL has no tags (send/recv need tag 0) and a send runs only together with its recv:
//    exchanges where both ranks send use send_recv or p2p (one NCCL group per call).
//  * split(): splits the host communicator `boot` the same way and bootstraps a new NCCL
//    communicator over that part on the same device and stream (the new one owns the host
//    part). `boot` must therefore outlive a communicator that split() is called on. The ops
//    of all those communicators run in the order they were issued on that one stream: a
//    recv waiting for its peer holds up every later op, of any of them.
//  * The communicator is non-blocking (config.blocking = 0) so that no NCCL call can hang
//    the host thread beyond the timeout; every call that answers ncclInProgress is polled
//    to completion before the next.
#pragma once
#include <memory>
#include <string>

#include "dist/comm.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*: no CUDA header needed here

namespace sat::dist {

// Whether this build has the NCCL backend (CUDA backend and NCCL found).
bool have_nccl();

// The GPU of this rank: its local rank on its node (NCCL needs a GPU of its own for every
// rank). Throws sat::Error naming `flag` when there is no usable GPU or the node has more
// ranks than GPUs.
int local_rank_gpu(const std::string& flag);

// Throws sat::Error when the build has no NCCL, or when NCCL fails (naming call, file, line).
std::unique_ptr<Comm> make_nccl_comm(Comm& boot, int cuda_device, CUstream_st* stream);
// The same on a stream of its own (non-blocking, created on cuda_device, destroyed with the
// communicator): for callers that order nothing else after the ops (bench comm).
std::unique_ptr<Comm> make_nccl_comm(Comm& boot, int cuda_device);

}  // namespace sat::dist
