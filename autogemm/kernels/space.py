"""Search spaces as data: the choices of each knob and the constraints between them, loaded from a
TOML file of `search_spaces/`, enumerated by backtracking (within ENUMERATION_LIMIT_S) and sampled
reproducibly. Expressions (the closed language of `space_expressions`, its arithmetic bounded) may
use the named constants of the space's family (`space_constants`: facts of the hardware and of
the pipeline, such as WARP or FIRST_ASYNC_STAGE), so that no such number is written out in a file."""

from __future__ import annotations

import functools
import itertools
import math
import random
import time
import tomllib
from pathlib import Path
from typing import Any, Iterable, Iterator

from .. import dtypes, families
from ..epilogue import FAST_FORM_ACTIVATIONS
from ..families.base import GemmConfig, packed_leading_dimensions
from ..paths import search_spaces_dir
from ..problem import Device, Problem
from .space_expressions import Expression, SpaceError

# How long enumerating a space (all its configurations, or the draws that make one config) may
# take before it is a SpaceError: the shipped SIMT space has 1.4e10 draws of its knobs, which the
# constraints prune as the walk goes; a space that they do not prune would run for hours.
ENUMERATION_LIMIT_S = 60.0


def default_space_name(problem: Problem, device: Device | None = None) -> str:
    """The shipped space for a problem: its dtype's family's (by the dtype and compute mode), where
    that family serves the problem; else that of the first family that does (a grouped product: the
    Hopper family's, which alone computes one)."""
    own = dtypes.lookup(problem.dtype, problem.compute).space
    serving = candidate_space_names(problem, device)
    return own if own in serving or not serving else serving[0]


def candidate_space_names(problem: Problem, device: Device | None = None) -> tuple[str, ...]:
    """The shipped spaces a tune without --space searches, each with its share of the budget: the
    spaces of the families that declare themselves candidates for the problem on the device (all
    devices where none is given; `GemmConfig.candidate_for`), in the families' candidate order: the
    dtype's own family is one wherever it computes the problem (not a grouped one: `default_space_name`)."""
    names = [family.space_for(problem) for family in families.candidate_families(problem, device)]
    return tuple(dict.fromkeys(names))

# Names a constraint may read from the problem and the device: a rule that uses any of them is a
# problem rule, applied where a problem is given (the tuner's draws, sampling for a problem) and
# not in enumerating the space itself, which stays the same for every problem.
# LDA and LDB are A's and B's row pitches when stored densely (K or M, N or K by the layout); GELU_OR_SILU
# is 1 where the problem's epilogue applies one of those (epilogue.FAST_FORM_ACTIVATIONS: a knob may choose their
# cheaper forms), else 0; EPILOGUE_LOADS is 1 where the epilogue reads a bias or a residual (a knob may load
# them ahead), else 0.
PROBLEM_NAMES = ("M", "N", "K", "BATCH", "SMS", "LDA", "LDB", "GELU_OR_SILU", "EPILOGUE_LOADS")


def problem_values(problem: Problem, device: Device) -> dict[str, Any]:
    lda, ldb = packed_leading_dimensions(problem)
    values = {"M": problem.m, "N": problem.n, "K": problem.k, "BATCH": problem.batch, "LDA": lda, "LDB": ldb,
              "GELU_OR_SILU": int(problem.epilogue.activation in FAST_FORM_ACTIVATIONS),
              "EPILOGUE_LOADS": int(bool(problem.epilogue.bias or problem.epilogue.residual))}
    if device.sm_count > 1:  # a generic device (compiling without a GPU) has no SM count: its rules are skipped
        values["SMS"] = device.sm_count
    return values


