// The GCC target attributes of the CPU kernels' x86 paths, each feature set
// defined once and named by what it enables. Internal to kernels/: no other
// file there writes __attribute__((target(...))).
//
// The sets differ on purpose, and a function keeps the set it was written
// for: with "fma" (or any AVX-512 set, whose vector FMAs come with avx512f)
// the compiler may fuse a multiply and an add into one rounding, which would
// change the bits of a path pinned to another (the files named *_nocontract.cc
// are built with -ffp-contract=off for that reason, kernels/CMakeLists.txt).
// A function may inline another only when its own set includes the callee's.
// AMX's tile instructions are inline asm (kernels/cpu/x86/amx_tiles.h): the
// AMX kernels need no AMX attribute.
#pragma once

// ---- AVX2 ------------------------------------------------------------------
// No FMA: every multiply and add rounds as the portable path's (exp_avx2.h,
// simd_sums.h's 8-lane trees, the rowwise, SnapKV and GGUF block AVX2 paths).
#define SNAPSERVE_TARGET_AVX2 __attribute__((target("avx2")))
// Integer AVX2 with the blocks' float16 scales (quant_dot_cpu_avx2_scales.h).
#define SNAPSERVE_TARGET_AVX2_F16C __attribute__((target("avx2,f16c")))
// Float32 dots and the paged attention softmax (linear_cpu.cc, paged_attention_cpu_softmax.h).
#define SNAPSERVE_TARGET_AVX2_FMA __attribute__((target("avx2,fma")))
// AVX2 paths that also read float16 (paged attention rows, the fused decode linear).
#define SNAPSERVE_TARGET_AVX2_FMA_F16C __attribute__((target("avx2,fma,f16c")))

// ---- AVX-512 ---------------------------------------------------------------
// AVX-512 Foundation alone (exp_avx512, silu_mul_avx512, the kv_append, SnapKV,
// int8 quantize and rowwise AVX-512 paths).
#define SNAPSERVE_TARGET_AVX512F __attribute__((target("avx512f")))
// simd_sums.h's 16-lane trees, which end in the 8-lane AVX2 tree.
#define SNAPSERVE_TARGET_AVX512F_AVX2 __attribute__((target("avx512f,avx2")))
// exp_at_most_88_avx512 (exp_avx512.h).
#define SNAPSERVE_TARGET_AVX512F_FMA __attribute__((target("avx512f,fma")))
// The float32 linear's AVX-512 tiles (linear_cpu_avx512.cc).
#define SNAPSERVE_TARGET_AVX512F_AVX2_FMA __attribute__((target("avx512f,avx2,fma")))
// AVX-512 paths that also read float16 (paged attention, the fused decode linear).
#define SNAPSERVE_TARGET_AVX512F_AVX2_FMA_F16C __attribute__((target("avx512f,avx2,fma,f16c")))
// AVX512DQ (vreduceps): the bfloat16-weight exp2 and SwiGLU gate, the prompt
// attention's softmax tile (exp_avx512.h, prefill_attention_cpu_common.h).
#define SNAPSERVE_TARGET_AVX512DQ_FMA __attribute__((target("avx512f,avx512dq,fma")))
// The float32 prompt attention (prefill_attention_cpu_avx512.cc).
#define SNAPSERVE_TARGET_AVX512DQ_AVX2_FMA __attribute__((target("avx512f,avx512dq,avx2,fma")))

// ---- AVX512_BF16 -----------------------------------------------------------
// Rounding rows to bfloat16 (rowwise_cpu_avx512_nocontract.cc).
#define SNAPSERVE_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// The bfloat16 decode linear (linear_cpu_avx512bf16.cc).
#define SNAPSERVE_TARGET_AVX512BF16_AVX2_FMA \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
// The bfloat16 prompt attention and the AMX kernels' vector parts
// (prefill_attention_cpu_avx512bf16.cc, prefill_attention_cpu_amx.cc,
// prefill_gemm_cpu_amx_nocontract.cc).
#define SNAPSERVE_TARGET_AVX512BF16_DQ_AVX2_FMA_F16C \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

// ---- AVX512_VNNI -----------------------------------------------------------
// The int8 prompt GEMM (prefill_gemm_int8_cpu_avx512vnni_nocontract.cc).
#define SNAPSERVE_TARGET_AVX512VNNI_FMA_F16C \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
// The int8 block dot (quant_dot_cpu_avx512vnni_nocontract.cc), which inlines
// quant_dot_cpu_avx2_scales.h's AVX2 helpers.
#define SNAPSERVE_TARGET_AVX512VNNI_AVX2_F16C \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")))
