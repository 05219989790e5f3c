"""One tuned result (`Record`): the config that won a problem on a GPU model, or cuBLAS, and what was
measured in the same run; how a record is checked when read from a file (`Record.from_json`,
`filed_record`: nothing from a file is trusted), and the cuBLAS record a tune keeps when no generated
kernel beat it (`cublas_record`). The documents that hold records are cache.py's."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from ..families import config_from_dict
from .predict import bytes_moved  # (the roofline's bytes: predict.py imports nothing of records)

# The timing protocol: the version stored with every record (measure/timing.py measures under it).
# Records of an older protocol are not evidence for the predictor and are re-measured (issue 35).
PROTOCOL = 2
from ..epilogue import require_measurable
from ..problem import Problem
from ..kernels.render import kernel_digest, kernel_template_hash
from .provenance import nvrtc_release

CUBLAS = "cublas"  # the family of records whose winner is cuBLAS itself

# What no GPU autogemm serves reaches, so that a record claiming it is forged or broken (a record's
# figures feed the predictor's roofline and decide what is served). Generous where the device's
# own peak is not known (reading a file, it is not): some ten times the dense FP16 tensor-core
# peak of the fastest GPU there is, beyond any L2 cache's bandwidth, and a speed-up over cuBLAS far
# beyond any measured (the shipped results' best is ~5x).
MAX_TFLOPS = 20_000.0
MAX_BYTES_PER_S = 200e12
MAX_RATIO = 1000.0
# what a record's `sustained` holds
SUSTAINED_FIGURES = ("sm_clock_mhz", "power_w", "rounds", "burst_ratio")
# ratio is cublas_ms / time_ms as measured; more apart than rounding makes them is not a measurement
RATIO_TOLERANCE = 0.05


def shown_value(value: Any) -> str:
    """A value as an error message shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class Record:
    """One tuned result: the winning config and what was measured in the same run."""

    problem: str  # Problem.key
    family: str
    config: dict[str, Any]
    config_name: str
    time_ms: float
    tflops: float
    cublas_ms: float
    cublas_tflops: float
    ratio: float  # cuBLAS time / kernel time, measured in the same run
    rel_error: float
    template_hash: str  # render.kernel_template_hash of the config's template when it was tuned
    device: str  # device name as the driver reports it
    versions: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    trials: dict[str, Any] = field(default_factory=dict)  # valid / rejected / failed counts of the tuning run
    wall_s: float = 0.0
    study: str = ""
    provisional: bool = False  # best so far of a tune still running (or killed); replaced by its end
    # For a cuBLAS record (family "cublas": no generated kernel beat cuBLAS by more than the noise):
    # the best generated kernel it measured, {"family", "config", "config_name", "ratio"}
    best_generated: dict[str, Any] = field(default_factory=dict)
    host: str = ""  # where it was measured (provenance, shown when caches from several hosts merge)
    # render.kernel_digest of the kernel (for a cuBLAS record: of the best generated one) when it was
    # tuned; the record is current while its config still renders to that source. Records written
    # before this field existed fall back to template_hash.
    source_digest: str = ""
    # The timing protocol (timing.PROTOCOL) of the figures: 1, records written before it had a number,
    # whose cuBLAS times could be host-bound. time_ms and cublas_ms are GPU times (cublas_ms: the
    # faster baseline's); latency_us and baseline_latency_us single-call latencies of what the record
    # serves and of the served cuBLAS fallback (0: not measured); baselines: ms of each baseline.
    protocol: int = 1
    latency_us: float = 0.0
    baseline_latency_us: float = 0.0
    baselines: dict[str, Any] = field(default_factory=dict)
    # Where the final comparison was timed sustained (the GPU never idle, clocks and power settled:
    # timing.sustained_times), time_ms, cublas_ms and baselines are those figures, and this says how:
    # the SM clock (MHz) and board power (W) seen during the rounds (0: not read), the rounds, and
    # burst_ratio, the ratio of the short re-timings before them. Empty: not timed sustained.
    sustained: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.best_generated:
            del data["best_generated"]
        if not self.sustained:
            del data["sustained"]
        return data

    @property
    def is_cublas(self) -> bool:
        return self.family == CUBLAS

    @property
    def generated_config(self):
        """The generated kernel the record measured: its winner, or the best generated kernel a cuBLAS
        record lost with (None: none)."""
        return self.best_generated_object if self.is_cublas else self.config_object

    @property
    def current_protocol(self) -> bool:
        """Measured under today's timing protocol (GPU time for every competitor, and latencies)."""
        return self.protocol >= PROTOCOL

    @property
    def compiled_by_another_nvrtc(self) -> str:
        """The NVRTC release the kernel this record serves was measured with ("13.0"), where this process
        compiles it with another; "" where they are the same, either is unknown, or the record serves cuBLAS.
        Its source renders the same (`stale` says so), but ptxas's registers differ between releases: a kernel
        one compiled without spills may spill under another (NVRTC 13.5 against 13.0: 7 kernels that shipped
        records serve spill 12-32 bytes)."""
        measured = str(self.versions.get("nvrtc") or "")
        here = nvrtc_release() if measured and not self.is_cublas else ""
        return measured if here and here != measured else ""

    @property
    def latency_ratio(self) -> float | None:
        """The served cuBLAS fallback's latency over this record's (None: not measured)."""
        return self.baseline_latency_us / self.latency_us if self.latency_us and self.baseline_latency_us else None

    @classmethod
    def from_json(cls, data: Any) -> Record:
        """A record read from a file, every field checked; ValueError naming the first fault."""
        try:
            return cls._from_json(data)
        except OverflowError as exc:
            # an integer of a few hundred digits (JSON carries it whole) in any number field or in the
            # problem key's sizes: math.isfinite, a quotient or the flops refuse it as a float. It is a
            # bad record, skipped like any other, not an error of every caller that reads the document.
            raise ValueError(f"a number too large for a float ({exc})") from None

    @classmethod
    def _from_json(cls, data) -> Record:
        if not isinstance(data, dict):
            raise ValueError(f"a record must be an object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        missing = [name for name, f in known.items()
                   if f.default is MISSING and f.default_factory is MISSING and name not in data]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        values = {name: data[name] for name in known if name in data}
        for name in ("problem", "family", "config_name", "template_hash", "device", "date", "study", "host",
                     "source_digest"):
            if name in values and not isinstance(values[name], str):
                raise ValueError(f"{name} must be a string, got {shown_value(values[name])}")
        for name in ("time_ms", "tflops", "cublas_ms", "cublas_tflops", "ratio"):
            value = values[name]
            if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {shown_value(value)}")
        for name, allow_nan in (("rel_error", True), ("wall_s", False)):
            value = values.get(name, 0.0)
            if type(value) not in (int, float) or (math.isnan(value) and not allow_nan) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {shown_value(value)}")
        for name in ("config", "versions", "trials"):
            if name in values and not isinstance(values[name], dict):
                raise ValueError(f"{name} must be an object, got {shown_value(values[name])}")
        # the run's facts are flat: a nested value would be carried into every export and listing
        for key, value in values.get("versions", {}).items():
            if not isinstance(value, str):
                raise ValueError(f"versions.{key} must be a string, got {shown_value(value)}")
        for key, value in values.get("trials", {}).items():
            if type(value) is not int or value < 0:
                raise ValueError(f"trials.{key} must be a count (an int >= 0), got {shown_value(value)}")
        if type(values.get("protocol", 1)) is not int or values.get("protocol", 1) < 1:
            raise ValueError(f"protocol must be an int >= 1, got {shown_value(values.get('protocol'))}")
        for name in ("latency_us", "baseline_latency_us"):
            value = values.get(name, 0.0)
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {shown_value(value)}")
        if not isinstance(values.get("baselines", {}), dict) or any(
                not isinstance(key, str) or type(value) not in (int, float) or not math.isfinite(value) or value <= 0
                for key, value in values.get("baselines", {}).items()):
            raise ValueError(f"baselines must map names to positive numbers, got {shown_value(values.get('baselines'))}")
        if not isinstance(values.get("sustained", {}), dict) or any(
                key not in SUSTAINED_FIGURES or type(value) not in (int, float) or not math.isfinite(value) or value < 0
                for key, value in values.get("sustained", {}).items()):
            raise ValueError(f"sustained must map {', '.join(SUSTAINED_FIGURES)} to numbers >= 0, got "
                             f"{shown_value(values.get('sustained'))}")
        if type(values.get("provisional", False)) is not bool:
            raise ValueError(f"provisional must be true or false, got {shown_value(values['provisional'])}")
        if "best_generated" in values and not isinstance(values["best_generated"], dict):
            raise ValueError(f"best_generated must be an object, got {shown_value(values['best_generated'])}")
        if values.get("family") != CUBLAS:  # only a cuBLAS record names a kernel it beat: nothing to keep
            values.pop("best_generated", None)
        problem = Problem.from_key(values["problem"])
        require_measurable(problem, "not a record autogemm can serve")
        _check_reachable(values, problem)
        record = cls(**values)
        if record.is_cublas:
            if record.config or record.config_name != CUBLAS:
                raise ValueError(f"a cuBLAS record has no config, got {shown_value(record.config)} named {shown_value(record.config_name)}")
            record.__dict__["config_object"] = None
            if record.best_generated:
                record.__dict__["best_generated_object"] = _best_generated(record.best_generated)
            return record
        if "family" in record.config:  # the record's own field names it; a second one would go unchecked
            raise ValueError(f"config must not name a family (the record's family field does), got {shown_value(record.config['family'])}")
        config = config_from_dict({**record.config, "family": record.family})
        if config.name != record.config_name:
            raise ValueError(f"config_name {shown_value(record.config_name)} is not its config's name {config.name!r}")
        record.__dict__["config_object"] = config  # parsed once: the cached property's value
        return record

    @functools.cached_property
    def config_object(self):
        """The generated kernel's config; None for a cuBLAS record."""
        return None if self.is_cublas else config_from_dict({**self.config, "family": self.family})

    @functools.cached_property
    def best_generated_object(self):
        return _best_generated(self.best_generated) if self.best_generated else None

    @property
    def problem_object(self) -> Problem:
        return Problem.from_key(self.problem)

    @property
    def stale(self) -> bool:
        """Measured with a kernel whose source has changed since: the generated winner's own, or for
        a cuBLAS record the kernel it beat (new kernels might win now). Only the record's own kernel
        counts: editing another family's template, or a part of a template this kernel does not
        render, leaves it current."""
        try:
            config = self.generated_config
            if config is None:
                return bool(self.template_hash)
            if self.source_digest:
                return self.source_digest != kernel_digest(config, self.problem_object)
            return self.template_hash != kernel_template_hash(config.template)
        except Exception:  # a config no family reads or no template renders any more is never current
            return True


