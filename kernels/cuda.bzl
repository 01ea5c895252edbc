"""cuda_library: compile .cu files with the toolkit's nvcc and wrap them as a cc_library.

nvcc runs in a genrule by absolute path (no Bazel CUDA rules exist offline). Objects are
position independent (Debian links PIE) and carry sm_90 SASS plus compute_90 PTX.
Headers listed in `hdrs` are visible to nvcc through -I of the workspace's include dirs.

`--define=cuda_slim=1` (with its own --output_base, so that the default build's outputs stay):
sm_90 SASS only, without line info: the same machine code, for packs carried to a Hopper machine
(tests/cuda/pack.sh). The PTX and line info do not compress, the SASS does: kda.cu's object
packs into 1.0 MB of xz instead of 7.1.
"""

NVCC = "/usr/local/cuda/bin/nvcc"
COMMON_FLAGS = [
    "-O3",
    "-std=c++17",
    "-Xcompiler -fPIC",
    "-Xcompiler -Wall,-Wextra",
    "-Ikernels/include",
    "-I.",
]
NVCC_FLAGS = " ".join(COMMON_FLAGS + [
    "-lineinfo",  # source lines in profiler and sanitizer reports (no change to the code)
    "-gencode=arch=compute_90,code=[sm_90,compute_90]",
])
NVCC_FLAGS_SLIM = " ".join(COMMON_FLAGS + ["-gencode=arch=compute_90,code=sm_90"])

def _nvcc_cmd(flags, src):
    return "t=$$(mktemp -d) && TMPDIR=$$t %s %s -c $(location %s) -o $@; r=$$?; rm -rf $$t; exit $$r" % (NVCC, flags, src)

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
            cmd = select({
                "//kernels:cuda_slim": _nvcc_cmd(NVCC_FLAGS_SLIM, src),
                "//conditions:default": _nvcc_cmd(NVCC_FLAGS, src),
            }),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        deps = deps + ["@cuda//:cudart"],
        linkopts = ["-lstdc++"],
        **kwargs
    )
