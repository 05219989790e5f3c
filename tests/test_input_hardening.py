"""Crafted inputs (issue 36, "Hardening II"), without a GPU: templates render in a sandbox; string
knobs take only their declared choices, even forced; search-space arithmetic is bounded in operand
size, exponent and time; __cuda_array_interface__ dicts are checked before anything asks the driver
about them; alpha and beta too large for a float are named; an `out` that overlaps an operand is
computed through a temporary (as NumPy does), and `explain` takes whatever `matmul` takes."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
import textwrap

import pytest

import autogemm
from autogemm.serving import call_context, dispatch, numpy_semantics
from autogemm.gpu import launch
from autogemm.families import SimtConfig, config_from_dict
from autogemm.gpu.operands import describe, real_scalar
from autogemm.problem import Device, Problem
from autogemm.kernels.render import render

explain_module = importlib.import_module("autogemm.serving.explain")  # (autogemm.explain is the function)


# ---- templates ----------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ lipsum.__globals__['os'].getcwd() }}",
    "{{ cycler.__init__.__globals__ }}",
])
def test_templates_render_in_a_sandbox(tmp_path, monkeypatch, body):
    (tmp_path / "simt_gemm.cu.j2").write_text(body + "\n")
    monkeypatch.setenv("AUTOGEMM_TEMPLATE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=r"template simt_gemm\.cu\.j2 .*is refused: .*unsafe") as info:
        render(SimtConfig(), Problem(256, 256, 256))
    assert str(tmp_path) in str(info.value)


# ---- string knobs -------------------------------------------------------------------------------

INJECTED = 'pad\n#include "/etc/passwd"\n'


def test_string_knobs_take_only_their_choices_even_forced():
    with pytest.raises(ValueError, match=r"smem='pad\\n#include .* must be one of plain, pad, swizzle"):
        render(SimtConfig(smem=INJECTED), Problem(256, 256, 256), force=True)
    # (an experiment may still build such a config, to see what check() says of it)
    forced = config_from_dict({"family": "simt", "split_reduce": "kernel; x"}, ranges=False)
    with pytest.raises(ValueError, match="split_reduce='kernel; x' must be one of kernel, fused, cluster"):
        render(forced, Problem(256, 256, 256), force=True)
    assert render(SimtConfig(group_m=3000), Problem(256, 256, 256), force=True)  # ints still may leave their range


def test_the_render_command_refuses_injected_string_knobs_with_force(capsys):
    from autogemm.cli import main

    code = main(["render", "--force", "--config", json.dumps({"smem": INJECTED})])
    out, err = capsys.readouterr()
    assert code != 0 and "#include" not in out and "must be one of plain, pad, swizzle" in err


def test_a_string_knob_without_choices_is_refused_by_the_table():
    from autogemm.families.knobs import Config, Knob

    with pytest.raises(TypeError, match="str knob mode needs its choices"):
        class Loose(Config):
            family = label = name_prefix = "loose"
            knobs = (Knob("mode", str, "fast"),)


# ---- search-space arithmetic --------------------------------------------------------------------

TINY = ('family = "simt"\n[knobs]\n'
        "bm = [128]\nbn = [128]\nbk = [8, 16]\nwm = [32]\nwn = [64]\ntm = [8]\ntn = [8]\n"
        'vec = [4]\nvec_frag = [4]\nstages = [2]\nsmem = ["pad"]\ngroup_m = [8]\nsplit_k = [1]\n'
        'min_blocks = [1]\ntranspose = ["async"]\nstream_k = [false]\nmax_registers = [0]\n')
HOSTILE = {
    "tower": "9 ** 9 ** 9 > 0",
    "knob exponent": "bk ** 100000000 > 0",
    "product": "(bk ** 60) * (bk ** 60) * (bk ** 60) * (bk ** 60) > 0",
    "text": "'x' * 10 ** 12 != ''",
    "list": "[0] * 10 ** 12 != []",
}


def _space_errors(tmp_path, spaces: dict[str, str], limit_s: float) -> dict:
    """{label: the SpaceError's message, or "no error"} of enumerating each space, in a process of
    its own: an unbounded one would hang this one (big-integer arithmetic never releases the GIL)."""
    paths = {}
    for label, text in spaces.items():
        paths[label] = str(tmp_path / f"{len(paths)}.toml")
        (tmp_path / f"{len(paths) - 1}.toml").write_text(text)
    script = textwrap.dedent(f"""
        import json, sys
        import autogemm.kernels.space as space
        space.ENUMERATION_LIMIT_S = {limit_s}
        out = {{}}
        for label, path in json.loads(sys.argv[1]).items():
            try:
                space.SearchSpace.load(path).all_configs
                out[label] = "no error"
            except space.SpaceError as exc:
                out[label] = str(exc)
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(paths)], capture_output=True, text=True,
                          timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_space_arithmetic_is_bounded(tmp_path):
    spaces = {label: TINY + f'[constraints]\nrules = ["bk >= 8", "{rule}"]\n' for label, rule in HOSTILE.items()}
    errors = _space_errors(tmp_path, spaces, 60)
    for label, rule in HOSTILE.items():
        assert "constraint" in errors[label] and rule in errors[label], (label, errors[label])
    assert "exponent" in errors["tower"] and "exponent" in errors["knob exponent"]
    assert "too large" in errors["product"] and "too long" in errors["text"] and "too long" in errors["list"]