def cublas_record(generated: Record, latency_ratio: float | None = None) -> Record:
    """The record of a tune that kept cuBLAS: cuBLAS's figures, and the generated kernel it beat
    (whose template's hash makes the record stale once the templates change), with its ratio in GPU
    time and in single-call latency."""
    best = {"family": generated.family, "config": generated.config, "config_name": generated.config_name,
            "ratio": generated.ratio, "tflops": generated.tflops, "rel_error": generated.rel_error}
    if latency_ratio is not None:
        best["latency_ratio"] = latency_ratio
    return dataclasses.replace(
        generated, family=CUBLAS, config={}, config_name=CUBLAS, time_ms=generated.cublas_ms,
        tflops=generated.cublas_tflops, ratio=1.0, rel_error=float("nan"), best_generated=best,
        latency_us=generated.baseline_latency_us,
    )


def _check_reachable(values: dict[str, Any], problem: Problem) -> None:
    """ValueError where a record's figures are beyond what a GPU does: above the compute or memory
    roofline (the problem's flops and bytes in the time given), a speed-up beyond MAX_RATIO, or a
    ratio that is not its two times' quotient. The fields' types are checked already."""
    if values["ratio"] > MAX_RATIO:
        raise ValueError(f"ratio {shown_value(values['ratio'])} is beyond any measured speed-up (at most {MAX_RATIO:g})")
    for name in ("tflops", "cublas_tflops"):
        if values[name] > MAX_TFLOPS:
            raise ValueError(f"{name} {shown_value(values[name])} is beyond any GPU (at most {MAX_TFLOPS:g})")
    for name in ("time_ms", "cublas_ms"):
        seconds = values[name] / 1e3
        if problem.flops / seconds > MAX_TFLOPS * 1e12 or bytes_moved(problem) / seconds > MAX_BYTES_PER_S:
            raise ValueError(f"{name} {shown_value(values[name])} is shorter than any GPU computes {problem.key} in")
    quotient = values["cublas_ms"] / values["time_ms"]
    if abs(values["ratio"] / quotient - 1) > RATIO_TOLERANCE:
        raise ValueError(f"ratio {shown_value(values['ratio'])} is not cublas_ms / time_ms ({quotient:.4g})")


