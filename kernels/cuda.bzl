"""cuda_library: compile .cu files with the toolkit's nvcc and wrap them as a cc_library.

nvcc runs in a genrule by absolute path (no Bazel CUDA rules exist offline). Objects are
position independent (Debian links PIE) and carry sm_90 SASS plus compute_90 PTX.
Headers listed in `hdrs` are visible to nvcc through -I of the workspace's include dirs.
"""

NVCC = "/usr/local/cuda/bin/nvcc"
NVCC_FLAGS = " ".join([
    "-O3",
    "-lineinfo",  # source lines in profiler and sanitizer reports (no change to the code)
    "-std=c++17",
    "-Xcompiler -fPIC",
    "-Xcompiler -Wall,-Wextra",
    "-gencode=arch=compute_90,code=[sm_90,compute_90]",
    "-Ikernels/include",
    "-I.",
])

def cuda_library(name, srcs, hdrs = [], deps = [], **kwargs):
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs,
            outs = [obj],
            # a temporary directory of its own: nvcc names its temporary files by process id,
            # which is the same in every sandbox's process namespace, so two nvcc actions
            # running at once otherwise overwrite each other's files in a shared /tmp
            cmd = "t=$$(mktemp -d) && TMPDIR=$$t %s %s -c $(location %s) -o $@; r=$$?; rm -rf $$t; exit $$r" % (NVCC, NVCC_FLAGS, src),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        deps = deps + ["@cuda//:cudart"],
        linkopts = ["-lstdc++"],
        **kwargs
    )
