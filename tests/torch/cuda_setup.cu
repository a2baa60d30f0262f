// The nvcc half of the LibTorch GPU tests (see cuda_setup.hpp): the kernels behind
// each engine's device seam are instantiated here.

#include "cuda_setup.hpp"

#include <unison/parallel/device.cuh>
#include <unison/thread/device.cuh>

namespace unison::test::torch_gpu {

template <class Engine>
device_setup<Engine> on_gpu(int dev) {
    return cuda::on_device<Engine>(dev, nullptr);
}

void attach_to_gpu(thread_communicator& comm, int dev) {
    cuda::use_device(comm, dev);
}

template device_setup<ddp_engine<thread_communicator>> on_gpu(int);
template device_setup<fsdp_f32_engine<thread_communicator>> on_gpu(int);
template device_setup<fsdp_f64_engine<thread_communicator>> on_gpu(int);
#if UNISON_TORCH_GPU_NCCL
template device_setup<ddp_engine<nccl_communicator>> on_gpu(int);
template device_setup<fsdp_f32_engine<nccl_communicator>> on_gpu(int);
template device_setup<fsdp_f64_engine<nccl_communicator>> on_gpu(int);
#endif

} // namespace unison::test::torch_gpu
