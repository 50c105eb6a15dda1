"""Writes a C file holding Cove's kernels (this directory's files) for cove-kernel to write out
(src/kernel/builtin_kernels.h). Usage: embed.py OUTPUT.c BASE_DIR FILE..."""
import os
import sys

output, base, files = sys.argv[1], sys.argv[2], sys.argv[3:]
lines = ['#include "kernel/builtin_kernels.h"', "",
         "const struct kernel_builtin_file kernel_builtin_files[] = {"]
for path in files:
    data = open(path, "rb").read()
    name = os.path.relpath(path, base)
    literal = "".join(f"\\x{b:02x}" for b in data)
    chunks = [literal[i:i + 96] for i in range(0, len(literal), 96)] or [""]
    body = "\n".join(f'     "{c}"' for c in chunks)
    lines.append(f'    {{"{name}",\n{body},\n     {len(data)}}},')
lines += ["};", "",
          f"const size_t kernel_builtin_file_count = {len(files)};", ""]
with open(output, "w") as f:
    f.write("\n".join(lines))
