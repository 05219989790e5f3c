"""The expression language of search-space files (derived values, constraints, knob conditions):
arithmetic, comparisons, boolean logic, x if c else y, min/max, over the knobs, the family's named
constants and the problem's sizes. Parsed into a closed set of AST nodes, and evaluated with bounded
arithmetic: a space's numbers are tile sizes, byte counts and problem sizes, so an operand of `*` or
`**` beyond MAX_INT_BITS, an exponent beyond MAX_EXPONENT or a repeated string or list longer than
MAX_SEQUENCE is a broken file (SpaceError naming the expression), where Python would compute
`9 ** 9 ** 9` for hours, holding the GIL, or allocate a terabyte for `'x' * 10 ** 12`."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

MAX_INT_BITS = 256  # magnitude of an operand of * or ** (a 64-bit problem size squared is 128 bits)
MAX_EXPONENT = 256
MAX_SEQUENCE = 10_000  # length of a string or list made by repetition


class SpaceError(ValueError):
    """A search-space file that cannot be used, with the file and the problem named."""


class _OutOfBounds(ArithmeticError):
    """Arithmetic beyond the language's bounds (said with the expression by _Expression)."""


def _too_big(value) -> bool:
    return isinstance(value, int) and value.bit_length() > MAX_INT_BITS


def _mul(x, y):
    for seq, count in ((x, y), (y, x)):
        if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
            if len(seq) * max(count, 0) > MAX_SEQUENCE:
                raise _OutOfBounds(f"a repeated {type(seq).__name__} would be too long "
                                   f"({len(seq)} x {count} > {MAX_SEQUENCE})")
            return seq * count
    if _too_big(x) or _too_big(y):
        raise _OutOfBounds(f"an operand of * is too large (over {MAX_INT_BITS} bits)")
    return x * y


def _add(x, y):
    if isinstance(x, (str, list, tuple)) and isinstance(y, (str, list, tuple)) and len(x) + len(y) > MAX_SEQUENCE:
        # (a chain of derived values each adding the one before to itself doubles at every step)
        raise _OutOfBounds(f"a joined {type(x).__name__} would be too long ({len(x)} + {len(y)} > {MAX_SEQUENCE})")
    return x + y


def _pow(x, y):
    if isinstance(y, (int, float)) and abs(y) > MAX_EXPONENT:
        shown = f"of {y.bit_length()} bits" if _too_big(y) else repr(y)  # (str() of a huge int raises)
        raise _OutOfBounds(f"exponent {shown} is beyond {MAX_EXPONENT}")
    if _too_big(x):
        raise _OutOfBounds(f"the base of ** is too large (over {MAX_INT_BITS} bits)")
    result = x ** y  # at most MAX_INT_BITS * MAX_EXPONENT bits: microseconds
    if _too_big(result):
        raise _OutOfBounds(f"a power is too large (over {MAX_INT_BITS} bits)")
    return result


# the nodes an expression may have; *, ** and + are evaluated by _mul, _pow and _add (bounded)
_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.BinOp,
    ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow, ast.Compare, ast.Eq, ast.NotEq,
    ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Name, ast.Load, ast.Constant,
    ast.Call, ast.Tuple, ast.List, ast.IfExp,
)
FUNCTIONS = {"min": min, "max": max}
_BOUNDED = {ast.Mult: "_mul", ast.Pow: "_pow", ast.Add: "_add"}
_GLOBALS = {"__builtins__": {}, **FUNCTIONS, "_mul": _mul, "_pow": _pow, "_add": _add}
# an expression of a search-space file is a line or two; one this long (or nested this deep: Python's
# parser and compiler recurse) is a broken file, refused before it is parsed
MAX_TEXT = 4096
MAX_DEPTH = 100


class _Bound(ast.NodeTransformer):
    """x * y -> _mul(x, y), x ** y -> _pow(x, y), x + y -> _add(x, y)."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        name = _BOUNDED.get(type(node.op))
        if name is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], []), node)


@dataclass(frozen=True)
class Expression:
    text: str
    names: frozenset[str]
    code: Any
    where: str = ""

    @classmethod
    def parse(cls, text: str, where: str) -> Expression:
        if len(text) > MAX_TEXT:
            raise SpaceError(f"{where}: an expression of {len(text)} characters is too long (at most {MAX_TEXT})")
        if _nesting(text) > MAX_DEPTH:
            raise SpaceError(f"{where}: an expression nested more than {MAX_DEPTH} deep is not allowed")
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise SpaceError(f"{where}: cannot parse {text[:200]!r}: {exc.msg}") from None
        except (RecursionError, MemoryError):  # (a long chain of operators: the parser's own limits)
            raise SpaceError(f"{where}: an expression too deep for the parser: {text[:200]!r}...") from None
        return cls._checked(tree, text, where)

    @classmethod
    def _checked(cls, tree, text: str, where: str) -> Expression:
        names = set()
        for node in ast.walk(tree):
            if not isinstance(node, _ALLOWED_NODES):
                raise SpaceError(f"{where}: {type(node).__name__} is not allowed in {text!r}")
            if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
                raise SpaceError(f"{where}: only min() and max() may be called, in {text!r}")
            if isinstance(node, ast.Name) and node.id.startswith("_"):  # (_mul, _pow: the bounded operators)
                raise SpaceError(f"{where}: names starting with _ are reserved, in {text!r}")
            if isinstance(node, ast.Name) and node.id not in FUNCTIONS:
                names.add(node.id)
        try:
            tree = ast.fix_missing_locations(_Bound().visit(tree))
            code = compile(tree, where, "eval")
        except (RecursionError, MemoryError):  # (an operator chain: the transformer and compiler recurse)
            raise SpaceError(f"{where}: an expression too deep to compile: {text[:200]!r}...") from None
        return cls(text, frozenset(names), code, where)

    def __call__(self, values: dict[str, Any]) -> Any:
        try:
            return eval(self.code, _GLOBALS, values)  # (AST-checked, arithmetic bounded)
        except (_OutOfBounds, OverflowError) as exc:
            raise SpaceError(f"{self.where}: {self.text[:200]!r}: {exc}") from None
        except (RecursionError, MemoryError) as exc:
            raise SpaceError(f"{self.where}: {self.text[:200]!r} cannot be evaluated ({type(exc).__name__})") from None


def _nesting(text: str) -> int:
    """The deepest nesting of brackets in `text` (outside string literals, roughly: quotes toggle)."""
    depth = deepest = 0
    quote = ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest
