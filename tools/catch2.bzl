"""catch2_test: a cc_test linked against the shared Catch2 main."""

def catch2_test(name, srcs, deps = [], **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + ["//third_party:catch2_main"],
        **kwargs
    )
