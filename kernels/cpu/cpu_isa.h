// Which SIMD instruction set the CPU kernels use (linear, SnapKV selection).
//
// Chosen once per process: the widest the CPU supports, optionally capped by
// the environment variable SNAPSERVE_CPU_ISA = portable | avx2 | avx512 |
// avx512vnni, so
// that tests can run every path on one machine and a deployment can pin one.
// A kernel's order of floating-point operations depends on this choice, which
// is why it is made once: every row of every batch then uses the same path.
#pragma once

namespace snapserve::kernels {

enum class CpuIsa {
  kPortable,  // plain C++
  kAvx2,      // AVX2 + FMA + F16C
  kAvx512,    // AVX-512F (+ AVX2 + FMA + F16C)
  // AVX-512F/BW/VL with VNNI (vpdpbusd: u8 x s8 quads summed into int32),
  // Ice Lake and Zen 4 on: the integer block dot of kernels/quant_dot/quant_dot.h.
  kAvx512Vnni,
  // AVX512_BF16 plus Intel's AMX tiles (AMX-TILE, AMX-BF16; Sapphire Rapids
  // on), with the kernel's leave to use them (Linux hands the tile state to a
  // process only on request: arch_prctl ARCH_REQ_XCOMP_PERM, made when the
  // level is chosen): the prompt attention's tdpbf16ps kernel
  // (kernels/prefill_attention/prefill_attention.h).
  kAmx,
};
// Levels are ordered: each has every instruction of the ones before it, so
// `cpu_isa() >= CpuIsa::kAvx512` asks "may this run the AVX-512F path".

CpuIsa cpu_isa();

// Whether the bfloat16 kernels may run: AVX512_BF16 (vdpbf16ps,
// vcvtneps2bf16) in the CPU and cpu_isa() at kAvx512Vnni, so that a
// SNAPSERVE_CPU_ISA cap below that turns them off too (Zen 4 and Sapphire
// Rapids have both; no CPU has AVX512_BF16 without VNNI).
bool has_avx512_bf16();

// Whether the AMX kernels may run: cpu_isa() at kAmx.
bool has_amx_bf16();

// Whether one vdpbf16ps does more multiply-adds per cycle here than float32
// FMAs do: on AMD's AVX512_BF16 CPUs (Zen 4, Zen 5) twice as many; on
// Intel's (Cooper Lake, Sapphire Rapids and later) it issues on one port
// against FMA's two, so a bfloat16 kernel there only adds the roundings.
// bench/attention_kernels.py shows it with the prompt attention kernels
// (bench/results/attention_kernels.json on a Zen 4,
// attention_kernels_spr.json on a Sapphire-Rapids-class Xeon). Read from the
// CPUID vendor; false without has_avx512_bf16().
bool bf16_dot_outpaces_fma();

// "portable", "avx2", "avx512", "avx512vnni" or "amx".
const char* cpu_isa_name(CpuIsa isa);

}  // namespace snapserve::kernels
