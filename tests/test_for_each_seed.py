"""CPU tier: common.testing's property-test helpers. for_each_seed runs a check over every seed in one test and
fails naming the smallest seed that fails, with that seed's error; seed_ranges puts the whole range under the
slow marker; cases runs a test's sizes in one test case and fails naming the first failing case."""
import inspect

import pytest

from common.testing import cases, for_each_seed, seed_ranges


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


def test_cases_run_every_combination_in_one_call_the_top_decorator_outermost():
    seen = []

    @cases("a", [1, pytest.param(2, id="two")])
    @cases("b, c", [(3, 4), (5, 6)])
    def check(fixture, a, b, c):
        seen.append((fixture, a, b, c))

    assert list(inspect.signature(check).parameters) == ["fixture"]      # what pytest asks fixtures for
    assert check.__name__ == "check" and check("f") is None
    assert seen == [("f", 1, 3, 4), ("f", 1, 5, 6), ("f", 2, 3, 4), ("f", 2, 5, 6)]


def test_a_failing_case_is_named_by_its_parameters_and_the_others_still_run():
    seen = []

    @cases("n", [1, 2, 3, 4, 5])
    @cases("hd", [64, 128])
    def check(n, hd):
        seen.append((n, hd))
        if hd == 128 and n % 2:
            raise ValueError(f"no kernel for {n}")
        assert n != 4, "four"

    with pytest.raises(AssertionError) as info:
        check()
    assert str(info.value) == ("n=1, hd=128 fails, the first of 5 failing cases of 10 (then n=3, hd=128; "
                               "n=4, hd=64; n=4, hd=128; ...): ValueError: no kernel for 1")
    assert isinstance(info.value.__cause__, ValueError)                    # its traceback is shown with the report
    assert len(seen) == 10


def test_cases_skip_only_where_every_case_skips():
    @cases("n", [1, 2])
    def some(n):
        if n == 1:
            pytest.skip("not on this GPU")
        assert n == 2

    @cases("n", [1, 2])
    def every(n):
        pytest.skip("not on this GPU")

    some()
    with pytest.raises(pytest.skip.Exception, match="all 2 cases: not on this GPU"):
        every()


def test_cases_refuse_what_they_cannot_loop_over():
    with pytest.raises(TypeError, match="marks"):
        cases("n", [pytest.param(1, marks=pytest.mark.slow)])
    with pytest.raises(TypeError, match="not 2 values"):
        cases("n, m", [(1, 2), (3,)])
    with pytest.raises(TypeError, match="parameters"):
        cases("m", [1])(lambda n: None)


@pytest.mark.parametrize("kind", ["row", "tiles"])
@cases("n, m", [(1, 2), (3, 4)])
def test_cases_sit_under_pytest_s_own_parametrisation(request, kind, n, m):
    assert request.node.callspec.params == {"kind": kind}                 # n and m are not pytest's
    assert (n, m) in ((1, 2), (3, 4))
