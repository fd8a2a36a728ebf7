/* kptc's usage texts: the whole one (kptc --help) and each command's (kptc COMMAND --help),
 * built from one copy of each command's lines. */
#include "tools/kptc/kptc.h"

#define PATTERN_NOTE \
    "PATTERN is a built-in pattern string, e.g. 'causal', 'sliding_window(1024)',\n" \
    "'document+causal+softcap(30)', 'sliding_window($w=256)' (docs/patterns.md), or a Lua\n" \
    "pattern script: a path ending in .lua (docs/lua.md, examples/patterns/).\n"

#define PARAM_NOTE \
    "  --param NAME=VALUE  (emit, check, bundle) set a param of a Lua script (repeatable)\n"

#define PATTERNS_LINE "  patterns            list the built-in pattern terms\n"
#define EMIT_LINE "  emit                compile PATTERN and print it\n"
#define CHECK_LINE "  check               run PATTERN on random inputs and check the result\n"
#define BUNDLE_LINE "  bundle              pregenerate kernels into one file the runtime preloads\n"

#define EMIT_OPTIONS \
    "      --emit ir|cuda|ptx|cubin|glsl|spirv|hip|hsaco  what to print: the IR; the CUDA\n" \
    "                                kernel as source, PTX or CUBIN (NVRTC); the Vulkan kernel\n" \
    "                                as GLSL or SPIR-V (validated); the AMD kernel as HIP or a\n" \
    "                                code object (hipRTC, else clang); binaries only to a file\n" \
    "                                or pipe\n" \
    "      --dump-after STAGE        print the IR after STAGE: parse, opt_fold, opt_simplify, " \
    "all\n" \
    "      --target T                cuda:sm_80 (default for cuda), cuda:sm_86, cuda:sm_89,\n" \
    "                                cuda:sm_90 (mma.sync); cuda:sm_90a (Hopper: TMA, wgmma);\n" \
    "                                spirv (default for glsl and spirv);\n" \
    "                                hip:gfx90a (default for hip), hip:gfx940, hip:gfx942;\n" \
    "                                spirv:coopmat (Vulkan, cooperative-matrix kernel)\n" \
    "      --head-dim D[,Dv]         head dims (default 128): 32, 64, 96, 128, 256 (CUDA, HIP);\n" \
    "                                1 to 256 (spirv)\n" \
    "      --dtype T                 input dtype of the kernel: f16 or bf16 (CUDA and HIP,\n" \
    "                                default bf16); f16, bf16 or f32 (spirv, default f16)\n" \
    "      --smem BYTES              spirv: the device's shared memory (default 32768; 49152\n" \
    "                                for spirv:coopmat); portable kernels use at most 32768\n" \
    "      --blockmap                spirv: print the block-map kernel's SPIR-V instead\n" \
    "      --paged                   the serving kernels (paged KV, ragged batches, split-KV\n" \
    "                                decode; CUDA targets)\n" \
    "      --backward                the backward kernels (gradients; CUDA targets)\n" \
    "      --tall                    cuda:sm_90a, masked forward, head dims up to 64: the\n" \
    "                                variant of 192-row q tiles the runtime takes for long\n" \
    "                                sequences\n" \
    "      --verbose                 print the compiler's time and log (ptxas's register/spill\n" \
    "                                report for CUDA) to stderr\n" \
    "      -o FILE                   write to FILE instead of stdout (binaries too)\n"

#define CHECK_OPTIONS \
    "      --backend cpu|cuda|hip|vulkan  cpu: the double-precision reference only (default);\n" \
    "                                the others: also that backend's kernel on this machine,\n" \
    "                                compared with it\n" \
    "      --shape B,Hq,Hkv,Sq,Skv,Dqk[,Dv]   default 1,4,2,512,512,64\n" \
    "      --dtype f16|bf16|f32      input dtype (default bf16)\n" \
    "      --layout bhsd|bshd        memory layout of q, k, v, o (default bhsd)\n" \
    "      --seed N                  random seed (default 1)\n" \
    "      --scalar NAME=VALUE       value of a runtime scalar $NAME (repeatable)\n" \
    "      --aux NAME=FILE.npy       data of an aux tensor (repeatable; default: generated)\n" \
    "      --tile QxK                tile size for the mask-analysis report (default 64x64)\n" \
    "      --save DIR                write q, k, v, o, lse and the aux tensors there as .npy\n" \
    "                                (f64, [B, H, S, D] order whatever the layout)\n" \
    "      --backward                also the gradients for a random dO: on cpu the reference's\n" \
    "                                against finite differences of the reference forward; on\n" \
    "                                cuda the backward kernels' against the reference (run\n" \
    "                                twice: the bits must repeat)\n" \
    "      --page-size N             serving mode (docs/serving.md): a ragged batch over a KV\n" \
    "                                cache of N-row pages (1 to 256; 0: contiguous cache),\n" \
    "                                shuffled; --shape gives Hq, Hkv and D\n" \
    "      --seqlens Q:KV[,Q:KV...]  serving mode: each sequence's queries and keys (default\n" \
    "                                1:1000,4:3000,0:17,16:700; page size default 16)\n" \
    "      --sinks                   a random sink logit per query head: serving mode, or\n" \
    "                                with --backward the dense shape (dsinks checked too)\n"

#define BUNDLE_OPTIONS \
    "      -o FILE                   the bundle to write (required)\n" \
    "      --target T[,T...]         cuda:sm_80, cuda:sm_86, cuda:sm_89, cuda:sm_90,\n" \
    "                                cuda:sm_90a (what H100 contexts run by default),\n" \
    "                                hip:gfx90a, hip:gfx940, hip:gfx942, spirv (required)\n" \
    "      --head-dim D[:Dv][,...]   head dims (default 64,128); 128:64 is Dqk 128, Dv 64\n" \
    "      --dtype T[,T...]          f16, bf16, f32 (spirv) (default bf16,f16; spirv f32,f16)\n" \
    "      -j N                      compile with N threads (default: the CPUs online)\n" \
    "      (several PATTERNs may be given)\n"

#define COMMAND_HELP(synopsis, line, options) \
    "usage: " synopsis "\n" line options PARAM_NOTE "\n" PATTERN_NOTE

const char kptc_usage_patterns[] =
    "usage: kptc patterns\n" PATTERNS_LINE "\nCompose terms with '+'; see docs/patterns.md.\n";
const char kptc_usage_emit[] = COMMAND_HELP("kptc emit [options] PATTERN", EMIT_LINE, EMIT_OPTIONS);
const char kptc_usage_check[] =
    COMMAND_HELP("kptc check [options] PATTERN", CHECK_LINE, CHECK_OPTIONS);
const char kptc_usage_bundle[] = COMMAND_HELP(
    "kptc bundle -o FILE --target T[,T...] [options] PATTERN...", BUNDLE_LINE, BUNDLE_OPTIONS);

const char kptc_usage[] =
    "usage: kptc <command> [options] PATTERN...\n"
    "\n"
    "commands:\n"
    PATTERNS_LINE
    EMIT_LINE EMIT_OPTIONS
    CHECK_LINE CHECK_OPTIONS
    BUNDLE_LINE BUNDLE_OPTIONS
    PARAM_NOTE
    "\n"
    "  --help, -h          this text (COMMAND --help: that command's)    --version   kpt's "
    "version\n"
    "\n"
    PATTERN_NOTE;
