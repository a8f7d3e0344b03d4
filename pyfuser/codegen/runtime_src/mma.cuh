// pyfuser device library: mma.cuh
// Hopper tensor-core matmul pieces: wgmma shared-memory descriptors and the warp group's
// fence / commit / wait, stmatrix (TMA tile stores are tma.cuh's). The wgmma instruction itself takes one
// register operand per accumulator (n / 2 of them for m64nNk16), so codegen prints it per shape
// (codegen/cuda.py `wgmma_helper`). Depends on types.cuh (pack_bf16x2) and tma.cuh (CUtensorMap).

namespace pf {

// Shared-memory matrix descriptor of a K-major operand in 128-byte-swizzled boxes (rows of 64
// 16-bit elements): start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29 (unused
// by swizzled K-major layouts: 1), stride byte offset >> 4 in 32-45 (1024: one group of 8 rows
// of 128 bytes to the next), base offset 0 in 49-51 (boxes start 1024-byte aligned), layout
// type 1 (128-byte swizzle) in 62-63. A step of 16 K elements inside the row adds 32 bytes to
// the start address (the hardware swizzles the full address).
__device__ __forceinline__ unsigned long long wgmma_desc_sw128(unsigned saddr) {
  return static_cast<unsigned long long>((saddr & 0x3FFFF) >> 4) |
         (1ull << 16) | (static_cast<unsigned long long>(1024 >> 4) << 32) | (1ull << 62);
}

// The descriptor of an MN-major operand (B given as a row-major [K, N] matrix) in 128-byte-
// swizzled boxes of 64 N elements x K rows: leading byte offset = the bytes from one 64-wide
// chunk of N to the next (`chunk_bytes`), stride byte offset 1024 (8 K rows of 128 bytes); a K
// step of 16 rows adds 2048 bytes to the address. The wgmma then takes imm-trans-b 1.
__device__ __forceinline__ unsigned long long wgmma_desc_sw128_mn(unsigned saddr,
                                                                  unsigned chunk_bytes) {
  return static_cast<unsigned long long>((saddr & 0x3FFFF) >> 4) |
         (static_cast<unsigned long long>((chunk_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<unsigned long long>(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// ldmatrix.m8n8.x4, stmatrix's inverse: lane l gives the row address of row l % 8 of matrix
// l / 8; register k of lane l receives the 16-bit pair at row l / 4, columns 2 (l % 4) and
// 2 (l % 4) + 1 of matrix k (low half: the first).
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1,
                                            unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
// stmatrix.m8n8.x4: lane l gives the row address of row l % 8 of matrix l / 8; register k of
// lane l is row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (low half first) of matrix k.
__device__ __forceinline__ void stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2,
                                            unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared::cta.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace pf