def test_space_enumeration_is_bounded_in_time(tmp_path):
    # 10^8 draws of knobs that only a constraint reads: hours to enumerate
    extra = "".join(f"x{i} = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n" for i in range(8))
    rule = " + ".join(f"x{i}" for i in range(8)) + " >= 0"
    text = TINY.replace("[knobs]\n", "[knobs]\n" + extra) + f'[constraints]\nrules = ["{rule}"]\n'
    errors = _space_errors(tmp_path, {"slow": text}, 0.5)
    assert re.search(r"enumerating .* took more than 0.5 s .*200000000 combinations", errors["slow"]), errors


def test_bounded_arithmetic_keeps_the_shipped_spaces_values():
    from autogemm.kernels.space import SearchSpace

    space = SearchSpace.load("gemv")
    draw = {k: v[-1] for k, v in space.knobs.items()}
    assert space.evaluate(draw)[1] == space.evaluate(dict(draw))[1]
    assert len(space.sample(20, Problem(1, 4096, 4096), Device.for_arch("sm_90"), seed=1)) == 20


# ---- __cuda_array_interface__ -------------------------------------------------------------------

class Crafted:
    """An object whose __cuda_array_interface__ is whatever a test puts there (never dereferenced)."""

    def __init__(self, interface):
        self.__cuda_array_interface__ = interface


def interface(shape=(4, 4), typestr="<f4", pointer=1 << 32, **changes) -> dict:
    return {"shape": shape, "typestr": typestr, "strides": None, "data": (pointer, False), "version": 3, **changes}


def _without(key):
    d = interface()
    del d[key]
    return d


FAULTS = [
    ("a", interface(shape=(4, -4)), ValueError, r"a: __cuda_array_interface__ shape \(4, -4\) has a negative extent"),
    ("a", interface(shape=(4.0, 4)), TypeError, r"a: __cuda_array_interface__ shape \(4.0, 4\) must be a tuple of ints"),
    ("a", interface(shape=4), TypeError, r"a: __cuda_array_interface__ shape 4 must be a tuple of ints"),
    ("a", interface(pointer=0), ValueError, "a: __cuda_array_interface__ data has a null pointer for 16 elements"),
    ("a", interface(data=5), TypeError, r"a: __cuda_array_interface__ data must be a \(pointer, read-only\) pair"),
    ("a", interface(data=(1.5, False)), TypeError, "a: __cuda_array_interface__ data pointer must be an int"),
    ("a", interface(strides=(16,)), ValueError, "a: __cuda_array_interface__ strides has 1 entries for 2 axes"),
    ("a", interface(strides=(16, 2)), ValueError,
     r"a: __cuda_array_interface__ strides \(16, 2\) are not multiples of the item size 4"),
    ("a", interface(strides=16), TypeError, "a: __cuda_array_interface__ strides must be None or a tuple of ints"),
    ("a", interface(mask=Crafted(interface())), ValueError, "a: __cuda_array_interface__ has a mask"),
    ("a", interface(typestr=">f4"), TypeError, "a: __cuda_array_interface__ typestr '>f4' is big-endian"),
    ("a", interface(typestr=42), TypeError, "a: __cuda_array_interface__ typestr must be a string"),
    ("a", interface(typestr="<zz"), TypeError, "a: __cuda_array_interface__ typestr '<zz' is not a NumPy type string"),
    ("a", _without("shape"), TypeError, "a: __cuda_array_interface__ has no 'shape'"),
    ("b", _without("typestr"), TypeError, "b: __cuda_array_interface__ has no 'typestr'"),
    ("b", _without("data"), TypeError, "b: __cuda_array_interface__ has no 'data'"),
    ("b", [1, 2], TypeError, "b: __cuda_array_interface__ must be a dict, got list"),
    ("out", interface(data=(1 << 40, True)), ValueError, "out is read-only"),
    ("out", interface(strides=(0, 4), pointer=1 << 40), ValueError, r"out has stride 0 along axis 0 \(extent 4\)"),
]


@pytest.mark.parametrize("role, crafted, error, message", FAULTS, ids=[f"{f[0]}:{f[3][:40]}" for f in FAULTS])
def test_crafted_interfaces_are_refused_before_the_driver_is_asked(monkeypatch, role, crafted, error, message):
    def no_driver(*args, **kwargs):
        raise AssertionError("the driver was asked about an operand before it was checked")

    monkeypatch.setattr(call_context, "device_of", no_driver)
    operands = {"a": Crafted(interface()), "b": Crafted(interface(pointer=1 << 36)),
                "out": Crafted(interface(pointer=1 << 40))}
    operands[role] = Crafted(crafted)
    for entry in (autogemm.matmul, explain_module.explain):
        with pytest.raises(error, match=message):
            entry(operands["a"], operands["b"], out=operands["out"])
    if role != "out":  # launch.bind and the measuring code describe operands too
        with pytest.raises(error, match=message):
            describe(operands[role], role)


