"""CPU tier: common.testing's property-test helpers. for_each_seed runs a check over every seed in one test and
fails naming the smallest seed that fails, with that seed's error; seed_ranges puts the whole range under the
slow marker."""
import pytest

from common.testing import for_each_seed, seed_ranges


def test_every_seed_is_checked_smallest_first_and_its_results_come_back_in_that_order():
    seen = []

    def check(seed):
        seen.append(seed)
        return seed * seed

    assert for_each_seed([3, 0, 2, 1], check) == [0, 1, 4, 9]
    assert seen == [0, 1, 2, 3]


def test_a_failure_names_the_smallest_failing_seed_and_its_assertion():
    seen = []

    def check(seed):
        seen.append(seed)
        assert seed % 7 != 5, f"seed {seed} is 5 mod 7"

    with pytest.raises(AssertionError) as info:
        for_each_seed(range(30), check)
    message = str(info.value)
    assert message.startswith("seed 5 fails, the smallest of 4 failing seeds of 30 (then 12, 19, 26): "
                              "AssertionError: seed 5 is 5 mod 7")
    assert isinstance(info.value.__cause__, AssertionError)      # its traceback is shown with the report
    assert seen == list(range(30))                                # one failure does not hide the others' count


def test_any_error_and_a_failed_pytest_raises_count_as_failures():
    def check(seed):
        if seed == 2:
            with pytest.raises(ValueError):                       # DID NOT RAISE: pytest's own Failed
                pass
        if seed == 1:
            raise KeyError("no such block")

    with pytest.raises(AssertionError, match=r"^seed 1 fails, the smallest of 2 failing seeds of 4 \(then 2\): "
                                             r"KeyError: 'no such block'"):
        for_each_seed(range(4), check)


def test_seed_ranges_runs_a_few_seeds_by_default_and_all_of_them_when_slow():
    mark = seed_ranges(300, 3000).mark
    default, full = mark.args[1]
    assert mark.args[0] == "seeds" and (default.id, full.id) == ("first-300-seeds", "all-3000-seeds")
    assert default.values == (range(300),) and full.values == (range(3000),)
    assert not default.marks and [m.name for m in full.marks] == ["slow"]
