"""Procedural tasksets with verifiable answers: arithmetic word problems and Countdown.

Item i of a generator depends only on (seed, i), so the same config always yields the same tasks.
"""

from __future__ import annotations

import random
from fractions import Fraction

from rollout.feeder.items import TaskItem, source

# (template, operation): GSM8K-like one-step stories with a numeric answer.
WORD_PROBLEMS = (
    ("{name} has {a} apples and buys {b} more. How many apples does {name} have now?", lambda a, b: a + b),
    ("{name} had {a} marbles and gave away {b}. How many marbles are left?", lambda a, b: a - b),
    ("{name} packs {b} boxes with {a} pens each. How many pens is that in total?", lambda a, b: a * b),
    ("A train has {a} seats in each of {b} cars. How many seats does it have?", lambda a, b: a * b),
    ("{name} reads {a} pages on Monday and {b} pages on Tuesday. How many pages in all?", lambda a, b: a + b),
)
NAMES = ("Ann", "Ben", "Cleo", "Dev", "Eli", "Fay")


@source("arithmetic")
def arithmetic(*, size: int = 1000, seed: int = 0, max_operand: int = 20,
               instruction: str = " Answer with the number only.") -> list[TaskItem]:
    """`size` one-step word problems with operands in [1, max_operand]; the answer is a number."""
    items = []
    for i in range(size):
        rng = random.Random(f"arithmetic/{seed}/{i}")
        template, op = rng.choice(WORD_PROBLEMS)
        a, b = sorted((rng.randint(1, max_operand), rng.randint(1, max_operand)), reverse=True)
        prompt = template.format(name=rng.choice(NAMES), a=a, b=b) + instruction
        items.append(TaskItem(key=str(i), prompt=prompt, answer=str(op(a, b)),
                              metadata={"operands": [a, b]}))
    return items


@source("sums")
def sums(*, size: int = 1000, seed: int = 0, max_operand: int = 9) -> list[TaskItem]:
    """`size` terse additions "a+b=" with operands in [0, max_operand]: small enough for the tiny CPU model."""
    items = []
    for i in range(size):
        rng = random.Random(f"sums/{seed}/{i}")
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        items.append(TaskItem(key=str(i), prompt=f"{a}+{b}=", answer=str(a + b), metadata={"operands": [a, b]}))
    return items


@source("countdown")
def countdown(*, size: int = 1000, seed: int = 0, count: int = 3, max_number: int = 25) -> list[TaskItem]:
    """`size` solvable Countdown puzzles: `count` numbers in [1, max_number] and a positive integer
    target made from all of them with + - * / (the reference equation is the answer)."""
    items = []
    for i in range(size):
        rng = random.Random(f"countdown/{seed}/{i}")
        while True:  # a few draws until the random equation lands on a positive integer
            numbers = [rng.randint(1, max_number) for _ in range(count)]
            equation, value = _random_equation(rng, numbers)
            if value.denominator == 1 and value > 0:
                break
        target = int(value)
        shown = sorted(numbers)
        prompt = (f"Using the numbers {shown}, create an equation that equals {target}. "
                  "Use + - * / and each number once. Answer with the equation only.")
        items.append(TaskItem(key=str(i), prompt=prompt, answer=equation,
                              metadata={"numbers": shown, "target": target}))
    return items


def _random_equation(rng: random.Random, numbers: list[int]) -> tuple[str, Fraction]:
    """Combine the numbers left to right with random operators, parenthesised so the text evaluates
    to the value computed here."""
    order = rng.sample(numbers, len(numbers))
    text, value = str(order[0]), Fraction(order[0])
    for n in order[1:]:
        op = rng.choice("+-*/")
        if op == "/" and n == 0:
            op = "+"
        value = {"+": value + n, "-": value - n, "*": value * n, "/": value / n}[op]
        text = f"({text}) {op} {n}" if " " in text else f"{text} {op} {n}"
    return text, value
