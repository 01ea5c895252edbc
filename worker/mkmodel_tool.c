/* mkmodel_tool.c: `kdecode mkmodel` on its own, for build rules that write checkpoints (the bundled
 * demo model). It links only the checkpoint writer, so building it as a tool compiles no backend
 * (no CUDA) in the build's host configuration. Same arguments and bytes as `kdecode mkmodel`. */
#include "worker/mkmodel.h"

int main(int argc, char **argv) { return kd_mkmodel_main(argc, argv); }
