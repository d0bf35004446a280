"""Procedural tasksets with verifiable answers: arithmetic word problems and Countdown.

Item i of a generator depends only on (seed, i), so the same config always yields the same tasks.
"""

from __future__ import annotations

import hashlib
import operator
import random
from fractions import Fraction

from undertow.rollout.feeder.items import TaskItem, source

# (template, operation): GSM8K-like one-step stories with a numeric answer.
WORD_PROBLEMS = (
    ("{name} has {a} apples and buys {b} more. How many apples does {name} have now?", "+"),
    ("{name} had {a} marbles and gave away {b}. How many marbles are left?", "-"),
    ("{name} packs {b} boxes with {a} pens each. How many pens is that in total?", "*"),
    ("A train has {a} seats in each of {b} cars. How many seats does it have?", "*"),
    ("{name} reads {a} pages on Monday and {b} pages on Tuesday. How many pages in all?", "+"),
)
# The same facts asked bare ("What is 12 + 7?"): the style SmolLM2-135M already half knows.
QUESTIONS = (("What is {a} + {b}?", "+"), ("What is {a} - {b}?", "-"), ("What is {a} times {b}?", "*"))
STYLES = {"story": WORD_PROBLEMS, "question": QUESTIONS}
OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
NAMES = ("Ann", "Ben", "Cleo", "Dev", "Eli", "Fay")
SPLITS = ("all", "train", "heldout")


@source("arithmetic")
def arithmetic(*, size: int = 1000, seed: int = 0, max_operand: int = 20,
               instruction: str = " Answer with the number only.", operations: str = "+-*",
               split: str = "all", heldout_fraction: float = 0.2, distinct: bool = False,
               style: str = "story") -> list[TaskItem]:
    """`size` one-step word problems (`style: story`, or bare `question`s) with operands in
    [1, max_operand] and `operations` among + - *; the answer is a number.

    `split: train` / `heldout` keeps only the facts ("a op b") of that part: a fixed
    `heldout_fraction` of all facts is held out, whatever the seed, so a held-out taskset shares no
    problem (not even its arithmetic in another story) with a training one. `distinct` redraws a
    prompt already drawn (a held-out set of N different problems).
    """
    if split not in SPLITS:
        raise ValueError(f"arithmetic: split must be one of {SPLITS}, got {split!r}")
    if style not in STYLES:
        raise ValueError(f"arithmetic: style must be one of {tuple(STYLES)}, got {style!r}")
    templates = tuple(t for t in STYLES[style] if t[1] in operations)
    if not templates:
        raise ValueError(f"arithmetic: operations {operations!r} names none of {''.join(OPERATIONS)}")
    items, seen = [], set()
    for i in range(size):
        rng = random.Random(f"arithmetic/{seed}/{i}")
        for _ in range(10_000):  # redraw until the fact falls in the split (the first draw when split is 'all')
            template, op = rng.choice(templates)
            a, b = sorted((rng.randint(1, max_operand), rng.randint(1, max_operand)), reverse=True)
            prompt = template.format(name=rng.choice(NAMES), a=a, b=b) + instruction
            if (split == "all" or (split == "heldout") == is_heldout(op, a, b, heldout_fraction)) \
                    and not (distinct and prompt in seen):
                break
        else:
            raise ValueError(f"arithmetic: no new {split} problem after 10,000 draws (size {size} too large "
                             f"for max_operand {max_operand}, operations {operations!r})")
        seen.add(prompt)
        items.append(TaskItem(key=str(i), prompt=prompt, answer=str(OPERATIONS[op](a, b)),
                              metadata={"operands": [a, b], "operation": op}))
    return items


def is_heldout(op: str, a: int, b: int, fraction: float) -> bool:
    """Whether the fact `a op b` is in the held-out part: a stable hash of the fact (not of the
    story or the seed), so every taskset draws its part from the same partition."""
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


@source("sums")
def sums(*, size: int = 1000, seed: int = 0, max_operand: int = 9) -> list[TaskItem]:
    """`size` terse additions "a+b=" with operands in [0, max_operand]: small enough for the tiny CPU model."""
    # One stream, drawn in order: item i is the same at any size, and 100,000 items take 0.1 s
    # (a generator seeded per item took 1.8 s, which `undertow config check` paid to measure contamination).
    rng = random.Random(f"sums/{seed}")
    pairs = [(rng.randrange(max_operand + 1), rng.randrange(max_operand + 1)) for _ in range(size)]
    return [TaskItem(key=str(i), prompt=f"{a}+{b}=", answer=str(a + b), metadata={"operands": [a, b]})
            for i, (a, b) in enumerate(pairs)]


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
