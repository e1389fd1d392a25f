"""cc_unit: a cc_library of one unit, `name`.cc with its header `name`.h."""

def cc_unit(name, srcs = None, hdrs = None, **kwargs):
    """A cc_library `name` of `name`.cc and `name`.h unless `srcs` / `hdrs` say otherwise.

    Most of the project's libraries are one source and its header named after the target;
    header-only ones pass `srcs = []`.
    """
    native.cc_library(
        name = name,
        srcs = [name + ".cc"] if srcs == None else srcs,
        hdrs = [name + ".h"] if hdrs == None else hdrs,
        **kwargs
    )
