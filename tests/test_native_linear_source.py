"""linear's C++ memo declares the part of cuBLASLt's C API it calls (serving/native_cublaslt.h) instead of
including cublasLt.h: its values as the installed header has them. Needs no PyTorch and no GPU: pip's CUDA
packages install the header."""

from __future__ import annotations

import pytest

from autogemm.serving import native_linear


def _cublaslt_headers():
    """cublasLt.h and the headers it takes its values from, where a CUDA package of pip installed them."""
    import sys
    from pathlib import Path

    for entry in map(Path, sys.path):
        for include in sorted(entry.glob("nvidia/*/include")):
            found = [include / name for name in ("cublasLt.h", "cublas_api.h", "library_types.h")]
            if all(path.is_file() for path in found):
                return found
    return None


def test_the_cublaslt_values_the_memo_declares_are_the_headers():
    """native_linear.cpp declares the part of cuBLASLt's C API it calls instead of including cublasLt.h (its
    build then needs PyTorch's headers alone): each value, and the heuristic result's layout, as the installed
    header has it."""
    import re

    headers = _cublaslt_headers()
    if headers is None:
        pytest.skip("no cublasLt.h installed (pip's nvidia-cublas has it)")
    text = "\n".join(path.read_text(errors="replace") for path in headers)
    source = "\n".join(path.read_text() for path in native_linear.HEADERS)
    declared = dict(re.findall(r"constexpr int (\w+) = (\d+);", source[source.index("namespace lt {"):]))
    assert len(declared) >= 17 and declared.pop("CUBLAS_VER_MAJOR") == "13"
    for name, value in declared.items():
        found = re.search(rf"\b{name}\s*=\s*(\d+)\b", text)
        assert found is not None and found.group(1) == value, (name, value, found and found.group(0))
    end = text.index("} cublasLtMatmulHeuristicResult_t;")
    result = text[text.rindex("typedef struct {", 0, end) + len("typedef struct {"):end]
    fields = [line.strip() for line in result.splitlines() if line.strip() and not line.strip().startswith(("/*", "*"))]
    assert fields == ["cublasLtMatmulAlgo_t algo;", "size_t workspaceSize;", "cublasStatus_t state;",
                      "float wavesCount;", "int reserved[4];"]
    assert re.search(r"typedef struct \{\s*uint64_t data\[8\];\s*\} cublasLtMatmulAlgo_t;", text)


def test_the_module_name_follows_every_header_the_source_includes():
    """native_linear.HEADERS is what module_name hashes beside the source: every header the source and its
    headers include by quoted name must be among them, or a change to it would not rebuild the memo."""
    import re

    names = {path.name for path in native_linear.HEADERS}
    for path in (native_linear.SOURCE, *native_linear.HEADERS):
        included = set(re.findall(r'^#include "([^"]+)"', path.read_text(), re.MULTILINE))
        assert included <= names, (path.name, included - names)
    assert {"native_cublaslt.h", "native_cuda.h", "native_prepared_linear.h", "native_prepared_pass.h"} <= names