def _declared_dtypes(declared, config_class, path: Path) -> tuple[tuple[str, str], ...]:
    """A space file's `dtypes = ["bfloat16/fp32", ...]`, each one its family computes."""
    computed = [(row.name, row.compute) for row in config_class.computes()]
    if not isinstance(declared, list) or not declared:
        raise SpaceError(f"{path}: dtypes must be a non-empty list like [\"float16/fp32\"], got {declared!r}")
    pairs = []
    for entry in declared:
        pair = tuple(entry.split("/")) if isinstance(entry, str) else ()
        if pair not in computed:
            raise SpaceError(f"{path}: dtypes names {entry!r}; the {config_class.family} family computes "
                             f"{', '.join('/'.join(p) for p in computed)}")
        pairs.append(pair)
    return tuple(pairs)


class _Deadline:
    """The time an enumeration of `space` may take (ENUMERATION_LIMIT_S), checked every 4096 steps."""

    def __init__(self, space: SearchSpace):
        self.space, self.limit, self.steps = space, ENUMERATION_LIMIT_S, 0
        self.end = time.monotonic() + self.limit

    def tick(self) -> None:
        self.steps += 1
        if self.steps & 4095 == 0 and time.monotonic() > self.end:
            draws = math.prod(len(choices) for choices in self.space.knobs.values())
            raise SpaceError(f"{self.space.path}: enumerating the space took more than {self.limit:g} s (its knobs "
                             f"have {draws} combinations): give the knobs fewer choices, or constraints that rule "
                             "draws out as soon as their knobs are set")


def _uniform(offered: dict[str, list[Any]], rng: random.Random, attempts: int) -> Iterator[dict[str, Any]]:
    """`attempts` draws of every knob of `offered` (knob -> its choices), each uniformly."""
    for _ in range(attempts):
        yield {knob: rng.choice(choices) for knob, choices in offered.items()}


