"""The CUDA libraries autogemm loads come with it: NVRTC and cuBLAS/cuBLASLt from the packages its CUDA
extra installs (`cuda-toolkit[...]` in pyproject.toml), not from a toolkit that happens to be on the
machine. No GPU is needed: NVRTC compiles without one, and the libraries are found and loaded by
cuda-pathfinder, as cuda-bindings and nvmath-python load them.

These fail rather than skip where a library is missing: they test the installation the README gives
(`pip install -e ".[cuda13,test]"`), and a missing library is what they are there to catch."""

from __future__ import annotations

import struct

import pytest

from autogemm.families import SimtConfig, config_from_name
from autogemm.kernels import compile as kernel_compile
from autogemm.kernels import nvrtc
from autogemm.kernels.render import render
from autogemm.problem import Device, Problem

EXTRA = "autogemm[cuda13] (or [cuda12])"


def _loaded(libname: str, package: str):
    """cuda-pathfinder's LoadedDL of `libname`, failing with the package that brings it."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError:
        pytest.fail(f"cuda-pathfinder is not installed: {EXTRA} brings it")
    try:
        return load_nvidia_dynamic_lib(libname)
    except Exception as exc:  # DynamicLibNotFoundError
        pytest.fail(f"lib{libname} is not found ({type(exc).__name__}: {exc}); {EXTRA} installs it as {package}")


@pytest.mark.parametrize("libname, package", [("nvrtc", "nvidia-cuda-nvrtc"), ("cublasLt", "nvidia-cublas"),
                                              ("cublas", "nvidia-cublas"), ("cudart", "nvidia-cuda-runtime")])
def test_the_libraries_come_from_the_installed_packages(libname, package):
    loaded = _loaded(libname, package)
    found_via = getattr(loaded, "found_via", "site-packages")
    assert found_via == "site-packages", (
        f"lib{libname} was loaded from {loaded.abs_path} ({found_via}), not from the installed packages: "
        f"{EXTRA} installs it as {package}")


def test_autogemm_reports_where_nvrtc_is():
    path, found_via = nvrtc.library()
    assert found_via == "site-packages" and "nvidia" in path, (path, found_via)
    assert nvrtc.version() >= (12, 0)


def _sm(cubin: bytes) -> int:
    """The SM version a CUDA ELF (EM_CUDA, 190) is built for: bits 8-15 of its e_flags."""
    assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18)[0] == 190, cubin[:20]
    (flags,) = struct.unpack_from("<I", cubin, 48)
    return (flags >> 8) & 0xFF


F16 = Problem(1000, 3000, 200, dtype="float16")
# one rendered kernel of each family (and of each tensor-core instruction) for each architecture
KERNELS = [
    ("simt", lambda: config_from_name(SimtConfig.defaults(Problem(1000, 3000, 200))[0][1]), Problem(1000, 3000, 200),
     ("sm_90", "sm_80")),
    ("tensor_core mma", lambda: config_from_name("wmma_64x64x32_w32x32_v8_s2_pad_g8_k1_o1_mma"), F16,
     ("sm_90", "sm_80")),
    ("tensor_core wmma", lambda: config_from_name("wmma_64x64x32_w32x32_v8_s2_pad_g8_k1_o1"), F16, ("sm_90", "sm_80")),
    ("tensor_core wgmma", lambda: config_from_name("wmma_256x128x64_w256x64_v8_s4_pad_g8_k1_o1_wgmma"), F16,
     ("sm_90",)),
    ("gemv", lambda: config_from_name("gemv_m4_n256_k256_w4_v4_u4_s1_o1"), Problem(1, 3000, 200, dtype="float16"),
     ("sm_90", "sm_80")),
    ("hopper", lambda: config_from_name("hopper_256x128x64_w128x128_s3_g1_k1_o1"), F16, ("sm_90",)),
]
CASES = [(family, make, problem, arch) for family, make, problem, archs in KERNELS for arch in archs]


@pytest.mark.parametrize("family, make, problem, arch", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_nvrtc_of_the_installed_packages_compiles_each_family(family, make, problem, arch, tmp_path, monkeypatch):
    """A rendered kernel of each family to a cubin for its architecture (sm_90a where it uses wgmma,
    setmaxnreg or TMA), by the NVRTC the packages brought, with the headers beside it."""
    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path))  # compiled here and now, none reused
    _, found_via = nvrtc.library()
    assert found_via == "site-packages", f"NVRTC was not found in the installed packages ({found_via}): {EXTRA}"
    config = make()
    assert not config.check(problem, Device.for_arch(arch)), (config.name, arch)
    source = render(config, problem)
    target = source.target(arch)
    assert target == ("sm_90a" if arch == "sm_90" else arch) or family not in ("hopper", "tensor_core wgmma")
    cubin = kernel_compile.compile_to_cubin(source, arch)
    data = cubin.read_bytes()
    assert _sm(data) == int(arch.removeprefix("sm_")), (family, arch, hex(struct.unpack_from("<I", data, 48)[0]))
    assert cubin.parent == tmp_path


def test_the_kernels_headers_are_taken_beside_nvrtc():
    """<mma.h> includes crt/mma.h: the include directory given to NVRTC has both, and is the one
    beside the NVRTC library in use, so that the headers are of NVRTC's own version."""
    from pathlib import Path

    kernel_compile._include_options.cache_clear()
    options = kernel_compile._include_options()
    assert len(options) == 1 and options[0].startswith("-I"), options
    include = Path(options[0][2:])
    assert (include / "mma.h").is_file() and (include / "crt" / "mma.h").is_file()
    library, _ = nvrtc.library()
    assert include == Path(library).resolve().parent.parent / "include"


