"""A small, safe arithmetic language for init rules: numbers, + - * / ^ (or **),
parentheses, sqrt, log, exp, min, max, and named variables.

Formulas are parsed with :mod:`ast` and every node is checked against a whitelist;
nothing is ever passed to ``eval``. ``^`` means power (as in the papers), not xor.

>>> Formula("sigma / sqrt(2 * L)")(sigma=0.02, L=2)
0.01
"""

from __future__ import annotations

import ast
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
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
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
        try:
            tree = ast.parse(self.text.replace("^", "**"), mode="eval")
        except SyntaxError:
            raise FormulaError(f"{self.text!r} does not parse") from None
        self._tree = tree.body
        allowed = set(allowed)
        self._allowed = tuple(sorted(allowed))
        self.names: set[str] = set()
        self._check(self._tree, allowed)

    def _check(self, node: ast.AST, allowed: set[str]) -> None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise FormulaError(f"{self.text!r}: only numbers are allowed, not {node.value!r}")
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
            if not node.args or (node.func.id not in ("min", "max") and len(node.args) != 1):
                raise FormulaError(f"{self.text!r}: {node.func.id} takes one argument")
            for a in node.args:
                self._check(a, allowed)
        else:
            raise FormulaError(f"{self.text!r}: {type(node).__name__} is not allowed in a formula")

    def _eval(self, node: ast.AST, env: dict[str, float]) -> float:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise FormulaError(f"{self.text!r}: {node.id!r} has no value here")
            return env[node.id]
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](self._eval(node.left, env), self._eval(node.right, env))
        if isinstance(node, ast.UnaryOp):
            return _UNOPS[type(node.op)](self._eval(node.operand, env))
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return FUNCTIONS[node.func.id](*(self._eval(a, env) for a in node.args))

    def __call__(self, **env: float) -> float:
        try:
            value = self._eval(self._tree, env)
        except (ZeroDivisionError, OverflowError, ValueError) as exc:
            if isinstance(exc, FormulaError):
                raise
            raise FormulaError(f"{self.text!r}: {exc} at {_short(env, self.names)}") from None
        if isinstance(value, complex) or not math.isfinite(value):
            raise FormulaError(f"{self.text!r} is not a finite number at {_short(env, self.names)}")
        return float(value)

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


def _short(env: dict[str, float], names: set[str]) -> str:
    return ", ".join(f"{k}={env[k]:g}" for k in sorted(names) if k in env) or "no variables"
