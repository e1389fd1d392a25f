"""cuda_library: .cu files compiled by nvcc into a static archive.

Architectures: SASS for sm_80 (A100) and sm_90 (H100, H200), and compute_90 PTX embedded, which
the driver JIT-compiles for newer GPUs (Blackwell: sm_100, sm_120) on first load.

Without a CUDA toolkit the `fallback_srcs` (CPU code that reports "no CUDA") are built
instead, so every target still builds on CPU-only machines.

  cu_hdrs:    headers the .cu files include that are not in `hdrs` (tracked for rebuilds)
  nvcc_copts: extra nvcc flags, e.g. ["-fmad=false"] for results that must match the CPU
"""

load("@local_cuda//:defs.bzl", "HAVE_CUDA", "NVCC")

CUDA_ARCH_FLAGS = ("-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 " +
                   "-gencode arch=compute_90,code=compute_90")

def cuda_library(name, cu_srcs, hdrs = [], fallback_srcs = [], deps = [], cu_hdrs = [], nvcc_copts = [], **kwargs):
    if not HAVE_CUDA:
        native.cc_library(
            name = name,
            srcs = fallback_srcs,
            hdrs = hdrs,
            deps = deps,
            **kwargs
        )
        return
    archive = name + "_cu.a"
    objs = []
    cmds = []
    for src in cu_srcs:
        obj = "$(@D)/" + name + "_" + src.replace("/", "_").replace(".cu", ".o")
        objs.append(obj)
        cmds.append(
            "{nvcc} -std=c++17 -O3 {arch} {copts} -Xcompiler -fPIC -I. -I$(GENDIR) -isystem external/local_cuda/include -DWB_HAVE_CUDA=1 -c $(location {src}) -o {obj}".format(
                nvcc = NVCC,
                arch = CUDA_ARCH_FLAGS,
                copts = " ".join(nvcc_copts),
                src = src,
                obj = obj,
            ),
        )
    cmds.append("ar rcs $@ " + " ".join(objs))
    native.genrule(
        name = name + "_nvcc",
        srcs = cu_srcs + hdrs + cu_hdrs,
        outs = [archive],
        cmd = " && ".join(cmds),
        tags = ["no-sandbox"],
    )
    native.cc_library(
        name = name,
        srcs = [archive],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_runtime"],
        alwayslink = 1,
        **kwargs
    )
