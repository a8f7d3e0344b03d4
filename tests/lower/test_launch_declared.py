"""Launches declared by lowering: the kernel's launch description and shared memory are
complete after lowering; codegen only prints."""
from kir_testing import lowered_inner_persistent

from pyfuser.codegen.cuda import generate_cuda


def test_lowering_states_shared_memory_and_codegen_only_prints():
    """Shared-memory sizes and offsets are decided by lowering; printing CUDA changes nothing
    in the kernel (it used to lay shared memory out and write the size back)."""
    *_, kernel = lowered_inner_persistent("rmsnorm_fwd", 64, 1024, "bf16",
                                          "tma_inner_persistent")
    assert kernel.launch.shared_mem_dynamic > 0 and kernel.smem_offsets
    desc = kernel.launch_description
    assert desc.shared_mem_bytes == kernel.launch.shared_mem_dynamic
    before = (kernel.launch.shared_mem_dynamic, dict(kernel.smem_offsets), desc)
    src = generate_cuda(kernel)
    assert "extern __shared__" in src
    assert (kernel.launch.shared_mem_dynamic, kernel.smem_offsets,
            kernel.launch_description) == before
