"""cuda_library: .cu files compiled by nvcc into a static archive (sm_80, sm_90).

Without a CUDA toolkit the `fallback_srcs` (CPU code that reports "no CUDA") are built
instead, so every target still builds on CPU-only machines.
"""

load("@local_cuda//:defs.bzl", "HAVE_CUDA", "NVCC")

CUDA_ARCH_FLAGS = "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90"

def cuda_library(name, cu_srcs, hdrs = [], fallback_srcs = [], deps = [], **kwargs):
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
            "{nvcc} -std=c++17 -O3 {arch} -Xcompiler -fPIC -I. -I$(GENDIR) -isystem external/local_cuda/include -DWB_HAVE_CUDA=1 -c $(location {src}) -o {obj}".format(
                nvcc = NVCC,
                arch = CUDA_ARCH_FLAGS,
                src = src,
                obj = obj,
            ),
        )
    cmds.append("ar rcs $@ " + " ".join(objs))
    native.genrule(
        name = name + "_nvcc",
        srcs = cu_srcs + hdrs,
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
