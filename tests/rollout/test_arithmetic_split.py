"""The arithmetic source's held-out split: facts partitioned by a stable hash, disjoint by construction."""

import pytest

from undertow.rollout.feeder import load_items
from undertow.rollout.feeder.procedural import is_heldout


def _facts(items):
    return {(i.metadata["operation"], *i.metadata["operands"]) for i in items}


def test_train_and_heldout_share_no_fact_whatever_the_seeds():
    common = {"name": "arithmetic", "style": "question", "max_operand": 30, "operations": "+-",
              "heldout_fraction": 0.3}
    train = load_items({**common, "size": 3000, "seed": 0, "split": "train"})
    heldout = load_items({**common, "size": 200, "seed": 1, "split": "heldout", "distinct": True})
    assert not _facts(train) & _facts(heldout)
    assert not {i.prompt for i in train} & {i.prompt for i in heldout}
    assert len({i.prompt for i in heldout}) == 200  # distinct: 200 different problems
    assert all(is_heldout(op, a, b, 0.3) for op, a, b in _facts(heldout))


def test_question_style_states_the_fact_and_its_answer():
    item = load_items({"name": "arithmetic", "size": 1, "style": "question", "operations": "-"})[0]
    a, b = item.metadata["operands"]
    assert item.prompt == f"What is {a} - {b}? Answer with the number only."
    assert item.answer == str(a - b) and a >= b  # operands are sorted: no negative answers


def test_the_held_out_fraction_of_facts_is_roughly_the_one_asked():
    facts = [(op, a, b) for op in "+-" for a in range(1, 31) for b in range(1, a + 1)]
    share = sum(is_heldout(*f, 0.3) for f in facts) / len(facts)
    assert 0.25 < share < 0.35, share


def test_default_draws_are_unchanged_by_the_split_options():
    """Configs that name no split get the same problems as before the split existed."""
    items = load_items({"name": "arithmetic", "size": 3, "seed": 3})
    assert items[0].prompt == "Dev had 6 marbles and gave away 3. How many marbles are left? Answer with the number only."


def test_bad_options_name_the_setting():
    with pytest.raises(ValueError, match="split"):
        load_items({"name": "arithmetic", "split": "test"})
    with pytest.raises(ValueError, match="style"):
        load_items({"name": "arithmetic", "style": "poem"})
    with pytest.raises(ValueError, match="operations"):
        load_items({"name": "arithmetic", "operations": "/"})
    with pytest.raises(ValueError, match="no new heldout problem"):  # 3 facts cannot make 50 distinct questions
        load_items({"name": "arithmetic", "size": 50, "style": "question", "max_operand": 2, "split": "heldout",
                    "heldout_fraction": 0.5, "distinct": True})