def _positive(name: str, value, bound: float) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 < value <= bound:
        raise ValueError(f"best_generated.{name} must be a positive number up to {bound:g}, got {shown_value(value)}")


# what a cuBLAS record says of the kernel it beat, beside the kernel's config (bounded like a record's)
_BEATEN_FIGURES = {"ratio": MAX_RATIO, "tflops": MAX_TFLOPS, "latency_ratio": MAX_RATIO, "single_call_ratio": MAX_RATIO}
_BEATEN_TEXT_CHARS = 1000


def _best_generated(data: dict[str, Any]):
    """The config of a cuBLAS record's best generated kernel, checked like a record's: its config,
    its figures numbers in range, anything else a flat value (it is written back by every export
    and listing)."""
    config = config_from_dict({**data.get("config", {}), "family": data.get("family")})
    if data.get("config_name") != config.name:
        raise ValueError(f"best_generated config_name {shown_value(data.get('config_name'))} is not its config's name")
    _positive("ratio", data.get("ratio"), MAX_RATIO)
    for key, value in data.items():
        if key in ("family", "config", "config_name"):
            continue
        if key in _BEATEN_FIGURES:
            _positive(key, value, _BEATEN_FIGURES[key])
        elif key == "rel_error":
            if type(value) not in (int, float) or value < 0:
                raise ValueError(f"best_generated.rel_error must be a number >= 0, got {shown_value(value)}")
        elif not (value is None or type(value) in (bool, int) or (type(value) is float and math.isfinite(value))
                  or (isinstance(value, str) and len(value) <= _BEATEN_TEXT_CHARS)):
            raise ValueError(f"best_generated.{key} must be a flat value (text, number, true/false), "
                             f"got {shown_value(value)}")
    return config


def filed_record(key: str, entry: Any) -> Record:
    """The record filed under `key` in a document; ValueError if it is not a valid record of that key."""
    try:
        record = Record.from_json(entry)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if record.problem != key:
        raise ValueError(f"it is the record of {record.problem}")
    return record
