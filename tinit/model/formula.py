"""A small, safe arithmetic language for init rules: numbers, + - * / ^ (or **),
parentheses, sqrt, log, exp, min, max, and named variables.

Formulas are parsed with :mod:`ast` and every node is checked against a whitelist;
nothing is ever passed to ``eval``. ``^`` means power (as in the papers), not xor.

A formula is bounded in size and in cost: at most :data:`MAX_CHARS` characters,
:data:`MAX_NODES` syntax nodes and :data:`MAX_DEPTH` levels of nesting, and it is
evaluated in floating point (every number a float), so ``9^9^9`` is an overflow found
in microseconds, not a 370-million-digit integer, and ``10^400`` is an error, not a
traceback. :meth:`Formula.values` evaluates it over arrays (every layer at once), so a
run can check a user's rule at every layer of every depth before it starts.

>>> Formula("sigma / sqrt(2 * L)")(sigma=0.02, L=2)
0.01
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Iterable

#: Variables an init rule may use (DESIGN/issue 12): the block index l (0-based), the
#: depth L, the widths, the matrix's fans, the base std and the scheme's own names.
VARIABLES = {
    "l": "block index, 0..L-1 (-1 embedding side, L head)",
    "L": "number of blocks",
    "d": "residual width d_model",
    "d_ff": "FFN hidden width",
    "d_h": "head width d / heads",
    "fan_in": "input features of the matrix",
    "fan_out": "output features of the matrix",
    "sigma": "base std (--sigma)",
    "sigma_emb": "embedding std (--embed-std, default sigma)",
    "V": "vocabulary size",
    "d0": "base width of muP (--base-width)",
    "L0": "base depth of CompleteP (--base-depth)",
    "std": "the role's own std (only in a truncation bound)",
}
FUNCTIONS = {"sqrt": math.sqrt, "log": math.log, "exp": math.exp, "min": min, "max": max}
#: Limits on a formula's size (the catalogue's longest rule has 55 characters, 17 nodes
#: and 6 levels): beyond them a formula is refused before it is parsed or evaluated.
MAX_CHARS, MAX_NODES, MAX_DEPTH = 1000, 256, 64


def _pow(a: float, b: float) -> float:
    """a^b in floating point; a negative base to a fractional power is an error (Python
    would return a complex number)."""
    out = a**b
    if isinstance(out, complex):
        raise ValueError(f"{a:g} to the power {b:g} is not a real number")
    return out


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: _pow,
}
_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class FormulaError(ValueError):
    """A formula that does not parse, uses something outside the whitelist, names an
    unknown variable, or evaluates to something that is not a finite number."""


class Formula:
    """A parsed formula; call it with the variables' values."""

    def __init__(self, text: str | float | int, allowed: Iterable[str] = VARIABLES):
        if isinstance(text, bool):
            raise FormulaError(f"{text!r} is not a formula")
        self.text = str(text).strip()
        if not self.text:
            raise FormulaError("empty formula")
        if len(self.text) > MAX_CHARS:
            raise FormulaError(f"{self.text[:40]!r}...: {len(self.text)} characters (at most {MAX_CHARS})")
        try:
            tree = ast.parse(self.text.replace("^", "**"), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            raise FormulaError(f"{_clip(self.text)!r} does not parse") from None
        self._tree = tree.body
        self._check_size(self._tree)
        allowed = set(allowed)
        self._allowed = tuple(sorted(allowed))
        self.names: set[str] = set()
        self._check(self._tree, allowed)

    def _check_size(self, tree: ast.AST) -> None:
        """At most MAX_NODES nodes and MAX_DEPTH levels, counted without recursion."""
        stack, nodes = [(tree, 1)], 0
        while stack:
            node, depth = stack.pop()
            nodes += 1
            if nodes > MAX_NODES or depth > MAX_DEPTH:
                what = f"over {MAX_NODES} terms" if nodes > MAX_NODES else f"nested over {MAX_DEPTH} deep"
                raise FormulaError(f"{_clip(self.text)!r}: {what}")
            stack += [(child, depth + 1) for child in ast.iter_child_nodes(node)]

    def _check(self, node: ast.AST, allowed: set[str]) -> None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise FormulaError(f"{self.text!r}: only numbers are allowed, not {node.value!r}")
            try:  # evaluated as a float: a huge integer literal is an overflow now, not at run time
                value = float(node.value)
            except OverflowError:
                big = _clip(str(node.value))
                raise FormulaError(f"{_clip(self.text)!r}: the number {big} is too large") from None
            if not math.isfinite(value):
                raise FormulaError(f"{self.text!r}: the number {node.value!r} is not finite")
            node.value = value
        elif isinstance(node, ast.Name):
            if node.id not in allowed:
                raise FormulaError(
                    f"{self.text!r}: unknown variable {node.id!r} (allowed: {', '.join(sorted(allowed))})"
                )
            self.names.add(node.id)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise FormulaError(f"{self.text!r}: operator not allowed (use + - * / ^)")
            self._check(node.left, allowed)
            self._check(node.right, allowed)
        elif isinstance(node, ast.UnaryOp):
            if type(node.op) not in _UNOPS:
                raise FormulaError(f"{self.text!r}: operator not allowed (use + - * / ^)")
            self._check(node.operand, allowed)
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                raise FormulaError(f"{self.text!r}: only the functions {', '.join(FUNCTIONS)} are allowed")
            if node.func.id in ("min", "max") and len(node.args) < 2:
                raise FormulaError(f"{self.text!r}: {node.func.id} takes two or more arguments")
            if node.func.id not in ("min", "max") and len(node.args) != 1:
                raise FormulaError(f"{self.text!r}: {node.func.id} takes one argument")
            if any(isinstance(a, ast.Starred) for a in node.args):
                raise FormulaError(f"{self.text!r}: Starred is not allowed in a formula")
            for a in node.args:
                self._check(a, allowed)
        else:
            raise FormulaError(f"{self.text!r}: {type(node).__name__} is not allowed in a formula")

    def _eval(self, node: ast.AST, env: dict, binops=_BINOPS, functions=FUNCTIONS):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise FormulaError(f"{self.text!r}: {node.id!r} has no value here")
            return env[node.id]
        if isinstance(node, ast.BinOp):
            left = self._eval(node.left, env, binops, functions)
            return binops[type(node.op)](left, self._eval(node.right, env, binops, functions))
        if isinstance(node, ast.UnaryOp):
            return _UNOPS[type(node.op)](self._eval(node.operand, env, binops, functions))
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return functions[node.func.id](*(self._eval(a, env, binops, functions) for a in node.args))

    def __call__(self, **env: float) -> float:
        try:
            value = self._eval(self._tree, {k: float(v) for k, v in env.items()})
        except (ArithmeticError, ValueError) as exc:
            if isinstance(exc, FormulaError):
                raise
            why = "overflows (beyond 1.8e308)" if isinstance(exc, OverflowError) else str(exc)
            raise FormulaError(f"{_clip(self.text)!r}: {why} at {_short(env, self.names)}") from None
        if isinstance(value, complex) or not math.isfinite(value):
            raise FormulaError(f"{self.text!r} is not a finite number at {_short(env, self.names)}")
        return float(value)

    def values(self, **env):
        """The formula over arrays (``env`` values broadcast, e.g. every layer at once),
        as float64; where it is undefined (log(0), 1/0, an overflow) the value is nan
        or inf: the caller checks :func:`numpy.isfinite`."""
        import numpy as np  # (not at import: `tinit --help` loads this module and no numpy)

        binops, functions = _array_ops()
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in env.items()}
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values())) if arrays else ()
        with np.errstate(all="ignore"):
            out = self._eval(self._tree, arrays, binops, functions)
        return np.broadcast_to(np.asarray(out, dtype=np.float64), shape)

    def __reduce__(self):
        # pickled as its text (and whitelist): a spawned worker re-parses it, so a user's
        # scheme travels inside the run's config (no process-global table)
        return (Formula, (self.text, self._allowed))

    def __repr__(self) -> str:
        return f"Formula({self.text!r})"

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, Formula) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


@functools.cache
def _array_ops() -> tuple[dict, dict]:
    """The operators and functions over arrays (:meth:`Formula.values`): a domain error
    or an overflow gives nan or inf there, which the caller reports."""
    import numpy as np

    functions = {"sqrt": np.sqrt, "log": np.log, "exp": np.exp,
                 "min": lambda *a: functools.reduce(np.minimum, a),
                 "max": lambda *a: functools.reduce(np.maximum, a)}  # fmt: skip
    return {**_BINOPS, ast.Pow: np.power}, functions


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _short(env: dict[str, float], names: set[str]) -> str:
    return ", ".join(f"{k}={env[k]:g}" for k in sorted(names) if k in env) or "no variables"