class SearchSpace:
    """A search space file as the tuner uses it: the knobs and their choices, the derived values and
    the constraints (problem rules among them) of one family, the configurations to try first; it
    samples, enumerates and checks configurations (`SearchSpace.load` reads one)."""

    def __init__(self, path: Path, family: str, knobs: dict[str, tuple[Any, ...]], derived: dict[str, Expression],
                 constraints: list[Expression], problem_constraints: Iterable[Expression] = (),
                 knob_conditions: dict[str, Expression] | None = None):
        self.path = path
        self.family = family
        self.config_class: type[GemmConfig] = families.get(family)
        self.fields: tuple[str, ...] = tuple(knob.name for knob in self.config_class.knobs)
        self.constants: dict[str, Any] = dict(self.config_class.space_constants)
        self.knobs = knobs
        self.derived = derived
        self.constraints = constraints
        self.problem_constraints: list[Expression] = list(problem_constraints)  # rules that read PROBLEM_NAMES
        # knob -> a condition over PROBLEM_NAMES: where it does not hold, the knob keeps its first
        # value and the sampler is not offered the others
        self.knob_conditions: dict[str, Expression] = dict(knob_conditions or {})
        self.seeds: list[Any] = []  # configurations the tuner tries first in a new study
        # the (dtype, compute) pairs the space is for, its first the one it is checked with by
        # default; a file that names none is for every pair its family computes
        self.dtypes: tuple[tuple[str, str], ...] = tuple((row.name, row.compute) for row in self.config_class.computes())

    @property
    def name(self) -> str:
        return self.path.stem

    def evaluate(self, knob_values: dict[str, Any], problem: Problem | None = None,
                 device: Device | None = None) -> tuple[object | None, list[str]]:
        """Knob values -> (config, []) or (None, the constraints they break); with a problem and
        device, the problem rules too."""
        values = {**self.constants, **knob_values}
        try:
            for name, expr in self.derived.items():
                values[name] = expr(values)
            broken = [rule.text for rule in self.constraints if not rule(values)]
            if problem is not None and device is not None and not broken:
                given = problem_values(problem, device)
                values.update(given)
                missing = set(PROBLEM_NAMES) - set(given)
                broken = [rule.text for rule in self.problem_constraints if not rule.names & missing and not rule(values)]
                offered = self._choices(given)
                broken += [f"{knob}: only {offered[knob][0]!r} unless {self.knob_conditions[knob].text}"
                           for knob in self.knob_conditions if knob_values.get(knob) not in offered[knob]]
        except ZeroDivisionError as exc:
            return None, [f"division by zero ({exc})"]
        if broken:
            return None, broken
        return self.config_class(**{f: values[f] for f in self.fields}), []

    @classmethod
    def load(cls, path: str | Path | None = None) -> SearchSpace:
        """Loads a space file; a bare name like ``simt`` means the shipped ``search_spaces/simt.toml``,
        and none the shipped space of the default dtype in its default compute mode (float32's)."""
        if path is None:
            path = search_spaces_dir() / f"{dtypes.lookup(dtypes.DTYPES[0]).space}.toml"
        path = Path(path)
        if not path.suffix and not path.exists():
            path = search_spaces_dir() / f"{path}.toml"
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SpaceError(f"search space file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SpaceError(f"{path}: not valid TOML: {exc}") from None
        family = data.get("family")
        known_families = [f.family for f in families.all_families()]
        if family not in known_families:
            raise SpaceError(f"{path}: family must be one of {', '.join(known_families)}, got {family!r}")
        config_class = families.get(family)
        fields = [knob.name for knob in config_class.knobs]
        raw_knobs = data.get("knobs", {})
        knobs = {}
        for name, values in raw_knobs.items():
            if not isinstance(values, list) or not values:
                raise SpaceError(f"{path}: knob {name} needs a non-empty list of choices")
            knobs[name] = tuple(values)
        derived = {
            name: Expression.parse(text, f"{path}: derived.{name}") for name, text in data.get("derived", {}).items()
        }
        overlap = set(knobs) & set(derived)
        if overlap:
            raise SpaceError(f"{path}: {', '.join(sorted(overlap))} both searched and derived")
        # a knob with an "off" position that the file does not name stays off: a space written
        # before the knob existed still loads, and searches what it did
        for knob in config_class.knobs:
            if knob.name not in knobs and knob.name not in derived and knob.has_off_position:
                knobs[knob.name] = (knob.omitted,)
        missing = [f for f in fields if f not in knobs and f not in derived]
        if missing:
            raise SpaceError(f"{path}: config fields neither searched nor derived: {', '.join(missing)}")
        rules = data.get("constraints", {}).get("rules", [])
        constraints = [Expression.parse(text, f"{path}: constraint") for text in rules]
        known = set(knobs) | set(derived) | set(config_class.space_constants)
        used = set()
        for expr in derived.values():
            if expr.names - known:
                hint = (f" (the problem's {', '.join(PROBLEM_NAMES)} may be read by constraints, not by derived values)"
                        if expr.names & set(PROBLEM_NAMES) else "")
                raise SpaceError(f"{path}: {expr.text!r} uses unknown names {', '.join(sorted(expr.names - known))}{hint}")
            used |= expr.names
        for expr in constraints:
            if expr.names - known - set(PROBLEM_NAMES):
                raise SpaceError(f"{path}: {expr.text!r} uses unknown names "
                                 f"{', '.join(sorted(expr.names - known - set(PROBLEM_NAMES)))}")
            used |= expr.names
        knob_conditions = {}
        for knob, text in data.get("knob_conditions", {}).items():
            where = f"{path}: knob_conditions.{knob}"
            if knob not in knobs:
                raise SpaceError(f"{where}: not a searched knob of this space")
            condition = Expression.parse(text, where) if isinstance(text, str) else None
            if condition is None or condition.names - set(PROBLEM_NAMES):
                raise SpaceError(f"{where}: a condition is an expression over {', '.join(PROBLEM_NAMES)} only")
            knob_conditions[knob] = condition
        problem_constraints = [rule for rule in constraints if rule.names & set(PROBLEM_NAMES)]
        constraints = [rule for rule in constraints if not rule.names & set(PROBLEM_NAMES)]
        unused = [k for k in knobs if k not in fields and k not in used]
        if unused:
            raise SpaceError(
                f"{path}: unknown knobs {', '.join(unused)}: neither a {family} config field "
                f"({', '.join(fields)}) nor used by a derived value or constraint"
            )
        space = cls(path, family, knobs, derived, constraints, problem_constraints, knob_conditions)
        if "dtypes" in data:
            space.dtypes = _declared_dtypes(data["dtypes"], config_class, path)
        seeds = data.get("seeds", {}).get("configs", [])
        for seed in seeds:
            try:
                config = space.config_class.from_name(seed)
            except ValueError as exc:
                raise SpaceError(f"{path}: seed {seed!r}: {exc}") from None
            if not space.contains(config):
                raise SpaceError(f"{path}: seed {seed} is not a configuration of this space")
            space.seeds.append(config)
        return space

    # ---- enumeration ------------------------------------------------------------------------
    @functools.cached_property
    def _schedule(self) -> list[tuple[str, list[tuple[str, Expression]], list[Expression]]]:
        return self._stages(list(self.knobs), set(self.constants))  # every knob, in the file's order

    def _stages(self, order: list[str], bound: set[str]) -> list[tuple[str, list[tuple[str, Expression]], list[Expression]]]:
        """For each knob of `order`, set in turn after the names in `bound`: the derived values and
        constraints that become computable once it is set (those computable before the first knob
        come with the first)."""
        bound = set(bound)
        pending_derived = dict(self.derived)
        pending_rules = list(self.constraints)
        schedule = []
        for knob in order:
            bound.add(knob)
            ready_derived = []
            progress = True
            while progress:
                progress = False
                for name, expr in list(pending_derived.items()):
                    if expr.names <= bound:
                        ready_derived.append((name, expr))
                        bound.add(name)
                        del pending_derived[name]
                        progress = True
            ready_rules = [r for r in pending_rules if r.names <= bound]
            pending_rules = [r for r in pending_rules if r not in ready_rules]
            schedule.append((knob, ready_derived, ready_rules))
        return schedule

    def _walk(self, stages: list[Any], depth: int, values: dict[str, Any], target: dict[str, Any] | None = None,
              deadline: _Deadline | None = None) -> Iterator[dict[str, Any]]:
        """Every setting of the stages' knobs (`_stages`) that the constraints allow, depth first;
        with `target` (config field -> value), only those whose derived fields take those values, a
        partial one dropped as soon as one does not. SpaceError once it runs past ENUMERATION_LIMIT_S."""
        if deadline is None:
            deadline = _Deadline(self)
        if depth == len(stages):
            yield dict(values)
            return
        knob, derived, rules = stages[depth]
        for choice in self.knobs[knob]:
            deadline.tick()
            values[knob] = choice
            try:
                ok = True
                for name, expr in derived:
                    values[name] = expr(values)
                    if target is not None and name in target and values[name] != target[name]:
                        ok = False  # (the config compares its fields with ==)
                        break
                ok = ok and all(rule(values) for rule in rules)
            except ZeroDivisionError:
                ok = False
            if ok:
                yield from self._walk(stages, depth + 1, values, target, deadline)
        values.pop(knob, None)

    @functools.cached_property
    def all_configs(self) -> tuple[Any, ...]:
        """Every configuration the space's constraints allow (independent of problem and device), each once
        (configs are frozen dataclasses, equal where their names are: keyed by themselves, since building a
        name took a third of the Hopper space's 12.9 s)."""
        configs = {}
        for values in self._walk(self._schedule, 0, dict(self.constants)):
            configs.setdefault(self.config_class(**{f: values[f] for f in self.fields}))
        return tuple(configs)

    def knob_values(self, config: Any) -> dict[str, Any] | None:
        """The knob values that produce `config` (the first in the knobs' order), or None. The knobs
        that are not config fields are walked, and a partial draw is dropped once a field derived
        from it or a constraint it decides rules it out: milliseconds, where trying every
        combination (some 14,000 in the SIMT space) took a tune's start 1.5 s."""
        fixed = {k: getattr(config, k) for k in self.knobs if k in self.fields}
        if any(v not in self.knobs[k] for k, v in fixed.items()):
            return None
        target = {f: getattr(config, f) for f in self.fields}
        stages = self._stages([k for k in self.knobs if k not in self.fields], set(self.constants) | set(fixed))
        for values in self._walk(stages, 0, {**self.constants, **fixed}, target):
            draw = {k: values[k] for k in self.knobs}
            if self.evaluate(draw)[0] == config:
                return draw
        return None

    def contains(self, config: Any) -> bool:
        """Whether some draw of the knobs produces exactly `config`."""
        return self.knob_values(config) is not None

    def knob_choices(self, problem: Problem, device: Device) -> dict[str, tuple[Any, ...]]:
        """The knobs' choices for this problem: a knob whose condition does not hold keeps its first."""
        return self._choices(problem_values(problem, device))

    def _choices(self, given: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
        """`knob_choices` from the problem's values (`problem_values`), which `evaluate` has already."""
        choices = dict(self.knobs)
        for knob, condition in self.knob_conditions.items():
            if condition.names <= set(given) and not condition(given):
                choices[knob] = self.knobs[knob][:1]
        return choices

    def valid_configs(self, problem: Problem, device: Device) -> list[Any]:
        """Every configuration of the space that passes its problem rules and `check` (slow for large
        spaces: enumerates)."""
        return [c for c in self.all_configs if self.suits(c, problem, device) and not c.check(problem, device)]

    def suits(self, config: Any, problem: Problem, device: Device) -> bool:
        """Whether some draw producing `config` passes the problem rules (True where there are none)."""
        if not self.problem_constraints:
            return True
        values = self.knob_values(config)
        return values is not None and self.evaluate(values, problem, device)[0] is not None

    def uniform_draws(self, problem: Problem, device: Device, rng: random.Random, attempts: int) -> Iterator[tuple[Any, ...]]:
        """(config, knob values) of the valid ones among `attempts` uniform draws of every knob (the
        same config may come twice), lazily: for a caller that needs a few."""
        return self._valid(_uniform(self.knob_choices(problem, device), rng, attempts), problem, device)

    def shuffled_draws(self, problem: Problem, device: Device, rng: random.Random, attempts: int) -> Iterator[tuple[Any, ...]]:
        """As `uniform_draws`, but where the knobs offer no more than `attempts` combinations, every one of
        them once, in an order `rng` shuffles: a small space is searched completely, and no draw repeats."""
        offered = self.knob_choices(problem, device)
        if math.prod(len(choices) for choices in offered.values()) > attempts:
            return self._valid(_uniform(offered, rng, attempts), problem, device)
        combinations = list(itertools.product(*offered.values()))
        rng.shuffle(combinations)
        return self._valid((dict(zip(offered, combination)) for combination in combinations), problem, device)

    def _valid(self, draws: Iterable[dict[str, Any]], problem: Problem, device: Device) -> Iterator[tuple[Any, ...]]:
        """(config, knob values) of the draws that satisfy the space's rules and the config's `check`, lazily."""
        for values in draws:
            config, _ = self.evaluate(values, problem, device)
            if config is not None and not config.check(problem, device):
                yield config, values

    def sample(self, count: int, problem: Problem, device: Device, seed: int = 0) -> list[Any]:
        """`count` distinct valid configurations, uniformly at random with a fixed seed.

        Draws every knob uniformly and keeps the draws that satisfy the constraints and `check`:
        uniform over the valid set without enumerating it. Returns fewer only if the space has
        fewer valid configurations than asked for.
        """
        chosen: dict[str, object] = {}
        attempts = 2000 * count + 100_000
        if math.prod(len(choices) for choices in self.knob_choices(problem, device).values()) < count:
            attempts = 0  # fewer knob combinations than configs asked for: no draws find them; enumerate
        for config, _ in self.uniform_draws(problem, device, random.Random(seed), attempts):
            chosen.setdefault(config.name, config)
            if len(chosen) == count:
                break
        if len(chosen) < count:  # a small or sparse space: enumerate it instead
            valid = self.valid_configs(problem, device)
            return valid if count >= len(valid) else random.Random(seed).sample(valid, count)
        return list(chosen.values())
