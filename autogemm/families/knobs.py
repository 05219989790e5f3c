"""Knob tables. A family declares each of its knobs once (its type, the values it may take, how it
is written in a configuration's name) and its config class gets, from that table alone: its fields
(a frozen dataclass), its name and the parsing of names (a pattern built from the table, never
written by hand), its dict form, and the checks of single knob values (reason code "choice").
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Self, dataclass_transform

_UNSET = object()


@dataclass(frozen=True)
class Knob:
    name: str
    kind: type[Any]  # int, bool or str: the exact type of every value
    default: Any
    code: str = ""  # written in front of the value in the config's name ("s" of "_s3")
    join: str = "_"  # written in front of the code: "_" starts a part of the name, "x" or "" continue one
    choices: tuple[Any, ...] = ()  # the values allowed (empty: any the other rules allow)
    low: int | None = None  # smallest allowed value of an int knob
    high: int | None = None  # largest
    power_of_two: bool = False
    # a value written as nothing in the name (the knob's "off" position), exempt from low/high
    omitted: Any = _UNSET
    words: Mapping[Any, str] | None = None  # value -> the text written for it instead of code + value
    why: str = ""  # said in a range reason: why the bound (or, with `omitted`, what "off" means)

    def write(self, value: Any) -> str:
        """This knob's part of a config name (empty when omitted)."""
        if self.is_omitted(value):
            return ""
        text = self.words[value] if self.words and value in self.words else f"{self.code}{value}"
        return self.join + text

    @property
    def has_off_position(self) -> bool:
        """Whether the knob has an "off" value (`omitted`): what a space that does not name it uses."""
        return self.omitted is not _UNSET

    def is_omitted(self, value: Any) -> bool:
        return self.omitted is not _UNSET and type(value) is type(self.omitted) and value == self.omitted

    def pattern(self) -> str:
        """A regular-expression group matching this knob's part of a name."""
        if self.words:
            alternatives = list(self.words.values())
        elif self.choices:
            alternatives = [str(c) for c in self.choices]
        else:
            alternatives = [r"\d+" if self.kind is int else "[a-z0-9]+"]
        escaped = [a if a in (r"\d+", "[a-z0-9]+") else re.escape(a) for a in
                   sorted(alternatives, key=len, reverse=True)]
        body = re.escape(self.join) + (re.escape(self.code) if not self.words else "")
        body += f"(?P<{self.name}>{'|'.join(escaped)})"
        return f"(?:{body})?" if self.omitted is not _UNSET else body

    def parse(self, text: str | None) -> Any:
        if text is None:
            return self.omitted
        if self.words:
            return next(value for value, word in self.words.items() if word == text)
        return int(text) if self.kind is int else text

    def type_reason(self, value: Any) -> str | None:
        """Why `value` is not of this knob's exact type (bool is not int, int is not bool)."""
        if type(value) is self.kind:
            return None
        wanted = {bool: "true or false", int: "an int", str: "a string"}[self.kind]
        return f"{self.name}={value!r} must be {wanted}"

    def range_reasons(self, value: Any) -> list[str]:
        """Why `value` (of the right type) is not one of this knob's values."""
        if self.is_omitted(value):
            return []
        shown = repr(value) if self.kind is str else str(value)
        out = []
        if self.choices and value not in self.choices:
            out.append(f"{self.name}={shown} must be one of {', '.join(map(str, self.choices))}")
        if self.power_of_two and not (value >= 1 and value & (value - 1) == 0):
            out.append(f"{self.name}={value} must be a power of two")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            why = f" ({self.why})" if self.why else ""
            if self.high is None:
                bound = f">= {self.low}{why}"
            elif self.omitted is not _UNSET:  # the "off" value and what it means, then the range
                bound = f"{self.omitted}{why} or {self.low} to {self.high}"
            else:
                bound = f"{self.low} to {self.high}{why}"
            out.append(f"{self.name}={value} must be {bound}")
        return out

    def reasons(self, value: Any, ranges: bool = True) -> list[str]:
        """Why `value` is not one this knob takes (empty when it is); without `ranges`, its type only."""
        reason = self.type_reason(value)
        if reason:
            return [reason]
        return self.range_reasons(value) if ranges else []


def knob_fields(knobs: tuple[Knob, ...], indent: str = "        ") -> str:
    """The fields a knob table gives a config class, as a class body declares them for type checkers
    (which cannot see fields made at run time): each family's class carries this text in an
    `if TYPE_CHECKING:` block, and tests/test_knobs.py fails where the two differ."""
    return "".join(f"{indent}{k.name}: {k.kind.__name__} = {k.default!r}\n" for k in knobs)