def test_well_formed_interfaces_still_read():
    x = describe(Crafted(interface(shape=(3, 5), strides=(20, 4), data=(1 << 32, True))), "a")
    assert (x.shape, x.strides, x.pointer) == ((3, 5), (20, 4), 1 << 32)  # a read-only operand is fine
    empty = describe(Crafted(interface(shape=(0, 5), pointer=0)), "a")  # an empty array may have no memory
    assert empty.shape == (0, 5)
    broadcast = numpy_semantics.read(Crafted(interface(strides=(0, 4))), "b")  # zero strides: fine to read
    assert broadcast.strides == (0, 4)


# ---- alpha and beta -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [("alpha", 10**400), ("beta", -(10**400))], ids=["alpha", "beta"])
def test_scalars_too_large_for_a_float_are_named(name, value):
    with pytest.raises(ValueError, match=f"{name} is too large for a float"):
        real_scalar(value, name)
    a, b, out = Crafted(interface()), Crafted(interface(pointer=1 << 36)), Crafted(interface(pointer=1 << 40))
    for entry in (autogemm.matmul, explain_module.explain):
        with pytest.raises(ValueError, match=f"{name} is too large for a float"):
            entry(a, b, out=out, **{name: value})


# ---- out overlapping an operand; explain takes what matmul takes --------------------------------

@pytest.fixture
def no_gpu_needed(monkeypatch):
    """explain's and matmul's device look-ups answered without a driver (an sm_90 without SMs, its
    stream not captured into a CUDA graph)."""
    import contextlib

    monkeypatch.setattr(call_context, "device_of", lambda info: 0)
    monkeypatch.setattr(call_context, "capture_allocations", lambda: contextlib.nullcontext(False))
    monkeypatch.setattr(launch, "device_info", lambda device: Device.for_arch("sm_90"))


def test_out_overlapping_an_operand_goes_through_a_temporary(no_gpu_needed, monkeypatch):
    a = Crafted(interface(shape=(64, 64)))
    ran = {}

    def run(call, *args, **kwargs):
        ran.update(kwargs, call=call)
        return "result"

    monkeypatch.setattr(numpy_semantics, "run", run)
    monkeypatch.setattr(dispatch, "_gemm", lambda *args: "gemm")
    assert autogemm.matmul(a, a, out=a) == "result"
    assert ran["apart"] and ran["call"].shape == (64, 64)
    assert autogemm.matmul(a, Crafted(interface(shape=(64, 64), pointer=1 << 36)),
                           out=Crafted(interface(shape=(64, 64), pointer=1 << 40))) == "gemm"  # no overlap: as before


def test_overlap_is_judged_by_byte_ranges():
    def operand(name, pointer, shape=(4, 4), strides=(16, 4)):
        return numpy_semantics.Operand(name, shape, strides, numpy_semantics.np.dtype("float32"), pointer)

    a, b = operand("a", 4096), operand("b", 1 << 20)
    assert numpy_semantics.overlapping(operand("out", 4096 + 60), a, b) == ["a"]
    assert numpy_semantics.overlapping(operand("out", 4096 + 64), a, b) == []
    assert numpy_semantics.overlapping(operand("out", 4096, shape=(0, 4)), a, b) == []  # empty: nothing written
    assert numpy_semantics.overlapping(operand("out", 4096), a, operand("b", 4096)) == ["a", "b"]


def test_explain_takes_the_arguments_matmul_takes():
    def parameters(function):
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    assert parameters(explain_module.explain) == parameters(dispatch.matmul)


def test_explain_describes_overlap_conversion_and_cast(no_gpu_needed):
    a = Crafted(interface(shape=(64, 64)))
    overlapped = explain_module.explain(a, a, out=a, alpha=2, beta=0.5)
    assert overlapped["copies"] == ["out"] and overlapped["source"] == "cublas"
    assert type(overlapped["source"]) is str  # (a ChoiceSource's value: a printed explain() shows the string)
    assert "out overlaps a and b" in overlapped["out"]
    mixed = explain_module.explain(Crafted(interface(shape=(64, 32), typestr="<f2")),
                                   Crafted(interface(shape=(32, 16), pointer=1 << 36)),
                                   out=Crafted(interface(shape=(64, 16), typestr="<f2", pointer=1 << 40)))
    assert mixed["conversions"] == ["a: float16 -> float32"] and mixed["dtype"] == "float32"
    assert "cast to out's float16" in mixed["out"]
    with pytest.raises(ValueError, match="beta != 0 needs out="):
        explain_module.explain(a, a, beta=0.5)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        explain_module.explain(a, a, alpha="2")
