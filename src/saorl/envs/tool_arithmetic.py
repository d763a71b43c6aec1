"""A built-in tool task for CPU: multiplication that a tiny model cannot do in its head.

Prompt `"37*58="`; the model may call a calculator with `<calc>37*58</calc>` (the closing tag is
a stop string), reads `<output>2146</output>` back, then answers `2146` followed by EOS. The
reward is 1 when the final answer is the product.

The supervised warm-up shows both habits: half of its demonstrations use the calculator, half
answer directly (correctly, but a 0.5M-parameter model cannot learn 2-digit multiplication from
a few hundred steps). The warmed-up policy therefore calls the tool on about half of the
problems and is right mostly when it does; RL has to discover that calling the tool pays.

The calculator evaluates `+ - * // %` and parentheses on integers in-process (an AST walk, no
`eval`): instant, so tool calls never hold up decoding. The sandboxed Python tool is
`saorl.envs.math.tool`.
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable

from saorl.envs.arithmetic import ArithmeticEnv, Problem
from saorl.envs.base import StepResult
from saorl.toolcalls import ToolCallError, parse_tool_call

TAG = "calc"
STOP = f"</{TAG}>"
_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def calculate(expr: str) -> str:
    """The value of an integer expression, or `error: ...` (never raises)."""
    if len(expr) > 64:
        return "error: expression too long"
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return "error: syntax"

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(type(node).__name__)

    try:
        value = ev(tree)
    except ValueError as e:
        return f"error: unsupported {e}"
    except ZeroDivisionError:
        return "error: division by zero"
    return str(value) if abs(value) < 10**12 else "error: too large"


class ToolArithmeticTask:
    """Products `a*b=` of two `num_digits`-digit numbers; a fixed held-out set."""

    def __init__(
        self, num_digits: int = 2, eval_size: int = 256, seed: int = 1234, train: bool = True
    ) -> None:
        """`train=False`: held-out problems only (evaluation), up to every problem there is."""
        lo = 10 ** (num_digits - 1)
        hi = 10**num_digits
        pairs = [(a, b) for a in range(lo, hi) for b in range(lo, hi)]
        if not train:
            eval_size = min(eval_size, len(pairs))
        elif eval_size >= len(pairs) // 2:
            raise ValueError(f"env.eval_size={eval_size} too large for {num_digits} digits")
        rng = random.Random(seed)
        held = rng.sample(pairs, eval_size)
        self._held = set(held)
        self._pairs = pairs
        self.held_out = [self._problem(a, b) for a, b in held]

    @staticmethod
    def _problem(a: int, b: int) -> Problem:
        return Problem(prompt=f"{a}*{b}=", answer=str(a * b), key=f"{a}*{b}")

    def sample(self, rng: random.Random) -> Problem:
        while True:
            a, b = rng.choice(self._pairs)
            if (a, b) not in self._held:
                return self._problem(a, b)

    @staticmethod
    def demo(problem: Problem, rng: random.Random) -> list[tuple[str, bool]]:
        """A supervised demonstration as (text, trained) segments; EOS follows the last one."""
        if rng.random() < 0.5:
            expr = problem.key
            return [
                (problem.prompt, False),
                (f"<{TAG}>{expr}{STOP}", True),
                (f"<output>{calculate(expr)}</output>", False),
                (problem.answer, True),
            ]
        return [(problem.prompt, False), (problem.answer, True)]


class ToolArithmeticEnv(ArithmeticEnv):
    """Calculator calls get `<output>...</output>` back; a turn without a call is the answer,
    graded as in `ArithmeticEnv` (same prompt, same reset)."""

    async def step(self, action_text: str) -> StepResult:
        assert self.problem is not None, "step() before reset()"
        call = parse_tool_call(action_text, "code", tag=TAG)
        if call is None:
            return await super().step(action_text)
        result = (
            f"error: {call.message}"
            if isinstance(call, ToolCallError)
            else calculate(call.arguments["code"])
        )
        return StepResult(
            [{"role": "tool", "content": f"<output>{result}</output>"}], info={"tool_call": True}
        )
