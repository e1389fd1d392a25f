"""cc_grpc_proto: protoc + grpc_cpp_plugin from Debian via a genrule, then a cc_library."""

def cc_grpc_proto(name, srcs, deps = [], grpc = True, visibility = None):
    """Generates C++ (and gRPC stubs) for `srcs` (paths under proto/, imported as weightbeam/v1/x.proto)."""
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    plugin = "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin --grpc_out=$(GENDIR)/proto" if grpc else ""
    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = "/usr/bin/protoc -Iproto --cpp_out=$(GENDIR)/proto {plugin} {files}".format(
            plugin = plugin,
            files = " ".join(["$(location {})".format(s) for s in srcs]),
        ),
    )
    native.filegroup(name = name + "_srcs", srcs = srcs, visibility = visibility)
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        deps = deps + ["//third_party:grpc"],
        visibility = visibility,
    )