# frozen dataclasses to type checkers too (PEP 681): the fields each subclass declares for them
@dataclass_transform(frozen_default=True)
class Config:
    """Base of every family's config class. A subclass sets `family` (the key in records and
    registries), `label` (how messages name it), `name_prefix` and `knobs`; its fields, name,
    parsing and dict form follow from `knobs` (and, for type checkers, from the same fields declared
    under TYPE_CHECKING: `knob_fields`)."""

    family: ClassVar[str] = ""
    label: ClassVar[str] = ""
    name_prefix: ClassVar[str] = ""
    knobs: ClassVar[tuple[Knob, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "knobs" not in cls.__dict__:
            return
        for knob in cls.knobs:
            if knob.kind is int and not knob.choices and (knob.low is None or knob.high is None):
                raise TypeError(f"{cls.__name__}: int knob {knob.name} needs choices or a range (low and high)")
            if knob.kind is str and not knob.choices:  # (its value reaches the source: render_reasons)
                raise TypeError(f"{cls.__name__}: str knob {knob.name} needs its choices")
        for before, knob in zip(cls.knobs, cls.knobs[1:]):
            if knob.join == "" and not (before.words or before.choices or before.kind is not int):
                raise TypeError(f"{cls.__name__}: {knob.name} follows {before.name} with no separator, "
                                f"so {before.name} needs a finite list of choices to be parsed")
        # the knobs become the fields of a frozen dataclass, in table order (positional arguments too)
        # (set through setattr: to a type checker a class's __annotations__ is not one of its members)
        setattr(cls, "__annotations__", {**{k.name: k.kind for k in cls.knobs},
                                         **{k: v for k, v in cls.__dict__.get("__annotations__", {}).items()
                                            if str(v).startswith("ClassVar")}})
        for knob in cls.knobs:
            setattr(cls, knob.name, knob.default)
        dataclasses.dataclass(frozen=True)(cls)
        cls._name_pattern = re.compile(re.escape(cls.name_prefix) + "".join(k.pattern() for k in cls.knobs))

    # ---- names ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.name_prefix + "".join(k.write(getattr(self, k.name)) for k in self.knobs)

    @classmethod
    def from_name(cls, name: str, ranges: bool = True) -> Self:
        """The config a name stands for; ValueError if the name is not one, or (unless `ranges` is
        false) names values the family does not take."""
        match = cls._name_pattern.fullmatch(name)
        config = cls(**{k.name: k.parse(match.group(k.name)) for k in cls.knobs}) if match else None
        if config is None or config.name != name:  # e.g. "_k01": parses, but is not how k1 is written
            raise ValueError(f"not a {cls.label} config name: {name!r}")
        return config.validated(ranges)

    # ---- dict form -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, **{k.name: getattr(self, k.name) for k in self.knobs}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], ranges: bool = True) -> Self:
        """A config from its dict form (JSON, a cache record, the command line): every knob of its
        exact type and, unless `ranges` is false (experiments), within its range; ValueError otherwise."""
        if not isinstance(data, dict):
            raise ValueError(f"a {cls.label} config must be an object of knobs, got {type(data).__name__}")
        data = cls.upgrade_dict(dict(data))
        family = data.pop("family", cls.family)
        if family != cls.family:
            raise ValueError(f"config family {family!r} is not {cls.family!r}")
        unknown = set(data) - {k.name for k in cls.knobs}
        if unknown:
            raise ValueError(f"unknown {cls.label} config knobs: {', '.join(sorted(map(str, unknown)))}")
        return cls(**data).validated(ranges)

    @classmethod
    def upgrade_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Rewrites the dict form of an earlier version of the family (cache records) into today's."""
        return data

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

    # ---- single knob values ----------------------------------------------------------------------
    def knob_reasons(self, ranges: bool = True) -> list[str]:
        """'choice' reasons for every knob whose value is not one the table allows (without
        `ranges`: only those of the wrong type)."""
        return [f"choice: {reason}" for k in self.knobs for reason in k.reasons(getattr(self, k.name), ranges)]

    def render_reasons(self, force: bool = False) -> list[str]:
        """Why this config is not rendered: `knob_reasons` (without `force`, ranges included), and
        even with `force` a string knob's value must be one of its choices: it is written into the
        kernel's source, where other text (a newline, an #include) would become code."""
        reasons = self.knob_reasons(ranges=not force)
        if force:
            texts = [(k, getattr(self, k.name)) for k in self.knobs if k.kind is str]
            reasons += [f"choice: {reason}" for k, value in texts if not k.type_reason(value)
                        for reason in k.range_reasons(value)]
        return reasons

    def validated(self, ranges: bool = True) -> Self:
        """This config, if every knob has its exact type (and, with `ranges`, a value the table
        allows); ValueError naming every knob that does not."""
        reasons = [r.removeprefix("choice: ") for r in self.knob_reasons(ranges)]
        if reasons:
            raise ValueError(f"invalid {self.label} config: " + "; ".join(reasons))
        return self