def test_a_missing_nvrtc_names_the_package(monkeypatch):
    from cuda import pathfinder

    def not_found(libname):
        raise pathfinder.DynamicLibNotFoundError(f'Failure finding "lib{libname}.so.13"')

    monkeypatch.setattr(pathfinder, "load_nvidia_dynamic_lib", not_found)
    nvrtc.library.cache_clear()
    try:
        with pytest.raises(nvrtc.NvrtcError, match=r"NVRTC \(libnvrtc\) cannot be found.*autogemm\[cuda13\].*nvidia-cuda-nvrtc"):
            nvrtc.library()
    finally:
        nvrtc.library.cache_clear()


def test_a_cublaslt_that_does_not_load_names_the_package(monkeypatch):
    """nvmath-python loads cuBLASLt on its first call: a library that is not there is named, with the
    package that brings it, where the first handle is made."""
    from autogemm.gpu import cublas_gemm

    class Lt:
        class cuBLASLtError(Exception):
            pass

        @staticmethod
        def create():
            raise RuntimeError('Failure finding "libcublasLt.so.13"')

    monkeypatch.setattr(cublas_gemm, "bindings", lambda: (Lt, object()))
    with pytest.raises(cublas_gemm.CublasUnavailable, match=r"libcublasLt.*autogemm\[cuda13\].*nvidia-cublas"):
        cublas_gemm._DeviceState(0)


def _header(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("// a header\n")


@pytest.mark.parametrize("layout", ["cuda13", "cuda12"])
def test_the_headers_beside_nvrtc_come_before_a_toolkits(layout, tmp_path, monkeypatch):
    """CUDA 13's packages keep mma.h and crt/mma.h in one nvidia/cu13/include; CUDA 12's split them
    between nvidia/cuda_runtime/include and nvidia/cuda_nvcc/include. Either is taken before a
    toolkit's (here one under $CUDA_HOME), whose headers may be of another version than NVRTC."""
    import cupy

    site = tmp_path / "site" / "nvidia"
    if layout == "cuda13":
        library = site / "cu13" / "lib" / "libnvrtc.so.13"
        expected = (f"-I{site / 'cu13' / 'include'}",)
        _header(site / "cu13" / "include" / "mma.h")
        _header(site / "cu13" / "include" / "crt" / "mma.h")
    else:
        library = site / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
        expected = (f"-I{site / 'cuda_runtime' / 'include'}", f"-I{site / 'cuda_nvcc' / 'include'}")
        _header(site / "cuda_nvrtc" / "include" / "nvrtc.h")
        _header(site / "cuda_runtime" / "include" / "mma.h")
        _header(site / "cuda_nvcc" / "include" / "crt" / "mma.h")
    _header(library)
    toolkit = tmp_path / "toolkit"
    _header(toolkit / "include" / "mma.h")
    _header(toolkit / "include" / "crt" / "mma.h")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(nvrtc, "library", lambda: (str(library), "site-packages"))
    monkeypatch.setattr(kernel_compile, "_nvidia_namespace", lambda: [str(site)])
    monkeypatch.setattr(cupy.cuda, "get_cuda_path", lambda: None)
    kernel_compile._include_options.cache_clear()
    try:
        assert kernel_compile._include_options() == expected
        library.unlink()  # no NVRTC package: the toolkit's headers
        monkeypatch.setattr(nvrtc, "library", lambda: (_ for _ in ()).throw(nvrtc.NvrtcError("none")))
        kernel_compile._include_options.cache_clear()
        assert kernel_compile._include_options() == (f"-I{toolkit / 'include'}",)
    finally:
        kernel_compile._include_options.cache_clear()


def test_the_crt_headers_of_a_second_site_folder_are_found(tmp_path, monkeypatch):
    """NVRTC and the runtime's headers in one site folder, nvidia-cuda-crt in another (a --target or user
    install beside a virtual environment's): both are NVIDIA's `nvidia` namespace package, and taken so."""
    import cupy

    venv_site, target = tmp_path / "venv" / "nvidia", tmp_path / "target" / "nvidia"
    library = venv_site / "cu13" / "lib" / "libnvrtc.so.13"
    _header(library)
    _header(venv_site / "cu13" / "include" / "mma.h")
    _header(target / "cu13" / "include" / "crt" / "mma.h")
    monkeypatch.setattr(nvrtc, "library", lambda: (str(library), "site-packages"))
    monkeypatch.setattr(kernel_compile, "_nvidia_namespace", lambda: [str(venv_site), str(target)])
    monkeypatch.setattr(cupy.cuda, "get_cuda_path", lambda: None)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    kernel_compile._include_options.cache_clear()
    try:
        assert kernel_compile._include_options() == (f"-I{venv_site / 'cu13' / 'include'}",
                                                     f"-I{target / 'cu13' / 'include'}")
    finally:
        kernel_compile._include_options.cache_clear()
