"""catch2_test: a cc_test linked against the shared Catch2 main."""

def catch2_test(name, srcs = None, deps = [], **kwargs):
    """A Catch2 test `name`; its source is `name`.cc unless `srcs` says otherwise."""
    native.cc_test(
        name = name,
        srcs = srcs or [name + ".cc"],
        deps = deps + ["//third_party:catch2_main"],
        **kwargs
    )
