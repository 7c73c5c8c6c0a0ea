/* The matrix engine (AMX). Its tile data is an extended state Linux gives a process only when asked
   (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA; Linux 5.16 and later): a tile instruction before that
   dies with SIGILL, whatever the CPU flags say. The permission covers every thread of the process and its forks, so
   the library asks once, when it is registered, and its kernels run their AMX tiles only when it was granted; else
   the dot-product tiles the library also carries. The request fails with EINVAL on older kernels, ENOSPC when a
   thread's signal stack is too small for the tile state (Python's faulthandler installs one), EPERM or EOPNOTSUPP
   where it is not allowed. onnxopt_amx_status() tells the loader which (runtime/matrix_engine.py).
   ONNXOPT_AMX=0 in the environment leaves the engine unused (to compare the two kinds of tiles). */
extern const int onnxopt_uses_amx; /* the library's kernels carry AMX tiles: 1, or emulated ones (tests): 2 */

enum { AMX_NOT_ASKED = 0, AMX_GRANTED = 1, AMX_EMULATED = 2, AMX_NO_CPU = -1000, AMX_TURNED_OFF = -1001 };
static int g_amx_state; /* one of the above, or -errno of the refused request */
enum { AMX_INT8 = 1, AMX_BF16 = 2, AMX_FP16 = 4 };
static int g_amx_units; /* the CPU's tile instructions: AMX_INT8 | AMX_BF16 | AMX_FP16 (all of them when emulated) */
extern const int onnxopt_amx_units_used; /* the units the library's tiles run on (library.py amx_units) */

/* Whether tiles using `units` (AMX_INT8, AMX_BF16) may run in this process. */
static int amx_ok(int units) {
  int state = __atomic_load_n(&g_amx_state, __ATOMIC_ACQUIRE);
  return (state == AMX_GRANTED || state == AMX_EMULATED) && (g_amx_units & units) == units;
}

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <errno.h>
long syscall(long number, ...); /* unistd.h declares it only outside strict C11 */

/* CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8, bit 22 AMX-BF16; sub-leaf 1: EAX bit 21 AMX-FP16 (read
   directly: older compilers' __builtin_cpu_supports does not know AMX's names). The units the CPU has, 0 without
   AMX-TILE. */
static int amx_cpu(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1)) return 0;
  int units = (d >> 25 & 1 ? AMX_INT8 : 0) | (d >> 22 & 1 ? AMX_BF16 : 0);
  if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 21 & 1)) units |= AMX_FP16;
  return units;
}
#define ONNXOPT_SYS_ARCH_PRCTL 158
#define ONNXOPT_ARCH_REQ_XCOMP_PERM 0x1023
#define ONNXOPT_XFEATURE_XTILEDATA 18

static void amx_request(void) {
  if (!onnxopt_uses_amx || __atomic_load_n(&g_amx_state, __ATOMIC_ACQUIRE) != AMX_NOT_ASKED) return;
  int state;
  const char *env = getenv("ONNXOPT_AMX");
  if (env && env[0] == '0' && env[1] == 0) {
    state = AMX_TURNED_OFF;
  } else if (onnxopt_uses_amx == 2) {
    state = AMX_EMULATED; /* plain code: nothing to ask of the CPU or the OS */
    g_amx_units = AMX_INT8 | AMX_BF16 | AMX_FP16;
  } else if (!(g_amx_units = amx_cpu())) {
    state = AMX_NO_CPU;
  } else {
    errno = 0;
    state = syscall(ONNXOPT_SYS_ARCH_PRCTL, ONNXOPT_ARCH_REQ_XCOMP_PERM, ONNXOPT_XFEATURE_XTILEDATA) == 0 ? AMX_GRANTED
                                                                                                        : -errno;
  }
  __atomic_store_n(&g_amx_state, state, __ATOMIC_RELEASE);
}
#else
static void amx_request(void) {
  if (onnxopt_uses_amx == 2) g_amx_units = AMX_INT8 | AMX_BF16 | AMX_FP16;
  if (onnxopt_uses_amx)
    __atomic_store_n(&g_amx_state, onnxopt_uses_amx == 2 ? AMX_EMULATED : AMX_NO_CPU, __ATOMIC_RELEASE);
}
#endif

/* 0: the library has no AMX tiles (or no session registered it yet); 1: granted, they run; 2: emulated tiles (tests)
   run; -1000: this CPU has no AMX; -1001: ONNXOPT_AMX=0; else -errno of the kernel's refusal. */
__attribute__((visibility("default"))) int onnxopt_amx_status(void) {
  return __atomic_load_n(&g_amx_state, __ATOMIC_ACQUIRE);
}

/* The units the library's tiles run on (bits 0-2) and those this CPU has (bits 8-10, all of them when emulated; none
   before a session registered the library or with ONNXOPT_AMX=0): a kernel whose unit the CPU lacks runs its
   dot-product tiles even where the tile state was granted, and the loader says so (runtime/matrix_engine.py). */
__attribute__((visibility("default"))) int onnxopt_amx_units(void) {
  int state = __atomic_load_n(&g_amx_state, __ATOMIC_ACQUIRE);
  return onnxopt_amx_units_used | (state == AMX_GRANTED || state == AMX_EMULATED ? g_amx_units : 0) << 8;
}

/* The bfloat16 GEMM and convolution tiles (codegen/compute/amx_tile.py, amx_conv_tile.py) name their registers and
   load no configuration of their own: the task loads this one (palette 1, all eight tiles 16 rows of 64 bytes) once before its calls and releases
   it after them. With LLVM's configuration at every call, `ldtilecfg` took 9% of the tile function and 15% of a
   call over 256 of K. Only where the tiles are real: emulated ones are plain code. */
#if defined(__x86_64__) && defined(__GNUC__)
static int amx_tiles_configure(void) {
  if (__atomic_load_n(&g_amx_state, __ATOMIC_ACQUIRE) != AMX_GRANTED) return 0;
  static const unsigned char cfg[64] __attribute__((aligned(64))) = {
      1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,      /* palette 1, start row 0 */
      64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, /* bytes a row, tiles 0-7 */
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,      /* tiles 8-15: none */
      16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0}; /* rows */
  __asm__ volatile("ldtilecfg %0" ::"m"(*(const unsigned char(*)[64])cfg));
  return 1;
}
static void amx_tiles_release(int configured) {
  if (configured) __asm__ volatile("tilerelease" ::: "memory");
}
#else
static int amx_tiles_configure(void) { return 0; }
static void amx_tiles_release(int configured) { (void)configured; }
#endif
