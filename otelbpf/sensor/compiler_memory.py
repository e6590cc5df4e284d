"""Give back the memory the BPF compile used, once the program is loaded.

BCC compiles with clang and LLVM in this process: ~60 MiB of the agent's resident memory
after start-up is theirs, and none of it is used again (probes attach by name and
address; a tail call loaded later is already compiled). Three parts:

- the heap LLVM freed, which glibc keeps mapped: ``malloc_trim(0)`` returns the free pages
  of every arena (~26 MiB here);
- ``BPF.free_bcc_memory()``: BCC's own helper drops the text pages of libbcc (which embeds
  LLVM when built statically, as upstream does);
- Debian's libbcc links LLVM and clang as shared libraries instead, so their code pages
  (~80 MiB of libLLVM and libclang-cpp touched by one compile) are dropped here the same
  way (``base/resident.py``): ``madvise(MADV_DONTNEED)`` on their read-only file mappings. The
  kernel reads a page again from the file if it is ever run again; only mappings with no
  anonymous (private, written) pages are touched, so relocated data is never discarded.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from otelbpf.base.resident import drop_file_pages, trim_heap

log = logging.getLogger(__name__)

#: Libraries only the compile uses (file basenames).
_COMPILER_LIBS = re.compile(r"lib(LLVM|clang-cpp|clang)[-.]")


def release(bpf: Any) -> int:
    """Give back what the compile left resident. Returns the bytes of compiler code
    pages dropped (the heap part is not measurable from here)."""
    try:
        bpf.free_bcc_memory()
    except Exception as exc:  # an older BCC without it: the rest still helps
        log.debug("free_bcc_memory: %s", exc)
    dropped = drop_file_pages(lambda path: _COMPILER_LIBS.search(os.path.basename(path)) is not None)
    trim_heap()
    return dropped
