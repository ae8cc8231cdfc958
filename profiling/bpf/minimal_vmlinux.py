"""Write the minimal vmlinux.h: only the kernel types iobatch.bpf.c uses, as committed beside it.

The eBPF object must come out the same whatever machine builds it, so the build reads the committed header, never the
build machine's BTF. The full x86_64 dump (`bpftool btf dump file /sys/kernel/btf/vmlinux format c`) is 2.8 MB and
135,000 lines; the types the program actually uses, with every member of each, are about 2,000 lines. CO-RE relocates
every field access against the running kernel's own BTF when the program loads, so a member list taken from one
kernel serves every kernel with BTF (what libbpf-tools relies on with its full per-architecture dumps).

How: the object built against a full dump carries in its own BTF exactly the types it references; dumped as C, minus
the program's own types (iobatch.h and iobatch.bpf.c's), that is the header. `make -C profiling/bpf vmlinux-minimal`
runs this on a machine with BTF (x86_64: the image's platform); the object built from the result must match the one
built from the full dump instruction for instruction, which that target checks.

    python3 minimal_vmlinux.py OBJECT_BTF_DUMP.h FULL_DUMP.h BPF_HELPER_DEFS.h SOURCE... > vmlinux.h
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SCALAR_TYPEDEF = re.compile(r"^typedef (?!struct |union |enum )[A-Za-z0-9_ ]+ \**([A-Za-z_][A-Za-z0-9_]*);$", re.M)
ENUMERATOR = re.compile(r"^\t([A-Za-z_][A-Za-z0-9_]*) = ", re.M)
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TAIL = "\n#ifndef BPF_NO_PRESERVE_ACCESS_INDEX\n#pragma clang attribute pop"
DEFINED = re.compile(r"^(?:struct|union|enum) ([A-Za-z_][A-Za-z0-9_]*) \{", re.M)
BLOCK_HEAD = re.compile(r"^(?:struct|union|enum) ([A-Za-z_][A-Za-z0-9_]*)(?: \{|;)")
HEADER = "/* Kernel types of iobatch.bpf.c (x86_64): written by minimal_vmlinux.py; CO-RE relocates them at load. */\n"


def own_types(sources: list[Path]) -> set[str]:
    """The struct, union and enum names the program's own sources define."""
    return {name for path in sources for name in DEFINED.findall(path.read_text(encoding="utf-8"))}


def helper_typedefs(full: str, present: str, helpers: str) -> list[str]:
    """The scalar typedefs of the full dump that libbpf's helper prototypes (bpf_helper_defs.h) name and `present`
    lacks (__be16, __wsum, ...), in the full dump's order, which defines a type before its uses."""
    wanted = set(WORD.findall(helpers))
    have = {m[1] for m in SCALAR_TYPEDEF.finditer(present)}
    return [m[0] for m in SCALAR_TYPEDEF.finditer(full) if m[1] in wanted and m[1] not in have]


def used_enums(full: str, present: str, sources: str) -> list[str]:
    """The enum blocks of the full dump with an enumerator the sources name (BPF_MAP_TYPE_HASH, BPF_ANY, ...) that
    `present` lacks: constants are compiled in, so the object's BTF does not carry them."""
    words = set(WORD.findall(sources))
    return [block for block in full.split("\n\n") if block.startswith("enum") and block not in present
            and words & set(ENUMERATOR.findall(block))]


def minimal(dump: str, own: set[str], full: str = "", helpers: str = "", sources: str = "") -> str:
    """`dump` (bpftool's C form of the object's BTF) without the blocks that define or declare the program's types,
    with the scalar typedefs libbpf's helper prototypes need (from `full`, the whole dump) before its end."""
    blocks = dump.split("\n\n")
    kept = []
    for block in blocks:
        head = BLOCK_HEAD.match(block.lstrip("\n"))
        if head and head[1] in own:
            continue
        kept.append(block)
    text = "\n\n".join(kept)
    typedefs = helper_typedefs(full, text, helpers) if full else []
    enums = used_enums(full, text, sources) if full else []
    if typedefs or enums:
        cut = text.rindex(TAIL)
        text = (text[:cut] + "\n/* Enumerations whose constants the program names. */\n" + "\n\n".join(enums)
                + "\n\n/* Named by libbpf's helper prototypes (bpf_helper_defs.h). */\n" + "\n".join(typedefs)
                + "\n" + text[cut:])
    return HEADER + text


def main(argv: list[str]) -> int:
    if len(argv) < 5:
        print("usage: " + __doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 64
    dump, full, helpers = (Path(p).read_text(encoding="utf-8") for p in argv[1:4])
    sources = [Path(p) for p in argv[4:]]
    text = "\n".join(p.read_text(encoding="utf-8") for p in sources)
    sys.stdout.write(minimal(dump, own_types(sources), full, helpers, text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
