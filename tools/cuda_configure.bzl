"""Finds the local CUDA toolkit (no download): writes @local_cuda with HAVE_CUDA and headers.

On a machine without /usr/local/cuda the repository still exists, HAVE_CUDA is False and
the GPU code is left out of the build.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("WB_CUDA_ROOT", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    disabled = ctx.os.environ.get("WB_DISABLE_CUDA", "") == "1"
    have = nvcc.exists and not disabled
    if have:
        ctx.symlink(root + "/include", "include")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cuda_runtime",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inl"]),
    includes = ["include"],
    defines = ["WB_HAVE_CUDA=1"],
    linkopts = ["-L{root}/lib64", "-lcudart_static", "-ldl", "-lrt", "-lpthread"],
)
""".format(root = root))
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cuda_runtime")
""")
    ctx.file("defs.bzl", "HAVE_CUDA = {}\nNVCC = \"{}\"\n".format(have, str(nvcc)))
    ctx.file("WORKSPACE", "workspace(name = \"local_cuda\")\n")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    local = True,
    environ = ["WB_CUDA_ROOT", "WB_DISABLE_CUDA"],
)
