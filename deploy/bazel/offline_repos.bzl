"""Repositories Bazel 4 would otherwise download, provided locally.

Bazel's built-in WORKSPACE suffix fetches @rules_cc and @remote_coverage_tools over the
network. Declaring them first (the suffix uses maybe()) keeps every build offline:
- @rules_cc: defs.bzl forwards to the native cc rules (Bazel 4 has them built in).
- @remote_coverage_tools: two no-op sh_binary targets every *_test refers to.
"""

def _rules_cc_impl(ctx):
    ctx.file("WORKSPACE", "workspace(name = \"rules_cc\")\n")
    ctx.file("BUILD", "")
    ctx.file("cc/BUILD", "")
    ctx.file("cc/defs.bzl", """
def cc_binary(**kw):
    native.cc_binary(**kw)
def cc_library(**kw):
    native.cc_library(**kw)
def cc_test(**kw):
    native.cc_test(**kw)
def cc_import(**kw):
    native.cc_import(**kw)
def cc_proto_library(**kw):
    native.cc_proto_library(**kw)
def cc_toolchain(**kw):
    native.cc_toolchain(**kw)
def cc_toolchain_suite(**kw):
    native.cc_toolchain_suite(**kw)
def objc_library(**kw):
    native.objc_library(**kw)
def objc_import(**kw):
    native.objc_import(**kw)
def fdo_profile(**kw):
    native.fdo_profile(**kw)
def fdo_prefetch_hints(**kw):
    native.fdo_prefetch_hints(**kw)
""")
    ctx.file("cc/private/rules_impl/BUILD", "")
    ctx.file("cc/find_cc_toolchain.bzl", """
def find_cc_toolchain(ctx):
    return ctx.toolchains["@bazel_tools//tools/cpp:toolchain_type"]
""")

rules_cc_stub = repository_rule(implementation = _rules_cc_impl)

def _coverage_impl(ctx):
    ctx.file("WORKSPACE", "workspace(name = \"remote_coverage_tools\")\n")
    ctx.file("noop.sh", "#!/bin/sh\nexit 0\n", executable = True)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
sh_binary(name = "coverage_report_generator", srcs = ["noop.sh"])
sh_binary(name = "lcov_merger", srcs = ["noop.sh"])
""")

remote_coverage_tools_stub = repository_rule(implementation = _coverage_impl)

def offline_repos():
    rules_cc_stub(name = "rules_cc")
    remote_coverage_tools_stub(name = "remote_coverage_tools")
    native.local_repository(name = "rules_java", path = "/usr/share/bazel/rules/java")
